/* int4serve-bench-decode-step — where the time of a batch-1 decode step goes
 * on the CUDA backend.
 *
 *   int4serve-bench-decode-step --model DIR [--prompt P] [--steps N] [--no-engine]
 *       [--step-only] [--batch B] [--fp16] [--fp8-kv] [--tp T [--devices LIST]]
 *
 * B sequences (default 1; B a decode-graph bucket, above 1 with --step-only):
 * each a P-token prompt (default 128) prefilled, then N decode steps
 * (default 256) of one token a sequence, greedy, sampled on the GPU
 * (eng_model_forward_sample: the graph path of the scheduler's decode
 * steps). Reported:
 *   step       wall time of eng_model_forward_sample per decode step (graph
 *              replay, GPU sampling, the one download), mean and median; its
 *              host parts (before the replay, the launch call, the sample
 *              call, the wait in the download) and its GPU parts timed by
 *              events on the backend's stream (uploads, the replay, sampling);
 *   replay     the recorded graph launched back to back (GPU time of one
 *              replay) and launched then waited for, one at a time;
 *   ahead      decode steps as the scheduler queues them ahead (each
 *              submitted before the one before is collected, its tokens
 *              fed on the device), against steps one at a time at the same
 *              positions: wall time a step;
 *   prefill    the P-token prompt's prefill of one sequence (eager, its first
 *              token sampled and downloaded): the first one, then five more;
 *   ops        one decode step run eagerly with the stream held by a host
 *              callback until every op is queued, so the GPU runs them back
 *              to back as in a replay; an event after each op gives each op's
 *              GPU time (its kernels and the gaps before them), summed per
 *              kind (INT4 GEMMs per shape) over the step;
 *   no-GEMM    a second model whose INT4 linears are skipped (their outputs
 *              keep the prefill's values): its step and its replay, i.e.
 *              everything of a step that is not the INT4 GEMM;
 *   engine     the engine (scheduler thread, detokenizer, events) on its own
 *              backend generating N tokens for the same prompt: time per
 *              token after the first, against the model-level step; the
 *              difference is the scheduler's host time between steps.
 * --tp T (with --devices, else devices 0 .. T-1) runs the engine part alone,
 * at tp 1 and at tp T in the same call, and prints the ratio.
 * --no-engine skips the engine part; --step-only runs the step and replay
 * parts alone (one model load); --fp16 loads the model unquantized
 * (quantization none: every linear fp16); --fp8-kv keeps the KV cache in
 * fp8 (E4M3, engine.kv_cache_dtype = "fp8") instead of fp16.
 * Checkpoints come from int4serve-mkmodel (e.g. --preset llama2-7b, with
 * --layers L for a quick per-layer measurement). */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/eng.h"
#include "engine/model.h"

#include <cuda_runtime.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BLOCKS 64 /* 1024 positions */
#define MAX_EV 2048
#define MAX_SHAPES 16

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench-decode-step: %s: %s\n", what, msg);
    exit(1);
}

static void cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        die(what, cudaGetErrorString(e));
}

/* ---- a backend wrapper that times the CUDA backend's ops --------------------- */
enum kind {
    K_EMBED,
    K_NORM,
    K_ROPE,
    K_ATTN,
    K_SILU,
    K_LMHEAD,
    K_GATHER,
    K_SAMPLE,
    K_Q4 /* + shape index */
};
static const char *const kind_name[] = {
    "embedding",   "rmsnorm_add",
    "rope",        "attention (RoPE when held + KV write + attend)",
    "silu_mul",    "lm_head (cuBLAS fp16)",
    "rows_gather", "sample"};

enum wrap_mode { W_STEP, W_OPS, W_SKIP_Q4 };

struct wrap {
    struct eng_backend pub; /* first: the table's be is this */
    struct eng_backend_iface iface;
    struct eng_backend *inner;
    cudaStream_t stream;
    enum wrap_mode mode;
    bool armed; /* W_STEP / W_OPS: time the next step; W_SKIP_Q4: skip */
    /* W_OPS: one event after each op */
    cudaEvent_t ev[MAX_EV];
    int kinds[MAX_EV];
    int n_ev;
    int32_t shape_n[MAX_SHAPES], shape_k[MAX_SHAPES];
    int n_shapes;
    /* W_STEP: events and host times of one step */
    cudaEvent_t e_start, e_pre, e_post, e_samp;
    bool started;
    uint64_t t_launch0, t_launch1, t_samp0, t_samp1;
    uint64_t t_up, t_prep; /* host time inside buf_upload / graph_prepare */
    int n_up;
};

static struct wrap *W(struct eng_backend *be)
{
    return (struct wrap *)be;
}

static void op_done(struct wrap *w, int kind)
{
    if (w->mode != W_OPS || !w->armed || w->n_ev == 0 || w->n_ev >= MAX_EV)
        return;
    cuda_ok(cudaEventRecord(w->ev[w->n_ev], w->stream), "event");
    w->kinds[w->n_ev++] = kind;
}

