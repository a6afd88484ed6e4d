/*
 * device.cu — krn_cuda_device_describe (kernels/cuda_device.h): the device
 *          attributes the launch policies read, queried once, and each INT4
 *          GEMM family prepared on the device (shared-memory limits raised,
 *          residency measured) so that no launch queries anything.
 */
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda_device.h"

#include <cuda_runtime.h>
#include <string.h>

namespace
{

/* A kernel that does nothing: its attributes tell which code of this build
 * the device loaded. */
__global__ void probe_kernel() {}

/* Per device: the kernels set (krn_cuda_kernels_set) and the compute
 * capability they are chosen for (0: not asked yet). Racing writers store
 * the same value. */
constexpr int kMaxDevices = 64;
int g_kernels[kMaxDevices];
int g_cc[kMaxDevices];

int kernels_cc(int dev)
{
    if (dev < 0 || dev >= kMaxDevices)
        return 0;
    if (g_cc[dev])
        return g_cc[dev];
    int major = 0, minor = 0, prev = 0;
    cudaFuncAttributes fa = {};
    if (cudaGetDevice(&prev) != cudaSuccess)
        return 0;
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, probe_kernel);
    (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int cc = major * 10 + minor;
    if (fa.ptxVersion > 0 && fa.ptxVersion < cc)
        cc = fa.ptxVersion;
    if (g_kernels[dev] == KRN_CUDA_KERNELS_SM75 && cc > 75)
        cc = 75;
    g_cc[dev] = cc;
    return cc;
}

} // namespace

int krncuda::arch()
{
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess ? kernels_cc(dev) : 0;
}

namespace
{

/* One attribute of device dev into *v. */
static cudaError_t attr(int *v, cudaDeviceAttr a, int dev)
{
    return cudaDeviceGetAttribute(v, a, dev);
}

static cudaError_t describe(int dev, struct krn_cuda_device *d)
{
    int major = 0, minor = 0, sms = 0, smem_block = 0, smem_sm = 0, l2 = 0;
    cudaError_t e = attr(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess)
        e = attr(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e == cudaSuccess)
        e = attr(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = attr(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess)
        e = attr(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (e == cudaSuccess)
        e = attr(&l2, cudaDevAttrL2CacheSize, dev);
    if (e != cudaSuccess)
        return e;
    d->ordinal = dev;
    d->cc = kernels_cc(dev);
    if (!d->cc)
        return cudaErrorUnknown;
    d->sms = sms;
    d->smem_per_block = smem_block;
    d->smem_per_sm = smem_sm;
    d->l2_bytes = l2;
#ifdef INT4SERVE_GEMM_SM90
    d->sm90a = major == 9 && d->cc / 10 == 9;
#endif
    /* the mma.sync and stream kernels are built for sm_80 and newer; below
     * that only the fallback runs, which needs no preparing */
    if (d->cc >= 80) {
        e = int4gemm::sm80_prepare(d);
        if (e == cudaSuccess)
            e = int4gemm::stream_prepare(d);
    }
#ifdef INT4SERVE_GEMM_SM90
    if (e == cudaSuccess && d->sm90a)
        e = int4gemm::sm90_prepare(d);
#endif
    return e;
}

} // namespace

extern "C" inf_status_t krn_cuda_kernels_set(int32_t ordinal, enum krn_cuda_kernels k,
                                             struct inf_err *err)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
    }
    if (ordinal < 0 || ordinal >= count || ordinal >= kMaxDevices)
        return inf_err_set(err, INF_E_INVALID, "cuda device %d out of range (%d devices)",
                           (int)ordinal, count);
    if (k != KRN_CUDA_KERNELS_AUTO && k != KRN_CUDA_KERNELS_SM75)
        return inf_err_set(err, INF_E_INVALID, "cuda kernels: unknown set %d", (int)k);
    g_kernels[ordinal] = k;
    g_cc[ordinal] = 0; /* asked again with the new cap */
    return INF_OK;
}

extern "C" int32_t krn_cuda_kernels_cc(int32_t ordinal)
{
    return kernels_cc(ordinal);
}

extern "C" inf_status_t krn_cuda_device_describe(int32_t ordinal, struct krn_cuda_device *d,
                                                 struct inf_err *err)
{
    if (!d)
        return inf_err_set(err, INF_E_INVALID, "cuda device: NULL description");
    memset(d, 0, sizeof *d);
    int count = 0, prev = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && (ordinal < 0 || ordinal >= count))
        return inf_err_set(err, INF_E_INVALID, "cuda device %d out of range (%d devices)",
                           (int)ordinal, count);
    if (e == cudaSuccess)
        e = cudaGetDevice(&prev);
    if (e == cudaSuccess)
        e = cudaSetDevice(ordinal);
    if (e == cudaSuccess) {
        e = describe(ordinal, d);
        const cudaError_t r = cudaSetDevice(prev);
        if (e == cudaSuccess)
            e = r;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch's check */
        return inf_err_set(err, INF_E_DEVICE, "cuda device %d: %s", (int)ordinal,
                           cudaGetErrorString(e));
    }
    return INF_OK;
}
