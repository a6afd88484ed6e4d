/* Unit tests of the INT4 GEMM's dispatch policy (kernels/int4_gemm_policy.h)
 * on the CPU, on two devices described by hand: an H200 (sm_90, 132 SMs,
 * the sm_90a kernels built) and an A100 (sm_80, 108 SMs).
 *
 * The expected tables are the choices the launcher made before the policy
 * had its own file (kernels/cuda/int4_gemm.cu's auto_config,
 * sm90_auto_choice, stream_choice and launch_grid, with the occupancy its
 * queries returned), worked out by hand for the benchmark's shapes
 * (bench/gemm: group 128, asymmetric, A 16-byte aligned, no bias) at every
 * M the benchmark and the engine use; the plan must give exactly those. */
#include "kernels/int4_gemm_policy.h"

#include <check.h>
#include <stdint.h>
#include <string.h>

/* ---- the two devices ------------------------------------------------------ */

/* Residency of the stream variants from the registers ptxas gives the build
 * (sm_80 and sm_90 alike): groups of 128 k, register-capped, 16 warps at 88
 * to 95 registers (one block of 512 threads), 8 and 4 warps at 80 (three
 * and six blocks); groups of 64 and 32 are not capped (94 to 160). Index:
 * [variant][groups a warp spans: 1, 2, 4][zero points][output]. */
static void stream_residency(struct krn_cuda_device *d)
{
    static const uint8_t per[3][3][2] = {
        {{1, 1}, {1, 1}, {1, 1}}, /* w16 */
        {{3, 3}, {2, 2}, {1, 1}}, /* w8 */
        {{6, 6}, {5, 4}, {3, 3}}, /* w4 */
    };
    for (int v = 0; v < 3; v++)
        for (int g = 0; g < 3; g++)
            for (int z = 0; z < 2; z++)
                for (int o = 0; o < 3; o++)
                    d->int4_gemm.stream[v][g][z][o] = per[v][g][z];
}

/* H200: 228 KiB of shared memory an SM (227 a block), 1 KiB reserved a
 * block. The mma.sync configurations' residency is their shared memory's
 * (their launch bounds leave registers for BPS blocks): 64, 88, 136, 108,
 * 112, 144, 80, 104, 126, 112, 96 and 56 KiB. The wgmma ones: 73, 85, 109,
 * 105 and 211 KiB. */
static struct krn_cuda_device h200(void)
{
    struct krn_cuda_device d;
    memset(&d, 0, sizeof d);
    d.cc = 90;
    d.sms = 132;
    d.smem_per_block = 232448;
    d.smem_per_sm = 233472;
    d.l2_bytes = 60 << 20;
    d.sm90a = true;
    static const uint8_t sm80[KRN_INT4_GEMM_SM80_COUNT] = {3, 2, 1, 2, 2, 1, 2, 2, 1, 2, 2, 3};
    memcpy(d.int4_gemm.sm80, sm80, sizeof sm80);
    static const uint8_t sm90[KRN_INT4_GEMM_SM90_COUNT] = {3, 2, 2, 2, 1};
    for (int c = 0; c < KRN_INT4_GEMM_SM90_COUNT; c++)
        for (int g = 0; g < 3; g++)
            d.int4_gemm.sm90[c][g] = sm90[c];
    stream_residency(&d);
    return d;
}

/* A100: 164 KiB an SM (163 a block); no sm_90a kernels. */
static struct krn_cuda_device a100(void)
{
    struct krn_cuda_device d;
    memset(&d, 0, sizeof d);
    d.cc = 80;
    d.sms = 108;
    d.smem_per_block = 166912;
    d.smem_per_sm = 167936;
    d.l2_bytes = 40 << 20;
    static const uint8_t sm80[KRN_INT4_GEMM_SM80_COUNT] = {2, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2};
    memcpy(d.int4_gemm.sm80, sm80, sizeof sm80);
    stream_residency(&d);
    return d;
}

/* ---- helpers ----------------------------------------------------------------- */