static int shape_of(struct wrap *w, int32_t n, int32_t k)
{
    for (int i = 0; i < w->n_shapes; i++)
        if (w->shape_n[i] == n && w->shape_k[i] == k)
            return i;
    if (w->n_shapes == MAX_SHAPES)
        return MAX_SHAPES - 1;
    w->shape_n[w->n_shapes] = n;
    w->shape_k[w->n_shapes] = k;
    return w->n_shapes++;
}

static void w_destroy(struct eng_backend *be)
{
    (void)be; /* the inner backend is destroyed by main */
}

static inf_status_t w_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                             const void *src, size_t bytes, struct inf_err *err)
{
    struct wrap *w = W(be);
    if (w->mode == W_STEP && w->armed && !w->started) {
        cuda_ok(cudaEventRecord(w->e_start, w->stream), "event");
        w->started = true;
    }
    const uint64_t t0 = now_ns();
    inf_status_t s = w->inner->iface->buf_upload(w->inner, dst, off, src, bytes, err);
    if (w->mode == W_STEP && w->armed) {
        w->t_up += now_ns() - t0;
        w->n_up++;
    }
    return s;
}

static inf_status_t w_upload_many(struct eng_backend *be, const struct eng_upload *ups, int32_t n,
                                  struct inf_err *err)
{
    struct wrap *w = W(be);
    if (w->mode == W_STEP && w->armed && !w->started) {
        cuda_ok(cudaEventRecord(w->e_start, w->stream), "event");
        w->started = true;
    }
    const uint64_t t0 = now_ns();
    inf_status_t s = w->inner->iface->buf_upload_many(w->inner, ups, n, err);
    if (w->mode == W_STEP && w->armed) {
        w->t_up += now_ns() - t0;
        w->n_up += n;
    }
    return s;
}

static inf_status_t w_linear_q4(struct eng_backend *be, const struct eng_q4w *q,
                                const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                bool y_f32, int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    if (w->mode == W_SKIP_Q4 && w->armed)
        return INF_OK;
    inf_status_t s = w->inner->iface->linear_q4(w->inner, q, bias, x, y, y_f32, m, err);
    op_done(w, K_Q4 + shape_of(w, q->n, q->k));
    return s;
}

/* The gated MLP's fused gate/up with its SiLU·mul (the GEMM's GLU output):
 * an INT4 GEMM too, timed and skipped as one. */
static inf_status_t w_linear_q4_glu(struct eng_backend *be, const struct eng_q4w *q,
                                    struct eng_mat x, struct eng_mat tmp, struct eng_mat out,
                                    int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    if (w->mode == W_SKIP_Q4 && w->armed)
        return INF_OK;
    inf_status_t s = w->inner->iface->linear_q4_glu(w->inner, q, x, tmp, out, m, err);
    op_done(w, K_Q4 + shape_of(w, q->n, q->k));
    return s;
}

static inf_status_t w_linear_fp(struct eng_backend *be, const struct eng_buf *wt,
                                enum eng_wdtype wdt, int32_t n, int32_t k,
                                const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                bool y_f32, int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s = w->inner->iface->linear_fp(w->inner, wt, wdt, n, k, bias, x, y, y_f32, m, err);
    op_done(w, K_LMHEAD);
    return s;
}

static inf_status_t w_embedding(struct eng_backend *be, const struct eng_buf *table,
                                enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                                const struct eng_buf *ids, struct eng_mat out, int32_t m,
                                struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s = w->inner->iface->embedding(w->inner, table, wdt, vocab, dim, ids, out, m, err);
    op_done(w, K_EMBED);
    return s;
}

static inf_status_t w_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                  const struct eng_mat *delta, const struct eng_buf *wt,
                                  const struct eng_buf *perm, float eps, struct eng_mat out,
                                  int32_t dim, int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s =
        w->inner->iface->rmsnorm_add(w->inner, x, delta, wt, perm, eps, out, dim, m, err);
    op_done(w, K_NORM);
    return s;
}

static inf_status_t w_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                           int32_t head_dim, const struct eng_buf *pos,
                           const struct eng_rope_params *p, int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s = w->inner->iface->rope(w->inner, x, n_heads, head_dim, pos, p, m, err);
    op_done(w, K_ROPE);
    return s;
}

static inf_status_t w_attn_decode(struct eng_backend *be, const struct eng_attn_params *p,
                                  struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s = w->inner->iface->attn_decode(w->inner, p, err);
    op_done(w, K_ATTN);
    return s;
}

static inf_status_t w_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                               struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s = w->inner->iface->silu_mul(w->inner, gate, up, out, dim, m, err);
    op_done(w, K_SILU);
    return s;
}

