#pragma once
/* engine/cuda/cuda_impl.h — internals of the CUDA backend, shared by its
 * files (one op family each):
 *   backend.c   creation, the table, errors, buffers, uploads, downloads
 *   linear.c    INT4 weights, the INT4 and fp linears, the GEMM's words
 *   ops.c       embedding, RMSNorm, RoPE, SiLU·mul, row gathers
 *   attention.c attention work lists and the paged attention ops
 *   blocks.c    the fused attention and MLP halves of a layer
 *   sample.c    sampling on the device, the token feed
 *   graphs.c    fixed-shape decode steps and their recorded graphs
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
 *   loading   buffers (cudaMalloc per buffer), repacked INT4 weights, the
 *             INT4 GEMM's workspace and the two word buffers, grown to the
 *             largest layer's need.
 * Ordering. Every op is queued on the backend's stream; uploads go through
 * the pinned staging ring (the host bytes are copied at once, the transfer
 * is asynchronous; a batch of them is one cudaMemcpyBatchAsync);
 * buf_download waits for the stream, which is also when the ring is
 * recycled and the device error flag is read.
 * Index buffers. Token ids, positions, sequence and block tables are
 * uploaded by the caller; small buffers keep a host copy of what was
 * uploaded (dropped for good once a kernel writes the buffer), so tables
 * are validated and attention work lists built on the host exactly as the
 * CPU backend does. Kernels still never follow an out-of-range index: they
 * write zeros and raise the device error flag, reported at the next
 * download as INF_E_INVALID.
 * State between ops. Only what backend.h declares: buffers, weights, the
 * recorded graphs, and the state of a fixed-shape decode step between
 * graph_prepare and graph_finish (struct cu_step).
 * Errors. Every CUDA and cuBLAS call is checked; a failure answers
 * INF_E_DEVICE with the call's message and marks the backend failed, so
 * every later call answers INF_E_DEVICE (the engine turns unhealthy). */
#include "engine/backend.h"
#include "kernels/cuda_device.h"
#include "kernels/int4_gemm.h"
#include "kernels/sample_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEFAULT_WORKSPACE ((size_t)64 << 20)
#define BLAS_WORKSPACE ((size_t)32 << 20)
#define STAGING_BYTES ((size_t)16 << 20)
#define UP_MAX 16                     /* copies of one upload batch */
#define SHADOW_MAX ((size_t)16 << 20) /* buffers up to this size keep a host copy */
#define GEMM_MAX_M 4096               /* rows per INT4 GEMM launch */
#define SMALL_BYTES 4096              /* error flag, RoPE frequencies */
#define ATTN_COUNTERS 4096            /* arrival counters of split decode groups */
#define SAMPLE_ROWS 32                /* rows of one sampling launch */
#define GRAPH_MAX 16                  /* recorded decode buckets */

/* Rows up to which a fixed-shape decode step's o and down projections end
 * with their sums as fixed-point words for the RMSNorm that adds them to
 * the residual, and its q/k/v projection with words the decode attention
 * reads itself (no split-K tail and no C either way). The 32-layer
 * Llama-2-7B decode replay on the H200 is faster with them at every row
 * count up to 16: 1 row 1.863 -> 1.798 ms (q/k/v), 8 rows 2.754 -> 2.667,
 * 16 rows 3.484 -> 3.431. */
#define ACC_MAX_M 16
/* Rows up to which the gate/up linear of such a step ends with its sums as
 * words, turned into SiLU·mul by a small kernel right after: faster up to 4
 * rows on the same replay (1 row 1.852 -> 1.811 ms, 4 rows 2.143 -> 2.126),
 * slower from 8 (2.448 -> 2.482). */
#define GLU_ACC_MAX_M 4
/* Rows from which an INT4 linear dequantizes its weight to fp16 once and
 * multiplies with cuBLAS: the fused kernels dequantize once per token tile,
 * so their cost grows with M; on the H200 the four Llama-2-7B linears take
 * 661 us in the INT4 kernel against 684 dequantized at M = 768, 863 against
 * 832 at 1024, and cross at about 880. */
