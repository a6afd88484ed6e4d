/* work.c — a request's preparation on libuv's worker pool (see srv_impl.h):
 * the loop thread never parses a large body or tokenizes a long prompt
 * itself, so one 2 MB prompt does not hold every other connection. */
#define INF_LOG_MODULE "srv"
#include "server/srv_impl.h"

#include <stddef.h>

static void on_work(uv_work_t *u)
{
    struct srv_work *w = (struct srv_work *)((char *)u - offsetof(struct srv_work, uv));
    w->fn(w);
}

static void on_work_done(uv_work_t *u, int status)
{
    struct srv_work *w = (struct srv_work *)((char *)u - offsetof(struct srv_work, uv));
    struct srv_req *r = w->r;
    struct srv_server *s = r->srv;
    (void)status; /* never cancelled: uv_cancel is not used */
    r->in_work = false;
    s->n_in_work--;
    w->done(w);
    /* done answered (or dropped) r: let libmicrohttpd go on with it, and
     * free it if its connection is already gone. */
    if (r->client_gone)
        srv_req_resume(r);
    srv_req_maybe_free(r);
}

void srv_req_work(struct srv_req *r, struct srv_work *w, void (*fn)(struct srv_work *),
                  void (*done)(struct srv_work *))
{
    struct srv_server *s = r->srv;
    w->r = r;
    w->fn = fn;
    w->done = done;
    r->in_work = true;
    s->n_in_work++;
    if (uv_queue_work(s->loop, &w->uv, on_work, on_work_done) == 0) {
        srv_req_suspend(r);
        return;
    }
    inf_log(WARN, "req=%s no worker thread: preparing on the loop", srv_req_short_id(r));
    fn(w);
    on_work_done(&w->uv, 0);
}
