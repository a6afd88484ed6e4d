#pragma once
/* kernels/attn_cuda.h — paged attention on the GPU: fp16 queries, fp16 or
 * fp8 (E4M3) K/V pools, fp32 softmax and accumulation.
 *
 * Pool layout (one layer, K and V alike): [n_blocks][block][n_kv_heads]
 * [head_dim] fp16, or one E4M3 byte a value (kv_fp8: x stored as
 * e4m3(x / scale), read as decode(code) * scale, kernels/fp8.h, with the
 * layer's k_scale and v_scale); position p of a sequence lives in block
 * block_table[slot][p / block], row p % block.
 *
 * Work is described by the caller as a list of items (built on the host from
 * the batch tables, uploaded to the device). An item is one block's work:
 * up to krn_cuda_attn_config().rows query rows that share one KV head,
 * attending over keys [k0, k1) of one sequence. Query row rr of a
 * sequence (rr = token index in the sequence * G + head index in the group,
 * G = n_heads / n_kv_heads) is token t_first + rr / G at position
 * p_first + rr / G, query head kvh * G + rr % G, and sees keys
 * 0..its position (causal), or with a sliding window (window > 0) its
 * position - window + 1..its position: keys of [k0, k1) outside that are
 * masked, so k0 may start anywhere at or before the first row's first key
 * (the work list starts it at that key's block, skipping the blocks before
 * it, which need not be in the table). An item either covers all of a row set's keys
 * and writes out directly (part < 0), or is one split of several and writes
 * its unnormalized partial (acc, max, sum) to partial slot `part`; a group
 * then names the consecutive items of one row set and is combined into out:
 * by a second kernel, or (config.fused_combine, the decode kernel) by the
 * last of the group's items to finish, which finds itself through the
 * group's arrival counter. The items of a group hold consecutive partial
 * slots (part of the group's first item + j), each slot of rows *
 * (head_dim + 2) floats laid out as the kernel chooses.
 * A fixed-shape list (a CUDA graph replays one grid size) is padded with
 * items of nrows 0, groups of n_splits 0 and K/V entries of pool row -1,
 * which do nothing.
 * Device pointers; launched on stream; kernels never allocate or
 * synchronize. Errors: INF_E_UNSUPPORTED (head_dim not a multiple of 8 or
 * above 256), INF_E_INVALID (counts), INF_E_DEVICE. */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct krn_cuda_attn_item {
    int32_t t_first; /* batch row of the sequence's first token */
    int32_t p_first; /* its position */
    int32_t slot;    /* block-table row */
    int32_t kvh;     /* KV head */
    int32_t row0;    /* first query row of this item (in the sequence's rows) */
    int32_t nrows;   /* rows in this item, <= krn_cuda_attn_rows() */
    int32_t k0, k1;  /* key positions [k0, k1) */
    int32_t part;    /* partial slot, or -1: write out directly */
    int32_t group;   /* with part >= 0: index of its group */
    int32_t pad[2];
};

struct krn_cuda_attn_group {
    int32_t item;     /* first item of the group (its row set) */
    int32_t n_splits; /* consecutive items, each with its partial slot */
};

