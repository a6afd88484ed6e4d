#pragma once
/* engine/backend.h — engine-internal: the backend interface.
 *
 * A backend is a table of function pointers (struct eng_backend_iface) over
 * opaque device buffers, filled by each backend from a `static const` struct
 * with designated initializers, plus the public wrappers below that check
 * arguments and optional slots. The model forward (engine/model.c) is written
 * once against the wrappers; adding a backend never touches it.
 *
 * Data types
 *   activations  every activation buffer holds elements of the backend's
 *                `act_dtype` (ENG_ACT_F32 on the CPU backend; a GPU backend
 *                may declare ENG_ACT_F16). Activations are addressed by a
 *                struct eng_mat view: element offset + row stride (ld).
 *   logits       the lm_head output is always fp32 ([m][n], ld n), so that
 *                sampling sees the same numbers on every backend.
 *   weights      INT4 weights enter as the canonical form (kernels/q4.h) and
 *                are repacked by weight_q4_create into the backend's own
 *                object; fp weights (embedding, lm_head, layers kept in fp)
 *                are uploaded raw as ENG_W_F32 or ENG_W_F16 [n][k] row-major;
 *                norm weights and biases are fp32.
 *   indices      token ids, positions, sequence tables and block tables are
 *                int32 buffers uploaded by the caller (buf_upload).
 *   KV cache     per layer one K and one V pool of `kv_dtype` elements,
 *                [n_blocks][ENG_KV_BLOCK][n_kv_heads][head_dim] (fp32 on CPU,
 *                fp16 on CUDA), or ENG_ACT_E4M3 on either when the backend
 *                was created with kv_fp8: one byte a value, x / scale
 *                encoded by kernels/fp8.h, read as decode(code) * scale with
 *                the layer's k_scale / v_scale (struct eng_attn_params).
 * Ownership
 *   Buffers and weight objects belong to the caller that created them and
 *   must be freed through the same backend before it is destroyed. Ops never
 *   keep pointers to their arguments after they return.
 * Threads
 *   A backend object is used by one thread at a time (the engine thread, or
 *   one thread per tensor-parallel rank); it may run work on threads of its
 *   own (the CPU backend's pool) but every op has finished, as seen from
 *   download, when the wrapper returns on the CPU; a device backend may queue
 *   ops on its stream, and buf_download synchronizes.
 * Errors
 *   Wrappers answer INF_E_INVALID for bad shapes or views,
 *   INF_E_UNSUPPORTED for a NULL optional slot or a dtype the backend lacks,
 *   INF_E_NOMEM / INF_E_DEVICE from the backend. */
#include "common/inf.h"
#include "kernels/q4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum eng_act_dtype {
    ENG_ACT_F32,
    ENG_ACT_F16,
    ENG_ACT_E4M3, /* KV pools only: FP8 E4M3 codes (kernels/fp8.h) */
};

enum eng_wdtype {
    ENG_W_F32,
    ENG_W_F16,
};

/* Bytes per element. */
size_t eng_act_size(enum eng_act_dtype dt);
/* "fp32", "fp16", "fp8 e4m3": for logs. */
const char *eng_kv_dtype_name(enum eng_act_dtype dt);
size_t eng_w_size(enum eng_wdtype dt);

/* A device buffer: `ptr` is the backend's address (host memory on the CPU,
 * device memory on a GPU); `impl` is the backend's private record. */
struct eng_buf {
    void *ptr;
    size_t size; /* bytes */
    void *impl;
};

/* A backend's repacked INT4 weight: shape as the caller sees it, plus the
 * backend's private object. */
struct eng_q4w {
    int32_t n, k;
    void *impl;
};

/* A 2-D view of an activation buffer: element (r, c) is at element offset
 * off + r * ld + c, in elements of the backend's act_dtype. */
struct eng_mat {
    struct eng_buf *buf;
    int64_t off;
    int64_t ld;
};

/* RoPE parameters, Hugging Face (rotate_half) convention: head element i
 * pairs with i + head_dim / 2; inv_freq[i] = theta^(-2i / head_dim), rescaled
 * as Hugging Face's "llama3" rope_type when llama3 is set. */
struct eng_rope_params {
    float theta;
    bool llama3;
    float factor, low_freq, high_freq;
    int32_t orig_max_pos;
};

