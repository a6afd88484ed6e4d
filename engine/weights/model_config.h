#pragma once
/* engine/weights/model_config.h — engine-internal: a model's config.json.
 *
 * Accepted architectures: LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM (q/k/v biases). Anything else, and any unsupported value
 * (a rope_scaling type other than llama3, head_dim not dividing, ...), is
 * refused with a message naming the key. Thread: any. */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

enum eng_arch {
    ENG_ARCH_LLAMA,
    ENG_ARCH_MISTRAL,
    ENG_ARCH_QWEN2,
};

#define ENG_MAX_EOS 8

struct eng_model_config {
    enum eng_arch arch;
    int32_t hidden;            /* hidden_size */
    int32_t intermediate;      /* intermediate_size */
    int32_t n_layers;          /* num_hidden_layers */
    int32_t n_heads;           /* num_attention_heads */
    int32_t n_kv_heads;        /* num_key_value_heads (defaults to n_heads) */
    int32_t head_dim;          /* head_dim (defaults to hidden / n_heads) */
    int32_t vocab;             /* vocab_size */
    int32_t max_pos;           /* max_position_embeddings */
    float rms_eps;             /* rms_norm_eps */
    float rope_theta;          /* rope_theta (default 10000) */
    bool rope_llama3;          /* rope_scaling.rope_type == "llama3" */
    float rope_factor;         /* rope_scaling.factor */
    float rope_low_freq;       /* rope_scaling.low_freq_factor */
    float rope_high_freq;      /* rope_scaling.high_freq_factor */
    int32_t rope_orig_max_pos; /* rope_scaling.original_max_position_embeddings */
    bool tie_embeddings;       /* tie_word_embeddings */
    bool qkv_bias;             /* true for Qwen2 */
    int32_t sliding_window;    /* Mistral's sliding_window when smaller than
                                  max_position_embeddings, else 0 (none) */
    int32_t bos_id;            /* -1 when absent */
    int32_t n_eos;             /* eos_token_id: a number or a list */
    int32_t eos_ids[ENG_MAX_EOS];
    char torch_dtype[16]; /* "float32", "float16", "bfloat16" or "" */
};

/* Read dir/config.json. Errors: INF_E_NOTFOUND, INF_E_FORMAT (bad JSON),
 * INF_E_UNSUPPORTED (architecture or value, named), INF_E_INVALID. */
inf_status_t eng_model_config_load(const char *dir, struct eng_model_config *cfg,
                                   struct inf_err *err);
/* Same, from a JSON text (tests, fuzzing). */
inf_status_t eng_model_config_parse(const char *json, size_t len, struct eng_model_config *cfg,
                                    struct inf_err *err);
