/* engine/weights/packed.c — AutoAWQ gemm, GPTQ and compressed-tensors
 * pack-quantized layers into the canonical form (engine/weights/packed.h
 * has the layouts). Each layout decision follows the writer's public
 * definition:
 *   AWQ    AutoAWQ awq/modules/linear/gemm.py, WQLinear_GEMM: qweight
 *          (in_features, out_features / 8), qzeros (in_features / group,
 *          out_features / 8), scales (in_features / group, out_features);
 *          from_linear packs column col * 8 + order_map[i] into bits 4i
 *          with order_map [0, 2, 4, 6, 1, 3, 5, 7], zeros the same way;
 *          intweight = round(w / scale + zero), so w = (q - zero) * scale.
 *          vLLM's awq loader unpacks with the reverse order [0, 4, 1, 5, 2,
 *          6, 3, 7], the nibble that holds column j.
 *   GPTQ   AutoGPTQ nn_modules/qlinear QuantLinear.pack (and GPTQModel's
 *          packer): qweight (in_features / 32 * bits, out_features) with
 *          input row 8r + j in bits 4j of row r; qzeros (ceil(in / group),
 *          out / 32 * bits) with column 8c + j in bits 4j, after
 *          "zeros -= 1" (the forward adds the 1 back); scales
 *          (ceil(in / group), out); g_idx[i] = i // group, or under desc_act
 *          the group of row i in the quantizer's order (g_idx[invperm]).
 *          GPTQModel's checkpoint_format "gptq_v2" stores the zeros
 *          without the - 1 (vLLM's gptq loader reads both).
 *   CT     compressed-tensors compressors/quantized_compressors/
 *          pack_quantized.py: pack_to_int32 adds 2^(bits - 1) to the signed
 *          int8 values and puts value[:, 8c + i] in bits 4i of column c
 *          (the last word padded), packed_dim 0 for weight_zero_point
 *          (rows 8p + i); weight_shape the unpacked (out, in); dequantize
 *          is (q - zero_point) * scale, with g_idx when actorder is group.
 */
#define INF_LOG_MODULE "eng"
#include "engine/weights/packed.h"

#include "engine/weights/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The nibble of an AWQ word that holds column j of its eight. */
static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

#define ROW_BLOCK 64 /* output rows unpacked by one task */

struct layer_src {
    const struct eng_qlayer *lq;
    const char *layer;
    int32_t n, k;
    int32_t g;                                  /* the format's group along k (k per channel) */
    int32_t G;                                  /* its groups: ceil(k / g) */
    int32_t cg;                                 /* the canonical group (kp per channel) */
    const struct eng_st_tensor *w, *z, *s, *gi; /* codes, zeros (or NULL), scales, g_idx */
};

static const char *sfx_w(enum eng_qmethod m)
{
    return m == ENG_QM_CT ? "weight_packed" : "qweight";
}

/* The tensor layer.suffix, required with shape dims[0..nd). missing_file:
 * the file named when it is absent (the layer's packed codes). */
static inf_status_t need(const eng_st_t *st, const struct layer_src *x, const char *suffix,
                         int32_t nd, const int64_t *dims, const char *missing_file,
                         const struct eng_st_tensor **out, struct inf_err *err)
{
    char name[320];
    snprintf(name, sizeof name, "%s.%s", x->layer, suffix);
    *out = NULL;
    if (!eng_st_find(st, name)) {
        if (missing_file)
            return inf_err_set(err, INF_E_NOTFOUND,
                               "%s: tensor '%.100s' is missing (%s layers need %s)", missing_file,
                               name, eng_qmethod_name(x->lq->method),
                               x->lq->method == ENG_QM_CT ? "weight_packed, weight_scale, "
                                                            "weight_shape"
                                                          : "qweight, qzeros, scales");
        return inf_err_set(err, INF_E_NOTFOUND,
                           "tensor '%.100s' is missing from the checkpoint (quantization_config "
                           "says %s)",
                           name, eng_qmethod_name(x->lq->method));
    }
    return eng_st_require(st, name, nd, dims, out, err);
}

static inf_status_t need_int(const struct eng_st_tensor *t, struct inf_err *err)
{
    if (t->dtype != ENG_DT_I32)
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.100s' is %s, packed INT4 is I32",
                           t->file, t->name, eng_dtype_name(t->dtype));
    return INF_OK;
}

