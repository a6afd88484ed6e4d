/* The CPU backend through the public wrappers of engine/backend.h: buffers,
 * INT4 linear from the canonical form (with bias, any thread count giving
 * identical bits; a column order), fp16 linear, paged attention prefill and decode over
 * block tables against a naive loop, and the argument checks every backend
 * shares. */
#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/weights/quant.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 5;

static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static struct eng_backend *cpu(int threads)
{
    struct eng_backend_cpu_opts o = {.n_threads = threads};
    struct eng_backend *be;
    struct inf_err err;
    ck_assert_int_eq(eng_backend_cpu_create(&o, &be, &err), INF_OK);
    ck_assert_str_eq(eng_backend_name(be), "cpu");
    ck_assert_int_eq(be->act_dtype, ENG_ACT_F32);
    return be;
}

static struct eng_buf *upload(struct eng_backend *be, const void *p, size_t n)
{
    struct eng_buf *b;
    ck_assert_int_eq(eng_buf_from_host(be, p, n, &b, NULL), INF_OK);
    return b;
}

START_TEST(buffers_round_trip)
{
    struct eng_backend *be = cpu(2);
    struct eng_buf *b;
    ck_assert_int_eq(eng_buf_alloc(be, 100, &b, NULL), INF_OK);
    ck_assert_uint_eq(b->size, 100);
    char src[40], dst[40];
    for (int i = 0; i < 40; i++)
        src[i] = (char)i;
    ck_assert_int_eq(eng_buf_upload(be, b, 60, src, 40, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, b, 60, dst, 40, NULL), INF_OK);
    ck_assert_int_eq(memcmp(src, dst, 40), 0);
    struct inf_err err;
    ck_assert_int_eq(eng_buf_upload(be, b, 61, src, 40, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_buf_download(be, b, 101, dst, 0, &err), INF_E_INVALID);
    eng_buf_free(be, b);
    eng_buf_free(be, NULL);
    eng_backend_destroy(be);
    eng_backend_destroy(NULL);
}
END_TEST

/* y = x W^T + b through the backend, for 1 and 3 threads: equal bits, and
 * close to a double loop over the dequantized canonical form. */
START_TEST(linear_q4_any_threads)
{
    int n = 37, k = 288, m = 5;
    float *w = malloc(sizeof(float) * (size_t)(n * k)),
          *x = malloc(sizeof(float) * (size_t)(m * k));
    float bias[37], y1[5 * 37], y3[5 * 37];
    for (int i = 0; i < n * k; i++)
        w[i] = urand();
    for (int i = 0; i < m * k; i++)
        x[i] = urand();
    for (int i = 0; i < n; i++)
        bias[i] = urand();
    struct krn_q4_weight q;
    ck_assert_int_eq(eng_q4_quantize(w, n, k, 256, false, &q, NULL), INF_OK);
    float *deq = malloc(sizeof(float) * (size_t)(n * k));
    eng_q4_dequantize(&q, deq);
    for (int t = 0; t < 2; t++) {
        struct eng_backend *be = cpu(t ? 3 : 1);
        struct eng_q4w *qw;
        ck_assert_int_eq(eng_weight_q4_create(be, &q, &qw, NULL), INF_OK);
        ck_assert_int_eq(qw->n, n);
        ck_assert_int_eq(qw->k, k);
        struct eng_buf *bx = upload(be, x, sizeof(float) * (size_t)(m * k));
        struct eng_buf *bb = upload(be, bias, sizeof bias);
        struct eng_buf *by;
        ck_assert_int_eq(eng_buf_alloc(be, sizeof y1, &by, NULL), INF_OK);
        struct eng_mat mx = {bx, 0, k}, my = {by, 0, n};
        ck_assert_int_eq(eng_op_linear_q4(be, qw, bb, mx, my, false, m, NULL), INF_OK);
        ck_assert_int_eq(eng_buf_download(be, by, 0, t ? y3 : y1, sizeof y1, NULL), INF_OK);
        /* a view that does not fit is refused, not overrun */
        struct inf_err err;
        struct eng_mat bad = {by, 1, n};
        ck_assert_int_eq(eng_op_linear_q4(be, qw, bb, mx, bad, false, m, &err), INF_E_INVALID);
        /* a backend of no group is a group of one: the sum is y itself */
        float before[sizeof y1 / sizeof y1[0]], after[sizeof y1 / sizeof y1[0]];
        ck_assert_int_eq(eng_buf_download(be, by, 0, before, sizeof before, NULL), INF_OK);
        ck_assert_int_eq(eng_op_all_reduce(be, my, n, m, &err), INF_OK);
        ck_assert_int_eq(eng_buf_download(be, by, 0, after, sizeof after, NULL), INF_OK);
        ck_assert_int_eq(memcmp(before, after, sizeof before), 0);
        eng_weight_q4_destroy(be, qw);
        eng_buf_free(be, bx);
        eng_buf_free(be, bb);
        eng_buf_free(be, by);
        eng_backend_destroy(be);
    }
    ck_assert_int_eq(memcmp(y1, y3, sizeof y1), 0);
    for (int r = 0; r < m; r++)
        for (int o = 0; o < n; o++) {
            double s = bias[o];
            for (int c = 0; c < k; c++)
                s += (double)deq[o * k + c] * x[r * k + c];
            ck_assert_msg(fabs(y1[r * n + o] - s) < 1e-4, "%g vs %g", y1[r * n + o], s);
        }
    eng_q4_free(&q);
    free(w), free(x), free(deq);
}
END_TEST

/* A weight with a column order (an act-order checkpoint's): y[r][o] =
 * sum_i x[r][perm[i]] * W[o][i], W as stored. Against a double loop over
 * the stored form and perm, and against x . dequantize(W)^T in the
 * caller's column order; 1 and 3 threads give equal bits; m above the
 * backend's gather chunk; K not a multiple of the group (padding); a perm
 * that repeats a column is refused. */
START_TEST(linear_q4_column_order)
{
    enum { N = 24, K = 100, M = 21 };
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float y[2][M * N];
    for (int i = 0; i < N * K; i++)
        w[i] = urand();
    for (int i = 0; i < M * K; i++)
        x[i] = urand();
    struct krn_q4_weight q;
    ck_assert_int_eq(eng_q4_quantize(w, N, K, 32, false, &q, NULL), INF_OK);
    q.perm = malloc(sizeof(int32_t) * K);
    for (int i = 0; i < K; i++)
        q.perm[i] = i;
    for (int i = K - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)((urand() * 0.5f + 0.5f) * (float)(i + 1)) % (i + 1);
        int32_t t = q.perm[i];
        q.perm[i] = q.perm[j];
        q.perm[j] = t;
    }
    for (int t = 0; t < 2; t++) {
        struct eng_backend *be = cpu(t ? 3 : 1);
        struct eng_q4w *qw;
        ck_assert_int_eq(eng_weight_q4_create(be, &q, &qw, NULL), INF_OK);
        struct eng_buf *bx = upload(be, x, sizeof(float) * M * K), *by;
        ck_assert_int_eq(eng_buf_alloc(be, sizeof y[0], &by, NULL), INF_OK);
        struct eng_mat mx = {bx, 0, K}, my = {by, 0, N};
        ck_assert_int_eq(eng_op_linear_q4(be, qw, NULL, mx, my, false, M, NULL), INF_OK);
        ck_assert_int_eq(eng_buf_download(be, by, 0, y[t], sizeof y[t], NULL), INF_OK);
        if (t == 1) { /* a column twice, one never: refused */
            struct eng_q4w *bad;
            struct inf_err err;
            int32_t keep = q.perm[7];
            q.perm[7] = q.perm[8];
            ck_assert_int_eq(eng_weight_q4_create(be, &q, &bad, &err), INF_E_INVALID);
            ck_assert_ptr_nonnull(strstr(err.msg, "perm[8]"));
            q.perm[7] = keep;
        }
        eng_weight_q4_destroy(be, qw);
        eng_buf_free(be, bx);
        eng_buf_free(be, by);
        eng_backend_destroy(be);
    }
    ck_assert_int_eq(memcmp(y[0], y[1], sizeof y[0]), 0);
    float *deq = malloc(sizeof(float) * N * K);
    eng_q4_dequantize(&q, deq); /* in x's column order */
    double worst = 0;
    for (int r = 0; r < M; r++)
        for (int o = 0; o < N; o++) {
            double a = 0, b = 0;
            for (int i = 0; i < K; i++) {
                a += (double)eng_q4_dequant_at(&q, o, i) * x[r * K + q.perm[i]];
                b += (double)deq[o * K + i] * x[r * K + i];
            }
            ck_assert_msg(fabs(y[0][r * N + o] - a) < 1e-4, "%g vs %g", y[0][r * N + o], a);
            worst = fmax(worst, fabs(a - b));
        }
    ck_assert_msg(worst < 1e-9, "dequantize and perm disagree by %g", worst);
    eng_q4_free(&q);
    free(w), free(x), free(deq);
}
END_TEST

