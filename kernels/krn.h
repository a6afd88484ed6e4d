#pragma once
/* kernels — public header. Compute kernels behind C launchers; each operation
 * family has its own launcher header (kernels/<op>.h) included from here. */
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* True when this build compiled the CUDA kernels (it says nothing about
 * whether a GPU is present at run time). Thread: any. */
bool krn_have_cuda(void);

#ifdef __cplusplus
}
#endif
