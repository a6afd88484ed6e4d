/*
 * config.c — the configuration table and everything generated from it:
 * defaults, the TOML file reader, command-line flags, --help, --print-config
 * and the start-up log.
 *
 * Every value, whatever its source, goes through one path: it becomes a TOML
 * node (the defaults are TOML text, command-line text is converted by the
 * key's type), then apply() checks it against the key's type and bounds and
 * stores it at the key's offset in struct srv_config.
 */
#define INF_LOG_MODULE "srv"
#include "server/srv.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OFF(field) offsetof(struct srv_config, field)
#define WHY_LEN 192

static const char *const backends[] = {"cpu", "cuda", "mock", NULL};
static const char *const quantizations[] = {"auto", "int4", "awq", "gptq", "compressed-tensors",
                                            "none", NULL};
static const char *const kv_dtypes[] = {"auto", "fp16", "fp8", NULL};
static const char *const cuda_kernel_sets[] = {"auto", "sm75", NULL};
static const char *const log_levels[] = {"debug", "info", "warn", "error", "off", NULL};
static const int64_t group_sizes[] = {32, 64, 128, 256, -1};

/* clang-format off */
const struct srv_config_key srv_config_keys[] = {
    {.section = "server", .name = "host", .type = SRV_CFG_STRING, .offset = OFF(host),
     .def = "\"127.0.0.1\"", .flag = "--host",
     .help = "address to listen on"},
    {.section = "server", .name = "port", .type = SRV_CFG_INT, .offset = OFF(port),
     .min = 0, .max = 65535, .def = "8000", .flag = "--port",
     .help = "TCP port to listen on; 0 picks a free one"},
    {.section = "server", .name = "api_key", .type = SRV_CFG_STRING, .offset = OFF(api_key),
     .def = "\"\"", .flag = "--api-key",
     .help = "bearer token clients must send; empty: no authentication; env INT4SERVE_API_KEY"},
    {.section = "server", .name = "served_model_name", .type = SRV_CFG_STRING,
     .offset = OFF(served_model_name), .def = "\"\"",
     .help = "model id in the API; empty: the model folder's base name"},
    {.section = "server", .name = "log_level", .type = SRV_CFG_ENUM, .offset = OFF(log_level),
     .choices = log_levels, .def = "\"info\"", .flag = "--log-level",
     .help = "least severe log level written to stderr"},
    {.section = "server", .name = "header_timeout", .type = SRV_CFG_FLOAT,
     .offset = OFF(header_timeout), .fmin = 0, .fmax = 3600, .def = "20",
     .help = "seconds from a request's first byte until its headers are complete; 0: no limit"},
    {.section = "server", .name = "body_timeout", .type = SRV_CFG_FLOAT,
     .offset = OFF(body_timeout), .fmin = 0, .fmax = 86400, .def = "60",
     .help = "seconds from the end of a request's headers until its body is complete; 0: no limit"},
    {.section = "server", .name = "cors_origins", .type = SRV_CFG_STR_LIST,
     .offset = OFF(cors_origins), .min = 0, .max = 64, .def = "[]",
     .help = "origins browsers may call from (CORS), \"*\" for any; empty: no CORS headers"},
    {.section = "server", .name = "allowed_hosts", .type = SRV_CFG_STR_LIST,
     .offset = OFF(allowed_hosts), .min = 0, .max = 64, .def = "[]",
     .help = "Host header values served, \"*\" for any, \".example.com\" for a domain and its "
             "subdomains; empty: the loopback names when bound to a loopback address, else any"},

    {.section = "model", .name = "model", .type = SRV_CFG_STRING, .offset = OFF(model),
     .def = "\"models/kjv-demo\"", .flag = "--model",
     .help = "model folder: config.json, *.safetensors, tokenizer.json"},
    {.section = "model", .name = "quantization", .type = SRV_CFG_ENUM, .offset = OFF(quantization),
     .choices = quantizations, .def = "\"auto\"",
     .help = "auto: the checkpoint's own INT4 format (AWQ, GPTQ, compressed-tensors) if "
             "config.json declares one, else int4; int4: quantize a 16-bit checkpoint on load; "
             "awq, gptq, compressed-tensors: require that INT4 format; none: run fp16"},
    {.section = "model", .name = "group_size", .type = SRV_CFG_INT, .offset = OFF(group_size),
     .min = -1, .max = 256, .allowed = group_sizes, .n_allowed = 5, .def = "128",
     .help = "INT4 quantization group along K when quantizing on load; -1: one group per "
             "output channel (an INT4 checkpoint keeps its own)"},
    {.section = "model", .name = "symmetric", .type = SRV_CFG_BOOL, .offset = OFF(symmetric),
     .def = "false",
     .help = "symmetric INT4 (zero point 8) instead of a zero point per group, when "
             "quantizing on load (an INT4 checkpoint keeps its own)"},
    {.section = "model", .name = "keep_fp16", .type = SRV_CFG_STR_LIST, .offset = OFF(keep_fp16),
     .min = 0, .max = 64, .def = "[\"embed_tokens\", \"lm_head\"]",
     .help = "weights whose name contains one of these stay fp16"},
    {.section = "model", .name = "fuse_qkv", .type = SRV_CFG_BOOL, .offset = OFF(fuse_qkv),
     .def = "true",
     .help = "fuse the q/k/v and the gate/up projections into one GEMM each"},
    {.section = "model", .name = "max_model_len", .type = SRV_CFG_INT, .offset = OFF(max_model_len),
     .min = 0, .max = 16777216, .def = "0",
     .help = "longest sequence (prompt + output) in tokens; 0: the model's own"},

    {.section = "engine", .name = "backend", .type = SRV_CFG_ENUM, .offset = OFF(backend),
     .choices = backends, .def = "\"cpu\"", .flag = "--backend",
     .help = "where the model runs"},
    {.section = "engine", .name = "devices", .type = SRV_CFG_INT_LIST, .offset = OFF(devices),
     .min = 0, .max = 255, .def = "[0]", .flag = "--devices",
     .help = "GPU ordinals for the cuda backend: [0, 1] or \"0,1\""},
    {.section = "engine", .name = "tp", .type = SRV_CFG_INT, .offset = OFF(tp),
     .min = 1, .max = 16, .def = "1", .flag = "--tp",
     .help = "tensor-parallel ranks: on the cuda backend one per device of engine.devices; on "
             "the cpu backend threads of this process sharing the cores"},
    {.section = "engine", .name = "threads", .type = SRV_CFG_INT, .offset = OFF(threads),
     .min = 0, .max = 1024, .def = "0", .flag = "--threads",
     .help = "CPU backend threads; 0: one per core"},
    {.section = "engine", .name = "max_batch", .type = SRV_CFG_INT, .offset = OFF(max_batch),
     .min = 1, .max = 1024, .def = "128", .flag = "--max-batch",
     .help = "most sequences running at once"},
    {.section = "engine", .name = "max_batched_tokens", .type = SRV_CFG_INT,
     .offset = OFF(max_batched_tokens), .min = 0, .max = 1048576, .def = "0",
     .help = "most tokens in one scheduler step, prefill chunks included; 0: 8192 on CUDA "
             "devices of compute capability 9.0+ with 70 GiB or more, else 2048 (at least "
             "max_batch)"},
    {.section = "engine", .name = "kv_cache_tokens", .type = SRV_CFG_INT,
     .offset = OFF(kv_cache_tokens), .min = 0, .max = 4294967296LL, .def = "0",
     .help = "KV cache capacity in tokens; 0: as much as memory allows"},
    {.section = "engine", .name = "gpu_memory_utilization", .type = SRV_CFG_FLOAT,
     .offset = OFF(gpu_memory_utilization), .fmin = 0.05, .fmax = 1.0, .def = "0.90",
     .help = "fraction of each GPU's memory for weights, KV cache and workspaces"},
    {.section = "engine", .name = "kv_cache_dtype", .type = SRV_CFG_ENUM,
     .offset = OFF(kv_cache_dtype), .choices = kv_dtypes, .def = "\"auto\"",
     .help = "KV cache elements: fp8 (e4m3, a K and a V scale per layer from the checkpoint, "
             "else 1.0) holds twice the tokens of fp16; auto and fp16: the backend's own (fp16 on "
             "cuda, fp32 on cpu)"},
    {.section = "engine", .name = "cuda_kernels", .type = SRV_CFG_ENUM,
     .offset = OFF(cuda_kernels), .choices = cuda_kernel_sets, .def = "\"auto\"",
     .help = "CUDA kernels: auto, those built for each GPU's compute capability; sm75, the "
             "compute capability 7.5 paths (what a T4 runs) on any GPU, to test them or bound a "
             "T4's speed"},
    {.section = "engine", .name = "seed", .type = SRV_CFG_INT, .offset = OFF(seed),
     .min = 0, .max = INT64_MAX, .def = "0",
     .help = "base sampling seed for requests that give none"},
    {.section = "engine", .name = "enforce_eager", .type = SRV_CFG_BOOL,
     .offset = OFF(enforce_eager), .def = "false",
     .help = "run decode steps op by op instead of replaying recorded CUDA graphs (cuda "
             "backend; slower, for diagnosis)"},
    {.section = "engine", .name = "stats_log_interval", .type = SRV_CFG_INT,
     .offset = OFF(stats_log_interval), .min = 0, .max = 86400, .def = "10",
     .help = "seconds between the engine's stats lines in the log while it runs (tokens, steps, "
             "the prefix cache's hit rate); 0: none"},
    {.section = "engine", .name = "warm_up", .type = SRV_CFG_BOOL, .offset = OFF(warm_up),
     .def = "true",
     .help = "before serving, run the prefill and decode shapes once so that the first "
             "requests do not pay kernel loading and graph recording (cuda backend)"},
    {.section = "engine", .name = "prefix_caching", .type = SRV_CFG_BOOL,
     .offset = OFF(prefix_caching), .def = "true",
     .help = "reuse the KV blocks of a prompt prefix cached from earlier requests "
             "(automatic prefix caching); false: compute every prompt whole"},

    {.section = "limits", .name = "max_queue", .type = SRV_CFG_INT, .offset = OFF(max_queue),
     .min = 1, .max = 1048576, .def = "256",
     .help = "requests waiting for admission; more are answered 429"},
    {.section = "limits", .name = "body_limit", .type = SRV_CFG_SIZE, .offset = OFF(body_limit),
     .min = 1024, .max = 1073741824, .def = "\"2MiB\"",
     .help = "largest request body; larger ones are answered 413"},
    {.section = "limits", .name = "connection_memory", .type = SRV_CFG_SIZE,
     .offset = OFF(connection_memory), .min = 8192, .max = 16777216, .def = "\"64KiB\"",
     .help = "buffer for one connection's request line and headers; larger heads are refused"},
    {.section = "limits", .name = "max_connections", .type = SRV_CFG_INT,
     .offset = OFF(max_connections), .min = 1, .max = 65536, .def = "1024",
     .help = "open HTTP connections in total; at the limit idle or slow ones make room, else 503"},
    {.section = "limits", .name = "per_ip_connections", .type = SRV_CFG_INT,
     .offset = OFF(per_ip_connections), .min = 0, .max = 65536, .def = "0",
     .help = "open HTTP connections per client address, more are answered 503; 0: no limit"},
    {.section = "limits", .name = "connection_timeout", .type = SRV_CFG_FLOAT,
     .offset = OFF(connection_timeout), .fmin = 0, .fmax = 86400, .def = "60",
     .help = "seconds a connection may stay idle; 0: no timeout"},
    {.section = "limits", .name = "drain_timeout", .type = SRV_CFG_FLOAT,
     .offset = OFF(drain_timeout), .fmin = 0, .fmax = 3600, .def = "30",
     .help = "seconds to finish running requests on SIGTERM; 0: abort them at once"},

    {.section = "testing", .name = "min_step_us", .type = SRV_CFG_INT,
     .offset = OFF(min_step_us), .min = 0, .max = 10000000, .def = "0",
     .help = "test hook: every engine step lasts at least this many microseconds; 0: off"},
    {.section = "testing", .name = "mock_vocab", .type = SRV_CFG_INT, .offset = OFF(mock_vocab),
     .min = 0, .max = 1048576, .def = "0",
     .help = "test hook: the mock backend's vocabulary; 0: its default"},
    {.section = "testing", .name = "mock_fail_step", .type = SRV_CFG_INT,
     .offset = OFF(mock_fail_step), .min = 0, .max = INT32_MAX, .def = "0",
     .help = "test hook: the mock backend's forward step that fails (engine failure); 0: none"},
    {.section = "testing", .name = "mock_device_sampling", .type = SRV_CFG_BOOL,
     .offset = OFF(mock_device_sampling), .def = "false",
     .help = "test hook: the mock backend samples \"on the device\", so that decode steps are "
             "queued ahead"},
};
/* clang-format on */

