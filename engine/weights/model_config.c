/* engine/weights/model_config.c — config.json of a Llama-family checkpoint into
 * struct eng_model_config, validated. Defaults follow transformers'
 * LlamaConfig where a key is optional. */
#define INF_LOG_MODULE "eng"
#include "engine/weights/model_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG "config.json"
/* Sanity bounds: far above any real model, low enough that products of two
 * of them fit an int64 and a tensor's element count fits a size_t. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 24)
#define MAX_POS (1 << 24)

/* An integer key in [lo, hi]. Absent or null: *out = def and INF_OK unless
 * required. */
static inf_status_t get_int(const json_t *root, const char *key, bool required, int32_t def,
                            int64_t lo, int64_t hi, int32_t *out, struct inf_err *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required)
            return inf_err_set(err, INF_E_INVALID, CFG ": %s is missing", key);
        *out = def;
        return INF_OK;
    }
    if (!json_is_integer(v))
        return inf_err_set(err, INF_E_INVALID, CFG ": %s must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return inf_err_set(err, INF_E_INVALID, CFG ": %s must be in [%lld, %lld], got %lld", key,
                           (long long)lo, (long long)hi, (long long)x);
    *out = (int32_t)x;
    return INF_OK;
}

/* A number key (integer or real) in (lo, hi). */
static inf_status_t get_num(const json_t *root, const char *key, const char *shown, double def,
                            double lo, double hi, float *out, struct inf_err *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return INF_OK;
    }
    if (!json_is_number(v))
        return inf_err_set(err, INF_E_INVALID, CFG ": %s must be a number", shown);
    double x = json_number_value(v);
    if (!(x > lo && x < hi))
        return inf_err_set(err, INF_E_INVALID, CFG ": %s must be in (%g, %g), got %g", shown, lo,
                           hi, x);
    *out = (float)x;
    return INF_OK;
}

static inf_status_t get_bool(const json_t *root, const char *key, bool def, bool *out,
                             struct inf_err *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return INF_OK;
    }
    if (!json_is_boolean(v))
        return inf_err_set(err, INF_E_INVALID, CFG ": %s must be true or false", key);
    *out = json_is_true(v);
    return INF_OK;
}

static inf_status_t parse_arch(const json_t *root, struct eng_model_config *cfg,
                               struct inf_err *err)
{
    static const struct {
        const char *arch, *model_type;
        enum eng_arch id;
    } archs[] = {
        {"LlamaForCausalLM", "llama", ENG_ARCH_LLAMA},
        {"MistralForCausalLM", "mistral", ENG_ARCH_MISTRAL},
        {"Qwen2ForCausalLM", "qwen2", ENG_ARCH_QWEN2},
    };
    const json_t *a = json_object_get(root, "architectures");
    if (a && !json_is_null(a)) {
        if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_string(json_array_get(a, 0)))
            return inf_err_set(err, INF_E_INVALID,
                               CFG ": architectures must be a non-empty list of names");
        if (json_array_size(a) > 1)
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               CFG ": architectures lists %zu models, expected one",
                               json_array_size(a));
        const char *name = json_string_value(json_array_get(a, 0));
        for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
            if (strcmp(name, archs[i].arch) == 0) {
                cfg->arch = archs[i].id;
                return INF_OK;
            }
        }
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           CFG ": architectures '%.64s' is not supported (LlamaForCausalLM, "
                               "MistralForCausalLM, Qwen2ForCausalLM)",
                           name);
    }
    const json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return inf_err_set(err, INF_E_INVALID, CFG ": architectures is missing");
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        if (strcmp(json_string_value(mt), archs[i].model_type) == 0) {
            cfg->arch = archs[i].id;
            return INF_OK;
        }
    }
    return inf_err_set(err, INF_E_UNSUPPORTED,
                       CFG ": model_type '%.64s' is not supported (llama, mistral, qwen2)",
                       json_string_value(mt));
}