static inf_status_t w_rows_gather(struct eng_backend *be, struct eng_mat x,
                                  const struct eng_buf *idx, struct eng_mat out, int32_t dim,
                                  int32_t m, struct inf_err *err)
{
    struct wrap *w = W(be);
    inf_status_t s = w->inner->iface->rows_gather(w->inner, x, idx, out, dim, m, err);
    op_done(w, K_GATHER);
    return s;
}

static inf_status_t w_sample(struct eng_backend *be, const struct eng_buf *logits,
                             int32_t n_logit_rows, int32_t vocab, const struct eng_sample_row *rows,
                             int32_t n, struct eng_buf *out, int32_t out_first, struct inf_err *err)
{
    struct wrap *w = W(be);
    bool st = w->mode == W_STEP && w->armed;
    if (st)
        w->t_samp0 = now_ns();
    inf_status_t s = w->inner->iface->sample(w->inner, logits, n_logit_rows, vocab, rows, n, out,
                                             out_first, err);
    if (st) {
        w->t_samp1 = now_ns();
        cuda_ok(cudaEventRecord(w->e_samp, w->stream), "event");
    }
    op_done(w, K_SAMPLE);
    return s;
}

/* Holds the stream while the host queues a profiled step. */
static void hold_stream(void *user)
{
    (void)user;
    struct timespec ts = {0, 30 * 1000000};
    nanosleep(&ts, NULL);
}

static inf_status_t w_graph_prepare(struct eng_backend *be, const struct eng_attn_params *p,
                                    int32_t bucket, const struct eng_upload *ups, int32_t n_ups,
                                    bool *have, struct inf_err *err)
{
    struct wrap *w = W(be);
    if (w->mode == W_STEP && w->armed && !w->started) {
        cuda_ok(cudaEventRecord(w->e_start, w->stream), "event");
        w->started = true;
    }
    const uint64_t t0 = now_ns();
    inf_status_t s = w->inner->iface->graph_prepare(w->inner, p, bucket, ups, n_ups, have, err);
    if (w->mode == W_STEP && w->armed) {
        w->t_prep += now_ns() - t0;
        w->n_up += n_ups; /* the step's tables go up with its work list */
    }
    if (s == INF_OK && w->mode == W_OPS && w->armed) {
        cuda_ok(cudaLaunchHostFunc(w->stream, hold_stream, NULL), "cudaLaunchHostFunc");
        cuda_ok(cudaEventRecord(w->ev[0], w->stream), "event");
        w->kinds[0] = -1;
        w->n_ev = 1;
    }
    return s;
}

static inf_status_t w_graph_launch(struct eng_backend *be, int32_t bucket, struct inf_err *err)
{
    struct wrap *w = W(be);
    bool st = w->mode == W_STEP && w->armed;
    if (st) {
        cuda_ok(cudaEventRecord(w->e_pre, w->stream), "event");
        w->t_launch0 = now_ns();
    }
    inf_status_t s = w->inner->iface->graph_launch(w->inner, bucket, err);
    if (st) {
        w->t_launch1 = now_ns();
        cuda_ok(cudaEventRecord(w->e_post, w->stream), "event");
    }
    return s;
}

static struct wrap *wrap_create(struct eng_backend *inner, enum wrap_mode mode)
{
    struct wrap *w = calloc(1, sizeof *w);
    if (!w)
        die("wrap", "out of memory");
    w->inner = inner;
    w->mode = mode;
    w->iface = *inner->iface;
    w->iface.destroy = w_destroy;
    w->iface.buf_upload = w_upload;
    w->iface.buf_upload_many = w_upload_many;
    /* Per-op timing and the step without its INT4 GEMMs go through the
     * plain ops: the blocks' composition (engine/blocks.c), each op
     * wrapped; a timed step keeps the backend's fused blocks. */
    if (mode != W_STEP) {
        w->iface.attn_block = NULL;
        w->iface.mlp_block = NULL;
    }
    w->iface.linear_q4 = w_linear_q4;
    if (inner->iface->linear_q4_glu)
        w->iface.linear_q4_glu = w_linear_q4_glu;
    w->iface.linear_fp = w_linear_fp;
    w->iface.embedding = w_embedding;
    w->iface.rmsnorm_add = w_rmsnorm_add;
    w->iface.rope = w_rope;
    w->iface.attn_decode = w_attn_decode;
    w->iface.silu_mul = w_silu_mul;
    w->iface.rows_gather = w_rows_gather;
    w->iface.sample = w_sample;
    w->iface.graph_prepare = w_graph_prepare;
    w->iface.graph_launch = w_graph_launch;
    w->pub = *inner;
    w->pub.iface = &w->iface;
    w->stream = (cudaStream_t)eng_backend_cuda_stream(inner);
    if (!w->stream)
        die("wrap", "not a CUDA backend");
    if (mode == W_OPS)
        for (int i = 0; i < MAX_EV; i++)
            cuda_ok(cudaEventCreate(&w->ev[i]), "cudaEventCreate");
    cudaEvent_t *e[] = {&w->e_start, &w->e_pre, &w->e_post, &w->e_samp};
    for (int i = 0; i < 4; i++)
        cuda_ok(cudaEventCreate(e[i]), "cudaEventCreate");
    return w;
}

