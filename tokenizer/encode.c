/* tokenizer/encode.c — text to ids: added-token matching, normalizers,
 * pre-tokenizers, the BPE model (merges by rank through a binary heap over a
 * linked list of symbols) with a cache of recent words, and the
 * post-processor. Scratch memory lives for one call and only grows, so the
 * per-token loop does not allocate. */
#include "tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct seg {
    size_t off, len;
    int32_t id; /* added token id, or -1 for text */
};

struct seglist {
    struct seg *s;
    size_t n, cap;
};

struct range {
    size_t s, e;
    bool match;
};

struct heap_item {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
};

struct enc {
    struct tok_buf norm, tmp, key;
    struct tok_list la, lb;
    struct seglist raw, sub;
    struct range *rng;
    size_t rng_n, rng_cap;
    pcre2_match_data *md;
    /* BPE word state */
    int32_t *sym;
    int32_t *prev, *next;
    struct heap_item *heap;
    size_t sym_cap, heap_cap;
};

static void enc_fini(struct enc *e)
{
    tok_buf_fini(&e->norm);
    tok_buf_fini(&e->tmp);
    tok_buf_fini(&e->key);
    tok_list_fini(&e->la);
    tok_list_fini(&e->lb);
    free(e->raw.s);
    free(e->sub.s);
    free(e->rng);
    if (e->md)
        pcre2_match_data_free(e->md);
    free(e->sym);
    free(e->prev);
    free(e->next);
    free(e->heap);
}

static bool seg_push(struct seglist *l, size_t off, size_t len, int32_t id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        struct seg *s = realloc(l->s, cap * sizeof *s);
        if (!s)
            return false;
        l->s = s;
        l->cap = cap;
    }
    l->s[l->n++] = (struct seg){off, len, id};
    return true;
}

static bool rng_push(struct enc *e, size_t s, size_t end, bool match)
{
    if (e->rng_n == e->rng_cap) {
        size_t cap = e->rng_cap ? e->rng_cap * 2 : 64;
        struct range *r = realloc(e->rng, cap * sizeof *r);
        if (!r)
            return false;
        e->rng = r;
        e->rng_cap = cap;
    }
    e->rng[e->rng_n++] = (struct range){s, end, match};
    return true;
}

static bool ids_push(struct tok_ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *p = realloc(o->ids, cap * sizeof *p);
        if (!p)
            return false;
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return true;
}

void tok_ids_fini(struct tok_ids *ids)
{
    if (!ids)
        return;
    free(ids->ids);
    memset(ids, 0, sizeof *ids);
}

struct tok_encode_opts tok_encode_defaults(void)
{
    return (struct tok_encode_opts){.add_special = true, .parse_special = true};
}

/* ---- added tokens ------------------------------------------------------------ */
static bool last_char_is_word(const char *s, size_t n)
{
    if (n == 0)
        return false;
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    uint32_t cp;
    tok_utf8_decode(s + i, &cp);
    return tok_is_alnum(cp);
}

static bool first_char_is_word(const char *s, size_t n)
{
    if (n == 0)
        return false;
    uint32_t cp;
    tok_utf8_decode(s, &cp);
    return tok_is_alnum(cp);
}

/* Split s[0..n) on the added tokens of m, as the reference's
 * AddedVocabulary::find_matches: leftmost-longest matches; a special token
 * when !parse_special, or a single_word token inside a word, is skipped
 * (left as text); lstrip/rstrip take the whitespace around into the match. */