START_TEST(linear_fp16_and_embedding)
{
    struct eng_backend *be = cpu(2);
    int n = 300, k = 40, m = 3;
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n * k));
    float x[3 * 40], y[3 * 300];
    for (int i = 0; i < n * k; i++)
        w[i] = inf_f32_to_f16(urand());
    for (int i = 0; i < m * k; i++)
        x[i] = urand();
    struct eng_buf *bw = upload(be, w, sizeof(uint16_t) * (size_t)(n * k));
    struct eng_buf *bx = upload(be, x, sizeof x), *by;
    ck_assert_int_eq(eng_buf_alloc(be, sizeof y, &by, NULL), INF_OK);
    ck_assert_int_eq(eng_op_linear_fp(be, bw, ENG_W_F16, n, k, NULL, (struct eng_mat){bx, 0, k},
                                      (struct eng_mat){by, 0, n}, true, m, NULL),
                     INF_OK);
    ck_assert_int_eq(eng_buf_download(be, by, 0, y, sizeof y, NULL), INF_OK);
    for (int r = 0; r < m; r++)
        for (int o = 0; o < n; o++) {
            double s = 0;
            for (int c = 0; c < k; c++)
                s += (double)inf_f16_to_f32(w[o * k + c]) * x[r * k + c];
            ck_assert(fabs(y[r * n + o] - s) < 1e-5);
        }
    /* the same table as embeddings: row 299 of token 299, and a bad id */
    int32_t ids[2] = {299, 0};
    struct eng_buf *bi = upload(be, ids, sizeof ids);
    ck_assert_int_eq(
        eng_op_embedding(be, bw, ENG_W_F16, n, k, bi, (struct eng_mat){by, 0, k}, 2, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, by, 0, y, sizeof(float) * 40, NULL), INF_OK);
    for (int c = 0; c < k; c++)
        ck_assert(y[c] == inf_f16_to_f32(w[299 * k + c]));
    ids[1] = 300;
    ck_assert_int_eq(eng_buf_upload(be, bi, 0, ids, sizeof ids, NULL), INF_OK);
    struct inf_err err;
    ck_assert_int_eq(
        eng_op_embedding(be, bw, ENG_W_F16, n, k, bi, (struct eng_mat){by, 0, k}, 2, &err),
        INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "300"));
    eng_buf_free(be, bw), eng_buf_free(be, bx), eng_buf_free(be, by), eng_buf_free(be, bi);
    free(w);
    eng_backend_destroy(be);
}
END_TEST

/* Two sequences: slot 0 prefills 20 tokens in one call, slot 1 already holds
 * 5 positions (written by an earlier prefill) and decodes its 6th. Outputs
 * against a naive loop over the K/V rows the test keeps itself. */
