/* engine/engine.c — the engine object and its thread.
 *
 * Loop -> engine: eng_request_submit / eng_request_cancel / eng_engine_abort_all
 * push small messages into the inbox (a mutex queue); the engine thread takes
 * the whole inbox between steps, so a request pointer crosses threads only
 * through it and is never touched by the submitter afterwards.
 * Engine -> loop: every event goes into the outbox; the notify callback runs
 * only when the outbox goes from empty to non-empty, and eng_events_take
 * swaps the whole list out (h2o's multithread handoff).
 *
 * Admission bound: `queued` counts requests submitted and not yet started (or
 * ended) by the scheduler; submit answers INF_E_BUSY when it would pass
 * max_queue. The engine thread subtracts what the scheduler reports as having
 * left the queue. */
#define INF_LOG_MODULE "eng"
#include "engine/eng.h"
#include "engine/backend.h"
#include "engine/mock/mock.h"
#include "engine/weights/model_config.h"
#include "engine/sched/scheduler_impl.h"
#include "engine/sched/scheduler_lm.h"
#include "engine/tp/comm.h"
#include "engine/tp/group.h"
#include "engine/tp/shard.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum msg_kind { MSG_SUBMIT, MSG_CANCEL, MSG_WAKE };

struct msg {
    struct inf_qnode node; /* first: the inbox links messages through it */
    enum msg_kind kind;
    struct eng_request *req; /* MSG_SUBMIT: owned by the message until the scheduler takes it */
    uint64_t id;
    uint64_t t_submit;
};

struct eng_engine {
    struct eng_config cfg; /* resolved defaults; pointer fields not kept */
    eng_notify_fn notify;
    void *user;
    struct eng_lm lm;
    const struct eng_detok_ops *detok;
    struct eng_detok_ops tok_ops; /* detok when it is the tokenizer's */
    tok_tokenizer_t *tok;         /* the server's tokenizer (NULL for none) */
    eng_sched_t *sched;           /* engine thread only, after create */
    inf_queue_t *inbox, *outbox;
    pthread_t thread;
    bool thread_started;
    uint64_t min_step_ns;
    struct eng_info info;
    enum eng_act_dtype kv_dtype; /* the backend's KV pools (kv_elem 0: the mock's, none) */
    int32_t kv_elem;

    atomic_bool draining;
    atomic_bool stopping;
    atomic_bool abort_pending;
    atomic_int_fast64_t queued;

    /* engine thread only */
    uint64_t dequeued_seen;
    bool failed;
    uint64_t log_every_ns;     /* the periodic stats line; 0: none */
    uint64_t log_next;         /* when it is due */
    struct eng_stats log_last; /* the counters at the last one */

    pthread_mutex_t stats_mu; /* guards stats */
    struct eng_stats stats;
};

/* ---- events ------------------------------------------------------------------------ */
static void outbox_push(void *user, struct eng_event *ev)
{
    eng_engine_t *eng = user;
    bool was_empty = false;
    if (inf_queue_push(eng->outbox, &ev->node, &was_empty) != INF_OK) {
        eng_event_destroy(ev); /* unbounded and never closed: cannot happen */
        return;
    }
    if (was_empty && eng->notify)
        eng->notify(eng->user);
}

struct eng_event *eng_events_take(eng_engine_t *eng)
{
    /* node is the first member of struct eng_event */
    return (struct eng_event *)(void *)inf_queue_take_all(eng->outbox);
}

/* An ERROR event for a request the scheduler never took. */
static void reject(eng_engine_t *eng, uint64_t id, inf_status_t code, const char *msg)
{
    struct eng_event *ev = calloc(1, sizeof *ev);
    if (!ev) {
        inf_log(ERROR, "req=%llu out of memory for its error event", (unsigned long long)id);
        return;
    }
    ev->kind = ENG_EV_ERROR;
    ev->req_id = id;
    ev->status = code;
    snprintf(ev->msg, sizeof ev->msg, "%s", msg);
    outbox_push(eng, ev);
}

/* ---- the thread ---------------------------------------------------------------------- */
static void publish_stats(eng_engine_t *eng)
{
    struct eng_stats st;
    eng_sched_stats(eng->sched, &st);
    st.failed = eng->failed;
    st.kv_capacity_tokens = eng->info.kv_capacity_tokens;
    st.kv_elem_bytes = eng->info.kv_elem_bytes;
    st.tp = eng->cfg.tp > 1 ? eng->cfg.tp : 1;
    pthread_mutex_lock(&eng->stats_mu);
    eng->stats = st;
    pthread_mutex_unlock(&eng->stats_mu);
}