/* Paged attention over one layer. The batch is described per sequence run:
 * seqs is an int32 buffer [n_seqs][3] = {first token in the batch, number of
 * tokens, slot}. Token t of the batch has position pos[t]; before the op,
 * its slot holds the KV of positions 0..pos[first]-1. The op writes the K/V
 * rows of every listed token at its position (block block_table[slot][pos /
 * ENG_KV_BLOCK], row pos % ENG_KV_BLOCK), then each token attends causally
 * over positions eng_attn_first_key(window, pos[t])..pos[t] of its slot
 * (0..pos[t] without a window); block-table entries of blocks wholly
 * before the first key of a sequence's first token are never read and
 * may be -1 (the scheduler frees them). q, k, v are views with rows indexed
 * by batch token; q holds n_heads heads, k and v n_kv_heads heads of
 * head_dim; query head h uses KV head h / (n_heads / n_kv_heads) (GQA).
 * out [n_tokens rows][n_heads * head_dim] receives the attention output. */
struct eng_attn_params {
    int32_t n_heads, n_kv_heads, head_dim;
    float scale; /* usually 1 / sqrt(head_dim) */
    struct eng_mat q, k, v, out;
    const struct eng_buf *pos;  /* int32 [batch tokens] */
    const struct eng_buf *seqs; /* int32 [n_seqs][3] */
    int32_t n_seqs;
    const struct eng_buf *block_table; /* int32 [n_slots][max_blocks] */
    int32_t n_slots, max_blocks;
    struct eng_buf *k_cache, *v_cache; /* this layer's pools */
    int32_t n_blocks;                  /* blocks in each pool */
    int32_t window;                    /* sliding window in keys, the query's own
                                          included; 0: none */
    /* E4M3 pools (kv_dtype ENG_ACT_E4M3): K is stored as e4m3(k / k_scale)
     * and read as decode(code) * k_scale, V likewise; finite and > 0.
     * Not read for other pools. */
    float k_scale, v_scale;
};

/* The first key position a query at position pos sees: Hugging Face
 * transformers' Mistral masks key k for query q unless q - window < k <= q
 * (masking_utils.py sliding_window_overlay: kv_idx > q_idx - sliding_window),
 * so a window of W keeps W keys, the query's own among them: flash-attention's
 * window_size (W - 1, 0). 0 without a window (window <= 0). */