static inf_status_t parse_rope_scaling(const json_t *root, struct eng_model_config *cfg,
                                       struct inf_err *err)
{
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs))
        return INF_OK;
    if (!json_is_object(rs))
        return inf_err_set(err, INF_E_INVALID, CFG ": rope_scaling must be an object or null");
    const char *tkey = "rope_scaling.rope_type";
    const json_t *t = json_object_get(rs, "rope_type");
    if (!t) {
        t = json_object_get(rs, "type");
        tkey = "rope_scaling.type";
    }
    if (!json_is_string(t))
        return inf_err_set(err, INF_E_INVALID, CFG ": %s must be a string", tkey);
    const char *type = json_string_value(t);
    if (strcmp(type, "default") == 0)
        return INF_OK;
    if (strcmp(type, "llama3") != 0)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           CFG ": %s '%.32s' is not supported (only llama3)", tkey, type);
    inf_status_t s;
    s = get_num(rs, "factor", "rope_scaling.factor", NAN, 0, 1e6, &cfg->rope_factor, err);
    if (s == INF_OK)
        s = get_num(rs, "low_freq_factor", "rope_scaling.low_freq_factor", NAN, 0, 1e6,
                    &cfg->rope_low_freq, err);
    if (s == INF_OK)
        s = get_num(rs, "high_freq_factor", "rope_scaling.high_freq_factor", NAN, 0, 1e6,
                    &cfg->rope_high_freq, err);
    if (s == INF_OK)
        s = get_int(rs, "original_max_position_embeddings", true, 0, 1, MAX_POS,
                    &cfg->rope_orig_max_pos, err);
    if (s != INF_OK) {
        if (s == INF_E_INVALID && err && strstr(err->msg, "original_max_position_embeddings"))
            return inf_err_set(err, INF_E_INVALID,
                               CFG ": rope_scaling.original_max_position_embeddings must be a "
                                   "positive integer");
        return s;
    }
    if (isnan(cfg->rope_factor) || isnan(cfg->rope_low_freq) || isnan(cfg->rope_high_freq))
        return inf_err_set(err, INF_E_INVALID,
                           CFG ": rope_scaling of type llama3 needs factor, low_freq_factor and "
                               "high_freq_factor");
    if (!(cfg->rope_high_freq > cfg->rope_low_freq))
        return inf_err_set(err, INF_E_INVALID,
                           CFG ": rope_scaling.high_freq_factor (%g) must exceed "
                               "low_freq_factor (%g)",
                           cfg->rope_high_freq, cfg->rope_low_freq);
    cfg->rope_llama3 = true;
    return INF_OK;
}

static inf_status_t parse_token_ids(const json_t *root, struct eng_model_config *cfg,
                                    struct inf_err *err)
{
    inf_status_t s = get_int(root, "bos_token_id", false, -1, 0, cfg->vocab - 1, &cfg->bos_id, err);
    if (s != INF_OK)
        return s;
    const json_t *e = json_object_get(root, "eos_token_id");
    cfg->n_eos = 0;
    if (!e || json_is_null(e))
        return INF_OK;
    if (json_is_integer(e))
        return get_int(root, "eos_token_id", true, 0, 0, cfg->vocab - 1,
                       &cfg->eos_ids[cfg->n_eos++], err);
    if (!json_is_array(e))
        return inf_err_set(err, INF_E_INVALID, CFG ": eos_token_id must be an integer or a list");
    if (json_array_size(e) > ENG_MAX_EOS)
        return inf_err_set(err, INF_E_UNSUPPORTED, CFG ": eos_token_id lists %zu ids, at most %d",
                           json_array_size(e), ENG_MAX_EOS);
    size_t i;
    const json_t *v;
    json_array_foreach(e, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= cfg->vocab)
            return inf_err_set(err, INF_E_INVALID,
                               CFG ": eos_token_id[%zu] must be an integer in [0, %d)", i,
                               cfg->vocab);
        cfg->eos_ids[cfg->n_eos++] = (int32_t)json_integer_value(v);
    }
    return INF_OK;
}

static inf_status_t parse_root(const json_t *root, struct eng_model_config *cfg,
                               struct inf_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(root))
        return inf_err_set(err, INF_E_FORMAT, CFG ": not a JSON object");
    inf_status_t s;
