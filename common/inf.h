#pragma once
/* common — public header: status codes, error struct, logging, arena, queue,
 * TOML. Depends on libc only; every module may include it. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes -------------------------------------------------------
 * One X-macro list makes the enum and its strings. Codes are negative, 0 is OK. */
#define INF_STATUS_MAP(X)                                                      \
    X(OK, 0, "ok")                                                             \
    X(E_INVALID, -1, "invalid argument")                                       \
    X(E_NOMEM, -2, "out of memory")                                            \
    X(E_IO, -3, "input/output error")                                          \
    X(E_NOTFOUND, -4, "not found")                                             \
    X(E_UNSUPPORTED, -5, "unsupported")                                        \
    X(E_FORMAT, -6, "malformed data")                                          \
    X(E_RANGE, -7, "value out of range")                                       \
    X(E_BUSY, -8, "busy")                                                      \
    X(E_SHUTDOWN, -9, "shutting down")                                         \
    X(E_TOOBIG, -10, "too large")                                              \
    X(E_AUTH, -11, "unauthorized")                                             \
    X(E_METHOD, -12, "method not allowed")                                     \
    X(E_CONTEXT, -13, "context length exceeded")                               \
    X(E_CANCELLED, -14, "cancelled")                                           \
    X(E_TIMEOUT, -15, "timed out")                                             \
    X(E_DEVICE, -16, "device error")                                           \
    X(E_INTERNAL, -17, "internal error")

typedef enum {
#define INF_STATUS_ENUM(name, val, str) INF_##name = (val),
    INF_STATUS_MAP(INF_STATUS_ENUM)
#undef INF_STATUS_ENUM
} inf_status_t;

/* The short text of a status ("invalid argument"); "unknown status" for a
 * value not in the map. Thread: any. */
const char *inf_status_str(inf_status_t s);
/* The enum name without prefix ("E_INVALID"). Thread: any. */
const char *inf_status_name(inf_status_t s);

/* ---- errors --------------------------------------------------------------- */
#define INF_ERR_LEN 256

struct inf_err {
    inf_status_t code;
    char msg[INF_ERR_LEN];
};

/* Record code and a printf-style message in err (which may be NULL) and return
 * code, so callers write `return inf_err_set(err, INF_E_INVALID, "...", x);`.
 * The message must be safe to show a client: no paths, no pointers. Thread: any. */
