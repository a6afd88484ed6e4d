/* completions.c — POST /v1/completions: parse and validate the body into a
 * struct api_completion_req, and the context-length check the caller runs
 * once the prompt is tokenized. Bounds and defaults: docs/API.md. */
#include "api/api_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const completion_keys[] = {
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "best_of",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "echo",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "add_special_tokens",
    "user",
    "suffix",
    NULL,
};

static const char *const stream_option_keys[] = {"include_usage", NULL};

#define PROMPT_SHAPE                                                                               \
    "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "     \
    "token ids"

/* An integer field: absent or null leaves *present false. */
static inf_status_t get_int(const json_t *root, const char *key, json_int_t *out, bool *present,
                            struct api_fault *fault, struct inf_err *err)
{
    json_t *v = json_object_get(root, key);
    *present = false;
    if (!v || json_is_null(v))
        return INF_OK;
    if (!json_is_integer(v)) {
        char d[48];
        return api_fail(fault, err, INF_E_INVALID, key, NULL, "'%s' must be an integer, got %s",
                        key, api_describe(v, d, sizeof d));
    }
    *out = json_integer_value(v);
    *present = true;
    return INF_OK;
}

/* A number field within [lo, hi], each end open or closed; absent or null
 * leaves *out alone. */
static inf_status_t get_real(const json_t *root, const char *key, double lo, bool lo_open,
                             double hi, bool hi_open, float *out, struct api_fault *fault,
                             struct inf_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return INF_OK;
    char d[48];
    if (!json_is_number(v))
        return api_fail(fault, err, INF_E_INVALID, key, NULL, "'%s' must be a number, got %s", key,
                        api_describe(v, d, sizeof d));
    double x = json_number_value(v);
    if ((lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi))
        return api_fail(fault, err, INF_E_INVALID, key, NULL, "'%s' must be in %c%g, %g%c, got %s",
                        key, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']',
                        api_describe(v, d, sizeof d));
    *out = (float)x;
    return INF_OK;
}

static inf_status_t parse_prompt(const json_t *root, const struct api_limits *lim,
                                 struct inf_arena *arena, struct api_completion_req *req,
                                 struct api_fault *fault, struct inf_err *err)
{
    json_t *v = json_object_get(root, "prompt");
    char d[48];
    if (!v || json_is_null(v))
        return api_fail(fault, err, INF_E_INVALID, "prompt", NULL, "'prompt' is required");
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return api_fail(fault, err, INF_E_INVALID, "prompt", NULL,
                            "'prompt' must not be empty");
        struct api_prompt *p = inf_arena_calloc(arena, 1, sizeof *p);
        char *s = inf_arena_strndup(arena, json_string_value(v), json_string_length(v));
        if (!p || !s)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        p->text.s = s;
        p->text.len = json_string_length(v);
        req->prompts = p;
        req->n_prompts = 1;
        return INF_OK;
    }
    if (!json_is_array(v))
        return api_fail(fault, err, INF_E_INVALID, "prompt", NULL, PROMPT_SHAPE ", got %s",
                        api_describe(v, d, sizeof d));
    size_t n = json_array_size(v);
    if (n == 0)
        return api_fail(fault, err, INF_E_INVALID, "prompt", NULL, "'prompt' must not be empty");

    json_type kind = json_typeof(json_array_get(v, 0));
    if (kind != JSON_STRING && kind != JSON_INTEGER && kind != JSON_ARRAY)
        return api_fail(fault, err, INF_E_INVALID, "prompt", NULL,
                        PROMPT_SHAPE ", got %s at index 0",
                        api_describe(json_array_get(v, 0), d, sizeof d));
    for (size_t i = 1; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (json_typeof(e) != kind)
            return api_fail(fault, err, INF_E_INVALID, "prompt", NULL,
                            PROMPT_SHAPE "; index 0 is %s but index %zu is %s",
                            kind == JSON_STRING    ? "a string"
                            : kind == JSON_INTEGER ? "a token id"
                                                   : "a list",
                            i, api_describe(e, d, sizeof d));
    }

    if (kind == JSON_INTEGER) { /* one prompt of token ids */
        struct api_prompt *p = inf_arena_calloc(arena, 1, sizeof *p);
        if (!p)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        int32_t *ids;
        inf_status_t st = api_get_ids(v, "prompt", lim->vocab, arena, &ids, &p->n_ids, fault, err);
        if (st != INF_OK)
            return st;
        p->ids = ids;
        req->prompts = p;
        req->n_prompts = 1;
        return INF_OK;
    }

    if (n > lim->max_prompts)
        return api_fail(fault, err, INF_E_INVALID, "prompt", NULL,
                        "'prompt' may hold at most %" PRIu32 " prompts, got %zu", lim->max_prompts,
                        n);
    struct api_prompt *ps = inf_arena_calloc(arena, n, sizeof *ps);
    if (!ps)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (kind == JSON_STRING) {
            size_t len = json_string_length(e);
            if (len == 0)
                return api_fail(fault, err, INF_E_INVALID, "prompt", NULL,
                                "'prompt' must not be empty: prompt %zu is an empty string", i);
            char *s = inf_arena_strndup(arena, json_string_value(e), len);
            if (!s)
                return inf_err_set(err, INF_E_NOMEM, "out of memory");
            ps[i].text.s = s;
            ps[i].text.len = len;
        } else {
            if (json_array_size(e) == 0)
                return api_fail(fault, err, INF_E_INVALID, "prompt", NULL,
                                "'prompt' must not be empty: prompt %zu holds no tokens", i);
            int32_t *ids;
            inf_status_t st =
                api_get_ids(e, "prompt", lim->vocab, arena, &ids, &ps[i].n_ids, fault, err);
            if (st != INF_OK)
                return st;
            ps[i].ids = ids;
        }
    }
    req->prompts = ps;
    req->n_prompts = (uint32_t)n;
    return INF_OK;
}

