/* engine/cuda/linear.c — INT4 weights and the linear layers of the CUDA
 * backend: the Marlin-class INT4 GEMM (kernels/int4_gemm.h), its fused
 * SiLU·mul form for a gated MLP's gate/up, dequantize + cuBLAS at large M,
 * cuBLAS or the one-row kernel for fp weights, and the fixed-point words a
 * GEMM of a fixed-shape decode step leaves for the op after it. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/cuda/cuda_impl.h"
#include "engine/par.h"
#include "engine/weights/quant.h"
#include "kernels/activation_cuda.h"
#include "kernels/gemv_cuda.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- INT4 weights ------------------------------------------------------------ */
/* The column order of an act-order weight onto the device, beside the
 * weight (waited for: w is the caller's). */
static inf_status_t perm_upload(struct cu_ctx *c, const struct krn_q4_weight *w, int32_t **out,
                                struct inf_err *err)
{
    size_t bytes = (size_t)w->k * sizeof(int32_t);
    cudaError_t e = cudaMalloc((void **)out, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        if (e == cudaErrorMemoryAllocation)
            return inf_err_set(err, INF_E_NOMEM, "out of GPU memory for a column order of %d",
                               w->k);
        return eng_cuda_fail(c, "cudaMalloc", cudaGetErrorString(e), err);
    }
    e = cudaMemcpyAsync(*out, w->perm, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        return eng_cuda_fail(c, "column order upload", cudaGetErrorString(e), err);
    return INF_OK;
}

inf_status_t eng_cuda_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
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
            st = eng_cuda_fail(c, "cudaMalloc", cudaGetErrorString(e), err);
        } else {
            /* On the backend's (non-blocking) stream, waited for: the host
             * copy is freed next and kernels on the stream read the weight. */
            e = cudaMemcpyAsync(q->dev, host, q->lay.bytes, cudaMemcpyHostToDevice, c->stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(c->stream);
            if (e != cudaSuccess)
                st = eng_cuda_fail(c, "weight upload", cudaGetErrorString(e), err);
        }
    }
    free(host);
    if (st == INF_OK && w->perm)
        st = perm_upload(c, w, &q->perm, err);
    if (st != INF_OK)
        goto fail;
    /* The GEMM's workspace grows to the largest layer (load time only). */
    size_t need = krn_int4_gemm_workspace_size(&q->plan, GEMM_MAX_M);
    if (need == 0) {
        st = eng_cuda_fail(c, "INT4 GEMM workspace size", "query failed", err);
        goto fail;
    }
    st = eng_cuda_grow_device(c, &c->gemm_ws, &c->gemm_ws_bytes, need, true, "the GEMM workspace",
                              err);
    /* So do the word buffers of a decode step's blocks. */
    if (st == INF_OK)
        st = eng_cuda_grow_device(c, &c->acc64, &c->acc64_bytes,
                                  2 * (size_t)ACC_MAX_M * (size_t)w->n * sizeof(int64_t), true,
                                  "the GEMM sums", err);
    /* The fp16 copy for large M grows to the largest INT4 layer. */
    if (st == INF_OK) {
        void *dq = c->deq;
        st = eng_cuda_grow_device(c, &dq, &c->deq_bytes, (size_t)w->n * (size_t)w->k * 2, false,
                                  "the fp16 copy of a weight (large-M linears)", err);
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
    if (q->perm)
        (void)cudaFree(q->perm);
    free(q);
    return st;
}

/* A gated MLP's [gate; up] for eng_cuda_linear_q4_glu: its rows interleaved in
 * runs of eight (krn_q4_glu_interleave), then as any INT4 weight. */
inf_status_t eng_cuda_weight_q4_create_glu(struct eng_backend *be, const struct krn_q4_weight *w,
                                           struct eng_q4w **out, struct inf_err *err)
{
    struct krn_q4_weight t;
    inf_status_t st = eng_q4_alloc(w->n, w->k, w->kp, w->group, w->symmetric, &t, err);
    if (st != INF_OK)
        return st;
    st = krn_q4_glu_interleave(w, &t, err);
    t.perm = w->perm; /* the rows move, the column order stays (borrowed) */
    if (st == INF_OK)
        st = eng_cuda_weight_q4_create(be, &t, out, err);
    t.perm = NULL;
    eng_q4_free(&t);
    if (st == INF_OK)
        ((struct cu_q4 *)(*out)->impl)->glu = true;
    return st;
}

void eng_cuda_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w)
{
    struct cu_ctx *c = ctx_of(be);
    struct cu_q4 *q = w->impl;
    if (cudaSetDevice(c->device) == cudaSuccess) {
        (void)cudaFree(q->dev);
        if (q->perm)
            (void)cudaFree(q->perm);
    }
    free(q);
}

