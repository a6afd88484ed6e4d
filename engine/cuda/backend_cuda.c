/* engine/cuda/backend_cuda.c — the CUDA backend: fp16 activations and KV on one
 * GPU, behind the same table as the CPU reference (engine/backend.h).
 *
 * Memory plan. Everything on the device is taken at creation or while the
 * model loads, never on a step:
 *   creation  the workspace (opts.workspace_bytes, default 64 MiB): two
 *             attention work-list regions (decode, prefill) and a scratch
 *             region that each op reuses from its start (strided copies,
 *             fp32 staging of fp32 linears, split-attention partials, fp16
 *             biases); cuBLAS's workspace (32 MiB, handed to cuBLAS so it
 *             never allocates); a 20 KiB block for the error flag, the
 *             RoPE frequencies and the decode attention's arrival counters
 *             (zero, and left zero by every launch); 16 MiB of pinned host
 *             staging for uploads and downloads.
 *   loading   buffers (cudaMalloc per buffer), repacked INT4 weights, and the
 *             INT4 GEMM's workspace, grown to the largest layer's need.
 * Ordering. Every op is queued on the backend's stream; uploads go through
 * the pinned staging ring (the host bytes are copied at once, the transfer
 * is asynchronous); buf_download waits for the stream, which is also when
 * the ring is recycled and the device error flag is read.
 * Index buffers. Token ids, positions, sequence and block tables are
 * uploaded by the caller; small buffers keep a host copy of what was
 * uploaded (dropped for good once a kernel writes the buffer), so tables
 * are validated and attention work lists built on the host exactly as the
 * CPU backend does. Kernels still never follow an out-of-range index: they
 * write zeros and raise the device error flag, reported at the next
 * download as INF_E_INVALID.
 * Errors. Every CUDA and cuBLAS call is checked; a failure answers
 * INF_E_DEVICE with the call's message and marks the backend failed, so
 * every later call answers INF_E_DEVICE (the engine turns unhealthy). */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/batch.h"
#include "engine/par.h"
#include "engine/weights/quant.h"
#include "kernels/activation_cuda.h"
#include "kernels/attn_cuda.h"
#include "kernels/embedding_cuda.h"
#include "kernels/gemv_cuda.h"
#include "kernels/int4_gemm.h"
#include "kernels/norm_cuda.h"
#include "kernels/rope.h"
#include "kernels/rope_cuda.h"
#include "kernels/sample_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_WORKSPACE ((size_t)64 << 20)
#define BLAS_WORKSPACE ((size_t)32 << 20)
#define STAGING_BYTES ((size_t)16 << 20)
#define UP_MAX 16                     /* buf_upload copies held for one batch */
#define SHADOW_MAX ((size_t)16 << 20) /* buffers up to this size keep a host copy */
#define GEMM_MAX_M 4096               /* rows per INT4 GEMM launch */
#define ACC_MAX_M 16                  /* rows of a deferred linear (fixed-point sums) */
/* Rows up to which the gate/up linear of a decode step ends with its sums
 * as words (glu_acc). 32-layer Llama-2-7B replay on the H200 (23:19-23:23 UTC,
 * INT4SERVE_CUDA_ACC64 2 against 1, alternating): 1 row 1.852 -> 1.811
 * ms, 2 rows 2.031 -> 2.018, 4 rows 2.143 -> 2.126, but 8 rows 2.448 ->
 * 2.482 and 16 rows 3.131 -> 3.122 (docs/gemm-notes.md, version 42). */
#define GLU_ACC_MAX_M 4
/* Rows up to which the q/k/v linear of a decode step ends with its sums as
 * words that the decode attention reads itself (qkv_acc_max_m; at most
 * ACC_MAX_M). 32-layer Llama-2-7B replay on the H200 (2026-12-01 12:26 and
 * 12:30 UTC, off / on, alternating): 1 row 1.863 / 1.862 -> 1.798 / 1.795
 * ms, 2 rows 2.148 / 2.149 -> 2.092 / 2.093, 4 rows 2.383 / 2.383 -> 2.333
 * / 2.333, 8 rows 2.754 -> 2.667, 16 rows 3.484 -> 3.431. */
#define QKV_ACC_MAX_M ACC_MAX_M
#define DEQUANT_MIN_M 896             /* rows from which INT4 linears use fp16 cuBLAS */
#define SMALL_BYTES 4096              /* error flag, RoPE frequencies */
#define ATTN_COUNTERS 4096            /* arrival counters of split decode groups */
#define SAMPLE_ROWS 32                /* rows of one sampling launch */
#define GRAPH_MAX 16                  /* recorded decode buckets */

_Static_assert(SAMPLE_ROWS <= KRN_SAMPLE_GREEDY_ROWS, "a launch's rows fit the greedy kernel's");

/* The device writes struct krn_cuda_sample_out; the engine reads it as
 * struct eng_sample_out: one layout. */
_Static_assert(sizeof(struct eng_sample_out) == sizeof(struct krn_cuda_sample_out) &&
                   ENG_SAMPLE_TOP == KRN_SAMPLE_TOP &&
                   offsetof(struct eng_sample_out, top_logprobs) ==
                       offsetof(struct krn_cuda_sample_out, top_logprobs),
               "sample result layouts differ");

struct cu_buf {
    struct eng_buf pub;
    uint8_t *shadow;  /* host copy of the uploaded bytes, or NULL */
    bool shadow_dead; /* a kernel wrote the buffer: no host copy from now on */
};

struct cu_q4 {
    struct eng_q4w pub;
    struct krn_int4_gemm_layout lay;
    struct krn_int4_gemm_plan plan; /* its launches on this device */
    void *dev; /* repacked weight */
    bool glu;  /* [gate; up] in the GLU column order (cu_weight_q4_create_glu) */
};

/* One cached attention work list: the bytes last uploaded to its region. */
struct list_cache {
    uint8_t *dev;
    uint8_t *host;
    size_t bytes;
};

/* Where the parts of an uploaded work list lie. A fixed-shape (decode
 * graph) list ends with the pool row of each of its rows (-1 for padding
 * rows) at map_off, for the fused RoPE + KV write; map_off is 0 otherwise. */
struct attn_layout {
    int32_t n_kv, n_items, n_groups;
    int32_t impl; /* the attention implementation the list was built for */
    size_t kv_bytes, items_bytes, bytes, map_off;
};

/* A RoPE call held back until the next op: the decode attention that
 * follows it fuses the rotation with its KV write (one kernel instead of
 * two); any other op launches it first as it is. */
struct rope_call {
    uint16_t *x;
    int64_t ldx;
    int32_t n_heads, head_dim, m;
    const int32_t *pos;
};

struct cu_ctx {
    int device;
    int sms;
    struct krn_cuda_device gpu; /* what the INT4 GEMM plans are made for */
    cudaStream_t stream;
    cublasHandle_t blas;
    bool failed;
    char fail_msg[512];
    /* device memory taken at creation */
    uint8_t *ws;
    size_t ws_bytes;
    struct list_cache lists[2]; /* decode, prefill */
    size_t list_bytes;
    uint8_t *scratch;
    size_t scratch_bytes;
    void *blas_ws;
    uint8_t *small; /* error flag at 0, inv_freq at 256, counters at SMALL_BYTES */
    int32_t *d_bad;
    int32_t *d_group_done;
    float *d_inv_freq;
    /* INT4 GEMM workspace, grown at load */
    void *gemm_ws;
    size_t gemm_ws_bytes;
    /* Large M: an INT4 layer is dequantized to fp16 here once and multiplied
     * by cuBLAS (deq_min_m rows or more; 0: never). Grown at load to the
     * largest INT4 layer. */
    uint16_t *deq;
    size_t deq_bytes;
    /* Two buffers of [ACC_MAX_M][largest n] int64: the fixed-point sums of
     * an INT4 linear of at most ACC_MAX_M rows of a fixed-shape decode step
     * left for the RMSNorm after it (the o and down projections;
     * KRN_INT4_GEMM_ACC64). The linears alternate between them (acc_next),
     * each zeroing the other's words (acc_dirty of them, already read) as
     * it runs; the step's last words are zeroed at its end (acc_clean), so
     * both are zero between steps, which a recorded graph relies on.
     * acc_held: sums wait for their reader in buffer held_buf; any other op
     * first writes them to held_c (acc_flush). INT4SERVE_CUDA_ACC64=0 turns
     * it off. */
    void *acc64;
    size_t acc64_bytes;
    /* glu_acc: the gated MLP's gate/up linear of such a step also ends with
     * its sums (in buffer acc_next, which is zero), finished at once by
     * krn_int4_gemm_acc_reduce_glu, which zeroes them again: no split-K
     * tail in that GEMM (INT4SERVE_CUDA_ACC64=2 keeps it). */
    bool defer_acc, glu_acc, acc_held;
    /* The q/k/v linear of such a step of at most qkv_acc_max_m rows (a
     * linear of qkv_n columns reading the last RMSNorm's output; qkv_n is
     * learned from the first decode attention that fuses RoPE) also ends
     * with its sums, which the attention reads itself
     * (krn_cuda_attn_params.q_words): no split-K tail and no C.
     * acc_for_attn marks held sums of that kind, which the RoPE op between
     * them keeps. INT4SERVE_CUDA_QKV_WORDS=N sets the rows (0: off). */
    bool acc_for_attn;
    int32_t qkv_acc_max_m, qkv_n;
    int32_t acc_next, held_buf;
    int64_t acc_dirty[2];
    uint16_t *held_c;
    int64_t held_ldc;
    int32_t held_m, held_n;
    /* the last RMSNorm's width and output: a linear of that width whose
     * input is not that output is an o or down projection */
    int32_t norm_dim;
    const struct eng_buf *norm_out;
    int32_t deq_min_m;
    /* pinned staging */
    uint8_t *staging;
    size_t staging_used;
    /* buf_upload's copies, held until the next op that queues other work
     * and then issued as one batch (cudaMemcpyBatchAsync): the small tables
     * of a step go as one operation of the stream instead of one each.
     * INT4SERVE_CUDA_UPLOAD_BATCH=0 issues each at once. */
    bool up_batch;
    /* fp16 linears of one row (KRN_GEMV_MAX_M) by krn_cuda_gemv_f16
     * instead of cuBLAS; INT4SERVE_CUDA_GEMV=0: cuBLAS always */
    bool gemv;
    /* launches of plain greedy rows by krn_cuda_sample_greedy (many blocks
     * a row, nothing uploaded); INT4SERVE_CUDA_GREEDY=0: krn_cuda_sample */
    bool greedy;
    int n_up;
    void *up_dst[UP_MAX];
    const void *up_src[UP_MAX];
    size_t up_size[UP_MAX];
    /* queued downloads (download_start / download_wait): per slot pinned
     * memory, the error flag word first (at 0) and the bytes at 256, and an
     * event after the copies */
    uint8_t *land[2];
    size_t land_cap[2], land_bytes[2];
    cudaEvent_t land_ev[2];
    bool land_busy[2];
    /* RoPE frequencies now on the device */
    bool inv_valid;
    struct eng_rope_params inv_params;
    int32_t inv_head_dim;
    /* host scratch for work lists (grows) */
    uint8_t *h_list;
    size_t h_list_cap;
    /* sampling: device workspace (taken at load), host staging of a launch's
     * rows and lists (grows) */
    void *sample_ws;
    size_t sample_ws_bytes;
    int32_t sample_vocab;
    struct krn_cuda_sample_row h_rows[SAMPLE_ROWS];
    int32_t *h_ints;
    float *h_vals;
    size_t h_lists_cap;
    /* decode graphs: the fixed-shape list of the step being prepared, the
     * recording in progress, the recorded buckets */
    bool fx_active;
    struct attn_layout fx;
    int32_t fx_rows;
    bool fuse_rope_kv; /* INT4SERVE_CUDA_FUSE_ROPE_KV=0 turns the fusion off */
    bool rope_in_attn; /* ... into the decode attention; INT4SERVE_CUDA_ROPE_IN_ATTN=0: its own kernel */
    bool rope_held;
    struct rope_call rope;
    bool capturing;
    int32_t n_graphs;
    int32_t graph_key[GRAPH_MAX];
    cudaGraphExec_t graph_exec[GRAPH_MAX];
};

