/* daemon.c — the loop: engine, HTTP, the engine's events, signals and drain.
 *
 * Start-up. The address is bound (and listening) before the model loads,
 * so that a bad host or a port in use fails at once, not minutes later;
 * connections made during the load wait in the listen backlog.
 *
 * Shutdown. The first SIGTERM/SIGINT/SIGHUP only sets state: new requests are
 * answered 503 and /health/ready turns 503, the engine stops admitting, and
 * running requests go on for up to drain_timeout seconds. Then (or at once
 * when drain_timeout is 0, or on a second signal) every request still in the
 * engine is aborted: it ends with finish_reason "abort" (or an error event in
 * a stream). Once no request is left, every suspended connection is resumed,
 * libmicrohttpd is stopped, the engine is destroyed and every handle closed,
 * so uv_run returns and uv_loop_close succeeds. */
#define INF_LOG_MODULE "srv"
#include "server/srv_impl.h"

#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* After an abort, how long to wait for the aborted requests' last bytes to
 * reach their clients before stopping anyway. */
#define ABORT_GRACE_MS 3000

void srv_options_defaults(struct srv_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->host = "127.0.0.1";
    opt->port = 8000;
    opt->model_name = "int4serve";
    opt->max_body_bytes = 2u << 20;
    opt->max_connections = 1024;
    opt->connection_timeout_s = 60;
    opt->header_timeout_s = 20;
    opt->body_timeout_s = 60;
    opt->drain_timeout_s = 30;
}

/* systemd's readiness protocol without libsystemd: one datagram to the unix
 * socket named by NOTIFY_SOCKET ('@' = the abstract namespace). */
static void notify_systemd(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if (len >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) {
        inf_log(WARN, "NOTIFY_SOCKET is not a usable socket address");
        return;
    }
    memcpy(sa.sun_path, path, len);
    if (sa.sun_path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, sl) < 0)
        inf_log(WARN, "sd_notify %s failed", msg);
    close(fd);
}

/* ---- engine -> loop ------------------------------------------------------------------------- */
static void on_engine_notify(void *user)
{
    /* Engine thread: only wake the loop. */
    struct srv_server *s = user;
    uv_async_send(&s->async);
}

static struct eng_event *next_event(struct eng_event *ev)
{
    struct inf_qnode *n = ev->node.next;
    return n ? (struct eng_event *)((char *)n - offsetof(struct eng_event, node)) : NULL;
}

/* Work one loop iteration may spend on the engine's events: at most this many
 * events, and no more once this much time went by (checked every 16 events).
 * The rest waits in the loop's pending list for the next iteration, so that
 * timers, signals and other connections are served in between. */
#define EVENTS_PER_ITERATION 256
#define EVENTS_NS_PER_ITERATION (4ull * 1000000ull)

/* Move what the outbox holds to the end of the loop's pending list. */
static void take_events(struct srv_server *s)
{
    if (!s->eng)
        return;
    struct eng_event *ev = eng_events_take(s->eng);
    if (!ev)
        return;
    if (s->ev_tail)
        s->ev_tail->node.next = &ev->node;
    else
        s->ev_head = ev;
    for (struct eng_event *n = next_event(ev); n; n = next_event(n))
        ev = n;
    s->ev_tail = ev;
}

/* Dispatch pending events within one iteration's budget; true when some are
 * left for the next iteration. */
static bool dispatch_events(struct srv_server *s)
{
    take_events(s);
    uint64_t t0 = inf_now_ns();
    for (unsigned k = 0; s->ev_head; k++) {
        if (k == EVENTS_PER_ITERATION ||
            (k % 16 == 15 && inf_now_ns() - t0 > EVENTS_NS_PER_ITERATION))
            return true;
        struct eng_event *ev = s->ev_head;
        s->ev_head = next_event(ev);
        if (!s->ev_head)
            s->ev_tail = NULL;
        struct srv_sub *sub = srv_sub_lookup(s, ev->req_id);
        if (sub)
            srv_cmpl_event(sub, ev);
        else
            inf_log(DEBUG, "event for unknown request %llu dropped",
                    (unsigned long long)ev->req_id);
        eng_event_destroy(ev);
    }
    return false;
}

static void on_events_idle(uv_idle_t *idle)
{
    struct srv_server *s = idle->data;
    if (!dispatch_events(s))
        uv_idle_stop(idle);
    srv_http_kick(s);
}