static bool split_added(const tok_tokenizer_t *tok, const struct tok_matcher *m, bool normalized,
                        bool parse_special, const char *s, size_t n, struct seglist *out)
{
    out->n = 0;
    size_t start_off = 0, i = 0;
    while (m->n && i < n) {
        unsigned char c = (unsigned char)s[i];
        uint32_t lo = m->first[c], hi = m->first[c + 1];
        const struct tok_added *hit = NULL;
        for (uint32_t k = lo; k < hi; k++) {
            const struct tok_added *a = &tok->added[m->order[k]];
            const char *t = normalized ? a->norm : a->content;
            size_t tl = normalized ? a->norm_len : a->len;
            if (tl <= n - i && memcmp(s + i, t, tl) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + (normalized ? hit->norm_len : hit->len);
        i = stop;
        if (!parse_special && hit->special)
            continue;
        if (hit->single_word) {
            bool start_space = start == 0 || !last_char_is_word(s, start);
            bool stop_space = stop == n || !first_char_is_word(s + stop, n - stop);
            if (!start_space || !stop_space)
                continue;
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                uint32_t cp;
                tok_utf8_decode(s + p, &cp);
                if (!tok_is_whitespace(cp))
                    break;
                ns = p;
            }
            start = ns > start_off ? ns : start_off;
        }
        if (hit->rstrip) {
            while (stop < n) {
                uint32_t cp;
                size_t l = tok_utf8_decode(s + stop, &cp);
                if (!tok_is_whitespace(cp))
                    break;
                stop += l;
            }
        }
        if (start_off < start && !seg_push(out, start_off, start - start_off, -1))
            return false;
        if (!seg_push(out, start, stop - start, hit->id))
            return false;
        start_off = stop;
        if (i < stop)
            i = stop;
    }
    if (start_off < n && !seg_push(out, start_off, n - start_off, -1))
        return false;
    return true;
}

/* ---- normalizers ------------------------------------------------------------------ */
static bool is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

static bool unicode_normalize(enum tok_norm_type t, const char *s, size_t n, struct tok_buf *out)
{
    if (is_ascii(s, n))
        return tok_buf_put(out, s, n);
    utf8proc_option_t opt = UTF8PROC_STABLE;
    if (t == NORM_NFC)
        opt |= UTF8PROC_COMPOSE;
    else if (t == NORM_NFKC)
        opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (t == NORM_NFD)
        opt |= UTF8PROC_DECOMPOSE;
    else
        opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_ssize_t need =
        utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, NULL, 0, opt);
    if (need < 0)
        return false;
    utf8proc_int32_t *buf = malloc(((size_t)need + 1) * sizeof *buf);
    if (!buf)
        return false;
    utf8proc_ssize_t got =
        utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, buf, need, opt);
    bool ok = got >= 0 && got <= need;
    if (ok) {
        utf8proc_ssize_t len = utf8proc_reencode(buf, got, opt);
        ok = len >= 0 && tok_buf_put(out, buf, (size_t)len);
    }
    free(buf);
    return ok;
}

static bool replace_all(const struct tok_pattern *pat, const char *rep, size_t rep_len,
                        const char *s, size_t n, struct tok_buf *out, pcre2_match_data *md)
{
    size_t pos = 0, ms, me;
    int r;
    while ((r = tok_pattern_next(pat, s, n, pos, md, &ms, &me)) == 1) {
        if (me == ms) {
            /* an empty match replaces nothing; step over one character */
            if (ms >= n)
                break;
            size_t l = tok_utf8_len((unsigned char)s[ms]);
            if (!tok_buf_put(out, s + pos, ms + l - pos))
                return false;
            pos = ms + l;
            continue;
        }
        if (!tok_buf_put(out, s + pos, ms - pos) || !tok_buf_put(out, rep, rep_len))
            return false;
        pos = me;
    }
    if (r < 0)
        return false;
    return tok_buf_put(out, s + pos, n - pos);
}

bool tok_normalize(const struct tok_norm *norm, const char *s, size_t n, struct tok_buf *out,
                       struct tok_buf *tmp, pcre2_match_data *md)
{
    switch (norm->type) {
    case NORM_SEQ: {
        /* Ping-pong between out and tmp; each step reads a private copy. */
        size_t base = out->n;
        if (!tok_buf_put(out, s, n))
            return false;
        for (size_t i = 0; i < norm->n_kids; i++) {
            tmp->n = 0;
            if (!tok_buf_put(tmp, out->p + base, out->n - base))
                return false;
            out->n = base;
            /* only a nested Sequence needs scratch of its own */
            struct tok_buf inner = {0};
            bool ok =
                tok_normalize(&norm->kids[i], tmp->p ? tmp->p : "", tmp->n, out, &inner, md);
            tok_buf_fini(&inner);
            if (!ok)
                return false;
        }
        return true;
    }
    case NORM_PREPEND:
        if (n == 0)
            return true;
        return tok_buf_put(out, norm->str, norm->str_len) && tok_buf_put(out, s, n);
    case NORM_REPLACE:
        return replace_all(&norm->pat, norm->str, norm->str_len, s, n, out, md);
    default:
        return unicode_normalize(norm->type, s, n, out);
    }
}

