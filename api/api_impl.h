#pragma once
/* api internals: the JSON writer, number formatting and the shared pieces of
 * the request parsers. Only the .c files of api/ include it. */
#include "api/api.h"

#include <jansson.h>

/* ---- writer -----------------------------------------------------------------
 * Appends to a malloc'd buffer; the first allocation failure sets oom and
 * turns every later call into a no-op, so encoders check once, at the end. */
struct jw {
    char *buf;
    size_t len, cap;
    bool oom;
};

void jw_init(struct jw *w);
void jw_raw(struct jw *w, const char *s, size_t n);
void jw_lit(struct jw *w, const char *s); /* strlen(s) bytes, verbatim */
/* A quoted JSON string: '"' '\\' and control characters escaped (\n, \u001f),
 * other UTF-8 kept as is, each invalid sequence replaced by U+FFFD. */
void jw_str(struct jw *w, const char *s, size_t n);
/* jw_str without the quotes, to build one string from pieces. */
void jw_esc(struct jw *w, const char *s, size_t n);
void jw_cstr(struct jw *w, const char *s); /* NULL writes null */
void jw_i64(struct jw *w, int64_t v);
void jw_u64(struct jw *w, uint64_t v);
/* The shortest decimal that reads back as the same float. JSON has no
 * infinities: values below -9999 (-inf too) write -9999.0 as vLLM does;
 * NaN and +inf write null. */
void jw_f32(struct jw *w, float v);
/* Move the text into arena a (NUL-terminated) and free the buffer.
 * Errors: INF_E_NOMEM. */
inf_status_t jw_finish(struct jw *w, struct inf_arena *a, char **out, size_t *out_len,
                       struct inf_err *err);

/* Python repr()-style shortest round-trip form of v (a double, or a float
 * when single): "2.5", "16.0", "1e-05", "1e+16". buf of >= 40 bytes. */
void api_fmt_real(char *buf, size_t cap, double v, bool single);

/* ---- parser pieces ---------------------------------------------------------- */
/* Fail with INF_E_INVALID (or st), the message from fmt, and fault->param. */
inf_status_t api_fail(struct api_fault *fault, struct inf_err *err, inf_status_t st,
                      const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Parse body as JSON (duplicate keys rejected) and require an object.
 * Errors: INF_E_INVALID with param null. */
inf_status_t api_body_load(const char *body, size_t len, json_t **root, struct api_fault *fault,
                           struct inf_err *err);

/* A short description of v for messages: "2.5", "16.0", "-1", "true",
 * "null", "a string", "an array", "an object". buf of >= 40 bytes. */
const char *api_describe(const json_t *v, char *buf, size_t cap);

/* Record in *ignored the keys of obj not in known[] (NULL-terminated),
 * prefixed with prefix ("" or "stream_options."). Errors: INF_E_NOMEM. */
inf_status_t api_collect_ignored(const json_t *obj, const char *const *known, const char *prefix,
                                 struct inf_arena *arena, const char ***ignored, uint32_t *n,
                                 struct inf_err *err);

/* Read a string field (absent or null: *out untouched, returns INF_OK). */
inf_status_t api_get_string(const json_t *root, const char *key, struct inf_arena *arena,
                            struct api_text *out, struct api_fault *fault, struct inf_err *err);
/* Read a boolean field (absent or null: *out untouched). */
inf_status_t api_get_bool(const json_t *root, const char *key, bool *out, struct api_fault *fault,
                          struct inf_err *err);

/* The model check shared by every endpoint: NULL (absent) or lim->model
 * passes; another name is INF_E_NOTFOUND, code "model_not_found". A
 * non-string is INF_E_INVALID. */
inf_status_t api_check_model(const json_t *root, const struct api_limits *lim,
                             struct inf_arena *arena, const char **model, struct api_fault *fault,
                             struct inf_err *err);

/* Read a token id array v (param names it) into the arena: each an integer
 * in [0, vocab). An empty array gives *ids NULL, *n 0. */
inf_status_t api_get_ids(const json_t *v, const char *param, uint32_t vocab,
                         struct inf_arena *arena, int32_t **ids, uint32_t *n,
                         struct api_fault *fault, struct inf_err *err);