static inline int32_t eng_attn_first_key(int32_t window, int32_t pos)
{
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* A linear layer as the model holds it: an INT4 weight (q4, from
 * weight_q4_create, or a GLU weight from weight_q4_create_glu when glu) or an
 * fp weight w [n][k] of wdt (buf_upload'ed); bias fp32 [n] or NULL. */
struct eng_linear {
    int32_t n, k;
    struct eng_q4w *q4;
    struct eng_buf *w;
    enum eng_wdtype wdt;
    struct eng_buf *bias;
    bool glu; /* q4 is a gated MLP's [gate; up] for linear_q4_glu */
};

/* One host-to-device copy of a batch of them (eng_buf_upload_many). */
struct eng_upload {
    struct eng_buf *dst;
    size_t off;
    const void *src;
    size_t bytes;
};

/* The attention half of a decoder layer, from its normalized input to the
 * next norm (the slot attn_block; engine/blocks.c composes it from the
 * plain ops where a backend has none, and that composition is the
 * definition):
 *   qkv = xn . Wqkv^T (+ bias)      one fused linear, or q, k and v apart
 *   RoPE on the q and k heads of qkv at pos
 *   attention: the decode runs (seq_dec, one token each), then the prefill
 *   runs (seq_pre), each writing its K/V and attending over its slot
 *   d = att . Wo^T                  then summed over the group (all_reduce)
 *   x += d; xn = rmsnorm(x) * norm
 * attn holds the heads, the q, k, v and out views (q, k and v in one buffer,
 * q's heads then k's in each row, so one rotation covers both), the tables
 * and this layer's pools; its seqs and n_seqs are not read. A backend may
 * keep q/k/v and d in a form of its own between the parts (the CUDA
 * backend's fixed-point sums in a decode step): their buffers are scratch
 * whose contents are undefined afterwards. */
struct eng_attn_block {
    int32_t m;         /* rows (batch tokens) */
    int32_t dim;       /* hidden size */
    struct eng_mat x;  /* [m][dim] the residual stream, updated */
    struct eng_mat xn; /* [m][dim] in: the normalized input; out: the next one */
    const struct eng_linear *qkv[3];
    int32_t n_qkv; /* 1 (fused) or 3 */
    const struct eng_rope_params *rope;
    struct eng_attn_params attn;
    const struct eng_buf *seq_dec; /* int32 [n_dec][3] */
    int32_t n_dec;
    const struct eng_buf *seq_pre; /* int32 [n_pre][3] */
    int32_t n_pre;
    const struct eng_linear *o;
    struct eng_mat d;                /* [m][dim] scratch */
    const struct eng_buf *norm;      /* fp32 [dim] */
    const struct eng_buf *norm_perm; /* int32 [dim] or NULL: xn's column order
                                        (the next linear's, rmsnorm_add) */
    float eps;
    bool all_reduce; /* d summed over the tensor-parallel group (eng_op_all_reduce)
                        before the residual add: o is row-parallel */
    int32_t o_lead;  /* o's shard starts with this many zero columns
                        (engine/tp/shard.h): it reads attn.out from o_lead columns
                        before it (k = o_lead + heads x head_dim + o_trail), which
                        hold 0 */
    int32_t o_trail; /* and ends with this many, after attn.out's columns (an
                        act-order shard reads every column of the whole layer) */
};

/* The gated MLP half of a decoder layer (the slot mlp_block; composed
 * likewise):
 *   g|u = xn . [Wgate; Wup]^T       one fused linear (a GLU weight, whose op
 *                                   gives h directly), or gate and up apart
 *   h = silu(g) * u
 *   d = h . Wdown^T                 then summed over the group (all_reduce)
 *   x += d; xn = rmsnorm(x) * norm
 * gu, h and d are scratch. */
struct eng_mlp_block {
    int32_t m, dim, inter; /* rows, hidden size, intermediate size */
    struct eng_mat x, xn;  /* as in struct eng_attn_block */
    const struct eng_linear *gu[2];
    int32_t n_gu;          /* 1 (fused) or 2 */
    struct eng_mat gu_out; /* [m][2 inter] scratch: gate | up */
    struct eng_mat h;      /* [m][inter] scratch */
    const struct eng_linear *down;
    struct eng_mat d;                       /* [m][dim] scratch */
    const struct eng_buf *norm, *norm_perm; /* as in struct eng_attn_block */
    float eps;
    bool all_reduce;    /* as in struct eng_attn_block: down is row-parallel */
    int32_t down_lead;  /* as o_lead: down reads h from down_lead zero columns before it */
    int32_t down_trail; /* as o_trail */
};

/* Sampling on the device (optional slots sample_reserve / sample). One
 * sampled row reads one row of fp32 logits and applies the host sampler's
 * rules (engine/sched/sampler.h), given its settings, its token history and the
 * uniform draw u its generator made (engine/sched/sampler.c fills the row). */
#define ENG_SAMPLE_TOP 20
struct eng_sample_hist {
    int32_t token;
    int32_t count;     /* occurrences in the output */
    int32_t in_prompt; /* 1 when in the prompt */
};
struct eng_sample_row {
    int32_t logit_row; /* row of the logits buffer */
    float temperature; /* 0: greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    double u; /* the draw, uniform in [0, 1) (temperature > 0) */
    int32_t n_logprobs;
    const int32_t *ban; /* ids set to -inf before anything (EOS before min_tokens) */
    int32_t n_ban;
    const int32_t *bias_ids; /* logit_bias, in order */
    const float *bias_vals;
    int32_t n_bias;
    const struct eng_sample_hist *hist; /* tokens with a count or in the prompt (penalties) */
    int32_t n_hist;
};
/* One row's result, as engine/sched/sampler.h's struct eng_sample. */
struct eng_sample_out {
    int32_t token; /* -1: every token is excluded */
    float logprob;
    int32_t n_top;
    int32_t top_ids[ENG_SAMPLE_TOP];
    float top_logprobs[ENG_SAMPLE_TOP];
};

struct eng_backend;

/* The table a backend fills. Slots marked optional may be NULL. Every op
 * gets already-validated arguments (the wrappers check). */
struct eng_backend_iface {
    const char *name;
    void (*destroy)(struct eng_backend *be);

    inf_status_t (*buf_alloc)(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                              struct inf_err *err);
    void (*buf_free)(struct eng_backend *be, struct eng_buf *buf);
    inf_status_t (*buf_upload)(struct eng_backend *be, struct eng_buf *dst, size_t off,
                               const void *src, size_t bytes, struct inf_err *err);
    inf_status_t (*buf_download)(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                 void *dst, size_t bytes, struct inf_err *err);
    /* Optional: the copies of ups[0..n) in order, as buf_upload each; a
     * device backend issues them as one transfer. */
    inf_status_t (*buf_upload_many)(struct eng_backend *be, const struct eng_upload *ups, int32_t n,
                                    struct inf_err *err);

    /* Repack the canonical form into the backend's object; the canonical
     * form stays the caller's. A weight with a column order (w->perm, an
     * act-order checkpoint) keeps its own copy of it, and every op on the
     * weight reads x[:, perm] (the public wrapper has checked that perm is
     * a permutation of 0..k-1). */
    inf_status_t (*weight_q4_create)(struct eng_backend *be, const struct krn_q4_weight *w,
                                     struct eng_q4w **out, struct inf_err *err);
    void (*weight_q4_destroy)(struct eng_backend *be, struct eng_q4w *w);

    /* y[m][w->n] = x[m][w->k] . W^T (+ bias[n], fp32, optional); y_f32
     * selects an fp32 output (logits) instead of act_dtype. */
    inf_status_t (*linear_q4)(struct eng_backend *be, const struct eng_q4w *w,
                              const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                              bool y_f32, int32_t m, struct inf_err *err);
    /* Optional (both or none): a gated MLP's gate and up projections as one
     * weight and one op. weight_q4_create_glu takes w = [gate; up] (n = 2 dim
     * rows, n a multiple of 16); its weight serves linear_q4_glu only, which
     * gives out[m][dim] = silu(x . gate^T) * (x . up^T) with each product
     * rounded to act_dtype first: bit for bit linear_q4 on [gate; up]
     * followed by silu_mul. tmp [m][n] is scratch the op may use. */
    inf_status_t (*weight_q4_create_glu)(struct eng_backend *be, const struct krn_q4_weight *w,
                                         struct eng_q4w **out, struct inf_err *err);
    inf_status_t (*linear_q4_glu)(struct eng_backend *be, const struct eng_q4w *w, struct eng_mat x,
                                  struct eng_mat tmp, struct eng_mat out, int32_t m,
                                  struct inf_err *err);
    /* y[m][n] = x[m][k] . W^T (+ bias) with W [n][k] of wdt; y_f32 selects an
     * fp32 output (logits) instead of act_dtype. */
    inf_status_t (*linear_fp)(struct eng_backend *be, const struct eng_buf *w, enum eng_wdtype wdt,
                              int32_t n, int32_t k, const struct eng_buf *bias, struct eng_mat x,
                              struct eng_mat y, bool y_f32, int32_t m, struct inf_err *err);
    /* out[t] = table[ids[t]] for t < m; table [vocab][dim] of wdt. */
    inf_status_t (*embedding)(struct eng_backend *be, const struct eng_buf *table,
                              enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                              const struct eng_buf *ids, struct eng_mat out, int32_t m,
                              struct inf_err *err);
    /* If delta is given: x += delta. Then out = x * w / sqrt(mean(x^2) + eps),
     * for m rows of dim; with perm (int32 [dim], a permutation) out is in
     * that column order: out[:, i] is the normalized x[:, perm[i]] times
     * w[i] (w given in that order too; an act-order linear's input). */
    inf_status_t (*rmsnorm_add)(struct eng_backend *be, struct eng_mat x,
                                const struct eng_mat *delta, const struct eng_buf *w,
                                const struct eng_buf *perm, float eps, struct eng_mat out,
                                int32_t dim, int32_t m, struct inf_err *err);
    /* Rotate n_heads heads of head_dim in place in every row t < m of x, at
     * position pos[t]. */
    inf_status_t (*rope)(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                         int32_t head_dim, const struct eng_buf *pos,
                         const struct eng_rope_params *p, int32_t m, struct inf_err *err);
    /* Sequences with several tokens (prefill chunks). */
    inf_status_t (*attn_prefill)(struct eng_backend *be, const struct eng_attn_params *p,
                                 struct inf_err *err);
    /* Sequences with exactly one token each (decode). */
    inf_status_t (*attn_decode)(struct eng_backend *be, const struct eng_attn_params *p,
                                struct inf_err *err);
    /* out[t][i] = silu(gate[t][i]) * up[t][i], i < dim, t < m. */
    inf_status_t (*silu_mul)(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                             struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err);
    /* out[i] = x[idx[i]] row copies, i < m (gathers the rows that need logits). */
    inf_status_t (*rows_gather)(struct eng_backend *be, struct eng_mat x, const struct eng_buf *idx,
                                struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err);
    /* Optional fused slots: a decoder layer's two halves (struct
     * eng_attn_block, struct eng_mlp_block), called by the model where it
     * knows which layer it runs. NULL: engine/blocks.c composes the plain
     * ops. A backend's slot gives the composition's results (a device
     * backend within its arithmetic's rounding). */
    inf_status_t (*attn_block)(struct eng_backend *be, const struct eng_attn_block *p,
                               struct inf_err *err);
    inf_status_t (*mlp_block)(struct eng_backend *be, const struct eng_mlp_block *p,
                              struct inf_err *err);
    /* Optional: sum x[m][dim] over the tensor-parallel group, in place.
     * NULL for a single device. */
    inf_status_t (*all_reduce)(struct eng_backend *be, struct eng_mat x, int32_t dim, int32_t m,
                               struct inf_err *err);
    /* Optional: free and total bytes of device memory now (a device
     * backend's start-up memory plan). NULL on host backends. */
    inf_status_t (*mem_info)(struct eng_backend *be, size_t *free_bytes, size_t *total_bytes,
                             struct inf_err *err);
    /* Optional (with sample): take the sampling workspace for a vocabulary
     * of vocab, once, at load. */
    inf_status_t (*sample_reserve)(struct eng_backend *be, int32_t vocab, struct inf_err *err);
    /* Optional: sample rows[i] (i < n) from logits (fp32 [n_logit_rows][vocab])
     * into out, a buffer of struct eng_sample_out, at index out_first + i.
     * Queued: download out to read the results. */
    inf_status_t (*sample)(struct eng_backend *be, const struct eng_buf *logits,
                           int32_t n_logit_rows, int32_t vocab, const struct eng_sample_row *rows,
                           int32_t n, struct eng_buf *out, int32_t out_first, struct inf_err *err);
    /* Optional (with sample; all three or none): the next step fed from
     * this one's results before they are back, engine/batch.h's feed.
     * token_feed: where feed[i] >= 0 (int32, i < n), tok[i] = the token
     * of samples[feed[i]] (struct eng_sample_out; 0 where that token is
     * -1). Queued. */
    inf_status_t (*token_feed)(struct eng_backend *be, struct eng_buf *tok,
                               const struct eng_buf *feed, const struct eng_buf *samples, int32_t n,
                               struct inf_err *err);
    /* download_start queues a download of bytes of src at off into the
     * backend's own host memory of slot (0 or 1) and returns;
     * download_wait waits for that download (not for what was queued
     * after it) and copies its bytes to dst. Errors as buf_download's,
     * answered by download_wait. A slot holds one download at a time. */
    inf_status_t (*download_start)(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                   size_t bytes, int slot, struct inf_err *err);
    inf_status_t (*download_wait)(struct eng_backend *be, int slot, void *dst, struct inf_err *err);
    /* Optional (all four or none): decode steps as recorded, replayed
     * graphs. A decode step padded to `bucket` rows goes:
     *   graph_prepare(p, bucket, ups, n_ups, &have): uploads ups (the
     *     step's tables, as buf_upload_many), validates p (the step's
     *     decode sequences; the block table with its planned stride) and
     *     uploads its attention work list in a fixed shape for bucket, all
     *     as one transfer; until graph_finish, attn_decode and attn_block
     *     use that list and nothing is uploaded;
     *   have: graph_launch(bucket) replays the step's recorded work;
     *   else the ops, run as they come, or recorded: graph_record(bucket,
     *     true) before them, graph_record(bucket, false) after, which ends
     *     the recording, keeps it for the bucket and launches it (it answers
     *     INF_E_UNSUPPORTED, and keeps nothing, when the work could not be
     *     recorded: the caller runs the ops again);
     *   graph_finish().
     * The recorded work must read and write the same buffers at every
     * replay: only their contents change. Between graph_prepare and
     * graph_finish a backend may keep scratch of the step's own (the CUDA
     * backend's fixed-point word buffers, zero again when the step ends). The graphs are the
     * backend's, one a bucket, until it is destroyed: a backend records the steps of one model (a
     * second model on it would replay the first one's). */
    inf_status_t (*graph_prepare)(struct eng_backend *be, const struct eng_attn_params *p,
                                  int32_t bucket, const struct eng_upload *ups, int32_t n_ups,
                                  bool *have, struct inf_err *err);
    inf_status_t (*graph_record)(struct eng_backend *be, int32_t bucket, bool begin,
                                 struct inf_err *err);
    inf_status_t (*graph_launch)(struct eng_backend *be, int32_t bucket, struct inf_err *err);
    void (*graph_finish)(struct eng_backend *be);
};

/* A backend object. Made by a backend's create function (e.g.
 * eng_backend_cpu_create), released by eng_backend_destroy. */
struct eng_backend {
    const struct eng_backend_iface *iface;
    enum eng_act_dtype act_dtype; /* dtype of activation buffers */
    enum eng_act_dtype kv_dtype;  /* dtype of the KV pools */
    int32_t step_tokens;          /* token budget of a scheduler step suited to
                                     this device; 0: the engine's default (2048) */
    bool f16_as_f32;              /* fp weights kept 16-bit are uploaded as fp32
                                     holding the same values (converted once at
                                     load): the backend reads fp16 slowly */
    void *ctx;                    /* the backend's private state */
};

/* Destroy be (and its threads). NULL is a no-op. Thread: owner. */
void eng_backend_destroy(struct eng_backend *be);
const char *eng_backend_name(const struct eng_backend *be);

/* ---- public wrappers: validate, then call the slot. Thread: owner. ---- */
inf_status_t eng_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                           struct inf_err *err);
void eng_buf_free(struct eng_backend *be, struct eng_buf *buf); /* NULL is a no-op */
inf_status_t eng_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                            const void *src, size_t bytes, struct inf_err *err);
/* The copies of ups[0..n) in order (each checked as eng_buf_upload's);
 * zero-byte entries are skipped. */
