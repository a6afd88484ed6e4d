#pragma once
/* kernels/cuda/launch.cuh — helpers shared by the CUDA launchers: the checked
 * end of a launch, programmatic dependent launch (launch_ex with the INT4
 * GEMM plan's choice, launch_pdl with pdl_supported() deciding) and 16-byte
 * fp16 vector access. */
#include "common/inf.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace krncuda
{

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

/* Programmatic dependent launch (sm_90 and newer). A kernel launched with
 * launch_pdl may begin while the kernel before it on the stream is still
 * running; it must call pdl_wait() before its first global memory access
 * (a read of the predecessor's output or a write the predecessor might
 * read), which returns once the predecessor has finished and its writes are
 * visible. pdl_trigger() lets the next PDL-launched kernel begin early; it
 * never relaxes that kernel's own pdl_wait(). Both are no-ops on older
 * devices and for kernels launched without the attribute, so a kernel that
 * calls them is correct however it is launched (graph capture included). */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The row kernels between the INT4 GEMMs (norms, RoPE, attention, SiLU·mul)
 * begin with pdl_enter(pdl_early(rows)). Early: they let the next kernel
 * launch before their own wait, so the GEMM after them launches while the
 * GEMM before them drains and loads its first weight stages there (its own
 * wait still covers the row kernel, which finishes after the GEMM before
 * it). Otherwise only after the wait. bench_gemm --between on the H200, the
 * four Llama-2 GEMMs each behind a row kernel: early is faster up to M = 64
 * (M = 1: 57.7 -> 48.8 us, M = 64: 92.9 -> 91.7) and slower at M = 128
 * (132.1 -> 136.8). */
constexpr int32_t kPdlEarlyRows = 64;

__host__ __device__ __forceinline__ bool pdl_early(int64_t rows)
{
    return rows <= kPdlEarlyRows;
}

/* pdl_enter in two halves, for a kernel that has work needing nothing from
 * the kernel before (constants, data uploaded before the step) to do between
 * them. */
__device__ __forceinline__ void pdl_enter_start(bool early)
{
    if (early)
        pdl_trigger();
}

__device__ __forceinline__ void pdl_enter_wait(bool early)
{
    pdl_wait();
    if (!early)
        pdl_trigger();
}

__device__ __forceinline__ void pdl_enter(bool early)
{
    pdl_enter_start(early);
    pdl_enter_wait(early);
}

/* Launch kernel<<<grid, block, smem, stream>>>(args...), with the
 * programmatic stream serialization attribute when pdl. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_ex(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                    size_t smem, cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

/* The compute capability the current device's kernels are chosen for
 * (krn_cuda_kernels_cc, kernels/cuda_device.h: the sm_75 paths below 80);
 * cached per device, 0 when it cannot be asked. */
int arch();

/* The current device runs the sm_75 paths. A device that cannot be asked
 * (none: the launch policies' tests on a machine without a GPU) counts as
 * the newer kind, whose policies those tests check. */
static inline bool sm75_paths()
{
    const int a = arch();
    return a > 0 && a < 80;
}

/* Programmatic dependent launch where the current device's kernels have it
 * (compute capability 9.0 and newer): the measured default of every launch
 * between the INT4 GEMMs. */
static inline bool pdl_supported()
{
    return arch() >= 90;
}

template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, Args... args)
{
    return launch_ex(pdl_supported(), kernel, grid, block, smem, stream, args...);
}

/* D += A B for one m16n8k8 tile, fp16 in, fp32 accumulate (mma.sync, sm_75+). */
__device__ __forceinline__ void mma1688(float *d, uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, "
                 "{%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

/* D += A B for one m16n8k16 tile, fp16 in, fp32 accumulate (mma.sync, sm_80+). */
__device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap(); /* m16n8k16 needs sm_80: the sm_75 paths take mma_k16<true> */
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* One m16n8k16 tile: on the sm_75 paths (T75) as two m16n8k8 halves of k,
 * whose fragments are the k16 fragment's halves (A registers 0-1 and 2-3, B
 * register 0 and 1), so the callers' fragments are the same for both. */
template <bool T75>
__device__ __forceinline__ void mma_k16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    if (T75) {
        mma1688(d, a[0], a[1], b0);
        mma1688(d, a[2], a[3], b1);
    } else {
        mma16816(d, a, b0, b1);
    }
}

/* Arrival on a split-K (or split-attention) counter: one thread, after a
 * block barrier that follows every thread's partial stores. acq_rel at gpu
 * scope: the release covers the block's stores (cumulative through the
 * barrier), the acquire lets the last arriver read the others' partials
 * after the next barrier. Replaces a __threadfence() in every thread.
 * Returns the count before this arrival. */
__device__ __forceinline__ int arrive_acq_rel(int *counter)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                 : "=r"(old)
                 : "l"(counter)
                 : "memory");
    return old;
}

/* SiLU(g) * u in fp32 with the precise expf, the arithmetic of every
 * SiLU·mul (krn_cuda_silu_mul, the INT4 GEMM's GLU output). */
__device__ __forceinline__ float silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* 16 bytes read once (weights streamed past L1: not kept there); the data
 * must not change during the kernel (ld.global.nc). */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi)
{
    __half2 h = __halves2half2(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
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
