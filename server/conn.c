/* conn.c — accepting connections, their deadlines, and closing them so that
 * clients read what they were sent.
 *
 * The loop accepts on the listening socket itself and hands each connection
 * to libmicrohttpd with MHD_add_connection. Before it does, it can refuse
 * one (per_ip_connections, or max_connections with nothing to make room)
 * with a 503 in OpenAI's body and Retry-After, written on the fresh socket.
 * At max_connections a new connection is taken by closing one that does no
 * work: waiting for a request's first byte (a fresh or kept-alive
 * connection), or still sending its headers, oldest first; then one still
 * sending its body. A connection whose request is being answered is never
 * closed to make room. So connections that trickle their headers (slowloris)
 * cannot lock clients out, and one client address cannot hold the server.
 *
 * Deadlines, checked four times a second: header_timeout from a request's
 * first byte until its header block is complete (libmicrohttpd's own idle
 * timeout restarts with every byte, so a byte every few seconds would hold a
 * connection for ever), body_timeout from there until its body is complete.
 * A connection waiting for its first byte has only the idle timeout
 * (limits.connection_timeout). libmicrohttpd reads whatever arrives at once,
 * so a first byte is seen in the socket's received-bytes counter (TCP_INFO).
 *
 * Lingering close. A connection answered before its request was read (a 413
 * on its Content-Length, a 400 on its framing, a refusal) still has request
 * bytes on the way; closing it then makes the kernel reset the connection,
 * and the client, still sending, loses the answer. Such a socket is kept
 * (dup'ed as libmicrohttpd lets go of it), half-closed, and read to the
 * client's end for a bounded time, as nginx's lingering_close does. */
#define INF_LOG_MODULE "srv"
#include "api/api.h"
#include "server/srv_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SWEEP_MS 250
/* Connections accepted in one callback before the loop serves others. */
#define ACCEPT_BATCH 64
/* After accept runs out of file descriptors, pause accepting this long. */
#define ACCEPT_PAUSE_MS 100
/* libmicrohttpd's own limit sits above ours: connections closed to make
 * room still count for it until it has cleaned them up. */
#define MHD_LIMIT_SLACK 1024
/* Lingering closes: at most this many at once (more are closed at once),
 * each at most this long, this long without a byte, this many bytes. */
#define LINGER_MAX 256
#define LINGER_TOTAL_NS (10ull * 1000000000ull)
#define LINGER_IDLE_NS (2ull * 1000000000ull)
#define LINGER_BYTES ((uint64_t)64 << 20)
#define IP_BUCKETS 4096

struct srv_ip {
    uint8_t a[16];
    uint32_t n;
    struct srv_ip *next;
};

struct srv_conn {
    struct srv_server *srv;
    struct MHD_Connection *mhd;
    int fd;
    struct srv_conn *prev, *next; /* oldest first */
    enum srv_conn_phase phase;
    uint64_t phase_ns;   /* when the phase began (HEAD: the request's first byte) */
    uint64_t idle_bytes; /* IDLE: bytes the socket had received when it began */
    struct srv_ip *ip;   /* its address's count (per_ip_connections) */
    char peer[48];       /* the client's address, for the log */
    struct srv_req *req; /* the request it carries, if any */
    bool closing;        /* shut down by the server: a deadline or to make room */
    bool linger;         /* answered before its request was read */
};

struct srv_linger {
    uv_poll_t poll;
    int fd;
    uint64_t until_ns, idle_until_ns, bytes;
    struct srv_conns *cs;
    struct srv_linger *prev, *next;
    bool closing;
};

struct srv_conns {
    struct srv_server *srv;
    uv_poll_t listen_poll;
    uv_timer_t sweep;
    uv_timer_t pause; /* accepting paused (out of file descriptors) */
    bool accepting, polling;
    struct srv_conn *head, *tail;
    uint32_t n, n_closing;
    struct srv_conn *adding; /* prepared for the MHD_add_connection in progress */
    struct srv_ip *ip[IP_BUCKETS];
    struct srv_linger *lingering;
    uint32_t n_lingering;
    struct srv_ratelog log_refused[SRV_REFUSE_N], log_closed[SRV_CLOSE_N], log_accept;
};

