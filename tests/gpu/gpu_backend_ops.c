/* GPU test: every op of the CUDA backend against the CPU backend (the
 * reference) on fresh random data, through the public wrappers of
 * engine/backend.h.
 *
 * Inputs are drawn in fp32, rounded to fp16 (what the GPU holds), and the
 * same rounded values are given to the CPU backend in fp32, so the only
 * differences are the GPU's fp16 outputs and its summation order.
 * Tolerances (relative Frobenius error, ||gpu - cpu|| / ||cpu||):
 *   embedding (fp16 table), rows_gather, K/V cache writes   exact (0)
 *   embedding (fp32 table)                                  <= 1e-3 (fp16 rounding)
 *   rmsnorm_add, rope, silu_mul                             <= 2e-3
 *   linear_q4, linear_fp (fp16 and fp32 weights)            <= 3e-3
 *     (fp16 at one row: kernels/cuda/gemv.cu, else cuBLAS)
 *   attention prefill and decode                            <= 3e-3
 * Each output is poisoned (0xff bytes: fp16 NaN) before the op, so an
 * element the GPU forgets to write fails the check. Shapes cover M = 1 and
 * larger M, strided views, K not a multiple of the group, act-order weights
 * (a column order: x gathered before the GEMM), GQA, head_dim 48,
 * 64, 128 and 256, several sequences of different lengths spanning several
 * KV blocks with shuffled block tables, a prefill chunk on top of existing
 * KV, and decode over 3000 positions with one or two sequences (few row
 * sets on a 132-SM GPU: the backend splits the keys and combines).
 * Decode (the tensor-core decode kernel for head_dim <= 128, the SIMT one
 * for 256) also covers batches of 1 to 67 sequences of random lengths (not
 * multiples of the 16-token block), MHA, GQA 4 and 8, query groups of 16
 * and 32 heads (one and two row sets per KV head), head_dim 48, 64, 128 and
 * 256, and contexts up to 20000 (many splits, combined in the kernel); each
 * decode runs twice on fresh poison, so the split groups' arrival counters
 * must be left as they were found. Decode inside a fixed-shape step (what
 * a decode graph runs: a work list of the bucket's size, padding items
 * included) of one to four sequences, against the CPU and, up to 512
 * positions, bit for bit the eager output. Then a backend with the sm_75
 * paths (engine.cuda_kernels = "sm75", what a T4 runs) repeats the INT4
 * linears, the fused blocks and the attention cases of every kernel, decode
 * in fixed shapes and with a window included.
 * Fresh seed each run, printed; INT4SERVE_TEST_SEED replays one.
 * Prints "SKIPPED: no GPU" and exits 77 (ctest: skipped) without a GPU. */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/weights/quant.h"
#include "kernels/attn_cuda.h"
#include "kernels/cuda_device.h"
#include "tests/gpu/glu_bound.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_fail, g_checks;
static uint64_t g_rng;
static struct eng_backend *g_cpu, *g_gpu;

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi), rounded to fp16. */
static float urand(float lo, float hi)
{
    float u = (float)((double)(rnd() >> 11) * 0x1p-53);
    return inf_f16_to_f32(inf_f32_to_f16(lo + (hi - lo) * u));
}

static float *frand(int64_t n, float lo, float hi)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = urand(lo, hi);
    return p;
}

/* A random permutation of 0..n-1 (Fisher-Yates), malloc'd. */
static int32_t *rand_perm(int32_t n)
{
    int32_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int32_t i = 0; i < n; i++)
        p[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd() % (uint64_t)(i + 1)), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

#define DIE_IF(st, what)                                                                           \
    do {                                                                                           \
        if ((st) != INF_OK) {                                                                      \
            fprintf(stderr, "FATAL %s:%d %s: %s\n", __FILE__, __LINE__, what, err.msg);            \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* A pair of buffers holding the same values: fp32 on the CPU, act dtype
 * (fp16) on the GPU. */
struct pair {
    struct eng_buf *c, *g;
    int64_t n;
};

static struct pair pair_make(const float *v, int64_t n)
{
    struct inf_err err = {0};
    struct pair p = {.n = n};
    DIE_IF(eng_buf_alloc(g_cpu, (size_t)n * 4, &p.c, &err), "alloc");
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)n * 2, &p.g, &err), "alloc");
    uint16_t *h = malloc((size_t)n * 2);
    if (v) {
        DIE_IF(eng_buf_upload(g_cpu, p.c, 0, v, (size_t)n * 4, &err), "upload");
        for (int64_t i = 0; i < n; i++)
            h[i] = inf_f32_to_f16(v[i]);
    } else {
        memset(h, 0xff, (size_t)n * 2);
    }
    DIE_IF(eng_buf_upload(g_gpu, p.g, 0, h, (size_t)n * 2, &err), "upload");
    free(h);
    return p;
}

static void pair_free(struct pair *p)
{
    eng_buf_free(g_cpu, p->c);
    eng_buf_free(g_gpu, p->g);
}

/* The same int32 data on both backends. */
static void ints_make(const int32_t *v, int64_t n, struct eng_buf **c, struct eng_buf **g)
{
    struct inf_err err = {0};
    DIE_IF(eng_buf_from_host(g_cpu, v, (size_t)n * 4, c, &err), "ints");
    DIE_IF(eng_buf_from_host(g_gpu, v, (size_t)n * 4, g, &err), "ints");
}

/* Compare rows x cols of view (off, ld) of a pair; returns the relative
 * Frobenius error, counts non-finite GPU values as failures. */
static double compare_view(const char *what, struct pair *p, int64_t off, int64_t ld, int64_t rows,
                           int64_t cols, double tol)
{
    struct inf_err err = {0};
    float *c = malloc((size_t)p->n * 4);
    uint16_t *g = malloc((size_t)p->n * 2);
    DIE_IF(eng_buf_download(g_cpu, p->c, 0, c, (size_t)p->n * 4, &err), "download");
    DIE_IF(eng_buf_download(g_gpu, p->g, 0, g, (size_t)p->n * 2, &err), "download");
    double d2 = 0, r2 = 0;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t i = off + r * ld + j;
            double gv = inf_f16_to_f32(g[i]);
            if (!isfinite(gv)) {
                bad++;
                continue;
            }
            d2 += (gv - c[i]) * (gv - c[i]);
            r2 += (double)c[i] * c[i];
        }
    double rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    g_checks++;
    bool ok = bad == 0 && rel <= tol;
    if (!ok)
        g_fail++;
    printf("%-4s %-58s rel %.3e (tol %.0e)%s\n", ok ? "ok" : "FAIL", what, rel, tol,
           bad ? " NON-FINITE OUTPUT" : "");
    free(c);
    free(g);
    return rel;
}

static double compare(const char *what, struct pair *p, double tol)
{
    return compare_view(what, p, 0, p->n, 1, p->n, tol);
}

static void expect_status(const char *what, inf_status_t got, inf_status_t want,
                          const struct inf_err *err)
{
    g_checks++;
    bool ok = got == want;
    if (!ok)
        g_fail++;
    printf("%-4s %-58s %s (%s)\n", ok ? "ok" : "FAIL", what, inf_status_name(got),
           err ? err->msg : "");
}

/* ---- ops ------------------------------------------------------------------------ */
static void test_embedding(int32_t vocab, int32_t dim, int32_t m, bool f16)
{
    struct inf_err err = {0};
    float *t = frand((int64_t)vocab * dim, -1, 1);
    int32_t *ids = malloc((size_t)m * 4);
    for (int32_t i = 0; i < m; i++)
        ids[i] = (int32_t)(rnd() % (uint64_t)vocab);
    struct eng_buf *tc, *tg, *ic, *ig;
    if (f16) {
        uint16_t *h = malloc((size_t)vocab * dim * 2);
        for (int64_t i = 0; i < (int64_t)vocab * dim; i++)
            h[i] = inf_f32_to_f16(t[i]);
        DIE_IF(eng_buf_from_host(g_cpu, h, (size_t)vocab * dim * 2, &tc, &err), "table");
        DIE_IF(eng_buf_from_host(g_gpu, h, (size_t)vocab * dim * 2, &tg, &err), "table");
        free(h);
    } else {
        /* fp32 table values off the fp16 grid: the GPU rounds them. */
        for (int64_t i = 0; i < (int64_t)vocab * dim; i++)
            t[i] += 1e-4f * (float)(i % 7);
        DIE_IF(eng_buf_from_host(g_cpu, t, (size_t)vocab * dim * 4, &tc, &err), "table");
        DIE_IF(eng_buf_from_host(g_gpu, t, (size_t)vocab * dim * 4, &tg, &err), "table");
    }
    ints_make(ids, m, &ic, &ig);
    int64_t ld = dim + 5;
    struct pair out = pair_make(NULL, (int64_t)m * ld);
    enum eng_wdtype wdt = f16 ? ENG_W_F16 : ENG_W_F32;
    DIE_IF(
        eng_op_embedding(g_cpu, tc, wdt, vocab, dim, ic, (struct eng_mat){out.c, 0, ld}, m, &err),
        "cpu embedding");
    DIE_IF(
        eng_op_embedding(g_gpu, tg, wdt, vocab, dim, ig, (struct eng_mat){out.g, 0, ld}, m, &err),
        "gpu embedding");
    char what[128];
    snprintf(what, sizeof what, "embedding %s vocab %d dim %d m %d", f16 ? "f16" : "f32", vocab,
             dim, m);
    compare_view(what, &out, 0, ld, m, dim, f16 ? 0.0 : 1e-3);
    /* An id outside the vocabulary is refused. */
    int32_t badid = vocab;
    DIE_IF(eng_buf_upload(g_gpu, ig, 0, &badid, 4, &err), "upload");
    inf_status_t st =
        eng_op_embedding(g_gpu, tg, wdt, vocab, dim, ig, (struct eng_mat){out.g, 0, ld}, m, &err);
    expect_status("embedding: id = vocab refused", st, INF_E_INVALID, &err);
    pair_free(&out);
    eng_buf_free(g_cpu, tc);
    eng_buf_free(g_gpu, tg);
    eng_buf_free(g_cpu, ic);
    eng_buf_free(g_gpu, ig);
    free(t);
    free(ids);
}

/* pad: rows of dim + pad elements; 0 gives dense rows, 16-byte aligned
 * with dim % 8 == 0 (the vector kernel), 3 the strided kernel. */
static bool g_norm_perm; /* test_rmsnorm: the output in a random column order */

