/* engine/blocks.c — the fused halves of a decoder layer (struct
 * eng_attn_block, struct eng_mlp_block): their checks, the dispatch to a
 * backend's slot, and the composition of plain ops that defines them and
 * serves every backend without a slot. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

static bool lin_ok(const struct eng_linear *l, int32_t n, int32_t k)
{
    return l && l->n == n && l->k == k && (l->q4 || l->w);
}

static struct eng_mat cols(struct eng_mat v, int64_t first)
{
    v.off += first;
    return v;
}

static inf_status_t attn_block_check(const struct eng_attn_block *p, struct inf_err *err)
{
    const struct eng_attn_params *a = &p->attn;
    if (p->m <= 0 || p->dim <= 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->head_dim <= 0 ||
        !p->rope || !p->norm || p->n_dec < 0 || p->n_pre < 0 || (p->n_dec && !p->seq_dec) ||
        (p->n_pre && !p->seq_pre))
        return inf_err_set(err, INF_E_INVALID, "attn_block: bad sizes (m=%d)", p->m);
    const int32_t hd = a->head_dim, qd = a->n_heads * hd, kvd = a->n_kv_heads * hd;
    /* one rotation covers q and k: k's heads follow q's in the same rows */
    if (a->k.buf != a->q.buf || a->k.ld != a->q.ld || a->k.off != a->q.off + qd)
        return inf_err_set(err, INF_E_INVALID, "attn_block: k must follow q in the same rows");
    bool lin = false;
    if (p->n_qkv == 1)
        lin = lin_ok(p->qkv[0], qd + 2 * kvd, p->dim) && !p->qkv[0]->glu && a->v.buf == a->q.buf &&
              a->v.ld == a->q.ld && a->v.off == a->q.off + qd + kvd;
    else if (p->n_qkv == 3)
        lin = lin_ok(p->qkv[0], qd, p->dim) && lin_ok(p->qkv[1], kvd, p->dim) &&
              lin_ok(p->qkv[2], kvd, p->dim) && !p->qkv[0]->glu && !p->qkv[1]->glu &&
              !p->qkv[2]->glu;
    if (!lin || p->o_lead < 0 || p->o_lead > a->out.off || p->o_trail < 0 ||
        a->out.off + qd + p->o_trail > a->out.ld ||
        !lin_ok(p->o, p->dim, p->o_lead + qd + p->o_trail) || p->o->glu)
        return inf_err_set(err, INF_E_INVALID,
                           "attn_block: q/k/v or o linear does not match %d heads of %d",
                           a->n_heads, hd);
    return INF_OK;
}

static inf_status_t mlp_block_check(const struct eng_mlp_block *p, struct inf_err *err)
{
    if (p->m <= 0 || p->dim <= 0 || p->inter <= 0 || !p->norm)
        return inf_err_set(err, INF_E_INVALID, "mlp_block: bad sizes (m=%d)", p->m);
    bool lin = false;
    if (p->n_gu == 1)
        lin = lin_ok(p->gu[0], 2 * p->inter, p->dim);
    else if (p->n_gu == 2)
        lin = lin_ok(p->gu[0], p->inter, p->dim) && lin_ok(p->gu[1], p->inter, p->dim) &&
              !p->gu[0]->glu && !p->gu[1]->glu;
    if (!lin || p->down_lead < 0 || p->down_lead > p->h.off || p->down_trail < 0 ||
        p->h.off + p->inter + p->down_trail > p->h.ld ||
        !lin_ok(p->down, p->dim, p->down_lead + p->inter + p->down_trail) || p->down->glu)
        return inf_err_set(err, INF_E_INVALID,
                           "mlp_block: gate/up or down linear does not match %d x %d", p->dim,
                           p->inter);
    return INF_OK;
}