static void on_async(uv_async_t *a)
{
    struct srv_server *s = a->data;
    if (dispatch_events(s) && !uv_is_closing((uv_handle_t *)&s->events_idle))
        uv_idle_start(&s->events_idle, on_events_idle);
    srv_http_kick(s);
}

/* ---- stopping ---------------------------------------------------------------------------------
 */
static void on_closed(uv_handle_t *h)
{
    struct srv_server *s = h->data;
    s->n_handles--;
}

static void stop_everything(struct srv_server *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    s->ready = false;
    inf_log(INFO, "stopping: %zu request(s) left", s->n_live);
    if (s->eng)
        eng_engine_abort_all(s->eng);
    /* One last batch for the clients; what is left is dropped unread, as
     * the requests it belongs to are freed below. */
    if (dispatch_events(s))
        inf_log(DEBUG, "stopping with engine events left undelivered");
    for (struct eng_event *ev = s->ev_head, *next; ev; ev = next) {
        next = next_event(ev);
        eng_event_destroy(ev);
    }
    s->ev_head = s->ev_tail = NULL;
    srv_http_stop(s);
    eng_engine_destroy(s->eng);
    s->eng = NULL;
    /* Requests the engine never finished (it was destroyed) are freed here. */
    while (s->live) {
        struct srv_req *r = s->live;
        if (r->in_engine) {
            r->in_engine = false;
            s->n_in_engine--;
        }
        r->conn_done = true;
        r->conn = NULL;
        srv_req_maybe_free(r);
    }
    uv_close((uv_handle_t *)&s->async, on_closed);
    uv_close((uv_handle_t *)&s->events_idle, on_closed);
    uv_close((uv_handle_t *)&s->sig_term, on_closed);
    uv_close((uv_handle_t *)&s->sig_int, on_closed);
    uv_close((uv_handle_t *)&s->sig_hup, on_closed);
    uv_close((uv_handle_t *)&s->drain_timer, on_closed);
    uv_close((uv_handle_t *)&s->stop_timer, on_closed);
    srv_ratelog_flush(&s->log_busy, inf_now_ns(), true);
    srv_ratelog_flush(&s->log_unavailable, inf_now_ns(), true);
}

static void on_stop_check(uv_timer_t *t)
{
    struct srv_server *s = t->data;
    if (s->stopping)
        return;
    /* A worker thread tokenizing a prompt reads the engine's tokenizer:
     * the engine is destroyed only once every such job is back. */
    if (s->n_in_work)
        return;
    if (s->n_in_engine == 0 && s->n_live == 0) {
        stop_everything(s);
        return;
    }
    if (s->aborting && inf_now_ns() >= s->abort_deadline_ns) {
        inf_log(WARN, "aborted requests did not finish within %d ms: stopping anyway",
                ABORT_GRACE_MS);
        stop_everything(s);
    }
}

void srv_daemon_check_drained(struct srv_server *s)
{
    /* Often called from inside libmicrohttpd's callbacks: only schedule. */
    if (s->draining && !s->stopping && !uv_is_closing((uv_handle_t *)&s->stop_timer))
        uv_timer_start(&s->stop_timer, on_stop_check, 0, 100);
}

static void abort_now(struct srv_server *s, const char *why)
{
    if (s->aborting)
        return;
    s->aborting = true;
    s->abort_deadline_ns = inf_now_ns() + (uint64_t)ABORT_GRACE_MS * 1000000ull;
    inf_log(INFO, "%s: aborting %zu request(s)", why, s->n_in_engine);
    uv_timer_stop(&s->drain_timer);
    if (s->eng)
        eng_engine_abort_all(s->eng);
    srv_daemon_check_drained(s);
}

static void on_drain_timeout(uv_timer_t *t)
{
    abort_now(t->data, "drain timeout");
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct srv_server *s = h->data;
    s->n_signals++;
    if (s->stopping)
        return;
    if (s->draining) {
        abort_now(s, "second signal");
        return;
    }
    s->draining = true;
    notify_systemd("STOPPING=1");
    inf_log(INFO, "signal %d (%s): draining %zu request(s) for up to %g s", signum,
            signum == SIGTERM  ? "SIGTERM"
            : signum == SIGINT ? "SIGINT"
                               : "SIGHUP",
            s->n_in_engine, s->opt.drain_timeout_s);
    if (s->eng)
        eng_engine_drain(s->eng);
    if (s->opt.drain_timeout_s <= 0) {
        abort_now(s, "drain timeout 0");
        return;
    }
    /* The loop's clock was read before this iteration's callbacks ran; after
     * a long batch of events it is stale and the timer would fire early. */
    uv_update_time(h->loop);
    uv_timer_start(&s->drain_timer, on_drain_timeout, (uint64_t)(s->opt.drain_timeout_s * 1000.0),
                   0);
    srv_daemon_check_drained(s);
}

