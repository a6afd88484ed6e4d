/* kernels/int4_gemm_policy.c — which INT4 GEMM kernel a launch runs.
 *
 * A weight's plan (krn_int4_gemm_plan_make) is made once at load, for the
 * device described at backend creation: for each M bucket it names the
 * configuration the architecture's table gives the weight's shape class,
 * after the rules that take a family out for the whole weight. A launch
 * (krn_int4_gemm_choose) reads the plan at its M and checks only its own
 * operands; the order of the families and every fallback are those of the
 * tables and rules below, which were measured on an H200 (sm_90, 132 SMs)
 * over the Llama-2-7B and Llama-3-8B linear shapes with bench_gemm (the
 * weights rotated past the L2). The sm_80 class (A100, sm_86, sm_89) runs
 * the H200's mma.sync table, the same kernels without wgmma.
 *
 * Plain C on purpose: tests/kernels/test_int4_gemm_policy.c checks the
 * plans of the benchmark's shapes on an H200 and an A100 on the CPU. */
#include "kernels/int4_gemm_policy.h"

#include <limits.h>
#include <string.h>

/* ---- the configurations ------------------------------------------------ */

#define SM80_INFO(ID, NAME, MB, NWN, NF, KPW, STAGES, BPS, AUTO)                                   \
    [KRN_INT4_GEMM_CFG_##ID] = {NAME,                                                              \
                                KRN_INT4_GEMM_FAMILY_SM80,                                         \
                                16 * (MB),                                                         \
                                8 * (NF) * (NWN),                                                  \
                                16 * (KPW) * (8 / (NWN)),                                          \
                                BPS,                                                               \
                                8,                                                                 \
                                (AUTO) != 0,                                                       \
                                (AUTO) && (MB) == 1},
