#pragma once
/* kernels/int4_gemm.h — INT4-weight GEMM for fp16 activations on CUDA GPUs.
 *
 *     C[m][n] = sum_k A[m][k] * W[n][k]  (+ bias[n])
 *
 * A [m][k] and C [m][n] are fp16, row-major, contiguous; W is a layer in the
 * canonical quantized form (kernels/q4.h), repacked once on the host by
 * krn_int4_gemm_repack() into the kernel's layout and uploaded by the caller.
 * Accumulation is fp32. The kernels use the weight fp16((code - zero) *
 * scale) exactly as the CPU reference computes it, except the sm_80
 * kernel's swapped path (M <= 8, weights of 256 tiles of 128 x 128 or more),
 * which sums exact products activation * (code - zero) per scale group and
 * applies the scale in fp32: it differs from the reference by that fp16
 * rounding (int4_gemm_sm80.cu, "Codes").
 *
 * Repacked layout (one host buffer, three 256-byte aligned sections)
 *   q      [n_pad/64][k_pad/16][32 lanes][4 u32]: one 512-byte chunk per
 *          (64 columns, 16 k) holds, for mma lane l, exactly the 32 codes of
 *          its eight m16n8k16 B fragments in one 16-byte word (see
 *          int4_repack.c for the nibble order)
 *   scale  [n_pad/64][groups][64] fp16, columns permuted so lane l's eight
 *          scales are one 16-byte word
 *   zero   same shape as scale, fp16 integer zero points (absent when
 *          symmetric: the kernel uses 8)
 * Padding: n_pad is n rounded up to 256, k_pad is k rounded up to 128; padded
 * codes dequantize to 0 and padded activations are read as 0, so callers never
 * see the padding. */
#include "common/inf.h"
#include "kernels/cuda_device.h"
#include "kernels/int4_gemm_configs.h"
#include "kernels/q4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRN_INT4_GEMM_N_ALIGN 256
#define KRN_INT4_GEMM_K_ALIGN 128

/* Shape and section offsets of one repacked weight. Plain data; fill it with
 * krn_int4_gemm_layout_make(). */
struct krn_int4_gemm_layout {
    int32_t n, k;         /* logical output / input features */
    int32_t n_pad, k_pad; /* padded: multiples of 256 / 128 */
    int32_t group;        /* the canonical group size (kp for per-channel) */
    int32_t group_steps;  /* 16-wide k steps per scale group (k_pad/16: one group) */
    int32_t groups;       /* scale rows per 64-column tile */
    bool symmetric;       /* zero section absent; zero point 8 */
    size_t q_offset;      /* byte offsets into the repacked buffer */
    size_t scale_offset;
    size_t zero_offset; /* == bytes when symmetric */
    size_t bytes;       /* total size of the repacked buffer */
};

/* Compute the repacked layout of w (sizes, padding, offsets); no allocation.
 * Thread: any. Errors: INF_E_INVALID (NULL or inconsistent w: kp not a
 * multiple of group, n or k < 1), INF_E_UNSUPPORTED (group not 32, 64, 128,
 * 256 or kp; sizes whose repacked form would overflow). */
inf_status_t krn_int4_gemm_layout_make(const struct krn_q4_weight *w,
                                       struct krn_int4_gemm_layout *lay, struct inf_err *err);

/* Repack w into dst (host memory, dst_bytes >= lay->bytes, lay from
 * krn_int4_gemm_layout_make(w)). The caller keeps ownership of both and uploads dst
 * to the device as is. Thread: any (w and dst not shared with a writer).
 * Errors: INF_E_INVALID (NULL, dst too small, lay not w's), INF_E_UNSUPPORTED
 * (a zero point that is not an integer in [0, 15], or not 8 when symmetric). */
inf_status_t krn_int4_gemm_repack(const struct krn_q4_weight *w,
                                  const struct krn_int4_gemm_layout *lay, void *dst,
                                  size_t dst_bytes, struct inf_err *err);

/* Rows of src [gate; up] (n = 2 dim, dim a multiple of 8) into dst in the
 * order KRN_INT4_GEMM_GLU reads: for each run of eight outputs j, gate rows
 * j..j+7 then up rows j..j+7 (codes, scales and zeros move with their row).
 * dst must have src's shape (n, k, kp, group, symmetric) and its own
 * buffers. Errors: INF_E_INVALID (NULL, shapes differ, n not a multiple of
 * 16). Thread: any. */
