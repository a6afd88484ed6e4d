/* int4serve — the daemon's entry point: configuration, then the runtime. */
#define INF_LOG_MODULE "srv"
#include "common/inf.h"
#include "server/srv.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Exit statuses: 0 --help / --version / --print-config and a clean shutdown;
 * 2 what a restart cannot fix: bad flags or configuration, an address that
 * cannot be bound, a model folder that is missing, unreadable or does not
 * match its config.json, a KV budget too small for one sequence; 1 a
 * failure a restart may cure (a device error, out of memory). The systemd
 * unit does not restart on 2 (RestartPreventExitStatus). */
enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* The engine's and the HTTP side's views of the configuration. Strings and
 * lists point into cfg (or into *devices, which the caller frees). */
static int options_from_config(const struct srv_config *cfg, struct srv_options *opt,
                               struct eng_config *ecfg, int32_t **devices)
{
    srv_options_defaults(opt);
    opt->host = cfg->host;
    opt->port = (int32_t)cfg->port;
    opt->api_key = cfg->api_key;
    opt->model_name = cfg->served_model_name;
    opt->max_body_bytes = (size_t)cfg->body_limit;
    opt->connection_memory_limit = (size_t)cfg->connection_memory;
    opt->max_connections = (uint32_t)cfg->max_connections;
    opt->max_connections_per_ip = (uint32_t)cfg->per_ip_connections;
    opt->connection_timeout_s = (uint32_t)ceil(cfg->connection_timeout);
    opt->header_timeout_s = cfg->header_timeout;
    opt->body_timeout_s = cfg->body_timeout;
    opt->cors_origins = cfg->cors_origins.v;
    opt->n_cors_origins = cfg->cors_origins.n;
    opt->allowed_hosts = cfg->allowed_hosts.v;
    opt->n_allowed_hosts = cfg->allowed_hosts.n;
    opt->drain_timeout_s = cfg->drain_timeout;

    memset(ecfg, 0, sizeof *ecfg);
    ecfg->model_dir = cfg->model;
    if (strcmp(cfg->backend, "cuda") == 0)
        ecfg->backend = ENG_BACKEND_CUDA;
    else if (strcmp(cfg->backend, "mock") == 0)
        ecfg->backend = ENG_BACKEND_MOCK;
    else
        ecfg->backend = ENG_BACKEND_CPU;
    ecfg->threads = (int32_t)cfg->threads;
    *devices = NULL;
    if (cfg->devices.n) {
        *devices = calloc(cfg->devices.n, sizeof **devices);
        if (!*devices)
            return -1;
        for (size_t i = 0; i < cfg->devices.n; i++)
            (*devices)[i] = (int32_t)cfg->devices.v[i];
    }
    ecfg->devices = *devices;
    ecfg->n_devices = (int32_t)cfg->devices.n;
    ecfg->tp = (int32_t)cfg->tp;
    ecfg->max_batch = (int32_t)cfg->max_batch;
    ecfg->max_batched_tokens = (int32_t)cfg->max_batched_tokens;
    ecfg->max_model_len = (int32_t)cfg->max_model_len;
    ecfg->kv_cache_tokens = cfg->kv_cache_tokens;
    ecfg->gpu_memory_utilization = (float)cfg->gpu_memory_utilization;
    ecfg->max_queue = (int32_t)cfg->max_queue;
    ecfg->kv_cache_dtype = strcmp(cfg->kv_cache_dtype, "fp8") == 0    ? ENG_KV_FP8
                           : strcmp(cfg->kv_cache_dtype, "fp16") == 0 ? ENG_KV_FP16
                                                                      : ENG_KV_AUTO;
    ecfg->cuda_sm75 = strcmp(cfg->cuda_kernels, "sm75") == 0;
    static const struct {
        const char *name;
        enum eng_quantization q;
    } quants[] = {{"auto", ENG_QUANTIZATION_AUTO},
                  {"int4", ENG_QUANTIZATION_INT4},
                  {"awq", ENG_QUANTIZATION_AWQ},
                  {"gptq", ENG_QUANTIZATION_GPTQ},
                  {"compressed-tensors", ENG_QUANTIZATION_CT},
                  {"none", ENG_QUANTIZATION_NONE}};
    ecfg->quantization = ENG_QUANTIZATION_AUTO;
    for (size_t i = 0; i < sizeof quants / sizeof quants[0]; i++)
        if (strcmp(cfg->quantization, quants[i].name) == 0)
            ecfg->quantization = quants[i].q;
    ecfg->group_size = (int32_t)cfg->group_size;
    ecfg->symmetric = cfg->symmetric;
    ecfg->n_keep_fp16 = (int32_t)cfg->keep_fp16.n;
    ecfg->keep_fp16 = cfg->keep_fp16.v;
    ecfg->fuse_qkv = cfg->fuse_qkv;
    ecfg->seed = (uint64_t)cfg->seed;
    ecfg->enforce_eager = cfg->enforce_eager;
    ecfg->skip_warm_up = !cfg->warm_up;
    ecfg->stats_log_s = (uint32_t)cfg->stats_log_interval;
    ecfg->min_step_us = (uint32_t)cfg->min_step_us;
    ecfg->mock_vocab = (int32_t)cfg->mock_vocab;
    ecfg->mock_fail_step = (int32_t)cfg->mock_fail_step;
    ecfg->mock_device_sampling = cfg->mock_device_sampling;
    ecfg->prefix_caching = cfg->prefix_caching;
    return 0;
}

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
    if (srv_config_check_model(&cfg, &err) != INF_OK) {
        inf_log(ERROR, "%s", err.msg);
        fprintf(stderr, "int4serve: %s\n", err.msg);
        srv_config_fini(&cfg);
        return EXIT_USAGE;
    }

    struct srv_options opt;
    struct eng_config ecfg;
    int32_t *devices = NULL;
    if (options_from_config(&cfg, &opt, &ecfg, &devices) != 0) {
        fprintf(stderr, "int4serve: out of memory\n");
        srv_config_fini(&cfg);
        return EXIT_RUNTIME;
    }
    /* A client closing its socket must not kill the daemon: writes get EPIPE. */
    signal(SIGPIPE, SIG_IGN);
    inf_status_t st = srv_daemon_run(&opt, &ecfg, &err);
    free(devices);
    int rc = 0;
    if (st != INF_OK) {
        char msg[1024];
        rc =
            srv_startup_error(&cfg, st, err.msg[0] ? err.msg : inf_status_str(st), msg, sizeof msg);
        inf_log(ERROR, "%s", msg);
        fprintf(stderr, "int4serve: %s\n", msg);
    }
    srv_config_fini(&cfg);
    return rc;
}