#define SM75_INFO(ID, NAME)                                                                        \
    [KRN_INT4_GEMM_CFG_##ID] = {NAME, KRN_INT4_GEMM_FAMILY_SM75, 16, 64, 16, 0, 8, true, false},
#define SM90_INFO(ID, NAME, TN, WG, BPS)                                                           \
    [KRN_INT4_GEMM_CFG_##ID] = {                                                                   \
        NAME, KRN_INT4_GEMM_FAMILY_SM90, TN, 64 * (WG), 128, BPS, 4 * (WG) + 1, false, false},
#define STREAM_INFO(ID, NAME, WARPS, MINB)                                                         \
    [KRN_INT4_GEMM_CFG_##ID] = {NAME,                                                              \
                                KRN_INT4_GEMM_FAMILY_STREAM,                                       \
                                KRN_INT4_GEMM_STREAM_MAX_M,                                        \
                                64,                                                                \
                                128 * (WARPS),                                                     \
                                MINB,                                                              \
                                WARPS,                                                             \
                                true,                                                              \
                                true},

/* clang-format off */
static const struct krn_int4_gemm_config_info kInfo[KRN_INT4_GEMM_CFG_COUNT] = {
    KRN_INT4_GEMM_SM80_CONFIGS(SM80_INFO)
    KRN_INT4_GEMM_SM75_CONFIGS(SM75_INFO)
    KRN_INT4_GEMM_SM90_CONFIGS(SM90_INFO)
    KRN_INT4_GEMM_STREAM_CONFIGS(STREAM_INFO)
};
/* clang-format on */

const struct krn_int4_gemm_config_info *krn_int4_gemm_config_info(int32_t cfg)
{
    return cfg >= 0 && cfg < KRN_INT4_GEMM_CFG_COUNT ? &kInfo[cfg] : NULL;
}

int krn_int4_gemm_config_count(void)
{
    return KRN_INT4_GEMM_CFG_COUNT;
}

const char *krn_int4_gemm_config_name(int config)
{
    return config >= 0 && config < KRN_INT4_GEMM_CFG_COUNT ? kInfo[config].name : NULL;
}

int krn_int4_gemm_config_find(const char *name)
{
    for (int i = 0; name && i < KRN_INT4_GEMM_CFG_COUNT; i++)
        if (!strcmp(kInfo[i].name, name))
            return i;
    return -1;
}

bool krn_int4_gemm_layout_ok(const struct krn_int4_gemm_layout *l)
{
    return l->n >= 1 && l->k >= 1 && l->n_pad >= l->n && l->k_pad >= l->k &&
           l->n_pad % KRN_INT4_GEMM_N_ALIGN == 0 && l->k_pad % KRN_INT4_GEMM_K_ALIGN == 0 &&
           l->group_steps >= 2 && l->groups >= 1 &&
           (l->groups == 1
                ? l->group_steps * 16 >= l->k_pad
                : (l->group_steps & (l->group_steps - 1)) == 0 && l->group_steps <= 16) &&
           (long long)l->groups * l->group_steps * 16 >= l->k_pad && l->q_offset % 16 == 0 &&
           l->scale_offset % 16 == 0 && l->zero_offset % 16 == 0;
}

/* ---- M buckets and shape classes --------------------------------------- */

/* The largest M of each bucket: 4 the stream kernel's (STREAM_AUTO_MAX_M);
 * 8 the swapped operands' (the tokens are one n8 mma fragment) and the
 * 256-column 16-row tile's on WIDE weights; 16 one 16-row tile, the
 * mma.sync kernel's range on Hopper; 32, 64 and 128 the token tiles. */
static const int32_t kBucketMaxM[KRN_INT4_GEMM_M_BUCKETS] = {4, 8, 16, 32, 64, 128, INT32_MAX};

int32_t krn_int4_gemm_bucket_of(int32_t m)
{
    int32_t b = 0;
    while (m > kBucketMaxM[b])
        b++;
    return b;
}

/* Weights of fewer 128 x 128 tiles than this (the tiny and small presets')
 * take a few microseconds whatever runs them, so they keep one arithmetic
 * at every M: the mma.sync kernel, the usual operand order, C written. Its
 * 16-, 32- and 64-row tiles split k the same way, and while every block
 * holds at most one unit a tile's k sum does not depend on M, so a row's
 * result does not depend on the batch it runs in (the engine's batch tests
 * on the small presets rely on it). */
#define TINY_TILES 256

/* n_pad from which the 16-row tile is 256 columns wide (all eight warps
 * along N, each taking the whole k tile): up to 8 rows from WIDE_N, up to 16
 * rows from WIDEST_N. Each block's stripe is long enough for the larger
 * tile there, and up to 8 rows a warp's chunk is a whole group of 128 k. */
#define WIDE_N 8192
#define WIDEST_N 16384
enum { NARROW, WIDE, WIDEST, N_WIDTHS };

/* Weights of fewer 128 x 128 tiles than this take the wgmma token tile one
 * step smaller above 32 rows: a larger one leaves too few units a block. */
#define SMALL_TILES 1536
enum { LARGE, SMALL, N_SIZES };

/* The stream kernel up to this many rows: from 4 rows on its per-row
 * atomics eat its gain over the persistent kernel. */
#define STREAM_AUTO_MAX_M 4
/* ... and only where one wave of a variant's blocks holds the whole weight
 * and fills at least 3/4 of the SMs: every load is then issued at the
 * start. On the H200 that is the 4096 x 4096 projections (o at M = 1: 5.08
 * against 6.48 us for the persistent kernel) and Llama-3-8B's q/k/v (6.88
 * against 8.20); a weight that takes several waves is slower (Llama-2
 * gate/up: 18.4 against 15.9, each new block starts its stream from
 * nothing). */
#define STREAM_FILL_NUM 3
#define STREAM_FILL_DEN 4

/* ---- the per-architecture tables --------------------------------------- */

#define M16N128 KRN_INT4_GEMM_CFG_SM80_M16_N128_K128_W4_S4
#define M16N256 KRN_INT4_GEMM_CFG_SM80_M16_N256_K128_W8_S4
#define M32N128 KRN_INT4_GEMM_CFG_SM80_M32_N128_K128_W4_S4
#define M64N128 KRN_INT4_GEMM_CFG_SM80_M64_N128_K128_W4_S4
#define T32 KRN_INT4_GEMM_CFG_SM90_T32_N128_K128
#define T64 KRN_INT4_GEMM_CFG_SM90_T64_N128_K128
#define T128 KRN_INT4_GEMM_CFG_SM90_T128_N128_K128

/* mma.sync, by width class and M bucket (sm_80 class; on sm_90 where wgmma
 * does not apply): the 16-row tile up to 16 rows, where the weight stream
 * is all there is; the 32-row tile up to 32; beyond, the 64-row tile (two
 * or more m tiles, each dequantizing the weights again). The other
 * compiled configurations are alternatives for bench_gemm --sweep and the
 * tests. */
static const int8_t kMma[N_WIDTHS][KRN_INT4_GEMM_M_BUCKETS] = {
    /*          <= 4     <= 8     <= 16    <= 32    <= 64    <= 128   more */
    [NARROW] = {M16N128, M16N128, M16N128, M32N128, M64N128, M64N128, M64N128},
    [WIDE] = {M16N256, M16N256, M16N128, M32N128, M64N128, M64N128, M64N128},
    [WIDEST] = {M16N256, M16N256, M16N256, M32N128, M64N128, M64N128, M64N128},
};

/* wgmma (sm_90), by size class and M bucket, -1: mma.sync. Up to 16 rows
 * the mma.sync kernel (the weight stream is all there is); above, the token
 * tile that covers M in as few tiles as the weight allows. On small weights
 * the 32-token tile beats mma.sync at 32 rows too (Llama-2 o: 11.39 against
 * 12.85 us). */
static const int8_t kWgmma[N_SIZES][KRN_INT4_GEMM_M_BUCKETS] = {
    /*         <= 4 <= 8 <= 16 <= 32 <= 64 <= 128 more */
    [LARGE] = {-1, -1, -1, T32, T64, T128, T128},
    [SMALL] = {-1, -1, -1, T32, T32, T64, T128},
};

/* The next smaller mma.sync tile, for a device whose shared memory does not
 * hold a table entry (sm_86 and sm_89: 99 KiB a block, 100 KiB an SM, too
 * little for the 64-row tile's 136 KiB). */
static int smaller_mma(int cfg)
{
    switch (cfg) {
    case M64N128:
        return M32N128;
    case M32N128:
    case M16N256:
        return M16N128;
    default:
        return -1;
    }
}

/* ---- helpers ------------------------------------------------------------ */

static int32_t ceil_div(int64_t a, int64_t b)
{
    return (int32_t)((a + b - 1) / b);
}

static int32_t min32(int32_t a, int32_t b)
{
    return a < b ? a : b;
}

/* log2 of the k16 steps of a scale group (2..16), or 30 for one group. */
static int gshift_of(const struct krn_int4_gemm_plan *p)
{
    if (p->groups > 1)
        for (int sh = 1; sh <= 4; sh++)
            if (p->group_steps == (1 << sh))
                return sh;
    return 30;
}

/* Index of the sm_90a kernel's scale-group run (2, 4, 8 k16 steps). */
static int sm90_gs_index(const struct krn_int4_gemm_plan *p)
{
    const int gs = p->groups > 1 && p->group_steps < 8 ? p->group_steps : 8;
    return gs == 2 ? 0 : gs == 4 ? 1 : 2;
}

static int sm90_gs(const struct krn_int4_gemm_plan *p)
{
    return 2 << sm90_gs_index(p);
}

/* Index of the scale groups a stream warp's 8 k16 steps span (1, 2, 4). */
static int stream_ngw_index(const struct krn_int4_gemm_plan *p)
{
    const int sh = gshift_of(p);
    return sh >= 3 ? 0 : sh == 2 ? 1 : 2;
}

/* Blocks along k of stream variant cfg: each takes 128 k a warp. */
static int32_t stream_k_blocks(int cfg, const struct krn_int4_gemm_plan *p)
{
    return ceil_div(p->k_pad, kInfo[cfg].bk);
}

/* The automatic stream variant for output out, or -1: the largest block
 * whose grid is one wave (every block resident at once) filling at least
 * STREAM_FILL_NUM / STREAM_FILL_DEN of the SMs, as long as no word sums
 * more blocks than the fixed point allows. Not on tiny weights, odd k (the
 * activations go in pairs) or more chunks than the counter region holds. */
static int stream_pick(const struct krn_cuda_device *dev, const struct krn_int4_gemm_plan *p,
                       int out)
{
    if (p->cc < 80 || p->tiny || p->k % 2 || p->n_pad / 64 > 2 * KRN_INT4_GEMM_MAX_GRID)
        return -1;
    const int ngw = stream_ngw_index(p), zp = p->symmetric ? 0 : 1;
    const int64_t chunks = p->n_pad / 64;
    for (int v = 0; v < KRN_INT4_GEMM_STREAM_COUNT; v++) {
        const int cfg = KRN_INT4_GEMM_STREAM_FIRST + v;
        const int64_t per_sm = dev->int4_gemm.stream[v][ngw][zp][out];
        if (per_sm < 1)
            return -1;
        const int64_t blocks = chunks * stream_k_blocks(cfg, p);
        if (blocks * STREAM_FILL_DEN >= (int64_t)STREAM_FILL_NUM * p->sms &&
            blocks <= p->sms * per_sm)
            return stream_k_blocks(cfg, p) <= KRN_INT4_GEMM_ACC64_MAX_PARTS ? cfg : -1;
    }
    return -1;
}

/* ---- the plan ------------------------------------------------------------ */

inf_status_t krn_int4_gemm_plan_make(const struct krn_cuda_device *dev,
                                     const struct krn_int4_gemm_layout *lay,
                                     struct krn_int4_gemm_plan *plan, struct inf_err *err)
{
    if (!dev || !lay || !plan)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm plan: NULL argument");
    if (!krn_int4_gemm_layout_ok(lay))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm plan: layout n=%d k=%d n_pad=%d k_pad=%d group_steps=%d "
                           "not supported",
                           (int)lay->n, (int)lay->k, (int)lay->n_pad, (int)lay->k_pad,
                           (int)lay->group_steps);
    if (dev->cc < 75 || dev->sms < 1)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm plan: compute capability %d.%d with %d SMs (7.5 or newer "
                           "needed)",
                           (int)dev->cc / 10, (int)dev->cc % 10, (int)dev->sms);
    memset(plan, 0, sizeof *plan);
    plan->n = lay->n;
    plan->k = lay->k;
    plan->n_pad = lay->n_pad;
    plan->k_pad = lay->k_pad;
    plan->group_steps = lay->group_steps;
    plan->groups = lay->groups;
    plan->symmetric = lay->symmetric;
    plan->cc = dev->cc;
    plan->sms = dev->sms;
    plan->wgmma = dev->sm90a && dev->cc / 10 == 9;
    plan->pdl = dev->cc >= 90;
    const int64_t tiles = (int64_t)(lay->n_pad / 128) * (lay->k_pad / 128);
    plan->tiny = tiles < TINY_TILES;

    for (int c = 0; c < KRN_INT4_GEMM_CFG_COUNT; c++) {
        const struct krn_int4_gemm_config_info *ci = &kInfo[c];
        int32_t per_sm = 0;
        switch (ci->family) {
        case KRN_INT4_GEMM_FAMILY_SM80:
            per_sm = dev->cc >= 80
                         ? min32(dev->int4_gemm.sm80[c - KRN_INT4_GEMM_SM80_FIRST], ci->bps)
                         : 0;
            break;
        case KRN_INT4_GEMM_FAMILY_SM90:
            per_sm =
                plan->wgmma
                    ? min32(dev->int4_gemm.sm90[c - KRN_INT4_GEMM_SM90_FIRST][sm90_gs_index(plan)],
                            ci->bps)
                    : 0;
            break;
        case KRN_INT4_GEMM_FAMILY_SM75:
            per_sm = 1;
            break;
        case KRN_INT4_GEMM_FAMILY_STREAM:
            per_sm = dev->cc >= 80 ? 1 : 0;
            break;
        }
        plan->slots[c] = dev->sms * per_sm;
    }

    const int width = lay->n_pad >= WIDEST_N ? WIDEST : lay->n_pad >= WIDE_N ? WIDE : NARROW;
    const int size = tiles < SMALL_TILES ? SMALL : LARGE;
    /* Groups of 32 k stay on mma.sync on Hopper: their wgmma variant is
     * correct but was never timed against it. */
    const bool wgmma = plan->wgmma && !plan->tiny && !(lay->groups > 1 && lay->group_steps < 4);
    for (int b = 0; b < KRN_INT4_GEMM_M_BUCKETS; b++) {
        struct krn_int4_gemm_pick *pk = &plan->bucket[b];
        pk->stream[0] = pk->stream[1] = pk->stream[2] = -1;
        pk->wgmma = -1;
        if (dev->cc < 80) { /* Turing: the fallback at every M */
            pk->mma = KRN_INT4_GEMM_CFG_SM75_M16_N64;
            continue;
        }
        int mma = kMma[width][b];
        while (mma >= 0 && plan->slots[mma] == 0)
            mma = smaller_mma(mma);
        if (mma < 0)
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               "int4 gemm plan: no configuration fits the shared memory of "
                               "this device (%d bytes a block)",
                               (int)dev->smem_per_block);
        pk->mma = (int8_t)mma;
        if (kBucketMaxM[b] <= STREAM_AUTO_MAX_M)
            for (int out = 0; out < 3; out++)
                pk->stream[out] = (int8_t)stream_pick(dev, plan, out);
        const int w = wgmma ? kWgmma[size][b] : -1;
        pk->wgmma = (int8_t)(w >= 0 && plan->slots[w] > 0 ? w : -1);
    }
    return INF_OK;
}