static struct krn_int4_gemm_layout layout(int32_t n, int32_t k, int32_t group, bool sym)
{
    struct krn_q4_weight w;
    memset(&w, 0, sizeof w);
    w.n = n;
    w.k = k;
    w.group = group;
    w.kp = (k + group - 1) / group * group;
    w.symmetric = sym;
    struct krn_int4_gemm_layout lay;
    ck_assert_int_eq(krn_int4_gemm_layout_make(&w, &lay, NULL), INF_OK);
    return lay;
}

static struct krn_int4_gemm_plan plan_of(const struct krn_cuda_device *d, int32_t n, int32_t k,
                                         int32_t group, bool sym)
{
    const struct krn_int4_gemm_layout lay = layout(n, k, group, sym);
    struct krn_int4_gemm_plan p;
    struct inf_err err;
    ck_assert_msg(krn_int4_gemm_plan_make(d, &lay, &p, &err) == INF_OK, "%s", err.msg);
    return p;
}

/* A launch of m rows with flags (A 16-byte aligned, no bias, the workspace
 * the plan asks for at 4096 rows). */
static struct krn_int4_gemm_call call_of(const struct krn_int4_gemm_plan *p, int32_t m,
                                         uint32_t flags, int32_t config)
{
    struct krn_int4_gemm_call c = {.m = m,
                                   .flags = flags,
                                   .config = config,
                                   .bias = false,
                                   .a_rows16 = true,
                                   .a4 = true,
                                   .workspace_bytes = krn_int4_gemm_workspace_size(p, 4096)};
    return c;
}

static struct krn_int4_gemm_choice choose(const struct krn_int4_gemm_plan *p,
                                          const struct krn_int4_gemm_call *c)
{
    struct krn_int4_gemm_choice ch;
    struct inf_err err;
    ck_assert_msg(krn_int4_gemm_choose(p, c, &ch, &err) == INF_OK, "%s", err.msg);
    ck_assert_uint_le(ch.workspace_need, c->workspace_bytes);
    return ch;
}

static struct krn_int4_gemm_choice pick(const struct krn_int4_gemm_plan *p, int32_t m,
                                        uint32_t flags, int32_t config)
{
    const struct krn_int4_gemm_call c = call_of(p, m, flags, config);
    return choose(p, &c);
}

/* ---- the benchmark's shapes ------------------------------------------------- */

struct shape {
    const char *name;
    int32_t k, n;
};

static const struct shape kShapes[] = {
    {"l2-qkv", 4096, 12288},  {"l2-o", 4096, 4096},   {"l2-gateup", 4096, 22016},
    {"l2-down", 11008, 4096}, {"l3-qkv", 4096, 6144}, {"l3-gateup", 4096, 28672},
    {"l3-down", 14336, 4096},
};
#define N_SHAPES 7

