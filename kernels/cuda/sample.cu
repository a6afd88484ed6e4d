/*
 * sample.cu — token sampling on the GPU (kernels/sample_cuda.h).
 * Mapping  one block of 1024 threads per sampled row, three launches:
 *          prep   plain greedy rows (no bans, bias, penalties or top-n)
 *                 finish in two passes over the raw row (largest value,
 *                 then the sum for its logprob, exp in fp32);
 *                 other rows: banned row, raw log-sum-exp and top-n logprobs, bias and
 *                 penalties, then greedy rows and rows without top_k/top_p
 *                 finish here (draw in id order: each thread owns a
 *                 contiguous run of ids, a block scan of the runs' sums
 *                 finds the run holding the draw, its thread walks it);
 *          sort   rows with top_k/top_p: a stable segmented radix sort of
 *                 (value, id), descending, over their rows only (the other
 *                 rows are empty segments);
 *          select the sorted rows: candidate count, top_k, top_p prefix,
 *                 draw over the prefix, the same run-and-walk scheme.
 *          greedy (krn_cuda_sample_greedy, launches whose rows are all plain
 *                 greedy): one launch, many blocks a row, 4096 values a
 *                 block held in registers (16-byte loads, all issued at
 *                 once); each block's best value, lowest id on ties, and
 *                 its sum of exp(v - block best) go to the workspace, and
 *                 the row's last block to arrive (a counter a row) takes
 *                 the best of the bests and the sum, each block's term
 *                 scaled by exp(block best - best) in double, for the
 *                 logprob.
 * Numerics the host sampler's fp32 operations are rounded the same way
 *          (__fadd_rn and friends: no contraction into fma); sums of
 *          exp(w - max) in double, in parallel (rounding-level difference
 *          from the host's sequential order).
 * Arch     any (cub ships with the toolkit).
 */
#include "kernels/cuda/launch.cuh"
#include "kernels/sample_cuda.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <math_constants.h>

namespace
{

constexpr int kT = 1024;

struct Best {
    float v;
    int32_t i;
};

/* a before b in the order (value descending, id ascending); NaN never is. */
__device__ __forceinline__ bool before(float av, int32_t ai, float bv, int32_t bi)
{
    return av > bv || (av == bv && ai < bi);
}

struct BestOp {
    __device__ __forceinline__ Best operator()(const Best &a, const Best &b) const
    {
        return before(b.v, b.i, a.v, a.i) ? b : a;
    }
};

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        return b > a ? b : a;
    }
};

struct MaxI {
    __device__ __forceinline__ int32_t operator()(int32_t a, int32_t b) const
    {
        return b > a ? b : a;
    }
};

using ReduceF = cub::BlockReduce<float, kT>;
using ReduceD = cub::BlockReduce<double, kT>;
using ReduceB = cub::BlockReduce<Best, kT>;
using ReduceI = cub::BlockReduce<int32_t, kT>;
using ScanD = cub::BlockScan<double, kT>;

union Shared {
    typename ReduceF::TempStorage f;
    typename ReduceD::TempStorage d;
    typename ReduceB::TempStorage b;
    typename ReduceI::TempStorage i;
    typename ScanD::TempStorage s;
};

struct Ws {
    float *work;     /* [rows][vocab] processed values (sort keys in) */
    int32_t *ids;    /* [rows][vocab] ids (sort values in) */
    float *keys;     /* [rows][vocab] sorted values */
    int32_t *sids;   /* [rows][vocab] sorted ids */
    double *lse;     /* [rows] raw log-sum-exp */
    float *wmax;     /* [rows] largest value after temperature */
    int32_t *seg_lo; /* [rows] sort segment bounds */
    int32_t *seg_hi; /* [rows] */
    void *sort_tmp;
    size_t sort_bytes;
};

/* Thread 0's r (a block reduction's result) in every thread, through slot. */
template <class T> __device__ T from_thread0(T r, T *slot)
{
    if (threadIdx.x == 0)
        *slot = r;
    __syncthreads();
    r = *slot;
    __syncthreads();
    return r;
}

