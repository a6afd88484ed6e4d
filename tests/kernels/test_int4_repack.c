/* Unit tests of the INT4 GEMM repack (kernels/int4_repack.c): the repacked
 * buffer is decoded the way the GPU kernel reads it — mma.m16n8k16 B-fragment
 * positions, the LOP3 magic-number extraction, the exact fp16 subtract and
 * scale — and must give back every canonical code, scale and zero, with a
 * padding that dequantizes to exactly 0. */
#include "common/inf.h"
#include "kernels/int4_gemm.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct canon {
    struct krn_q4_weight w;
};

static uint32_t rng_state;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* A random canonical weight: codes 0..15 inside k, the zero point past k
 * (as q4.h specifies), scales in (0, 0.05], integer zeros. */
static void canon_make(struct canon *c, int32_t n, int32_t k, int32_t group, bool per_channel,
                       bool symmetric)
{
    struct krn_q4_weight *w = &c->w;
    w->n = n;
    w->k = k;
    w->group = per_channel ? k : group;
    w->kp = per_channel ? k : (k + group - 1) / group * group;
    w->symmetric = symmetric;
    int32_t ng = w->kp / w->group;
    w->q = calloc((size_t)n * (size_t)(w->kp / 2), 1);
    w->scale = malloc(sizeof(uint16_t) * (size_t)n * (size_t)ng);
    w->zero = malloc(sizeof(uint16_t) * (size_t)n * (size_t)ng);
    ck_assert_ptr_nonnull(w->q);
    for (int64_t i = 0; i < (int64_t)n * ng; i++) {
        w->scale[i] = inf_f32_to_f16((float)(1 + rnd() % 1000) * 5e-5f);
        w->zero[i] = inf_f32_to_f16(symmetric ? 8.0f : (float)(rnd() % 16));
    }
    for (int32_t r = 0; r < n; r++)
        for (int32_t j = 0; j < w->kp; j++) {
            unsigned code =
                j < k ? rnd() % 16 : (unsigned)inf_f16_to_f32(w->zero[r * ng + j / w->group]);
            uint8_t *b = &w->q[(int64_t)r * (w->kp / 2) + j / 2];
            *b = (uint8_t)((j & 1) ? ((*b & 0x0f) | (code << 4)) : ((*b & 0xf0) | code));
        }
}

static void canon_free(struct canon *c)
{
    free(c->w.q);
    free(c->w.scale);
    free(c->w.zero);
}

/* fp16((code - zero) * scale), the reference dequantization. */
static uint16_t ref_dequant(const struct krn_q4_weight *w, int32_t n, int32_t k)
{
    int32_t g = k / w->group;
    int32_t ng = w->kp / w->group;
    float s = inf_f16_to_f32(w->scale[n * ng + g]);
    float z = inf_f16_to_f32(w->zero[n * ng + g]);
    return inf_f32_to_f16(((float)krn_q4_code(w, n, k) - z) * s);
}

/* The kernel's view of one lane word: four fp16 pairs from LOP3 masks, each
 * pair (lo, hi) at nibbles (p, p + 4); returns the 8 values as the kernel
 * dequantizes them, in fragment order [frag parity][reg][element]. */
static void kernel_decode_word(uint32_t word, float s[2], float z[2], uint16_t out[2][2][2])
{
    static const uint32_t masks[2] = {0x000f000fu, 0x00f000f0u};
    for (int p = 0; p < 4; p++) {
        uint32_t src = p < 2 ? word : word >> 8;
        uint32_t h2 = (src & masks[p % 2]) | 0x64006400u;
        int fr = p / 2, reg = p % 2;
        for (int e = 0; e < 2; e++) {
            float v = inf_f16_to_f32((uint16_t)(h2 >> (16 * e)));
            /* low-nibble pairs: (1024 + q) - (1024 + z); high: (1024 + 16q)/16 - (64 + z) */
            float d = (p % 2 == 0) ? v - (1024.0f + z[fr]) : v / 16.0f - (64.0f + z[fr]);
            out[fr][reg][e] = inf_f32_to_f16(d * s[fr]);
        }
    }
}

