#pragma once
/* engine/weights/qconfig.h — engine-internal: how an INT4 checkpoint folder
 * says it was quantized, validated, and which of its linear layers that
 * covers.
 *
 * Read from config.json's quantization_config or, where config.json has
 * none, from quantize_config.json beside it (older AutoGPTQ folders):
 *   awq                 AutoAWQ "gemm" (bits 4, zero_point true); other
 *                       versions (gemv, exllama, ...) are refused by name;
 *                       modules_to_not_convert: layers whose name contains
 *                       an entry stay in floating point (transformers'
 *                       rule)
 *   gptq                AutoGPTQ / GPTQModel: bits 4, group_size (-1 per
 *                       channel), desc_act, sym, checkpoint_format "gptq"
 *                       (qzeros hold zero - 1) or "gptq_v2" (the zeros
 *                       themselves), pack_dtype int32; lm_head quantized
 *                       only when "lm_head" is true
 *   compressed-tensors  llm-compressor's "pack-quantized": every config
 *                       group int, num_bits 4, strategy group or channel,
 *                       symmetric or not, weights only (no input or output
 *                       activation quantization); a layer is quantized when
 *                       a group's targets match it ("Linear", an exact name,
 *                       or "re:" and a regular expression matched from the
 *                       name's start) and no ignore entry does
 * Group sizes: 32, 64, 128, 256 and multiples of 256 (stored as groups of
 * 256 with repeated scales, which is exact), or per channel. Anything else,
 * and any value these readers do not implement, is refused with the file
 * and the key. Thread: any. */
#include "common/inf.h"

#include <regex.h>
#include <stdbool.h>
#include <stdint.h>

enum eng_qmethod {
    ENG_QM_NONE, /* a 16-bit checkpoint: no quantization_config */
    ENG_QM_AWQ,
    ENG_QM_GPTQ,
    ENG_QM_CT, /* compressed-tensors pack-quantized */
};

/* How one linear layer's INT4 tensors are stored (engine/weights/packed.h
 * reads them). */
struct eng_qlayer {
    enum eng_qmethod method;
    int32_t group;       /* along K; -1: one group per output channel */
    bool sym;            /* the checkpoint says symmetric: every zero point is 8 */
    bool zero_minus_one; /* GPTQ checkpoint_format "gptq": qzeros hold zero - 1 */
    bool act_order;      /* GPTQ desc_act, compressed-tensors actorder "group":
                            g_idx must be present (it may permute K) */
};

/* A name pattern of compressed-tensors' targets and ignore lists, or an
 * entry of AWQ's modules_to_not_convert. */
struct eng_qname {
    char *text; /* as written (without "re:") */
    bool re;    /* a regular expression (compiled in rx) */
    bool klass; /* "Linear": every linear layer */
    regex_t rx;
};

/* A compressed-tensors config group. */
struct eng_qgroup {
    struct eng_qlayer q;
    int32_t n_targets;
    struct eng_qname *targets;
};

struct eng_qcfg {
    enum eng_qmethod method;
    char file[24];       /* where it was read: "config.json" or "quantize_config.json" */
    char desc[160];      /* for the log: method and parameters */
    struct eng_qlayer q; /* awq, gptq: every quantized layer */
    bool lm_head;        /* gptq: lm_head quantized too */
    int32_t n_skip;      /* awq modules_to_not_convert, compressed-tensors ignore */
    struct eng_qname *skip;
    int32_t n_groups; /* compressed-tensors */
    struct eng_qgroup *groups;
};

/* "awq", "gptq", "compressed-tensors", "none". */
const char *eng_qmethod_name(enum eng_qmethod m);

/* Read dir's quantization (method ENG_QM_NONE when the folder declares
 * none). On error *q holds nothing to free. Errors: INF_E_FORMAT (bad JSON),
 * INF_E_UNSUPPORTED (a method, version, format or value not implemented,
 * named with its file and key), INF_E_INVALID (a value of the wrong type),
 * INF_E_IO, INF_E_NOMEM. */
inf_status_t eng_qcfg_load(const char *dir, struct eng_qcfg *q, struct inf_err *err);

/* Parse a JSON text named file in messages: config.json (whole_config: its
 * quantization_config object is read, absent is ENG_QM_NONE) or a
 * quantize_config.json (the object itself; quant_method defaults to gptq).
 * Errors as eng_qcfg_load. */
inf_status_t eng_qcfg_parse(const char *json, size_t len, const char *file, bool whole_config,
                            struct eng_qcfg *q, struct inf_err *err);

/* Release what a successful load or parse allocated; zeroes *q. */
void eng_qcfg_free(struct eng_qcfg *q);

/* Whether linear layer `name` (its module name, e.g.
 * "model.layers.0.self_attn.q_proj" or "lm_head") is stored as INT4 in the
 * checkpoint, and how (*out); false: it is stored in floating point (not
 * covered, ignored, or no quantization at all). */
bool eng_qcfg_layer(const struct eng_qcfg *q, const char *name, struct eng_qlayer *out);