inf_status_t krn_q4_glu_interleave(const struct krn_q4_weight *src, struct krn_q4_weight *dst,
                                   struct inf_err *err);

/* The bytes krn_int4_gemm_repack writes for the 64-column tiles [t0, t1)
 * only (0 <= t0 <= t1 <= lay->n_pad / 64): their codes, scales and zeros,
 * plus, in the call whose t1 is the last tile, the zero bytes between and
 * after the sections. Disjoint ranges that together cover every tile give
 * exactly krn_int4_gemm_repack's buffer, so they may run on several threads
 * at once. Checks as krn_int4_gemm_repack (zero points only of the rows in
 * the range) plus INF_E_INVALID for a range out of bounds.
 * Thread: any (ranges of one dst must not overlap). */
inf_status_t krn_int4_gemm_repack_tiles(const struct krn_q4_weight *w,
                                        const struct krn_int4_gemm_layout *lay, void *dst,
                                        size_t dst_bytes, int32_t t0, int32_t t1,
                                        struct inf_err *err);

/* Kernels: an mma.sync pipeline (sm_80 and newer), a Turing fallback, on
 * Hopper a wgmma kernel chosen by shape for M > 16, and (sm_80 and newer) a
 * one-round stream kernel for M <= 4 on weights one wave of its blocks
 * holds; their configurations are named in kernels/int4_gemm_configs.h. On
 * sm_90 launches use programmatic dependent launch: a GEMM may begin
 * streaming its weights while the previous kernel in the stream finishes; it
 * reads A and writes C and the workspace only after that kernel is done.
 *
 * Which kernel a launch runs is decided once per weight and device: the
 * plan (krn_int4_gemm_plan_make, made at load next to the layout) holds,
 * for each M bucket, the configuration the per-architecture table gives the
 * weight's shape on that device (kernels/int4_gemm_policy.c); a launch looks
 * its M up there and only checks its own operands (alignment, flags, bias),
 * with no device or occupancy query. */

/* Row counts the plan distinguishes: M <= 4, 8, 16, 32, 64, 128, and more. */
#define KRN_INT4_GEMM_M_BUCKETS 7

/* One M bucket of a plan: what an automatic launch of that many rows takes,
 * each entry a configuration (enum krn_int4_gemm_config) or -1. */
struct krn_int4_gemm_pick {
    int8_t stream[3]; /* the stream kernel first, by output: C, GLU, fixed-point words */
    int8_t wgmma;     /* the sm_90a kernel first */
    int8_t mma;       /* otherwise the sm_80 kernel (the sm_75 fallback below sm_80) */
};

/* The dispatch plan of one weight on one device. Plain data; fill it with
 * krn_int4_gemm_plan_make(), keep it with the weight's layout. */
struct krn_int4_gemm_plan {
    /* the layout it was made for (a launch checks its layout against it) */
    int32_t n, k, n_pad, k_pad, group_steps, groups;
    bool symmetric;
    int32_t cc;  /* the device's compute capability (10 major + minor) */
    int32_t sms; /* its SMs */
    bool wgmma;  /* the sm_90 table: sm_90a kernels on a Hopper GPU */
    bool pdl;    /* launches use programmatic dependent launch (sm_90 and newer) */
    bool tiny;   /* fewer than 256 tiles of 128 x 128: one arithmetic at every M */
    struct krn_int4_gemm_pick bucket[KRN_INT4_GEMM_M_BUCKETS];
    /* per configuration: blocks of its grid (persistent kernels: SMs x
     * resident blocks, at most its cap; others: the SMs); 0: it cannot run
     * on this device */
    int32_t slots[KRN_INT4_GEMM_CFG_COUNT];
};

/* Plan the launches of the weight of layout lay on device dev (from
 * krn_cuda_device_describe, or filled by a test). Plain C, no CUDA call.
 * Thread: any. Errors: INF_E_INVALID (NULL), INF_E_UNSUPPORTED (a layout
 * the kernels cannot run, a device below compute capability 7.5 or without
 * room for any configuration). */
inf_status_t krn_int4_gemm_plan_make(const struct krn_cuda_device *dev,
                                     const struct krn_int4_gemm_layout *lay,
                                     struct krn_int4_gemm_plan *plan, struct inf_err *err);

