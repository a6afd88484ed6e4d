#pragma once
/* kernels/sample_cuda.h — token sampling on the GPU, one row of fp32 logits
 * per sampled token, the same rules as the host sampler (engine/sched/sampler.h):
 *   1. the banned ids of the row are set to -inf (EOS before min_tokens);
 *      logprobs are the log-softmax of that row (raw: before bias and
 *      penalties), top-n by value, lowest id on ties;
 *   2. logit_bias added in list order; repetition_penalty on tokens of the
 *      prompt or output, frequency * count + presence subtracted for tokens
 *      of the output (fp32, each operation rounded as the host's);
 *   3. temperature 0: the largest value, lowest id on ties (-1 when every
 *      value is -inf). Otherwise value / temperature, the min_p cut
 *      (value >= max + log(min_p)); without top_k / top_p the draw walks
 *      the candidates in id order, with them the candidates sorted by value
 *      (descending, lowest id first on ties: a stable radix sort), cut to
 *      top_k and to the smallest prefix whose mass reaches top_p. The draw
 *      takes the first candidate whose cumulative weight exp(w - max)
 *      (double) exceeds u * total, u given per row (the host's generator
 *      makes it), the last candidate when rounding leaves none; -1 when no
 *      candidate is left.
 * Sums are parallel in double: they differ from the host's sequential sums
 * by rounding only, so a draw can differ only when u * total falls within
 * about 1e-15 relative of a boundary. A greedy row without bans, bias,
 * penalties or top-n computes its logprob's log-sum-exp with exp in fp32
 * (summed in double): about 1e-7 relative from the host's.
 * Device pointers; work queued on stream; nothing allocated (the caller
 * gives the workspace of krn_cuda_sample_workspace). Errors: INF_E_INVALID
 * (sizes, workspace too small), INF_E_DEVICE (launch failure). */
#include "common/inf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRN_SAMPLE_TOP 20

/* One sampled row, as the kernels read it (uploaded by the caller). */
struct krn_cuda_sample_row {
    double u;          /* uniform in [0, 1) for the draw (temperature > 0) */
    int32_t logit_row; /* row of logits */
    float temperature; /* 0: greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* 1: off */
    float log_min_p;   /* logf(min_p) as the host computes it; -inf: off */
    float rep, pres, freq;
    int32_t n_logprobs;       /* 0..KRN_SAMPLE_TOP */
    int32_t ban_off, n_ban;   /* ints[ban_off..): banned ids */
    int32_t bias_off, n_bias; /* ints[bias_off..) ids, vals[bias_off..) biases */
    int32_t hist_off, n_hist; /* ints[hist_off..): (token, output count, in prompt) triples */
    int32_t sort;             /* top_k or top_p is on (set by the caller) */
    int32_t pad;
};

/* What one row gives back. */
struct krn_cuda_sample_out {
    int32_t token; /* -1: every token excluded */
    float logprob; /* of token */
    int32_t n_top;
    int32_t top_ids[KRN_SAMPLE_TOP];
    float top_logprobs[KRN_SAMPLE_TOP];
};

/* Logits rows of a greedy launch (passed by value: nothing to upload), and
 * the largest vocabulary it takes. */
#define KRN_SAMPLE_GREEDY_ROWS 32
#define KRN_SAMPLE_GREEDY_MAX_VOCAB 1048576
struct krn_cuda_greedy_rows {
    int32_t row[KRN_SAMPLE_GREEDY_ROWS];
};

/* Workspace bytes for up to max_rows rows of vocab per call (0 when the
 * sort library cannot size it). */
size_t krn_cuda_sample_workspace(int32_t max_rows, int32_t vocab);

/* Plain greedy rows (temperature 0, no bans, bias, penalties or top-n): for
 * i < n_rows (at most KRN_SAMPLE_GREEDY_ROWS), out[i] = the largest value
 * of logits row rows->row[i] (host memory), lowest id on ties, -1 when all
 * are -inf, and its logprob; n_top 0. The same results as krn_cuda_sample
 * on such rows (the logprob within rounding: its sum is taken per block of
 * 4096 values and scaled) from one launch of many blocks a row, with
 * nothing uploaded. The workspace (krn_cuda_sample_workspace) must be zero
 * before its first use (it holds arrival counters that the launch leaves
 * zero); vocab up to KRN_SAMPLE_GREEDY_MAX_VOCAB. */
inf_status_t krn_cuda_sample_greedy(const float *logits, int32_t vocab,
                                    const struct krn_cuda_greedy_rows *rows, int32_t n_rows,
                                    void *ws, size_t ws_bytes, struct krn_cuda_sample_out *out,
                                    void *stream, struct inf_err *err);

/* Sample n_rows rows (n_rows <= the max_rows the workspace was sized for):
 * rows, ints and vals in device memory, logits fp32 [*][vocab], out
 * [n_rows]. any_sort: some row has sort set (the sort runs only then). */
inf_status_t krn_cuda_sample(const float *logits, int32_t vocab,
                             const struct krn_cuda_sample_row *rows, int32_t n_rows, bool any_sort,
                             const int32_t *ints, const float *vals, void *ws, size_t ws_bytes,
                             struct krn_cuda_sample_out *out, void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