#define DEQUANT_MIN_M 896

struct cu_buf {
    struct eng_buf pub;
    uint8_t *shadow;  /* host copy of the uploaded bytes, or NULL */
    bool shadow_dead; /* a kernel wrote the buffer: no host copy from now on */
};

struct cu_q4 {
    struct eng_q4w pub;
    struct krn_int4_gemm_layout lay;
    struct krn_int4_gemm_plan plan; /* its launches on this device */
    void *dev;                      /* repacked weight */
    int32_t *perm;                  /* device [k]: the input column of each stored column (an
                                       act-order weight; eng_cuda_q4_run gathers x first), or NULL */
    bool glu; /* [gate; up] in the GLU column order (eng_cuda_weight_q4_create_glu) */
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

/* A fixed-shape decode step, from graph_prepare to graph_finish: its rows
 * and attention work list, and the bookkeeping of the two word buffers
 * (struct cu_ctx's acc64). A linear that ends with words writes them into
 * buffer acc_next (zeroed first if words are left there) and zeroes the
 * other buffer's acc_dirty words as it runs (the block before read them);
 * the step's last words are zeroed when it ends, so both buffers are zero
 * between steps, which a recorded graph relies on. */
struct cu_step {
    bool active;
    int32_t rows;
    struct attn_layout lay;
    int32_t acc_next;
    int64_t acc_dirty[2];
};

struct cu_ctx {
    int device;
    int sms;
    bool kv_fp8;                /* the KV pools hold E4M3 codes (kv_dtype ENG_ACT_E4M3) */
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
    /* An INT4 layer dequantized to fp16 for cuBLAS (DEQUANT_MIN_M rows or
     * more), grown at load to the largest INT4 layer. */
    uint16_t *deq;
    size_t deq_bytes;
    /* Two buffers of [ACC_MAX_M][largest n] int64: the fixed-point sums
     * (words, KRN_INT4_GEMM_ACC64) that a block's linear leaves for the op
     * after it inside the block (struct cu_step). */
    void *acc64;
    size_t acc64_bytes;
    struct cu_step step;
    /* pinned staging ring */
    uint8_t *staging;
    size_t staging_used;
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
    /* tensor parallelism: the rank's communicator (NULL: one rank), and the
     * host rows of an all-reduce through host memory (the local kind) */
    struct eng_comm *comm;
    uint16_t *ar_h16;
    float *ar_f32;
    size_t ar_cap; /* elements */
    /* decode graphs: the recording in progress, the recorded buckets */
    bool capturing;
    int32_t n_graphs;
    int32_t graph_key[GRAPH_MAX];
    cudaGraphExec_t graph_exec[GRAPH_MAX];
};

static inline struct cu_ctx *ctx_of(struct eng_backend *be)
{
    return be->ctx;
}

/* ---- errors (backend.c) ---------------------------------------------------
 * eng_cuda_fail marks the backend failed and answers INF_E_DEVICE; kst passes a
 * launcher's status on (INF_E_DEVICE marks the backend failed). */
inf_status_t eng_cuda_fail(struct cu_ctx *c, const char *what, const char *msg,
                           struct inf_err *err);
const char *eng_cuda_blas_msg(cublasStatus_t s);
inf_status_t eng_cuda_kst(struct cu_ctx *c, inf_status_t st, const struct inf_err *le,
                          struct inf_err *err);

#define CU(c, call, what)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return eng_cuda_fail(c, what, cudaGetErrorString(e_), err);                            \
    } while (0)

#define BLAS(c, call, what)                                                                        \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return eng_cuda_fail(c, what, eng_cuda_blas_msg(s_), err);                             \
    } while (0)

