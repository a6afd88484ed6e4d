/* engine/cuda/backend.c — the CUDA backend: fp16 activations and KV on one
 * GPU, behind the same table as the CPU reference (engine/backend.h). This
 * file: creation and the table, errors, buffers, uploads and downloads;
 * engine/cuda/cuda_impl.h has the memory plan and the other files. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/cuda/cuda_impl.h"
#include "engine/tp/comm.h"
#include "kernels/activation_cuda.h"
#include "kernels/embedding_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(SAMPLE_ROWS <= KRN_SAMPLE_GREEDY_ROWS, "a launch's rows fit the greedy kernel's");

/* The device writes struct krn_cuda_sample_out; the engine reads it as
 * struct eng_sample_out: one layout. */
_Static_assert(sizeof(struct eng_sample_out) == sizeof(struct krn_cuda_sample_out) &&
                   ENG_SAMPLE_TOP == KRN_SAMPLE_TOP &&
                   offsetof(struct eng_sample_out, top_logprobs) ==
                       offsetof(struct krn_cuda_sample_out, top_logprobs),
               "sample result layouts differ");

/* ---- errors -------------------------------------------------------------- */
inf_status_t eng_cuda_fail(struct cu_ctx *c, const char *what, const char *msg, struct inf_err *err)
{
    if (!c->failed) {
        c->failed = true;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%.100s: %.300s", what, msg);
        inf_log(ERROR, "CUDA backend failed: %s: %s", what, msg);
    }
    return inf_err_set(err, INF_E_DEVICE, "CUDA %s: %s", what, msg);
}

const char *eng_cuda_blas_msg(cublasStatus_t s)
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

inf_status_t eng_cuda_kst(struct cu_ctx *c, inf_status_t st, const struct inf_err *le,
                          struct inf_err *err)
{
    if (st == INF_OK)
        return INF_OK;
    if (st == INF_E_DEVICE)
        return eng_cuda_fail(c, "kernel", le->msg, err);
    return inf_err_set(err, st, "%s", le->msg);
}

inf_status_t eng_cuda_enter(struct cu_ctx *c, struct inf_err *err)
{
    if (c->failed)
        return inf_err_set(err, INF_E_DEVICE, "the CUDA backend failed earlier (%s)", c->fail_msg);
    int cur = -1;
    CU(c, cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != c->device)
        CU(c, cudaSetDevice(c->device), "cudaSetDevice");
    return INF_OK;
}

/* ---- buffers -------------------------------------------------------------- */
void eng_cuda_written(const struct eng_buf *b)
{
    struct cu_buf *cb = cbuf(b);
    free(cb->shadow);
    cb->shadow = NULL;
    cb->shadow_dead = true;
}

void eng_cuda_weight_seen(const struct eng_buf *b)
{
    if (b && cbuf(b)->shadow)
        eng_cuda_written(b);
}

inf_status_t eng_cuda_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
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
        return eng_cuda_fail(c, "cudaMalloc", cudaGetErrorString(e), err);
    }
    b->pub.ptr = p;
    b->pub.size = bytes;
    b->pub.impl = b;
    *out = &b->pub;
    return INF_OK;
}

void eng_cuda_buf_free(struct eng_backend *be, struct eng_buf *buf)
{
    struct cu_ctx *c = ctx_of(be);
    struct cu_buf *b = cbuf(buf);
    if (cudaSetDevice(c->device) == cudaSuccess)
        (void)cudaFree(buf->ptr); /* implicitly waits for work that uses it */
    free(b->shadow);
    free(b);
}

