#pragma once
/* kernels/cuda/launch.cuh — helpers shared by the CUDA launchers (not the INT4
 * GEMM): the checked end of a launch and 16-byte fp16 vector access. */
#include "common/inf.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace krncuda {

/* The checked end of every launcher: a launch error (bad configuration, or a
 * sticky error left by earlier work) becomes INF_E_DEVICE naming the op. */
static inline inf_status_t launched(const char *op, struct inf_err *err)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "%s: %s", op, cudaGetErrorString(e));
    return INF_OK;
}

/* Grid size for a grid-stride loop over n elements (n > 0). */
static inline unsigned grid_for(int64_t n, int threads)
{
    int64_t g = (n + threads - 1) / threads;
    return (unsigned)(g > 65535 * 8 ? 65535 * 8 : g);
}

__device__ __forceinline__ void unpack8(uint4 v, float *f)
{
    const __half2 *h = reinterpret_cast<const __half2 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

} // namespace krncuda
