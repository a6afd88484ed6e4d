/* engine/model.c — the forward step of a Llama-family model, written once
 * against the backend table (engine/backend.h): each decoder layer as its
 * two fused halves (eng_op_attn_block, eng_op_mlp_block), decode steps
 * padded to a bucket and replayed as recorded graphs, the lm_head in
 * chunks of rows, sampling on the device. Loading is engine/model_load.c. */
#define INF_LOG_MODULE "eng"
#include "engine/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- forward --------------------------------------------------------------- */

static struct eng_mat mat(struct eng_buf *b, int64_t off, int64_t ld)
{
    return (struct eng_mat){.buf = b, .off = off, .ld = ld};
}

/* Check the batch and build the sequence runs. */
static inf_status_t plan(struct eng_model *m, const struct eng_batch *b, int32_t *n_dec,
                         int32_t *n_pre, int32_t *n_lrows, struct inf_err *err)
{
    if (b->n_tokens <= 0)
        return inf_err_set(err, INF_E_INVALID, "a batch needs at least one token");
    if (b->n_tokens > m->opts.max_tokens)
        return inf_err_set(err, INF_E_TOOBIG, "%d tokens in a step, at most %d", b->n_tokens,
                           m->opts.max_tokens);
    if (b->n_slots <= 0 || b->max_blocks <= 0 || !b->block_table)
        return inf_err_set(err, INF_E_INVALID, "a batch needs block tables");
    *n_dec = *n_pre = *n_lrows = 0;
    int32_t t = 0;
    while (t < b->n_tokens) {
        int32_t slot = b->slot[t], t0 = t;
        if (slot < 0 || slot >= b->n_slots)
            return inf_err_set(err, INF_E_INVALID, "token %d: slot %d out of range", t, slot);
        for (int32_t u = 0; u < t0; u++)
            if (b->slot[u] == slot)
                return inf_err_set(err, INF_E_INVALID,
                                   "tokens of slot %d are not contiguous in the batch", slot);
        while (t < b->n_tokens && b->slot[t] == slot) {
            if (b->pos[t] < 0 || (t > t0 && b->pos[t] != b->pos[t - 1] + 1))
                return inf_err_set(err, INF_E_INVALID,
                                   "token %d: positions of slot %d are not consecutive", t, slot);
            t++;
        }
        int32_t *dst =
            t - t0 == 1 ? &m->host_seq_dec[3 * (*n_dec)++] : &m->host_seq_pre[3 * (*n_pre)++];
        dst[0] = t0;
        dst[1] = t - t0;
        dst[2] = slot;
    }
    for (t = 0; t < b->n_tokens; t++)
        if (b->want_logits[t])
            m->host_lrows[(*n_lrows)++] = t;
    if (*n_lrows != b->n_logits)
        return inf_err_set(err, INF_E_INVALID, "n_logits is %d but %d tokens want logits",
                           b->n_logits, *n_lrows);
    return INF_OK;
}

/* The attention parameters of a step (pools and sequences set per call). */
static struct eng_attn_params attn_params(eng_model_t *m, int32_t n_slots, int32_t max_blocks)
{
    const struct eng_model_config *c = &m->cfg;
    /* this rank's heads (all of them at tp 1) */
    const struct eng_tp_shape *tp = &m->tp;
    int32_t hd = c->head_dim, qd = tp->n_heads * hd, kvd = tp->n_kv_heads * hd, qkvw = qd + 2 * kvd;
    return (struct eng_attn_params){.n_heads = tp->n_heads,
                                    .n_kv_heads = tp->n_kv_heads,
                                    .head_dim = hd,
                                    .scale = 1.0f / sqrtf((float)hd),
                                    .q = mat(m->qkv, 0, qkvw),
                                    .k = mat(m->qkv, qd, qkvw),
                                    .v = mat(m->qkv, qd + kvd, qkvw),
                                    .out =
                                        mat(m->att, m->att_lead, m->att_lead + qd + m->att_trail),
                                    .pos = m->pos,
                                    .block_table = m->bt,
                                    .n_slots = n_slots,
                                    .max_blocks = max_blocks,
                                    .k_cache = m->layers[0].k_cache,
                                    .v_cache = m->layers[0].v_cache,
                                    .n_blocks = m->opts.n_kv_blocks,
                                    .window = c->sliding_window,
                                    .k_scale = m->layers[0].k_scale,
                                    .v_scale = m->layers[0].v_scale};
}

