/* engine/weights/qconfig.c — an INT4 checkpoint's quantization_config (or
 * quantize_config.json) into struct eng_qcfg, validated. Which keys mean
 * what follows the writers' own definitions: transformers' AwqConfig and
 * AutoAWQ's quant_config (bits / w_bit, group_size / q_group_size,
 * zero_point, version, modules_to_not_convert); AutoGPTQ's
 * BaseQuantizeConfig and GPTQModel's QuantizeConfig (bits, group_size,
 * desc_act, sym, checkpoint_format, pack_dtype, lm_head, dynamic);
 * compressed-tensors' QuantizationConfig, QuantizationScheme and
 * QuantizationArgs (format, config_groups, targets, weights, ignore). */
#define INF_LOG_MODULE "eng"
#include "engine/weights/qconfig.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define QC "quantization_config"

const char *eng_qmethod_name(enum eng_qmethod m)
{
    switch (m) {
    case ENG_QM_AWQ:
        return "awq";
    case ENG_QM_GPTQ:
        return "gptq";
    case ENG_QM_CT:
        return "compressed-tensors";
    default:
        return "none";
    }
}

/* Where messages say a key lives: "config.json: quantization_config.bits". */
struct ctx {
    const char *file;
    const char *obj; /* "quantization_config", "config_groups.group_0.weights", ... */
};

#define KEYFMT "%s: %s%s%s"
#define KEYARGS(x, key) (x)->file, (x)->obj, (x)->obj[0] ? "." : "", key

static const json_t *get(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* An integer key (or its alias); def when absent. */
static inf_status_t get_int(const struct ctx *x, const json_t *o, const char *key,
                            const char *alias, int64_t def, int64_t *out, struct inf_err *err)
{
    const json_t *v = get(o, key);
    const char *k = key;
    if (!v && alias && (v = get(o, alias)))
        k = alias;
    if (!v) {
        *out = def;
        return INF_OK;
    }
    if (!json_is_integer(v))
        return inf_err_set(err, INF_E_INVALID, KEYFMT " must be an integer", KEYARGS(x, k));
    *out = json_integer_value(v);
    return INF_OK;
}

static inf_status_t get_bool(const struct ctx *x, const json_t *o, const char *key, bool def,
                             bool *out, struct inf_err *err)
{
    const json_t *v = get(o, key);
    if (!v) {
        *out = def;
        return INF_OK;
    }
    if (!json_is_boolean(v))
        return inf_err_set(err, INF_E_INVALID, KEYFMT " must be true or false", KEYARGS(x, key));
    *out = json_is_true(v);
    return INF_OK;
}

/* A string key; def (may be NULL) when absent. */
static inf_status_t get_str(const struct ctx *x, const json_t *o, const char *key, const char *def,
                            const char **out, struct inf_err *err)
{
    const json_t *v = get(o, key);
    if (!v) {
        *out = def;
        return INF_OK;
    }
    if (!json_is_string(v))
        return inf_err_set(err, INF_E_INVALID, KEYFMT " must be a string", KEYARGS(x, key));
    *out = json_string_value(v);
    return INF_OK;
}

static inf_status_t check_bits(const struct ctx *x, int64_t bits, const char *key,
                               struct inf_err *err)
{
    if (bits != 4)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           KEYFMT " %lld is not supported (INT4 checkpoints only: 4)",
                           KEYARGS(x, key), (long long)bits);
    return INF_OK;
}

/* Group sizes the canonical form holds exactly (kernels/q4.h): its own, a
 * multiple of 256 as repeated groups of 256, or per channel (-1). */
static inf_status_t check_group(const struct ctx *x, int64_t g, const char *key,
                                struct inf_err *err)
{
    if (g == -1 || g == 32 || g == 64 || g == 128 || g == 256 ||
        (g > 256 && g % 256 == 0 && g <= (1 << 24)))
        return INF_OK;
    return inf_err_set(err, INF_E_UNSUPPORTED,
                       KEYFMT " %lld is not supported (32, 64, 128, 256, a multiple of 256, or "
                              "-1 per channel)",
                       KEYARGS(x, key), (long long)g);
}

