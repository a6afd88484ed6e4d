/* engine/weights/safetensors_write.c — streaming safetensors writer (see
 * safetensors_write.h). The header is padded with spaces to a multiple of 8
 * bytes, as the reference writer does, so the data area starts aligned. */
#define INF_LOG_MODULE "eng"
#include "engine/weights/safetensors_write.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHARDS 99999

struct wtensor {
    char *name;
    enum eng_dtype dtype;
    int32_t ndim;
    int64_t shape[ENG_ST_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* within its shard's data area */
    int32_t shard;
};

struct eng_st_writer {
    char *dir;
    int32_t n_req;    /* shards asked for */
    int32_t n_shards; /* shards written, known once started */
    char **shard_names;
    struct wtensor *t;
    int64_t n, cap;
    bool started, failed;
    int64_t cur;        /* tensor being written */
    uint64_t cur_done;  /* its bytes written so far */
    int32_t open_shard; /* index of the shard in f, -1 before the first */
    FILE *f;
    char *fbuf;
};

inf_status_t eng_st_writer_create(const char *dir, int32_t n_shards, eng_st_writer_t **out,
                                  struct inf_err *err)
{
    *out = NULL;
    if (n_shards < 1 || n_shards > MAX_SHARDS)
        return inf_err_set(err, INF_E_INVALID, "shard count must be in [1, %d], got %d", MAX_SHARDS,
                           n_shards);
    eng_st_writer_t *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    w->n_req = n_shards;
    w->open_shard = -1;
    *out = w;
    return INF_OK;
}

void eng_st_writer_destroy(eng_st_writer_t *w)
{
    if (!w)
        return;
    if (w->f)
        fclose(w->f);
    free(w->fbuf);
    for (int64_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    for (int32_t i = 0; w->shard_names && i < w->n_shards; i++)
        free(w->shard_names[i]);
    free(w->shard_names);
    free(w->dir);
    free(w);
}

inf_status_t eng_st_writer_add(eng_st_writer_t *w, const char *name, enum eng_dtype dtype,
                               int32_t ndim, const int64_t *shape, struct inf_err *err)
{
    if (w->started)
        return inf_err_set(err, INF_E_INVALID, "tensor '%.80s' declared after data was written",
                           name);
    if (!name[0] || strcmp(name, "__metadata__") == 0)
        return inf_err_set(err, INF_E_INVALID, "tensor name '%.80s' is not allowed", name);
    if (eng_dtype_size(dtype) == 0)
        return inf_err_set(err, INF_E_INVALID, "tensor '%.80s': unknown dtype %d", name,
                           (int)dtype);
    if (ndim < 0 || ndim > ENG_ST_MAX_DIMS)
        return inf_err_set(err, INF_E_INVALID, "tensor '%.80s': %d dimensions, at most %d", name,
                           ndim, ENG_ST_MAX_DIMS);
    uint64_t bytes = eng_dtype_size(dtype);
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return inf_err_set(err, INF_E_INVALID, "tensor '%.80s': negative dimension %lld", name,
                               (long long)shape[i]);
        if (shape[i] > 0 && bytes > (UINT64_C(1) << 62) / (uint64_t)shape[i])
            return inf_err_set(err, INF_E_INVALID, "tensor '%.80s': too large", name);
        bytes *= (uint64_t)shape[i];
    }
    for (int64_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return inf_err_set(err, INF_E_INVALID, "tensor '%.80s' declared twice", name);
    if (w->n == w->cap) {
        int64_t cap = w->cap ? w->cap * 2 : 64;
        struct wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        w->t = nt;
        w->cap = cap;
    }
    struct wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->nbytes = bytes;
    w->n++;
    return INF_OK;
}

/* Split the tensors over shards by the position of their first byte in the
 * whole checkpoint, then renumber so no shard is empty. */
static inf_status_t plan(eng_st_writer_t *w, struct inf_err *err)
{
    uint64_t total = 0;
    for (int64_t i = 0; i < w->n; i++)
        total += w->t[i].nbytes;
    uint64_t start = 0;
    int32_t prev = -1, ns = 0;
    for (int64_t i = 0; i < w->n; i++) {
        int32_t s = 0;
        if (total > 0)
            s = (int32_t)((double)start / (double)total * w->n_req);
        if (s >= w->n_req)
            s = w->n_req - 1;
        if (s != prev || i == 0) {
            ns++;
            prev = s;
        }
        w->t[i].shard = ns - 1;
        start += w->t[i].nbytes;
    }
    if (ns == 0)
        ns = 1;
    w->n_shards = ns;
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n; i++) {
        if (i > 0 && w->t[i].shard != w->t[i - 1].shard)
            off = 0;
        w->t[i].offset = off;
        off += w->t[i].nbytes;
    }
    w->shard_names = calloc((size_t)ns, sizeof *w->shard_names);
    if (!w->shard_names)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (int32_t s = 0; s < ns; s++) {
        char name[64];
        if (w->n_req == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, ns);
        if (!(w->shard_names[s] = strdup(name)))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    return INF_OK;
}

static FILE *open_in_dir(const eng_st_writer_t *w, const char *name, struct inf_err *err,
                         inf_status_t *st)
{
    size_t len = strlen(w->dir) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) {
        *st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(path, len, "%s/%s", w->dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        int e = errno;
        inf_log(ERROR, "create %s: %s", path, strerror(e));
        *st = inf_err_set(err, INF_E_IO, "%s: cannot create: %s", name, strerror(e));
    }
    free(path);
    return f;
}

static inf_status_t write_index(eng_st_writer_t *w, struct inf_err *err)
{
    uint64_t total = 0;
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    inf_status_t st = INF_OK;
    if (!root || !meta || !wm) {
        json_decref(meta);
        json_decref(wm);
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto out;
    }
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", wm);
    for (int64_t i = 0; i < w->n; i++) {
        total += w->t[i].nbytes;
        if (json_object_set_new(wm, w->t[i].name, json_string(w->shard_names[w->t[i].shard]))) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto out;
        }
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    FILE *f = open_in_dir(w, "model.safetensors.index.json", err, &st);
    if (!f)
        goto out;
    int rc = json_dumpf(root, f, JSON_INDENT(2) | JSON_SORT_KEYS);
    bool bad = rc != 0 || fputc('\n', f) == EOF;
    if (fclose(f) != 0 || bad)
        st = inf_err_set(err, INF_E_IO, "model.safetensors.index.json: write failed");
out:
    json_decref(root);
    return st;
}

static char *shard_header(const eng_st_writer_t *w, int32_t s, size_t *len)
{
    json_t *root = json_object(), *meta = json_object();
    char *text = NULL;
    if (!root || !meta) {
        json_decref(meta);
        goto out;
    }
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    for (int64_t i = 0; i < w->n; i++) {
        const struct wtensor *t = &w->t[i];
        if (t->shard != s)
            continue;
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        if (!e || !shape || !offs) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            goto out;
        }
        for (int32_t d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)t->offset));
        json_array_append_new(offs, json_integer((json_int_t)(t->offset + t->nbytes)));
        json_object_set_new(e, "dtype", json_string(eng_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_set_new(root, t->name, e))
            goto out;
    }
    char *raw = json_dumps(root, JSON_COMPACT);
    if (!raw)
        goto out;
    size_t n = strlen(raw), padded = (n + 7) & ~(size_t)7;
    text = malloc(padded + 1);
    if (text) {
        memcpy(text, raw, n);
        memset(text + n, ' ', padded - n);
        text[padded] = '\0';
        *len = padded;
    }
    free(raw);
out:
    json_decref(root);
    return text;
}