static inf_status_t parse_stop(const json_t *root, const struct api_limits *lim,
                               struct inf_arena *arena, struct api_completion_req *req,
                               struct api_fault *fault, struct inf_err *err)
{
    json_t *v = json_object_get(root, "stop");
    char d[48];
    if (!v || json_is_null(v))
        return INF_OK;
    size_t n;
    if (json_is_string(v))
        n = 1;
    else if (json_is_array(v))
        n = json_array_size(v);
    else
        return api_fail(fault, err, INF_E_INVALID, "stop", NULL,
                        "'stop' must be a string or a list of strings, got %s",
                        api_describe(v, d, sizeof d));
    if (n == 0)
        return INF_OK;
    if (n > lim->max_stop)
        return api_fail(fault, err, INF_E_INVALID, "stop", NULL,
                        "'stop' may hold at most %" PRIu32 " strings, got %zu", lim->max_stop, n);
    struct api_text *stop = inf_arena_calloc(arena, n, sizeof *stop);
    if (!stop)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(e))
            return api_fail(fault, err, INF_E_INVALID, "stop", NULL,
                            "'stop' must hold only strings, got %s at index %zu",
                            api_describe(e, d, sizeof d), i);
        size_t len = json_string_length(e);
        if (len == 0)
            return api_fail(fault, err, INF_E_INVALID, "stop", NULL,
                            "'stop' strings must not be empty");
        /* Stop strings reach the engine as C strings. */
        if (memchr(json_string_value(e), '\0', len))
            return api_fail(fault, err, INF_E_INVALID, "stop", NULL,
                            "'stop' strings must not contain the character U+0000, found at "
                            "index %zu",
                            i);
        char *s = inf_arena_strndup(arena, json_string_value(e), len);
        if (!s)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        stop[i].s = s;
        stop[i].len = len;
    }
    req->stop = stop;
    req->n_stop = (uint32_t)n;
    return INF_OK;
}

/* A logit_bias key: a decimal token id ("42"), nothing else. A number too
 * large for any vocabulary reads as INT64_MAX. */
static bool parse_token_key(const char *k, json_int_t *id)
{
    json_int_t v = 0;
    if (!*k)
        return false;
    for (; *k; k++) {
        if (*k < '0' || *k > '9')
            return false;
        if (v <= 100000000000LL)
            v = v * 10 + (*k - '0');
    }
    *id = v > 100000000000LL ? INT64_MAX : v;
    return true;
}

