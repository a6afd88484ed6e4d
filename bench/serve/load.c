/* int4serve-bench-load — how long loading a checkpoint takes, and a digest of
 * what the backend receives, so a change to the load path can be timed and
 * checked bit for bit.
 *
 *   int4serve-bench-load DIR [--quant int4|auto|none] [--backend host|cpu]
 *                            [--threads T] [--hash] [--repeat R]
 *
 * --backend host (default) is the CUDA backend's host side without a GPU:
 * activations fp16, INT4 weights planned and repacked into the INT4 GEMM's
 * layout (kernels/int4_gemm.h) exactly as engine/cuda/backend_cuda.c does, and
 * every upload copied once into host memory (the CPU work of a pageable
 * cudaMemcpy) and then dropped, so a 7B checkpoint needs no 13 GB of RAM.
 * --backend cpu loads onto the real CPU backend (fp32, its own repack).
 * --threads is the model's load_threads (0: one per usable core).
 * --hash digests every byte uploaded or repacked, in load order (the time
 * it takes is not counted); two loads that print the same digest handed the
 * backend the same bytes.
 * Reported: the load time, the time spent inside the backend's weight and
 * upload slots (repack + copy), and the bytes uploaded. */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/weights/quant.h"
#include "kernels/int4_gemm.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SMALL_BUF ((size_t)16 << 20) /* host buffers up to this size are kept */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct host_ctx {
    bool hash;
    uint64_t digest;
    double hash_s;  /* time spent hashing (subtracted) */
    double slot_s;  /* time inside weight_q4_create and buf_upload */
    uint64_t bytes; /* bytes uploaded or repacked */
    uint8_t *sink;  /* where large uploads land */
    size_t sink_cap;
    int32_t threads;
};

/* A 64-bit digest over 8-byte words (order-sensitive), fast enough for 13 GB. */
static void digest(struct host_ctx *c, const void *p, size_t n)
{
    if (!c->hash)
        return;
    double t0 = now_s();
    uint64_t h = c->digest ^ (uint64_t)n * 0x9e3779b97f4a7c15ull;
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    c->digest = h;
    c->hash_s += now_s() - t0;
}

static struct host_ctx *hctx(struct eng_backend *be)
{
    return be->ctx;
}

static inf_status_t h_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                                struct inf_err *err)
{
    (void)be;
    struct eng_buf *b = calloc(1, sizeof *b);
    if (!b)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    if (bytes <= SMALL_BUF && !(b->ptr = calloc(1, bytes))) {
        free(b);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    b->size = bytes;
    *out = b;
    return INF_OK;
}

static void h_buf_free(struct eng_backend *be, struct eng_buf *buf)
{
    (void)be;
    free(buf->ptr);
    free(buf);
}

/* The copy a pageable upload costs the host, into memory that is dropped. */
static inf_status_t sink_copy(struct host_ctx *c, const void *src, size_t bytes,
                              struct inf_err *err)
{
    if (bytes > c->sink_cap) {
        free(c->sink);
        c->sink_cap = 0;
        if (!(c->sink = malloc(bytes)))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        c->sink_cap = bytes;
    }
    memcpy(c->sink, src, bytes);
    return INF_OK;
}

static inf_status_t h_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                                 const void *src, size_t bytes, struct inf_err *err)
{
    struct host_ctx *c = hctx(be);
    double t0 = now_s();
    inf_status_t s = INF_OK;
    if (dst->ptr)
        memcpy((uint8_t *)dst->ptr + off, src, bytes);
    else
        s = sink_copy(c, src, bytes, err);
    c->slot_s += now_s() - t0;
    c->bytes += bytes;
    digest(c, src, bytes);
    return s;
}

static inf_status_t h_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                   void *dst, size_t bytes, struct inf_err *err)
{
    (void)be;
    if (!src->ptr)
        return inf_err_set(err, INF_E_UNSUPPORTED, "large buffers are not kept");
    memcpy(dst, (const uint8_t *)src->ptr + off, bytes);
    return INF_OK;
}

/* As engine/cuda/backend_cuda.c: plan, repack into host memory on a pool of
 * threads made for the call, copy, free. */
