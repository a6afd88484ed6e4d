#pragma once
/* engine/model.h — engine-internal: a Llama-family model (Llama, Mistral,
 * Qwen2) loaded onto a backend, and its forward step.
 *
 * The forward is written once against engine/backend.h: embedding, per
 * layer RMSNorm (fused with the residual add), q/k/v projection (+ Qwen2
 * biases), RoPE (llama3 scaling), GQA attention over the paged KV cache,
 * o projection, RMSNorm, SwiGLU MLP; final norm, lm_head (tied to the
 * embeddings when the config says so). Thread: engine (one owner). */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/weights/model_config.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum eng_quant {
    ENG_QUANT_NONE, /* every weight fp: fp32 on backends with fp32 activations (the
                       reference), fp16 on those with fp16 activations (a GPU); an
                       INT4 checkpoint is refused */
    ENG_QUANT_INT4, /* a 16-bit checkpoint quantized on load (round to nearest,
                       engine/weights/quant.h): every linear layer INT4 except those
                       matching keep_fp16; an INT4 checkpoint is refused */
    ENG_QUANT_AUTO, /* the checkpoint's own INT4 (AWQ, GPTQ, compressed-tensors,
                       repacked without requantization) when its config declares
                       one, else ENG_QUANT_INT4 (the default) */
    ENG_QUANT_AWQ,  /* an AutoAWQ gemm checkpoint, refusing any other */
    ENG_QUANT_GPTQ, /* a GPTQ checkpoint, refusing any other */
    ENG_QUANT_CT,   /* a compressed-tensors pack-quantized checkpoint, refusing any other */
};

/* Decode steps on a backend that records graphs (engine/backend.h). */
enum eng_graphs {
    ENG_GRAPHS_OFF,   /* every step runs its ops as they come, unpadded */
    ENG_GRAPHS_ON,    /* decode-only steps padded to a bucket (1, 2, 4, 8, 16, 24, 32,
                         48, 64, 96, 128 rows) replay that bucket's graph (default) */
    ENG_GRAPHS_EAGER, /* the same padded steps, ops run as they come (tests) */
};

/* The rows a decode-only step of `rows` tokens is padded to under
 * ENG_GRAPHS_ON / ENG_GRAPHS_EAGER (its bucket), or -1 above the largest.
 * Thread: any. */
int32_t eng_model_graph_bucket(int32_t rows);

struct eng_model_opts {
    enum eng_quant quant;
    /* Quantizing a 16-bit checkpoint on load; an INT4 checkpoint's own
     * groups and zero points are kept whatever these say. */
    int32_t group_size; /* 32, 64, 128 (default), 256; 0 = per-channel */
    bool symmetric;     /* zero point 8 (engine/weights/quant.h) */
    bool fuse_qkv;      /* q/k/v into one linear and gate/up into one (default) */
    /* fnmatch(3) patterns over Hugging Face tensor names (a fused layer
     * matches when its own name, e.g. "model.layers.0.self_attn.qkv_proj.weight",
     * or any of its parts matches): those linear layers stay fp16 when
     * the model is INT4 (a layer an INT4 checkpoint stores packed is
     * dequantized to fp16). NULL: {"model.embed_tokens.*", "lm_head.*"}.
     * The embedding table is never quantized (fp16 under INT4). */
    const char *const *keep_fp16;
    int32_t n_keep_fp16;
    int32_t max_tokens;  /* tokens one forward call may hold (default 512) */
    int32_t n_kv_blocks; /* blocks in the KV pool of each layer (default 256) */
    /* The largest block table a step may bring, allocated on the device at
     * load (max_slots sequences x max_seq_blocks blocks): a step then
     * allocates nothing. 0 (default): the table buffer grows when a larger
     * one arrives. */
    int32_t max_slots, max_seq_blocks;
    enum eng_graphs decode_graphs; /* needs max_slots and max_seq_blocks */
    /* Threads that convert, quantize and repack the weights while loading
     * (0, the default: one per usable core); the loaded model is the same
     * bytes whatever the count. */
    int32_t load_threads;
    /* Tensor parallelism: this model is rank tp_rank of tp_size (0 and 1:
     * the whole model). A rank holds its shard of every linear, quantized
     * whole first (engine/tp/shard.h): q/k/v and gate/up by heads and
     * rows, o and down by columns, summed over the group by the backend's
     * all_reduce after them; norms, embedding and lm_head whole. Its KV
     * pools hold its KV heads only. Every rank runs the same steps at once
     * (engine/tp/group.h). */
    int32_t tp_rank, tp_size;
    /* No lm_head: the step stops at the final norm (ranks other than the
     * first of a group, whose logits nobody reads). */
    bool no_logits;
};