static inf_status_t parse_logit_bias(const json_t *root, const struct api_limits *lim,
                                     struct inf_arena *arena, struct api_completion_req *req,
                                     struct api_fault *fault, struct inf_err *err)
{
    json_t *v = json_object_get(root, "logit_bias");
    char d[48];
    if (!v || json_is_null(v))
        return INF_OK;
    if (!json_is_object(v))
        return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                        "'logit_bias' must be an object of token ids to biases, got %s",
                        api_describe(v, d, sizeof d));
    size_t n = json_object_size(v);
    if (n == 0)
        return INF_OK;
    int32_t *ids = inf_arena_alloc(arena, n * sizeof *ids);
    float *vals = inf_arena_alloc(arena, n * sizeof *vals);
    unsigned char *seen = inf_arena_calloc(arena, lim->vocab / 8 + 1, 1);
    if (!ids || !vals || !seen)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    size_t i = 0;
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e)
    {
        json_int_t id;
        if (!parse_token_key(k, &id))
            return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                            "'logit_bias' keys must be token ids, got \"%.32s\"", k);
        if (id >= (json_int_t)lim->vocab)
            return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                            "'logit_bias' token id %.32s is outside the vocabulary [0, %" PRIu32
                            ")",
                            k, lim->vocab);
        if (seen[id / 8] & (1u << (id % 8)))
            return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                            "'logit_bias' names token id %" JSON_INTEGER_FORMAT " twice", id);
        seen[id / 8] |= (unsigned char)(1u << (id % 8));
        if (!json_is_number(e))
            return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                            "'logit_bias' value for token id %" JSON_INTEGER_FORMAT
                            " must be a number, got %s",
                            id, api_describe(e, d, sizeof d));
        double b = json_number_value(e);
        if (b < -100 || b > 100)
            return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                            "'logit_bias' value for token id %" JSON_INTEGER_FORMAT
                            " must be in [-100, 100], got %s",
                            id, api_describe(e, d, sizeof d));
        ids[i] = (int32_t)id;
        vals[i] = (float)b;
        i++;
    }
    req->bias_ids = ids;
    req->bias_values = vals;
    req->n_bias = (uint32_t)n;
    return INF_OK;
}