static struct cu_ctx *ctx_of(struct eng_backend *be)
{
    return be->ctx;
}

/* ---- errors -------------------------------------------------------------- */
static inf_status_t cu_fail(struct cu_ctx *c, const char *what, const char *msg,
                            struct inf_err *err)
{
    if (!c->failed) {
        c->failed = true;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%.100s: %.300s", what, msg);
        inf_log(ERROR, "CUDA backend failed: %s: %s", what, msg);
    }
    return inf_err_set(err, INF_E_DEVICE, "CUDA %s: %s", what, msg);
}

#define CU(c, call, what)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cu_fail(c, what, cudaGetErrorString(e_), err);                                  \
    } while (0)

static const char *blas_msg(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cuBLAS not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "cuBLAS allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "cuBLAS invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "cuBLAS architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "cuBLAS execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "cuBLAS operation not supported";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "cuBLAS internal error";
    default:
        return "cuBLAS error";
    }
}

#define BLAS(c, call, what)                                                                        \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return cu_fail(c, what, blas_msg(s_), err);                                            \
    } while (0)

/* A launcher's status: INF_E_DEVICE marks the backend failed, others
 * (unsupported shapes) are passed on as they are. */
static inf_status_t kst(struct cu_ctx *c, inf_status_t st, const struct inf_err *le,
                        struct inf_err *err)
{
    if (st == INF_OK)
        return INF_OK;
    if (st == INF_E_DEVICE)
        return cu_fail(c, "kernel", le->msg, err);
    return inf_err_set(err, st, "%s", le->msg);
}

#define KRN(c, call)                                                                               \
    do {                                                                                           \
        struct inf_err le_ = {0};                                                                  \
        struct inf_err *lep_ = &le_;                                                               \
        inf_status_t st_ = (call);                                                                 \
        if (st_ != INF_OK)                                                                         \
            return kst(c, st_, lep_, err);                                                         \
    } while (0)

/* Launch a held RoPE call as it is. */
static inf_status_t rope_flush(struct cu_ctx *c, struct inf_err *err)
{
    if (!c->rope_held)
        return INF_OK;
    c->rope_held = false;
    const struct rope_call *r = &c->rope;
    KRN(c, krn_cuda_rope(r->x, r->ldx, r->n_heads, r->head_dim, r->pos, c->d_inv_freq, r->m,
                         c->stream, lep_));
    return INF_OK;
}

/* Buffer i of the fixed-point sums. */
static int64_t *acc_buf(const struct cu_ctx *c, int32_t i)
{
    return (int64_t *)c->acc64 + (size_t)i * (c->acc64_bytes / 16);
}

/* Write held fixed-point sums to their C (the reduce zeroes them). */
static inf_status_t acc_flush(struct cu_ctx *c, struct inf_err *err)
{
    if (!c->acc_held)
        return INF_OK;
    c->acc_held = false;
    c->acc_dirty[c->held_buf] = 0;
    KRN(c, krn_int4_gemm_acc_reduce(acc_buf(c, c->held_buf), c->held_c, c->held_ldc, c->held_m,
                                    c->held_n, c->stream, lep_));
    return INF_OK;
}

/* Zero buffer i's words left by a linear (dirty). */
static inf_status_t acc_zero(struct cu_ctx *c, int32_t i, struct inf_err *err)
{
    if (c->acc_dirty[i] > 0)
        CU(c,
           cudaMemsetAsync(acc_buf(c, i), 0, (size_t)c->acc_dirty[i] * sizeof(int64_t), c->stream),
           "zeroing the GEMM sums");
    c->acc_dirty[i] = 0;
    return INF_OK;
}

/* Zero whatever words are left: the end of a step, after which both buffers
 * are zero (what a graph replay finds). Nothing may be held. */
static inf_status_t acc_clean(struct cu_ctx *c, struct inf_err *err)
{
    inf_status_t st = acc_zero(c, 0, err);
    if (st == INF_OK)
        st = acc_zero(c, 1, err);
    c->acc_next = 0;
    return st;
}

/* Start of every op: refuse after a failure, make the backend's device
 * current on this thread (the engine thread may differ from the creator),
 * launch a held RoPE call unless keep_rope (the decode attention, which may
 * fuse it) and write held GEMM sums unless keep_acc (the RMSNorm, which may
 * read them). */
/* Issue the held buf_upload copies (in one batch when more than one). */
static inf_status_t up_flush(struct cu_ctx *c, struct inf_err *err)
{
    const int n = c->n_up;
    if (n == 0)
        return INF_OK;
    c->n_up = 0;
    if (n == 1) {
        CU(c,
           cudaMemcpyAsync(c->up_dst[0], c->up_src[0], c->up_size[0], cudaMemcpyHostToDevice,
                           c->stream),
           "upload");
        return INF_OK;
    }
    struct cudaMemcpyAttributes at;
    memset(&at, 0, sizeof at);
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
    CU(c,
       cudaMemcpyBatchAsync(c->up_dst, c->up_src, c->up_size, (size_t)n, &at, &idx, 1, c->stream),
       "batched upload");
    return INF_OK;
}

/* keep_up: buf_upload's own entry, which adds to the held copies. */
static inf_status_t enter3(struct cu_ctx *c, bool keep_rope, bool keep_acc, bool keep_up,
                           struct inf_err *err)
{
    if (c->failed)
        return inf_err_set(err, INF_E_DEVICE, "the CUDA backend failed earlier (%s)", c->fail_msg);
    int cur = -1;
    CU(c, cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != c->device)
        CU(c, cudaSetDevice(c->device), "cudaSetDevice");
    /* Held copies go before anything else is queued. buf_upload (keep_up)
     * adds to them; the sums or RoPE its entry may flush below were held by
     * an op before the first held copy (whose own entry flushed them), so
     * queueing them now keeps the order. */
    inf_status_t st = keep_up ? INF_OK : up_flush(c, err);
    if (st != INF_OK)
        return st;
    st = keep_acc ? INF_OK : acc_flush(c, err);
    if (st == INF_OK && !keep_rope)
        st = rope_flush(c, err);
    return st;
}

static inf_status_t enter2(struct cu_ctx *c, bool keep_rope, bool keep_acc, struct inf_err *err)
{
    return enter3(c, keep_rope, keep_acc, false, err);
}

static inf_status_t enter(struct cu_ctx *c, bool keep_rope, struct inf_err *err)
{
    return enter2(c, keep_rope, false, err);
}

#define ENTER(c)                                                                                   \
    do {                                                                                           \
        inf_status_t en_ = enter(c, false, err);                                                   \
        if (en_ != INF_OK)                                                                         \
            return en_;                                                                            \
    } while (0)

/* ---- buffers -------------------------------------------------------------- */
static struct cu_buf *cbuf(const struct eng_buf *b)
{
    return b->impl;
}

/* A kernel (or a device copy) writes b: its host copy no longer mirrors it. */
static void written(const struct eng_buf *b)
{
    struct cu_buf *cb = cbuf(b);
    free(cb->shadow);
    cb->shadow = NULL;
    cb->shadow_dead = true;
}

/* b is read as a weight (never an index table): its host copy is not
 * needed. */
static void weight_seen(const struct eng_buf *b)
{
    if (b && cbuf(b)->shadow)
        written(b);
}

/* The uploaded bytes of b, or NULL when they are not known on the host. */
static const void *shadow_of(const struct eng_buf *b)
{
    return cbuf(b)->shadow;
}

static void *dptr(struct eng_mat v, size_t esz)
{
    return (uint8_t *)v.buf->ptr + (size_t)v.off * esz;
}

static inf_status_t cu_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                                 struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    struct cu_buf *b = calloc(1, sizeof *b);
    if (!b)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        free(b);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError(); /* not sticky: clear it */
            return inf_err_set(err, INF_E_NOMEM, "out of GPU memory allocating %zu bytes", bytes);
        }
        return cu_fail(c, "cudaMalloc", cudaGetErrorString(e), err);
    }
    b->pub.ptr = p;
    b->pub.size = bytes;
    b->pub.impl = b;
    *out = &b->pub;
    return INF_OK;
}

static void cu_buf_free(struct eng_backend *be, struct eng_buf *buf)
{
    struct cu_ctx *c = ctx_of(be);
    struct cu_buf *b = cbuf(buf);
    if (c->acc_held && (uint8_t *)c->held_c >= (uint8_t *)buf->ptr &&
        (uint8_t *)c->held_c < (uint8_t *)buf->ptr + buf->size) {
        c->acc_held = false; /* nobody can read that C now; zero the sums */
        struct inf_err e = {0};
        if (cudaSetDevice(c->device) == cudaSuccess)
            (void)acc_clean(c, &e);
    }
    if (cudaSetDevice(c->device) == cudaSuccess) {
        struct inf_err e = {0};
        (void)up_flush(c, &e);    /* a held copy may write it */
        (void)cudaFree(buf->ptr); /* implicitly waits for work that uses it */
    }
    free(b->shadow);
    free(b);
}

/* Wait for the stream; recycles the staging ring. */
static inf_status_t cu_sync(struct cu_ctx *c, struct inf_err *err)
{
    if (c->capturing)
        return inf_err_set(err, INF_E_UNSUPPORTED, "a synchronization while recording a graph");
    inf_status_t st = up_flush(c, err);
    if (st != INF_OK)
        return st;
    CU(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    c->staging_used = 0;
    return INF_OK;
}

/* Queue a host-to-device copy of src through the staging ring (src may be
 * reused at once); hold: add it to the held copies instead (up_flush). */
static inf_status_t stage_upload2(struct cu_ctx *c, void *dst, const void *src, size_t bytes,
                                  bool hold, struct inf_err *err)
{
    /* A recorded copy would read the staging bytes of the recording at
     * every replay. */
    if (c->capturing)
        return inf_err_set(err, INF_E_UNSUPPORTED, "an upload while recording a graph");
    if (bytes > STAGING_BYTES) {
        /* Large uploads happen while loading: a plain synchronous copy. */
        inf_status_t st = up_flush(c, err);
        if (st != INF_OK)
            return st;
        CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
        return cu_sync(c, err);
    }
    if (c->staging_used + bytes > STAGING_BYTES) {
        inf_status_t st = cu_sync(c, err);
        if (st != INF_OK)
            return st;
    }
    uint8_t *s = c->staging + c->staging_used;
    memcpy(s, src, bytes);
    c->staging_used += (bytes + 255) / 256 * 256;
    if (hold && c->n_up == UP_MAX) {
        inf_status_t st = up_flush(c, err);
        if (st != INF_OK)
            return st;
    }
    if (hold) {
        c->up_dst[c->n_up] = dst;
        c->up_src[c->n_up] = s;
        c->up_size[c->n_up++] = bytes;
        return INF_OK;
    }
    CU(c, cudaMemcpyAsync(dst, s, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
    return INF_OK;
}

static inf_status_t stage_upload(struct cu_ctx *c, void *dst, const void *src, size_t bytes,
                                 struct inf_err *err)
{
    return stage_upload2(c, dst, src, bytes, false, err);
}

static inf_status_t cu_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                                  const void *src, size_t bytes, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    inf_status_t en = enter3(c, false, false, c->up_batch, err);
    if (en != INF_OK)
        return en;
    struct cu_buf *b = cbuf(dst);
    if (!b->shadow && !b->shadow_dead && dst->size <= SHADOW_MAX)
        b->shadow = calloc(1, dst->size); /* on failure: simply no host copy */
    if (b->shadow)
        memcpy(b->shadow + off, src, bytes);
    return stage_upload2(c, (uint8_t *)dst->ptr + off, src, bytes, c->up_batch, err);
}

/* The error flag a download brought back: INF_OK, or the kernel's
 * complaint (the flag is cleared on the device). */
static inf_status_t bad_flag(struct cu_ctx *c, int32_t f, struct inf_err *err)
{
    if (!f)
        return INF_OK;
    CU(c, cudaMemsetAsync(c->d_bad, 0, sizeof(int32_t), c->stream), "clear error flag");
    return inf_err_set(err, INF_E_INVALID, "a kernel met an out-of-range %s",
                       (f & KRN_CUDA_BAD_ID)    ? "token id"
                       : (f & KRN_CUDA_BAD_ROW) ? "row index"
                                                : "block table entry");
}

/* Queue the copies of the error flag to flag and of bytes at src to dst;
 * with both destinations pinned (pinned) and batching on, as one operation
 * of the stream (cudaMemcpyBatchAsync). */
static inf_status_t download_flagged(struct cu_ctx *c, void *flag, void *dst, const void *src,
                                     size_t bytes, bool pinned, struct inf_err *err)
{
    void *dsts[2] = {flag, dst};
    const void *srcs[2] = {c->d_bad, src};
    size_t sizes[2] = {sizeof(int32_t), bytes};
    if (pinned && c->up_batch && bytes) {
        struct cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx = 0;
        CU(c, cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &at, &idx, 1, c->stream), "download");
        return INF_OK;
    }
    for (int i = 0; i < (bytes ? 2 : 1); i++)
        CU(c, cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToHost, c->stream),
           "download");
    return INF_OK;
}