#define KRN(c, call)                                                                               \
    do {                                                                                           \
        struct inf_err le_ = {0};                                                                  \
        struct inf_err *lep_ = &le_;                                                               \
        inf_status_t st_ = (call);                                                                 \
        if (st_ != INF_OK)                                                                         \
            return eng_cuda_kst(c, st_, lep_, err);                                                \
    } while (0)

/* Start of every op: refuse after a failure, make the backend's device
 * current on this thread (the engine thread may differ from the creator). */
inf_status_t eng_cuda_enter(struct cu_ctx *c, struct inf_err *err);

#define ENTER(c)                                                                                   \
    do {                                                                                           \
        inf_status_t en_ = eng_cuda_enter(c, err);                                                 \
        if (en_ != INF_OK)                                                                         \
            return en_;                                                                            \
    } while (0)

/* ---- buffers (backend.c) ---------------------------------------------------- */
static inline struct cu_buf *cbuf(const struct eng_buf *b)
{
    return b->impl;
}

/* A kernel (or a device copy) writes b: its host copy no longer mirrors it. */
void eng_cuda_written(const struct eng_buf *b);
/* b is read as a weight (never an index table): its host copy is not
 * needed. b may be NULL. */
void eng_cuda_weight_seen(const struct eng_buf *b);

/* The uploaded bytes of b, or NULL when they are not known on the host. */
static inline const void *shadow_of(const struct eng_buf *b)
{
    return cbuf(b)->shadow;
}

static inline void *dptr(struct eng_mat v, size_t esz)
{
    return (uint8_t *)v.buf->ptr + (size_t)v.off * esz;
}

static inline int ld_int(int64_t ld, int32_t cols)
{
    return (int)(ld < cols ? cols : ld);
}

/* Wait for the stream; recycles the staging ring. */
inf_status_t eng_cuda_sync(struct cu_ctx *c, struct inf_err *err);

/* Copies staged in the ring and issued together (cudaMemcpyBatchAsync). */
struct cu_upload_batch {
    int n;
    void *dst[UP_MAX];
    const void *src[UP_MAX];
    size_t size[UP_MAX];
};
/* Stage bytes of src for dst (src may be reused at once) into b; copies
 * too large for the ring go at once, synchronously, after what b holds. */
inf_status_t eng_cuda_batch_add(struct cu_ctx *c, struct cu_upload_batch *b, void *dst,
                                const void *src, size_t bytes, struct inf_err *err);
/* Issue b's copies (one batch when more than one) and empty it. */
inf_status_t eng_cuda_batch_issue(struct cu_ctx *c, struct cu_upload_batch *b, struct inf_err *err);
/* A buf_upload's copy into b: the buffer's host copy kept up to date. */
inf_status_t eng_cuda_batch_upload(struct cu_ctx *c, struct cu_upload_batch *b,
                                   const struct eng_upload *u, struct inf_err *err);
/* One staged copy, issued at once. */
inf_status_t eng_cuda_stage_upload(struct cu_ctx *c, void *dst, const void *src, size_t bytes,
                                   struct inf_err *err);

/* Grow the device buffer *p to at least need bytes (load time only: waits
 * for the stream), zero-filled when zero. */
inf_status_t eng_cuda_grow_device(struct cu_ctx *c, void **p, size_t *bytes, size_t need, bool zero,
                                  const char *what, struct inf_err *err);

/* ---- scratch: a bump allocator over the scratch region, reset per op ---- */
struct bump {
    uint8_t *base;
    size_t cap, used;
};

static inline void *bump_take(struct bump *b, size_t bytes)
{
    size_t at = (b->used + 255) / 256 * 256;
    if (at > b->cap || bytes > b->cap - at)
        return NULL;
    b->used = at + bytes;
    return b->base + at;
}

static inline struct bump scratch_of(struct cu_ctx *c)
{
    return (struct bump){.base = c->scratch, .cap = c->scratch_bytes, .used = 0};
}