__device__ float block_max(Shared &sh, float x, float *bcast)
{
    return from_thread0(ReduceF(sh.f).Reduce(x, MaxOp()), bcast);
}

__device__ double block_sum(Shared &sh, double x, double *bcast)
{
    return from_thread0(ReduceD(sh.d).Sum(x), bcast);
}

__device__ Best block_best(Shared &sh, Best x, Best *bcast)
{
    return from_thread0(ReduceB(sh.b).Reduce(x, BestOp()), bcast);
}

/* The draw over positions [0, n) of a sequence whose weight at position j
 * is weight(j) (0 for non-candidates): the first j whose inclusive prefix
 * sum exceeds u * total, else last (the last candidate), -1 for total 0.
 * Each thread owns one contiguous run. */
template <class W>
__device__ int32_t block_draw(Shared &sh, int32_t n, double u, W weight, int32_t *s_pick)
{
    const int32_t run = (n + kT - 1) / kT;
    const int32_t j0 = threadIdx.x * run, j1 = min(n, j0 + run);
    double part = 0.0;
    int32_t last = -1;
    for (int32_t j = j0; j < j1; j++) {
        double e = weight(j);
        part += e;
        if (e > 0.0)
            last = j;
    }
    double base, total;
    ScanD(sh.s).ExclusiveSum(part, base, total);
    __syncthreads();
    if (threadIdx.x == 0)
        *s_pick = INT32_MAX;
    __syncthreads();
    if (total > 0.0) {
        const double r = u * total;
        if (part > 0.0 && r >= base && r < base + part) {
            double acc = base;
            for (int32_t j = j0; j < j1; j++) {
                acc += weight(j);
                if (r < acc) {
                    atomicMin(s_pick, j);
                    break;
                }
            }
        }
    }
    __syncthreads();
    int32_t pick = *s_pick;
    __syncthreads();
    if (pick == INT32_MAX) {
        /* rounding left no run: the last candidate (the host's default) */
        int32_t l = ReduceI(sh.i).Reduce(last, MaxI());
        if (threadIdx.x == 0)
            *s_pick = total > 0.0 ? l : -1;
        __syncthreads();
        pick = *s_pick;
        __syncthreads();
    }
    return pick;
}

/* Weight of id t in a row of processed values (non-candidates are -inf). */
struct RowWeight {
    const float *w;
    float wmax;
    __device__ double operator()(int32_t t) const
    {
        float v = w[t];
        return v > -CUDART_INF_F ? exp((double)v - (double)wmax) : 0.0;
    }
};

__device__ void finish(krn_cuda_sample_out *o, const float *raw, int32_t tok, double lse)
{
    o->token = tok;
    o->logprob = tok >= 0 ? (float)((double)raw[tok] - lse) : -CUDART_INF_F;
}

