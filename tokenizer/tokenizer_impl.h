#pragma once
/* tokenizer/tokenizer_impl.h — internals of the tokenizer, shared by
 * tokenizer_load.c, tokenizer_encode.c, tokenizer_decode.c and
 * tokenizer_util.c. Not part of the engine's public interface. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>
#include <pthread.h>

/* ---- growable byte buffer and string lists -------------------------------- */
struct tok_buf {
    char *p;
    size_t n, cap;
};

/* One string of a list: bytes [off, off+len) of the list's buffer. at_start:
 * the piece begins at offset 0 of the original input (Metaspace's "first"). */
struct tok_piece {
    uint32_t off, len;
    bool at_start;
};

struct tok_list {
    struct tok_piece *p;
    size_t n, cap;
    struct tok_buf b;
};

bool tok_buf_reserve(struct tok_buf *b, size_t extra);
bool tok_buf_put(struct tok_buf *b, const void *s, size_t n);
void tok_buf_fini(struct tok_buf *b);
void tok_list_clear(struct tok_list *l);
/* Append a piece made of bytes s[0..n) copied into the list's buffer. */
bool tok_list_push(struct tok_list *l, const char *s, size_t n, bool at_start);
/* Begin/extend/end a piece built in place at the end of the buffer. */
bool tok_list_push_empty(struct tok_list *l, bool at_start);
void tok_list_fini(struct tok_list *l);

/* ---- string -> int32 hash map (keys point into storage owned elsewhere) --- */
struct tok_strmap {
    const char **keys;
    uint32_t *lens;
    int32_t *vals;
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t n, cap, mask;
};

uint64_t tok_hash(const void *s, size_t n);
bool tok_strmap_init(struct tok_strmap *m, size_t expected);
void tok_strmap_fini(struct tok_strmap *m);
/* Insert or overwrite; key must outlive the map. */
bool tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t val);
/* Value of key, or -1. */
int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len);

/* ---- merges: (left id, right id) -> (rank, merged id) ---------------------- */
struct tok_merge_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    uint32_t rank;
    int32_t id;
};

struct tok_mergemap {
    struct tok_merge_slot *slots;
    size_t n, mask;
};

/* ---- UTF-8 and Unicode helpers ---------------------------------------------- */
/* Length of the valid UTF-8 prefix of s (RFC 3629: no surrogates/overlongs). */
size_t tok_utf8_valid_prefix(const char *s, size_t n);
/* Decode one character of valid UTF-8 at s; returns its length. */
size_t tok_utf8_decode(const char *s, uint32_t *cp);
/* Length of the character starting with lead byte c (1 for a non-lead byte). */
size_t tok_utf8_len(unsigned char c);
bool tok_is_whitespace(uint32_t cp); /* Unicode White_Space */
bool tok_is_numeric(uint32_t cp);    /* general category N* */
bool tok_is_alnum(uint32_t cp);      /* L* or N* or '_' for single_word */
/* Append Rust's String::from_utf8_lossy(s) to out. */
bool tok_utf8_lossy(struct tok_buf *out, const unsigned char *s, size_t n);

/* The GPT-2 byte <-> unicode table of the ByteLevel components. */
struct tok_bytelevel {
    char enc[256][3]; /* byte -> UTF-8 of its character */
    uint8_t enc_len[256];
    int16_t dec[512]; /* code point -> byte, -1 when not a byte character */
};
extern struct tok_bytelevel tok_bl;
void tok_bytelevel_init(void);

/* ---- patterns (Split, Replace) ---------------------------------------------- */
struct tok_pattern {
    char *lit; /* literal string (Pattern::String) or NULL */
    size_t lit_len;
    pcre2_code *re; /* Pattern::Regex, compiled UTF + UCP, JIT when possible */
};

/* Find the next match of pat in s[0..n) at or after start. Returns 1 with
 * [*ms, *me) on a match, 0 when none, -1 on a regex error. md: match data
 * for regexes. */
int tok_pattern_next(const struct tok_pattern *pat, const char *s, size_t n, size_t start,
                         pcre2_match_data *md, size_t *ms, size_t *me);

/* ---- components ---------------------------------------------------------------- */
enum tok_norm_type {
    NORM_SEQ,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_NFC,
    NORM_NFKC,
    NORM_NFD,
    NORM_NFKD
};