START_TEST(attention_prefill_and_decode)
{
    enum { NH = 4, NKV = 2, HD = 8, NBLK = 8, MAXB = 3 };
    int qkvw = (NH + 2 * NKV) * HD;
    struct eng_backend *be = cpu(3);
    int32_t bt[2 * MAXB] = {5, 1, -1, 6, -1, -1};
    int64_t pool = (int64_t)NBLK * ENG_KV_BLOCK * NKV * HD;
    struct eng_buf *kc, *vc, *bq, *bo, *bpos, *bs, *bbt;
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)pool, &kc, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)pool, &vc, NULL), INF_OK);
    /* rows: 0..19 slot 0 prefill; 20..24 slot 1 history; 25 slot 1 decode */
    float *qkv = malloc(sizeof(float) * 26 * (size_t)qkvw);
    for (int i = 0; i < 26 * qkvw; i++)
        qkv[i] = urand();
    int32_t pos[26];
    for (int i = 0; i < 20; i++)
        pos[i] = i;
    for (int i = 0; i < 6; i++)
        pos[20 + i] = i;
    bq = upload(be, qkv, sizeof(float) * 26 * (size_t)qkvw);
    bpos = upload(be, pos, sizeof pos);
    bbt = upload(be, bt, sizeof bt);
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * 26 * NH * HD, &bo, NULL), INF_OK);
    struct eng_attn_params p = {.n_heads = NH,
                                .n_kv_heads = NKV,
                                .head_dim = HD,
                                .scale = 1.0f / sqrtf(HD),
                                .q = {bq, 0, qkvw},
                                .k = {bq, NH * HD, qkvw},
                                .v = {bq, (NH + NKV) * HD, qkvw},
                                .out = {bo, 0, NH * HD},
                                .pos = bpos,
                                .block_table = bbt,
                                .n_slots = 2,
                                .max_blocks = MAXB,
                                .k_cache = kc,
                                .v_cache = vc,
                                .n_blocks = NBLK};
    int32_t hist[3] = {20, 5, 1}, pre[3] = {0, 20, 0}, dec[3] = {25, 1, 1};
    bs = upload(be, hist, sizeof hist);
    p.seqs = bs;
    p.n_seqs = 1;
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_upload(be, bs, 0, pre, sizeof pre, NULL), INF_OK);
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_upload(be, bs, 0, dec, sizeof dec, NULL), INF_OK);
    ck_assert_int_eq(eng_op_attn_decode(be, &p, NULL), INF_OK);
    float *out = malloc(sizeof(float) * 26 * NH * HD);
    ck_assert_int_eq(eng_buf_download(be, bo, 0, out, sizeof(float) * 26 * NH * HD, NULL), INF_OK);
    for (int t = 0; t < 26; t++) {
        int first = t < 20 ? 0 : 20; /* row of position 0 of the token's sequence */
        for (int h = 0; h < NH; h++) {
            int kh = h / (NH / NKV);
            double s[20], mx = -1e300, sum = 0;
            for (int pp = 0; pp <= pos[t]; pp++) {
                double d = 0;
                for (int e = 0; e < HD; e++)
                    d += (double)qkv[t * qkvw + h * HD + e] *
                         qkv[(first + pp) * qkvw + NH * HD + kh * HD + e];
                s[pp] = d / sqrt(HD);
                mx = fmax(mx, s[pp]);
            }
            for (int pp = 0; pp <= pos[t]; pp++)
                sum += (s[pp] = exp(s[pp] - mx));
            for (int e = 0; e < HD; e++) {
                double a = 0;
                for (int pp = 0; pp <= pos[t]; pp++)
                    a += s[pp] / sum * qkv[(first + pp) * qkvw + (NH + NKV) * HD + kh * HD + e];
                ck_assert_msg(fabs(out[t * NH * HD + h * HD + e] - a) < 1e-5, "t=%d h=%d", t, h);
            }
        }
    }
    /* a slot whose table lacks the block for its position is refused */
    int32_t far[3] = {0, 20, 1};
    struct inf_err err;
    ck_assert_int_eq(eng_buf_upload(be, bs, 0, far, sizeof far, NULL), INF_OK);
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "no block"));
    p.n_kv_heads = 3;
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, &err), INF_E_INVALID);
    eng_buf_free(be, kc), eng_buf_free(be, vc), eng_buf_free(be, bq), eng_buf_free(be, bo);
    eng_buf_free(be, bpos), eng_buf_free(be, bs), eng_buf_free(be, bbt);
    free(qkv), free(out);
    eng_backend_destroy(be);
}
END_TEST

/* Attention over long contexts (several chunks of positions) gives the same
 * bits on 1, 2, 3 and 5 threads: a prefill of 200 tokens (rows shared out
 * whole), then decode steps of three sequences at contexts 201, 70 and 1
 * (chunks and heads shared out, then combined), alone and together; and
 * the decode of a sequence equals the same token's row in a prefill. */