static inf_status_t cu_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                    void *dst, size_t bytes, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    /* The error flag travels with the download: one synchronization. */
    size_t flag_at = (c->staging_used + 255) / 256 * 256;
    if (flag_at + 256 + bytes > STAGING_BYTES) {
        inf_status_t st = cu_sync(c, err);
        if (st != INF_OK)
            return st;
        flag_at = 0;
    }
    int32_t *flag = (int32_t *)(c->staging + flag_at);
    uint8_t *land = bytes <= STAGING_BYTES - flag_at - 256 ? c->staging + flag_at + 256 : NULL;
    inf_status_t st = download_flagged(c, flag, land ? (void *)land : dst,
                                       (const uint8_t *)src->ptr + off, bytes, land != NULL, err);
    if (st == INF_OK)
        st = cu_sync(c, err);
    if (st != INF_OK)
        return st;
    if (land)
        memcpy(dst, land, bytes);
    return bad_flag(c, *flag, err);
}

static inf_status_t cu_download_start(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                      size_t bytes, int slot, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (c->capturing)
        return inf_err_set(err, INF_E_UNSUPPORTED, "a download while recording a graph");
    if (c->land_busy[slot])
        return inf_err_set(err, INF_E_INVALID, "download slot %d is still in use", slot);
    if (256 + bytes > c->land_cap[slot]) {
        if (c->land[slot]) {
            CU(c, cudaFreeHost(c->land[slot]), "free pinned memory");
            c->land[slot] = NULL;
            c->land_cap[slot] = 0;
        }
        size_t cap = 256 + (bytes < 4096 ? 4096 : bytes * 2);
        CU(c, cudaHostAlloc((void **)&c->land[slot], cap, cudaHostAllocDefault), "pinned memory");
        c->land_cap[slot] = cap;
    }
    if (!c->land_ev[slot])
        CU(c, cudaEventCreateWithFlags(&c->land_ev[slot], cudaEventDisableTiming), "event");
    inf_status_t st = download_flagged(c, c->land[slot], c->land[slot] + 256,
                                       (const uint8_t *)src->ptr + off, bytes, true, err);
    if (st != INF_OK)
        return st;
    CU(c, cudaEventRecord(c->land_ev[slot], c->stream), "event record");
    c->land_bytes[slot] = bytes;
    c->land_busy[slot] = true;
    return INF_OK;
}

static inf_status_t cu_download_wait(struct eng_backend *be, int slot, void *dst,
                                     struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (!c->land_busy[slot])
        return inf_err_set(err, INF_E_INVALID, "download slot %d holds no download", slot);
    c->land_busy[slot] = false;
    /* With the other slot idle nothing of a later step is queued: wait for
     * the whole stream, which recycles the staging ring too. */
    if (c->land_busy[slot ^ 1]) {
        CU(c, cudaEventSynchronize(c->land_ev[slot]), "event synchronize");
    } else {
        inf_status_t st = cu_sync(c, err);
        if (st != INF_OK)
            return st;
    }
    memcpy(dst, c->land[slot] + 256, c->land_bytes[slot]);
    return bad_flag(c, *(const int32_t *)c->land[slot], err);
}

static inf_status_t cu_token_feed(struct eng_backend *be, struct eng_buf *tok,
                                  const struct eng_buf *feed, const struct eng_buf *samples,
                                  int32_t n, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    const size_t row = sizeof(struct krn_cuda_sample_out);
    _Static_assert(sizeof(struct krn_cuda_sample_out) % 4 == 0, "int32 stride");
    KRN(c, krn_cuda_token_feed(
               (int32_t *)tok->ptr, (const int32_t *)feed->ptr,
               (const int32_t *)samples->ptr + offsetof(struct krn_cuda_sample_out, token) / 4,
               (int64_t)(row / 4), (int32_t)(samples->size / row), n, c->d_bad, c->stream, lep_));
    written(tok);
    return INF_OK;
}

/* ---- scratch: a bump allocator over the scratch region, reset per op ---- */
struct bump {
    uint8_t *base;
    size_t cap, used;
};

static void *bump_take(struct bump *b, size_t bytes)
{
    size_t at = (b->used + 255) / 256 * 256;
    if (at > b->cap || bytes > b->cap - at)
        return NULL;
    b->used = at + bytes;
    return b->base + at;
}

static struct bump scratch_of(struct cu_ctx *c)
{
    return (struct bump){.base = c->scratch, .cap = c->scratch_bytes, .used = 0};
}

/* ---- INT4 weights and linear layers --------------------------------------- */
/* Grow the device buffer *p to at least need bytes (load time only: waits
 * for the stream), zero-filled when zero. */
static inf_status_t grow_device(struct cu_ctx *c, void **p, size_t *bytes, size_t need, bool zero,
                                const char *what, struct inf_err *err)
{
    if (need <= *bytes)
        return INF_OK;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess) {
        (void)cudaFree(*p);
        *p = NULL;
        *bytes = 0;
        e = cudaMalloc(p, need);
        if (e == cudaSuccess && zero)
            e = cudaMemsetAsync(*p, 0, need, c->stream);
        if (e == cudaSuccess)
            *bytes = need;
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *p = NULL;
        return inf_err_set(err, INF_E_NOMEM, "out of GPU memory for %s (%zu bytes)", what, need);
    }
    if (e != cudaSuccess)
        return cu_fail(c, what, cudaGetErrorString(e), err);
    return INF_OK;
}

static inf_status_t cu_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
                                        struct eng_q4w **out, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    struct cu_q4 *q = calloc(1, sizeof *q);
    if (!q)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    inf_status_t st = krn_int4_gemm_layout_make(w, &q->lay, err);
    if (st == INF_OK)
        st = krn_int4_gemm_plan_make(&c->gpu, &q->lay, &q->plan, err);
    if (st != INF_OK)
        goto fail;
    void *host = malloc(q->lay.bytes);
    if (!host) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory repacking a %dx%d weight", w->n, w->k);
        goto fail;
    }
    /* Repacking is a pass over every code: on every core (threads made for
     * the call; the bytes do not depend on their count). */
    eng_par_t *par = NULL;
    st = eng_par_create(0, &par, err);
    if (st == INF_OK)
        st = eng_q4_gemm_repack(w, &q->lay, host, q->lay.bytes, par, err);
    eng_par_destroy(par);
    if (st == INF_OK) {
        cudaError_t e = cudaMalloc(&q->dev, q->lay.bytes);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            q->dev = NULL;
            st = inf_err_set(err, INF_E_NOMEM, "out of GPU memory for a %dx%d weight", w->n, w->k);
        } else if (e != cudaSuccess) {
            q->dev = NULL;
            st = cu_fail(c, "cudaMalloc", cudaGetErrorString(e), err);
        } else {
            /* On the backend's (non-blocking) stream, waited for: the host
             * copy is freed next and kernels on the stream read the weight. */
            e = cudaMemcpyAsync(q->dev, host, q->lay.bytes, cudaMemcpyHostToDevice, c->stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(c->stream);
            if (e != cudaSuccess)
                st = cu_fail(c, "weight upload", cudaGetErrorString(e), err);
        }
    }
    free(host);
    if (st != INF_OK)
        goto fail;
    /* The GEMM's workspace grows to the largest layer (load time only). */
    size_t need = krn_int4_gemm_workspace_size(&q->plan, GEMM_MAX_M);
    if (need == 0) {
        st = cu_fail(c, "INT4 GEMM workspace size", "query failed", err);
        goto fail;
    }
    st = grow_device(c, &c->gemm_ws, &c->gemm_ws_bytes, need, true, "the GEMM workspace", err);
    /* So do the fixed-point sums of a decode step's deferred linears. */
    if (st == INF_OK)
        st = grow_device(c, &c->acc64, &c->acc64_bytes,
                         2 * (size_t)ACC_MAX_M * (size_t)w->n * sizeof(int64_t), true,
                         "the GEMM sums", err);
    /* The fp16 copy for large M grows to the largest INT4 layer. */
    if (st == INF_OK && c->deq_min_m > 0) {
        void *dq = c->deq;
        st = grow_device(c, &dq, &c->deq_bytes, (size_t)w->n * (size_t)w->k * 2, false,
                         "the fp16 copy of a weight (large-M linears; "
                         "INT4SERVE_CUDA_DEQUANT_MIN_M=0 turns them off)",
                         err);
        c->deq = dq;
    }
    if (st != INF_OK)
        goto fail;
    q->pub.n = w->n;
    q->pub.k = w->k;
    q->pub.impl = q;
    *out = &q->pub;
    return INF_OK;
fail:
    if (q->dev)
        (void)cudaFree(q->dev);
    free(q);
    return st;
}

/* A gated MLP's [gate; up] for cu_linear_q4_glu: its rows interleaved in
 * runs of eight (krn_q4_glu_interleave), then as any INT4 weight.
 * INT4SERVE_CUDA_GLU=0 declines (INF_E_UNSUPPORTED), so the engine keeps
 * the GEMM and the SiLU·mul apart. */
static inf_status_t cu_weight_q4_create_glu(struct eng_backend *be, const struct krn_q4_weight *w,
                                            struct eng_q4w **out, struct inf_err *err)
{
    const char *off = getenv("INT4SERVE_CUDA_GLU"); /* "0": the engine's unfused path */
    if (off && !strcmp(off, "0"))
        return inf_err_set(err, INF_E_UNSUPPORTED, "GLU linear off (INT4SERVE_CUDA_GLU=0)");
    struct krn_q4_weight t;
    inf_status_t st = eng_q4_alloc(w->n, w->k, w->kp, w->group, w->symmetric, &t, err);
    if (st != INF_OK)
        return st;
    st = krn_q4_glu_interleave(w, &t, err);
    if (st == INF_OK)
        st = cu_weight_q4_create(be, &t, out, err);
    eng_q4_free(&t);
    if (st == INF_OK)
        ((struct cu_q4 *)(*out)->impl)->glu = true;
    return st;
}