inf_status_t eng_buf_upload_many(struct eng_backend *be, const struct eng_upload *ups, int32_t n,
                                 struct inf_err *err);
/* The optional feed ops (struct eng_backend_iface's token_feed,
 * download_start, download_wait); INF_E_UNSUPPORTED where the backend has
 * none (eng_backend_can_feed). */
bool eng_backend_can_feed(const struct eng_backend *be);
inf_status_t eng_op_token_feed(struct eng_backend *be, struct eng_buf *tok,
                               const struct eng_buf *feed, const struct eng_buf *samples, int32_t n,
                               struct inf_err *err);
inf_status_t eng_buf_download_start(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                    size_t bytes, int slot, struct inf_err *err);
inf_status_t eng_buf_download_wait(struct eng_backend *be, int slot, void *dst,
                                   struct inf_err *err);
inf_status_t eng_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                              void *dst, size_t bytes, struct inf_err *err);
/* Allocate and upload in one call. */
inf_status_t eng_buf_from_host(struct eng_backend *be, const void *src, size_t bytes,
                               struct eng_buf **out, struct inf_err *err);

inf_status_t eng_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
                                  struct eng_q4w **out, struct inf_err *err);
void eng_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w); /* NULL: no-op */

inf_status_t eng_op_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                              const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                              bool y_f32, int32_t m, struct inf_err *err);
/* y = x . W^T (+ bias) for l: linear_q4 or linear_fp (a GLU weight is
 * refused: it serves eng_op_linear_q4_glu only). */