static void test_rmsnorm(int32_t dim, int32_t m, bool with_delta, int32_t pad)
{
    struct inf_err err = {0};
    int64_t ld = dim + pad;
    int32_t *order = rand_perm(dim);
    struct eng_buf *pc = NULL, *pg = NULL;
    if (g_norm_perm) {
        DIE_IF(eng_buf_from_host(g_cpu, order, (size_t)dim * 4, &pc, &err), "perm");
        DIE_IF(eng_buf_from_host(g_gpu, order, (size_t)dim * 4, &pg, &err), "perm");
    }
    float *xv = frand((int64_t)m * ld, -2, 2), *dv = frand((int64_t)m * ld, -1, 1);
    float *wv = frand(dim, 0.5f, 1.5f);
    struct pair x = pair_make(xv, (int64_t)m * ld), d = pair_make(dv, (int64_t)m * ld);
    struct pair out = pair_make(NULL, (int64_t)m * dim);
    struct eng_buf *wc, *wg;
    DIE_IF(eng_buf_from_host(g_cpu, wv, (size_t)dim * 4, &wc, &err), "w");
    DIE_IF(eng_buf_from_host(g_gpu, wv, (size_t)dim * 4, &wg, &err), "w");
    struct eng_mat dc = {d.c, 0, ld}, dg = {d.g, 0, ld};
    DIE_IF(eng_op_rmsnorm_add(g_cpu, (struct eng_mat){x.c, 0, ld}, with_delta ? &dc : NULL, wc, pc,
                              1e-5f, (struct eng_mat){out.c, 0, dim}, dim, m, &err),
           "cpu rmsnorm");
    DIE_IF(eng_op_rmsnorm_add(g_gpu, (struct eng_mat){x.g, 0, ld}, with_delta ? &dg : NULL, wg, pg,
                              1e-5f, (struct eng_mat){out.g, 0, dim}, dim, m, &err),
           "gpu rmsnorm");
    char what[128];
    snprintf(what, sizeof what, "rmsnorm%s%s dim %d m %d ld %d: out", with_delta ? "+add" : "",
             g_norm_perm ? " ordered" : "", dim, m, (int)ld);
    compare(what, &out, 2e-3);
    snprintf(what, sizeof what, "rmsnorm%s dim %d m %d ld %d: residual", with_delta ? "+add" : "",
             dim, m, (int)ld);
    compare_view(what, &x, 0, ld, m, dim, 2e-3);
    pair_free(&x);
    pair_free(&d);
    pair_free(&out);
    eng_buf_free(g_cpu, wc);
    eng_buf_free(g_gpu, wg);
    eng_buf_free(g_cpu, pc);
    eng_buf_free(g_gpu, pg);
    free(order);
    free(xv);
    free(dv);
    free(wv);
}

static void test_rope(int32_t n_heads, int32_t hd, int32_t m, bool llama3, int32_t max_pos)
{
    struct inf_err err = {0};
    int64_t ld = (int64_t)n_heads * hd + 16;
    float *xv = frand((int64_t)m * ld, -1, 1);
    int32_t *pos = malloc((size_t)m * 4);
    for (int32_t i = 0; i < m; i++)
        pos[i] = (int32_t)(rnd() % (uint64_t)max_pos);
    struct pair x = pair_make(xv, (int64_t)m * ld);
    struct eng_buf *pc, *pg;
    ints_make(pos, m, &pc, &pg);
    struct eng_rope_params rp = {.theta = llama3 ? 500000.0f : 10000.0f,
                                 .llama3 = llama3,
                                 .factor = 8.0f,
                                 .low_freq = 1.0f,
                                 .high_freq = 4.0f,
                                 .orig_max_pos = 8192};
    DIE_IF(eng_op_rope(g_cpu, (struct eng_mat){x.c, 0, ld}, n_heads, hd, pc, &rp, m, &err),
           "cpu rope");
    DIE_IF(eng_op_rope(g_gpu, (struct eng_mat){x.g, 0, ld}, n_heads, hd, pg, &rp, m, &err),
           "gpu rope");
    char what[128];
    snprintf(what, sizeof what, "rope heads %d hd %d m %d%s pos < %d", n_heads, hd, m,
             llama3 ? " llama3" : "", max_pos);
    compare_view(what, &x, 0, ld, m, (int64_t)n_heads * hd, 2e-3);
    pair_free(&x);
    eng_buf_free(g_cpu, pc);
    eng_buf_free(g_gpu, pg);
    free(xv);
    free(pos);
}

static void test_silu(int32_t dim, int32_t m)
{
    struct inf_err err = {0};
    int64_t ld = 2 * (int64_t)dim; /* gate | up side by side, as the model lays them */
    float *gu = frand((int64_t)m * ld, -6, 6);
    struct pair in = pair_make(gu, (int64_t)m * ld), out = pair_make(NULL, (int64_t)m * dim);
    DIE_IF(eng_op_silu_mul(g_cpu, (struct eng_mat){in.c, 0, ld}, (struct eng_mat){in.c, dim, ld},
                           (struct eng_mat){out.c, 0, dim}, dim, m, &err),
           "cpu silu");
    DIE_IF(eng_op_silu_mul(g_gpu, (struct eng_mat){in.g, 0, ld}, (struct eng_mat){in.g, dim, ld},
                           (struct eng_mat){out.g, 0, dim}, dim, m, &err),
           "gpu silu");
    char what[128];
    snprintf(what, sizeof what, "silu_mul dim %d m %d", dim, m);
    compare(what, &out, 2e-3);
    pair_free(&in);
    pair_free(&out);
    free(gu);
}

static void test_gather(int32_t dim, int32_t rows, int32_t m)
{
    struct inf_err err = {0};
    float *xv = frand((int64_t)rows * dim, -3, 3);
    int32_t *idx = malloc((size_t)m * 4);
    for (int32_t i = 0; i < m; i++)
        idx[i] = (int32_t)(rnd() % (uint64_t)rows);
    struct pair x = pair_make(xv, (int64_t)rows * dim), out = pair_make(NULL, (int64_t)m * dim);
    struct eng_buf *ic, *ig;
    ints_make(idx, m, &ic, &ig);
    DIE_IF(eng_op_rows_gather(g_cpu, (struct eng_mat){x.c, 0, dim}, ic,
                              (struct eng_mat){out.c, 0, dim}, dim, m, &err),
           "cpu gather");
    DIE_IF(eng_op_rows_gather(g_gpu, (struct eng_mat){x.g, 0, dim}, ig,
                              (struct eng_mat){out.g, 0, dim}, dim, m, &err),
           "gpu gather");
    char what[128];
    snprintf(what, sizeof what, "rows_gather dim %d rows %d m %d", dim, rows, m);
    compare(what, &out, 0.0);
    int32_t bad = rows;
    DIE_IF(eng_buf_upload(g_gpu, ig, 0, &bad, 4, &err), "upload");
    inf_status_t st = eng_op_rows_gather(g_gpu, (struct eng_mat){x.g, 0, dim}, ig,
                                         (struct eng_mat){out.g, 0, dim}, dim, m, &err);
    expect_status("rows_gather: row past the buffer refused", st, INF_E_INVALID, &err);
    pair_free(&x);
    pair_free(&out);
    eng_buf_free(g_cpu, ic);
    eng_buf_free(g_gpu, ig);
    free(xv);
    free(idx);
}

/* While set, test_linear_q4 and test_linear_q4_glu give their weights a
 * random column order (kernels/q4.h perm, an act-order checkpoint's): both
 * backends then read x[:, perm]. */
static bool g_perm;

static void maybe_perm(struct krn_q4_weight *q)
{
    if (!g_perm)
        return;
    q->perm = rand_perm(q->k);
}

/* INT4 linear; x_pad / y_pad add columns to the row strides (strided views). */
static void test_linear_q4(int32_t m, int32_t n, int32_t k, int32_t group, bool sym, bool bias,
                           int32_t x_pad, int32_t y_pad)
{
    struct inf_err err = {0};
    float *wv = frand((int64_t)n * k, -1, 1);
    struct krn_q4_weight q;
    DIE_IF(eng_q4_quantize(wv, n, k, group, sym, &q, &err), "quantize");
    maybe_perm(&q);
    struct eng_q4w *wc, *wg;
    DIE_IF(eng_weight_q4_create(g_cpu, &q, &wc, &err), "cpu q4");
    DIE_IF(eng_weight_q4_create(g_gpu, &q, &wg, &err), "gpu q4");
    eng_q4_free(&q);
    int64_t ldx = k + x_pad, ldy = n + y_pad;
    float *xv = frand((int64_t)m * ldx, -1, 1);
    struct pair x = pair_make(xv, (int64_t)m * ldx), y = pair_make(NULL, (int64_t)m * ldy);
    struct eng_buf *bc = NULL, *bg = NULL;
    float *bv = NULL;
    if (bias) {
        bv = frand(n, -0.5f, 0.5f);
        DIE_IF(eng_buf_from_host(g_cpu, bv, (size_t)n * 4, &bc, &err), "bias");
        DIE_IF(eng_buf_from_host(g_gpu, bv, (size_t)n * 4, &bg, &err), "bias");
    }
    DIE_IF(eng_op_linear_q4(g_cpu, wc, bc, (struct eng_mat){x.c, 0, ldx},
                            (struct eng_mat){y.c, 0, ldy}, false, m, &err),
           "cpu linear_q4");
    DIE_IF(eng_op_linear_q4(g_gpu, wg, bg, (struct eng_mat){x.g, 0, ldx},
                            (struct eng_mat){y.g, 0, ldy}, false, m, &err),
           "gpu linear_q4");
    char what[128];
    snprintf(what, sizeof what, "linear_q4 m %d n %d k %d g %d %s%s%s%s", m, n, k, group,
             sym ? "sym" : "asym", bias ? " bias" : "", x_pad || y_pad ? " strided" : "",
             g_perm ? " perm" : "");
    compare_view(what, &y, 0, ldy, m, n, 3e-3);
    pair_free(&x);
    pair_free(&y);
    eng_buf_free(g_cpu, bc);
    eng_buf_free(g_gpu, bg);
    eng_weight_q4_destroy(g_cpu, wc);
    eng_weight_q4_destroy(g_gpu, wg);
    free(wv);
    free(xv);
    free(bv);
}

/* A fixed-shape decode step of m one-token sequences (what a decode graph
 * runs), opened by graph_prepare on a small attention layout: m sequences
 * at position 0, a KV block each. */
struct fx_step {
    struct eng_buf *pos, *seqs, *bt, *kc, *vc, *q;
};

static void fx_begin(struct fx_step *f, int32_t m)
{
    struct inf_err err = {0};
    const int32_t H = 2, hd = 64;
    int32_t *pos = calloc((size_t)m, 4), *seqs = malloc((size_t)m * 12),
            *bt = malloc((size_t)m * 4);
    for (int32_t s = 0; s < m; s++) {
        seqs[3 * s] = s;
        seqs[3 * s + 1] = 1;
        seqs[3 * s + 2] = s;
        bt[s] = s;
    }
    DIE_IF(eng_buf_from_host(g_gpu, pos, (size_t)m * 4, &f->pos, &err), "pos");
    DIE_IF(eng_buf_from_host(g_gpu, seqs, (size_t)m * 12, &f->seqs, &err), "seqs");
    DIE_IF(eng_buf_from_host(g_gpu, bt, (size_t)m * 4, &f->bt, &err), "bt");
    const size_t pool = (size_t)m * ENG_KV_BLOCK * H * hd * 2;
    DIE_IF(eng_buf_alloc(g_gpu, pool, &f->kc, &err), "k pool");
    DIE_IF(eng_buf_alloc(g_gpu, pool, &f->vc, &err), "v pool");
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)m * 3 * H * hd * 2, &f->q, &err), "qkv");
    struct eng_attn_params ap = {.n_heads = H,
                                 .n_kv_heads = H,
                                 .head_dim = hd,
                                 .scale = 0.125f,
                                 .q = {f->q, 0, 3 * H * hd},
                                 .k = {f->q, H * hd, 3 * H * hd},
                                 .v = {f->q, 2 * H * hd, 3 * H * hd},
                                 .out = {f->q, 0, 3 * H * hd},
                                 .pos = f->pos,
                                 .seqs = f->seqs,
                                 .n_seqs = m,
                                 .block_table = f->bt,
                                 .n_slots = m,
                                 .max_blocks = 1,
                                 .k_cache = f->kc,
                                 .v_cache = f->vc,
                                 .n_blocks = m};
    bool have = false;
    DIE_IF(eng_graph_prepare(g_gpu, &ap, m, NULL, 0, &have, &err), "graph_prepare");
    free(pos);
    free(seqs);
    free(bt);
}

