/* Safetensors reader and streaming writer: round trips for every dtype,
 * sharded checkpoints, and each kind of malformed file built byte by byte. */
#include "engine/weights/safetensors.h"
#include "engine/weights/safetensors_write.h"

#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------- */

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/int4serve-st-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmpdir);
}

static char *path_in(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *name, const void *data, size_t len)
{
    FILE *f = fopen(path_in(name), "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

/* A safetensors file: 8-byte little-endian header length, the JSON, then
 * data_len bytes 0, 1, 2, ... */
static void write_st(const char *name, const char *json, size_t data_len)
{
    size_t hl = strlen(json);
    size_t len = 8 + hl + data_len;
    unsigned char *buf = malloc(len);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + i] = (unsigned char)i;
    write_bytes(name, buf, len);
    free(buf);
}

/* Open name in tmpdir expecting code; the message must name every needle. */
static void expect_open_fails(const char *path, inf_status_t code, const char *needle1,
                              const char *needle2)
{
    eng_st_t *st = (eng_st_t *)0x1;
    struct inf_err err;
    inf_err_clear(&err);
    inf_status_t s = eng_st_open(path, &st, &err);
    ck_assert_msg(s == code, "status %s, want %s (%s)", inf_status_name(s), inf_status_name(code),
                  err.msg);
    ck_assert_int_eq(err.code, code);
    ck_assert_ptr_null(st);
    if (needle1)
        ck_assert_msg(strstr(err.msg, needle1), "'%s' not in '%s'", needle1, err.msg);
    if (needle2)
        ck_assert_msg(strstr(err.msg, needle2), "'%s' not in '%s'", needle2, err.msg);
    /* no directory in the message: only base names */
    ck_assert_msg(!strstr(err.msg, "/tmp"), "path leaked: %s", err.msg);
}

static void expect_bad(const char *json, size_t data_len, inf_status_t code, const char *tensor)
{
    write_st("bad.safetensors", json, data_len);
    expect_open_fails(path_in("bad.safetensors"), code, "bad.safetensors", tensor);
}

/* ---- round trips ------------------------------------------------------------ */

/* Stream the bytes of one tensor in odd-sized chunks. */
static void stream(eng_st_writer_t *w, const void *data, size_t len)
{
    const unsigned char *p = data;
    struct inf_err err;
    size_t chunk = 7;
    while (len > 0) {
        size_t k = len < chunk ? len : chunk;
        ck_assert_int_eq(eng_st_writer_write(w, p, k, &err), INF_OK);
        p += k;
        len -= k;
        chunk = chunk * 3 + 1;
    }
}

START_TEST(roundtrip_every_dtype)
{
    struct inf_err err;
    eng_st_writer_t *w;
    ck_assert_int_eq(eng_st_writer_create(tmpdir, 1, &w, &err), INF_OK);
    float f32[6];
    uint16_t f16[6], bf16[6];
    int32_t i32[5] = {-2147483647 - 1, -1, 0, 1, 2147483647};
    int8_t i8[4] = {-128, -1, 0, 127};
    uint8_t u8[3] = {0, 128, 255};
    int64_t i64[2] = {INT64_MIN, INT64_MAX};
    /* values exact in every float format */
    const float vals[6] = {0.0f, 1.0f, -2.5f, 0.125f, 1024.0f, -0.0078125f};
    for (int i = 0; i < 6; i++) {
        f32[i] = vals[i] + (float)i * 1e-7f; /* f32 keeps what halves would round */
        f16[i] = inf_f32_to_f16(vals[i]);
        bf16[i] = inf_f32_to_bf16(vals[i]);
    }
    int64_t s23[2] = {2, 3}, s5[1] = {5}, s4[1] = {4}, s3[1] = {3}, s2[1] = {2};
    int64_t s3x1x2[3] = {3, 1, 2}, s_empty[2] = {0, 7};
    ck_assert_int_eq(eng_st_writer_add(w, "a.f32", ENG_DT_F32, 2, s23, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "b.f16", ENG_DT_F16, 3, s3x1x2, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "c.bf16", ENG_DT_BF16, 2, s23, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "d.empty", ENG_DT_F32, 2, s_empty, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "e.i32", ENG_DT_I32, 1, s5, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "f.i8", ENG_DT_I8, 1, s4, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "g.u8", ENG_DT_U8, 1, s3, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "h.i64", ENG_DT_I64, 1, s2, &err), INF_OK);
    float scalar = 3.5f;
    ck_assert_int_eq(eng_st_writer_add(w, "i.scalar", ENG_DT_F32, 0, NULL, &err), INF_OK);
    stream(w, f32, sizeof f32);
    stream(w, f16, sizeof f16);
    stream(w, bf16, sizeof bf16);
    stream(w, i32, sizeof i32);
    stream(w, i8, sizeof i8);
    stream(w, u8, sizeof u8);
    stream(w, i64, sizeof i64);
    stream(w, &scalar, sizeof scalar);
    ck_assert_int_eq(eng_st_writer_finish(w, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_shards(w), 1);
    ck_assert_str_eq(eng_st_writer_shard_name(w, 0), "model.safetensors");
    eng_st_writer_destroy(w);

    /* the header is padded to 8 bytes so the data area is aligned */
    FILE *f = fopen(path_in("model.safetensors"), "rb");
    unsigned char lenb[8];
    ck_assert_uint_eq(fread(lenb, 1, 8, f), 8);
    fclose(f);
    ck_assert_uint_eq(lenb[0] % 8, 0);

    eng_st_t *st;
    ck_assert_int_eq(eng_st_open(tmpdir, &st, &err), INF_OK);
    ck_assert_int_eq(eng_st_count(st), 9);
    const struct eng_st_tensor *t = eng_st_find(st, "a.f32");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, ENG_DT_F32);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], 2);
    ck_assert_int_eq(t->shape[1], 3);
    ck_assert_int_eq(t->numel, 6);
    ck_assert_uint_eq(t->nbytes, 24);
    ck_assert_str_eq(t->file, "model.safetensors");
    ck_assert_int_eq(memcmp(t->data, f32, sizeof f32), 0);
    float out[6];
    ck_assert_int_eq(eng_st_read_f32(t, 0, 6, out, &err), INF_OK);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(out[i], f32[i]);

    t = eng_st_find(st, "b.f16");
    ck_assert_int_eq(t->dtype, ENG_DT_F16);
    ck_assert_int_eq(t->ndim, 3);
    ck_assert_int_eq(t->shape[0], 3);
    ck_assert_int_eq(t->shape[1], 1);
    ck_assert_int_eq(t->shape[2], 2);
    ck_assert_int_eq(memcmp(t->data, f16, sizeof f16), 0);
    /* a sub-range at an odd element */
    ck_assert_int_eq(eng_st_read_f32(t, 1, 5, out, &err), INF_OK);
    for (int i = 0; i < 5; i++)
        ck_assert_float_eq(out[i], vals[i + 1]);

    t = eng_st_find(st, "c.bf16");
    ck_assert_int_eq(t->dtype, ENG_DT_BF16);
    ck_assert_int_eq(eng_st_read_f32(t, 0, 6, out, &err), INF_OK);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(out[i], vals[i]);

    t = eng_st_find(st, "d.empty");
    ck_assert_int_eq(t->numel, 0);
    ck_assert_uint_eq(t->nbytes, 0);
    ck_assert_int_eq(t->shape[1], 7);
    ck_assert_int_eq(eng_st_read_f32(t, 0, 0, out, &err), INF_OK);

    t = eng_st_find(st, "e.i32");
    ck_assert_int_eq(t->dtype, ENG_DT_I32);
    int32_t i32b[5];
    memcpy(i32b, t->data, sizeof i32b);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(i32b[i], i32[i]);
    ck_assert_int_eq(eng_st_read_f32(t, 0, 1, out, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "e.i32"));

    t = eng_st_find(st, "f.i8");
    ck_assert_int_eq(t->dtype, ENG_DT_I8);
    ck_assert_int_eq(((const int8_t *)t->data)[0], -128);
    ck_assert_int_eq(((const int8_t *)t->data)[3], 127);
    t = eng_st_find(st, "g.u8");
    ck_assert_int_eq(t->dtype, ENG_DT_U8);
    ck_assert_int_eq(((const uint8_t *)t->data)[2], 255);
    t = eng_st_find(st, "h.i64");
    ck_assert_int_eq(t->dtype, ENG_DT_I64);
    int64_t i64b[2];
    memcpy(i64b, t->data, sizeof i64b);
    ck_assert(i64b[0] == INT64_MIN && i64b[1] == INT64_MAX);
    t = eng_st_find(st, "i.scalar");
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_int_eq(t->numel, 1);
    ck_assert_int_eq(eng_st_read_f32(t, 0, 1, out, &err), INF_OK);
    ck_assert_float_eq(out[0], 3.5f);

    /* iteration is in file order */
    ck_assert_str_eq(eng_st_at(st, 0)->name, "a.f32");
    ck_assert_str_eq(eng_st_at(st, 8)->name, "i.scalar");
    ck_assert_ptr_null(eng_st_at(st, 9));
    ck_assert_ptr_null(eng_st_find(st, "nope"));

    /* require: shape checked, absence named */
    const struct eng_st_tensor *r;
    int64_t want[2] = {2, 3}, wrong[2] = {3, 2};
    ck_assert_int_eq(eng_st_require(st, "a.f32", 2, want, &r, &err), INF_OK);
    ck_assert_ptr_eq(r, eng_st_find(st, "a.f32"));
    ck_assert_int_eq(eng_st_require(st, "a.f32", 2, wrong, &r, &err), INF_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "a.f32"));
    ck_assert_ptr_nonnull(strstr(err.msg, "[2, 3]"));
    ck_assert_ptr_nonnull(strstr(err.msg, "[3, 2]"));
    ck_assert_int_eq(eng_st_require(st, "a.f32", 1, want, &r, &err), INF_E_FORMAT);
    ck_assert_int_eq(eng_st_require(st, "missing.w", 2, want, &r, &err), INF_E_NOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "missing.w"));
    ck_assert_ptr_null(r);

    /* read_f32 bounds */
    t = eng_st_find(st, "a.f32");
    ck_assert_int_eq(eng_st_read_f32(t, 4, 3, out, &err), INF_E_RANGE);
    ck_assert_int_eq(eng_st_read_f32(t, -1, 1, out, &err), INF_E_RANGE);
    ck_assert_int_eq(eng_st_read_f32(t, 0, -1, out, &err), INF_E_RANGE);
    ck_assert_int_eq(eng_st_read_f32(t, 7, 0, out, &err), INF_E_RANGE);
    eng_st_close(st);

    /* the file itself opens too */
    ck_assert_int_eq(eng_st_open(path_in("model.safetensors"), &st, &err), INF_OK);
    ck_assert_int_eq(eng_st_count(st), 9);
    eng_st_close(st);
    eng_st_close(NULL);
}
END_TEST