static inf_status_t need_float(const struct eng_st_tensor *t, struct inf_err *err)
{
    if (t->dtype != ENG_DT_F16 && t->dtype != ENG_DT_BF16 && t->dtype != ENG_DT_F32)
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: tensor '%.100s' is %s, scales are F16, BF16 "
                           "or F32",
                           t->file, t->name, eng_dtype_name(t->dtype));
    return INF_OK;
}

/* Find and check every tensor of the layer. */
static inf_status_t find_tensors(const eng_st_t *st, struct layer_src *x, struct inf_err *err)
{
    const int32_t n = x->n, k = x->k, G = x->G;
    const enum eng_qmethod m = x->lq->method;
    inf_status_t s;
    char name[320];
    snprintf(name, sizeof name, "%s.%s", x->layer, sfx_w(m));
    const struct eng_st_tensor *t0 = eng_st_find(st, name);
    const char *file = t0 ? t0->file : NULL;
    if (m == ENG_QM_CT) {
        int64_t dw[2] = {n, (k + 7) / 8}, ds[2] = {n, G}, dz[2] = {(n + 7) / 8, G}, dsh[1] = {2};
        const struct eng_st_tensor *shape;
        int32_t sv[2];
        if ((s = need(st, x, "weight_packed", 2, dw, NULL, &x->w, err)) ||
            (s = need_int(x->w, err)) ||
            (s = need(st, x, "weight_shape", 1, dsh, file, &shape, err)) ||
            (s = eng_st_read_i32(shape, 0, 2, sv, err)))
            return s;
        if (sv[0] != n || sv[1] != k)
            return inf_err_set(err, INF_E_FORMAT,
                               "%s: tensor '%.100s' is [%d, %d], the model needs [%d, %d]",
                               shape->file, shape->name, sv[0], sv[1], n, k);
        if ((s = need(st, x, "weight_scale", 2, ds, file, &x->s, err)) ||
            (s = need_float(x->s, err)))
            return s;
        if (!x->lq->sym && ((s = need(st, x, "weight_zero_point", 2, dz, file, &x->z, err)) ||
                            (s = need_int(x->z, err))))
            return s;
        snprintf(name, sizeof name, "%s.weight_g_idx", x->layer);
    } else {
        if (n % 8 != 0)
            return inf_err_set(err, INF_E_FORMAT,
                               "%s: tensor '%.100s': %d output features, %s packs them by 8",
                               file ? file : "checkpoint", name, n, eng_qmethod_name(m));
        if (m == ENG_QM_GPTQ && k % 8 != 0)
            return inf_err_set(err, INF_E_FORMAT,
                               "%s: tensor '%.100s': %d input features, gptq packs them by 8",
                               file ? file : "checkpoint", name, k);
        int64_t dw[2] = {m == ENG_QM_AWQ ? k : k / 8, m == ENG_QM_AWQ ? n / 8 : n};
        int64_t dz[2] = {G, n / 8}, ds[2] = {G, n};
        if ((s = need(st, x, "qweight", 2, dw, NULL, &x->w, err)) || (s = need_int(x->w, err)) ||
            (s = need(st, x, "qzeros", 2, dz, file, &x->z, err)) || (s = need_int(x->z, err)) ||
            (s = need(st, x, "scales", 2, ds, file, &x->s, err)) || (s = need_float(x->s, err)))
            return s;
        if (m == ENG_QM_AWQ)
            return INF_OK;
        snprintf(name, sizeof name, "%s.g_idx", x->layer);
    }
    /* g_idx: needed under act-order, optional otherwise (row / group when absent) */
    x->gi = eng_st_find(st, name);
    if (!x->gi && x->lq->act_order)
        return inf_err_set(err, INF_E_NOTFOUND,
                           "%s: tensor '%.100s' is missing (act-order needs it)", file, name);
    if (x->gi) {
        int64_t dg[1] = {k};
        if ((s = eng_st_require(st, name, 1, dg, &x->gi, err)))
            return s;
        if (x->gi->dtype != ENG_DT_I32 && x->gi->dtype != ENG_DT_I64)
            return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.100s' is %s, not I32 or I64",
                               x->gi->file, x->gi->name, eng_dtype_name(x->gi->dtype));
    }
    return INF_OK;
}

/* The column order from g_idx: NULL in *perm when every row is in group
 * row / g already. */
