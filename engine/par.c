/* engine/par.c — the load-time thread pool (engine/par.h).
 *
 * One job at a time: the owner publishes fn/arg/n/grain under the mutex,
 * bumps the generation and wakes the workers; everyone, the owner included,
 * takes chunks from an atomic counter until none is left; the owner waits
 * until every worker has checked out of the generation. */
#define INF_LOG_MODULE "eng"
#include "engine/par.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

struct eng_par {
    int32_t n_workers; /* threads started (the owner not counted) */
    pthread_t th[ENG_PAR_MAX];
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers: a new generation or stop */
    pthread_cond_t idle; /* owner: a worker finished the generation */
    uint64_t gen;
    int32_t busy; /* workers still in the current generation */
    bool stop;
    /* the job of the current generation */
    void (*fn)(void *arg, int64_t i0, int64_t i1);
    void *arg;
    int64_t n, grain;
    atomic_int_fast64_t next; /* first item not yet handed out */
};

int32_t eng_par_threads(int32_t want)
{
    if (want > 0)
        return want < ENG_PAR_MAX ? want : ENG_PAR_MAX;
    cpu_set_t set;
    long n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n < 1)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n < ENG_PAR_MAX ? (int32_t)n : ENG_PAR_MAX;
}

/* Take chunks until the job is exhausted. */
static void drain(struct eng_par *p)
{
    for (;;) {
        int64_t i0 = atomic_fetch_add(&p->next, p->grain);
        if (i0 >= p->n)
            return;
        int64_t i1 = p->n - i0 < p->grain ? p->n : i0 + p->grain;
        p->fn(p->arg, i0, i1);
    }
}

static void *worker(void *arg)
{
    struct eng_par *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->idle);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

inf_status_t eng_par_create(int32_t want, eng_par_t **out, struct inf_err *err)
{
    *out = NULL;
    struct eng_par *p = calloc(1, sizeof *p);
    if (!p)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a thread pool");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->idle, NULL);
    atomic_init(&p->next, 0);
    int32_t n = eng_par_threads(want);
    for (int32_t i = 0; i < n - 1; i++) {
        if (pthread_create(&p->th[p->n_workers], NULL, worker, p) != 0)
            break; /* a smaller pool does the same work */
        p->n_workers++;
    }
    *out = p;
    return INF_OK;
}

void eng_par_destroy(eng_par_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_workers; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int32_t eng_par_size(const eng_par_t *p)
{
    return p ? p->n_workers + 1 : 1;
}

void eng_par_run(eng_par_t *p, int64_t n, int64_t grain,
                 void (*fn)(void *arg, int64_t i0, int64_t i1), void *arg)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (!p || p->n_workers == 0 || n <= grain) {
        for (int64_t i0 = 0; i0 < n; i0 += grain)
            fn(arg, i0, n - i0 < grain ? n : i0 + grain);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->next, 0);
    p->busy = p->n_workers;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
