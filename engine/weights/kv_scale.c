/* engine/weights/kv_scale.c — the FP8 KV cache's per-layer scales from a
 * checkpoint (engine/weights/kv_scale.h). */
#include "engine/weights/kv_scale.h"

#include <math.h>
#include <stdio.h>

/* The one value of tensor name into *out, if it is there (*have). */
static inf_status_t scalar(const eng_st_t *st, const char *name, float *out, bool *have,
                           struct inf_err *err)
{
    const struct eng_st_tensor *t = eng_st_find(st, name);
    *have = t != NULL;
    if (!t)
        return INF_OK;
    if (t->numel != 1)
        return inf_err_set(err, INF_E_FORMAT, "%s: a KV cache scale holds one value, found %lld",
                           name, (long long)t->numel);
    float v = 0.0f;
    inf_status_t s = eng_st_read_f32(t, 0, 1, &v, err);
    if (s != INF_OK)
        return s;
    if (!(v > 0.0f) || !isfinite(v))
        return inf_err_set(err, INF_E_FORMAT, "%s: a KV cache scale must be finite and > 0, got %g",
                           name, (double)v);
    *out = v;
    return INF_OK;
}

inf_status_t eng_kv_scale_read(const eng_st_t *st, int32_t layer, float *k, float *v, bool *found,
                               struct inf_err *err)
{
    static const char *const k_names[] = {"k_scale", "k_proj.k_scale", "qkv_proj.k_scale",
                                          "k_proj.output_scale"};
    static const char *const v_names[] = {"v_scale", "v_proj.v_scale", "qkv_proj.v_scale",
                                          "v_proj.output_scale"};
    char name[128];
    bool hk = false, hv = false, h;
    *k = *v = 1.0f;
    inf_status_t s;
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
        if (!hk) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", layer, k_names[i]);
            if ((s = scalar(st, name, k, &hk, err)))
                return s;
        }
        if (!hv) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", layer, v_names[i]);
            if ((s = scalar(st, name, v, &hv, err)))
                return s;
        }
    }
    if (!hk || !hv) {
        float both = 1.0f;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.kv_scale", layer);
        if ((s = scalar(st, name, &both, &h, err)))
            return s;
        if (h && !hk)
            *k = both;
        if (h && !hv)
            *v = both;
        hk = hk || h;
        hv = hv || h;
    }
    *found = hk || hv;
    return INF_OK;
}