/* Decode the whole repacked buffer into a dense fp16 matrix [n_pad][k_pad]. */
static uint16_t *decode_all(const struct krn_int4_gemm_layout *lay, const uint8_t *buf)
{
    uint16_t *dq = malloc(sizeof(uint16_t) * (size_t)lay->n_pad * (size_t)lay->k_pad);
    ck_assert_ptr_nonnull(dq);
    const uint32_t *q = (const uint32_t *)(buf + lay->q_offset);
    const uint16_t *sc = (const uint16_t *)(buf + lay->scale_offset);
    const uint16_t *zr = lay->symmetric ? NULL : (const uint16_t *)(buf + lay->zero_offset);
    int32_t ksteps = lay->k_pad / 16;
    for (int32_t t = 0; t < lay->n_pad / 64; t++)
        for (int32_t ks = 0; ks < ksteps; ks++) {
            int32_t g = ks / lay->group_steps;
            ck_assert_int_lt(g, lay->groups);
            for (int lane = 0; lane < 32; lane++) {
                int r = lane / 4, c = lane % 4;
                for (int j = 0; j < 4; j++) {
                    uint32_t word = q[(((int64_t)t * ksteps + ks) * 32 + lane) * 4 + j];
                    float s[2], z[2];
                    for (int fr = 0; fr < 2; fr++) {
                        int f = 2 * j + fr;
                        /* the lane's scale word: element r*8 + f */
                        int64_t o = ((int64_t)t * lay->groups + g) * 64 + r * 8 + f;
                        s[fr] = inf_f16_to_f32(sc[o]);
                        z[fr] = zr ? inf_f16_to_f32(zr[o]) : 8.0f;
                    }
                    uint16_t v[2][2][2];
                    kernel_decode_word(word, s, z, v);
                    for (int fr = 0; fr < 2; fr++)
                        for (int reg = 0; reg < 2; reg++)
                            for (int e = 0; e < 2; e++) {
                                /* mma.m16n8k16 B operand: col = lane/4, k = 2c + e + 8 reg */
                                int32_t n = t * 64 + (2 * j + fr) * 8 + r;
                                int32_t k = ks * 16 + 2 * c + e + 8 * reg;
                                dq[(int64_t)n * lay->k_pad + k] = v[fr][reg][e];
                            }
                }
            }
        }
    return dq;
}

static void check_round_trip(int32_t n, int32_t k, int32_t group, bool per_channel, bool sym)
{
    struct canon c;
    canon_make(&c, n, k, group, per_channel, sym);
    struct krn_int4_gemm_layout lay;
    struct inf_err err;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, &err), INF_OK);
    ck_assert_int_eq(lay.n_pad % 256, 0);
    ck_assert_int_eq(lay.k_pad % 128, 0);
    ck_assert_int_ge(lay.n_pad, n);
    ck_assert_int_lt(lay.n_pad - n, 256);
    ck_assert_int_ge(lay.k_pad, k);
    ck_assert_int_lt(lay.k_pad - k, 128);
    ck_assert_uint_eq(lay.scale_offset % 256, 0);
    ck_assert_uint_eq(lay.zero_offset % 256, 0);
    ck_assert_uint_ge(lay.scale_offset, (size_t)lay.n_pad * lay.k_pad / 2);
    ck_assert(lay.symmetric == sym);
    uint8_t *buf = malloc(lay.bytes);
    ck_assert_ptr_nonnull(buf);
    memset(buf, 0xa5, lay.bytes);
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, buf, lay.bytes, &err), INF_OK);
    uint16_t *dq = decode_all(&lay, buf);
    int64_t bad = 0;
    for (int32_t r = 0; r < lay.n_pad; r++)
        for (int32_t j = 0; j < lay.k_pad; j++) {
            uint16_t got = dq[(int64_t)r * lay.k_pad + j];
            uint16_t want = (r < n && j < k) ? ref_dequant(&c.w, r, j) : 0;
            /* padding must be exactly zero (+0 or -0) */
            if (!(r < n && j < k) && (got & 0x7fff) == 0)
                continue;
            if (got != want && bad++ < 5)
                fprintf(stderr, "n=%d k=%d group=%d sym=%d: W[%d][%d] = %04x, want %04x\n", n, k,
                        group, sym, r, j, got, want);
        }
    ck_assert_int_eq(bad, 0);
    free(dq);
    free(buf);
    canon_free(&c);
}

