/* engine/weights/safetensors.c — the safetensors reader: header parsing and
 * validation, memory-mapped files, sharded checkpoints.
 *
 * File layout: u64 little-endian N, N bytes of JSON header, then the data
 * area. The header maps each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end]} with offsets relative to the data area;
 * "__metadata__" (string -> string) is allowed and ignored. */
#define INF_LOG_MODULE "eng"
#include "engine/weights/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers past 100 MB; so do we, before
 * handing a length from the file to the JSON parser. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

struct eng_st_header {
    int64_t count;
    struct eng_st_tensor *tensors; /* sorted by data offset */
    char *strings;                 /* names and the file name, one block */
};

struct st_shard {
    void *map;
    size_t map_len;
    struct eng_st_header *h;
};

struct eng_st {
    int32_t n_shards;
    struct st_shard *shards;
    int64_t count;
    const struct eng_st_tensor **all;    /* shard by shard, offset order */
    const struct eng_st_tensor **sorted; /* by name, for eng_st_find */
};

/* ---- dtypes ---------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [ENG_DT_F32] = {"F32", 4}, [ENG_DT_F16] = {"F16", 2}, [ENG_DT_BF16] = {"BF16", 2},
    [ENG_DT_I32] = {"I32", 4}, [ENG_DT_I8] = {"I8", 1},   [ENG_DT_U8] = {"U8", 1},
    [ENG_DT_I64] = {"I64", 8},
};
#define N_DTYPES ((int)(sizeof dtype_info / sizeof dtype_info[0]))

size_t eng_dtype_size(enum eng_dtype dt)
{
    if ((int)dt < 0 || (int)dt >= N_DTYPES)
        return 0;
    return dtype_info[dt].size;
}

const char *eng_dtype_name(enum eng_dtype dt)
{
    if ((int)dt < 0 || (int)dt >= N_DTYPES)
        return "?";
    return dtype_info[dt].name;
}

bool eng_dtype_parse(const char *name, enum eng_dtype *out)
{
    for (int i = 0; i < N_DTYPES; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (enum eng_dtype)i;
            return true;
        }
    }
    return false;
}

/* ---- header ---------------------------------------------------------------- */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* A JSON integer in [0, INT64_MAX]; false otherwise. */
static bool json_nonneg(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    if (x < 0)
        return false;
    *out = (uint64_t)x;
    return true;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct eng_st_tensor *x = a, *y = b;
    uintptr_t ox = (uintptr_t)x->data, oy = (uintptr_t)y->data;
    if (ox != oy)
        return ox < oy ? -1 : 1;
    /* equal begins: the empty tensor first, so a zero-length tensor never
     * hides an overlap behind it */
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Validate one tensor entry; fills t except name and file. */
static inf_status_t parse_entry(const char *file, const char *name, const json_t *v,
                                uint64_t data_len, struct eng_st_tensor *t, struct inf_err *err)
{
    if (!json_is_object(v))
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s': entry is not an object", file,
                           name);
    const json_t *jd = json_object_get(v, "dtype");
    const json_t *js = json_object_get(v, "shape");
    const json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s': missing or non-string dtype",
                           file, name);
    if (!eng_dtype_parse(json_string_value(jd), &t->dtype))
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s': unknown dtype '%.16s'", file,
                           name, json_string_value(jd));
    if (!json_is_array(js))
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s': missing or non-array shape",
                           file, name);
    size_t nd = json_array_size(js);
    if (nd > ENG_ST_MAX_DIMS)
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s': %zu dimensions, at most %d",
                           file, name, nd, ENG_ST_MAX_DIMS);
    t->ndim = (int32_t)nd;
    /* numel * size must fit the data area, which bounds every product: check
     * each step against the limit so nothing overflows on the way. */
    uint64_t esize = eng_dtype_size(t->dtype);
    uint64_t limit = data_len / esize;
    uint64_t numel = 1;
    bool zero = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_nonneg(json_array_get(js, i), &d))
            return inf_err_set(err, INF_E_FORMAT,
                               "%s: tensor '%.80s': shape[%zu] is not a non-negative integer", file,
                               name, i);
        t->shape[i] = (int64_t)d;
        if (d == 0)
            zero = true;
        else if (!zero) {
            if (numel > limit / d)
                return inf_err_set(err, INF_E_FORMAT,
                                   "%s: tensor '%.80s': shape larger than the data area", file,
                                   name);
            numel *= d;
        }
    }
    if (zero)
        numel = 0;
    for (size_t i = nd; i < ENG_ST_MAX_DIMS; i++)
        t->shape[i] = 1;
    t->numel = (int64_t)numel;
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: tensor '%.80s': data_offsets is not a [begin, end] pair", file,
                           name);
    uint64_t b, e;
    if (!json_nonneg(json_array_get(jo, 0), &b) || !json_nonneg(json_array_get(jo, 1), &e))
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: tensor '%.80s': data_offsets are not non-negative integers", file,
                           name);
    if (b > e || e > data_len)
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: tensor '%.80s': data_offsets [%llu, %llu] outside the data area "
                           "of %llu bytes",
                           file, name, (unsigned long long)b, (unsigned long long)e,
                           (unsigned long long)data_len);
    if (e - b != numel * esize)
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: tensor '%.80s': %llu bytes but shape x %s needs %llu", file, name,
                           (unsigned long long)(e - b), eng_dtype_name(t->dtype),
                           (unsigned long long)(numel * esize));
    t->data = (const void *)(uintptr_t)b; /* an offset until the caller rebases it */
    t->nbytes = (size_t)(e - b);
    return INF_OK;
}

