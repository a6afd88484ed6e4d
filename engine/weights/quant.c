/* engine/weights/quant.c — round-to-nearest INT4 quantization into the canonical form
 * (kernels/q4.h). The formulas and bounds are in engine/weights/quant.h. */
#define INF_LOG_MODULE "eng"
#include "engine/weights/quant.h"

#include <math.h>
#include <pthread.h>
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
    free(w->perm);
    memset(w, 0, sizeof *w);
}

bool eng_q4_perm_equal(const int32_t *a, const int32_t *b, int32_t k)
{
    if (!a || !b)
        return a == b;
    return memcmp(a, b, (size_t)k * sizeof *a) == 0;
}

inf_status_t eng_q4_concat(const struct krn_q4_weight *parts, int32_t np, struct krn_q4_weight *out,
                           struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    if (np <= 0)
        return inf_err_set(err, INF_E_INVALID, "no INT4 weights to stack");
    const struct krn_q4_weight *p0 = &parts[0];
    int64_t n = 0;
    bool sym = true;
    for (int32_t i = 0; i < np; i++) {
        const struct krn_q4_weight *p = &parts[i];
        if (p->k != p0->k || p->kp != p0->kp || p->group != p0->group ||
            !eng_q4_perm_equal(p->perm, p0->perm, p0->k))
            return inf_err_set(err, INF_E_INVALID,
                               "INT4 weights to stack differ (k %d/%d, kp %d/%d, group %d/%d or "
                               "their column order)",
                               p->k, p0->k, p->kp, p0->kp, p->group, p0->group);
        n += p->n;
        sym = sym && p->symmetric;
    }
    if (n > INT32_MAX)
        return inf_err_set(err, INF_E_INVALID, "stacked INT4 weight of %lld rows", (long long)n);
    inf_status_t st = eng_q4_alloc((int32_t)n, p0->k, p0->kp, p0->group, sym, out, err);
    if (st != INF_OK)
        return st;
    if (p0->perm && !(out->perm = malloc((size_t)p0->k * sizeof *out->perm))) {
        eng_q4_free(out);
        return inf_err_set(err, INF_E_NOMEM, "out of memory stacking INT4 weights");
    }
    if (p0->perm)
        memcpy(out->perm, p0->perm, (size_t)p0->k * sizeof *out->perm);
    size_t qrow = (size_t)p0->kp / 2, grow = (size_t)krn_q4_groups(p0);
    int64_t r0 = 0;
    for (int32_t i = 0; i < np; i++) {
        const struct krn_q4_weight *p = &parts[i];
        memcpy(out->q + (size_t)r0 * qrow, p->q, (size_t)p->n * qrow);
        memcpy(out->scale + (size_t)r0 * grow, p->scale, (size_t)p->n * grow * 2);
        memcpy(out->zero + (size_t)r0 * grow, p->zero, (size_t)p->n * grow * 2);
        r0 += p->n;
    }
    return INF_OK;
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
    if (st == INF_OK)
        st = eng_q4_quantize_rows(w, 0, n, out, err);
    if (st != INF_OK)
        eng_q4_free(out);
    return st;
}

/* Quantizing is most of the work of loading a float checkpoint, so the row
 * loop is compiled twice on x86-64, for the baseline and for x86-64-v3
 * (8-wide lanes, picked by the dynamic linker). Both give the same bytes:
 * every step is one IEEE operation (a division, rintf, an addition, min,
 * max) with nothing to contract into an fma. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QUANT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define QUANT_CLONES
#endif

/* lo = min(0, min v), hi = max(0, max v) over v[0, len); true when a value
 * is not finite. Eight running lanes, so the loop vectorizes; the result is
 * the sequential one: v < lo never lets -0 replace +0, so every lane and the
 * combination give the same extreme value. A non-finite value turns its
 * lane's v * 0 sum into NaN. */
static inline bool group_range(const float *v, int32_t len, float *lo_out, float *hi_out)
{
    float lo8[8] = {0}, hi8[8] = {0}, nf8[8] = {0};
    int32_t c = 0;
    for (; c + 8 <= len; c += 8)
        for (int j = 0; j < 8; j++) {
            float x = v[c + j];
            lo8[j] = x < lo8[j] ? x : lo8[j];
            hi8[j] = x > hi8[j] ? x : hi8[j];
            nf8[j] += x * 0.0f;
        }
    for (int j = 0; c < len; c++, j++) {
        float x = v[c];
        lo8[j] = x < lo8[j] ? x : lo8[j];
        hi8[j] = x > hi8[j] ? x : hi8[j];
        nf8[j] += x * 0.0f;
    }
    float lo = 0.0f, hi = 0.0f;
    bool bad = false;
    for (int j = 0; j < 8; j++) {
        lo = lo8[j] < lo ? lo8[j] : lo;
        hi = hi8[j] > hi ? hi8[j] : hi;
        bad = bad || nf8[j] != 0.0f;
    }
    *lo_out = lo;
    *hi_out = hi;
    return bad;
}

/* Codes of one group, columns [0, len) of wr with scale s > 0 and zero z. */
static inline void group_codes(const float *wr, int32_t len, float s, float z, uint8_t *code)
{
    for (int32_t c = 0; c < len; c++) {
        float qv = rintf(wr[c] / s) + z;
        qv = qv < 0.0f ? 0.0f : qv > 15.0f ? 15.0f : qv;
        code[c] = (uint8_t)(int)qv;
    }
}