static inf_status_t parse_fields(const json_t *root, const struct api_limits *lim,
                                 struct inf_arena *arena, struct api_completion_req *req,
                                 struct api_fault *fault, struct inf_err *err)
{
    inf_status_t st;
    json_int_t x;
    bool has;
    char d[48];

#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((st = (call)) != INF_OK)                                                               \
            return st;                                                                             \
    } while (0)

    TRY(parse_prompt(root, lim, arena, req, fault, err));

    /* max_tokens: null means as many as the context allows. */
    json_t *mt = json_object_get(root, "max_tokens");
    if (mt && json_is_null(mt)) {
        req->max_tokens = API_MAX_TOKENS_AUTO;
    } else {
        TRY(get_int(root, "max_tokens", &x, &has, fault, err));
        if (has && x < 1)
            return api_fail(fault, err, INF_E_INVALID, "max_tokens", NULL,
                            "'max_tokens' must be at least 1, got %" JSON_INTEGER_FORMAT, x);
        if (has)
            req->max_tokens = x;
    }

    TRY(get_real(root, "temperature", 0, false, 2, false, &req->temperature, fault, err));
    TRY(get_real(root, "top_p", 0, true, 1, false, &req->top_p, fault, err));

    TRY(get_int(root, "top_k", &x, &has, fault, err));
    if (has) {
        if (x < -1)
            return api_fail(
                fault, err, INF_E_INVALID, "top_k", NULL,
                "'top_k' must be -1 (disabled) or at least 1, got %" JSON_INTEGER_FORMAT, x);
        if (x <= 0)
            req->top_k = API_TOP_K_OFF; /* 0 disables, as in vLLM */
        else
            req->top_k = x > (json_int_t)lim->vocab ? (int32_t)lim->vocab : (int32_t)x;
    }

    TRY(get_real(root, "min_p", 0, false, 1, false, &req->min_p, fault, err));

    TRY(get_int(root, "n", &x, &has, fault, err));
    if (has && (x < 1 || x > (json_int_t)lim->max_n))
        return api_fail(fault, err, INF_E_INVALID, "n", NULL,
                        "'n' must be in [1, %" PRIu32 "], got %" JSON_INTEGER_FORMAT, lim->max_n,
                        x);
    if (has)
        req->n = (uint32_t)x;
    req->best_of = req->n;
    TRY(get_int(root, "best_of", &x, &has, fault, err));
    if (has && (x < 1 || x > (json_int_t)lim->max_n))
        return api_fail(fault, err, INF_E_INVALID, "best_of", NULL,
                        "'best_of' must be in [1, %" PRIu32 "], got %" JSON_INTEGER_FORMAT,
                        lim->max_n, x);
    if (has && x < (json_int_t)req->n)
        return api_fail(fault, err, INF_E_INVALID, "best_of", NULL,
                        "'best_of' must be at least 'n' (%" PRIu32 "), got %" JSON_INTEGER_FORMAT,
                        req->n, x);
    /* Generating more than n and keeping the best is not supported (vLLM's
     * current engine refuses it too): best_of may only repeat n. */
    if (has && x > (json_int_t)req->n)
        return api_fail(fault, err, INF_E_INVALID, "best_of", NULL,
                        "'best_of' greater than 'n' is not supported: it must equal 'n' (%" PRIu32
                        ") or be left out, got %" JSON_INTEGER_FORMAT,
                        req->n, x);

    TRY(parse_stop(root, lim, arena, req, fault, err));

    TRY(get_int(root, "seed", &x, &has, fault, err));
    req->has_seed = has;
    if (has)
        req->seed = x;

    TRY(api_get_bool(root, "stream", &req->stream, fault, err));

    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return api_fail(fault, err, INF_E_INVALID, "stream_options", NULL,
                            "'stream_options' must be an object, got %s",
                            api_describe(so, d, sizeof d));
        if (!req->stream)
            return api_fail(fault, err, INF_E_INVALID, "stream_options", NULL,
                            "'stream_options' is only allowed when 'stream' is true");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu)) {
            if (!json_is_boolean(iu))
                return api_fail(fault, err, INF_E_INVALID, "stream_options.include_usage", NULL,
                                "'stream_options.include_usage' must be a boolean, got %s",
                                api_describe(iu, d, sizeof d));
            req->include_usage = json_is_true(iu);
        }
    }

    TRY(get_int(root, "logprobs", &x, &has, fault, err));
    if (has && (x < 0 || x > (json_int_t)lim->max_logprobs))
        return api_fail(fault, err, INF_E_INVALID, "logprobs", NULL,
                        "'logprobs' must be in [0, %" PRIu32 "], got %" JSON_INTEGER_FORMAT,
                        lim->max_logprobs, x);
    if (has)
        req->logprobs = (int32_t)x;

    TRY(api_get_bool(root, "echo", &req->echo, fault, err));
    TRY(get_real(root, "presence_penalty", -2, false, 2, false, &req->presence_penalty, fault,
                 err));
    TRY(get_real(root, "frequency_penalty", -2, false, 2, false, &req->frequency_penalty, fault,
                 err));
    TRY(get_real(root, "repetition_penalty", 0, true, 2, false, &req->repetition_penalty, fault,
                 err));
    TRY(parse_logit_bias(root, lim, arena, req, fault, err));
    /* Each choice samples with its own copy of the biases. */
    if ((uint64_t)req->n_bias * req->n_prompts * req->n > lim->max_bias_total)
        return api_fail(fault, err, INF_E_INVALID, "logit_bias", NULL,
                        "'logit_bias' holds %" PRIu32 " entries for %" PRIu32 " choices (%" PRIu32
                        " prompts x n=%" PRIu32 "); entries times choices "
                        "may be at most %" PRIu32,
                        req->n_bias, req->n_prompts * req->n, req->n_prompts, req->n,
                        lim->max_bias_total);
    TRY(api_get_bool(root, "ignore_eos", &req->ignore_eos, fault, err));

    TRY(get_int(root, "min_tokens", &x, &has, fault, err));
    if (has && x < 0)
        return api_fail(fault, err, INF_E_INVALID, "min_tokens", NULL,
                        "'min_tokens' must be at least 0, got %" JSON_INTEGER_FORMAT, x);
    if (has && req->max_tokens != API_MAX_TOKENS_AUTO && x > req->max_tokens)
        return api_fail(fault, err, INF_E_INVALID, "min_tokens", NULL,
                        "'min_tokens' must be at most 'max_tokens' (%" PRId64
                        "), got %" JSON_INTEGER_FORMAT,
                        req->max_tokens, x);
    if (has && x > (json_int_t)lim->max_model_len)
        return api_fail(fault, err, INF_E_INVALID, "min_tokens", NULL,
                        "'min_tokens' must be at most the context length (%" PRIu32
                        "), got %" JSON_INTEGER_FORMAT,
                        lim->max_model_len, x);
    if (has)
        req->min_tokens = (uint32_t)x;

    TRY(api_get_bool(root, "add_special_tokens", &req->add_special_tokens, fault, err));

    struct api_text user = {NULL, 0};
    TRY(api_get_string(root, "user", arena, &user, fault, err));
    req->user = user.s;

    json_t *sfx = json_object_get(root, "suffix");
    if (sfx && !json_is_null(sfx))
        return api_fail(fault, err, INF_E_UNSUPPORTED, "suffix", "unsupported_parameter",
                        "Unsupported parameter: 'suffix' is not supported by this server.");

    /* Last, like vLLM: a well-formed request for another model is a 404. */
    TRY(api_check_model(root, lim, arena, &req->model, fault, err));

    const char **ignored = NULL;
    uint32_t n_ignored = 0;
    TRY(api_collect_ignored(root, completion_keys, "", arena, &ignored, &n_ignored, err));
    if (so && json_is_object(so))
        TRY(api_collect_ignored(so, stream_option_keys, "stream_options.", arena, &ignored,
                                &n_ignored, err));
    req->ignored = ignored;
    req->n_ignored = n_ignored;