START_TEST(round_trip_groups)
{
    rng_state = 0x1234567u + (uint32_t)_i;
    static const int32_t groups[] = {32, 64, 128, 256};
    for (int g = 0; g < 4; g++) {
        check_round_trip(256, 512, groups[g], false, false);
        check_round_trip(256, 512, groups[g], false, true);
    }
    check_round_trip(256, 384, 0, true, false);
    check_round_trip(256, 384, 0, true, true);
}
END_TEST

START_TEST(round_trip_ragged)
{
    rng_state = 0xbeef01u;
    /* K not a multiple of the group, N and K not multiples of the tiles. */
    check_round_trip(11, 4096 % 1000 + 40, 32, false, false); /* k = 136 */
    check_round_trip(300, 100, 32, false, true);
    check_round_trip(288, 288, 256, false, false);
    check_round_trip(70, 200, 64, false, false);
    check_round_trip(5, 40, 32, false, false);  /* kernel groups beyond the canonical ones */
    check_round_trip(129, 100, 0, true, false); /* per-channel, k = 100 */
    check_round_trip(1, 16, 0, true, true);
}
END_TEST

/* The layout written out the slow way, one nibble at a time from the
 * header's description (an independent reference for the fast paths and
 * the tile ranges): every byte of the buffer, gaps zero. */
static unsigned naive_code(const struct krn_q4_weight *w, const struct krn_int4_gemm_layout *lay,
                           int32_t n, int32_t k)
{
    int32_t ng = w->kp / w->group;
    if (n >= w->n)
        return 8;
    if (k < w->k)
        return (unsigned)((w->q[(int64_t)n * (w->kp / 2) + k / 2] >> (4 * (k & 1))) & 0xf);
    int32_t g = lay->groups == 1 ? 0 : k / w->group;
    return g < ng ? (unsigned)inf_f16_to_f32(w->zero[(int64_t)n * ng + g]) : 8u;
}

static void naive_repack(const struct krn_q4_weight *w, const struct krn_int4_gemm_layout *lay,
                         uint8_t *dst)
{
    memset(dst, 0, lay->bytes);
    int32_t ng = w->kp / w->group, ksteps = lay->k_pad / 16;
    uint32_t *q = (uint32_t *)(dst + lay->q_offset);
    for (int32_t t = 0; t < lay->n_pad / 64; t++)
        for (int32_t s = 0; s < ksteps; s++)
            for (int lane = 0; lane < 32; lane++)
                for (int j = 0; j < 4; j++) {
                    uint32_t word = 0;
                    for (int nib = 0; nib < 8; nib++) {
                        int p = nib % 4, odd = nib / 4;
                        int32_t n = t * 64 + (2 * j + p / 2) * 8 + lane / 4;
                        int32_t k = s * 16 + 2 * (lane % 4) + odd + 8 * (p % 2);
                        word |= naive_code(w, lay, n, k) << (4 * nib);
                    }
                    q[((int64_t)t * ksteps + s) * 128 + lane * 4 + j] = word;
                }
    uint16_t *sc = (uint16_t *)(dst + lay->scale_offset);
    uint16_t *zr = lay->symmetric ? NULL : (uint16_t *)(dst + lay->zero_offset);
    for (int32_t t = 0; t < lay->n_pad / 64; t++)
        for (int32_t g = 0; g < lay->groups; g++)
            for (int i = 0; i < 64; i++) {
                int32_t n = t * 64 + (i % 8) * 8 + i / 8;
                int64_t o = ((int64_t)t * lay->groups + g) * 64 + i;
                bool in = n < w->n && g < ng;
                sc[o] = in ? w->scale[(int64_t)n * ng + g] : 0;
                if (zr)
                    zr[o] = in ? w->zero[(int64_t)n * ng + g] : 0x4800;
            }
}