static void wrap_destroy(struct wrap *w)
{
    if (!w)
        return;
    if (w->mode == W_OPS)
        for (int i = 0; i < MAX_EV; i++)
            cudaEventDestroy(w->ev[i]);
    cudaEventDestroy(w->e_start);
    cudaEventDestroy(w->e_pre);
    cudaEventDestroy(w->e_post);
    cudaEventDestroy(w->e_samp);
    free(w);
}

static double ev_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return ms;
}

/* ---- the sequences ------------------------------------------------------------- */
#define MAX_BATCH 128
static int32_t g_batch = 1; /* --batch: decode rows a step (a graph bucket) */

/* g_batch sequences; sequence k owns block-table row k and the KV blocks
 * k * MAX_BLOCKS .. (k + 1) * MAX_BLOCKS - 1. */
struct seq {
    int32_t bt[MAX_BATCH][MAX_BLOCKS];
    int32_t pos[MAX_BATCH];  /* tokens in the KV cache */
    int32_t next[MAX_BATCH]; /* the token to feed */
};

/* n tokens of sequence k (n > 1: a prefill chunk, alone in the batch), or,
 * with k < 0, one token of every sequence (a decode step). */
static inf_status_t run_step(eng_model_t *m, struct seq *s, int32_t k, const int32_t *toks,
                             int32_t n, struct inf_err *err)
{
    static int32_t pos[1024], slot[1024], tok[MAX_BATCH];
    static uint8_t want[1024];
    static struct eng_sample_row rows[MAX_BATCH];
    static struct eng_sample_out out[MAX_BATCH];
    const bool dec = k < 0;
    const int32_t nt = dec ? g_batch : n, nl = dec ? g_batch : 1;
    for (int32_t i = 0; i < nt; i++) {
        pos[i] = dec ? s->pos[i] : s->pos[k] + i;
        slot[i] = dec ? i : 0;
        want[i] = dec || i == n - 1;
        if (dec)
            tok[i] = s->next[i];
    }
    for (int32_t i = 0; i < nl; i++)
        rows[i] = (struct eng_sample_row){
            .logit_row = i, .temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    struct eng_batch b = {.n_tokens = nt,
                          .tokens = dec ? tok : toks,
                          .pos = pos,
                          .slot = slot,
                          .want_logits = want,
                          .n_logits = nl,
                          .block_table = dec ? &s->bt[0][0] : s->bt[k],
                          .n_slots = dec ? g_batch : 1,
                          .max_blocks = MAX_BLOCKS};
    inf_status_t st = eng_model_forward_sample(m, &b, rows, nl, out, err);
    if (st != INF_OK)
        return st;
    for (int32_t i = 0; i < nl; i++) {
        const int32_t q = dec ? i : k;
        s->pos[q] += dec ? 1 : n;
        s->next[q] = out[i].token >= 0 ? out[i].token : 1;
    }
    return INF_OK;
}

static void prefill(eng_model_t *m, struct seq *s, int32_t prompt)
{
    static int32_t ids[1024];
    struct inf_err err = {0};
    for (int32_t k = 0; k < g_batch; k++) {
        for (int32_t i = 0; i < MAX_BLOCKS; i++)
            s->bt[k][i] = k * MAX_BLOCKS + i;
        s->pos[k] = 0;
        for (int32_t i = 0; i < prompt; i++)
            ids[i] = 1 + (i + 7 * k) % 250;
        if (run_step(m, s, k, ids, prompt, &err) != INF_OK)
            die("prefill", err.msg);
    }
}

static bool g_fp16;   /* --fp16: the checkpoint's weights as they are (quantization none) */
static bool g_kv_fp8; /* --fp8-kv: the KV pools in E4M3 */

static eng_model_t *load(const char *dir, struct eng_backend *be, enum eng_graphs g)
{
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.max_tokens = 512;
    o.n_kv_blocks = MAX_BLOCKS * g_batch;
    o.max_slots = g_batch;
    o.max_seq_blocks = MAX_BLOCKS;
    o.decode_graphs = g;
    if (g_fp16)
        o.quant = ENG_QUANT_NONE;
    eng_model_t *m = NULL;
    struct inf_err err = {0};
    uint64_t t0 = now_ns();
    if (eng_model_load(dir, be, &o, &m, &err) != INF_OK)
        die("model", err.msg);
    printf("model loaded in %.1f s\n", (double)(now_ns() - t0) / 1e9);
    return m;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Wall time of n decode steps: mean and median in ms. */
static void decode_steps(eng_model_t *m, struct seq *s, int32_t n, double *mean, double *med)
{
    uint64_t *t = malloc(sizeof *t * (size_t)n);
    struct inf_err err = {0};
    uint64_t sum = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        if (run_step(m, s, -1, NULL, 1, &err) != INF_OK)
            die("decode", err.msg);
        t[i] = now_ns() - t0;
        sum += t[i];
    }
    qsort(t, (size_t)n, sizeof *t, cmp_u64);
    *mean = (double)sum / n / 1e6;
    *med = (double)t[n / 2] / 1e6;
    free(t);
}

/* n decode steps as the scheduler queues them ahead: each submitted before
 * the one before it is collected (eng_model_sample_submit), its tokens fed
 * on the device from that step's samples. Mean wall time a step, in ms:
 * what the device takes per step when the host never holds it. */
static double ahead_steps(eng_model_t *m, struct seq *s, int32_t n)
{
    static int32_t pos[MAX_BATCH], slot[MAX_BATCH], tok[MAX_BATCH], feed[MAX_BATCH];
    static uint8_t want[MAX_BATCH];
    static struct eng_sample_row rows[MAX_BATCH];
    static struct eng_sample_out out[MAX_BATCH];
    struct inf_err err = {0};
    for (int32_t i = 0; i < g_batch; i++) {
        slot[i] = i;
        want[i] = 1;
        feed[i] = i;
        tok[i] = s->next[i];
        rows[i] = (struct eng_sample_row){
            .logit_row = i, .temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    }
    struct eng_batch b = {.n_tokens = g_batch,
                          .tokens = tok,
                          .pos = pos,
                          .slot = slot,
                          .want_logits = want,
                          .n_logits = g_batch,
                          .block_table = &s->bt[0][0],
                          .n_slots = g_batch,
                          .max_blocks = MAX_BLOCKS};
    uint64_t t0 = now_ns();
    for (int32_t j = 0; j <= n; j++) {
        if (j < n) {
            for (int32_t i = 0; i < g_batch; i++)
                pos[i] = s->pos[i] + j;
            b.feed = j == 0 ? NULL : feed;
            if (eng_model_sample_submit(m, &b, rows, g_batch, &err) != INF_OK)
                die("submit", err.msg);
        }
        if (j > 0 && eng_model_sample_collect(m, out, &err) != INF_OK)
            die("collect", err.msg);
    }
    const double ms = (double)(now_ns() - t0) / 1e6 / n;
    for (int32_t i = 0; i < g_batch; i++) {
        s->pos[i] += n;
        s->next[i] = out[i].token >= 0 ? out[i].token : 1;
    }
    return ms;
}

/* The recorded graph of bucket g_batch replayed: back to back (ms of GPU per replay)
 * and one at a time with a wait (ms per launch + wait). */
static void replays(struct eng_backend *be, double *b2b, double *one)
{
    struct inf_err err = {0};
    struct eng_buf *tiny = NULL;
    int32_t v;
    if (eng_buf_alloc(be, 256, &tiny, &err) != INF_OK)
        die("alloc", err.msg);
    const int R = 200;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < R; i++) {
            if (eng_graph_launch(be, g_batch, &err) != INF_OK)
                die("graph launch", err.msg);
            if (pass == 1 && eng_buf_download(be, tiny, 0, &v, 4, &err) != INF_OK)
                die("download", err.msg);
        }
        if (eng_buf_download(be, tiny, 0, &v, 4, &err) != INF_OK)
            die("download", err.msg);
        double ms = (double)(now_ns() - t0) / 1e6 / R;
        *(pass == 0 ? b2b : one) = ms;
    }
    eng_buf_free(be, tiny);
}