static void attn_run(int threads, const float *qkv, float *out)
{
    enum { NH = 4, NKV = 2, HD = 16, NBLK = 40, MAXB = 14 };
    const int qkvw = (NH + 2 * NKV) * HD, ROWS = 200 + 3 + 200;
    struct eng_backend *be = cpu(threads);
    int32_t bt[3 * MAXB];
    for (int i = 0; i < 3 * MAXB; i++)
        bt[i] = (i * 7) % NBLK; /* scattered, distinct within the first 40 */
    int64_t pool = (int64_t)NBLK * ENG_KV_BLOCK * NKV * HD;
    struct eng_buf *kc, *vc, *bo;
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)pool, &kc, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)pool, &vc, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)ROWS * NH * HD, &bo, NULL), INF_OK);
    /* rows 0..199: slot 0 positions 0..199 (prefill); 200..202: decode of
     * slot 0 at 200, slot 1 at 69 (after a 69-token prefill at rows
     * 203..271), slot 2 at 0; 203..402: slot 1's and spare rows */
    int32_t pos[403];
    for (int i = 0; i < 200; i++)
        pos[i] = i;
    pos[200] = 200, pos[201] = 69, pos[202] = 0;
    for (int i = 203; i < 403; i++)
        pos[i] = i - 203;
    struct eng_buf *bq = upload(be, qkv, sizeof(float) * (size_t)ROWS * qkvw);
    struct eng_buf *bpos = upload(be, pos, sizeof pos), *bbt = upload(be, bt, sizeof bt);
    struct eng_attn_params p = {.n_heads = NH,
                                .n_kv_heads = NKV,
                                .head_dim = HD,
                                .scale = 0.25f,
                                .q = {bq, 0, qkvw},
                                .k = {bq, NH * HD, qkvw},
                                .v = {bq, (NH + NKV) * HD, qkvw},
                                .out = {bo, 0, NH * HD},
                                .pos = bpos,
                                .block_table = bbt,
                                .n_slots = 3,
                                .max_blocks = MAXB,
                                .k_cache = kc,
                                .v_cache = vc,
                                .n_blocks = NBLK};
    int32_t pre0[3] = {0, 200, 0}, pre1[3] = {203, 69, 1},
            dec[9] = {200, 1, 0, 201, 1, 1, 202, 1, 2};
    struct eng_buf *bs = upload(be, pre0, sizeof pre0), *bd = upload(be, dec, sizeof dec);
    p.seqs = bs;
    p.n_seqs = 1;
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_upload(be, bs, 0, pre1, sizeof pre1, NULL), INF_OK);
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
    p.seqs = bd;
    p.n_seqs = 3;
    ck_assert_int_eq(eng_op_attn_decode(be, &p, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, bo, 0, out, sizeof(float) * (size_t)ROWS * NH * HD, NULL),
                     INF_OK);
    /* slot 1's decode alone: the same row again */
    p.n_seqs = 1;
    int32_t one[3] = {201, 1, 1};
    ck_assert_int_eq(eng_buf_upload(be, bd, 0, one, sizeof one, NULL), INF_OK);
    float again[NH * HD];
    ck_assert_int_eq(eng_op_attn_decode(be, &p, NULL), INF_OK);
    ck_assert_int_eq(
        eng_buf_download(be, bo, sizeof(float) * 201 * NH * HD, again, sizeof again, NULL), INF_OK);
    ck_assert_int_eq(memcmp(again, out + 201 * NH * HD, sizeof again), 0);
    /* slot 1 as a prefill of 70 tokens whose last (row 272) is the decode
     * row's q, k and v: its row equals the decode's */
    int32_t pre70[3] = {203, 70, 1};
    ck_assert_int_eq(eng_buf_upload(be, bs, 0, pre70, sizeof pre70, NULL), INF_OK);
    p.seqs = bs;
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
    ck_assert_int_eq(
        eng_buf_download(be, bo, sizeof(float) * 272 * NH * HD, again, sizeof again, NULL), INF_OK);
    ck_assert_int_eq(memcmp(again, out + 201 * NH * HD, sizeof again), 0);
    eng_buf_free(be, kc), eng_buf_free(be, vc), eng_buf_free(be, bo), eng_buf_free(be, bq);
    eng_buf_free(be, bpos), eng_buf_free(be, bbt), eng_buf_free(be, bs), eng_buf_free(be, bd);
    eng_backend_destroy(be);
}

START_TEST(attention_same_bits_any_threads)
{
    enum { NH = 4, NKV = 2, HD = 16, ROWS = 403 };
    const int qkvw = (NH + 2 * NKV) * HD;
    float *qkv = malloc(sizeof(float) * ROWS * (size_t)qkvw);
    for (int i = 0; i < ROWS * qkvw; i++)
        qkv[i] = 1.5f * urand();
    memcpy(qkv + 272 * qkvw, qkv + 201 * qkvw, sizeof(float) * (size_t)qkvw);
    float *ref = malloc(sizeof(float) * ROWS * NH * HD),
          *got = malloc(sizeof(float) * ROWS * NH * HD);
    static const int threads[] = {1, 2, 3, 5};
    for (int ti = 0; ti < 4; ti++) {
        attn_run(threads[ti], qkv, ti ? got : ref);
        if (ti)
            for (int r = 0; r < 203; r++)
                ck_assert_msg(
                    memcmp(ref + r * NH * HD, got + r * NH * HD, sizeof(float) * NH * HD) == 0,
                    "%d threads: row %d differs from 1 thread", threads[ti], r);
    }
    free(qkv), free(ref), free(got);
}
END_TEST

/* Sliding-window attention against a naive masked softmax written here:
 * a query at position i sees the keys j with i - W < j <= i (Hugging Face
 * Mistral's mask). One sequence of GQA heads is prefilled in two chunks
 * (0..69, then 70..149 over the first chunk's KV) and decodes position
 * 150; before the second chunk and again before the decode, every block
 * wholly before the first key of the call's first token is poisoned with
 * NaN and dropped from the table (-1), as the scheduler frees them, so a
 * read of one shows. Windows below, at and above the context, on 1 and 3
 * threads (the decode of one row takes the path that shares chunks out);
 * at and above the context the bits are those of no window. */
enum { WNH = 6, WNKV = 2, WHD = 16, WCTX = 151, WNBLK = 12, WMAXB = 10 };