inf_status_t eng_op_linear(struct eng_backend *be, const struct eng_linear *l, struct eng_mat x,
                           struct eng_mat y, bool y_f32, int32_t m, struct inf_err *err);
/* The GLU pair (iface weight_q4_create_glu / linear_q4_glu); has_glu: the
 * backend offers them. */
bool eng_backend_has_glu(const struct eng_backend *be);
inf_status_t eng_weight_q4_create_glu(struct eng_backend *be, const struct krn_q4_weight *w,
                                      struct eng_q4w **out, struct inf_err *err);
inf_status_t eng_op_linear_q4_glu(struct eng_backend *be, const struct eng_q4w *w, struct eng_mat x,
                                  struct eng_mat tmp, struct eng_mat out, int32_t m,
                                  struct inf_err *err);
inf_status_t eng_op_linear_fp(struct eng_backend *be, const struct eng_buf *w, enum eng_wdtype wdt,
                              int32_t n, int32_t k, const struct eng_buf *bias, struct eng_mat x,
                              struct eng_mat y, bool y_f32, int32_t m, struct inf_err *err);
inf_status_t eng_op_embedding(struct eng_backend *be, const struct eng_buf *table,
                              enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                              const struct eng_buf *ids, struct eng_mat out, int32_t m,
                              struct inf_err *err);