/* The periodic stats line, as vLLM's: rates and the prefix cache's hit
 * rate over the interval since the last line, and the gauges now. Written
 * only when the engine ran steps since then. */
static void log_stats(eng_engine_t *eng, uint64_t now)
{
    struct eng_stats st;
    eng_sched_stats(eng->sched, &st);
    const struct eng_stats *l = &eng->log_last;
    if (st.steps_total != l->steps_total) {
        double s = (double)(now - (eng->log_next - eng->log_every_ns)) / 1e9;
        uint64_t q = st.prefix_cache_queries_total - l->prefix_cache_queries_total;
        uint64_t h = st.prefix_cache_hits_total - l->prefix_cache_hits_total;
        char hit[64];
        if (!eng->cfg.prefix_caching)
            snprintf(hit, sizeof hit, "off");
        else if (q == 0)
            snprintf(hit, sizeof hit, "hit rate -");
        else
            snprintf(hit, sizeof hit, "hit rate %.1f%% of %llu tokens",
                     100.0 * (double)h / (double)q, (unsigned long long)q);
        inf_log(INFO,
                "stats: prompt %.1f tok/s, generation %.1f tok/s, running %d, waiting %d, "
                "KV cache %.1f%% used, prefix cache %s, preemptions %llu",
                (double)(st.prompt_tokens_total - l->prompt_tokens_total) / s,
                (double)(st.generation_tokens_total - l->generation_tokens_total) / s, st.running,
                st.waiting,
                st.kv_blocks_total ? 100.0 * (double)st.kv_blocks_used / (double)st.kv_blocks_total
                                   : 0.0,
                hit, (unsigned long long)(st.preemptions_total - l->preemptions_total));
    }
    eng->log_last = st;
    eng->log_next = now + eng->log_every_ns;
}

static void account_dequeued(eng_engine_t *eng)
{
    uint64_t d = eng_sched_dequeued(eng->sched);
    if (d != eng->dequeued_seen) {
        atomic_fetch_sub(&eng->queued, (int_fast64_t)(d - eng->dequeued_seen));
        eng->dequeued_seen = d;
    }
}

static void handle_msgs(eng_engine_t *eng, struct inf_qnode *list)
{
    while (list) {
        struct msg *m = (struct msg *)(void *)list;
        list = list->next;
        if (m->kind == MSG_SUBMIT) {
            struct inf_err err = {0};
            uint64_t id = m->req->id;
            inf_status_t st = eng->failed ? inf_err_set(&err, INF_E_DEVICE, "the engine failed")
                                          : eng_sched_add(eng->sched, m->req, m->t_submit, &err);
            if (st != INF_OK) {
                atomic_fetch_sub(&eng->queued, 1);
                eng_request_destroy(m->req);
                reject(eng, id, st, err.msg);
            }
        } else if (m->kind == MSG_CANCEL) {
            eng_sched_cancel(eng->sched, m->id);
        }
        free(m);
    }
    if (atomic_exchange(&eng->abort_pending, false))
        eng_sched_abort_all(eng->sched);
    account_dequeued(eng);
}

static void sleep_until(uint64_t t)
{
    uint64_t now = inf_now_ns();
    if (now >= t)
        return;
    uint64_t d = t - now;
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    nanosleep(&ts, NULL);
}

static void *engine_main(void *arg)
{
    eng_engine_t *eng = arg;
    for (;;) {
        handle_msgs(eng, inf_queue_take_all(eng->inbox));
        if (atomic_load(&eng->stopping))
            break;
        if (eng_sched_idle(eng->sched)) {
            publish_stats(eng);
            /* steps since the last stats line: wake for it when it is due */
            int wait_ms = -1;
            if (eng->log_every_ns && eng->stats.steps_total != eng->log_last.steps_total) {
                uint64_t now = inf_now_ns();
                if (now >= eng->log_next) {
                    log_stats(eng, now);
                    continue;
                }
                wait_ms = (int)((eng->log_next - now) / 1000000ull) + 1;
            }
            inf_queue_wait(eng->inbox, wait_ms);
            continue;
        }
        uint64_t t0 = inf_now_ns();
        struct inf_err err = {0};
        inf_status_t st = eng_sched_step(eng->sched, &err);
        if (st != INF_OK) {
            inf_log(ERROR, "engine step failed (%s): %s; failing every request",
                    inf_status_name(st), err.msg);
            eng->failed = true;
            /* published before the requests hear of it: a client that gets
             * its error and then asks /health must find the failure */
            publish_stats(eng);
            eng_sched_fail_all(eng->sched, INF_E_DEVICE, "the engine failed");
        }
        account_dequeued(eng);
        publish_stats(eng);
        if (eng->log_every_ns && inf_now_ns() >= eng->log_next)
            log_stats(eng, inf_now_ns());
        if (eng->min_step_ns)
            sleep_until(t0 + eng->min_step_ns);
    }
    return NULL;
}