inf_status_t eng_st_header_parse(const char *json, size_t json_len, uint64_t data_len,
                                 const char *file, struct eng_st_header **out, struct inf_err *err)
{
    *out = NULL;
    file = file ? base_name(file) : "(buffer)";
    json_error_t jerr;
    json_t *root = json_loadb(json, json_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return inf_err_set(err, INF_E_FORMAT, "%s: header is not valid JSON: %.100s (offset %d)",
                           file, jerr.text, jerr.position);
    inf_status_t st = INF_OK;
    struct eng_st_header *h = NULL;
    if (!json_is_object(root)) {
        st = inf_err_set(err, INF_E_FORMAT, "%s: header is not a JSON object", file);
        goto fail;
    }
    size_t n = 0, strbytes = strlen(file) + 1;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v)) {
                st = inf_err_set(err, INF_E_FORMAT, "%s: __metadata__ is not an object", file);
                goto fail;
            }
            continue;
        }
        n++;
        strbytes += strlen(key) + 1;
    }
    h = calloc(1, sizeof *h);
    if (!h || !(h->tensors = calloc(n ? n : 1, sizeof *h->tensors)) ||
        !(h->strings = malloc(strbytes))) {
        st = inf_err_set(err, INF_E_NOMEM, "%s: out of memory for %zu tensors", file, n);
        goto fail;
    }
    char *sp = h->strings;
    size_t flen = strlen(file) + 1;
    memcpy(sp, file, flen);
    const char *fname = sp;
    sp += flen;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        struct eng_st_tensor *t = &h->tensors[h->count];
        if (key[0] == '\0') {
            st = inf_err_set(err, INF_E_FORMAT, "%s: a tensor has an empty name", file);
            goto fail;
        }
        st = parse_entry(file, key, v, data_len, t, err);
        if (st != INF_OK)
            goto fail;
        size_t klen = strlen(key) + 1;
        memcpy(sp, key, klen);
        t->name = sp;
        t->file = fname;
        sp += klen;
        h->count++;
    }
    qsort(h->tensors, (size_t)h->count, sizeof *h->tensors, cmp_offset);
    /* In offset order, each non-empty tensor must start at or after the end
     * of every non-empty tensor before it. */
    const struct eng_st_tensor *last = NULL;
    for (int64_t i = 0; i < h->count; i++) {
        const struct eng_st_tensor *b = &h->tensors[i];
        if (b->nbytes == 0)
            continue;
        if (last && (uintptr_t)b->data < (uintptr_t)last->data + last->nbytes) {
            st = inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s' overlaps tensor '%.80s'", file,
                             b->name, last->name);
            goto fail;
        }
        last = b;
    }
    json_decref(root);
    *out = h;
    return INF_OK;
