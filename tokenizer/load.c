/* tokenizer/load.c — reading tokenizer.json (and tokenizer_config.json) into
 * the tokenizer's tables and component trees. Every component this
 * implementation lacks is refused here, by name, so encoding never meets one. */
#define INF_LOG_MODULE "tok"
#include "tokenizer/tokenizer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_FLAGS (JSON_ALLOW_NUL | JSON_DECODE_ANY)

/* ---- small JSON accessors ---------------------------------------------------- */
static bool jbool(const json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v))
        return json_is_true(v);
    return dflt;
}

static const char *jstr(const json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return NULL;
    if (len)
        *len = json_string_length(v);
    return json_string_value(v);
}

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* ---- patterns ------------------------------------------------------------------- */
/* Oniguruma's \s (what tokenizer.json patterns are written for) is the
 * White_Space set: \t-\r, U+0085 and the Z categories. PCRE2's \s with UCP
 * lacks U+0085, so \s and \S are spelled out. */
#define ONIG_SPACE "\\t-\\r\\x{85}\\p{Z}"

static inf_status_t regex_translate(const char *src, size_t n, struct tok_buf *out,
                                    struct inf_err *err)
{
    int depth = 0; /* inside a character class */
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char d = src[i + 1];
            const char *rep = NULL;
            if (d == 's')
                rep = depth ? ONIG_SPACE : "[" ONIG_SPACE "]";
            else if (d == 'S') {
                if (depth)
                    return inf_err_set(err, INF_E_UNSUPPORTED,
                                       "tokenizer regex: \\S inside a character class");
                rep = "[^" ONIG_SPACE "]";
            }
            if (rep) {
                if (!tok_buf_put(out, rep, strlen(rep)))
                    return inf_err_set(err, INF_E_NOMEM, "out of memory");
            } else if (!tok_buf_put(out, src + i, 2))
                return inf_err_set(err, INF_E_NOMEM, "out of memory");
            i++;
            continue;
        }
        if (c == '[') {
            /* "[]" or "[^]" at a class start is a literal ']' in both dialects. */
            if (depth == 0) {
                depth = 1;
                if (!tok_buf_put(out, "[", 1))
                    return inf_err_set(err, INF_E_NOMEM, "out of memory");
                if (i + 1 < n && src[i + 1] == '^') {
                    tok_buf_put(out, "^", 1);
                    i++;
                }
                if (i + 1 < n && src[i + 1] == ']') {
                    tok_buf_put(out, "\\]", 2);
                    i++;
                }
                continue;
            }
            if (i + 1 < n && src[i + 1] == ':') {
                /* POSIX class [:alpha:] inside a class */
                const char *end = memchr(src + i + 2, ']', n - i - 2);
                if (end) {
                    size_t l = (size_t)(end - (src + i)) + 1;
                    if (!tok_buf_put(out, src + i, l))
                        return inf_err_set(err, INF_E_NOMEM, "out of memory");
                    i += l - 1;
                    continue;
                }
            }
            return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer regex: nested character classes");
        }
        if (c == ']' && depth)
            depth = 0;
        if (!tok_buf_put(out, &c, 1))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    return INF_OK;
}

static inf_status_t regex_compile(const char *src, size_t n, struct tok_pattern *pat,
                                  struct inf_err *err)
{
    struct tok_buf b = {0};
    inf_status_t st = regex_translate(src, n, &b, err);
    if (st != INF_OK) {
        tok_buf_fini(&b);
        return st;
    }
    int ec;
    PCRE2_SIZE eo;
    pat->re =
        pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    tok_buf_fini(&b);
    if (!pat->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer regex does not compile: %s",
                           (const char *)msg);
    }
    /* JIT is an optimisation: the interpreter gives the same matches. */
    (void)pcre2_jit_compile(pat->re, PCRE2_JIT_COMPLETE);
    return INF_OK;
}

static inf_status_t pattern_parse(const json_t *p, struct tok_pattern *pat, const char *what,
                                  struct inf_err *err)
{
    size_t n;
    const char *s;
    if ((s = jstr(p, "String", &n))) {
        pat->lit = dupn(s, n);
        pat->lit_len = n;
        return pat->lit ? INF_OK : inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    if ((s = jstr(p, "Regex", &n)))
        return regex_compile(s, n, pat, err);
    return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: %s has no String or Regex pattern",
                       what);
}

