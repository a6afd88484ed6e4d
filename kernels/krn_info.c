#include "kernels/cuda_device.h"
#include "kernels/krn.h"

bool krn_have_cuda(void)
{
#ifdef INT4SERVE_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

#ifndef INT4SERVE_HAVE_CUDA
inf_status_t krn_cuda_device_describe(int32_t ordinal, struct krn_cuda_device *d,
                                      struct inf_err *err)
{
    (void)ordinal;
    (void)d;
    return inf_err_set(err, INF_E_UNSUPPORTED, "cuda device: this build has no CUDA");
}

inf_status_t krn_cuda_kernels_set(int32_t ordinal, enum krn_cuda_kernels k, struct inf_err *err)
{
    (void)ordinal;
    (void)k;
    return inf_err_set(err, INF_E_UNSUPPORTED, "cuda device: this build has no CUDA");
}

int32_t krn_cuda_kernels_cc(int32_t ordinal)
{
    (void)ordinal;
    return 0;
}
#endif