static inf_status_t make_perm(const struct layer_src *x, int32_t **perm, struct inf_err *err)
{
    *perm = NULL;
    if (!x->gi)
        return INF_OK;
    const int32_t k = x->k, G = x->G, g = x->g;
    int32_t *gi = malloc((size_t)k * sizeof *gi);
    int32_t *pos = calloc((size_t)G + 1, sizeof *pos);
    inf_status_t s = INF_OK;
    if (!gi || !pos) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory reading a g_idx");
        goto done;
    }
    if ((s = eng_st_read_i32(x->gi, 0, k, gi, err)))
        goto done;
    bool plain = true;
    for (int32_t r = 0; r < k; r++) {
        if (gi[r] < 0 || gi[r] >= G) {
            s = inf_err_set(err, INF_E_FORMAT,
                            "%s: tensor '%.100s': g_idx[%d] = %d is outside [0, %d)", x->gi->file,
                            x->gi->name, r, gi[r], G);
            goto done;
        }
        plain = plain && gi[r] == r / g;
        pos[gi[r] + 1]++;
    }
    if (plain)
        goto done;
    for (int32_t c = 0; c < G; c++) {
        int32_t want = k - c * g < g ? k - c * g : g;
        if (pos[c + 1] != want) {
            s = inf_err_set(err, INF_E_FORMAT,
                            "%s: tensor '%.100s': group %d has %d rows, a group of %d over %d "
                            "rows needs %d",
                            x->gi->file, x->gi->name, c, pos[c + 1], g, k, want);
            goto done;
        }
        pos[c + 1] += pos[c];
    }
    if (!(*perm = malloc((size_t)k * sizeof **perm))) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory for a column order");
        goto done;
    }
    for (int32_t r = 0; r < k; r++) /* stable: each group keeps its rows in order */
        (*perm)[pos[gi[r]]++] = r;
done:
    free(gi);
    free(pos);
    return s;
}

/* Scales and zero points of the format's groups into the canonical rows:
 * canonical group c of row r takes format group c * cg / g (per channel 0).
 * Every value is checked here, so the code pass cannot fail on them. */
static inf_status_t scales_zeros(const struct layer_src *x, struct krn_q4_weight *out,
                                 struct inf_err *err)
{
    const int32_t n = x->n, G = x->G;
    const enum eng_qmethod m = x->lq->method;
    const int64_t ns = (int64_t)n * G;
    float *sv = malloc((size_t)ns * sizeof *sv);
    int32_t *zw = x->z ? malloc((size_t)x->z->numel * sizeof *zw) : NULL;
    uint8_t *zv = malloc((size_t)ns);
    inf_status_t s = INF_OK;
    if (!sv || !zv || (x->z && !zw)) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory reading scales");
        goto done;
    }
    if ((s = eng_st_read_f32(x->s, 0, ns, sv, err)) ||
        (x->z && (s = eng_st_read_i32(x->z, 0, x->z->numel, zw, err))))
        goto done;
    /* zv[r * G + f], sv the same order after this loop */
    bool sym = true;
    for (int32_t f = 0; f < G; f++)
        for (int32_t r = 0; r < n; r++) {
            int z;
            if (m == ENG_QM_CT)
                z = x->z ? (zw[(int64_t)(r / 8) * G + f] >> (4 * (r % 8))) & 15 : 8;
            else if (m == ENG_QM_AWQ)
                z = (zw[(int64_t)f * (n / 8) + r / 8] >> (4 * awq_nibble[r % 8])) & 15;
            else
                z = ((zw[(int64_t)f * (n / 8) + r / 8] >> (4 * (r % 8))) & 15) +
                    (x->lq->zero_minus_one ? 1 : 0);
            if (z > 15) { /* a stored 15 under checkpoint_format gptq */
                s = inf_err_set(err, INF_E_FORMAT,
                                "%s: tensor '%.100s': zero point %d of group %d, column %d is "
                                "outside 0..15 (checkpoint_format gptq stores zero - 1)",
                                x->z->file, x->z->name, z, f, r);
                goto done;
            }
            if (x->lq->sym && z != 8) {
                s = inf_err_set(err, INF_E_FORMAT,
                                "%s: tensor '%.100s': zero point %d of group %d, column %d, "
                                "but the checkpoint is symmetric (8)",
                                x->z->file, x->z->name, z, f, r);
                goto done;
            }
            sym = sym && z == 8;
            zv[(int64_t)r * G + f] = (uint8_t)z;
        }
    float *sr = malloc((size_t)ns * sizeof *sr); /* [r][f] */
    if (!sr) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory reading scales");
        goto done;
    }
    for (int64_t i = 0; i < ns; i++) {
        /* AWQ and GPTQ store [G][n], compressed-tensors [n][G] */
        int64_t r = m == ENG_QM_CT ? i / G : i % n, f = m == ENG_QM_CT ? i % G : i / n;
        float v = sv[i];
        uint16_t h = inf_f32_to_f16(v);
        if (!isfinite(v) || v < 0.0f || inf_f16_to_f32(h) != v) {
            s = inf_err_set(err, INF_E_FORMAT,
                            "%s: tensor '%.100s': scale %g of group %lld, column %lld is %s",
                            x->s->file, x->s->name, (double)v, (long long)f, (long long)r,
                            !isfinite(v) ? "not finite"
                            : v < 0.0f   ? "negative"
                                         : "not exact in fp16");
            free(sr);
            goto done;
        }
        sr[r * G + f] = v;
    }
    const int32_t ng = krn_q4_groups(out);
    for (int32_t r = 0; r < n; r++)
        for (int32_t c = 0; c < ng; c++) {
            int32_t f = x->lq->group < 0 ? 0 : (int32_t)((int64_t)c * x->cg / x->g);
            out->scale[(int64_t)r * ng + c] = inf_f32_to_f16(sr[(int64_t)r * G + f]);
            out->zero[(int64_t)r * ng + c] = inf_f32_to_f16((float)zv[(int64_t)r * G + f]);
        }
    out->symmetric = sym;
    free(sr);