#undef TRY
    return INF_OK;
}

inf_status_t api_completion_parse(const char *body, size_t len, const struct api_limits *lim,
                                  struct inf_arena *arena, struct api_completion_req *req,
                                  struct api_fault *fault, struct inf_err *err)
{
    INF_ASSERT(lim && arena && req);
    if (fault)
        fault->param = fault->code = NULL;
    memset(req, 0, sizeof *req);
    req->max_tokens = 16;
    req->temperature = 1.0f;
    req->top_p = 1.0f;
    req->top_k = API_TOP_K_OFF;
    req->min_p = 0.0f;
    req->n = 1;
    req->best_of = 1;
    req->logprobs = API_LOGPROBS_OFF;
    req->repetition_penalty = 1.0f;
    req->add_special_tokens = true;

    json_t *root;
    inf_status_t st = api_body_load(body, len, &root, fault, err);
    if (st != INF_OK)
        return st;
    st = parse_fields(root, lim, arena, req, fault, err);
    json_decref(root);
    return st;
}

inf_status_t api_check_context(uint32_t prompt_len, int64_t max_tokens, uint32_t max_model_len,
                               uint32_t *max_new, struct api_fault *fault, struct inf_err *err)
{
    if (fault)
        fault->param = fault->code = NULL;
    if (max_tokens == API_MAX_TOKENS_AUTO) {
        if (prompt_len >= max_model_len)
            return api_fail(fault, err, INF_E_CONTEXT, NULL, "context_length_exceeded",
                            "This model's maximum context length is %" PRIu32
                            " tokens. However, you requested %" PRIu32
                            " tokens in the messages. Please reduce the length of the messages.",
                            max_model_len, prompt_len);
        if (max_new)
            *max_new = max_model_len - prompt_len;
        return INF_OK;
    }
    INF_ASSERT(max_tokens >= 1);
    if (prompt_len > max_model_len || (uint64_t)max_tokens > max_model_len - prompt_len)
        /* The sum cannot overflow: both terms are below 2^63. */
        return api_fail(fault, err, INF_E_CONTEXT, NULL, "context_length_exceeded",
                        "This model's maximum context length is %" PRIu32
                        " tokens. However, you requested %" PRIu64 " tokens (%" PRIu32
                        " in the messages, %" PRId64
                        " in the completion). Please reduce the length of the messages or "
                        "completion.",
                        max_model_len, (uint64_t)prompt_len + (uint64_t)max_tokens, prompt_len,
                        max_tokens);
    if (max_new)
        *max_new = (uint32_t)max_tokens;
    return INF_OK;
}

void api_limits_init(struct api_limits *lim, const char *model, uint32_t vocab,
                     uint32_t max_model_len)
{
    lim->model = model;
    lim->vocab = vocab;
    lim->max_model_len = max_model_len;
    lim->max_n = 16;
    lim->max_logprobs = 5;
    lim->max_stop = 4;
    lim->max_prompts = 256;
    lim->max_bias_total = 1u << 20;
}
