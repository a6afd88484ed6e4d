/* bench_attn — paged decode attention (kernels/attn_cuda.h): the SIMT
 * kernel with its combine kernel against the tensor-core decode kernel
 * (automatic choice and every compiled configuration), in one run, on the
 * serving shapes of Llama-2-7B (32 heads, 32 KV heads, head_dim 128) and
 * Llama-3-8B (32 / 8, GQA 4).
 *
 *   bench_attn [--replays R] [--quick] [--kv fp16|fp8|both] [--case TEXT]
 *
 * Every case runs on fp16 K/V pools and on fp8 (E4M3) pools of the same
 * shape (--kv both, the default), in the same call; the summary gives the
 * fp8 speed-up of the automatic choice. The E4M3 pools hold codes of
 * uniform values with k_scale = v_scale = 1 / 64, the reference reads the
 * codes' values (kernels/fp8.h) times the scale. --case runs the cases whose
 * name contains TEXT ("128x512") only.
 *
 * Work lists are built as engine/cuda/backend_cuda.c builds them (one row set
 * per sequence and KV head; keys split when the row sets would leave
 * resident blocks unused, up to one wave of them). Method: K/V pools hold
 * enough copies of each case to exceed 4x the L2 (at least 256 MiB), each
 * with its own shuffled block tables, and launches cycle the copies, so
 * every launch reads its K/V from HBM; a CUDA graph of many launches is
 * replayed after a warm-up and the per-launch time is the median replay
 * over the launches in it (the combine kernel of the SIMT path included).
 * Bytes = the K and V rows of every position of every sequence, read once
 * (Q and the output are a few KB). Ceiling measured in the same run: a
 * 1 GiB device-to-device copy with 16-byte loads (bytes read + written).
 * Correctness: for each case and implementation, the first two sequences
 * (all heads) of copy 0 against a float64 host reference; the largest
 * relative error is printed. */
#include "bench/common/graph_timer.cuh"
#include "common/inf.h"
#include "kernels/attn_cuda.h"
#include "kernels/fp8.h"

#include <algorithm>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CS(x)                                                                                      \
    do {                                                                                           \
        struct inf_err err_ = {};                                                                  \
        inf_status_t s_ = (x);                                                                     \
        if (s_ != INF_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, err_.msg);                  \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

constexpr int kBlock = 16; /* tokens per KV block, as the engine's */

__global__ void fill_random_half(half *x, int64_t n, uint64_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = (float)(z >> 40) / (float)(1u << 24);
        x[i] = __float2half(2.0f * u - 1.0f);
    }
}

/* E4M3 codes of uniform values in [-1, 1) / scale. */
__global__ void fill_random_e4m3(uint8_t *x, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = (float)(z >> 40) / (float)(1u << 24);
        x[i] = krn_e4m3_encode((2.0f * u - 1.0f) / scale);
    }
}

constexpr float kFp8Scale = 1.0f / 64;

__global__ void copy_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static uint64_t g_rng = 0x1234567;
static uint64_t rnd()
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct bcase {
    const char *name;
    int n_seqs, ctx, n_heads, n_kv, hd;
};

static const bcase kCases[] = {
    {"a l2 128x512", 128, 512, 32, 32, 128}, {"b l3 64x2048", 64, 2048, 32, 8, 128},
    {"c l3 1x32768", 1, 32768, 32, 8, 128},  {"d l2 1x384", 1, 384, 32, 32, 128},
    {"d l3 1x384", 1, 384, 32, 8, 128},      {"l2 1x32768", 1, 32768, 32, 32, 128},
    {"l3 128x512", 128, 512, 32, 8, 128},    {"l2 32x2048", 32, 2048, 32, 32, 128},
    {"l3 8x4096", 8, 4096, 32, 8, 128},      {"hd64 64x1024", 64, 1024, 32, 8, 64},
};

static cudaStream_t g_stream;


/* The work list of one case for one implementation, as the backend builds
 * it for an eager decode step (every sequence decodes its token at
 * position ctx - 1). */
struct wlist {
    std::vector<krn_cuda_attn_item> items;
    std::vector<krn_cuda_attn_group> groups;
    int n_parts = 0;
    int rows = 0;
};

