/* json.c — the compact JSON writer the encoders share, number formatting, and
 * the reading helpers the request parsers share. */
#include "api/api_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ------------------------------------------------------------------ */

void jw_init(struct jw *w)
{
    w->buf = NULL;
    w->len = 0;
    w->cap = 0;
    w->oom = false;
}

static bool jw_reserve(struct jw *w, size_t n)
{
    if (w->oom)
        return false;
    if (n <= w->cap - w->len)
        return true;
    if (n > SIZE_MAX / 4 - w->len || !inf_grow(&w->buf, &w->cap, w->len + n, 256)) {
        w->oom = true;
        return false;
    }
    return true;
}

void jw_raw(struct jw *w, const char *s, size_t n)
{
    if (!jw_reserve(w, n))
        return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
}

void jw_lit(struct jw *w, const char *s)
{
    jw_raw(w, s, strlen(s));
}

size_t api_utf8_chars(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t chars = 0;
    for (size_t i = 0; i < len; chars++) {
        bool valid;
        i += inf_utf8_next(p + i, len - i, &valid);
    }
    return chars;
}

void jw_esc(struct jw *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t run = 0; /* start of the pending verbatim run */
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        bool valid = true;
        size_t span = c < 0x80 ? 1 : inf_utf8_next(p + i, n - i, &valid);
        if (c >= 0x80 && valid) {
            i += span;
            continue;
        }
        jw_raw(w, s + run, i - run);
        char esc[8];
        if (!valid) {
            jw_raw(w, "\xEF\xBF\xBD", 3); /* U+FFFD */
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            jw_raw(w, esc, 2);
        } else if (c == '\n') {
            jw_raw(w, "\\n", 2);
        } else if (c == '\r') {
            jw_raw(w, "\\r", 2);
        } else if (c == '\t') {
            jw_raw(w, "\\t", 2);
        } else if (c == '\b') {
            jw_raw(w, "\\b", 2);
        } else if (c == '\f') {
            jw_raw(w, "\\f", 2);
        } else {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            jw_raw(w, esc, 6);
        }
        i += span;
        run = i;
    }
    jw_raw(w, s + run, n - run);
}

void jw_str(struct jw *w, const char *s, size_t n)
{
    jw_raw(w, "\"", 1);
    jw_esc(w, s, n);
    jw_raw(w, "\"", 1);
}

void jw_cstr(struct jw *w, const char *s)
{
    if (s)
        jw_str(w, s, strlen(s));
    else
        jw_raw(w, "null", 4);
}

void jw_i64(struct jw *w, int64_t v)
{
    char b[32];
    int k = snprintf(b, sizeof b, "%" PRId64, v);
    jw_raw(w, b, (size_t)k);
}

void jw_u64(struct jw *w, uint64_t v)
{
    char b[32];
    int k = snprintf(b, sizeof b, "%" PRIu64, v);
    jw_raw(w, b, (size_t)k);
}

void api_fmt_real(char *buf, size_t cap, double v, bool single)
{
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v < 0 ? "-inf" : "inf");
        return;
    }
    /* The fewest significant digits that read back as the same value. */
    char tmp[48];
    int maxp = single ? 9 : 17;
    for (int p = 1; p <= maxp; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        if (single ? strtof(tmp, NULL) == (float)v : strtod(tmp, NULL) == v)
            break;
    }
    /* tmp is [-]d[.ddd]e<sign>XX: split it into sign, digits, exponent. */
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg)
        q++;
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.' && nd < (int)sizeof dig - 1)
            dig[nd++] = *q;
    int exp = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    dig[nd] = '\0';

    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                out[o++] = i < nd ? dig[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++)
                    out[o++] = dig[i];
            else
                out[o++] = '0';
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++)
                out[o++] = '0';
            for (int i = 0; i < nd; i++)
                out[o++] = dig[i];
        }
        out[o] = '\0';
    } else {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++)
                out[o++] = dig[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    snprintf(buf, cap, "%s", out);
}

void jw_f32(struct jw *w, float v)
{
    if (isnan(v) || (isinf(v) && v > 0)) {
        jw_raw(w, "null", 4);
        return;
    }
    if (v < -9999.0f)
        v = -9999.0f; /* vLLM's stand-in for -inf: JSON has no infinities */
    char b[48];
    api_fmt_real(b, sizeof b, v, true);
    jw_lit(w, b);
}

inf_status_t jw_finish(struct jw *w, struct inf_arena *a, char **out, size_t *out_len,
                       struct inf_err *err)
{
    char *p = NULL;
    if (!w->oom)
        p = inf_arena_strndup(a, w->buf ? w->buf : "", w->len);
    size_t len = w->len;
    free(w->buf);
    jw_init(w);
    if (!p)
        return inf_err_set(err, INF_E_NOMEM, "out of memory encoding a response");
    *out = p;
    if (out_len)
        *out_len = len;
    return INF_OK;
}

/* ---- parser pieces ----------------------------------------------------------- */

inf_status_t api_fail(struct api_fault *fault, struct inf_err *err, inf_status_t st,
                      const char *param, const char *code, const char *fmt, ...)
{
    if (fault) {
        fault->param = param;
        fault->code = code;
    }
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = st;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

inf_status_t api_body_load(const char *body, size_t len, json_t **root, struct api_fault *fault,
                           struct inf_err *err)
{
    *root = NULL;
    if (!body)
        len = 0;
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    if (i == len)
        return api_fail(fault, err, INF_E_INVALID, NULL, NULL,
                        "The request body is empty; expected a JSON object");
    json_error_t je;
    json_t *v =
        json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        return api_fail(fault, err, INF_E_INVALID, NULL, NULL,
                        "We could not parse the JSON body of your request: %s (line %d, column %d)",
                        je.text, je.line, je.column);
    if (!json_is_object(v)) {
        char d[48];
        api_fail(fault, err, INF_E_INVALID, NULL, NULL,
                 "The request body must be a JSON object, got %s", api_describe(v, d, sizeof d));
        json_decref(v);
        return INF_E_INVALID;
    }
    *root = v;
    return INF_OK;
}

const char *api_describe(const json_t *v, char *buf, size_t cap)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case JSON_REAL:
        api_fmt_real(buf, cap, json_real_value(v), false);
        return buf;
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
    default:
        return "null";
    }
}