void tok_pattern_free(struct tok_pattern *p)
{
    free(p->lit);
    if (p->re)
        pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

/* ---- normalizers -------------------------------------------------------------- */
void tok_norm_free(struct tok_norm *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n_kids; i++) {
        struct tok_norm *k = &n->kids[i];
        for (size_t j = 0; j < k->n_kids; j++)
            tok_norm_free(&k->kids[j]);
        free(k->kids);
        free(k->str);
        tok_pattern_free(&k->pat);
    }
    free(n->kids);
    free(n->str);
    tok_pattern_free(&n->pat);
}

static inf_status_t norm_parse(const json_t *j, struct tok_norm *n, struct inf_err *err)
{
    memset(n, 0, sizeof *n);
    const char *type = jstr(j, "type", NULL);
    if (!type)
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr))
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Sequence without normalizers");
        n->type = NORM_SEQ;
        n->kids = calloc(json_array_size(arr) + 1, sizeof *n->kids);
        if (!n->kids)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v)
        {
            inf_status_t st = norm_parse(v, &n->kids[i], err);
            n->n_kids = i + 1;
            if (st != INF_OK)
                return st;
        }
        return INF_OK;
    }
    if (!strcmp(type, "Prepend")) {
        size_t l;
        const char *s = jstr(j, "prepend", &l);
        if (!s)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Prepend without prepend");
        n->type = NORM_PREPEND;
        n->str = dupn(s, l);
        n->str_len = l;
        return n->str ? INF_OK : inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    if (!strcmp(type, "Replace")) {
        size_t l;
        const char *s = jstr(j, "content", &l);
        if (!s)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Replace without content");
        n->type = NORM_REPLACE;
        n->str = dupn(s, l);
        n->str_len = l;
        if (!n->str)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        return pattern_parse(json_object_get(j, "pattern"), &n->pat, "Replace", err);
    }
    if (!strcmp(type, "NFC"))
        n->type = NORM_NFC;
    else if (!strcmp(type, "NFKC"))
        n->type = NORM_NFKC;
    else if (!strcmp(type, "NFD"))
        n->type = NORM_NFD;
    else if (!strcmp(type, "NFKD"))
        n->type = NORM_NFKD;
    else
        return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer.json: normalizer %s is not supported",
                           type);
    return INF_OK;
}

/* ---- pre-tokenizers ---------------------------------------------------------------- */
void tok_pretok_free(struct tok_pretok *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_kids; i++) {
        struct tok_pretok *k = &p->kids[i];
        for (size_t j = 0; j < k->n_kids; j++)
            tok_pretok_free(&k->kids[j]);
        free(k->kids);
        tok_pattern_free(&k->pat);
    }
    free(p->kids);
    tok_pattern_free(&p->pat);
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static inf_status_t prepend_parse(const json_t *j, enum tok_prepend *out, struct inf_err *err)
{
    const char *ps = jstr(j, "prepend_scheme", NULL);
    if (ps) {
        if (!strcmp(ps, "always"))
            *out = PREPEND_ALWAYS;
        else if (!strcmp(ps, "first"))
            *out = PREPEND_FIRST;
        else if (!strcmp(ps, "never"))
            *out = PREPEND_NEVER;
        else
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               "tokenizer.json: Metaspace prepend_scheme %s is not supported", ps);
        return INF_OK;
    }
    *out = jbool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    return INF_OK;
}

static inf_status_t char_parse(const json_t *j, const char *key, char *buf, size_t *len,
                               uint32_t *cp, struct inf_err *err)
{
    size_t l;
    const char *s = jstr(j, key, &l);
    if (!s || l == 0 || l > 4 || tok_utf8_valid_prefix(s, l) != l ||
        tok_utf8_len((unsigned char)s[0]) != l)
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: %s must be one character", key);
    if (buf) {
        memcpy(buf, s, l);
        buf[l] = 0;
    }
    if (len)
        *len = l;
    tok_utf8_decode(s, cp);
    return INF_OK;
}

