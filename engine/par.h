#pragma once
/* engine/par.h — engine-internal: a small thread pool, for load-time host
 * work (converting, quantizing and repacking weights, so a checkpoint is
 * prepared on every core) and for the CPU backend's ops.
 *
 * eng_par_run splits [0, n) into chunks of `grain` items handed out in
 * turn to the pool's threads and the caller's; fn must treat every item
 * independently of the others and of which thread runs it, so results never
 * depend on the thread count. Thread: one owner calls eng_par_run at a time
 * (the pool's own threads never call it). */
#include "common/inf.h"

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

#ifdef __cplusplus
}
#endif