/* ---- linears and their words (linear.c) ------------------------------------ */
/* Buffer i of the word buffers. */
static inline int64_t *cu_acc_buf(const struct cu_ctx *c, int32_t i)
{
    return (int64_t *)c->acc64 + (size_t)i * (c->acc64_bytes / 16);
}

/* y = x W^T (+ bias) for INT4 weight q, or with tmp (q a GLU weight) y =
 * SiLU(gate) * up through tmp [m][n] where needed; y_f32: an fp32 y.
 * words: NULL, or a block of the fixed-shape step asks for the sums as
 * words (m <= ACC_MAX_M, no bias): *words is then the word buffer holding
 * them, [m][n], and y is not written; -1 when the GEMM wrote y. */
inf_status_t eng_cuda_q4_run(struct cu_ctx *c, const struct cu_q4 *q, const struct eng_buf *bias,
                             struct eng_mat x, struct eng_mat y, const struct eng_mat *tmp,
                             bool y_f32, int32_t m, int32_t *words, struct inf_err *err);
/* Write buffer i's words of an [m][n] linear to y (fp16, its row stride;
 * the reduce zeroes them). */
inf_status_t eng_cuda_words_reduce(struct cu_ctx *c, int32_t i, struct eng_mat y, int32_t m,
                                   int32_t n, struct inf_err *err);
/* Zero whatever words are left: the end of a step. */
inf_status_t eng_cuda_words_clean(struct cu_ctx *c, struct inf_err *err);

/* ---- ops (ops.c) ----------------------------------------------------------- */
/* The RoPE frequencies of p on the device (uploaded when they change). */
inf_status_t eng_cuda_rope_freqs(struct cu_ctx *c, const struct eng_rope_params *p,
                                 int32_t head_dim, struct inf_err *err);
/* x += d (the words of buffer words when >= 0, else d), out = rmsnorm(x) w. */
inf_status_t eng_cuda_norm_add(struct cu_ctx *c, struct eng_mat x, const struct eng_mat *d,
                               int32_t words, const struct eng_buf *w, const struct eng_buf *perm,
                               float eps, struct eng_mat out, int32_t dim, int32_t m,
                               struct inf_err *err);

/* ---- attention (attention.c) ------------------------------------------------ */
/* Build p's work list and upload it (fixed > 0: the fixed shape of a decode
 * bucket); batch: the upload joins it instead of going at once. */
inf_status_t eng_cuda_attn_list(struct cu_ctx *c, const struct eng_attn_params *p, bool decode,
                                int32_t fixed, struct cu_upload_batch *batch,
                                struct attn_layout *lay, struct inf_err *err);
/* The decode attention of a fixed-shape step with the RoPE of its rows and
 * their K/V write inside (p's q and k heads rotated at p->pos); qkv_words
 * >= 0: q, k and v as the q/k/v linear's words in that buffer (row stride
 * qkv_n). *done false (nothing queued, the words untouched) where the fused
 * form does not take the step's views. */
inf_status_t eng_cuda_attn_fused(struct cu_ctx *c, const struct eng_attn_params *p,
                                 int32_t qkv_words, int32_t qkv_n, bool *done, struct inf_err *err);

/* ---- the table's slots, by file ------------------------------------------------ */
inf_status_t eng_cuda_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                                struct inf_err *err);
void eng_cuda_buf_free(struct eng_backend *be, struct eng_buf *buf);
inf_status_t eng_cuda_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                                 const void *src, size_t bytes, struct inf_err *err);
inf_status_t eng_cuda_buf_upload_many(struct eng_backend *be, const struct eng_upload *ups,
                                      int32_t n, struct inf_err *err);
inf_status_t eng_cuda_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                   void *dst, size_t bytes, struct inf_err *err);
inf_status_t eng_cuda_download_start(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                     size_t bytes, int slot, struct inf_err *err);
inf_status_t eng_cuda_download_wait(struct eng_backend *be, int slot, void *dst,
                                    struct inf_err *err);