static inf_status_t pretok_parse(const json_t *j, struct tok_pretok *p, struct inf_err *err)
{
    memset(p, 0, sizeof *p);
    const char *type = jstr(j, "type", NULL);
    if (!type)
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr))
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Sequence without pretokenizers");
        p->type = PT_SEQ;
        p->kids = calloc(json_array_size(arr) + 1, sizeof *p->kids);
        if (!p->kids)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v)
        {
            inf_status_t st = pretok_parse(v, &p->kids[i], err);
            p->n_kids = i + 1;
            if (st != INF_OK)
                return st;
        }
        return INF_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        p->type = PT_BYTELEVEL;
        p->add_prefix_space = jbool(j, "add_prefix_space", true);
        p->use_regex = jbool(j, "use_regex", true);
        if (p->use_regex)
            return regex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, &p->pat, err);
        return INF_OK;
    }
    if (!strcmp(type, "Split")) {
        p->type = PT_SPLIT;
        const char *b = jstr(j, "behavior", NULL);
        if (!b)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Split without behavior");
        if (!strcmp(b, "Removed"))
            p->behavior = SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated"))
            p->behavior = SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious"))
            p->behavior = SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext"))
            p->behavior = SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous"))
            p->behavior = SPLIT_CONTIGUOUS;
        else
            return inf_err_set(err, INF_E_UNSUPPORTED,
                               "tokenizer.json: Split behavior %s is not supported", b);
        p->invert = jbool(j, "invert", false);
        return pattern_parse(json_object_get(j, "pattern"), &p->pat, "Split", err);
    }
    if (!strcmp(type, "Metaspace")) {
        p->type = PT_METASPACE;
        uint32_t cp;
        inf_status_t st = char_parse(j, "replacement", p->repl, &p->repl_len, &cp, err);
        if (st == INF_OK)
            st = prepend_parse(j, &p->prepend, err);
        p->split = jbool(j, "split", true);
        return st;
    }
    if (!strcmp(type, "Digits")) {
        p->type = PT_DIGITS;
        p->individual_digits = jbool(j, "individual_digits", false);
        return INF_OK;
    }
    return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer.json: pre_tokenizer %s is not supported",
                       type);
}

/* ---- decoders ----------------------------------------------------------------------- */
void tok_dec_free(struct tok_dec *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n_kids; i++) {
        struct tok_dec *k = &d->kids[i];
        for (size_t j = 0; j < k->n_kids; j++)
            tok_dec_free(&k->kids[j]);
        free(k->kids);
        free(k->str);
        tok_pattern_free(&k->pat);
    }
    free(d->kids);
    free(d->str);
    tok_pattern_free(&d->pat);
}

static inf_status_t dec_parse(const json_t *j, struct tok_dec *d, struct inf_err *err)
{
    memset(d, 0, sizeof *d);
    const char *type = jstr(j, "type", NULL);
    if (!type)
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: decoder without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr))
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Sequence without decoders");
        d->type = DEC_SEQ;
        d->kids = calloc(json_array_size(arr) + 1, sizeof *d->kids);
        if (!d->kids)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v)
        {
            inf_status_t st = dec_parse(v, &d->kids[i], err);
            d->n_kids = i + 1;
            if (st != INF_OK)
                return st;
        }
        return INF_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        d->type = DEC_BYTELEVEL;
        return INF_OK;
    }
    if (!strcmp(type, "ByteFallback")) {
        d->type = DEC_BYTEFALLBACK;
        return INF_OK;
    }
    if (!strcmp(type, "Fuse")) {
        d->type = DEC_FUSE;
        return INF_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        d->type = DEC_METASPACE;
        inf_status_t st = char_parse(j, "replacement", NULL, NULL, &d->repl_cp, err);
        return st != INF_OK ? st : prepend_parse(j, &d->prepend, err);
    }
    if (!strcmp(type, "Strip")) {
        d->type = DEC_STRIP;
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < 0)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Strip needs start and stop");
        d->start = (size_t)json_integer_value(a);
        d->stop = (size_t)json_integer_value(b);
        return char_parse(j, "content", NULL, NULL, &d->repl_cp, err);
    }
    if (!strcmp(type, "Replace")) {
        d->type = DEC_REPLACE;
        size_t l;
        const char *s = jstr(j, "content", &l);
        if (!s)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: Replace without content");
        d->str = dupn(s, l);
        d->str_len = l;
        if (!d->str)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        return pattern_parse(json_object_get(j, "pattern"), &d->pat, "Replace", err);
    }
    return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer.json: decoder %s is not supported", type);
}

