#pragma once
/* engine/weights/safetensors.h — engine-internal: memory-mapped safetensors
 * checkpoints, single-file or sharded through model.safetensors.index.json.
 *
 * The header is parsed with jansson and fully validated at open: header
 * length within the file, every tensor's [begin, end) inside the data area,
 * no two tensors overlapping, shape x dtype size == byte length, a known
 * dtype. Errors name the file (base name only) and the tensor. Tensor data
 * is never copied: `data` points into the read-only mapping, which lives
 * until eng_st_close. Thread: any, one owner. */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

enum eng_dtype {
    ENG_DT_F32,
    ENG_DT_F16,
    ENG_DT_BF16,
    ENG_DT_I32,
    ENG_DT_I8,
    ENG_DT_U8,
    ENG_DT_I64,
};

#define ENG_ST_MAX_DIMS 4

struct eng_st_tensor {
    const char *name;            /* as in the header, owned by the checkpoint */
    enum eng_dtype dtype;
    int32_t ndim;                /* 0..ENG_ST_MAX_DIMS */
    int64_t shape[ENG_ST_MAX_DIMS];
    int64_t numel;               /* product of shape (1 for a scalar) */
    const void *data;            /* into the mapping; unaligned for 2-byte types is possible */
    size_t nbytes;
    const char *file;            /* base name of the shard holding it */
};

typedef struct eng_st eng_st_t;

/* Open path: a model folder (model.safetensors, or the shards listed by
 * model.safetensors.index.json) or a single .safetensors file.
 * Errors: INF_E_NOTFOUND (no checkpoint), INF_E_IO, INF_E_FORMAT (malformed;
 * the message names the file and tensor). */
inf_status_t eng_st_open(const char *path, eng_st_t **out, struct inf_err *err);
void eng_st_close(eng_st_t *st); /* NULL is a no-op */

/* The tensor called name, or NULL. */
const struct eng_st_tensor *eng_st_find(const eng_st_t *st, const char *name);
/* Like eng_st_find but an absent tensor, or one whose shape differs from
 * shape[0..ndim), is an error naming the tensor. */
inf_status_t eng_st_require(const eng_st_t *st, const char *name, int32_t ndim,
                            const int64_t *shape, const struct eng_st_tensor **out,
                            struct inf_err *err);
/* Iterate: index 0..count-1. */
int64_t eng_st_count(const eng_st_t *st);
const struct eng_st_tensor *eng_st_at(const eng_st_t *st, int64_t i);

/* Convert elements [first, first + n) of a float tensor (F32, F16, BF16) to
 * f32 in dst. INF_E_UNSUPPORTED for other dtypes, INF_E_RANGE out of bounds. */
inf_status_t eng_st_read_f32(const struct eng_st_tensor *t, int64_t first, int64_t n,
                             float *dst, struct inf_err *err);

/* Convert elements [first, first + n) of a float tensor to fp16 bit patterns
 * in dst: the values eng_st_read_f32 gives, rounded to fp16 as
 * inf_f32_to_f16 does (an F16 tensor is copied, its NaNs made the one quiet
 * NaN that round trip gives). Errors as eng_st_read_f32. */
inf_status_t eng_st_read_f16(const struct eng_st_tensor *t, int64_t first, int64_t n, uint16_t *dst,
                             struct inf_err *err);

/* Copy elements [first, first + n) of an integer tensor (I32, or I64 whose
 * values fit an int32) into dst: the packed codes and zero points of INT4
 * checkpoints, g_idx, weight_shape. INF_E_UNSUPPORTED for other dtypes,
 * INF_E_RANGE out of bounds or for an I64 value beyond int32 (naming the
 * file, the tensor and the element). */
inf_status_t eng_st_read_i32(const struct eng_st_tensor *t, int64_t first, int64_t n, int32_t *dst,
                             struct inf_err *err);

/* Ask the kernel to start reading t's bytes from the file now (a hint, in
 * the background), so a later read does not wait for the disk. Thread: any. */
void eng_st_prefetch(const struct eng_st_tensor *t);

/* Bytes per element of a dtype; its safetensors name ("F16"). */
size_t eng_dtype_size(enum eng_dtype dt);
const char *eng_dtype_name(enum eng_dtype dt);

/* Parse a safetensors header (the JSON after the 8-byte length) for a data
 * area of data_len bytes, without a file: used by open and by the fuzzer. On
 * success *out holds the parsed tensors (data pointers relative to NULL +
 * offset) and must be freed with eng_st_header_free. */
struct eng_st_header;
inf_status_t eng_st_header_parse(const char *json, size_t json_len, uint64_t data_len,
                                 const char *file, struct eng_st_header **out,
                                 struct inf_err *err);
void eng_st_header_free(struct eng_st_header *h);

/* Tensors of a parsed header, in data-offset order: index 0..count-1. */
int64_t eng_st_header_count(const struct eng_st_header *h);
const struct eng_st_tensor *eng_st_header_at(const struct eng_st_header *h, int64_t i);

/* Parse a whole safetensors file image buf[0, len) (8-byte little-endian
 * header length, JSON header, data area) named file in messages. On success
 * the tensors' data pointers point into buf, which must outlive *out; free
 * with eng_st_header_free. Errors: INF_E_FORMAT naming file and tensor. */
inf_status_t eng_st_buffer_parse(const void *buf, size_t len, const char *file,
                                 struct eng_st_header **out, struct inf_err *err);

/* The dtype called name ("BF16"); false when unknown. */
bool eng_dtype_parse(const char *name, enum eng_dtype *out);
