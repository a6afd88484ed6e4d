#pragma once
/* server — public header: configuration and the daemon's entry points. */
#include "common/inf.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Print "int4serve <version>" and the build's features to f. Thread: any. */
void srv_version_print(FILE *f);

/* ---- configuration -------------------------------------------------------------
 * One declarative table (server/config.c, srv_config_keys[]) describes every
 * key: section, name, type, bounds, default, CLI flag, one-line description.
 * Values come from the defaults, then the TOML file, then INT4SERVE_API_KEY
 * (api_key only), then the command line: later sources win.
 * Thread: the functions below run on the main thread during start-up; a
 * finished struct srv_config is read-only and may then be read anywhere. */

struct srv_int_list {
    const int64_t *v;
    size_t n;
};

struct srv_str_list {
    const char *const *v;
    size_t n;
};

/* The effective configuration. Strings and lists live in cfg->arena. */
struct srv_config {
    /* [server] */
    const char *host;                  /* address to listen on */
    int64_t port;                      /* 0 = any free port */
    const char *api_key;               /* "" = no authentication */
    const char *served_model_name;     /* after srv_config_finish: never "" */
    const char *log_level;             /* debug | info | warn | error | off */
    double header_timeout;             /* seconds from a request's first byte to its last header */
    double body_timeout;               /* seconds from the headers to the body's last byte */
    struct srv_str_list cors_origins;  /* origins answered with CORS headers ("*": any) */
    struct srv_str_list allowed_hosts; /* Host values served; empty: see srv_options */
    /* [model] */
    const char *model;             /* model folder */
    const char *quantization;      /* auto | int4 | awq | gptq | compressed-tensors | none */
    int64_t group_size;            /* 32, 64, 128, 256, or -1 (per channel) */
    bool symmetric;                /* zero point fixed at 8 */
    struct srv_str_list keep_fp16; /* weight name patterns kept in fp16 */
    bool fuse_qkv;                 /* fuse q/k/v and gate/up projections */
    int64_t max_model_len;         /* 0 = the model's */
    /* [engine] */
    const char *backend;           /* cpu | cuda | mock */
    struct srv_int_list devices;   /* GPU ordinals */
    int64_t tp;                    /* tensor-parallel ranks */
    int64_t threads;               /* CPU backend threads; 0 = one per core */
    int64_t max_batch;             /* sequences running at once */
    int64_t max_batched_tokens;    /* tokens per scheduler step */
    int64_t kv_cache_tokens;       /* 0 = as many as memory allows */
    double gpu_memory_utilization; /* fraction of GPU memory to take */
    int64_t seed;                  /* sampling seed for requests without one */
    bool enforce_eager;            /* no decode graphs */
    bool warm_up;                  /* warm the device model up before serving */
    int64_t stats_log_interval;    /* seconds between the engine's stats lines; 0 = none */
    const char *kv_cache_dtype;    /* auto | fp16 | fp8 */
    const char *cuda_kernels;      /* auto | sm75 */
    bool prefix_caching;           /* share the KV blocks of a common prefix */
    /* [limits] */
    int64_t max_queue;          /* requests waiting for admission */
    int64_t body_limit;         /* bytes */
    int64_t connection_memory;  /* bytes of libmicrohttpd buffer per connection */
    int64_t max_connections;    /* open connections in total */
    int64_t per_ip_connections; /* per client address; 0 = no limit */
    double connection_timeout;  /* seconds idle before a connection is closed; 0 = never */
    double drain_timeout;       /* seconds to finish requests on SIGTERM; 0 = abort now */
    /* [testing]: hooks for the project's own tests */
    int64_t min_step_us;       /* every engine step lasts at least this long */
    int64_t mock_vocab;        /* mock backend: vocabulary; 0 = its default */
    int64_t mock_fail_step;    /* mock backend: the forward that fails; 0 = none */
    bool mock_device_sampling; /* mock backend: samples "on the device" */

    const char *config_path; /* the file read, or NULL */
    const char **origin;     /* per key (index in srv_config_keys): "default",
                                "config.toml:12", "--port", "INT4SERVE_API_KEY" */
    struct inf_arena arena;
};

enum srv_config_type {
    SRV_CFG_BOOL,
    SRV_CFG_INT,
    SRV_CFG_FLOAT,
    SRV_CFG_STRING,
    SRV_CFG_ENUM,     /* a string out of choices */
    SRV_CFG_SIZE,     /* bytes: an integer, or a string "512KiB", "2MiB", "1GiB" */
    SRV_CFG_INT_LIST, /* [0, 1], or a string "0,1" */
    SRV_CFG_STR_LIST, /* ["a", "b"]; on the command line "a,b" */
};

struct srv_config_key {
    const char *section, *name;
    enum srv_config_type type;
    size_t offset;              /* of the field in struct srv_config */
    int64_t min, max;           /* INT, SIZE, INT_LIST items */
    double fmin, fmax;          /* FLOAT */
    const char *const *choices; /* ENUM: NULL-terminated */
    const int64_t *allowed;     /* INT: when set, only these n_allowed values */
    size_t n_allowed;
    const char *def;  /* the default, as a TOML value */
    const char *flag; /* a dedicated CLI flag ("--port"), or NULL */
    const char *help; /* one line */
};

extern const struct srv_config_key srv_config_keys[];
extern const size_t srv_config_nkeys;

/* The key "section.name", or "name" alone when no other section has it;
 * NULL when unknown. */
const struct srv_config_key *srv_config_key_find(const char *name);