/* ---- rate-limited log lines ------------------------------------------------------ */
bool srv_ratelog_take(struct srv_ratelog *rl, uint64_t now_ns)
{
    if (rl->window_ns && now_ns - rl->window_ns < SRV_RATELOG_INTERVAL_NS) {
        rl->suppressed++;
        return false;
    }
    srv_ratelog_flush(rl, now_ns, true);
    rl->window_ns = now_ns ? now_ns : 1;
    return true;
}

void srv_ratelog_flush(struct srv_ratelog *rl, uint64_t now_ns, bool force)
{
    if (!rl->window_ns || (!force && now_ns - rl->window_ns < SRV_RATELOG_INTERVAL_NS))
        return;
    if (rl->suppressed)
        inf_log(INFO, "%s: %llu more in the last %.0f s", rl->what,
                (unsigned long long)rl->suppressed, (double)(now_ns - rl->window_ns) / 1e9);
    rl->suppressed = 0;
    rl->window_ns = 0;
}

/* ---- addresses --------------------------------------------------------------------- */
/* The address as 16 bytes (IPv4 as IPv4-mapped IPv6) and as text. */
static void addr_key(const struct sockaddr *sa, uint8_t key[16], char *text, size_t cap)
{
    memset(key, 0, 16);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &in->sin_addr, 4);
        inet_ntop(AF_INET, &in->sin_addr, text, (socklen_t)cap);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        memcpy(key, &in6->sin6_addr, 16);
        inet_ntop(AF_INET6, &in6->sin6_addr, text, (socklen_t)cap);
    } else {
        snprintf(text, cap, "?");
    }
}

static struct srv_ip *ip_find(struct srv_conns *cs, const uint8_t key[16], bool add)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ key[i]) * 16777619u;
    struct srv_ip **pp = &cs->ip[h % IP_BUCKETS];
    for (struct srv_ip *e = *pp; e; e = e->next)
        if (memcmp(e->a, key, 16) == 0)
            return e;
    if (!add)
        return NULL;
    struct srv_ip *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    memcpy(e->a, key, 16);
    e->next = *pp;
    *pp = e;
    return e;
}

static void ip_release(struct srv_conns *cs, struct srv_ip *e)
{
    if (!e || --e->n)
        return;
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ e->a[i]) * 16777619u;
    struct srv_ip **pp = &cs->ip[h % IP_BUCKETS];
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp)
        *pp = e->next;
    free(e);
}

/* ---- lingering close ----------------------------------------------------------------- */
static void on_handle_closed(uv_handle_t *h)
{
    struct srv_server *s = h->data;
    s->n_handles--;
}

static void on_linger_closed(uv_handle_t *h)
{
    struct srv_linger *l = (struct srv_linger *)h;
    struct srv_server *s = l->cs->srv;
    close(l->fd);
    free(l);
    s->n_handles--;
}

static void linger_end(struct srv_linger *l)
{
    if (l->closing)
        return;
    l->closing = true;
    struct srv_conns *cs = l->cs;
    if (l->prev)
        l->prev->next = l->next;
    else
        cs->lingering = l->next;
    if (l->next)
        l->next->prev = l->prev;
    cs->n_lingering--;
    uv_poll_stop(&l->poll);
    uv_close((uv_handle_t *)&l->poll, on_linger_closed);
}