fail:
    eng_st_header_free(h);
    json_decref(root);
    return st;
}

void eng_st_header_free(struct eng_st_header *h)
{
    if (!h)
        return;
    free(h->tensors);
    free(h->strings);
    free(h);
}

int64_t eng_st_header_count(const struct eng_st_header *h)
{
    return h->count;
}

const struct eng_st_tensor *eng_st_header_at(const struct eng_st_header *h, int64_t i)
{
    if (i < 0 || i >= h->count)
        return NULL;
    return &h->tensors[i];
}

inf_status_t eng_st_buffer_parse(const void *buf, size_t len, const char *file,
                                 struct eng_st_header **out, struct inf_err *err)
{
    *out = NULL;
    const char *fname = file ? base_name(file) : "(buffer)";
    if (len < 8)
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: %zu bytes, shorter than the 8-byte header length", fname, len);
    const unsigned char *p = buf;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER)
        return inf_err_set(err, INF_E_FORMAT, "%s: header length %llu over the limit of %llu",
                           fname, (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    if (hlen > len - 8)
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: header length %llu runs past the end of the file (%zu bytes)",
                           fname, (unsigned long long)hlen, len);
    struct eng_st_header *h;
    const char *json = (const char *)p + 8;
    uint64_t data_len = len - 8 - hlen;
    inf_status_t st = eng_st_header_parse(json, (size_t)hlen, data_len, fname, &h, err);
    if (st != INF_OK)
        return st;
    const unsigned char *data = p + 8 + hlen;
    for (int64_t i = 0; i < h->count; i++)
        h->tensors[i].data = data + (uintptr_t)h->tensors[i].data;
    *out = h;
    return INF_OK;
}

/* ---- files ------------------------------------------------------------------ */

static inf_status_t shard_open(const char *path, struct st_shard *sh, struct inf_err *err)
{
    const char *fname = base_name(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        inf_log(ERROR, "open %s: %s", path, strerror(e));
        return inf_err_set(err, e == ENOENT ? INF_E_NOTFOUND : INF_E_IO, "%s: cannot open: %s",
                           fname, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return inf_err_set(err, INF_E_IO, "%s: not a regular file", fname);
    }
    if (sb.st_size < 8) {
        close(fd);
        return inf_err_set(err, INF_E_FORMAT,
                           "%s: %lld bytes, shorter than the 8-byte header length", fname,
                           (long long)sb.st_size);
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        inf_log(ERROR, "mmap %s (%zu bytes): %s", path, len, strerror(e));
        return inf_err_set(err, INF_E_IO, "%s: cannot map %zu bytes: %s", fname, len, strerror(e));
    }
    inf_status_t st = eng_st_buffer_parse(map, len, fname, &sh->h, err);
    if (st != INF_OK) {
        munmap(map, len);
        return st;
    }
    sh->map = map;
    sh->map_len = len;
    return INF_OK;
}

static int cmp_name(const void *a, const void *b)
{
    const struct eng_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Build st->all and st->sorted from the shards; duplicates are an error. */
static inf_status_t index_tensors(eng_st_t *st, struct inf_err *err)
{
    int64_t n = 0;
    for (int32_t s = 0; s < st->n_shards; s++)
        n += st->shards[s].h->count;
    st->all = calloc(n ? (size_t)n : 1, sizeof *st->all);
    st->sorted = calloc(n ? (size_t)n : 1, sizeof *st->sorted);
    if (!st->all || !st->sorted)
        return inf_err_set(err, INF_E_NOMEM, "out of memory indexing %lld tensors", (long long)n);
    int64_t k = 0;
    for (int32_t s = 0; s < st->n_shards; s++)
        for (int64_t i = 0; i < st->shards[s].h->count; i++)
            st->all[k++] = &st->shards[s].h->tensors[i];
    st->count = n;
    memcpy(st->sorted, st->all, (size_t)n * sizeof *st->all);
    qsort(st->sorted, (size_t)n, sizeof *st->sorted, cmp_name);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(st->sorted[i - 1]->name, st->sorted[i]->name) == 0)
            return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s' also appears in %s",
                               st->sorted[i]->file, st->sorted[i]->name, st->sorted[i - 1]->file);
    return INF_OK;
}

