/* http.c — libmicrohttpd driven by the libuv loop.
 *
 * libmicrohttpd runs with no thread of its own (MHD_USE_EPOLL without an
 * internal polling thread): its epoll fd is watched by a uv_poll_t, a
 * uv_timer_t honours MHD_get_timeout, and MHD_run is called after each event,
 * so every MHD callback runs on the loop thread. A request that waits on the
 * engine is a suspended connection; the loop resumes it when the engine's
 * events arrive. While a connection is suspended libmicrohttpd does not watch
 * its socket, so a sweep timer peeks at those sockets to notice a client that
 * went away and cancel its request. The loop accepts connections itself and
 * hands them to libmicrohttpd (conn.c). */
#define INF_LOG_MODULE "srv"
#include "api/api.h"
#include "server/srv_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define SWEEP_MS 100

/* ---- byte buffers ------------------------------------------------------------ */
bool srv_buf_put(struct srv_buf *b, const void *s, size_t n)
{
    if (!inf_grow(&b->p, &b->cap, b->len + n + 1, 256))
        return false;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

bool srv_buf_puts(struct srv_buf *b, const char *s)
{
    return srv_buf_put(b, s, strlen(s));
}

bool srv_buf_printf(struct srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !inf_grow(&b->p, &b->cap, b->len + (size_t)n + 1, 256))
        return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void srv_buf_free(struct srv_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- the id registry (engine request id -> sub-request) ---------------------------- */
void srv_sub_register(struct srv_server *s, struct srv_sub *sub)
{
    size_t h = (size_t)(sub->id % SRV_REG_BUCKETS);
    sub->hnext = s->reg[h];
    s->reg[h] = sub;
    sub->registered = true;
}

void srv_sub_unregister(struct srv_server *s, struct srv_sub *sub)
{
    if (!sub->registered)
        return;
    struct srv_sub **pp = &s->reg[sub->id % SRV_REG_BUCKETS];
    while (*pp && *pp != sub)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = sub->hnext;
    sub->hnext = NULL;
    sub->registered = false;
}

struct srv_sub *srv_sub_lookup(struct srv_server *s, uint64_t id)
{
    for (struct srv_sub *sub = s->reg[id % SRV_REG_BUCKETS]; sub; sub = sub->hnext)
        if (sub->id == id)
            return sub;
    return NULL;
}

/* ---- running libmicrohttpd ---------------------------------------------------------- */
static void on_mhd_timer(uv_timer_t *t);

static void arm_timer(struct srv_server *s)
{
    MHD_UNSIGNED_LONG_LONG ms = 0;
    if (!s->mhd)
        return;
    if (MHD_get_timeout(s->mhd, &ms) == MHD_YES) {
        /* Cap so a clock jump can never park the loop for long. */
        if (ms > 60000)
            ms = 60000;
        uv_timer_start(&s->mhd_timer, on_mhd_timer, (uint64_t)ms, 0);
    } else {
        uv_timer_stop(&s->mhd_timer);
    }
}

static void mhd_run(struct srv_server *s)
{
    if (!s->mhd || s->in_mhd_run)
        return;
    s->in_mhd_run = true;
    MHD_run(s->mhd);
    s->in_mhd_run = false;
    arm_timer(s);
}

static void on_mhd_timer(uv_timer_t *t)
{
    mhd_run(t->data);
}

static void on_mhd_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    mhd_run(p->data);
}

static void on_kick(uv_idle_t *idle)
{
    struct srv_server *s = idle->data;
    uv_idle_stop(idle);
    mhd_run(s);
}

void srv_http_kick(struct srv_server *s)
{
    if (s->mhd && !uv_is_closing((uv_handle_t *)&s->kick))
        uv_idle_start(&s->kick, on_kick);
}

/* ---- suspend / resume ---------------------------------------------------------------- */
void srv_req_suspend(struct srv_req *r)
{
    if (r->suspended || !r->conn)
        return;
    MHD_suspend_connection(r->conn);
    r->suspended = true;
}

void srv_req_resume(struct srv_req *r)
{
    if (!r->suspended || !r->conn)
        return;
    r->suspended = false;
    MHD_resume_connection(r->conn);
    srv_http_kick(r->srv);
}

void srv_req_close(struct srv_req *r)
{
    if (!r->conn)
        return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        shutdown(ci->connect_fd, SHUT_RDWR);
    srv_req_resume(r);
    srv_http_kick(r->srv);
}

/* A suspended connection is not polled by libmicrohttpd: peek at its socket to
 * see whether the client closed it, and cancel the request if so. */
static void on_sweep(uv_timer_t *t)
{
    struct srv_server *s = t->data;
    for (struct srv_req *r = s->live; r; r = r->next) {
        if (!r->suspended || !r->conn || r->cancelled || r->client_gone ||
            (!r->in_engine && !r->in_work))
            continue;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci)
            continue;
        char c;
        ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            /* A worker thread still holds a request being tokenized: only
             * mark it; its completion sees the mark. */
            if (r->in_work)
                r->client_gone = true;
            else
                srv_cmpl_cancel(r, "client closed while waiting");
        }
    }
}

