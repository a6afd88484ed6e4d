#pragma once
/* kernels/cuda_device.h — what the kernels' launch policies know of a GPU:
 * one struct, filled once per device by krn_cuda_device_describe() when a
 * backend is created, then read by plain C (krn_int4_gemm_plan_make) with no
 * CUDA call. Tests on the CPU fill it by hand to check a policy against a
 * device they do not have. */
#include "common/inf.h"
#include "kernels/int4_gemm_configs.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Resident blocks per SM of each INT4 GEMM kernel on the device, as the
 * occupancy calculator gives them for the compiled code (register use is
 * known only from it); 0: the kernel cannot run there (its shared memory
 * exceeds the device's). */
struct krn_int4_gemm_residency {
    /* per configuration: every variant of one has the same shared memory,
     * and its launch bounds leave registers for its BPS blocks */
    uint8_t sm80[KRN_INT4_GEMM_SM80_COUNT];
    /* per configuration and scale-group run (2, 4, 8 k16 steps); the GLU
     * variant has the same resources */
    uint8_t sm90[KRN_INT4_GEMM_SM90_COUNT][3];
    /* per variant, scale groups a warp's 8 k16 steps span (1: groups of
     * 128 k or more, 2: 64, 4: 32), zero points (0: symmetric), output (C,
     * GLU, fixed-point words) */
    uint8_t stream[KRN_INT4_GEMM_STREAM_COUNT][3][2][3];
};

struct krn_cuda_device {
    int32_t ordinal;        /* CUDA device index */
    int32_t cc;             /* krn_cuda_kernels_cc: 75, 80, 86, 89, 90 */
    int32_t sms;            /* streaming multiprocessors */
    int32_t smem_per_block; /* bytes of shared memory a block may opt in to */
    int32_t smem_per_sm;    /* bytes of shared memory an SM has */
    int64_t l2_bytes;
    bool sm90a; /* the build has the sm_90a kernels (wgmma) and the device runs them */
    struct krn_int4_gemm_residency int4_gemm;
};

/* Which kernels run on a device. Every launcher on the device follows this
 * setting, process-wide: AUTO those built for its compute capability; SM75
 * the sm_75 paths (mma.sync m16n8k8, no cp.async, no PDL, the INT4 GEMM's
 * Turing kernel: what a T4 runs) whatever the GPU, for testing and to bound
 * a T4's speed from a newer GPU. */
enum krn_cuda_kernels { KRN_CUDA_KERNELS_AUTO = 0, KRN_CUDA_KERNELS_SM75 = 1 };

/* Set the kernels of device `ordinal` (before any launch on it; a backend
 * does so when it is created). Errors: INF_E_INVALID (ordinal or value),
 * INF_E_UNSUPPORTED (no CUDA in this build). */
inf_status_t krn_cuda_kernels_set(int32_t ordinal, enum krn_cuda_kernels k, struct inf_err *err);

/* The compute capability (10 major + minor) the kernels of device `ordinal`
 * are chosen for: the device's, capped by KRN_CUDA_KERNELS_SM75 at 75 and by
 * the newest code this build has for it (the PTX architecture the loaded
 * code came from: a build of compute_75 alone runs the sm_75 paths on any
 * newer GPU, JIT-compiled by the driver). 0 when it cannot be asked. */
int32_t krn_cuda_kernels_cc(int32_t ordinal);

/* Fill *d for CUDA device `ordinal` and prepare the INT4 GEMM's kernels on
 * it: raise each kernel's shared-memory limit to what it uses (every launch
 * relies on that) and measure its residency. Call once per device, before
 * any INT4 GEMM launch on it; the current device is restored before it
 * returns. Thread: any (the CUDA runtime may be in use by others).
 * Errors: INF_E_INVALID (NULL d, ordinal out of range), INF_E_UNSUPPORTED
 * (a build without CUDA), INF_E_DEVICE (a CUDA error). */
inf_status_t krn_cuda_device_describe(int32_t ordinal, struct krn_cuda_device *d,
                                      struct inf_err *err);

#ifdef __cplusplus
}
#endif