static void window_ref(const float *qkv, int qkvw, int t, int window, double *out)
{
    const int G = WNH / WNKV;
    for (int h = 0; h < WNH; h++) {
        const int kh = h / G;
        double s[WCTX], mx = -1e300, sum = 0;
        for (int j = 0; j <= t; j++) {
            s[j] = -INFINITY;
            if (window > 0 && j <= t - window)
                continue; /* masked: outside the window */
            double d = 0;
            for (int e = 0; e < WHD; e++)
                d += (double)qkv[t * qkvw + h * WHD + e] * qkv[j * qkvw + WNH * WHD + kh * WHD + e];
            s[j] = d * 0.25;
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= t; j++)
            sum += (s[j] = s[j] == -INFINITY ? 0.0 : exp(s[j] - mx));
        for (int e = 0; e < WHD; e++) {
            double a = 0;
            for (int j = 0; j <= t; j++)
                a += s[j] / sum * qkv[j * qkvw + (WNH + WNKV) * WHD + kh * WHD + e];
            out[h * WHD + e] = a;
        }
    }
}

/* Runs the three calls at window w on threads; out [WCTX][WNH * WHD]. */
static void window_run(int threads, int w, const float *qkv, float *out)
{
    const int qkvw = (WNH + 2 * WNKV) * WHD, row = WNKV * WHD;
    struct eng_backend *be = cpu(threads);
    int32_t bt[WMAXB];
    for (int b = 0; b < WMAXB; b++)
        bt[b] = WNBLK - 1 - b; /* scattered: block b of the sequence in pool block 11 - b */
    int32_t pos[WCTX];
    for (int i = 0; i < WCTX; i++)
        pos[i] = i;
    const int64_t pool = (int64_t)WNBLK * ENG_KV_BLOCK * row;
    struct eng_buf *kc, *vc, *bo;
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)pool, &kc, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)pool, &vc, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * WCTX * WNH * WHD, &bo, NULL), INF_OK);
    struct eng_buf *bq = upload(be, qkv, sizeof(float) * WCTX * (size_t)qkvw);
    struct eng_buf *bpos = upload(be, pos, sizeof pos), *bbt = upload(be, bt, sizeof bt);
    int32_t seq[3] = {0, 70, 0};
    struct eng_buf *bs = upload(be, seq, sizeof seq);
    struct eng_attn_params p = {.n_heads = WNH,
                                .n_kv_heads = WNKV,
                                .head_dim = WHD,
                                .scale = 0.25f,
                                .q = {bq, 0, qkvw},
                                .k = {bq, WNH * WHD, qkvw},
                                .v = {bq, (WNH + WNKV) * WHD, qkvw},
                                .out = {bo, 0, WNH * WHD},
                                .pos = bpos,
                                .seqs = bs,
                                .n_seqs = 1,
                                .block_table = bbt,
                                .n_slots = 1,
                                .max_blocks = WMAXB,
                                .k_cache = kc,
                                .v_cache = vc,
                                .n_blocks = WNBLK,
                                .window = w};
    ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
    float *nan = malloc(sizeof(float) * ENG_KV_BLOCK * (size_t)row);
    for (int i = 0; i < ENG_KV_BLOCK * row; i++)
        nan[i] = NAN;
    static const int first[2] = {70, 150}, count[2] = {80, 1};
    for (int call = 0; call < 2; call++) {
        /* the blocks before this call's first window: poisoned, dropped */
        for (int b = 0; b < eng_attn_first_key(w, first[call]) / ENG_KV_BLOCK; b++) {
            if (bt[b] < 0)
                continue;
            const size_t off = sizeof(float) * (size_t)bt[b] * ENG_KV_BLOCK * (size_t)row;
            ck_assert_int_eq(
                eng_buf_upload(be, kc, off, nan, sizeof(float) * ENG_KV_BLOCK * row, NULL), INF_OK);
            ck_assert_int_eq(
                eng_buf_upload(be, vc, off, nan, sizeof(float) * ENG_KV_BLOCK * row, NULL), INF_OK);
            bt[b] = -1;
        }
        ck_assert_int_eq(eng_buf_upload(be, bbt, 0, bt, sizeof bt, NULL), INF_OK);
        int32_t sq[3] = {first[call], count[call], 0};
        ck_assert_int_eq(eng_buf_upload(be, bs, 0, sq, sizeof sq, NULL), INF_OK);
        if (call == 0)
            ck_assert_int_eq(eng_op_attn_prefill(be, &p, NULL), INF_OK);
        else
            ck_assert_int_eq(eng_op_attn_decode(be, &p, NULL), INF_OK);
    }
    ck_assert_int_eq(eng_buf_download(be, bo, 0, out, sizeof(float) * WCTX * WNH * WHD, NULL),
                     INF_OK);
    /* a block inside the window missing from the table is refused */
    if (w > 0 && w < 140) {
        const int b = eng_attn_first_key(w, 150) / ENG_KV_BLOCK;
        bt[b] = -1;
        ck_assert_int_eq(eng_buf_upload(be, bbt, 0, bt, sizeof bt, NULL), INF_OK);
        struct inf_err err;
        ck_assert_int_eq(eng_op_attn_decode(be, &p, &err), INF_E_INVALID);
        ck_assert_ptr_nonnull(strstr(err.msg, "no block"));
    }
    p.window = -1;
    ck_assert_int_eq(eng_op_attn_decode(be, &p, NULL), INF_E_INVALID);
    free(nan);
    eng_buf_free(be, kc), eng_buf_free(be, vc), eng_buf_free(be, bo), eng_buf_free(be, bq);
    eng_buf_free(be, bpos), eng_buf_free(be, bbt), eng_buf_free(be, bs);
    eng_backend_destroy(be);
}

