/* engine/cuda/sample.c — sampling on the device (the host sampler's rules,
 * engine/sched/sampler.h, in kernels/sample_cuda.h): only the results come
 * back; and the token feed that takes a step's tokens from the samples of
 * the step before it without a round trip. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/cuda/cuda_impl.h"
#include "kernels/embedding_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

inf_status_t eng_cuda_token_feed(struct eng_backend *be, struct eng_buf *tok,
                                 const struct eng_buf *feed, const struct eng_buf *samples,
                                 int32_t n, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    const size_t row = sizeof(struct krn_cuda_sample_out);
    _Static_assert(sizeof(struct krn_cuda_sample_out) % 4 == 0, "int32 stride");
    KRN(c, krn_cuda_token_feed(
               (int32_t *)tok->ptr, (const int32_t *)feed->ptr,
               (const int32_t *)samples->ptr + offsetof(struct krn_cuda_sample_out, token) / 4,
               (int64_t)(row / 4), (int32_t)(samples->size / row), n, c->d_bad, c->stream, lep_));
    eng_cuda_written(tok);
    return INF_OK;
}

/* ---- sampling ------------------------------------------------------------------ */
inf_status_t eng_cuda_sample_reserve(struct eng_backend *be, int32_t vocab, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    size_t need = krn_cuda_sample_workspace(SAMPLE_ROWS, vocab);
    if (need == 0)
        return eng_cuda_fail(c, "sampling workspace size", "query failed", err);
    if (need <= c->sample_ws_bytes) {
        c->sample_vocab = vocab;
        return INF_OK;
    }
    CU(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    (void)cudaFree(c->sample_ws);
    c->sample_ws = NULL;
    c->sample_ws_bytes = 0;
    cudaError_t e = cudaMalloc(&c->sample_ws, need);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        c->sample_ws = NULL;
        return inf_err_set(err, INF_E_NOMEM, "out of GPU memory for the sampling workspace");
    }
    CU(c, e, "cudaMalloc");
    /* the greedy kernel's arrival counters start at zero */
    CU(c, cudaMemset(c->sample_ws, 0, need), "cudaMemset");
    c->sample_ws_bytes = need;
    c->sample_vocab = vocab;
    return INF_OK;
}

/* Host list staging of at least n entries. */
static bool lists_reserve(struct cu_ctx *c, size_t n)
{
    if (n <= c->h_lists_cap)
        return true;
    size_t cap = c->h_lists_cap ? c->h_lists_cap : 1024;
    while (cap < n)
        cap *= 2;
    int32_t *pi = realloc(c->h_ints, cap * sizeof *pi);
    if (!pi)
        return false;
    c->h_ints = pi;
    float *pv = realloc(c->h_vals, cap * sizeof *pv);
    if (!pv)
        return false;
    c->h_vals = pv;
    c->h_lists_cap = cap;
    return true;
}