struct tok_norm {
    enum tok_norm_type type;
    struct tok_norm *kids; /* NORM_SEQ */
    size_t n_kids;
    char *str; /* Prepend's text, Replace's content */
    size_t str_len;
    struct tok_pattern pat; /* Replace */
};

enum tok_split_behavior {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_CONTIGUOUS
};
enum tok_prepend { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

enum tok_pretok_type { PT_SEQ, PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS };

struct tok_pretok {
    enum tok_pretok_type type;
    struct tok_pretok *kids; /* PT_SEQ */
    size_t n_kids;
    bool add_prefix_space, use_regex; /* ByteLevel */
    struct tok_pattern pat;           /* Split (ByteLevel's GPT-2 regex when use_regex) */
    enum tok_split_behavior behavior;
    bool invert;
    char repl[5]; /* Metaspace replacement, UTF-8 */
    size_t repl_len;
    enum tok_prepend prepend;
    bool split;             /* Metaspace */
    bool individual_digits; /* Digits */
};

enum tok_dec_type {
    DEC_SEQ,
    DEC_BYTELEVEL,
    DEC_METASPACE,
    DEC_BYTEFALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_REPLACE
};

struct tok_dec {
    enum tok_dec_type type;
    struct tok_dec *kids;
    size_t n_kids;
    uint32_t repl_cp; /* Metaspace replacement; Strip content */
    enum tok_prepend prepend;
    size_t start, stop; /* Strip */
    struct tok_pattern pat;
    char *str; /* Replace content */
    size_t str_len;
};

/* One item of the post-processor's single template: a sequence (the encoded
 * text) or a list of special ids. */
struct tok_tmpl_item {
    bool is_seq;
    int32_t *ids;
    size_t n_ids;
};

struct tok_added {
    char *content;
    size_t len;
    char *norm; /* normalized content, for normalized tokens */
    size_t norm_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
};

/* Added tokens of one matching set (raw or normalized), grouped by first byte
 * and longest first, for leftmost-longest matching. */
struct tok_matcher {
    uint32_t *order; /* indices into tok->added, sorted by (first byte, length desc) */
    size_t n;
    uint32_t first[257]; /* order[first[b] .. first[b+1]) start with byte b */
};

#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_KEY 44
#define TOK_CACHE_IDS 9

struct tok_cache_slot {
    uint64_t hash;
    uint8_t key_len, n_ids; /* key_len 0 = empty */
    char key[TOK_CACHE_KEY];
    int32_t ids[TOK_CACHE_IDS];
};

struct tok_tokenizer {
    /* vocabulary: id -> token string (model vocab, overridden by added tokens) */
    struct tok_buf pool; /* vocab strings; sized once, never moves */
    const char **id_str; /* into pool, or an added token's own string */
    uint32_t *id_len;    /* UINT32_MAX: no token */
    int32_t n_ids;
    struct tok_strmap vocab;     /* model vocab: token -> id */
    struct tok_strmap added_map; /* added token content -> id */
    bool *is_special;
    /* model */
    struct tok_mergemap merges;
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_ids[256]; /* id of "<0xXX>", -1 when absent */
    /* pipeline */
    struct tok_norm *norm;
    struct tok_pretok *pretok;
    struct tok_dec *dec;
    struct tok_tmpl_item *tmpl;
    size_t n_tmpl;
    bool has_post;
    /* added tokens */
    struct tok_added *added;
    size_t n_added;
    struct tok_matcher match_raw, match_norm;
    int32_t bos_id, eos_id, pad_id;
    /* word cache */
    pthread_mutex_t cache_lock;
    struct tok_cache_slot *cache;
};

/* Load-time helpers (tokenizer_load.c). */
void tok_norm_free(struct tok_norm *n);
void tok_pretok_free(struct tok_pretok *p);
void tok_dec_free(struct tok_dec *d);
void tok_pattern_free(struct tok_pattern *p);

/* Apply the normalizer to s[0..n), appending to out. */
bool tok_normalize(const struct tok_norm *norm, const char *s, size_t n, struct tok_buf *out,
                       struct tok_buf *tmp, pcre2_match_data *md);

/* Decode ids[0..n) through the decoder chain (tokenizer_decode.c).
 * partial: hold back what later ids could change; *settled (may be NULL) is
 * set when nothing was held back. cont: the ids continue earlier text. */
inf_status_t tok_decode_run(const tok_tokenizer_t *tok, const int32_t *ids, size_t n,
                                bool skip_special, bool cont, bool partial, struct tok_buf *out,
                                bool *settled, struct inf_err *err);
