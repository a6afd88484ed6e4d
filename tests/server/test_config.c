/* Configuration: the table against config.example.toml and the documented
 * defaults, every kind of error with the file, line and key it names, and the
 * precedence of flags over the environment over the file over the defaults. */
#include "server/srv.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct srv_config cfg;
static struct inf_err err;

static void setup(void)
{
    inf_err_clear(&err);
    ck_assert_int_eq(srv_config_init(&cfg, &err), INF_OK);
}

static void teardown(void)
{
    srv_config_fini(&cfg);
}

static char *read_source_file(const char *rel, size_t *len)
{
    const char *dir = getenv("INT4SERVE_SOURCE_DIR");
    ck_assert_msg(dir != NULL, "INT4SERVE_SOURCE_DIR is not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char *buf = malloc(1 << 20);
    *len = fread(buf, 1, (1 << 20) - 1, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

static const void *fld(const struct srv_config *c, const struct srv_config_key *k)
{
    return (const char *)c + k->offset;
}

static bool field_eq(const struct srv_config *a, const struct srv_config *b,
                     const struct srv_config_key *k)
{
    const void *x = fld(a, k), *y = fld(b, k);
    switch (k->type) {
    case SRV_CFG_BOOL:
        return *(const bool *)x == *(const bool *)y;
    case SRV_CFG_INT:
    case SRV_CFG_SIZE:
        return *(const int64_t *)x == *(const int64_t *)y;
    case SRV_CFG_FLOAT:
        return *(const double *)x == *(const double *)y;
    case SRV_CFG_STRING:
    case SRV_CFG_ENUM:
        return strcmp(*(const char *const *)x, *(const char *const *)y) == 0;
    case SRV_CFG_INT_LIST: {
        const struct srv_int_list *l = x, *m = y;
        if (l->n != m->n)
            return false;
        for (size_t i = 0; i < l->n; i++)
            if (l->v[i] != m->v[i])
                return false;
        return true;
    }
    case SRV_CFG_STR_LIST: {
        const struct srv_str_list *l = x, *m = y;
        if (l->n != m->n)
            return false;
        for (size_t i = 0; i < l->n; i++)
            if (strcmp(l->v[i], m->v[i]) != 0)
                return false;
        return true;
    }
    }
    return false;
}

static const char *origin_of(const char *key)
{
    const struct srv_config_key *k = srv_config_key_find(key);
    ck_assert_ptr_nonnull(k);
    return cfg.origin[k - srv_config_keys];
}

/* ---- the table ------------------------------------------------------------------- */

START_TEST(documented_defaults)
{
    /* The defaults as the project documents them, written out independently. */
    ck_assert_str_eq(cfg.host, "127.0.0.1");
    ck_assert_int_eq(cfg.port, 8000);
    ck_assert_str_eq(cfg.model, "models/kjv-demo");
    ck_assert_str_eq(cfg.served_model_name, "");
    ck_assert_str_eq(cfg.backend, "cpu");
    ck_assert_uint_eq(cfg.devices.n, 1);
    ck_assert_int_eq(cfg.devices.v[0], 0);
    ck_assert_int_eq(cfg.tp, 1);
    ck_assert_int_eq(cfg.threads, 0);
    ck_assert_int_eq(cfg.max_batch, 128);
    ck_assert_int_eq(cfg.max_batched_tokens, 0); /* the engine chooses by device */
    ck_assert_int_eq(cfg.max_model_len, 0);
    ck_assert_int_eq(cfg.kv_cache_tokens, 0);
    ck_assert(cfg.gpu_memory_utilization == 0.90);
    ck_assert_str_eq(cfg.quantization, "auto");
    ck_assert_int_eq(cfg.group_size, 128);
    ck_assert(!cfg.symmetric);
    ck_assert_uint_eq(cfg.keep_fp16.n, 2);
    ck_assert_str_eq(cfg.keep_fp16.v[0], "embed_tokens");
    ck_assert_str_eq(cfg.keep_fp16.v[1], "lm_head");
    ck_assert(cfg.fuse_qkv);
    ck_assert_int_eq(cfg.max_queue, 256);
    ck_assert_int_eq(cfg.body_limit, 2 * 1024 * 1024);
    ck_assert_int_eq(cfg.connection_memory, 64 * 1024);
    ck_assert(cfg.drain_timeout == 30.0);
    ck_assert(cfg.connection_timeout == 60.0);
    ck_assert_int_eq(cfg.max_connections, 1024);
    /* Off: a load balancer, or a 256-connection wrk, from one address works */
    ck_assert_int_eq(cfg.per_ip_connections, 0);
    ck_assert(cfg.header_timeout == 20.0);
    ck_assert(cfg.body_timeout == 60.0);
    ck_assert_uint_eq(cfg.cors_origins.n, 0);
    ck_assert_uint_eq(cfg.allowed_hosts.n, 0);
    ck_assert_str_eq(cfg.api_key, "");
    ck_assert_str_eq(cfg.log_level, "info");
    ck_assert_int_eq(cfg.seed, 0);
    for (size_t i = 0; i < srv_config_nkeys; i++)
        ck_assert_str_eq(cfg.origin[i], "default");
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_OK);
    ck_assert_str_eq(cfg.served_model_name, "kjv-demo");
}
END_TEST

START_TEST(table_names_and_flags)
{
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char full[128];
        snprintf(full, sizeof full, "%s.%s", k->section, k->name);
        /* Both spellings find the key: bare names are unique. */
        ck_assert_ptr_eq(srv_config_key_find(full), k);
        ck_assert_ptr_eq(srv_config_key_find(k->name), k);
        ck_assert_msg(k->help && strlen(k->help) > 10 && !strchr(k->help, '\n'), "%s", full);
        for (size_t j = 0; j < i; j++)
            ck_assert(!k->flag || !srv_config_keys[j].flag ||
                      strcmp(k->flag, srv_config_keys[j].flag) != 0);
    }
    static const char *const flags[][2] = {
        {"--host", "server.host"},           {"--port", "server.port"},
        {"--model", "model.model"},          {"--backend", "engine.backend"},
        {"--devices", "engine.devices"},     {"--tp", "engine.tp"},
        {"--max-batch", "engine.max_batch"}, {"--threads", "engine.threads"},
        {"--log-level", "server.log_level"}, {"--api-key", "server.api_key"},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const struct srv_config_key *k = srv_config_key_find(flags[i][1]);
        ck_assert_ptr_nonnull(k);
        ck_assert_str_eq(k->flag, flags[i][0]);
    }
    ck_assert_ptr_null(srv_config_key_find("nope"));
    ck_assert_ptr_null(srv_config_key_find("engine.port"));
}
END_TEST

START_TEST(example_matches_table)
{
    size_t len;
    char *text = read_source_file("config.example.toml", &len);
    struct inf_arena a;
    struct inf_toml_node *root;
    inf_arena_init(&a, 0);
    ck_assert_msg(inf_toml_parse(text, len, &a, &root, &err) == INF_OK, "%s", err.msg);
    /* Every key of the table is in the example, with a comment line above it. */
    size_t per_section_total = 0;
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        const struct inf_toml_node *v = inf_toml_find(root, k->section, k->name);
        ck_assert_msg(v != NULL, "config.example.toml lacks %s.%s", k->section, k->name);
        const char *line = text;
        for (int l = 1; l < v->line - 1; l++)
            line = strchr(line, '\n') + 1;
        ck_assert_msg(v->line > 1 && line[0] == '#', "%s.%s has no comment above it", k->section,
                      k->name);
    }
    /* No extra keys or sections. */
    for (const struct inf_toml_node *sec = root->first; sec; sec = sec->next) {
        ck_assert_int_eq(sec->type, INF_TOML_TABLE);
        for (const struct inf_toml_node *kv = sec->first; kv; kv = kv->next) {
            char full[128];
            snprintf(full, sizeof full, "%s.%s", sec->key, kv->key);
            ck_assert_msg(srv_config_key_find(full) != NULL, "extra key %s", full);
            per_section_total++;
        }
    }
    ck_assert_uint_eq(per_section_total, srv_config_nkeys);
    /* Each value in the example is the default. */
    struct srv_config ex;
    ck_assert_int_eq(srv_config_init(&ex, &err), INF_OK);
    ck_assert_msg(srv_config_load_toml(&ex, "config.example.toml", text, len, &err) == INF_OK, "%s",
                  err.msg);
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        ck_assert_msg(field_eq(&ex, &cfg, k), "config.example.toml: %s.%s is not the default %s",
                      k->section, k->name, k->def);
        ck_assert_str_ne(ex.origin[i], "default");
    }
    srv_config_fini(&ex);
    inf_arena_fini(&a);
    free(text);
}
END_TEST

