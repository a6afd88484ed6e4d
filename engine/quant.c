/* engine/quant.c — round-to-nearest INT4 quantization into the canonical form
 * (kernels/q4.h). The formulas and bounds are in engine/quant.h. */
#define INF_LOG_MODULE "eng"
#include "engine/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool eng_q4_group_valid(int32_t group)
{
    return group == 0 || group == 32 || group == 64 || group == 128 || group == 256;
}

int32_t eng_q4_padded_k(int32_t k, int32_t group)
{
    if (group == 0)
        return k + (k & 1);
    return (k + group - 1) / group * group;
}

inf_status_t eng_q4_alloc(int32_t n, int32_t k, int32_t kp, int32_t group, bool symmetric,
                          struct krn_q4_weight *out, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    if (n <= 0 || k <= 0 || kp < k || group <= 0 || kp % group != 0 || (kp & 1))
        return inf_err_set(err, INF_E_INVALID, "bad INT4 weight shape n=%d k=%d kp=%d group=%d", n,
                           k, kp, group);
    size_t ng = (size_t)n * (size_t)(kp / group);
    out->q = calloc((size_t)n * (size_t)(kp / 2), 1);
    out->scale = calloc(ng, sizeof(uint16_t));
    out->zero = calloc(ng, sizeof(uint16_t));
    if (!out->q || !out->scale || !out->zero) {
        eng_q4_free(out);
        return inf_err_set(err, INF_E_NOMEM, "out of memory for an INT4 weight %dx%d", n, kp);
    }
    out->n = n;
    out->k = k;
    out->kp = kp;
    out->group = group;
    out->symmetric = symmetric;
    return INF_OK;
}

void eng_q4_free(struct krn_q4_weight *w)
{
    if (!w)
        return;
    free(w->q);
    free(w->scale);
    free(w->zero);
    memset(w, 0, sizeof *w);
}

static inline void put_code(uint8_t *row, int32_t col, int code)
{
    if (col & 1)
        row[col / 2] = (uint8_t)((row[col / 2] & 0x0f) | (code << 4));
    else
        row[col / 2] = (uint8_t)((row[col / 2] & 0xf0) | code);
}

inf_status_t eng_q4_quantize(const float *w, int32_t n, int32_t k, int32_t group, bool symmetric,
                             struct krn_q4_weight *out, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    if (!eng_q4_group_valid(group))
        return inf_err_set(err, INF_E_INVALID,
                           "group size must be 32, 64, 128, 256 or per-channel, got %d", group);
    if (n <= 0 || k <= 0)
        return inf_err_set(err, INF_E_INVALID, "bad matrix shape %dx%d", n, k);
    int32_t kp = eng_q4_padded_k(k, group);
    int32_t g = group == 0 ? kp : group;
    inf_status_t st = eng_q4_alloc(n, k, kp, g, symmetric, out, err);
    if (st != INF_OK)
        return st;
    int32_t ngroups = kp / g;
    for (int32_t r = 0; r < n; r++) {
        const float *wr = w + (int64_t)r * k;
        uint8_t *qr = out->q + (int64_t)r * (kp / 2);
        for (int32_t gi = 0; gi < ngroups; gi++) {
            int32_t c0 = gi * g, c1 = c0 + g < k ? c0 + g : k;
            float lo = 0.0f, hi = 0.0f;
            for (int32_t c = c0; c < c1; c++) {
                float v = wr[c];
                if (!isfinite(v)) {
                    eng_q4_free(out);
                    return inf_err_set(err, INF_E_RANGE, "weight [%d][%d] is not finite", r, c);
                }
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            float scale, zero;
            if (symmetric) {
                float amax = fmaxf(-lo, hi);
                scale = amax / 7.0f;
                zero = 8.0f;
            } else {
                scale = (hi - lo) / 15.0f;
                zero = 0.0f; /* fixed below once scale is rounded */
            }
            uint16_t sh = inf_f32_to_f16(scale);
            float s = inf_f16_to_f32(sh);
            if (!isfinite(s)) {
                eng_q4_free(out);
                return inf_err_set(err, INF_E_RANGE, "row %d group %d: scale %g does not fit fp16",
                                   r, gi, scale);
            }
            if (!symmetric && s > 0.0f) {
                zero = rintf(-lo / s);
                zero = zero < 0.0f ? 0.0f : zero > 15.0f ? 15.0f : zero;
            }
            if (s == 0.0f && symmetric)
                zero = 8.0f;
            out->scale[(int64_t)r * ngroups + gi] = sh;
            out->zero[(int64_t)r * ngroups + gi] = inf_f32_to_f16(zero);
            int zc = (int)zero;
            for (int32_t c = c0; c < c0 + g; c++) {
                int code = zc;
                if (c < k && s > 0.0f) {
                    float qv = rintf(wr[c] / s) + zero;
                    code = qv < 0.0f ? 0 : qv > 15.0f ? 15 : (int)qv;
                }
                put_code(qr, c, code);
            }
        }
    }
    return INF_OK;
}

float eng_q4_dequant_at(const struct krn_q4_weight *w, int32_t row, int32_t col)
{
    int64_t gi = (int64_t)row * krn_q4_groups(w) + col / w->group;
    float s = inf_f16_to_f32(w->scale[gi]);
    float z = inf_f16_to_f32(w->zero[gi]);
    return ((float)krn_q4_code(w, row, col) - z) * s;
}

void eng_q4_dequantize(const struct krn_q4_weight *w, float *out)
{
    for (int32_t r = 0; r < w->n; r++)
        for (int32_t c = 0; c < w->k; c++)
            out[(int64_t)r * w->k + c] = eng_q4_dequant_at(w, r, c);
}

size_t eng_q4_bytes(const struct krn_q4_weight *w)
{
    size_t ng = (size_t)w->n * (size_t)krn_q4_groups(w);
    return (size_t)w->n * (size_t)(w->kp / 2) + 2 * ng * sizeof(uint16_t);
}