static void fx_end(struct fx_step *f)
{
    eng_graph_finish(g_gpu);
    eng_buf_free(g_gpu, f->pos);
    eng_buf_free(g_gpu, f->seqs);
    eng_buf_free(g_gpu, f->bt);
    eng_buf_free(g_gpu, f->kc);
    eng_buf_free(g_gpu, f->vc);
    eng_buf_free(g_gpu, f->q);
}

/* A gated MLP's gate/up as one GLU weight (linear_q4_glu): against the CPU's
 * linear_q4 + silu_mul, and bit for bit against the GPU's own linear_q4 on
 * [gate; up] followed by silu_mul. x_pad / o_pad pad the row strides of x
 * and out (strided views). */
static void test_linear_q4_glu(int32_t m, int32_t dim, int32_t k, int32_t group, bool sym,
                               int32_t x_pad, int32_t o_pad)
{
    struct inf_err err = {0};
    const int32_t n = 2 * dim;
    float *wv = frand((int64_t)n * k, -1, 1);
    struct krn_q4_weight q;
    DIE_IF(eng_q4_quantize(wv, n, k, group, sym, &q, &err), "quantize");
    maybe_perm(&q);
    struct eng_q4w *wc, *wg, *wglu;
    DIE_IF(eng_weight_q4_create(g_cpu, &q, &wc, &err), "cpu q4");
    DIE_IF(eng_weight_q4_create(g_gpu, &q, &wg, &err), "gpu q4");
    DIE_IF(eng_weight_q4_create_glu(g_gpu, &q, &wglu, &err), "gpu q4 glu");
    struct eng_q4w *none = NULL;
    expect_status("create_glu: the CPU backend has none",
                  eng_weight_q4_create_glu(g_cpu, &q, &none, &err), INF_E_UNSUPPORTED, &err);
    eng_q4_free(&q);
    const int64_t ldx = k + x_pad, ldo = dim + o_pad;
    float *xv = frand((int64_t)m * ldx, -1, 1);
    struct pair x = pair_make(xv, (int64_t)m * ldx), gu = pair_make(NULL, (int64_t)m * n),
                out = pair_make(NULL, (int64_t)m * ldo), ref = pair_make(NULL, (int64_t)m * ldo);
    /* CPU and the GPU's unfused path */
    DIE_IF(eng_op_linear_q4(g_cpu, wc, NULL, (struct eng_mat){x.c, 0, ldx},
                            (struct eng_mat){gu.c, 0, n}, false, m, &err),
           "cpu linear_q4");
    DIE_IF(eng_op_silu_mul(g_cpu, (struct eng_mat){gu.c, 0, n}, (struct eng_mat){gu.c, dim, n},
                           (struct eng_mat){out.c, 0, ldo}, dim, m, &err),
           "cpu silu");
    DIE_IF(eng_op_linear_q4(g_gpu, wg, NULL, (struct eng_mat){x.g, 0, ldx},
                            (struct eng_mat){gu.g, 0, n}, false, m, &err),
           "gpu linear_q4");
    DIE_IF(eng_op_silu_mul(g_gpu, (struct eng_mat){gu.g, 0, n}, (struct eng_mat){gu.g, dim, n},
                           (struct eng_mat){ref.g, 0, ldo}, dim, m, &err),
           "gpu silu");
    /* the unfused path's g and u (for the fixed-shape bound below) */
    uint16_t *hgu = malloc((size_t)m * n * 2);
    DIE_IF(eng_buf_download(g_gpu, gu.g, 0, hgu, (size_t)m * n * 2, &err), "download");
    /* the GLU op, its scratch poisoned */
    uint16_t *poison = malloc((size_t)m * n * 2);
    memset(poison, 0xff, (size_t)m * n * 2);
    DIE_IF(eng_buf_upload(g_gpu, gu.g, 0, poison, (size_t)m * n * 2, &err), "poison");
    DIE_IF(eng_op_linear_q4_glu(g_gpu, wglu, (struct eng_mat){x.g, 0, ldx},
                                (struct eng_mat){gu.g, 0, n}, (struct eng_mat){out.g, 0, ldo}, m,
                                &err),
           "gpu linear_q4_glu");
    char what[128];
    snprintf(what, sizeof what, "linear_q4_glu m %d dim %d k %d g %d %s%s%s", m, dim, k, group,
             sym ? "sym" : "asym", x_pad || o_pad ? " strided" : "", g_perm ? " perm" : "");
    compare_view(what, &out, 0, ldo, m, dim, 3e-3);
    /* bit for bit the unfused GPU path (the padding columns are never written) */
    uint16_t *h1 = malloc((size_t)m * ldo * 2), *h2 = malloc((size_t)m * ldo * 2);
    DIE_IF(eng_buf_download(g_gpu, out.g, 0, h1, (size_t)m * ldo * 2, &err), "download");
    DIE_IF(eng_buf_download(g_gpu, ref.g, 0, h2, (size_t)m * ldo * 2, &err), "download");
    int64_t diff = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < dim; c++)
            diff += h1[r * ldo + c] != h2[r * ldo + c];
    g_checks++;
    if (diff) {
        g_fail++;
        printf("FAIL %s: %lld values differ from linear_q4 + silu_mul\n", what, (long long)diff);
    }
    /* Inside a fixed-shape decode step of at most 16 rows the gate/up sums
     * end as fixed-point words and SiLU·mul is taken from them
     * (krn_int4_gemm_acc_reduce_glu): against the CPU, and within what a
     * step of g and of u can change of the unfused path (the sums differ by
     * the fixed point's rounding, then g and u are rounded to fp16:
     * glu_step_bound). */
    if (m <= 16) {
        struct fx_step fx;
        fx_begin(&fx, m);
        DIE_IF(eng_buf_upload(g_gpu, gu.g, 0, poison, (size_t)m * n * 2, &err), "poison");
        DIE_IF(eng_buf_upload(g_gpu, out.g, 0, poison,
                              (size_t)m * ldo * 2 < (size_t)m * n * 2 ? (size_t)m * ldo * 2
                                                                      : (size_t)m * n * 2,
                              &err),
               "poison");
        DIE_IF(eng_op_linear_q4_glu(g_gpu, wglu, (struct eng_mat){x.g, 0, ldx},
                                    (struct eng_mat){gu.g, 0, n}, (struct eng_mat){out.g, 0, ldo},
                                    m, &err),
               "gpu linear_q4_glu (fixed shape)");
        fx_end(&fx);
        char what2[160];
        snprintf(what2, sizeof what2, "%s (fixed-shape step)", what);
        compare_view(what2, &out, 0, ldo, m, dim, 3e-3);
        DIE_IF(eng_buf_download(g_gpu, out.g, 0, h1, (size_t)m * ldo * 2, &err), "download");
        int64_t far = 0, other = 0;
        for (int64_t r = 0; r < m; r++) {
            /* The words sum the blocks' fp32 partials exactly, the plain
             * path in fp32: where the partials cancel, a small g or u can
             * move by more than one of its own steps. 2^-18 of the row's
             * RMS is about 100 times the fp32 rounding of a typical
             * partial. (One value of 2752 beyond the bound without it on
             * the H200, INT4SERVE_TEST_SEED=759914654752824.) */
            double sg = 0, su = 0;
            for (int64_t c = 0; c < dim; c++) {
                const double g = inf_f16_to_f32(hgu[r * n + c]),
                             u = inf_f16_to_f32(hgu[r * n + dim + c]);
                sg += g * g;
                su += u * u;
            }
            const float g_min = ldexpf((float)sqrt(sg / dim), -18),
                        u_min = ldexpf((float)sqrt(su / dim), -18);
            for (int64_t c = 0; c < dim; c++) {
                const float a = inf_f16_to_f32(h1[r * ldo + c]),
                            b = inf_f16_to_f32(h2[r * ldo + c]);
                const float g = inf_f16_to_f32(hgu[r * n + c]),
                            u = inf_f16_to_f32(hgu[r * n + dim + c]);
                other += h1[r * ldo + c] != h2[r * ldo + c];
                const float bound = glu_step_bound_floor(g, u, b, g_min, u_min);
                if (!(fabsf(a - b) <= bound) && far++ < 3)
                    printf("  row %lld col %lld: %.8g against %.8g (g %.8g u %.8g, bound %.3g)\n",
                           (long long)r, (long long)c, a, b, g, u, bound);
            }
        }
        g_checks++;
        if (far) {
            g_fail++;
            printf("FAIL %s: %lld values beyond a step of g and u from linear_q4 + silu_mul\n",
                   what2, (long long)far);
        } else {
            printf("ok   %s: %lld of %lld values differ from linear_q4 + silu_mul, all within a "
                   "step of g and u\n",
                   what2, (long long)other, (long long)m * dim);
        }
    }
    /* a GLU weight is for linear_q4_glu only */
    expect_status("linear_q4 on a GLU weight refused",
                  eng_op_linear_q4(g_gpu, wglu, NULL, (struct eng_mat){x.g, 0, ldx},
                                   (struct eng_mat){gu.g, 0, n}, false, m, &err),
                  INF_E_INVALID, &err);
    free(h1);
    free(h2);
    free(hgu);
    free(poison);
    pair_free(&x);
    pair_free(&gu);
    pair_free(&out);
    pair_free(&ref);
    eng_weight_q4_destroy(g_cpu, wc);
    eng_weight_q4_destroy(g_gpu, wg);
    eng_weight_q4_destroy(g_gpu, wglu);
    free(wv);
    free(xv);
}

/* ---- the fused halves of a layer ------------------------------------------------ */
/* An INT4 linear on both backends from the same random weight. */
struct q4_pair {
    struct eng_q4w *c, *g;
    struct eng_linear lc, lg;
};

static struct q4_pair q4_pair_make(int32_t n, int32_t k, int32_t group, bool glu)
{
    struct inf_err err = {0};
    /* variance 1/k, so that each output keeps its input's scale: weights
     * of +-1 make a 4096-wide layer's sums overflow fp16 two linears on */
    const float a = sqrtf(3.0f / (float)k);
    float *wv = frand((int64_t)n * k, -a, a);
    struct krn_q4_weight q;
    DIE_IF(eng_q4_quantize(wv, n, k, group, false, &q, &err), "quantize");
    struct q4_pair p = {0};
    DIE_IF(eng_weight_q4_create(g_cpu, &q, &p.c, &err), "cpu q4");
    if (glu)
        DIE_IF(eng_weight_q4_create_glu(g_gpu, &q, &p.g, &err), "gpu q4 glu");
    else
        DIE_IF(eng_weight_q4_create(g_gpu, &q, &p.g, &err), "gpu q4");
    eng_q4_free(&q);
    free(wv);
    p.lc = (struct eng_linear){.n = n, .k = k, .q4 = p.c};
    p.lg = (struct eng_linear){.n = n, .k = k, .q4 = p.g, .glu = glu};
    return p;
}

static void q4_pair_free(struct q4_pair *p)
{
    eng_weight_q4_destroy(g_cpu, p->c);
    eng_weight_q4_destroy(g_gpu, p->g);
}