inf_status_t eng_cuda_sync(struct cu_ctx *c, struct inf_err *err)
{
    if (c->capturing)
        return inf_err_set(err, INF_E_UNSUPPORTED, "a synchronization while recording a graph");
    CU(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    c->staging_used = 0;
    return INF_OK;
}

inf_status_t eng_cuda_batch_issue(struct cu_ctx *c, struct cu_upload_batch *b, struct inf_err *err)
{
    const int n = b->n;
    b->n = 0;
    if (n == 0)
        return INF_OK;
    if (n == 1) {
        CU(c, cudaMemcpyAsync(b->dst[0], b->src[0], b->size[0], cudaMemcpyHostToDevice, c->stream),
           "upload");
        return INF_OK;
    }
    struct cudaMemcpyAttributes at;
    memset(&at, 0, sizeof at);
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
    CU(c, cudaMemcpyBatchAsync(b->dst, b->src, b->size, (size_t)n, &at, &idx, 1, c->stream),
       "batched upload");
    return INF_OK;
}

inf_status_t eng_cuda_batch_add(struct cu_ctx *c, struct cu_upload_batch *b, void *dst,
                                const void *src, size_t bytes, struct inf_err *err)
{
    /* A recorded copy would read the staging bytes of the recording at
     * every replay. */
    if (c->capturing)
        return inf_err_set(err, INF_E_UNSUPPORTED, "an upload while recording a graph");
    inf_status_t st;
    if (bytes > STAGING_BYTES) {
        /* Large uploads happen while loading: a plain synchronous copy. */
        if ((st = eng_cuda_batch_issue(c, b, err)) != INF_OK)
            return st;
        CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
        return eng_cuda_sync(c, err);
    }
    /* The ring is recycled only once what it holds was issued and done. */
    if (c->staging_used + bytes > STAGING_BYTES &&
        ((st = eng_cuda_batch_issue(c, b, err)) != INF_OK ||
         (st = eng_cuda_sync(c, err)) != INF_OK))
        return st;
    if (b->n == UP_MAX && (st = eng_cuda_batch_issue(c, b, err)) != INF_OK)
        return st;
    uint8_t *s = c->staging + c->staging_used;
    memcpy(s, src, bytes);
    c->staging_used += (bytes + 255) / 256 * 256;
    b->dst[b->n] = dst;
    b->src[b->n] = s;
    b->size[b->n++] = bytes;
    return INF_OK;
}

inf_status_t eng_cuda_stage_upload(struct cu_ctx *c, void *dst, const void *src, size_t bytes,
                                   struct inf_err *err)
{
    struct cu_upload_batch b = {0};
    inf_status_t st = eng_cuda_batch_add(c, &b, dst, src, bytes, err);
    return st == INF_OK ? eng_cuda_batch_issue(c, &b, err) : st;
}

inf_status_t eng_cuda_batch_upload(struct cu_ctx *c, struct cu_upload_batch *b,
                                   const struct eng_upload *u, struct inf_err *err)
{
    if (u->bytes == 0)
        return INF_OK;
    struct cu_buf *cb = cbuf(u->dst);
    if (!cb->shadow && !cb->shadow_dead && u->dst->size <= SHADOW_MAX)
        cb->shadow = calloc(1, u->dst->size); /* on failure: simply no host copy */
    if (cb->shadow)
        memcpy(cb->shadow + u->off, u->src, u->bytes);
    return eng_cuda_batch_add(c, b, (uint8_t *)u->dst->ptr + u->off, u->src, u->bytes, err);
}

inf_status_t eng_cuda_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                                 const void *src, size_t bytes, struct inf_err *err)
{
    const struct eng_upload u = {dst, off, src, bytes};
    return eng_cuda_buf_upload_many(be, &u, 1, err);
}

inf_status_t eng_cuda_buf_upload_many(struct eng_backend *be, const struct eng_upload *ups,
                                      int32_t n, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    struct cu_upload_batch b = {0};
    for (int32_t i = 0; i < n; i++) {
        inf_status_t st = eng_cuda_batch_upload(c, &b, &ups[i], err);
        if (st != INF_OK)
            return st;
    }
    return eng_cuda_batch_issue(c, &b, err);
}

inf_status_t eng_cuda_grow_device(struct cu_ctx *c, void **p, size_t *bytes, size_t need, bool zero,
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
        return eng_cuda_fail(c, what, cudaGetErrorString(e), err);
    return INF_OK;
}

/* ---- downloads -------------------------------------------------------------- */
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
 * with both destinations pinned (pinned), as one operation of the stream
 * (cudaMemcpyBatchAsync). */