static void on_linger_read(uv_poll_t *p, int status, int events)
{
    struct srv_linger *l = (struct srv_linger *)p;
    static char sink[65536];
    (void)events;
    if (status < 0) {
        linger_end(l);
        return;
    }
    for (;;) {
        ssize_t n = recv(l->fd, sink, sizeof sink, 0);
        if (n > 0) {
            l->bytes += (uint64_t)n;
            l->idle_until_ns = inf_now_ns() + LINGER_IDLE_NS;
            if (l->bytes > LINGER_BYTES) {
                linger_end(l);
                return;
            }
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        linger_end(l); /* the client's end (0) or an error */
        return;
    }
}

/* Take fd over: half-close it and read what the client still sends, then
 * close it. fd is non-blocking. */
static void linger_start(struct srv_conns *cs, int fd)
{
    struct srv_server *s = cs->srv;
    struct srv_linger *l = NULL;
    if (s->stopping || cs->n_lingering >= LINGER_MAX || !(l = calloc(1, sizeof *l))) {
        close(fd);
        return;
    }
    shutdown(fd, SHUT_WR);
    if (uv_poll_init(s->loop, &l->poll, fd) != 0) {
        free(l);
        close(fd);
        return;
    }
    s->n_handles++;
    l->poll.data = l;
    l->fd = fd;
    l->cs = cs;
    uint64_t now = inf_now_ns();
    l->until_ns = now + LINGER_TOTAL_NS;
    l->idle_until_ns = now + LINGER_IDLE_NS;
    l->next = cs->lingering;
    if (l->next)
        l->next->prev = l;
    cs->lingering = l;
    cs->n_lingering++;
    uv_poll_start(&l->poll, UV_READABLE | UV_DISCONNECT, on_linger_read);
}

/* ---- the connection table -------------------------------------------------------------- */
struct srv_conn *srv_conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        c ? MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT) : NULL;
    return ci ? ci->socket_context : NULL;
}

static uint64_t bytes_received(int fd)
{
    return srv_tcp_bytes_received(fd);
}

void srv_conn_phase(struct srv_conn *sc, enum srv_conn_phase p)
{
    if (!sc)
        return;
    sc->phase = p;
    sc->phase_ns = inf_now_ns();
    /* linger stays: libmicrohttpd closes a connection answered before its
     * request was read, right after the request it ends (phase IDLE). */
    if (p == SRV_CONN_IDLE)
        sc->idle_bytes = bytes_received(sc->fd);
}

void srv_conn_linger(struct srv_conn *sc)
{
    if (sc)
        sc->linger = true;
}

bool srv_conn_closed_by_us(const struct srv_conn *sc)
{
    return sc && sc->closing;
}

void srv_conn_set_req(struct srv_conn *sc, struct srv_req *r)
{
    if (!sc)
        return;
    if (sc->req && sc->req != r)
        sc->req->sc = NULL;
    sc->req = r;
    if (r)
        r->sc = sc;
}

static void conn_unlink(struct srv_conns *cs, struct srv_conn *sc)
{
    if (sc->prev)
        sc->prev->next = sc->next;
    else
        cs->head = sc->next;
    if (sc->next)
        sc->next->prev = sc->prev;
    else
        cs->tail = sc->prev;
    cs->n--;
    if (sc->closing)
        cs->n_closing--;
}

void srv_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode code)
{
    struct srv_server *s = cls;
    struct srv_conns *cs = s->conns;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct srv_conn *sc = cs->adding;
        cs->adding = NULL;
        if (!sc)
            return; /* not one we accepted: libmicrohttpd's own limits apply */
        sc->mhd = c;
        *socket_context = sc;
        sc->prev = cs->tail;
        if (cs->tail)
            cs->tail->next = sc;
        else
            cs->head = sc;
        cs->tail = sc;
        cs->n++;
        if (sc->ip)
            sc->ip->n++;
        s->metrics.conn_total++;
        s->metrics.conn_open = cs->n;
        return;
    }
    struct srv_conn *sc = *socket_context;
    *socket_context = NULL;
    if (!sc)
        return;
    conn_unlink(cs, sc);
    if (sc->req)
        sc->req->sc = NULL;
    ip_release(cs, sc->ip);
    s->metrics.conn_open = cs->n;
    /* Answered before its request was read, or request bytes still unread:
     * keep the socket past libmicrohttpd's close and drain it. */
    char c1;
    bool pending = !sc->closing && recv(sc->fd, &c1, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
    if (!s->stopping && !sc->closing && (sc->linger || pending)) {
        int fd = dup(sc->fd);
        if (fd >= 0)
            linger_start(cs, fd);
    }
    free(sc);
}

