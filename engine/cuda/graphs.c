/* engine/cuda/graphs.c — fixed-shape decode steps (struct cu_step) and
 * their recorded CUDA graphs, one a bucket: graph_prepare uploads the
 * step's tables with its attention work list in the bucket's fixed shape,
 * so that every replay of the bucket's graph reads and writes the same
 * buffers and only their contents change. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/cuda/cuda_impl.h"

static int graph_find(const struct cu_ctx *c, int32_t bucket)
{
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graph_key[i] == bucket)
            return i;
    return -1;
}

inf_status_t eng_cuda_graph_prepare(struct eng_backend *be, const struct eng_attn_params *p,
                                    int32_t bucket, const struct eng_upload *ups, int32_t n_ups,
                                    bool *have, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    c->step.active = false;
    /* the tables first (the list is built from their host copies), then the
     * list, all as one transfer */
    struct cu_upload_batch batch = {0};
    inf_status_t st = INF_OK;
    for (int32_t i = 0; i < n_ups && st == INF_OK; i++)
        st = eng_cuda_batch_upload(c, &batch, &ups[i], err);
    if (st == INF_OK)
        st = eng_cuda_attn_list(c, p, true, bucket, &batch, &c->step.lay, err);
    if (st == INF_OK)
        st = eng_cuda_batch_issue(c, &batch, err);
    if (st != INF_OK)
        return st;
    c->step.active = true;
    c->step.rows = bucket;
    *have = graph_find(c, bucket) >= 0;
    return INF_OK;
}

inf_status_t eng_cuda_graph_launch(struct eng_backend *be, int32_t bucket, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    int i = graph_find(c, bucket);
    if (i < 0)
        return inf_err_set(err, INF_E_INVALID, "no graph recorded for %d rows", bucket);
    CU(c, cudaGraphLaunch(c->graph_exec[i], c->stream), "cudaGraphLaunch");
    return INF_OK;
}

inf_status_t eng_cuda_graph_record(struct eng_backend *be, int32_t bucket, bool begin,
                                   struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    if (begin) {
        if (c->capturing || graph_find(c, bucket) >= 0 || c->n_graphs == GRAPH_MAX)
            return inf_err_set(err, INF_E_INVALID, "cannot record a graph for %d rows", bucket);
        /* Relaxed: the INT4 GEMM queries attributes and occupancy while
         * launching, which the stricter modes refuse during a capture. */
        CU(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed),
           "cudaStreamBeginCapture");
        c->capturing = true;
        return INF_OK;
    }
    if (!c->capturing)
        return inf_err_set(err, INF_E_INVALID, "no graph is being recorded");
    /* the step's last words are zeroed inside the graph: every replay
     * leaves both buffers zero, as it finds them */
    inf_status_t cs = eng_cuda_words_clean(c, err);
    if (cs != INF_OK)
        return cs;
    c->capturing = false;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    cudaGraphExec_t x = NULL;
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&x, g, 0);
    if (g)
        (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        /* Capture errors are not sticky: the context is still usable and
         * the caller runs the ops again. */
        const char *msg = cudaGetErrorString(e);
        (void)cudaGetLastError();
        cudaError_t sticky = cudaStreamQuery(c->stream);
        if (sticky != cudaSuccess && sticky != cudaErrorNotReady)
            return eng_cuda_fail(c, "graph recording", cudaGetErrorString(sticky), err);
        return inf_err_set(err, INF_E_UNSUPPORTED, "graph recording failed: %s", msg);
    }
    c->graph_key[c->n_graphs] = bucket;
    c->graph_exec[c->n_graphs++] = x;
    CU(c, cudaGraphLaunch(x, c->stream), "cudaGraphLaunch");
    return INF_OK;
}

void eng_cuda_graph_finish(struct eng_backend *be)
{
    struct cu_ctx *c = ctx_of(be);
    if (c->capturing) { /* a recording abandoned by an error */
        cudaGraph_t g = NULL;
        c->capturing = false;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g)
            (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
    }
    { /* the words an eager step left zeroed */
        struct inf_err e = {0};
        if (cudaSetDevice(c->device) == cudaSuccess)
            (void)eng_cuda_words_clean(c, &e);
    }
    c->step.active = false;
}

#endif