inf_status_t eng_attn_block_compose(struct eng_backend *be, const struct eng_attn_block *p,
                                    struct inf_err *err)
{
    struct eng_attn_params a = p->attn;
    const int32_t m = p->m, hd = a.head_dim;
    inf_status_t s;
    if (p->n_qkv == 1) {
        s = eng_op_linear(be, p->qkv[0], p->xn, a.q, false, m, err);
    } else if (!(s = eng_op_linear(be, p->qkv[0], p->xn, a.q, false, m, err)) &&
               !(s = eng_op_linear(be, p->qkv[1], p->xn, a.k, false, m, err))) {
        s = eng_op_linear(be, p->qkv[2], p->xn, a.v, false, m, err);
    }
    if (s || (s = eng_op_rope(be, a.q, a.n_heads + a.n_kv_heads, hd, a.pos, p->rope, m, err)))
        return s;
    if (p->n_dec > 0) {
        a.seqs = p->seq_dec;
        a.n_seqs = p->n_dec;
        if ((s = eng_op_attn_decode(be, &a, err)))
            return s;
    }
    if (p->n_pre > 0) {
        a.seqs = p->seq_pre;
        a.n_seqs = p->n_pre;
        if ((s = eng_op_attn_prefill(be, &a, err)))
            return s;
    }
    if ((s = eng_op_linear(be, p->o, cols(a.out, -p->o_lead), p->d, false, m, err)) ||
        (p->all_reduce && (s = eng_op_all_reduce(be, p->d, p->dim, m, err))))
        return s;
    return eng_op_rmsnorm_add(be, p->x, &p->d, p->norm, p->norm_perm, p->eps, p->xn, p->dim, m,
                              err);
}

inf_status_t eng_mlp_block_compose(struct eng_backend *be, const struct eng_mlp_block *p,
                                   struct inf_err *err)
{
    const int32_t m = p->m, I = p->inter;
    const struct eng_mat g = p->gu_out, u = cols(p->gu_out, I);
    inf_status_t s;
    if (p->n_gu == 1 && p->gu[0]->glu) {
        s = eng_op_linear_q4_glu(be, p->gu[0]->q4, p->xn, g, p->h, m, err);
    } else {
        if (p->n_gu == 1)
            s = eng_op_linear(be, p->gu[0], p->xn, g, false, m, err);
        else if (!(s = eng_op_linear(be, p->gu[0], p->xn, g, false, m, err)))
            s = eng_op_linear(be, p->gu[1], p->xn, u, false, m, err);
        if (!s)
            s = eng_op_silu_mul(be, g, u, p->h, I, m, err);
    }
    return s ? s : eng_mlp_block_tail(be, p, err);
}

inf_status_t eng_mlp_block_tail(struct eng_backend *be, const struct eng_mlp_block *p,
                                struct inf_err *err)
{
    inf_status_t s;
    if ((s = eng_op_linear(be, p->down, cols(p->h, -p->down_lead), p->d, false, p->m, err)) ||
        (p->all_reduce && (s = eng_op_all_reduce(be, p->d, p->dim, p->m, err))))
        return s;
    return eng_op_rmsnorm_add(be, p->x, &p->d, p->norm, p->norm_perm, p->eps, p->xn, p->dim, p->m,
                              err);
}

inf_status_t eng_op_attn_block(struct eng_backend *be, const struct eng_attn_block *p,
                               struct inf_err *err)
{
    inf_status_t s = attn_block_check(p, err);
    if (s != INF_OK)
        return s;
    return be->iface->attn_block ? be->iface->attn_block(be, p, err)
                                 : eng_attn_block_compose(be, p, err);
}

inf_status_t eng_op_mlp_block(struct eng_backend *be, const struct eng_mlp_block *p,
                              struct inf_err *err)
{
    inf_status_t s = mlp_block_check(p, err);
    if (s != INF_OK)
        return s;
    return be->iface->mlp_block ? be->iface->mlp_block(be, p, err)
                                : eng_mlp_block_compose(be, p, err);
}
