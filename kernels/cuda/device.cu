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
    d->cc = major * 10 + minor;
    d->sms = sms;
    d->smem_per_block = smem_block;
    d->smem_per_sm = smem_sm;
    d->l2_bytes = l2;
#ifdef INT4SERVE_GEMM_SM90
    d->sm90a = major == 9;
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
