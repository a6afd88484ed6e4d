/* engine/tp/nccl.c — the NCCL communicator: one ncclComm_t a rank, all made
 * in this process, over a local group that gives the ranks their barrier
 * and their abort. */
#define INF_LOG_MODULE "eng"
#include "engine/tp/comm_impl.h"

#include <stdlib.h>

#if defined(INT4SERVE_HAVE_CUDA) && defined(INT4SERVE_HAVE_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

static void nccl_fini(struct eng_comm *c)
{
    if (c->nccl)
        (void)ncclCommDestroy((ncclComm_t)c->nccl);
    c->nccl = NULL;
}

static void nccl_abort(struct eng_comm *c)
{
    if (c->nccl)
        (void)ncclCommAbort((ncclComm_t)c->nccl);
    c->nccl = NULL;
}

inf_status_t eng_comm_nccl_create(int32_t size, const int32_t *devices, eng_comm_t **ranks,
                                  struct inf_err *err)
{
    if (size < 1 || size > 64)
        return inf_err_set(err, INF_E_INVALID, "an NCCL group of %d ranks", size);
    /* NVLink multicast (NVLS) stays off: shared machines can be taken out
     * of service by it, and the small messages of a decode step do not
     * need it. */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclComm_t comms[64];
    int devs[64];
    for (int32_t r = 0; r < size; r++)
        devs[r] = devices[r];
    ncclResult_t nr = ncclCommInitAll(comms, size, devs);
    if (nr != ncclSuccess)
        return inf_err_set(err, INF_E_DEVICE, "NCCL between devices %d..%d (%d ranks): %s",
                           devices[0], devices[size - 1], size, ncclGetErrorString(nr));
    inf_status_t st = eng_comm_local_create(size, 0, ranks, err);
    if (st != INF_OK) {
        for (int32_t r = 0; r < size; r++)
            (void)ncclCommDestroy(comms[r]);
        return st;
    }
    for (int32_t r = 0; r < size; r++) {
        ranks[r]->nccl = comms[r];
        ranks[r]->device = devices[r];
        ranks[r]->fini = nccl_fini;
        ranks[r]->abort = nccl_abort;
    }
    return INF_OK;
}

bool eng_comm_on_device(const eng_comm_t *c)
{
    return c && c->nccl != NULL;
}

inf_status_t eng_comm_all_reduce_f16_dev(eng_comm_t *c, void *x, size_t n, void *stream,
                                         struct inf_err *err)
{
    if (eng_comm_aborted(c) || !c->nccl)
        return inf_err_set(err, INF_E_INTERNAL, "the tensor-parallel group was aborted");
    ncclComm_t comm = (ncclComm_t)c->nccl;
    ncclResult_t nr = ncclAllReduce(x, x, n, ncclHalf, ncclSum, comm, (cudaStream_t)stream);
    ncclResult_t async = ncclSuccess;
    if (nr == ncclSuccess)
        (void)ncclCommGetAsyncError(comm, &async);
    if (nr != ncclSuccess || async != ncclSuccess)
        return inf_err_set(err, INF_E_DEVICE, "NCCL all-reduce on device %d (rank %d): %s",
                           c->device, c->rank, ncclGetErrorString(nr != ncclSuccess ? nr : async));
    return INF_OK;
}

#else

inf_status_t eng_comm_nccl_create(int32_t size, const int32_t *devices, eng_comm_t **ranks,
                                  struct inf_err *err)
{
    (void)size;
    (void)devices;
    (void)ranks;
    return inf_err_set(err, INF_E_UNSUPPORTED, "this build has no NCCL");
}

bool eng_comm_on_device(const eng_comm_t *c)
{
    (void)c;
    return false;
}

inf_status_t eng_comm_all_reduce_f16_dev(eng_comm_t *c, void *x, size_t n, void *stream,
                                         struct inf_err *err)
{
    (void)c;
    (void)x;
    (void)n;
    (void)stream;
    return inf_err_set(err, INF_E_UNSUPPORTED, "this build has no NCCL");
}

#endif
