/* GPU test: the decode-step kernels of kernels/rope_cuda.h and norm_cuda.h
 * against references written here.
 *
 *   krn_cuda_rope_kv   RoPE fused with the KV write, against krn_cuda_rope
 *                      followed by a host copy of the rotated K and of V
 *                      (bit-identical rows and pool rows), against a host
 *                      RoPE in fp32 (within one fp16 rounding), pool rows
 *                      of rows without a destination (-1) untouched; shapes
 *                      MHA 32/32 x 128 (Llama-2-7B) at 1 and 5 rows, GQA 8/2 x
 *                      64, head_dim 48, and a 256-wide head.
 *   krn_cuda_attention with the RoPE fused (rope_inv_freq): the decode
 *                      kernel rotating its queries and writing the step's
 *                      K/V itself, against krn_cuda_rope_kv followed by the
 *                      same attention on the same work list: the output,
 *                      both pools bit for bit, q left unrotated, a second
 *                      launch the same; MHA 32/32 x 128 (Llama-2-7B at
 *                      batch 1: three splits) and at 3 rows with contexts
 *                      0 to 700, positions at split and tile edges, items
 *                      of up to 901 keys (the token's tile after the ring
 *                      turned over), GQA 32/8 x 128 and 8/2 x 64, 20 query
 *                      heads a KV head (two items own the same new key);
 *                      head_dim 48 and 256 refused. The same from q/k/v
 *                      rows given as fixed-point words (q_words, values off
 *                      the fp16 grid) against the unfused path on their
 *                      krn_int4_gemm_acc_reduce, q's fp16 rows poisoned:
 *                      output and pools bit for bit, the words untouched.
 *   krn_cuda_rope      the scalar path (head_dim 40, an odd row stride)
 *                      against the host reference.
 *   krn_cuda_rmsnorm_add  dims 4096, 12288 and 20000 (one, two and four
 *                      16-byte vectors a thread), 4100 (the scalar path),
 *                      with and without the residual delta, 1 to 3 rows
 *                      (padded strides when several), two launches back to back (the
 *                      second reads what the first wrote: the programmatic
 *                      dependent launch waits): the stored residual is the
 *                      fp16 sum exactly, the output within 2 fp16 roundings
 *                      of a double-precision reference.
 * Prints "SKIPPED: no GPU" without one. */
#include "common/inf.h"
#include "kernels/attn_cuda.h"
#include "kernels/int4_gemm.h"
#include "kernels/norm_cuda.h"
#include "kernels/rope.h"
#include "kernels/rope_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static uint64_t g_rng = 12345;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static void cu(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}

static void ok(inf_status_t st, const struct inf_err *err, const char *what)
{
    if (st != INF_OK) {
        fprintf(stderr, "FATAL %s: %s\n", what, err->msg);
        exit(2);
    }
}

