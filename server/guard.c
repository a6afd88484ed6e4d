/* guard.c — what a request's head must be before anything reads its body,
 * and the headers browsers need (CORS).
 *
 * Framing (request smuggling). A proxy in front of the server may read a
 * request's length differently from libmicrohttpd 0.9.75, which takes the
 * first of two Content-Length headers and lets Transfer-Encoding win over
 * Content-Length: a request carrying both, two different lengths, a
 * Transfer-Encoding other than a lone "chunked" (or any in HTTP/1.0), or a
 * header name with blanks or other bytes a name may not hold is refused
 * with 400 and the connection closed, as RFC 9112 section 6 asks. So is an
 * HTTP/1.1 request without exactly one Host header.
 *
 * DNS rebinding. A web page can make the browser resolve its own name to
 * 127.0.0.1 and then read the server's answers as same-origin; the Host
 * header still names the page's domain. server.allowed_hosts lists the Host
 * values served; by default, when the server listens on a loopback address,
 * only loopback names.
 *
 * Cross-origin requests. A page may send a "simple" POST (text/plain, a
 * form) to any address without asking first; a JSON body's Content-Type is
 * not simple, so requiring it (415 otherwise) makes the browser ask
 * (preflight), and no CORS headers are sent unless server.cors_origins
 * lists the page's origin. */
#define INF_LOG_MODULE "srv"
#include "server/srv_impl.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- Host values ------------------------------------------------------------------ */
/* The host of a Host header value or a configured name, without port,
 * brackets or a trailing dot, lower-cased, into out. false when it is not
 * a host (empty, blanks, two colons outside brackets, ...). */
static bool host_norm(const char *v, char *out, size_t cap)
{
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    const char *h = v;
    size_t hl = n;
    if (n && v[0] == '[') {
        const char *end = memchr(v, ']', n);
        if (!end)
            return false;
        h = v + 1;
        hl = (size_t)(end - h);
        const char *rest = end + 1;
        size_t rl = n - (size_t)(rest - v);
        if (rl && (rest[0] != ':' || strspn(rest + 1, "0123456789") != rl - 1))
            return false;
    } else {
        const char *colon = memchr(v, ':', n);
        if (colon) {
            if (memchr(colon + 1, ':', n - (size_t)(colon + 1 - v)))
                return false; /* an IPv6 address must be bracketed */
            size_t pl = n - (size_t)(colon + 1 - v);
            if (strspn(colon + 1, "0123456789") < pl)
                return false;
            hl = (size_t)(colon - v);
        }
    }
    if (hl && h[hl - 1] == '.')
        hl--;
    if (hl == 0 || hl >= cap)
        return false;
    for (size_t i = 0; i < hl; i++) {
        unsigned char c = (unsigned char)h[i];
        if (c <= ' ' || c >= 0x7f || strchr("/\\@,;\"'<>{}|^`#?%[]", c))
            return false;
        out[i] = (char)tolower(c);
    }
    out[hl] = '\0';
    return true;
}

static bool host_allowed(const struct srv_server *s, const char *host)
{
    if (s->allowed_all)
        return true;
    size_t hl = strlen(host);
    for (size_t i = 0; i < s->n_allowed; i++) {
        const char *e = s->allowed[i];
        if (e[0] == '.') {
            /* ".example.com": example.com and every name under it */
            size_t el = strlen(e);
            if (strcmp(host, e + 1) == 0 || (hl > el && strcmp(host + hl - el, e) == 0))
                return true;
        } else if (strcmp(host, e) == 0) {
            return true;
        }
    }
    return false;
}