/* ---- vocabulary ---------------------------------------------------------------------------- */
/* The vocab string of id: a copy in the pool (which was sized for all of
 * them, so earlier pointers stay valid). */
static inf_status_t vocab_token(tok_tokenizer_t *tok, int32_t id, const char *s, size_t n,
                                struct inf_err *err)
{
    if (id < 0 || id >= tok->n_ids)
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: token id %d out of range", id);
    if (tok->pool.n + n + 1 > tok->pool.cap)
        return inf_err_set(err, INF_E_INTERNAL, "tokenizer vocabulary pool overflow");
    char *p = tok->pool.p + tok->pool.n;
    tok_buf_put(&tok->pool, s, n);
    tok_buf_put(&tok->pool, "", 1);
    tok->id_str[id] = p;
    tok->id_len[id] = (uint32_t)n;
    if (!tok_strmap_put(&tok->vocab, p, n, id))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    return INF_OK;
}

static inf_status_t merges_build(tok_tokenizer_t *tok, const json_t *merges, struct inf_err *err)
{
    size_t n = json_array_size(merges);
    size_t slots = 16;
    while (slots < n * 2 + 16)
        slots *= 2;
    tok->merges.slots = calloc(slots, sizeof *tok->merges.slots);
    if (!tok->merges.slots)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    tok->merges.mask = slots - 1;
    struct tok_buf cat = {0};
    inf_status_t st = INF_OK;
    for (size_t r = 0; r < n; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t l = json_string_length(m);
            const char *sp = memchr(s, ' ', l);
            if (!sp) {
                st = inf_err_set(err, INF_E_FORMAT, "tokenizer.json: merge %zu is not \"a b\"", r);
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = l - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            al = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            st = inf_err_set(err, INF_E_FORMAT, "tokenizer.json: merge %zu is malformed", r);
            break;
        }
        int32_t ia = tok_strmap_get(&tok->vocab, a, al),
                ib = tok_strmap_get(&tok->vocab, b, bl);
        cat.n = 0;
        if (!tok_buf_put(&cat, a, al) || !tok_buf_put(&cat, b, bl)) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            break;
        }
        int32_t ic = tok_strmap_get(&tok->vocab, cat.p, cat.n);
        if (ia < 0 || ib < 0 || ic < 0) {
            st = inf_err_set(err, INF_E_FORMAT,
                             "tokenizer.json: merge %zu uses a token outside the vocabulary", r);
            break;
        }
        uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
        size_t h = tok_hash(&key, sizeof key) & tok->merges.mask;
        while (tok->merges.slots[h].key && tok->merges.slots[h].key != key)
            h = (h + 1) & tok->merges.mask;
        if (!tok->merges.slots[h].key)
            tok->merges.n++;
        tok->merges.slots[h] = (struct tok_merge_slot){.key = key, .rank = (uint32_t)r, .id = ic};
    }
    tok_buf_fini(&cat);
    return st;
}