static double unif(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static uint16_t rh(float lo, float hi)
{
    return inf_f32_to_f16(lo + (hi - lo) * (float)unif());
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    cu(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
}

/* ---- RoPE + KV write --------------------------------------------------------- */

/* Host RoPE of one row in fp32 (the kernel's formula). */
static void host_rope(float *row, int32_t n_heads, int32_t hd, int32_t pos, const float *inv)
{
    for (int32_t h = 0; h < n_heads; h++)
        for (int32_t i = 0; i < hd / 2; i++) {
            float a = row[h * hd + i], b = row[h * hd + i + hd / 2], ang = (float)pos * inv[i];
            float c = cosf(ang), s = sinf(ang);
            row[h * hd + i] = a * c - b * s;
            row[h * hd + i + hd / 2] = b * c + a * s;
        }
}

static void test_rope_kv(int32_t nq, int32_t nkv, int32_t hd, int32_t m)
{
    struct inf_err err = {0};
    const int32_t n = nq + nkv, kvd = nkv * hd;
    const int64_t ld = (int64_t)(nq + 2 * nkv) * hd + 8; /* q, k, v and a pad */
    const int32_t pool_rows = 3 * m + 2;
    const size_t xb = (size_t)m * ld * 2, pb = (size_t)pool_rows * kvd * 2;
    uint16_t *hx = malloc(xb), *hy = malloc(xb), *hz = malloc(xb);
    uint16_t *hk = malloc(pb), *hv = malloc(pb), *hk0 = malloc(pb);
    int32_t *pos = malloc(sizeof(int32_t) * m), *kvr = malloc(sizeof(int32_t) * m);
    float inv[256], *row = malloc(sizeof(float) * (size_t)n * hd);
    for (int64_t i = 0; i < (int64_t)m * ld; i++)
        hx[i] = rh(-2.0f, 2.0f);
    for (size_t i = 0; i < pb / 2; i++)
        hk0[i] = rh(-1.0f, 1.0f);
    for (int32_t r = 0; r < m; r++) {
        pos[r] = r == 0 ? 4000 + (int32_t)(unif() * 1000) : (int32_t)(unif() * 300);
        kvr[r] = r == m - 1 && m > 1 ? -1 : 3 * r + 1; /* the last of several rows: padding */
    }
    krn_rope_inv_freq(10000.0f, false, 1.0f, 1.0f, 4.0f, 8192, hd, inv);
    uint16_t *dx = dalloc(xb), *dk = dalloc(pb), *dv = dalloc(pb);
    int32_t *dpos = dalloc(sizeof(int32_t) * m), *dkvr = dalloc(sizeof(int32_t) * m);
    float *dinv = dalloc(sizeof inv);
    cu(cudaMemcpy(dpos, pos, sizeof(int32_t) * m, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dkvr, kvr, sizeof(int32_t) * m, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dinv, inv, sizeof inv, cudaMemcpyHostToDevice), "copy");
    /* fused */
    cu(cudaMemcpy(dx, hx, xb, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dk, hk0, pb, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dv, hk0, pb, cudaMemcpyHostToDevice), "copy");
    CHECK(krn_cuda_rope_kv_ok(dx, ld, nq, nkv, hd, dx + (int64_t)n * hd, ld, dk, dv),
          "rope_kv_ok refuses %d/%d x %d", nq, nkv, hd);
    ok(krn_cuda_rope_kv(dx, ld, nq, nkv, hd, dpos, dinv, dx + (int64_t)n * hd, ld, dk, dv, dkvr, m,
                        NULL, &err),
       &err, "rope_kv");
    cu(cudaDeviceSynchronize(), "sync");
    cu(cudaMemcpy(hy, dx, xb, cudaMemcpyDeviceToHost), "copy");
    cu(cudaMemcpy(hk, dk, pb, cudaMemcpyDeviceToHost), "copy");
    cu(cudaMemcpy(hv, dv, pb, cudaMemcpyDeviceToHost), "copy");
    /* unfused */
    cu(cudaMemcpy(dx, hx, xb, cudaMemcpyHostToDevice), "copy");
    ok(krn_cuda_rope(dx, ld, n, hd, dpos, dinv, m, NULL, &err), &err, "rope");
    cu(cudaDeviceSynchronize(), "sync");
    cu(cudaMemcpy(hz, dx, xb, cudaMemcpyDeviceToHost), "copy");
    CHECK(memcmp(hy, hz, xb) == 0, "%d/%d x %d, %d rows: fused rows differ from krn_cuda_rope", nq,
          nkv, hd, m);
    long pool_bad = 0, host_bad = 0;
    double worst = 0.0;
    for (int32_t r = 0; r < m; r++) {
        const uint16_t *zr = hz + (int64_t)r * ld;
        for (int32_t pr = 0; pr < pool_rows; pr++) {
            bool dst = kvr[r] == pr;
            for (int32_t i = 0; i < kvd && dst; i++) {
                pool_bad += hk[(int64_t)pr * kvd + i] != zr[(int64_t)nq * hd + i];
                pool_bad += hv[(int64_t)pr * kvd + i] != zr[(int64_t)n * hd + i];
            }
        }
        for (int32_t i = 0; i < n * hd; i++)
            row[i] = inf_f16_to_f32(hx[(int64_t)r * ld + i]);
        host_rope(row, n, hd, pos[r], inv);
        for (int32_t i = 0; i < n * hd; i++) {
            double g = inf_f16_to_f32(zr[i]), d = fabs(g - row[i]);
            /* one fp16 rounding of a value below 4, plus sin/cos ulps */
            if (d > 2.5e-3 + 1e-3 * fabs(row[i]))
                host_bad++;
            worst = d > worst ? d : worst;
        }
        for (int32_t i = n * hd; i < ld; i++) /* v and the pad are not touched */
            host_bad += zr[i] != hx[(int64_t)r * ld + i];
    }
    /* pool rows nobody targets keep their bytes */
    long kept_bad = 0;
    for (int32_t pr = 0; pr < pool_rows; pr++) {
        bool used = false;
        for (int32_t r = 0; r < m; r++)
            used |= kvr[r] == pr;
        if (!used)
            kept_bad +=
                memcmp(hk + (size_t)pr * kvd, hk0 + (size_t)pr * kvd, (size_t)kvd * 2) != 0 ||
                memcmp(hv + (size_t)pr * kvd, hk0 + (size_t)pr * kvd, (size_t)kvd * 2) != 0;
    }
    CHECK(pool_bad == 0, "%d/%d x %d: %ld pool values differ from the rotated row", nq, nkv, hd,
          pool_bad);
    CHECK(kept_bad == 0, "%d/%d x %d: %ld untargeted pool rows changed", nq, nkv, hd, kept_bad);
    CHECK(host_bad == 0, "%d/%d x %d: %ld values off the host RoPE (worst %.3g)", nq, nkv, hd,
          host_bad, worst);
    printf("rope_kv %2d/%2d x %3d, %d rows: fused == rope + copy, host worst %.2g\n", nq, nkv, hd,
           m, worst);
    cudaFree(dx), cudaFree(dk), cudaFree(dv), cudaFree(dpos), cudaFree(dkvr), cudaFree(dinv);
    free(hx), free(hy), free(hz), free(hk), free(hv), free(hk0), free(pos), free(kvr), free(row);
}

/* ---- RoPE fused into the decode attention ------------------------------------- */

/* The attention implementation test_rope_attn launches (kernels/attn_cuda.h). */
static int32_t g_attn_impl = KRN_ATTN_AUTO;

/* m one-token sequences; row r has ctx[r] keys before its own (position
 * ctx[r]); keys split every split_keys; block tables reversed (paging).
 * words: the q/k/v rows are also given as fixed-point words (random low
 * bits), the unfused path reading their krn_int4_gemm_acc_reduce. */
static void test_rope_attn(int32_t nq, int32_t nkv, int32_t hd, int32_t m, const int32_t *ctx,
                           int32_t split_keys, bool words)
{
    struct inf_err err = {0};
    const int32_t G = nq / nkv, kvd = nkv * hd, blk = 16;
    const int64_t ld = (int64_t)(nq + 2 * nkv) * hd + 8;
    int32_t max_blocks = 0, n_blocks = 0;
    for (int32_t r = 0; r < m; r++) {
        int32_t nb = (ctx[r] + 1 + blk - 1) / blk;
        max_blocks = nb > max_blocks ? nb : max_blocks;
        n_blocks += nb;
    }
    int32_t *bt = calloc((size_t)m * max_blocks, 4), *pos = malloc(4 * (size_t)m),
            *map = malloc(4 * (size_t)m);
    for (int32_t r = 0, base = 0; r < m; r++) {
        int32_t nb = (ctx[r] + 1 + blk - 1) / blk;
        for (int32_t j = 0; j < nb; j++)
            bt[r * max_blocks + j] = base + nb - 1 - j;
        base += nb;
        pos[r] = ctx[r];
        map[r] = bt[r * max_blocks + ctx[r] / blk] * blk + ctx[r] % blk;
    }
    /* items: row sets of up to 16 rows a KV head, keys split; one padding item */
    struct krn_cuda_attn_item items[512];
    struct krn_cuda_attn_group groups[256];
    int32_t n_items = 0, n_groups = 0, n_slots = 0;
    for (int32_t r = 0; r < m; r++)
        for (int32_t kvh = 0; kvh < nkv; kvh++)
            for (int32_t row0 = 0; row0 < G; row0 += 16) {
                const int32_t keys = ctx[r] + 1, ns = (keys + split_keys - 1) / split_keys;
                if (ns > 1)
                    groups[n_groups] = (struct krn_cuda_attn_group){n_items, ns};
                for (int32_t j = 0; j < ns; j++) {
                    int32_t k1 = (j + 1) * split_keys;
                    items[n_items++] =
                        (struct krn_cuda_attn_item){.t_first = r,
                                                    .p_first = ctx[r],
                                                    .slot = r,
                                                    .kvh = kvh,
                                                    .row0 = row0,
                                                    .nrows = G - row0 < 16 ? G - row0 : 16,
                                                    .k0 = j * split_keys,
                                                    .k1 = k1 < keys ? k1 : keys,
                                                    .part = ns > 1 ? n_slots++ : -1,
                                                    .group = ns > 1 ? n_groups : 0};
                }
                n_groups += ns > 1;
            }
    items[n_items++] = (struct krn_cuda_attn_item){.nrows = 0};
    const size_t xb = (size_t)m * ld * 2, pb = (size_t)n_blocks * blk * kvd * 2,
                 ob = (size_t)m * nq * hd * 2;
    uint16_t *hx = malloc(xb), *hp = malloc(pb), *hq = malloc(pb);
    uint16_t *ra[3], *rb[3]; /* out, K pool, V pool of the two paths */
    for (int i = 0; i < 3; i++) {
        ra[i] = malloc(i ? pb : ob);
        rb[i] = malloc(i ? pb : ob);
    }
    for (int64_t i = 0; i < (int64_t)m * ld; i++)
        hx[i] = rh(-2.0f, 2.0f);
    int64_t *hw = NULL, *dw = NULL;
    if (words) { /* values off the fp16 grid; hx becomes their reduce */
        hw = malloc((size_t)m * ld * 8);
        for (int64_t i = 0; i < (int64_t)m * ld; i++)
            hw[i] = (int64_t)llround((unif() * 4.0 - 2.0) * 1073741824.0);
        dw = dalloc((size_t)m * ld * 8);
        int64_t *dw2 = dalloc((size_t)m * ld * 8);
        uint16_t *dx0 = dalloc(xb);
        cu(cudaMemcpy(dw, hw, (size_t)m * ld * 8, cudaMemcpyHostToDevice), "copy");
        cu(cudaMemcpy(dw2, hw, (size_t)m * ld * 8, cudaMemcpyHostToDevice), "copy");
        ok(krn_int4_gemm_acc_reduce(dw2, dx0, ld, m, (int32_t)ld, NULL, &err), &err, "acc reduce");
        cu(cudaMemcpy(hx, dx0, xb, cudaMemcpyDeviceToHost), "copy");
        cudaFree(dw2), cudaFree(dx0);
    }
    for (size_t i = 0; i < pb / 2; i++) {
        hp[i] = rh(-1.0f, 1.0f);
        hq[i] = rh(-1.0f, 1.0f);
    }
    float inv[256];
    krn_rope_inv_freq(500000.0f, true, 8.0f, 1.0f, 4.0f, 8192, hd, inv);
    uint16_t *dx = dalloc(xb), *dk = dalloc(pb), *dv = dalloc(pb), *dout = dalloc(ob);
    int32_t *dbt = dalloc(4 * (size_t)m * max_blocks), *dpos = dalloc(4 * (size_t)m),
            *dmap = dalloc(4 * (size_t)m), *ddone = dalloc(4 * 256);
    float *dinv = dalloc(sizeof inv), *dpart = dalloc((size_t)(n_slots + 1) * 16 * (hd + 2) * 4);
    struct krn_cuda_attn_item *ditems = dalloc(sizeof(items[0]) * n_items);
    struct krn_cuda_attn_group *dgroups = dalloc(sizeof(groups[0]) * (n_groups + 1));
    cu(cudaMemcpy(dbt, bt, 4 * (size_t)m * max_blocks, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dpos, pos, 4 * (size_t)m, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dmap, map, 4 * (size_t)m, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dinv, inv, sizeof inv, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(ditems, items, sizeof(items[0]) * n_items, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dgroups, groups, sizeof(groups[0]) * (n_groups + 1), cudaMemcpyHostToDevice),
       "copy");
    cu(cudaMemset(ddone, 0, 4 * 256), "memset");
    const uint16_t *dvn = dx + (int64_t)(nq + nkv) * hd;
    struct krn_cuda_attn_params kp = {.q = dx,
                                      .ldq = ld,
                                      .out = dout,
                                      .ldo = (int64_t)nq * hd,
                                      .k_pool = dk,
                                      .v_pool = dv,
                                      .block_table = dbt,
                                      .max_blocks = max_blocks,
                                      .block = blk,
                                      .n_heads = nq,
                                      .n_kv_heads = nkv,
                                      .head_dim = hd,
                                      .scale = 1.0f / sqrtf((float)hd),
                                      .items = ditems,
                                      .n_items = n_items,
                                      .groups = dgroups,
                                      .n_groups = n_groups,
                                      .partials = dpart,
                                      .group_done = ddone,
                                      .decode = true,
                                      .impl = g_attn_impl,
                                      .rows = m};
    struct krn_cuda_attn_params rp = kp;
    rp.rope_inv_freq = dinv;
    rp.rope_pos = dpos;
    rp.kv_map = dmap;
    rp.v_new = dvn;
    rp.ldv = ld;
    struct krn_cuda_attn_params wp = rp; /* the same from the words; q poisoned */
    wp.q_words = dw;
    wp.v_words = dw ? dw + (int64_t)(nq + nkv) * hd : NULL;
    wp.ldw = ld;
    long bad[3] = {0, 0, 0}, again_bad = 0, q_bad = 0, w_bad[3] = {0, 0, 0}, w_changed = 0;
    for (int pass = 0; pass < (words ? 4 : 3); pass++) {
        /* unfused, fused, fused again, fused from words */
        cu(cudaMemcpy(dx, hx, xb, cudaMemcpyHostToDevice), "copy");
        if (pass == 3)
            cu(cudaMemset(dx, 0xff, xb), "poison q");
        cu(cudaMemcpy(dk, hp, pb, cudaMemcpyHostToDevice), "copy");
        cu(cudaMemcpy(dv, hq, pb, cudaMemcpyHostToDevice), "copy");
        cu(cudaMemset(dout, 0xff, ob), "poison");
        if (pass == 0) {
            ok(krn_cuda_rope_kv(dx, ld, nq, nkv, hd, dpos, dinv, dvn, ld, dk, dv, dmap, m, NULL,
                                &err),
               &err, "rope_kv");
            ok(krn_cuda_attention(&kp, NULL, &err), &err, "attention");
        } else {
            ok(krn_cuda_attention(pass == 3 ? &wp : &rp, NULL, &err), &err, "attention with RoPE");
        }
        cu(cudaDeviceSynchronize(), "sync");
        if (pass == 3) {
            uint16_t *o3 = malloc(ob), *k3 = malloc(pb), *v3 = malloc(pb);
            int64_t *w3 = malloc((size_t)m * ld * 8);
            cu(cudaMemcpy(o3, dout, ob, cudaMemcpyDeviceToHost), "copy");
            cu(cudaMemcpy(k3, dk, pb, cudaMemcpyDeviceToHost), "copy");
            cu(cudaMemcpy(v3, dv, pb, cudaMemcpyDeviceToHost), "copy");
            cu(cudaMemcpy(w3, dw, (size_t)m * ld * 8, cudaMemcpyDeviceToHost), "copy");
            for (size_t j = 0; j < ob / 2; j++)
                w_bad[0] += o3[j] != ra[0][j];
            for (size_t j = 0; j < pb / 2; j++) {
                w_bad[1] += k3[j] != ra[1][j];
                w_bad[2] += v3[j] != ra[2][j];
            }
            w_changed = memcmp(w3, hw, (size_t)m * ld * 8) != 0;
            free(o3), free(k3), free(v3), free(w3);
            continue;
        }
        uint16_t **res = pass == 0 ? ra : rb;
        uint16_t *tmp = pass == 2 ? malloc(ob) : NULL;
        cu(cudaMemcpy(pass == 2 ? tmp : res[0], dout, ob, cudaMemcpyDeviceToHost), "copy");
        if (pass == 2) {
            again_bad = memcmp(tmp, rb[0], ob) != 0;
            free(tmp);
            continue;
        }
        cu(cudaMemcpy(res[1], dk, pb, cudaMemcpyDeviceToHost), "copy");
        cu(cudaMemcpy(res[2], dv, pb, cudaMemcpyDeviceToHost), "copy");
        if (pass == 1) {
            uint16_t *x2 = malloc(xb);
            cu(cudaMemcpy(x2, dx, xb, cudaMemcpyDeviceToHost), "copy");
            q_bad = memcmp(x2, hx, xb) != 0;
            free(x2);
        }
    }
    for (int i = 0; i < 3; i++) {
        size_t n = (i ? pb : ob) / 2;
        for (size_t j = 0; j < n; j++)
            bad[i] += ra[i][j] != rb[i][j];
    }
    long unwritten = 0; /* every output value written (0xffff is a NaN) */
    for (size_t j = 0; j < ob / 2; j++)
        unwritten += rb[0][j] == 0xffff;
    CHECK(bad[0] == 0 && unwritten == 0,
          "%d/%d x %d, %d rows: fused output differs in %ld values (%ld unwritten)", nq, nkv, hd, m,
          bad[0], unwritten);
    CHECK(bad[1] == 0 && bad[2] == 0, "%d/%d x %d, %d rows: pools differ (K %ld, V %ld)", nq, nkv,
          hd, m, bad[1], bad[2]);
    CHECK(q_bad == 0, "%d/%d x %d: the fused launch changed q", nq, nkv, hd);
    CHECK(again_bad == 0, "%d/%d x %d: a second fused launch differs", nq, nkv, hd);
    if (words) {
        CHECK(w_bad[0] == 0 && w_bad[1] == 0 && w_bad[2] == 0 && !w_changed,
              "%d/%d x %d, %d rows: from words, output %ld, K %ld, V %ld values differ from the "
              "reduced rows' (words changed: %ld)",
              nq, nkv, hd, m, w_bad[0], w_bad[1], w_bad[2], w_changed);
        cudaFree(dw);
        free(hw);
    }
    printf("attention + RoPE %2d/%2d x %3d, %d rows, %d items, %d groups%s (%s): == rope_kv + "
           "attention\n",
           nq, nkv, hd, m, n_items, n_groups, words ? ", from words too" : "",
           krn_cuda_attn_impl_name(g_attn_impl));
    cudaFree(dx), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dbt), cudaFree(dpos);
    cudaFree(dmap), cudaFree(ddone), cudaFree(dinv), cudaFree(dpart), cudaFree(ditems);
    cudaFree(dgroups);
    for (int i = 0; i < 3; i++)
        free(ra[i]), free(rb[i]);
    free(hx), free(hp), free(hq), free(bt), free(pos), free(map);
}

/* Shapes the decode kernel does not rotate itself are refused. */
static void test_rope_attn_refused(int32_t hd)
{
    struct inf_err err = {0};
    uint16_t *buf = dalloc(1 << 20);
    struct krn_cuda_attn_item *it = dalloc(sizeof *it);
    cu(cudaMemset(it, 0, sizeof *it), "memset");
    struct krn_cuda_attn_params kp = {.q = buf,
                                      .ldq = 4 * hd,
                                      .out = buf,
                                      .ldo = 2 * hd,
                                      .k_pool = buf,
                                      .v_pool = buf,
                                      .block_table = (const int32_t *)buf,
                                      .max_blocks = 1,
                                      .block = 16,
                                      .n_heads = 2,
                                      .n_kv_heads = 1,
                                      .head_dim = hd,
                                      .scale = 0.1f,
                                      .items = it,
                                      .n_items = 1,
                                      .group_done = (int32_t *)buf,
                                      .decode = true,
                                      .rows = 1,
                                      .rope_inv_freq = (const float *)buf,
                                      .rope_pos = (const int32_t *)buf,
                                      .kv_map = (const int32_t *)buf,
                                      .v_new = buf,
                                      .ldv = 4 * hd};
    inf_status_t st = krn_cuda_attention(&kp, NULL, &err);
    CHECK(st == INF_E_UNSUPPORTED, "head_dim %d with RoPE: status %d, not unsupported", hd, st);
    kp.decode = false;
    kp.head_dim = 64;
    st = krn_cuda_attention(&kp, NULL, &err);
    CHECK(st == INF_E_UNSUPPORTED, "prefill with RoPE: status %d, not unsupported", st);
    cu(cudaDeviceSynchronize(), "sync");
    cudaFree(buf), cudaFree(it);
}

/* krn_cuda_rope alone on a shape of the scalar path (odd stride). */
static void test_rope_scalar(void)
{
    struct inf_err err = {0};
    const int32_t nh = 3, hd = 40, m = 2;
    const int64_t ld = nh * hd + 3;
    uint16_t hx[2 * 123], hy[2 * 123];
    int32_t pos[2] = {7, 1234};
    float inv[256], row[120];
    for (int i = 0; i < m * ld; i++)
        hx[i] = rh(-2.0f, 2.0f);
    krn_rope_inv_freq(10000.0f, false, 1.0f, 1.0f, 4.0f, 8192, hd, inv);
    uint16_t *dx = dalloc(sizeof hx);
    int32_t *dpos = dalloc(sizeof pos);
    float *dinv = dalloc(sizeof inv);
    cu(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dpos, pos, sizeof pos, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dinv, inv, sizeof inv, cudaMemcpyHostToDevice), "copy");
    ok(krn_cuda_rope(dx, ld, nh, hd, dpos, dinv, m, NULL, &err), &err, "rope");
    cu(cudaMemcpy(hy, dx, sizeof hy, cudaMemcpyDeviceToHost), "copy");
    long bad = 0;
    for (int r = 0; r < m; r++) {
        for (int i = 0; i < nh * hd; i++)
            row[i] = inf_f16_to_f32(hx[r * ld + i]);
        host_rope(row, nh, hd, pos[r], inv);
        for (int i = 0; i < nh * hd; i++)
            bad += fabs(inf_f16_to_f32(hy[r * ld + i]) - row[i]) > 2.5e-3 + 1e-3 * fabs(row[i]);
        for (int64_t i = nh * hd; i < ld; i++)
            bad += hy[r * ld + i] != hx[r * ld + i];
    }
    CHECK(bad == 0, "rope scalar path: %ld values off the host reference", bad);
    cudaFree(dx), cudaFree(dpos), cudaFree(dinv);
}

/* ---- RMSNorm --------------------------------------------------------------------- */
static void test_norm(int32_t dim, int32_t m, bool with_delta)
{
    struct inf_err err = {0};
    const int64_t ld = dim + 8 * (m > 1); /* padded rows keep 16-byte alignment */
    const size_t hb = (size_t)m * ld * 2;
    uint16_t *hx = malloc(hb), *hd = malloc(hb), *hx2 = malloc(hb), *ho = malloc(hb),
             *ho2 = malloc(hb);
    float *w = malloc(sizeof(float) * (size_t)dim);
    for (int64_t i = 0; i < (int64_t)m * ld; i++) {
        hx[i] = rh(-3.0f, 3.0f);
        hd[i] = rh(-1.0f, 1.0f);
    }
    for (int32_t i = 0; i < dim; i++)
        w[i] = 0.5f + (float)unif();
    uint16_t *dx = dalloc(hb), *dd = dalloc(hb), *dout = dalloc(hb), *dout2 = dalloc(hb);
    float *dw = dalloc(sizeof(float) * (size_t)dim);
    cu(cudaMemcpy(dx, hx, hb, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dd, hd, hb, cudaMemcpyHostToDevice), "copy");
    cu(cudaMemcpy(dw, w, sizeof(float) * (size_t)dim, cudaMemcpyHostToDevice), "copy");
    const float eps = 1e-5f;
    /* two launches back to back: the second adds the first's output to x */
    ok(krn_cuda_rmsnorm_add(dx, ld, with_delta ? dd : NULL, ld, dw, NULL, eps, dout, ld, dim, m,
                            NULL, &err),
       &err, "rmsnorm");
    ok(krn_cuda_rmsnorm_add(dx, ld, dout, ld, dw, NULL, eps, dout2, ld, dim, m, NULL, &err), &err,
       "rmsnorm 2");
    cu(cudaDeviceSynchronize(), "sync");
    cu(cudaMemcpy(hx2, dx, hb, cudaMemcpyDeviceToHost), "copy");
    cu(cudaMemcpy(ho, dout, hb, cudaMemcpyDeviceToHost), "copy");
    cu(cudaMemcpy(ho2, dout2, hb, cudaMemcpyDeviceToHost), "copy");
    long bad_res = 0, bad_out = 0;
    double worst = 0.0;
    uint16_t *x1 = malloc((size_t)dim * 2);
    for (int32_t r = 0; r < m; r++) {
        const int64_t o = (int64_t)r * ld;
        /* step 1 on the host */
        double ss = 0.0;
        for (int32_t i = 0; i < dim; i++) {
            float v = inf_f16_to_f32(hx[o + i]);
            if (with_delta)
                v = inf_f16_to_f32(inf_f32_to_f16(v + inf_f16_to_f32(hd[o + i])));
            x1[i] = inf_f32_to_f16(v);
            ss += (double)v * v;
        }
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int32_t i = 0; i < dim; i++) {
            double ref = inf_f16_to_f32(x1[i]) * inv * w[i], g = inf_f16_to_f32(ho[o + i]);
            double d = fabs(g - ref);
            worst = d > worst ? d : worst;
            bad_out += d > 2e-3 * fabs(ref) + 1e-4;
        }
        /* step 2: x = fp16(x1 + out1) exactly, from the GPU's out1 */
        double ss2 = 0.0;
        for (int32_t i = 0; i < dim; i++) {
            uint16_t want = inf_f32_to_f16(inf_f16_to_f32(x1[i]) + inf_f16_to_f32(ho[o + i]));
            bad_res += hx2[o + i] != want;
            double v = inf_f16_to_f32(want);
            ss2 += v * v;
        }
        double inv2 = 1.0 / sqrt(ss2 / dim + eps);
        for (int32_t i = 0; i < dim; i++) {
            double ref = inf_f16_to_f32(hx2[o + i]) * inv2 * w[i], g = inf_f16_to_f32(ho2[o + i]);
            double d = fabs(g - ref);
            worst = d > worst ? d : worst;
            bad_out += d > 2e-3 * fabs(ref) + 1e-4;
        }
        for (int64_t i = dim; i < ld; i++) /* the row's padding is not touched */
            bad_res += hx2[o + i] != hx[o + i];
    }
    CHECK(bad_res == 0, "rmsnorm dim %d, %d rows%s: %ld residual values differ", dim, m,
          with_delta ? ", delta" : "", bad_res);
    CHECK(bad_out == 0, "rmsnorm dim %d, %d rows%s: %ld outputs off (worst %.3g)", dim, m,
          with_delta ? ", delta" : "", bad_out, worst);
    printf("rmsnorm dim %5d, %d rows%s: worst %.2g\n", dim, m, with_delta ? ", delta" : "       ",
           worst);
    cudaFree(dx), cudaFree(dd), cudaFree(dout), cudaFree(dout2), cudaFree(dw);
    free(hx), free(hd), free(hx2), free(ho), free(ho2), free(w), free(x1);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    test_rope_kv(32, 32, 128, 1);
    test_rope_kv(32, 32, 128, 5);
    test_rope_kv(8, 2, 64, 3);
    test_rope_kv(4, 2, 48, 2);
    test_rope_kv(2, 1, 256, 4);
    {
        const int32_t c1[] = {383}, c3[] = {0, 700, 17}, c2[] = {127, 128}, cg[] = {100, 31},
                      c20[] = {200}, cl[] = {900, 333}, c8[] = {5, 64, 300, 129};
        for (int w = 0; w < 2; w++) {
            test_rope_attn(32, 32, 128, 1, c1, 128, w);
            test_rope_attn(32, 8, 128, 4, c8, 128, w); /* Llama-3-8B's heads */
            test_rope_attn(8, 2, 64, 2, cg, 64, w);
        }
        test_rope_attn(32, 32, 128, 2, cl, 2048, false); /* one item a row: the ring turns over */
        test_rope_attn(32, 32, 128, 3, c3, 128, false);
        test_rope_attn(32, 32, 128, 2, c2, 128, false);
        test_rope_attn(40, 2, 128, 1, c20, 128, true);
        /* every compiled decode configuration (the automatic choice takes
         * some for other shapes: krn_cuda_attn_impl_for) */
        for (g_attn_impl = 2; g_attn_impl < krn_cuda_attn_impl_count(); g_attn_impl++) {
            test_rope_attn(32, 32, 128, 3, c3, 128, true);
            test_rope_attn(32, 8, 128, 4, c8, 128, true);
            test_rope_attn(8, 2, 64, 2, cg, 64, true);
        }
        g_attn_impl = KRN_ATTN_AUTO;
        test_rope_attn_refused(48);
        test_rope_attn_refused(256);
    }
    test_rope_scalar();
    for (int d = 0; d < 2; d++) {
        test_norm(4096, 1, d);
        test_norm(4096, 3, d);
        test_norm(12288, 2, d);
        test_norm(20000, 1, d);
        test_norm(4100, 2, d);
    }
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