/* The device work of a step over T rows whose tables are uploaded: the
 * embedding, the first norm, each layer's two halves (its attention with
 * the decode runs, then the prefill runs; the norm after each half is the
 * next one's input norm), the final norm's output in xn. */
static inf_status_t body(eng_model_t *m, const struct eng_attn_params *ap, int32_t T, int32_t n_dec,
                         int32_t n_pre, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    const int32_t H = c->hidden, I = m->tp.inter, L = c->n_layers;
    const bool reduce = m->tp.size > 1; /* o and down are row-parallel shards */
    const struct eng_mat x = mat(m->x, 0, H), xn = mat(m->xn, 0, H), d = mat(m->d, 0, H);
    inf_status_t s;
    if ((s = eng_op_embedding(be, m->embed, m->embed_dt, c->vocab, H, m->tok, x, T, err)) ||
        (s = eng_op_rmsnorm_add(be, x, NULL, m->layers[0].attn_norm, m->layers[0].attn_perm,
                                c->rms_eps, xn, H, T, err)))
        return s;
    struct eng_attn_block ab = {.m = T,
                                .dim = H,
                                .x = x,
                                .xn = xn,
                                .rope = &m->rope,
                                .attn = *ap,
                                .seq_dec = m->seq_dec,
                                .n_dec = n_dec,
                                .seq_pre = m->seq_pre,
                                .n_pre = n_pre,
                                .d = d,
                                .eps = c->rms_eps,
                                .all_reduce = reduce};
    struct eng_mlp_block mb = {.m = T,
                               .dim = H,
                               .inter = I,
                               .x = x,
                               .xn = xn,
                               .gu_out = mat(m->gu, 0, 2 * I),
                               .h = mat(m->h, m->h_lead, m->h_lead + I + m->h_trail),
                               .d = d,
                               .eps = c->rms_eps,
                               .all_reduce = reduce};
    for (int32_t l = 0; l < L; l++) {
        struct layer *ly = &m->layers[l];
        ab.n_qkv = ly->n_qkv;
        mb.n_gu = ly->n_gu;
        for (int i = 0; i < 3; i++)
            ab.qkv[i] = &ly->qkv[i].lin;
        ab.o = &ly->o.lin;
        ab.o_lead = ly->o.lead;
        ab.o_trail = ly->o.trail;
        mb.down_lead = ly->down.lead;
        mb.down_trail = ly->down.trail;
        ab.attn.k_cache = ly->k_cache;
        ab.attn.v_cache = ly->v_cache;
        ab.attn.k_scale = ly->k_scale;
        ab.attn.v_scale = ly->v_scale;
        ab.norm = ly->mlp_norm;
        ab.norm_perm = ly->mlp_perm;
        mb.gu[0] = &ly->gu[0].lin;
        mb.gu[1] = &ly->gu[1].lin;
        mb.down = &ly->down.lin;
        mb.norm = l + 1 < L ? m->layers[l + 1].attn_norm : m->final_norm;
        mb.norm_perm = l + 1 < L ? m->layers[l + 1].attn_perm : NULL;
        if ((s = eng_op_attn_block(be, &ab, err)) || (s = eng_op_mlp_block(be, &mb, err)))
            return s;
    }
    return INF_OK;
}

/* Decode batches padded to these row counts replay one graph each. */
static const int32_t k_buckets[MODEL_BUCKETS] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128};
#define N_BUCKETS MODEL_BUCKETS

