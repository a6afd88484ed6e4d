/* harness.c — start/stop the real daemon and talk HTTP to it (see harness.h). */
#include "harness.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
#include <unistd.h>

const char *it_backend = "mock";

const char *it_env_backend(void)
{
    const char *b = getenv("INT4SERVE_IT_BACKEND");
    return b && *b ? b : NULL;
}

bool it_model(unsigned seed, char *dir, size_t cap, bool *owned)
{
    const char *bdir = getenv("INT4SERVE_BUILD_DIR");
    const char *want = getenv("INT4SERVE_IT_MODEL");
    const char *preset = getenv("INT4SERVE_IT_PRESET");
    *owned = !(want && *want);
    if (*owned)
        snprintf(dir, cap, "/tmp/int4serve-it-model-%d", (int)getpid());
    else
        snprintf(dir, cap, "%s", want);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (!*owned && access(cfg, R_OK) == 0)
        return true;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s/tools/mkmodel/int4serve-mkmodel' --out '%s' --preset '%s' --seed %u >/dev/null",
             bdir ? bdir : ".", dir, preset && *preset ? preset : "tiny", seed);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot make the model: %s\n", cmd);
        return false;
    }
    return true;
}

double it_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A port nobody listens on now: bind 127.0.0.1:0, read it back, close. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

char *it_log(const struct it_server *s)
{
    FILE *f = fopen(s->log_path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

static char g_hooks[8][96];
static int g_n_hooks;

void it_hook(const char *key, const char *value)
{
    char kv[96];
    snprintf(kv, sizeof kv, "testing.%s=%s", key, value);
    size_t klen = strlen("testing.") + strlen(key) + 1; /* "testing.key=" */
    for (int i = 0; i < g_n_hooks; i++)
        if (strncmp(g_hooks[i], kv, klen) == 0) {
            snprintf(g_hooks[i], sizeof g_hooks[i], "%s", kv);
            return;
        }
    if (g_n_hooks < 8)
        snprintf(g_hooks[g_n_hooks++], sizeof g_hooks[0], "%s", kv);
}

static bool spawn(struct it_server *s, const char *const *extra)
{
    const char *bdir = getenv("INT4SERVE_BUILD_DIR");
    char exe[512];
    snprintf(exe, sizeof exe, "%s/server/int4serve", bdir ? bdir : ".");
    static int seq;
    snprintf(s->log_path, sizeof s->log_path, "/tmp/int4serve-it-%d-%d.log", (int)getpid(), ++seq);
    s->port = free_port();
    snprintf(s->base, sizeof s->base, "http://127.0.0.1:%d", s->port);
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);

    const char *argv[64];
    int n = 0;
    argv[n++] = exe;
    argv[n++] = "--backend";
    argv[n++] = it_backend;
    argv[n++] = "--host";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = port;
    /* The suite's second run: the mock samples "on the device", so that
     * the scheduler queues decode steps ahead (tests/integration's CMake). */
    const char *ahead = getenv("INT4SERVE_IT_AHEAD");
    if (ahead && strcmp(ahead, "1") == 0 && strcmp(it_backend, "mock") == 0) {
        argv[n++] = "--set";
        argv[n++] = "testing.mock_device_sampling=true";
    }
    /* a suite run against a tensor-parallel group (tests/integration's
     * CMake: the cpu suite again at tp 2) */
    const char *tp = getenv("INT4SERVE_IT_TP");
    if (tp && *tp && strcmp(it_backend, "mock") != 0) {
        argv[n++] = "--tp";
        argv[n++] = tp;
    }
    for (int i = 0; i < g_n_hooks; i++) {
        argv[n++] = "--set";
        argv[n++] = g_hooks[i];
    }
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        /* The server dies with the test process, even when a test fails. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    return true;
}

bool it_start(struct it_server *s, const char *const *extra)
{
    /* A large checkpoint on a GPU takes longer than 30 s to load. */
    const char *ws = getenv("INT4SERVE_IT_START_S");
    double wait_s = ws && atof(ws) > 0 ? atof(ws) : 30.0;
    for (int attempt = 0; attempt < 3; attempt++) {
        memset(s, 0, sizeof *s);
        if (!spawn(s, extra))
            return false;
        double t0 = it_now();
        while (it_now() - t0 < wait_s) {
            int st;
            if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
                s->pid = 0;
                break; /* exited: maybe the port was taken; try again */
            }
            struct it_resp r;
            if (it_http(s, "GET", "/health/ready", NULL, NULL, &r)) {
                long code = r.status;
                it_resp_free(&r);
                if (code == 200)
                    return true;
            }
            sleep_ms(20);
        }
        char *log = it_log(s);
        fprintf(stderr, "--- server log (attempt %d) ---\n%s\n", attempt + 1, log);
        free(log);
        if (s->pid > 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            return false;
        }
    }
    return false;
}