static char *read_small_file(const char *path, size_t max, size_t *len, inf_status_t *code,
                             int *eno)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *eno = errno;
        *code = errno == ENOENT ? INF_E_NOTFOUND : INF_E_IO;
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= max) {
                *code = INF_E_TOOBIG;
                *eno = 0;
                goto fail;
            }
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                *code = INF_E_NOMEM;
                *eno = ENOMEM;
                goto fail;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                *code = INF_E_IO;
                *eno = EIO;
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

/* A shard name from an index must be a plain file name in the same folder. */
static bool shard_name_ok(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 &&
           strlen(s) < 256;
}

static inf_status_t open_sharded(eng_st_t *st, const char *dir, const char *index_path,
                                 struct inf_err *err)
{
    const char *iname = base_name(index_path);
    size_t len;
    inf_status_t code = INF_E_IO;
    int eno = 0;
    char *text = read_small_file(index_path, (size_t)64 << 20, &len, &code, &eno);
    if (!text)
        return inf_err_set(err, code, "%s: cannot read: %s", iname,
                           eno ? strerror(eno) : "too large");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return inf_err_set(err, INF_E_FORMAT, "%s: not valid JSON: %.100s (line %d)", iname,
                           jerr.text, jerr.line);
    inf_status_t s = INF_OK;
    char *path = NULL;
    const char **names = NULL;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        s = inf_err_set(err, INF_E_FORMAT, "%s: weight_map is missing, empty or not an object",
                        iname);
        goto out;
    }
    /* Distinct shard names, in order of first mention. */
    size_t nw = json_object_size(wm);
    names = calloc(nw, sizeof *names);
    st->shards = calloc(nw, sizeof *st->shards);
    if (!names || !st->shards) {
        s = inf_err_set(err, INF_E_NOMEM, "%s: out of memory", iname);
        goto out;
    }
    const char *key;
    json_t *v;
    int32_t ns = 0;
    json_object_foreach(wm, key, v)
    {
        if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
            s = inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s': shard is not a file name",
                            iname, key);
            goto out;
        }
        const char *f = json_string_value(v);
        int32_t j = 0;
        while (j < ns && strcmp(names[j], f) != 0)
            j++;
        if (j == ns)
            names[ns++] = f;
    }
    size_t plen = strlen(dir) + 300;
    path = malloc(plen);
    if (!path) {
        s = inf_err_set(err, INF_E_NOMEM, "%s: out of memory", iname);
        goto out;
    }
    for (int32_t j = 0; j < ns; j++) {
        snprintf(path, plen, "%s/%s", dir, names[j]);
        s = shard_open(path, &st->shards[j], err);
        if (s != INF_OK)
            goto out;
        st->n_shards++;
    }
    s = index_tensors(st, err);
    if (s != INF_OK)
        goto out;
    json_object_foreach(wm, key, v)
    {
        const struct eng_st_tensor *t = eng_st_find(st, key);
        const char *f = json_string_value(v);
        if (!t) {
            s = inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s' listed in %s is missing", f, key,
                            iname);
            goto out;
        }
        if (strcmp(t->file, f) != 0) {
            s = inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s' listed in %s is in %s", f, key,
                            iname, t->file);
            goto out;
        }
    }
out:
    free(path);
    free(names);
    json_decref(root);
    return s;
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

