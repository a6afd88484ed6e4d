/* engine/cuda/blocks.c — the fused halves of a decoder layer on the CUDA
 * backend (struct eng_attn_block, struct eng_mlp_block). Inside a
 * fixed-shape decode step (graph_prepare .. graph_finish) the parts hand
 * their results over without writing them as fp16 where the kernels allow:
 *   attention  the q/k/v linear ends with fixed-point words (one launch,
 *              no split-K tail, no C) that the decode attention reads
 *              itself, rotating q and k and writing the step's K/V on the
 *              way; the o linear ends with words that the RMSNorm adds to
 *              the residual;
 *   MLP        the gate/up linear of a GLU weight gives SiLU·mul (from its
 *              words up to GLU_ACC_MAX_M rows); the down linear ends with
 *              words for the RMSNorm.
 * Anywhere else, and wherever a part does not take the fused form, each
 * block is engine/blocks.c's composition of the plain ops. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/cuda/cuda_impl.h"
#include "kernels/rope_cuda.h"

/* A block of the fixed-shape step the backend prepared: m its rows. */
static bool in_step(const struct cu_ctx *c, int32_t m)
{
    return c->step.active && m == c->step.rows;
}

/* The INT4 weight of l where its linear may end with words (no bias). */
static const struct cu_q4 *words_weight(const struct eng_linear *l, int32_t m)
{
    return l->q4 && !l->bias && !l->glu && m <= ACC_MAX_M ? l->q4->impl : NULL;
}

/* y = x l^T (+ bias), its sums left as words where the linear takes them
 * (*words >= 0), else written to y (*words = -1). */
static inf_status_t linear_words(struct cu_ctx *c, struct eng_backend *be,
                                 const struct eng_linear *l, struct eng_mat x, struct eng_mat y,
                                 int32_t m, int32_t *words, struct inf_err *err)
{
    *words = -1;
    const struct cu_q4 *q = words_weight(l, m);
    if (q)
        return eng_cuda_q4_run(c, q, NULL, x, y, NULL, false, m, words, err);
    return eng_op_linear(be, l, x, y, false, m, err);
}

inf_status_t eng_cuda_attn_block(struct eng_backend *be, const struct eng_attn_block *p,
                                 struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    /* a decode step of the prepared shape (its list is the step's) */
    if (!in_step(c, p->m) || p->n_pre > 0 || p->n_dec <= 0)
        return eng_attn_block_compose(be, p, err);
    struct eng_attn_params a = p->attn;
    a.seqs = p->seq_dec;
    a.n_seqs = p->n_dec;
    const int32_t m = p->m, hd = a.head_dim;
    const int32_t qkv_n = (a.n_heads + 2 * a.n_kv_heads) * hd;
    inf_status_t s;
    int32_t words = -1;
    if (p->n_qkv == 1) {
        s = linear_words(c, be, p->qkv[0], p->xn, a.q, m, &words, err);
    } else if (!(s = eng_op_linear(be, p->qkv[0], p->xn, a.q, false, m, err)) &&
               !(s = eng_op_linear(be, p->qkv[1], p->xn, a.k, false, m, err))) {
        s = eng_op_linear(be, p->qkv[2], p->xn, a.v, false, m, err);
    }
    if (s || (s = eng_cuda_rope_freqs(c, p->rope, hd, err)))
        return s;
    bool fused = false;
    if ((s = eng_cuda_attn_fused(c, &a, words, qkv_n, &fused, err)))
        return s;
    /* else the plain RoPE and attention, from fp16 q/k/v */
    if (!fused &&
        ((words >= 0 && (s = eng_cuda_words_reduce(c, words, a.q, m, qkv_n, err))) ||
         (s = eng_op_rope(be, a.q, a.n_heads + a.n_kv_heads, hd, a.pos, p->rope, m, err)) ||
         (s = eng_op_attn_decode(be, &a, err))))
        return s;
    /* a row-parallel o is summed over the group as fp16 rows first */
    struct eng_mat o_in = a.out;
    o_in.off -= p->o_lead;
    if (p->all_reduce)
        s = eng_op_linear(be, p->o, o_in, p->d, false, m, err);
    else
        s = linear_words(c, be, p->o, o_in, p->d, m, &words, err);
    if (s || (p->all_reduce && (s = eng_op_all_reduce(be, p->d, p->dim, m, err))))
        return s;
    return eng_cuda_norm_add(c, p->x, &p->d, words, p->norm, p->norm_perm, p->eps, p->xn, p->dim, m,
                             err);
}

inf_status_t eng_cuda_mlp_block(struct eng_backend *be, const struct eng_mlp_block *p,
                                struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (!in_step(c, p->m))
        return eng_mlp_block_compose(be, p, err);
    const int32_t m = p->m, I = p->inter;
    inf_status_t s;
    if (p->n_gu == 1 && p->gu[0]->glu) {
        s = eng_cuda_q4_run(c, p->gu[0]->q4->impl, NULL, p->xn, p->h, &p->gu_out, false, m, NULL,
                            err);
    } else {
        struct eng_mat g = p->gu_out, u = p->gu_out;
        u.off += I;
        if (p->n_gu == 1)
            s = eng_op_linear(be, p->gu[0], p->xn, g, false, m, err);
        else if (!(s = eng_op_linear(be, p->gu[0], p->xn, g, false, m, err)))
            s = eng_op_linear(be, p->gu[1], p->xn, u, false, m, err);
        if (!s)
            s = eng_op_silu_mul(be, g, u, p->h, I, m, err);
    }
    int32_t words = -1;
    if (s)
        return s;
    struct eng_mat h_in = p->h;
    h_in.off -= p->down_lead;
    if (p->all_reduce)
        s = eng_op_linear(be, p->down, h_in, p->d, false, m, err);
    else
        s = linear_words(c, be, p->down, h_in, p->d, m, &words, err);
    if (s || (p->all_reduce && (s = eng_op_all_reduce(be, p->d, p->dim, m, err))))
        return s;
    return eng_cuda_norm_add(c, p->x, &p->d, words, p->norm, p->norm_perm, p->eps, p->xn, p->dim, m,
                             err);
}

#endif