inf_status_t srv_guard_init(struct srv_server *s, bool loopback, struct inf_err *err)
{
    const struct srv_options *o = &s->opt;
    static const char *const LOOPBACK[] = {".localhost", "127.0.0.1", "::1"};
    size_t n = o->n_allowed_hosts ? o->n_allowed_hosts : 4;
    s->allowed_all = false;
    s->n_allowed = 0;
    s->allowed = calloc(n, sizeof *s->allowed);
    if (!s->allowed)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < o->n_allowed_hosts; i++) {
        const char *e = o->allowed_hosts[i];
        char buf[256];
        if (strcmp(e, "*") == 0) {
            s->allowed_all = true;
            continue;
        }
        bool dot = e[0] == '.';
        if (!host_norm(dot ? e + 1 : e, buf + dot, sizeof buf - 1))
            return inf_err_set(err, INF_E_INVALID,
                               "allowed_hosts: \"%.64s\" is not a host name or address", e);
        buf[0] = dot ? '.' : buf[0];
        if (!(s->allowed[s->n_allowed++] = strdup(buf)))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    if (o->n_allowed_hosts)
        return INF_OK;
    if (!loopback) {
        s->allowed_all = true; /* reachable from elsewhere: names are the operator's */
        return INF_OK;
    }
    for (size_t i = 0; i < 3; i++)
        if (!(s->allowed[s->n_allowed++] = strdup(LOOPBACK[i])))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
    char buf[256];
    if (o->host && host_norm(o->host, buf, sizeof buf) && !host_allowed(s, buf) &&
        !(s->allowed[s->n_allowed++] = strdup(buf)))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    return INF_OK;
}

void srv_guard_fini(struct srv_server *s)
{
    for (size_t i = 0; i < s->n_allowed; i++)
        free((void *)s->allowed[i]);
    free(s->allowed);
    s->allowed = NULL;
    s->n_allowed = 0;
}

/* ---- the head ------------------------------------------------------------------------ */
struct head_scan {
    unsigned n_cl, n_te, n_host;
    bool cl_differ, bad_name;
    char cl[32];      /* the first Content-Length, trimmed */
    const char *te;   /* the first Transfer-Encoding */
    const char *host; /* the first Host */
    char bad[48];     /* the first bad header name */
};

/* v without blanks around it, as [*p, *p + *n). */
static void trim(const char *v, const char **p, size_t *n)
{
    size_t len = strlen(v);
    while (len && (*v == ' ' || *v == '\t'))
        v++, len--;
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    *p = v;
    *n = len;
}

static bool is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    struct head_scan *h = cls;
    (void)kind;
    if (!key)
        return MHD_YES;
    bool bad = !*key;
    for (const unsigned char *k = (const unsigned char *)key; *k && !bad; k++)
        bad = !is_tchar(*k);
    if (bad && !h->bad_name)
        snprintf(h->bad, sizeof h->bad, "%s", key);
    h->bad_name = h->bad_name || bad;
    const char *v = value ? value : "";
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        const char *p;
        size_t n;
        trim(v, &p, &n);
        if (h->n_cl++ == 0)
            snprintf(h->cl, sizeof h->cl, "%.*s", (int)(n < 31 ? n : 31), p);
        else if (strlen(h->cl) != n || strncmp(h->cl, p, n) != 0)
            h->cl_differ = true;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        if (h->n_te++ == 0)
            h->te = v;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        if (h->n_host++ == 0)
            h->host = v;
    }
    return MHD_YES;
}

static bool refuse_head(struct srv_req *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static bool refuse_head(struct srv_req *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_req_respond_error(r, 400, INF_E_INVALID, NULL, NULL, "%s", msg);
    return false;
}

bool srv_guard_head(struct srv_req *r, const char *version)
{
    struct head_scan h = {0};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, scan_header, &h);
    bool http11 = version && strcmp(version, MHD_HTTP_VERSION_1_0) != 0;
    if (h.bad_name)
        return refuse_head(r, "the header name \"%.40s\" is not a valid field name", h.bad);
    if (h.cl_differ)
        return refuse_head(r, "the request has Content-Length headers with different values");
    if (h.n_te) {
        const char *p;
        size_t n;
        trim(h.te, &p, &n);
        if (h.n_cl)
            return refuse_head(r, "the request has both Content-Length and Transfer-Encoding");
        if (!http11)
            return refuse_head(r, "Transfer-Encoding is not allowed in an HTTP/1.0 request");
        if (h.n_te > 1 || n != 7 || strncasecmp(p, "chunked", 7) != 0)
            return refuse_head(r,
                               "Transfer-Encoding \"%.40s\" is not supported: send a "
                               "Content-Length, or \"chunked\" alone",
                               h.te);
    }
    if (http11 && h.n_host != 1)
        return refuse_head(r, "%s",
                           h.n_host ? "the request has more than one Host header"
                                    : "an HTTP/1.1 request needs a Host header");
    if (h.n_host) {
        char host[256];
        if (!host_norm(h.host, host, sizeof host))
            return refuse_head(r, "the Host header \"%.64s\" is not a host", h.host);
        if (!host_allowed(r->srv, host))
            return refuse_head(r, "the host \"%.64s\" is not served here (server.allowed_hosts)",
                               host);
    }
    return true;
}