QUANT_CLONES
inf_status_t eng_q4_quantize_rows(const float *w, int32_t r0, int32_t rows,
                                  struct krn_q4_weight *out, struct inf_err *err)
{
    const int32_t k = out->k, kp = out->kp, g = out->group, ngroups = kp / g;
    const bool symmetric = out->symmetric;
    if (r0 < 0 || rows < 0 || r0 > out->n || rows > out->n - r0)
        return inf_err_set(err, INF_E_INVALID, "rows [%d, +%d) outside a %d-row weight", r0, rows,
                           out->n);
    uint8_t code[256];
    uint8_t *codes = g <= 256 ? code : malloc((size_t)g); /* per-channel rows may be longer */
    if (!codes)
        return inf_err_set(err, INF_E_NOMEM, "out of memory quantizing a %d-wide row", g);
    inf_status_t st = INF_OK;
    for (int32_t i = 0; i < rows && st == INF_OK; i++) {
        const int32_t r = r0 + i;
        const float *wr = w + (int64_t)i * k;
        uint8_t *qr = out->q + (int64_t)r * (kp / 2);
        for (int32_t gi = 0; gi < ngroups; gi++) {
            int32_t c0 = gi * g, c1 = c0 + g < k ? c0 + g : k;
            float lo, hi;
            if (group_range(wr + c0, c1 - c0, &lo, &hi)) {
                int32_t c = c0;
                while (isfinite(wr[c]))
                    c++;
                st = inf_err_set(err, INF_E_RANGE, "weight [%d][%d] is not finite", r, c);
                break;
            }
            float scale, zero;
            if (symmetric) {
                /* not fmaxf: its sign for max(-0, +0) depends on how it is
                 * compiled; +0 (an all-zero group) as optimized builds give */
                float amax = -lo > hi ? -lo : hi;
                scale = amax / 7.0f;
                zero = 8.0f;
            } else {
                scale = (hi - lo) / 15.0f;
                zero = 0.0f; /* fixed below once scale is rounded */
            }
            uint16_t sh = inf_f32_to_f16(scale);
            float s = inf_f16_to_f32(sh);
            if (!isfinite(s)) {
                st = inf_err_set(err, INF_E_RANGE, "row %d group %d: scale %g does not fit fp16", r,
                                 gi, scale);
                break;
            }
            if (!symmetric && s > 0.0f) {
                zero = rintf(-lo / s);
                zero = zero < 0.0f ? 0.0f : zero > 15.0f ? 15.0f : zero;
            }
            if (s == 0.0f && symmetric)
                zero = 8.0f;
            out->scale[(int64_t)r * ngroups + gi] = sh;
            out->zero[(int64_t)r * ngroups + gi] = inf_f32_to_f16(zero);
            /* Columns past k (and every column of an all-zero group) hold
             * the zero point. A group starts on an even column and has an
             * even length, so a byte never straddles two groups. */
            int32_t cv = s > 0.0f ? c1 - c0 : 0;
            if (cv > 0)
                group_codes(wr + c0, cv, s, zero, codes);
            memset(codes + cv, (int)zero, (size_t)(g - cv));
            for (int32_t c = 0; c < g / 2; c++) {
                uint16_t pair; /* codes 2c (low byte) and 2c + 1 */
                memcpy(&pair, codes + 2 * c, 2);
                qr[c0 / 2 + c] = (uint8_t)((pair & 0x0fu) | ((pair >> 4) & 0xf0u));
            }
        }
    }
    if (codes != code)
        free(codes);
    return st;
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
            out[(int64_t)r * w->k + (w->perm ? w->perm[c] : c)] = eng_q4_dequant_at(w, r, c);
}

size_t eng_q4_bytes(const struct krn_q4_weight *w)
{
    size_t ng = (size_t)w->n * (size_t)krn_q4_groups(w);
    return (size_t)w->n * (size_t)(w->kp / 2) + 2 * ng * sizeof(uint16_t) +
           (w->perm ? (size_t)w->k * sizeof(int32_t) : 0);
}

/* The tiles of one repack, shared by the threads of eng_q4_gemm_repack. */
struct repack_job {
    const struct krn_q4_weight *w;
    const struct krn_int4_gemm_layout *lay;
    void *dst;
    size_t dst_bytes;
    pthread_mutex_t mu;
    inf_status_t st; /* the first error met, under mu */
    struct inf_err err;
};

static void repack_range(void *arg, int64_t t0, int64_t t1)
{
    struct repack_job *j = arg;
    struct inf_err e = {0};
    inf_status_t s = krn_int4_gemm_repack_tiles(j->w, j->lay, j->dst, j->dst_bytes, (int32_t)t0,
                                                (int32_t)t1, &e);
    if (s != INF_OK) {
        pthread_mutex_lock(&j->mu);
        if (j->st == INF_OK) {
            j->st = s;
            j->err = e;
        }
        pthread_mutex_unlock(&j->mu);
    }
}

inf_status_t eng_q4_gemm_repack(const struct krn_q4_weight *w,
                                const struct krn_int4_gemm_layout *lay, void *dst, size_t dst_bytes,
                                eng_par_t *par, struct inf_err *err)
{
    if (!lay)
        return krn_int4_gemm_repack(w, lay, dst, dst_bytes, err); /* its NULL error */
    struct repack_job j = {.w = w, .lay = lay, .dst = dst, .dst_bytes = dst_bytes, .st = INF_OK};
    pthread_mutex_init(&j.mu, NULL);
    /* Four tiles (256 columns) a chunk: a few hundred KiB of output each. */
    eng_par_run(par, lay->n_pad / 64, 4, repack_range, &j);
    pthread_mutex_destroy(&j.mu);
    if (j.st != INF_OK)
        return inf_err_set(err, j.st, "%s", j.err.msg);
    return INF_OK;
}