/* Fill caller-provided cfg with the defaults. Errors: INF_E_NOMEM. */
inf_status_t srv_config_init(struct srv_config *cfg, struct inf_err *err);
/* Release what cfg owns. cfg may be NULL. */
void srv_config_fini(struct srv_config *cfg);

/* Apply the TOML text of a file named name (used in messages). Every key must
 * be known and valid; on error err->msg names the file, line and key
 * ("config.toml:12: key 'engine.max_batch': must be in [1, 1024], got 0").
 * Errors: INF_E_FORMAT (TOML syntax), INF_E_INVALID, INF_E_NOMEM. On error cfg
 * may hold part of the file's values. */
inf_status_t srv_config_load_toml(struct srv_config *cfg, const char *name, const char *text,
                                  size_t len, struct inf_err *err);
/* Read and apply the file at path. Errors: those above, INF_E_IO. */
inf_status_t srv_config_load_file(struct srv_config *cfg, const char *path, struct inf_err *err);
/* Set one key ("section.name" or a unique "name") from command-line text;
 * origin names the source in messages ("--port", "--set"). Errors: INF_E_NOTFOUND
 * (unknown key), INF_E_INVALID. */
inf_status_t srv_config_set(struct srv_config *cfg, const char *key, const char *value,
                            const char *origin, struct inf_err *err);
/* Derive what depends on other keys (served_model_name) and check the keys
 * against each other (tp vs devices, max_batched_tokens vs max_batch).
 * Errors: INF_E_INVALID, naming the key and where it was set. */
inf_status_t srv_config_finish(struct srv_config *cfg, struct inf_err *err);

enum srv_config_action {
    SRV_CONFIG_RUN,
    SRV_CONFIG_HELP,    /* --help */
    SRV_CONFIG_VERSION, /* --version */
    SRV_CONFIG_PRINT,   /* --print-config: print the effective configuration as TOML */
};

/* The whole start-up sequence on cfg (from srv_config_init): parse argv,
 * read --config, apply env_api_key (the value of INT4SERVE_API_KEY, or NULL),
 * apply the flags, srv_config_finish. *action says what main should do; for
 * HELP and VERSION nothing else is done. Errors name the flag or the file,
 * line and key. Thread: main, at start-up. */
inf_status_t srv_config_from_args(struct srv_config *cfg, int argc, char **argv,
                                  const char *env_api_key, enum srv_config_action *action,
                                  struct inf_err *err);

/* The --help text: flags, then every key with its default and description. */
void srv_config_print_help(FILE *f);
/* cfg as a TOML document, every key with its one-line description. */
void srv_config_print_toml(const struct srv_config *cfg, FILE *f);
/* The value of key k in cfg as TOML text into buf (api_key as given: callers
 * mask it). Returns buf. */
char *srv_config_format(const struct srv_config *cfg, const struct srv_config_key *k, char *buf,
                        size_t size);
/* One INFO line per key, api_key masked. */
void srv_config_log(const struct srv_config *cfg);

/* ---- start-up failures (startup.c) -------------------------------------------
 * Thread: main, at start-up. */

/* Check that cfg's model folder exists, is a folder and can be read, before
 * anything is loaded from it (the mock backend needs none). Errors name the
 * key, its value and origin: INF_E_NOTFOUND, INF_E_INVALID (not a folder),
 * INF_E_IO (cannot be read). */
inf_status_t srv_config_check_model(const struct srv_config *cfg, struct inf_err *err);
/* The start-up failure st with message msg (srv_daemon_run's) as written for
 * the operator into out: a leading key name ("kv_cache_tokens: ...",
 * "port: ...") becomes the key with its value and origin, and a failure
 * about the model names the model folder. Returns the exit status: 2 when
 * the configuration or the model must change (a restart cannot help), 1
 * when a restart may (a device error, out of memory). */
int srv_startup_error(const struct srv_config *cfg, inf_status_t st, const char *msg, char *out,
                      size_t cap);

/* ---- the daemon (server side: loop, HTTP, routing, signals) ----------------
 * Everything below runs on the loop thread unless said otherwise. */
#include "engine/eng.h"

#include <stdint.h>

/* What the HTTP side needs, filled by main from the configuration. */
struct srv_options {
    const char *host;                /* listen address, e.g. "127.0.0.1" */
    int32_t port;                    /* 0 = an ephemeral port (logged once bound) */
    const char *api_key;             /* NULL or "" = no authentication */
    const char *model_name;          /* the id /v1/models lists and requests must name */
    size_t max_body_bytes;           /* larger bodies are answered 413 (default 2 MiB) */
    uint32_t max_connections;        /* open connections at once (default 1024) */
    uint32_t max_connections_per_ip; /* 0 = unlimited */
    uint32_t connection_timeout_s;   /* idle timeout, 0 = none */
    double header_timeout_s;         /* a request's first byte to its last header; 0 = none */
    double body_timeout_s;           /* a request's last header to its body's last byte; 0 = none */
    size_t connection_memory_limit;  /* per-connection buffer (0 = default) */
    double drain_timeout_s; /* on SIGTERM, wait this long for running requests; 0 = abort */
    const char *const *cors_origins; /* [n_cors_origins] origins given CORS headers; "*" any */
    size_t n_cors_origins;
    const char *const *allowed_hosts; /* [n_allowed_hosts] Host values served ("*" any,
                                         ".example.com" a domain and its subdomains); none:
                                         the loopback names when the listening address is a
                                         loopback one, any otherwise */
    size_t n_allowed_hosts;
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

#ifdef __cplusplus
}
#endif
