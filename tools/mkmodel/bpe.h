#pragma once
/* tools/mkmodel/bpe.h — a tiny byte-level BPE trainer and a tokenizer.json
 * writer in Hugging Face's format (GPT-2 ByteLevel pre-tokenizer and
 * decoder, BPE model, two special tokens, TemplateProcessing adding BOS). */
#include "common/inf.h"

#include <stdint.h>

#define BPE_BOS "<|begin_of_text|>"
#define BPE_EOS "<|end_of_text|>"

struct bpe_vocab {
    int32_t n_symbols; /* 256 byte symbols + merged symbols: ids 0..n_symbols-1 */
    char **symbols;    /* id -> its text in GPT-2's byte-to-unicode alphabet (UTF-8) */
    int32_t n_merges;
    int32_t (*merges)[2];   /* in rank order: pair of symbol ids */
    int32_t bos_id, eos_id; /* the special tokens, after the symbols */
    int32_t size;           /* n_symbols + 2 */
};

/* Learn up to max_merges merges from the built-in English text, stopping
 * early when no pair occurs twice. Deterministic. Errors: INF_E_NOMEM. */
inf_status_t bpe_train(int32_t max_merges, struct bpe_vocab *v, struct inf_err *err);
void bpe_free(struct bpe_vocab *v);

/* Write v as a tokenizer.json to path. Errors: INF_E_IO, INF_E_NOMEM. */
inf_status_t bpe_write_tokenizer_json(const struct bpe_vocab *v, const char *path,
                                      struct inf_err *err);