static void cu_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w)
{
    struct cu_ctx *c = ctx_of(be);
    struct cu_q4 *q = w->impl;
    if (cudaSetDevice(c->device) == cudaSuccess)
        (void)cudaFree(q->dev);
    free(q);
}

static int ld_int(int64_t ld, int32_t cols);

/* y = x W^T (+ bias) for INT4 weight w. With tmp (w in the GLU column
 * order, cu_weight_q4_create_glu), y [m][n / 2] gets SiLU(gate) * up
 * instead: from the GEMM's GLU output, or through tmp [m][n] where that
 * cannot be used (large M, cuBLAS on the dequantized weight; A rows not
 * 16-byte aligned) and krn_cuda_silu_mul_glu — the same bits either way. */
static inf_status_t q4_linear(struct eng_backend *be, const struct eng_q4w *w,
                              const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                              const struct eng_mat *tmp, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    const struct cu_q4 *q = w->impl;
    const int32_t n = w->n, k = w->k, ny = tmp ? n / 2 : n;
    const bool large = c->deq_min_m > 0 && m >= c->deq_min_m && c->deq &&
                       (size_t)n * (size_t)k * 2 <= c->deq_bytes;
    if (tmp && (large || k % 8 != 0 ||
                ((m == 1 || x.ld == k) && (uintptr_t)dptr(x, 2) % 16 != 0))) {
        inf_status_t s = q4_linear(be, w, bias, x, *tmp, NULL, m, err);
        if (s != INF_OK)
            return s;
        if (tmp->ld > INT_MAX || y.ld > INT_MAX)
            return inf_err_set(err, INF_E_UNSUPPORTED, "linear: row stride too large");
        KRN(c, krn_cuda_silu_mul_glu(dptr(*tmp, 2), tmp->ld, dptr(y, 2), y.ld, ny, m, c->stream,
                                     lep_));
        written(y.buf);
        return INF_OK;
    }
    if (large) {
        /* Large M: dequantize once, then one fp16 tensor-core GEMM (as
         * cu_linear_fp: row-major y = x W^T is column-major Y = W^T X). */
        if (x.ld > INT_MAX || y.ld > INT_MAX)
            return inf_err_set(err, INF_E_UNSUPPORTED, "linear: row stride too large");
        const float one = 1.0f, zero = 0.0f;
        KRN(c, krn_int4_dequant_f16(&q->lay, q->dev, c->deq, k, c->stream, lep_));
        BLAS(c,
             cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, c->deq, CUDA_R_16F, k,
                          dptr(x, 2), CUDA_R_16F, ld_int(x.ld, k), &zero, dptr(y, 2), CUDA_R_16F,
                          ld_int(y.ld, n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
        if (bias)
            KRN(c, krn_cuda_bias_add(dptr(y, 2), false, ld_int(y.ld, n), bias->ptr, n, m,
                                     c->stream, lep_));
        weight_seen(bias);
        written(y.buf);
        return INF_OK;
    }
    struct bump sc = scratch_of(c);
    uint16_t *b16 = NULL;
    if (bias) {
        b16 = bump_take(&sc, (size_t)n * 2);
        if (!b16)
            return inf_err_set(err, INF_E_NOMEM, "workspace too small for a bias of %d", n);
        KRN(c, krn_cuda_f32_to_f16(bias->ptr, n, NULL, b16, n, n, 1, c->stream, lep_));
    }
    /* The GEMM takes contiguous rows; strided views go through scratch. */
    const bool x_direct = m == 1 || x.ld == k, y_direct = m == 1 || y.ld == ny;
    size_t per_row = (x_direct ? 0 : (size_t)k * 2) + (y_direct ? 0 : (size_t)ny * 2);
    int32_t chunk = GEMM_MAX_M;
    if (per_row) {
        size_t fit = (sc.cap - sc.used - 512) / per_row;
        if (sc.used + 512 > sc.cap || fit == 0)
            return inf_err_set(err, INF_E_NOMEM, "workspace too small for a %dx%d linear", n, k);
        if (fit < (size_t)chunk)
            chunk = (int32_t)fit;
    }
    uint16_t *xs = x_direct ? NULL : bump_take(&sc, (size_t)chunk * k * 2);
    uint16_t *ys = y_direct ? NULL : bump_take(&sc, (size_t)chunk * ny * 2);
    if ((!x_direct && !xs) || (!y_direct && !ys))
        return inf_err_set(err, INF_E_NOMEM, "workspace too small for a %dx%d linear", n, k);
    for (int32_t r0 = 0; r0 < m; r0 += chunk) {
        int32_t rows = m - r0 < chunk ? m - r0 : chunk;
        const uint16_t *a = (const uint16_t *)dptr(x, 2) + (int64_t)r0 * x.ld;
        uint16_t *cout = (uint16_t *)dptr(y, 2) + (int64_t)r0 * y.ld;
        if (!x_direct) {
            CU(c,
               cudaMemcpy2DAsync(xs, (size_t)k * 2, a, (size_t)x.ld * 2, (size_t)k * 2,
                                 (size_t)rows, cudaMemcpyDeviceToDevice, c->stream),
               "copy");
            a = xs;
        }
        /* A linear of a fixed-shape decode step, in one launch, whose sums
         * fit a word buffer: an o or down projection (at most ACC_MAX_M
         * rows) may leave them as fixed point for the RMSNorm that adds it
         * to the residual; the gate/up linear (at most GLU_ACC_MAX_M) ends
         * with them and SiLU·mul is taken from them right after (the words
         * are zeroed again). */
        const bool words = c->fx_active && y_direct && rows == m &&
                           (size_t)m * (size_t)n * sizeof(int64_t) <= c->acc64_bytes / 2;
        const bool qkv =
            words && !tmp && !b16 && m <= c->qkv_acc_max_m && n == c->qkv_n && x.buf == c->norm_out;
        const bool defer = (words && c->defer_acc && !tmp && !b16 && m <= ACC_MAX_M &&
                            n == c->norm_dim && x.buf != c->norm_out) ||
                           qkv;
        const bool glu_words = words && c->glu_acc && tmp && m <= GLU_ACC_MAX_M;
        const int32_t ab = c->acc_next;
        if (defer || glu_words) { /* words a linear that did not take the sums left */
            inf_status_t zs = acc_zero(c, ab, err);
            if (zs != INF_OK)
                return zs;
        }
        int32_t taken = 0;
        struct krn_int4_gemm_args ga = {.lay = &q->lay,
                                        .plan = &q->plan,
                                        .b = q->dev,
                                        .a = a,
                                        .bias = b16,
                                        .c = y_direct ? cout : ys,
                                        .m = rows,
                                        .workspace = c->gemm_ws,
                                        .workspace_bytes = c->gemm_ws_bytes,
                                        .stream = c->stream,
                                        .flags = glu_words ? KRN_INT4_GEMM_GLU | KRN_INT4_GEMM_ACC64
                                                 : tmp     ? KRN_INT4_GEMM_GLU
                                                 : defer   ? KRN_INT4_GEMM_ACC64
                                                           : 0,
                                        .config = -1,
                                        .acc = defer || glu_words ? acc_buf(c, ab) : NULL,
                                        .acc_taken = &taken,
                                        .acc_clear = defer ? acc_buf(c, 1 - ab) : NULL,
                                        .acc_clear_words = defer ? c->acc_dirty[1 - ab] : 0};
        KRN(c, krn_int4_gemm(&ga, lep_));
        if (taken && glu_words) {
            KRN(c, krn_int4_gemm_acc_reduce_glu(acc_buf(c, ab), cout, ny, m, n, c->stream, lep_));
        } else if (taken) {
            c->acc_dirty[1 - ab] = 0;
            c->acc_dirty[ab] = (int64_t)m * n;
            c->acc_next = 1 - ab;
            c->held_buf = ab;
            c->acc_held = true;
            c->held_c = cout;
            c->held_ldc = y.ld < n ? n : y.ld;
            c->held_m = m;
            c->held_n = n;
            c->acc_for_attn = qkv;
        }
        weight_seen(bias);
        if (!y_direct)
            CU(c,
               cudaMemcpy2DAsync(cout, (size_t)y.ld * 2, ys, (size_t)ny * 2, (size_t)ny * 2,
                                 (size_t)rows, cudaMemcpyDeviceToDevice, c->stream),
               "copy");
    }
    written(y.buf);
    return INF_OK;
}

static inf_status_t cu_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                                 const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                 int32_t m, struct inf_err *err)
{
    ENTER(ctx_of(be));
    if (((const struct cu_q4 *)w->impl)->glu)
        return inf_err_set(err, INF_E_INVALID, "linear_q4: a GLU weight (use linear_q4_glu)");
    return q4_linear(be, w, bias, x, y, NULL, m, err);
}

static inf_status_t cu_linear_q4_glu(struct eng_backend *be, const struct eng_q4w *w,
                                     struct eng_mat x, struct eng_mat tmp, struct eng_mat out,
                                     int32_t m, struct inf_err *err)
{
    ENTER(ctx_of(be));
    if (!((const struct cu_q4 *)w->impl)->glu)
        return inf_err_set(err, INF_E_INVALID, "linear_q4_glu: not a GLU weight");
    return q4_linear(be, w, NULL, x, out, &tmp, m, err);
}

static int ld_int(int64_t ld, int32_t cols)
{
    return (int)(ld < cols ? cols : ld);
}

static inf_status_t cu_linear_fp(struct eng_backend *be, const struct eng_buf *w,
                                 enum eng_wdtype wdt, int32_t n, int32_t k,
                                 const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                 bool y_f32, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (x.ld > INT_MAX || y.ld > INT_MAX)
        return inf_err_set(err, INF_E_UNSUPPORTED, "linear_fp: row stride too large");
    const float one = 1.0f, zero = 0.0f;
    const size_t ysz = y_f32 ? 4 : 2;
    if (wdt == ENG_W_F16) {
        /* One row (a batch-1 decode step's lm_head, an unquantized model's
         * linears): the weight-streaming kernel where it takes the shape
         * (kernels/cuda/gemv.cu says where it is faster than cuBLAS). */
        inf_status_t gs = INF_E_UNSUPPORTED;
        if (c->gemv && m <= KRN_GEMV_MAX_M) {
            struct inf_err ge = {0};
            gs = krn_cuda_gemv_f16(w->ptr, n, k, dptr(x, 2), ld_int(x.ld, k), dptr(y, ysz), y_f32,
                                   ld_int(y.ld, n), m, c->stream, &ge);
            if (gs != INF_OK && gs != INF_E_UNSUPPORTED)
                return kst(c, gs, &ge, err);
        }
        /* Row-major y[m][n] = x[m][k] W[n][k]^T is column-major
         * Y(n x m) = W^T(n x k) X(k x m): W is read transposed. */
        if (gs != INF_OK)
            BLAS(c,
                 cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w->ptr, CUDA_R_16F,
                              k, dptr(x, 2), CUDA_R_16F, ld_int(x.ld, k), &zero, dptr(y, ysz),
                              y_f32 ? CUDA_R_32F : CUDA_R_16F, ld_int(y.ld, n), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
        if (bias)
            KRN(c, krn_cuda_bias_add(dptr(y, ysz), y_f32, ld_int(y.ld, n), bias->ptr, n, m,
                                     c->stream, lep_));
        written(y.buf);
        weight_seen(w);
        weight_seen(bias);
        return INF_OK;
    }
    /* fp32 weights (quantization off): fp32 activations in scratch, fp32
     * GEMM, rows in chunks that fit. */
    struct bump sc = scratch_of(c);
    size_t per_row = (size_t)k * 4 + (y_f32 ? 0 : (size_t)n * 4);
    size_t fit = sc.cap / (per_row + 64);
    if (fit == 0)
        return inf_err_set(err, INF_E_NOMEM, "workspace too small for a %dx%d fp32 linear", n, k);
    int32_t chunk = fit < (size_t)m ? (int32_t)fit : m;
    float *xs = bump_take(&sc, (size_t)chunk * k * 4);
    float *ys = y_f32 ? NULL : bump_take(&sc, (size_t)chunk * n * 4);
    if (!xs || (!y_f32 && !ys))
        return inf_err_set(err, INF_E_NOMEM, "workspace too small for a %dx%d fp32 linear", n, k);
    for (int32_t r0 = 0; r0 < m; r0 += chunk) {
        int32_t rows = m - r0 < chunk ? m - r0 : chunk;
        const uint16_t *a = (const uint16_t *)dptr(x, 2) + (int64_t)r0 * x.ld;
        KRN(c, krn_cuda_f16_to_f32(a, ld_int(x.ld, k), xs, k, k, rows, c->stream, lep_));
        void *yo = y_f32 ? (void *)((float *)dptr(y, 4) + (int64_t)r0 * y.ld) : (void *)ys;
        int ldy = y_f32 ? ld_int(y.ld, n) : n;
        BLAS(c,
             cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w->ptr, CUDA_R_32F,
                          k, xs, CUDA_R_32F, k, &zero, yo, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
        if (y_f32) {
            if (bias)
                KRN(c, krn_cuda_bias_add(yo, true, ldy, bias->ptr, n, rows, c->stream, lep_));
        } else {
            uint16_t *yd = (uint16_t *)dptr(y, 2) + (int64_t)r0 * y.ld;
            KRN(c, krn_cuda_f32_to_f16(ys, n, bias ? bias->ptr : NULL, yd, ld_int(y.ld, n), n, rows,
                                       c->stream, lep_));
        }
    }
    written(y.buf);
    weight_seen(w);
    weight_seen(bias);
    return INF_OK;
}

/* ---- row ops ----------------------------------------------------------------- */
static inf_status_t cu_embedding(struct eng_backend *be, const struct eng_buf *table,
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
    written(out.buf);
    weight_seen(table);
    return INF_OK;
}

static inf_status_t cu_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                   const struct eng_mat *delta, const struct eng_buf *w, float eps,
                                   struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    /* delta is the C of held GEMM sums: read them instead */
    const bool from_acc = c->acc_held && delta && dptr(*delta, 2) == (void *)c->held_c &&
                          m == c->held_m && dim == c->held_n;
    inf_status_t en = enter2(c, false, from_acc, err);
    if (en != INF_OK)
        return en;
    c->norm_dim = dim;
    c->norm_out = out.buf;
    struct inf_err le = {0};
    inf_status_t st = INF_E_UNSUPPORTED;
    if (from_acc) {
        st = krn_cuda_rmsnorm_add_acc(dptr(x, 2), x.ld, acc_buf(c, c->held_buf), w->ptr, eps,
                                      dptr(out, 2), out.ld, dim, m, c->stream, &le);
        if (st == INF_OK)
            c->acc_held = false;
        else if (st != INF_E_UNSUPPORTED)
            return kst(c, st, &le, err);
    }
    if (st != INF_OK) { /* the usual form (held sums written first) */
        en = acc_flush(c, err);
        if (en != INF_OK)
            return en;
        KRN(c, krn_cuda_rmsnorm_add(dptr(x, 2), x.ld, delta ? dptr(*delta, 2) : NULL,
                                    delta ? delta->ld : 0, w->ptr, eps, dptr(out, 2), out.ld, dim,
                                    m, c->stream, lep_));
    }
    written(x.buf);
    written(out.buf);
    weight_seen(w);
    return INF_OK;
}

static inf_status_t cu_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                            int32_t head_dim, const struct eng_buf *pos,
                            const struct eng_rope_params *p, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    /* a decode step's RoPE is held for the attention, and so are the q/k/v
     * sums it would rotate */
    const bool hold = c->fx_active && c->fuse_rope_kv && m == c->fx_rows;
    inf_status_t en =
        enter2(c, false, hold && c->acc_held && c->acc_for_attn && c->held_c == dptr(x, 2), err);
    if (en != INF_OK)
        return en;
    /* The frequencies come from the CPU code (one definition of the math)
     * and are uploaded only when the parameters change. */
    const struct eng_rope_params *q = &c->inv_params;
    if (!c->inv_valid || c->inv_head_dim != head_dim || q->theta != p->theta ||
        q->llama3 != p->llama3 || q->factor != p->factor || q->low_freq != p->low_freq ||
        q->high_freq != p->high_freq || q->orig_max_pos != p->orig_max_pos) {
        float inv[256];
        krn_rope_inv_freq(p->theta, p->llama3, p->factor, p->low_freq, p->high_freq,
                          p->orig_max_pos, head_dim, inv);
        inf_status_t st =
            stage_upload(c, c->d_inv_freq, inv, (size_t)(head_dim / 2) * sizeof(float), err);
        if (st != INF_OK)
            return st;
        c->inv_params = *p;
        c->inv_head_dim = head_dim;
        c->inv_valid = true;
    }
    written(x.buf);
    if (hold) {
        /* a decode step: the attention that follows may fuse it */
        c->rope = (struct rope_call){.x = dptr(x, 2),
                                     .ldx = x.ld,
                                     .n_heads = n_heads,
                                     .head_dim = head_dim,
                                     .m = m,
                                     .pos = pos->ptr};
        c->rope_held = true;
        return INF_OK;
    }
    KRN(c, krn_cuda_rope(dptr(x, 2), x.ld, n_heads, head_dim, pos->ptr, c->d_inv_freq, m, c->stream,
                         lep_));
    return INF_OK;
}

static inf_status_t cu_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                                struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    KRN(c, krn_cuda_silu_mul(dptr(gate, 2), gate.ld, dptr(up, 2), up.ld, dptr(out, 2), out.ld, dim,
                             m, c->stream, lep_));
    written(out.buf);
    return INF_OK;
}

