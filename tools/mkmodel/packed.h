#pragma once
/* tools/mkmodel/packed.h — the INT4 checkpoint formats int4serve-mkmodel
 * writes (--format): a linear layer's float weight quantized the way each
 * format's own quantizer does it and stored in the format's tensors, and
 * the quantization_config that declares it.
 *
 *   awq            AutoAWQ "gemm": qweight, qzeros, scales
 *   gptq           GPTQ (AutoGPTQ / GPTQModel), checkpoint_format gptq (or
 *                  gptq_v2): qweight, qzeros, scales, g_idx = row / group
 *   gptq-actorder  the same with desc_act: the rows of K quantized in a
 *                  random order (shared by the projections that read the
 *                  same input, as GPTQ's Hessian order is), g_idx the group
 *                  of each row in that order
 *   ct             compressed-tensors pack-quantized: weight_packed,
 *                  weight_scale (the model's dtype), weight_zero_point
 *                  (asymmetric), weight_shape (I64)
 * The layouts are those engine/weights/packed.h reads; where they come from
 * is cited in packed.c. */
#include "common/inf.h"
#include "engine/weights/safetensors_write.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

enum mk_format { MK_FP, MK_AWQ, MK_GPTQ, MK_GPTQ_ACT, MK_CT };

struct mk_quant {
    enum mk_format fmt;
    int32_t group;         /* along K; -1 per channel */
    bool sym;              /* symmetric (gptq, ct) */
    bool v2;               /* gptq: checkpoint_format gptq_v2 */
    enum eng_dtype sdtype; /* ct: weight_scale's dtype (the model's) */
};

/* Parse a --format name; false when unknown. */
bool mk_format_parse(const char *name, enum mk_format *out);

/* Whether q can store a linear of n outputs by k inputs (awq: k a multiple
 * of the group, n of 8; gptq: k and n multiples of 8); the message names the
 * layer. Errors: INF_E_INVALID. */
inf_status_t mk_packed_check(const struct mk_quant *q, const char *layer, int64_t n, int64_t k,
                             struct inf_err *err);

/* Declare the tensors of linear `layer` (module name) in q's format. */
inf_status_t mk_packed_declare(eng_st_writer_t *w, const struct mk_quant *q, const char *layer,
                               int64_t n, int64_t k, struct inf_err *err);

/* Quantize w[n][k] (fp32) and write the tensors mk_packed_declare declared,
 * in that order. seed and layer pick the act-order permutation (the same for
 * q, k and v of a layer, and for gate and up). Errors: INF_E_NOMEM,
 * INF_E_IO and those of the writer. */
inf_status_t mk_packed_write(eng_st_writer_t *w, const struct mk_quant *q, const char *layer,
                             const float *wt, int64_t n, int64_t k, uint64_t seed,
                             struct inf_err *err);

/* The quantization_config object of q (a new reference). */
json_t *mk_quant_config(const struct mk_quant *q);