size_t krn_int4_gemm_workspace_size(const struct krn_int4_gemm_plan *plan, int32_t max_m)
{
    if (!plan || max_m < 1)
        return 0;
    size_t need = 256;
    for (int c = 0; c < KRN_INT4_GEMM_CFG_COUNT; c++) {
        const struct krn_int4_gemm_config_info *ci = &kInfo[c];
        size_t w = 0;
        /* the largest grid of each (every SM at its cap) and, for sm_90a,
         * the partial tile of a whole token tile */
        if (ci->family == KRN_INT4_GEMM_FAMILY_SM80)
            w = KRN_INT4_GEMM_FIXED_BYTES + 2 * (size_t)plan->sms * (size_t)ci->bps *
                                                (size_t)min32(max_m, ci->bm) * (size_t)ci->bn *
                                                sizeof(float);
        else if (ci->family == KRN_INT4_GEMM_FAMILY_SM90 && plan->wgmma)
            w = KRN_INT4_GEMM_FIXED_BYTES +
                2 * (size_t)plan->sms * 2 * (size_t)ci->bm * (size_t)ci->bn * sizeof(float);
        if (w > need)
            need = w;
    }
    return need;
}

/* ---- one launch ---------------------------------------------------------- */

/* Blocks of a persistent launch with `slots` resident blocks. Units (m tile,
 * n tile, k tile) are striped over the grid in (tile, k tile) order, so with
 * G blocks a tile is shared by the blocks whose stripes cross it. With fewer
 * tiles than slots, G = tiles x s (s = slots / tiles, at most k_tiles) puts
 * the start of block t s on the first k tile of tile t: every stripe then
 * lies inside one tile and every tile has exactly s contributors (one
 * partial and one arrival a block instead of up to two, all tiles finishing
 * together). Taken when it keeps at least 7/8 of the slots;
 * KRN_INT4_GEMM_GRID_STRIPED keeps all of them. */