int32_t eng_model_graph_bucket(int32_t rows)
{
    for (int32_t i = 0; i < N_BUCKETS; i++)
        if (rows <= k_buckets[i])
            return rows < 1 ? -1 : k_buckets[i];
    return -1;
}

/* The bucket of a decode batch of T tokens, or -1. */
static int32_t bucket_of(const eng_model_t *m, int32_t T)
{
    for (int32_t i = 0; i < N_BUCKETS; i++)
        if (T <= k_buckets[i])
            return k_buckets[i] <= m->graph_rows ? i : -1;
    return -1;
}

/* A decode-only step, every token wanting logits, padded to bucket rows
 * (token 0 at position 0; those rows are computed and never read): the
 * tables in their planned shapes, the attention list in the backend's fixed
 * shape, then the recorded graph of the bucket replayed (recorded on its
 * first use), or the ops run as they come (graphs off, or a recording that
 * failed). Leaves the logits of every row in lo. */
/* b's feed (engine/batch.h): the upload of its fed rows (n: the tokens
 * uploaded, b's padded) joins ups at *n_ups; once the tokens are up,
 * feed_apply overwrites the fed ones on the device from the last step's
 * samples. */
static inf_status_t feed_upload(eng_model_t *m, const struct eng_batch *b, int32_t n,
                                struct eng_upload *ups, int32_t *n_ups, struct inf_err *err)
{
    if (!b->feed)
        return INF_OK;
    if (!m->feed)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not feed tokens",
                           eng_backend_name(m->be));
    for (int32_t t = 0; t < n; t++)
        m->host_feed[t] = t < b->n_tokens ? b->feed[t] : -1;
    ups[(*n_ups)++] = (struct eng_upload){m->feed, 0, m->host_feed, (size_t)n * 4};
    return INF_OK;
}

static inf_status_t feed_apply(eng_model_t *m, const struct eng_batch *b, int32_t n,
                               struct inf_err *err)
{
    return b->feed ? eng_op_token_feed(m->be, m->tok, m->feed, m->samples, n, err) : INF_OK;
}

static inf_status_t decode_graph(eng_model_t *m, const struct eng_batch *b, int32_t bi,
                                 int32_t n_dec, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    const int32_t T = b->n_tokens, B = k_buckets[bi], S = m->opts.max_seq_blocks;
    for (int32_t t = 0; t < B; t++) {
        m->pad_tok[t] = t < T ? b->tokens[t] : 0;
        m->pad_pos[t] = t < T ? b->pos[t] : 0;
    }
    for (int32_t k = 0; k < b->n_slots; k++)
        for (int32_t j = 0; j < S; j++)
            m->pad_bt[(int64_t)k * S + j] =
                j < b->max_blocks ? b->block_table[(int64_t)k * b->max_blocks + j] : -1;
    /* the step's tables go up with the backend's work list, as one
     * transfer on a device backend */
    struct eng_upload ups[5] = {{m->tok, 0, m->pad_tok, (size_t)B * 4},
                                {m->pos, 0, m->pad_pos, (size_t)B * 4},
                                {m->seq_dec, 0, m->host_seq_dec, (size_t)n_dec * 12},
                                {m->bt, 0, m->pad_bt, (size_t)b->n_slots * (size_t)S * 4}};
    int32_t n_ups = 4;
    inf_status_t s = feed_upload(m, b, B, ups, &n_ups, err);
    if (s != INF_OK)
        return s;
    struct eng_attn_params ap = attn_params(m, b->n_slots, S);
    ap.seqs = m->seq_dec;
    ap.n_seqs = n_dec;
    bool have = false;
    if ((s = eng_graph_prepare(be, &ap, B, ups, n_ups, &have, err)) ||
        (s = feed_apply(m, b, B, err)))
        return s;
    if (have && m->opts.decode_graphs == ENG_GRAPHS_ON) {
        s = eng_graph_launch(be, B, err);
        eng_graph_finish(be);
        return s;
    }
    bool record = m->opts.decode_graphs == ENG_GRAPHS_ON && !m->graph_failed[bi];
    const struct eng_mat lx = mat(m->xn, 0, c->hidden), lo = mat(m->lo, 0, c->vocab);
    struct inf_err e2 = {0};
    for (;;) {
        if (record && (s = eng_graph_record(be, B, true, &e2)))
            break;
        s = body(m, &ap, B, n_dec, 0, &e2);
        if (s == INF_OK)
            s = m->opts.no_logits ? INF_OK
                                  : eng_op_linear(be, &m->lm_head.lin, lx, lo, true, B, &e2);
        if (!record)
            break;
        if (s == INF_OK) {
            s = eng_graph_record(be, B, false, &e2); /* ends it; launches it if kept */
            if (s != INF_E_UNSUPPORTED)
                break;
        } else {
            eng_graph_finish(be); /* abandons the recording */
            if (s != INF_E_UNSUPPORTED)
                break;
            struct inf_err e3 = {0};
            if ((s = eng_graph_prepare(be, &ap, B, NULL, 0, &have, &e3))) {
                e2 = e3;
                break;
            }
        }
        /* Something on the path cannot be recorded: this bucket runs its
         * ops as they come from now on. */
        inf_log(WARN, "decode graph of %d rows not recorded (%s); running it eagerly", B, e2.msg);
        m->graph_failed[bi] = true;
        record = false;
    }
    if (s != INF_OK)
        inf_err_set(err, s, "%s", e2.msg);
    eng_graph_finish(be);
    return s;
}

