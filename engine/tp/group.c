/* engine/tp/group.c — a tensor-parallel group as the scheduler's model
 * (engine/tp/group.h): a thread a rank besides the first, and a job they
 * all run at once. */
#define INF_LOG_MODULE "eng"
#include "engine/tp/group.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/tp/comm.h"
#include "engine/tp/shard.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum job { JOB_NONE, JOB_FORWARD, JOB_SAMPLE, JOB_KV, JOB_STOP };

struct rank {
    struct group *g;
    int32_t r;
    struct eng_backend *be;
    eng_model_t *m;
    struct eng_lm_keep keep;
    eng_comm_t *comm;
    pthread_t th;
    bool started;
    inf_status_t st; /* of the last job */
    struct inf_err err;
};

struct group {
    int32_t size;
    struct rank *ranks;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t seq;    /* jobs posted */
    int32_t pending; /* ranks besides the first still on the job */
    enum job job;
    const struct eng_batch *b;
    int32_t n_blocks;
    /* JOB_SAMPLE: rank 0 samples on its device */
    const struct eng_sample_row *rows;
    int32_t n_rows;
    struct eng_sample_out *out;
    bool failed; /* a job failed: the group answers every later one so */
    struct inf_err fail;
};

/* Rank rk's part of the posted job. */
static void run_job(struct group *g, struct rank *rk, float *logits)
{
    struct inf_err e = {0};
    inf_status_t st = INF_OK;
    switch (g->job) {
    case JOB_FORWARD:
        st = rk->r == 0 ? eng_model_forward(rk->m, g->b, logits, &e)
                        : eng_model_forward_hidden(rk->m, g->b, &e);
        break;
    case JOB_SAMPLE:
        st = rk->r == 0 ? eng_model_forward_sample(rk->m, g->b, g->rows, g->n_rows, g->out, &e)
                        : eng_model_forward_hidden(rk->m, g->b, &e);
        break;
    case JOB_KV:
        st = g->n_blocks == eng_model_n_kv_blocks(rk->m)
                 ? INF_OK
                 : eng_model_kv_reserve(rk->m, g->n_blocks, &e);
        break;
    default:
        break;
    }
    rk->st = st;
    rk->err = e;
    /* no rank may wait for this one in a collective it will not reach */
    if (st != INF_OK && rk->comm)
        eng_comm_abort(rk->comm);
}

static void *rank_main(void *arg)
{
    struct rank *rk = arg;
    struct group *g = rk->g;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->seq == seen)
            pthread_cond_wait(&g->go, &g->mu);
        seen = g->seq;
        const enum job job = g->job;
        pthread_mutex_unlock(&g->mu);
        if (job == JOB_STOP)
            return NULL;
        run_job(g, rk, NULL);
        pthread_mutex_lock(&g->mu);
        if (--g->pending == 0)
            pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
}

/* Post job to every rank, run rank 0's part here, wait for the others.
 * The first failure (lowest rank) is the group's, for good. */
static inf_status_t run_all(struct group *g, enum job job, float *logits, struct inf_err *err)
{
    if (g->failed)
        return inf_err_set(err, INF_E_DEVICE, "the tensor-parallel group failed earlier: %s",
                           g->fail.msg);
    pthread_mutex_lock(&g->mu);
    g->job = job;
    g->pending = g->size - 1;
    g->seq++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    run_job(g, &g->ranks[0], logits);
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0)
        pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (int32_t r = 0; r < g->size; r++) {
        const struct rank *rk = &g->ranks[r];
        if (rk->st == INF_OK)
            continue;
        /* the one that failed first, not one its abort stopped */
        if (rk->st == INF_E_INTERNAL && strstr(rk->err.msg, "was aborted"))
            continue;
        g->failed = true;
        g->fail = rk->err;
        return inf_err_set(err, rk->st, "rank %d: %s", r, rk->err.msg);
    }
    for (int32_t r = 0; r < g->size; r++)
        if (g->ranks[r].st != INF_OK) {
            g->failed = true;
            g->fail = g->ranks[r].err;
            return inf_err_set(err, g->ranks[r].st, "rank %d: %s", r, g->ranks[r].err.msg);
        }
    return INF_OK;
}