START_TEST(config_doc_lists_every_key)
{
    size_t len;
    char *doc = read_source_file("docs/CONFIG.md", &len);
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char want[256];
        snprintf(want, sizeof want, "| `%s` | `%s` |", k->name, k->def);
        ck_assert_msg(strstr(doc, want) != NULL, "docs/CONFIG.md lacks the row %s", want);
    }
    free(doc);
}
END_TEST

START_TEST(deploy_config_is_valid)
{
    /* The container configuration in deploy/ loads and keeps the drain the
     * unit and the manifests are sized for. */
    size_t len;
    char *text = read_source_file("deploy/config.toml", &len);
    ck_assert_msg(srv_config_load_toml(&cfg, "deploy/config.toml", text, len, &err) == INF_OK, "%s",
                  err.msg);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_OK);
    ck_assert_str_eq(cfg.host, "0.0.0.0");
    ck_assert_str_eq(cfg.backend, "cuda");
    ck_assert(cfg.drain_timeout == 30.0);
    free(text);
}
END_TEST

/* ---- file errors -------------------------------------------------------------------- */

static void load_fails(const char *text, inf_status_t code, const char *want)
{
    inf_status_t st = srv_config_load_toml(&cfg, "config.toml", text, strlen(text), &err);
    ck_assert_int_eq(st, code);
    ck_assert_int_eq(err.code, code);
    ck_assert_str_eq(err.msg, want);
}