/* ---- the public API ------------------------------------------------------------------- */
inf_status_t eng_request_submit(eng_engine_t *eng, struct eng_request *req, struct inf_err *err)
{
    if (atomic_load(&eng->draining) || atomic_load(&eng->stopping))
        return inf_err_set(err, INF_E_SHUTDOWN, "the server is shutting down");
    inf_status_t st = eng_sched_validate(eng->sched, req, err);
    if (st != INF_OK)
        return st;
    if (atomic_fetch_add(&eng->queued, 1) >= eng->cfg.max_queue) {
        atomic_fetch_sub(&eng->queued, 1);
        return inf_err_set(err, INF_E_BUSY, "the queue is full (%d requests waiting)",
                           eng->cfg.max_queue);
    }
    struct msg *m = calloc(1, sizeof *m);
    if (!m) {
        atomic_fetch_sub(&eng->queued, 1);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    m->kind = MSG_SUBMIT;
    m->req = req;
    m->t_submit = inf_now_ns();
    st = inf_queue_push(eng->inbox, &m->node, NULL);
    if (st != INF_OK) {
        atomic_fetch_sub(&eng->queued, 1);
        free(m);
        return inf_err_set(err, st, "the server is shutting down");
    }
    return INF_OK;
}

void eng_request_cancel(eng_engine_t *eng, uint64_t req_id)
{
    struct msg *m = calloc(1, sizeof *m);
    if (!m) {
        inf_log(ERROR, "req=%llu out of memory for its cancellation", (unsigned long long)req_id);
        return;
    }
    m->kind = MSG_CANCEL;
    m->id = req_id;
    if (inf_queue_push(eng->inbox, &m->node, NULL) != INF_OK)
        free(m);
}

void eng_engine_drain(eng_engine_t *eng)
{
    atomic_store(&eng->draining, true);
}

void eng_engine_abort_all(eng_engine_t *eng)
{
    atomic_store(&eng->abort_pending, true);
    struct msg *m = calloc(1, sizeof *m);
    if (!m)
        return; /* the flag is seen at the next step */
    m->kind = MSG_WAKE;
    if (inf_queue_push(eng->inbox, &m->node, NULL) != INF_OK)
        free(m);
}

void eng_engine_info(const eng_engine_t *eng, struct eng_info *info)
{
    *info = eng->info;
}

void eng_engine_stats(eng_engine_t *eng, struct eng_stats *st)
{
    pthread_mutex_lock(&eng->stats_mu);
    *st = eng->stats;
    pthread_mutex_unlock(&eng->stats_mu);
}

tok_tokenizer_t *eng_engine_tokenizer(const eng_engine_t *eng)
{
    return eng->tok;
}

/* ---- lifetime -------------------------------------------------------------------------- */
/* Release the ranks' backends, then their communicators (comms may be NULL). */
static void free_ranks(struct eng_backend **bes, eng_comm_t **comms, int32_t n)
{
    for (int32_t r = 0; r < n; r++) {
        eng_backend_destroy(bes[r]);
        bes[r] = NULL;
    }
    for (int32_t r = 0; comms && r < n; r++) {
        eng_comm_destroy(comms[r]);
        comms[r] = NULL;
    }
}

/* KV bytes per token: K and V of every layer in the backend's KV dtype. */
static int64_t kv_bytes_per_token(const struct eng_model_config *mc, const struct eng_backend *be)
{
    return (int64_t)mc->n_layers * 2 * mc->n_kv_heads * mc->head_dim *
           (int64_t)eng_act_size(be->kv_dtype);
}

/* The backend cfg->backend names, for rank `rank` of tp (comm: its
 * communicator; NULL at tp 1). Adding a backend is a case here. */
static inf_status_t make_backend(const struct eng_config *cfg, int32_t rank, int32_t tp,
                                 eng_comm_t *comm, struct eng_backend **out, struct inf_err *err)
{
    if (cfg->backend == ENG_BACKEND_CPU) {
        /* the ranks of a group share the cores (unless threads is set) */
        int32_t threads = cfg->threads;
        if (threads == 0 && tp > 1) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            threads = cores > tp ? (int32_t)(cores / tp) : 1;
        }
        struct eng_backend_cpu_opts bo = {
            .n_threads = threads, .comm = comm, .kv_fp8 = cfg->kv_cache_dtype == ENG_KV_FP8};
        return eng_backend_cpu_create(&bo, out, err);
    }
    /* cuda: rank r on devices[r] (eng_backend_cuda_create answers
     * INF_E_UNSUPPORTED in a build without CUDA). */
    struct eng_backend_cuda_opts co = {
        .device = cfg->n_devices > rank && cfg->devices ? cfg->devices[rank] : 0,
        .comm = comm,
        .kv_fp8 = cfg->kv_cache_dtype == ENG_KV_FP8,
        .sm75 = cfg->cuda_sm75,
    };
    return eng_backend_cuda_create(&co, out, err);
}