/* Launcher flags. */
#define KRN_INT4_GEMM_FORCE_SM75 0x1u /* use the sm_75 fallback whatever the GPU */
/* Spread the units over every resident block even where a grid of whole
 * split-K shares per tile (the default, see krn_int4_gemm) applies; for the
 * benchmark's comparison and the tests. */
#define KRN_INT4_GEMM_GRID_STRIPED 0x2u
/* Keep the tokens as the mma A operand at M <= 8 (the mma.sync kernel
 * otherwise swaps the operands there, see int4_gemm_sm80.cu); for the
 * benchmark's comparison and the tests. */
#define KRN_INT4_GEMM_NO_SWAP 0x4u

/* GLU output (the gate and up projections of a gated MLP as one weight):
 * the weight's columns come in runs of 16, eight gate columns then the
 * eight up columns of the same outputs (krn_q4_glu_interleave makes that
 * order from [gate; up]), n a multiple of 16; C is [m][n / 2] with
 * C[r][j] = SiLU(g) * u, g and u the fp16-rounded sums (+ bias, in the
 * weight's column order) of gate and up column j: bit for bit the plain
 * GEMM on [gate; up] followed by krn_cuda_silu_mul. C must be 4-byte
 * aligned. */
#define KRN_INT4_GEMM_GLU 0x20u

/* Fixed-point sums for the reader of C to finish (no bias, A rows
 * 16-byte aligned; 4-byte for the stream kernel): where the launch runs the
 * sm_80 kernel's 16-row tile (M <= 16 on Hopper) or the stream kernel on a
 * weight of at least 256 tiles of 128 x 128 (smaller ones give a row the
 * same bits at every M) with at most 64 blocks sharing an output, every block
 * adds its fp32 partial of each output into args->acc (int64 [m][n], row
 * stride n, all zero on entry) with an integer atomic, so the sums are
 * exact in any order, and the kernel ends there: no arrival, no last
 * arriver summing the others' partials (which cost about 2 us a launch on
 * the H200). C is then not written and
 * *args->acc_taken is 1; krn_int4_gemm_acc_reduce (which zeroes the words),
 * or a consumer reading them itself (krn_cuda_rmsnorm_add_acc, which leaves
 * them), gives C. Such a launch also zeroes args->acc_clear_words words at
 * args->acc_clear (another launch's, whose reader ran before this launch)
 * once the kernel before it is done: a stream of them can alternate two
 * word buffers and never spend a kernel of its own on zeroing. Elsewhere C
 * is written as usual, *acc_taken is 0 and neither buffer is touched. The
 * value is C's up to the fixed point's 2^-30 steps
 * (kernels/cuda/acc64.cuh), not bit for bit the plain launch's order of
 * fp32 additions. */
#define KRN_INT4_GEMM_ACC64 0x40u
/* With KRN_INT4_GEMM_GLU too, the words are the gate and up sums [m][n] in
 * the weight's column order (runs of 8 gate + 8 up columns), no C is
 * written when they are taken, and krn_int4_gemm_acc_reduce_glu gives the
 * GLU output from them: C[r][j] = SiLU(g) * u of the fp16-rounded sums,
 * as the GLU launch computes it from its own sums. */

/* One GEMM. All pointers but lay, plan and acc_taken are device pointers. */
struct krn_int4_gemm_args {
    const struct krn_int4_gemm_layout *lay; /* host memory: the weight's layout */
    const struct krn_int4_gemm_plan *plan;  /* host memory: its plan for the current device */
    const void *b;        /* the repacked weight buffer on the device, 16-byte aligned */
    const uint16_t *a;    /* [m][k] fp16 activations, 2-byte aligned */
    const uint16_t *bias; /* [n] fp16, or NULL */
    uint16_t *c;          /* [m][n] fp16 output, 2-byte aligned; must not alias a */
    int32_t m;            /* rows of A and C, >= 0 (0: nothing to do) */
    void *workspace;      /* krn_int4_gemm_workspace_size() bytes, zero-filled once
                             before its first use; every launch leaves it zeroed */
    size_t workspace_bytes;
    void *stream;       /* cudaStream_t to launch on (NULL: the default stream) */
    uint32_t flags;     /* KRN_INT4_GEMM_* */
    int32_t config;     /* KRN_INT4_GEMM_CFG_AUTO: the plan's choice; else a
                           configuration to force (enum krn_int4_gemm_config) */
    int64_t *acc;       /* KRN_INT4_GEMM_ACC64: [m][n] device words, zero, 8-byte aligned */
    int32_t *acc_taken; /* host memory or NULL: 1 when acc took the sums instead of C */
    int64_t *acc_clear; /* KRN_INT4_GEMM_ACC64: words zeroed when acc is taken, or NULL */
    int64_t acc_clear_words;
};

