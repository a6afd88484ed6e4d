#pragma once
/* engine/weights/safetensors_write.h — engine-internal: a streaming safetensors
 * writer for checkpoint folders in Hugging Face's layout.
 *
 * Use: create, declare every tensor in file order (eng_st_writer_add), then
 * stream each tensor's bytes in that order in chunks of any size
 * (eng_st_writer_write), then eng_st_writer_finish. Only the header lives in
 * memory, so a checkpoint of any size can be written from a generator.
 * With n_shards == 1 the folder gets model.safetensors; with more it gets
 * model-0000i-of-0000n.safetensors (tensors split in declaration order,
 * balanced by bytes, never splitting a tensor) and
 * model.safetensors.index.json. Thread: any, one owner. */
#include "common/inf.h"
#include "engine/weights/safetensors.h"

#include <stdint.h>

typedef struct eng_st_writer eng_st_writer_t;

/* A writer into the existing folder dir. n_shards in [1, 99999] (fewer are
 * written when there are fewer tensors). Errors: INF_E_INVALID, INF_E_NOMEM. */
inf_status_t eng_st_writer_create(const char *dir, int32_t n_shards, eng_st_writer_t **out,
                                  struct inf_err *err);
/* Abandon or release the writer; files already written stay. NULL is a no-op. */
void eng_st_writer_destroy(eng_st_writer_t *w);

/* Declare the next tensor. Errors: INF_E_INVALID (empty or duplicate name,
 * bad shape, ndim > ENG_ST_MAX_DIMS, called after the first write). */
inf_status_t eng_st_writer_add(eng_st_writer_t *w, const char *name, enum eng_dtype dtype,
                               int32_t ndim, const int64_t *shape, struct inf_err *err);
/* Append nbytes of data, continuing the current tensor and moving on to the
 * next ones (and the next shard) as each is filled. The first call writes
 * the index and the first header. Errors: INF_E_RANGE (more bytes than
 * declared), INF_E_IO. */
inf_status_t eng_st_writer_write(eng_st_writer_t *w, const void *data, size_t nbytes,
                                 struct inf_err *err);
/* Check every declared byte was written and close the files.
 * Errors: INF_E_INVALID (data missing), INF_E_IO. */
inf_status_t eng_st_writer_finish(eng_st_writer_t *w, struct inf_err *err);

/* Number of shards actually written and the name of shard i (valid until
 * destroy). Known once the first write or finish has run. */
int32_t eng_st_writer_shards(const eng_st_writer_t *w);
const char *eng_st_writer_shard_name(const eng_st_writer_t *w, int32_t i);