/* ---- responses ---------------------------------------------------------------------- */
static void count_status(struct srv_server *s, unsigned status)
{
    unsigned cls = status / 100;
    if (cls >= 1 && cls <= 5)
        s->metrics.http_responses[cls]++;
}

void srv_req_respond(struct srv_req *r, unsigned status, struct MHD_Response *resp)
{
    if (!resp) {
        /* Nothing to send: a resumed connection without a response is closed
         * by the access handler. */
        inf_log(ERROR, "req=%s out of memory building a response", srv_req_short_id(r));
        srv_req_resume(r);
        return;
    }
    MHD_add_response_header(resp, "X-Request-Id", r->xrid_given ? srv_req_short_id(r) : r->id_str);
    srv_cors_headers(r, resp);
    if (r->responded || !r->conn) {
        MHD_destroy_response(resp);
        return;
    }
    count_status(r->srv, status);
    r->status = status;
    if (r->in_handler) {
        r->responded = true;
        if (MHD_queue_response(r->conn, status, resp) != MHD_YES)
            inf_log(WARN, "req=%s could not queue the response", srv_req_short_id(r));
        MHD_destroy_response(resp);
        return;
    }
    /* Outside the handler: libmicrohttpd queues only from inside it, so keep the
     * response and resume; the handler is called again and queues it. */
    if (r->pending)
        MHD_destroy_response(r->pending);
    r->pending = resp;
    r->pending_status = status;
    srv_req_resume(r);
}

void srv_req_respond_body(struct srv_req *r, unsigned status, const char *ctype, const char *body,
                          size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp && ctype)
        MHD_add_response_header(resp, "Content-Type", ctype);
    srv_req_respond(r, status, resp);
}

void srv_req_respond_error(struct srv_req *r, unsigned http_status, inf_status_t st,
                           const char *param, const char *code, const char *fmt, ...)
{
    char msg[INF_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned status = http_status ? http_status : (unsigned)api_status_http(st);
    /* 429s and 503s come in floods under load: the first of an interval is
     * written, the rest counted. */
    struct srv_ratelog *rl = status == 429   ? &r->srv->log_busy
                             : status == 503 ? &r->srv->log_unavailable
                                             : NULL;
    if (!rl || srv_ratelog_take(rl, inf_now_ns()))
        inf_log(INFO, "req=%s %s %s -> %u %s", srv_req_short_id(r), r->method, r->url ? r->url : "",
                status, msg);
    struct inf_arena a;
    inf_arena_init(&a, 1024);
    char *body = NULL;
    size_t len = 0;
    struct MHD_Response *resp = NULL;
    if (api_error_encode(st, msg, param, code, &a, &body, &len, NULL) == INF_OK)
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_COPY);
    inf_arena_fini(&a);
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "application/json");
        if (status == 429)
            MHD_add_response_header(resp, "Retry-After", "1");
        if (status == 401)
            MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    }
    srv_req_respond(r, status, resp);
}

/* ---- request lifetime ---------------------------------------------------------------- */
void srv_id_prefix(char out[17])
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        /* no entropy source: the clock and the pid, mixed (splitmix64) */
        v = (uint64_t)inf_now_ns() ^ ((uint64_t)getpid() << 32);
        v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
        v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
        v ^= v >> 31;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

/* A client's X-Request-Id is taken as the request's id when it has 1 to
 * SRV_XRID_MAX characters of [A-Za-z0-9._:/+=@~-] (what UUIDs, ULIDs and
 * trace ids use; nothing that could break a log line or a JSON string). */