START_TEST(file_unknown_key)
{
    load_fails("[engine]\nmax_batch = 4\nmax_batchh = 3\n", INF_E_INVALID,
               "config.toml:3: unknown key 'engine.max_batchh'");
    load_fails("# c\n[engin]\nmax_batch = 4\n", INF_E_INVALID,
               "config.toml:2: unknown section 'engin'");
    load_fails("\n\nmax_batch = 4\n", INF_E_INVALID,
               "config.toml:3: unknown key 'max_batch' (it belongs in [engine])");
    load_fails("[server]\nport = 1\n[server.tls]\ncert = \"x\"\n", INF_E_INVALID,
               "config.toml:3: unknown key 'server.tls'");
    load_fails("server = 1\n", INF_E_INVALID,
               "config.toml:1: key 'server' must be a section [server]");
}
END_TEST

START_TEST(file_wrong_type)
{
    load_fails("[server]\nport = \"8000\"\n", INF_E_INVALID,
               "config.toml:2: key 'server.port': must be an integer, got a string");
    load_fails("[model]\nsymmetric = \"yes\"\n", INF_E_INVALID,
               "config.toml:2: key 'model.symmetric': must be a boolean, got a string");
    load_fails("[model]\nkeep_fp16 = [\"a\", 1]\n", INF_E_INVALID,
               "config.toml:2: key 'model.keep_fp16': must be a list of strings, item 2 is an "
               "integer");
    load_fails("[engine]\nbackend = 1\n", INF_E_INVALID,
               "config.toml:2: key 'engine.backend': must be a string, got an integer");
    load_fails("[engine]\ndevices = [0, 1.5]\n", INF_E_INVALID,
               "config.toml:2: key 'engine.devices': must be a list of integers, item 2 is a "
               "float");
    load_fails("[engine]\ngpu_memory_utilization = true\n", INF_E_INVALID,
               "config.toml:2: key 'engine.gpu_memory_utilization': must be a number, got a "
               "boolean");
}
END_TEST