const size_t srv_config_nkeys = sizeof srv_config_keys / sizeof srv_config_keys[0];

/* ---- small helpers --------------------------------------------------------------- */

/* A bounded string builder: appends are truncated, never overflow. */
struct sbuf {
    char *p;
    size_t size, len;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->len + 1 >= b->size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->size - b->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len = b->len + (size_t)n < b->size ? b->len + (size_t)n : b->size - 1;
}

static void sb_quoted(struct sbuf *b, const char *s)
{
    sb_printf(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            sb_printf(b, "\\%c", c);
        else if (c == '\n')
            sb_printf(b, "\\n");
        else if (c == '\t')
            sb_printf(b, "\\t");
        else if (c < 0x20 || c == 0x7F)
            sb_printf(b, "\\u%04x", c);
        else
            sb_printf(b, "%c", c);
    }
    sb_printf(b, "\"");
}

/* The shortest %g text that reads back as x. */
static void sb_double(struct sbuf *b, double x)
{
    char tmp[40];
    if (x == floor(x) && fabs(x) < 1e15) {
        sb_printf(b, "%.0f", x);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    sb_printf(b, "%s", tmp);
}

static void *field(struct srv_config *cfg, const struct srv_config_key *k)
{
    return (char *)cfg + k->offset;
}

static const void *cfield(const struct srv_config *cfg, const struct srv_config_key *k)
{
    return (const char *)cfg + k->offset;
}

static size_t key_index(const struct srv_config_key *k)
{
    return (size_t)(k - srv_config_keys);
}

static const struct srv_config_key *key_lookup(const char *section, size_t slen, const char *name)
{
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        if (strcmp(k->name, name) == 0 &&
            (!section || (strncmp(k->section, section, slen) == 0 && k->section[slen] == '\0')))
            return k;
    }
    return NULL;
}