static int32_t launch_grid(int32_t slots, const struct krn_int4_gemm_choice *ch, uint32_t flags)
{
    const int64_t tiles = (int64_t)ch->m_tiles * ch->n_tiles;
    int64_t grid = slots;
    if (!(flags & KRN_INT4_GEMM_GRID_STRIPED) && tiles < slots) {
        int64_t s = slots / tiles;
        if (s > ch->k_tiles)
            s = ch->k_tiles;
        if (tiles * s * 8 >= (int64_t)slots * 7)
            grid = tiles * s;
    }
    if (grid > ch->units)
        grid = ch->units;
    if (grid > KRN_INT4_GEMM_MAX_GRID)
        grid = KRN_INT4_GEMM_MAX_GRID;
    return (int32_t)grid;
}

/* Tiles of a persistent configuration; INF_E_UNSUPPORTED past 2^30 units. */
static inf_status_t tile(const struct krn_int4_gemm_plan *plan, int32_t m, int32_t bm, int32_t bn,
                         int32_t bk, struct krn_int4_gemm_choice *ch, struct inf_err *err)
{
    ch->m_tiles = ceil_div(m, bm);
    ch->n_tiles = plan->n_pad / bn;
    ch->k_tiles = plan->k_pad / bk;
    const int64_t units = (int64_t)ch->m_tiles * ch->n_tiles * ch->k_tiles;
    if (units > (1LL << 30))
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: m=%d n=%d k=%d too large", (int)m,
                           (int)plan->n, (int)plan->k);
    ch->units = (int32_t)units;
    ch->slot_rows = min32(m, bm);
    return INF_OK;
}