static void names_free(struct eng_qname *v, int32_t n)
{
    for (int32_t i = 0; v && i < n; i++) {
        if (v[i].re)
            regfree(&v[i].rx);
        free(v[i].text);
    }
    free(v);
}

/* What compiling pattern p (POSIX ERE) may build, in nodes: glibc's regcomp
 * copies an expression for each repetition it must spell out ("x+" as "xx*",
 * "x{m,n}" as n copies), so stacked or nested repetitions multiply, and a
 * pattern of a few hundred bytes ("a+++...") can take gigabytes. Counted as
 * an atom's nodes times 2 for each "+" and n + 1 for each "{m,n}" after it,
 * summed over the pattern; capped at RE_NODES_MAX + 1 as soon as it is
 * passed. Repetitions of repetitions cost time as well: regcomp's epsilon
 * closures over "(x*)+" grow so fast with each level that five levels take
 * seconds, and with each such atom in a row (thirty take seconds), so st
 * reports how many repetitions stand on one another at most (stacked, "x*+",
 * or through groups, "(x*)+") and how many atoms have two; the callers allow
 * two levels and eight such atoms. The writers' patterns (".*lm_head",
 * "model\.layers\.[0-9]+\.mlp\..*") have one. */
#define RE_NODES_MAX 1024
#define RE_DEPTH_MAX 16
#define RE_QDEPTH_MAX 2
#define RE_NESTED_MAX 8

struct re_stat {
    int qdepth, nested;
};

static double re_nodes(const char **p, int depth, struct re_stat *st)
{
    double total = 0;
    while (**p && **p != ')') {
        double c = 1;
        struct re_stat in = {0, 0};
        const char ch = *(*p)++;
        if (ch == '|')
            continue;
        if (ch == '(') {
            if (depth >= RE_DEPTH_MAX)
                return RE_NODES_MAX + 1;
            c = 1 + re_nodes(p, depth + 1, &in);
            if (**p == ')')
                (*p)++;
        } else if (ch == '\\') {
            if (**p)
                (*p)++;
        } else if (ch == '[') {
            /* a bracket expression: "]" first (after "^") is a member */
            if (**p == '^')
                (*p)++;
            if (**p == ']')
                (*p)++;
            while (**p && **p != ']')
                (*p)++;
            if (**p)
                (*p)++;
        }
        int q = in.qdepth;
        for (;; q++) {
            if (**p == '*' || **p == '?') {
                (*p)++;
            } else if (**p == '+') {
                (*p)++;
                c *= 2;
            } else if (**p == '{') {
                const char *e = *p + 1;
                char *end;
                long lo = strtol(e, &end, 10), hi = lo;
                if (*end == ',')
                    hi = end[1] == '}' ? lo : strtol(end + 1, &end, 10);
                while (*end && *end != '}')
                    end++;
                *p = *end ? end + 1 : end;
                c *= (double)(hi > lo ? hi : lo) + 1;
            } else {
                break;
            }
        }
        if (q > st->qdepth)
            st->qdepth = q;
        st->nested += in.nested + (q >= 2);
        total += c;
        if (total > RE_NODES_MAX)
            return RE_NODES_MAX + 1;
    }
    return total;
}

/* Whether pattern pat is small enough to compile: at most 1024 bytes,
 * RE_NODES_MAX nodes spelt out, RE_QDEPTH_MAX repetitions on one another,
 * RE_NESTED_MAX atoms with more than one. */
static bool re_small(const char *pat)
{
    if (strlen(pat) > 1024)
        return false;
    double n = 0;
    struct re_stat st = {0, 0};
    while (*pat && n <= RE_NODES_MAX && st.qdepth <= RE_QDEPTH_MAX) {
        n += re_nodes(&pat, 0, &st);
        if (*pat == ')') /* unbalanced: regcomp refuses it, count on */
            pat++;
    }
    return n <= RE_NODES_MAX && st.qdepth <= RE_QDEPTH_MAX && st.nested <= RE_NESTED_MAX;
}

