/* engine/par.c — the thread pool (engine/par.h).
 *
 * One job at a time. The owner publishes the job's fields, then bumps the
 * generation (release). Each worker has a slot; it claims its slot for the
 * new generation (a compare-and-swap of the slot's generation), runs its
 * part and counts it out of `pending`. The owner runs its own part, then
 * claims every slot still unclaimed and runs those parts itself: a worker
 * that is asleep or preempted (a core taken by another process) holds
 * nobody up, and a worker that wakes late finds its slot taken. Then the
 * owner waits for `pending`, the parts workers claimed, to reach zero.
 * A CPU decode step hands the pool a few dozen jobs of tens of
 * microseconds each, so waking a sleeping thread for each (a futex round
 * trip and a context switch, 20-50 us on a loaded machine) would cost as
 * much as the work: workers spin on the generation for SPIN_NS after each
 * job and only then sleep on the condition variable, and the owner spins
 * while the others finish. */
#define INF_LOG_MODULE "eng"
#include "engine/par.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long an idle worker keeps watching for the next job before it sleeps:
 * longer than the gaps inside and between decode steps (sampling, the next
 * batch), short enough that an idle server gives its cores back at once. */
#define SPIN_NS 200000
/* The owner yields its core after this long waiting for the others (one of
 * them may have been preempted on an oversubscribed machine). */
#define OWNER_YIELD_NS 50000

enum job_kind { JOB_CHUNKS, JOB_EACH };

/* The generation a worker's part was last claimed for, on a line of its own
 * (claims are written by the worker and read by the owner). */
struct slot {
    _Alignas(64) atomic_uint_fast64_t gen;
};

struct eng_par {
    int32_t n_workers; /* threads started (the owner not counted) */
    pthread_t th[ENG_PAR_MAX];
    struct slot *slots; /* [1 + n_workers]; 0 unused */
    /* the job of the current generation, written by the owner before it
     * bumps gen and read by the workers after they see the new gen */
    enum job_kind kind;
    void (*fn)(void *arg, int64_t i0, int64_t i1);
    void *arg;
    int64_t n, grain;
    _Alignas(64) atomic_int_fast64_t next; /* JOB_CHUNKS: first item not handed out */
    _Alignas(64) atomic_uint_fast64_t gen;
    _Alignas(64) atomic_int pending; /* claimed parts of the generation not done */
    atomic_int claimed;              /* slots claimed in the current generation */
    atomic_int sleepers;             /* workers asleep (or about to be) on wake */
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    bool profile;
    uint64_t stat_runs, stat_wait_ns;
};