__global__ void __launch_bounds__(kT)
    prep_kernel(const float *logits,                            /* [*][vocab] fp32 */
                int32_t vocab, const krn_cuda_sample_row *rows, /* [n_rows] */
                const int32_t *ints,                            /* banned ids, bias ids, history */
                const float *vals,                              /* bias values */
                Ws ws, krn_cuda_sample_out *out)                /* [n_rows] */
{
    /* block = one sampled row; threads stride over the vocabulary */
    __shared__ Shared sh;
    __shared__ float s_f;
    __shared__ double s_d;
    __shared__ Best s_b;
    __shared__ int32_t s_pick;
    const int32_t ri = blockIdx.x, tid = threadIdx.x;
    const krn_cuda_sample_row p = rows[ri];
    const float *raw = logits + (int64_t)p.logit_row * vocab;
    float *w = ws.work + (int64_t)ri * vocab;
    krn_cuda_sample_out *o = out + ri;

    /* 0. plain greedy (no bans, bias, penalties or top-n): the raw row is the
     * processed row; one pass for the largest value (lowest id on ties), one
     * for the sum, exp in fp32 summed in double */
    if (p.temperature == 0.0f && p.n_ban == 0 && p.n_bias == 0 && p.n_hist == 0 &&
        p.n_logprobs <= 0) {
        Best b = {-CUDART_INF_F, INT32_MAX};
        for (int32_t t = tid; t < vocab; t += kT) {
            const float v = raw[t];
            if (before(v, t, b.v, b.i))
                b = {v, t};
        }
        b = block_best(sh, b, &s_b);
        double sum = 0.0;
        if (isfinite(b.v))
            for (int32_t t = tid; t < vocab; t += kT)
                sum += (double)expf(raw[t] - b.v);
        sum = block_sum(sh, sum, &s_d);
        if (tid == 0) {
            const double lse = (double)b.v + log(sum);
            o->n_top = 0;
            ws.lse[ri] = lse;
            ws.seg_lo[ri] = ri * vocab;
            ws.seg_hi[ri] = ri * vocab;
            finish(o, raw, b.v > -CUDART_INF_F ? b.i : -1, lse);
        }
        return;
    }

    /* 1. the banned row: logprobs come from it */
    for (int32_t t = tid; t < vocab; t += kT)
        w[t] = raw[t];
    __syncthreads();
    for (int32_t j = tid; j < p.n_ban; j += kT) {
        int32_t t = ints[p.ban_off + j];
        if (t >= 0 && t < vocab)
            w[t] = -CUDART_INF_F;
    }
    __syncthreads();
    float mx = -CUDART_INF_F;
    for (int32_t t = tid; t < vocab; t += kT)
        mx = w[t] > mx ? w[t] : mx;
    mx = block_max(sh, mx, &s_f);
    double sum = 0.0;
    if (isfinite(mx))
        for (int32_t t = tid; t < vocab; t += kT)
            sum += exp((double)w[t] - (double)mx);
    sum = block_sum(sh, sum, &s_d);
    const double lse = (double)mx + log(sum);
    const int32_t n_top = p.n_logprobs < vocab ? p.n_logprobs : vocab;
    /* top-n: each pick is the best element after the previous one in the
     * total order (value desc, id asc), so nothing needs marking */
    Best prev = {CUDART_INF_F, -1};
    for (int32_t j = 0; j < n_top; j++) {
        Best b = {-CUDART_INF_F, INT32_MAX};
        for (int32_t t = tid; t < vocab; t += kT) {
            float v = w[t];
            if (before(prev.v, prev.i, v, t) && before(v, t, b.v, b.i))
                b = {v, t};
        }
        b = block_best(sh, b, &s_b);
        if (tid == 0) {
            o->top_ids[j] = b.i;
            o->top_logprobs[j] = (float)((double)w[b.i] - lse);
        }
        prev = b;
    }
    if (tid == 0) {
        o->n_top = n_top;
        ws.lse[ri] = lse;
        ws.seg_lo[ri] = ri * vocab;
        ws.seg_hi[ri] = ri * vocab;
    }

    /* 2. bias in list order (duplicates add up, as on the host), penalties */
    if (tid == 0)
        for (int32_t j = 0; j < p.n_bias; j++) {
            int32_t t = ints[p.bias_off + j];
            w[t] = __fadd_rn(w[t], vals[p.bias_off + j]);
        }
    __syncthreads();
    for (int32_t j = tid; j < p.n_hist; j += kT) {
        const int32_t *h = ints + p.hist_off + 3 * j;
        int32_t t = h[0], cnt = h[1], inp = h[2];
        float x = w[t];
        if (p.rep != 1.0f && (inp || cnt > 0))
            x = x > 0.0f ? __fdiv_rn(x, p.rep) : __fmul_rn(x, p.rep);
        if (cnt > 0)
            x = __fsub_rn(x, __fadd_rn(__fmul_rn(p.freq, (float)cnt), p.pres));
        w[t] = x;
    }
    __syncthreads();

    /* 3. greedy */
    if (p.temperature == 0.0f) {
        Best b = {-CUDART_INF_F, INT32_MAX};
        for (int32_t t = tid; t < vocab; t += kT)
            if (before(w[t], t, b.v, b.i))
                b = {w[t], t};
        b = block_best(sh, b, &s_b);
        if (tid == 0)
            finish(o, raw, b.v > -CUDART_INF_F ? b.i : -1, lse);
        return;
    }
    float wm = -CUDART_INF_F;
    for (int32_t t = tid; t < vocab; t += kT) {
        float v = __fdiv_rn(w[t], p.temperature);
        w[t] = v;
        wm = v > wm ? v : wm;
    }
    wm = block_max(sh, wm, &s_f);
    const float cut = p.log_min_p > -CUDART_INF_F ? __fadd_rn(wm, p.log_min_p) : -CUDART_INF_F;
    for (int32_t t = tid; t < vocab; t += kT) {
        float v = w[t];
        if (!(v > -CUDART_INF_F && v >= cut))
            w[t] = -CUDART_INF_F;
        if (p.sort)
            ws.ids[(int64_t)ri * vocab + t] = t;
    }
    __syncthreads();
    if (p.sort) {
        if (tid == 0) {
            ws.wmax[ri] = wm;
            ws.seg_hi[ri] = (ri + 1) * vocab;
        }
        return;
    }
    int32_t tok = block_draw(sh, vocab, p.u, RowWeight{w, wm}, &s_pick);
    if (tid == 0)
        finish(o, raw, tok, lse);
}