static inf_status_t cu_rows_gather(struct eng_backend *be, struct eng_mat x,
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
    written(out.buf);
    return INF_OK;
}

/* ---- attention ---------------------------------------------------------------- */

/* Grow the host list buffer to at least bytes. */
static bool h_list_reserve(struct cu_ctx *c, size_t bytes)
{
    if (bytes <= c->h_list_cap)
        return true;
    size_t cap = c->h_list_cap ? c->h_list_cap : 4096;
    while (cap < bytes)
        cap *= 2;
    uint8_t *p = realloc(c->h_list, cap);
    if (!p)
        return false;
    c->h_list = p;
    c->h_list_cap = cap;
    return true;
}

static size_t align16(size_t x)
{
    return (x + 15) / 16 * 16;
}

/* Validate p as the CPU backend does, build its work list and upload it
 * (skipped when the same bytes are there already: every layer of a step has
 * the same list). fixed > 0: the fixed shape of a decode bucket of `fixed`
 * sequences: every K/V entry, item and group of the bucket is present
 * (padding does nothing), each row set owning the same number of split
 * slots, so one recorded grid serves every step of the bucket. *lay
 * receives the layout; lay->n_kv == 0 when there is nothing to do. */
static inf_status_t attn_list(struct cu_ctx *c, const struct eng_attn_params *p, bool decode,
                              int32_t fixed, struct attn_layout *lay, struct inf_err *err)
{
    memset(lay, 0, sizeof *lay);
    const int32_t *seqs = shadow_of(p->seqs), *pos = shadow_of(p->pos),
                  *bt = shadow_of(p->block_table);
    if (!seqs || !pos || !bt)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: positions and tables must be filled with buf_upload");
    const int32_t hd = p->head_dim, G = p->n_heads / p->n_kv_heads;
    /* decode: a token a sequence; a fixed shape is its bucket's */
    const int32_t impl =
        krn_cuda_attn_impl_for(hd, decode, fixed ? fixed : p->n_seqs, p->n_heads, p->n_kv_heads);
    struct krn_cuda_attn_config cfg;
    inf_status_t st = krn_cuda_attn_config(hd, decode, impl, &cfg, err);
    if (st != INF_OK)
        return st;
    const int32_t R = cfg.rows, tile = cfg.tile;
    /* Validate the tables from their host copies, as every backend does. */
    int32_t n_tok = 0;
    st = eng_attn_tables_check(p, pos, (int64_t)(p->pos->size / 4), seqs, bt, fixed != 0, &n_tok,
                               NULL, err);
    if (st != INF_OK)
        return st;
    int64_t n_chunks = 0;
    for (int32_t s = 0; s < p->n_seqs; s++)
        n_chunks += (int64_t)p->n_kv_heads * (((int64_t)seqs[3 * s + 1] * G + R - 1) / R);
    if (fixed) {
        /* the bucket's shape, whatever the sequences */
        n_tok = fixed;
        n_chunks = (int64_t)fixed * p->n_kv_heads * ((G + R - 1) / R);
    }
    if (n_tok == 0)
        return INF_OK;
    /* Split long key ranges when the row sets alone would leave resident
     * blocks unused: up to one wave of them in all. */
    const size_t slot_bytes = (size_t)R * (size_t)(hd + 2) * sizeof(float);
    const int64_t part_cap = (int64_t)(c->scratch_bytes / slot_bytes);
    int64_t max_splits = krn_cuda_attn_splits_cap(n_chunks, c->sms, &cfg);
    if (fixed && max_splits * n_chunks > part_cap)
        max_splits = part_cap / n_chunks > 1 ? part_cap / n_chunks : 1;
    /* A fused combine counts arrivals per group: every group needs a counter. */
    if (fixed && cfg.fused_combine && n_chunks > ATTN_COUNTERS)
        max_splits = 1;

    /* Host list: [kv destinations (int32 pairs)] [items] [groups]. Sized for
     * the worst case, then filled. */
    int64_t max_items = n_chunks * max_splits;
    size_t kv_bytes = align16((size_t)n_tok * 2 * sizeof(int32_t));
    size_t items_bytes = align16((size_t)max_items * sizeof(struct krn_cuda_attn_item));
    size_t need = kv_bytes + items_bytes + (size_t)n_chunks * sizeof(struct krn_cuda_attn_group);
    if (!h_list_reserve(c, need))
        return inf_err_set(err, INF_E_NOMEM, "out of memory for an attention work list");
    int32_t *kvdst = (int32_t *)c->h_list;
    struct krn_cuda_attn_item *items = (struct krn_cuda_attn_item *)(c->h_list + kv_bytes);
    int32_t n_kv = 0, n_items = 0, n_groups = 0;
    int64_t n_parts = 0;
    for (int32_t s = 0; s < p->n_seqs; s++) {
        int32_t t0 = seqs[3 * s], nt = seqs[3 * s + 1], slot = seqs[3 * s + 2];
        const int32_t *blocks = bt + (int64_t)slot * p->max_blocks;
        for (int32_t t = t0; t < t0 + nt; t++) {
            kvdst[2 * n_kv] = t;
            kvdst[2 * n_kv + 1] =
                blocks[pos[t] / ENG_KV_BLOCK] * ENG_KV_BLOCK + pos[t] % ENG_KV_BLOCK;
            n_kv++;
        }
    }
    for (; n_kv < n_tok; n_kv++) { /* fixed shape: padding entries */
        kvdst[2 * n_kv] = 0;
        kvdst[2 * n_kv + 1] = -1;
    }
    /* Groups are written after the items; keep them in a second pass. */
    struct krn_cuda_attn_group *groups =
        (struct krn_cuda_attn_group *)(c->h_list + kv_bytes + items_bytes);
    for (int32_t s = 0; s < p->n_seqs; s++) {
        int32_t t0 = seqs[3 * s], nt = seqs[3 * s + 1], slot = seqs[3 * s + 2];
        int32_t total_rows = nt * G;
        for (int32_t kvh = 0; kvh < p->n_kv_heads; kvh++) {
            for (int32_t row0 = 0; row0 < total_rows; row0 += R) {
                int32_t nr = total_rows - row0 < R ? total_rows - row0 : R;
                int32_t ctx = pos[t0] + (row0 + nr - 1) / G + 1;
                int64_t splits = (ctx + cfg.split_keys - 1) / cfg.split_keys;
                if (splits > max_splits)
                    splits = max_splits;
                int32_t len = ctx;
                if (splits > 1) {
                    len = (int32_t)((ctx + splits - 1) / splits);
                    len = (len + tile - 1) / tile * tile;
                    splits = (ctx + len - 1) / len;
                }
                if (!fixed && splits > 1 &&
                    (n_parts + splits > part_cap ||
                     (cfg.fused_combine && n_groups >= ATTN_COUNTERS))) {
                    splits = 1; /* the partials or counters would not fit: one pass */
                    len = ctx;
                }
                const int32_t group = n_groups;
                int32_t first = n_items;
                if (fixed)
                    groups[n_groups++] = (struct krn_cuda_attn_group){
                        .item = first, .n_splits = splits > 1 ? (int32_t)splits : 0};
                else if (splits > 1)
                    groups[n_groups++] =
                        (struct krn_cuda_attn_group){.item = first, .n_splits = (int32_t)splits};
                for (int32_t j = 0; j < splits; j++) {
                    struct krn_cuda_attn_item *it = &items[n_items++];
                    memset(it, 0, sizeof *it);
                    it->t_first = t0;
                    it->p_first = pos[t0];
                    it->slot = slot;
                    it->kvh = kvh;
                    it->row0 = row0;
                    it->nrows = nr;
                    it->k0 = j * len;
                    it->k1 = (j + 1) * len < ctx ? (j + 1) * len : ctx;
                    /* fixed: each row set owns the partial slots of its items */
                    it->part = splits > 1 ? (fixed ? first + j : (int32_t)n_parts++) : -1;
                    it->group = splits > 1 ? group : 0;
                }
                if (fixed) /* the rest of the row set's split slots: padding */
                    for (; n_items < first + max_splits; n_items++)
                        memset(&items[n_items], 0, sizeof items[n_items]);
            }
        }
    }
    if (fixed) {
        for (; n_groups < n_chunks; n_groups++) {
            groups[n_groups] = (struct krn_cuda_attn_group){.item = n_items, .n_splits = 0};
            for (int64_t j = 0; j < max_splits; j++, n_items++)
                memset(&items[n_items], 0, sizeof items[n_items]);
        }
        for (int32_t g = 0; g < n_groups; g++)
            if (groups[g].item >= n_items)
                groups[g].item = 0;
    }
    /* Pack the groups right after the items actually made. */
    size_t items_used = align16((size_t)n_items * sizeof(struct krn_cuda_attn_item));
    if (items_used != items_bytes)
        memmove(c->h_list + kv_bytes + items_used, groups,
                (size_t)n_groups * sizeof(struct krn_cuda_attn_group));
    size_t list_bytes =
        kv_bytes + items_used + (size_t)n_groups * sizeof(struct krn_cuda_attn_group);
    size_t map_off = 0;
    if (fixed) {
        /* each row's pool row, for the fused RoPE + KV write */
        map_off = align16(list_bytes);
        size_t map_end = map_off + (size_t)fixed * sizeof(int32_t);
        if (!h_list_reserve(c, map_end))
            return inf_err_set(err, INF_E_NOMEM, "out of memory for an attention work list");
        int32_t *map = (int32_t *)(c->h_list + map_off);
        const int32_t *kd = (const int32_t *)c->h_list;
        memset(c->h_list + list_bytes, 0, map_off - list_bytes);
        for (int32_t t = 0; t < fixed; t++)
            map[t] = -1;
        for (int32_t i = 0; i < n_kv; i++)
            if (kd[2 * i + 1] >= 0 && kd[2 * i] >= 0 && kd[2 * i] < fixed)
                map[kd[2 * i]] = kd[2 * i + 1];
        list_bytes = map_end;
    }
    struct list_cache *lc = &c->lists[decode ? 0 : 1];
    if (list_bytes > c->list_bytes)
        return inf_err_set(err, INF_E_NOMEM,
                           "attention work list of %zu bytes exceeds the workspace's %zu",
                           list_bytes, c->list_bytes);
    if (lc->bytes != list_bytes || memcmp(lc->host, c->h_list, list_bytes) != 0) {
        /* graph_prepare's list joins the step's held table copies (the ops
         * that read it enter after it, which issues them) */
        st = stage_upload2(c, lc->dev, c->h_list, list_bytes, fixed != 0 && c->up_batch, err);
        if (st != INF_OK)
            return st;
        memcpy(lc->host, c->h_list, list_bytes);
        lc->bytes = list_bytes;
    }
    *lay = (struct attn_layout){.n_kv = n_kv,
                                .n_items = n_items,
                                .n_groups = n_groups,
                                .impl = impl,
                                .kv_bytes = kv_bytes,
                                .items_bytes = items_used,
                                .bytes = list_bytes,
                                .map_off = map_off};
    return INF_OK;
}