static bool xrid_usable(const char *v)
{
    if (!v)
        return false;
    size_t n = strlen(v);
    if (n == 0 || n > SRV_XRID_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("._:/+=@~-", c)))
            return false;
    }
    return true;
}

static struct srv_req *req_new(struct srv_server *s, struct MHD_Connection *conn,
                               const char *method, const char *url)
{
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->srv = s;
    r->conn = conn;
    r->id = ++s->next_id;
    const char *xrid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    if (xrid_usable(xrid)) {
        snprintf(r->id_str, sizeof r->id_str, SRV_REQ_ID_PREFIX "%s", xrid);
        r->xrid_given = true;
    } else {
        snprintf(r->id_str, sizeof r->id_str, SRV_REQ_ID_PREFIX "%s%08llx", s->id_prefix,
                 (unsigned long long)r->id);
    }
    snprintf(r->method, sizeof r->method, "%s", method);
    r->url = strdup(url);
    r->arrival_ns = inf_now_ns();
    if (!r->url) {
        free(r);
        return NULL;
    }
    srv_cors_capture(r);
    srv_conn_set_req(srv_conn_of(conn), r);
    r->next = s->live;
    if (s->live)
        s->live->prev = r;
    s->live = r;
    s->n_live++;
    return r;
}

void srv_req_maybe_free(struct srv_req *r)
{
    if (!r->conn_done || r->in_engine || r->in_work)
        return;
    struct srv_server *s = r->srv;
    if (r->sc)
        srv_conn_set_req(r->sc, NULL);
    if (r->prev)
        r->prev->next = r->next;
    else
        s->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    s->n_live--;
    if (r->pending)
        MHD_destroy_response(r->pending);
    srv_cmpl_free(r);
    srv_buf_free(&r->body);
    free(r->origin);
    free(r->url);
    free(r);
    if (s->draining)
        srv_daemon_check_drained(s);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct srv_server *s = cls;
    struct srv_req *r = *con_cls;
    (void)conn;
    (void)s;
    if (!r)
        return;
    *con_cls = NULL;
    r->conn = NULL;
    r->conn_done = true;
    r->suspended = false;
    /* A connection the server closed (a deadline, or to make room) was
     * counted and logged there. */
    bool ours = srv_conn_closed_by_us(r->sc);
    if (r->sc) {
        struct srv_conn *sc = r->sc;
        srv_conn_set_req(sc, NULL);
        srv_conn_phase(sc, SRV_CONN_IDLE);
    }
    /* One access line per request; errors were logged with their message
     * when answered, and probes (/health, /metrics) only at DEBUG. */
    double ms = (double)(inf_now_ns() - r->arrival_ns) / 1e6;
    bool probe = strncmp(r->url, "/health", 7) == 0 || strcmp(r->url, "/metrics") == 0;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && (ours || r->client_gone))
        inf_log(DEBUG, "req=%s %s %s: connection closed after %.1f ms", srv_req_short_id(r),
                r->method, r->url, ms);
    else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        inf_log(INFO, "req=%s %s %s -> %u, connection ended early (%s) after %.1f ms",
                srv_req_short_id(r), r->method, r->url, r->status,
                toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED   ? "timeout"
                : toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? "shutdown"
                : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT    ? "client closed"
                                                                : "error",
                ms);
    else if (r->status < 400 && !probe)
        inf_log(INFO, "req=%s %s %s -> %u in %.1f ms", srv_req_short_id(r), r->method, r->url,
                r->status, ms);
    else if (r->status < 400)
        inf_log(DEBUG, "req=%s %s %s -> %u", srv_req_short_id(r), r->method, r->url, r->status);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->in_engine)
        srv_cmpl_cancel(r, toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN
                               ? "server stopped"
                               : "client closed mid-response");
    srv_req_maybe_free(r);
}

/* Content-Length checked before any body byte is read: a value over the limit
 * is answered 413 at once (libmicrohttpd then reads nothing more and closes).
 * libmicrohttpd 0.9.75 answers a Content-Length that is not a number, or does
 * not fit in 64 bits, itself (400 / 413 with its own HTML body, and it writes
 * that answer's header block twice) before this handler is called, and no
 * callback runs in between that could answer instead (docs/API.md, "Known
 * limitations", says what was tried); the checks here cover what it lets
 * through (leading blanks, values it accepted). */
