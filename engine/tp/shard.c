/* engine/tp/shard.c — rows and column ranges of a canonical INT4 weight
 * (engine/tp/shard.h). */
#include "engine/tp/shard.h"
#include "engine/weights/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void set_code(struct krn_q4_weight *w, int32_t row, int32_t col, int code)
{
    uint8_t *b = &w->q[(int64_t)row * (w->kp / 2) + col / 2];
    *b = (col & 1) ? (uint8_t)((*b & 0x0f) | (code << 4)) : (uint8_t)((*b & 0xf0) | code);
}

/* The code that dequantizes to 0 in group g of row: the zero point (an
 * integer in [0, 15] in every canonical weight; 8 when symmetric). */
static int zero_code(const struct krn_q4_weight *w, int32_t row, int32_t g)
{
    const float z = inf_f16_to_f32(w->zero[(int64_t)row * krn_q4_groups(w) + g]);
    const int c = (int)lrintf(z);
    return c < 0 ? 0 : c > 15 ? 15 : c;
}

inf_status_t eng_q4_take_rows(const struct krn_q4_weight *w, const struct eng_rows *ranges,
                              int32_t n, struct krn_q4_weight *out, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    int64_t rows = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ranges[i].first < 0 || ranges[i].count < 0 ||
            (int64_t)ranges[i].first + ranges[i].count > w->n)
            return inf_err_set(err, INF_E_INVALID, "rows %d..%d outside a weight of %d rows",
                               ranges[i].first, ranges[i].first + ranges[i].count, w->n);
        rows += ranges[i].count;
    }
    if (rows == 0 || rows > INT32_MAX)
        return inf_err_set(err, INF_E_INVALID, "a shard of %lld rows", (long long)rows);
    inf_status_t st = eng_q4_alloc((int32_t)rows, w->k, w->kp, w->group, w->symmetric, out, err);
    if (st != INF_OK)
        return st;
    /* the rows read their input columns as w's do */
    if (w->perm) {
        if (!(out->perm = malloc((size_t)w->k * sizeof *out->perm))) {
            eng_q4_free(out);
            return inf_err_set(err, INF_E_NOMEM, "out of memory for a shard");
        }
        memcpy(out->perm, w->perm, (size_t)w->k * sizeof *out->perm);
    }
    const size_t qrow = (size_t)w->kp / 2, grow = (size_t)krn_q4_groups(w) * 2;
    int64_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t r0 = ranges[i].first, c = ranges[i].count;
        memcpy(out->q + at * qrow, w->q + r0 * qrow, (size_t)c * qrow);
        memcpy((uint8_t *)out->scale + at * grow, (const uint8_t *)w->scale + r0 * grow,
               (size_t)c * grow);
        memcpy((uint8_t *)out->zero + at * grow, (const uint8_t *)w->zero + r0 * grow,
               (size_t)c * grow);
        at += c;
    }
    return INF_OK;
}

inf_status_t eng_q4_take_cols(const struct krn_q4_weight *w, int32_t c0, int32_t c1,
                              struct krn_q4_weight *out, int32_t *lead, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    *lead = 0;
    if (c0 < 0 || c1 <= c0 || c1 > w->k)
        return inf_err_set(err, INF_E_INVALID, "columns %d..%d outside a weight of %d", c0, c1,
                           w->k);
    if (w->perm) /* its stored columns are not the input's */
        return inf_err_set(err, INF_E_UNSUPPORTED, "a column range of an act-order weight");
    const bool channel = krn_q4_groups(w) == 1;
    const int32_t ld = channel ? 0 : c0 % w->group, start = c0 - ld, k = ld + (c1 - c0);
    const int32_t kp = channel ? (k + 1) / 2 * 2 : (k + w->group - 1) / w->group * w->group;
    const int32_t group = channel ? kp : w->group, g0 = channel ? 0 : start / w->group;
    inf_status_t st = eng_q4_alloc(w->n, k, kp, group, w->symmetric, out, err);
    if (st != INF_OK)
        return st;
    const int32_t ng = krn_q4_groups(out), wg = krn_q4_groups(w);
    for (int32_t r = 0; r < w->n; r++) {
        memcpy(out->scale + (int64_t)r * ng, w->scale + (int64_t)r * wg + g0, (size_t)ng * 2);
        memcpy(out->zero + (int64_t)r * ng, w->zero + (int64_t)r * wg + g0, (size_t)ng * 2);
        for (int32_t j = 0; j < kp; j++) {
            const int32_t src = start + j;
            const bool inside = j >= ld && src < c1;
            set_code(out, r, j, inside ? krn_q4_code(w, r, src) : zero_code(out, r, j / group));
        }
    }
    *lead = ld;
    return INF_OK;
}