/* Everything up to the final norm: xn holds the normalized rows; *n_lr of
 * them want logits (their indices in host_lrows). A decode step that went
 * through decode_graph has its logits in lo already (*in_lo). */
static inf_status_t forward_hidden(eng_model_t *m, const struct eng_batch *b, int32_t *n_lr_out,
                                   bool *in_lo, struct inf_err *err)
{
    struct eng_backend *be = m->be;
    int32_t n_dec = 0, n_pre = 0, n_lr = 0;
    *in_lo = false;
    if (m->opts.n_kv_blocks == 0)
        return inf_err_set(err, INF_E_INVALID, "the KV cache is not reserved");
    inf_status_t s = plan(m, b, &n_dec, &n_pre, &n_lr, err);
    if (s != INF_OK)
        return s;
    *n_lr_out = n_lr;
    int32_t T = b->n_tokens;
    size_t bt_bytes = (size_t)b->n_slots * (size_t)b->max_blocks * sizeof(int32_t);
    if (!m->bt || m->bt->size < bt_bytes) {
        if (m->opts.max_slots > 0 && m->opts.max_seq_blocks > 0)
            return inf_err_set(err, INF_E_TOOBIG,
                               "a block table of %d x %d exceeds the planned %d x %d", b->n_slots,
                               b->max_blocks, m->opts.max_slots, m->opts.max_seq_blocks);
        eng_buf_free(be, m->bt);
        m->bt = NULL;
        if ((s = eng_buf_alloc(be, bt_bytes, &m->bt, err)))
            return s;
    }
    int32_t bi = n_pre == 0 && n_lr == T && m->graph_rows > 0 ? bucket_of(m, T) : -1;
    if (bi >= 0 && b->n_slots <= m->opts.max_slots && b->max_blocks <= m->opts.max_seq_blocks) {
        *in_lo = true;
        return decode_graph(m, b, bi, n_dec, err);
    }
    struct eng_upload ups[7] = {{m->tok, 0, b->tokens, (size_t)T * 4},
                                {m->pos, 0, b->pos, (size_t)T * 4},
                                {m->seq_dec, 0, m->host_seq_dec, (size_t)n_dec * 12},
                                {m->seq_pre, 0, m->host_seq_pre, (size_t)n_pre * 12},
                                {m->bt, 0, b->block_table, bt_bytes}};
    int32_t n_ups = 5;
    if ((s = feed_upload(m, b, T, ups, &n_ups, err)) ||
        (s = eng_buf_upload_many(be, ups, n_ups, err)) || (s = feed_apply(m, b, T, err)))
        return s;
    struct eng_attn_params ap = attn_params(m, b->n_slots, b->max_blocks);
    return body(m, &ap, T, n_dec, n_pre, err);
}