static inf_status_t h_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
                                       struct eng_q4w **out, struct inf_err *err)
{
    struct host_ctx *c = hctx(be);
    double t0 = now_s();
    struct krn_int4_gemm_layout lay;
    inf_status_t s = krn_int4_gemm_layout_make(w, &lay, err);
    if (s != INF_OK)
        return s;
    struct eng_q4w *q = calloc(1, sizeof *q);
    void *host = malloc(lay.bytes);
    if (!q || !host) {
        free(q);
        free(host);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    eng_par_t *par = NULL;
    s = eng_par_create(c->threads, &par, err);
    if (s == INF_OK)
        s = eng_q4_gemm_repack(w, &lay, host, lay.bytes, par, err);
    eng_par_destroy(par);
    if (s == INF_OK)
        s = sink_copy(c, host, lay.bytes, err);
    c->slot_s += now_s() - t0;
    c->bytes += lay.bytes;
    if (s == INF_OK)
        digest(c, host, lay.bytes);
    free(host);
    if (s != INF_OK) {
        free(q);
        return s;
    }
    q->n = w->n;
    q->k = w->k;
    *out = q;
    return INF_OK;
}

static void h_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w)
{
    (void)be;
    free(w);
}

static void h_destroy(struct eng_backend *be)
{
    free(hctx(be)->sink);
    free(be->ctx);
    free(be);
}

static const struct eng_backend_iface host_iface = {
    .name = "host",
    .destroy = h_destroy,
    .buf_alloc = h_buf_alloc,
    .buf_free = h_buf_free,
    .buf_upload = h_buf_upload,
    .buf_download = h_buf_download,
    .weight_q4_create = h_weight_q4_create,
    .weight_q4_destroy = h_weight_q4_destroy,
};

static struct eng_backend *host_create(bool hash, int32_t threads)
{
    struct eng_backend *be = calloc(1, sizeof *be);
    struct host_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    c->hash = hash;
    c->digest = 0xcbf29ce484222325ull;
    c->threads = threads;
    be->iface = &host_iface;
    be->act_dtype = ENG_ACT_F16;
    be->kv_dtype = ENG_ACT_F16;
    be->ctx = c;
    return be;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: int4serve-bench-load DIR [--quant int4|auto|none] [--backend host|cpu]\n"
               "                            [--threads T] [--hash] [--repeat R]\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"quant", required_argument, NULL, 'q'},
                                       {"backend", required_argument, NULL, 'b'},
                                       {"threads", required_argument, NULL, 't'},
                                       {"hash", no_argument, NULL, 'H'},
                                       {"repeat", required_argument, NULL, 'r'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    const char *quant = "int4", *backend = "host";
    int threads = 0, repeat = 1;
    bool hash = false;
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'q':
            quant = optarg;
            break;
        case 'b':
            backend = optarg;
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 'H':
            hash = true;
            break;
        case 'r':
            repeat = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || repeat < 1 || threads < 0 ||
        (strcmp(quant, "int4") != 0 && strcmp(quant, "auto") != 0 &&
         strcmp(quant, "none") != 0) ||
        (strcmp(backend, "host") != 0 && strcmp(backend, "cpu") != 0)) {
        usage(stderr);
        return 2;
    }
    const char *dir = argv[optind];
    for (int r = 0; r < repeat; r++) {
        struct inf_err err = {0};
        struct eng_backend *be = NULL;
        bool host = strcmp(backend, "host") == 0;
        if (host) {
            be = host_create(hash, threads);
        } else {
            struct eng_backend_cpu_opts co = {.n_threads = 0};
            if (eng_backend_cpu_create(&co, &be, &err) != INF_OK)
                be = NULL;
        }
        if (!be) {
            fprintf(stderr, "bench-load: no backend: %s\n", err.msg);
            return 1;
        }
        struct eng_model_opts o;
        eng_model_opts_default(&o);
        /* auto: an INT4 checkpoint as it is stored (repacked, not requantized) */
        o.quant = strcmp(quant, "int4") == 0   ? ENG_QUANT_INT4
                  : strcmp(quant, "auto") == 0 ? ENG_QUANT_AUTO
                                               : ENG_QUANT_NONE;
        o.n_kv_blocks = 1;
        o.max_tokens = 16;
        o.load_threads = threads;
        eng_model_t *m = NULL;
        double t0 = now_s();
        inf_status_t s = eng_model_load(dir, be, &o, &m, &err);
        double t = now_s() - t0;
        if (s != INF_OK) {
            fprintf(stderr, "bench-load: %s\n", err.msg);
            eng_backend_destroy(be);
            return 1;
        }
        if (host) {
            struct host_ctx *c = hctx(be);
            t -= c->hash_s;
            printf("load %s %s threads %d: %.2f s (backend repack + copy %.2f s), %.1f MB "
                   "uploaded",
                   quant, backend, threads, t, c->slot_s, (double)c->bytes / 1e6);
            if (hash)
                printf(", digest %016llx", (unsigned long long)c->digest);
            printf("\n");
        } else {
            printf("load %s %s threads %d: %.2f s\n", quant, backend, threads, t);
        }
        fflush(stdout);
        eng_model_destroy(m);
        eng_backend_destroy(be);
    }
    return 0;
}