inf_status_t eng_op_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                const struct eng_mat *delta, const struct eng_buf *w,
                                const struct eng_buf *perm, float eps, struct eng_mat out,
                                int32_t dim, int32_t m, struct inf_err *err);
inf_status_t eng_op_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                         int32_t head_dim, const struct eng_buf *pos,
                         const struct eng_rope_params *p, int32_t m, struct inf_err *err);
inf_status_t eng_op_attn_prefill(struct eng_backend *be, const struct eng_attn_params *p,
                                 struct inf_err *err);
inf_status_t eng_op_attn_decode(struct eng_backend *be, const struct eng_attn_params *p,
                                struct inf_err *err);
inf_status_t eng_op_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                             struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err);
inf_status_t eng_op_rows_gather(struct eng_backend *be, struct eng_mat x, const struct eng_buf *idx,
                                struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err);
/* The fused halves of a decoder layer: the backend's slot where it has one,
 * else eng_*_block_compose. Errors as the plain ops'. */
inf_status_t eng_op_attn_block(struct eng_backend *be, const struct eng_attn_block *p,
                               struct inf_err *err);
inf_status_t eng_op_mlp_block(struct eng_backend *be, const struct eng_mlp_block *p,
                              struct inf_err *err);
/* The plain ops' composition that defines each block (struct
 * eng_attn_block's and struct eng_mlp_block's comments), for a backend's
 * slot to fall back to where its fused form does not apply. */