START_TEST(f16_bf16_rounding_and_specials)
{
    /* read_f32 widens the stored bits exactly, including inf and subnormals */
    struct inf_err err;
    eng_st_writer_t *w;
    ck_assert_int_eq(eng_st_writer_create(tmpdir, 1, &w, &err), INF_OK);
    uint16_t h[4] = {0x7c00, 0xfc00, 0x0001, 0x3555}; /* inf, -inf, 2^-24, 0.333251953125 */
    uint16_t b[3] = {0x3f80, 0xc040, 0x0080};         /* 1, -3, 2^-126 */
    int64_t s4[1] = {4}, s3[1] = {3};
    ck_assert_int_eq(eng_st_writer_add(w, "h", ENG_DT_F16, 1, s4, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "b", ENG_DT_BF16, 1, s3, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_write(w, h, sizeof h, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_write(w, b, sizeof b, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_finish(w, &err), INF_OK);
    eng_st_writer_destroy(w);
    eng_st_t *st;
    ck_assert_int_eq(eng_st_open(tmpdir, &st, &err), INF_OK);
    float o[4];
    ck_assert_int_eq(eng_st_read_f32(eng_st_find(st, "h"), 0, 4, o, &err), INF_OK);
    ck_assert(isinf(o[0]) && o[0] > 0);
    ck_assert(isinf(o[1]) && o[1] < 0);
    ck_assert_float_eq(o[2], ldexpf(1.0f, -24));
    ck_assert_float_eq(o[3], 0.333251953125f);
    ck_assert_int_eq(eng_st_read_f32(eng_st_find(st, "b"), 0, 3, o, &err), INF_OK);
    ck_assert_float_eq(o[0], 1.0f);
    ck_assert_float_eq(o[1], -3.0f);
    ck_assert_float_eq(o[2], ldexpf(1.0f, -126));
    eng_st_close(st);
}
END_TEST

START_TEST(roundtrip_sharded)
{
    struct inf_err err;
    eng_st_writer_t *w;
    ck_assert_int_eq(eng_st_writer_create(tmpdir, 3, &w, &err), INF_OK);
    enum { NT = 7, NE = 1000 };
    char name[NT][32];
    for (int i = 0; i < NT; i++) {
        snprintf(name[i], sizeof name[i], "model.layers.%d.w", i);
        int64_t shape[2] = {10, NE / 10};
        ck_assert_int_eq(eng_st_writer_add(w, name[i], ENG_DT_F32, 2, shape, &err), INF_OK);
    }
    float *buf = malloc(NE * sizeof *buf);
    for (int i = 0; i < NT; i++) {
        for (int j = 0; j < NE; j++)
            buf[j] = (float)(i * NE + j);
        stream(w, buf, NE * sizeof *buf);
    }
    /* one byte too many is refused */
    ck_assert_int_eq(eng_st_writer_write(w, buf, 1, &err), INF_E_RANGE);
    eng_st_writer_destroy(w);

    ck_assert_int_eq(eng_st_writer_create(tmpdir, 3, &w, &err), INF_OK);
    for (int i = 0; i < NT; i++) {
        int64_t shape[2] = {10, NE / 10};
        ck_assert_int_eq(eng_st_writer_add(w, name[i], ENG_DT_F32, 2, shape, &err), INF_OK);
    }
    for (int i = 0; i < NT; i++) {
        for (int j = 0; j < NE; j++)
            buf[j] = (float)(i * NE + j);
        stream(w, buf, NE * sizeof *buf);
    }
    ck_assert_int_eq(eng_st_writer_finish(w, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_shards(w), 3);
    ck_assert_str_eq(eng_st_writer_shard_name(w, 0), "model-00001-of-00003.safetensors");
    ck_assert_str_eq(eng_st_writer_shard_name(w, 2), "model-00003-of-00003.safetensors");
    eng_st_writer_destroy(w);
    ck_assert_int_eq(access(path_in("model.safetensors"), F_OK), -1);

    /* the index lists every tensor and the total size */
    json_error_t jerr;
    json_t *idx = json_load_file(path_in("model.safetensors.index.json"), 0, &jerr);
    ck_assert_ptr_nonnull(idx);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")),
        NT * NE * 4);
    json_t *wm = json_object_get(idx, "weight_map");
    ck_assert_int_eq(json_object_size(wm), NT);
    ck_assert_str_eq(json_string_value(json_object_get(wm, name[0])),
                     "model-00001-of-00003.safetensors");
    ck_assert_str_eq(json_string_value(json_object_get(wm, name[NT - 1])),
                     "model-00003-of-00003.safetensors");
    json_decref(idx);

    eng_st_t *st;
    ck_assert_int_eq(eng_st_open(tmpdir, &st, &err), INF_OK);
    ck_assert_int_eq(eng_st_count(st), NT);
    int seen[3] = {0, 0, 0};
    for (int i = 0; i < NT; i++) {
        const struct eng_st_tensor *t = eng_st_find(st, name[i]);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_eq(eng_st_at(st, i), t); /* shard order = declaration order */
        ck_assert_int_eq(eng_st_read_f32(t, 0, NE, buf, &err), INF_OK);
        for (int j = 0; j < NE; j++)
            ck_assert_float_eq(buf[j], (float)(i * NE + j));
        int s = t->file[10] - '1'; /* model-0000S-of-... */
        ck_assert(s >= 0 && s < 3);
        seen[s]++;
    }
    ck_assert(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
    eng_st_close(st);
    /* the index itself is an accepted path */
    ck_assert_int_eq(eng_st_open(path_in("model.safetensors.index.json"), &st, &err), INF_OK);
    ck_assert_int_eq(eng_st_count(st), NT);
    eng_st_close(st);
    free(buf);
}
END_TEST

START_TEST(writer_refusals)
{
    struct inf_err err;
    eng_st_writer_t *w;
    ck_assert_int_eq(eng_st_writer_create(tmpdir, 0, &w, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_st_writer_create(tmpdir, 1, &w, &err), INF_OK);
    int64_t s[2] = {2, 2}, neg[1] = {-1}, big[4] = {1LL << 40, 1LL << 40, 1, 1};
    ck_assert_int_eq(eng_st_writer_add(w, "x", ENG_DT_F32, 2, s, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "x", ENG_DT_F32, 2, s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "'x'"));
    ck_assert_int_eq(eng_st_writer_add(w, "", ENG_DT_F32, 2, s, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_st_writer_add(w, "__metadata__", ENG_DT_F32, 2, s, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_st_writer_add(w, "n", ENG_DT_F32, 1, neg, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_st_writer_add(w, "b", ENG_DT_F32, 4, big, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_st_writer_add(w, "d", ENG_DT_F32, 5, s, &err), INF_E_INVALID);
    float v[4] = {1, 2, 3, 4};
    ck_assert_int_eq(eng_st_writer_write(w, v, 8, &err), INF_OK);
    ck_assert_int_eq(eng_st_writer_add(w, "late", ENG_DT_F32, 2, s, &err), INF_E_INVALID);
    /* half the data: finish names the tensor */
    ck_assert_int_eq(eng_st_writer_finish(w, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "'x'"));
    eng_st_writer_destroy(w);
    eng_st_writer_destroy(NULL);
}
END_TEST

/* ---- malformed files ----------------------------------------------------------- */

START_TEST(malformed_header_length)
{
    /* the length says 1000 bytes of header, the file has 20 */
    unsigned char b[28] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes("bad.safetensors", b, sizeof b);
    expect_open_fails(path_in("bad.safetensors"), INF_E_FORMAT, "bad.safetensors", "past the end");
    /* a length near 2^64 must not wrap */
    unsigned char c[16] = {0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    write_bytes("bad.safetensors", c, sizeof c);
    expect_open_fails(path_in("bad.safetensors"), INF_E_FORMAT, "bad.safetensors", NULL);
    /* shorter than the length field */
    write_bytes("bad.safetensors", "\x02\0\0", 3);
    expect_open_fails(path_in("bad.safetensors"), INF_E_FORMAT, "bad.safetensors", NULL);
    write_bytes("empty.safetensors", "", 0);
    expect_open_fails(path_in("empty.safetensors"), INF_E_FORMAT, "empty.safetensors", NULL);
}
END_TEST

START_TEST(malformed_offsets)
{
    /* past the data area */
    expect_bad("{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
               INF_E_FORMAT, "w.x");
    /* begin after end */
    expect_bad("{\"w.y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[6,4]}}", 8, INF_E_FORMAT,
               "w.y");
    /* negative offset */
    expect_bad("{\"w.z\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 8,
               INF_E_FORMAT, "w.z");
    /* not a pair */
    expect_bad("{\"w.p\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}", 8,
               INF_E_FORMAT, "w.p");
    expect_bad("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[2]}}", 8, INF_E_FORMAT, "w.q");
    expect_bad("{\"w.r\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,\"2\"]}}", 8,
               INF_E_FORMAT, "w.r");
    /* overlapping, in either order in the header */
    expect_bad("{\"a.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               16, INF_E_FORMAT, "overlaps");
    expect_bad("{\"b.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
               "\"a.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               16, INF_E_FORMAT, "b.w");
    /* an empty tensor between two overlapping ones does not hide the overlap */
    expect_bad("{\"a.w\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]},"
               "\"e.w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
               "\"c.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
               16, INF_E_FORMAT, "c.w");
    /* identical ranges */
    expect_bad("{\"a.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"d.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
               16, INF_E_FORMAT, "overlaps");
}
END_TEST

START_TEST(malformed_shapes)
{
    /* shape x dtype != byte length */
    expect_bad("{\"m.w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16,
               INF_E_FORMAT, "m.w");
    expect_bad("{\"m.h\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
               INF_E_FORMAT, "m.h");
    /* negative dimension */
    expect_bad("{\"m.n\":{\"dtype\":\"F32\",\"shape\":[-1,4],\"data_offsets\":[0,16]}}", 16,
               INF_E_FORMAT, "m.n");
    /* dimensions whose product overflows 64 bits: refused, not wrapped */
    expect_bad("{\"m.o\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,0]}}",
               16, INF_E_FORMAT, "m.o");
    expect_bad("{\"m.p\":{\"dtype\":\"I64\",\"shape\":[2305843009213693952,8],"
               "\"data_offsets\":[0,0]}}",
               16, INF_E_FORMAT, "m.p");
    /* a dimension too big for JSON integers */
    expect_bad("{\"m.q\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],"
               "\"data_offsets\":[0,0]}}",
               16, INF_E_FORMAT, "bad.safetensors");
    /* more dimensions than supported */
    expect_bad("{\"m.r\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 16,
               INF_E_FORMAT, "m.r");
    /* non-integer or missing shape */
    expect_bad("{\"m.s\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 16,
               INF_E_FORMAT, "m.s");
    expect_bad("{\"m.t\":{\"dtype\":\"U8\",\"shape\":4,\"data_offsets\":[0,4]}}", 16, INF_E_FORMAT,
               "m.t");
    /* a zero dimension with zero bytes is fine; with bytes it is not */
    expect_bad("{\"m.u\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               16, INF_E_FORMAT, "m.u");
}
END_TEST

START_TEST(malformed_json_and_dtype)
{
    expect_bad("{\"w\":", 8, INF_E_FORMAT, "not valid JSON");
    expect_bad("[1,2]", 8, INF_E_FORMAT, "not a JSON object");
    expect_bad("{\"k.w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               INF_E_FORMAT, "k.w");
    expect_bad("{\"k.w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               INF_E_FORMAT, "F64");
    expect_bad("{\"k.x\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}", 8, INF_E_FORMAT,
               "k.x");
    expect_bad("{\"k.y\":[1,2]}", 8, INF_E_FORMAT, "k.y");
    expect_bad("{\"__metadata__\":[1]}", 8, INF_E_FORMAT, "__metadata__");
    /* duplicate keys */
    expect_bad("{\"k.z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"k.z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               8, INF_E_FORMAT, "k.z");
    /* an embedded NUL in a name */
    expect_bad("{\"k\\u0000z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 8,
               INF_E_FORMAT, "bad.safetensors");
}
END_TEST

START_TEST(valid_edge_headers)
{
    /* metadata, trailing spaces, a gap between tensors, and an empty header */
    write_st("ok.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]},"
             "\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}    ",
             8);
    eng_st_t *st;
    struct inf_err err;
    ck_assert_int_eq(eng_st_open(path_in("ok.safetensors"), &st, &err), INF_OK);
    ck_assert_int_eq(eng_st_count(st), 2);
    ck_assert_str_eq(eng_st_at(st, 0)->name, "a"); /* offset order */
    const struct eng_st_tensor *b = eng_st_find(st, "b");
    ck_assert_int_eq(((const uint8_t *)b->data)[0], 6); /* data bytes are 0, 1, 2, ... */
    ck_assert_int_eq(((const uint8_t *)b->data)[1], 7);
    int32_t a;
    memcpy(&a, eng_st_find(st, "a")->data, 4);
    ck_assert_int_eq(a, 0x03020100);
    eng_st_close(st);
    write_st("none.safetensors", "{}", 0);
    ck_assert_int_eq(eng_st_open(path_in("none.safetensors"), &st, &err), INF_OK);
    ck_assert_int_eq(eng_st_count(st), 0);
    ck_assert_ptr_null(eng_st_find(st, "x"));
    eng_st_close(st);
}
END_TEST

START_TEST(header_parse_direct)
{
    const char *js = "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[4,16]},"
                     "\"y\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    struct eng_st_header *h;
    struct inf_err err;
    ck_assert_int_eq(eng_st_header_parse(js, strlen(js), 16, "dir/x.safetensors", &h, &err),
                     INF_OK);
    ck_assert_int_eq(eng_st_header_count(h), 2);
    const struct eng_st_tensor *t = eng_st_header_at(h, 1);
    ck_assert_str_eq(t->name, "x");
    ck_assert_str_eq(t->file, "x.safetensors");
    ck_assert_uint_eq((uintptr_t)t->data, 4);
    ck_assert_uint_eq(t->nbytes, 12);
    ck_assert_int_eq(t->numel, 6);
    ck_assert_ptr_null(eng_st_header_at(h, 2));
    eng_st_header_free(h);
    /* the same header with one byte less of data */
    ck_assert_int_eq(eng_st_header_parse(js, strlen(js), 15, "x.safetensors", &h, &err),
                     INF_E_FORMAT);
    ck_assert_ptr_null(h);
    ck_assert_ptr_nonnull(strstr(err.msg, "x.safetensors: tensor 'x'"));
    eng_st_header_free(NULL);

    /* whole buffer */
    unsigned char buf[8 + 64 + 4];
    const char *hj = "{\"v\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    size_t hl = strlen(hj);
    memset(buf, 0, sizeof buf);
    buf[0] = (unsigned char)hl;
    memcpy(buf + 8, hj, hl);
    memcpy(buf + 8 + hl, "\x09\x08\x07\x06", 4);
    ck_assert_int_eq(eng_st_buffer_parse(buf, 8 + hl + 4, "mem", &h, &err), INF_OK);
    ck_assert_ptr_eq(eng_st_header_at(h, 0)->data, buf + 8 + hl);
    eng_st_header_free(h);
    ck_assert_int_eq(eng_st_buffer_parse(buf, 8 + hl + 3, "mem", &h, &err), INF_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'v'"));
}
END_TEST

START_TEST(dtype_names)
{
    enum eng_dtype d;
    const char *names[] = {"F32", "F16", "BF16", "I32", "I8", "U8", "I64"};
    const size_t sizes[] = {4, 2, 2, 4, 1, 1, 8};
    for (int i = 0; i < 7; i++) {
        ck_assert(eng_dtype_parse(names[i], &d));
        ck_assert_int_eq(d, i);
        ck_assert_str_eq(eng_dtype_name(d), names[i]);
        ck_assert_uint_eq(eng_dtype_size(d), sizes[i]);
    }
    ck_assert(!eng_dtype_parse("f32", &d));
    ck_assert(!eng_dtype_parse("F8_E4M3", &d));
    ck_assert_uint_eq(eng_dtype_size((enum eng_dtype)99), 0);
}
END_TEST

/* ---- sharded checkpoints that do not add up ------------------------------------ */

static const char *one_tensor = "{\"t.a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";

START_TEST(sharded_missing_tensor)
{
    write_st("s1.safetensors", one_tensor, 4);
    const char *idx = "{\"weight_map\":{\"t.a\":\"s1.safetensors\",\"t.b\":\"s1.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    expect_open_fails(tmpdir, INF_E_FORMAT, "s1.safetensors", "t.b");
}
END_TEST

START_TEST(sharded_missing_shard)
{
    write_st("s1.safetensors", one_tensor, 4);
    const char *idx = "{\"weight_map\":{\"t.a\":\"s1.safetensors\",\"t.b\":\"s2.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    expect_open_fails(tmpdir, INF_E_NOTFOUND, "s2.safetensors", NULL);
}
END_TEST

START_TEST(sharded_wrong_shard_and_duplicates)
{
    write_st("s1.safetensors", one_tensor, 4);
    write_st("s2.safetensors", "{\"t.b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
             4);
    const char *idx = "{\"weight_map\":{\"t.a\":\"s2.safetensors\",\"t.b\":\"s1.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    expect_open_fails(tmpdir, INF_E_FORMAT, "t.a", "s1.safetensors");
    /* the same tensor in two shards */
    write_st("s2.safetensors", one_tensor, 4);
    idx = "{\"weight_map\":{\"t.a\":\"s1.safetensors\",\"t.c\":\"s2.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    expect_open_fails(tmpdir, INF_E_FORMAT, "t.a", "also appears");
}
END_TEST

START_TEST(sharded_bad_index)
{
    write_st("s1.safetensors", one_tensor, 4);
    const char *bad[] = {
        "{\"weight_map\":",
        "{\"weight_map\":{}}",
        "{\"metadata\":{}}",
        "{\"weight_map\":{\"t.a\":\"../s1.safetensors\"}}",
        "{\"weight_map\":{\"t.a\":7}}",
        "{\"weight_map\":{\"t.a\":\"s1.safetensors\",\"t.a\":\"s1.safetensors\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes("model.safetensors.index.json", bad[i], strlen(bad[i]));
        expect_open_fails(tmpdir, INF_E_FORMAT, "model.safetensors.index.json", NULL);
    }
    /* a malformed shard is named by the shard */
    write_st("s1.safetensors", "{\"t.a\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[0,4]}}",
             4);
    const char *idx = "{\"weight_map\":{\"t.a\":\"s1.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    expect_open_fails(tmpdir, INF_E_FORMAT, "s1.safetensors", "t.a");
}
END_TEST

START_TEST(not_found)
{
    expect_open_fails(tmpdir, INF_E_NOTFOUND, "model.safetensors", NULL);
    expect_open_fails(path_in("nope.safetensors"), INF_E_NOTFOUND, "nope.safetensors", NULL);
}
END_TEST

/* Every fp16 bit pattern: eng_st_read_f32 gives inf_f16_to_f32 (the table
 * is that function), and eng_st_read_f16 gives what converting that value
 * back with inf_f32_to_f16 gives (NaNs become the quiet NaN of their sign);
 * F32 and BF16 sources convert as f32 -> inf_f32_to_f16. */
START_TEST(read_f16_is_the_f32_round_trip)
{
    uint16_t *h = malloc(65536 * 2), *out = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    struct eng_st_tensor t = {.name = "t",
                              .dtype = ENG_DT_F16,
                              .ndim = 1,
                              .shape = {65536},
                              .numel = 65536,
                              .data = h,
                              .nbytes = 65536 * 2,
                              .file = "f"};
    ck_assert_int_eq(eng_st_read_f32(&t, 0, 65536, f, NULL), INF_OK);
    ck_assert_int_eq(eng_st_read_f16(&t, 0, 65536, out, NULL), INF_OK);
    for (uint32_t i = 0; i < 65536; i++) {
        float want = inf_f16_to_f32((uint16_t)i);
        ck_assert_msg(memcmp(&f[i], &want, 4) == 0, "f32 of %04x", i);
        ck_assert_msg(out[i] == inf_f32_to_f16(want), "f16 of %04x: %04x", i, out[i]);
    }
    ck_assert_uint_eq(out[0x7c01], 0x7e00); /* a signalling NaN */
    ck_assert_uint_eq(out[0xfc00], 0xfc00); /* -inf */
    ck_assert_uint_eq(out[0x0001], 0x0001); /* the smallest subnormal */
    /* a range inside, and bf16 / f32 sources */
    ck_assert_int_eq(eng_st_read_f16(&t, 0x3c00, 3, out, NULL), INF_OK);
    ck_assert_uint_eq(out[2], 0x3c02);
    struct inf_err err;
    ck_assert_int_eq(eng_st_read_f16(&t, 65535, 2, out, &err), INF_E_RANGE);
    t.dtype = ENG_DT_BF16;
    ck_assert_int_eq(eng_st_read_f16(&t, 0, 65536, out, NULL), INF_OK);
    for (uint32_t i = 0; i < 65536; i++)
        ck_assert_uint_eq(out[i], inf_f32_to_f16(inf_bf16_to_f32((uint16_t)i)));
    float fv[5] = {1.0f, -65520.0f, 1e-8f, 3.14159265f, 65504.0f};
    t = (struct eng_st_tensor){.name = "t",
                               .dtype = ENG_DT_F32,
                               .ndim = 1,
                               .shape = {5},
                               .numel = 5,
                               .data = fv,
                               .nbytes = 20,
                               .file = "f"};
    ck_assert_int_eq(eng_st_read_f16(&t, 0, 5, out, NULL), INF_OK);
    ck_assert_uint_eq(out[0], 0x3c00);
    ck_assert_uint_eq(out[1], 0xfc00); /* rounds past the largest half */
    ck_assert_uint_eq(out[3], 0x4248);
    ck_assert_uint_eq(out[4], 0x7bff);
    t.dtype = ENG_DT_I32;
    ck_assert_int_eq(eng_st_read_f16(&t, 0, 5, out, &err), INF_E_UNSUPPORTED);
    eng_st_prefetch(&t); /* a hint on any memory: no effect to see, must not fail */
    eng_st_prefetch(NULL);
    free(h);
    free(out);
    free(f);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("roundtrip");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, roundtrip_every_dtype);
    tcase_add_test(tc, f16_bf16_rounding_and_specials);
    tcase_add_test(tc, roundtrip_sharded);
    tcase_add_test(tc, writer_refusals);
    tcase_add_test(tc, dtype_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("convert");
    tcase_add_test(tc, read_f16_is_the_f32_round_trip);
    suite_add_tcase(s, tc);
    tc = tcase_create("malformed");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, malformed_header_length);
    tcase_add_test(tc, malformed_offsets);
    tcase_add_test(tc, malformed_shapes);
    tcase_add_test(tc, malformed_json_and_dtype);
    tcase_add_test(tc, valid_edge_headers);
    tcase_add_test(tc, header_parse_direct);
    suite_add_tcase(s, tc);
    tc = tcase_create("sharded");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, sharded_missing_tensor);
    tcase_add_test(tc, sharded_missing_shard);
    tcase_add_test(tc, sharded_wrong_shard_and_duplicates);
    tcase_add_test(tc, sharded_bad_index);
    tcase_add_test(tc, not_found);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