START_TEST(file_out_of_bounds)
{
    /* The key on line 12, as in the documentation's example. */
    load_fails("# 1\n# 2\n# 3\n[server]\nport = 8000\n# 6\n# 7\n[engine]\nbackend = \"cpu\"\n"
               "tp = 1\n\nmax_batch = 0\n",
               INF_E_INVALID,
               "config.toml:12: key 'engine.max_batch': must be in [1, 1024], got 0");
    load_fails("[server]\nport = 65536\n", INF_E_INVALID,
               "config.toml:2: key 'server.port': must be in [0, 65535], got 65536");
    load_fails("[model]\ngroup_size = 100\n", INF_E_INVALID,
               "config.toml:2: key 'model.group_size': must be one of 32, 64, 128, 256, -1, got "
               "100");
    load_fails("[engine]\ngpu_memory_utilization = 1.5\n", INF_E_INVALID,
               "config.toml:2: key 'engine.gpu_memory_utilization': must be in [0.05, 1], got 1.5");
    load_fails("[engine]\nbackend = \"gpu\"\n", INF_E_INVALID,
               "config.toml:2: key 'engine.backend': must be one of \"cpu\", \"cuda\", \"mock\", "
               "got \"gpu\"");
    load_fails("[limits]\nbody_limit = \"2MB\"\n", INF_E_INVALID,
               "config.toml:2: key 'limits.body_limit': must be a size such as 2097152 or "
               "\"2MiB\", got \"2MB\"");
    load_fails("[limits]\nbody_limit = 100\n", INF_E_INVALID,
               "config.toml:2: key 'limits.body_limit': must be in [1024, 1073741824], got 100");
    load_fails("[engine]\ndevices = [0, 0]\n", INF_E_INVALID,
               "config.toml:2: key 'engine.devices': lists 0 twice");
    load_fails("[engine]\ndevices = []\n", INF_E_INVALID,
               "config.toml:2: key 'engine.devices': must not be empty");
    load_fails("[limits]\ndrain_timeout = -1\n", INF_E_INVALID,
               "config.toml:2: key 'limits.drain_timeout': must be in [0, 3600], got -1");
}
END_TEST

START_TEST(file_duplicate)
{
    load_fails("[engine]\nmax_batch = 4\n\nmax_batch = 8\n", INF_E_FORMAT,
               "config.toml: line 4, column 1: duplicate key 'max_batch' (first defined on line "
               "2)");
    load_fails("[engine]\ntp = 1\n[server]\n[engine]\n", INF_E_FORMAT,
               "config.toml: line 4, column 1: table 'engine' is already defined on line 1");
    load_fails("[server]\nport 8000\n", INF_E_FORMAT,
               "config.toml: line 2, column 6: expected '='");
}
END_TEST

START_TEST(file_values)
{
    const char *text = "[server]\nhost = \"0.0.0.0\"\n[engine]\nbackend = \"cuda\"\n"
                       "devices = \"1, 3\"\ntp = 2\n[limits]\nbody_limit = \"512KiB\"\n"
                       "connection_timeout = 2.5\n[model]\nkeep_fp16 = []\n";
    ck_assert_int_eq(srv_config_load_toml(&cfg, "c.toml", text, strlen(text), &err), INF_OK);
    ck_assert_str_eq(cfg.host, "0.0.0.0");
    ck_assert_uint_eq(cfg.devices.n, 2);
    ck_assert_int_eq(cfg.devices.v[1], 3);
    ck_assert_int_eq(cfg.body_limit, 512 * 1024);
    ck_assert(cfg.connection_timeout == 2.5);
    ck_assert_uint_eq(cfg.keep_fp16.n, 0);
    ck_assert_str_eq(origin_of("engine.tp"), "c.toml:6");
    ck_assert_str_eq(origin_of("port"), "default");
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_OK);
}
END_TEST