/* The held RoPE call rotates exactly the q and k heads of this decode
 * step's rows (as the model issues them: q heads then k heads, adjacent in
 * one row), and the fixed-shape list carries the rows' pool rows. */
static bool rope_fusable(const struct cu_ctx *c, const struct eng_attn_params *p)
{
    const struct rope_call *r = &c->rope;
    const int32_t hd = p->head_dim;
    return c->rope_held && c->fuse_rope_kv && c->fx.map_off != 0 && r->m == c->fx_rows &&
           r->head_dim == hd && r->n_heads == p->n_heads + p->n_kv_heads && r->pos == p->pos->ptr &&
           r->x == (uint16_t *)dptr(p->q, 2) && r->ldx == p->q.ld && p->k.ld == p->q.ld &&
           (uint16_t *)dptr(p->k, 2) == r->x + (int64_t)p->n_heads * hd &&
           krn_cuda_rope_kv_ok(r->x, r->ldx, p->n_heads, p->n_kv_heads, hd, dptr(p->v, 2), p->v.ld,
                               p->k_cache->ptr, p->v_cache->ptr);
}

/* The held sums as the fused decode attention's q/k/v words, where they
 * are the rows of q (the q and k heads), k and v that the held RoPE names:
 * *qw the words of q's first column, *vw of v's; otherwise both NULL. */
static void qkv_words(const struct cu_ctx *c, const struct eng_attn_params *p, const int64_t **qw,
                      const int64_t **vw)
{
    const struct rope_call *r = &c->rope;
    const uint16_t *q = r->x, *v = dptr(p->v, 2);
    if (!c->acc_held || !c->acc_for_attn || c->held_c != q || c->held_m != c->fx_rows ||
        c->held_ldc != c->held_n || r->ldx != c->held_n || p->v.ld != r->ldx || v < q ||
        v - q + (int64_t)p->n_kv_heads * p->head_dim > c->held_n || (v - q) % 2)
        return;
    *qw = acc_buf(c, c->held_buf);
    *vw = *qw + (v - q);
}

static inf_status_t cu_attn(struct eng_backend *be, const struct eng_attn_params *p, bool decode,
                            struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    /* held q/k/v sums (acc_for_attn) stay for the fused kernel below */
    inf_status_t en = enter2(c, true, decode && c->acc_held && c->acc_for_attn, err);
    if (en != INF_OK)
        return en;
    const bool fused = decode && c->fx_active && rope_fusable(c, p);
    if (fused)
        c->qkv_n = (p->n_heads + 2 * p->n_kv_heads) * p->head_dim;
    const int64_t *qw = NULL, *vw = NULL;
    if (fused && c->rope_in_attn)
        qkv_words(c, p, &qw, &vw);
    if (!qw && (en = acc_flush(c, err)) != INF_OK)
        return en;
    if (!fused && (en = rope_flush(c, err)) != INF_OK)
        return en;
    struct attn_layout lay;
    if (decode && c->fx_active) {
        lay = c->fx; /* prepared for the step by graph_prepare */
    } else {
        inf_status_t st = attn_list(c, p, decode, 0, &lay, err);
        if (st != INF_OK)
            return st;
    }
    const struct list_cache *lc = &c->lists[decode ? 0 : 1];
    const int32_t hd = p->head_dim;
    const int64_t kv_row = (int64_t)p->n_kv_heads * hd;
    if (lay.n_kv == 0 && !fused)
        return INF_OK;
    if (!fused)
        KRN(c, krn_cuda_kv_write(dptr(p->k, 2), p->k.ld, dptr(p->v, 2), p->v.ld, p->k_cache->ptr,
                                 p->v_cache->ptr, (int32_t)kv_row, (const int32_t *)lc->dev,
                                 lay.n_kv, c->stream, lep_));
    struct krn_cuda_attn_params kp = {
        .q = dptr(p->q, 2),
        .ldq = p->q.ld,
        .out = dptr(p->out, 2),
        .ldo = p->out.ld,
        .k_pool = p->k_cache->ptr,
        .v_pool = p->v_cache->ptr,
        .block_table = p->block_table->ptr,
        .max_blocks = p->max_blocks,
        .block = ENG_KV_BLOCK,
        .n_heads = p->n_heads,
        .n_kv_heads = p->n_kv_heads,
        .head_dim = hd,
        .scale = p->scale,
        .items = (const struct krn_cuda_attn_item *)(lc->dev + lay.kv_bytes),
        .n_items = lay.n_items,
        .groups = (const struct krn_cuda_attn_group *)(lc->dev + lay.kv_bytes + lay.items_bytes),
        .n_groups = lay.n_groups,
        .partials = (float *)c->scratch,
        .group_done = c->d_group_done,
        .decode = decode,
        .impl = lay.impl,
        .rows = decode ? p->n_seqs : 0 /* a token a sequence */};
    if (fused) {
        /* RoPE of the step's rows with their K/V written into the pools:
         * inside the attention kernel where it takes them, else its own
         * kernel first */
        c->rope_held = false;
        const struct rope_call *r = &c->rope;
        const int32_t *map = (const int32_t *)(lc->dev + lay.map_off);
        inf_status_t st = INF_E_UNSUPPORTED;
        if (c->rope_in_attn && lay.n_items > 0) {
            struct krn_cuda_attn_params rp = kp;
            rp.rope_inv_freq = c->d_inv_freq;
            rp.rope_pos = r->pos;
            rp.kv_map = map;
            rp.v_new = dptr(p->v, 2);
            rp.ldv = p->v.ld;
            rp.q_words = qw;
            rp.v_words = vw;
            rp.ldw = qw ? c->held_n : 0;
            struct inf_err le = {0};
            st = krn_cuda_attention(&rp, c->stream, &le);
            if (st != INF_OK && st != INF_E_UNSUPPORTED)
                return kst(c, st, &le, err);
            if (st == INF_OK && qw)
                c->acc_held = false; /* read; the next linear of words zeroes them */
        }
        if (st != INF_OK && (en = acc_flush(c, err)) != INF_OK)
            return en; /* the kernels below read q/k/v as fp16 */
        written(p->k_cache);
        written(p->v_cache);
        if (st == INF_OK) {
            written(p->out.buf);
            return INF_OK;
        }
        KRN(c, krn_cuda_rope_kv(r->x, r->ldx, p->n_heads, p->n_kv_heads, hd, r->pos, c->d_inv_freq,
                                dptr(p->v, 2), p->v.ld, p->k_cache->ptr, p->v_cache->ptr, map, r->m,
                                c->stream, lep_));
        if (lay.n_kv == 0)
            return INF_OK;
    }
    KRN(c, krn_cuda_attention(&kp, c->stream, lep_));
    written(p->out.buf);
    written(p->k_cache);
    written(p->v_cache);
    return INF_OK;
}

