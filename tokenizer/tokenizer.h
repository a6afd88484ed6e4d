#pragma once
/* tokenizer/tokenizer.h — Hugging Face tokenizer.json tokenizers (BPE models:
 * SentencePiece-style with byte fallback, and byte-level BPE), encoding and
 * decoding id for id like the reference `tokenizers` library.
 *
 * Supported components (anything else is refused at load, by name):
 *   model          BPE (vocab, merges as "a b" or ["a","b"], byte_fallback,
 *                  unk_token, fuse_unk, ignore_merges,
 *                  continuing_subword_prefix / end_of_word_suffix)
 *   normalizer     Sequence, Prepend, Replace, NFC, NFKC, NFD, NFKD
 *   pre_tokenizer  Sequence, ByteLevel, Split, Metaspace, Digits
 *   post_processor Sequence, TemplateProcessing, ByteLevel
 *   decoder        Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
 *                  Replace
 * Added tokens are matched in the text before the model (leftmost-longest,
 * honouring lstrip, rstrip, single_word and normalized). */
#include "common/inf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tok_tokenizer tok_tokenizer_t;

/* A growable list of token ids. Zero-initialise it ({0}) before first use;
 * tok_encode appends to it; release with tok_ids_fini. */
struct tok_ids {
    int32_t *ids;
    size_t n;
    size_t cap;
};

/* Free the storage of ids and zero it. ids may be NULL. */
void tok_ids_fini(struct tok_ids *ids);

/* Load <dir>/tokenizer.json and, when present, <dir>/tokenizer_config.json
 * (for the BOS/EOS/PAD token names). On INF_OK *out is a new tokenizer the
 * caller owns (tok_destroy). Thread: any.
 * Errors: INF_E_IO (missing or unreadable file), INF_E_FORMAT (malformed JSON
 * or inconsistent vocab/merges), INF_E_UNSUPPORTED (a component this
 * implementation does not have, named in the message), INF_E_NOMEM. */
inf_status_t tok_load(const char *dir, tok_tokenizer_t **out, struct inf_err *err);

/* As tok_load, from explicit paths; config_path may be NULL. */
inf_status_t tok_load_files(const char *tokenizer_json, const char *config_path,
                                tok_tokenizer_t **out, struct inf_err *err);

/* As tok_load_files, from the texts of the two files (config may be NULL). */
inf_status_t tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                               size_t config_len, tok_tokenizer_t **out, struct inf_err *err);

/* Free tok. tok may be NULL. No other call may be in flight on tok. */
void tok_destroy(tok_tokenizer_t *tok);

struct tok_encode_opts {
    /* Run the post-processor (BOS/EOS as tokenizer.json's template says).
     * The reference's default is true. */
    bool add_special;
    /* Text of a special added token in the input becomes its id (the
     * reference's default, true). When false, special tokens' text is encoded
     * as ordinary text; non-special added tokens are still matched. */
    bool parse_special;
};

/* The reference's defaults: add_special = true, parse_special = true. */
struct tok_encode_opts tok_encode_defaults(void);

/* Encode len bytes of UTF-8 text (NULs allowed) and append the ids to out.
 * opts may be NULL (the defaults). On error out keeps its earlier contents.
 * Thread: any; concurrent calls on one tokenizer are safe (they share a cache
 * under a lock that never blocks).
 * Errors: INF_E_INVALID (text is not valid UTF-8), INF_E_NOMEM,
 * INF_E_INTERNAL (the pre-tokenizer regex failed to match). */
inf_status_t tok_encode(tok_tokenizer_t *tok, const char *text, size_t len,
                            const struct tok_encode_opts *opts, struct tok_ids *out,
                            struct inf_err *err);

/* Decode n ids to UTF-8 text, as the reference's decode(ids,
 * skip_special_tokens). On INF_OK *text is a NUL-terminated malloc'd string
 * the caller frees, *text_len its length (may be NULL).
 * Thread: any. Errors: INF_E_RANGE (an id outside the vocabulary), INF_E_NOMEM. */
inf_status_t tok_decode(const tok_tokenizer_t *tok, const int32_t *ids, size_t n, bool skip_special,
                            char **text, size_t *text_len, struct inf_err *err);

/* Number of ids (one past the largest id of the vocabulary and added tokens). */
int32_t tok_vocab_size(const tok_tokenizer_t *tok);
/* The token string of id (its vocabulary form, e.g. "Ġthe" or "<0x0A>"), or
 * NULL when id is outside the vocabulary. Owned by tok. */
const char *tok_id_to_token(const tok_tokenizer_t *tok, int32_t id);
/* The id of a token string (vocabulary or added token), or -1. */
int32_t tok_token_to_id(const tok_tokenizer_t *tok, const char *token);
/* True when id is a special added token (skipped by skip_special). */
bool tok_is_special(const tok_tokenizer_t *tok, int32_t id);
/* The ids named by tokenizer_config.json's bos_token / eos_token / pad_token,
 * or -1 when absent. */
int32_t tok_bos_id(const tok_tokenizer_t *tok);
int32_t tok_eos_id(const tok_tokenizer_t *tok);
int32_t tok_pad_id(const tok_tokenizer_t *tok);

/* ---- streaming detokenizer ---------------------------------------------------
 * Feeds ids one at a time and returns text deltas that never end inside a
 * UTF-8 character and whose concatenation, after tok_stream_finish, is
 * exactly tok_decode of all ids pushed. Text that later ids could still
 * change (an unfinished byte-fallback run, an incomplete UTF-8 sequence of
 * byte-level tokens) is held back until it is settled. Work per id is bounded
 * by the length of the unsettled tail, not of the whole sequence. */
typedef struct tok_stream tok_stream_t;

struct tok_stream_opts {
    bool skip_special; /* as tok_decode's skip_special */
    /* The ids continue earlier text (a prompt): the decoders' start-of-text
     * rules (Metaspace's and Strip's removal of the leading space) are not
     * applied. The deltas then concatenate to decode(prompt + ids) minus
     * decode(prompt) whenever that prompt's decode is settled. */
    bool continuation;
};

/* New stream over tok (which must outlive it); opts may be NULL (both false).
 * Thread: one thread at a time per stream. Errors: INF_E_NOMEM. */
inf_status_t tok_stream_create(const tok_tokenizer_t *tok, const struct tok_stream_opts *opts,
                                   tok_stream_t **out, struct inf_err *err);
void tok_stream_destroy(tok_stream_t *s);

/* Push one id. *delta points to *delta_len bytes (possibly 0) owned by the
 * stream, valid until the next call on it.
 * Errors: INF_E_RANGE (id outside the vocabulary; the stream is unchanged),
 * INF_E_NOMEM. */
inf_status_t tok_stream_push(tok_stream_t *s, int32_t id, const char **delta,
                                 size_t *delta_len, struct inf_err *err);

/* End of the sequence: return what was held back. The stream is then empty
 * and may be reused for a new sequence. Errors: INF_E_NOMEM. */
inf_status_t tok_stream_finish(tok_stream_t *s, const char **delta, size_t *delta_len,
                                   struct inf_err *err);

#ifdef __cplusplus
}
#endif