static wlist build_list(const bcase &c, const struct krn_cuda_attn_config &cfg, int sms)
{
    wlist w;
    const int G = c.n_heads / c.n_kv, R = cfg.rows;
    w.rows = R;
    const int64_t n_chunks = (int64_t)c.n_seqs * c.n_kv * ((G + R - 1) / R);
    const int64_t max_splits = krn_cuda_attn_splits_cap(n_chunks, sms, &cfg);
    for (int s = 0; s < c.n_seqs; s++)
        for (int kvh = 0; kvh < c.n_kv; kvh++)
            for (int row0 = 0; row0 < G; row0 += R) {
                const int nr = std::min(R, G - row0), ctx = c.ctx;
                int64_t splits =
                    std::min<int64_t>((ctx + cfg.split_keys - 1) / cfg.split_keys, max_splits);
                int len = ctx;
                if (splits > 1) {
                    len = (int)((ctx + splits - 1) / splits);
                    len = (len + cfg.tile - 1) / cfg.tile * cfg.tile;
                    splits = (ctx + len - 1) / len;
                }
                const int group = (int)w.groups.size();
                if (splits > 1)
                    w.groups.push_back({(int32_t)w.items.size(), (int32_t)splits});
                for (int j = 0; j < splits; j++) {
                    krn_cuda_attn_item it;
                    memset(&it, 0, sizeof it);
                    it.t_first = s;
                    it.p_first = ctx - 1;
                    it.slot = s;
                    it.kvh = kvh;
                    it.row0 = row0;
                    it.nrows = nr;
                    it.k0 = j * len;
                    it.k1 = std::min((j + 1) * len, ctx);
                    it.part = splits > 1 ? w.n_parts++ : -1;
                    it.group = splits > 1 ? group : 0;
                    w.items.push_back(it);
                }
            }
    return w;
}

/* One copy of a case's data: block table, queries, output. */
struct copy_data {
    int32_t *d_bt;
    half *d_q, *d_out;
    std::vector<int32_t> bt;
};