/* ---- run
 * ------------------------------------------------------------------------------------------ */
inf_status_t srv_daemon_run(const struct srv_options *opt, const struct eng_config *ecfg,
                            struct inf_err *err)
{
    inf_status_t st = INF_OK;
    uv_loop_t loop;
    struct srv_server *s = calloc(1, sizeof *s);
    if (!s)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    if (uv_loop_init(&loop) != 0) {
        free(s);
        return inf_err_set(err, INF_E_INTERNAL, "cannot create the event loop");
    }
    s->loop = &loop;
    s->opt = *opt;
    s->listen_fd = -1;
    s->started_unix = (int64_t)time(NULL);
    srv_id_prefix(s->id_prefix);
    srv_metrics_init(&s->metrics);

    uv_async_init(&loop, &s->async, on_async);
    s->async.data = s;
    uv_idle_init(&loop, &s->events_idle);
    s->events_idle.data = s;
    uv_signal_init(&loop, &s->sig_term);
    s->sig_term.data = s;
    uv_signal_init(&loop, &s->sig_int);
    s->sig_int.data = s;
    uv_signal_init(&loop, &s->sig_hup);
    s->sig_hup.data = s;
    uv_timer_init(&loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_timer_init(&loop, &s->stop_timer);
    s->stop_timer.data = s;
    s->n_handles = 7;
    s->log_busy.what = "429 answers (admission queue full)";
    s->log_unavailable.what = "503 answers";

    /* Bind first: a bad host or a port in use is found before the model
     * loads. */
    st = srv_http_bind(s, err);
    if (st != INF_OK)
        goto fail_engine;
    st = eng_engine_create(ecfg, on_engine_notify, s, &s->eng, err);
    if (st != INF_OK)
        goto fail_engine;
    eng_engine_info(s->eng, &s->info);
    s->max_queue = ecfg->max_queue > 0 ? ecfg->max_queue : 256; /* the engine's default */
    inf_log(INFO, "engine: backend %s, vocab %d, context %d, KV capacity %lld tokens",
            s->info.backend_name ? s->info.backend_name : "?", (int)s->info.vocab,
            (int)s->info.max_model_len, (long long)s->info.kv_capacity_tokens);

    st = srv_http_start(s, err);
    if (st != INF_OK)
        goto fail_http;
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    /* A hangup (the terminal went away, or a "reload" by habit) drains
     * like SIGTERM: there is no configuration to reload in place. */
    uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
    s->ready = true;
    notify_systemd("READY=1");
    inf_log(INFO, "ready: serving model \"%s\" on port %u", s->opt.model_name, (unsigned)s->port);

    uv_run(&loop, UV_RUN_DEFAULT);
    goto done;

fail_http:
    eng_engine_destroy(s->eng);
    s->eng = NULL;
fail_engine:
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    s->listen_fd = -1;
    uv_close((uv_handle_t *)&s->async, on_closed);
    uv_close((uv_handle_t *)&s->events_idle, on_closed);
    uv_close((uv_handle_t *)&s->sig_term, on_closed);
    uv_close((uv_handle_t *)&s->sig_int, on_closed);
    uv_close((uv_handle_t *)&s->sig_hup, on_closed);
    uv_close((uv_handle_t *)&s->drain_timer, on_closed);
    uv_close((uv_handle_t *)&s->stop_timer, on_closed);
    uv_run(&loop, UV_RUN_DEFAULT);
done:
    if (uv_loop_close(&loop) != 0) {
        inf_log(ERROR, "the loop still has %d handle(s) open at exit", s->n_handles);
        if (st == INF_OK)
            st = inf_err_set(err, INF_E_INTERNAL, "event loop did not close cleanly");
    } else if (st == INF_OK) {
        inf_log(INFO, "stopped cleanly");
    }
    srv_conns_destroy(s);
    srv_guard_fini(s);
    free(s);
    return st;
}