/* A list of names or patterns (null or absent: none). re_ok: "re:" entries
 * are regular expressions (compressed-tensors); otherwise plain text. */
static inf_status_t get_names(const struct ctx *x, const json_t *o, const char *key, bool re_ok,
                              struct eng_qname **out, int32_t *n_out, struct inf_err *err)
{
    *out = NULL;
    *n_out = 0;
    const json_t *v = get(o, key);
    if (!v)
        return INF_OK;
    if (!json_is_array(v))
        return inf_err_set(err, INF_E_INVALID, KEYFMT " must be a list of names", KEYARGS(x, key));
    size_t n = json_array_size(v);
    if (n == 0)
        return INF_OK;
    struct eng_qname *names = calloc(n, sizeof *names);
    if (!names)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    int32_t got = 0;
    inf_status_t st = INF_OK;
    for (size_t i = 0; i < n && st == INF_OK; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_string(e)) {
            st = inf_err_set(err, INF_E_INVALID, KEYFMT "[%zu] must be a string", KEYARGS(x, key),
                             i);
            break;
        }
        const char *s = json_string_value(e);
        struct eng_qname *q = &names[got];
        q->re = re_ok && strncmp(s, "re:", 3) == 0;
        q->klass = re_ok && strcmp(s, "Linear") == 0;
        if (!(q->text = strdup(q->re ? s + 3 : s))) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            break;
        }
        if (q->re && !re_small(q->text)) {
            q->re = false;
            st = inf_err_set(err, INF_E_UNSUPPORTED,
                             KEYFMT "[%zu] 're:%.80s' is too large a regular expression (more "
                                    "than 1024 bytes or %d nodes spelt out, or repetitions of "
                                    "repetitions nested too deep or too many)",
                             KEYARGS(x, key), i, q->text, RE_NODES_MAX);
            got++;
            break;
        }
        if (q->re) {
            /* anchored at the start as Python's re.match, which the
             * writers' matching uses */
            size_t len = strlen(q->text) + 4;
            char *pat = malloc(len);
            int rc = -1;
            if (pat) {
                snprintf(pat, len, "^(%s)", q->text);
                rc = regcomp(&q->rx, pat, REG_EXTENDED | REG_NOSUB);
                free(pat);
            }
            if (rc != 0) {
                q->re = false;
                st = inf_err_set(err, INF_E_UNSUPPORTED,
                                 KEYFMT "[%zu] 're:%.80s' is not a POSIX extended regular "
                                        "expression",
                                 KEYARGS(x, key), i, q->text);
                got++;
                break;
            }
        }
        got++;
    }
    if (st != INF_OK) {
        names_free(names, got);
        return st;
    }
    *out = names;
    *n_out = got;
    return INF_OK;
}

static bool name_matches(const struct eng_qname *p, const char *name, bool substring)
{
    if (p->klass)
        return true;
    if (p->re)
        return regexec(&p->rx, name, 0, NULL, 0) == 0;
    return substring ? strstr(name, p->text) != NULL : strcmp(name, p->text) == 0;
}

