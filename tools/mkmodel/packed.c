/* tools/mkmodel/packed.c — INT4 checkpoint formats for int4serve-mkmodel.
 *
 * Quantizers (per group of K, on the fp16-rounded scale):
 *   awq   AutoAWQ's pseudo_quantize_tensor with zero points: scale =
 *         (max - min) / 15, zero = clamp(-round(min / scale), 0, 15),
 *         q = clamp(round(w / scale) + zero, 0, 15)
 *   gptq  GPTQ's Quantizer.find_params (no error feedback, which only
 *         changes which codes come out): xmin = min(min, 0), xmax =
 *         max(max, 0), symmetric xmax = max(|xmin|, xmax) = -xmin; scale =
 *         (xmax - xmin) / 15; zero 8 when symmetric, else round(-xmin /
 *         scale) (at least 1: checkpoint_format gptq stores zero - 1 in a
 *         nibble, where 0 has no room)
 *   ct    compressed-tensors' calculate_qparams for int4: min and max taken
 *         with 0, symmetric scale = max|w| / 7.5 and zero point 0,
 *         asymmetric scale = (max - min) / 15 and zero point
 *         round(-8 - min / scale) in [-8, 7]; q = clamp(round(w / scale) +
 *         zero point, -8, 7)
 * Layouts (which the loader's engine/weights/packed.c reads):
 *   awq   AutoAWQ WQLinear_GEMM.from_linear: qweight [k][n / 8] with column
 *         8c + order_map[i] in bits 4i, order_map [0, 2, 4, 6, 1, 3, 5, 7];
 *         qzeros [k / group][n / 8] the same; scales [k / group][n] fp16
 *   gptq  AutoGPTQ QuantLinear.pack: qweight [k / 8][n], row 8r + j in bits
 *         4j; qzeros [ceil(k / group)][n / 8], column 8c + j in bits 4j,
 *         holding zero - 1 (checkpoint_format gptq) or zero (GPTQModel's
 *         gptq_v2); scales [ceil(k / group)][n] fp16; g_idx [k] I32; under
 *         desc_act GPTQ quantizes columns in perm order and stores g_idx =
 *         (position of the row in perm) / group
 *   ct    compressed-tensors pack_to_int32: value + 8 of column 8c + i in
 *         bits 4i (the last word zero-padded), weight_zero_point packed
 *         along the rows (packed_dim 0), weight_shape torch.tensor(shape)
 *         (I64) */
#include "tools/mkmodel/packed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};

bool mk_format_parse(const char *name, enum mk_format *out)
{
    static const struct {
        const char *name;
        enum mk_format f;
    } names[] = {{"fp", MK_FP},
                 {"awq", MK_AWQ},
                 {"gptq", MK_GPTQ},
                 {"gptq-actorder", MK_GPTQ_ACT},
                 {"ct", MK_CT}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].f;
            return true;
        }
    return false;
}

static int64_t group_of(const struct mk_quant *q, int64_t k)
{
    return q->group < 0 ? k : q->group;
}

inf_status_t mk_packed_check(const struct mk_quant *q, const char *layer, int64_t n, int64_t k,
                             struct inf_err *err)
{
    int64_t g = group_of(q, k);
    if (q->fmt == MK_AWQ && (k % g != 0 || n % 8 != 0))
        return inf_err_set(err, INF_E_INVALID,
                           "%s: awq needs in_features (%lld) divisible by the group (%lld) and "
                           "out_features (%lld) by 8",
                           layer, (long long)k, (long long)g, (long long)n);
    if ((q->fmt == MK_GPTQ || q->fmt == MK_GPTQ_ACT) && (k % 8 != 0 || n % 8 != 0))
        return inf_err_set(err, INF_E_INVALID,
                           "%s: gptq packs in_features (%lld) and out_features (%lld) by 8", layer,
                           (long long)k, (long long)n);
    return INF_OK;
}