/* ---- the step's words ----------------------------------------------------------- */
/* Zero buffer i's words left by a linear (dirty). */
static inf_status_t words_zero(struct cu_ctx *c, int32_t i, struct inf_err *err)
{
    if (c->step.acc_dirty[i] > 0)
        CU(c,
           cudaMemsetAsync(cu_acc_buf(c, i), 0, (size_t)c->step.acc_dirty[i] * sizeof(int64_t),
                           c->stream),
           "zeroing the GEMM sums");
    c->step.acc_dirty[i] = 0;
    return INF_OK;
}

inf_status_t eng_cuda_words_clean(struct cu_ctx *c, struct inf_err *err)
{
    inf_status_t st = words_zero(c, 0, err);
    if (st == INF_OK)
        st = words_zero(c, 1, err);
    c->step.acc_next = 0;
    return st;
}

inf_status_t eng_cuda_words_reduce(struct cu_ctx *c, int32_t i, struct eng_mat y, int32_t m,
                                   int32_t n, struct inf_err *err)
{
    c->step.acc_dirty[i] = 0;
    KRN(c, krn_int4_gemm_acc_reduce(cu_acc_buf(c, i), dptr(y, 2), y.ld < n ? n : y.ld, m, n,
                                    c->stream, lep_));
    eng_cuda_written(y.buf);
    return INF_OK;
}

/* ---- INT4 linears ------------------------------------------------------------- */
/* Large M: dequantize once, then one fp16 tensor-core GEMM (as eng_cuda_linear_fp:
 * row-major y = x W^T is column-major Y = W^T X). */
static inf_status_t q4_dequant_gemm(struct cu_ctx *c, const struct cu_q4 *q,
                                    const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                    bool y_f32, int32_t m, struct inf_err *err)
{
    const int32_t n = q->pub.n, k = q->pub.k;
    if (x.ld > INT_MAX || y.ld > INT_MAX)
        return inf_err_set(err, INF_E_UNSUPPORTED, "linear: row stride too large");
    const float one = 1.0f, zero = 0.0f;
    KRN(c, krn_int4_dequant_f16(&q->lay, q->dev, c->deq, k, c->stream, lep_));
    BLAS(c,
         cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, c->deq, CUDA_R_16F, k,
                      dptr(x, 2), CUDA_R_16F, ld_int(x.ld, k), &zero, dptr(y, y_f32 ? 4 : 2),
                      y_f32 ? CUDA_R_32F : CUDA_R_16F, ld_int(y.ld, n), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT),
         "cublasGemmEx");
    if (bias)
        KRN(c, krn_cuda_bias_add(dptr(y, y_f32 ? 4 : 2), y_f32, ld_int(y.ld, n), bias->ptr, n, m,
                                 c->stream, lep_));
    eng_cuda_weight_seen(bias);
    eng_cuda_written(y.buf);
    return INF_OK;
}

/* eng_cuda_q4_run on x as the GEMM takes it: q's own columns (x already
 * gathered for a weight with a column order). sc_used: bytes at the front
 * of the scratch region the caller holds (the gathered x). */