inf_status_t eng_st_open(const char *path, eng_st_t **out, struct inf_err *err)
{
    *out = NULL;
    eng_st_t *st = calloc(1, sizeof *st);
    size_t plen = strlen(path) + sizeof ST_INDEX_NAME + 2;
    char *buf = malloc(plen);
    inf_status_t s = INF_OK;
    if (!st || !buf) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory opening a checkpoint");
        goto fail;
    }
    if (is_dir(path)) {
        snprintf(buf, plen, "%s/%s", path, ST_INDEX_NAME);
        if (access(buf, F_OK) == 0) {
            s = open_sharded(st, path, buf, err);
        } else {
            snprintf(buf, plen, "%s/%s", path, ST_SINGLE_NAME);
            if (access(buf, F_OK) != 0) {
                inf_log(ERROR, "no %s or %s in %s", ST_SINGLE_NAME, ST_INDEX_NAME, path);
                s = inf_err_set(err, INF_E_NOTFOUND, "no %s or %s in the model folder",
                                ST_SINGLE_NAME, ST_INDEX_NAME);
                goto fail;
            }
            st->shards = calloc(1, sizeof *st->shards);
            if (!st->shards) {
                s = inf_err_set(err, INF_E_NOMEM, "out of memory opening a checkpoint");
                goto fail;
            }
            s = shard_open(buf, &st->shards[0], err);
            if (s == INF_OK) {
                st->n_shards = 1;
                s = index_tensors(st, err);
            }
        }
    } else if (ends_with(path, ".index.json")) {
        snprintf(buf, plen, "%s", path);
        char *slash = strrchr(buf, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(buf, plen, ".");
        s = open_sharded(st, buf, path, err);
    } else {
        st->shards = calloc(1, sizeof *st->shards);
        if (!st->shards) {
            s = inf_err_set(err, INF_E_NOMEM, "out of memory opening a checkpoint");
            goto fail;
        }
        s = shard_open(path, &st->shards[0], err);
        if (s == INF_OK) {
            st->n_shards = 1;
            s = index_tensors(st, err);
        }
    }
    if (s != INF_OK)
        goto fail;
    free(buf);
    *out = st;
    return INF_OK;
fail:
    free(buf);
    eng_st_close(st);
    return s;
}

void eng_st_close(eng_st_t *st)
{
    if (!st)
        return;
    for (int32_t i = 0; i < st->n_shards; i++) {
        eng_st_header_free(st->shards[i].h);
        munmap(st->shards[i].map, st->shards[i].map_len);
    }
    free(st->shards);
    free(st->all);
    free(st->sorted);
    free(st);
}

/* ---- lookup and conversion --------------------------------------------------- */

const struct eng_st_tensor *eng_st_find(const eng_st_t *st, const char *name)
{
    int64_t lo = 0, hi = st->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->sorted[mid]->name, name);
        if (c == 0)
            return st->sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void shape_str(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

inf_status_t eng_st_require(const eng_st_t *st, const char *name, int32_t ndim,
                            const int64_t *shape, const struct eng_st_tensor **out,
                            struct inf_err *err)
{
    *out = NULL;
    const struct eng_st_tensor *t = eng_st_find(st, name);
    if (!t)
        return inf_err_set(err, INF_E_NOTFOUND, "tensor '%.100s' is missing from the checkpoint",
                           name);
    bool same = t->ndim == ndim;
    for (int32_t i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char want[64], got[64];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        return inf_err_set(err, INF_E_FORMAT, "%s: tensor '%.80s' has shape %s, expected %s",
                           t->file, name, got, want);
    }
    *out = t;
    return INF_OK;
}

int64_t eng_st_count(const eng_st_t *st)
{
    return st->count;
}

const struct eng_st_tensor *eng_st_at(const eng_st_t *st, int64_t i)
{
    if (i < 0 || i >= st->count)
        return NULL;
    return st->all[i];
}

/* fp16 -> fp32 by table: inf_f16_to_f32 of every bit pattern, built once
 * (256 KiB), so converting a checkpoint costs a load per element. */
static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void f16_table_init(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = inf_f16_to_f32((uint16_t)i);
}

static inf_status_t read_check(const struct eng_st_tensor *t, int64_t first, int64_t n,
                               struct inf_err *err)
{
    if (t->dtype != ENG_DT_F32 && t->dtype != ENG_DT_F16 && t->dtype != ENG_DT_BF16)
        return inf_err_set(err, INF_E_UNSUPPORTED, "%s: tensor '%.80s' is %s, not a float type",
                           t->file, t->name, eng_dtype_name(t->dtype));
    if (first < 0 || n < 0 || first > t->numel || n > t->numel - first)
        return inf_err_set(err, INF_E_RANGE,
                           "%s: tensor '%.80s': elements [%lld, +%lld) outside its %lld", t->file,
                           t->name, (long long)first, (long long)n, (long long)t->numel);
    return INF_OK;
}

inf_status_t eng_st_read_f32(const struct eng_st_tensor *t, int64_t first, int64_t n, float *dst,
                             struct inf_err *err)
{
    inf_status_t s = read_check(t, first, n, err);
    if (s != INF_OK || n == 0)
        return s;
    const unsigned char *src =
        (const unsigned char *)t->data + (size_t)first * eng_dtype_size(t->dtype);
    switch (t->dtype) {
    case ENG_DT_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case ENG_DT_F16:
        pthread_once(&f16_once, f16_table_init);
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = f16_table[h];
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = inf_bf16_to_f32(h);
        }
        break;
    }
    return INF_OK;
}