done:
    free(sv);
    free(zw);
    free(zv);
    return s;
}

/* The code pass, shared by the load threads: rows [n0, n1) of the layer
 * unpacked in the checkpoint's own column order, then written in the
 * canonical order (perm) with the padding set to each group's zero. */
struct codes_job {
    const struct layer_src *x;
    struct krn_q4_weight *out;
    pthread_mutex_t mu;
    inf_status_t st;
    struct inf_err err;
};

static inf_status_t unpack_rows(const struct layer_src *x, int32_t n0, int32_t n1, uint8_t *codes,
                                int32_t *buf, struct inf_err *err)
{
    const int32_t k = x->k, n = x->n;
    inf_status_t s;
    switch (x->lq->method) {
    case ENG_QM_AWQ: /* qweight [k][n / 8] */
        for (int32_t r = 0; r < k; r++) {
            if ((s = eng_st_read_i32(x->w, (int64_t)r * (n / 8) + n0 / 8, (n1 - n0) / 8, buf, err)))
                return s;
            for (int32_t c = 0; c < (n1 - n0) / 8; c++)
                for (int32_t j = 0; j < 8; j++)
                    codes[(int64_t)(c * 8 + j) * k + r] =
                        (uint8_t)((buf[c] >> (4 * awq_nibble[j])) & 15);
        }
        return INF_OK;
    case ENG_QM_GPTQ: /* qweight [k / 8][n] */
        for (int32_t r = 0; r < k / 8; r++) {
            if ((s = eng_st_read_i32(x->w, (int64_t)r * n + n0, n1 - n0, buf, err)))
                return s;
            for (int32_t c = 0; c < n1 - n0; c++)
                for (int32_t j = 0; j < 8; j++)
                    codes[(int64_t)c * k + 8 * r + j] = (uint8_t)((buf[c] >> (4 * j)) & 15);
        }
        return INF_OK;
    default: { /* weight_packed [n][ceil(k / 8)] */
        const int32_t kw = (k + 7) / 8;
        for (int32_t c = n0; c < n1; c++) {
            if ((s = eng_st_read_i32(x->w, (int64_t)c * kw, kw, buf, err)))
                return s;
            uint8_t *row = codes + (int64_t)(c - n0) * k;
            for (int32_t i = 0; i < k; i++)
                row[i] = (uint8_t)((buf[i / 8] >> (4 * (i % 8))) & 15);
        }
        return INF_OK;
    }
    }
}