/* ---- plain greedy launches: many blocks a row ---- */

constexpr int kGT = 256;              /* threads of a greedy block */
constexpr int kGPer = 16;             /* values a thread */
constexpr int kGSpan = kGT * kGPer;   /* values a block */
constexpr int kGMaxBlocks = kGT;      /* blocks a row the last block reads */
static_assert(kGMaxBlocks * kGSpan == KRN_SAMPLE_GREEDY_MAX_VOCAB, "the header's limit");

/* One block's part of a row: its best value and id, sum of exp(v - best). */
struct GreedyPart {
    float v;
    int32_t i;
    double s;
};

using GReduceB = cub::BlockReduce<Best, kGT>;
using GReduceD = cub::BlockReduce<double, kGT>;

union GShared {
    typename GReduceB::TempStorage b;
    typename GReduceD::TempStorage d;
};

__device__ Best gblock_best(GShared &sh, Best x, Best *bcast)
{
    return from_thread0(GReduceB(sh.b).Reduce(x, BestOp()), bcast);
}

__device__ double gblock_sum(GShared &sh, double x)
{
    double r = GReduceD(sh.d).Sum(x); /* valid in thread 0 */
    __syncthreads();
    return r;
}

/* grid (blocks a row, rows); vec: vocab % 4 == 0 and the logits 16-byte
 * aligned (float4 loads). */