static inf_status_t q4_run(struct cu_ctx *c, const struct cu_q4 *q, const struct eng_buf *bias,
                           struct eng_mat x, struct eng_mat y, const struct eng_mat *tmp,
                           bool y_f32, int32_t m, int32_t *words, size_t sc_used,
                           struct inf_err *err)
{
    const int32_t n = q->pub.n, k = q->pub.k, ny = tmp ? n / 2 : n;
    if (words)
        *words = -1;
    const bool large = m >= DEQUANT_MIN_M && c->deq && (size_t)n * (size_t)k * 2 <= c->deq_bytes;
    if (tmp &&
        (large || k % 8 != 0 || ((m == 1 || x.ld == k) && (uintptr_t)dptr(x, 2) % 16 != 0))) {
        /* where the GEMM cannot give SiLU·mul itself: through tmp, the same
         * bits */
        inf_status_t s = q4_run(c, q, bias, x, *tmp, NULL, false, m, NULL, sc_used, err);
        if (s != INF_OK)
            return s;
        if (tmp->ld > INT_MAX || y.ld > INT_MAX)
            return inf_err_set(err, INF_E_UNSUPPORTED, "linear: row stride too large");
        KRN(c, krn_cuda_silu_mul_glu(dptr(*tmp, 2), tmp->ld, dptr(y, 2), y.ld, ny, m, c->stream,
                                     lep_));
        eng_cuda_written(y.buf);
        return INF_OK;
    }
    if (large)
        return q4_dequant_gemm(c, q, bias, x, y, y_f32, m, err);
    struct bump sc = scratch_of(c);
    sc.used = sc_used;
    uint16_t *b16 = NULL;
    if (bias) {
        b16 = bump_take(&sc, (size_t)n * 2);
        if (!b16)
            return inf_err_set(err, INF_E_NOMEM, "workspace too small for a bias of %d", n);
        KRN(c, krn_cuda_f32_to_f16(bias->ptr, n, NULL, b16, n, n, 1, c->stream, lep_));
    }
    /* The GEMM takes contiguous fp16 rows; strided views and fp32 outputs
     * go through scratch. */
    const bool x_direct = m == 1 || x.ld == k, y_direct = !y_f32 && (m == 1 || y.ld == ny);
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
    /* The fixed-point form, inside a fixed-shape decode step only (its word
     * buffers' bookkeeping is the step's) and in one launch: a block's o,
     * down or q/k/v linear leaves its sums for the op after it (words); the
     * gate/up linear of a GLU weight ends with them and SiLU·mul is taken
     * from them right after (the reduce zeroes them again). */
    const bool in_step = c->step.active && m == c->step.rows && y_direct && chunk >= m &&
                         (size_t)m * (size_t)n * sizeof(int64_t) <= c->acc64_bytes / 2;
    const bool keep = in_step && words && !tmp && !b16 && m <= ACC_MAX_M;
    const bool glu_words = in_step && tmp && m <= GLU_ACC_MAX_M;
    for (int32_t r0 = 0; r0 < m; r0 += chunk) {
        int32_t rows = m - r0 < chunk ? m - r0 : chunk;
        const uint16_t *a = (const uint16_t *)dptr(x, 2) + (int64_t)r0 * x.ld;
        if (!x_direct) {
            CU(c,
               cudaMemcpy2DAsync(xs, (size_t)k * 2, a, (size_t)x.ld * 2, (size_t)k * 2,
                                 (size_t)rows, cudaMemcpyDeviceToDevice, c->stream),
               "copy");
            a = xs;
        }
        uint16_t *cout = y_direct ? (uint16_t *)dptr(y, 2) + (int64_t)r0 * y.ld : ys;
        const int32_t ab = c->step.acc_next;
        if (keep || glu_words) {
            inf_status_t zs =
                words_zero(c, ab, err); /* words a linear that did not take them left */
            if (zs != INF_OK)
                return zs;
        }
        int32_t taken = 0;
        struct krn_int4_gemm_args ga = {.lay = &q->lay,
                                        .plan = &q->plan,
                                        .b = q->dev,
                                        .a = a,
                                        .bias = b16,
                                        .c = cout,
                                        .m = rows,
                                        .workspace = c->gemm_ws,
                                        .workspace_bytes = c->gemm_ws_bytes,
                                        .stream = c->stream,
                                        .flags = glu_words ? KRN_INT4_GEMM_GLU | KRN_INT4_GEMM_ACC64
                                                 : tmp     ? KRN_INT4_GEMM_GLU
                                                 : keep    ? KRN_INT4_GEMM_ACC64
                                                           : 0,
                                        .config = -1,
                                        .acc = keep || glu_words ? cu_acc_buf(c, ab) : NULL,
                                        .acc_taken = &taken,
                                        .acc_clear = keep ? cu_acc_buf(c, 1 - ab) : NULL,
                                        .acc_clear_words = keep ? c->step.acc_dirty[1 - ab] : 0};
        KRN(c, krn_int4_gemm(&ga, lep_));
        if (taken && glu_words) {
            KRN(c,
                krn_int4_gemm_acc_reduce_glu(cu_acc_buf(c, ab), cout, ny, m, n, c->stream, lep_));
        } else if (taken) {
            /* the block reads them; the next words linear zeroes them */
            c->step.acc_dirty[1 - ab] = 0;
            c->step.acc_dirty[ab] = (int64_t)m * n;
            c->step.acc_next = 1 - ab;
            *words = ab;
            continue;
        }
        if (y_f32) {
            float *yo = (float *)dptr(y, 4) + (int64_t)r0 * y.ld;
            KRN(c, krn_cuda_f16_to_f32(ys, ny, yo, ld_int(y.ld, ny), ny, rows, c->stream, lep_));
        } else if (!y_direct) {
            CU(c,
               cudaMemcpy2DAsync((uint16_t *)dptr(y, 2) + (int64_t)r0 * y.ld, (size_t)y.ld * 2, ys,
                                 (size_t)ny * 2, (size_t)ny * 2, (size_t)rows,
                                 cudaMemcpyDeviceToDevice, c->stream),
               "copy");
        }
    }
    eng_cuda_weight_seen(bias);
    if (!words || *words < 0)
        eng_cuda_written(y.buf);
    return INF_OK;
}

/* A weight with a column order (an act-order checkpoint): x[:, perm] is
 * gathered into the front of the scratch region, then the plain path runs
 * on it. Rows go in chunks that take at most half the region, so the plain
 * path keeps the other half for its own staging; m rows fit at once for
 * every decode step (a chunk of a 14336-wide x is over 900 rows), so the
 * words of a fixed-shape step are kept as without the gather. */