static const int32_t kMs[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
#define N_MS 11

struct expect {
    int cfg;
    bool swapped;
    int32_t grid;
};

#define S16 KRN_INT4_GEMM_CFG_STREAM_W16_K2048_B1
#define S8 KRN_INT4_GEMM_CFG_STREAM_W8_K1024_B3
#define M16N128 KRN_INT4_GEMM_CFG_SM80_M16_N128_K128_W4_S4
#define M16N256 KRN_INT4_GEMM_CFG_SM80_M16_N256_K128_W8_S4
#define M32N128 KRN_INT4_GEMM_CFG_SM80_M32_N128_K128_W4_S4
#define M64N128 KRN_INT4_GEMM_CFG_SM80_M64_N128_K128_W4_S4
#define T32 KRN_INT4_GEMM_CFG_SM90_T32_N128_K128
#define T64 KRN_INT4_GEMM_CFG_SM90_T64_N128_K128
#define T128 KRN_INT4_GEMM_CFG_SM90_T128_N128_K128

/* H200. M <= 4: the stream kernel where one wave of a variant holds the
 * weight (o: 64 chunks x 2 k blocks of 2048 = 128 <= 132 x 1; Llama-3 q/k/v:
 * 96 x 4 of 1024 = 384 <= 132 x 3), else the 16-row mma.sync tile, 256
 * columns from n_pad 8192 up to M = 8 and from 16384 up to 16, swapped up to
 * 8 rows. Above 16 rows the wgmma token tile: 32, 64, 128 (one step smaller
 * for o, under 1536 tiles). Grids: 264 slots (132 x 2) or 132 (t128), whole
 * split-K shares per tile where they keep 7/8 of them. */
static const struct expect kH200[N_SHAPES][N_MS] = {
    /* l2-qkv */
    {{M16N256, 1, 240},
     {M16N256, 1, 240},
     {M16N256, 1, 240},
     {M16N256, 1, 240},
     {M16N128, 0, 264},
     {T32, 0, 264},
     {T64, 0, 264},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132}},
    /* l2-o */
    {{S16, 0, 128},
     {S16, 0, 128},
     {S16, 0, 128},
     {M16N128, 1, 256},
     {M16N128, 0, 256},
     {T32, 0, 256},
     {T32, 0, 256},
     {T64, 0, 256},
     {T128, 0, 128},
     {T128, 0, 128},
     {T128, 0, 132}},
    /* l2-gateup */
    {{M16N256, 1, 258},
     {M16N256, 1, 258},
     {M16N256, 1, 258},
     {M16N256, 1, 258},
     {M16N256, 0, 258},
     {T32, 0, 264},
     {T64, 0, 264},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132}},
    /* l2-down */
    {{M16N128, 1, 256},
     {M16N128, 1, 256},
     {M16N128, 1, 256},
     {M16N128, 1, 256},
     {M16N128, 0, 256},
     {T32, 0, 256},
     {T64, 0, 256},
     {T128, 0, 128},
     {T128, 0, 128},
     {T128, 0, 128},
     {T128, 0, 132}},
    /* l3-qkv */
    {{S8, 0, 384},
     {S8, 0, 384},
     {S8, 0, 384},
     {M16N128, 1, 240},
     {M16N128, 0, 240},
     {T32, 0, 240},
     {T64, 0, 240},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132}},
    /* l3-gateup */
    {{M16N256, 1, 264},
     {M16N256, 1, 264},
     {M16N256, 1, 264},
     {M16N256, 1, 264},
     {M16N256, 0, 264},
     {T32, 0, 264},
     {T64, 0, 264},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132},
     {T128, 0, 132}},
    /* l3-down */
    {{M16N128, 1, 256},
     {M16N128, 1, 256},
     {M16N128, 1, 256},
     {M16N128, 1, 256},
     {M16N128, 0, 256},
     {T32, 0, 256},
     {T64, 0, 256},
     {T128, 0, 128},
     {T128, 0, 128},
     {T128, 0, 128},
     {T128, 0, 132}},
};

/* A100. M <= 4: the stream kernel for o only (64 x 4 = 256 blocks of 8 warps
 * <= 108 x 3; 16 warps would take 128 > 108; Llama-3 q/k/v's 384 > 324 and
 * 768 > 648); the same mma.sync table as the H200's up to 16 rows, then the
 * 32-row tile up to 32 and the 64-row tile beyond. Slots: 216 for the
 * 16 x 128 tile, 108 for the others (their shared memory holds one block). */