__global__ void __launch_bounds__(kGT)
    greedy_kernel(const float *logits, int32_t vocab, krn_cuda_greedy_rows rows, bool vec,
                  GreedyPart *parts, int32_t *counters, krn_cuda_sample_out *out)
{
    __shared__ GShared sh;
    __shared__ Best s_b;
    __shared__ int32_t s_last;
    const int32_t ri = blockIdx.y, nb = gridDim.x, tid = threadIdx.x;
    const float *raw = logits + (int64_t)rows.row[ri] * vocab;
    const int32_t base = blockIdx.x * kGSpan;
    float x[kGPer];
    int32_t id[kGPer];
    if (vec) {
#pragma unroll
        for (int j = 0; j < kGPer / 4; j++) {
            const int32_t t = base + (j * kGT + tid) * 4;
            float4 q = make_float4(-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F);
            if (t < vocab)
                q = __ldg(reinterpret_cast<const float4 *>(raw + t));
            x[4 * j] = q.x, x[4 * j + 1] = q.y, x[4 * j + 2] = q.z, x[4 * j + 3] = q.w;
#pragma unroll
            for (int e = 0; e < 4; e++)
                id[4 * j + e] = t + e;
        }
    } else {
#pragma unroll
        for (int j = 0; j < kGPer; j++) {
            const int32_t t = base + j * kGT + tid;
            x[j] = t < vocab ? __ldg(raw + t) : -CUDART_INF_F;
            id[j] = t;
        }
    }
    /* the best value, lowest id on ties (ids past the vocabulary skipped) */
    Best b = {-CUDART_INF_F, INT32_MAX};
#pragma unroll
    for (int j = 0; j < kGPer; j++)
        if (id[j] < vocab && before(x[j], id[j], b.v, b.i))
            b = {x[j], id[j]};
    b = gblock_best(sh, b, &s_b);
    double sum = 0.0;
    if (isfinite(b.v))
#pragma unroll
        for (int j = 0; j < kGPer; j++)
            if (id[j] < vocab)
                sum += (double)expf(x[j] - b.v);
    sum = gblock_sum(sh, sum);
    if (tid == 0) {
        parts[(int64_t)ri * nb + blockIdx.x] = GreedyPart{b.v, b.i, sum};
        __threadfence();
        s_last = atomicAdd(&counters[ri], 1) == nb - 1;
    }
    __syncthreads();
    if (!s_last)
        return;
    /* the row's last block: every part is written and visible */
    __threadfence();
    GreedyPart p = {-CUDART_INF_F, INT32_MAX, 0.0};
    if (tid < nb) {
        const GreedyPart *q = parts + (int64_t)ri * nb + tid;
        p.v = __ldcg(&q->v);
        p.i = __ldcg(&q->i);
        p.s = __ldcg(&q->s);
    }
    const Best m = gblock_best(sh, Best{p.v, p.i}, &s_b);
    double term = 0.0;
    if (isfinite(m.v) && tid < nb && p.v > -CUDART_INF_F)
        term = p.s * exp((double)p.v - (double)m.v);
    const double total = gblock_sum(sh, term);
    if (tid == 0) {
        const double lse = (double)m.v + log(total);
        krn_cuda_sample_out *o = out + ri;
        o->n_top = 0;
        finish(o, raw, m.v > -CUDART_INF_F ? m.i : -1, lse);
        counters[ri] = 0; /* for the next launch */
    }
}

/* Weight of sorted position j (j < n): exp(key - wmax), or key / tot terms. */
struct SortedWeight {
    const float *k;
    float wmax;
    int32_t n;
    __device__ double operator()(int32_t j) const
    {
        return j < n && k[j] > -CUDART_INF_F ? exp((double)k[j] - (double)wmax) : 0.0;
    }
};

__global__ void __launch_bounds__(kT) select_kernel(const float *logits, int32_t vocab,
                                                    const krn_cuda_sample_row *rows, /* [n_rows] */
                                                    Ws ws, krn_cuda_sample_out *out) /* [n_rows] */
{
    /* block = one sampled row that needed the sorted order */
    __shared__ Shared sh;
    __shared__ double s_d;
    __shared__ int32_t s_pick, s_keep;
    const int32_t ri = blockIdx.x, tid = threadIdx.x;
    const krn_cuda_sample_row p = rows[ri];
    if (!p.sort || p.temperature == 0.0f)
        return;
    const float *k = ws.keys + (int64_t)ri * vocab;
    const int32_t *ids = ws.sids + (int64_t)ri * vocab;
    const float wm = ws.wmax[ri];
    /* candidates are a prefix of the sorted row */
    int32_t cnt = 0;
    for (int32_t t = tid; t < vocab; t += kT)
        cnt += k[t] > -CUDART_INF_F;
    cnt = ReduceI(sh.i).Sum(cnt);
    if (tid == 0)
        s_pick = cnt;
    __syncthreads();
    int32_t nc = s_pick;
    __syncthreads();
    if (p.top_k > 0 && p.top_k < nc)
        nc = p.top_k;
    if (nc > 0 && p.top_p < 1.0f) {
        /* smallest prefix whose normalized mass reaches top_p: the host adds
         * e_i / tot term by term */
        const SortedWeight sw{k, wm, nc};
        double tot = 0.0;
        for (int32_t j = tid; j < nc; j += kT)
            tot += sw(j);
        tot = block_sum(sh, tot, &s_d);
        const int32_t run = (nc + kT - 1) / kT;
        const int32_t j0 = tid * run, j1 = min(nc, j0 + run);
        double part = 0.0;
        for (int32_t j = j0; j < j1; j++)
            part += sw(j) / tot;
        double base, all;
        ScanD(sh.s).ExclusiveSum(part, base, all);
        if (tid == 0)
            s_keep = nc;
        __syncthreads();
        if (j0 < j1 && base + part >= (double)p.top_p) {
            double acc = base;
            for (int32_t j = j0; j < j1; j++) {
                acc += sw(j) / tot;
                if (acc >= (double)p.top_p) {
                    atomicMin(&s_keep, j + 1);
                    break;
                }
            }
        }
        __syncthreads();
        nc = s_keep;
        __syncthreads();
    }
    int32_t pos = nc > 0 ? block_draw(sh, nc, p.u, SortedWeight{k, wm, nc}, &s_pick) : -1;
    if (tid == 0) {
        const float *raw = logits + (int64_t)p.logit_row * vocab;
        finish(out + ri, raw, pos >= 0 ? ids[pos] : -1, ws.lse[ri]);
    }
}