static inf_status_t model_parse(tok_tokenizer_t *tok, const json_t *model, const json_t *added,
                                struct inf_err *err)
{
    if (!json_is_object(model))
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: no model");
    const char *type = jstr(model, "type", NULL);
    if (type && strcmp(type, "BPE"))
        return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer.json: model %s is not supported",
                           type);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: BPE model needs vocab and merges");
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");

    /* Size: one past the largest id of vocab and added tokens. */
    int64_t max_id = -1;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX - 1)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: bad vocab id");
        if (json_integer_value(v) > max_id)
            max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > INT32_MAX - 1)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: bad added token id");
        if (json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
    }
    /* The pool is sized once: the vocab map's keys point into it. */
    size_t pool_bytes = 16;
    json_object_keylen_foreach((json_t *)vocab, key, klen, v) pool_bytes += klen + 1;
    if (!tok_buf_reserve(&tok->pool, pool_bytes))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    tok->n_ids = (int32_t)(max_id + 1);
    tok->id_str = calloc((size_t)tok->n_ids + 1, sizeof *tok->id_str);
    tok->id_len = malloc(((size_t)tok->n_ids + 1) * sizeof *tok->id_len);
    tok->is_special = calloc((size_t)tok->n_ids + 1, sizeof *tok->is_special);
    if (!tok->id_str || !tok->id_len || !tok->is_special ||
        !tok_strmap_init(&tok->vocab, json_object_size(vocab)))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (int32_t k = 0; k < tok->n_ids; k++)
        tok->id_len[k] = UINT32_MAX;
    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        inf_status_t st = vocab_token(tok, (int32_t)json_integer_value(v), key, klen, err);
        if (st != INF_OK)
            return st;
    }

    tok->byte_fallback = jbool(model, "byte_fallback", false);
    tok->fuse_unk = jbool(model, "fuse_unk", false);
    tok->ignore_merges = jbool(model, "ignore_merges", false);
    tok->unk_id = -1;
    size_t l;
    const char *s = jstr(model, "unk_token", &l);
    if (s) {
        tok->unk_id = tok_strmap_get(&tok->vocab, s, l);
        if (tok->unk_id < 0)
            return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: unk_token not in the vocab");
    }
    if ((s = jstr(model, "continuing_subword_prefix", &l)) && l) {
        tok->cont_prefix = dupn(s, l);
        tok->cont_prefix_len = l;
    }
    if ((s = jstr(model, "end_of_word_suffix", &l)) && l) {
        tok->eow_suffix = dupn(s, l);
        tok->eow_suffix_len = l;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_ids[b] = tok_strmap_get(&tok->vocab, name, 6);
    }
    return merges_build(tok, merges, err);
}

/* ---- added tokens -------------------------------------------------------------------------------
 */
static int cmp_added;
static const struct tok_added *cmp_base;

static int added_cmp(const void *pa, const void *pb)
{
    const struct tok_added *a = &cmp_base[*(const uint32_t *)pa];
    const struct tok_added *b = &cmp_base[*(const uint32_t *)pb];
    const char *as = cmp_added ? a->norm : a->content, *bs = cmp_added ? b->norm : b->content;
    size_t al = cmp_added ? a->norm_len : a->len, bl = cmp_added ? b->norm_len : b->len;
    if ((unsigned char)as[0] != (unsigned char)bs[0])
        return (unsigned char)as[0] < (unsigned char)bs[0] ? -1 : 1;
    if (al != bl)
        return al > bl ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

static inf_status_t matcher_build(tok_tokenizer_t *tok, struct tok_matcher *m, bool normalized,
                                  struct inf_err *err)
{
    m->order = malloc((tok->n_added + 1) * sizeof *m->order);
    if (!m->order)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    m->n = 0;
    for (size_t i = 0; i < tok->n_added; i++) {
        const struct tok_added *a = &tok->added[i];
        if (a->normalized == normalized && (normalized ? a->norm_len : a->len) > 0)
            m->order[m->n++] = (uint32_t)i;
    }
    pthread_mutex_lock(&sort_lock);
    cmp_added = normalized;
    cmp_base = tok->added;
    qsort(m->order, m->n, sizeof *m->order, added_cmp);
    pthread_mutex_unlock(&sort_lock);
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        m->first[b] = (uint32_t)k;
        while (k < m->n) {
            const struct tok_added *a = &tok->added[m->order[k]];
            unsigned char c = (unsigned char)(normalized ? a->norm[0] : a->content[0]);
            if (c != b)
                break;
            k++;
        }
    }
    m->first[256] = (uint32_t)k;
    return INF_OK;
}