/* ---- the engine ---------------------------------------------------------------- */
static void on_notify(void *user)
{
    (void)user;
}

/* The engine at tp ranks on devices[0..n_dev) (tp 1: the default device);
 * returns ms a token after the first. model_step > 0: the model-level step
 * it is compared with. */
static double engine_run(const char *dir, int32_t prompt, int32_t n, double model_step, int32_t tp,
                         const int32_t *devices, int32_t n_dev)
{
    struct eng_config cfg = {0};
    cfg.tp = tp;
    cfg.devices = tp > 1 ? devices : NULL;
    cfg.n_devices = tp > 1 ? n_dev : 0;
    cfg.backend = ENG_BACKEND_CUDA;
    cfg.model_dir = dir;
    cfg.max_batch = 8;
    cfg.max_batched_tokens = 512;
    cfg.max_model_len = prompt + n + 16;
    cfg.kv_cache_tokens = 4096;
    cfg.kv_cache_dtype = g_kv_fp8 ? ENG_KV_FP8 : ENG_KV_AUTO;
    cfg.quantization = ENG_QUANTIZATION_INT4;
    cfg.group_size = 128;
    cfg.fuse_qkv = true;
    cfg.max_queue = 8;
    eng_engine_t *eng = NULL;
    struct inf_err err = {0};
    uint64_t tl = now_ns();
    if (eng_engine_create(&cfg, on_notify, NULL, &eng, &err) != INF_OK)
        die("engine", err.msg);
    printf("engine (tp %d) loaded in %.1f s\n", tp, (double)(now_ns() - tl) / 1e9);
    double per = 0;
    for (int rep = 0; rep < 2; rep++) {
        struct eng_request *q = eng_request_create();
        q->id = 1 + (uint64_t)rep;
        q->n_prompt = prompt;
        q->prompt = malloc(sizeof(int32_t) * (size_t)prompt);
        for (int32_t i = 0; i < prompt; i++)
            q->prompt[i] = 1 + i % 250;
        q->max_tokens = n;
        q->sampling.temperature = 0.0f;
        q->sampling.top_p = 1.0f;
        q->sampling.ignore_eos = true;
        uint64_t t0 = now_ns(), t_done = 0, ttft = 0;
        int32_t got = 0;
        if (eng_request_submit(eng, q, &err) != INF_OK)
            die("submit", err.msg);
        while (!t_done) {
            struct eng_event *ev = eng_events_take(eng);
            while (ev) {
                struct eng_event *next = (struct eng_event *)(void *)ev->node.next;
                if (ev->kind == ENG_EV_DONE || ev->kind == ENG_EV_ERROR) {
                    if (ev->kind == ENG_EV_ERROR)
                        die("request", ev->msg);
                    t_done = now_ns();
                    ttft = ev->ttft_ns;
                    got = ev->completion_tokens;
                }
                eng_event_destroy(ev);
                ev = next;
            }
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if (rep == 1) {
            /* from the first token (the engine's TTFT) to the end, as seen
             * by this thread polling every 20 us */
            per = ((double)(t_done - t0) - (double)ttft) / 1e6 / (got > 1 ? got - 1 : 1);
            printf("engine (tp %d): %d tokens; first after %.2f ms; then %.3f ms a token (%.0f "
                   "tok/s)",
                   tp, got, (double)ttft / 1e6, per, 1e3 / per);
            if (model_step > 0)
                printf("; model-level step %.3f ms: the scheduler adds %.3f ms a step", model_step,
                       per - model_step);
            printf("\n");
        }
    }
    struct eng_stats st;
    eng_engine_stats(eng, &st);
    printf("engine steps: %llu\n", (unsigned long long)st.steps_total);
    eng_engine_destroy(eng);
    return per;
}

/* "0,1" into devices; the count, or -1. */
static int32_t parse_devices(const char *s, int32_t *devices, int32_t cap)
{
    int32_t n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 255)
            return -1;
        devices[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int32_t prompt = 128, steps = 256;
    bool engine = true, step_only = false;
    int32_t tp = 1, devices[16], n_dev = 0;
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"prompt", required_argument, 0, 'p'},
                                       {"steps", required_argument, 0, 'n'},
                                       {"no-engine", no_argument, 0, 'E'},
                                       {"step-only", no_argument, 0, 'S'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"fp16", no_argument, 0, 'F'},
                                       {"tp", required_argument, 0, 't'},
                                       {"devices", required_argument, 0, 'd'},
                                       {"fp8-kv", no_argument, 0, 'K'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            dir = optarg;
            break;
        case 'p':
            prompt = atoi(optarg);
            break;
        case 'n':
            steps = atoi(optarg);
            break;
        case 'E':
            engine = false;
            break;
        case 'S':
            step_only = true;
            engine = false;
            break;
        case 'b':
            g_batch = atoi(optarg);
            break;
        case 'F':
            g_fp16 = true;
            break;
        case 'K':
            g_kv_fp8 = true;
            break;
        case 't':
            tp = atoi(optarg);
            break;
        case 'd':
            n_dev = parse_devices(optarg, devices, 16);
            break;
        default:
            dir = NULL;
            prompt = 0;
        }
    }
    const bool bucket = g_batch <= MAX_BATCH && eng_model_graph_bucket(g_batch) == g_batch;
    if (!dir || prompt < 1 || prompt > 512 || steps < 8 || !bucket || (g_batch > 1 && !step_only) ||
        prompt + steps + 16 > MAX_BLOCKS * ENG_KV_BLOCK) {
        fprintf(stderr,
                "usage: int4serve-bench-decode-step --model DIR [--prompt P (1..512)] "
                "[--steps N (8.., P + N <= %d)] [--no-engine] [--step-only] [--fp16]\n"
                "       [--tp T [--devices 0,1,...]: the engine alone at tp 1 and at T]\n"
                "       [--batch B (a graph bucket: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128; "
                "above 1 with --step-only)]\n",
                MAX_BLOCKS * ENG_KV_BLOCK - 16);
        return 2;
    }
    if (tp < 1 || tp > 16 || n_dev < 0 || (n_dev > 0 && n_dev != tp)) {
        fprintf(stderr, "int4serve-bench-decode-step: --tp 1..16, --devices a list of tp ids\n");
        return 2;
    }
    inf_log_set_level(INF_LOG_WARN);
    if (tp > 1) {
        /* the engine alone, at tp 1 and at tp ranks, in this one call */
        if (n_dev == 0)
            for (n_dev = 0; n_dev < tp; n_dev++)
                devices[n_dev] = n_dev;
        double one = engine_run(dir, prompt, steps, 0, 1, NULL, 0);
        double par = engine_run(dir, prompt, steps, 0, tp, devices, n_dev);
        printf("tp %d against tp 1: %.3f / %.3f ms a token, %.2fx\n", tp, par, one, one / par);
        return 0;
    }
    struct inf_err err = {0};
    struct eng_backend *be1 = NULL, *be2 = NULL;
    const struct eng_backend_cuda_opts bo = {.kv_fp8 = g_kv_fp8};
    if (eng_backend_cuda_create(&bo, &be1, &err) != INF_OK ||
        eng_backend_cuda_create(&bo, &be2, &err) != INF_OK)
        die("backend", err.msg);
    struct wrap *wa = wrap_create(be1, W_STEP), *wb = wrap_create(be1, W_OPS),
                *wc = wrap_create(be2, W_SKIP_Q4);
    eng_model_t *ma = load(dir, &wa->pub, ENG_GRAPHS_ON);
    const struct eng_model_config *cfg = eng_model_config(ma);
    printf("model: hidden %d, intermediate %d, layers %d, heads %d/%d, vocab %d; prompt %d, "
           "%d decode steps of %d sequences; KV cache %s\n",
           cfg->hidden, cfg->intermediate, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->vocab,
           prompt, steps, g_batch, eng_kv_dtype_name(be1->kv_dtype));

    /* 1. the step as the scheduler runs it */
    static struct seq sa, sb, sc, s2;
    uint64_t t_pre = now_ns();
    prefill(ma, &sa, prompt);
    const double prefill_cold = (double)(now_ns() - t_pre) / 1e6 / g_batch;
    double mean, med;
    decode_steps(ma, &sa, 8, &mean, &med); /* records the graph, warms up */
    decode_steps(ma, &sa, steps, &mean, &med);
    printf("\nstep (eng_model_forward_sample, graph replay): mean %.3f ms, median %.3f ms "
           "(%.0f tok/s at the median)\n",
           mean, med, 1e3 * g_batch / med);
    /* its parts, over 32 steps */
    double h_pre = 0, h_launch = 0, h_samp = 0, h_wait = 0, g_up = 0, g_graph = 0, g_samp = 0;
    wa->t_up = wa->t_prep = 0;
    wa->n_up = 0;
    const int NP = 32;
    for (int i = 0; i < NP; i++) {
        wa->armed = true;
        wa->started = false;
        uint64_t t0 = now_ns();
        if (run_step(ma, &sa, -1, NULL, 1, &err) != INF_OK)
            die("decode", err.msg);
        uint64_t t1 = now_ns();
        wa->armed = false;
        cuda_ok(cudaEventSynchronize(wa->e_samp), "sync");
        h_pre += (double)(wa->t_launch0 - t0) / 1e6;
        h_launch += (double)(wa->t_launch1 - wa->t_launch0) / 1e6;
        h_samp += (double)(wa->t_samp1 - wa->t_samp0) / 1e6;
        h_wait += (double)(t1 - wa->t_samp1) / 1e6;
        g_up += ev_ms(wa->e_start, wa->e_pre);
        g_graph += ev_ms(wa->e_pre, wa->e_post);
        g_samp += ev_ms(wa->e_post, wa->e_samp);
    }
    printf("  host: %.3f ms planning + uploads + graph_prepare, %.3f ms cudaGraphLaunch, "
           "%.3f ms sample call, %.3f ms download (wait)\n",
           h_pre / NP, h_launch / NP, h_samp / NP, h_wait / NP);
    printf("  host, before the launch: %.1f uploads taking %.3f ms, graph_prepare %.3f ms\n",
           (double)wa->n_up / NP, (double)wa->t_up / 1e6 / NP, (double)wa->t_prep / 1e6 / NP);
    printf("  GPU (events on the stream): %.3f ms first upload to replay start, %.3f ms replay, "
           "%.3f ms sampling (uploads + kernels)\n",
           g_up / NP, g_graph / NP, g_samp / NP);
    double b2b, one;
    replays(be1, &b2b, &one);
    printf("replay: %.3f ms back to back (GPU time), %.3f ms launch + wait\n", b2b, one);
    if (eng_model_can_submit(ma)) {
        /* one step at a time and queued ahead, alternating at the same
         * positions (attention grows with them) */
        for (int round = 0; round < 2; round++) {
            int32_t na = 48;
            if (sa.pos[0] + 2 * na > MAX_BLOCKS * ENG_KV_BLOCK) /* the KV room left */
                break;
            double pm, pmed;
            decode_steps(ma, &sa, na, &pm, &pmed);
            const double ah = ahead_steps(ma, &sa, na);
            printf("positions %d..: one at a time %.3f ms a step (mean), queued ahead %.3f ms "
                   "(%.0f tok/s), %d steps each\n",
                   sa.pos[0] - 2 * na, pm, ah, 1e3 * g_batch / ah, na);
        }
    }
    {
        /* the prompt's prefill (one chunk, eager, its first token sampled
         * and downloaded), first and warm: the model's part of a TTFT */
        double best = 1e30, sum = 0;
        const int NPF = 5;
        for (int i = 0; i < NPF; i++) {
            t_pre = now_ns();
            prefill(ma, &s2, prompt);
            const double t = (double)(now_ns() - t_pre) / 1e6 / g_batch;
            sum += t;
            best = t < best ? t : best;
        }
        printf("prefill of %d tokens (eng_model_forward_sample, one sequence): first %.3f ms, "
               "then mean %.3f ms, best %.3f ms\n",
               prompt, prefill_cold, sum / NPF, best);
    }
    if (step_only) {
        eng_model_destroy(ma);
        wrap_destroy(wa);
        wrap_destroy(wb);
        wrap_destroy(wc);
        eng_backend_destroy(be1);
        eng_backend_destroy(be2);
        return 0;
    }

    /* 2. per-op GPU time, eagerly, the stream held until all is queued */
    eng_model_t *mb = load(dir, &wb->pub, ENG_GRAPHS_EAGER);
    prefill(mb, &sb, prompt);
    decode_steps(mb, &sb, 4, &mean, &med);
    double eager_mean = mean;
    double per_kind[K_Q4 + MAX_SHAPES] = {0};
    int count_kind[K_Q4 + MAX_SHAPES] = {0};
    double ops_total = 0;
    const int NO = 8;
    for (int i = 0; i < NO; i++) {
        wb->armed = true;
        if (run_step(mb, &sb, -1, NULL, 1, &err) != INF_OK)
            die("decode", err.msg);
        wb->armed = false;
        for (int e = 1; e < wb->n_ev; e++) {
            double ms = ev_ms(wb->ev[e - 1], wb->ev[e]);
            per_kind[wb->kinds[e]] += ms / NO;
            count_kind[wb->kinds[e]]++;
            ops_total += ms / NO;
        }
    }
    printf("\nops (eager, queued ahead; GPU time per step; eager step wall %.3f ms):\n",
           eager_mean);
    printf("| op | calls a step | ms a step | us a call |\n| --- | ---: | ---: | ---: |\n");
    double q4_total = 0;
    for (int k = 0; k < K_Q4 + wb->n_shapes; k++) {
        if (!count_kind[k])
            continue;
        int calls = count_kind[k] / NO;
        char name[96];
        if (k >= K_Q4) {
            snprintf(name, sizeof name, "INT4 GEMM N %d K %d", wb->shape_n[k - K_Q4],
                     wb->shape_k[k - K_Q4]);
            q4_total += per_kind[k];
        } else {
            snprintf(name, sizeof name, "%s", kind_name[k]);
        }
        printf("| %s | %d | %.3f | %.2f |\n", name, calls, per_kind[k],
               1e3 * per_kind[k] / (calls ? calls : 1));
    }
    printf("| all ops | | %.3f | |\n| all but the INT4 GEMM | | %.3f | |\n", ops_total,
           ops_total - q4_total);
    printf(
        "per layer without the GEMM: %.2f us (%d layers)\n",
        1e3 * (ops_total - q4_total - per_kind[K_EMBED] - per_kind[K_LMHEAD] - per_kind[K_SAMPLE]) /
            cfg->n_layers,
        cfg->n_layers);

    /* 3. everything but the INT4 GEMM, replayed */
    eng_model_t *mc = load(dir, &wc->pub, ENG_GRAPHS_ON);
    prefill(mc, &sc, prompt);
    wc->armed = true; /* from here on the INT4 linears do nothing */
    decode_steps(mc, &sc, 8, &mean, &med);
    decode_steps(mc, &sc, steps, &mean, &med);
    double nb2b, none;
    replays(be2, &nb2b, &none);
    printf("\nno-GEMM step: mean %.3f ms, median %.3f ms; replay %.3f ms back to back, %.3f ms "
           "launch + wait\n",
           mean, med, nb2b, none);
    double model_step = 0;
    {
        eng_model_destroy(mc);
        eng_model_destroy(mb);
        prefill(ma, &s2, prompt);
        decode_steps(ma, &s2, steps, &mean, &med);
        model_step = med;
    }
    eng_model_destroy(ma);
    wrap_destroy(wa);
    wrap_destroy(wb);
    wrap_destroy(wc);
    eng_backend_destroy(be1);
    eng_backend_destroy(be2);
    if (engine)
        engine_run(dir, prompt, steps, model_step, 1, NULL, 0);
    return 0;
}