/* ---- awq ---------------------------------------------------------------------- */
static inf_status_t parse_awq(const struct ctx *x, const json_t *o, struct eng_qcfg *q,
                              struct inf_err *err)
{
    int64_t bits = 0, group = 0;
    bool zp = true;
    const char *version = NULL;
    inf_status_t st;
    if ((st = get_int(x, o, "bits", "w_bit", 4, &bits, err)) ||
        (st = check_bits(x, bits, get(o, "bits") ? "bits" : "w_bit", err)) ||
        (st = get_int(x, o, "group_size", "q_group_size", 128, &group, err)) ||
        (st = check_group(x, group, get(o, "group_size") ? "group_size" : "q_group_size", err)) ||
        (st = get_bool(x, o, "zero_point", true, &zp, err)) ||
        (st = get_str(x, o, "version", "gemm", &version, err)))
        return st;
    /* AutoAWQ's GEMM layers always carry zero points (WQLinear_GEMM.from_linear
     * needs them); the other versions pack differently. */
    if (!zp)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           KEYFMT " false is not supported (AutoAWQ GEMM checkpoints have zero "
                                  "points)",
                           KEYARGS(x, "zero_point"));
    if (strcasecmp(version, "gemm") != 0)
        return inf_err_set(err, INF_E_UNSUPPORTED, KEYFMT " '%.32s' is not supported (gemm)",
                           KEYARGS(x, "version"), version);
    q->q = (struct eng_qlayer){.method = ENG_QM_AWQ, .group = (int32_t)group};
    if ((st = get_names(x, o, "modules_to_not_convert", false, &q->skip, &q->n_skip, err)))
        return st;
    if (group < 0)
        snprintf(q->desc, sizeof q->desc, "awq gemm (bits 4, per channel, zero points)");
    else
        snprintf(q->desc, sizeof q->desc, "awq gemm (bits 4, group %lld, zero points)",
                 (long long)group);
    return INF_OK;
}

/* ---- gptq --------------------------------------------------------------------- */
static inf_status_t parse_gptq(const struct ctx *x, const json_t *o, struct eng_qcfg *q,
                               struct inf_err *err)
{
    int64_t bits = 0, group = 0;
    bool desc_act = false, sym = true, marlin = false;
    const char *fmt = NULL, *pack = NULL;
    inf_status_t st;
    if ((st = get_int(x, o, "bits", NULL, 4, &bits, err)) ||
        (st = check_bits(x, bits, "bits", err)) ||
        (st = get_int(x, o, "group_size", NULL, 128, &group, err)) ||
        (st = check_group(x, group, "group_size", err)) ||
        (st = get_bool(x, o, "desc_act", false, &desc_act, err)) ||
        (st = get_bool(x, o, "sym", true, &sym, err)) ||
        (st = get_bool(x, o, "lm_head", false, &q->lm_head, err)) ||
        (st = get_bool(x, o, "is_marlin_format", false, &marlin, err)) ||
        (st = get_str(x, o, "checkpoint_format", "gptq", &fmt, err)) ||
        (st = get_str(x, o, "pack_dtype", "int32", &pack, err)))
        return st;
    bool v1 = strcmp(fmt, "gptq") == 0;
    if (marlin)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           KEYFMT " true is not supported (Marlin-repacked GPTQ)",
                           KEYARGS(x, "is_marlin_format"));
    if (!v1 && strcmp(fmt, "gptq_v2") != 0)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           KEYFMT " '%.32s' is not supported (gptq, gptq_v2)",
                           KEYARGS(x, "checkpoint_format"), fmt);
    if (strcmp(pack, "int32") != 0 && strcmp(pack, "torch.int32") != 0)
        return inf_err_set(err, INF_E_UNSUPPORTED, KEYFMT " '%.32s' is not supported (int32)",
                           KEYARGS(x, "pack_dtype"), pack);
    const json_t *dyn = get(o, "dynamic");
    if (dyn && !(json_is_object(dyn) && json_object_size(dyn) == 0))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           KEYFMT " is not supported (per-module quantization overrides)",
                           KEYARGS(x, "dynamic"));
    q->q = (struct eng_qlayer){.method = ENG_QM_GPTQ,
                               .group = (int32_t)group,
                               .sym = sym,
                               .zero_minus_one = v1,
                               .act_order = desc_act};
    char g[32];
    if (group < 0)
        snprintf(g, sizeof g, "per channel");
    else
        snprintf(g, sizeof g, "group %lld", (long long)group);
    snprintf(q->desc, sizeof q->desc, "gptq (bits 4, %s, %s, %s, checkpoint_format %s%s)", g,
             desc_act ? "desc_act" : "no desc_act", sym ? "sym" : "asym", fmt,
             q->lm_head ? ", lm_head" : "");
    return INF_OK;
}

