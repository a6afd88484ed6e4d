/* tokenize.c — POST /tokenize and POST /detokenize in vLLM's shapes. */
#include "api/api_impl.h"

#include <string.h>

static const char *const tokenize_keys[] = {"model", "prompt", "add_special_tokens", NULL};
static const char *const detokenize_keys[] = {"model", "tokens", NULL};

inf_status_t api_tokenize_parse(const char *body, size_t len, const struct api_limits *lim,
                                struct inf_arena *arena, struct api_tokenize_req *req,
                                struct api_fault *fault, struct inf_err *err)
{
    INF_ASSERT(lim && arena && req);
    if (fault)
        fault->param = fault->code = NULL;
    memset(req, 0, sizeof *req);
    req->add_special_tokens = true;

    json_t *root;
    inf_status_t st = api_body_load(body, len, &root, fault, err);
    if (st != INF_OK)
        return st;
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) {
        st = api_fail(fault, err, INF_E_INVALID, "prompt", NULL, "'prompt' is required");
        goto out;
    }
    if ((st = api_get_string(root, "prompt", arena, &req->prompt, fault, err)) != INF_OK)
        goto out;
    if ((st = api_get_bool(root, "add_special_tokens", &req->add_special_tokens, fault, err)) !=
        INF_OK)
        goto out;
    if ((st = api_check_model(root, lim, arena, &req->model, fault, err)) != INF_OK)
        goto out;
    const char **ignored = NULL;
    st = api_collect_ignored(root, tokenize_keys, "", arena, &ignored, &req->n_ignored, err);
    req->ignored = ignored;
out:
    json_decref(root);
    return st;
}

inf_status_t api_tokenize_encode(const int32_t *ids, uint32_t n, uint32_t max_model_len,
                                 struct inf_arena *a, char **out, size_t *out_len,
                                 struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "{\"count\":");
    jw_u64(&w, n);
    jw_lit(&w, ",\"max_model_len\":");
    jw_u64(&w, max_model_len);
    jw_lit(&w, ",\"tokens\":[");
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            jw_raw(&w, ",", 1);
        jw_i64(&w, ids[i]);
    }
    jw_lit(&w, "]}");
    return jw_finish(&w, a, out, out_len, err);
}

inf_status_t api_detokenize_parse(const char *body, size_t len, const struct api_limits *lim,
                                  struct inf_arena *arena, struct api_detokenize_req *req,
                                  struct api_fault *fault, struct inf_err *err)
{
    INF_ASSERT(lim && arena && req);
    if (fault)
        fault->param = fault->code = NULL;
    memset(req, 0, sizeof *req);

    json_t *root;
    inf_status_t st = api_body_load(body, len, &root, fault, err);
    if (st != INF_OK)
        return st;
    json_t *t = json_object_get(root, "tokens");
    char d[48];
    if (!t || json_is_null(t)) {
        st = api_fail(fault, err, INF_E_INVALID, "tokens", NULL, "'tokens' is required");
        goto out;
    }
    if (!json_is_array(t)) {
        st = api_fail(fault, err, INF_E_INVALID, "tokens", NULL,
                      "'tokens' must be a list of token ids, got %s", api_describe(t, d, sizeof d));
        goto out;
    }
    int32_t *ids;
    if ((st = api_get_ids(t, "tokens", lim->vocab, arena, &ids, &req->n_ids, fault, err)) != INF_OK)
        goto out;
    req->ids = ids;
    if ((st = api_check_model(root, lim, arena, &req->model, fault, err)) != INF_OK)
        goto out;
    const char **ignored = NULL;
    st = api_collect_ignored(root, detokenize_keys, "", arena, &ignored, &req->n_ignored, err);
    req->ignored = ignored;
out:
    json_decref(root);
    return st;
}

inf_status_t api_detokenize_encode(const char *text, size_t len, struct inf_arena *a, char **out,
                                   size_t *out_len, struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "{\"prompt\":");
    jw_str(&w, text ? text : "", text ? len : 0);
    jw_raw(&w, "}", 1);
    return jw_finish(&w, a, out, out_len, err);
}
