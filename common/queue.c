#include "common/inf.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct inf_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled on push and on close */
    struct inf_qnode *head, *tail;
    size_t len, capacity;
    bool closed;
};

inf_queue_t *inf_queue_create(size_t capacity)
{
    inf_queue_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&q->mu, NULL) != 0)
        goto fail_mu;
    if (pthread_cond_init(&q->cv, &ca) != 0)
        goto fail_cv;
    pthread_condattr_destroy(&ca);
    q->capacity = capacity;
    return q;

fail_cv:
    pthread_mutex_destroy(&q->mu);
fail_mu:
    pthread_condattr_destroy(&ca);
    free(q);
    return NULL;
}

void inf_queue_destroy(inf_queue_t *q)
{
    if (!q)
        return;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

inf_status_t inf_queue_push(inf_queue_t *q, struct inf_qnode *node, bool *was_empty)
{
    inf_status_t st = INF_OK;
    bool empty = false;
    node->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        st = INF_E_SHUTDOWN;
    } else if (q->capacity && q->len >= q->capacity) {
        st = INF_E_BUSY;
    } else {
        empty = q->head == NULL;
        if (q->tail)
            q->tail->next = node;
        else
            q->head = node;
        q->tail = node;
        q->len++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    if (was_empty)
        *was_empty = empty;
    return st;
}

struct inf_qnode *inf_queue_take_all(inf_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    struct inf_qnode *list = q->head;
    q->head = q->tail = NULL;
    q->len = 0;
    pthread_mutex_unlock(&q->mu);
    return list;
}

/* Wait on cv until pred or deadline; mutex held. Returns false on timeout. */
static bool wait_locked(inf_queue_t *q, int timeout_ms)
{
    if (timeout_ms < 0)
        return pthread_cond_wait(&q->cv, &q->mu) == 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(&q->cv, &q->mu, &ts) != ETIMEDOUT;
}

struct inf_qnode *inf_queue_pop(inf_queue_t *q, int timeout_ms)
{
    struct inf_qnode *n = NULL;
    uint64_t deadline = timeout_ms > 0 ? inf_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->closed && timeout_ms != 0) {
        int left = timeout_ms;
        if (timeout_ms > 0) {
            uint64_t now = inf_now_ns();
            if (now >= deadline)
                break;
            left = (int)((deadline - now + 999999ull) / 1000000ull);
        }
        if (!wait_locked(q, left) && timeout_ms > 0 && inf_now_ns() >= deadline)
            break;
    }
    if (q->head) {
        n = q->head;
        q->head = n->next;
        if (!q->head)
            q->tail = NULL;
        q->len--;
        n->next = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}

void inf_queue_wait(inf_queue_t *q, int timeout_ms)
{
    pthread_mutex_lock(&q->mu);
    if (!q->head && !q->closed && timeout_ms != 0)
        wait_locked(q, timeout_ms);
    pthread_mutex_unlock(&q->mu);
}

void inf_queue_close(inf_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

size_t inf_queue_len(inf_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->len;
    pthread_mutex_unlock(&q->mu);
    return n;
}