inf_status_t eng_cuda_sample(struct eng_backend *be, const struct eng_buf *logits,
                             int32_t n_logit_rows, int32_t vocab, const struct eng_sample_row *rows,
                             int32_t n, struct eng_buf *out, int32_t out_first, struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    (void)n_logit_rows;
    if (!c->sample_ws || vocab > c->sample_vocab)
        return inf_err_set(err, INF_E_INVALID,
                           "sample: the workspace is reserved for a vocabulary of %d, not %d",
                           c->sample_vocab, vocab);
    for (int32_t r0 = 0; r0 < n; r0 += SAMPLE_ROWS) {
        int32_t nr = n - r0 < SAMPLE_ROWS ? n - r0 : SAMPLE_ROWS;
        struct krn_cuda_sample_out *o = (struct krn_cuda_sample_out *)out->ptr + out_first + r0;
        /* rows that are all plain greedy: the kernel of many blocks a row,
         * their logits rows passed by value */
        bool plain = vocab <= KRN_SAMPLE_GREEDY_MAX_VOCAB;
        struct krn_cuda_greedy_rows gr;
        for (int32_t i = 0; i < nr && plain; i++) {
            const struct eng_sample_row *r = &rows[r0 + i];
            plain = r->temperature == 0.0f && r->n_ban == 0 && r->n_bias == 0 && r->n_hist == 0 &&
                    r->n_logprobs <= 0;
            gr.row[i] = r->logit_row;
        }
        if (plain) {
            KRN(c, krn_cuda_sample_greedy(logits->ptr, vocab, &gr, nr, c->sample_ws,
                                          c->sample_ws_bytes, o, c->stream, lep_));
            continue;
        }
        size_t n_list = 0;
        for (int32_t i = 0; i < nr; i++) {
            const struct eng_sample_row *r = &rows[r0 + i];
            n_list += (size_t)r->n_ban + (size_t)r->n_bias + 3 * (size_t)r->n_hist;
        }
        if (!lists_reserve(c, n_list + 1))
            return inf_err_set(err, INF_E_NOMEM, "out of memory for sampling lists");
        bool any_sort = false;
        int32_t at = 0;
        for (int32_t i = 0; i < nr; i++) {
            const struct eng_sample_row *r = &rows[r0 + i];
            struct krn_cuda_sample_row *k = &c->h_rows[i];
            memset(k, 0, sizeof *k);
            k->u = r->u;
            k->logit_row = r->logit_row;
            k->temperature = r->temperature;
            k->top_k = r->top_k;
            k->top_p = r->top_p;
            /* the host's own logf, so the cut is the same float */
            k->log_min_p = r->min_p > 0.0f ? logf(r->min_p) : -INFINITY;
            k->rep = r->repetition_penalty;
            k->pres = r->presence_penalty;
            k->freq = r->frequency_penalty;
            k->n_logprobs = r->n_logprobs;
            k->sort = r->temperature != 0.0f && (r->top_k > 0 || r->top_p < 1.0f);
            any_sort |= k->sort != 0;
            k->ban_off = at;
            k->n_ban = r->n_ban;
            memcpy(c->h_ints + at, r->ban, (size_t)r->n_ban * sizeof(int32_t));
            at += r->n_ban;
            k->bias_off = at;
            k->n_bias = r->n_bias;
            memcpy(c->h_ints + at, r->bias_ids, (size_t)r->n_bias * sizeof(int32_t));
            memcpy(c->h_vals + at, r->bias_vals, (size_t)r->n_bias * sizeof(float));
            at += r->n_bias;
            k->hist_off = at;
            k->n_hist = r->n_hist;
            for (int32_t j = 0; j < r->n_hist; j++) {
                c->h_ints[at + 3 * j] = r->hist[j].token;
                c->h_ints[at + 3 * j + 1] = r->hist[j].count;
                c->h_ints[at + 3 * j + 2] = r->hist[j].in_prompt;
            }
            at += 3 * r->n_hist;
        }
        /* rows and lists travel through the scratch region, queued before
         * the launch that reads them */
        struct bump sc = scratch_of(c);
        size_t rows_b = (size_t)nr * sizeof(struct krn_cuda_sample_row);
        size_t list_b = (size_t)(at + 1) * 4;
        void *d_rows = bump_take(&sc, rows_b);
        int32_t *d_ints = bump_take(&sc, list_b);
        float *d_vals = bump_take(&sc, list_b);
        if (!d_rows || !d_ints || !d_vals)
            return inf_err_set(err, INF_E_NOMEM, "sampling lists of %zu bytes exceed the workspace",
                               rows_b + 2 * list_b);
        inf_status_t st = eng_cuda_stage_upload(c, d_rows, c->h_rows, rows_b, err);
        if (st == INF_OK && at > 0)
            st = eng_cuda_stage_upload(c, d_ints, c->h_ints, (size_t)at * 4, err);
        if (st == INF_OK && at > 0)
            st = eng_cuda_stage_upload(c, d_vals, c->h_vals, (size_t)at * 4, err);
        if (st != INF_OK)
            return st;
        KRN(c, krn_cuda_sample(logits->ptr, vocab, d_rows, nr, any_sort, d_ints, d_vals,
                               c->sample_ws, c->sample_ws_bytes, o, c->stream, lep_));
    }
    eng_cuda_written(out);
    return INF_OK;
}

#endif