/* ---- pre-tokenizers -------------------------------------------------------------------- */
/* Fold the ranges of one piece by behaviour and push the kept, non-empty ones. */
static bool fold_push(struct enc *e, enum tok_split_behavior b, const char *s, bool at_start,
                      struct tok_list *out)
{
    struct range *r = e->rng;
    size_t n = e->rng_n, k = 0;
    /* Fold in place into r[0..k). */
    switch (b) {
    case SPLIT_ISOLATED:
    case SPLIT_REMOVED:
        k = n;
        break;
    case SPLIT_CONTIGUOUS: {
        bool prev = false;
        for (size_t i = 0; i < n; i++) {
            bool m = r[i].match;
            if (m == prev && k > 0)
                r[k - 1].e = r[i].e;
            else
                r[k++] = (struct range){r[i].s, r[i].e, false};
            prev = m;
        }
        break;
    }
    case SPLIT_MERGED_PREV: {
        bool prev = false;
        for (size_t i = 0; i < n; i++) {
            bool m = r[i].match;
            if (m && !prev && k > 0)
                r[k - 1].e = r[i].e;
            else
                r[k++] = (struct range){r[i].s, r[i].e, false};
            prev = m;
        }
        break;
    }
    case SPLIT_MERGED_NEXT: {
        /* Walk backwards, merging a match into the piece after it. */
        bool prev = false;
        size_t w = n; /* folded ranges written at r[w..n) going down */
        for (size_t i = n; i-- > 0;) {
            bool m = r[i].match;
            struct range cur = r[i];
            if (m && !prev && w < n)
                r[w].s = cur.s;
            else
                r[--w] = (struct range){cur.s, cur.e, false};
            prev = m;
        }
        memmove(r, r + w, (n - w) * sizeof *r);
        k = n - w;
        break;
    }
    }
    for (size_t i = 0; i < k; i++) {
        if (b == SPLIT_REMOVED && r[i].match)
            continue;
        if (r[i].e > r[i].s &&
            !tok_list_push(out, s + r[i].s, r[i].e - r[i].s, at_start && r[i].s == 0))
            return false;
    }
    return true;
}

/* Ranges of s as the reference's Pattern::find_matches: alternating
 * non-matches and matches covering s. */
static int pattern_ranges(struct enc *e, const struct tok_pattern *pat, const char *s, size_t n,
                          bool invert)
{
    e->rng_n = 0;
    if (n == 0)
        return rng_push(e, 0, 0, invert) ? 0 : -2;
    size_t prev = 0, pos = 0, ms, me;
    int r = 0;
    while (pos <= n && (r = tok_pattern_next(pat, s, n, pos, e->md, &ms, &me)) == 1) {
        if (me == ms) {
            /* Empty match: recorded (it is dropped as empty), then step on. */
            if (prev != ms && !rng_push(e, prev, ms, invert))
                return -2;
            if (!rng_push(e, ms, ms, !invert))
                return -2;
            prev = ms;
            if (ms >= n)
                break;
            pos = ms + tok_utf8_len((unsigned char)s[ms]);
            continue;
        }
        if (prev != ms && !rng_push(e, prev, ms, invert))
            return -2;
        if (!rng_push(e, ms, me, !invert))
            return -2;
        prev = pos = me;
    }
    if (pos <= n && r < 0)
        return -1;
    if (prev != n && !rng_push(e, prev, n, invert))
        return -2;
    return 0;
}