const struct srv_config_key *srv_config_key_find(const char *name)
{
    const char *dot = strchr(name, '.');
    if (dot)
        return key_lookup(name, (size_t)(dot - name), dot + 1);
    const struct srv_config_key *k = key_lookup(NULL, 0, name);
    /* A bare name is accepted only when it is unique across sections. */
    for (size_t i = k ? key_index(k) + 1 : srv_config_nkeys; i < srv_config_nkeys; i++)
        if (strcmp(srv_config_keys[i].name, name) == 0)
            return NULL;
    return k;
}

static bool is_section(const char *s)
{
    for (size_t i = 0; i < srv_config_nkeys; i++)
        if (strcmp(srv_config_keys[i].section, s) == 0)
            return true;
    return false;
}

/* What a key accepts beyond its type: "[1, 1024]", "one of ...". */
static void sb_rule(struct sbuf *b, const struct srv_config_key *k)
{
    switch (k->type) {
    case SRV_CFG_INT:
        if (k->n_allowed) {
            sb_printf(b, "one of ");
            for (size_t i = 0; i < k->n_allowed; i++)
                sb_printf(b, "%s%lld", i ? ", " : "", (long long)k->allowed[i]);
        } else {
            sb_printf(b, "[%lld, %lld]", (long long)k->min, (long long)k->max);
        }
        break;
    case SRV_CFG_SIZE:
    case SRV_CFG_INT_LIST:
        sb_printf(b, "[%lld, %lld]", (long long)k->min, (long long)k->max);
        break;
    case SRV_CFG_FLOAT:
        sb_printf(b, "[");
        sb_double(b, k->fmin);
        sb_printf(b, ", ");
        sb_double(b, k->fmax);
        sb_printf(b, "]");
        break;
    case SRV_CFG_ENUM:
        sb_printf(b, "one of ");
        for (size_t i = 0; k->choices[i]; i++)
            sb_printf(b, "%s\"%s\"", i ? ", " : "", k->choices[i]);
        break;
    case SRV_CFG_BOOL:
    case SRV_CFG_STRING:
    case SRV_CFG_STR_LIST:
        break;
    }
}