/* The poisoned elements (0xffff) of rows x cols of a GPU buffer. */
static int64_t poisoned(struct eng_buf *b, int64_t rows, int64_t ld, int64_t cols)
{
    struct inf_err err = {0};
    uint16_t *h = malloc((size_t)rows * ld * 2);
    DIE_IF(eng_buf_download(g_gpu, b, 0, h, (size_t)rows * ld * 2, &err), "download");
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            n += h[r * ld + c] == 0xffff;
    free(h);
    return n;
}

static void poison(struct eng_buf *b, size_t bytes)
{
    struct inf_err err = {0};
    uint8_t *h = malloc(bytes);
    memset(h, 0xff, bytes);
    DIE_IF(eng_buf_upload(g_gpu, b, 0, h, bytes, &err), "poison");
    free(h);
}

static void want_words(const char *what, struct eng_buf *b, int64_t rows, int64_t ld, int64_t cols,
                       bool want)
{
    const int64_t n = poisoned(b, rows, ld, cols), all = rows * cols;
    const bool words = n == all;
    g_checks++;
    if (words != want || (n && !words)) {
        g_fail++;
        printf("FAIL %s: %lld of %lld poisoned (want %s)\n", what, (long long)n, (long long)all,
               want ? "the fixed-point words, never written" : "written");
    } else {
        printf("ok   %s: %s\n", what, words ? "handed over as fixed-point words" : "written");
    }
}

/* The attention half of a layer (eng_op_attn_block) in a decode step of m
 * sequences with contexts of up to 300 positions, fused q/k/v (bias when
 * asked) and o: the GPU's fused form inside a fixed-shape step and its
 * composition outside one, against the CPU's composition (x, xn and both
 * pools). want: inside the step the o linear hands its sums over as words
 * (its fp16 output keeps its poison), and so does the q/k/v linear where it
 * has no bias. */
static void test_attn_block(int32_t m, int32_t nh, int32_t nkv, int32_t hd, int32_t dim,
                            int32_t group, bool bias, bool want)
{
    struct inf_err err = {0};
    const int32_t qd = nh * hd, kvd = nkv * hd, qkvw = qd + 2 * kvd;
    int32_t *before = malloc((size_t)m * 4), max_blocks = 0;
    for (int32_t s = 0; s < m; s++) {
        before[s] = (int32_t)(rnd() % 300);
        int32_t need = before[s] / ENG_KV_BLOCK + 1;
        max_blocks = need > max_blocks ? need : max_blocks;
    }
    const int32_t n_blocks = m * max_blocks;
    int32_t *seqs = malloc((size_t)m * 12), *pos = malloc((size_t)m * 4);
    int32_t *bt = malloc((size_t)m * max_blocks * 4);
    for (int32_t s = 0; s < m; s++) {
        seqs[3 * s] = s;
        seqs[3 * s + 1] = 1;
        seqs[3 * s + 2] = s;
        pos[s] = before[s];
        for (int32_t b = 0; b < max_blocks; b++)
            bt[s * max_blocks + b] = b <= before[s] / ENG_KV_BLOCK ? s * max_blocks + b : -1;
    }
    struct eng_buf *sc, *sg, *pc, *pg, *bc, *bg;
    ints_make(seqs, (int64_t)m * 3, &sc, &sg);
    ints_make(pos, m, &pc, &pg);
    ints_make(bt, (int64_t)m * max_blocks, &bc, &bg);
    const int64_t pool = (int64_t)n_blocks * ENG_KV_BLOCK * kvd;
    float *kv0 = frand(pool, -1, 1), *vv0 = frand(pool, -1, 1);
    float *xv = frand((int64_t)m * dim, -2, 2), *xnv = frand((int64_t)m * dim, -1, 1);
    float *nv = frand(dim, 0.5f, 1.5f), *bv = bias ? frand(qkvw, -0.5f, 0.5f) : NULL;
    struct q4_pair wqkv = q4_pair_make(qkvw, dim, group, false),
                   wo = q4_pair_make(dim, qd, group, false);
    struct eng_buf *nc, *ng, *bic = NULL, *big = NULL;
    DIE_IF(eng_buf_from_host(g_cpu, nv, (size_t)dim * 4, &nc, &err), "norm");
    DIE_IF(eng_buf_from_host(g_gpu, nv, (size_t)dim * 4, &ng, &err), "norm");
    if (bias) {
        DIE_IF(eng_buf_from_host(g_cpu, bv, (size_t)qkvw * 4, &bic, &err), "bias");
        DIE_IF(eng_buf_from_host(g_gpu, bv, (size_t)qkvw * 4, &big, &err), "bias");
        wqkv.lc.bias = bic;
        wqkv.lg.bias = big;
    }
    const struct eng_rope_params rope = {.theta = 10000.0f};
    for (int where = 0; where < 2; where++) { /* 0: inside a fixed-shape step, 1: outside */
        struct pair x = pair_make(xv, (int64_t)m * dim), xn = pair_make(xnv, (int64_t)m * dim);
        struct pair kc = pair_make(kv0, pool), vc = pair_make(vv0, pool);
        struct pair qkv = pair_make(NULL, (int64_t)m * qkvw),
                    att = pair_make(NULL, (int64_t)m * qd);
        struct pair d = pair_make(NULL, (int64_t)m * dim);
        struct eng_attn_block ab = {.m = m,
                                    .dim = dim,
                                    .n_qkv = 1,
                                    .rope = &rope,
                                    .n_dec = m,
                                    .eps = 1e-5f,
                                    .attn = {.n_heads = nh,
                                             .n_kv_heads = nkv,
                                             .head_dim = hd,
                                             .scale = 1.0f / sqrtf((float)hd),
                                             .n_slots = m,
                                             .max_blocks = max_blocks,
                                             .n_blocks = n_blocks}};
        for (int bi = 0; bi < 2; bi++) {
            struct eng_backend *be = bi ? g_gpu : g_cpu;
            struct eng_buf *Q = bi ? qkv.g : qkv.c;
            struct eng_attn_block b = ab;
            b.x = (struct eng_mat){bi ? x.g : x.c, 0, dim};
            b.xn = (struct eng_mat){bi ? xn.g : xn.c, 0, dim};
            b.qkv[0] = bi ? &wqkv.lg : &wqkv.lc;
            b.o = bi ? &wo.lg : &wo.lc;
            b.d = (struct eng_mat){bi ? d.g : d.c, 0, dim};
            b.norm = bi ? ng : nc;
            b.seq_dec = bi ? sg : sc;
            b.attn.q = (struct eng_mat){Q, 0, qkvw};
            b.attn.k = (struct eng_mat){Q, qd, qkvw};
            b.attn.v = (struct eng_mat){Q, qd + kvd, qkvw};
            b.attn.out = (struct eng_mat){bi ? att.g : att.c, 0, qd};
            b.attn.pos = bi ? pg : pc;
            b.attn.block_table = bi ? bg : bc;
            b.attn.k_cache = bi ? kc.g : kc.c;
            b.attn.v_cache = bi ? vc.g : vc.c;
            bool have = false;
            if (bi && where == 0) {
                struct eng_attn_params ap = b.attn;
                ap.seqs = sg;
                ap.n_seqs = m;
                DIE_IF(eng_graph_prepare(g_gpu, &ap, m, NULL, 0, &have, &err), "graph_prepare");
            }
            DIE_IF(eng_op_attn_block(be, &b, &err), "attn_block");
            if (bi && where == 0)
                eng_graph_finish(g_gpu);
        }
        char what[160];
        const char *how = where ? "composed" : "fixed-shape step";
        snprintf(what, sizeof what, "attn_block m %d h %d/%d hd %d dim %d%s (%s): x", m, nh, nkv,
                 hd, dim, bias ? " bias" : "", how);
        compare(what, &x, 3e-3);
        snprintf(what, sizeof what, "attn_block m %d h %d/%d hd %d (%s): xn", m, nh, nkv, hd, how);
        compare(what, &xn, 5e-3);
        snprintf(what, sizeof what, "attn_block m %d h %d/%d hd %d (%s): K cache", m, nh, nkv, hd,
                 how);
        compare(what, &kc, 3e-3);
        snprintf(what, sizeof what, "attn_block m %d h %d/%d hd %d (%s): V cache", m, nh, nkv, hd,
                 how);
        compare(what, &vc, 3e-3);
        snprintf(what, sizeof what, "attn_block m %d h %d/%d hd %d (%s): q/k/v", m, nh, nkv, hd,
                 how);
        want_words(what, qkv.g, m, qkvw, qkvw, want && !bias && where == 0);
        snprintf(what, sizeof what, "attn_block m %d h %d/%d hd %d (%s): o", m, nh, nkv, hd, how);
        want_words(what, d.g, m, dim, dim, want && where == 0);
        pair_free(&x);
        pair_free(&xn);
        pair_free(&kc);
        pair_free(&vc);
        pair_free(&qkv);
        pair_free(&att);
        pair_free(&d);
    }
    q4_pair_free(&wqkv);
    q4_pair_free(&wo);
    eng_buf_free(g_cpu, nc);
    eng_buf_free(g_gpu, ng);
    eng_buf_free(g_cpu, bic);
    eng_buf_free(g_gpu, big);
    eng_buf_free(g_cpu, sc);
    eng_buf_free(g_gpu, sg);
    eng_buf_free(g_cpu, pc);
    eng_buf_free(g_gpu, pg);
    eng_buf_free(g_cpu, bc);
    eng_buf_free(g_gpu, bg);
    free(before);
    free(seqs);
    free(pos);
    free(bt);
    free(kv0);
    free(vv0);
    free(xv);
    free(xnv);
    free(nv);
    free(bv);
}

/* The MLP half of a layer (eng_op_mlp_block): a GLU gate/up weight on the
 * GPU (the CPU has none: its plain [gate; up]) and down, inside a
 * fixed-shape step and outside one, against the CPU (x, xn); want: inside
 * the step down hands its sums over as words (d keeps its poison). Twice in
 * a row inside one step, so the second block uses the other word buffer
 * and zeroes the first's. */