int it_wait_exit(struct it_server *s, double timeout_s)
{
    double t0 = it_now();
    int st = 0;
    while (s->pid > 0) {
        pid_t w = waitpid(s->pid, &st, WNOHANG);
        if (w == s->pid) {
            s->pid = 0;
            if (WIFEXITED(st))
                return WEXITSTATUS(st);
            return -1;
        }
        if (it_now() - t0 > timeout_s) {
            char *log = it_log(s);
            fprintf(stderr, "--- server did not exit; log ---\n%s\n", log);
            free(log);
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            s->pid = 0;
            return -1;
        }
        sleep_ms(10);
    }
    return -1;
}

void it_cleanup(struct it_server *s)
{
    unlink(s->log_path);
}

int it_stop(struct it_server *s, int sig, double timeout_s)
{
    if (s->pid <= 0)
        return -1;
    kill(s->pid, sig ? sig : SIGTERM);
    int rc = it_wait_exit(s, timeout_s);
    if (rc != 0) {
        char *log = it_log(s);
        fprintf(stderr, "--- server exit %d; log ---\n%s\n", rc, log);
        free(log);
    } else {
        unlink(s->log_path); /* kept only when something went wrong */
    }
    return rc;
}

/* ---- HTTP ------------------------------------------------------------------------- */
struct sink {
    char *p;
    size_t len;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *user)
{
    struct sink *s = user;
    size_t n = size * nmemb;
    char *p = realloc(s->p, s->len + n + 1);
    if (!p)
        return 0;
    memcpy(p + s->len, ptr, n);
    s->p = p;
    s->len += n;
    s->p[s->len] = '\0';
    return n;
}

bool it_http(const struct it_server *s, const char *method, const char *path, const char *body,
             const char *const *headers, struct it_resp *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    if (!c)
        return false;
    char url[512];
    snprintf(url, sizeof url, "%s%s", s->base, path);
    struct sink data = {0}, hdr = {0};
    struct curl_slist *hl = NULL;
    for (int i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    if (body)
        hl = curl_slist_append(hl, "Content-Type: application/json");
    hl = curl_slist_append(hl, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &data);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &hdr);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
        free(data.p);
        free(hdr.p);
        return false;
    }
    out->body = data.p ? data.p : strdup("");
    out->len = data.len;
    for (size_t i = 0; hdr.p && i < hdr.len; i++) {
        /* lower-case header names (up to the colon of each line) */
        if (i == 0 || hdr.p[i - 1] == '\n') {
            for (size_t j = i; j < hdr.len && hdr.p[j] != ':' && hdr.p[j] != '\n'; j++)
                if (hdr.p[j] >= 'A' && hdr.p[j] <= 'Z')
                    hdr.p[j] = (char)(hdr.p[j] - 'A' + 'a');
        }
    }
    out->headers = hdr.p ? hdr.p : strdup("");
    return true;
}

bool it_post(const struct it_server *s, const char *path, const char *body, struct it_resp *out)
{
    return it_http(s, "POST", path, body, NULL, out);
}

void it_resp_free(struct it_resp *r)
{
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof *r);
}

const char *it_header(const struct it_resp *r, const char *name, char *buf, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = r->headers; p && *p;) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ':') {
            p += nl + 1;
            while (*p == ' ')
                p++;
            size_t n = strcspn(p, "\r\n");
            if (n >= cap)
                n = cap - 1;
            memcpy(buf, p, n);
            buf[n] = '\0';
            return buf;
        }
        const char *e = strchr(p, '\n');
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

json_t *it_json(const struct it_resp *r)
{
    if (!r->body)
        return NULL;
    return json_loadb(r->body, r->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
}

int it_connect(const struct it_server *s, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)s->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if ((rcvbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) != 0) ||
        connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* All of buf on fd; false on an error or a closed peer. */
bool it_send_all(int fd, const char *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        off += (size_t)w;
    }
    return true;
}

int it_send_completion(const struct it_server *s, const char *body, int rcvbuf)
{
    int fd = it_connect(s, rcvbuf);
    if (fd < 0)
        return -1;
    char head[256];
    int n = snprintf(
        head, sizeof head,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        "\r\nContent-Length: %zu\r\n\r\n",
        strlen(body));
    if (!it_send_all(fd, head, (size_t)n) || !it_send_all(fd, body, strlen(body))) {
        close(fd);
        return -1;
    }
    return fd;
}