/* The logits of rows [r0, r0 + nr) of those wanting them, into lo. */
static inf_status_t logits_chunk(eng_model_t *m, int32_t r0, int32_t nr, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    int32_t H = c->hidden;
    inf_status_t s;
    /* This chunk's row indices go to the front of the index buffer. */
    if ((s = eng_buf_upload(be, m->lrows, 0, m->host_lrows + r0, (size_t)nr * 4, err)) ||
        (s = eng_op_rows_gather(be, mat(m->xn, 0, H), m->lrows, mat(m->lx, 0, H), H, nr, err)))
        return s;
    return eng_op_linear(be, &m->lm_head.lin, mat(m->lx, 0, H), mat(m->lo, 0, c->vocab), true, nr,
                         err);
}

inf_status_t eng_model_forward_hidden(eng_model_t *m, const struct eng_batch *b,
                                      struct inf_err *err)
{
    int32_t n_lr = 0;
    bool in_lo = false;
    inf_status_t s = forward_hidden(m, b, &n_lr, &in_lo, err);
    /* the step's end, so that a failure on its device shows in this call */
    int32_t word = 0;
    return s != INF_OK ? s : eng_buf_download(m->be, m->tok, 0, &word, sizeof word, err);
}

inf_status_t eng_model_forward(eng_model_t *m, const struct eng_batch *b, float *logits,
                               struct inf_err *err)
{
    if (m->opts.no_logits)
        return inf_err_set(err, INF_E_INVALID, "forward: this model computes no logits");
    const struct eng_model_config *c = &m->cfg;
    int32_t n_lr = 0;
    bool in_lo = false;
    inf_status_t s = forward_hidden(m, b, &n_lr, &in_lo, err);
    if (s != INF_OK)
        return s;
    if (in_lo)
        return eng_buf_download(m->be, m->lo, 0, logits, (size_t)n_lr * (size_t)c->vocab * 4, err);
    for (int32_t r0 = 0; r0 < n_lr; r0 += LOGIT_ROWS) {
        int32_t nr = n_lr - r0 < LOGIT_ROWS ? n_lr - r0 : LOGIT_ROWS;
        if ((s = logits_chunk(m, r0, nr, err)) ||
            (s = eng_buf_download(m->be, m->lo, 0, logits + (int64_t)r0 * c->vocab,
                                  (size_t)nr * (size_t)c->vocab * 4, err)))
            return s;
    }
    return INF_OK;
}

bool eng_model_can_sample(const eng_model_t *m)
{
    return m->samples != NULL;
}

/* One greedy step of b, its n_rows sampled rows wanting nothing else. */
static inf_status_t warm_step(eng_model_t *m, const struct eng_batch *b, int32_t n_rows,
                              struct eng_sample_row *rows, struct eng_sample_out *out,
                              struct inf_err *err)
{
    for (int32_t i = 0; i < n_rows; i++)
        rows[i] =
            (struct eng_sample_row){.logit_row = i, .top_p = 1.0f, .repetition_penalty = 1.0f};
    return eng_model_forward_sample(m, b, rows, n_rows, out, err);
}

