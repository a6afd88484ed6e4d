#pragma once
/* api — public header: the OpenAI wire format as pure functions over plain C
 * structs. No I/O, no threads; a json_t never leaves this module.
 *
 * Requests (POST /v1/completions, /tokenize, /detokenize) are parsed from the
 * raw body into plain structs whose strings and arrays live in a caller's
 * arena. Responses (final JSON, server-sent-event chunks, error bodies,
 * /v1/models) are encoded into NUL-terminated strings in a caller's arena,
 * compact, with a fixed key order and the shortest number forms that read
 * back to the same value. docs/API.md describes the wire format.
 *
 * Every function here is pure and may be called from any thread, on
 * arguments that thread owns. */
#include "common/inf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ----------------------------------------------------------------
 * A failing parser returns its status and fills err (message safe to show a
 * client) and fault (what else OpenAI's error body names). */
struct api_fault {
    const char *param; /* the request field at fault ("temperature"), NULL: null */
    const char *code;  /* machine-readable code ("model_not_found"), NULL: null */
};

/* The HTTP status that answers a status code: the one place this mapping
 * lives. 400 bad request, 401 auth, 404 not found, 405 method, 413 too big,
 * 429 busy (admission queue full; the server adds Retry-After), 503 shutting
 * down, 500 otherwise. Thread: any. */
int api_status_http(inf_status_t st);

/* OpenAI's error "type" for a status: "requests" for INF_E_BUSY (OpenAI's
 * 429 for too many requests), "invalid_request_error" for every other 4xx
 * (OpenAI answers a bad API key with this type and code "invalid_api_key"),
 * "server_error" for 5xx. Thread: any. */
const char *api_error_type(inf_status_t st);

/* OpenAI's error "code" a status carries when the caller names none:
 * "rate_limit_exceeded" for INF_E_BUSY, NULL (null) otherwise. Thread: any. */
const char *api_error_code(inf_status_t st);

/* Encode {"error":{"message":...,"type":...,"param":...,"code":...}} for st
 * into a NUL-terminated string in arena a; *out_len (may be NULL) gets its
 * length. message NULL uses inf_status_str(st); param NULL encodes as null,
 * code NULL as api_error_code(st). Invalid UTF-8 in message is replaced by U+FFFD.
 * Errors: INF_E_NOMEM (arena). */
inf_status_t api_error_encode(inf_status_t st, const char *message, const char *param,
                              const char *code, struct inf_arena *a, char **out, size_t *out_len,
                              struct inf_err *err);

/* ---- limits the parsers enforce ------------------------------------------ */
struct api_limits {
    const char *model;       /* served model name; a request naming another gets 404 */
    uint32_t vocab;          /* token ids must be in [0, vocab); >= 1 */
    uint32_t max_model_len;  /* context length (reported by /tokenize) */
    uint32_t max_n;          /* bound on n and best_of (default 16) */
    uint32_t max_logprobs;   /* bound on logprobs (default 5, OpenAI's) */
    uint32_t max_stop;       /* bound on the number of stop strings (default 4) */
    uint32_t max_prompts;    /* bound on the number of prompts in one request (default 256) */
    uint32_t max_bias_total; /* bound on logit_bias entries times choices (prompts x n), which
                              * every choice's sampler holds a copy of (default 1 << 20) */
};

/* Fill lim with the defaults above for a model of vocab tokens and a context
 * of max_model_len tokens. model is borrowed (must outlive lim's use). */
void api_limits_init(struct api_limits *lim, const char *model, uint32_t vocab,
                     uint32_t max_model_len);

/* ---- POST /v1/completions: request ---------------------------------------- */
/* A length-counted UTF-8 string, also NUL-terminated (it may hold NULs). */
struct api_text {
    const char *s;
    size_t len;
};

/* One prompt: text to tokenize, or token ids given by the client. */
struct api_prompt {
    struct api_text text; /* text.s NULL when given as ids */
    const int32_t *ids;   /* ids in [0, vocab), n_ids >= 1; NULL when text */
    uint32_t n_ids;
};

#define API_MAX_TOKENS_AUTO (-1) /* max_tokens null: as many as the context allows */
#define API_TOP_K_OFF (-1)       /* top_k disabled */
#define API_LOGPROBS_OFF (-1)    /* logprobs null */
#define API_MAX_IGNORED 16       /* unknown keys reported per request; the rest dropped */

struct api_completion_req {
    const char *model;                /* as sent; NULL when absent or null */
    const struct api_prompt *prompts; /* >= 1; each non-empty */
    uint32_t n_prompts;
    int64_t max_tokens;          /* >= 1 (16 by default), or API_MAX_TOKENS_AUTO */
    float temperature;           /* [0, 2], default 1 */
    float top_p;                 /* (0, 1], default 1 */
    int32_t top_k;               /* >= 1 (clamped to vocab), or API_TOP_K_OFF (default; 0 too) */
    float min_p;                 /* [0, 1], default 0 */
    uint32_t n;                  /* [1, max_n], default 1 */
    uint32_t best_of;            /* always n: only best_of == n (or absent) is accepted */
    const struct api_text *stop; /* <= max_stop strings, none empty */
    uint32_t n_stop;
    bool has_seed;
    int64_t seed;
    bool stream;
    bool include_usage; /* stream_options.include_usage (only with stream) */
    int32_t logprobs;   /* [0, max_logprobs], or API_LOGPROBS_OFF (default) */
    bool echo;
    float presence_penalty;   /* [-2, 2], default 0 */
    float frequency_penalty;  /* [-2, 2], default 0 */
    float repetition_penalty; /* (0, 2], default 1 */
    const int32_t *bias_ids;  /* logit_bias: ids in [0, vocab), unique */
    const float *bias_values; /*   and their biases in [-100, 100] */
    uint32_t n_bias;
    bool ignore_eos;
    uint32_t min_tokens;        /* [0, max_tokens], default 0 */
    bool add_special_tokens;    /* vLLM's extension; default true */
    const char *user;           /* NULL when absent */
    const char *const *ignored; /* top-level keys (and "stream_options.<key>") we do
                                 * not know: accepted and ignored, to be logged.
                                 * Safe to log: at most API_MAX_IGNORED names, each
                                 * clipped to 64 bytes, control bytes as '?' */
    uint32_t n_ignored;
};

/* Parse and validate a POST /v1/completions body of len bytes (not
 * NUL-terminated). On INF_OK *req is filled and everything it points to lives
 * in arena (the caller frees it with the arena); on error *req is unspecified
 * and err/fault (each may be NULL) say why.
 * Errors: INF_E_INVALID (400: bad JSON, a bad value; fault->param names it),
 * INF_E_UNSUPPORTED (400: suffix), INF_E_NOTFOUND (404: model other than
 * lim->model; code "model_not_found"), INF_E_NOMEM. Thread: any. */
inf_status_t api_completion_parse(const char *body, size_t len, const struct api_limits *lim,
                                  struct inf_arena *arena, struct api_completion_req *req,
                                  struct api_fault *fault, struct inf_err *err);

/* Check that a prompt of prompt_len tokens plus max_tokens new ones fits in
 * max_model_len (vLLM's check, run by the caller once the prompt is
 * tokenized). max_tokens is a parsed value or API_MAX_TOKENS_AUTO; on INF_OK
 * *max_new (may be NULL) is the number of tokens to generate at most. On
 * error: INF_E_CONTEXT (400) with code "context_length_exceeded", param null,
 * and the message "This model's maximum context length is N tokens. However,
 * you requested M tokens (P in the messages, C in the completion). Please
 * reduce the length of the messages or completion." Thread: any. */
inf_status_t api_check_context(uint32_t prompt_len, int64_t max_tokens, uint32_t max_model_len,
                               uint32_t *max_new, struct api_fault *fault, struct inf_err *err);

/* ---- POST /v1/completions: response ----------------------------------------
 * Plain structs the server fills from engine events. Strings are borrowed
 * for the call; invalid UTF-8 in them is encoded as U+FFFD. */
enum api_finish {
    API_FINISH_NONE = 0, /* not finished: null */
    API_FINISH_STOP,     /* "stop": EOS or a stop string */
    API_FINISH_LENGTH,   /* "length": max_tokens or the context */
    API_FINISH_ABORT,    /* "abort": cancelled (vLLM's value) */
};

struct api_top_logprob {
    struct api_text token; /* the candidate token's text */
    float logprob;         /* clamped to -9999 like vLLM (-inf too) */
};

struct api_token_logprob {
    struct api_text token;             /* the chosen token's text */
    float logprob;                     /* NaN: null (the first echoed prompt token) */
    const struct api_top_logprob *top; /* NULL: null; else n_top entries, best first */
    uint32_t n_top;                    /* a token string seen twice keeps its first */
};

struct api_logprobs {
    const struct api_token_logprob *tokens;
    uint32_t n_tokens;
    uint32_t text_offset0;        /* characters (code points) of this choice's text that
                                   * precede the first token: 0 in a final response,
                                   * the text streamed so far in a chunk */
    const uint32_t *text_offsets; /* NULL: text_offset is text_offset0, then each
                                   * token's characters added up; else
                                   * [n_tokens] written as given (echoed prompt
                                   * tokens, whose texts need not add up to the
                                   * echoed text) */
};

struct api_choice {
    uint32_t index;
    struct api_text text;                /* the whole text, or the chunk's delta */
    const struct api_logprobs *logprobs; /* NULL: null */
    enum api_finish finish;
};

struct api_usage {
    uint32_t prompt_tokens;
    uint32_t completion_tokens; /* total_tokens is their sum */
};

/* What every response and chunk of one request repeats. */
struct api_resp_head {
    const char *id;  /* encoded as "cmpl-<id>"; NULL: "cmpl-" */
    int64_t created; /* unix seconds */
    const char *model;
};

/* The final JSON of a non-streamed completion:
 * {"id":"cmpl-<id>","object":"text_completion","created":...,"model":...,
 *  "choices":[{"index":0,"text":...,"logprobs":...,"finish_reason":...}],
 *  "usage":{"prompt_tokens":P,"completion_tokens":C,"total_tokens":P+C}}
 * into arena a. Errors: INF_E_NOMEM. Thread: any. */
inf_status_t api_completion_encode(const struct api_resp_head *h, const struct api_choice *choices,
                                   uint32_t n_choices, const struct api_usage *usage,
                                   struct inf_arena *a, char **out, size_t *out_len,
                                   struct inf_err *err);

/* One server-sent event carrying one choice's delta:
 * "data: {...same head...,"choices":[{choice}],"usage":null}\n\n".
 * Errors: INF_E_NOMEM. Thread: any. */
inf_status_t api_chunk_encode(const struct api_resp_head *h, const struct api_choice *choice,
                              struct inf_arena *a, char **out, size_t *out_len,
                              struct inf_err *err);

/* The last event of a stream with stream_options.include_usage:
 * "data: {...head...,"choices":[],"usage":{...}}\n\n". Errors: INF_E_NOMEM. */
inf_status_t api_chunk_usage_encode(const struct api_resp_head *h, const struct api_usage *usage,
                                    struct inf_arena *a, char **out, size_t *out_len,
                                    struct inf_err *err);

/* The event that ends every stream. */
#define API_SSE_DONE "data: [DONE]\n\n"

/* Characters (Unicode code points, what OpenAI's text_offset counts) in the
 * len bytes at s; each invalid UTF-8 sequence counts as one U+FFFD. */
size_t api_utf8_chars(const char *s, size_t len);

/* ---- GET /v1/models --------------------------------------------------------- */
struct api_model_card {
    const char *id;
    int64_t created;
    uint32_t max_model_len;
};

/* {"object":"list","data":[{"id":...,"object":"model","created":...,
 *  "owned_by":"int4serve","max_model_len":N}]}. Errors: INF_E_NOMEM. */
inf_status_t api_models_encode(const struct api_model_card *cards, uint32_t n, struct inf_arena *a,
                               char **out, size_t *out_len, struct inf_err *err);
/* One model object (GET /v1/models/{id}, OpenAI's retrieve): what each item
 * of api_models_encode's "data" holds. */
inf_status_t api_model_encode(const struct api_model_card *card, struct inf_arena *a, char **out,
                              size_t *out_len, struct inf_err *err);

/* ---- POST /tokenize and /detokenize (vLLM's shapes) ------------------------ */
struct api_tokenize_req {
    const char *model;       /* NULL when absent or null */
    struct api_text prompt;  /* required; may be empty */
    bool add_special_tokens; /* default true */
    const char *const *ignored;
    uint32_t n_ignored;
};

/* Parse {"model"?, "prompt": string, "add_special_tokens"?: bool}. Ownership
 * and errors as api_completion_parse. */
inf_status_t api_tokenize_parse(const char *body, size_t len, const struct api_limits *lim,
                                struct inf_arena *arena, struct api_tokenize_req *req,
                                struct api_fault *fault, struct inf_err *err);

/* {"count":n,"max_model_len":N,"tokens":[...]}. Errors: INF_E_NOMEM. */
inf_status_t api_tokenize_encode(const int32_t *ids, uint32_t n, uint32_t max_model_len,
                                 struct inf_arena *a, char **out, size_t *out_len,
                                 struct inf_err *err);

struct api_detokenize_req {
    const char *model;  /* NULL when absent or null */
    const int32_t *ids; /* in [0, vocab); may be empty (NULL) */
    uint32_t n_ids;
    const char *const *ignored;
    uint32_t n_ignored;
};

/* Parse {"model"?, "tokens": [ids]}. Ownership and errors as
 * api_completion_parse. */
inf_status_t api_detokenize_parse(const char *body, size_t len, const struct api_limits *lim,
                                  struct inf_arena *arena, struct api_detokenize_req *req,
                                  struct api_fault *fault, struct inf_err *err);

/* {"prompt":"<text>"}. Errors: INF_E_NOMEM. */
inf_status_t api_detokenize_encode(const char *text, size_t len, struct inf_arena *a, char **out,
                                   size_t *out_len, struct inf_err *err);

#ifdef __cplusplus
}
#endif
