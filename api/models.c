/* models.c — GET /v1/models: the list of served models. */
#include "api/api_impl.h"

inf_status_t api_models_encode(const struct api_model_card *cards, uint32_t n, struct inf_arena *a,
                               char **out, size_t *out_len, struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "{\"object\":\"list\",\"data\":[");
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            jw_raw(&w, ",", 1);
        jw_lit(&w, "{\"id\":");
        jw_cstr(&w, cards[i].id);
        jw_lit(&w, ",\"object\":\"model\",\"created\":");
        jw_i64(&w, cards[i].created);
        jw_lit(&w, ",\"owned_by\":\"int4serve\",\"max_model_len\":");
        jw_u64(&w, cards[i].max_model_len);
        jw_raw(&w, "}", 1);
    }
    jw_lit(&w, "]}");
    return jw_finish(&w, a, out, out_len, err);
}