static const char *type_desc(enum srv_config_type t)
{
    switch (t) {
    case SRV_CFG_BOOL:
        return "a boolean";
    case SRV_CFG_INT:
        return "an integer";
    case SRV_CFG_FLOAT:
        return "a number";
    case SRV_CFG_STRING:
    case SRV_CFG_ENUM:
        return "a string";
    case SRV_CFG_SIZE:
        return "a size in bytes (an integer, or a string such as \"2MiB\")";
    case SRV_CFG_INT_LIST:
        return "a list of integers";
    case SRV_CFG_STR_LIST:
        return "a list of strings";
    }
    return "?";
}

static const char *node_desc(enum inf_toml_type t)
{
    static const char *const names[] = {"a table", "a string",  "an integer",
                                        "a float", "a boolean", "an array"};
    return (unsigned)t < 6 ? names[t] : "?";
}

static bool why_set(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool why_set(char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, WHY_LEN, fmt, ap);
    va_end(ap);
    return false;
}

static bool check_int(const struct srv_config_key *k, int64_t v, char *why)
{
    bool ok = v >= k->min && v <= k->max;
    if (k->n_allowed) {
        ok = false;
        for (size_t i = 0; i < k->n_allowed; i++)
            ok = ok || v == k->allowed[i];
    }
    if (ok)
        return true;
    char rule[96];
    struct sbuf b = {rule, sizeof rule, 0};
    sb_rule(&b, k);
    return why_set(why, "must be %s%s, got %lld", k->n_allowed ? "" : "in ", rule, (long long)v);
}

/* "2097152", "512KiB", "2 MiB", "1GiB", "100B" -> bytes. */
static bool parse_size(const char *s, int64_t *out)
{
    static const struct {
        const char *unit;
        int64_t mul;
    } units[] = {{"", 1}, {"B", 1}, {"KiB", 1LL << 10}, {"MiB", 1LL << 20}, {"GiB", 1LL << 30}};
    int64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (*p - '0');
    }
    while (*p == ' ')
        p++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].unit) == 0) {
            if (v > INT64_MAX / units[i].mul)
                return false;
            *out = v * units[i].mul;
            return true;
        }
    }
    return false;
}

static bool parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE)
        return false;
    *out = (int64_t)v;
    return true;
}

/* "0,1, 2" -> integers; false with why on a bad item. */
static bool parse_int_list(struct inf_arena *a, const char *s, int64_t **v, size_t *n, char *why)
{
    long count = inf_int_list_parse(s, NULL, 0);
    if (count < 0)
        return why_set(why, "must be a list of integers such as \"0,1\", got \"%.64s\"", s);
    *n = 0;
    *v = inf_arena_calloc(a, count ? (size_t)count : 1, sizeof **v);
    if (!*v)
        return why_set(why, "out of memory");
    *n = (size_t)inf_int_list_parse(s, *v, (size_t)count);
    return true;
}

/* ---- the one path every value takes ----------------------------------------------- */

static bool apply(struct srv_config *cfg, const struct srv_config_key *k,
                  const struct inf_toml_node *v, char *why)
{
    void *f = field(cfg, k);
    struct inf_arena *a = &cfg->arena;
    int64_t iv;
    switch (k->type) {
    case SRV_CFG_BOOL:
        if (v->type != INF_TOML_BOOL)
            break;
        *(bool *)f = v->b;
        return true;
    case SRV_CFG_INT:
        if (v->type != INF_TOML_INT)
            break;
        if (!check_int(k, v->i, why))
            return false;
        *(int64_t *)f = v->i;
        return true;
    case SRV_CFG_FLOAT: {
        if (v->type != INF_TOML_INT && v->type != INF_TOML_FLOAT)
            break;
        double x = v->type == INF_TOML_INT ? (double)v->i : v->f;
        if (!(x >= k->fmin && x <= k->fmax)) {
            char rule[96];
            struct sbuf b = {rule, sizeof rule, 0};
            sb_rule(&b, k);
            return why_set(why, "must be in %s, got %g", rule, x);
        }
        *(double *)f = x;
        return true;
    }
    case SRV_CFG_STRING: {
        if (v->type != INF_TOML_STRING)
            break;
        const char *s = inf_arena_strndup(a, v->str, v->str_len);
        if (!s)
            return why_set(why, "out of memory");
        *(const char **)f = s;
        return true;
    }
    case SRV_CFG_ENUM:
        if (v->type != INF_TOML_STRING)
            break;
        for (size_t i = 0; k->choices[i]; i++) {
            if (strcmp(k->choices[i], v->str) == 0) {
                *(const char **)f = k->choices[i];
                return true;
            }
        }
        char rule[96];
        struct sbuf b = {rule, sizeof rule, 0};
        sb_rule(&b, k);
        return why_set(why, "must be %s, got \"%.64s\"", rule, v->str);
    case SRV_CFG_SIZE:
        if (v->type == INF_TOML_INT)
            iv = v->i;
        else if (v->type != INF_TOML_STRING)
            break;
        else if (!parse_size(v->str, &iv))
            return why_set(why, "must be a size such as 2097152 or \"2MiB\", got \"%.64s\"",
                           v->str);
        if (!check_int(k, iv, why))
            return false;
        *(int64_t *)f = iv;
        return true;
    case SRV_CFG_INT_LIST: {
        int64_t *items;
        size_t n = 0;
        if (v->type == INF_TOML_STRING) {
            if (!parse_int_list(a, v->str, &items, &n, why))
                return false;
        } else if (v->type == INF_TOML_ARRAY) {
            if (!(items = inf_arena_calloc(a, v->count + 1, sizeof *items)))
                return why_set(why, "out of memory");
            for (const struct inf_toml_node *it = v->first; it; it = it->next, n++) {
                if (it->type != INF_TOML_INT)
                    return why_set(why, "must be a list of integers, item %zu is %s", n + 1,
                                   node_desc(it->type));
                items[n] = it->i;
            }
        } else {
            break;
        }
        if (n == 0)
            return why_set(why, "must not be empty");
        for (size_t i = 0; i < n; i++) {
            if (!check_int(k, items[i], why))
                return false;
            for (size_t j = 0; j < i; j++)
                if (items[j] == items[i])
                    return why_set(why, "lists %lld twice", (long long)items[i]);
        }
        *(struct srv_int_list *)f = (struct srv_int_list){items, n};
        return true;
    }
    case SRV_CFG_STR_LIST: {
        if (v->type != INF_TOML_ARRAY)
            break;
        if ((int64_t)v->count > k->max)
            return why_set(why, "must have at most %lld items, got %zu", (long long)k->max,
                           v->count);
        const char **items = inf_arena_calloc(a, v->count + 1, sizeof *items);
        size_t n = 0;
        if (!items)
            return why_set(why, "out of memory");
        for (const struct inf_toml_node *it = v->first; it; it = it->next, n++) {
            if (it->type != INF_TOML_STRING)
                return why_set(why, "must be a list of strings, item %zu is %s", n + 1,
                               node_desc(it->type));
            if (!(items[n] = inf_arena_strndup(a, it->str, it->str_len)))
                return why_set(why, "out of memory");
        }
        *(struct srv_str_list *)f = (struct srv_str_list){items, n};
        return true;
    }
    }
    return why_set(why, "must be %s, got %s", type_desc(k->type), node_desc(v->type));
}