struct worker_arg {
    struct eng_par *p;
    int32_t id; /* 1..n_workers; the owner is 0 */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

/* Thread id's part of the current job. */
static void run_part(struct eng_par *p, int32_t id)
{
    if (p->kind == JOB_EACH) {
        p->fn(p->arg, id, p->n_workers + 1);
        return;
    }
    for (;;) {
        int64_t i0 = atomic_fetch_add_explicit(&p->next, p->grain, memory_order_relaxed);
        if (i0 >= p->n)
            return;
        int64_t i1 = p->n - i0 < p->grain ? p->n : i0 + p->grain;
        p->fn(p->arg, i0, i1);
    }
}

/* Wait for a generation after seen: spin, then sleep. */
static uint64_t wait_job(struct eng_par *p, uint64_t seen, bool spin)
{
    uint64_t g;
    if (spin) {
        uint64_t t0 = now_ns();
        for (uint32_t i = 1;; i++) {
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
                return g;
            CPU_RELAX();
            if ((i & 63) == 0 && now_ns() - t0 > SPIN_NS)
                break;
        }
    }
    pthread_mutex_lock(&p->mu);
    /* sleepers before the second look at gen, both sequentially consistent:
     * either this sees the owner's new gen or the owner sees sleepers > 0
     * and broadcasts under mu, which this thread holds until it waits */
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

/* Claim slot id for generation g: false when it is taken (by the owner, or
 * g is a generation this thread saw too late: a later one was published,
 * which the owner does only once every part of g is done, stolen ones
 * included). Once a claim succeeds, g's job stays published until its part
 * is counted out, so its fields may be read. */
static bool claim(struct eng_par *p, int32_t id, uint64_t g)
{
    uint_fast64_t c = atomic_load_explicit(&p->slots[id].gen, memory_order_relaxed);
    if (c >= g || !atomic_compare_exchange_strong(&p->slots[id].gen, &c, g))
        return false;
    atomic_fetch_add_explicit(&p->claimed, 1, memory_order_relaxed);
    return true;
}

static void *worker(void *varg)
{
    struct worker_arg *wa = varg;
    struct eng_par *p = wa->p;
    const int32_t id = wa->id;
    free(wa);
    uint64_t seen = 0;
    bool spin = false; /* a new pool sleeps until its first job */
    for (;;) {
        seen = wait_job(p, seen, spin);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        if (claim(p, id, seen)) {
            run_part(p, id);
            atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
        }
        spin = true;
    }
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
    atomic_init(&p->next, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->claimed, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    int32_t n = eng_par_threads(want);
    p->slots = aligned_alloc(64, sizeof(struct slot) * (size_t)n);
    if (!p->slots) {
        free(p);
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a thread pool");
    }
    for (int32_t i = 0; i < n; i++)
        atomic_init(&p->slots[i].gen, 0);
    for (int32_t i = 0; i < n - 1; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa)
            break;
        wa->p = p;
        wa->id = p->n_workers + 1;
        if (pthread_create(&p->th[p->n_workers], NULL, worker, wa) != 0) {
            free(wa);
            break; /* a smaller pool does the same work */
        }
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
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_workers; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->slots);
    free(p);
}

int32_t eng_par_size(const eng_par_t *p)
{
    return p ? p->n_workers + 1 : 1;
}

/* Publish the job set up in p, run the owner's part, wait for the rest. */
static void dispatch(struct eng_par *p)
{
    atomic_store_explicit(&p->pending, p->n_workers, memory_order_relaxed);
    atomic_store_explicit(&p->claimed, 0, memory_order_relaxed);
    const uint64_t g = atomic_fetch_add(&p->gen, 1) + 1; /* sequentially consistent: see wait_job */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    run_part(p, 0);
    /* the parts no worker has started: here (a chunked job's are empty,
     * the owner has drained it) */
    if (atomic_load_explicit(&p->claimed, memory_order_relaxed) < p->n_workers)
        for (int32_t id = 1; id <= p->n_workers; id++)
            if (claim(p, id, g)) {
                if (p->kind == JOB_EACH)
                    run_part(p, id);
                atomic_fetch_sub_explicit(&p->pending, 1, memory_order_relaxed);
            }
    uint64_t t0 = p->profile ? now_ns() : 0;
    uint64_t spun = 0;
    for (uint32_t i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        CPU_RELAX();
        if ((i & 255) == 0) {
            uint64_t t = now_ns();
            if (!spun)
                spun = t;
            else if (t - spun > OWNER_YIELD_NS)
                sched_yield();
        }
    }
    if (p->profile) {
        p->stat_runs++;
        p->stat_wait_ns += now_ns() - t0;
    }
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
    p->kind = JOB_CHUNKS;
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    dispatch(p);
}

void eng_par_each(eng_par_t *p, void (*fn)(void *arg, int64_t id, int64_t n_threads), void *arg)
{
    if (!p || p->n_workers == 0) {
        fn(arg, 0, 1);
        return;
    }
    p->kind = JOB_EACH;
    p->fn = fn;
    p->arg = arg;
    dispatch(p);
}

void eng_par_profile(eng_par_t *p, bool on)
{
    if (!p)
        return;
    p->profile = on;
    p->stat_runs = 0;
    p->stat_wait_ns = 0;
}

void eng_par_stats(const eng_par_t *p, uint64_t *runs, uint64_t *wait_ns)
{
    *runs = p ? p->stat_runs : 0;
    *wait_ns = p ? p->stat_wait_ns : 0;
}