START_TEST(attention_sliding_window)
{
    const int qkvw = (WNH + 2 * WNKV) * WHD;
    float *qkv = malloc(sizeof(float) * WCTX * (size_t)qkvw);
    for (int i = 0; i < WCTX * qkvw; i++)
        qkv[i] = 2.0f * urand();
    float *full = malloc(sizeof(float) * WCTX * WNH * WHD),
          *got = malloc(sizeof(float) * WCTX * WNH * WHD);
    window_run(1, 0, qkv, full);
    static const int windows[] = {1, 2, 5, 16, 17, 63, 64, 65, 100, 150, 151, 152, 4096};
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
        const int w = windows[wi];
        for (int threads = 1; threads <= 3; threads += 2) {
            window_run(threads, w, qkv, got);
            for (int t = 0; t < WCTX; t++) {
                double ref[WNH * WHD];
                window_ref(qkv, qkvw, t, w, ref);
                for (int e = 0; e < WNH * WHD; e++)
                    ck_assert_msg(fabs(got[t * WNH * WHD + e] - ref[e]) < 1e-5,
                                  "window %d threads %d position %d: %g, want %g", w, threads, t,
                                  got[t * WNH * WHD + e], ref[e]);
            }
            /* a window covering every context is no window, bit for bit */
            if (w >= WCTX)
                ck_assert_int_eq(memcmp(got, full, sizeof(float) * WCTX * WNH * WHD), 0);
        }
    }
    free(qkv), free(full), free(got);
}
END_TEST

START_TEST(rows_ops_through_wrappers)
{
    struct eng_backend *be = cpu(2);
    int dim = 64, m = 300; /* large enough to be split over the pool */
    float *x = malloc(sizeof(float) * (size_t)(m * dim)),
          *d = malloc(sizeof(float) * (size_t)(m * dim));
    float w[64];
    for (int i = 0; i < m * dim; i++) {
        x[i] = urand();
        d[i] = urand();
    }
    for (int i = 0; i < dim; i++)
        w[i] = 1.0f + 0.1f * urand();
    struct eng_buf *bx = upload(be, x, sizeof(float) * (size_t)(m * dim));
    struct eng_buf *bd = upload(be, d, sizeof(float) * (size_t)(m * dim));
    struct eng_buf *bw = upload(be, w, sizeof w), *bo;
    ck_assert_int_eq(eng_buf_alloc(be, sizeof(float) * (size_t)(m * dim), &bo, NULL), INF_OK);
    struct eng_mat mx = {bx, 0, dim}, md = {bd, 0, dim}, mo = {bo, 0, dim};
    ck_assert_int_eq(eng_op_rmsnorm_add(be, mx, &md, bw, NULL, 1e-6f, mo, dim, m, NULL), INF_OK);
    float *o = malloc(sizeof(float) * (size_t)(m * dim));
    ck_assert_int_eq(eng_buf_download(be, bo, 0, o, sizeof(float) * (size_t)(m * dim), NULL),
                     INF_OK);
    for (int r = 0; r < m; r += 37) {
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += ((double)x[r * dim + i] + d[r * dim + i]) *
                  ((double)x[r * dim + i] + d[r * dim + i]);
        for (int i = 0; i < dim; i++) {
            double want = ((double)x[r * dim + i] + d[r * dim + i]) / sqrt(ss / dim + 1e-6) * w[i];
            ck_assert(fabs(o[r * dim + i] - want) < 1e-5);
        }
    }
    ck_assert_int_eq(eng_op_silu_mul(be, mx, md, mo, dim, m, NULL), INF_OK);
    int32_t idx[2] = {299, 3};
    struct eng_buf *bi = upload(be, idx, sizeof idx);
    ck_assert_int_eq(eng_op_rows_gather(be, mo, bi, mx, dim, 2, NULL), INF_OK);
    float g[64];
    ck_assert_int_eq(eng_buf_download(be, bx, 0, g, sizeof g, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, bo, sizeof(float) * 299 * 64, o, sizeof g, NULL), INF_OK);
    ck_assert_int_eq(memcmp(g, o, sizeof g), 0);
    idx[0] = 300;
    ck_assert_int_eq(eng_buf_upload(be, bi, 0, idx, sizeof idx, NULL), INF_OK);
    ck_assert_int_eq(eng_op_rows_gather(be, mo, bi, mx, dim, 2, NULL), INF_E_INVALID);
    struct eng_rope_params rp = {.theta = 10000.0f};
    ck_assert_int_eq(eng_op_rope(be, mx, 2, 33, bi, &rp, 2, NULL),
                     INF_E_INVALID); /* odd head_dim */
    eng_buf_free(be, bx), eng_buf_free(be, bd), eng_buf_free(be, bw), eng_buf_free(be, bo);
    eng_buf_free(be, bi);
    free(x), free(d), free(o);
    eng_backend_destroy(be);
}
END_TEST

/* ---- the fused layer halves and upload batches ------------------------------- */
static struct eng_buf *frand_buf(struct eng_backend *be, int64_t n, float scale)
{
    float *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * urand();
    struct eng_buf *b = upload(be, v, (size_t)n * 4);
    free(v);
    return b;
}

static struct eng_linear fp_linear(struct eng_backend *be, int32_t n, int32_t k)
{
    return (struct eng_linear){
        .n = n, .k = k, .w = frand_buf(be, (int64_t)n * k, 0.3f), .wdt = ENG_W_F32};
}

static int g_mlp_calls;
static inf_status_t counting_mlp(struct eng_backend *be, const struct eng_mlp_block *p,
                                 struct inf_err *err)
{
    g_mlp_calls++;
    return eng_mlp_block_compose(be, p, err);
}

/* eng_op_mlp_block is its definition (gate/up, SiLU*mul, down, residual
 * add, norm) bit for bit, through a backend's slot where it has one, and
 * refuses linears that do not fit; eng_buf_upload_many copies in order and
 * refuses a copy out of its buffer. */
