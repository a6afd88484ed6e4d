#pragma once
/* engine/tp/comm.h — engine-internal: the communicator of a tensor-parallel
 * group, one handle per rank.
 *
 * The ranks of a group run the same step at once, each on its own thread
 * and backend; a collective is called by every rank of the group with the
 * same arguments (its own buffer) and returns on each once all have
 * contributed. Sums are taken in rank order, so every rank gets the same
 * bits, and the same bits at every run.
 *
 * Implementations:
 *   local  ranks that share host memory (threads of this process): the CPU
 *          backend's collectives, and the tests of the sharded model on one
 *          machine. Buffers are host memory.
 * Thread: each handle is used by its rank's thread only; the ranks' threads
 * meet inside the collectives. */
#include "common/inf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct eng_comm eng_comm_t;

/* A group of size ranks sharing host memory; ranks[r] is rank r's handle.
 * max_floats: room taken now for collectives of that many elements (a
 * rank's room grows when a larger one comes). Errors: INF_E_INVALID (size
 * < 1), INF_E_NOMEM. On error no handle is made. */
inf_status_t eng_comm_local_create(int32_t size, size_t max_floats, eng_comm_t **ranks,
                                   struct inf_err *err);

/* Release rank c's handle; the group is freed with its last handle. NULL is
 * a no-op. No collective may be in flight on the group. */
void eng_comm_destroy(eng_comm_t *c);

int32_t eng_comm_rank(const eng_comm_t *c);
int32_t eng_comm_size(const eng_comm_t *c);

/* x[r][j] summed over the group for rows r < m of cols floats at row stride
 * ld (host memory), in place, on every rank. Every rank must call it with
 * the same m and cols. Errors: INF_E_NOMEM (no room for the rows: the
 * caller aborts the group), INF_E_INTERNAL (the group was aborted). */
inf_status_t eng_comm_all_reduce_f32(eng_comm_t *c, float *x, int64_t ld, int32_t m, int32_t cols,
                                     struct inf_err *err);

/* Wait until every rank of the group reached this call (or the group was
 * aborted). */
void eng_comm_barrier(eng_comm_t *c);

/* Abort the group: every collective in flight or to come returns
 * INF_E_INTERNAL on every rank, so that a rank that failed leaves no other
 * waiting (a device group's collectives are aborted too). Thread: any. */
void eng_comm_abort(eng_comm_t *c);
bool eng_comm_aborted(const eng_comm_t *c);

/* ---- NCCL (engine/tp/nccl.c; builds with NCCL) --------------------------------
 * A group over the GPUs devices[0..size), one NCCL communicator a rank
 * made in this process (ncclCommInitAll), never with NVLink multicast
 * (NCCL_NVLS_ENABLE=0). Errors: INF_E_UNSUPPORTED (a build without NCCL),
 * INF_E_DEVICE naming the devices and NCCL's message. */
inf_status_t eng_comm_nccl_create(int32_t size, const int32_t *devices, eng_comm_t **ranks,
                                  struct inf_err *err);
/* True for a group whose collectives run on the devices (NCCL). */
bool eng_comm_on_device(const eng_comm_t *c);
/* x [n] fp16 on the rank's device summed over the group in place, queued on
 * stream (capturable in a CUDA graph). Errors: INF_E_DEVICE (NCCL's
 * message), INF_E_INTERNAL (the group was aborted). */
inf_status_t eng_comm_all_reduce_f16_dev(eng_comm_t *c, void *x, size_t n, void *stream,
                                         struct inf_err *err);

#ifdef __cplusplus
}
#endif