struct Layout {
    size_t count, work, ids, keys, sids, lse, wmax, seg_lo, seg_hi, tmp, total;
};

size_t align256(size_t x)
{
    return (x + 255) / 256 * 256;
}

size_t sort_tmp_bytes(int32_t rows, int32_t vocab)
{
    size_t bytes = 0;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, bytes, (const float *)nullptr, (float *)nullptr, (const int32_t *)nullptr,
        (int32_t *)nullptr, (int64_t)rows * vocab, rows, (const int32_t *)nullptr,
        (const int32_t *)nullptr, 0, 32, (cudaStream_t)0);
    return e == cudaSuccess ? bytes : 0;
}

Layout layout(int32_t rows, int32_t vocab, size_t tmp_bytes)
{
    Layout l;
    const size_t rv = (size_t)rows * (size_t)vocab * 4;
    size_t at = 0;
    /* the greedy kernel's arrival counters: always first, so that a
     * workspace reused for another vocabulary keeps them zero */
    l.count = at, at += align256((size_t)KRN_SAMPLE_GREEDY_ROWS * 4);
    l.work = at, at += align256(rv);
    l.ids = at, at += align256(rv);
    l.keys = at, at += align256(rv);
    l.sids = at, at += align256(rv);
    l.lse = at, at += align256((size_t)rows * 8);
    l.wmax = at, at += align256((size_t)rows * 4);
    l.seg_lo = at, at += align256((size_t)rows * 4);
    l.seg_hi = at, at += align256((size_t)rows * 4);
    l.tmp = at, at += align256(tmp_bytes);
    l.total = at;
    return l;
}

int32_t greedy_blocks(int32_t vocab)
{
    return (vocab + kGSpan - 1) / kGSpan;
}

/* Workspace bytes the greedy kernel uses for rows of vocab: the counters,
 * then its parts where the general kernels' values go. */
size_t greedy_bytes(int32_t rows, int32_t vocab)
{
    return layout(rows, vocab, 0).work + (size_t)rows * greedy_blocks(vocab) * sizeof(GreedyPart);
}

} // namespace

extern "C" size_t krn_cuda_sample_workspace(int32_t max_rows, int32_t vocab)
{
    if (max_rows <= 0 || vocab <= 0)
        return 0;
    size_t tmp = sort_tmp_bytes(max_rows, vocab);
    if (tmp == 0)
        return 0;
    /* the sort's need is queried again per call; keep slack for it */
    const size_t total = layout(max_rows, vocab, tmp + tmp / 4 + 4096).total;
    const size_t greedy = greedy_bytes(max_rows, vocab);
    return total > greedy ? total : greedy;
}

