#include "kernels/krn.h"

bool krn_have_cuda(void)
{
#ifdef INT4SERVE_HAVE_CUDA
    return true;
#else
    return false;
#endif
}