inf_status_t eng_attn_block_compose(struct eng_backend *be, const struct eng_attn_block *p,
                                    struct inf_err *err);
inf_status_t eng_mlp_block_compose(struct eng_backend *be, const struct eng_mlp_block *p,
                                   struct inf_err *err);
/* The MLP block's part after h: down (from down_lead), the all-reduce where
 * asked, the RMSNorm; for a slot that fuses gate/up and SiLU*mul alone. */
inf_status_t eng_mlp_block_tail(struct eng_backend *be, const struct eng_mlp_block *p,
                                struct inf_err *err);
/* For backends: validate the tables of an attention call (they are caller
 * data) from host copies: pos [rows], seqs [p->n_seqs][3], block_table
 * [p->n_slots][p->max_blocks]. Each sequence's tokens lie inside the batch,
 * its slot exists, its positions are consecutive and inside the table, and
 * every block from the first key of its first token
 * (eng_attn_first_key(p->window, ...)) up to its last position is a pool
 * block; a negative window is refused; single_token also
 * requires one token per sequence. On INF_OK *n_tok is the number of tokens
 * and *max_ctx the longest context (either may be NULL).
 * Errors: INF_E_INVALID naming the sequence, position or slot. */
inf_status_t eng_attn_tables_check(const struct eng_attn_params *p, const int32_t *pos,
                                   int64_t rows, const int32_t *seqs, const int32_t *block_table,
                                   bool single_token, int32_t *n_tok, int32_t *max_ctx,
                                   struct inf_err *err);

/* INF_E_UNSUPPORTED when the backend has no all_reduce (single device). */
inf_status_t eng_op_all_reduce(struct eng_backend *be, struct eng_mat x, int32_t dim, int32_t m,
                               struct inf_err *err);

/* INF_E_UNSUPPORTED when the backend has no device memory to report. */
inf_status_t eng_backend_mem_info(struct eng_backend *be, size_t *free_bytes, size_t *total_bytes,
                                  struct inf_err *err);

/* True when the backend samples on the device (sample and sample_reserve). */
bool eng_backend_can_sample(const struct eng_backend *be);
/* INF_E_UNSUPPORTED without the slots; INF_E_INVALID for vocab <= 0. */
inf_status_t eng_backend_sample_reserve(struct eng_backend *be, int32_t vocab, struct inf_err *err);
/* Checks every row (logit_row in range, settings in the host sampler's
 * ranges, ids in the vocabulary) and that out holds out_first + n results. */
inf_status_t eng_op_sample(struct eng_backend *be, const struct eng_buf *logits,
                           int32_t n_logit_rows, int32_t vocab, const struct eng_sample_row *rows,
                           int32_t n, struct eng_buf *out, int32_t out_first, struct inf_err *err);

/* True when the backend records decode graphs (the graph_* slots). */
bool eng_backend_has_graphs(const struct eng_backend *be);
/* The graph_* slots (see the table); INF_E_UNSUPPORTED without them. */
inf_status_t eng_graph_prepare(struct eng_backend *be, const struct eng_attn_params *p,
                               int32_t bucket, const struct eng_upload *ups, int32_t n_ups,
                               bool *have, struct inf_err *err);
inf_status_t eng_graph_record(struct eng_backend *be, int32_t bucket, bool begin,
                              struct inf_err *err);
inf_status_t eng_graph_launch(struct eng_backend *be, int32_t bucket, struct inf_err *err);
void eng_graph_finish(struct eng_backend *be);

/* ---- the CPU backend (engine/cpu/backend_cpu.c) ----------------------------
 * fp32 activations and KV. n_threads 0 = one per core the process may run
 * on. Ops run on a pthread pool owned by the backend; the calling thread
 * takes part and every op has finished when it returns. Errors:
 * INF_E_NOMEM, INF_E_INVALID. */
