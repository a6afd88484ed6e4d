#pragma once
/* tests/integration — a harness that starts the real int4serve on a free
 * loopback port, talks HTTP to it with libcurl (or a raw socket), and stops
 * it. Used by every test_*.c here. */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct it_server {
    pid_t pid;
    int port;
    char log_path[256];
    char base[64]; /* "http://127.0.0.1:<port>" */
};

/* The --backend it_start passes ("mock" unless a test sets it). */
extern const char *it_backend;

/* The backend named by $INT4SERVE_IT_BACKEND ("cuda", "cpu"), or NULL when
 * it is unset or empty. Suites whose checks hold for any model (test_cpu)
 * run on it; suites that need the mock (its reference logits, its byte
 * tokenizer's exact text, the mock_fail_step hook) ignore it. */
const char *it_env_backend(void);
/* A checkpoint for a real backend, its folder written into dir:
 * $INT4SERVE_IT_MODEL when set (made there by int4serve-mkmodel --preset
 * ${INT4SERVE_IT_PRESET:-tiny} --seed seed when it holds no config.json, and
 * kept), else a fresh tiny one under /tmp that the caller removes (*owned is
 * then true). Returns false (after printing the command) when mkmodel fails. */
bool it_model(unsigned seed, char *dir, size_t cap, bool *owned);

/* A test hook of the server's [testing] keys ("min_step_us", "200"): it_start
 * passes it as --set testing.<key>=<value> to every server this process
 * starts from now on. Up to 8; a key set again takes the new value. */
void it_hook(const char *key, const char *value);

/* Start int4serve with it_backend and the extra arguments (NULL
 * terminated, may be NULL), wait until /health/ready answers 200 (at most
 * $INT4SERVE_IT_START_S seconds, default 30).
 * Returns false (after printing the server's log) when it did not come up. */
bool it_start(struct it_server *s, const char *const *extra);
/* Send sig (0 = SIGTERM) and wait up to timeout_s for the exit; returns the
 * exit status, or -1 when it had to be killed or died of a signal. The log
 * file is removed after a clean exit (0) and printed otherwise. */
int it_stop(struct it_server *s, int sig, double timeout_s);
/* Remove the server's log file (after a test that passed). */
void it_cleanup(struct it_server *s);
/* Wait for the server to exit by itself; status as it_stop (the log stays). */
int it_wait_exit(struct it_server *s, double timeout_s);
/* The server's log so far (malloc'd). */
char *it_log(const struct it_server *s);

struct it_resp {
    long status;
    char *body;
    size_t len;
    char *headers; /* raw header block, lower-cased names */
};

/* One HTTP exchange. body may be NULL; headers NULL-terminated "Name: v".
 * Returns false on a transport error. */
bool it_http(const struct it_server *s, const char *method, const char *path, const char *body,
             const char *const *headers, struct it_resp *out);
/* POST a JSON body to /v1/completions. */
bool it_post(const struct it_server *s, const char *path, const char *body, struct it_resp *out);
void it_resp_free(struct it_resp *r);
/* The value of header name (lower case) in r, copied into buf; NULL if absent. */
const char *it_header(const struct it_resp *r, const char *name, char *buf, size_t cap);
/* The body as JSON (NULL if it does not parse); the caller decrefs. */
json_t *it_json(const struct it_resp *r);

/* A raw request over a fresh TCP connection: send req, read until the
 * server closes or timeout_s passes. Returns the bytes read (NUL-terminated
 * in out), or -1. */
ssize_t it_raw(const struct it_server *s, const char *req, size_t req_len, char *out, size_t cap,
               double timeout_s);

/* Send all of buf on fd (MSG_NOSIGNAL); false on an error or a closed peer. */
bool it_send_all(int fd, const char *buf, size_t len);
/* Read fd until the server closes it, cap - 1 bytes or timeout_s; the bytes
 * read (NUL-terminated in out). */
ssize_t it_read_all(int fd, char *out, size_t cap, double timeout_s);

/* A TCP connection to the server on loopback; rcvbuf > 0 sets SO_RCVBUF
 * first (a client that reads slowly). Returns the fd, or -1. */
int it_connect(const struct it_server *s, int rcvbuf);

/* it_connect, then POST /v1/completions with body, the response left unread:
 * the caller reads or closes the returned fd. -1 when the connection or the
 * send fails. */
int it_send_completion(const struct it_server *s, const char *body, int rcvbuf);

/* A sample's value from /metrics ("int4serve_num_requests_running", or with
 * its labels "name{k=\"v\"}"); NAN when absent. */
double it_metric(const struct it_server *s, const char *sample);

/* Poll /metrics until sample equals want: true, or false after timeout_s
 * (the last value printed on stderr). */
bool it_wait_metric(const struct it_server *s, const char *sample, double want, double timeout_s);

/* The SSE events of a stream body: the data payloads in order, "[DONE]"
 * included. Returns the count; *out is a malloc'd array of malloc'd strings. */
size_t it_sse_split(const char *body, size_t len, char ***out);
void it_strv_free(char **v, size_t n);

/* Completion text of choice i in a non-streamed JSON response (a borrowed
 * string owned by j), NULL if missing. */
const char *it_choice_text(json_t *j, size_t i);
/* Concatenated "text" of every chunk for choice index i of a stream body;
 * finish receives the last non-null finish_reason (may be NULL). malloc'd. */
char *it_stream_text(const char *body, size_t len, size_t index, char *finish, size_t cap);

/* Seconds of monotonic time. */
double it_now(void);

/* POST n bodies to path at once (libcurl multi, one connection each) and
 * collect the responses in order. Returns the number of transport errors. */
int it_post_many(const struct it_server *s, const char *path, char *const *bodies, size_t n,
                 struct it_resp *out);
