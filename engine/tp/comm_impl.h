#pragma once
/* engine/tp/comm_impl.h — internals of the communicators (engine/tp/comm.c,
 * the local kind, and engine/tp/nccl.c, which adds NCCL to a local group
 * for its barrier and its abort). */
#include "engine/tp/comm.h"

#include <stdbool.h>

struct group; /* comm.c: the ranks' shared host state */

struct eng_comm {
    struct group *g;
    int32_t rank;
    void *nccl; /* ncclComm_t of the rank (engine/tp/nccl.c), or NULL */
    int32_t device;
    void (*fini)(struct eng_comm *c);  /* releases what nccl.c added */
    void (*abort)(struct eng_comm *c); /* ends its device collectives */
};