static int digit_ranges(struct enc *e, const char *s, size_t n)
{
    e->rng_n = 0;
    if (n == 0)
        return rng_push(e, 0, 0, false) ? 0 : -2;
    size_t last = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = tok_utf8_decode(s + i, &cp);
        if (tok_is_numeric(cp)) {
            if (last < i && !rng_push(e, last, i, false))
                return -2;
            if (!rng_push(e, i, i + l, true))
                return -2;
            last = i + l;
        }
        i += l;
    }
    if (last < n && !rng_push(e, last, n, false))
        return -2;
    return 0;
}

/* Apply one pre-tokenizer to every piece of in, writing out. Returns 0, -1 on
 * a regex failure, -2 on out of memory. */
static int pretok_apply(const struct tok_pretok *p, struct enc *e, struct tok_list *in,
                        struct tok_list *out)
{
    tok_list_clear(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->b.p + in->p[i].off;
        size_t n = in->p[i].len;
        bool at = in->p[i].at_start;
        int rc = 0;
        switch (p->type) {
        case PT_SEQ:
            break;
        case PT_SPLIT:
            rc = pattern_ranges(e, &p->pat, s, n, p->invert);
            if (rc == 0 && !fold_push(e, p->behavior, s, at, out))
                rc = -2;
            break;
        case PT_DIGITS:
            rc = digit_ranges(e, s, n);
            if (rc == 0 &&
                !fold_push(e, p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, s, at, out))
                rc = -2;
            break;
        case PT_METASPACE: {
            struct tok_buf *t = &e->tmp;
            t->n = 0;
            bool starts = n >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0;
            /* ' ' becomes the replacement first; the prepend check sees that. */
            if (n > 0 && s[0] == ' ')
                starts = true;
            bool prep =
                (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at)) && !starts;
            if (prep && !tok_buf_put(t, p->repl, p->repl_len))
                return -2;
            for (size_t k = 0; k < n; k++) {
                bool ok = s[k] == ' ' ? tok_buf_put(t, p->repl, p->repl_len)
                                      : tok_buf_put(t, s + k, 1);
                if (!ok)
                    return -2;
            }
            if (!p->split) {
                if (t->n && !tok_list_push(out, t->p, t->n, at))
                    return -2;
                break;
            }
            /* split on the replacement, MergedWithNext */
            e->rng_n = 0;
            size_t last = 0, k = 0;
            while (k < t->n) {
                if (t->n - k >= p->repl_len && memcmp(t->p + k, p->repl, p->repl_len) == 0) {
                    if (last < k && !rng_push(e, last, k, false))
                        return -2;
                    if (!rng_push(e, k, k + p->repl_len, true))
                        return -2;
                    k += p->repl_len;
                    last = k;
                } else
                    k++;
            }
            if (last < t->n && !rng_push(e, last, t->n, false))
                return -2;
            if (!fold_push(e, SPLIT_MERGED_NEXT, t->p, at, out))
                return -2;
            break;
        }
        case PT_BYTELEVEL: {
            struct tok_buf *t = &e->tmp;
            t->n = 0;
            if (p->add_prefix_space && (n == 0 || s[0] != ' ') && !tok_buf_put(t, " ", 1))
                return -2;
            if (!tok_buf_put(t, s, n))
                return -2;
            const char *ts = t->p;
            size_t tn = t->n;
            if (p->use_regex) {
                rc = pattern_ranges(e, &p->pat, ts, tn, false);
                if (rc != 0)
                    return rc;
            } else {
                e->rng_n = 0;
                if (!rng_push(e, 0, tn, false))
                    return -2;
            }
            for (size_t r = 0; r < e->rng_n; r++) {
                size_t a = e->rng[r].s, b = e->rng[r].e;
                if (a == b)
                    continue;
                if (!tok_list_push_empty(out, at && a == 0) ||
                    !tok_buf_reserve(&out->b, (b - a) * 2))
                    return -2;
                char *w = out->b.p + out->b.n;
                size_t wn = 0;
                for (size_t q = a; q < b; q++) {
                    unsigned char c = (unsigned char)ts[q];
                    memcpy(w + wn, tok_bl.enc[c], tok_bl.enc_len[c]);
                    wn += tok_bl.enc_len[c];
                }
                out->b.n += wn;
                out->p[out->n - 1].len = (uint32_t)wn;
            }
            break;
        }
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int pretokenize(const struct tok_pretok *p, struct enc *e, struct tok_list **cur)
{
    if (p->type == PT_SEQ) {
        for (size_t i = 0; i < p->n_kids; i++) {
            int rc = pretokenize(&p->kids[i], e, cur);
            if (rc)
                return rc;
        }
        return 0;
    }
    struct tok_list *out = *cur == &e->la ? &e->lb : &e->la;
    int rc = pretok_apply(p, e, *cur, out);
    *cur = out;
    return rc;
}

/* ---- BPE
 * -------------------------------------------------------------------------------------------- */
static bool merge_get(const tok_tokenizer_t *tok, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t h = tok_hash(&key, sizeof key) & tok->merges.mask;
    for (;;) {
        const struct tok_merge_slot *s = &tok->merges.slots[h];
        if (!s->key)
            return false;
        if (s->key == key) {
            *rank = s->rank;
            *id = s->id;
            return true;
        }
        h = (h + 1) & tok->merges.mask;
    }
}

static inline bool heap_less(const struct heap_item *a, const struct heap_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n)
{
    struct heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static bool bpe_reserve(struct enc *e, size_t n)
{
    if (n + 1 > e->sym_cap) {
        size_t cap = (n + 1) * 2;
        int32_t *a = realloc(e->sym, cap * sizeof *a);
        if (!a)
            return false;
        e->sym = a;
        if (!(a = realloc(e->prev, cap * sizeof *a)))
            return false;
        e->prev = a;
        if (!(a = realloc(e->next, cap * sizeof *a)))
            return false;
        e->next = a;
        e->sym_cap = cap;
    }
    if (3 * n + 4 > e->heap_cap) {
        size_t cap = 6 * n + 8;
        struct heap_item *h = realloc(e->heap, cap * sizeof *h);
        if (!h)
            return false;
        e->heap = h;
        e->heap_cap = cap;
    }
    return true;
}

/* Symbols of the word before any merge, as the reference's merge_word. */
static bool bpe_symbols(const tok_tokenizer_t *tok, struct enc *e, const char *s, size_t n, size_t *out_n)
{
    size_t ns = 0;
    int32_t unk_pending = -1; /* fused unk in progress (index into sym) */
    for (size_t i = 0; i < n;) {
        size_t l = tok_utf8_len((unsigned char)s[i]);
        if (l > n - i)
            l = n - i;
        int32_t id;
        bool pre = tok->cont_prefix && i > 0, suf = tok->eow_suffix && i + l == n;
        if (!pre && !suf)
            id = tok_strmap_get(&tok->vocab, s + i, l);
        else {
            e->key.n = 0;
            if ((pre && !tok_buf_put(&e->key, tok->cont_prefix, tok->cont_prefix_len)) ||
                !tok_buf_put(&e->key, s + i, l) ||
                (suf && !tok_buf_put(&e->key, tok->eow_suffix, tok->eow_suffix_len)))
                return false;
            id = tok_strmap_get(&tok->vocab, e->key.p, e->key.n);
        }
        if (id >= 0) {
            e->sym[ns++] = id;
            unk_pending = -1;
        } else {
            bool done = false;
            if (tok->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < l; k++)
                    all = all && tok->byte_ids[(unsigned char)s[i + k]] >= 0;
                if (all) {
                    for (size_t k = 0; k < l; k++)
                        e->sym[ns++] = tok->byte_ids[(unsigned char)s[i + k]];
                    done = true;
                    unk_pending = -1;
                }
            }
            if (!done && tok->unk_id >= 0) {
                if (tok->fuse_unk && unk_pending >= 0)
                    ; /* extends the previous unk */
                else {
                    unk_pending = (int32_t)ns;
                    e->sym[ns++] = tok->unk_id;
                }
            }
        }
        i += l;
    }
    *out_n = ns;
    return true;
}

static bool bpe_word(tok_tokenizer_t *tok, struct enc *e, const char *s, size_t n,
                     struct tok_ids *out)
{
    if (tok->ignore_merges) {
        int32_t id = tok_strmap_get(&tok->vocab, s, n);
        if (id >= 0)
            return ids_push(out, id);
    }
    /* byte fallback can make up to 4 symbols per character: n bytes bound it */
    if (!bpe_reserve(e, n))
        return false;
    size_t ns;
    if (!bpe_symbols(tok, e, s, n, &ns))
        return false;
    int32_t *sym = e->sym, *prev = e->prev, *next = e->next;
    for (size_t i = 0; i < ns; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        uint32_t rank;
        int32_t id;
        if (merge_get(tok, sym[i], sym[i + 1], &rank, &id))
            heap_push(e->heap, &hn, (struct heap_item){rank, (uint32_t)i, id});
    }
    while (hn) {
        struct heap_item top = heap_pop(e->heap, &hn);
        uint32_t pos = top.pos;
        if (sym[pos] < 0 || next[pos] < 0)
            continue;
        int32_t nx = next[pos];
        uint32_t rank;
        int32_t id;
        if (!merge_get(tok, sym[pos], sym[nx], &rank, &id) || id != top.id)
            continue;
        sym[pos] = id;
        sym[nx] = -1; /* removed */
        next[pos] = next[nx];
        if (next[nx] >= 0)
            prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0 && merge_get(tok, sym[prev[pos]], sym[pos], &rank, &id))
            heap_push(e->heap, &hn, (struct heap_item){rank, (uint32_t)prev[pos], id});
        if (next[pos] >= 0 && merge_get(tok, sym[pos], sym[next[pos]], &rank, &id))
            heap_push(e->heap, &hn, (struct heap_item){rank, pos, id});
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = next[i])
        if (!ids_push(out, sym[i]))
            return false;
    return true;
}

static bool bpe_cached(tok_tokenizer_t *tok, struct enc *e, const char *s, size_t n,
                       struct tok_ids *out)
{
    if (n == 0 || n > TOK_CACHE_KEY)
        return bpe_word(tok, e, s, n, out);
    uint64_t h = tok_hash(s, n);
    struct tok_cache_slot *slot = &tok->cache[h & (TOK_CACHE_SLOTS - 1)];
    /* Never wait for the lock: a busy cache only costs a recomputation. */
    if (pthread_mutex_trylock(&tok->cache_lock) == 0) {
        if (slot->hash == h && slot->key_len == n && memcmp(slot->key, s, n) == 0) {
            int32_t ids[TOK_CACHE_IDS];
            size_t k = slot->n_ids;
            memcpy(ids, slot->ids, k * sizeof *ids);
            pthread_mutex_unlock(&tok->cache_lock);
            for (size_t i = 0; i < k; i++)
                if (!ids_push(out, ids[i]))
                    return false;
            return true;
        }
        pthread_mutex_unlock(&tok->cache_lock);
    }
    size_t before = out->n;
    if (!bpe_word(tok, e, s, n, out))
        return false;
    size_t k = out->n - before;
    if (k <= TOK_CACHE_IDS && pthread_mutex_trylock(&tok->cache_lock) == 0) {
        slot->hash = h;
        slot->key_len = (uint8_t)n;
        slot->n_ids = (uint8_t)k;
        memcpy(slot->key, s, n);
        memcpy(slot->ids, out->ids + before, k * sizeof *out->ids);
        pthread_mutex_unlock(&tok->cache_lock);
    }
    return true;
}

/* ---- the pipeline
 * -------------------------------------------------------------------------------------- */
/* Normalized text t[0..n) (no added tokens left in it): pre-tokenize and run
 * the model on each piece. */
static inf_status_t encode_text(tok_tokenizer_t *tok, struct enc *e, const char *t, size_t n,
                                bool at_start, struct tok_ids *out, struct inf_err *err)
{
    if (n == 0)
        return INF_OK;
    struct tok_list *cur = &e->la;
    tok_list_clear(cur);
    if (!tok_list_push(cur, t, n, at_start))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    if (tok->pretok) {
        int rc = pretokenize(tok->pretok, e, &cur);
        if (rc == -1)
            return inf_err_set(err, INF_E_INTERNAL, "tokenizer regex failed");
        if (rc)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < cur->n; i++)
        if (!bpe_cached(tok, e, cur->b.p + cur->p[i].off, cur->p[i].len, out))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
    return INF_OK;
}

static inf_status_t encode_body(tok_tokenizer_t *tok, struct enc *e, const char *text, size_t len,
                                bool parse_special, struct tok_ids *out, struct inf_err *err)
{
    if (!split_added(tok, &tok->match_raw, false, parse_special, text, len, &e->raw))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    for (size_t i = 0; i < e->raw.n; i++) {
        struct seg sg = e->raw.s[i];
        if (sg.id >= 0) {
            if (!ids_push(out, sg.id))
                return inf_err_set(err, INF_E_NOMEM, "out of memory");
            continue;
        }
        const char *t = text + sg.off;
        size_t n = sg.len;
        if (tok->norm) {
            e->norm.n = 0;
            if (!tok_normalize(tok->norm, t, n, &e->norm, &e->tmp, e->md))
                return inf_err_set(err, INF_E_NOMEM, "normalization failed");
            t = e->norm.p ? e->norm.p : "";
            n = e->norm.n;
        }
        if (tok->match_norm.n == 0) {
            inf_status_t st = encode_text(tok, e, t, n, sg.off == 0, out, err);
            if (st != INF_OK)
                return st;
            continue;
        }
        if (!split_added(tok, &tok->match_norm, true, parse_special, t, n, &e->sub))
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        for (size_t k = 0; k < e->sub.n; k++) {
            struct seg ss = e->sub.s[k];
            inf_status_t st =
                ss.id >= 0
                    ? (ids_push(out, ss.id) ? INF_OK
                                            : inf_err_set(err, INF_E_NOMEM, "out of memory"))
                    : encode_text(tok, e, t + ss.off, ss.len, sg.off == 0 && ss.off == 0, out, err);
            if (st != INF_OK)
                return st;
        }
    }
    return INF_OK;
}

inf_status_t tok_encode(tok_tokenizer_t *tok, const char *text, size_t len,
                            const struct tok_encode_opts *opts, struct tok_ids *out,
                            struct inf_err *err)
{
    struct tok_encode_opts o = opts ? *opts : tok_encode_defaults();
    if (len && !text)
        return inf_err_set(err, INF_E_INVALID, "text is NULL");
    if (tok_utf8_valid_prefix(text, len) != len)
        return inf_err_set(err, INF_E_INVALID, "text is not valid UTF-8");
    size_t base = out->n;
    struct enc e = {0};
    inf_status_t st = INF_OK;
    e.md = pcre2_match_data_create(1, NULL);
    if (!e.md) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto done;
    }
    size_t t = 0;
    if (o.add_special && tok->tmpl) {
        for (; t < tok->n_tmpl && !tok->tmpl[t].is_seq; t++)
            for (size_t k = 0; k < tok->tmpl[t].n_ids; k++)
                if (!ids_push(out, tok->tmpl[t].ids[k])) {
                    st = inf_err_set(err, INF_E_NOMEM, "out of memory");
                    goto done;
                }
        t++; /* the sequence itself */
    }
    st = encode_body(tok, &e, text ? text : "", len, o.parse_special, out, err);
    if (st != INF_OK)
        goto done;
    if (o.add_special && tok->tmpl)
        for (; t < tok->n_tmpl; t++)
            for (size_t k = 0; k < tok->tmpl[t].n_ids; k++)
                if (!tok->tmpl[t].is_seq && !ids_push(out, tok->tmpl[t].ids[k])) {
                    st = inf_err_set(err, INF_E_NOMEM, "out of memory");
                    goto done;
                }
done:
    if (st != INF_OK)
        out->n = base;
    enc_fini(&e);
    return st;
}
