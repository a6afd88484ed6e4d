#pragma once
/* kernels/int4_gemm_configs.h — the INT4 GEMM's compiled configurations, each
 * named by what it is. One X-macro list per kernel family: the kernels
 * (kernels/cuda) expand it into their template instances and the policy
 * (kernels/int4_gemm_policy.c) into its geometry table, so the two cannot
 * drift apart. The enum below gives every configuration its name for
 * krn_int4_gemm_args.config; the order of the lists is the enum's.
 *
 * sm_80 mma.sync (kernels/cuda/int4_gemm_sm80.cu):
 *   X(ID, NAME, MB, NWN, NF, KPW, STAGES, BPS, AUTO)
 *   a tile of 16 MB rows x 8 NF NWN columns x 128 k; 8 warps, NWN along N
 *   and 8 / NWN along K, each taking KPW = NWN consecutive k16 steps of a k
 *   tile; STAGES cp.async stages; registers capped for BPS blocks per SM.
 *   AUTO: a configuration the policy picks, compiled with GLU output and,
 *   for 16-row tiles, with fixed-point (ACC64) output too. Name: "sm80",
 *   rows, columns, k tile, warps along N (w), stages (s).
 * sm_75 fallback (kernels/cuda/int4_gemm_sm75.cu): X(ID, NAME), a 16 x 64
 *   tile a block, for Turing and for tests on newer GPUs.
 * sm_90a wgmma (kernels/cuda/sm90/int4_gemm_sm90.cu): X(ID, NAME, TN, WG, BPS)
 *   TN tokens x 64 WG columns x 128 k a tile, WG consumer warpgroups and a
 *   producer warp, at most BPS blocks per SM.
 * Stream (kernels/cuda/int4_gemm_stream.cu): X(ID, NAME, WARPS, MINB)
 *   one round of loads a block of WARPS warps: 64 columns x 128 WARPS k (the
 *   k split: k_pad / (128 WARPS) blocks share each output), registers capped
 *   for MINB blocks per SM (groups of 128 k or more). Name: warps (w), k a
 *   block, blocks per SM (b). */

#define KRN_INT4_GEMM_SM80_CONFIGS(X)                                                              \
    X(SM80_M16_N128_K128_W4_S4, "sm80 m16 n128 k128 w4 s4", 1, 4, 4, 4, 4, 2, 1)                   \
    X(SM80_M32_N128_K128_W4_S4, "sm80 m32 n128 k128 w4 s4", 2, 4, 4, 4, 4, 2, 1)                   \
    X(SM80_M64_N128_K128_W4_S4, "sm80 m64 n128 k128 w4 s4", 4, 4, 4, 4, 4, 1, 1)                   \
    X(SM80_M64_N256_K128_W8_S3, "sm80 m64 n256 k128 w8 s3", 4, 8, 4, 8, 3, 1, 0)                   \
    X(SM80_M16_N256_K128_W4_S4, "sm80 m16 n256 k128 w4 s4", 1, 4, 8, 4, 4, 2, 0)                   \
    X(SM80_M32_N256_K128_W4_S4, "sm80 m32 n256 k128 w4 s4", 2, 4, 8, 4, 4, 1, 0)                   \
    X(SM80_M16_N128_K128_W2_S4, "sm80 m16 n128 k128 w2 s4", 1, 2, 8, 2, 4, 2, 0)                   \
    X(SM80_M64_N128_K128_W8_S4, "sm80 m64 n128 k128 w8 s4", 4, 8, 2, 8, 4, 2, 0)                   \
    X(SM80_M128_N128_K128_W8_S3, "sm80 m128 n128 k128 w8 s3", 8, 8, 2, 8, 3, 1, 0)                 \
    X(SM80_M32_N256_K128_W8_S4, "sm80 m32 n256 k128 w8 s4", 2, 8, 4, 8, 4, 2, 0)                   \
    X(SM80_M16_N256_K128_W8_S4, "sm80 m16 n256 k128 w8 s4", 1, 8, 4, 8, 4, 2, 1)                   \
    X(SM80_M16_N128_K128_W8_S4, "sm80 m16 n128 k128 w8 s4", 1, 8, 2, 8, 4, 2, 0)