static const struct expect kA100[N_SHAPES][N_MS] = {
    /* l2-qkv */
    {{M16N256, 1, 96},
     {M16N256, 1, 96},
     {M16N256, 1, 96},
     {M16N256, 1, 96},
     {M16N128, 0, 192},
     {M32N128, 0, 96},
     {M64N128, 0, 96},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
    /* l2-o */
    {{S8, 0, 256},
     {S8, 0, 256},
     {S8, 0, 256},
     {M16N128, 1, 192},
     {M16N128, 0, 192},
     {M32N128, 0, 96},
     {M64N128, 0, 96},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
    /* l2-gateup */
    {{M16N256, 1, 108},
     {M16N256, 1, 108},
     {M16N256, 1, 108},
     {M16N256, 1, 108},
     {M16N256, 0, 108},
     {M32N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
    /* l2-down */
    {{M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 0, 192},
     {M32N128, 0, 96},
     {M64N128, 0, 96},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
    /* l3-qkv */
    {{M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 0, 192},
     {M32N128, 0, 96},
     {M64N128, 0, 96},
     {M64N128, 0, 96},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
    /* l3-gateup */
    {{M16N256, 1, 108},
     {M16N256, 1, 108},
     {M16N256, 1, 108},
     {M16N256, 1, 108},
     {M16N256, 0, 108},
     {M32N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
    /* l3-down */
    {{M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 1, 192},
     {M16N128, 0, 192},
     {M32N128, 0, 96},
     {M64N128, 0, 96},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108},
     {M64N128, 0, 108}},
};

/* Every shape and M: the plain launch (C), the engine's fixed-point form
 * (ACC64: the words are taken exactly up to 16 rows, by the stream and the
 * 16-row mma.sync kernels, never by wgmma or the taller tiles) and the GLU
 * output (the same configuration and grid). */
static void check_table(const struct krn_cuda_device *d, const struct expect (*want)[N_MS],
                        const char *dev)
{
    for (int s = 0; s < N_SHAPES; s++) {
        const struct krn_int4_gemm_plan p = plan_of(d, kShapes[s].n, kShapes[s].k, 128, false);
        for (int i = 0; i < N_MS; i++) {
            const int32_t m = kMs[i];
            const struct expect *e = &want[s][i];
            const struct krn_int4_gemm_choice c = pick(&p, m, 0, KRN_INT4_GEMM_CFG_AUTO);
            ck_assert_msg(c.config == e->cfg && c.swapped == e->swapped && c.grid == e->grid &&
                              !c.words && c.out == KRN_INT4_GEMM_OUT_C,
                          "%s %s M=%d: got %s%s grid %d, want %s%s grid %d", dev, kShapes[s].name,
                          m, krn_int4_gemm_config_name(c.config), c.swapped ? " swapped" : "",
                          c.grid, krn_int4_gemm_config_name(e->cfg), e->swapped ? " swapped" : "",
                          e->grid);
            const struct krn_int4_gemm_choice a = pick(&p, m, KRN_INT4_GEMM_ACC64, -1);
            ck_assert_msg(a.config == e->cfg && a.swapped == e->swapped && a.grid == e->grid &&
                              a.words == (m <= 16),
                          "%s %s M=%d ACC64: got %s words %d", dev, kShapes[s].name, m,
                          krn_int4_gemm_config_name(a.config), a.words);
            const struct krn_int4_gemm_choice g = pick(&p, m, KRN_INT4_GEMM_GLU, -1);
            ck_assert_msg(g.config == e->cfg && g.grid == e->grid && g.out == KRN_INT4_GEMM_OUT_GLU,
                          "%s %s M=%d GLU: got %s", dev, kShapes[s].name, m,
                          krn_int4_gemm_config_name(g.config));
            const struct krn_int4_gemm_choice ga =
                pick(&p, m, KRN_INT4_GEMM_GLU | KRN_INT4_GEMM_ACC64, -1);
            ck_assert_int_eq(ga.config, e->cfg);
            ck_assert_int_eq(ga.words, m <= 16);
            /* symmetric weights choose the same */
            const struct krn_int4_gemm_plan q = plan_of(d, kShapes[s].n, kShapes[s].k, 128, true);
            const struct krn_int4_gemm_choice y = pick(&q, m, 0, -1);
            ck_assert_int_eq(y.config, e->cfg);
            ck_assert_int_eq(y.grid, e->grid);
        }
    }
}

START_TEST(test_h200_table)
{
    const struct krn_cuda_device d = h200();
    check_table(&d, kH200, "H200");
}
END_TEST

START_TEST(test_a100_table)
{
    const struct krn_cuda_device d = a100();
    check_table(&d, kA100, "A100");
}
END_TEST

/* Rows between the listed M land in their bucket: 3 rows as 4, 5-7 as 8,
 * 9-15 as 16, 17 as 32, 33 as 64, 129 and 895 as the largest. */
START_TEST(test_buckets)
{
    static const int32_t m[] = {1, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 895, 4096};
    static const int32_t b[] = {0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        ck_assert_int_eq(krn_int4_gemm_bucket_of(m[i]), b[i]);
    const struct krn_cuda_device d = h200();
    const struct krn_int4_gemm_plan p = plan_of(&d, 4096, 4096, 128, false);
    ck_assert_int_eq(pick(&p, 3, 0, -1).config, S16);
    ck_assert_int_eq(pick(&p, 5, 0, -1).config, M16N128);
    ck_assert_int_eq(pick(&p, 5, 0, -1).swapped, 1);
    ck_assert_int_eq(pick(&p, 9, 0, -1).swapped, 0);
    ck_assert_int_eq(pick(&p, 17, 0, -1).config, T32);
    ck_assert_int_eq(pick(&p, 100, 0, -1).config, T64);
    ck_assert_int_eq(pick(&p, 129, 0, -1).config, T128);
}
END_TEST

/* What a launch's own operands change: flags that ask for the mma.sync
 * kernel's options, A alignment, a bias with ACC64. */
START_TEST(test_operands)
{
    const struct krn_cuda_device d = h200();
    const struct krn_int4_gemm_plan o = plan_of(&d, 4096, 4096, 128, false);
    /* no stream kernel with NO_SWAP or GRID_STRIPED: the 16-row tile */
    struct krn_int4_gemm_choice c = pick(&o, 1, KRN_INT4_GEMM_NO_SWAP, -1);
    ck_assert_int_eq(c.config, M16N128);
    ck_assert_int_eq(c.swapped, 0);
    c = pick(&o, 1, KRN_INT4_GEMM_GRID_STRIPED, -1);
    ck_assert_int_eq(c.config, M16N128);
    ck_assert_int_eq(c.swapped, 1);
    ck_assert_int_eq(c.grid, 264); /* every slot, not 32 tiles x 8 */
    const struct krn_int4_gemm_plan qkv = plan_of(&d, 12288, 4096, 128, false);
    ck_assert_int_eq(pick(&qkv, 1, KRN_INT4_GEMM_GRID_STRIPED, -1).grid, 264);
    /* A only 2-byte aligned: neither the stream nor the wgmma kernel */
    struct krn_int4_gemm_call k = call_of(&o, 1, 0, -1);
    k.a4 = false;
    k.a_rows16 = false;
    c = choose(&o, &k);
    ck_assert_int_eq(c.config, M16N128);
    ck_assert_int_eq(c.swapped, 1);
    k.m = 32;
    c = choose(&o, &k);
    ck_assert_int_eq(c.config, M32N128);
    /* ... and no GLU variant for such rows */
    struct krn_int4_gemm_choice ch;
    k.flags = KRN_INT4_GEMM_GLU;
    ck_assert_int_eq(krn_int4_gemm_choose(&o, &k, &ch, NULL), INF_E_UNSUPPORTED);
    /* 4-byte aligned A keeps the stream kernel */
    k = call_of(&o, 2, 0, -1);
    k.a_rows16 = false;
    ck_assert_int_eq(choose(&o, &k).config, S16);
    /* a bias with ACC64: C written (the stream kernel's C output) */
    k = call_of(&o, 1, KRN_INT4_GEMM_ACC64, -1);
    k.bias = true;
    c = choose(&o, &k);
    ck_assert_int_eq(c.config, S16);
    ck_assert_int_eq(c.out, KRN_INT4_GEMM_OUT_C);
    ck_assert_int_eq(c.words, 0);
    k.m = 8;
    c = choose(&o, &k);
    ck_assert_int_eq(c.config, M16N128);
    ck_assert_int_eq(c.words, 0);
    /* the stream kernel's C words must fit the workspace's region: at M = 3
     * an 87552-column weight's do not (3 x 87552 x 8 bytes > 2 MiB) */
    const struct krn_int4_gemm_plan wide = plan_of(&d, 87552, 256, 128, false);
    ck_assert_int_eq(pick(&wide, 3, 0, KRN_INT4_GEMM_CFG_STREAM_W4_K512_B6).family,
                     KRN_INT4_GEMM_FAMILY_SM80);
    ck_assert_int_eq(
        pick(&wide, 3, KRN_INT4_GEMM_ACC64, KRN_INT4_GEMM_CFG_STREAM_W4_K512_B6).config,
        KRN_INT4_GEMM_CFG_STREAM_W4_K512_B6);
    /* a workspace smaller than the launch needs */
    k = call_of(&qkv, 1, 0, -1);
    k.workspace_bytes = 1024;
    ck_assert_int_eq(krn_int4_gemm_choose(&qkv, &k, &ch, NULL), INF_E_INVALID);
}
END_TEST

/* Forced configurations: run where the operands and the device allow,
 * else the plan's mma.sync choice. */
START_TEST(test_forced)
{
    const struct krn_cuda_device h = h200(), a = a100();
    const struct krn_int4_gemm_plan ho = plan_of(&h, 4096, 4096, 128, false);
    const struct krn_int4_gemm_plan ao = plan_of(&a, 4096, 4096, 128, false);
    struct krn_int4_gemm_choice c = pick(&ho, 8, 0, KRN_INT4_GEMM_CFG_STREAM_W4_K512_B6);
    ck_assert_int_eq(c.config, KRN_INT4_GEMM_CFG_STREAM_W4_K512_B6);
    ck_assert_int_eq(c.grid, 64 * 8);
    ck_assert_int_eq(c.k_tiles, 8);
    c = pick(&ho, 9, 0, KRN_INT4_GEMM_CFG_STREAM_W4_K512_B6); /* past one n8 fragment */
    ck_assert_int_eq(c.config, M16N128);
    ck_assert_int_eq(c.swapped, 0);
    c = pick(&ho, 40, 0, KRN_INT4_GEMM_CFG_SM90_T8_N128_K128);
    ck_assert_int_eq(c.config, KRN_INT4_GEMM_CFG_SM90_T8_N128_K128);
    ck_assert_int_eq(c.m_tiles, 5);
    /* no GLU variant of the 8-token wgmma tile: the plan's mma.sync choice */
    ck_assert_int_eq(pick(&ho, 40, KRN_INT4_GEMM_GLU, KRN_INT4_GEMM_CFG_SM90_T8_N128_K128).config,
                     M64N128);
    /* no wgmma on the A100 */
    ck_assert_int_eq(pick(&ao, 40, 0, KRN_INT4_GEMM_CFG_SM90_T8_N128_K128).config, M64N128);
    c = pick(&ao, 1, 0, KRN_INT4_GEMM_CFG_SM80_M128_N128_K128_W8_S3);
    ck_assert_int_eq(c.config, KRN_INT4_GEMM_CFG_SM80_M128_N128_K128_W8_S3);
    ck_assert_int_eq(c.swapped, 0);
    ck_assert_int_eq(c.grid, 96); /* 32 tiles x 3 of 108 slots */
    c = pick(&ho, 1, 0, KRN_INT4_GEMM_CFG_SM80_M16_N128_K128_W8_S4);
    ck_assert_int_eq(c.config, KRN_INT4_GEMM_CFG_SM80_M16_N128_K128_W8_S4);
    ck_assert_int_eq(c.swapped, 1);
    /* the fallback, forced or by flag */
    c = pick(&ho, 17, 0, KRN_INT4_GEMM_CFG_SM75_M16_N64);
    ck_assert_int_eq(c.family, KRN_INT4_GEMM_FAMILY_SM75);
    ck_assert_int_eq(c.grid, 64 * 2);
    ck_assert_int_eq(pick(&ao, 1, KRN_INT4_GEMM_FORCE_SM75, -1).family, KRN_INT4_GEMM_FAMILY_SM75);
    /* GLU variants only for the automatic choice's mma.sync configurations */
    struct krn_int4_gemm_call k =
        call_of(&ao, 1, KRN_INT4_GEMM_GLU, KRN_INT4_GEMM_CFG_SM80_M16_N128_K128_W8_S4);
    struct krn_int4_gemm_choice ch;
    ck_assert_int_eq(krn_int4_gemm_choose(&ao, &k, &ch, NULL), INF_E_UNSUPPORTED);
    k.config = KRN_INT4_GEMM_CFG_COUNT;
    ck_assert_int_eq(krn_int4_gemm_choose(&ao, &k, &ch, NULL), INF_E_UNSUPPORTED);
    k.config = -2;
    ck_assert_int_eq(krn_int4_gemm_choose(&ao, &k, &ch, NULL), INF_E_UNSUPPORTED);
}
END_TEST

/* Weights the rules take out of a family: tiny ones (one arithmetic at every
 * M), groups of 32 on Hopper (mma.sync). */
START_TEST(test_rules)
{
    const struct krn_cuda_device h = h200(), a = a100();
    const struct krn_int4_gemm_plan t = plan_of(&h, 288, 288, 128, false);
    ck_assert(t.tiny);
    static const int32_t ms[] = {1, 8, 16, 32, 64, 1000};
    static const int want[] = {M16N128, M16N128, M16N128, M32N128, M64N128, M64N128};
    for (int i = 0; i < 6; i++) {
        const struct krn_int4_gemm_choice c = pick(&t, ms[i], KRN_INT4_GEMM_ACC64, -1);
        ck_assert_int_eq(c.config, want[i]);
        ck_assert_int_eq(c.swapped, 0);
        ck_assert_int_eq(c.words, 0);
    }
    /* groups of 32: the stream kernel where it fits, mma.sync above 16 rows */
    const struct krn_int4_gemm_plan g = plan_of(&h, 4096, 4096, 32, false);
    ck_assert_int_eq(pick(&g, 1, 0, -1).config, S16);
    ck_assert_int_eq(pick(&g, 32, 0, -1).config, M32N128);
    ck_assert_int_eq(pick(&g, 64, 0, -1).config, M64N128);
    /* groups of 64 take wgmma */
    const struct krn_int4_gemm_plan g64 = plan_of(&h, 4096, 4096, 64, false);
    ck_assert_int_eq(pick(&g64, 64, 0, -1).config, T32);
    /* per-channel scales too; on the A100 no stream variant fits g's grid */
    const struct krn_int4_gemm_plan pc = plan_of(&h, 4096, 4096, 4096, false);
    ck_assert_int_eq(pick(&pc, 128, 0, -1).config, T64);
    const struct krn_int4_gemm_plan ag = plan_of(&a, 4096, 4096, 32, false);
    ck_assert_int_eq(pick(&ag, 1, 0, -1).config, M16N128);
    ck_assert_int_eq(pick(&ag, 1, 0, -1).swapped, 1);
    /* programmatic dependent launch on sm_90 only */
    ck_assert(t.pdl);
    ck_assert(!ag.pdl);
}
END_TEST

/* Devices other than the two: Turing takes the fallback at every M; sm_86 /
 * sm_89 (100 KiB an SM, 99 a block) lack the room for the 64-row tile and
 * take the 32-row one; a device too old or a bad layout is refused. */
START_TEST(test_other_devices)
{
    struct krn_cuda_device t = a100();
    t.cc = 75;
    t.sms = 40;
    memset(&t.int4_gemm, 0, sizeof t.int4_gemm);
    const struct krn_int4_gemm_plan p = plan_of(&t, 4096, 4096, 128, false);
    for (int b = 0; b < KRN_INT4_GEMM_M_BUCKETS; b++)
        ck_assert_int_eq(p.bucket[b].mma, KRN_INT4_GEMM_CFG_SM75_M16_N64);
    struct krn_int4_gemm_choice c = pick(&p, 40, 0, -1);
    ck_assert_int_eq(c.family, KRN_INT4_GEMM_FAMILY_SM75);
    ck_assert_int_eq(c.grid, 64 * 3);
    ck_assert_uint_ge(krn_int4_gemm_workspace_size(&p, 1), 256);

    struct krn_cuda_device s = a100();
    s.cc = 86;
    s.sms = 84;
    static const uint8_t sm80[KRN_INT4_GEMM_SM80_COUNT] = {1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1};
    memcpy(s.int4_gemm.sm80, sm80, sizeof sm80);
    const struct krn_int4_gemm_plan q = plan_of(&s, 12288, 4096, 128, false);
    ck_assert_int_eq(pick(&q, 1, 0, -1).config, M16N256);
    ck_assert_int_eq(pick(&q, 64, 0, -1).config, M32N128);
    ck_assert_int_eq(pick(&q, 64, 0, -1).grid, 84);
    struct krn_int4_gemm_call k = call_of(&q, 64, 0, KRN_INT4_GEMM_CFG_SM80_M64_N128_K128_W4_S4);
    struct krn_int4_gemm_choice ch;
    ck_assert_int_eq(krn_int4_gemm_choose(&q, &k, &ch, NULL), INF_E_UNSUPPORTED);

    struct krn_cuda_device old = a100();
    old.cc = 70;
    const struct krn_int4_gemm_layout lay = layout(4096, 4096, 128, false);
    struct krn_int4_gemm_plan r;
    ck_assert_int_eq(krn_int4_gemm_plan_make(&old, &lay, &r, NULL), INF_E_UNSUPPORTED);
    ck_assert_int_eq(krn_int4_gemm_plan_make(NULL, &lay, &r, NULL), INF_E_INVALID);
    struct krn_int4_gemm_layout bad = lay;
    bad.k_pad += 8;
    const struct krn_cuda_device h = h200();
    ck_assert_int_eq(krn_int4_gemm_plan_make(&h, &bad, &r, NULL), INF_E_UNSUPPORTED);
}
END_TEST

/* The workspace covers every configuration's need at up to max_m rows. */
START_TEST(test_workspace)
{
    const struct krn_cuda_device devs[2] = {h200(), a100()};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < N_SHAPES; s++) {
            const struct krn_int4_gemm_plan p =
                plan_of(&devs[d], kShapes[s].n, kShapes[s].k, 128, false);
            for (int32_t m = 1; m <= 1024; m = m * 2 + 1) {
                const size_t ws = krn_int4_gemm_workspace_size(&p, m);
                for (int c = -1; c < KRN_INT4_GEMM_CFG_COUNT; c++) {
                    struct krn_int4_gemm_call k = call_of(&p, m, 0, c);
                    k.workspace_bytes = ws;
                    struct krn_int4_gemm_choice ch;
                    struct inf_err err;
                    ck_assert_msg(krn_int4_gemm_choose(&p, &k, &ch, &err) == INF_OK, "%s", err.msg);
                    k.flags = KRN_INT4_GEMM_GRID_STRIPED;
                    ck_assert_msg(krn_int4_gemm_choose(&p, &k, &ch, &err) == INF_OK, "%s", err.msg);
                }
            }
        }
    ck_assert_uint_eq(krn_int4_gemm_workspace_size(NULL, 16), 0);
}
END_TEST

START_TEST(test_names)
{
    ck_assert_int_eq(krn_int4_gemm_config_count(), KRN_INT4_GEMM_CFG_COUNT);
    for (int c = 0; c < KRN_INT4_GEMM_CFG_COUNT; c++) {
        const char *name = krn_int4_gemm_config_name(c);
        ck_assert_ptr_nonnull(name);
        ck_assert_int_eq(krn_int4_gemm_config_find(name), c);
    }
    ck_assert_ptr_null(krn_int4_gemm_config_name(-1));
    ck_assert_ptr_null(krn_int4_gemm_config_name(KRN_INT4_GEMM_CFG_COUNT));
    ck_assert_int_eq(krn_int4_gemm_config_find("sm80 m16 n256 k128 w8 s4"), M16N256);
    ck_assert_int_eq(krn_int4_gemm_config_find("stream w8 k1024 b3"), S8);
    ck_assert_int_eq(krn_int4_gemm_config_find("sm90 wgmma t128 n128 k128"), T128);
    ck_assert_int_eq(krn_int4_gemm_config_find("sm80"), -1);
    ck_assert_int_eq(krn_int4_gemm_config_find(NULL), -1);
    const struct krn_int4_gemm_config_info *i = krn_int4_gemm_config_info(M16N256);
    ck_assert_int_eq(i->bm, 16);
    ck_assert_int_eq(i->bn, 256);
    ck_assert_int_eq(i->bk, 128);
    ck_assert(i->acc);
    i = krn_int4_gemm_config_info(KRN_INT4_GEMM_CFG_SM80_M64_N256_K128_W8_S3);
    ck_assert_int_eq(i->bm, 64);
    ck_assert_int_eq(i->bk, 128);
    ck_assert(!i->glu);
    ck_assert_int_eq(krn_int4_gemm_config_info(S16)->bk, 2048);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("int4_gemm_policy");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_h200_table);
    tcase_add_test(tc, test_a100_table);
    tcase_add_test(tc, test_buckets);
    tcase_add_test(tc, test_operands);
    tcase_add_test(tc, test_forced);
    tcase_add_test(tc, test_rules);
    tcase_add_test(tc, test_other_devices);
    tcase_add_test(tc, test_workspace);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