/* Defaults: AUTO (INT4), group 128, asymmetric, fused, default patterns. */
void eng_model_opts_default(struct eng_model_opts *o);

/* How one linear layer was loaded. */
struct eng_layer_info {
    char name[80];     /* e.g. "model.layers.3.self_attn.qkv_proj" */
    int32_t n, k;      /* output and input features */
    bool quantized;    /* INT4; else fp weights of fp_dtype */
    bool from_ckpt;    /* INT4 as the checkpoint stores it (repacked, not requantized) */
    bool act_order;    /* its columns follow a permutation (kernels/q4.h perm) */
    bool norm_ordered; /* act_order, and the RMSNorm before it writes its input
                          in that order (no gather before it) */
    int32_t kp;        /* padded K when quantized (== k when no padding) */
    int32_t group;     /* stored group size when quantized */
    enum eng_wdtype fp_dtype;
};

typedef struct eng_model eng_model_t;

/* Load dir (config.json + safetensors) onto be, quantizing, repacking or
 * keeping each weight per opts and the checkpoint's quantization_config
 * (engine/weights/qconfig.h), and allocate the activation buffers and KV
 * pools. Logs the checkpoint's format and, once, which layers needed K
 * padding for the group size. be must outlive the model. Errors: those of
 * the config and checkpoint readers (naming the key or tensor),
 * INF_E_INVALID (options, or a quant that contradicts the checkpoint, naming
 * both), INF_E_NOMEM. */
inf_status_t eng_model_load(const char *dir, struct eng_backend *be,
                            const struct eng_model_opts *opts, eng_model_t **out,
                            struct inf_err *err);
void eng_model_destroy(eng_model_t *m); /* NULL is a no-op */

/* (Re)allocate the KV pools for n_blocks blocks of ENG_KV_BLOCK tokens per
 * layer; what they held is lost. Errors: INF_E_INVALID, INF_E_NOMEM (the
 * model then has no pools until a later reserve succeeds). */
inf_status_t eng_model_kv_reserve(eng_model_t *m, int32_t n_blocks, struct inf_err *err);

const struct eng_model_config *eng_model_config(const eng_model_t *m);
int32_t eng_model_max_tokens(const eng_model_t *m);
int32_t eng_model_n_kv_blocks(const eng_model_t *m);

/* Linear layers in load order (lm_head last). */
int32_t eng_model_layer_count(const eng_model_t *m);
const struct eng_layer_info *eng_model_layer_info(const eng_model_t *m, int32_t i);

/* Run one step: write the KV of every token of b and compute fp32 logits
 * [b->n_logits][vocab] into logits for the tokens with want_logits, in
 * batch order. block_table ids must be < eng_model_n_kv_blocks and cover
 * every position the step writes (engine/sched/kv_cache.h does this).
 * Errors: INF_E_INVALID (a malformed batch: slot runs not contiguous,
 * positions not consecutive, ids out of range, n_logits wrong),
 * INF_E_TOOBIG (more than max_tokens), backend errors. The KV pools must
 * be reserved (n_kv_blocks > 0 at load, or eng_model_kv_reserve). */
inf_status_t eng_model_forward(eng_model_t *m, const struct eng_batch *b, float *logits,
                               struct inf_err *err);