START_TEST(cross_key_checks)
{
    const char *text = "[engine]\nmax_batch = 512\n\nmax_batched_tokens = 256\n";
    ck_assert_int_eq(srv_config_load_toml(&cfg, "c.toml", text, strlen(text), &err), INF_OK);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_E_INVALID);
    ck_assert_str_eq(err.msg, "c.toml:4: key 'engine.max_batched_tokens': must be at least "
                              "engine.max_batch (512), got 256");
    srv_config_fini(&cfg);
    setup();
    /* the cpu backend runs any tp (the model's heads decide at load) */
    ck_assert_int_eq(srv_config_set(&cfg, "tp", "2", "--tp", &err), INF_OK);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_OK);
    ck_assert_int_eq(srv_config_set(&cfg, "backend", "mock", "--backend", &err), INF_OK);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_E_INVALID);
    ck_assert_str_eq(err.msg, "--tp: key 'engine.tp': tensor parallelism (2 ranks) needs backend "
                              "\"cpu\" or \"cuda\", not \"mock\"");
    ck_assert_int_eq(srv_config_set(&cfg, "backend", "cuda", "--backend", &err), INF_OK);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_E_INVALID);
    ck_assert_str_eq(err.msg, "--tp: key 'engine.tp': 2 ranks need as many devices, "
                              "engine.devices lists 1");
    ck_assert_int_eq(srv_config_set(&cfg, "devices", "0,1,2", "--devices", &err), INF_OK);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_E_INVALID);
    ck_assert_str_eq(err.msg, "--devices: key 'engine.devices': lists 3 devices, but engine.tp = "
                              "2 uses 2 of them");
    ck_assert_int_eq(srv_config_set(&cfg, "devices", "0,1", "--devices", &err), INF_OK);
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_OK);
    ck_assert_int_eq(srv_config_set(&cfg, "model", "/srv/models/llama-3-8b//", "--model", &err),
                     INF_OK);
    cfg.served_model_name = "";
    ck_assert_int_eq(srv_config_finish(&cfg, &err), INF_OK);
    ck_assert_str_eq(cfg.served_model_name, "llama-3-8b");
}
END_TEST

/* ---- command line ------------------------------------------------------------------- */

static char tmp_path[64];