inf_status_t inf_err_set(struct inf_err *err, inf_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reset err to INF_OK with an empty message. err may be NULL. */
void inf_err_clear(struct inf_err *err);

/* Programmer errors only: never for input or configuration. */
#define INF_ASSERT(cond)                                                       \
    do {                                                                       \
        if (!(cond))                                                           \
            inf_assert_fail(#cond, __FILE__, __LINE__);                        \
    } while (0)
#ifdef __cplusplus
[[noreturn]] void inf_assert_fail(const char *cond, const char *file, int line);
#else
_Noreturn void inf_assert_fail(const char *cond, const char *file, int line);
#endif

/* ---- logging ----------------------------------------------------------------
 * One line per event on stderr:
 *   2026-11-30T04:19:00.123Z W srv http.c:142 req=17 client closed mid-stream
 * The level is checked before the arguments are evaluated. Each .c file may
 * define INF_LOG_MODULE (a short module name) before including this header. */
enum inf_log_level {
    INF_LOG_DEBUG = 0,
    INF_LOG_INFO = 1,
    INF_LOG_WARN = 2,
    INF_LOG_ERROR = 3,
    INF_LOG_OFF = 4,
};

extern volatile int inf_log_level_current;

#ifndef INF_LOG_MODULE
#define INF_LOG_MODULE "-"
#endif

#define inf_log(level, ...)                                                    \
    do {                                                                       \
        if ((int)(INF_LOG_##level) >= inf_log_level_current)                   \
            inf_log_write(INF_LOG_##level, INF_LOG_MODULE, __FILE__, __LINE__,  \
                          __VA_ARGS__);                                        \
    } while (0)

/* Thread: any. Writes one whole line with a single write(2). */
void inf_log_write(enum inf_log_level level, const char *module, const char *file, int line,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Set the minimum level written. Thread: any (takes effect for later lines). */
void inf_log_set_level(enum inf_log_level level);
/* Parse "debug" | "info" | "warn" | "error" | "off". Returns false if unknown. */
bool inf_log_level_parse(const char *s, enum inf_log_level *out);
/* Redirect log output to fd (default 2). For tests. */
void inf_log_set_fd(int fd);

/* ---- arena -------------------------------------------------------------------
 * A bump allocator over a chain of blocks; everything is freed at once by
 * inf_arena_fini / inf_arena_reset. Not thread-safe: one owner at a time. */
struct inf_arena_block;
struct inf_arena {
    struct inf_arena_block *head; /* current block, newest first */
    size_t block_size;            /* default size of new blocks */
    size_t used_total;            /* bytes handed out since the last reset */
};

/* Initialise caller-provided storage. block_size 0 picks 4 KiB. */
void inf_arena_init(struct inf_arena *a, size_t block_size);
/* Free every block. a may be NULL. */
void inf_arena_fini(struct inf_arena *a);
/* Forget every allocation but keep the first block for reuse. */
void inf_arena_reset(struct inf_arena *a);
/* size bytes aligned to 16; NULL on out of memory or size overflow. */
void *inf_arena_alloc(struct inf_arena *a, size_t size);
/* Zeroed n*size bytes; NULL on overflow or out of memory. */
void *inf_arena_calloc(struct inf_arena *a, size_t n, size_t size);
/* Copy of the n bytes at s plus a NUL terminator. */
char *inf_arena_strndup(struct inf_arena *a, const char *s, size_t n);
char *inf_arena_strdup(struct inf_arena *a, const char *s);
char *inf_arena_sprintf(struct inf_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- queue -------------------------------------------------------------------
 * An intrusive FIFO guarded by a mutex and a condition variable: many
 * producers, one consumer. Items embed a struct inf_qnode. Thread: any. */
struct inf_qnode {
    struct inf_qnode *next;
};

struct inf_queue; /* opaque; defined in queue.c */
typedef struct inf_queue inf_queue_t;

/* capacity 0 = unbounded. Returns NULL on out of memory. */
inf_queue_t *inf_queue_create(size_t capacity);
/* Frees the queue, not the items still in it. q may be NULL. */
void inf_queue_destroy(inf_queue_t *q);
/* Append node. INF_E_BUSY when the queue is at capacity, INF_E_SHUTDOWN once
 * closed. Returns true in *was_empty (may be NULL) when the queue went from
 * empty to non-empty, so a producer can signal the consumer only then. */
inf_status_t inf_queue_push(inf_queue_t *q, struct inf_qnode *node, bool *was_empty);
/* Remove the whole list at once, in FIFO order; NULL when empty. Never blocks. */
struct inf_qnode *inf_queue_take_all(inf_queue_t *q);
/* Remove one item, waiting up to timeout_ms (-1 forever, 0 not at all).
 * NULL on timeout or when closed and empty. */
struct inf_qnode *inf_queue_pop(inf_queue_t *q, int timeout_ms);
/* Wait until the queue is non-empty or closed, up to timeout_ms (-1 forever). */
void inf_queue_wait(inf_queue_t *q, int timeout_ms);
/* Refuse further pushes and wake every waiter. */
void inf_queue_close(inf_queue_t *q);
size_t inf_queue_len(inf_queue_t *q);

/* ---- half precision --------------------------------------------------------
 * Host conversions for fp16 and bf16 stored as their bit patterns; round to
 * nearest even. Thread: any. */
float inf_f16_to_f32(uint16_t h);
uint16_t inf_f32_to_f16(float f);
float inf_bf16_to_f32(uint16_t b);
uint16_t inf_f32_to_bf16(float f);

/* ---- TOML ---------------------------------------------------------------------
 * A reader for the subset of TOML the configuration uses: tables [a] and
 * [a.b], bare / quoted / dotted keys, basic strings (escapes \" \\ \b \f \n
 * \r \t \uXXXX \UXXXXXXXX) and literal strings, decimal integers (sign,
 * underscores, overflow detected), floats (fraction, exponent, inf, nan),
 * booleans, arrays of scalars (multi-line, trailing comma) and comments.
 * Not supported (answered with an error): multi-line strings, inline tables,
 * arrays of tables, nested arrays, dates, hexadecimal / octal / binary
 * integers, strings containing U+0000.
 * The document is a tree of nodes allocated in a caller's arena; it lives as
 * long as the arena. Thread: any (no shared state). */
enum inf_toml_type {
    INF_TOML_TABLE,
    INF_TOML_STRING,
    INF_TOML_INT,
    INF_TOML_FLOAT,
    INF_TOML_BOOL,
    INF_TOML_ARRAY,
};

struct inf_toml_node {
    enum inf_toml_type type;
    const char *key;            /* name in the parent table; NULL for the root and array items */
    int line, col;              /* 1-based position of the key (array items: of the value) */
    struct inf_toml_node *next; /* next key of the parent table / next item of the array */
    /* Tables and arrays: children in document order. */
    struct inf_toml_node *first, *last;
    size_t count;
    /* Scalars, by type. Strings are NUL-terminated UTF-8 of str_len bytes. */
    const char *str;
    size_t str_len;
    int64_t i;
    double f;
    bool b;
    unsigned flags; /* private to the reader */
};

/* Parse len bytes of text into a tree allocated in a; *root is the top-level
 * table. On error returns INF_E_FORMAT (INF_E_NOMEM when the arena fails) with
 * err->msg "line L, column C: <what>", columns counted in characters from 1;
 * *root is then NULL and what was allocated stays in the arena. Duplicate keys
 * and tables defined twice are errors. */
inf_status_t inf_toml_parse(const char *text, size_t len, struct inf_arena *a,
                            struct inf_toml_node **root, struct inf_err *err);
/* The child of table named key, or NULL (also when table is NULL or not a
 * table). */
const struct inf_toml_node *inf_toml_get(const struct inf_toml_node *table, const char *key);
/* The value of key in the table at the dotted path table_path ("engine",
 * "a.b"; NULL or "" for root itself), or NULL. Path parts are bare names. */
const struct inf_toml_node *inf_toml_find(const struct inf_toml_node *root,
                                          const char *table_path, const char *key);
/* "table", "string", "integer", "float", "boolean", "array". */
const char *inf_toml_type_name(enum inf_toml_type t);

/* ---- UTF-8 ----------------------------------------------------------------- */
/* The character at s[0..n), n >= 1, checked against RFC 3629 (no overlong
 * forms, no surrogates, nothing past U+10FFFF). Returns its length with
 * *valid true; for an ill-formed sequence, *valid false and the length of
 * its maximal valid-so-far prefix, at least 1 (what one U+FFFD replaces, as
 * Python's and Rust's lossy decoders count). Thread: any. */
size_t inf_utf8_next(const void *s, size_t n, bool *valid);
/* Write the UTF-8 form of cp (a Unicode scalar value, <= U+10FFFF) to out;
 * returns its length, 1 to 4. Thread: any. */
size_t inf_utf8_encode(uint32_t cp, char out[4]);

/* ---- growing byte buffers ------------------------------------------------- */
/* Make the heap block *p of *cap bytes hold at least need bytes: the
 * capacity doubles, from min when it is 0, until it does, and *p is
 * realloc'd. On false (need past SIZE_MAX / 2, or out of memory) *p and *cap
 * are unchanged and *p still belongs to the caller. Thread: any. */
bool inf_grow(char **p, size_t *cap, size_t need, size_t min);

/* ---- integer lists ----------------------------------------------------------- */
/* Parse s, decimal integers separated by commas ("0,1, 2": spaces around an
 * item are allowed; "" is the empty list), storing the first cap of them in
 * out (out may be NULL when cap is 0: counting only). Returns the number of
 * items in s, which may be more than cap, or -1 when s is not such a list
 * (an empty item, a non-integer, a value outside int64_t). Thread: any. */
long inf_int_list_parse(const char *s, int64_t *out, size_t cap);

/* ---- time ------------------------------------------------------------------ */
/* Monotonic time in nanoseconds. Thread: any. */
uint64_t inf_now_ns(void);

#ifdef __cplusplus
}
#endif