static void set_origin(struct srv_config *cfg, const struct srv_config_key *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_origin(struct srv_config *cfg, const struct srv_config_key *k, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    const char *s = inf_arena_strdup(&cfg->arena, buf);
    cfg->origin[key_index(k)] = s ? s : "?";
}

inf_status_t srv_config_init(struct srv_config *cfg, struct inf_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    inf_arena_init(&cfg->arena, 0);
    cfg->origin = inf_arena_calloc(&cfg->arena, srv_config_nkeys, sizeof *cfg->origin);
    if (!cfg->origin)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char text[256], why[WHY_LEN];
        struct inf_arena tmp;
        struct inf_toml_node *root;
        struct inf_err terr;
        snprintf(text, sizeof text, "v = %s", k->def);
        inf_arena_init(&tmp, 0);
        inf_status_t st = inf_toml_parse(text, strlen(text), &tmp, &root, &terr);
        bool ok = st == INF_OK && apply(cfg, k, inf_toml_get(root, "v"), why);
        inf_arena_fini(&tmp);
        if (!ok)
            return inf_err_set(err, st == INF_E_NOMEM ? st : INF_E_INTERNAL,
                               "default of %s.%s is invalid: %s", k->section, k->name,
                               st == INF_OK ? why : terr.msg);
        cfg->origin[i] = "default";
    }
    return INF_OK;
}

void srv_config_fini(struct srv_config *cfg)
{
    if (cfg)
        inf_arena_fini(&cfg->arena);
}

/* ---- sources ------------------------------------------------------------------------ */

inf_status_t srv_config_load_toml(struct srv_config *cfg, const char *name, const char *text,
                                  size_t len, struct inf_err *err)
{
    struct inf_arena tmp;
    struct inf_toml_node *root;
    struct inf_err terr;
    char why[WHY_LEN];
    inf_status_t st;
    inf_arena_init(&tmp, 0);
    if ((st = inf_toml_parse(text, len, &tmp, &root, &terr)) != INF_OK) {
        inf_err_set(err, st, "%s: %s", name, terr.msg);
        goto out;
    }
    for (const struct inf_toml_node *sec = root->first; sec; sec = sec->next) {
        if (!is_section(sec->key)) {
            const struct srv_config_key *k = srv_config_key_find(sec->key);
            if (k)
                st = inf_err_set(err, INF_E_INVALID, "%s:%d: unknown key '%s' (it belongs in [%s])",
                                 name, sec->line, sec->key, k->section);
            else
                st = inf_err_set(err, INF_E_INVALID, "%s:%d: unknown %s '%s'", name, sec->line,
                                 sec->type == INF_TOML_TABLE ? "section" : "key", sec->key);
            goto out;
        }
        if (sec->type != INF_TOML_TABLE) {
            st = inf_err_set(err, INF_E_INVALID, "%s:%d: key '%s' must be a section [%s]", name,
                             sec->line, sec->key, sec->key);
            goto out;
        }
        for (const struct inf_toml_node *kv = sec->first; kv; kv = kv->next) {
            const struct srv_config_key *k = key_lookup(sec->key, strlen(sec->key), kv->key);
            if (!k) {
                st = inf_err_set(err, INF_E_INVALID, "%s:%d: unknown key '%s.%s'", name, kv->line,
                                 sec->key, kv->key);
                goto out;
            }
            if (!apply(cfg, k, kv, why)) {
                st = inf_err_set(err, INF_E_INVALID, "%s:%d: key '%s.%s': %s", name, kv->line,
                                 k->section, k->name, why);
                goto out;
            }
            set_origin(cfg, k, "%s:%d", name, kv->line);
        }
    }
out:
    inf_arena_fini(&tmp);
    return st;
}