/* Close the open shard and open the following ones up to s, writing each
 * one's header. */
static inf_status_t advance_to_shard(eng_st_writer_t *w, int32_t s, struct inf_err *err)
{
    while (w->open_shard < s) {
        if (w->f) {
            FILE *f = w->f;
            w->f = NULL;
            if (fclose(f) != 0)
                return inf_err_set(err, INF_E_IO, "%s: write failed",
                                   w->shard_names[w->open_shard]);
        }
        w->open_shard++;
        const char *name = w->shard_names[w->open_shard];
        size_t hlen = 0;
        char *hdr = shard_header(w, w->open_shard, &hlen);
        if (!hdr)
            return inf_err_set(err, INF_E_NOMEM, "%s: out of memory for the header", name);
        inf_status_t st = INF_OK;
        w->f = open_in_dir(w, name, err, &st);
        if (!w->f) {
            free(hdr);
            return st;
        }
        setvbuf(w->f, w->fbuf, _IOFBF, 1 << 20);
        unsigned char lenb[8];
        for (int i = 0; i < 8; i++)
            lenb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
        bool ok = fwrite(lenb, 1, 8, w->f) == 8 && fwrite(hdr, 1, hlen, w->f) == hlen;
        free(hdr);
        if (!ok)
            return inf_err_set(err, INF_E_IO, "%s: write failed: %s", name, strerror(errno));
    }
    return INF_OK;
}