struct eng_comm; /* engine/tp/comm.h */
struct eng_backend_cpu_opts {
    int32_t n_threads;
    bool kv_fp8; /* KV pools of E4M3 codes (kv_dtype ENG_ACT_E4M3) instead of fp32 */
    /* A tensor-parallel rank's communicator (the local kind), which its
     * all_reduce sums over; NULL: a group of one (all_reduce leaves x as it
     * is). It must outlive the backend. */
    struct eng_comm *comm;
};
inf_status_t eng_backend_cpu_create(const struct eng_backend_cpu_opts *opts,
                                    struct eng_backend **out, struct inf_err *err);
/* Threads the CPU backend runs on (the caller included). */
int32_t eng_backend_cpu_threads(const struct eng_backend *be);

/* Where the CPU backend's time goes (bench/cpu_decode): with the profile on,
 * each op's wall time, its hand-off to the pool included, is summed per op
 * name and weight shape, and the pool counts its hand-offs and how long the
 * caller waited for the other threads after its own share. */
#define ENG_CPU_PROF_OPS 32
struct eng_cpu_prof_op {
    char name[16]; /* "linear_q4", "attn_decode", "rmsnorm_add", ... */
    int32_t n, k;  /* a linear's weight shape; 0 for other ops */
    uint64_t calls, ns;
};
struct eng_cpu_prof {
    int32_t n_ops;
    struct eng_cpu_prof_op ops[ENG_CPU_PROF_OPS];
    uint64_t handoffs;        /* runs that woke the pool's threads */
    uint64_t handoff_wait_ns; /* the caller waiting for them after its share */
};
/* Turn the profile on (from zero) or off. Thread: owner. */
void eng_backend_cpu_profile(struct eng_backend *be, bool on);
/* What the profile holds now. Thread: owner. */
void eng_backend_cpu_profile_read(const struct eng_backend *be, struct eng_cpu_prof *out);

/* ---- the CUDA backend (engine/cuda/backend_cuda.c) ---------------------------
 * fp16 activations and KV on one GPU; INT4 linears through the Marlin-class
 * GEMM (kernels/int4_gemm.h), fp16/fp32 linears through cuBLAS (fp32
 * accumulation), the other ops through kernels/<op>_cuda.h. Device memory is
 * taken only at creation (workspace, staging) and while loading (buffers,
 * weights); ops queue work on the backend's stream and buf_download
 * synchronizes. Any CUDA or cuBLAS failure is answered INF_E_DEVICE and
 * leaves the backend failed: every later call answers INF_E_DEVICE.
 * Index buffers (token ids, positions, sequence and block tables, gather
 * rows) must be filled with buf_upload: the backend validates them from the
 * uploaded bytes, as the CPU backend does.
 * Without INT4SERVE_HAVE_CUDA the create function exists and answers
 * INF_E_UNSUPPORTED. Errors: INF_E_UNSUPPORTED (no GPU or no driver, compute
 * capability below 7.5, a build without kernels for the device, a CPU-only
 * build), INF_E_INVALID (device
 * ordinal out of range), INF_E_DEVICE (a CUDA error), INF_E_NOMEM (device or
 * pinned memory). Thread: the creating thread
 * and then one owner at a time (each call selects the device). */
struct eng_backend_cuda_opts {
    int32_t device; /* CUDA device ordinal */
    bool kv_fp8;    /* KV pools of E4M3 codes (kv_dtype ENG_ACT_E4M3) instead of fp16 */
    /* The sm_75 kernels (engine.cuda_kernels = "sm75", what a T4 runs)
     * whatever the GPU: set for the device, process-wide, when the backend
     * is created (krn_cuda_kernels_set, kernels/cuda_device.h). */
    bool sm75;
    size_t workspace_bytes; /* scratch for strided copies, conversions and split
                               attention; 0 = 64 MiB */
    /* A tensor-parallel rank's communicator (engine/tp/comm.h): NCCL on the
     * devices, or the local kind through host memory (ranks that share a
     * GPU; not inside a recorded graph); NULL: a group of one. It must
     * outlive the backend. */
    struct eng_comm *comm;
};
inf_status_t eng_backend_cuda_create(const struct eng_backend_cuda_opts *opts,
                                     struct eng_backend **out, struct inf_err *err);
/* The cudaStream_t every op of a CUDA backend is queued on, for tools that
 * time its work with CUDA events; NULL for another backend or a build without
 * CUDA. The stream stays the backend's. Thread: owner. */
void *eng_backend_cuda_stream(const struct eng_backend *be);

#ifdef __cplusplus
}
#endif
