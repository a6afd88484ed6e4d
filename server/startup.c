/* startup.c — a start-up failure as the operator needs it: the key at
 * fault with its value and where it was set, the model folder, and an exit
 * status a supervisor can act on (2: the configuration or the model must
 * change, restarting will not help; 1: a restart may).
 *
 * The engine words its errors without paths (they may reach a client) and
 * starts them with the name of the key they are about ("kv_cache_tokens:
 * 16 tokens cannot hold one sequence of max_model_len 1024") or of the file
 * in the model folder ("config.json: cannot open: ..."); the HTTP side
 * starts its own with "host:" or "port:". Here a leading key name becomes
 * "engine.kv_cache_tokens = 16 (--set engine.kv_cache_tokens): ...", and the
 * model folder is named for a failure about the model. */
#define INF_LOG_MODULE "srv"
#include "server/srv.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* "<section>.<name> = <value> (<origin>)" for key k into out. */
static void describe_key(const struct srv_config *cfg, const struct srv_config_key *k, char *out,
                         size_t cap)
{
    char val[256];
    if (strcmp(k->name, "api_key") == 0)
        snprintf(val, sizeof val, "\"****\"");
    else
        srv_config_format(cfg, k, val, sizeof val);
    snprintf(out, cap, "%s.%s = %s (%s)", k->section, k->name, val,
             cfg->origin[k - srv_config_keys]);
}

inf_status_t srv_config_check_model(const struct srv_config *cfg, struct inf_err *err)
{
    if (strcmp(cfg->backend, "mock") == 0)
        return INF_OK; /* the mock model needs no folder */
    const struct srv_config_key *k = srv_config_key_find("model.model");
    char key[400];
    describe_key(cfg, k, key, sizeof key);
    struct stat st;
    if (stat(cfg->model, &st) != 0)
        return inf_err_set(err, errno == ENOENT ? INF_E_NOTFOUND : INF_E_IO,
                           "%s: the model folder cannot be opened: %s", key, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return inf_err_set(err, INF_E_INVALID,
                           "%s: is not a folder (a model folder holds config.json, the "
                           "*.safetensors weights and tokenizer.json)",
                           key);
    DIR *d = opendir(cfg->model);
    if (!d)
        return inf_err_set(err, INF_E_IO, "%s: the model folder cannot be read: %s", key,
                           strerror(errno));
    closedir(d);
    return INF_OK;
}

int srv_startup_error(const struct srv_config *cfg, inf_status_t st, const char *msg, char *out,
                      size_t cap)
{
    /* A leading key name: "kv_cache_tokens: ...", "gpu_memory_utilization 0.90 ...". */
    char word[64];
    size_t n = strspn(msg, "abcdefghijklmnopqrstuvwxyz_.");
    const struct srv_config_key *k = NULL;
    if (n > 0 && n < sizeof word && (msg[n] == ':' || msg[n] == ' ')) {
        memcpy(word, msg, n);
        word[n] = '\0';
        k = srv_config_key_find(word);
    }
    bool mock = strcmp(cfg->backend, "mock") == 0;
    bool about_model = !mock && !(k && strcmp(k->section, "server") == 0) &&
                       (st == INF_E_NOTFOUND || st == INF_E_FORMAT || st == INF_E_INVALID ||
                        st == INF_E_UNSUPPORTED || st == INF_E_IO || st == INF_E_TOOBIG ||
                        st == INF_E_RANGE || (k && st == INF_E_NOMEM));
    char key[400] = "", model[400] = "";
    const char *rest = msg;
    if (k) {
        describe_key(cfg, k, key, sizeof key);
        if (msg[n] == ':')
            rest = msg + n + 1 + (msg[n + 1] == ' ');
    }
    const struct srv_config_key *mk = srv_config_key_find("model.model");
    if (about_model && k != mk)
        describe_key(cfg, mk, model, sizeof model);
    /* The KV budget and the context depend on the model's size and
     * config.json: name the folder with them. */
    bool sized =
        k && (strcmp(k->name, "kv_cache_tokens") == 0 || strcmp(k->name, "max_model_len") == 0 ||
              strcmp(k->name, "gpu_memory_utilization") == 0);
    if (k && about_model && sized)
        snprintf(out, cap, "%s: %s, for %s", key, rest, model);
    else if (k)
        snprintf(out, cap, "%s: %s", key, rest);
    else if (about_model)
        snprintf(out, cap, "%s: %s", model, msg);
    else
        snprintf(out, cap, "%s", msg);
    /* What a restart may cure: a device, memory, the machine. */
    if (st == INF_E_DEVICE || st == INF_E_INTERNAL || st == INF_E_TIMEOUT ||
        (st == INF_E_NOMEM && !k) || st == INF_E_BUSY || st == INF_E_SHUTDOWN ||
        st == INF_E_CANCELLED)
        return 1;
    return 2;
}