static inf_status_t added_parse(tok_tokenizer_t *tok, const json_t *added, struct inf_err *err)
{
    size_t n = json_array_size(added);
    tok->added = calloc(n + 1, sizeof *tok->added);
    if (!tok->added || !tok_strmap_init(&tok->added_map, n))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    struct tok_buf nb = {0}, tmp = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    inf_status_t st = md ? INF_OK : inf_err_set(err, INF_E_NOMEM, "out of memory");
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v)
    {
        if (st != INF_OK)
            break;
        struct tok_added *a = &tok->added[tok->n_added];
        size_t l;
        const char *s = jstr(v, "content", &l);
        if (!s) {
            st = inf_err_set(err, INF_E_FORMAT, "tokenizer.json: added token without content");
            break;
        }
        a->content = dupn(s, l);
        a->len = l;
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->special = jbool(v, "special", false);
        a->lstrip = jbool(v, "lstrip", false);
        a->rstrip = jbool(v, "rstrip", false);
        a->single_word = jbool(v, "single_word", false);
        a->normalized = jbool(v, "normalized", !a->special);
        tok->n_added++;
        if (!a->content) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            break;
        }
        nb.n = 0;
        if (a->normalized && tok->norm) {
            if (!tok_normalize(tok->norm, s, l, &nb, &tmp, md)) {
                st = inf_err_set(err, INF_E_NOMEM, "out of memory");
                break;
            }
        } else if (!tok_buf_put(&nb, s, l)) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            break;
        }
        a->norm = dupn(nb.p ? nb.p : "", nb.n);
        a->norm_len = nb.n;
        if (!a->norm || !tok_strmap_put(&tok->added_map, a->content, a->len, a->id)) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            break;
        }
        /* The reference keeps a normalized token's normalized form: that is
         * what decoding it gives. */
        tok->id_str[a->id] = a->normalized ? a->norm : a->content;
        tok->id_len[a->id] = (uint32_t)(a->normalized ? a->norm_len : a->len);
        tok->is_special[a->id] = a->special;
    }
    tok_buf_fini(&nb);
    tok_buf_fini(&tmp);
    pcre2_match_data_free(md);
    if (st == INF_OK)
        st = matcher_build(tok, &tok->match_raw, false, err);
    if (st == INF_OK)
        st = matcher_build(tok, &tok->match_norm, true, err);
    return st;
}

/* ---- post-processor
 * ------------------------------------------------------------------------------ */
static inf_status_t template_parse(tok_tokenizer_t *tok, const json_t *j, struct inf_err *err)
{
    if (tok->tmpl)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "tokenizer.json: more than one TemplateProcessing");
    json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single))
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: TemplateProcessing without single");
    tok->tmpl = calloc(json_array_size(single) + 1, sizeof *tok->tmpl);
    if (!tok->tmpl)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item)
    {
        struct tok_tmpl_item *t = &tok->tmpl[tok->n_tmpl++];
        json_t *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            t->is_seq = true;
            continue;
        }
        const char *name = sp ? jstr(sp, "id", NULL) : NULL;
        json_t *def = name ? json_object_get(specials, name) : NULL;
        json_t *ids = def ? json_object_get(def, "ids") : NULL;
        if (!json_is_array(ids))
            return inf_err_set(err, INF_E_FORMAT,
                               "tokenizer.json: template special token without ids");
        t->ids = calloc(json_array_size(ids) + 1, sizeof *t->ids);
        if (!t->ids)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        size_t k;
        json_t *idv;
        json_array_foreach(ids, k, idv)
        {
            if (!json_is_integer(idv) || json_integer_value(idv) < 0 ||
                json_integer_value(idv) >= tok->n_ids)
                return inf_err_set(err, INF_E_FORMAT,
                                   "tokenizer.json: template special id out of range");
            t->ids[t->n_ids++] = (int32_t)json_integer_value(idv);
        }
    }
    return INF_OK;
}

static inf_status_t post_parse(tok_tokenizer_t *tok, const json_t *j, struct inf_err *err)
{
    const char *type = jstr(j, "type", NULL);
    if (!type)
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: post_processor without a type");
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(j, "processors"), i, v)
        {
            inf_status_t st = post_parse(tok, v, err);
            if (st != INF_OK)
                return st;
        }
        return INF_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        return INF_OK; /* only trims offsets; ids are unchanged */
    if (!strcmp(type, "TemplateProcessing"))
        return template_parse(tok, j, err);
    return inf_err_set(err, INF_E_UNSUPPORTED, "tokenizer.json: post_processor %s is not supported",
                       type);
}