inf_status_t srv_config_load_file(struct srv_config *cfg, const char *path, struct inf_err *err)
{
    enum { MAX_FILE = 1 << 20 };
    FILE *f = fopen(path, "rb");
    if (!f)
        return inf_err_set(err, INF_E_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = malloc(MAX_FILE + 1);
    if (!text) {
        fclose(f);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    size_t len = fread(text, 1, MAX_FILE + 1, f);
    inf_status_t st = INF_OK;
    if (ferror(f))
        st = inf_err_set(err, INF_E_IO, "%s: cannot read: %s", path, strerror(errno));
    else if (len > MAX_FILE)
        st = inf_err_set(err, INF_E_TOOBIG, "%s: larger than %d bytes", path, MAX_FILE);
    fclose(f);
    if (st == INF_OK && (st = srv_config_load_toml(cfg, path, text, len, err)) == INF_OK) {
        cfg->config_path = inf_arena_strdup(&cfg->arena, path);
        if (!cfg->config_path)
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    free(text);
    return st;
}

inf_status_t srv_config_set(struct srv_config *cfg, const char *key, const char *value,
                            const char *origin, struct inf_err *err)
{
    const struct srv_config_key *k = srv_config_key_find(key);
    if (!k)
        return inf_err_set(err, INF_E_NOTFOUND, "%s: unknown key '%s' (see --help)", origin, key);
    struct inf_toml_node node = {.type = INF_TOML_STRING, .str = value, .str_len = strlen(value)};
    struct inf_arena tmp;
    char why[WHY_LEN];
    bool ok = true;
    inf_arena_init(&tmp, 0);
    switch (k->type) {
    case SRV_CFG_BOOL:
        node.type = INF_TOML_BOOL;
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes") ||
            !strcmp(value, "on"))
            node.b = true;
        else if (strcmp(value, "false") && strcmp(value, "0") && strcmp(value, "no") &&
                 strcmp(value, "off"))
            ok = why_set(why, "must be true or false, got \"%.64s\"", value);
        break;
    case SRV_CFG_INT:
        node.type = INF_TOML_INT;
        if (!parse_i64(value, &node.i))
            ok = why_set(why, "must be an integer, got \"%.64s\"", value);
        break;
    case SRV_CFG_FLOAT: {
        char *end;
        node.type = INF_TOML_FLOAT;
        node.f = strtod(value, &end);
        if (end == value || *end != '\0')
            ok = why_set(why, "must be a number, got \"%.64s\"", value);
        break;
    }
    case SRV_CFG_STR_LIST: {
        /* "a,b" -> ["a", "b"]; empty items are dropped, so "" is the empty list. */
        node.type = INF_TOML_ARRAY;
        for (const char *p = value; ok && *p;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            struct inf_toml_node *it = inf_arena_calloc(&tmp, 1, sizeof *it);
            if (!it || !(it->str = inf_arena_strndup(&tmp, p, len))) {
                ok = why_set(why, "out of memory");
                break;
            }
            it->type = INF_TOML_STRING;
            it->str_len = len;
            if (len) {
                *(node.last ? &node.last->next : &node.first) = it;
                node.last = it;
                node.count++;
            }
            p = comma ? comma + 1 : p + len;
        }
        break;
    }
    case SRV_CFG_STRING:
    case SRV_CFG_ENUM:
    case SRV_CFG_SIZE:
    case SRV_CFG_INT_LIST:
        break; /* apply() reads the text */
    }
    ok = ok && apply(cfg, k, &node, why);
    inf_arena_fini(&tmp);
    if (!ok)
        return inf_err_set(err, INF_E_INVALID, "%s: %s", origin, why);
    set_origin(cfg, k, "%s", origin);
    return INF_OK;
}

inf_status_t srv_config_finish(struct srv_config *cfg, struct inf_err *err)
{
    char why[WHY_LEN];
    const struct srv_config_key *bad = NULL;
    if (!cfg->served_model_name[0]) {
        /* The model folder's base name: "models/kjv-demo/" -> "kjv-demo". */
        size_t len = strlen(cfg->model);
        while (len > 1 && cfg->model[len - 1] == '/')
            len--;
        size_t start = len;
        while (start > 0 && cfg->model[start - 1] != '/')
            start--;
        const char *name =
            len > start ? inf_arena_strndup(&cfg->arena, cfg->model + start, len - start) : "model";
        if (!name)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        cfg->served_model_name = name;
        set_origin(cfg, srv_config_key_find("server.served_model_name"), "from model.model");
    }
    const bool cuda = strcmp(cfg->backend, "cuda") == 0;
    if (cfg->tp > 1 && strcmp(cfg->backend, "mock") == 0) {
        bad = srv_config_key_find("engine.tp");
        why_set(why,
                "tensor parallelism (%lld ranks) needs backend \"cpu\" or \"cuda\", not "
                "\"mock\"",
                (long long)cfg->tp);
    } else if (cuda && (size_t)cfg->tp > cfg->devices.n) {
        bad = srv_config_key_find("engine.tp");
        why_set(why, "%lld ranks need as many devices, engine.devices lists %zu",
                (long long)cfg->tp, cfg->devices.n);
    } else if (cuda && cfg->devices.n > (size_t)cfg->tp) {
        bad = srv_config_key_find("engine.devices");
        why_set(why, "lists %zu devices, but engine.tp = %lld uses %lld of them", cfg->devices.n,
                (long long)cfg->tp, (long long)cfg->tp);
    } else if (cfg->max_batched_tokens != 0 && cfg->max_batched_tokens < cfg->max_batch) {
        bad = srv_config_key_find("engine.max_batched_tokens");
        why_set(why, "must be at least engine.max_batch (%lld), got %lld",
                (long long)cfg->max_batch, (long long)cfg->max_batched_tokens);
    }
    if (bad)
        return inf_err_set(err, INF_E_INVALID, "%s: key '%s.%s': %s", cfg->origin[key_index(bad)],
                           bad->section, bad->name, why);
    return INF_OK;
}

/* ---- command line ------------------------------------------------------------------- */

enum flag_kind { FLAG_KEY, FLAG_CONFIG, FLAG_SET, FLAG_PRINT };

struct flag {
    enum flag_kind kind;
    const struct srv_config_key *key; /* FLAG_KEY */
    char name[48];                    /* "--port" */
    const char *value;                /* NULL for FLAG_PRINT */
};

/* Read the flag at argv[*i] (advancing *i past its value). */
static inf_status_t next_flag(int argc, char **argv, int *i, struct flag *fl, struct inf_err *err)
{
    const char *arg = argv[*i];
    if (strncmp(arg, "--", 2) != 0)
        return inf_err_set(err, INF_E_INVALID, "unexpected argument '%.64s' (see --help)", arg);
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= sizeof fl->name)
        return inf_err_set(err, INF_E_INVALID, "unknown flag '%.64s' (see --help)", arg);
    memcpy(fl->name, arg, len);
    fl->name[len] = '\0';
    fl->key = NULL;
    if (strcmp(fl->name, "--config") == 0) {
        fl->kind = FLAG_CONFIG;
    } else if (strcmp(fl->name, "--set") == 0) {
        fl->kind = FLAG_SET;
    } else if (strcmp(fl->name, "--print-config") == 0) {
        fl->kind = FLAG_PRINT;
        fl->value = NULL;
        if (eq)
            return inf_err_set(err, INF_E_INVALID, "--print-config takes no value");
        return INF_OK;
    } else {
        fl->kind = FLAG_KEY;
        for (size_t k = 0; k < srv_config_nkeys && !fl->key; k++)
            if (srv_config_keys[k].flag && strcmp(srv_config_keys[k].flag, fl->name) == 0)
                fl->key = &srv_config_keys[k];
        if (!fl->key)
            return inf_err_set(err, INF_E_INVALID, "unknown flag '%s' (see --help)", fl->name);
    }
    if (eq) {
        fl->value = eq + 1;
    } else if (*i + 1 < argc) {
        fl->value = argv[++*i];
    } else {
        return inf_err_set(err, INF_E_INVALID, "%s needs a value", fl->name);
    }
    return INF_OK;
}

inf_status_t srv_config_from_args(struct srv_config *cfg, int argc, char **argv,
                                  const char *env_api_key, enum srv_config_action *action,
                                  struct inf_err *err)
{
    struct flag fl;
    const char *config = NULL;
    inf_status_t st;
    *action = SRV_CONFIG_RUN;
    /* --help and --version win over everything, even a bad flag. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            *action = SRV_CONFIG_HELP;
            return INF_OK;
        }
        if (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V")) {
            *action = SRV_CONFIG_VERSION;
            return INF_OK;
        }
    }
    /* First pass: every flag known and complete; find the file. */
    for (int i = 1; i < argc; i++) {
        if ((st = next_flag(argc, argv, &i, &fl, err)) != INF_OK)
            return st;
        if (fl.kind == FLAG_CONFIG)
            config = fl.value;
        if (fl.kind == FLAG_PRINT)
            *action = SRV_CONFIG_PRINT;
    }
    if (config && (st = srv_config_load_file(cfg, config, err)) != INF_OK)
        return st;
    if (env_api_key && *env_api_key &&
        (st = srv_config_set(cfg, "server.api_key", env_api_key, "INT4SERVE_API_KEY", err)) !=
            INF_OK)
        return st;
    /* Second pass: the flags, in order; a later one wins. */
    for (int i = 1; i < argc; i++) {
        next_flag(argc, argv, &i, &fl, NULL);
        if (fl.kind == FLAG_KEY) {
            char key[96];
            snprintf(key, sizeof key, "%s.%s", fl.key->section, fl.key->name);
            st = srv_config_set(cfg, key, fl.value, fl.name, err);
        } else if (fl.kind == FLAG_SET) {
            const char *eq = strchr(fl.value, '=');
            char key[96], origin[128];
            if (!eq || eq == fl.value || (size_t)(eq - fl.value) >= sizeof key)
                return inf_err_set(err, INF_E_INVALID, "--set needs SECTION.KEY=VALUE, got '%.64s'",
                                   fl.value);
            memcpy(key, fl.value, (size_t)(eq - fl.value));
            key[eq - fl.value] = '\0';
            snprintf(origin, sizeof origin, "--set %s", key);
            st = srv_config_set(cfg, key, eq + 1, origin, err);
        }
        if (st != INF_OK)
            return st;
    }
    return srv_config_finish(cfg, err);
}

/* ---- output ------------------------------------------------------------------------- */

char *srv_config_format(const struct srv_config *cfg, const struct srv_config_key *k, char *buf,
                        size_t size)
{
    struct sbuf b = {buf, size, 0};
    const void *f = cfield(cfg, k);
    if (size)
        buf[0] = '\0';
    switch (k->type) {
    case SRV_CFG_BOOL:
        sb_printf(&b, "%s", *(const bool *)f ? "true" : "false");
        break;
    case SRV_CFG_INT:
        sb_printf(&b, "%lld", (long long)*(const int64_t *)f);
        break;
    case SRV_CFG_FLOAT:
        sb_double(&b, *(const double *)f);
        break;
    case SRV_CFG_STRING:
    case SRV_CFG_ENUM:
        sb_quoted(&b, *(const char *const *)f);
        break;
    case SRV_CFG_SIZE: {
        int64_t v = *(const int64_t *)f;
        if (v > 0 && v % (1LL << 30) == 0)
            sb_printf(&b, "\"%lldGiB\"", (long long)(v >> 30));
        else if (v > 0 && v % (1LL << 20) == 0)
            sb_printf(&b, "\"%lldMiB\"", (long long)(v >> 20));
        else if (v > 0 && v % (1LL << 10) == 0)
            sb_printf(&b, "\"%lldKiB\"", (long long)(v >> 10));
        else
            sb_printf(&b, "%lld", (long long)v);
        break;
    }
    case SRV_CFG_INT_LIST: {
        const struct srv_int_list *l = f;
        sb_printf(&b, "[");
        for (size_t i = 0; i < l->n; i++)
            sb_printf(&b, "%s%lld", i ? ", " : "", (long long)l->v[i]);
        sb_printf(&b, "]");
        break;
    }
    case SRV_CFG_STR_LIST: {
        const struct srv_str_list *l = f;
        sb_printf(&b, "[");
        for (size_t i = 0; i < l->n; i++) {
            sb_printf(&b, "%s", i ? ", " : "");
            sb_quoted(&b, l->v[i]);
        }
        sb_printf(&b, "]");
        break;
    }
    }
    return buf;
}

/* "<help> (one of ...; flag --x)" for one key. */
static void sb_describe(struct sbuf *b, const struct srv_config_key *k)
{
    char rule[128];
    struct sbuf r = {rule, sizeof rule, 0};
    rule[0] = '\0';
    sb_rule(&r, k);
    sb_printf(b, "%s", k->help);
    if (rule[0] || k->flag) {
        sb_printf(b, " (%s%s%s%s)", rule, rule[0] && k->flag ? "; " : "", k->flag ? "flag " : "",
                  k->flag ? k->flag : "");
    }
}

void srv_config_print_help(FILE *f)
{
    fprintf(f,
            "Usage: int4serve [--config FILE] [FLAGS] [--set SECTION.KEY=VALUE ...]\n\n"
            "Serves a Llama-family model with INT4 weights over an OpenAI-compatible HTTP "
            "API.\n\nFlags:\n"
            "  %-24s read the configuration from a TOML file\n",
            "--config FILE");
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        if (k->flag) {
            char name[64];
            snprintf(name, sizeof name, "%s VALUE", k->flag);
            fprintf(f, "  %-24s set %s.%s\n", name, k->section, k->name);
        }
    }
    fprintf(f,
            "  %-24s set any key below (KEY is section.key, or the key alone)\n"
            "  %-24s print the effective configuration as TOML and exit\n"
            "  %-24s print the version and exit\n"
            "  %-24s print this help and exit\n\n"
            "Keys, with their defaults ([section] key = value in the file):\n",
            "--set KEY=VALUE", "--print-config", "--version, -V", "--help, -h");
    const char *section = "";
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char line[512], kv[160];
        struct sbuf b = {line, sizeof line, 0};
        if (strcmp(section, k->section) != 0)
            fprintf(f, "\n[%s]\n", section = k->section);
        snprintf(kv, sizeof kv, "%s = %s", k->name, k->def);
        sb_describe(&b, k);
        fprintf(f, "  %-42s %s\n", kv, line);
    }
    fprintf(f, "\nThe environment variable INT4SERVE_API_KEY sets server.api_key.\n"
               "Precedence: flags, then INT4SERVE_API_KEY, then the file, then the defaults.\n");
}