#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((s = (call)) != INF_OK)                                                                \
            return s;                                                                              \
    } while (0)
    TRY(parse_arch(root, cfg, err));
    TRY(get_int(root, "hidden_size", true, 0, 1, MAX_DIM, &cfg->hidden, err));
    TRY(get_int(root, "intermediate_size", true, 0, 1, MAX_DIM, &cfg->intermediate, err));
    TRY(get_int(root, "num_hidden_layers", true, 0, 1, MAX_LAYERS, &cfg->n_layers, err));
    TRY(get_int(root, "num_attention_heads", true, 0, 1, MAX_DIM, &cfg->n_heads, err));
    TRY(get_int(root, "num_key_value_heads", false, cfg->n_heads, 1, MAX_DIM, &cfg->n_kv_heads,
                err));
    TRY(get_int(root, "head_dim", false, 0, 1, MAX_DIM, &cfg->head_dim, err));
    TRY(get_int(root, "vocab_size", true, 0, 1, MAX_VOCAB, &cfg->vocab, err));
    TRY(get_int(root, "max_position_embeddings", false, 2048, 1, MAX_POS, &cfg->max_pos, err));
    TRY(get_num(root, "rms_norm_eps", "rms_norm_eps", 1e-6, 0, 1, &cfg->rms_eps, err));
    TRY(get_num(root, "rope_theta", "rope_theta", 10000.0, 0, 1e12, &cfg->rope_theta, err));
    TRY(get_bool(root, "tie_word_embeddings", false, &cfg->tie_embeddings, err));

    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return inf_err_set(err, INF_E_INVALID,
                           CFG ": num_attention_heads (%d) must be a multiple of "
                               "num_key_value_heads (%d)",
                           cfg->n_heads, cfg->n_kv_heads);
    if (cfg->head_dim == 0) {
        if (cfg->hidden % cfg->n_heads != 0)
            return inf_err_set(err, INF_E_INVALID,
                               CFG ": hidden_size (%d) must be a multiple of "
                                   "num_attention_heads (%d) when head_dim is absent",
                               cfg->hidden, cfg->n_heads);
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    }
    if (cfg->head_dim % 2 != 0)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           CFG ": head_dim (%d) must be even for rotary embeddings", cfg->head_dim);
    if ((int64_t)cfg->n_heads * cfg->head_dim > MAX_DIM)
        return inf_err_set(err, INF_E_INVALID,
                           CFG ": num_attention_heads x head_dim (%lld) is too large",
                           (long long)cfg->n_heads * cfg->head_dim);

    const json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           CFG ": hidden_act '%.32s' is not supported (silu)",
                           json_is_string(act) ? json_string_value(act) : "?");
    bool attn_bias, mlp_bias;
    TRY(get_bool(root, "attention_bias", false, &attn_bias, err));
    TRY(get_bool(root, "mlp_bias", false, &mlp_bias, err));
    if (attn_bias)
        return inf_err_set(err, INF_E_UNSUPPORTED, CFG ": attention_bias true is not supported");
    if (mlp_bias)
        return inf_err_set(err, INF_E_UNSUPPORTED, CFG ": mlp_bias true is not supported");
    cfg->qkv_bias = cfg->arch == ENG_ARCH_QWEN2;

    /* Sliding-window attention (Mistral): a query sees the window's last
     * keys, its own included (engine/backend.h, eng_attn_first_key). A
     * window that covers the whole context is plain causal attention and
     * is dropped; Qwen2 applies its window only from max_window_layers on,
     * which is not implemented, and Llama has none, so a smaller window is
     * refused there. */
    bool use_sw = true;
    if (cfg->arch == ENG_ARCH_QWEN2)
        TRY(get_bool(root, "use_sliding_window", false, &use_sw, err));
    const json_t *sw = json_object_get(root, "sliding_window");
    cfg->sliding_window = 0;
    if (use_sw && sw && !json_is_null(sw)) {
        if (!json_is_integer(sw) || json_integer_value(sw) <= 0)
            return inf_err_set(err, INF_E_INVALID,
                               CFG ": sliding_window must be a positive integer or null");
        if (json_integer_value(sw) < cfg->max_pos) {
            if (cfg->arch != ENG_ARCH_MISTRAL)
                return inf_err_set(err, INF_E_UNSUPPORTED,
                                   CFG ": sliding_window %lld smaller than "
                                       "max_position_embeddings %d is supported for Mistral only",
                                   (long long)json_integer_value(sw), cfg->max_pos);
            cfg->sliding_window = (int32_t)json_integer_value(sw);
        }
    }

    TRY(parse_rope_scaling(root, cfg, err));
    TRY(parse_token_ids(root, cfg, err));

    const char *dkey = "torch_dtype";
    const json_t *dt = json_object_get(root, dkey);
    if (!dt || json_is_null(dt)) {
        dkey = "dtype";
        dt = json_object_get(root, dkey);
    }
    if (dt && !json_is_null(dt)) {
        const char *d = json_is_string(dt) ? json_string_value(dt) : "";
        if (strcmp(d, "float32") != 0 && strcmp(d, "float16") != 0 && strcmp(d, "bfloat16") != 0)
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               CFG ": %s '%.32s' is not supported (float32, float16, bfloat16)",
                               dkey, d);
        snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", d);
    }
#undef TRY
    return INF_OK;
}

inf_status_t eng_model_config_parse(const char *json, size_t len, struct eng_model_config *cfg,
                                    struct inf_err *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        memset(cfg, 0, sizeof *cfg);
        return inf_err_set(err, INF_E_FORMAT, CFG ": not valid JSON: %.100s (line %d)", jerr.text,
                           jerr.line);
    }
    inf_status_t s = parse_root(root, cfg, err);
    json_decref(root);
    return s;
}

inf_status_t eng_model_config_load(const char *dir, struct eng_model_config *cfg,
                                   struct inf_err *err)
{
    size_t plen = strlen(dir) + sizeof "/" CFG;
    char *path = malloc(plen);
    if (!path)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    snprintf(path, plen, "%s/" CFG, dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        inf_log(ERROR, "open %s: %s", path, strerror(e));
        free(path);
        return inf_err_set(err, e == ENOENT ? INF_E_NOTFOUND : INF_E_IO, CFG ": cannot open: %s",
                           strerror(e));
    }
    free(path);
    /* A config.json is a few KB; 16 MB is a generous bound. */
    size_t cap = 16 << 20, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, f)) > 0 && n + r < cap)
        n += r;
    bool toobig = r > 0, bad = ferror(f);
    fclose(f);
    if (bad || toobig) {
        free(buf);
        return inf_err_set(err, bad ? INF_E_IO : INF_E_TOOBIG,
                           bad ? CFG ": read error" : CFG ": larger than 16 MB");
    }
    inf_status_t s = eng_model_config_parse(buf, n, cfg, err);
    free(buf);
    return s;
}