static inf_status_t cu_attn_prefill(struct eng_backend *be, const struct eng_attn_params *p,
                                    struct inf_err *err)
{
    return cu_attn(be, p, false, err);
}

static inf_status_t cu_attn_decode(struct eng_backend *be, const struct eng_attn_params *p,
                                   struct inf_err *err)
{
    return cu_attn(be, p, true, err);
}

/* ---- sampling ------------------------------------------------------------------ */
static inf_status_t cu_sample_reserve(struct eng_backend *be, int32_t vocab, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    size_t need = krn_cuda_sample_workspace(SAMPLE_ROWS, vocab);
    if (need == 0)
        return cu_fail(c, "sampling workspace size", "query failed", err);
    if (need <= c->sample_ws_bytes) {
        c->sample_vocab = vocab;
        return INF_OK;
    }
    CU(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    (void)cudaFree(c->sample_ws);
    c->sample_ws = NULL;
    c->sample_ws_bytes = 0;
    cudaError_t e = cudaMalloc(&c->sample_ws, need);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        c->sample_ws = NULL;
        return inf_err_set(err, INF_E_NOMEM, "out of GPU memory for the sampling workspace");
    }
    CU(c, e, "cudaMalloc");
    /* the greedy kernel's arrival counters start at zero */
    CU(c, cudaMemset(c->sample_ws, 0, need), "cudaMemset");
    c->sample_ws_bytes = need;
    c->sample_vocab = vocab;
    return INF_OK;
}

/* Host list staging of at least n entries. */
static bool lists_reserve(struct cu_ctx *c, size_t n)
{
    if (n <= c->h_lists_cap)
        return true;
    size_t cap = c->h_lists_cap ? c->h_lists_cap : 1024;
    while (cap < n)
        cap *= 2;
    int32_t *pi = realloc(c->h_ints, cap * sizeof *pi);
    if (!pi)
        return false;
    c->h_ints = pi;
    float *pv = realloc(c->h_vals, cap * sizeof *pv);
    if (!pv)
        return false;
    c->h_vals = pv;
    c->h_lists_cap = cap;
    return true;
}

static inf_status_t cu_sample(struct eng_backend *be, const struct eng_buf *logits,
                              int32_t n_logit_rows, int32_t vocab,
                              const struct eng_sample_row *rows, int32_t n, struct eng_buf *out,
                              int32_t out_first, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    (void)n_logit_rows;
    if (!c->sample_ws || vocab > c->sample_vocab)
        return inf_err_set(err, INF_E_INVALID,
                           "sample: the workspace is reserved for a vocabulary of %d, not %d",
                           c->sample_vocab, vocab);
    for (int32_t r0 = 0; r0 < n; r0 += SAMPLE_ROWS) {
        int32_t nr = n - r0 < SAMPLE_ROWS ? n - r0 : SAMPLE_ROWS;
        struct krn_cuda_sample_out *o = (struct krn_cuda_sample_out *)out->ptr + out_first + r0;
        /* rows that are all plain greedy: the kernel of many blocks a row,
         * their logits rows passed by value */
        bool plain = c->greedy && vocab <= KRN_SAMPLE_GREEDY_MAX_VOCAB;
        struct krn_cuda_greedy_rows gr;
        for (int32_t i = 0; i < nr && plain; i++) {
            const struct eng_sample_row *r = &rows[r0 + i];
            plain = r->temperature == 0.0f && r->n_ban == 0 && r->n_bias == 0 && r->n_hist == 0 &&
                    r->n_logprobs <= 0;
            gr.row[i] = r->logit_row;
        }
        if (plain) {
            KRN(c, krn_cuda_sample_greedy(logits->ptr, vocab, &gr, nr, c->sample_ws,
                                          c->sample_ws_bytes, o, c->stream, lep_));
            continue;
        }
        size_t n_list = 0;
        for (int32_t i = 0; i < nr; i++) {
            const struct eng_sample_row *r = &rows[r0 + i];
            n_list += (size_t)r->n_ban + (size_t)r->n_bias + 3 * (size_t)r->n_hist;
        }
        if (!lists_reserve(c, n_list + 1))
            return inf_err_set(err, INF_E_NOMEM, "out of memory for sampling lists");
        bool any_sort = false;
        int32_t at = 0;
        for (int32_t i = 0; i < nr; i++) {
            const struct eng_sample_row *r = &rows[r0 + i];
            struct krn_cuda_sample_row *k = &c->h_rows[i];
            memset(k, 0, sizeof *k);
            k->u = r->u;
            k->logit_row = r->logit_row;
            k->temperature = r->temperature;
            k->top_k = r->top_k;
            k->top_p = r->top_p;
            /* the host's own logf, so the cut is the same float */
            k->log_min_p = r->min_p > 0.0f ? logf(r->min_p) : -INFINITY;
            k->rep = r->repetition_penalty;
            k->pres = r->presence_penalty;
            k->freq = r->frequency_penalty;
            k->n_logprobs = r->n_logprobs;
            k->sort = r->temperature != 0.0f && (r->top_k > 0 || r->top_p < 1.0f);
            any_sort |= k->sort != 0;
            k->ban_off = at;
            k->n_ban = r->n_ban;
            memcpy(c->h_ints + at, r->ban, (size_t)r->n_ban * sizeof(int32_t));
            at += r->n_ban;
            k->bias_off = at;
            k->n_bias = r->n_bias;
            memcpy(c->h_ints + at, r->bias_ids, (size_t)r->n_bias * sizeof(int32_t));
            memcpy(c->h_vals + at, r->bias_vals, (size_t)r->n_bias * sizeof(float));
            at += r->n_bias;
            k->hist_off = at;
            k->n_hist = r->n_hist;
            for (int32_t j = 0; j < r->n_hist; j++) {
                c->h_ints[at + 3 * j] = r->hist[j].token;
                c->h_ints[at + 3 * j + 1] = r->hist[j].count;
                c->h_ints[at + 3 * j + 2] = r->hist[j].in_prompt;
            }
            at += 3 * r->n_hist;
        }
        /* rows and lists travel through the scratch region, queued before
         * the launch that reads them */
        struct bump sc = scratch_of(c);
        size_t rows_b = (size_t)nr * sizeof(struct krn_cuda_sample_row);
        size_t list_b = (size_t)(at + 1) * 4;
        void *d_rows = bump_take(&sc, rows_b);
        int32_t *d_ints = bump_take(&sc, list_b);
        float *d_vals = bump_take(&sc, list_b);
        if (!d_rows || !d_ints || !d_vals)
            return inf_err_set(err, INF_E_NOMEM, "sampling lists of %zu bytes exceed the workspace",
                               rows_b + 2 * list_b);
        inf_status_t st = stage_upload(c, d_rows, c->h_rows, rows_b, err);
        if (st == INF_OK && at > 0)
            st = stage_upload(c, d_ints, c->h_ints, (size_t)at * 4, err);
        if (st == INF_OK && at > 0)
            st = stage_upload(c, d_vals, c->h_vals, (size_t)at * 4, err);
        if (st != INF_OK)
            return st;
        KRN(c, krn_cuda_sample(logits->ptr, vocab, d_rows, nr, any_sort, d_ints, d_vals,
                               c->sample_ws, c->sample_ws_bytes, o, c->stream, lep_));
    }
    written(out);
    return INF_OK;
}

/* ---- decode graphs ------------------------------------------------------------- */
static int graph_find(const struct cu_ctx *c, int32_t bucket)
{
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graph_key[i] == bucket)
            return i;
    return -1;
}

static inf_status_t cu_graph_prepare(struct eng_backend *be, const struct eng_attn_params *p,
                                     int32_t bucket, bool *have, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    inf_status_t en = enter3(c, false, false, c->up_batch, err); /* copies stay held */
    if (en != INF_OK)
        return en;
    c->fx_active = false;
    inf_status_t st = attn_list(c, p, true, bucket, &c->fx, err);
    if (st != INF_OK)
        return st;
    c->fx_active = true;
    c->fx_rows = bucket;
    *have = graph_find(c, bucket) >= 0;
    return INF_OK;
}

static inf_status_t cu_graph_launch(struct eng_backend *be, int32_t bucket, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    int i = graph_find(c, bucket);
    if (i < 0)
        return inf_err_set(err, INF_E_INVALID, "no graph recorded for %d rows", bucket);
    CU(c, cudaGraphLaunch(c->graph_exec[i], c->stream), "cudaGraphLaunch");
    return INF_OK;
}

static inf_status_t cu_graph_record(struct eng_backend *be, int32_t bucket, bool begin,
                                    struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (begin) {
        if (c->capturing || graph_find(c, bucket) >= 0 || c->n_graphs == GRAPH_MAX)
            return inf_err_set(err, INF_E_INVALID, "cannot record a graph for %d rows", bucket);
        /* Relaxed: the INT4 GEMM queries attributes and occupancy while
         * launching, which the stricter modes refuse during a capture. */
        CU(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed),
           "cudaStreamBeginCapture");
        c->capturing = true;
        return INF_OK;
    }
    if (!c->capturing)
        return inf_err_set(err, INF_E_INVALID, "no graph is being recorded");
    /* the step's last GEMM sums are zeroed inside the graph: every replay
     * leaves both buffers zero, as it finds them */
    inf_status_t cs = acc_flush(c, err);
    if (cs == INF_OK)
        cs = acc_clean(c, err);
    if (cs != INF_OK)
        return cs;
    c->capturing = false;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    cudaGraphExec_t x = NULL;
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&x, g, 0);
    if (g)
        (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        /* Capture errors are not sticky: the context is still usable and
         * the caller runs the ops again. */
        const char *msg = cudaGetErrorString(e);
        (void)cudaGetLastError();
        cudaError_t sticky = cudaStreamQuery(c->stream);
        if (sticky != cudaSuccess && sticky != cudaErrorNotReady)
            return cu_fail(c, "graph recording", cudaGetErrorString(sticky), err);
        return inf_err_set(err, INF_E_UNSUPPORTED, "graph recording failed: %s", msg);
    }
    c->graph_key[c->n_graphs] = bucket;
    c->graph_exec[c->n_graphs++] = x;
    CU(c, cudaGraphLaunch(x, c->stream), "cudaGraphLaunch");
    return INF_OK;
}

static void cu_graph_finish(struct eng_backend *be)
{
    struct cu_ctx *c = ctx_of(be);
    { /* sums no RMSNorm read written to their C; the step's words zeroed */
        struct inf_err e = {0};
        if (acc_flush(c, &e) == INF_OK)
            (void)acc_clean(c, &e);
    }
    if (c->rope_held) { /* a RoPE no attention followed: launched as it is */
        struct inf_err e = {0};
        (void)rope_flush(c, &e);
    }
    c->fx_active = false;
    if (c->capturing) { /* a recording abandoned by an error */
        cudaGraph_t g = NULL;
        c->capturing = false;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g)
            (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
    }
}