/* ---- tokenizer_config.json
 * ------------------------------------------------------------------------- */
static int32_t config_token(const tok_tokenizer_t *tok, const json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return -1;
    size_t l = json_string_length(v);
    const char *s = json_string_value(v);
    int32_t id = tok_strmap_get(&tok->added_map, s, l);
    return id >= 0 ? id : tok_strmap_get(&tok->vocab, s, l);
}

/* ---- entry points
 * ------------------------------------------------------------------------------------- */
inf_status_t tok_load_json(const char *text, size_t len, const char *config_text,
                               size_t config_len, tok_tokenizer_t **out, struct inf_err *err)
{
    tok_bytelevel_init();
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_FLAGS, &je);
    json_t *cfg = NULL;
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return inf_err_set(err, INF_E_FORMAT, "tokenizer.json: line %d: %s", je.line, je.text);
    }
    if (config_text) {
        cfg = json_loadb(config_text, config_len, JSON_FLAGS | JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg || !json_is_object(cfg)) {
            json_decref(root);
            json_decref(cfg);
            return inf_err_set(err, INF_E_FORMAT, "tokenizer_config.json: line %d: %s", je.line,
                               je.text);
        }
    }
    inf_status_t st = INF_OK;
    tok_tokenizer_t *tok = calloc(1, sizeof *tok);
    if (!tok) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto fail_json;
    }
    pthread_mutex_init(&tok->cache_lock, NULL);
    tok->bos_id = tok->eos_id = tok->pad_id = -1;
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        st = inf_err_set(err, INF_E_FORMAT, "tokenizer.json: added_tokens is not a list");
        goto fail;
    }
    if (!json_is_array(added))
        added = NULL;
    if ((st = model_parse(tok, json_object_get(root, "model"), added, err)) != INF_OK)
        goto fail;
    json_t *j;
    if (json_is_object(j = json_object_get(root, "normalizer"))) {
        if (!(tok->norm = calloc(1, sizeof *tok->norm))) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = norm_parse(j, tok->norm, err)) != INF_OK)
            goto fail;
    }
    if (json_is_object(j = json_object_get(root, "pre_tokenizer"))) {
        if (!(tok->pretok = calloc(1, sizeof *tok->pretok))) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = pretok_parse(j, tok->pretok, err)) != INF_OK)
            goto fail;
    }
    if (json_is_object(j = json_object_get(root, "decoder"))) {
        if (!(tok->dec = calloc(1, sizeof *tok->dec))) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = dec_parse(j, tok->dec, err)) != INF_OK)
            goto fail;
    }
    if (json_is_object(j = json_object_get(root, "post_processor"))) {
        tok->has_post = true;
        if ((st = post_parse(tok, j, err)) != INF_OK)
            goto fail;
    }
    if (added && (st = added_parse(tok, added, err)) != INF_OK)
        goto fail;
    if (!added) {
        tok_strmap_init(&tok->added_map, 0);
        if ((st = matcher_build(tok, &tok->match_raw, false, err)) != INF_OK ||
            (st = matcher_build(tok, &tok->match_norm, true, err)) != INF_OK)
            goto fail;
    }
    if (!json_is_null(json_object_get(root, "truncation")) && json_object_get(root, "truncation"))
        inf_log(WARN, "tokenizer.json: truncation settings ignored");
    if (!json_is_null(json_object_get(root, "padding")) && json_object_get(root, "padding"))
        inf_log(WARN, "tokenizer.json: padding settings ignored");
    if (!(tok->cache = calloc(TOK_CACHE_SLOTS, sizeof *tok->cache))) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto fail;
    }
    if (cfg) {
        tok->bos_id = config_token(tok, cfg, "bos_token");
        tok->eos_id = config_token(tok, cfg, "eos_token");
        tok->pad_id = config_token(tok, cfg, "pad_token");
    }
    json_decref(root);
    json_decref(cfg);
    *out = tok;
    return INF_OK;