static void test_mlp_block(int32_t m, int32_t dim, int32_t inter, int32_t group, bool want)
{
    struct inf_err err = {0};
    float *xv = frand((int64_t)m * dim, -2, 2), *xnv = frand((int64_t)m * dim, -1, 1);
    float *nv = frand(dim, 0.5f, 1.5f);
    struct q4_pair wgu = q4_pair_make(2 * inter, dim, group, true),
                   wd = q4_pair_make(dim, inter, group, false);
    struct eng_buf *nc, *ng;
    DIE_IF(eng_buf_from_host(g_cpu, nv, (size_t)dim * 4, &nc, &err), "norm");
    DIE_IF(eng_buf_from_host(g_gpu, nv, (size_t)dim * 4, &ng, &err), "norm");
    for (int where = 0; where < 2; where++) {
        struct pair x = pair_make(xv, (int64_t)m * dim), xn = pair_make(xnv, (int64_t)m * dim);
        struct pair gu = pair_make(NULL, (int64_t)m * 2 * inter),
                    h = pair_make(NULL, (int64_t)m * inter), d = pair_make(NULL, (int64_t)m * dim);
        struct fx_step fx;
        if (where == 0)
            fx_begin(&fx, m);
        for (int bi = 0; bi < 2; bi++) {
            struct eng_mlp_block b = {.m = m,
                                      .dim = dim,
                                      .inter = inter,
                                      .x = {bi ? x.g : x.c, 0, dim},
                                      .xn = {bi ? xn.g : xn.c, 0, dim},
                                      .gu = {bi ? &wgu.lg : &wgu.lc},
                                      .n_gu = 1,
                                      .gu_out = {bi ? gu.g : gu.c, 0, 2 * inter},
                                      .h = {bi ? h.g : h.c, 0, inter},
                                      .down = bi ? &wd.lg : &wd.lc,
                                      .d = {bi ? d.g : d.c, 0, dim},
                                      .norm = bi ? ng : nc,
                                      .eps = 1e-5f};
            for (int rep = 0; rep < 2; rep++) {
                if (bi && rep == 1)
                    poison(d.g, (size_t)m * dim * 2);
                DIE_IF(eng_op_mlp_block(bi ? g_gpu : g_cpu, &b, &err), "mlp_block");
            }
        }
        if (where == 0)
            fx_end(&fx);
        char what[160];
        const char *how = where ? "composed" : "fixed-shape step";
        snprintf(what, sizeof what, "mlp_block m %d dim %d inter %d g %d (%s): x", m, dim, inter,
                 group, how);
        compare(what, &x, 3e-3);
        snprintf(what, sizeof what, "mlp_block m %d dim %d inter %d (%s): xn", m, dim, inter, how);
        compare(what, &xn, 5e-3);
        snprintf(what, sizeof what, "mlp_block m %d dim %d inter %d (%s): down", m, dim, inter,
                 how);
        want_words(what, d.g, m, dim, dim, want && where == 0);
        pair_free(&x);
        pair_free(&xn);
        pair_free(&gu);
        pair_free(&h);
        pair_free(&d);
    }
    q4_pair_free(&wgu);
    q4_pair_free(&wd);
    eng_buf_free(g_cpu, nc);
    eng_buf_free(g_gpu, ng);
    free(xv);
    free(xnv);
    free(nv);
}

static void test_linear_fp(int32_t m, int32_t n, int32_t k, bool w16, bool y32, bool bias)
{
    struct inf_err err = {0};
    float *wv = frand((int64_t)n * k, -1, 1);
    struct eng_buf *wc, *wg;
    enum eng_wdtype wdt = w16 ? ENG_W_F16 : ENG_W_F32;
    if (w16) {
        uint16_t *h = malloc((size_t)n * k * 2);
        for (int64_t i = 0; i < (int64_t)n * k; i++)
            h[i] = inf_f32_to_f16(wv[i]);
        DIE_IF(eng_buf_from_host(g_cpu, h, (size_t)n * k * 2, &wc, &err), "w");
        DIE_IF(eng_buf_from_host(g_gpu, h, (size_t)n * k * 2, &wg, &err), "w");
        free(h);
    } else {
        DIE_IF(eng_buf_from_host(g_cpu, wv, (size_t)n * k * 4, &wc, &err), "w");
        DIE_IF(eng_buf_from_host(g_gpu, wv, (size_t)n * k * 4, &wg, &err), "w");
    }
    float *xv = frand((int64_t)m * k, -1, 1);
    struct pair x = pair_make(xv, (int64_t)m * k);
    struct eng_buf *bc = NULL, *bg = NULL;
    float *bv = NULL;
    if (bias) {
        bv = frand(n, -0.5f, 0.5f);
        DIE_IF(eng_buf_from_host(g_cpu, bv, (size_t)n * 4, &bc, &err), "bias");
        DIE_IF(eng_buf_from_host(g_gpu, bv, (size_t)n * 4, &bg, &err), "bias");
    }
    char what[128];
    snprintf(what, sizeof what, "linear_fp m %d n %d k %d w %s y %s%s", m, n, k,
             w16 ? "f16" : "f32", y32 ? "f32" : "f16", bias ? " bias" : "");
    int64_t ny = (int64_t)m * n;
    struct eng_buf *yc, *yg;
    DIE_IF(eng_buf_alloc(g_cpu, (size_t)ny * 4, &yc, &err), "y");
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)ny * (y32 ? 4 : 2), &yg, &err), "y");
    void *poison = malloc((size_t)ny * 4);
    memset(poison, 0xff, (size_t)ny * 4);
    DIE_IF(eng_buf_upload(g_gpu, yg, 0, poison, (size_t)ny * (y32 ? 4 : 2), &err), "poison");
    DIE_IF(eng_op_linear_fp(g_cpu, wc, wdt, n, k, bc, (struct eng_mat){x.c, 0, k},
                            (struct eng_mat){yc, 0, n}, y32, m, &err),
           "cpu linear_fp");
    DIE_IF(eng_op_linear_fp(g_gpu, wg, wdt, n, k, bg, (struct eng_mat){x.g, 0, k},
                            (struct eng_mat){yg, 0, n}, y32, m, &err),
           "gpu linear_fp");
    float *c = malloc((size_t)ny * 4), *g = malloc((size_t)ny * 4);
    DIE_IF(eng_buf_download(g_cpu, yc, 0, c, (size_t)ny * 4, &err), "download");
    if (y32) {
        DIE_IF(eng_buf_download(g_gpu, yg, 0, g, (size_t)ny * 4, &err), "download");
    } else {
        uint16_t *h = poison;
        DIE_IF(eng_buf_download(g_gpu, yg, 0, h, (size_t)ny * 2, &err), "download");
        for (int64_t i = 0; i < ny; i++)
            g[i] = inf_f16_to_f32(h[i]);
    }
    double d2 = 0, r2 = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < ny; i++) {
        if (!isfinite(g[i])) {
            bad++;
            continue;
        }
        d2 += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        r2 += (double)c[i] * c[i];
    }
    double rel = sqrt(d2 / r2);
    g_checks++;
    bool ok = bad == 0 && rel <= 3e-3;
    g_fail += !ok;
    printf("%-4s %-58s rel %.3e (tol 3e-03)%s\n", ok ? "ok" : "FAIL", what, rel,
           bad ? " NON-FINITE OUTPUT" : "");
    free(c);
    free(g);
    free(poison);
    pair_free(&x);
    eng_buf_free(g_cpu, yc);
    eng_buf_free(g_gpu, yg);
    eng_buf_free(g_cpu, wc);
    eng_buf_free(g_gpu, wg);
    eng_buf_free(g_cpu, bc);
    eng_buf_free(g_gpu, bg);
    free(wv);
    free(xv);
    free(bv);
}

/* ---- attention ---------------------------------------------------------------- */
/* A sliding window for test_attention2 (0: none): every sequence's table
 * entries wholly before the window of its first token point at a block of
 * NaN K and V, which the CPU never reads; a GPU kernel that loaded any of
 * its rows, even masked, would turn the output non-finite (0 x NaN), so
 * the GPU must skip those blocks, not only mask them. */
static int32_t g_window;

struct seq_spec {
    int32_t before; /* positions already in the cache */
    int32_t n_new;  /* tokens in this step */
};

/* fixed (decode only): after the eager calls, the same step again as a
 * fixed-shape decode step of n_seqs rows (graph_prepare: what a decode
 * graph runs), on fresh poison: against the CPU, and bit for bit the eager
 * output where both cut the keys alike (same_splits). */