static inf_status_t need_workspace(const struct krn_int4_gemm_call *call,
                                   struct krn_int4_gemm_choice *ch, size_t need,
                                   struct inf_err *err)
{
    ch->workspace_need = need;
    if (call->workspace_bytes < need)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: workspace %zu bytes, need %zu",
                           call->workspace_bytes, need);
    return INF_OK;
}

/* The stream kernel for call, or false: a forced stream configuration or,
 * automatically, the plan's variant for the launch's output, where the
 * operands allow it (M within one n8 fragment, not tiny, no flag asking for
 * the mma.sync kernel's own options, A 4-byte aligned with k even, the words
 * within the workspace's region). */
static bool choose_stream(const struct krn_int4_gemm_plan *plan,
                          const struct krn_int4_gemm_call *call,
                          const struct krn_int4_gemm_pick *pk, struct krn_int4_gemm_choice *ch)
{
    const bool forced = call->config >= KRN_INT4_GEMM_STREAM_FIRST &&
                        call->config < KRN_INT4_GEMM_STREAM_FIRST + KRN_INT4_GEMM_STREAM_COUNT;
    if (!forced && call->config != KRN_INT4_GEMM_CFG_AUTO)
        return false;
    const uint32_t own = KRN_INT4_GEMM_NO_SWAP | KRN_INT4_GEMM_GRID_STRIPED;
    if (call->m > KRN_INT4_GEMM_STREAM_MAX_M || plan->tiny || (call->flags & own) || plan->k % 2 ||
        !call->a4 || plan->n_pad / 64 > 2 * KRN_INT4_GEMM_MAX_GRID)
        return false;
    enum krn_int4_gemm_out out;
    if ((call->flags & KRN_INT4_GEMM_ACC64) && !call->bias) {
        out = KRN_INT4_GEMM_OUT_WORDS;
    } else {
        if ((size_t)call->m * plan->n_pad * sizeof(int64_t) > KRN_INT4_GEMM_STREAM_WORD_BYTES ||
            call->workspace_bytes < KRN_INT4_GEMM_FIXED_BYTES)
            return false;
        out = call->flags & KRN_INT4_GEMM_GLU ? KRN_INT4_GEMM_OUT_GLU : KRN_INT4_GEMM_OUT_C;
    }
    const int cfg = forced ? call->config : pk->stream[out];
    if (cfg < 0 || stream_k_blocks(cfg, plan) > KRN_INT4_GEMM_ACC64_MAX_PARTS)
        return false;
    ch->config = cfg;
    ch->family = KRN_INT4_GEMM_FAMILY_STREAM;
    ch->out = out;
    ch->words = out == KRN_INT4_GEMM_OUT_WORDS;
    ch->m_tiles = 1;
    ch->n_tiles = plan->n_pad / 64;
    ch->k_tiles = stream_k_blocks(cfg, plan);
    ch->grid = ch->n_tiles * ch->k_tiles;
    ch->workspace_need = ch->words ? 0 : KRN_INT4_GEMM_FIXED_BYTES;
    return true;
}