static inf_status_t group_forward(void *self, const struct eng_batch *b, float *logits,
                                  struct inf_err *err)
{
    struct group *g = self;
    g->b = b;
    return run_all(g, JOB_FORWARD, logits, err);
}

static inf_status_t group_forward_sample(void *self, const struct eng_batch *b,
                                         const struct eng_sample_row *rows, int32_t n_rows,
                                         struct eng_sample_out *out, struct inf_err *err)
{
    struct group *g = self;
    g->b = b;
    g->rows = rows;
    g->n_rows = n_rows;
    g->out = out;
    return run_all(g, JOB_SAMPLE, NULL, err);
}

static inf_status_t group_kv_reserve(void *self, int32_t n_blocks, struct inf_err *err)
{
    struct group *g = self;
    g->n_blocks = n_blocks;
    return run_all(g, JOB_KV, NULL, err);
}

static void group_destroy(void *self)
{
    struct group *g = self;
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->job = JOB_STOP;
    g->seq++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int32_t r = 0; r < g->size; r++) {
        struct rank *rk = &g->ranks[r];
        if (rk->started)
            pthread_join(rk->th, NULL);
    }
    for (int32_t r = 0; r < g->size; r++) {
        struct rank *rk = &g->ranks[r];
        eng_model_destroy(rk->m);
        eng_backend_destroy(rk->be);
        eng_lm_keep_fini(&rk->keep);
        eng_comm_destroy(rk->comm);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    free(g->ranks);
    free(g);
}

inf_status_t eng_tp_group_create(const struct eng_lm_model_opts *o, struct eng_backend **backends,
                                 eng_comm_t **comms, int32_t tp, struct eng_lm *lm,
                                 struct inf_err *err)
{
    if (tp < 2)
        return inf_err_set(err, INF_E_INVALID, "a tensor-parallel group needs 2 ranks or more");
    struct group *g = calloc(1, sizeof *g);
    struct rank *ranks = calloc((size_t)tp, sizeof *ranks);
    if (!g || !ranks) {
        free(g);
        free(ranks);
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a tensor-parallel group");
    }
    g->size = tp;
    g->ranks = ranks;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    inf_status_t st = INF_OK;
    for (int32_t r = 0; r < tp && st == INF_OK; r++) {
        ranks[r] = (struct rank){.g = g, .r = r, .be = backends[r], .comm = comms[r]};
        st = eng_lm_model_load(o, backends[r], r, tp, &ranks[r].keep, &ranks[r].m, err);
    }
    for (int32_t r = 1; r < tp && st == INF_OK; r++) {
        if (pthread_create(&ranks[r].th, NULL, rank_main, &ranks[r]) != 0)
            st = inf_err_set(err, INF_E_NOMEM, "cannot start the thread of rank %d", r);
        else
            ranks[r].started = true;
    }
    if (st != INF_OK) {
        /* the caller keeps the backends and communicators */
        for (int32_t r = 0; r < tp; r++) {
            ranks[r].be = NULL;
            ranks[r].comm = NULL;
        }
        group_destroy(g);
        return st;
    }
    memset(lm, 0, sizeof *lm);
    lm->self = g;
    eng_lm_describe(lm, o, ranks[0].m, backends[0], tp);
    lm->kv_reserve = group_kv_reserve;
    lm->forward = group_forward;
    /* rank 0 samples on its device where it can; the steps are not queued
     * ahead (the other ranks take their token ids from the host) and the
     * group does not warm up (its decode graphs are recorded on first use) */
    lm->forward_sample = eng_model_can_sample(ranks[0].m) ? group_forward_sample : NULL;
    lm->destroy = group_destroy;
    for (int32_t r = 0; r < tp; r++) {
        const struct eng_tp_shape *sh = eng_model_tp_shape(ranks[r].m);
        inf_log(INFO,
                "tensor parallelism: rank %d of %d on %s: query heads %d-%d, KV heads %d-%d, MLP "
                "rows %d-%d",
                r, tp, eng_backend_name(backends[r]), sh->h0, sh->h0 + sh->n_heads - 1, sh->kv0,
                sh->kv0 + sh->n_kv_heads - 1, sh->i0, sh->i0 + sh->inter - 1);
    }
    return INF_OK;
}