inf_status_t eng_model_warm_up(eng_model_t *m, int32_t max_rows, int32_t prompt_tokens,
                               int32_t *n_graphs, int32_t *n_prompt, struct inf_err *err)
{
    *n_graphs = 0;
    *n_prompt = 0;
    if (!m->samples)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not sample",
                           eng_backend_name(m->be));
    const int32_t n_blocks = m->opts.n_kv_blocks;
    /* the prompt: within the step budget, the positions, the planned block
     * table and the pool */
    int32_t p = prompt_tokens;
    if (p > m->opts.max_tokens)
        p = m->opts.max_tokens;
    if (p > m->cfg.max_pos)
        p = m->cfg.max_pos;
    if (m->opts.max_seq_blocks > 0 && p > m->opts.max_seq_blocks * ENG_KV_BLOCK)
        p = m->opts.max_seq_blocks * ENG_KV_BLOCK;
    if ((int64_t)p > (int64_t)n_blocks * ENG_KV_BLOCK)
        p = n_blocks * ENG_KV_BLOCK;
    const int32_t n = p > k_buckets[N_BUCKETS - 1] ? p : k_buckets[N_BUCKETS - 1];
    int32_t *tok = calloc((size_t)n, sizeof *tok), *pos = calloc((size_t)n, sizeof *pos),
            *slot = calloc((size_t)n, sizeof *slot), *bt = calloc((size_t)n, sizeof *bt);
    uint8_t *want = calloc((size_t)n, 1);
    struct eng_sample_row *rows = calloc(k_buckets[N_BUCKETS - 1], sizeof *rows);
    struct eng_sample_out *out = calloc(k_buckets[N_BUCKETS - 1], sizeof *out);
    inf_status_t s = INF_OK;
    if (!tok || !pos || !slot || !bt || !want || !rows || !out) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory for the warm-up");
        goto done;
    }
    /* Prefills first: one sequence of 128 tokens (or fewer), then of p. They
     * run eagerly, so whatever an op sets up on its first call is in place
     * before the decode steps record their graphs. */
    for (int32_t k = 0; k < 2 && p > 0; k++) {
        const int32_t P = k == 0 && p > 128 ? 128 : p;
        for (int32_t t = 0; t < P; t++) {
            pos[t] = t;
            slot[t] = 0;
            want[t] = t == P - 1;
        }
        const int32_t nb = (P + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
        for (int32_t j = 0; j < nb; j++)
            bt[j] = j;
        const struct eng_batch b = {.n_tokens = P,
                                    .tokens = tok,
                                    .pos = pos,
                                    .slot = slot,
                                    .want_logits = want,
                                    .n_logits = 1,
                                    .block_table = bt,
                                    .n_slots = 1,
                                    .max_blocks = nb};
        if ((s = warm_step(m, &b, 1, rows, out, err)))
            goto done;
        *n_prompt = P;
        if (P == p)
            break;
    }
    /* Decode steps: B sequences of one token at position 0, sequence k in
     * block k; each bucket records its graph and replays it (*n_graphs
     * counts the recorded ones: a bucket whose recording failed runs eagerly
     * from then on, logged by decode_graph). */
    for (int32_t i = 0; i < N_BUCKETS && m->graph_rows > 0; i++) {
        const int32_t B = k_buckets[i];
        if (B > max_rows || B > m->graph_rows || B > n_blocks || B > m->cap_samples)
            break;
        for (int32_t t = 0; t < B; t++) {
            pos[t] = 0;
            slot[t] = t;
            bt[t] = t;
            want[t] = 1;
        }
        const struct eng_batch b = {.n_tokens = B,
                                    .tokens = tok,
                                    .pos = pos,
                                    .slot = slot,
                                    .want_logits = want,
                                    .n_logits = B,
                                    .block_table = bt,
                                    .n_slots = B,
                                    .max_blocks = 1};
        if ((s = warm_step(m, &b, B, rows, out, err)))
            goto done;
        *n_graphs += !m->graph_failed[i];
    }
done:
    free(tok);
    free(pos);
    free(slot);
    free(bt);
    free(want);
    free(rows);
    free(out);
    return s;
}