/* ---- compressed-tensors ---------------------------------------------------------- */
static inf_status_t parse_ct_weights(const struct ctx *x, const json_t *w, struct eng_qlayer *lq,
                                     struct inf_err *err)
{
    int64_t bits = 0, group = 0;
    bool sym = true, dynamic = false;
    const char *type = NULL, *strategy = NULL;
    inf_status_t st;
    if (!json_is_object(w))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "%s: %s.weights is missing (weight quantization is needed)", x->file,
                           x->obj);
    struct ctx wx = *x;
    char obj[160];
    snprintf(obj, sizeof obj, "%s.weights", x->obj);
    wx.obj = obj;
    if ((st = get_int(&wx, w, "num_bits", NULL, 8, &bits, err)) ||
        (st = check_bits(&wx, bits, "num_bits", err)) ||
        (st = get_str(&wx, w, "type", "int", &type, err)) ||
        (st = get_bool(&wx, w, "symmetric", true, &sym, err)) ||
        (st = get_bool(&wx, w, "dynamic", false, &dynamic, err)) ||
        (st = get_str(&wx, w, "strategy", "tensor", &strategy, err)))
        return st;
    if (strcmp(type, "int") != 0)
        return inf_err_set(err, INF_E_UNSUPPORTED, KEYFMT " '%.16s' is not supported (int)",
                           KEYARGS(&wx, "type"), type);
    if (dynamic)
        return inf_err_set(err, INF_E_UNSUPPORTED, KEYFMT " true is not supported",
                           KEYARGS(&wx, "dynamic"));
    if (strcmp(strategy, "group") == 0) {
        if ((st = get_int(&wx, w, "group_size", NULL, 0, &group, err)))
            return st;
        if (group <= 0)
            return inf_err_set(err, INF_E_INVALID, KEYFMT " must be positive for strategy group",
                               KEYARGS(&wx, "group_size"));
        if ((st = check_group(&wx, group, "group_size", err)))
            return st;
    } else if (strcmp(strategy, "channel") == 0) {
        group = -1;
    } else {
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           KEYFMT " '%.16s' is not supported (group, channel)",
                           KEYARGS(&wx, "strategy"), strategy);
    }
    /* actorder "group" stores weight_g_idx; "weight" (and the older true)
     * reorders during quantization only and keeps groups contiguous */
    const json_t *ao = get(w, "actorder");
    bool act = ao && json_is_string(ao) && strcmp(json_string_value(ao), "group") == 0;
    *lq = (struct eng_qlayer){
        .method = ENG_QM_CT, .group = (int32_t)group, .sym = sym, .act_order = act};
    return INF_OK;
}

