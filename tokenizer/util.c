/* tokenizer/util.c — buffers, hash maps, UTF-8 and Unicode helpers, the
 * byte-level table and pattern matching shared by the tokenizer's files. */
#include "tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers ------------------------------------------------------------------ */
bool tok_buf_reserve(struct tok_buf *b, size_t extra)
{
    return extra <= SIZE_MAX - b->n && inf_grow(&b->p, &b->cap, b->n + extra, 256);
}

bool tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
    if (!tok_buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

void tok_buf_fini(struct tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void tok_list_clear(struct tok_list *l)
{
    l->n = 0;
    l->b.n = 0;
}

bool tok_list_push_empty(struct tok_list *l, bool at_start)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct tok_piece *p = realloc(l->p, cap * sizeof *p);
        if (!p)
            return false;
        l->p = p;
        l->cap = cap;
    }
    if (l->b.n > UINT32_MAX)
        return false;
    l->p[l->n++] = (struct tok_piece){.off = (uint32_t)l->b.n, .len = 0, .at_start = at_start};
    return true;
}

bool tok_list_push(struct tok_list *l, const char *s, size_t n, bool at_start)
{
    if (!tok_list_push_empty(l, at_start) || !tok_buf_put(&l->b, s, n) || n > UINT32_MAX)
        return false;
    l->p[l->n - 1].len = (uint32_t)n;
    return true;
}

void tok_list_fini(struct tok_list *l)
{
    free(l->p);
    tok_buf_fini(&l->b);
    memset(l, 0, sizeof *l);
}

/* ---- hashing ---------------------------------------------------------------------- */
uint64_t tok_hash(const void *s, size_t n)
{
    /* FNV-1a with a final avalanche: short keys, good enough spread. */
    const unsigned char *p = s;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

bool tok_strmap_init(struct tok_strmap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    size_t slots = 16;
    while (slots < expected * 2 + 16)
        slots *= 2;
    m->cap = expected + 16;
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->lens = malloc(m->cap * sizeof *m->lens);
    m->vals = malloc(m->cap * sizeof *m->vals);
    m->slots = calloc(slots, sizeof *m->slots);
    m->mask = slots - 1;
    if (!m->keys || !m->lens || !m->vals || !m->slots) {
        tok_strmap_fini(m);
        return false;
    }
    return true;
}

void tok_strmap_fini(struct tok_strmap *m)
{
    free(m->keys);
    free(m->lens);
    free(m->vals);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static bool strmap_grow(struct tok_strmap *m)
{
    size_t cap = m->cap * 2;
    const char **k = realloc(m->keys, cap * sizeof *k);
    if (!k)
        return false;
    m->keys = k;
    uint32_t *l = realloc(m->lens, cap * sizeof *l);
    if (!l)
        return false;
    m->lens = l;
    int32_t *v = realloc(m->vals, cap * sizeof *v);
    if (!v)
        return false;
    m->vals = v;
    m->cap = cap;
    size_t slots = (m->mask + 1) * 2;
    uint32_t *s = calloc(slots, sizeof *s);
    if (!s)
        return false;
    free(m->slots);
    m->slots = s;
    m->mask = slots - 1;
    for (size_t i = 0; i < m->n; i++) {
        size_t h = tok_hash(m->keys[i], m->lens[i]) & m->mask;
        while (m->slots[h])
            h = (h + 1) & m->mask;
        m->slots[h] = (uint32_t)i + 1;
    }
    return true;
}

bool tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t val)
{
    size_t h = tok_hash(key, len) & m->mask;
    while (m->slots[h]) {
        uint32_t e = m->slots[h] - 1;
        if (m->lens[e] == len && memcmp(m->keys[e], key, len) == 0) {
            m->vals[e] = val;
            return true;
        }
        h = (h + 1) & m->mask;
    }
    if (m->n == m->cap || (m->n + 1) * 2 > m->mask + 1) {
        if (!strmap_grow(m))
            return false;
        return tok_strmap_put(m, key, len, val);
    }
    m->keys[m->n] = key;
    m->lens[m->n] = (uint32_t)len;
    m->vals[m->n] = val;
    m->slots[h] = (uint32_t)++m->n;
    return true;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len)
{
    if (!m->slots)
        return -1;
    size_t h = tok_hash(key, len) & m->mask;
    while (m->slots[h]) {
        uint32_t e = m->slots[h] - 1;
        if (m->lens[e] == len && memcmp(m->keys[e], key, len) == 0)
            return m->vals[e];
        h = (h + 1) & m->mask;
    }
    return -1;
}

/* ---- UTF-8 ---------------------------------------------------------------------------- */
size_t tok_utf8_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    if (c >= 0xE0 && c < 0xF0)
        return 3;
    if (c >= 0xC2 && c < 0xE0)
        return 2;
    return 1;
}

size_t tok_utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool valid;
        size_t l = inf_utf8_next(u + i, n - i, &valid);
        if (!valid)
            return i;
        i += l;
    }
    return i;
}

size_t tok_utf8_decode(const char *s, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

bool tok_utf8_lossy(struct tok_buf *out, const unsigned char *s, size_t n)
{
    /* Rust's from_utf8_lossy: each maximal invalid prefix of a sequence (a
     * lone bad byte, or a truncated valid start) becomes one U+FFFD. */
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] < 0x80)
            j++;
        if (j > i && !tok_buf_put(out, s + i, j - i))
            return false;
        i = j;
        if (i >= n)
            break;
        bool valid;
        size_t l = inf_utf8_next(s + i, n - i, &valid);
        if (valid) {
            if (!tok_buf_put(out, s + i, l))
                return false;
            i += l;
            continue;
        }
        /* Invalid: skip the longest valid-so-far prefix (at least one byte). */
        if (!tok_buf_put(out, fffd, 3))
            return false;
        i += l;
    }
    return true;
}

/* ---- Unicode properties ------------------------------------------------------------------ */
bool tok_is_whitespace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool tok_is_numeric(uint32_t c)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool tok_is_alnum(uint32_t c)
{
    if (c == '_')
        return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || tok_is_numeric(c);
}

/* ---- byte-level table ----------------------------------------------------------------------- */
struct tok_bytelevel tok_bl;
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

static void bytelevel_build(void)
{
    int n = 0;
    for (int i = 0; i < 512; i++)
        tok_bl.dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp;
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
            cp = (uint32_t)b;
        else
            cp = 256 + (uint32_t)n++;
        tok_bl.enc_len[b] = (uint8_t)inf_utf8_encode(cp, tok_bl.enc[b]);
        tok_bl.dec[cp] = (int16_t)b;
    }
}

void tok_bytelevel_init(void)
{
    pthread_once(&bl_once, bytelevel_build);
}

/* ---- patterns -------------------------------------------------------------------------------- */
int tok_pattern_next(const struct tok_pattern *pat, const char *s, size_t n, size_t start,
                         pcre2_match_data *md, size_t *ms, size_t *me)
{
    if (start > n)
        return 0;
    if (pat->lit) {
        if (pat->lit_len == 0 || pat->lit_len > n - start)
            return 0;
        const char *p = memmem(s + start, n - start, pat->lit, pat->lit_len);
        if (!p)
            return 0;
        *ms = (size_t)(p - s);
        *me = *ms + pat->lit_len;
        return 1;
    }
    int rc = pcre2_match(pat->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}