inf_status_t eng_cuda_all_reduce(struct eng_backend *be, struct eng_mat x, int32_t dim, int32_t m,
                                 struct inf_err *err);
inf_status_t eng_cuda_mem_info(struct eng_backend *be, size_t *free_bytes, size_t *total_bytes,
                               struct inf_err *err);

inf_status_t eng_cuda_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
                                       struct eng_q4w **out, struct inf_err *err);
inf_status_t eng_cuda_weight_q4_create_glu(struct eng_backend *be, const struct krn_q4_weight *w,
                                           struct eng_q4w **out, struct inf_err *err);
void eng_cuda_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w);
inf_status_t eng_cuda_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                                const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                bool y_f32, int32_t m, struct inf_err *err);
inf_status_t eng_cuda_linear_q4_glu(struct eng_backend *be, const struct eng_q4w *w,
                                    struct eng_mat x, struct eng_mat tmp, struct eng_mat out,
                                    int32_t m, struct inf_err *err);
inf_status_t eng_cuda_linear_fp(struct eng_backend *be, const struct eng_buf *w,
                                enum eng_wdtype wdt, int32_t n, int32_t k,
                                const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                bool y_f32, int32_t m, struct inf_err *err);

inf_status_t eng_cuda_embedding(struct eng_backend *be, const struct eng_buf *table,
                                enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                                const struct eng_buf *ids, struct eng_mat out, int32_t m,
                                struct inf_err *err);
inf_status_t eng_cuda_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                  const struct eng_mat *delta, const struct eng_buf *w,
                                  const struct eng_buf *perm, float eps, struct eng_mat out,
                                  int32_t dim, int32_t m, struct inf_err *err);
inf_status_t eng_cuda_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                           int32_t head_dim, const struct eng_buf *pos,
                           const struct eng_rope_params *p, int32_t m, struct inf_err *err);
inf_status_t eng_cuda_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                               struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err);
inf_status_t eng_cuda_rows_gather(struct eng_backend *be, struct eng_mat x,
                                  const struct eng_buf *idx, struct eng_mat out, int32_t dim,
                                  int32_t m, struct inf_err *err);

inf_status_t eng_cuda_attn_prefill(struct eng_backend *be, const struct eng_attn_params *p,
                                   struct inf_err *err);
inf_status_t eng_cuda_attn_decode(struct eng_backend *be, const struct eng_attn_params *p,
                                  struct inf_err *err);

inf_status_t eng_cuda_attn_block(struct eng_backend *be, const struct eng_attn_block *p,
                                 struct inf_err *err);
inf_status_t eng_cuda_mlp_block(struct eng_backend *be, const struct eng_mlp_block *p,
                                struct inf_err *err);

inf_status_t eng_cuda_sample_reserve(struct eng_backend *be, int32_t vocab, struct inf_err *err);
inf_status_t eng_cuda_sample(struct eng_backend *be, const struct eng_buf *logits,
                             int32_t n_logit_rows, int32_t vocab, const struct eng_sample_row *rows,
                             int32_t n, struct eng_buf *out, int32_t out_first,
                             struct inf_err *err);
inf_status_t eng_cuda_token_feed(struct eng_backend *be, struct eng_buf *tok,
                                 const struct eng_buf *feed, const struct eng_buf *samples,
                                 int32_t n, struct inf_err *err);

inf_status_t eng_cuda_graph_prepare(struct eng_backend *be, const struct eng_attn_params *p,
                                    int32_t bucket, const struct eng_upload *ups, int32_t n_ups,
                                    bool *have, struct inf_err *err);
inf_status_t eng_cuda_graph_record(struct eng_backend *be, int32_t bucket, bool begin,
                                   struct inf_err *err);
inf_status_t eng_cuda_graph_launch(struct eng_backend *be, int32_t bucket, struct inf_err *err);
void eng_cuda_graph_finish(struct eng_backend *be);