static bool known_key(const char *k, const char *const *known)
{
    for (; *known; known++)
        if (strcmp(k, *known) == 0)
            return true;
    return false;
}

/* A copy of an unknown key fit for a log line: clipped, no control bytes.
 * The clip backs off to a character boundary so the name stays UTF-8. */
static char *loggable_name(struct inf_arena *arena, const char *prefix, const char *k)
{
    size_t n = strlen(k);
    if (n > 64) {
        n = 64;
        while (n > 0 && ((unsigned char)k[n] & 0xC0) == 0x80)
            n--;
    }
    char *s = inf_arena_sprintf(arena, "%s%.*s", prefix, (int)n, k);
    if (s)
        for (char *p = s; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
    return s;
}

inf_status_t api_collect_ignored(const json_t *obj, const char *const *known, const char *prefix,
                                 struct inf_arena *arena, const char ***ignored, uint32_t *n,
                                 struct inf_err *err)
{
    const char *k;
    json_t *v;
    size_t extra = 0;
    json_object_foreach((json_t *)obj, k, v)
    {
        if (!known_key(k, known))
            extra++;
    }
    if (extra > API_MAX_IGNORED - *n)
        extra = API_MAX_IGNORED - *n;
    if (!extra)
        return INF_OK;
    const char **list = inf_arena_calloc(arena, *n + extra, sizeof *list);
    if (!list)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (uint32_t i = 0; i < *n; i++)
        list[i] = (*ignored)[i];
    uint32_t limit = *n + (uint32_t)extra;
    json_object_foreach((json_t *)obj, k, v)
    {
        if (*n == limit)
            break;
        if (known_key(k, known))
            continue;
        char *s = loggable_name(arena, prefix, k);
        if (!s)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        list[(*n)++] = s;
    }
    *ignored = list;
    return INF_OK;
}

inf_status_t api_get_string(const json_t *root, const char *key, struct inf_arena *arena,
                            struct api_text *out, struct api_fault *fault, struct inf_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return INF_OK;
    if (!json_is_string(v)) {
        char d[48];
        return api_fail(fault, err, INF_E_INVALID, key, NULL, "'%s' must be a string, got %s", key,
                        api_describe(v, d, sizeof d));
    }
    size_t n = json_string_length(v);
    char *s = inf_arena_strndup(arena, json_string_value(v), n);
    if (!s)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    out->s = s;
    out->len = n;
    return INF_OK;
}

inf_status_t api_get_bool(const json_t *root, const char *key, bool *out, struct api_fault *fault,
                          struct inf_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return INF_OK;
    if (!json_is_boolean(v)) {
        char d[48];
        return api_fail(fault, err, INF_E_INVALID, key, NULL, "'%s' must be a boolean, got %s", key,
                        api_describe(v, d, sizeof d));
    }
    *out = json_is_true(v);
    return INF_OK;
}

inf_status_t api_check_model(const json_t *root, const struct api_limits *lim,
                             struct inf_arena *arena, const char **model, struct api_fault *fault,
                             struct inf_err *err)
{
    struct api_text t = {NULL, 0};
    inf_status_t st = api_get_string(root, "model", arena, &t, fault, err);
    if (st != INF_OK)
        return st;
    *model = t.s;
    if (!t.s || !lim->model)
        return INF_OK;
    if (t.len == strlen(lim->model) && memcmp(t.s, lim->model, t.len) == 0)
        return INF_OK;
    /* Clip the echoed name so the message stays whole; %.*s stops at a NUL. */
    return api_fail(fault, err, INF_E_NOTFOUND, "model", "model_not_found",
                    "The model `%.*s%s` does not exist or you do not have access to it.",
                    t.len > 96 ? 96 : (int)t.len, t.s, t.len > 96 ? "..." : "");
}

inf_status_t api_get_ids(const json_t *v, const char *param, uint32_t vocab,
                         struct inf_arena *arena, int32_t **ids, uint32_t *n,
                         struct api_fault *fault, struct inf_err *err)
{
    size_t len = json_array_size(v);
    *ids = NULL;
    *n = 0;
    if (len == 0)
        return INF_OK;
    if (len > UINT32_MAX)
        return api_fail(fault, err, INF_E_INVALID, param, NULL, "'%s' holds too many tokens",
                        param);
    int32_t *out = inf_arena_alloc(arena, len * sizeof *out);
    if (!out)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            char d[48];
            return api_fail(fault, err, INF_E_INVALID, param, NULL,
                            "'%s' token ids must be integers, got %s at index %zu", param,
                            api_describe(e, d, sizeof d), i);
        }
        json_int_t id = json_integer_value(e);
        if (id < 0 || id >= (json_int_t)vocab)
            return api_fail(fault, err, INF_E_INVALID, param, NULL,
                            "'%s' token id %" JSON_INTEGER_FORMAT
                            " at index %zu is outside the vocabulary [0, %" PRIu32 ")",
                            param, id, i, vocab);
        out[i] = (int32_t)id;
    }
    *ids = out;
    *n = (uint32_t)len;
    return INF_OK;
}