fail:
    tok_destroy(tok);
fail_json:
    json_decref(root);
    json_decref(cfg);
    return st;
}

static inf_status_t read_file(const char *path, char **text, size_t *len, struct inf_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        inf_log(ERROR, "cannot open %s: %s", path, strerror(errno));
        return inf_err_set(err, INF_E_IO, "cannot open the tokenizer file");
    }
    struct tok_buf b = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (!tok_buf_put(&b, chunk, got)) {
            fclose(f);
            tok_buf_fini(&b);
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        tok_buf_fini(&b);
        return inf_err_set(err, INF_E_IO, "cannot read the tokenizer file");
    }
    if (!tok_buf_put(&b, "", 1)) {
        tok_buf_fini(&b);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    *text = b.p;
    *len = b.n - 1;
    return INF_OK;
}

inf_status_t tok_load_files(const char *tokenizer_json, const char *config_path,
                                tok_tokenizer_t **out, struct inf_err *err)
{
    char *t = NULL, *c = NULL;
    size_t tl = 0, cl = 0;
    inf_status_t st = read_file(tokenizer_json, &t, &tl, err);
    if (st == INF_OK && config_path)
        st = read_file(config_path, &c, &cl, err);
    if (st == INF_OK)
        st = tok_load_json(t, tl, c, cl, out, err);
    free(t);
    free(c);
    return st;
}

inf_status_t tok_load(const char *dir, tok_tokenizer_t **out, struct inf_err *err)
{
    size_t n = strlen(dir);
    char *tj = malloc(n + 32), *cj = malloc(n + 32);
    if (!tj || !cj) {
        free(tj);
        free(cj);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    snprintf(tj, n + 32, "%s/tokenizer.json", dir);
    snprintf(cj, n + 32, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(cj, "rb");
    if (f)
        fclose(f);
    inf_status_t st = tok_load_files(tj, f ? cj : NULL, out, err);
    free(tj);
    free(cj);
    return st;
}

void tok_destroy(tok_tokenizer_t *tok)
{
    if (!tok)
        return;
    tok_buf_fini(&tok->pool);
    free(tok->id_str);
    free(tok->id_len);
    free(tok->is_special);
    tok_strmap_fini(&tok->vocab);
    tok_strmap_fini(&tok->added_map);
    free(tok->merges.slots);
    free(tok->cont_prefix);
    free(tok->eow_suffix);
    tok_norm_free(tok->norm);
    free(tok->norm);
    tok_pretok_free(tok->pretok);
    free(tok->pretok);
    tok_dec_free(tok->dec);
    free(tok->dec);
    for (size_t i = 0; i < tok->n_tmpl; i++)
        free(tok->tmpl[i].ids);
    free(tok->tmpl);
    for (size_t i = 0; i < tok->n_added; i++) {
        free(tok->added[i].content);
        free(tok->added[i].norm);
    }
    free(tok->added);
    free(tok->match_raw.order);
    free(tok->match_norm.order);
    free(tok->cache);
    pthread_mutex_destroy(&tok->cache_lock);
    free(tok);
}

int32_t tok_vocab_size(const tok_tokenizer_t *tok)
{
    return tok->n_ids;
}

const char *tok_id_to_token(const tok_tokenizer_t *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_ids || tok->id_len[id] == UINT32_MAX)
        return NULL;
    return tok->id_str[id];
}

int32_t tok_token_to_id(const tok_tokenizer_t *tok, const char *token)
{
    size_t l = strlen(token);
    int32_t id = tok_strmap_get(&tok->added_map, token, l);
    return id >= 0 ? id : tok_strmap_get(&tok->vocab, token, l);
}

bool tok_is_special(const tok_tokenizer_t *tok, int32_t id)
{
    return id >= 0 && id < tok->n_ids && tok->is_special[id];
}

int32_t tok_bos_id(const tok_tokenizer_t *tok)
{
    return tok->bos_id;
}

int32_t tok_eos_id(const tok_tokenizer_t *tok)
{
    return tok->eos_id;
}

int32_t tok_pad_id(const tok_tokenizer_t *tok)
{
    return tok->pad_id;
}