inf_status_t eng_st_read_f16(const struct eng_st_tensor *t, int64_t first, int64_t n, uint16_t *dst,
                             struct inf_err *err)
{
    inf_status_t s = read_check(t, first, n, err);
    if (s != INF_OK || n == 0)
        return s;
    const unsigned char *src =
        (const unsigned char *)t->data + (size_t)first * eng_dtype_size(t->dtype);
    switch (t->dtype) {
    case ENG_DT_F16:
        /* fp16 -> fp32 -> fp16 gives every value back but NaNs, which
         * inf_f32_to_f16 turns into the quiet NaN of their sign. */
        memcpy(dst, src, (size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            if ((dst[i] & 0x7c00u) == 0x7c00u && (dst[i] & 0x3ffu) != 0)
                dst[i] = (uint16_t)((dst[i] & 0x8000u) | 0x7e00u);
        break;
    case ENG_DT_F32:
        for (int64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, 4);
            dst[i] = inf_f32_to_f16(f);
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = inf_f32_to_f16(inf_bf16_to_f32(h));
        }
        break;
    }
    return INF_OK;
}

inf_status_t eng_st_read_i32(const struct eng_st_tensor *t, int64_t first, int64_t n, int32_t *dst,
                             struct inf_err *err)
{
    if (t->dtype != ENG_DT_I32 && t->dtype != ENG_DT_I64)
        return inf_err_set(err, INF_E_UNSUPPORTED, "%s: tensor '%.80s' is %s, not I32 or I64",
                           t->file, t->name, eng_dtype_name(t->dtype));
    if (first < 0 || n < 0 || first > t->numel || n > t->numel - first)
        return inf_err_set(err, INF_E_RANGE,
                           "%s: tensor '%.80s': elements [%lld, +%lld) outside its %lld", t->file,
                           t->name, (long long)first, (long long)n, (long long)t->numel);
    const unsigned char *src =
        (const unsigned char *)t->data + (size_t)first * eng_dtype_size(t->dtype);
    if (t->dtype == ENG_DT_I32) {
        if (n > 0)
            memcpy(dst, src, (size_t)n * 4);
        return INF_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, src + 8 * i, 8);
        if (v < INT32_MIN || v > INT32_MAX)
            return inf_err_set(err, INF_E_RANGE, "%s: tensor '%.80s': element %lld is %lld",
                               t->file, t->name, (long long)(first + i), (long long)v);
        dst[i] = (int32_t)v;
    }
    return INF_OK;
}

void eng_st_prefetch(const struct eng_st_tensor *t)
{
    if (!t || t->nbytes == 0)
        return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)t->data, b = a + t->nbytes;
    uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096;
    a -= a % page;
    (void)madvise((void *)a, b - a, MADV_WILLNEED); /* a hint: failure changes nothing */
}