/* The same step up to the final norm, the KV written and no logits, waited
 * for: what a tensor-parallel rank other than the first runs (its opts'
 * no_logits; eng_model_forward refuses such a model). Errors: those of
 * eng_model_forward. */
inf_status_t eng_model_forward_hidden(eng_model_t *m, const struct eng_batch *b,
                                      struct inf_err *err);

/* The rank's part of the model: its query and KV heads and MLP rows
 * (everything at tp 1). */
struct eng_tp_shape;
const struct eng_tp_shape *eng_model_tp_shape(const eng_model_t *m);

/* True when the backend samples on the device (eng_model_forward_sample). */
bool eng_model_can_sample(const eng_model_t *m);

/* eng_model_forward, sampling on the device: rows[i] (i < n_rows, in order
 * of logit_row) is sampled from the logits of the logit_row-th token of b
 * wanting them; out[i] receives its token and logprobs. Only the results
 * come back to the host (one synchronization). Errors: those of
 * eng_model_forward, INF_E_UNSUPPORTED (the backend does not sample),
 * INF_E_TOOBIG (more rows than max_slots, else max_tokens), INF_E_INVALID
 * (rows out of order or range, settings out of range). */
inf_status_t eng_model_forward_sample(eng_model_t *m, const struct eng_batch *b,
                                      const struct eng_sample_row *rows, int32_t n_rows,
                                      struct eng_sample_out *out, struct inf_err *err);

/* A step in two halves (struct eng_lm's submit and collect,
 * engine/sched/scheduler_impl.h), on a backend that samples and feeds tokens
 * (eng_model_can_submit): submit queues forward_sample's work and a
 * download of its results and returns; b may carry a feed
 * (engine/batch.h) naming rows of the step submitted just before. collect
 * waits for the oldest step submitted and not collected (not for a later
 * one) and writes its out[n_rows]. At most two are in flight;
 * eng_model_forward_sample refuses while any is. Errors: INF_E_UNSUPPORTED,
 * INF_E_INVALID (order), those of eng_model_forward_sample. */
bool eng_model_can_submit(const eng_model_t *m);
inf_status_t eng_model_sample_submit(eng_model_t *m, const struct eng_batch *b,
                                     const struct eng_sample_row *rows, int32_t n_rows,
                                     struct inf_err *err);
inf_status_t eng_model_sample_collect(eng_model_t *m, struct eng_sample_out *out,
                                      struct inf_err *err);

/* Run, once before serving, what the first requests would otherwise set up
 * lazily: the prefill of one sequence of 128 tokens, then of prompt_tokens
 * (each capped by the step budget, the positions and the pool), then one
 * greedy decode step of every decode-graph bucket up to max_rows rows
 * (recording its graph). It writes KV blocks 0 to max(max_rows,
 * prompt_tokens / 16); they are free afterwards (any later owner writes a
 * position before reading it). *n_graphs: graphs recorded; *n_prompt: the
 * longest prefill. Errors:
 * INF_E_UNSUPPORTED (the backend does not sample), INF_E_NOMEM, those of
 * eng_model_forward_sample. */
inf_status_t eng_model_warm_up(eng_model_t *m, int32_t max_rows, int32_t prompt_tokens,
                               int32_t *n_graphs, int32_t *n_prompt, struct inf_err *err);

/* The scheduler's view (engine/sched/model_lm.c): fill lm (struct eng_lm of
 * engine/sched/scheduler_impl.h) with a CPU backend and the model of
 * cfg->model_dir loaded per cfg (quantization, group_size (-1 per-channel),
 * symmetric, keep_fp16, fuse_qkv, threads; max_batched_tokens tokens per
 * step); lm->destroy releases both. The KV pools come from lm->kv_reserve.
 * Errors: INF_E_UNSUPPORTED (backend not cpu), those of eng_model_load.
 * Thread: engine. */
struct eng_config;
struct eng_lm;
inf_status_t eng_model_lm_create(const struct eng_config *cfg, struct eng_lm *lm,
                                 struct inf_err *err);

#ifdef __cplusplus
}
#endif