/* Whether the ranks' devices are all different (a GPU each). */
static bool devices_distinct(const struct eng_config *cfg, int32_t tp)
{
    for (int32_t a = 0; a < tp; a++)
        for (int32_t b = a + 1; b < tp; b++)
            if (cfg->n_devices > b && cfg->devices[a] == cfg->devices[b])
                return false;
    return cfg->n_devices >= tp;
}

/* The backends of the ranks: one at tp 1; at tp > 1 a group's, each with its
 * communicator (engine/tp/comm.h). On error nothing is left made. */
static inf_status_t make_ranks(const struct eng_config *cfg, const struct eng_model_config *mc,
                               int32_t tp, struct eng_backend **bes, eng_comm_t **comms,
                               struct inf_err *err)
{
    inf_status_t st = INF_OK;
    if (tp > 1) {
        struct eng_tp_shape shape;
        if ((st = eng_tp_shape_of(mc->n_heads, mc->n_kv_heads, mc->intermediate, 0, tp, &shape,
                                  err)))
            return st;
        /* a GPU each: NCCL; ranks that share a GPU (or no NCCL): host memory */
        const bool nccl = cfg->backend == ENG_BACKEND_CUDA && devices_distinct(cfg, tp);
        st = nccl ? eng_comm_nccl_create(tp, cfg->devices, comms, err)
                  : eng_comm_local_create(tp, 0, comms, err);
        if (st == INF_E_UNSUPPORTED && nccl) {
            inf_log(WARN, "tp: %s; the ranks communicate through host memory", err ? err->msg : "");
            inf_err_clear(err);
            st = eng_comm_local_create(tp, 0, comms, err);
        }
        if (st != INF_OK)
            return st;
        inf_log(INFO, "tensor parallelism: %d ranks on the %s backend, %s", tp,
                cfg->backend == ENG_BACKEND_CUDA ? "cuda" : "cpu",
                eng_comm_on_device(comms[0]) ? "NCCL between the GPUs"
                                             : "all-reduce in host memory");
    }
    for (int32_t r = 0; r < tp && st == INF_OK; r++)
        st = make_backend(cfg, r, tp, tp > 1 ? comms[r] : NULL, &bes[r], err);
    if (st != INF_OK)
        free_ranks(bes, tp > 1 ? comms : NULL, tp);
    return st;
}

/* The KV tokens one sequence holds at most: max_model_len, or with a
 * sliding window the blocks of its window and two more (a decoding
 * sequence's, with a step queued ahead: engine/sched/scheduler.c, "Sliding
 * window"; its prefill chunks are cut to what is free). */
