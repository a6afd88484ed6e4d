/* models.c — GET /v1/models: the list of served models, and one of them. */
#include "api/api_impl.h"

static void put_card(struct jw *w, const struct api_model_card *card)
{
    jw_lit(w, "{\"id\":");
    jw_cstr(w, card->id);
    jw_lit(w, ",\"object\":\"model\",\"created\":");
    jw_i64(w, card->created);
    jw_lit(w, ",\"owned_by\":\"int4serve\",\"max_model_len\":");
    jw_u64(w, card->max_model_len);
    jw_raw(w, "}", 1);
}

inf_status_t api_model_encode(const struct api_model_card *card, struct inf_arena *a, char **out,
                              size_t *out_len, struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    put_card(&w, card);
    return jw_finish(&w, a, out, out_len, err);
}

inf_status_t api_models_encode(const struct api_model_card *cards, uint32_t n, struct inf_arena *a,
                               char **out, size_t *out_len, struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "{\"object\":\"list\",\"data\":[");
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            jw_raw(&w, ",", 1);
        put_card(&w, &cards[i]);
    }
    jw_lit(&w, "]}");
    return jw_finish(&w, a, out, out_len, err);
}