/* krn_int4_gemm_repack into a buffer full of garbage, and the same through
 * tile ranges of random lengths in random order, both byte-equal to the
 * naive layout. */
static void check_tiles(int32_t n, int32_t k, int32_t group, bool per_channel, bool sym)
{
    struct canon c;
    canon_make(&c, n, k, group, per_channel, sym);
    struct krn_int4_gemm_layout lay;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, NULL), INF_OK);
    uint8_t *want = malloc(lay.bytes), *got = malloc(lay.bytes);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(got);
    naive_repack(&c.w, &lay, want);
    memset(got, 0xa5, lay.bytes);
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, got, lay.bytes, NULL), INF_OK);
    ck_assert_msg(memcmp(got, want, lay.bytes) == 0, "whole repack differs: n=%d k=%d g=%d", n, k,
                  group);
    /* ranges cut at random, repacked last range first */
    int32_t tiles = lay.n_pad / 64, cuts[64], nc = 0;
    for (int32_t t = 0; t < tiles; t += 1 + (int32_t)(rnd() % 5))
        cuts[nc++] = t;
    cuts[nc] = tiles;
    memset(got, 0x5a, lay.bytes);
    for (int32_t i = nc - 1; i >= 0; i--)
        ck_assert_int_eq(
            krn_int4_gemm_repack_tiles(&c.w, &lay, got, lay.bytes, cuts[i], cuts[i + 1], NULL),
            INF_OK);
    ck_assert_msg(memcmp(got, want, lay.bytes) == 0, "tile ranges differ: n=%d k=%d g=%d", n, k,
                  group);
    struct inf_err err;
    ck_assert_int_eq(krn_int4_gemm_repack_tiles(&c.w, &lay, got, lay.bytes, 1, 0, &err),
                     INF_E_INVALID);
    ck_assert_int_eq(krn_int4_gemm_repack_tiles(&c.w, &lay, got, lay.bytes, 0, tiles + 1, &err),
                     INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "outside"));
    free(want);
    free(got);
    canon_free(&c);
}

START_TEST(tiles_match_naive)
{
    rng_state = 0x5eed5u;
    check_tiles(256, 512, 128, false, false);
    check_tiles(512, 256, 32, false, true);
    check_tiles(300, 136, 32, false, false); /* ragged N and K */
    check_tiles(70, 200, 64, false, true);
    check_tiles(5, 40, 32, false, false);  /* kernel groups beyond the canonical ones */
    check_tiles(129, 100, 0, true, false); /* per-channel */
    check_tiles(1000, 384, 256, false, false);
}
END_TEST

START_TEST(plan_sizes)
{
    struct canon c;
    rng_state = 77u;
    canon_make(&c, 4096, 4096, 128, false, true);
    struct krn_int4_gemm_layout lay;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, NULL), INF_OK);
    ck_assert_int_eq(lay.n_pad, 4096);
    ck_assert_int_eq(lay.k_pad, 4096);
    ck_assert_int_eq(lay.group_steps, 8);
    ck_assert_int_eq(lay.groups, 32);
    ck_assert_uint_eq(lay.scale_offset, 4096u * 4096u / 2u);
    ck_assert_uint_eq(lay.bytes, 4096u * 4096u / 2u + 4096u * 32u * 2u); /* no zero section */
    c.w.symmetric = false;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, NULL), INF_OK);
    ck_assert_uint_eq(lay.bytes, 4096u * 4096u / 2u + 2u * 4096u * 32u * 2u);
    canon_free(&c);
}
END_TEST

