/* error.c — status → HTTP status and OpenAI error type, and the error body.
 * The only place these mappings live. */
#include "api/api_impl.h"

int api_status_http(inf_status_t st)
{
    switch (st) {
    case INF_OK:
        return 200;
    case INF_E_INVALID:
    case INF_E_FORMAT:
    case INF_E_RANGE:
    case INF_E_CONTEXT:
    case INF_E_UNSUPPORTED:
        return 400;
    case INF_E_AUTH:
        return 401;
    case INF_E_NOTFOUND:
        return 404;
    case INF_E_METHOD:
        return 405;
    case INF_E_TOOBIG:
        return 413;
    case INF_E_BUSY: /* the admission queue is full: try again later */
        return 429;
    case INF_E_SHUTDOWN: /* draining after SIGTERM */
        return 503;
    default:
        return 500;
    }
}

const char *api_error_type(inf_status_t st)
{
    /* OpenAI's wire: a 429 for too many requests is type "requests" (its
     * token-rate twin is "tokens"); every other client error, a bad API key
     * included, is an "invalid_request_error" told apart by its code; internal
     * failures and draining are "server_error". */
    if (st == INF_E_BUSY)
        return "requests";
    int http = api_status_http(st);
    return http >= 400 && http < 500 ? "invalid_request_error" : "server_error";
}

const char *api_error_code(inf_status_t st)
{
    return st == INF_E_BUSY ? "rate_limit_exceeded" : NULL;
}

inf_status_t api_error_encode(inf_status_t st, const char *message, const char *param,
                              const char *code, struct inf_arena *a, char **out, size_t *out_len,
                              struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "{\"error\":{\"message\":");
    jw_cstr(&w, message ? message : inf_status_str(st));
    jw_lit(&w, ",\"type\":");
    jw_cstr(&w, api_error_type(st));
    jw_lit(&w, ",\"param\":");
    jw_cstr(&w, param);
    jw_lit(&w, ",\"code\":");
    jw_cstr(&w, code ? code : api_error_code(st));
    jw_lit(&w, "}}");
    return jw_finish(&w, a, out, out_len, err);
}