static inf_status_t parse_ct(const struct ctx *x, const json_t *o, struct eng_qcfg *q,
                             struct inf_err *err)
{
    const char *fmt = NULL;
    inf_status_t st;
    if ((st = get_str(x, o, "format", NULL, &fmt, err)))
        return st;
    const json_t *sp = get(o, "sparsity_config");
    const json_t *spf = sp ? get(sp, "format") : NULL;
    if (spf && (!json_is_string(spf) || strcmp(json_string_value(spf), "dense") != 0))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "%s: " QC ".sparsity_config.format '%.32s' is not supported (dense)",
                           x->file, json_is_string(spf) ? json_string_value(spf) : "?");
    const json_t *groups = get(o, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return inf_err_set(err, INF_E_INVALID, KEYFMT " must be an object of config groups",
                           KEYARGS(x, "config_groups"));
    size_t ng = json_object_size(groups);
    q->groups = calloc(ng, sizeof *q->groups);
    if (!q->groups)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    const char *gname;
    const json_t *g;
    json_object_foreach((json_t *)groups, gname, g)
    {
        char obj[128];
        snprintf(obj, sizeof obj, QC ".config_groups.%.64s", gname);
        struct ctx gx = {.file = x->file, .obj = obj};
        if (!json_is_object(g))
            return inf_err_set(err, INF_E_INVALID, "%s: %s must be an object", x->file, obj);
        const char *gfmt = NULL;
        if ((st = get_str(&gx, g, "format", fmt, &gfmt, err)))
            return st;
        if (!gfmt || strcmp(gfmt, "pack-quantized") != 0)
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               "%s: " QC ".format '%.32s' is not supported (pack-quantized)",
                               x->file, gfmt ? gfmt : "(none)");
        if (get(g, "input_activations") || get(g, "output_activations"))
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               "%s: %s quantizes activations; only weight-only INT4 (W4A16) "
                               "is supported",
                               x->file, obj);
        struct eng_qgroup *qg = &q->groups[q->n_groups];
        if ((st = parse_ct_weights(&gx, get(g, "weights"), &qg->q, err)))
            return st;
        if ((st = get_names(&gx, g, "targets", true, &qg->targets, &qg->n_targets, err)))
            return st;
        q->n_groups++;
        if (qg->n_targets == 0)
            return inf_err_set(err, INF_E_INVALID, "%s: %s.targets must list layers", x->file, obj);
    }
    if ((st = get_names(x, o, "ignore", true, &q->skip, &q->n_skip, err)))
        return st;
    if (get(o, "kv_cache_scheme"))
        inf_log(WARN,
                "%s: " QC ".kv_cache_scheme is not implemented: the KV cache keeps its "
                "own dtype",
                x->file);
    const struct eng_qlayer *l0 = &q->groups[0].q;
    char gs[32];
    if (l0->group < 0)
        snprintf(gs, sizeof gs, "per channel");
    else
        snprintf(gs, sizeof gs, "group %d", l0->group);
    snprintf(q->desc, sizeof q->desc, "compressed-tensors pack-quantized (bits 4, %s, %s%s%s)", gs,
             l0->sym ? "symmetric" : "asymmetric", l0->act_order ? ", actorder group" : "",
             q->n_groups > 1 ? ", and other config groups" : "");
    return INF_OK;
}

/* ---- entry points ---------------------------------------------------------------- */
void eng_qcfg_free(struct eng_qcfg *q)
{
    if (!q)
        return;
    names_free(q->skip, q->n_skip);
    for (int32_t i = 0; q->groups && i < q->n_groups; i++)
        names_free(q->groups[i].targets, q->groups[i].n_targets);
    free(q->groups);
    memset(q, 0, sizeof *q);
}

inf_status_t eng_qcfg_parse(const char *json, size_t len, const char *file, bool whole_config,
                            struct eng_qcfg *q, struct inf_err *err)
{
    memset(q, 0, sizeof *q);
    snprintf(q->file, sizeof q->file, "%s", file);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return inf_err_set(err, INF_E_FORMAT, "%s: not valid JSON: %.100s (line %d)", file,
                           jerr.text, jerr.line);
    inf_status_t st = INF_OK;
    const json_t *o = whole_config ? get(root, QC) : root;
    struct ctx x = {.file = file, .obj = whole_config ? QC : ""};
    if (!json_is_object(root)) {
        st = inf_err_set(err, INF_E_FORMAT, "%s: not a JSON object", file);
        goto done;
    }
    if (!o)
        goto done; /* a 16-bit checkpoint */
    if (!json_is_object(o)) {
        st = inf_err_set(err, INF_E_INVALID, "%s: " QC " must be an object", file);
        goto done;
    }
    const char *method = NULL;
    if ((st = get_str(&x, o, "quant_method", whole_config ? NULL : "gptq", &method, err)))
        goto done;
    if (!method) {
        st = inf_err_set(err, INF_E_INVALID, KEYFMT " is missing", KEYARGS(&x, "quant_method"));
        goto done;
    }
    if (strcmp(method, "awq") == 0) {
        q->method = ENG_QM_AWQ;
        st = parse_awq(&x, o, q, err);
    } else if (strcmp(method, "gptq") == 0) {
        q->method = ENG_QM_GPTQ;
        st = parse_gptq(&x, o, q, err);
    } else if (strcmp(method, "compressed-tensors") == 0) {
        q->method = ENG_QM_CT;
        st = parse_ct(&x, o, q, err);
    } else {
        st = inf_err_set(err, INF_E_UNSUPPORTED,
                         KEYFMT " '%.32s' is not supported (awq, gptq, compressed-tensors)",
                         KEYARGS(&x, "quant_method"), method);
    }
done:
    json_decref(root);
    if (st != INF_OK)
        eng_qcfg_free(q);
    return st;
}