#define KRN_INT4_GEMM_SM75_CONFIGS(X) X(SM75_M16_N64, "sm75 fallback m16 n64")

/* Two consumer warpgroups (128 columns) throughout: four (256 columns, each
 * token tile read from L2 once per 16 KiB of weights instead of 8) were
 * slower on every Llama shape from M = 32 to 256 on the H200. Two blocks an
 * SM up to 64 tokens (four warpgroups take turns on the tensor cores), one
 * for 128 (its stages need the room). */
#define KRN_INT4_GEMM_SM90_CONFIGS(X)                                                              \
    X(SM90_T8_N128_K128, "sm90 wgmma t8 n128 k128", 8, 2, 2)                                       \
    X(SM90_T16_N128_K128, "sm90 wgmma t16 n128 k128", 16, 2, 2)                                    \
    X(SM90_T32_N128_K128, "sm90 wgmma t32 n128 k128", 32, 2, 2)                                    \
    X(SM90_T64_N128_K128, "sm90 wgmma t64 n128 k128", 64, 2, 2)                                    \
    X(SM90_T128_N128_K128, "sm90 wgmma t128 n128 k128", 128, 2, 1)

/* Largest block first: the policy's order (kernels/int4_gemm_policy.c). 16
 * warps: one block an SM (512 threads, at most 128 registers); 8: three (at
 * most 80); 4: six (at most 80). */
#define KRN_INT4_GEMM_STREAM_CONFIGS(X)                                                            \
    X(STREAM_W16_K2048_B1, "stream w16 k2048 b1", 16, 1)                                           \
    X(STREAM_W8_K1024_B3, "stream w8 k1024 b3", 8, 3)                                              \
    X(STREAM_W4_K512_B6, "stream w4 k512 b6", 4, 6)

/* The sm_90a kernel has GLU variants for token tiles of 32 and more and scale
 * groups of at least 4 k16 steps (what the policy picks). */
#define KRN_INT4_GEMM_SM90_HAS_GLU(TN, GS) ((TN) >= 32 && (GS) >= 4)

#define KRN_INT4_GEMM_CFG_ONE_(...) +1

enum krn_int4_gemm_config {
    KRN_INT4_GEMM_CFG_AUTO = -1, /* the plan's choice */
#define KRN_INT4_GEMM_CFG_ENUM_(ID, ...) KRN_INT4_GEMM_CFG_##ID,
    /* clang-format off */
    KRN_INT4_GEMM_SM80_CONFIGS(KRN_INT4_GEMM_CFG_ENUM_)
    KRN_INT4_GEMM_SM75_CONFIGS(KRN_INT4_GEMM_CFG_ENUM_)
    KRN_INT4_GEMM_SM90_CONFIGS(KRN_INT4_GEMM_CFG_ENUM_)
    KRN_INT4_GEMM_STREAM_CONFIGS(KRN_INT4_GEMM_CFG_ENUM_)
    KRN_INT4_GEMM_CFG_COUNT
    /* clang-format on */
};
#undef KRN_INT4_GEMM_CFG_ENUM_

/* Each family's configurations are a contiguous range of the enum. */
enum {
    KRN_INT4_GEMM_SM80_COUNT = 0 KRN_INT4_GEMM_SM80_CONFIGS(KRN_INT4_GEMM_CFG_ONE_),
    KRN_INT4_GEMM_SM90_COUNT = 0 KRN_INT4_GEMM_SM90_CONFIGS(KRN_INT4_GEMM_CFG_ONE_),
    KRN_INT4_GEMM_STREAM_COUNT = 0 KRN_INT4_GEMM_STREAM_CONFIGS(KRN_INT4_GEMM_CFG_ONE_),
    KRN_INT4_GEMM_SM80_FIRST = KRN_INT4_GEMM_CFG_SM80_M16_N128_K128_W4_S4,
    KRN_INT4_GEMM_SM90_FIRST = KRN_INT4_GEMM_CFG_SM90_T8_N128_K128,
    KRN_INT4_GEMM_STREAM_FIRST = KRN_INT4_GEMM_CFG_STREAM_W16_K2048_B1,
};