static inf_status_t download_flagged(struct cu_ctx *c, void *flag, void *dst, const void *src,
                                     size_t bytes, bool pinned, struct inf_err *err)
{
    void *dsts[2] = {flag, dst};
    const void *srcs[2] = {c->d_bad, src};
    size_t sizes[2] = {sizeof(int32_t), bytes};
    if (pinned && bytes) {
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

inf_status_t eng_cuda_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                   void *dst, size_t bytes, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    /* The error flag travels with the download: one synchronization. */
    size_t flag_at = (c->staging_used + 255) / 256 * 256;
    if (flag_at + 256 + bytes > STAGING_BYTES) {
        inf_status_t st = eng_cuda_sync(c, err);
        if (st != INF_OK)
            return st;
        flag_at = 0;
    }
    int32_t *flag = (int32_t *)(c->staging + flag_at);
    uint8_t *land = bytes <= STAGING_BYTES - flag_at - 256 ? c->staging + flag_at + 256 : NULL;
    inf_status_t st = download_flagged(c, flag, land ? (void *)land : dst,
                                       (const uint8_t *)src->ptr + off, bytes, land != NULL, err);
    if (st == INF_OK)
        st = eng_cuda_sync(c, err);
    if (st != INF_OK)
        return st;
    if (land)
        memcpy(dst, land, bytes);
    return bad_flag(c, *flag, err);
}

inf_status_t eng_cuda_download_start(struct eng_backend *be, const struct eng_buf *src, size_t off,
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

inf_status_t eng_cuda_download_wait(struct eng_backend *be, int slot, void *dst,
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
        inf_status_t st = eng_cuda_sync(c, err);
        if (st != INF_OK)
            return st;
    }
    memcpy(dst, c->land[slot] + 256, c->land_bytes[slot]);
    return bad_flag(c, *(const int32_t *)c->land[slot], err);
}

inf_status_t eng_cuda_all_reduce(struct eng_backend *be, struct eng_mat x, int32_t dim, int32_t m,
                                 struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (!c->comm || m == 0)
        return INF_OK; /* a group of one */
    if (eng_comm_on_device(c->comm)) {
        /* NCCL on the stream: one contiguous block, capturable */
        if (m > 1 && x.ld != dim)
            return inf_err_set(err, INF_E_UNSUPPORTED, "all_reduce: rows of %d at stride %lld", dim,
                               (long long)x.ld);
        struct inf_err ne = {0};
        inf_status_t st =
            eng_comm_all_reduce_f16_dev(c->comm, dptr(x, 2), (size_t)m * dim, c->stream, &ne);
        if (st == INF_E_DEVICE)
            return eng_cuda_fail(c, "NCCL", ne.msg, err);
        if (st != INF_OK)
            return inf_err_set(err, st, "%s", ne.msg);
        eng_cuda_written(x.buf);
        return INF_OK;
    }
    /* Through host memory: ranks that share a GPU (tests), or a build
     * without NCCL. It synchronizes, so a step with it is not recorded. */
    if (c->capturing)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "an all-reduce through host memory while recording a graph");
    const size_t n = (size_t)m * (size_t)dim;
    if (n > c->ar_cap) {
        uint16_t *h = realloc(c->ar_h16, n * sizeof *h);
        if (h)
            c->ar_h16 = h;
        float *f = h ? realloc(c->ar_f32, n * sizeof *f) : NULL;
        if (f)
            c->ar_f32 = f;
        if (!h || !f)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for an all-reduce of %zu", n);
        c->ar_cap = n;
    }
    CU(c,
       cudaMemcpy2DAsync(c->ar_h16, (size_t)dim * 2, dptr(x, 2), (size_t)x.ld * 2, (size_t)dim * 2,
                         (size_t)m, cudaMemcpyDeviceToHost, c->stream),
       "all-reduce download");
    CU(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    for (size_t i = 0; i < n; i++)
        c->ar_f32[i] = inf_f16_to_f32(c->ar_h16[i]);
    inf_status_t st = eng_comm_all_reduce_f32(c->comm, c->ar_f32, dim, m, dim, err);
    if (st != INF_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        c->ar_h16[i] = inf_f32_to_f16(c->ar_f32[i]);
    CU(c,
       cudaMemcpy2DAsync(dptr(x, 2), (size_t)x.ld * 2, c->ar_h16, (size_t)dim * 2, (size_t)dim * 2,
                         (size_t)m, cudaMemcpyHostToDevice, c->stream),
       "all-reduce upload");
    /* the host rows are reused by the next call */
    CU(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    eng_cuda_written(x.buf);
    return INF_OK;
}

inf_status_t eng_cuda_mem_info(struct eng_backend *be, size_t *free_bytes, size_t *total_bytes,
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
    free(c->ar_h16);
    free(c->ar_f32);
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
    .buf_alloc = eng_cuda_buf_alloc,
    .buf_free = eng_cuda_buf_free,
    .buf_upload = eng_cuda_buf_upload,
    .buf_download = eng_cuda_buf_download,
    .buf_upload_many = eng_cuda_buf_upload_many,
    .weight_q4_create = eng_cuda_weight_q4_create,
    .weight_q4_destroy = eng_cuda_weight_q4_destroy,
    .linear_q4 = eng_cuda_linear_q4,
    .weight_q4_create_glu = eng_cuda_weight_q4_create_glu,
    .linear_q4_glu = eng_cuda_linear_q4_glu,
    .linear_fp = eng_cuda_linear_fp,
    .embedding = eng_cuda_embedding,
    .rmsnorm_add = eng_cuda_rmsnorm_add,
    .rope = eng_cuda_rope,
    .attn_prefill = eng_cuda_attn_prefill,
    .attn_decode = eng_cuda_attn_decode,
    .silu_mul = eng_cuda_silu_mul,
    .rows_gather = eng_cuda_rows_gather,
    .attn_block = eng_cuda_attn_block,
    .mlp_block = eng_cuda_mlp_block,
    .all_reduce = eng_cuda_all_reduce,
    .mem_info = eng_cuda_mem_info,
    .sample_reserve = eng_cuda_sample_reserve,
    .sample = eng_cuda_sample,
    .token_feed = eng_cuda_token_feed,
    .download_start = eng_cuda_download_start,
    .download_wait = eng_cuda_download_wait,
    .graph_prepare = eng_cuda_graph_prepare,
    .graph_record = eng_cuda_graph_record,
    .graph_launch = eng_cuda_graph_launch,
    .graph_finish = eng_cuda_graph_finish,
};

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
                           "needs 7.5 or newer",
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
    c->comm = opts ? opts->comm : NULL;
    CU(c, cudaSetDevice(dev), "cudaSetDevice");
    CU(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream");
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        st = inf_err_set(err, INF_E_DEVICE, "cublasCreate: %s", eng_cuda_blas_msg(bs));
        goto fail;
    }
    CU(c, cudaMalloc(&c->blas_ws, BLAS_WORKSPACE), "cuBLAS workspace");
    if ((bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS) {
        st = inf_err_set(err, INF_E_DEVICE, "cuBLAS setup: %s", eng_cuda_blas_msg(bs));
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
    /* The kernels the device runs (every launcher on it follows them), then
     * the INT4 GEMM's device description, its kernels prepared on it. */
    st = krn_cuda_kernels_set(
        dev, opts && opts->sm75 ? KRN_CUDA_KERNELS_SM75 : KRN_CUDA_KERNELS_AUTO, err);
    if (st == INF_OK)
        st = krn_cuda_device_describe(dev, &c->gpu, err);
    if (st != INF_OK)
        goto fail;
    be->iface = &cuda_iface;
    be->act_dtype = ENG_ACT_F16;
    be->kv_dtype = opts && opts->kv_fp8 ? ENG_ACT_E4M3 : ENG_ACT_F16;
    c->kv_fp8 = be->kv_dtype == ENG_ACT_E4M3;
    /* The default step budget (engine.max_batched_tokens = 0): 8192 tokens on
     * Hopper-class devices with 70 GiB or more, as vLLM's OpenAI server does
     * on H100-class GPUs. Prefill chunks of 8192 rows amortize the INT4
     * linears' dequantize-to-fp16 over four times the tokens of a 2048-token
     * step; smaller or older devices keep the engine's 2048. */
    be->step_tokens = prop.major >= 9 && prop.totalGlobalMem >= (size_t)70 << 30 ? 8192 : 0;
    be->ctx = c;
    inf_log(INFO, "CUDA backend on device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB", dev,
            prop.name, prop.major, prop.minor, prop.multiProcessorCount,
            (double)prop.totalGlobalMem / (double)(1u << 30));
    if (c->gpu.cc < prop.major * 10 + prop.minor)
        inf_log(INFO, "CUDA device %d runs the sm_%d kernels (%s)", dev, (int)c->gpu.cc,
                opts && opts->sm75 ? "engine.cuda_kernels = \"sm75\""
                                   : "the newest code this build has for it");
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
    if (be && be->iface)
        return NULL;
    return NULL;
}

#endif
