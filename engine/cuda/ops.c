/* engine/cuda/ops.c — the CUDA backend's row ops: embedding, RMSNorm with
 * the residual add (also from a linear's fixed-point words), RoPE, SiLU·mul
 * and row gathers. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/cuda/cuda_impl.h"
#include "kernels/activation_cuda.h"
#include "kernels/embedding_cuda.h"
#include "kernels/norm_cuda.h"
#include "kernels/rope.h"
#include "kernels/rope_cuda.h"

inf_status_t eng_cuda_embedding(struct eng_backend *be, const struct eng_buf *table,
                                enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                                const struct eng_buf *ids, struct eng_mat out, int32_t m,
                                struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    const int32_t *id = shadow_of(ids);
    if (id)
        for (int32_t t = 0; t < m; t++)
            if (id[t] < 0 || id[t] >= vocab)
                return inf_err_set(err, INF_E_INVALID, "token id %d outside the vocabulary (%d)",
                                   id[t], vocab);
    KRN(c, krn_cuda_embed(table->ptr, wdt == ENG_W_F16, vocab, dim, ids->ptr, dptr(out, 2),
                          ld_int(out.ld, dim), m, c->d_bad, c->stream, lep_));
    eng_cuda_written(out.buf);
    eng_cuda_weight_seen(table);
    return INF_OK;
}

inf_status_t eng_cuda_norm_add(struct cu_ctx *c, struct eng_mat x, const struct eng_mat *d,
                               int32_t words, const struct eng_buf *w, const struct eng_buf *perm,
                               float eps, struct eng_mat out, int32_t dim, int32_t m,
                               struct inf_err *err)
{
    inf_status_t st = INF_E_UNSUPPORTED;
    if (words >= 0) {
        /* the sums are not consumed: the next words linear zeroes them */
        struct inf_err le = {0};
        st = krn_cuda_rmsnorm_add_acc(dptr(x, 2), x.ld, cu_acc_buf(c, words), w->ptr,
                                      perm ? perm->ptr : NULL, eps, dptr(out, 2), out.ld, dim, m,
                                      c->stream, &le);
        if (st != INF_OK && st != INF_E_UNSUPPORTED)
            return eng_cuda_kst(c, st, &le, err);
        if (st != INF_OK && (st = eng_cuda_words_reduce(c, words, *d, m, dim, err)) != INF_OK)
            return st; /* the usual form below, from d */
    }
    if (st != INF_OK)
        KRN(c, krn_cuda_rmsnorm_add(dptr(x, 2), x.ld, d ? dptr(*d, 2) : NULL, d ? d->ld : 0, w->ptr,
                                    perm ? perm->ptr : NULL, eps, dptr(out, 2), out.ld, dim, m,
                                    c->stream, lep_));
    eng_cuda_written(x.buf);
    eng_cuda_written(out.buf);
    eng_cuda_weight_seen(w);
    return INF_OK;
}

inf_status_t eng_cuda_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                  const struct eng_mat *delta, const struct eng_buf *w,
                                  const struct eng_buf *perm, float eps, struct eng_mat out,
                                  int32_t dim, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    return eng_cuda_norm_add(c, x, delta, -1, w, perm, eps, out, dim, m, err);
}

inf_status_t eng_cuda_rope_freqs(struct cu_ctx *c, const struct eng_rope_params *p,
                                 int32_t head_dim, struct inf_err *err)
{
    /* The frequencies come from the CPU code (one definition of the math)
     * and are uploaded only when the parameters change. */
    const struct eng_rope_params *q = &c->inv_params;
    if (c->inv_valid && c->inv_head_dim == head_dim && q->theta == p->theta &&
        q->llama3 == p->llama3 && q->factor == p->factor && q->low_freq == p->low_freq &&
        q->high_freq == p->high_freq && q->orig_max_pos == p->orig_max_pos)
        return INF_OK;
    float inv[256];
    krn_rope_inv_freq(p->theta, p->llama3, p->factor, p->low_freq, p->high_freq, p->orig_max_pos,
                      head_dim, inv);
    inf_status_t st =
        eng_cuda_stage_upload(c, c->d_inv_freq, inv, (size_t)(head_dim / 2) * sizeof(float), err);
    if (st != INF_OK)
        return st;
    c->inv_params = *p;
    c->inv_head_dim = head_dim;
    c->inv_valid = true;
    return INF_OK;
}

inf_status_t eng_cuda_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                           int32_t head_dim, const struct eng_buf *pos,
                           const struct eng_rope_params *p, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    inf_status_t st = eng_cuda_rope_freqs(c, p, head_dim, err);
    if (st != INF_OK)
        return st;
    KRN(c, krn_cuda_rope(dptr(x, 2), x.ld, n_heads, head_dim, pos->ptr, c->d_inv_freq, m, c->stream,
                         lep_));
    eng_cuda_written(x.buf);
    return INF_OK;
}

inf_status_t eng_cuda_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                               struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    KRN(c, krn_cuda_silu_mul(dptr(gate, 2), gate.ld, dptr(up, 2), up.ld, dptr(out, 2), out.ld, dim,
                             m, c->stream, lep_));
    eng_cuda_written(out.buf);
    return INF_OK;
}

inf_status_t eng_cuda_rows_gather(struct eng_backend *be, struct eng_mat x,
                                  const struct eng_buf *idx, struct eng_mat out, int32_t dim,
                                  int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    /* Rows of x that lie inside its buffer. */
    int64_t avail = (int64_t)(x.buf->size / 2) - x.off - dim;
    int64_t x_rows = avail < 0 ? 0 : x.ld > 0 ? avail / x.ld + 1 : 1;
    const int32_t *id = shadow_of(idx);
    if (id)
        for (int32_t r = 0; r < m; r++)
            if (id[r] < 0 || id[r] >= x_rows)
                return inf_err_set(err, INF_E_INVALID, "rows_gather: row %d out of the buffer",
                                   id[r]);
    KRN(c, krn_cuda_rows_gather(dptr(x, 2), x.ld, x_rows, idx->ptr, dptr(out, 2),
                                ld_int(out.ld, dim), dim, m, c->d_bad, c->stream, lep_));
    eng_cuda_written(out.buf);
    return INF_OK;
}

#endif