static int64_t seq_kv_tokens(const struct eng_config *cfg, const struct eng_model_config *mc)
{
    int64_t t = cfg->max_model_len;
    if (mc->sliding_window > 0) {
        const int64_t w = ((int64_t)mc->sliding_window + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK + 2;
        if (w * ENG_KV_BLOCK < t)
            t = w * ENG_KV_BLOCK;
    }
    return t;
}

/* The KV tokens max_batch sequences hold at once: max_batch of
 * seq_kv_tokens, and with a sliding window one step's prefill chunk more
 * (max_batched_tokens: a chunk holds its window and its own tokens), never
 * more than max_batch full sequences. */
static int64_t kv_want_tokens(const struct eng_config *cfg, const struct eng_model_config *mc)
{
    const int64_t full = (int64_t)cfg->max_batch * cfg->max_model_len;
    const int64_t one = seq_kv_tokens(cfg, mc);
    if (one == cfg->max_model_len)
        return full;
    const int64_t w = (int64_t)cfg->max_batch * one + cfg->max_batched_tokens;
    return w < full ? w : full;
}

/* The automatic KV size on a host backend: kv_want_tokens within 256 MiB,
 * and never less than one sequence. */
#define KV_AUTO_BYTES (256ll << 20)
/* Device memory left out of the KV pool besides what gpu_memory_utilization
 * leaves: CUDA graph executables and the driver's own growth. */
#define KV_DEVICE_HEADROOM ((size_t)256 << 20)

/* The device memory plan, after the weights and workspaces are in place:
 * the KV pool takes what gpu_memory_utilization leaves of the device's
 * total (cudaMemGetInfo), less a headroom, capped at max_batch full
 * sequences of max_model_len (the memory is the device's: a windowed
 * model's spare blocks serve the prefix cache), at least one sequence
 * (seq_kv_tokens). Answers the capacity in tokens (a multiple of
 * ENG_KV_BLOCK). */
static inf_status_t plan_device_kv(const struct eng_config *cfg, struct eng_backend *be,
                                   const struct eng_model_config *mc, int32_t tp, int64_t *tokens,
                                   struct inf_err *err)
{
    size_t free_b = 0, total_b = 0;
    inf_status_t st = eng_backend_mem_info(be, &free_b, &total_b, err);
    if (st != INF_OK)
        return st;
    double util = cfg->gpu_memory_utilization > 0.0f ? cfg->gpu_memory_utilization : 0.90;
    double used = (double)(total_b - free_b);
    double budget = util * (double)total_b - used - (double)KV_DEVICE_HEADROOM;
    if (budget > (double)free_b - (double)KV_DEVICE_HEADROOM)
        budget = (double)free_b - (double)KV_DEVICE_HEADROOM;
    /* A rank keeps its KV heads only; ranks that share the first rank's
     * GPU share its budget. */
    int64_t per_tok = kv_bytes_per_token(mc, be);
    if (tp > 1) {
        struct eng_tp_shape sh;
        if (eng_tp_shape_of(mc->n_heads, mc->n_kv_heads, mc->intermediate, 0, tp, &sh, NULL) ==
            INF_OK)
            per_tok = per_tok / mc->n_kv_heads * sh.n_kv_heads;
        int32_t sharing = 0;
        for (int32_t r = 0; r < tp; r++)
            sharing += cfg->n_devices > r && cfg->devices[r] == cfg->devices[0];
        budget /= sharing > 0 ? sharing : 1;
    }
    int64_t t = budget > 0 ? (int64_t)(budget / (double)per_tok) : 0;
    const int64_t one = seq_kv_tokens(cfg, mc);
    const int64_t want = (int64_t)cfg->max_batch * cfg->max_model_len;
    if (t > want)
        t = want;
    t = t / ENG_KV_BLOCK * ENG_KV_BLOCK;
    inf_log(INFO,
            "GPU memory plan: %.2f GiB total, %.2f GiB used by weights and workspaces, "
            "gpu_memory_utilization %.2f -> KV pool of %lld tokens (%.2f GiB, %lld bytes a token, "
            "%s)",
            (double)total_b / 1073741824.0, used / 1073741824.0, util, (long long)t,
            (double)t * (double)per_tok / 1073741824.0, (long long)per_tok,
            eng_kv_dtype_name(be->kv_dtype));
    if (t < one)
        return inf_err_set(err, INF_E_NOMEM,
                           "gpu_memory_utilization %.2f leaves room for %lld KV tokens, less than "
                           "one sequence of max_model_len %d (%lld tokens held at once)",
                           util, (long long)t, cfg->max_model_len, (long long)one);
    *tokens = t;
    return INF_OK;
}

/* engine.max_batched_tokens 0: the backend's step budget for its device
 * (backend_tokens, 0 when it names none), else 2048; never below max_batch. */
static int32_t default_step_budget(int32_t max_batch, int32_t backend_tokens)
{
    int32_t t = backend_tokens > 0 ? backend_tokens : 2048;
    return max_batch > t ? max_batch : t;
}

/* A checkpoint folder on a real backend: config.json, tokenizer.json and the
 * weights. Sizes the KV pool (cfg.kv_cache_tokens 0: on a device backend
 * from gpu_memory_utilization once the weights are loaded, on the CPU room
 * for max_batch full sequences within KV_AUTO_BYTES, at least one) and the
 * model's step buffers (max_batched_tokens, block tables of max_batch x
 * max_model_len). */
static inf_status_t load_checkpoint(eng_engine_t *eng, struct inf_err *err)
{
    struct eng_config *cfg = &eng->cfg;
    struct eng_backend *bes[ENG_TP_MAX] = {0};
    eng_comm_t *comms[ENG_TP_MAX] = {0};
    struct eng_model_config mc;
    inf_status_t st;
    if (!cfg->model_dir || !*cfg->model_dir)
        return inf_err_set(err, INF_E_INVALID, "model: a model folder is required");
    const int32_t tp = cfg->tp > 1 ? cfg->tp : 1;
    if (tp > ENG_TP_MAX)
        return inf_err_set(err, INF_E_INVALID, "tp: at most %d ranks, got %d", ENG_TP_MAX, tp);
    st = eng_model_config_load(cfg->model_dir, &mc, err);
    if (st != INF_OK)
        return st;
    st = make_ranks(cfg, &mc, tp, bes, comms, err);
    if (st != INF_OK)
        return st;
    struct eng_backend *be = bes[0];
    eng->kv_dtype = be->kv_dtype;
    eng->kv_elem = (int32_t)eng_act_size(be->kv_dtype);
    if (cfg->max_batched_tokens == 0) {
        cfg->max_batched_tokens = default_step_budget(cfg->max_batch, be->step_tokens);
        if (be->step_tokens > 0)
            inf_log(INFO, "max_batched_tokens %d (the %s backend's step budget on this device)",
                    cfg->max_batched_tokens, eng_backend_name(be));
    }
    if (cfg->max_model_len > mc.max_pos)
        inf_log(WARN, "max_model_len %d is above the model's %d; using %d", cfg->max_model_len,
                mc.max_pos, mc.max_pos);
    if (cfg->max_model_len == 0 || cfg->max_model_len > mc.max_pos)
        cfg->max_model_len = mc.max_pos;
    size_t free_b, total_b;
    bool device_plan =
        cfg->kv_cache_tokens == 0 && eng_backend_mem_info(be, &free_b, &total_b, NULL) == INF_OK;
    if (cfg->kv_cache_tokens == 0 && !device_plan) {
        int64_t fit = KV_AUTO_BYTES / kv_bytes_per_token(&mc, be);
        const int64_t one = seq_kv_tokens(cfg, &mc), want = kv_want_tokens(cfg, &mc);
        int64_t t = want < fit ? want : fit;
        if (t < one)
            t = one;
        cfg->kv_cache_tokens = (t + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK * ENG_KV_BLOCK;
    }
    if (cfg->kv_cache_tokens / ENG_KV_BLOCK > INT32_MAX) {
        st = inf_err_set(err, INF_E_INVALID, "kv_cache_tokens: too large");
        goto fail_be;
    }
    st = tok_load(cfg->model_dir, &eng->tok, err);
    if (st != INF_OK)
        goto fail_be;
    struct eng_lm_model_opts lo;
    eng_lm_model_opts_from_config(cfg, &lo);
    st = tp > 1 ? eng_tp_group_create(&lo, bes, comms, tp, &eng->lm, err)
                : eng_lm_model_create(&lo, be, &eng->lm, err);
    if (st != INF_OK)
        goto fail_tok;
    if (device_plan) {
        /* The pool itself is allocated by the scheduler's kv_reserve. */
        st = plan_device_kv(cfg, be, &mc, tp, &cfg->kv_cache_tokens, err);
        if (st != INF_OK) {
            eng->lm.destroy(eng->lm.self); /* frees the backends too */
            tok_destroy(eng->tok);
            eng->tok = NULL;
            return st;
        }
    }
    /* A config without eos_token_id / bos_token_id: the tokenizer's. */
    int32_t tok_eos = tok_eos_id(eng->tok);
    if (eng->lm.n_eos == 0 && tok_eos >= 0 && tok_eos < eng->lm.vocab)
        eng->lm.eos_ids[eng->lm.n_eos++] = tok_eos;
    if (eng->lm.bos_id < 0)
        eng->lm.bos_id = tok_bos_id(eng->tok);
    eng_lm_detok_ops(eng->tok, &eng->tok_ops);
    eng->detok = &eng->tok_ops;
    return INF_OK;

fail_tok:
    tok_destroy(eng->tok);
    eng->tok = NULL;
fail_be:
    free_ranks(bes, tp > 1 ? comms : NULL, tp);
    return st;
}

/* Load the model and tokenizer; fix cfg.max_model_len and
 * cfg.kv_cache_tokens to what they resolve to. */
static inf_status_t load_model(eng_engine_t *eng, struct inf_err *err)
{
    struct eng_config *cfg = &eng->cfg;
    inf_status_t st;
    switch (cfg->backend) {
    case ENG_BACKEND_MOCK: {
        struct eng_mock_config mc = {
            .vocab = cfg->mock_vocab,
            .max_len = cfg->max_model_len,
            .fail_at_step = cfg->mock_fail_step,
            .device_sampling = cfg->mock_device_sampling,
        };
        st = eng_mock_create(&mc, &eng->lm, err);
        if (st != INF_OK)
            return st;
        st = eng_mock_tokenizer(eng->lm.vocab, &eng->tok, err);
        if (st != INF_OK) {
            eng->lm.destroy(eng->lm.self);
            return st;
        }
        eng->detok = &eng_mock_detok;
        cfg->max_model_len = eng->lm.max_len;
        if (cfg->kv_cache_tokens == 0)
            cfg->kv_cache_tokens = (int64_t)cfg->max_batch * cfg->max_model_len;
        return INF_OK;
    }
    case ENG_BACKEND_CPU:
    case ENG_BACKEND_CUDA:
        return load_checkpoint(eng, err);
    }
    return inf_err_set(err, INF_E_INVALID, "backend: unknown kind %d", (int)cfg->backend);
}

inf_status_t eng_engine_create(const struct eng_config *cfg, eng_notify_fn notify, void *user,
                               eng_engine_t **out, struct inf_err *err)
{
    inf_status_t st;
    eng_engine_t *eng = calloc(1, sizeof *eng);
    if (!eng)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    eng->cfg = *cfg;
    eng->notify = notify;
    eng->user = user;
    if (eng->cfg.max_batch == 0)
        eng->cfg.max_batch = 128;
    if (eng->cfg.max_queue == 0)
        eng->cfg.max_queue = 256;
    if (eng->cfg.max_batch < 0 || eng->cfg.max_batched_tokens < 0 || eng->cfg.max_queue < 0 ||
        eng->cfg.max_model_len < 0 || eng->cfg.kv_cache_tokens < 0) {
        st = inf_err_set(err, INF_E_INVALID, "engine limits must not be negative");
        goto fail_cfg;
    }
    eng->min_step_ns = (uint64_t)cfg->min_step_us * 1000ull;
    if (cfg->mock_vocab < 0 || cfg->mock_fail_step < 0) {
        st = inf_err_set(err, INF_E_INVALID, "mock settings must not be negative");
        goto fail_cfg;
    }
    eng->log_every_ns = (uint64_t)cfg->stats_log_s * 1000000000ull;

    st = load_model(eng, err);
    if (st != INF_OK)
        goto fail_cfg;
    if (eng->cfg.max_batched_tokens == 0) /* still 0 on the mock backend */
        eng->cfg.max_batched_tokens = default_step_budget(eng->cfg.max_batch, 0);
    int64_t kv_tokens = eng->cfg.kv_cache_tokens;
    if (kv_tokens / ENG_KV_BLOCK > INT32_MAX) {
        st = inf_err_set(err, INF_E_INVALID, "kv_cache_tokens: too large");
        goto fail_lm;
    }
    struct eng_sched_config sc = {
        .max_batch = eng->cfg.max_batch,
        .max_batched_tokens = eng->cfg.max_batched_tokens,
        .max_model_len = eng->cfg.max_model_len,
        .kv_blocks = (int32_t)(kv_tokens / ENG_KV_BLOCK),
        .seed = eng->cfg.seed,
        .prefix_caching = eng->cfg.prefix_caching,
        .no_overlap = eng->cfg.no_overlap,
    };
    st = eng_sched_create(&sc, &eng->lm, eng->detok, outbox_push, eng, &eng->sched, err);
    if (st != INF_OK)
        goto fail_lm;
    /* A device model warms up before serving, so that the first requests do
     * not pay the lazy set-up (kernel loading, decode-graph recording). */
    if (eng->lm.warm_up && !eng->cfg.skip_warm_up) {
        const uint64_t t0 = inf_now_ns();
        int32_t n_graphs = 0, n_prompt = 0;
        st = eng->lm.warm_up(eng->lm.self, eng->cfg.max_batch, eng->cfg.max_batched_tokens,
                             &n_graphs, &n_prompt, err);
        if (st != INF_OK) {
            inf_log(ERROR, "warm-up before serving failed: %s", err ? err->msg : "");
            goto fail_sched;
        }
        inf_log(INFO, "warm-up: decode graphs of %d batch sizes, prefill of %d tokens, in %.0f ms",
                n_graphs, n_prompt, (double)(inf_now_ns() - t0) / 1e6);
    }

    eng->inbox = inf_queue_create(0);
    eng->outbox = inf_queue_create(0);
    if (!eng->inbox || !eng->outbox) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto fail_queues;
    }
    if (pthread_mutex_init(&eng->stats_mu, NULL) != 0) {
        st = inf_err_set(err, INF_E_NOMEM, "cannot create a mutex");
        goto fail_queues;
    }
    eng->info = (struct eng_info){
        .vocab = eng->lm.vocab,
        .max_model_len = eng->cfg.max_model_len,
        .bos_id = eng->lm.bos_id,
        .kv_capacity_tokens = (int64_t)sc.kv_blocks * ENG_KV_BLOCK,
        .max_batched_tokens = eng->cfg.max_batched_tokens,
        .backend_name = eng->lm.name,
        .kv_dtype = eng->kv_elem ? eng_kv_dtype_name(eng->kv_dtype) : "none",
        .kv_elem_bytes = eng->kv_elem,
    };
    eng->cfg.model_dir = NULL;
    eng->cfg.devices = NULL;
    eng->cfg.keep_fp16 = NULL;
    publish_stats(eng);
    eng->log_next = inf_now_ns() + eng->log_every_ns;
    if (pthread_create(&eng->thread, NULL, engine_main, eng) != 0) {
        st = inf_err_set(err, INF_E_NOMEM, "cannot start the engine thread");
        goto fail_mutex;
    }
    eng->thread_started = true;
    inf_log(INFO,
            "engine ready: backend %s, vocab %d, max_model_len %d, max_batch %d, "
            "max_batched_tokens %d, kv %lld tokens (%s)",
            eng->lm.name, eng->lm.vocab, eng->cfg.max_model_len, eng->cfg.max_batch,
            eng->cfg.max_batched_tokens, (long long)eng->info.kv_capacity_tokens,
            eng->info.kv_dtype);
    *out = eng;
    return INF_OK;

fail_mutex:
    pthread_mutex_destroy(&eng->stats_mu);
fail_queues:
    inf_queue_destroy(eng->outbox);
    inf_queue_destroy(eng->inbox);
fail_sched:
    eng_sched_destroy(eng->sched);
fail_lm:
    eng->lm.destroy(eng->lm.self);
    tok_destroy(eng->tok);
fail_cfg:
    free(eng);
    return st;
}

void eng_engine_destroy(eng_engine_t *eng)
{
    if (!eng)
        return;
    atomic_store(&eng->stopping, true);
    inf_queue_close(eng->inbox);
    if (eng->thread_started)
        pthread_join(eng->thread, NULL);
    /* Messages that arrived after the thread's last look. */
    for (struct inf_qnode *n = inf_queue_take_all(eng->inbox), *next; n; n = next) {
        next = n->next;
        struct msg *m = (struct msg *)(void *)n;
        eng_request_destroy(m->req);
        free(m);
    }
    eng_sched_destroy(eng->sched);
    for (struct inf_qnode *n = inf_queue_take_all(eng->outbox), *next; n; n = next) {
        next = n->next;
        eng_event_destroy((struct eng_event *)(void *)n);
    }
    eng->lm.destroy(eng->lm.self);
    tok_destroy(eng->tok);
    inf_queue_destroy(eng->inbox);
    inf_queue_destroy(eng->outbox);
    pthread_mutex_destroy(&eng->stats_mu);
    free(eng);
}