/* Bytes of workspace a launch with m <= max_m rows of the weight of plan
 * needs (any configuration its device runs). Plain C. Thread: any. Returns
 * 0 for a NULL plan or max_m < 1. */
size_t krn_int4_gemm_workspace_size(const struct krn_int4_gemm_plan *plan, int32_t max_m);

/* Enqueue C = A * dequant(W)^T (+ bias) on args->stream, with the
 * configuration args->plan gives for args->m (or the forced one). Never
 * allocates nor synchronizes nor queries the device; safe to capture in a
 * CUDA graph. The plan's device must be the current one and have been
 * described (krn_cuda_device_describe prepares the kernels). Workspace may
 * not be shared by two launches in flight at once.
 * Thread: the thread owning the current device's stream.
 * Errors: INF_E_INVALID (NULL pointers, m < 0, workspace too small, a plan
 * made for another layout), INF_E_UNSUPPORTED (misaligned pointers, a layout
 * this build cannot run, a configuration out of range or without room on
 * the device, no GLU variant for the operands, m too large), INF_E_DEVICE
 * (a CUDA error, including one left sticky by earlier work). */
inf_status_t krn_int4_gemm(const struct krn_int4_gemm_args *args, struct inf_err *err);

/* C [m][n] (row stride ldc, 2-byte aligned) from the fixed-point sums of a
 * KRN_INT4_GEMM_ACC64 launch that took them (acc [m][n]), which are zeroed
 * for the next one. Enqueued on stream; safe to capture. Errors:
 * INF_E_INVALID (NULL, m or n < 1, ldc < n), INF_E_DEVICE. */
inf_status_t krn_int4_gemm_acc_reduce(int64_t *acc, uint16_t *c, int64_t ldc, int32_t m, int32_t n,
                                      void *stream, struct inf_err *err);

/* The GLU output C [m][n / 2] (row stride ldc, even; C 4-byte aligned) from
 * the fixed-point sums of a KRN_INT4_GEMM_GLU | KRN_INT4_GEMM_ACC64 launch
 * that took them (acc [m][n], n the weight's columns, a multiple of 16,
 * 16-byte aligned), which are zeroed. Enqueued on stream; safe to capture.
 * Errors: INF_E_INVALID (NULL, m < 1, n, ldc or alignment), INF_E_DEVICE. */
inf_status_t krn_int4_gemm_acc_reduce_glu(int64_t *acc, uint16_t *c, int64_t ldc, int32_t m,
                                          int32_t n, void *stream, struct inf_err *err);

/* Write the weight of lay (repacked buffer b on the device) dequantized to
 * fp16 into w [n][ldw] on the device (row n, column k: fp16((code - zero) *
 * scale), the CPU reference's value bit for bit; columns >= k untouched).
 * For a cuBLAS fp16 GEMM when M is large. Enqueued on stream (cudaStream_t),
 * never allocates or synchronizes. Thread: the owner of stream.
 * Errors: INF_E_INVALID (NULL), INF_E_UNSUPPORTED (layout, ldw < k,
 * alignment), INF_E_DEVICE (launch). */
inf_status_t krn_int4_dequant_f16(const struct krn_int4_gemm_layout *lay, const void *b,
                                  uint16_t *w, int64_t ldw, void *stream, struct inf_err *err);

/* Number of configurations (KRN_INT4_GEMM_CFG_COUNT), the name of each
 * ("sm80 m16 n128 k128 w4 s4", NULL out of range) and the configuration of a
 * name (-1 if none). A build without sm_90 keeps the sm_90a names; forcing
 * one there takes the automatic sm_80 choice. Thread: any. */
int krn_int4_gemm_config_count(void);
const char *krn_int4_gemm_config_name(int config);
int krn_int4_gemm_config_find(const char *name);

#ifdef __cplusplus
}
#endif
