#pragma once
/* engine/model_impl.h — engine-internal: the model's state, shared by its
 * loading (engine/model_load.c) and its forward step (engine/model.c).
 *
 * Activation buffers, each [max_tokens rows] of act_dtype:
 *   x    [T][H]            residual stream
 *   xn   [T][H]            normalized input of the next projection
 *   d    [T][H]            output of o_proj / down_proj (the residual delta)
 *   qkv  [T][(nh+2nkv)hd]  q | k | v heads side by side (fused or not)
 *   att  [T][nh*hd]        attention output
 *   gu   [T][2I]           gate | up
 *   h    [T][I]            silu(gate) * up
 *   lx   [LR][H]           normalized rows that want logits (chunk)
 *   lo   [LR][V] fp32      their logits (chunk)
 * Index buffers (int32): tokens [T], pos [T], two sequence lists [T][3]
 * (decode and prefill runs), logit rows [T], block table (grows). */
#include "engine/model.h"
#include "engine/par.h"
#include "engine/tp/shard.h"
#include "engine/weights/qconfig.h"

#include <stdbool.h>
#include <stdint.h>

#define LOGIT_ROWS 32    /* rows of logits computed per lm_head call */
#define MODEL_BUCKETS 11 /* decode graph buckets (engine/model.c) */

/* A linear layer: what the backend runs (lin) and its record. */
struct lin {
    struct eng_linear lin;
    int32_t info;    /* index into m->info */
    bool w_borrowed; /* tied lm_head: lin.w is the embedding table */
    int32_t lead;    /* a row-parallel shard's leading zero columns (engine/tp/shard.h) */
    int32_t trail;   /* and trailing ones (an act-order shard reads every column) */
};

struct layer {
    struct eng_buf *attn_norm, *mlp_norm;
    /* act-order q/k/v and gate/up (their shared column order, taken out of
     * the linears at load): the norm's output order and the weight in it;
     * NULL otherwise */
    struct eng_buf *attn_perm, *mlp_perm;
    struct lin qkv[3]; /* fused: qkv[0] only */
    struct lin o;
    struct lin gu[2]; /* fused: gu[0] only */
    /* linears of qkv and gu: 1 fused, else 3 and 2 (fuse_qkv off, or an INT4
     * checkpoint whose parts cannot be stacked) */
    int32_t n_qkv, n_gu;
    struct lin down;
    struct eng_buf *k_cache, *v_cache;
    float k_scale, v_scale; /* an FP8 KV cache's scales (1.0 unless the checkpoint has them) */
};

/* How the linear layers are loaded, from opts.quant and the checkpoint. */
enum load_mode {
    LOAD_FP,     /* every weight fp */
    LOAD_RTN,    /* a 16-bit checkpoint quantized on load */
    LOAD_PACKED, /* an INT4 checkpoint repacked (its float layers stay fp) */
};

struct eng_model {
    struct eng_model_config cfg;
    struct eng_model_opts opts;
    struct eng_backend *be;
    enum load_mode mode;
    struct eng_qcfg qcfg; /* the checkpoint's quantization (LOAD_PACKED) */
    /* this rank's part of the model (the whole model at tp 1), and the
     * columns before the attention output and the MLP's h that the
     * row-parallel shards read as zeros (the largest lead of any layer),
     * and likewise after them (the largest trail) */
    struct eng_tp_shape tp;
    int32_t att_lead, h_lead, att_trail, h_trail;
    bool fused;
    /* projections asked to fuse that an INT4 checkpoint does not let stack
     * (column orders or groups that differ): how many groups, the first */
    int32_t n_apart;
    char apart[96];
    struct eng_buf *embed;
    enum eng_wdtype embed_dt;
    struct eng_buf *final_norm;
    struct lin lm_head;
    struct layer *layers;
    struct eng_layer_info *info;
    int32_t n_info, cap_info;
    struct eng_rope_params rope;
    /* activations and indices */
    struct eng_buf *x, *xn, *d, *qkv, *att, *gu, *h, *lx, *lo;
    struct eng_buf *tok, *pos, *seq_dec, *seq_pre, *lrows, *bt;
    int32_t *host_seq_dec, *host_seq_pre, *host_lrows;
    /* sampling on the device: results [cap_samples] and a host copy of one
     * chunk's rows */
    struct eng_buf *samples;
    struct eng_sample_row *host_rows;
    int32_t cap_samples;
    /* steps in two halves (eng_model_sample_submit): the batch's feed on the
     * device and its host copy, padded; the download slot the next submit
     * takes, and how many are submitted and not collected */
    struct eng_buf *feed;
    int32_t *host_feed;
    int sub_next, n_sub;
    /* decode graphs: rows of the largest bucket (0: none), padded tables,
     * buckets whose recording failed */
    int32_t graph_rows;
    int32_t *pad_tok, *pad_pos, *pad_bt;
    bool graph_failed[MODEL_BUCKETS];
    /* while loading: the threads, the host buffer of fp conversions, and
     * seconds spent per phase */
    eng_par_t *par;
    void *stage;
    size_t stage_bytes;
    double t_quantize;   /* converting and quantizing INT4 layers */
    double t_q4_backend; /* the backend's repack and upload of them */
    double t_convert;    /* converting fp weights to their dtype */
    double t_upload;     /* uploading fp weights */
};

/* After a load: the INT4 checkpoint's format and its layers, the layers
 * padded along K, and the KV cache's element type and scales (n_kv_scaled:
 * layers whose scales the checkpoint gives), in the log (engine/model_log.c). */
void eng_model_log_load(const struct eng_model *m, int32_t n_kv_scaled);
