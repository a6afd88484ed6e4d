#pragma once
/* kernels/int4_gemm_policy.h — the INT4 GEMM's dispatch policy as plain C,
 * shared by its launcher (kernels/cuda/int4_gemm.cu) and the tests that
 * check it on the CPU. krn_int4_gemm_plan_make (kernels/int4_gemm.h) makes
 * a weight's plan from the per-architecture tables; krn_int4_gemm_choose
 * turns the plan and one launch's operands into exactly what is launched.
 * Not for the engine: it calls krn_int4_gemm, which does both. */
#include "common/inf.h"
#include "kernels/int4_gemm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace: a fixed region of arrival counters (one per possible shared
 * tile: two per block of at most KRN_INT4_GEMM_MAX_GRID; the stream
 * kernel's, one per 64-column chunk, are the same zeroed ints), then the
 * stream kernel's fixed-point words (m x n_pad int64, zero at rest), then
 * the persistent kernels' fp32 partial tiles. Fixed, so that no launch's
 * partials land where another configuration or M keeps its counters or
 * words. */
#define KRN_INT4_GEMM_MAX_GRID 2048
#define KRN_INT4_GEMM_COUNTER_BYTES ((size_t)2 * KRN_INT4_GEMM_MAX_GRID * sizeof(int32_t))
#define KRN_INT4_GEMM_STREAM_WORD_BYTES ((size_t)1 << 21)
#define KRN_INT4_GEMM_FIXED_BYTES (KRN_INT4_GEMM_COUNTER_BYTES + KRN_INT4_GEMM_STREAM_WORD_BYTES)
/* The stream kernel's tokens are one n8 mma fragment. */
#define KRN_INT4_GEMM_STREAM_MAX_M 8
/* Contributions one fixed-point word may sum (kernels/cuda/acc64.cuh). */
#define KRN_INT4_GEMM_ACC64_MAX_PARTS 64

enum krn_int4_gemm_family {
    KRN_INT4_GEMM_FAMILY_SM80,   /* mma.sync pipeline, persistent */
    KRN_INT4_GEMM_FAMILY_SM75,   /* Turing fallback */
    KRN_INT4_GEMM_FAMILY_SM90,   /* wgmma, persistent */
    KRN_INT4_GEMM_FAMILY_STREAM, /* one round of loads a block */
};

/* Output of a launch: C, the GLU output, or the caller's fixed-point words. */
enum krn_int4_gemm_out {
    KRN_INT4_GEMM_OUT_C = 0,
    KRN_INT4_GEMM_OUT_GLU = 1,
    KRN_INT4_GEMM_OUT_WORDS = 2,
};

/* The geometry of one configuration (kernels/int4_gemm_configs.h). */
struct krn_int4_gemm_config_info {
    const char *name;
    enum krn_int4_gemm_family family;
    int32_t bm;    /* rows (tokens) of a tile: 16 for sm_75 and stream */
    int32_t bn;    /* columns of a tile: 64 for sm_75 and stream */
    int32_t bk;    /* k of a tile; stream: k of a block (128 warps) */
    int32_t bps;   /* at most this many blocks per SM (persistent families) */
    int32_t warps; /* stream: warps a block */
    bool glu;      /* sm_80: GLU variants compiled */
    bool acc;      /* sm_80: fixed-point (ACC64) variants compiled */
};

/* Geometry of configuration cfg, or NULL out of range. Thread: any. */
const struct krn_int4_gemm_config_info *krn_int4_gemm_config_info(int32_t cfg);

/* One launch's operands, as far as the choice depends on them. */
struct krn_int4_gemm_call {
    int32_t m;
    uint32_t flags; /* KRN_INT4_GEMM_* */
    int32_t config; /* KRN_INT4_GEMM_CFG_AUTO or a configuration to force */
    bool bias;      /* a bias is added */
    bool a_rows16;  /* k % 8 == 0 and A 16-byte aligned: cp.async rows */
    bool a4;        /* A 4-byte aligned: activation pairs */
    size_t workspace_bytes;
};

/* What krn_int4_gemm launches. */
struct krn_int4_gemm_choice {
    int32_t config; /* enum krn_int4_gemm_config */
    enum krn_int4_gemm_family family;
    enum krn_int4_gemm_out out;
    bool swapped;                      /* sm_80: weights as the mma A operand, tokens as B */
    bool words;                        /* the sums go to args->acc (*acc_taken = 1) */
    int32_t m_tiles, n_tiles, k_tiles; /* stream: k_tiles is the blocks along k */
    int32_t units;                     /* persistent: m_tiles n_tiles k_tiles */
    int32_t slot_rows;                 /* persistent: rows of a partial tile */
    int32_t grid;                      /* blocks (sm_75: n_tiles x m_tiles) */
    size_t workspace_need;             /* bytes of workspace the launch uses */
};

/* The launch of call on a weight planned as plan: the first family the
 * operands allow, in the order stream, sm_90a, sm_80 (sm_75 below sm_80 or
 * when forced); a forced configuration the operands or the device do not
 * allow falls to the plan's sm_80 choice, as the automatic choice does.
 * Plain arithmetic, no CUDA call. Thread: any.
 * Errors: INF_E_INVALID (NULL, m < 1, workspace too small),
 * INF_E_UNSUPPORTED (a configuration out of range or that cannot run here,
 * no GLU variant for the operands, sizes past the kernels' limits). */
inf_status_t krn_int4_gemm_choose(const struct krn_int4_gemm_plan *plan,
                                  const struct krn_int4_gemm_call *call,
                                  struct krn_int4_gemm_choice *ch, struct inf_err *err);

/* Whether the kernels can run a weight of layout l (padding, group shape,
 * section alignment). Thread: any. */
bool krn_int4_gemm_layout_ok(const struct krn_int4_gemm_layout *l);

/* The M bucket of m rows (index into plan->bucket). Thread: any. */
int32_t krn_int4_gemm_bucket_of(int32_t m);

#ifdef __cplusplus
}
#endif