/* Shut sc's socket down: libmicrohttpd sees it at once and ends it. */
static void conn_close(struct srv_conns *cs, struct srv_conn *sc, enum srv_close why)
{
    struct srv_server *s = cs->srv;
    if (sc->closing)
        return;
    sc->closing = true;
    cs->n_closing++;
    s->metrics.conn_closed[why]++;
    shutdown(sc->fd, SHUT_RDWR);
    static const char *const what[] = {
        [SRV_CLOSE_HEADER_TIMEOUT] = "did not complete its request headers within",
        [SRV_CLOSE_BODY_TIMEOUT] = "did not complete its request body within",
        [SRV_CLOSE_EVICTED] = "made room for a new one at max_connections",
    };
    if (srv_ratelog_take(&cs->log_closed[why], inf_now_ns())) {
        if (why == SRV_CLOSE_EVICTED)
            inf_log(INFO, "closed a connection from %s (%s): it %s", sc->peer,
                    sc->phase == SRV_CONN_IDLE   ? "idle"
                    : sc->phase == SRV_CONN_HEAD ? "sending its headers"
                                                 : "sending its body",
                    what[why]);
        else
            inf_log(INFO, "closed a connection from %s: it %s %g s", sc->peer, what[why],
                    why == SRV_CLOSE_HEADER_TIMEOUT ? s->opt.header_timeout_s
                                                    : s->opt.body_timeout_s);
    }
    srv_http_kick(s);
}

/* The connection to close to make room for a new one, or NULL: idle or
 * still sending its headers, oldest first, else still sending its body. */
static struct srv_conn *pick_victim(struct srv_conns *cs)
{
    struct srv_conn *body = NULL;
    for (struct srv_conn *sc = cs->head; sc; sc = sc->next) {
        if (sc->closing)
            continue;
        if (sc->phase == SRV_CONN_IDLE || sc->phase == SRV_CONN_HEAD)
            return sc;
        if (sc->phase == SRV_CONN_BODY && !body)
            body = sc;
    }
    return body;
}