/* ---- Content-Type -------------------------------------------------------------------- */
static bool is_json_type(const char *ct)
{
    const char *p;
    size_t n;
    trim(ct, &p, &n);
    const char *semi = memchr(p, ';', n);
    if (semi)
        n = (size_t)(semi - p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    static const char app[] = "application/";
    if (n < sizeof app || strncasecmp(p, app, sizeof app - 1) != 0)
        return false;
    const char *sub = p + sizeof app - 1;
    size_t sl = n - (sizeof app - 1);
    return (sl == 4 && strncasecmp(sub, "json", 4) == 0) ||
           (sl > 5 && strncasecmp(sub + sl - 5, "+json", 5) == 0);
}

bool srv_guard_content_type(struct srv_req *r)
{
    if (r->body.len == 0)
        return true; /* the handler answers an empty body */
    const char *ct =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (ct && is_json_type(ct))
        return true;
    srv_req_respond_error(r, 415, INF_E_UNSUPPORTED, NULL, NULL,
                          "the request body must be JSON sent with Content-Type: "
                          "application/json, got %s%.64s%s",
                          ct ? "\"" : "", ct ? ct : "none", ct ? "\"" : "");
    return false;
}

/* ---- CORS ----------------------------------------------------------------------------- */
static bool cors_any(const struct srv_server *s)
{
    for (size_t i = 0; i < s->opt.n_cors_origins; i++)
        if (strcmp(s->opt.cors_origins[i], "*") == 0)
            return true;
    return false;
}

void srv_cors_capture(struct srv_req *r)
{
    const struct srv_options *o = &r->srv->opt;
    if (!o->n_cors_origins || !r->conn)
        return;
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!origin || !*origin || strlen(origin) > 512)
        return;
    for (const char *c = origin; *c; c++)
        if ((unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f)
            return;
    bool ok = cors_any(r->srv);
    for (size_t i = 0; !ok && i < o->n_cors_origins; i++)
        ok = strcasecmp(o->cors_origins[i], origin) == 0;
    if (ok)
        r->origin = strdup(origin);
}

void srv_cors_headers(const struct srv_req *r, struct MHD_Response *resp)
{
    if (!r->origin)
        return;
    if (cors_any(r->srv)) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    } else {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
}

bool srv_cors_preflight(struct srv_req *r, const char *method)
{
    const struct srv_options *o = &r->srv->opt;
    if (!o->n_cors_origins || strcmp(r->method, "OPTIONS") != 0)
        return false;
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return false;
    if (!r->origin) {
        srv_req_respond_error(r, 403, INF_E_AUTH, NULL, NULL,
                              "the origin \"%.64s\" is not allowed (server.cors_origins)", origin);
        return true;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp) {
        bool get = strcmp(method, "GET") == 0;
        MHD_add_response_header(resp, "Access-Control-Allow-Methods",
                                get ? "GET, HEAD, OPTIONS" : "POST, OPTIONS");
        const char *want =
            MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        bool echo = want && strlen(want) < 512;
        for (const char *c = want; echo && *c; c++)
            echo = is_tchar((unsigned char)*c) || *c == ',' || *c == ' ';
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                echo ? want : "Authorization, Content-Type, X-Request-Id");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    srv_req_respond(r, 204, resp);
    return true;
}
