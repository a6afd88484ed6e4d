#pragma once
/* bench/common/graph_timer.cuh — what the CUDA benchmarks share: a checked
 * CUDA call (CK) and the median time of a launch replayed inside a graph. */
#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* Median per-launch microseconds of `replays` replays of a graph holding
 * `launches` launches that record(i) enqueues on stream (captured). */
template <typename F>
static double time_graph(cudaStream_t stream, int launches, int replays, F record)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < launches; i++)
        record(i);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream)); /* warm-up */
    CK(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < replays; r++) {
        CK(cudaEventRecord(e0, stream));
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return ms[ms.size() / 2] * 1000.0 / launches;
}