/* dir/name into a malloc'd buffer; INF_E_NOTFOUND when absent. */
static inf_status_t read_file(const char *dir, const char *name, char **out, size_t *len,
                              struct inf_err *err)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        if (e == ENOENT)
            return INF_E_NOTFOUND;
        return inf_err_set(err, INF_E_IO, "%s: cannot open: %s", name, strerror(e));
    }
    size_t cap = 16 << 20, n = 0, r;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    while ((r = fread(buf + n, 1, cap - n, f)) > 0 && n + r < cap)
        n += r;
    bool bad = ferror(f), toobig = r > 0;
    fclose(f);
    if (bad || toobig) {
        free(buf);
        return inf_err_set(err, bad ? INF_E_IO : INF_E_TOOBIG, "%s: %s", name,
                           bad ? "read error" : "larger than 16 MB");
    }
    *out = buf;
    *len = n;
    return INF_OK;
}

inf_status_t eng_qcfg_load(const char *dir, struct eng_qcfg *q, struct inf_err *err)
{
    memset(q, 0, sizeof *q);
    char *buf;
    size_t len;
    inf_status_t st = read_file(dir, "config.json", &buf, &len, err);
    if (st == INF_E_NOTFOUND)
        return inf_err_set(err, st, "config.json: cannot open: %s", strerror(ENOENT));
    if (st != INF_OK)
        return st;
    st = eng_qcfg_parse(buf, len, "config.json", true, q, err);
    free(buf);
    if (st != INF_OK || q->method != ENG_QM_NONE)
        return st;
    st = read_file(dir, "quantize_config.json", &buf, &len, err);
    if (st == INF_E_NOTFOUND) {
        snprintf(q->file, sizeof q->file, "config.json");
        return INF_OK;
    }
    if (st != INF_OK)
        return st;
    st = eng_qcfg_parse(buf, len, "quantize_config.json", false, q, err);
    free(buf);
    return st;
}

bool eng_qcfg_layer(const struct eng_qcfg *q, const char *name, struct eng_qlayer *out)
{
    switch (q->method) {
    case ENG_QM_AWQ:
        /* AutoAWQ quantizes the decoder's linears, never lm_head */
        if (strcmp(name, "lm_head") == 0)
            return false;
        for (int32_t i = 0; i < q->n_skip; i++)
            if (name_matches(&q->skip[i], name, true))
                return false;
        *out = q->q;
        return true;
    case ENG_QM_GPTQ:
        if (strcmp(name, "lm_head") == 0 && !q->lm_head)
            return false;
        *out = q->q;
        return true;
    case ENG_QM_CT:
        for (int32_t i = 0; i < q->n_skip; i++)
            if (name_matches(&q->skip[i], name, false))
                return false;
        for (int32_t g = 0; g < q->n_groups; g++)
            for (int32_t t = 0; t < q->groups[g].n_targets; t++)
                if (name_matches(&q->groups[g].targets[t], name, false)) {
                    *out = q->groups[g].q;
                    return true;
                }
        return false;
    default:
        return false;
    }
}
