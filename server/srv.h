#pragma once
/* server — public header: configuration and the daemon's entry points. */
#include "common/inf.h"

#include <stdio.h>

/* Print "int4serve <version>" and the build's features to f. Thread: any. */
void srv_version_print(FILE *f);

/* ---- the daemon (server side: loop, HTTP, routing, signals) ----------------
 * Everything below runs on the loop thread unless said otherwise. */
#include "engine/eng.h"

#include <stdint.h>

/* What the HTTP side needs, filled by main from the configuration. */
struct srv_options {
    const char *host;              /* listen address, e.g. "127.0.0.1" */
    int32_t port;                  /* 0 = an ephemeral port (logged once bound) */
    const char *api_key;           /* NULL or "" = no authentication */
    const char *model_name;        /* the id /v1/models lists and requests must name */
    size_t max_body_bytes;         /* larger bodies are answered 413 (default 2 MiB) */
    uint32_t max_connections;      /* MHD connection limit (0 = libmicrohttpd's default) */
    uint32_t max_connections_per_ip; /* 0 = unlimited */
    uint32_t connection_timeout_s; /* idle / header timeout, 0 = none */
    size_t connection_memory_limit; /* per-connection buffer (0 = default) */
    double drain_timeout_s;        /* on SIGTERM, wait this long for running requests; 0 = abort */
};

/* Default values for every field (max_body 2 MiB, drain 30 s, host 127.0.0.1,
 * port 8000, model "int4serve"). */
void srv_options_defaults(struct srv_options *opt);

/* Run the daemon on a fresh loop until SIGTERM/SIGINT (drained) or a fatal
 * error. Creates the engine from ecfg, binds, serves, drains, frees
 * everything. Returns INF_OK after a clean shutdown; on a start-up failure the
 * status and err say what failed (the engine's message names the model
 * problem). Thread: the caller becomes the loop thread. */
inf_status_t srv_daemon_run(const struct srv_options *opt, const struct eng_config *ecfg,
                            struct inf_err *err);