ssize_t it_read_all(int fd, char *out, size_t cap, double timeout_s)
{
    size_t got = 0;
    double t0 = it_now();
    while (got + 1 < cap) {
        double left = timeout_s - (it_now() - t0);
        if (left <= 0)
            break;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            break;
        ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    return (ssize_t)got;
}

ssize_t it_raw(const struct it_server *s, const char *req, size_t req_len, char *out, size_t cap,
               double timeout_s)
{
    int fd = it_connect(s, 0);
    if (fd < 0)
        return -1;
    it_send_all(fd, req, req_len); /* a partial send still reads what came back */
    size_t got = 0;
    double t0 = it_now();
    while (got + 1 < cap) {
        double left = timeout_s - (it_now() - t0);
        if (left <= 0)
            break;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            break;
        ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
    return (ssize_t)got;
}

double it_metric(const struct it_server *s, const char *sample)
{
    struct it_resp r;
    if (!it_http(s, "GET", "/metrics", NULL, NULL, &r))
        return NAN;
    double v = NAN;
    size_t n = strlen(sample);
    for (const char *p = r.body; p && *p;) {
        if (strncmp(p, sample, n) == 0 && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
        const char *e = strchr(p, '\n');
        p = e ? e + 1 : NULL;
    }
    it_resp_free(&r);
    return v;
}

bool it_wait_metric(const struct it_server *s, const char *sample, double want, double timeout_s)
{
    double t0 = it_now();
    while (it_now() - t0 < timeout_s) {
        if (it_metric(s, sample) == want)
            return true;
        usleep(10000);
    }
    fprintf(stderr, "%s = %g, want %g\n", sample, it_metric(s, sample), want);
    return false;
}

size_t it_sse_split(const char *body, size_t len, char ***out)
{
    size_t n = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    const char *p = body, *end = body + len;
    while (p < end) {
        const char *e = strstr(p, "\n\n");
        if (!e)
            e = end;
        if ((size_t)(e - p) >= 6 && strncmp(p, "data: ", 6) == 0) {
            if (n == cap) {
                cap *= 2;
                v = realloc(v, cap * sizeof *v);
            }
            v[n++] = strndup(p + 6, (size_t)(e - p - 6));
        }
        p = e + 2;
    }
    *out = v;
    return n;
}

void it_strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

const char *it_choice_text(json_t *j, size_t i)
{
    json_t *ch = json_array_get(json_object_get(j, "choices"), i);
    return json_string_value(json_object_get(ch, "text"));
}

char *it_stream_text(const char *body, size_t len, size_t index, char *finish, size_t cap)
{
    char **ev;
    size_t n = it_sse_split(body, len, &ev);
    size_t tl = 0;
    char *text = calloc(1, 1);
    if (finish && cap)
        finish[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_loads(ev[i], JSON_ALLOW_NUL, NULL);
        if (!j)
            continue;
        json_t *chs = json_object_get(j, "choices");
        for (size_t k = 0; k < json_array_size(chs); k++) {
            json_t *ch = json_array_get(chs, k);
            if ((size_t)json_integer_value(json_object_get(ch, "index")) != index)
                continue;
            const char *t = json_string_value(json_object_get(ch, "text"));
            size_t l = json_string_length(json_object_get(ch, "text"));
            if (t) {
                text = realloc(text, tl + l + 1);
                memcpy(text + tl, t, l);
                tl += l;
                text[tl] = '\0';
            }
            const char *f = json_string_value(json_object_get(ch, "finish_reason"));
            if (f && finish)
                snprintf(finish, cap, "%s", f);
        }
        json_decref(j);
    }
    it_strv_free(ev, n);
    return text;
}

int it_post_many(const struct it_server *s, const char *path, char *const *bodies, size_t n,
                 struct it_resp *out)
{
    CURLM *m = curl_multi_init();
    CURL **h = calloc(n, sizeof *h);
    struct sink *data = calloc(n, sizeof *data);
    struct sink *hdrs = calloc(n, sizeof *hdrs);
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    hl = curl_slist_append(hl, "Expect:");
    char url[512];
    snprintf(url, sizeof url, "%s%s", s->base, path);
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)n);
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        h[i] = curl_easy_init();
        curl_easy_setopt(h[i], CURLOPT_URL, url);
        curl_easy_setopt(h[i], CURLOPT_POSTFIELDS, bodies[i]);
        curl_easy_setopt(h[i], CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(h[i], CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h[i], CURLOPT_WRITEDATA, &data[i]);
        curl_easy_setopt(h[i], CURLOPT_HEADERFUNCTION, on_data);
        curl_easy_setopt(h[i], CURLOPT_HEADERDATA, &hdrs[i]);
        curl_easy_setopt(h[i], CURLOPT_TIMEOUT, 120L);
        curl_easy_setopt(h[i], CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h[i], CURLOPT_FORBID_REUSE, 1L);
        curl_easy_setopt(h[i], CURLOPT_PRIVATE, (void *)(uintptr_t)i);
        curl_multi_add_handle(m, h[i]);
    }
    int running = 1, errors = 0;
    while (running) {
        curl_multi_perform(m, &running);
        if (running)
            curl_multi_poll(m, NULL, 0, 100, NULL);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            void *priv = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            size_t i = (size_t)(uintptr_t)priv;
            if (msg->data.result != CURLE_OK) {
                if (errors++ == 0)
                    fprintf(stderr, "it_post_many: request %zu: %s\n", i,
                            curl_easy_strerror(msg->data.result));
            } else
                curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &out[i].status);
        }
    }
    for (size_t i = 0; i < n; i++) {
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        out[i].body = data[i].p ? data[i].p : strdup("");
        out[i].len = data[i].len;
        out[i].headers = hdrs[i].p ? hdrs[i].p : strdup("");
        for (char *p = out[i].headers; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    }
    free(hdrs);
    curl_slist_free_all(hl);
    curl_multi_cleanup(m);
    free(h);
    free(data);
    return errors;
}