inf_status_t eng_tp_shape_of(int32_t n_heads, int32_t n_kv_heads, int32_t inter, int32_t rank,
                             int32_t size, struct eng_tp_shape *out, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    if (size < 1 || rank < 0 || rank >= size)
        return inf_err_set(err, INF_E_INVALID, "tp: rank %d of %d", rank, size);
    if (n_heads % size)
        return inf_err_set(err, INF_E_INVALID,
                           "tp = %d does not divide the model's %d attention heads", size, n_heads);
    if (n_kv_heads % size && size % n_kv_heads)
        return inf_err_set(err, INF_E_INVALID,
                           "tp = %d neither divides the model's %d KV heads nor is a multiple of "
                           "them",
                           size, n_kv_heads);
    if (inter % size)
        return inf_err_set(err, INF_E_INVALID,
                           "tp = %d does not divide the model's intermediate size %d", size, inter);
    out->rank = rank;
    out->size = size;
    out->n_heads = n_heads / size;
    out->h0 = rank * out->n_heads;
    /* fewer KV heads than ranks: each is replicated on size / n_kv_heads
     * ranks, whose query heads all read it */
    out->n_kv_heads = n_kv_heads >= size ? n_kv_heads / size : 1;
    out->kv0 = n_kv_heads >= size ? rank * out->n_kv_heads : rank * n_kv_heads / size;
    out->inter = inter / size;
    out->i0 = rank * out->inter;
    return INF_OK;
}

inf_status_t eng_q4_mask_cols(const struct krn_q4_weight *w, int32_t c0, int32_t c1,
                              struct krn_q4_weight *out, struct inf_err *err)
{
    memset(out, 0, sizeof *out);
    if (c0 < 0 || c1 <= c0 || c1 > w->k)
        return inf_err_set(err, INF_E_INVALID, "columns %d..%d outside a weight of %d", c0, c1,
                           w->k);
    const struct eng_rows all = {0, w->n};
    inf_status_t st = eng_q4_take_rows(w, &all, 1, out, err);
    if (st != INF_OK)
        return st;
    for (int32_t i = 0; i < w->k; i++) {
        const int32_t c = w->perm ? w->perm[i] : i;
        if (c < c0 || c >= c1)
            for (int32_t r = 0; r < w->n; r++)
                set_code(out, r, i, zero_code(out, r, i / w->group));
    }
    return INF_OK;
}

inf_status_t eng_q4_order_rows(struct krn_q4_weight *w, const int32_t *order, struct inf_err *err)
{
    /* as runs of consecutive rows, one take */
    struct eng_rows *runs = malloc((size_t)w->n * sizeof *runs);
    if (!runs)
        return inf_err_set(err, INF_E_NOMEM, "out of memory reordering rows");
    int32_t nr = 0;
    for (int32_t i = 0; i < w->n; i++) {
        if (nr > 0 && runs[nr - 1].first + runs[nr - 1].count == order[i])
            runs[nr - 1].count++;
        else
            runs[nr++] = (struct eng_rows){order[i], 1};
    }
    struct krn_q4_weight out;
    inf_status_t s = eng_q4_take_rows(w, runs, nr, &out, err);
    free(runs);
    if (s == INF_OK) {
        eng_q4_free(w);
        *w = out;
    }
    return s;
}