static void test_attention2(const char *name, int32_t n_heads, int32_t n_kv, int32_t hd,
                            const struct seq_spec *sp, int32_t n_seqs, bool decode, bool fixed,
                            bool same_splits)
{
    struct inf_err err = {0};
    int32_t max_blocks = 0, n_tok = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t need = (sp[s].before + sp[s].n_new + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
        max_blocks = need > max_blocks ? need : max_blocks;
        n_tok += sp[s].n_new;
    }
    int32_t n_slots = n_seqs + 1; /* one unused slot */
    int32_t n_blocks = n_slots * max_blocks + 4;
    const int32_t nan_block = n_blocks - 1; /* the last: NaN rows (g_window) */
    /* Block tables: a shuffled pool, -1 past each sequence's end. */
    int32_t *perm = rand_perm(n_blocks - 1); /* the NaN block stays out */
    int32_t *bt = malloc((size_t)n_slots * max_blocks * 4);
    int32_t used = 0;
    for (int32_t s = 0; s < n_slots; s++)
        for (int32_t b = 0; b < max_blocks; b++) {
            /* slot s holds sequence n_seqs - 1 - s; the last slot is unused */
            int32_t q = n_seqs - 1 - s;
            int32_t need =
                q >= 0 ? (sp[q].before + sp[q].n_new + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK : 0;
            bt[s * max_blocks + b] = b < need ? perm[used++] : -1;
            if (q >= 0 && b < eng_attn_first_key(g_window, sp[q].before) / ENG_KV_BLOCK)
                bt[s * max_blocks + b] = nan_block; /* before the window: never read */
        }
    /* Batch: sequence s uses slot n_seqs - 1 - s (slots out of order). */
    int32_t *seqs = malloc((size_t)n_seqs * 12), *pos = malloc((size_t)n_tok * 4);
    int32_t t = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        seqs[3 * s] = t;
        seqs[3 * s + 1] = sp[s].n_new;
        seqs[3 * s + 2] = n_seqs - 1 - s;
        for (int32_t i = 0; i < sp[s].n_new; i++)
            pos[t++] = sp[s].before + i;
    }
    /* Existing KV: random rows at positions < before of each sequence,
     * written straight into both pools (fp16 values). */
    int64_t row = (int64_t)n_kv * hd, pool = (int64_t)n_blocks * ENG_KV_BLOCK * row;
    float *kpool = frand(pool, -1, 1), *vpool = frand(pool, -1, 1);
    for (int64_t i = (int64_t)nan_block * ENG_KV_BLOCK * row; i < pool; i++)
        kpool[i] = vpool[i] = NAN;
    struct pair kc = pair_make(kpool, pool), vc = pair_make(vpool, pool);
    /* q | k | v in one row, as the model lays them out. */
    int64_t ldq = (int64_t)(n_heads + 2 * n_kv) * hd;
    float *qkv = frand((int64_t)n_tok * ldq, -2, 2);
    struct pair in = pair_make(qkv, (int64_t)n_tok * ldq);
    int64_t ldo = (int64_t)n_heads * hd;
    struct pair out = pair_make(NULL, (int64_t)n_tok * ldo);
    struct eng_buf *sc, *sg, *pc, *pg, *bc, *bg;
    ints_make(seqs, (int64_t)n_seqs * 3, &sc, &sg);
    ints_make(pos, n_tok, &pc, &pg);
    ints_make(bt, (int64_t)n_slots * max_blocks, &bc, &bg);
    struct eng_attn_params a = {.n_heads = n_heads,
                                .n_kv_heads = n_kv,
                                .head_dim = hd,
                                .scale = 1.0f / sqrtf((float)hd),
                                .n_seqs = n_seqs,
                                .n_slots = n_slots,
                                .max_blocks = max_blocks,
                                .n_blocks = n_blocks,
                                .window = g_window};
    struct eng_attn_params ac = a, ag = a;
    ac.q = (struct eng_mat){in.c, 0, ldq};
    ac.k = (struct eng_mat){in.c, (int64_t)n_heads * hd, ldq};
    ac.v = (struct eng_mat){in.c, (int64_t)(n_heads + n_kv) * hd, ldq};
    ac.out = (struct eng_mat){out.c, 0, ldo};
    ac.pos = pc;
    ac.seqs = sc;
    ac.block_table = bc;
    ac.k_cache = kc.c;
    ac.v_cache = vc.c;
    ag.q = (struct eng_mat){in.g, 0, ldq};
    ag.k = (struct eng_mat){in.g, (int64_t)n_heads * hd, ldq};
    ag.v = (struct eng_mat){in.g, (int64_t)(n_heads + n_kv) * hd, ldq};
    ag.out = (struct eng_mat){out.g, 0, ldo};
    ag.pos = pg;
    ag.seqs = sg;
    ag.block_table = bg;
    ag.k_cache = kc.g;
    ag.v_cache = vc.g;
    inf_status_t (*op)(struct eng_backend *, const struct eng_attn_params *, struct inf_err *) =
        decode ? eng_op_attn_decode : eng_op_attn_prefill;
    DIE_IF(op(g_cpu, &ac, &err), "cpu attention");
    DIE_IF(op(g_gpu, &ag, &err), "gpu attention");
    char what[160];
    char wname[96];
    if (g_window > 0) /* the name says the window */
        snprintf(wname, sizeof wname, "%s window %d", name, g_window);
    else
        snprintf(wname, sizeof wname, "%s", name);
    name = wname;
    snprintf(what, sizeof what, "attn %s %s h %d/%d hd %d: out", decode ? "decode" : "prefill",
             name, n_heads, n_kv, hd);
    compare(what, &out, 3e-3);
    if (decode) {
        /* Again on fresh poison: the same answer (the K/V writes are
         * idempotent), so nothing the first launch left behind (arrival
         * counters of split groups) disturbs the next. */
        uint16_t *poison = malloc((size_t)n_tok * ldo * 2);
        memset(poison, 0xff, (size_t)n_tok * ldo * 2);
        DIE_IF(eng_buf_upload(g_gpu, out.g, 0, poison, (size_t)n_tok * ldo * 2, &err), "poison");
        free(poison);
        DIE_IF(op(g_gpu, &ag, &err), "gpu attention (again)");
        snprintf(what, sizeof what, "attn decode %s h %d/%d hd %d: out again", name, n_heads, n_kv,
                 hd);
        compare(what, &out, 3e-3);
    }
    if (decode && fixed) {
        const size_t ob = (size_t)n_tok * ldo * 2;
        uint16_t *eager = malloc(ob), *fx = malloc(ob);
        DIE_IF(eng_buf_download(g_gpu, out.g, 0, eager, ob, &err), "download");
        memset(fx, 0xff, ob);
        DIE_IF(eng_buf_upload(g_gpu, out.g, 0, fx, ob, &err), "poison");
        bool have = false;
        DIE_IF(eng_graph_prepare(g_gpu, &ag, n_seqs, NULL, 0, &have, &err), "graph_prepare");
        DIE_IF(op(g_gpu, &ag, &err), "gpu attention (fixed shape)");
        eng_graph_finish(g_gpu);
        snprintf(what, sizeof what, "attn decode %s h %d/%d hd %d: out (fixed shape)", name,
                 n_heads, n_kv, hd);
        compare(what, &out, 3e-3);
        if (same_splits) {
            DIE_IF(eng_buf_download(g_gpu, out.g, 0, fx, ob, &err), "download");
            g_checks++;
            const bool same = memcmp(eager, fx, ob) == 0;
            if (!same)
                g_fail++;
            printf("%-4s attn decode %s h %d/%d hd %d: fixed shape bit for bit eager\n",
                   same ? "ok" : "FAIL", name, n_heads, n_kv, hd);
        }
        free(eager);
        free(fx);
    }
    /* The K/V rows this step wrote, compared exactly (the whole pools but
     * the NaN block: untouched rows must stay as uploaded too). */
    const int64_t live = (int64_t)nan_block * ENG_KV_BLOCK * row;
    snprintf(what, sizeof what, "attn %s %s: K cache", decode ? "decode" : "prefill", name);
    compare_view(what, &kc, 0, live, 1, live, 0.0);
    snprintf(what, sizeof what, "attn %s %s: V cache", decode ? "decode" : "prefill", name);
    compare_view(what, &vc, 0, live, 1, live, 0.0);
    pair_free(&kc);
    pair_free(&vc);
    pair_free(&in);
    pair_free(&out);
    eng_buf_free(g_cpu, sc);
    eng_buf_free(g_gpu, sg);
    eng_buf_free(g_cpu, pc);
    eng_buf_free(g_gpu, pg);
    eng_buf_free(g_cpu, bc);
    eng_buf_free(g_gpu, bg);
    free(perm);
    free(bt);
    free(seqs);
    free(pos);
    free(kpool);
    free(vpool);
    free(qkv);
}

static void test_attention(const char *name, int32_t n_heads, int32_t n_kv, int32_t hd,
                           const struct seq_spec *sp, int32_t n_seqs, bool decode)
{
    test_attention2(name, n_heads, n_kv, hd, sp, n_seqs, decode, false, false);
}

/* GPU only, information: time attention on serving shapes (n_seqs
 * sequences of ctx positions, n_new tokens each in this step; Llama-3-8B
 * heads). Prints the time per call, the K/V bytes read (at least once) and
 * the attention FLOPs (2 matmuls, causal). */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void time_attention(int32_t n_seqs, int32_t ctx, int32_t n_new, bool decode)
{
    struct inf_err err = {0};
    const int32_t nh = 32, nkv = 8, hd = 128;
    int32_t per_seq = (ctx + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
    int32_t n_blocks = n_seqs * per_seq, n_tok = n_seqs * n_new;
    int64_t row = (int64_t)nkv * hd, pool = (int64_t)n_blocks * ENG_KV_BLOCK * row;
    int64_t ldq = (int64_t)(nh + 2 * nkv) * hd;
    struct eng_buf *kc, *vc, *in, *out, *sg, *pg, *bg, *probe;
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)pool * 2, &kc, &err), "k");
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)pool * 2, &vc, &err), "v");
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)n_tok * ldq * 2, &in, &err), "in");
    DIE_IF(eng_buf_alloc(g_gpu, (size_t)n_tok * nh * hd * 2, &out, &err), "out");
    /* Fill the pools and inputs with small fp16 values (0x2000 ~ 0.0078). */
    uint16_t *fill = malloc((size_t)(pool > n_tok * ldq ? pool : n_tok * ldq) * 2);
    for (int64_t i = 0; i < (pool > n_tok * ldq ? pool : n_tok * ldq); i++)
        fill[i] = (uint16_t)(0x2000 + (rnd() & 0x3ff));
    DIE_IF(eng_buf_upload(g_gpu, kc, 0, fill, (size_t)pool * 2, &err), "fill");
    DIE_IF(eng_buf_upload(g_gpu, vc, 0, fill, (size_t)pool * 2, &err), "fill");
    DIE_IF(eng_buf_upload(g_gpu, in, 0, fill, (size_t)n_tok * ldq * 2, &err), "fill");
    free(fill);
    int32_t *seqs = malloc((size_t)n_seqs * 12), *pos = malloc((size_t)n_tok * 4);
    int32_t *bt = malloc((size_t)n_blocks * 4);
    for (int32_t s = 0; s < n_seqs; s++) {
        seqs[3 * s] = s * n_new;
        seqs[3 * s + 1] = n_new;
        seqs[3 * s + 2] = s;
        for (int32_t i = 0; i < n_new; i++)
            pos[s * n_new + i] = ctx - n_new + i;
    }
    for (int32_t i = 0; i < n_blocks; i++)
        bt[i] = i;
    DIE_IF(eng_buf_from_host(g_gpu, seqs, (size_t)n_seqs * 12, &sg, &err), "seqs");
    DIE_IF(eng_buf_from_host(g_gpu, pos, (size_t)n_tok * 4, &pg, &err), "pos");
    DIE_IF(eng_buf_from_host(g_gpu, bt, (size_t)n_blocks * 4, &bg, &err), "bt");
    DIE_IF(eng_buf_alloc(g_gpu, 4, &probe, &err), "probe");
    struct eng_attn_params a = {.n_heads = nh,
                                .n_kv_heads = nkv,
                                .head_dim = hd,
                                .scale = 1.0f / sqrtf((float)hd),
                                .q = {in, 0, ldq},
                                .k = {in, (int64_t)nh * hd, ldq},
                                .v = {in, (int64_t)(nh + nkv) * hd, ldq},
                                .out = {out, 0, (int64_t)nh * hd},
                                .pos = pg,
                                .seqs = sg,
                                .n_seqs = n_seqs,
                                .block_table = bg,
                                .n_slots = n_seqs,
                                .max_blocks = per_seq,
                                .k_cache = kc,
                                .v_cache = vc,
                                .n_blocks = n_blocks};
    inf_status_t (*op)(struct eng_backend *, const struct eng_attn_params *, struct inf_err *) =
        decode ? eng_op_attn_decode : eng_op_attn_prefill;
    int32_t word;
    DIE_IF(op(g_gpu, &a, &err), "warm-up");
    DIE_IF(eng_buf_download(g_gpu, probe, 0, &word, 4, &err), "sync");
    const int iters = 20;
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        DIE_IF(op(g_gpu, &a, &err), "attention");
    DIE_IF(eng_buf_download(g_gpu, probe, 0, &word, 4, &err), "sync");
    double dt = (now_s() - t0) / iters;
    double kv_bytes = 2.0 * n_seqs * (double)ctx * row * 2;
    double keys = 0; /* (query, key) pairs per head */
    for (int32_t i = 0; i < n_new; i++)
        keys += ctx - n_new + i + 1;
    double flops = 4.0 * n_seqs * keys * nh * hd;
    printf("info attn %-7s seqs %3d ctx %5d new %4d (32/8 heads, hd 128): %8.3f ms  "
           "%7.1f GB/s K/V  %6.1f TFLOP/s\n",
           decode ? "decode" : "prefill", n_seqs, ctx, n_new, dt * 1e3, kv_bytes / dt / 1e9,
           flops / dt / 1e12);
    eng_buf_free(g_gpu, kc);
    eng_buf_free(g_gpu, vc);
    eng_buf_free(g_gpu, in);
    eng_buf_free(g_gpu, out);
    eng_buf_free(g_gpu, sg);
    eng_buf_free(g_gpu, pg);
    eng_buf_free(g_gpu, bg);
    eng_buf_free(g_gpu, probe);
    free(seqs);
    free(pos);
    free(bt);
}

/* Decode over batches of random lengths (positions before the new token:
 * 0 to max_before, mostly not multiples of the block), on the head shapes
 * of MHA, GQA and wide query groups. */
static void test_decode_random(int32_t n_seqs, int32_t max_before, int32_t n_heads, int32_t n_kv,
                               int32_t hd)
{
    struct seq_spec *sp = malloc((size_t)n_seqs * sizeof *sp);
    for (int32_t s = 0; s < n_seqs; s++)
        sp[s] = (struct seq_spec){(int32_t)(rnd() % (uint64_t)(max_before + 1)), 1};
    char name[64];
    snprintf(name, sizeof name, "%d seqs ctx <= %d", n_seqs, max_before + 1);
    test_attention(name, n_heads, n_kv, hd, sp, n_seqs, true);
    free(sp);
}

/* Fixed-shape decode steps (each row set with the bucket's number of item
 * slots, the unused ones padding) against the CPU and the eager call: one
 * split, two, three and six splits, long ones (ctx 20000), two and four
 * sequences; bit for bit the eager output up to ctx 512 (the longer ones
 * against the CPU only). */