static void write_tmp(const char *text)
{
    strcpy(tmp_path, "/tmp/int4serve-test-XXXXXX");
    int fd = mkstemp(tmp_path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static inf_status_t run_args(const char *env_key, enum srv_config_action *action, ...)
{
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, action);
    argv[argc++] = "int4serve";
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    return srv_config_from_args(&cfg, argc, argv, env_key, action, &err);
}

START_TEST(cli_precedence)
{
    enum srv_config_action action;
    write_tmp("[server]\nhost = \"0.0.0.0\"\nport = 9000\napi_key = \"from-file\"\n"
              "[engine]\nmax_batch = 64\nthreads = 3\n");
    /* The file is read first wherever --config stands; flags win, later flags win. */
    inf_status_t st = run_args(NULL, &action, "--port", "9001", "--config", tmp_path, "--set",
                               "engine.max_batch=32", "--threads=5", "--threads", "6", NULL);
    ck_assert_msg(st == INF_OK, "%s", err.msg);
    ck_assert_int_eq(action, SRV_CONFIG_RUN);
    ck_assert_int_eq(cfg.port, 9001);
    ck_assert_str_eq(origin_of("port"), "--port");
    ck_assert_int_eq(cfg.max_batch, 32);
    ck_assert_str_eq(origin_of("max_batch"), "--set engine.max_batch");
    ck_assert_int_eq(cfg.threads, 6);
    ck_assert_str_eq(cfg.host, "0.0.0.0");
    char want[128];
    snprintf(want, sizeof want, "%s:2", tmp_path);
    ck_assert_str_eq(origin_of("host"), want);
    ck_assert_str_eq(cfg.config_path, tmp_path);
    ck_assert_str_eq(cfg.api_key, "from-file");
    ck_assert_int_eq(cfg.tp, 1);
    ck_assert_str_eq(origin_of("tp"), "default");
    srv_config_fini(&cfg);

    /* The environment beats the file; a flag beats the environment. */
    setup();
    ck_assert_int_eq(run_args("from-env", &action, "--config", tmp_path, NULL), INF_OK);
    ck_assert_str_eq(cfg.api_key, "from-env");
    ck_assert_str_eq(origin_of("api_key"), "INT4SERVE_API_KEY");
    srv_config_fini(&cfg);
    setup();
    ck_assert_int_eq(
        run_args("from-env", &action, "--api-key", "from-flag", "--config", tmp_path, NULL),
        INF_OK);
    ck_assert_str_eq(cfg.api_key, "from-flag");
    unlink(tmp_path);
}
END_TEST

START_TEST(cli_values)
{
    enum srv_config_action action;
    ck_assert_int_eq(run_args(NULL, &action, "--devices", "0,2", "--backend", "cuda", "--tp", "2",
                              "--set", "keep_fp16=lm_head,norm", "--set", "model.symmetric=true",
                              "--set", "limits.body_limit=1GiB", "--set",
                              "gpu_memory_utilization=0.5", "--log-level", "debug", NULL),
                     INF_OK);
    ck_assert_uint_eq(cfg.devices.n, 2);
    ck_assert_int_eq(cfg.devices.v[1], 2);
    ck_assert_uint_eq(cfg.keep_fp16.n, 2);
    ck_assert_str_eq(cfg.keep_fp16.v[1], "norm");
    ck_assert(cfg.symmetric);
    ck_assert_int_eq(cfg.body_limit, 1LL << 30);
    ck_assert(cfg.gpu_memory_utilization == 0.5);
    ck_assert_str_eq(cfg.log_level, "debug");
    ck_assert_str_eq(cfg.backend, "cuda");
}
END_TEST

static void args_fail(const char *want, ...)
{
    char *argv[16];
    int argc = 0;
    enum srv_config_action action;
    va_list ap;
    va_start(ap, want);
    argv[argc++] = "int4serve";
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    srv_config_fini(&cfg);
    setup();
    ck_assert_int_ne(srv_config_from_args(&cfg, argc, argv, NULL, &action, &err), INF_OK);
    ck_assert_str_eq(err.msg, want);
}

START_TEST(cli_errors)
{
    args_fail("--max-batch: must be in [1, 1024], got 0", "--max-batch", "0", NULL);
    args_fail("--port: must be an integer, got \"http\"", "--port", "http", NULL);
    args_fail("--port: must be an integer, got \"80x\"", "--port=80x", NULL);
    args_fail("--backend: must be one of \"cpu\", \"cuda\", \"mock\", got \"gpu\"", "--backend",
              "gpu", NULL);
    args_fail("--devices: must be a list of integers such as \"0,1\", got \"0,a\"", "--devices",
              "0,a", NULL);
    args_fail("--set model.fuse_qkv: must be true or false, got \"maybe\"", "--set",
              "model.fuse_qkv=maybe", NULL);
    args_fail("--set engine.nope: unknown key 'engine.nope' (see --help)", "--set", "engine.nope=1",
              NULL);
    args_fail("--set needs SECTION.KEY=VALUE, got 'max_batch'", "--set", "max_batch", NULL);
    args_fail("unknown flag '--bogus' (see --help)", "--port", "1", "--bogus", "1", NULL);
    args_fail("unexpected argument 'serve' (see --help)", "serve", NULL);
    args_fail("--port needs a value", "--port", NULL);
    args_fail("/nonexistent/int4serve.toml: cannot open: No such file or directory", "--config",
              "/nonexistent/int4serve.toml", NULL);
    /* A bad flag is reported before the file is read. */
    args_fail("unknown flag '--bogus' (see --help)", "--config", "/nonexistent", "--bogus", NULL);
}
END_TEST

START_TEST(cli_help_and_version)
{
    enum srv_config_action action;
    ck_assert_int_eq(run_args(NULL, &action, "--bogus", "--help", NULL), INF_OK);
    ck_assert_int_eq(action, SRV_CONFIG_HELP);
    ck_assert_int_eq(run_args(NULL, &action, "--version", NULL), INF_OK);
    ck_assert_int_eq(action, SRV_CONFIG_VERSION);
    ck_assert_int_eq(run_args(NULL, &action, "--print-config", "--port", "5", NULL), INF_OK);
    ck_assert_int_eq(action, SRV_CONFIG_PRINT);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    srv_config_print_help(f);
    fclose(f);
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        char want[256];
        snprintf(want, sizeof want, "  %s = %s ", k->name, k->def);
        ck_assert_msg(strstr(text, want) != NULL, "help lacks '%s'", want);
        ck_assert_msg(strstr(text, k->help) != NULL, "help lacks %s's description", k->name);
        if (k->flag) {
            snprintf(want, sizeof want, "  %s VALUE ", k->flag);
            ck_assert_msg(strstr(text, want) != NULL, "help lacks %s", k->flag);
        }
    }
    ck_assert_ptr_nonnull(strstr(text, "--config FILE"));
    ck_assert_ptr_nonnull(strstr(text, "--set KEY=VALUE"));
    free(text);
}
END_TEST