static inf_status_t start(eng_st_writer_t *w, struct inf_err *err)
{
    w->started = true;
    if (!(w->fbuf = malloc(1 << 20)))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    inf_status_t st = plan(w, err);
    if (st == INF_OK && w->n_req > 1)
        st = write_index(w, err);
    if (st == INF_OK)
        st = advance_to_shard(w, 0, err);
    return st;
}

inf_status_t eng_st_writer_write(eng_st_writer_t *w, const void *data, size_t nbytes,
                                 struct inf_err *err)
{
    if (w->failed)
        return inf_err_set(err, INF_E_INVALID, "writer failed earlier");
    inf_status_t st = INF_OK;
    if (!w->started && (st = start(w, err)) != INF_OK)
        goto fail;
    const unsigned char *p = data;
    while (nbytes > 0) {
        while (w->cur < w->n && w->cur_done == w->t[w->cur].nbytes) {
            w->cur++;
            w->cur_done = 0;
        }
        if (w->cur >= w->n) {
            st = inf_err_set(err, INF_E_RANGE, "%zu bytes written past the last tensor", nbytes);
            goto fail;
        }
        struct wtensor *t = &w->t[w->cur];
        if ((st = advance_to_shard(w, t->shard, err)) != INF_OK)
            goto fail;
        uint64_t left = t->nbytes - w->cur_done;
        size_t k = nbytes < left ? nbytes : (size_t)left;
        if (fwrite(p, 1, k, w->f) != k) {
            st = inf_err_set(err, INF_E_IO, "%s: write failed: %s", w->shard_names[t->shard],
                             strerror(errno));
            goto fail;
        }
        p += k;
        nbytes -= k;
        w->cur_done += k;
    }
    return INF_OK;
fail:
    w->failed = true;
    return st;
}

inf_status_t eng_st_writer_finish(eng_st_writer_t *w, struct inf_err *err)
{
    if (w->failed)
        return inf_err_set(err, INF_E_INVALID, "writer failed earlier");
    inf_status_t st = INF_OK;
    if (!w->started && (st = start(w, err)) != INF_OK)
        goto fail;
    while (w->cur < w->n && w->cur_done == w->t[w->cur].nbytes) {
        w->cur++;
        w->cur_done = 0;
    }
    if (w->cur < w->n) {
        st = inf_err_set(err, INF_E_INVALID, "tensor '%.80s': %llu of %llu bytes written",
                         w->t[w->cur].name, (unsigned long long)w->cur_done,
                         (unsigned long long)w->t[w->cur].nbytes);
        goto fail;
    }
    if ((st = advance_to_shard(w, w->n_shards - 1, err)) != INF_OK)
        goto fail;
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0) {
        st = inf_err_set(err, INF_E_IO, "%s: write failed", w->shard_names[w->n_shards - 1]);
        goto fail;
    }
    return INF_OK;
fail:
    w->failed = true;
    return st;
}

int32_t eng_st_writer_shards(const eng_st_writer_t *w)
{
    return w->n_shards;
}

const char *eng_st_writer_shard_name(const eng_st_writer_t *w, int32_t i)
{
    if (!w->shard_names || i < 0 || i >= w->n_shards)
        return NULL;
    return w->shard_names[i];
}
