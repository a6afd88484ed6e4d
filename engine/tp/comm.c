/* engine/tp/comm.c — the local communicator: the ranks of a group are
 * threads of this process and meet in shared host memory.
 *
 * An all-reduce: each rank copies its rows into its own slot, all meet at a
 * barrier, each sums the slots in rank order into its own buffer (so every
 * rank holds the same bits), and all meet again before a slot may be
 * written by the next collective. */
#define INF_LOG_MODULE "eng"
#include "engine/tp/comm_impl.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct group {
    int32_t size;
    int32_t refs; /* handles alive */
    size_t *cap;  /* [size] floats of each slot */
    float **slot; /* [size][cap[r]]: rank r's rows of a collective */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t arrived;
    uint64_t generation;
    bool aborted;
    struct eng_comm **members; /* [size]: the ranks' handles (NULL once released) */
};

static void group_free(struct group *g)
{
    for (int32_t r = 0; r < g->size; r++)
        free(g->slot[r]);
    free(g->slot);
    free(g->cap);
    free(g->members);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

inf_status_t eng_comm_local_create(int32_t size, size_t max_floats, eng_comm_t **ranks,
                                   struct inf_err *err)
{
    if (size < 1)
        return inf_err_set(err, INF_E_INVALID, "a group needs at least one rank, got %d", size);
    struct group *g = calloc(1, sizeof *g);
    if (!g)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a communicator");
    g->size = size;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->slot = calloc((size_t)size, sizeof *g->slot);
    g->cap = calloc((size_t)size, sizeof *g->cap);
    g->members = calloc((size_t)size, sizeof *g->members);
    bool ok = g->slot && g->cap && g->members;
    for (int32_t r = 0; ok && r < size && max_floats; r++) {
        ok = (g->slot[r] = malloc(max_floats * sizeof(float))) != NULL;
        g->cap[r] = ok ? max_floats : 0;
    }
    int32_t made = 0;
    for (; ok && made < size; made++) {
        eng_comm_t *c = calloc(1, sizeof *c);
        if (!c) {
            ok = false;
            break;
        }
        c->g = g;
        c->rank = made;
        c->device = -1;
        ranks[made] = c;
        g->members[made] = c;
    }
    if (!ok) {
        for (int32_t r = 0; r < made; r++)
            free(ranks[r]);
        if (g->slot && g->cap && g->members) {
            group_free(g);
        } else {
            free(g->slot);
            free(g->cap);
            free(g->members);
            free(g);
        }
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a communicator of %d ranks", size);
    }
    g->refs = size;
    return INF_OK;
}

void eng_comm_destroy(eng_comm_t *c)
{
    if (!c)
        return;
    struct group *g = c->g;
    pthread_mutex_lock(&g->mu);
    g->members[c->rank] = NULL;
    pthread_mutex_unlock(&g->mu);
    if (c->fini)
        c->fini(c);
    free(c);
    pthread_mutex_lock(&g->mu);
    const bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        group_free(g);
}

int32_t eng_comm_rank(const eng_comm_t *c)
{
    return c->rank;
}

int32_t eng_comm_size(const eng_comm_t *c)
{
    return c->g->size;
}

void eng_comm_barrier(eng_comm_t *c)
{
    struct group *g = c->g;
    if (g->size == 1)
        return;
    pthread_mutex_lock(&g->mu);
    const uint64_t gen = g->generation;
    if (g->aborted) {
        /* nobody waits for the others any more */
    } else if (++g->arrived == g->size) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->generation == gen && !g->aborted)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

void eng_comm_abort(eng_comm_t *c)
{
    struct group *g = c->g;
    pthread_mutex_lock(&g->mu);
    /* every rank's device collectives, whichever rank failed */
    for (int32_t r = 0; r < g->size && !g->aborted; r++)
        if (g->members[r] && g->members[r]->abort)
            g->members[r]->abort(g->members[r]);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static bool aborted(struct group *g);

bool eng_comm_aborted(const eng_comm_t *c)
{
    return aborted(c->g);
}

static bool aborted(struct group *g)
{
    pthread_mutex_lock(&g->mu);
    const bool a = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return a;
}

inf_status_t eng_comm_all_reduce_f32(eng_comm_t *c, float *x, int64_t ld, int32_t m, int32_t cols,
                                     struct inf_err *err)
{
    struct group *g = c->g;
    if (c->nccl)
        return inf_err_set(err, INF_E_INVALID, "all_reduce: host rows on a device communicator");
    if (m < 0 || cols < 0 || (m > 1 && ld < cols))
        return inf_err_set(err, INF_E_INVALID, "all_reduce: %d rows of %d at stride %lld", m, cols,
                           (long long)ld);
    if (g->size == 1 || m == 0 || cols == 0)
        return INF_OK;
    /* A rank's slot is read by the others only between the two barriers of
     * a collective, so each rank grows its own before it writes. */
    const size_t need = (size_t)m * (size_t)cols;
    if (need > g->cap[c->rank]) {
        float *p = realloc(g->slot[c->rank], need * sizeof *p);
        if (!p)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for an all-reduce of %d x %d", m,
                               cols);
        g->slot[c->rank] = p;
        g->cap[c->rank] = need;
    }
    float *mine = g->slot[c->rank];
    for (int32_t r = 0; r < m; r++)
        memcpy(mine + (size_t)r * cols, x + r * ld, (size_t)cols * sizeof(float));
    eng_comm_barrier(c);
    if (aborted(g))
        return inf_err_set(err, INF_E_INTERNAL, "the tensor-parallel group was aborted");
    for (int32_t r = 0; r < m; r++) {
        float *row = x + r * ld;
        for (int32_t j = 0; j < cols; j++) {
            float s = g->slot[0][(size_t)r * cols + j];
            for (int32_t k = 1; k < g->size; k++)
                s += g->slot[k][(size_t)r * cols + j];
            row[j] = s;
        }
    }
    eng_comm_barrier(c);
    return aborted(g) ? inf_err_set(err, INF_E_INTERNAL, "the tensor-parallel group was aborted")
                      : INF_OK;
}