START_TEST(blocks_and_uploads)
{
    struct eng_backend *be = cpu(2);
    const int32_t m = 3, H = 24, I = 40;
    struct eng_linear gu = fp_linear(be, 2 * I, H), down = fp_linear(be, H, I);
    struct eng_buf *x0 = frand_buf(be, (int64_t)m * H, 1.0f),
                   *xn0 = frand_buf(be, (int64_t)m * H, 1.0f);
    struct eng_buf *norm = frand_buf(be, H, 1.0f);
    float xa[3 * 24], xna[3 * 24], xb[3 * 24], xnb[3 * 24];
    struct eng_buf *x, *xn, *g, *h, *d;
    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * H * 4, &x, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * H * 4, &xn, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * 2 * I * 4, &g, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * I * 4, &h, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * H * 4, &d, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, x0, 0, xa, sizeof xa, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, xn0, 0, xna, sizeof xna, NULL), INF_OK);
    /* by hand */
    ck_assert_int_eq(eng_buf_upload(be, x, 0, xa, sizeof xa, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_upload(be, xn, 0, xna, sizeof xna, NULL), INF_OK);
    struct eng_mat mx = {x, 0, H}, mxn = {xn, 0, H}, mg = {g, 0, 2 * I}, mu = {g, I, 2 * I},
                   mh = {h, 0, I}, md = {d, 0, H};
    ck_assert_int_eq(eng_op_linear(be, &gu, mxn, mg, false, m, NULL), INF_OK);
    ck_assert_int_eq(eng_op_silu_mul(be, mg, mu, mh, I, m, NULL), INF_OK);
    ck_assert_int_eq(eng_op_linear(be, &down, mh, md, false, m, NULL), INF_OK);
    ck_assert_int_eq(eng_op_rmsnorm_add(be, mx, &md, norm, NULL, 1e-5f, mxn, H, m, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, x, 0, xb, sizeof xb, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, xn, 0, xnb, sizeof xnb, NULL), INF_OK);
    /* as a block, through a slot that counts its calls, from a batch of uploads */
    struct eng_backend_iface iface = *be->iface;
    iface.mlp_block = counting_mlp;
    const struct eng_backend_iface *plain = be->iface;
    be->iface = &iface;
    const struct eng_upload ups[2] = {{x, 0, xa, sizeof xa}, {xn, 0, xna, sizeof xna}};
    ck_assert_int_eq(eng_buf_upload_many(be, ups, 2, NULL), INF_OK);
    struct eng_mlp_block b = {.m = m,
                              .dim = H,
                              .inter = I,
                              .x = mx,
                              .xn = mxn,
                              .gu = {&gu},
                              .n_gu = 1,
                              .gu_out = mg,
                              .h = mh,
                              .down = &down,
                              .d = md,
                              .norm = norm,
                              .eps = 1e-5f};
    ck_assert_int_eq(eng_op_mlp_block(be, &b, NULL), INF_OK);
    ck_assert_int_eq(g_mlp_calls, 1);
    float xc[3 * 24], xnc[3 * 24];
    ck_assert_int_eq(eng_buf_download(be, x, 0, xc, sizeof xc, NULL), INF_OK);
    ck_assert_int_eq(eng_buf_download(be, xn, 0, xnc, sizeof xnc, NULL), INF_OK);
    ck_assert_int_eq(memcmp(xb, xc, sizeof xb), 0);
    ck_assert_int_eq(memcmp(xnb, xnc, sizeof xnb), 0);
    /* a down projection of the wrong width is refused before any work */
    struct inf_err err;
    struct eng_linear bad = down;
    bad.k = I - 8;
    b.down = &bad;
    ck_assert_int_eq(eng_op_mlp_block(be, &b, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "mlp_block"));
    ck_assert_int_eq(g_mlp_calls, 1);
    be->iface = plain;
    /* an attention half whose k does not follow q in the rows is refused */
    const struct eng_rope_params rope = {.theta = 10000.0f};
    struct eng_attn_block ab = {.m = m,
                                .dim = H,
                                .x = mx,
                                .xn = mxn,
                                .qkv = {&gu},
                                .n_qkv = 1,
                                .rope = &rope,
                                .o = &down,
                                .d = md,
                                .norm = norm,
                                .eps = 1e-5f,
                                .attn = {.n_heads = 2,
                                         .n_kv_heads = 1,
                                         .head_dim = 8,
                                         .q = {g, 0, 32},
                                         .k = {g, 20, 32},
                                         .v = {g, 24, 32}}};
    ck_assert_int_eq(eng_op_attn_block(be, &ab, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "k must follow q"));
    /* a copy past its buffer: nothing is copied */
    const struct eng_upload over[2] = {{x, 0, xna, sizeof xna}, {h, 8, xa, (size_t)m * I * 4}};
    ck_assert_int_eq(eng_buf_upload_many(be, over, 2, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_buf_download(be, x, 0, xc, sizeof xc, NULL), INF_OK);
    ck_assert_int_eq(memcmp(xb, xc, sizeof xb), 0);
    struct eng_buf *bufs[] = {gu.w, down.w, x0, xn0, norm, x, xn, g, h, d};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        eng_buf_free(be, bufs[i]);
    eng_backend_destroy(be);
}
END_TEST

/* The CPU backend's own mlp_block slot (gate/up and SiLU*mul as one job,
 * column ranges shared out per thread) gives the composition of the plain
 * ops bit for bit: INT4 and fp32 gate/up, 1 to 3 threads, intermediate
 * sizes that split unevenly (40: 16 + 16 + 8 columns), one row and several;
 * the fused output h is the plain ops' too. */
START_TEST(mlp_block_slot_equals_composition)
{
    static const int32_t threads[] = {1, 2, 3}, inters[] = {40, 72}, ms[] = {1, 3};
    const int32_t H = 24;
    for (int ti = 0; ti < 3; ti++)
        for (int ii = 0; ii < 2; ii++)
            for (int q4 = 0; q4 < 2; q4++) {
                struct eng_backend *be = cpu(threads[ti]);
                const int32_t I = inters[ii];
                struct eng_linear gu = fp_linear(be, 2 * I, H), down = fp_linear(be, H, I);
                if (q4) {
                    float *w = malloc(sizeof(float) * 2 * I * H);
                    for (int i = 0; i < 2 * I * H; i++)
                        w[i] = 0.3f * urand();
                    struct krn_q4_weight q;
                    ck_assert_int_eq(eng_q4_quantize(w, 2 * I, H, 32, false, &q, NULL), INF_OK);
                    eng_buf_free(be, gu.w);
                    gu.w = NULL;
                    ck_assert_int_eq(eng_weight_q4_create(be, &q, &gu.q4, NULL), INF_OK);
                    eng_q4_free(&q);
                    free(w);
                }
                for (int mi = 0; mi < 2; mi++) {
                    const int32_t m = ms[mi];
                    struct eng_buf *x0 = frand_buf(be, (int64_t)m * H, 1.0f),
                                   *xn0 = frand_buf(be, (int64_t)m * H, 1.0f),
                                   *norm = frand_buf(be, H, 1.0f);
                    float want[2][3 * 24], got[2][3 * 24], hw[3 * 72], hg[3 * 72];
                    struct eng_buf *x, *xn, *g, *h, *d;
                    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * H * 4, &x, NULL), INF_OK);
                    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * H * 4, &xn, NULL), INF_OK);
                    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * 2 * I * 4, &g, NULL), INF_OK);
                    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * I * 4, &h, NULL), INF_OK);
                    ck_assert_int_eq(eng_buf_alloc(be, (size_t)m * H * 4, &d, NULL), INF_OK);
                    struct eng_mat mx = {x, 0, H}, mxn = {xn, 0, H}, mg = {g, 0, 2 * I},
                                   mh = {h, 0, I}, md = {d, 0, H};
                    struct eng_mlp_block b = {.m = m,
                                              .dim = H,
                                              .inter = I,
                                              .x = mx,
                                              .xn = mxn,
                                              .gu = {&gu},
                                              .n_gu = 1,
                                              .gu_out = mg,
                                              .h = mh,
                                              .down = &down,
                                              .d = md,
                                              .norm = norm,
                                              .eps = 1e-5f};
                    for (int pass = 0; pass < 2; pass++) {
                        float xa[3 * 24];
                        ck_assert_int_eq(eng_buf_download(be, x0, 0, xa, (size_t)m * H * 4, NULL),
                                         INF_OK);
                        ck_assert_int_eq(eng_buf_upload(be, x, 0, xa, (size_t)m * H * 4, NULL),
                                         INF_OK);
                        ck_assert_int_eq(eng_buf_download(be, xn0, 0, xa, (size_t)m * H * 4, NULL),
                                         INF_OK);
                        ck_assert_int_eq(eng_buf_upload(be, xn, 0, xa, (size_t)m * H * 4, NULL),
                                         INF_OK);
                        /* scratch poisoned (NaN), so nothing carries over between passes */
                        float poison[3 * 2 * 72];
                        memset(poison, 0xff, sizeof poison);
                        ck_assert_int_eq(
                            eng_buf_upload(be, g, 0, poison, (size_t)m * 2 * I * 4, NULL), INF_OK);
                        ck_assert_int_eq(eng_buf_upload(be, h, 0, poison, (size_t)m * I * 4, NULL),
                                         INF_OK);
                        if (pass == 0)
                            ck_assert_int_eq(eng_mlp_block_compose(be, &b, NULL), INF_OK);
                        else
                            ck_assert_int_eq(eng_op_mlp_block(be, &b, NULL), INF_OK);
                        float(*o)[3 * 24] = pass ? got : want;
                        ck_assert_int_eq(eng_buf_download(be, x, 0, o[0], (size_t)m * H * 4, NULL),
                                         INF_OK);
                        ck_assert_int_eq(eng_buf_download(be, xn, 0, o[1], (size_t)m * H * 4, NULL),
                                         INF_OK);
                        ck_assert_int_eq(
                            eng_buf_download(be, h, 0, pass ? hg : hw, (size_t)m * I * 4, NULL),
                            INF_OK);
                    }
                    ck_assert_msg(memcmp(want[0], got[0], (size_t)m * H * 4) == 0 &&
                                      memcmp(want[1], got[1], (size_t)m * H * 4) == 0,
                                  "threads %d I %d q4 %d m %d: x / xn differ", threads[ti], I, q4,
                                  m);
                    ck_assert_msg(memcmp(hw, hg, (size_t)m * I * 4) == 0,
                                  "threads %d I %d q4 %d m %d: h differs", threads[ti], I, q4, m);
                    struct eng_buf *bufs[] = {x0, xn0, norm, x, xn, g, h, d};
                    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
                        eng_buf_free(be, bufs[i]);
                }
                eng_weight_q4_destroy(be, gu.q4);
                eng_buf_free(be, gu.w);
                eng_buf_free(be, down.w);
                eng_backend_destroy(be);
            }
}
END_TEST

START_TEST(thread_count_checked)
{
    struct eng_backend_cpu_opts o = {.n_threads = -1};
    struct eng_backend *be;
    struct inf_err err;
    ck_assert_int_eq(eng_backend_cpu_create(&o, &be, &err), INF_E_INVALID);
    ck_assert_ptr_null(be);
    ck_assert_int_eq(eng_backend_cpu_create(NULL, &be, &err), INF_OK);
    ck_assert_int_ge(eng_backend_cpu_threads(be), 1);
    eng_backend_destroy(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_cpu");
    TCase *t = tcase_create("ops");
    tcase_add_test(t, buffers_round_trip);
    tcase_add_test(t, linear_q4_any_threads);
    tcase_add_test(t, linear_q4_column_order);
    tcase_add_test(t, linear_fp16_and_embedding);
    tcase_add_test(t, attention_prefill_and_decode);
    tcase_add_test(t, attention_same_bits_any_threads);
    tcase_add_test(t, attention_sliding_window);
    tcase_add_test(t, rows_ops_through_wrappers);
    tcase_add_test(t, blocks_and_uploads);
    tcase_add_test(t, mlp_block_slot_equals_composition);
    tcase_add_test(t, thread_count_checked);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
