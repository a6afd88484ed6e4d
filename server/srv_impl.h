#pragma once
/* server — internals shared by the files of server/ (never included elsewhere).
 *
 * Threads: everything here runs on the loop thread, which owns the uv_loop_t,
 * the libmicrohttpd daemon (external epoll mode: every MHD callback runs
 * inside MHD_run on the loop), every connection and every struct srv_req.
 * The engine is reached only through eng.h; its events come back through the
 * outbox and the uv_async_t. */
#include "engine/eng.h"
#include "server/srv.h"

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* ---- growable byte buffer ------------------------------------------------ */
struct srv_buf {
    char *p;
    size_t len, cap;
};
/* Append n bytes (keeps a NUL after them). false on out of memory. */
bool srv_buf_put(struct srv_buf *b, const void *s, size_t n);
bool srv_buf_puts(struct srv_buf *b, const char *s);
bool srv_buf_printf(struct srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(struct srv_buf *b);

/* ---- metrics (metrics.c) --------------------------------------------------- */
#define SRV_HIST_MAX_BUCKETS 24
struct srv_hist {
    const double *bounds; /* upper bounds in seconds, ascending */
    int n_bounds;
    uint64_t counts[SRV_HIST_MAX_BUCKETS]; /* per bucket (not cumulative); [n_bounds] = +Inf */
    double sum;
    uint64_t count;
};

/* Why a connection was refused at accept, or closed by the server. */
enum srv_refuse { SRV_REFUSE_MAX_CONNECTIONS, SRV_REFUSE_PER_IP, SRV_REFUSE_N };
enum srv_close { SRV_CLOSE_HEADER_TIMEOUT, SRV_CLOSE_BODY_TIMEOUT, SRV_CLOSE_EVICTED, SRV_CLOSE_N };

struct srv_metrics {
    struct srv_hist ttft, itl, e2e, queue;
    uint64_t success[4];        /* by enum eng_finish: [STOP], [LENGTH], [ABORT] */
    uint64_t errors_total;      /* requests that ended with an engine error */
    uint64_t http_responses[6]; /* by status class: [2] 2xx ... [5] 5xx */
    uint64_t conn_open;         /* connections open now */
    uint64_t conn_total;        /* connections accepted and served */
    uint64_t conn_refused[SRV_REFUSE_N];
    uint64_t conn_closed[SRV_CLOSE_N];
};

/* A log line that may repeat many times a second (a 429, a refused
 * connection): the first of an interval is written in full, the rest are
 * counted and written as one line with their number when the interval ends
 * (srv_ratelog_flush, from a timer). */
#define SRV_RATELOG_INTERVAL_NS (10ull * 1000000000ull)
struct srv_ratelog {
    const char *what;    /* "429 (queue full)": names the events in the summary line */
    uint64_t window_ns;  /* start of the open interval; 0 = none open */
    uint64_t suppressed; /* events not written in the open interval */
};
/* true: write the event's own line now (the first of an interval). */
bool srv_ratelog_take(struct srv_ratelog *rl, uint64_t now_ns);
/* Write the summary of an interval that is over (or of any, when force). */
void srv_ratelog_flush(struct srv_ratelog *rl, uint64_t now_ns, bool force);

void srv_metrics_init(struct srv_metrics *m);
void srv_hist_observe(struct srv_hist *h, double seconds);
/* Prometheus text exposition of m and the engine's snapshot st; malloc'd. */
char *srv_metrics_render(const struct srv_metrics *m, const struct eng_stats *st, size_t *len);

/* ---- requests ---------------------------------------------------------------- */
struct srv_cmpl; /* completion state, completion.c */
struct srv_server;
struct srv_req;

/* One engine request of an HTTP request (one per prompt), known to the
 * registry by its engine id. */
struct srv_sub {
    uint64_t id;
    struct srv_req *r;
    uint32_t index; /* prompt index */
    bool registered;
    bool submitted;
    bool done; /* its last engine event (DONE or ERROR) was seen */
    struct srv_sub *hnext;
};

#define SRV_REQ_ID_PREFIX "cmpl-"

/* The longest X-Request-Id taken from a client. */
#define SRV_XRID_MAX 128

struct srv_conn;

struct srv_req {
    uint64_t id;
    char id_str[sizeof SRV_REQ_ID_PREFIX + SRV_XRID_MAX];
    /* SRV_REQ_ID_PREFIX "<id>": the completion id; the logs write req=<id>
     * (srv_req_short_id). <id> is the client's X-Request-Id when it sent a
     * usable one, else "<process prefix><n>". */
    bool xrid_given;     /* <id> came from the client: X-Request-Id echoes it */
    struct srv_conn *sc; /* its connection's state; NULL once that is gone */
    char *origin;        /* the Origin header when CORS headers are to be sent */
    struct srv_server *srv;
    struct MHD_Connection *conn; /* NULL once libmicrohttpd is done with it */
    struct srv_req *prev, *next; /* every live request */
    char method[8];
    char *url;
    struct srv_buf body;
    bool body_too_big;
    uint64_t body_seen; /* bytes received, kept or not */
    bool in_handler;    /* inside the access handler: responses queue directly */
    bool responded;     /* a response is queued */
    bool suspended;
    bool in_engine;               /* submitted; the engine's last event not yet seen */
    bool conn_done;               /* libmicrohttpd called request-completed */
    bool cancelled;               /* eng_request_cancel was sent */
    bool dispatched;              /* routed once the body was complete */
    bool in_work;                 /* a worker thread holds it (tokenization) */
    bool client_gone;             /* seen closed while suspended */
    struct MHD_Response *pending; /* to queue when resumed */
    unsigned pending_status;
    unsigned status; /* the HTTP status answered (for the access log) */
    uint64_t arrival_ns;
    struct srv_cmpl *cmpl;
};

/* The request id without SRV_REQ_ID_PREFIX: what the logs write after req=
 * and what the completion encoder prefixes itself. */
static inline const char *srv_req_short_id(const struct srv_req *r)
{
    return r->id_str + sizeof SRV_REQ_ID_PREFIX - 1;
}

/* ---- the server ------------------------------------------------------------------ */
#define SRV_REG_BUCKETS 1024

struct srv_server {
    uv_loop_t *loop;
    struct srv_options opt;
    eng_engine_t *eng;
    struct eng_info info;
    int32_t max_queue; /* the engine's admission bound: most prompts one request may hold */
    struct MHD_Daemon *mhd;
    int listen_fd;
    uint16_t port;
    uv_poll_t mhd_poll;                  /* MHD's epoll fd */
    uv_timer_t mhd_timer;                /* MHD_get_timeout */
    uv_async_t async;                    /* engine outbox went non-empty */
    uv_idle_t events_idle;               /* started while events wait in the pending list */
    struct eng_event *ev_head, *ev_tail; /* taken from the outbox, not yet dispatched */
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t drain_timer;
    uv_timer_t sweep_timer;  /* watches suspended connections for a closed client */
    uv_idle_t kick;          /* one more MHD_run on the next iteration */
    struct srv_conns *conns; /* conn.c: accepting, connection states, deadlines */
    int n_handles;           /* initialised handles still to close */
    size_t n_in_work;        /* requests a worker thread holds */
    bool in_mhd_run;
    bool ready;    /* model loaded, serving */
    bool draining; /* SIGTERM seen: new requests 503 */
    bool aborting; /* drain over: everything aborted */
    bool stopping; /* daemon being stopped */
    int n_signals;
    uint64_t next_id;
    char id_prefix[17]; /* 16 random hex digits per process: ids differ across
                           replicas and restarts */
    uint64_t abort_deadline_ns;
    int64_t started_unix;
    uv_timer_t stop_timer; /* polls for the end of a drain */
    struct srv_sub *reg[SRV_REG_BUCKETS];
    struct srv_req *live; /* list of every live request */
    size_t n_live;
    size_t n_in_engine;
    struct srv_metrics metrics;
    struct srv_ratelog log_busy, log_unavailable; /* 429s and 503s */
    /* guard.c: the Host values served (allowed_all: any) */
    bool allowed_all;
    const char **allowed;
    size_t n_allowed;
};

/* http.c */
/* Bind and listen on opt.host:opt.port (s->listen_fd, s->port); nothing is
 * accepted until srv_http_start. Errors name the key: INF_E_INVALID (host),
 * INF_E_IO (the port). */
inf_status_t srv_http_bind(struct srv_server *s, struct inf_err *err);
/* Start libmicrohttpd on the bound socket and begin accepting. */
inf_status_t srv_http_start(struct srv_server *s, struct inf_err *err);
/* Resume every suspended connection, stop the daemon and close its handles. */
void srv_http_stop(struct srv_server *s);
/* Ask for an MHD_run on the next loop iteration (after resumes). */
void srv_http_kick(struct srv_server *s);
/* Queue resp (a response this call takes over) as r's answer: directly when
 * inside the access handler, else after resuming the connection. Adds
 * X-Request-Id. */
void srv_req_respond(struct srv_req *r, unsigned status, struct MHD_Response *resp);
/* A body (copied) with its content type. */
void srv_req_respond_body(struct srv_req *r, unsigned status, const char *ctype, const char *body,
                          size_t len);
/* OpenAI's error body for st (HTTP status from api_status_http unless
 * http_status != 0); param and code may be NULL (null). */
void srv_req_respond_error(struct srv_req *r, unsigned http_status, inf_status_t st,
                           const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Suspend r's connection (inside a handler or a content reader). */
void srv_req_suspend(struct srv_req *r);
/* Resume r's connection if suspended (outside MHD callbacks) and kick. */
void srv_req_resume(struct srv_req *r);
/* Close r's connection (outside MHD callbacks): shut its socket down and
 * resume it, so libmicrohttpd sees the error and ends the request. */
void srv_req_close(struct srv_req *r);
/* The engine-id registry: add, remove (no-op when absent), find. */
void srv_sub_register(struct srv_server *s, struct srv_sub *sub);
void srv_sub_unregister(struct srv_server *s, struct srv_sub *sub);
struct srv_sub *srv_sub_lookup(struct srv_server *s, uint64_t id);
/* Free r if neither libmicrohttpd nor the engine needs it any more. */
void srv_req_maybe_free(struct srv_req *r);

/* ---- connections (conn.c) -------------------------------------------------------
 * The loop accepts on the listening socket itself and hands each connection
 * to libmicrohttpd (MHD_add_connection), so that it can refuse one with an
 * answer (503, OpenAI's body, Retry-After), make room at max_connections by
 * closing idle or slow connections, and keep per-connection deadlines:
 * header_timeout from a request's first byte to the end of its headers,
 * body_timeout from there to the end of its body. A connection answered
 * before its request was read is closed by half-closing it and reading what
 * the client still sends (bounded), so that the client reads the answer. */
enum srv_conn_phase {
    SRV_CONN_IDLE, /* waiting for a request's first byte (new, or kept alive) */
    SRV_CONN_HEAD, /* a request began: its header block is not complete */
    SRV_CONN_BODY, /* headers complete, body being read */
    SRV_CONN_BUSY, /* the request is complete: being answered */
};

inf_status_t srv_conns_create(struct srv_server *s, struct inf_err *err);
/* Begin accepting on s->listen_fd (after MHD_start_daemon). */
void srv_conns_accept_start(struct srv_server *s);
/* Stop accepting, close the listening socket and every lingering close. */
void srv_conns_stop(struct srv_server *s);
/* Free what srv_conns_create allocated (after the loop has closed). */
void srv_conns_destroy(struct srv_server *s);
/* MHD_OPTION_NOTIFY_CONNECTION. */
void srv_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* The state of the connection c (NULL if unknown). */
struct srv_conn *srv_conn_of(struct MHD_Connection *c);
/* The connection moved to phase p (BODY, BUSY, IDLE after a request). */
void srv_conn_phase(struct srv_conn *sc, enum srv_conn_phase p);
/* The request was answered before its body was read: drain before closing. */
void srv_conn_linger(struct srv_conn *sc);
/* true when the server closed it (deadline, eviction): its end is counted
 * and logged there. */
bool srv_conn_closed_by_us(const struct srv_conn *sc);
/* r is the request sc carries now (NULL: none); keeps r->sc in step. */
void srv_conn_set_req(struct srv_conn *sc, struct srv_req *r);
/* Bytes the TCP socket fd has received so far (TCP_INFO), 0 when the
 * kernel does not say (tcpinfo.c). */
uint64_t srv_tcp_bytes_received(int fd);
/* libmicrohttpd's connection limit: above max_connections, as connections
 * closed to make room count for it until it has cleaned them up. */
unsigned srv_conns_mhd_limit(const struct srv_server *s);

/* ---- guard.c: checks on a request's head, CORS ------------------------------------- */
/* The Host values served, from opt and whether the listening address is a
 * loopback one. */
inf_status_t srv_guard_init(struct srv_server *s, bool loopback, struct inf_err *err);
void srv_guard_fini(struct srv_server *s);
/* The head of a new request (inside its first handler call): framing
 * (Content-Length, Transfer-Encoding), header names, Host, allowed_hosts.
 * On a fault answers 400 and returns false. */
bool srv_guard_head(struct srv_req *r, const char *version);
/* A POST body's Content-Type: application/json (or +json) or 415. */
bool srv_guard_content_type(struct srv_req *r);
/* Keep the Origin header when CORS headers are to be sent to it. */
void srv_cors_capture(struct srv_req *r);
/* Add CORS headers to resp when r's origin is allowed. */
void srv_cors_headers(const struct srv_req *r, struct MHD_Response *resp);
/* An OPTIONS preflight on a route serving method: answered (204, or 403 for
 * an origin not listed) when CORS is on and the request has an Origin;
 * false when it is not a preflight to answer. */
bool srv_cors_preflight(struct srv_req *r, const char *method);

/* ---- work.c: a request's CPU-heavy preparation off the loop ----------------------
 * Parsing a large body and tokenizing a prompt (2 MB take about 100 ms) run
 * on libuv's worker pool: the request's connection is suspended meanwhile,
 * r is kept alive (r->in_work), and done runs back on the loop. fn may read
 * r's body and the engine's tokenizer (thread-safe) and write only the
 * state that embeds the job; the loop touches neither until done. */
struct srv_work {
    uv_work_t uv;
    struct srv_req *r;
    void (*fn)(struct srv_work *w);   /* on a worker thread */
    void (*done)(struct srv_work *w); /* on the loop; r->client_gone says whether anyone waits */
};
/* Start w for r (inside the handler). Without a worker (uv_queue_work
 * failed) fn and done run at once, on the loop. */
void srv_req_work(struct srv_req *r, struct srv_work *w, void (*fn)(struct srv_work *),
                  void (*done)(struct srv_work *));

/* route.c: answer a request whose body is complete (inside the handler). */
void srv_route(struct srv_req *r);

/* completion.c */
void srv_cmpl_handle(struct srv_req *r);                        /* POST /v1/completions */
void srv_cmpl_event(struct srv_sub *sub, struct eng_event *ev); /* one engine event */
/* Unregister r's engine ids and free its completion state (NULL: no-op). */
void srv_cmpl_free(struct srv_req *r);
/* The client went away (or the server aborts): cancel in the engine. */
void srv_cmpl_cancel(struct srv_req *r, const char *why);

/* daemon.c: called when a request leaves the engine, to finish a drain. */
void srv_daemon_check_drained(struct srv_server *s);

/* 16 random hex digits (getrandom; the clock and pid mixed without it) for
 * this process's request ids. Thread: any. */
void srv_id_prefix(char out[17]);