START_TEST(print_round_trip)
{
    enum srv_config_action action;
    ck_assert_int_eq(run_args(NULL, &action, "--host", "::1", "--set", "served_model_name=a\"b\\c",
                              "--set", "keep_fp16=x,y", "--devices", "3", "--set",
                              "body_limit=3000", "--set", "connection_timeout=0.25", "--api-key",
                              "secret-key", "--set", "seed=9223372036854775807", NULL),
                     INF_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    srv_config_print_toml(&cfg, f);
    fclose(f);
    ck_assert_ptr_null(strstr(text, "secret-key"));
    struct srv_config back;
    ck_assert_int_eq(srv_config_init(&back, &err), INF_OK);
    ck_assert_msg(srv_config_load_toml(&back, "printed", text, len, &err) == INF_OK, "%s", err.msg);
    for (size_t i = 0; i < srv_config_nkeys; i++) {
        const struct srv_config_key *k = &srv_config_keys[i];
        if (strcmp(k->name, "api_key") == 0)
            ck_assert_str_eq(back.api_key, "");
        else
            ck_assert_msg(field_eq(&back, &cfg, k), "%s does not survive printing", k->name);
    }
    ck_assert_str_eq(back.served_model_name, "a\"b\\c");
    srv_config_fini(&back);
    free(text);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("table");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, documented_defaults);
    tcase_add_test(tc, table_names_and_flags);
    tcase_add_test(tc, example_matches_table);
    tcase_add_test(tc, config_doc_lists_every_key);
    tcase_add_test(tc, deploy_config_is_valid);
    suite_add_tcase(s, tc);
    tc = tcase_create("file");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, file_unknown_key);
    tcase_add_test(tc, file_wrong_type);
    tcase_add_test(tc, file_out_of_bounds);
    tcase_add_test(tc, file_duplicate);
    tcase_add_test(tc, file_values);
    tcase_add_test(tc, cross_key_checks);
    suite_add_tcase(s, tc);
    tc = tcase_create("cli");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, cli_precedence);
    tcase_add_test(tc, cli_values);
    tcase_add_test(tc, cli_errors);
    tcase_add_test(tc, cli_help_and_version);
    tcase_add_test(tc, print_round_trip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