/* ---- declaring ------------------------------------------------------------------ */
static inf_status_t add(eng_st_writer_t *w, const char *layer, const char *sfx, enum eng_dtype dt,
                        int32_t nd, int64_t d0, int64_t d1, struct inf_err *err)
{
    char name[192];
    snprintf(name, sizeof name, "%s.%s", layer, sfx);
    int64_t shape[2] = {d0, d1};
    return eng_st_writer_add(w, name, dt, nd, shape, err);
}

inf_status_t mk_packed_declare(eng_st_writer_t *w, const struct mk_quant *q, const char *layer,
                               int64_t n, int64_t k, struct inf_err *err)
{
    int64_t g = group_of(q, k), G = (k + g - 1) / g;
    inf_status_t s;
    switch (q->fmt) {
    case MK_AWQ:
        if ((s = add(w, layer, "qweight", ENG_DT_I32, 2, k, n / 8, err)) ||
            (s = add(w, layer, "qzeros", ENG_DT_I32, 2, G, n / 8, err)))
            return s;
        return add(w, layer, "scales", ENG_DT_F16, 2, G, n, err);
    case MK_GPTQ:
    case MK_GPTQ_ACT:
        if ((s = add(w, layer, "qweight", ENG_DT_I32, 2, k / 8, n, err)) ||
            (s = add(w, layer, "qzeros", ENG_DT_I32, 2, G, n / 8, err)) ||
            (s = add(w, layer, "scales", ENG_DT_F16, 2, G, n, err)))
            return s;
        return add(w, layer, "g_idx", ENG_DT_I32, 1, k, 0, err);
    case MK_CT:
        if ((s = add(w, layer, "weight_packed", ENG_DT_I32, 2, n, (k + 7) / 8, err)) ||
            (s = add(w, layer, "weight_scale", q->sdtype, 2, n, G, err)))
            return s;
        if (!q->sym && (s = add(w, layer, "weight_zero_point", ENG_DT_I32, 2, (n + 7) / 8, G, err)))
            return s;
        return add(w, layer, "weight_shape", ENG_DT_I64, 1, 2, 0, err);
    default:
        return inf_err_set(err, INF_E_INVALID, "%s: not a packed format", layer);
    }
}

/* ---- quantizing ------------------------------------------------------------------ */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The order GPTQ would quantize layer's input rows in: a random
 * permutation keyed by the input it reads (q/k/v share one, gate/up one). */