struct krn_cuda_attn_params {
    const uint16_t *q; /* token t, head h at q + t * ldq + h * head_dim */
    int64_t ldq;
    uint16_t *out; /* token t, head h at out + t * ldo + h * head_dim */
    int64_t ldo;
    const uint16_t *k_pool, *v_pool; /* fp16 pools, or with kv_fp8 the E4M3 bytes' address */
    bool kv_fp8;                     /* the pools hold E4M3 codes */
    float k_scale, v_scale;          /* kv_fp8: a K / V value is decode(code) * scale */
    const int32_t *block_table;      /* [n_slots][max_blocks] */
    int32_t max_blocks;
    int32_t block; /* tokens per KV block */
    int32_t n_heads, n_kv_heads, head_dim;
    float scale;
    int32_t window; /* sliding window in keys, the query's own included; 0: none */
    const struct krn_cuda_attn_item *items;
    int32_t n_items;
    const struct krn_cuda_attn_group *groups;
    int32_t n_groups;
    float *partials;     /* [slots][rows][head_dim + 2] */
    int32_t *group_done; /* [n_groups] arrival counters for a fused combine:
                            zero before the launch, left zero after */
    bool decode;         /* selects the decode-shaped configuration */
    int32_t impl;        /* KRN_ATTN_AUTO, or a forced implementation */
    int32_t rows;        /* the step's query rows (0: not given), for the decode
                            kernel's krncuda::pdl_enter(pdl_early(rows)) */
    /* RoPE and the K/V write of a decode step, fused (rope_inv_freq non-null;
     * the decode kernel only, see krn_cuda_attention). The step's q heads
     * (at q) and k heads (the n_kv_heads heads after them in the same rows)
     * are not rotated yet: every item rotates its query rows as it loads
     * them, and an item whose keys hold its token's own position rotates
     * that token's k head kvh and writes it, and v head kvh of the token's
     * row of v_new, into the pools at pool row kv_map[t] (none where
     * negative: a padding row) before it reads those keys. Token t is at
     * position rope_pos[t]; frequencies rope_inv_freq[head_dim / 2]; the
     * values are those of krn_cuda_rope_kv (kernels/rope_cuda.h), bit for
     * bit. q is left as it was. Each item's rows must be one token's (a
     * decode step: one token a sequence). */
    const float *rope_inv_freq;
    const int32_t *rope_pos;
    const int32_t *kv_map;
    const uint16_t *v_new;
    int64_t ldv;
    /* With rope_inv_freq, or null: the step's q, k and v rows as the
     * fixed-point words of the INT4 GEMM that made them (KRN_INT4_GEMM_ACC64,
     * kernels/int4_gemm.h), read instead of q and v_new: value = the fp16 of
     * the word's sum, as krn_int4_gemm_acc_reduce writes it (so the output
     * is bit for bit that of the reduced rows). Row t's q and k heads from
     * q_words + t * ldw, its v heads from v_words + t * ldw (16-byte aligned,
     * ldw even). The words are left as they are. */
    const int64_t *q_words, *v_words;
    int64_t ldw;
};

/* Implementations: KRN_ATTN_AUTO picks per shape (decode with head_dim <=
 * 128: the tensor-core decode kernel; prefill with head_dim <= 128: the
 * tensor-core prefill kernel; else the SIMT kernel). KRN_ATTN_SIMT forces
 * the SIMT kernel (with its combine kernel) for every shape, and values from
 * 2 to krn_cuda_attn_impl_count() - 1 force one compiled configuration of
 * the decode kernel (decode, head_dim <= 128 only); benchmarks use them. */
enum { KRN_ATTN_AUTO = 0, KRN_ATTN_SIMT = 1 };

/* What the caller needs to build a work list for one implementation. */
struct krn_cuda_attn_config {
    int32_t rows;        /* query rows per item */
    int32_t tile;        /* split boundaries should be multiples of this */
    int32_t split_keys;  /* fewest keys worth a split of their own */
    int32_t max_splits;  /* most items in one group */
    int32_t ctas_per_sm; /* items resident at once on one SM */
    bool fused_combine;  /* groups combined in the same launch (group_done) */
};

/* The most splits a group of a work list of n_chunks row sets may take:
 * enough to fill one wave of resident blocks (sms x cfg->ctas_per_sm) when
 * the row sets alone would leave blocks idle, never more than that wave
 * (items past it wait for a second round: the 32-layer Llama-2-7B decode
 * step of 4 rows on the H200 took 2.32 ms with 384 items for 264 resident
 * blocks and 2.06 ms with 256; docs/CUDA.md, "Decode attention"), at least
 * 1, at most cfg->max_splits. */
static inline int64_t krn_cuda_attn_splits_cap(int64_t n_chunks, int32_t sms,
                                               const struct krn_cuda_attn_config *cfg)
{
    const int64_t want = (int64_t)sms * cfg->ctas_per_sm;
    int64_t cap = n_chunks > 0 && n_chunks < want ? want / n_chunks : 1;
    return cap > cfg->max_splits ? cfg->max_splits : cap;
}