static void codes_run(void *arg, int64_t b0, int64_t b1)
{
    struct codes_job *j = arg;
    const struct layer_src *x = j->x;
    struct krn_q4_weight *out = j->out;
    const int32_t k = x->k, kp = out->kp, g = out->group, ng = krn_q4_groups(out);
    /* words of one read: a row of weight_packed, or a block's words */
    const int32_t bw = (k + 7) / 8 > ROW_BLOCK ? (k + 7) / 8 : ROW_BLOCK;
    uint8_t *codes = malloc((size_t)ROW_BLOCK * (size_t)k);
    int32_t *buf = malloc((size_t)bw * sizeof *buf);
    struct inf_err e = {0};
    inf_status_t s = INF_OK;
    if (!codes || !buf)
        s = inf_err_set(&e, INF_E_NOMEM, "out of memory unpacking a layer");
    for (int64_t b = b0; b < b1 && s == INF_OK; b++) {
        int32_t n0 = (int32_t)b * ROW_BLOCK, n1 = n0 + ROW_BLOCK < x->n ? n0 + ROW_BLOCK : x->n;
        if ((s = unpack_rows(x, n0, n1, codes, buf, &e)))
            break;
        for (int32_t r = n0; r < n1; r++) {
            const uint8_t *src = codes + (int64_t)(r - n0) * k;
            uint8_t *q = out->q + (int64_t)r * (kp / 2);
            for (int32_t c = 0; c < kp; c += 2) {
                int v[2];
                for (int t = 0; t < 2; t++) {
                    int32_t i = c + t;
                    v[t] = i < k ? src[out->perm ? out->perm[i] : i]
                                 : (int)inf_f16_to_f32(out->zero[(int64_t)r * ng + i / g]);
                }
                q[c / 2] = (uint8_t)(v[0] | (v[1] << 4));
            }
        }
    }
    free(codes);
    free(buf);
    if (s != INF_OK) {
        pthread_mutex_lock(&j->mu);
        if (j->st == INF_OK) {
            j->st = s;
            j->err = e;
        }
        pthread_mutex_unlock(&j->mu);
    }
}

inf_status_t eng_q4_from_checkpoint(const eng_st_t *st, const char *layer,
                                    const struct eng_qlayer *lq, int32_t n, int32_t k,
                                    eng_par_t *par, struct krn_q4_weight *out, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    if (n <= 0 || k <= 0 || lq->method == ENG_QM_NONE)
        return inf_err_set(err, INF_E_INVALID, "%s: bad INT4 layer %dx%d", layer, n, k);
    struct layer_src x = {.lq = lq, .layer = layer, .n = n, .k = k};
    x.g = lq->group < 0 ? k : lq->group;
    x.G = (k + x.g - 1) / x.g;
    /* canonical group: the format's (32..256), 256 for a multiple of it,
     * 0 (per channel) for one group a row */
    int32_t cgroup = lq->group < 0 ? 0 : lq->group > 256 ? 256 : lq->group;
    if (!eng_q4_group_valid(cgroup) || (cgroup > 0 && lq->group % cgroup != 0))
        return inf_err_set(err, INF_E_UNSUPPORTED, "%s: group size %d is not supported", layer,
                           lq->group);
    inf_status_t s = find_tensors(st, &x, err);
    if (s != INF_OK)
        return s;
    int32_t kp = eng_q4_padded_k(k, cgroup);
    x.cg = cgroup == 0 ? kp : cgroup;
    int32_t *perm = NULL;
    if ((s = make_perm(&x, &perm, err)))
        return s;
    if ((s = eng_q4_alloc(n, k, kp, x.cg, false, out, err))) {
        free(perm);
        return s;
    }
    out->perm = perm;
    if ((s = scales_zeros(&x, out, err)))
        goto fail;
    struct codes_job j = {.x = &x, .out = out, .st = INF_OK};
    pthread_mutex_init(&j.mu, NULL);
    eng_par_run(par, (n + ROW_BLOCK - 1) / ROW_BLOCK, 1, codes_run, &j);
    pthread_mutex_destroy(&j.mu);
    if (j.st != INF_OK) {
        s = inf_err_set(err, j.st, "%s", j.err.msg);
        goto fail;
    }
    return INF_OK;
fail:
    eng_q4_free(out);
    return s;
}

void eng_q4_checkpoint_prefetch(const eng_st_t *st, const char *layer, const struct eng_qlayer *lq)
{
    static const char *const awq[] = {"qweight", "qzeros", "scales", NULL};
    static const char *const gptq[] = {"qweight", "qzeros", "scales", "g_idx", NULL};
    static const char *const ct[] = {"weight_packed", "weight_scale", "weight_zero_point",
                                     "weight_g_idx", NULL};
    const char *const *sfx = lq->method == ENG_QM_AWQ ? awq : lq->method == ENG_QM_GPTQ ? gptq : ct;
    char name[320];
    for (int i = 0; sfx[i]; i++) {
        snprintf(name, sizeof name, "%s.%s", layer, sfx[i]);
        eng_st_prefetch(eng_st_find(st, name));
    }
}