static inf_status_t cu_mem_info(struct eng_backend *be, size_t *free_bytes, size_t *total_bytes,
                                struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    CU(c, cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
    return INF_OK;
}

/* ---- table and lifetime -------------------------------------------------------- */
static void ctx_free(struct cu_ctx *c)
{
    if (cudaSetDevice(c->device) == cudaSuccess) {
        if (c->stream)
            (void)cudaStreamSynchronize(c->stream);
        if (c->blas)
            (void)cublasDestroy(c->blas);
        (void)cudaFree(c->ws);
        (void)cudaFree(c->blas_ws);
        (void)cudaFree(c->small);
        (void)cudaFree(c->gemm_ws);
        (void)cudaFree(c->deq);
        (void)cudaFree(c->acc64);
        (void)cudaFree(c->sample_ws);
        for (int i = 0; i < c->n_graphs; i++)
            (void)cudaGraphExecDestroy(c->graph_exec[i]);
        if (c->staging)
            (void)cudaFreeHost(c->staging);
        for (int i = 0; i < 2; i++) {
            if (c->land[i])
                (void)cudaFreeHost(c->land[i]);
            if (c->land_ev[i])
                (void)cudaEventDestroy(c->land_ev[i]);
        }
        if (c->stream)
            (void)cudaStreamDestroy(c->stream);
    }
    for (int i = 0; i < 2; i++)
        free(c->lists[i].host);
    free(c->h_list);
    free(c->h_ints);
    free(c->h_vals);
    free(c);
}

static void cu_destroy(struct eng_backend *be)
{
    ctx_free(be->ctx);
    free(be);
}

static const struct eng_backend_iface cuda_iface = {
    .name = "cuda",
    .destroy = cu_destroy,
    .buf_alloc = cu_buf_alloc,
    .buf_free = cu_buf_free,
    .buf_upload = cu_buf_upload,
    .buf_download = cu_buf_download,
    .weight_q4_create = cu_weight_q4_create,
    .weight_q4_destroy = cu_weight_q4_destroy,
    .linear_q4 = cu_linear_q4,
    .weight_q4_create_glu = cu_weight_q4_create_glu,
    .linear_q4_glu = cu_linear_q4_glu,
    .linear_fp = cu_linear_fp,
    .embedding = cu_embedding,
    .rmsnorm_add = cu_rmsnorm_add,
    .rope = cu_rope,
    .attn_prefill = cu_attn_prefill,
    .attn_decode = cu_attn_decode,
    .silu_mul = cu_silu_mul,
    .rows_gather = cu_rows_gather,
    .all_reduce = NULL,
    .mem_info = cu_mem_info,
    .sample_reserve = cu_sample_reserve,
    .sample = cu_sample,
    .token_feed = cu_token_feed,
    .download_start = cu_download_start,
    .download_wait = cu_download_wait,
    .graph_prepare = cu_graph_prepare,
    .graph_record = cu_graph_record,
    .graph_launch = cu_graph_launch,
    .graph_finish = cu_graph_finish,
};

/* An integer setting from the environment: name's value if it is a whole
 * decimal number in [0, hi], else def. Read once, at creation. */
static int32_t env_int(const char *name, int32_t def, int32_t hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    return end && *end == '\0' && v >= 0 && v <= hi ? (int32_t)v : def;
}

#undef CU
#define CU(c, call, what)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st =                                                                                   \
                e_ == cudaErrorMemoryAllocation                                                    \
                    ? inf_err_set(err, INF_E_NOMEM, "CUDA %s: out of memory", what)                \
                    : inf_err_set(err, INF_E_DEVICE, "CUDA %s: %s", what, cudaGetErrorString(e_)); \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

inf_status_t eng_backend_cuda_create(const struct eng_backend_cuda_opts *opts,
                                     struct eng_backend **out, struct inf_err *err)
{
    *out = NULL;
    int32_t dev = opts ? opts->device : 0;
    size_t ws = opts && opts->workspace_bytes ? opts->workspace_bytes : DEFAULT_WORKSPACE;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend cuda: no usable GPU (%s)",
                           cudaGetErrorString(e));
    }
    if (count == 0)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend cuda: no GPU found");
    if (dev < 0 || dev >= count)
        return inf_err_set(err, INF_E_INVALID, "CUDA device %d out of range (%d devices)", dev,
                           count);
    if (ws < ((size_t)4 << 20))
        return inf_err_set(err, INF_E_INVALID, "CUDA workspace of %zu bytes: at least 4 MiB", ws);
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "CUDA device %d: %s", dev, cudaGetErrorString(e));
    if (prop.major * 10 + prop.minor < 75)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "CUDA device %d (%s) has compute capability %d.%d; the CUDA backend "
                           "needs 8.0 or newer (7.5 with the INT4 GEMM fallback)",
                           dev, prop.name, prop.major, prop.minor);

    inf_status_t st = INF_OK;
    struct eng_backend *be = calloc(1, sizeof *be);
    struct cu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return inf_err_set(err, INF_E_NOMEM, "out of memory creating the CUDA backend");
    }
    c->device = dev;
    c->sms = prop.multiProcessorCount;
    CU(c, cudaSetDevice(dev), "cudaSetDevice");
    CU(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream");
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        st = inf_err_set(err, INF_E_DEVICE, "cublasCreate: %s", blas_msg(bs));
        goto fail;
    }
    CU(c, cudaMalloc(&c->blas_ws, BLAS_WORKSPACE), "cuBLAS workspace");
    if ((bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS) {
        st = inf_err_set(err, INF_E_DEVICE, "cuBLAS setup: %s", blas_msg(bs));
        goto fail;
    }
    CU(c, cudaMalloc((void **)&c->ws, ws), "workspace");
    c->ws_bytes = ws;
    /* An eighth of the workspace holds each cached work list. */
    c->list_bytes = ws / 16 / 256 * 256;
    c->lists[0].dev = c->ws;
    c->lists[1].dev = c->ws + c->list_bytes;
    c->scratch = c->ws + 2 * c->list_bytes;
    c->scratch_bytes = ws - 2 * c->list_bytes;
    for (int i = 0; i < 2; i++)
        if (!(c->lists[i].host = malloc(c->list_bytes))) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory creating the CUDA backend");
            goto fail;
        }
    CU(c, cudaMalloc((void **)&c->small, SMALL_BYTES + ATTN_COUNTERS * sizeof(int32_t)),
       "cudaMalloc");
    c->d_bad = (int32_t *)c->small;
    c->d_inv_freq = (float *)(c->small + 256);
    c->d_group_done = (int32_t *)(c->small + SMALL_BYTES);
    CU(c, cudaMemsetAsync(c->small, 0, SMALL_BYTES + ATTN_COUNTERS * sizeof(int32_t), c->stream),
       "cudaMemset");
    CU(c, cudaHostAlloc((void **)&c->staging, STAGING_BYTES, cudaHostAllocDefault),
       "pinned staging");
    const char *fu = getenv("INT4SERVE_CUDA_UPLOAD_BATCH");
    c->up_batch = !(fu && strcmp(fu, "0") == 0);
    const char *fg = getenv("INT4SERVE_CUDA_GEMV");
    c->gemv = !(fg && strcmp(fg, "0") == 0);
    const char *fgr = getenv("INT4SERVE_CUDA_GREEDY");
    c->greedy = !(fgr && strcmp(fgr, "0") == 0);
    const char *fr = getenv("INT4SERVE_CUDA_FUSE_ROPE_KV");
    c->fuse_rope_kv = !(fr && strcmp(fr, "0") == 0);
    const char *fra = getenv("INT4SERVE_CUDA_ROPE_IN_ATTN");
    c->rope_in_attn = !(fra && strcmp(fra, "0") == 0);
    const char *fa = getenv("INT4SERVE_CUDA_ACC64");
    c->defer_acc = !(fa && strcmp(fa, "0") == 0);
    c->qkv_acc_max_m = c->defer_acc && c->fuse_rope_kv && c->rope_in_attn
                           ? env_int("INT4SERVE_CUDA_QKV_WORDS", QKV_ACC_MAX_M, ACC_MAX_M)
                           : 0;
    c->glu_acc = c->defer_acc && !(fa && strcmp(fa, "2") == 0);
    /* Rows from which an INT4 linear dequantizes its weight once and uses
     * cuBLAS fp16 (the fused INT4 kernels dequantize once per token tile, so
     * their cost grows with M). From bench_gemm on the H200 (the four
     * Llama-2-7B linears): the INT4 kernel 661 us against 684 for dequantize
     * + cuBLAS at M = 768, 863 against 832 at 1024 (Llama-3-8B: 665 / 707,
     * 863 / 824); about 880 is where they cross (docs/PERF.md).
     * INT4SERVE_CUDA_DEQUANT_MIN_M overrides it; 0 turns the path off. */
    c->deq_min_m = env_int("INT4SERVE_CUDA_DEQUANT_MIN_M", DEQUANT_MIN_M, INT32_MAX);
    /* Probe: a build without kernels for this device fails here, clearly. */
    {
        struct inf_err le = {0};
        inf_status_t ps = krn_cuda_bias_add(c->small + 2048, true, 1, (const float *)c->small, 1, 1,
                                            c->stream, &le);
        if (ps == INF_OK)
            ps = cudaStreamSynchronize(c->stream) == cudaSuccess ? INF_OK : INF_E_DEVICE;
        if (ps != INF_OK) {
            (void)cudaGetLastError();
            st = inf_err_set(err, INF_E_UNSUPPORTED,
                             "CUDA device %d (%s, compute capability %d.%d): this build has no "
                             "kernels for it (CMAKE_CUDA_ARCHITECTURES)",
                             dev, prop.name, prop.major, prop.minor);
            goto fail;
        }
    }
    /* The INT4 GEMM's device description, its kernels prepared on it. */
    st = krn_cuda_device_describe(dev, &c->gpu, err);
    if (st != INF_OK)
        goto fail;
    be->iface = &cuda_iface;
    be->act_dtype = ENG_ACT_F16;
    be->kv_dtype = ENG_ACT_F16;
    /* The default step budget (engine.max_batched_tokens = 0): 8192 tokens on
     * Hopper-class devices with 70 GiB or more, as vLLM's OpenAI server does
     * on H100-class GPUs. Prefill chunks of 8192 rows amortize the INT4
     * linears' dequantize-to-fp16 (docs/CUDA.md) over four times the tokens
     * of a 2048-token step; smaller or older devices keep the engine's 2048. */
    be->step_tokens =
        prop.major >= 9 && prop.totalGlobalMem >= (size_t)70 << 30 ? 8192 : 0;
    be->ctx = c;
    inf_log(INFO, "CUDA backend on device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB", dev,
            prop.name, prop.major, prop.minor, prop.multiProcessorCount,
            (double)prop.totalGlobalMem / (double)(1u << 30));
    *out = be;
    return INF_OK;
fail:
    ctx_free(c);
    free(be);
    return st;
}

void *eng_backend_cuda_stream(const struct eng_backend *be)
{
    if (!be || !be->iface || !be->iface->name || strcmp(be->iface->name, "cuda") != 0)
        return NULL;
    const struct cu_ctx *c = be->ctx;
    return c->stream;
}

#else /* !INT4SERVE_HAVE_CUDA */

inf_status_t eng_backend_cuda_create(const struct eng_backend_cuda_opts *opts,
                                     struct eng_backend **out, struct inf_err *err)
{
    (void)opts;
    *out = NULL;
    return inf_err_set(err, INF_E_UNSUPPORTED,
                       "backend cuda: this build has no CUDA support (configure with nvcc "
                       "available and INT4SERVE_CUDA=ON)");
}

void *eng_backend_cuda_stream(const struct eng_backend *be)
{
    (void)be;
    return NULL;
}

#endif