/* ---- accepting ---------------------------------------------------------------------------- */
/* Answer a refused connection on its fresh socket, then let it linger. */
static void refuse(struct srv_conns *cs, int fd, enum srv_refuse why, const char *peer)
{
    struct srv_server *s = cs->srv;
    static const char *const msg[] = {
        [SRV_REFUSE_MAX_CONNECTIONS] = "the server has too many open connections: retry later",
        [SRV_REFUSE_PER_IP] = "too many open connections from this address: retry later",
    };
    s->metrics.conn_refused[why]++;
    s->metrics.http_responses[5]++;
    if (srv_ratelog_take(&cs->log_refused[why], inf_now_ns()))
        inf_log(INFO, "refused a connection from %s with 503: %s (%s %u)", peer,
                why == SRV_REFUSE_PER_IP ? "per-address limit" : "connection limit",
                why == SRV_REFUSE_PER_IP ? "limits.per_ip_connections" : "limits.max_connections",
                why == SRV_REFUSE_PER_IP ? s->opt.max_connections_per_ip : s->opt.max_connections);
    struct inf_arena a;
    inf_arena_init(&a, 512);
    char *body = NULL;
    size_t blen = 0;
    char head[256];
    if (api_error_encode(INF_E_SHUTDOWN, msg[why], NULL, NULL, &a, &body, &blen, NULL) == INF_OK) {
        int h = snprintf(head, sizeof head,
                         "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
                         blen);
        /* A fresh socket's send buffer takes these few hundred bytes at once. */
        if (send(fd, head, (size_t)h, MSG_NOSIGNAL | MSG_DONTWAIT) == h)
            (void)send(fd, body, blen, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    inf_arena_fini(&a);
    linger_start(cs, fd);
}

static void on_listen(uv_poll_t *p, int status, int events);

static void on_pause_over(uv_timer_t *t)
{
    struct srv_conns *cs = t->data;
    if (cs->accepting && !cs->polling) {
        uv_poll_start(&cs->listen_poll, UV_READABLE, on_listen);
        cs->polling = true;
    }
}

static void accept_one(struct srv_conns *cs, int fd, const struct sockaddr_storage *ss,
                       socklen_t sl)
{
    struct srv_server *s = cs->srv;
    uint8_t key[16];
    char peer[48];
    addr_key((const struct sockaddr *)ss, key, peer, sizeof peer);
    if (s->opt.max_connections_per_ip) {
        struct srv_ip *ip = ip_find(cs, key, false);
        if (ip && ip->n >= s->opt.max_connections_per_ip) {
            refuse(cs, fd, SRV_REFUSE_PER_IP, peer);
            return;
        }
    }
    if (cs->n - cs->n_closing >= s->opt.max_connections) {
        struct srv_conn *v = pick_victim(cs);
        if (!v) {
            refuse(cs, fd, SRV_REFUSE_MAX_CONNECTIONS, peer);
            return;
        }
        conn_close(cs, v, SRV_CLOSE_EVICTED);
    }
    struct srv_conn *sc = calloc(1, sizeof *sc);
    struct srv_ip *ip = s->opt.max_connections_per_ip ? ip_find(cs, key, true) : NULL;
    if (!sc || (s->opt.max_connections_per_ip && !ip)) {
        free(sc);
        close(fd);
        return;
    }
    sc->srv = s;
    sc->fd = fd;
    sc->ip = ip;
    sc->phase = SRV_CONN_IDLE;
    sc->phase_ns = inf_now_ns();
    snprintf(sc->peer, sizeof sc->peer, "%s", peer);
    cs->adding = sc;
    if (MHD_add_connection(s->mhd, fd, (const struct sockaddr *)ss, sl) != MHD_YES) {
        /* libmicrohttpd closed fd */
        inf_log(DEBUG, "libmicrohttpd did not take a connection from %s", peer);
    }
    if (cs->adding) { /* not taken */
        cs->adding = NULL;
        if (ip && ip->n == 0) {
            ip->n = 1; /* the entry was made for it: let ip_release free it */
            ip_release(cs, ip);
        }
        free(sc);
    }
}

static void on_listen(uv_poll_t *p, int status, int events)
{
    struct srv_conns *cs = p->data;
    struct srv_server *s = cs->srv;
    (void)events;
    if (status < 0 || !s->mhd)
        return;
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (srv_ratelog_take(&cs->log_accept, inf_now_ns()))
                    inf_log(WARN, "accept: %s: pausing new connections for %d ms", strerror(errno),
                            ACCEPT_PAUSE_MS);
                uv_poll_stop(&cs->listen_poll);
                cs->polling = false;
                uv_timer_start(&cs->pause, on_pause_over, ACCEPT_PAUSE_MS, 0);
            }
            break; /* EAGAIN: none left; others: the next wake-up retries */
        }
        accept_one(cs, fd, &ss, sl);
    }
    srv_http_kick(s);
}

/* ---- deadlines ------------------------------------------------------------------------------ */
static void on_sweep(uv_timer_t *t)
{
    struct srv_conns *cs = t->data;
    struct srv_server *s = cs->srv;
    uint64_t now = inf_now_ns();
    uint64_t head_ns = (uint64_t)(s->opt.header_timeout_s * 1e9);
    uint64_t body_ns = (uint64_t)(s->opt.body_timeout_s * 1e9);
    for (struct srv_conn *sc = cs->head, *next; sc; sc = next) {
        next = sc->next;
        if (sc->closing)
            continue;
        if (sc->phase == SRV_CONN_IDLE && head_ns) {
            /* A first byte came: the request's header deadline runs from it
             * (between two sweeps; the later bound keeps the client's side). */
            uint64_t b = bytes_received(sc->fd);
            if (b > sc->idle_bytes) {
                sc->phase = SRV_CONN_HEAD;
                sc->phase_ns = now - (uint64_t)SWEEP_MS * 1000000ull / 2;
            }
        }
        if (sc->phase == SRV_CONN_HEAD && head_ns && now - sc->phase_ns > head_ns)
            conn_close(cs, sc, SRV_CLOSE_HEADER_TIMEOUT);
        else if (sc->phase == SRV_CONN_BODY && body_ns && now - sc->phase_ns > body_ns)
            conn_close(cs, sc, SRV_CLOSE_BODY_TIMEOUT);
    }
    for (struct srv_linger *l = cs->lingering, *next; l; l = next) {
        next = l->next;
        if (now >= l->until_ns || now >= l->idle_until_ns)
            linger_end(l);
    }
    for (int i = 0; i < SRV_REFUSE_N; i++)
        srv_ratelog_flush(&cs->log_refused[i], now, false);
    for (int i = 0; i < SRV_CLOSE_N; i++)
        srv_ratelog_flush(&cs->log_closed[i], now, false);
    srv_ratelog_flush(&cs->log_accept, now, false);
    srv_ratelog_flush(&s->log_busy, now, false);
    srv_ratelog_flush(&s->log_unavailable, now, false);
}