void srv_config_print_toml(const struct srv_config *cfg, FILE *f)
{
    const char *section = "";
    fprintf(f, "# int4serve configuration: every key with its value and what it does.\n"
               "# Precedence: command-line flags, then INT4SERVE_API_KEY (api_key), then this\n"
               "# file, then the defaults.\n");
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char line[512], val[512];
        struct sbuf b = {line, sizeof line, 0};
        if (strcmp(section, k->section) != 0)
            fprintf(f, "\n[%s]\n", section = k->section);
        sb_describe(&b, k);
        fprintf(f, "# %s\n", line);
        if (k->offset == OFF(api_key) && cfg->api_key[0])
            fprintf(f, "# %s is set (%s) and not shown\n%s = \"\"\n", k->name, cfg->origin[i],
                    k->name);
        else
            fprintf(f, "%s = %s\n", k->name, srv_config_format(cfg, k, val, sizeof val));
    }
}

void srv_config_log(const struct srv_config *cfg)
{
    if (cfg->config_path)
        inf_log(INFO, "config file %s", cfg->config_path);
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char val[512];
        if (k->offset == OFF(api_key))
            snprintf(val, sizeof val, "%s", cfg->api_key[0] ? "\"****\"" : "\"\"");
        else
            srv_config_format(cfg, k, val, sizeof val);
        inf_log(INFO, "config %s.%s = %s (%s)", k->section, k->name, val, cfg->origin[i]);
    }
}