static void test_decode_fixed(void)
{
    const struct seq_spec one_384[1] = {{383, 1}}, one_130[1] = {{129, 1}}, one_5[1] = {{4, 1}},
                          one_long[1] = {{19999, 1}};
    test_attention2("1 seq ctx 384", 32, 32, 128, one_384, 1, true, true, true);
    test_attention2("1 seq ctx 384", 32, 8, 128, one_384, 1, true, true, true);
    test_attention2("1 seq ctx 130", 32, 32, 128, one_130, 1, true, true, true);
    test_attention2("1 seq ctx 5", 32, 8, 128, one_5, 1, true, true, true);
    test_attention2("1 seq ctx 130", 8, 8, 64, one_130, 1, true, true, true);
    test_attention2("1 seq ctx 20000", 32, 8, 128, one_long, 1, true, true, false);
    test_attention2("1 seq ctx 20000", 8, 8, 64, one_long, 1, true, true, false);
    const struct seq_spec two[2] = {{700, 1}, {99, 1}};
    test_attention2("2 seqs ctx 701, 100", 32, 8, 128, two, 2, true, true, false);
    const struct seq_spec four[4] = {{300, 1}, {16, 1}, {511, 1}, {64, 1}};
    test_attention2("4 seqs ctx 301..17", 32, 8, 128, four, 4, true, true, true);
    test_attention2("4 seqs ctx 301..17 (MHA)", 32, 32, 128, four, 4, true, true, false);
    /* 768 row sets and more: another decode configuration
     * (krn_cuda_attn_impl_for), one item a row set */
    struct seq_spec many[128];
    for (int32_t s = 0; s < 128; s++)
        many[s] = (struct seq_spec){(s * 37) % 300, 1};
    test_attention2("48 seqs ctx <= 300 (MHA)", 32, 32, 128, many, 48, true, true, true);
    test_attention2("32 seqs ctx <= 300 (MHA)", 32, 32, 128, many, 32, true, true, true);
    test_attention2("24 seqs ctx <= 300 (MHA)", 32, 32, 128, many, 24, true, true, true);
    test_attention2("128 seqs ctx <= 300 (GQA 4)", 32, 8, 128, many, 128, true, true, true);
    test_attention2("48 seqs ctx <= 300 (GQA 4)", 32, 8, 128, many, 48, true, true, true);
}

static void test_decode_batches(void)
{
    /* batch 1: the latency case, split in the kernel */
    const struct seq_spec one_384[1] = {{383, 1}};
    test_attention("1 seq ctx 384", 32, 32, 128, one_384, 1, true);
    test_attention("1 seq ctx 384", 32, 8, 128, one_384, 1, true);
    const struct seq_spec one_short[1] = {{4, 1}};
    test_attention("1 seq ctx 5", 32, 8, 128, one_short, 1, true);
    /* long contexts: many splits per row set, several row sets */
    const struct seq_spec one_long[1] = {{19999, 1}};
    test_attention("1 seq ctx 20000 (split)", 32, 8, 128, one_long, 1, true);
    test_attention("1 seq ctx 20000 (split)", 8, 8, 64, one_long, 1, true);
    const struct seq_spec mixed[4] = {{5000, 1}, {16, 1}, {3001, 1}, {1199, 1}};
    test_attention("4 seqs ctx 5001..17 (split)", 32, 8, 128, mixed, 4, true);
    test_attention("4 seqs ctx 5001..17 (split)", 16, 2, 64, mixed, 4, true);
    test_attention("4 seqs ctx 5001..17 (split)", 8, 8, 48, mixed, 4, true);
    test_attention("4 seqs ctx 5001..17 (split)", 8, 2, 256, mixed, 4, true);
    /* batches: MHA, GQA 4, GQA 8, groups of 16 and 32 query heads */
    test_decode_random(3, 700, 32, 32, 128);
    test_decode_random(17, 600, 32, 8, 128);
    test_decode_random(67, 530, 16, 16, 128);
    test_decode_random(40, 300, 32, 4, 64);
    test_decode_random(9, 1000, 16, 1, 128);
    test_decode_random(5, 900, 32, 1, 64);
    test_decode_random(24, 200, 12, 12, 48);
    test_decode_random(13, 400, 8, 2, 256);
}

/* Sliding windows (g_window) against the CPU: windows of 1 key, of a
 * block, below, at and above the contexts; prefill chunks on existing KV
 * (the tensor-core kernel, the SIMT one at head_dim 256), decode batches
 * of contexts several windows long (split over the window only), one
 * sequence of 20000 positions whose window of 4096 is split across many
 * parts, and fixed-shape steps (the decode graphs' lists). */
static void test_window(void)
{
    const struct seq_spec pre[3] = {{0, 300}, {700, 200}, {40, 90}};
    const struct seq_spec dec[4] = {{5000, 1}, {16, 1}, {3001, 1}, {1199, 1}};
    const struct seq_spec one_long[1] = {{19999, 1}};
    static const int32_t windows[] = {1, 16, 17, 100, 1000, 1201, 4096, 30000};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        g_window = windows[i];
        test_attention("chunks on existing KV", 16, 4, 128, pre, 3, false);
        test_attention("chunks on existing KV", 8, 2, 64, pre, 3, false);
        test_attention("chunks on existing KV", 8, 4, 256, pre, 3, false);
        test_attention("4 seqs ctx 5001..17", 32, 8, 128, dec, 4, true);
        test_attention("4 seqs ctx 5001..17", 8, 8, 64, dec, 4, true);
        test_attention("4 seqs ctx 5001..17", 8, 2, 256, dec, 4, true);
        test_attention2("4 seqs ctx 5001..17 (fixed)", 32, 8, 128, dec, 4, true, true, false);
    }
    g_window = 4096;
    test_attention("1 seq ctx 20000 (split)", 32, 8, 128, one_long, 1, true);
    test_attention("1 seq ctx 20000 (split)", 8, 8, 64, one_long, 1, true);
    test_attention2("1 seq ctx 20000 (fixed)", 32, 8, 128, one_long, 1, true, true, false);
    g_window = 0;
}

static void test_attention_errors(void)
{
    struct inf_err err = {0};
    /* A block table entry past the pool is refused before any work. */
    int32_t seqs[3] = {0, 1, 0}, pos[1] = {20}, bt[2] = {0, 7};
    struct eng_buf *sg, *pg, *bg;
    DIE_IF(eng_buf_from_host(g_gpu, seqs, 12, &sg, &err), "seqs");
    DIE_IF(eng_buf_from_host(g_gpu, pos, 4, &pg, &err), "pos");
    DIE_IF(eng_buf_from_host(g_gpu, bt, 8, &bg, &err), "bt");
    struct eng_buf *act, *kc, *vc;
    DIE_IF(eng_buf_alloc(g_gpu, 4 * 64 * 2, &act, &err), "act");
    DIE_IF(eng_buf_alloc(g_gpu, 4 * 16 * 64 * 2, &kc, &err), "k");
    DIE_IF(eng_buf_alloc(g_gpu, 4 * 16 * 64 * 2, &vc, &err), "v");
    struct eng_attn_params a = {.n_heads = 1,
                                .n_kv_heads = 1,
                                .head_dim = 64,
                                .scale = 0.125f,
                                .q = {act, 0, 64},
                                .k = {act, 64, 64},
                                .v = {act, 128, 64},
                                .out = {act, 192, 64},
                                .pos = pg,
                                .seqs = sg,
                                .n_seqs = 1,
                                .block_table = bg,
                                .n_slots = 1,
                                .max_blocks = 2,
                                .k_cache = kc,
                                .v_cache = vc,
                                .n_blocks = 4};
    inf_status_t st = eng_op_attn_decode(g_gpu, &a, &err);
    expect_status("attention: block id past the pool refused", st, INF_E_INVALID, &err);
    /* head_dim 20 is not a multiple of 8: unsupported, said so. */
    a.head_dim = 20;
    a.q.ld = a.k.ld = a.v.ld = a.out.ld = 20;
    a.k.off = 20;
    a.v.off = 40;
    a.out.off = 60;
    bt[1] = 1;
    DIE_IF(eng_buf_upload(g_gpu, bg, 0, bt, 8, &err), "bt");
    st = eng_op_attn_decode(g_gpu, &a, &err);
    expect_status("attention: head_dim 20 unsupported", st, INF_E_UNSUPPORTED, &err);
    eng_buf_free(g_gpu, sg);
    eng_buf_free(g_gpu, pg);
    eng_buf_free(g_gpu, bg);
    eng_buf_free(g_gpu, act);
    eng_buf_free(g_gpu, kc);
    eng_buf_free(g_gpu, vc);
}

/* The sm_75 paths on this GPU: the INT4 GEMM's Turing kernel (and the
 * dequantized path from M = 896, as before), no fixed-point hand-over
 * between the fused linears (the Turing kernel writes fp16), the
 * tensor-core attention kernels with m16n8k8 and synchronous copies, no
 * PDL; against the CPU with the same tolerances. */
