/* int4serve — the daemon's entry point: configuration, then the runtime. */
#define INF_LOG_MODULE "srv"
#include "common/inf.h"
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>

/* Exit statuses: 0 --help / --version / --print-config, 1 a failure at run
 * time, 2 bad flags or configuration. */
enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

int main(int argc, char **argv)
{
    struct srv_config cfg;
    struct inf_err err = {0};
    enum srv_config_action action;
    enum inf_log_level level;

    if (srv_config_init(&cfg, &err) != INF_OK) {
        fprintf(stderr, "int4serve: %s\n", err.msg);
        srv_config_fini(&cfg);
        return EXIT_RUNTIME;
    }
    if (srv_config_from_args(&cfg, argc, argv, getenv("INT4SERVE_API_KEY"), &action, &err) !=
        INF_OK) {
        fprintf(stderr, "int4serve: %s\n", err.msg);
        srv_config_fini(&cfg);
        return EXIT_USAGE;
    }
    switch (action) {
    case SRV_CONFIG_HELP:
        srv_config_print_help(stdout);
        srv_config_fini(&cfg);
        return 0;
    case SRV_CONFIG_VERSION:
        srv_version_print(stdout);
        srv_config_fini(&cfg);
        return 0;
    case SRV_CONFIG_PRINT:
        srv_config_print_toml(&cfg, stdout);
        srv_config_fini(&cfg);
        return 0;
    case SRV_CONFIG_RUN:
        break;
    }
    /* The table's choices are exactly inf_log_level_parse's names. */
    if (inf_log_level_parse(cfg.log_level, &level))
        inf_log_set_level(level);
    srv_config_log(&cfg);
    inf_log(ERROR, "no model runtime exists yet in this build: configuration checked, exiting");
    srv_config_fini(&cfg);
    return EXIT_RUNTIME;
}