inf_status_t krn_int4_gemm_choose(const struct krn_int4_gemm_plan *plan,
                                  const struct krn_int4_gemm_call *call,
                                  struct krn_int4_gemm_choice *ch, struct inf_err *err)
{
    if (!plan || !call || !ch || call->m < 1)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: NULL arguments or m < 1");
    if (call->config < KRN_INT4_GEMM_CFG_AUTO || call->config >= KRN_INT4_GEMM_CFG_COUNT)
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: no configuration %d",
                           (int)call->config);
    memset(ch, 0, sizeof *ch);
    const int32_t m = call->m;
    const bool glu = (call->flags & KRN_INT4_GEMM_GLU) != 0;
    const int forced = call->config;
    const enum krn_int4_gemm_family ffam =
        forced >= 0 ? kInfo[forced].family : KRN_INT4_GEMM_FAMILY_SM80;
    const struct krn_int4_gemm_pick *pk = &plan->bucket[krn_int4_gemm_bucket_of(m)];

    /* Turing, or the fallback forced: one block a 16 x 64 tile. */
    if ((call->flags & KRN_INT4_GEMM_FORCE_SM75) || plan->cc < 80 ||
        forced == KRN_INT4_GEMM_CFG_SM75_M16_N64) {
        ch->config = KRN_INT4_GEMM_CFG_SM75_M16_N64;
        ch->family = KRN_INT4_GEMM_FAMILY_SM75;
        ch->out = glu ? KRN_INT4_GEMM_OUT_GLU : KRN_INT4_GEMM_OUT_C;
        ch->m_tiles = ceil_div(m, 16);
        ch->n_tiles = plan->n_pad / 64;
        if (ch->m_tiles > 65535)
            return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm (sm75): m=%d too large", (int)m);
        ch->grid = ch->m_tiles * ch->n_tiles;
        return INF_OK;
    }

    if (choose_stream(plan, call, pk, ch))
        return INF_OK;

    /* Hopper: the wgmma kernel where the plan has it (or forced), when it
     * can run these operands (cp.async of whole 16-byte A pieces) and has
     * the output's variant. */
    if (plan->wgmma) {
        const int c9 = forced == KRN_INT4_GEMM_CFG_AUTO    ? pk->wgmma
                       : ffam == KRN_INT4_GEMM_FAMILY_SM90 ? forced
                                                           : -1;
        if (c9 >= 0 && call->a_rows16 && plan->slots[c9] > 0 &&
            (!glu || KRN_INT4_GEMM_SM90_HAS_GLU(kInfo[c9].bm, sm90_gs(plan)))) {
            const struct krn_int4_gemm_config_info *ci = &kInfo[c9];
            ch->config = c9;
            ch->family = KRN_INT4_GEMM_FAMILY_SM90;
            ch->out = glu ? KRN_INT4_GEMM_OUT_GLU : KRN_INT4_GEMM_OUT_C;
            inf_status_t st = tile(plan, m, ci->bm, ci->bn, ci->bk, ch, err);
            if (st != INF_OK)
                return st;
            ch->grid = launch_grid(plan->slots[c9], ch, call->flags);
            return need_workspace(call, ch,
                                  KRN_INT4_GEMM_FIXED_BYTES + 2 * (size_t)ch->grid *
                                                                  (size_t)ci->bm * (size_t)ci->bn *
                                                                  sizeof(float),
                                  err);
        }
    }

    /* The mma.sync kernel: the forced configuration or the plan's. */
    const int c8 = ffam == KRN_INT4_GEMM_FAMILY_SM80 && forced >= 0 ? forced : pk->mma;
    const struct krn_int4_gemm_config_info *ci = &kInfo[c8];
    if (plan->slots[c8] == 0)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: %s needs more shared memory than this device has", ci->name);
    ch->config = c8;
    ch->family = KRN_INT4_GEMM_FAMILY_SM80;
    /* a 16-row tile holding at most 8 rows swaps the operands (the tokens
     * as the n8 fragment: half the mma) */
    ch->swapped = m <= 8 && ci->bm == 16 && !plan->tiny && !(call->flags & KRN_INT4_GEMM_NO_SWAP);
    if (glu && (!call->a_rows16 || !ci->glu))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: no GLU variant of %s%s (the automatic choice's "
                           "configurations, A rows 16-byte aligned)",
                           ci->name, call->a_rows16 ? "" : " for these A rows");
    inf_status_t st = tile(plan, m, ci->bm, ci->bn, ci->bk, ch, err);
    if (st != INF_OK)
        return st;
    ch->grid = launch_grid(plan->slots[c8], ch, call->flags);
    /* Fixed-point sums where asked and compiled, not on tiny weights, and
     * while no word takes more than KRN_INT4_GEMM_ACC64_MAX_PARTS
     * contributions (blocks hold units / grid units or one more, in
     * stripes). */
    ch->words = (call->flags & KRN_INT4_GEMM_ACC64) && !call->bias && call->a_rows16 && ci->acc &&
                !plan->tiny;
    if (ch->words) {
        const int64_t per_block = ch->units / ch->grid;
        ch->words = (ch->k_tiles + per_block - 1) / per_block + 1 <= KRN_INT4_GEMM_ACC64_MAX_PARTS;
    }
    ch->out = ch->words ? KRN_INT4_GEMM_OUT_WORDS
              : glu     ? KRN_INT4_GEMM_OUT_GLU
                        : KRN_INT4_GEMM_OUT_C;
    return need_workspace(call, ch,
                          KRN_INT4_GEMM_FIXED_BYTES + 2 * (size_t)ch->grid * (size_t)ch->slot_rows *
                                                          (size_t)ci->bn * sizeof(float),
                          err);
}