static inf_status_t q4_run_gathered(struct cu_ctx *c, const struct cu_q4 *q,
                                    const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                    const struct eng_mat *tmp, bool y_f32, int32_t m,
                                    int32_t *words, struct inf_err *err)
{
    const int32_t k = q->pub.k;
    const size_t row_bytes = (size_t)k * 2;
    struct bump sc = scratch_of(c);
    size_t fit = sc.cap / 2 / row_bytes;
    if (fit == 0)
        return inf_err_set(err, INF_E_NOMEM, "workspace too small to gather a row of %d", k);
    const int32_t chunk = fit < (size_t)m ? (int32_t)fit : m;
    uint16_t *xg = bump_take(&sc, (size_t)chunk * row_bytes);
    if (!xg)
        return inf_err_set(err, INF_E_NOMEM, "workspace too small to gather a row of %d", k);
    struct eng_buf gbuf = {.ptr = xg, .size = (size_t)chunk * row_bytes};
    if (words)
        *words = -1;
    for (int32_t r0 = 0; r0 < m; r0 += chunk) {
        const int32_t rows = m - r0 < chunk ? m - r0 : chunk;
        KRN(c, krn_cuda_gather_cols((const uint16_t *)dptr(x, 2) + (int64_t)r0 * x.ld, x.ld,
                                    q->perm, k, xg, k, rows, c->stream, lep_));
        struct eng_mat xs = {.buf = &gbuf, .off = 0, .ld = k};
        struct eng_mat ys = {.buf = y.buf, .off = y.off + (int64_t)r0 * y.ld, .ld = y.ld};
        struct eng_mat ts = tmp ? *tmp : (struct eng_mat){0};
        if (tmp)
            ts.off += (int64_t)r0 * tmp->ld;
        /* words only where one chunk holds every row: they are the step's */
        inf_status_t s = q4_run(c, q, bias, xs, ys, tmp ? &ts : NULL, y_f32, rows,
                                chunk >= m ? words : NULL, sc.used, err);
        if (s != INF_OK)
            return s;
    }
    return INF_OK;
}

inf_status_t eng_cuda_q4_run(struct cu_ctx *c, const struct cu_q4 *q, const struct eng_buf *bias,
                             struct eng_mat x, struct eng_mat y, const struct eng_mat *tmp,
                             bool y_f32, int32_t m, int32_t *words, struct inf_err *err)
{
    if (q->perm)
        return q4_run_gathered(c, q, bias, x, y, tmp, y_f32, m, words, err);
    return q4_run(c, q, bias, x, y, tmp, y_f32, m, words, 0, err);
}

inf_status_t eng_cuda_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                                const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                bool y_f32, int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    const struct cu_q4 *q = w->impl;
    if (q->glu)
        return inf_err_set(err, INF_E_INVALID, "linear_q4: a GLU weight (use linear_q4_glu)");
    return eng_cuda_q4_run(c, q, bias, x, y, NULL, y_f32, m, NULL, err);
}

inf_status_t eng_cuda_linear_q4_glu(struct eng_backend *be, const struct eng_q4w *w,
                                    struct eng_mat x, struct eng_mat tmp, struct eng_mat out,
                                    int32_t m, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    const struct cu_q4 *q = w->impl;
    if (!q->glu)
        return inf_err_set(err, INF_E_INVALID, "linear_q4_glu: not a GLU weight");
    return eng_cuda_q4_run(c, q, NULL, x, out, &tmp, false, m, NULL, err);
}

/* ---- fp linears --------------------------------------------------------------- */
inf_status_t eng_cuda_linear_fp(struct eng_backend *be, const struct eng_buf *w,
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
        /* Few rows (a batch-1 decode step's lm_head, an unquantized model's
         * linears): the weight-streaming kernel where it takes the shape
         * (kernels/cuda/gemv.cu says where it is faster than cuBLAS). */
        inf_status_t gs = INF_E_UNSUPPORTED;
        if (m <= KRN_GEMV_MAX_M) {
            struct inf_err ge = {0};
            gs = krn_cuda_gemv_f16(w->ptr, n, k, dptr(x, 2), ld_int(x.ld, k), dptr(y, ysz), y_f32,
                                   ld_int(y.ld, n), m, c->stream, &ge);
            if (gs != INF_OK && gs != INF_E_UNSUPPORTED)
                return eng_cuda_kst(c, gs, &ge, err);
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
        eng_cuda_written(y.buf);
        eng_cuda_weight_seen(w);
        eng_cuda_weight_seen(bias);
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
    eng_cuda_written(y.buf);
    eng_cuda_weight_seen(w);
    eng_cuda_weight_seen(bias);
    return INF_OK;
}

#endif