static double ref_check(const bcase &c, const void *k_pool, const void *v_pool, bool fp8,
                        const copy_data &cp)
{
    const int G = c.n_heads / c.n_kv, hd = c.hd, per_seq = (c.ctx + kBlock - 1) / kBlock;
    const int64_t kv_row = (int64_t)c.n_kv * hd;
    const int check = std::min(c.n_seqs, 2);
    const size_t es = fp8 ? 1 : 2;
    std::vector<half> q((size_t)check * c.n_heads * hd), out(q.size());
    CK(cudaMemcpy(q.data(), cp.d_q, q.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out.data(), cp.d_out, out.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<half> kb((size_t)kBlock * kv_row), vb(kb.size());
    std::vector<uint8_t> kc(kb.size()), vc(kb.size());
    std::vector<float> kf((size_t)c.ctx * kv_row), vf(kf.size());
    double d2 = 0, r2 = 0;
    for (int s = 0; s < check; s++) {
        for (int b = 0; b < per_seq; b++) {
            const int64_t blk = cp.bt[(size_t)s * per_seq + b];
            const size_t at = (size_t)blk * kBlock * kv_row * es;
            CK(cudaMemcpy(fp8 ? (void *)kc.data() : (void *)kb.data(), (const char *)k_pool + at,
                          kb.size() * es, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(fp8 ? (void *)vc.data() : (void *)vb.data(), (const char *)v_pool + at,
                          vb.size() * es, cudaMemcpyDeviceToHost));
            for (int r = 0; r < kBlock && b * kBlock + r < c.ctx; r++)
                for (int64_t e = 0; e < kv_row; e++) {
                    const size_t i = (size_t)(b * kBlock + r) * kv_row + e;
                    kf[i] = fp8 ? krn_e4m3_decode(kc[r * kv_row + e]) * kFp8Scale
                                : __half2float(kb[r * kv_row + e]);
                    vf[i] = fp8 ? krn_e4m3_decode(vc[r * kv_row + e]) * kFp8Scale
                                : __half2float(vb[r * kv_row + e]);
                }
        }
        std::vector<double> sc(c.ctx);
        for (int h = 0; h < c.n_heads; h++) {
            const int kvh = h / G;
            const half *qh = &q[((size_t)s * c.n_heads + h) * hd];
            double mx = -INFINITY;
            for (int p = 0; p < c.ctx; p++) {
                double a = 0;
                for (int d = 0; d < hd; d++)
                    a += (double)__half2float(qh[d]) * kf[(size_t)p * kv_row + kvh * hd + d];
                sc[p] = a / sqrt((double)hd);
                mx = std::max(mx, sc[p]);
            }
            double l = 0;
            for (int p = 0; p < c.ctx; p++)
                l += (sc[p] = exp(sc[p] - mx));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int p = 0; p < c.ctx; p++)
                    o += sc[p] * vf[(size_t)p * kv_row + kvh * hd + d];
                o /= l;
                const double g = __half2float(out[((size_t)s * c.n_heads + h) * hd + d]);
                d2 += (g - o) * (g - o);
                r2 += o * o;
                if (!std::isfinite(g))
                    d2 += 1e30;
            }
        }
    }
    return sqrt(d2 / r2);
}

int main(int argc, char **argv)
{
    int replays = 7;
    bool quick = false;
    std::vector<bool> kvs = {false, true}; /* fp8 pools */
    const char *only = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--replays") && i + 1 < argc)
            replays = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            const char *k = argv[++i];
            kvs = !strcmp(k, "fp16")  ? std::vector<bool>{false}
                  : !strcmp(k, "fp8") ? std::vector<bool>{true}
                                      : std::vector<bool>{false, true};
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [--replays R] [--quick] [--kv fp16|fp8|both] [--case TEXT]\n",
                    argv[0]);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no GPU\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    printf("device %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);

    /* Bandwidth ceiling: 1 GiB copy. */
    double copy_tbs;
    {
        const int64_t n = (int64_t)1 << 26; /* uint4 */
        uint4 *a, *b;
        CK(cudaMalloc(&a, n * 16));
        CK(cudaMalloc(&b, n * 16));
        CK(cudaMemset(a, 1, n * 16));
        double us = time_graph(g_stream, 4, replays, [&](int) {
            copy_kernel<<<prop.multiProcessorCount * 8, 512, 0, g_stream>>>(a, b, n);
        });
        copy_tbs = 2.0 * n * 16 / (us * 1e-6) / 1e12;
        printf("copy ceiling: %.2f TB/s (read + write, 1 GiB)\n", copy_tbs);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    /* Device scratch shared by every case: partials, counters, lists. */
    const size_t part_bytes = (size_t)48 << 20;
    float *d_part;
    int32_t *d_done;
    CK(cudaMalloc(&d_part, part_bytes));
    CK(cudaMalloc(&d_done, 1 << 20));
    CK(cudaMemset(d_done, 0, 1 << 20));

    const int n_impl = krn_cuda_attn_impl_count();
    std::vector<int> impls = {KRN_ATTN_SIMT, KRN_ATTN_AUTO};
    if (!quick)
        for (int i = 2; i < n_impl; i++)
            impls.push_back(i);
    struct row {
        const char *cas;
        int impl;
        bool fp8;
        double us, tbs, err;
        int items;
    };
    std::vector<row> rows;
    for (const bcase &c : kCases)
        for (bool fp8 : kvs) {
            if (only && !strstr(c.name, only))
                continue;
            const int per_seq = (c.ctx + kBlock - 1) / kBlock;
            const int64_t kv_row = (int64_t)c.n_kv * c.hd;
            const int es = fp8 ? 1 : 2;
            const double bytes = 2.0 * c.n_seqs * (double)c.ctx * kv_row * es;
            const int64_t blocks_one = (int64_t)c.n_seqs * per_seq;
            int copies = (int)std::max<double>(1.0, ceil((256.0 * (1 << 20)) / bytes));
            copies = std::min(copies, 64);
            const int64_t n_blocks = blocks_one * copies;
            const int64_t pool = n_blocks * kBlock * kv_row;
            void *k_pool, *v_pool;
            CK(cudaMalloc(&k_pool, pool * es));
            CK(cudaMalloc(&v_pool, pool * es));
            if (fp8) {
                fill_random_e4m3<<<1024, 256, 0, g_stream>>>((uint8_t *)k_pool, pool, rnd(),
                                                             kFp8Scale);
                fill_random_e4m3<<<1024, 256, 0, g_stream>>>((uint8_t *)v_pool, pool, rnd(),
                                                             kFp8Scale);
            } else {
                fill_random_half<<<1024, 256, 0, g_stream>>>((half *)k_pool, pool, rnd());
                fill_random_half<<<1024, 256, 0, g_stream>>>((half *)v_pool, pool, rnd());
            }
            std::vector<int32_t> perm(n_blocks);
            for (int64_t i = 0; i < n_blocks; i++)
                perm[i] = (int32_t)i;
            for (int64_t i = n_blocks - 1; i > 0; i--)
                std::swap(perm[i], perm[rnd() % (uint64_t)(i + 1)]);
            std::vector<copy_data> cps(copies);
            const int64_t q_elems = (int64_t)c.n_seqs * c.n_heads * c.hd;
            for (int k = 0; k < copies; k++) {
                copy_data &cp = cps[k];
                cp.bt.assign(perm.begin() + k * blocks_one, perm.begin() + (k + 1) * blocks_one);
                CK(cudaMalloc(&cp.d_bt, blocks_one * 4));
                CK(cudaMemcpy(cp.d_bt, cp.bt.data(), blocks_one * 4, cudaMemcpyHostToDevice));
                CK(cudaMalloc(&cp.d_q, q_elems * 2));
                CK(cudaMalloc(&cp.d_out, q_elems * 2));
                fill_random_half<<<256, 256, 0, g_stream>>>(cp.d_q, q_elems, rnd());
            }
            CK(cudaStreamSynchronize(g_stream));
            for (int impl : impls) {
                /* "auto" runs what the backend would for this step's shape */
                const int run =
                    impl == KRN_ATTN_AUTO
                        ? krn_cuda_attn_impl_for_kv(c.hd, true, c.n_seqs, c.n_heads, c.n_kv, fp8)
                        : impl;
                char name[64];
                snprintf(name, sizeof name, "%s %s%s%s", fp8 ? "fp8 " : "fp16",
                         krn_cuda_attn_impl_name(impl), run != impl ? ": " : "",
                         run != impl ? krn_cuda_attn_impl_name(run) : "");
                struct krn_cuda_attn_config cfg;
                CS(krn_cuda_attn_config_kv(c.hd, true, run, fp8, &cfg, &err_));
                wlist w = build_list(c, cfg, prop.multiProcessorCount);
                if ((size_t)w.n_parts * w.rows * (c.hd + 2) * 4 > part_bytes ||
                    w.groups.size() > (1 << 18)) {
                    printf("%-14s %-16s skipped (scratch)\n", c.name, name);
                    continue;
                }
                krn_cuda_attn_item *d_items;
                krn_cuda_attn_group *d_groups = nullptr;
                CK(cudaMalloc(&d_items, w.items.size() * sizeof(krn_cuda_attn_item)));
                CK(cudaMemcpy(d_items, w.items.data(), w.items.size() * sizeof(krn_cuda_attn_item),
                              cudaMemcpyHostToDevice));
                if (!w.groups.empty()) {
                    CK(cudaMalloc(&d_groups, w.groups.size() * sizeof(krn_cuda_attn_group)));
                    CK(cudaMemcpy(d_groups, w.groups.data(),
                                  w.groups.size() * sizeof(krn_cuda_attn_group),
                                  cudaMemcpyHostToDevice));
                }
                std::vector<krn_cuda_attn_params> ps(copies);
                for (int k = 0; k < copies; k++) {
                    krn_cuda_attn_params &p = ps[k];
                    memset(&p, 0, sizeof p);
                    p.q = reinterpret_cast<const uint16_t *>(cps[k].d_q);
                    p.ldq = (int64_t)c.n_heads * c.hd;
                    p.out = reinterpret_cast<uint16_t *>(cps[k].d_out);
                    p.ldo = (int64_t)c.n_heads * c.hd;
                    p.k_pool = reinterpret_cast<const uint16_t *>(k_pool);
                    p.v_pool = reinterpret_cast<const uint16_t *>(v_pool);
                    p.kv_fp8 = fp8;
                    p.k_scale = p.v_scale = kFp8Scale;
                    p.block_table = cps[k].d_bt;
                    p.max_blocks = per_seq;
                    p.block = kBlock;
                    p.n_heads = c.n_heads;
                    p.n_kv_heads = c.n_kv;
                    p.head_dim = c.hd;
                    p.scale = 1.0f / sqrtf((float)c.hd);
                    p.items = d_items;
                    p.n_items = (int32_t)w.items.size();
                    p.groups = d_groups;
                    p.n_groups = (int32_t)w.groups.size();
                    p.partials = d_part;
                    p.group_done = d_done;
                    p.decode = true;
                    p.impl = run;
                }
                /* poison copy 0's output, run it once, check it; the poison on
                 * the launches' stream (a plain cudaMemset runs on the legacy
                 * stream, which a non-blocking stream does not wait for) */
                CK(cudaMemsetAsync(cps[0].d_out, 0xff, q_elems * 2, g_stream));
                CS(krn_cuda_attention(&ps[0], g_stream, &err_));
                CK(cudaStreamSynchronize(g_stream));
                const double rel = ref_check(c, k_pool, v_pool, fp8, cps[0]);
                const int launches =
                    std::max(copies, std::max(8, (int)(2e7 / bytes)) / copies * copies);
                const double us =
                    time_graph(g_stream, std::min(launches, 2048), replays, [&](int i) {
                        CS(krn_cuda_attention(&ps[i % copies], g_stream, &err_));
                    });
                rows.push_back(
                    {c.name, impl, fp8, us, bytes / (us * 1e-6) / 1e12, rel, (int)w.items.size()});
                const row &r = rows.back();
                printf("%-14s %-22s %6d items %9.2f us %6.2f TB/s  rel err %.1e%s\n", r.cas, name,
                       r.items, r.us, r.tbs, r.err, !(r.err <= 3e-3) ? "  WRONG" : "");
                fflush(stdout);
                CK(cudaFree(d_items));
                if (d_groups)
                    CK(cudaFree(d_groups));
            }
            for (copy_data &cp : cps) {
                CK(cudaFree(cp.d_bt));
                CK(cudaFree(cp.d_q));
                CK(cudaFree(cp.d_out));
            }
            CK(cudaFree(k_pool));
            CK(cudaFree(v_pool));
        }

    /* Summary: SIMT (before) against the automatic choice (after), fp16
     * pools; then the automatic choice on fp16 against fp8 pools. */
    printf("\n%-14s %12s %8s %12s %8s %7s   (copy ceiling %.2f TB/s)\n", "case", "simt us", "TB/s",
           "auto us", "TB/s", "speedup", copy_tbs);
    for (const bcase &c : kCases) {
        const row *a = nullptr, *b = nullptr;
        for (const row &r : rows)
            if (!strcmp(r.cas, c.name) && !r.fp8) {
                if (r.impl == KRN_ATTN_SIMT)
                    a = &r;
                if (r.impl == KRN_ATTN_AUTO)
                    b = &r;
            }
        if (a && b)
            printf("%-14s %12.2f %8.2f %12.2f %8.2f %6.2fx\n", c.name, a->us, a->tbs, b->us, b->tbs,
                   a->us / b->us);
    }
    printf("\n%-14s %12s %8s %12s %8s %12s %7s\n", "case", "fp16 us", "TB/s", "fp8 us", "TB/s",
           "best fp8 us", "fp8 x");
    for (const bcase &c : kCases) {
        const row *a = nullptr, *b = nullptr, *best = nullptr;
        for (const row &r : rows)
            if (!strcmp(r.cas, c.name) && r.impl != KRN_ATTN_SIMT) {
                if (r.impl == KRN_ATTN_AUTO && !r.fp8)
                    a = &r;
                if (r.impl == KRN_ATTN_AUTO && r.fp8)
                    b = &r;
                if (r.fp8 && (!best || r.us < best->us))
                    best = &r;
            }
        if (a && b)
            printf("%-14s %12.2f %8.2f %12.2f %8.2f %12.2f %6.2fx  (best: %s)\n", c.name, a->us,
                   a->tbs, b->us, b->tbs, best->us, a->us / b->us,
                   krn_cuda_attn_impl_name(best->impl));
    }
    int wrong = 0;
    for (const row &r : rows)
        wrong += !(r.err <= 3e-3); /* NaN too */
    printf("%s: %d of %zu results off the float64 reference by more than 3e-3\n",
           wrong ? "FAILED" : "PASSED", wrong, rows.size());
    CK(cudaFree(d_part));
    CK(cudaFree(d_done));
    return wrong ? 1 : 0;
}