static bool check_content_length(struct srv_req *r)
{
    const char *cl =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl)
        return true;
    const char *p = cl;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p < '0' || *p > '9') {
        srv_req_respond_error(r, 400, INF_E_INVALID, NULL, NULL, "Content-Length is not a number");
        return false;
    }
    unsigned long long v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (ULLONG_MAX - 9) / 10) {
            v = ULLONG_MAX;
            while (*p >= '0' && *p <= '9')
                p++;
            break;
        }
        v = v * 10 + (unsigned)(*p - '0');
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p) {
        srv_req_respond_error(r, 400, INF_E_INVALID, NULL, NULL, "Content-Length is not a number");
        return false;
    }
    if (v > r->srv->opt.max_body_bytes) {
        srv_req_respond_error(r, 413, INF_E_TOOBIG, NULL, NULL,
                              "request body of %llu bytes is over the limit of %zu bytes", v,
                              r->srv->opt.max_body_bytes);
        return false;
    }
    return true;
}

/* Whether the head announces a body (a Content-Length above 0, or chunks). */
static bool head_has_body(struct MHD_Connection *conn)
{
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
        return true;
    if (!cl)
        return false;
    while (*cl == ' ' || *cl == '\t' || *cl == '0')
        cl++;
    return *cl >= '1' && *cl <= '9';
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    struct srv_server *s = cls;
    struct srv_req *r = *con_cls;

    if (!r) {
        r = req_new(s, conn, method, url);
        if (!r)
            return MHD_NO; /* out of memory: libmicrohttpd closes the connection */
        *con_cls = r;
        bool body = head_has_body(conn);
        r->in_handler = true;
        if (srv_guard_head(r, version))
            check_content_length(r);
        r->in_handler = false;
        /* Refused on its head: the body, if any, is still on its way; the
         * connection is closed after the answer, and drained so that the
         * client reads it. */
        if (r->responded && body)
            srv_conn_linger(r->sc);
        srv_conn_phase(r->sc, body && !r->responded ? SRV_CONN_BODY : SRV_CONN_BUSY);
        return MHD_YES;
    }
    if (r->responded)
        return MHD_YES;
    if (*upload_data_size) {
        r->body_seen += *upload_data_size;
        /* A chunked body far over the limit: stop reading and close (the
         * answer 413 can only be queued once the body has ended). */
        if (r->body_too_big && r->body_seen > 16 * (uint64_t)s->opt.max_body_bytes) {
            inf_log(INFO, "req=%s body over 16x the limit without a Content-Length: closing",
                    srv_req_short_id(r));
            return MHD_NO;
        }
        if (!r->body_too_big) {
            if (r->body.len + *upload_data_size > s->opt.max_body_bytes) {
                /* A chunked body that grew over the limit: drop it, answer at the end. */
                r->body_too_big = true;
                srv_buf_free(&r->body);
            } else if (!srv_buf_put(&r->body, upload_data, *upload_data_size)) {
                r->body_too_big = true;
                srv_buf_free(&r->body);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }

    r->in_handler = true;
    if (r->pending) {
        struct MHD_Response *resp = r->pending;
        r->pending = NULL;
        r->responded = true;
        if (MHD_queue_response(conn, r->pending_status, resp) != MHD_YES)
            inf_log(WARN, "req=%s could not queue the response", srv_req_short_id(r));
        MHD_destroy_response(resp);
    } else if (!r->dispatched) {
        r->dispatched = true;
        srv_conn_phase(r->sc, SRV_CONN_BUSY);
        if (r->body_too_big)
            srv_req_respond_error(r, 413, INF_E_TOOBIG, NULL, NULL,
                                  "request body is over the limit of %zu bytes",
                                  s->opt.max_body_bytes);
        else
            srv_route(r);
    }
    r->in_handler = false;
    if (!r->responded && !r->suspended) {
        /* The client left while its request was prepared, or no answer
         * could be built (out of memory): close the connection rather than
         * be called again for nothing. */
        if (!r->client_gone)
            inf_log(ERROR, "req=%s no response to send: closing", srv_req_short_id(r));
        return MHD_NO;
    }
    return MHD_YES;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    inf_log(DEBUG, "microhttpd: %s", msg);
}

/* ---- start / stop --------------------------------------------------------------------------- */
static int bind_listen(const char *host, int32_t port, uint16_t *bound, struct inf_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", (int)port);
    int rc = getaddrinfo(host && *host ? host : NULL, portstr, &hints, &res);
    if (rc != 0) {
        inf_err_set(err, INF_E_INVALID, "host: cannot resolve \"%s\": %s", host ? host : "",
                    gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        inf_err_set(err, INF_E_IO, "port: cannot listen on %s:%d: %s", host ? host : "*", (int)port,
                    strerror(last_errno));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* Whether the socket listens on a loopback address (127.0.0.0/8, ::1, or
 * an IPv4-mapped 127.x). */
static bool is_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return false;
    if (ss.ss_family == AF_INET)
        return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

inf_status_t srv_http_bind(struct srv_server *s, struct inf_err *err)
{
    int fd = bind_listen(s->opt.host, s->opt.port, &s->port, err);
    if (fd < 0)
        return err ? err->code : INF_E_IO;
    s->listen_fd = fd;
    inf_status_t st = srv_guard_init(s, is_loopback(fd), err);
    if (st != INF_OK) {
        close(fd);
        s->listen_fd = -1;
        return st;
    }
    inf_log(INFO, "listening on %s:%u (connections are served once the model is loaded)",
            s->opt.host ? s->opt.host : "*", (unsigned)s->port);
    return INF_OK;
}

inf_status_t srv_http_start(struct srv_server *s, struct inf_err *err)
{
    inf_status_t st = srv_conns_create(s, err);
    if (st != INF_OK)
        return st;
    /* Options are passed as an array so the optional limits can be left out. */
    struct MHD_OptionItem ops[10];
    int n = 0;
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, s};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)srv_conns_notify, s};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                       (intptr_t)srv_conns_mhd_limit(s), NULL};
    if (s->opt.connection_timeout_s)
        ops[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                           (intptr_t)s->opt.connection_timeout_s, NULL};
    if (s->opt.connection_memory_limit)
        ops[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                           (intptr_t)s->opt.connection_memory_limit, NULL};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};

    /* External epoll mode (no MHD thread), suspend/resume (which brings MHD's
     * inter-thread channel, so a resume wakes its epoll fd), turbo (no
     * per-call socket sanity checks), no listening socket of its own: the
     * loop accepts and adds each connection (conn.c). */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TURBO | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET;
    /* The logger goes first so that every later message reaches it. */
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER,
                              on_mhd_log, s, MHD_OPTION_ARRAY, ops, MHD_OPTION_END);
    if (!s->mhd)
        return inf_err_set(err, INF_E_IO, "port: libmicrohttpd could not start on port %u",
                           (unsigned)s->port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!di) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        return inf_err_set(err, INF_E_INTERNAL, "libmicrohttpd has no epoll fd");
    }
    uv_poll_init(s->loop, &s->mhd_poll, di->epoll_fd);
    s->mhd_poll.data = s;
    uv_timer_init(s->loop, &s->mhd_timer);
    s->mhd_timer.data = s;
    uv_timer_init(s->loop, &s->sweep_timer);
    s->sweep_timer.data = s;
    uv_idle_init(s->loop, &s->kick);
    s->kick.data = s;
    s->n_handles += 4;
    uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
    uv_timer_start(&s->sweep_timer, on_sweep, SWEEP_MS, SWEEP_MS);
    srv_conns_accept_start(s);
    arm_timer(s);
    inf_log(INFO, "accepting connections on port %u", (unsigned)s->port);
    return INF_OK;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct srv_server *s = h->data;
    s->n_handles--;
}

void srv_http_stop(struct srv_server *s)
{
    if (!s->mhd)
        return;
    /* libmicrohttpd must not be stopped with suspended connections: resume
     * them all and let one run hand them back before stopping. */
    bool any = false;
    for (struct srv_req *r = s->live; r; r = r->next) {
        if (r->suspended && r->conn) {
            r->suspended = false;
            MHD_resume_connection(r->conn);
            any = true;
        }
    }
    if (any)
        mhd_run(s);
    srv_conns_stop(s);
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    s->listen_fd = -1;
    uv_close((uv_handle_t *)&s->mhd_poll, on_handle_closed);
    uv_close((uv_handle_t *)&s->mhd_timer, on_handle_closed);
    uv_close((uv_handle_t *)&s->sweep_timer, on_handle_closed);
    uv_close((uv_handle_t *)&s->kick, on_handle_closed);
}
