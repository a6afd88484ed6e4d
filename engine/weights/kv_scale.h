#pragma once
/* engine/weights/kv_scale.h — engine-internal: the per-layer scales of an
 * FP8 KV cache as a checkpoint carries them, under the names vLLM reads:
 *   model.layers.N.self_attn.k_scale / v_scale         (the usual form)
 *   model.layers.N.self_attn.k_proj.k_scale / v_proj.v_scale   (ModelOpt)
 *   model.layers.N.self_attn.qkv_proj.k_scale / v_scale
 *   model.layers.N.self_attn.k_proj.output_scale / v_proj.output_scale
 *                                                      (compressed-tensors)
 *   model.layers.N.self_attn.kv_scale                  (one for both, older)
 * each a float tensor of one element. The first name found wins. */
#include "common/inf.h"
#include "engine/weights/safetensors.h"

#include <stdbool.h>

/* Layer l's scales into *k and *v (1.0 each where the checkpoint has none);
 * *found: whether any was there. Errors: INF_E_FORMAT for a scale that is
 * not a single finite value > 0 (naming the tensor), the readers' errors. */
inf_status_t eng_kv_scale_read(const eng_st_t *st, int32_t layer, float *k, float *v, bool *found,
                               struct inf_err *err);