/* A step and its sampling, queued: the results in m->samples. */
static inf_status_t sample_queue(eng_model_t *m, const struct eng_batch *b,
                                 const struct eng_sample_row *rows, int32_t n_rows,
                                 struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    if (!m->samples)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not sample",
                           eng_backend_name(m->be));
    if (n_rows < 0 || n_rows > m->cap_samples)
        return inf_err_set(err, INF_E_TOOBIG, "%d sampled rows in a step, at most %d", n_rows,
                           m->cap_samples);
    for (int32_t i = 0; i < n_rows; i++)
        if (rows[i].logit_row < 0 || rows[i].logit_row >= b->n_logits ||
            (i > 0 && rows[i].logit_row < rows[i - 1].logit_row))
            return inf_err_set(err, INF_E_INVALID,
                               "sampled row %d: logits row %d (rows must be in order, < %d)", i,
                               rows[i].logit_row, b->n_logits);
    int32_t n_lr = 0;
    bool in_lo = false;
    inf_status_t s = forward_hidden(m, b, &n_lr, &in_lo, err);
    if (s != INF_OK)
        return s;
    if (in_lo)
        return eng_op_sample(m->be, m->lo, n_lr, c->vocab, rows, n_rows, m->samples, 0, err);
    int32_t i0 = 0;
    for (int32_t r0 = 0; r0 < n_lr && i0 < n_rows; r0 += LOGIT_ROWS) {
        int32_t nr = n_lr - r0 < LOGIT_ROWS ? n_lr - r0 : LOGIT_ROWS;
        int32_t i1 = i0;
        while (i1 < n_rows && rows[i1].logit_row < r0 + nr) {
            m->host_rows[i1 - i0] = rows[i1];
            m->host_rows[i1 - i0].logit_row -= r0;
            i1++;
        }
        if (i1 == i0)
            continue;
        if ((s = logits_chunk(m, r0, nr, err)) ||
            (s = eng_op_sample(m->be, m->lo, nr, c->vocab, m->host_rows, i1 - i0, m->samples, i0,
                               err)))
            return s;
        i0 = i1;
    }
    return INF_OK;
}

inf_status_t eng_model_forward_sample(eng_model_t *m, const struct eng_batch *b,
                                      const struct eng_sample_row *rows, int32_t n_rows,
                                      struct eng_sample_out *out, struct inf_err *err)
{
    if (m->n_sub > 0)
        return inf_err_set(err, INF_E_INVALID, "a step submitted is not collected yet");
    inf_status_t s = sample_queue(m, b, rows, n_rows, err);
    /* the step's one synchronization */
    return s != INF_OK
               ? s
               : eng_buf_download(m->be, m->samples, 0, out, (size_t)n_rows * sizeof *out, err);
}

bool eng_model_can_submit(const eng_model_t *m)
{
    return m->feed != NULL;
}

inf_status_t eng_model_sample_submit(eng_model_t *m, const struct eng_batch *b,
                                     const struct eng_sample_row *rows, int32_t n_rows,
                                     struct inf_err *err)
{
    if (!m->feed)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not submit steps",
                           eng_backend_name(m->be));
    if (m->n_sub == 2)
        return inf_err_set(err, INF_E_INVALID, "two steps submitted are not collected yet");
    inf_status_t s = sample_queue(m, b, rows, n_rows, err);
    if (s == INF_OK)
        s = eng_buf_download_start(
            m->be, m->samples, 0, (size_t)n_rows * sizeof(struct eng_sample_out), m->sub_next, err);
    if (s != INF_OK)
        return s;
    m->sub_next ^= 1;
    m->n_sub++;
    return INF_OK;
}

inf_status_t eng_model_sample_collect(eng_model_t *m, struct eng_sample_out *out,
                                      struct inf_err *err)
{
    if (m->n_sub == 0)
        return inf_err_set(err, INF_E_INVALID, "no step submitted");
    /* the oldest: with two in flight the slot the next submit would take */
    int slot = m->n_sub == 2 ? m->sub_next : m->sub_next ^ 1;
    m->n_sub--;
    return eng_buf_download_wait(m->be, slot, out, err);
}