static void actorder_perm(const char *layer, uint64_t seed, int64_t k, int32_t *perm)
{
    char key[192];
    snprintf(key, sizeof key, "%s", layer);
    char *p;
    if ((p = strstr(key, "q_proj")) || (p = strstr(key, "k_proj")) || (p = strstr(key, "v_proj")))
        memcpy(p, "x_proj", 6);
    else if ((p = strstr(key, "gate_proj")))
        snprintf(p, sizeof key - (size_t)(p - key), "up_proj");
    uint64_t s = seed * 0x9e3779b97f4a7c15ull;
    for (const char *c = key; *c; c++) /* FNV-1a of the key */
        s = (s ^ (uint8_t)*c) * 0x100000001b3ull;
    for (int64_t i = 0; i < k; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = k - 1; i > 0; i--) {
        int64_t j = (int64_t)(mix(&s) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static float round_scale(const struct mk_quant *q, float s)
{
    if (q->fmt == MK_CT && q->sdtype == ENG_DT_BF16)
        return inf_bf16_to_f32(inf_f32_to_bf16(s));
    /* fp16 values also where the scales are stored as F32, so that the
     * canonical form (fp16 scales) holds them exactly */
    return inf_f16_to_f32(inf_f32_to_f16(s));
}

/* One group's scale and (unsigned, 0..15) zero point over v[0..len), and
 * its codes (unsigned, 0..15) into code[0..len). */
static void quantize_group(const struct mk_quant *q, const float *v, int64_t len, float *scale,
                           int *zero, uint8_t *code)
{
    float lo = v[0], hi = v[0];
    for (int64_t i = 1; i < len; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    float s;
    int z;
    if (q->fmt == MK_AWQ) {
        float r = hi - lo > 1e-5f ? hi - lo : 1e-5f;
        s = round_scale(q, r / 15.0f);
        z = (int)-rintf(lo / s);
    } else {
        lo = lo < 0 ? lo : 0;
        hi = hi > 0 ? hi : 0;
        if (q->sym) {
            float a = -lo > hi ? -lo : hi;
            a = a > 0 ? a : 1.0f;
            s = round_scale(q, q->fmt == MK_CT ? a / 7.5f : 2.0f * a / 15.0f);
            z = 8;
        } else {
            float r = hi - lo > 0 ? hi - lo : 1.0f;
            s = round_scale(q, r / 15.0f);
            /* ct: round(-8 - lo / s) + 8 as the unsigned nibble */
            z = q->fmt == MK_CT ? (int)rintf(-8.0f - lo / s) + 8 : (int)rintf(-lo / s);
            if ((q->fmt == MK_GPTQ || q->fmt == MK_GPTQ_ACT) && !q->v2 && z < 1)
                z = 1;
        }
    }
    z = z < 0 ? 0 : z > 15 ? 15 : z;
    for (int64_t i = 0; i < len; i++) {
        int c = (int)rintf(v[i] / s) + z;
        code[i] = (uint8_t)(c < 0 ? 0 : c > 15 ? 15 : c);
    }
    *scale = s;
    *zero = z;
}

/* ---- writing ---------------------------------------------------------------------- */
static inf_status_t put(eng_st_writer_t *w, const void *p, size_t bytes, struct inf_err *err)
{
    return eng_st_writer_write(w, p, bytes, err);
}

static void scale_bytes(const struct mk_quant *q, const float *v, int64_t count, void *out)
{
    for (int64_t i = 0; i < count; i++) {
        if (q->fmt == MK_CT && q->sdtype == ENG_DT_F32) {
            memcpy((float *)out + i, &v[i], 4);
        } else {
            uint16_t h = q->fmt == MK_CT && q->sdtype == ENG_DT_BF16 ? inf_f32_to_bf16(v[i])
                                                                     : inf_f32_to_f16(v[i]);
            memcpy((uint16_t *)out + i, &h, 2);
        }
    }
}

inf_status_t mk_packed_write(eng_st_writer_t *w, const struct mk_quant *q, const char *layer,
                             const float *wt, int64_t n, int64_t k, uint64_t seed,
                             struct inf_err *err)
{
    const int64_t g = group_of(q, k), G = (k + g - 1) / g;
    uint8_t *codes = malloc((size_t)(n * k));           /* [n][k], unsigned */
    float *scales = malloc((size_t)(n * G) * 4);        /* [n][G] */
    int *zeros = malloc((size_t)(n * G) * sizeof(int)); /* [n][G], unsigned */
    int32_t *perm = malloc((size_t)k * 4), *gidx = malloc((size_t)k * 4);
    float *gv = malloc((size_t)g * 4);
    uint8_t *gc = malloc((size_t)g);
    size_t words =
        (size_t)(n * ((k + 7) / 8) > G * ((n + 7) / 8) ? n * ((k + 7) / 8) : G * ((n + 7) / 8));
    uint32_t *pk = calloc(words > (size_t)k ? words : (size_t)k, 4);
    void *sb = malloc((size_t)(n * G) * 4);
    inf_status_t s = INF_OK;
    if (!codes || !scales || !zeros || !perm || !gidx || !gv || !gc || !pk || !sb) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory packing %s", layer);
        goto done;
    }
    if (q->fmt == MK_GPTQ_ACT)
        actorder_perm(layer, seed, k, perm);
    else
        for (int64_t i = 0; i < k; i++)
            perm[i] = (int32_t)i;
    for (int64_t i = 0; i < k; i++)
        gidx[perm[i]] = (int32_t)(i / g);
    for (int64_t r = 0; r < n; r++)
        for (int64_t f = 0; f < G; f++) {
            int64_t i0 = f * g, len = k - i0 < g ? k - i0 : g;
            for (int64_t i = 0; i < len; i++)
                gv[i] = wt[r * k + perm[i0 + i]];
            quantize_group(q, gv, len, &scales[r * G + f], &zeros[r * G + f], gc);
            for (int64_t i = 0; i < len; i++)
                codes[r * k + perm[i0 + i]] = gc[i];
        }
    switch (q->fmt) {
    case MK_AWQ:
        memset(pk, 0, (size_t)(k * (n / 8)) * 4);
        for (int64_t r = 0; r < k; r++)
            for (int64_t c = 0; c < n / 8; c++)
                for (int i = 0; i < 8; i++)
                    pk[r * (n / 8) + c] |= (uint32_t)codes[(c * 8 + awq_order[i]) * k + r]
                                           << (4 * i);
        if ((s = put(w, pk, (size_t)(k * (n / 8)) * 4, err)))
            goto done;
        memset(pk, 0, (size_t)(G * (n / 8)) * 4);
        for (int64_t f = 0; f < G; f++)
            for (int64_t c = 0; c < n / 8; c++)
                for (int i = 0; i < 8; i++)
                    pk[f * (n / 8) + c] |= (uint32_t)zeros[(c * 8 + awq_order[i]) * G + f]
                                           << (4 * i);
        if ((s = put(w, pk, (size_t)(G * (n / 8)) * 4, err)))
            goto done;
        break;
    case MK_GPTQ:
    case MK_GPTQ_ACT:
        memset(pk, 0, (size_t)((k / 8) * n) * 4);
        for (int64_t r = 0; r < k / 8; r++)
            for (int64_t c = 0; c < n; c++)
                for (int j = 0; j < 8; j++)
                    pk[r * n + c] |= (uint32_t)codes[c * k + 8 * r + j] << (4 * j);
        if ((s = put(w, pk, (size_t)((k / 8) * n) * 4, err)))
            goto done;
        memset(pk, 0, (size_t)(G * (n / 8)) * 4);
        for (int64_t f = 0; f < G; f++)
            for (int64_t c = 0; c < n / 8; c++)
                for (int j = 0; j < 8; j++)
                    pk[f * (n / 8) + c] |= (uint32_t)(zeros[(c * 8 + j) * G + f] - (q->v2 ? 0 : 1))
                                           << (4 * j);
        if ((s = put(w, pk, (size_t)(G * (n / 8)) * 4, err)))
            goto done;
        break;
    case MK_CT: {
        const int64_t kw = (k + 7) / 8;
        memset(pk, 0, (size_t)(n * kw) * 4);
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < k; i++)
                pk[r * kw + i / 8] |= (uint32_t)codes[r * k + i] << (4 * (i % 8));
        if ((s = put(w, pk, (size_t)(n * kw) * 4, err)))
            goto done;
        break;
    }
    default:
        s = inf_err_set(err, INF_E_INVALID, "%s: not a packed format", layer);
        goto done;
    }
    /* scales: [G][n] for awq and gptq, [n][G] for ct */
    float *sv = (float *)sb;
    if (q->fmt == MK_CT) {
        scale_bytes(q, scales, n * G, sb);
    } else {
        float *t = malloc((size_t)(n * G) * 4);
        if (!t) {
            s = inf_err_set(err, INF_E_NOMEM, "out of memory packing %s", layer);
            goto done;
        }
        for (int64_t f = 0; f < G; f++)
            for (int64_t r = 0; r < n; r++)
                t[f * n + r] = scales[r * G + f];
        scale_bytes(q, t, n * G, sv);
        free(t);
    }
    size_t ssz = q->fmt == MK_CT ? eng_dtype_size(q->sdtype) : 2;
    if ((s = put(w, sb, (size_t)(n * G) * ssz, err)))
        goto done;
    if (q->fmt == MK_GPTQ || q->fmt == MK_GPTQ_ACT) {
        s = put(w, gidx, (size_t)k * 4, err);
    } else if (q->fmt == MK_CT) {
        if (!q->sym) {
            const int64_t np = (n + 7) / 8;
            memset(pk, 0, (size_t)(np * G) * 4);
            for (int64_t r = 0; r < n; r++)
                for (int64_t f = 0; f < G; f++)
                    pk[(r / 8) * G + f] |= (uint32_t)zeros[r * G + f] << (4 * (r % 8));
            if ((s = put(w, pk, (size_t)(np * G) * 4, err)))
                goto done;
        }
        int64_t shape[2] = {n, k};
        s = put(w, shape, sizeof shape, err);
    }
done:
    free(codes);
    free(scales);
    free(zeros);
    free(perm);
    free(gidx);
    free(gv);
    free(gc);
    free(pk);
    free(sb);
    return s;
}

json_t *mk_quant_config(const struct mk_quant *q)
{
    json_t *c = json_object();
    if (!c)
        return NULL;
    switch (q->fmt) {
    case MK_AWQ: /* transformers' AwqConfig as AutoAWQ saves it */
        json_object_set_new(c, "quant_method", json_string("awq"));
        json_object_set_new(c, "bits", json_integer(4));
        json_object_set_new(c, "group_size", json_integer(q->group));
        json_object_set_new(c, "zero_point", json_true());
        json_object_set_new(c, "version", json_string("gemm"));
        json_object_set_new(c, "modules_to_not_convert", json_null());
        break;
    case MK_GPTQ:
    case MK_GPTQ_ACT: /* GPTQModel's QuantizeConfig */
        json_object_set_new(c, "quant_method", json_string("gptq"));
        json_object_set_new(c, "bits", json_integer(4));
        json_object_set_new(c, "group_size", json_integer(q->group));
        json_object_set_new(c, "desc_act", json_boolean(q->fmt == MK_GPTQ_ACT));
        json_object_set_new(c, "sym", json_boolean(q->sym));
        json_object_set_new(c, "lm_head", json_false());
        json_object_set_new(c, "damp_percent", json_real(0.01));
        json_object_set_new(c, "true_sequential", json_true());
        json_object_set_new(c, "static_groups", json_false());
        json_object_set_new(c, "checkpoint_format", json_string(q->v2 ? "gptq_v2" : "gptq"));
        json_object_set_new(c, "pack_dtype", json_string("int32"));
        break;
    case MK_CT: { /* compressed-tensors' QuantizationConfig as llm-compressor saves it */
        json_t *wts = json_pack("{s:i, s:s, s:b, s:s, s:b, s:n, s:s}", "num_bits", 4, "type", "int",
                                "symmetric", q->sym, "strategy", q->group < 0 ? "channel" : "group",
                                "dynamic", 0, "actorder", "observer", "minmax");
        if (wts)
            json_object_set_new(wts, "group_size",
                                q->group < 0 ? json_null() : json_integer(q->group));
        json_t *g0 = json_pack("{s:[s], s:o, s:n, s:n}", "targets", "Linear", "weights", wts,
                               "input_activations", "output_activations");
        json_object_set_new(c, "quant_method", json_string("compressed-tensors"));
        json_object_set_new(c, "format", json_string("pack-quantized"));
        json_object_set_new(c, "quantization_status", json_string("compressed"));
        json_object_set_new(c, "config_groups", json_pack("{s:o}", "group_0", g0));
        json_object_set_new(c, "ignore", json_pack("[s]", "lm_head"));
        json_object_set_new(c, "kv_cache_scheme", json_null());
        break;
    }
    default:
        json_decref(c);
        return NULL;
    }
    return c;
}