/* Fill *out for head_dim, decode or prefill, and impl on the current device
 * (queries the device's occupancy once per configuration), for fp16 pools;
 * _kv for fp16 or (kv_fp8) E4M3 pools, whose decode kernels take half the
 * shared memory and so fit more blocks an SM.
 * Thread: any. Errors: INF_E_UNSUPPORTED (head_dim; impl not built for the
 * shape), INF_E_INVALID (impl out of range), INF_E_DEVICE. */
inf_status_t krn_cuda_attn_config(int32_t head_dim, bool decode, int32_t impl,
                                  struct krn_cuda_attn_config *out, struct inf_err *err);
inf_status_t krn_cuda_attn_config_kv(int32_t head_dim, bool decode, int32_t impl, bool kv_fp8,
                                     struct krn_cuda_attn_config *out, struct inf_err *err);

/* The implementation for a step's shape: KRN_ATTN_AUTO where the per-head_dim
 * default serves it, else the decode configuration that runs a decode step
 * of `rows` query tokens (a token a sequence) of n_heads query and
 * n_kv_heads KV heads faster: w4 s2 for head_dim 128 from 768 row sets and
 * at 265 to 396 (Llama-2-7B from 24 rows, Llama-3-8B at 48 and from 96),
 * w4 s3 for head_dim 64 above 264 (a Llama-3.2-1B shape from 34 rows).
 * The bounds are the H200's waves (132 SMs, two w4 s3 or three w4 s2
 * blocks an SM; kernels/cuda/attn_decode.cu). Pass the same value to
 * krn_cuda_attn_config and as the launch's impl. Needs no device.
 * Thread: any. */
int32_t krn_cuda_attn_impl_for(int32_t head_dim, bool decode, int32_t rows, int32_t n_heads,
                               int32_t n_kv_heads);
/* The same for fp16 or (kv_fp8) E4M3 pools. */
int32_t krn_cuda_attn_impl_for_kv(int32_t head_dim, bool decode, int32_t rows, int32_t n_heads,
                                  int32_t n_kv_heads, bool kv_fp8);

/* Number of implementations (valid impl values are 0 .. count - 1) and a
 * short name of each ("auto", "simt", "tc-decode w4 s3", ...). */
int32_t krn_cuda_attn_impl_count(void);
const char *krn_cuda_attn_impl_name(int32_t impl);

/* Run every item, then combine every group. With p->rope_inv_freq set:
 * INF_E_UNSUPPORTED unless the decode kernel runs the shape (decode,
 * head_dim 64 or 128) and what krn_cuda_rope_kv_ok checks holds for q, v_new
 * and the pools; the caller then rotates and writes the K/V itself
 * (krn_cuda_rope_kv) and launches without. */
inf_status_t krn_cuda_attention(const struct krn_cuda_attn_params *p, void *stream,
                                struct inf_err *err);

/* Write K and V rows: for i < n, token dst[2i] of the batch (k + t * ldk,
 * v + t * ldv, row_elems fp16 each) goes to pool row dst[2i + 1] (element
 * offset dst[2i + 1] * row_elems). */
inf_status_t krn_cuda_kv_write(const uint16_t *k, int64_t ldk, const uint16_t *v, int64_t ldv,
                               uint16_t *k_pool, uint16_t *v_pool, int32_t row_elems,
                               const int32_t *dst, int32_t n, void *stream, struct inf_err *err);
/* The same into E4M3 pools of row_elems bytes a row: element x of k is
 * stored as e4m3(x / k_scale), of v as e4m3(x / v_scale) (kernels/fp8.h's
 * krn_e4m3_encode of the fp16 value made fp32, bit for bit). */
inf_status_t krn_cuda_kv_write_e4m3(const uint16_t *k, int64_t ldk, const uint16_t *v, int64_t ldv,
                                    uint8_t *k_pool, uint8_t *v_pool, int32_t row_elems,
                                    float k_scale, float v_scale, const int32_t *dst, int32_t n,
                                    void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