/* ---- life cycle -------------------------------------------------------------------------------
 */
inf_status_t srv_conns_create(struct srv_server *s, struct inf_err *err)
{
    struct srv_conns *cs = calloc(1, sizeof *cs);
    if (!cs)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    cs->srv = s;
    cs->log_refused[SRV_REFUSE_MAX_CONNECTIONS].what = "connections refused with 503 at the limit";
    cs->log_refused[SRV_REFUSE_PER_IP].what = "connections refused with 503 (per address)";
    cs->log_closed[SRV_CLOSE_HEADER_TIMEOUT].what = "connections closed at the header deadline";
    cs->log_closed[SRV_CLOSE_BODY_TIMEOUT].what = "connections closed at the body deadline";
    cs->log_closed[SRV_CLOSE_EVICTED].what = "connections closed to make room";
    cs->log_accept.what = "accept failures";
    s->conns = cs;
    return INF_OK;
}

unsigned srv_conns_mhd_limit(const struct srv_server *s)
{
    return s->opt.max_connections + MHD_LIMIT_SLACK;
}

void srv_conns_accept_start(struct srv_server *s)
{
    struct srv_conns *cs = s->conns;
    uv_poll_init(s->loop, &cs->listen_poll, s->listen_fd);
    cs->listen_poll.data = cs;
    uv_timer_init(s->loop, &cs->sweep);
    cs->sweep.data = cs;
    uv_timer_init(s->loop, &cs->pause);
    cs->pause.data = cs;
    s->n_handles += 3;
    cs->accepting = cs->polling = true;
    uv_poll_start(&cs->listen_poll, UV_READABLE, on_listen);
    uv_timer_start(&cs->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
}

void srv_conns_stop(struct srv_server *s)
{
    struct srv_conns *cs = s->conns;
    if (!cs || !cs->accepting)
        return;
    cs->accepting = false;
    cs->listen_poll.data = s;
    cs->sweep.data = s;
    cs->pause.data = s;
    uv_close((uv_handle_t *)&cs->listen_poll, on_handle_closed);
    uv_close((uv_handle_t *)&cs->sweep, on_handle_closed);
    uv_close((uv_handle_t *)&cs->pause, on_handle_closed);
    while (cs->lingering)
        linger_end(cs->lingering);
    for (int i = 0; i < SRV_REFUSE_N; i++)
        srv_ratelog_flush(&cs->log_refused[i], inf_now_ns(), true);
    for (int i = 0; i < SRV_CLOSE_N; i++)
        srv_ratelog_flush(&cs->log_closed[i], inf_now_ns(), true);
}

void srv_conns_destroy(struct srv_server *s)
{
    struct srv_conns *cs = s->conns;
    if (!cs)
        return;
    for (int i = 0; i < IP_BUCKETS; i++)
        for (struct srv_ip *e = cs->ip[i], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    while (cs->head) {
        struct srv_conn *sc = cs->head;
        cs->head = sc->next;
        free(sc);
    }
    free(cs);
    s->conns = NULL;
}
