#pragma once
/* engine/par.h — engine-internal: a small thread pool, for load-time host
 * work (converting, quantizing and repacking weights, so a checkpoint is
 * prepared on every core) and for the CPU backend's ops.
 *
 * eng_par_run splits [0, n) into chunks of `grain` items handed out in
 * turn to the pool's threads and the caller's; fn must treat every item
 * independently of the others and of which thread runs it, so results never
 * depend on the thread count. eng_par_each runs fn once on every thread,
 * each knowing its index, for work split statically (the same thread takes
 * the same rows of a weight at every step, so they stay in its cache).
 * Threads stay up between runs; an idle one watches for the next run for a
 * fraction of a millisecond before it sleeps, so back-to-back runs cost no
 * context switch. Thread: one owner calls eng_par_run / eng_par_each at a
 * time (the pool's own threads never call them). */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENG_PAR_MAX 1024 /* threads in one pool, the caller included */

typedef struct eng_par eng_par_t;

/* Threads a pool of `want` gets: want when > 0 (at most ENG_PAR_MAX), else
 * the cores this process may run on. Thread: any. */
int32_t eng_par_threads(int32_t want);

/* A pool of eng_par_threads(want) threads, the caller counting as one (so
 * want 1 starts none). A thread that cannot be started leaves the pool
 * smaller; the work still gets done. Errors: INF_E_NOMEM. */
inf_status_t eng_par_create(int32_t want, eng_par_t **out, struct inf_err *err);
/* Stop and join the threads. NULL is a no-op. */
void eng_par_destroy(eng_par_t *p);
/* Threads that take part in a run, the caller included (1 for NULL). */
int32_t eng_par_size(const eng_par_t *p);

/* Call fn(arg, i0, i1) over consecutive chunks [i0, i1) of [0, n), at most
 * grain items each (grain < 1 counts as 1), on the pool's threads and the
 * caller's; returns when every chunk is done. p NULL: all on the caller. */
void eng_par_run(eng_par_t *p, int64_t n, int64_t grain,
                 void (*fn)(void *arg, int64_t i0, int64_t i1), void *arg);

/* Call fn(arg, id, n_threads) once for every id < n_threads, the pool's
 * size: id 0 on the caller, id i on the pool's thread i unless that thread
 * has not started it by the time the caller finished its own (asleep, or
 * its core taken by another process): then on the caller too. Returns when
 * all are done. p NULL: fn(arg, 0, 1) on the caller. */
void eng_par_each(eng_par_t *p, void (*fn)(void *arg, int64_t id, int64_t n_threads), void *arg);

/* Count runs that woke the pool and the nanoseconds the caller waited for
 * the other threads after its own part (their imbalance and hand-off
 * latency), from zero, while on (default off). Thread: the owner. */
void eng_par_profile(eng_par_t *p, bool on);
void eng_par_stats(const eng_par_t *p, uint64_t *runs, uint64_t *wait_ns);

#ifdef __cplusplus
}
#endif