static void test_sm75(void)
{
    struct inf_err err = {0};
    eng_backend_destroy(g_gpu);
    struct eng_backend_cuda_opts go = {.device = 0, .sm75 = true};
    DIE_IF(eng_backend_cuda_create(&go, &g_gpu, &err), "cuda backend (sm75)");
    const int32_t cc = krn_cuda_kernels_cc(0);
    g_checks++;
    g_fail += cc != 75;
    printf("%-4s sm75: the device's kernels are chosen for compute capability %d\n",
           cc == 75 ? "ok" : "FAIL", (int)cc);
    struct krn_cuda_attn_config cfg;
    expect_status("sm75: an sm_80 decode configuration is refused",
                  krn_cuda_attn_config_kv(128, true, 2, false, &cfg, &err), INF_E_UNSUPPORTED,
                  &err);
    test_linear_q4(1, 768, 288, 128, false, false, 0, 0);
    test_linear_q4(37, 2816, 512, 128, false, true, 0, 0);
    test_linear_q4(300, 500, 1000, 32, true, false, 0, 0);
    test_linear_q4(16, 384, 288, 64, false, false, 24, 40);
    test_linear_q4(1300, 1024, 4096, 128, false, true, 0, 0);
    test_linear_q4_glu(1, 2752, 4096, 128, false, 0, 0);
    test_linear_q4_glu(33, 2752, 4096, 64, false, 0, 0);
    test_attn_block(1, 32, 32, 128, 4096, 128, false, false);
    test_attn_block(5, 32, 8, 128, 4096, 128, false, false);
    test_attn_block(3, 32, 8, 128, 4096, 128, true, false);
    test_mlp_block(4, 4096, 11008, 128, false);
    const struct seq_spec dec_short[5] = {{0, 1}, {15, 1}, {16, 1}, {17, 1}, {100, 1}};
    test_attention("sm75 5 seqs ctx 1..101", 8, 2, 64, dec_short, 5, true);
    test_attention("sm75 5 seqs ctx 1..101", 8, 8, 128, dec_short, 5, true);
    const struct seq_spec pre_fresh[3] = {{0, 37}, {0, 5}, {0, 64}};
    test_attention("sm75 3 fresh prompts", 8, 8, 128, pre_fresh, 3, false);
    test_attention("sm75 3 fresh prompts", 6, 6, 48, pre_fresh, 3, false);
    const struct seq_spec pre_chunk[3] = {{40, 25}, {100, 3}, {7, 70}};
    test_attention("sm75 chunks on existing KV", 16, 4, 128, pre_chunk, 3, false);
    test_attention("sm75 chunks on existing KV", 8, 2, 64, pre_chunk, 3, false);
    test_attention("sm75 chunks on existing KV", 8, 4, 256, pre_chunk, 3, false);
    const struct seq_spec dec_long[2] = {{1999, 1}, {700, 1}};
    test_attention("sm75 2 seqs ctx 2000, 701 (split)", 32, 8, 128, dec_long, 2, true);
    test_attention("sm75 2 seqs ctx 2000, 701 (split)", 8, 2, 64, dec_long, 2, true);
    const struct seq_spec four[4] = {{300, 1}, {16, 1}, {511, 1}, {64, 1}};
    test_attention2("sm75 4 seqs ctx 301..17", 32, 8, 128, four, 4, true, true, true);
    const struct seq_spec one_long[1] = {{19999, 1}};
    test_attention2("sm75 1 seq ctx 20000", 32, 8, 128, one_long, 1, true, true, false);
    test_decode_random(17, 600, 32, 8, 128);
    test_decode_random(40, 300, 32, 4, 64);
    g_window = 100;
    test_attention("sm75 window chunks on existing KV", 16, 4, 128, pre_chunk, 3, false);
    test_attention2("sm75 window 4 seqs ctx 301..17", 32, 8, 128, four, 4, true, true, false);
    g_window = 0;
    eng_backend_destroy(g_gpu);
    go.sm75 = false;
    DIE_IF(eng_backend_cuda_create(&go, &g_gpu, &err), "cuda backend");
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    const char *s = getenv("INT4SERVE_TEST_SEED");
    g_rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("seed %llu (INT4SERVE_TEST_SEED replays it)\n", (unsigned long long)g_rng);
    struct inf_err err = {0};
    struct eng_backend_cpu_opts co = {.n_threads = 0};
    DIE_IF(eng_backend_cpu_create(&co, &g_cpu, &err), "cpu backend");
    struct eng_backend_cuda_opts go = {.device = 0, .workspace_bytes = 0};
    DIE_IF(eng_backend_cuda_create(&go, &g_gpu, &err), "cuda backend");

    struct eng_backend *bad = NULL;
    struct eng_backend_cuda_opts gbad = {.device = n};
    inf_status_t st = eng_backend_cuda_create(&gbad, &bad, &err);
    expect_status("create: device ordinal out of range", st, INF_E_INVALID, &err);

    test_embedding(1000, 288, 1, true);
    test_embedding(1000, 288, 67, true);
    test_embedding(513, 512, 33, false);
    test_rmsnorm(288, 1, false, 3);
    test_rmsnorm(288, 37, true, 3);
    test_rmsnorm(4096, 130, true, 3);
    test_rmsnorm(4096, 1, true, 0);
    test_rmsnorm(4096, 16, true, 0);
    test_rmsnorm(5120, 3, false, 0);
    test_rmsnorm(8192, 7, true, 0);
    test_rmsnorm(288, 2, true, 0);
    test_rmsnorm(16384, 3, true, 0); /* four vectors a thread */
    /* in an act-order linear's column order: the vector kernel (one, two and
     * four vectors a thread, with and without the residual add) and the
     * strided one */
    g_norm_perm = true;
    test_rmsnorm(4096, 1, true, 0);
    test_rmsnorm(4096, 16, false, 0);
    test_rmsnorm(12288, 5, true, 0);
    test_rmsnorm(16384, 3, true, 0);
    test_rmsnorm(288, 37, true, 3);
    g_norm_perm = false;
    test_rope(8, 64, 1, false, 4096);
    test_rope(14, 128, 45, true, 131072);
    test_rope(6, 48, 33, false, 2048);
    test_silu(768, 1);
    test_silu(1408, 77);
    test_gather(512, 100, 1);
    test_gather(288, 512, 32);

    test_linear_q4(1, 768, 288, 128, false, false, 0, 0);
    test_linear_q4(37, 2816, 512, 128, false, true, 0, 0);
    test_linear_q4(300, 500, 1000, 32, true, false, 0, 0);
    test_linear_q4(16, 384, 288, 64, false, false, 24, 40);
    test_linear_q4(513, 1024, 4096, 128, false, false, 0, 0);
    test_linear_q4(600, 700, 520, 32, true, true, 8, 16);
    test_linear_q4(520, 300, 100, 32, false, true, 0, 0);
    test_linear_q4(1000, 4096, 4096, 128, false, true, 0, 0);
    test_linear_q4(64, 4096, 4096, 128, false, true, 0, 0);
    /* M >= 896 (the backend's DEQUANT_MIN_M; the 1000-row case above too):
     * the weight dequantized to fp16 once, then cuBLAS (with bias, strided
     * rows, an odd k) */
    test_linear_q4(1300, 700, 520, 32, true, true, 8, 16);
    test_linear_q4(1290, 300, 100, 32, false, true, 0, 0);
    test_linear_q4(1300, 1024, 4096, 128, false, true, 0, 0);
    test_linear_q4(5000, 256, 256, 0, false, true, 0, 0); /* per-channel; two GEMM chunks */
    /* the GLU op: the GEMM's GLU output (M = 1-64, 17+ on the wgmma kernel),
     * strided views, A rows not 16-byte aligned (k % 8 != 0: the unfused
     * path inside), and M >= 896 (cuBLAS, then the GLU SiLU·mul) */
    test_linear_q4_glu(1, 2752, 4096, 128, false, 0, 0);
    test_linear_q4_glu(5, 1024, 4096, 128, true, 0, 0);
    test_linear_q4_glu(33, 2752, 4096, 64, false, 0, 0);
    test_linear_q4_glu(64, 512, 288, 32, true, 8, 24);
    test_linear_q4_glu(7, 256, 100, 32, false, 0, 0);
    test_linear_q4_glu(1000, 1024, 512, 128, false, 0, 8);
    /* act-order weights (a column order): x gathered before the GEMM, at
     * M = 1 and 16, strided x, K not a multiple of the group, the
     * dequantized path (M >= 896), rows in two gather chunks (a 4096-wide
     * row of x gathers at most 3584 rows into the default workspace), the
     * GLU op and its fixed-shape step */
    g_perm = true;
    test_linear_q4(1, 768, 288, 128, false, false, 0, 0);
    test_linear_q4(16, 384, 288, 64, false, false, 24, 40);
    test_linear_q4(37, 2816, 512, 128, true, true, 0, 0);
    test_linear_q4(520, 300, 100, 32, false, true, 0, 0);
    test_linear_q4(1300, 1024, 4096, 128, false, true, 8, 16);
    test_linear_q4(5000, 256, 4096, 128, false, false, 0, 0);
    test_linear_q4_glu(1, 2752, 4096, 128, false, 0, 0);
    test_linear_q4_glu(33, 2752, 4096, 64, false, 0, 0);
    test_linear_q4_glu(7, 256, 100, 32, false, 0, 0);
    test_linear_q4_glu(1000, 1024, 512, 128, false, 0, 8);
    g_perm = false;
    /* the fused halves of a layer: inside a fixed-shape step of at most 16
     * rows the linears on weights of 256 tiles or more hand their sums over
     * as fixed-point words (q/k/v to the decode attention, o and down to
     * the RMSNorm); a q/k/v bias keeps q/k/v in fp16 (o still hands over
     * words); with more rows or tiny weights they write fp16 */
    test_attn_block(1, 32, 32, 128, 4096, 128, false, true);
    test_attn_block(5, 32, 8, 128, 4096, 128, false, true);
    test_attn_block(16, 32, 8, 128, 4096, 64, false, true);
    test_attn_block(3, 32, 8, 128, 4096, 128, true, true);
    test_attn_block(17, 32, 8, 128, 4096, 128, false, false);
    test_attn_block(2, 4, 2, 64, 288, 32, false, false); /* tiny */
    test_mlp_block(1, 4096, 11008, 128, true);
    test_mlp_block(4, 4096, 11008, 128, true);
    test_mlp_block(16, 4096, 14336, 64, true);
    test_mlp_block(17, 4096, 11008, 128, false);
    test_mlp_block(3, 288, 768, 32, false); /* tiny */
    test_linear_fp(1, 1024, 288, true, true, false);
    /* fp16 weights at one row: the weight-streaming kernel (gemv.cu):
     * outputs not a multiple of its rows a block, one and several batches
     * of chunks a thread, fp16 and fp32 out, bias; k % 8 != 0 and more rows
     * go to cuBLAS */
    test_linear_fp(1, 1001, 4096, true, true, false);
    test_linear_fp(1, 1001, 4096, true, false, true);
    test_linear_fp(1, 257, 11008, true, true, true);
    test_linear_fp(1, 4099, 11008, true, false, false);
    test_linear_fp(1, 32000, 4096, true, true, false);
    test_linear_fp(1, 300, 100, true, true, false);
    test_linear_fp(2, 1001, 4096, true, false, true);
    test_linear_fp(4, 32000, 4096, true, true, false);
    test_linear_fp(32, 2048, 512, true, true, false);
    test_linear_fp(7, 768, 288, true, false, true);
    test_linear_fp(9, 500, 300, false, false, true);
    test_linear_fp(3, 1000, 288, false, true, false);

    const struct seq_spec dec_short[5] = {{0, 1}, {15, 1}, {16, 1}, {17, 1}, {100, 1}};
    test_attention("5 seqs ctx 1..101", 8, 2, 64, dec_short, 5, true);
    test_attention("5 seqs ctx 1..101", 8, 8, 128, dec_short, 5, true);
    const struct seq_spec pre_fresh[3] = {{0, 37}, {0, 5}, {0, 64}};
    test_attention("3 fresh prompts", 8, 8, 128, pre_fresh, 3, false);
    test_attention("3 fresh prompts", 6, 6, 48, pre_fresh, 3, false);
    const struct seq_spec pre_chunk[3] = {{40, 25}, {100, 3}, {7, 70}};
    test_attention("chunks on existing KV", 16, 4, 128, pre_chunk, 3, false);
    test_attention("chunks on existing KV", 8, 2, 64, pre_chunk, 3, false);
    test_attention("chunks on existing KV", 8, 4, 256, pre_chunk, 3, false);
    const struct seq_spec dec_long1[1] = {{2999, 1}};
    test_attention("1 seq ctx 3000 (split)", 32, 4, 128, dec_long1, 1, true);
    test_attention("1 seq ctx 3000 (split)", 8, 2, 64, dec_long1, 1, true);
    const struct seq_spec dec_long2[2] = {{1999, 1}, {700, 1}};
    test_attention("2 seqs ctx 2000, 701 (split)", 32, 8, 128, dec_long2, 2, true);
    test_attention("2 seqs ctx 2000, 701 (split)", 4, 2, 256, dec_long2, 2, true);
    const struct seq_spec pre_long[1] = {{1500, 300}};
    test_attention("1 chunk of 300 on 1500", 8, 2, 64, pre_long, 1, false);
    test_decode_batches();
    test_decode_fixed();
    test_window();
    test_attention_errors();
    test_sm75();
    if (!getenv("INT4SERVE_TEST_NO_TIMING")) {
        time_attention(1, 32768, 1, true);
        time_attention(64, 2048, 1, true);
        time_attention(128, 1024, 1, true);
        time_attention(1, 2048, 2048, false);
        time_attention(4, 4096, 512, false);
    }

    eng_backend_destroy(g_gpu);
    eng_backend_destroy(g_cpu);
    printf("%s: %d of %d checks failed\n", g_fail ? "FAILED" : "PASSED", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