START_TEST(errors)
{
    struct canon c;
    rng_state = 99u;
    canon_make(&c, 64, 256, 64, false, false);
    struct krn_int4_gemm_layout lay;
    struct inf_err err;
    ck_assert_int_eq(krn_int4_gemm_layout_make(NULL, &lay, &err), INF_E_INVALID);
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, &err), INF_OK);
    uint8_t *buf = malloc(lay.bytes);
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, buf, lay.bytes - 1, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "need"));
    /* a fractional zero point */
    uint16_t keep = c.w.zero[3];
    c.w.zero[3] = inf_f32_to_f16(3.5f);
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, buf, lay.bytes, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "zero point 3.5"));
    c.w.zero[3] = inf_f32_to_f16(16.0f);
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, buf, lay.bytes, &err), INF_E_UNSUPPORTED);
    c.w.zero[3] = keep;
    /* symmetric weights must have zero 8 */
    c.w.symmetric = true;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, &err), INF_OK);
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, buf, lay.bytes, &err), INF_E_UNSUPPORTED);
    /* layout of another weight */
    c.w.symmetric = false;
    ck_assert_int_eq(krn_int4_gemm_repack(&c.w, &lay, buf, lay.bytes, &err), INF_E_INVALID);
    /* unsupported group, inconsistent kp */
    c.w.group = 48;
    c.w.kp = 288;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "48"));
    c.w.group = 64;
    c.w.kp = 250;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&c.w, &lay, &err), INF_E_INVALID);
    c.w.kp = 256;
    free(buf);
    canon_free(&c);
}
END_TEST

/* krn_q4_glu_interleave: row r of the result is gate row 8 (r / 16) + r % 8
 * for r % 16 < 8, else up row (n / 2) + 8 (r / 16) + r % 8, codes, scales and
 * zeros alike (checked element by element through krn_q4_code, not by the
 * function's own row copies); and its refusals. */
START_TEST(glu_interleave)
{
    struct canon a, b;
    struct inf_err err;
    const int32_t n = 96, k = 200, dim = n / 2;
    canon_make(&a, n, k, 64, false, false);
    canon_make(&b, n, k, 64, false, false); /* same shape, other contents */
    ck_assert_int_eq(krn_q4_glu_interleave(&a.w, &b.w, &err), INF_OK);
    const int32_t ng = a.w.kp / a.w.group;
    for (int32_t r = 0; r < n; r++) {
        const int32_t j = 8 * (r / 16) + r % 8, from = r % 16 < 8 ? j : dim + j;
        for (int32_t c = 0; c < a.w.kp; c++)
            ck_assert_int_eq(krn_q4_code(&b.w, r, c), krn_q4_code(&a.w, from, c));
        for (int32_t g = 0; g < ng; g++) {
            ck_assert_uint_eq(b.w.scale[r * ng + g], a.w.scale[from * ng + g]);
            ck_assert_uint_eq(b.w.zero[r * ng + g], a.w.zero[from * ng + g]);
        }
    }
    struct krn_q4_weight bad = b.w;
    bad.n = 80; /* a multiple of 16, but not a's shape */
    ck_assert_int_eq(krn_q4_glu_interleave(&a.w, &bad, &err), INF_E_INVALID);
    ck_assert_int_eq(krn_q4_glu_interleave(&a.w, NULL, &err), INF_E_INVALID);
    canon_free(&a);
    canon_free(&b);
    canon_make(&a, 40, 64, 32, false, true); /* n % 16 != 0 */
    canon_make(&b, 40, 64, 32, false, true);
    ck_assert_int_eq(krn_q4_glu_interleave(&a.w, &b.w, &err), INF_E_INVALID);
    canon_free(&a);
    canon_free(&b);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("int4_repack");
    TCase *tc = tcase_create("round_trip");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, round_trip_groups);
    tcase_add_test(tc, round_trip_ragged);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("tiles");
    tcase_set_timeout(tt, 120);
    tcase_add_test(tt, tiles_match_naive);
    suite_add_tcase(s, tt);
    TCase *tl = tcase_create("layout");
    tcase_add_test(tl, plan_sizes);
    tcase_add_test(tl, errors);
    tcase_add_test(tl, glu_interleave);
    suite_add_tcase(s, tl);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