extern "C" inf_status_t krn_cuda_sample(const float *logits, int32_t vocab,
                                        const struct krn_cuda_sample_row *rows, int32_t n_rows,
                                        bool any_sort, const int32_t *ints, const float *vals,
                                        void *ws, size_t ws_bytes, struct krn_cuda_sample_out *out,
                                        void *stream, struct inf_err *err)
{
    if (n_rows == 0)
        return INF_OK;
    if (n_rows < 0 || vocab <= 0 || (int64_t)n_rows * vocab > INT32_MAX)
        return inf_err_set(err, INF_E_INVALID, "sample: %d rows of %d", n_rows, vocab);
    const size_t tmp = any_sort ? sort_tmp_bytes(n_rows, vocab) : 0;
    const Layout l = layout(n_rows, vocab, tmp);
    if (l.total > ws_bytes || (any_sort && tmp == 0))
        return inf_err_set(err, INF_E_INVALID,
                           "sample: workspace of %zu bytes, %d rows of %d need %zu", ws_bytes,
                           n_rows, vocab, l.total);
    uint8_t *b = (uint8_t *)ws;
    Ws w;
    w.work = (float *)(b + l.work);
    w.ids = (int32_t *)(b + l.ids);
    w.keys = (float *)(b + l.keys);
    w.sids = (int32_t *)(b + l.sids);
    w.lse = (double *)(b + l.lse);
    w.wmax = (float *)(b + l.wmax);
    w.seg_lo = (int32_t *)(b + l.seg_lo);
    w.seg_hi = (int32_t *)(b + l.seg_hi);
    w.sort_tmp = b + l.tmp;
    w.sort_bytes = tmp;
    cudaStream_t st = (cudaStream_t)stream;
    prep_kernel<<<n_rows, kT, 0, st>>>(logits, vocab, rows, ints, vals, w, out);
    inf_status_t s = krncuda::launched("sample prep", err);
    if (s != INF_OK || !any_sort)
        return s;
    size_t bytes = tmp;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
        w.sort_tmp, bytes, w.work, w.keys, w.ids, w.sids, (int64_t)n_rows * vocab, n_rows, w.seg_lo,
        w.seg_hi, 0, 32, st);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "sample sort: %s", cudaGetErrorString(e));
    select_kernel<<<n_rows, kT, 0, st>>>(logits, vocab, rows, w, out);
    return krncuda::launched("sample select", err);
}

extern "C" inf_status_t krn_cuda_sample_greedy(const float *logits, int32_t vocab,
                                               const struct krn_cuda_greedy_rows *rows,
                                               int32_t n_rows, void *ws, size_t ws_bytes,
                                               struct krn_cuda_sample_out *out, void *stream,
                                               struct inf_err *err)
{
    if (n_rows == 0)
        return INF_OK;
    if (n_rows < 0 || n_rows > KRN_SAMPLE_GREEDY_ROWS || vocab <= 0)
        return inf_err_set(err, INF_E_INVALID, "sample greedy: %d rows of %d", n_rows, vocab);
    const int32_t nb = greedy_blocks(vocab);
    if (nb > kGMaxBlocks)
        return inf_err_set(err, INF_E_INVALID, "sample greedy: a vocabulary of %d is over %d",
                           vocab, kGMaxBlocks * kGSpan);
    for (int32_t i = 0; i < n_rows; i++)
        if (rows->row[i] < 0)
            return inf_err_set(err, INF_E_INVALID, "sample greedy: logits row %d", rows->row[i]);
    const Layout l = layout(n_rows, vocab, 0);
    if (greedy_bytes(n_rows, vocab) > ws_bytes)
        return inf_err_set(err, INF_E_INVALID, "sample greedy: workspace of %zu bytes too small",
                           ws_bytes);
    uint8_t *b = (uint8_t *)ws;
    const bool vec = vocab % 4 == 0 && ((uintptr_t)logits & 15) == 0;
    greedy_kernel<<<dim3(nb, n_rows), kGT, 0, (cudaStream_t)stream>>>(
        logits, vocab, *rows, vec, (GreedyPart *)(b + l.work), (int32_t *)(b + l.count), out);
    return krncuda::launched("sample greedy", err);
}
