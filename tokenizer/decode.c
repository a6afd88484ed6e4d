/* tokenizer/decode.c — ids to text through the decoder chain (as the
 * reference's decode_chain over token strings, then joined), and the
 * streaming detokenizer built on a "partial" decode that holds back what
 * later ids could still change. */
#include "tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

struct dstate {
    bool cont;    /* the text continues earlier text */
    bool partial; /* hold back what later ids could change */
    bool fused;   /* the list is one string standing for the whole text */
    bool held;    /* something was held back */
    pcre2_match_data *md;
    struct tok_buf scratch;
};

static bool chain_has(const struct tok_dec *d, enum tok_dec_type t)
{
    if (d->type == t)
        return true;
    for (size_t i = 0; i < d->n_kids; i++)
        if (chain_has(&d->kids[i], t))
            return true;
    return false;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "<0xHH>" as the reference's ByteFallback reads it (u8::from_str_radix on
 * the two characters, which also takes "+H"). */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    if (s[3] == '+') {
        int v = hexval(s[4]);
        return v;
    }
    int hi = hexval(s[3]), lo = hexval(s[4]);
    if (hi < 0 || lo < 0)
        return -1;
    return hi * 16 + lo;
}

/* The bytes of piece i. An empty list of pieces may have no buffer yet:
 * answer "" rather than offsetting a null pointer. */
#define PIECE(l, i) ((l)->b.p ? (l)->b.p + (l)->p[i].off : "")

static bool replace_token(const struct tok_pattern *pat, const char *rep, size_t rep_len,
                          const char *s, size_t n, struct tok_list *out, pcre2_match_data *md)
{
    if (!tok_list_push_empty(out, false))
        return false;
    size_t start = out->b.n, pos = 0, ms, me;
    int r;
    while ((r = tok_pattern_next(pat, s, n, pos, md, &ms, &me)) == 1) {
        if (me == ms) {
            if (ms >= n)
                break;
            size_t l = tok_utf8_len((unsigned char)s[ms]);
            if (!tok_buf_put(&out->b, s + pos, ms + l - pos))
                return false;
            pos = ms + l;
            continue;
        }
        if (!tok_buf_put(&out->b, s + pos, ms - pos) || !tok_buf_put(&out->b, rep, rep_len))
            return false;
        pos = me;
    }
    if (r < 0 || !tok_buf_put(&out->b, s + pos, n - pos))
        return false;
    out->p[out->n - 1].len = (uint32_t)(out->b.n - start);
    return true;
}

static bool flush_bytes(struct tok_list *out, const unsigned char *bytes, size_t nb)
{
    if (nb == 0)
        return true;
    if (tok_utf8_valid_prefix((const char *)bytes, nb) == nb)
        return tok_list_push(out, (const char *)bytes, nb, false);
    for (size_t i = 0; i < nb; i++)
        if (!tok_list_push(out, "\xEF\xBF\xBD", 3, false))
            return false;
    return true;
}

static bool dec_apply(const struct tok_dec *d, struct tok_list **cur, struct tok_list **alt,
                      struct dstate *st)
{
    if (d->type == DEC_SEQ) {
        for (size_t i = 0; i < d->n_kids; i++)
            if (!dec_apply(&d->kids[i], cur, alt, st))
                return false;
        return true;
    }
    struct tok_list *in = *cur, *out = *alt;
    tok_list_clear(out);
    switch (d->type) {
    case DEC_SEQ:
        break;
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++)
            if (!replace_token(&d->pat, d->str, d->str_len, PIECE(in, i), in->p[i].len, out,
                               st->md))
                return false;
        break;
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = PIECE(in, i);
            size_t n = in->p[i].len;
            bool strip = i == 0 && !st->cont && d->prepend != PREPEND_NEVER;
            if (!tok_list_push_empty(out, false))
                return false;
            size_t start = out->b.n;
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                size_t l = tok_utf8_decode(s + k, &cp);
                bool ok = true;
                if (cp == d->repl_cp) {
                    if (!strip)
                        ok = tok_buf_put(&out->b, " ", 1);
                } else
                    ok = tok_buf_put(&out->b, s + k, l);
                if (!ok)
                    return false;
                k += l;
            }
            out->p[out->n - 1].len = (uint32_t)(out->b.n - start);
        }
        break;
    case DEC_BYTEFALLBACK: {
        struct tok_buf *bytes = &st->scratch;
        bytes->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            int b = byte_token(PIECE(in, i), in->p[i].len);
            if (b >= 0) {
                unsigned char c = (unsigned char)b;
                if (!tok_buf_put(bytes, &c, 1))
                    return false;
                continue;
            }
            if (!flush_bytes(out, (unsigned char *)bytes->p, bytes->n))
                return false;
            bytes->n = 0;
            if (!tok_list_push(out, PIECE(in, i), in->p[i].len, false))
                return false;
        }
        if (!flush_bytes(out, (unsigned char *)bytes->p, bytes->n))
            return false;
        break;
    }
    case DEC_FUSE: {
        if (!tok_list_push_empty(out, false))
            return false;
        size_t total = 0;
        for (size_t i = 0; i < in->n; i++) {
            if (!tok_buf_put(&out->b, PIECE(in, i), in->p[i].len))
                return false;
            total += in->p[i].len;
        }
        out->p[0].len = (uint32_t)total;
        st->fused = true;
        break;
    }
    case DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = PIECE(in, i);
            size_t n = in->p[i].len, a = 0, b = n;
            bool skip_start = st->fused && st->cont;
            for (size_t k = 0; k < d->start && !skip_start && a < n; k++) {
                uint32_t cp;
                size_t l = tok_utf8_decode(s + a, &cp);
                if (cp != d->repl_cp)
                    break;
                a += l;
            }
            for (size_t k = 0; k < d->stop && b > a; k++) {
                size_t p = b - 1;
                while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                uint32_t cp;
                tok_utf8_decode(s + p, &cp);
                if (cp != d->repl_cp)
                    break;
                b = p;
            }
            if (st->partial && st->fused && d->stop > 0)
                st->held = true; /* the end may not be the end */
            if (!tok_list_push(out, s + a, b - a, false))
                return false;
        }
        break;
    case DEC_BYTELEVEL: {
        struct tok_buf *bytes = &st->scratch;
        bytes->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = PIECE(in, i);
            size_t n = in->p[i].len, mark = bytes->n;
            bool all = true;
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                size_t l = tok_utf8_decode(s + k, &cp);
                if (cp >= 512 || tok_bl.dec[cp] < 0) {
                    all = false;
                    break;
                }
                unsigned char c = (unsigned char)tok_bl.dec[cp];
                if (!tok_buf_put(bytes, &c, 1))
                    return false;
                k += l;
            }
            if (!all) {
                /* a character outside the table: the token's own bytes */
                bytes->n = mark;
                if (!tok_buf_put(bytes, s, n))
                    return false;
            }
        }
        size_t nb = bytes->n;
        if (st->partial) {
            /* hold back an incomplete (valid so far) trailing sequence */
            size_t k = nb, back = 0;
            while (k > 0 && back < 3 && ((unsigned char)bytes->p[k - 1] & 0xC0) == 0x80) {
                k--;
                back++;
            }
            if (k > 0) {
                unsigned char lead = (unsigned char)bytes->p[k - 1];
                size_t need = tok_utf8_len(lead);
                if (need > 1 && need > nb - (k - 1) &&
                    tok_utf8_valid_prefix(bytes->p + k - 1, nb - (k - 1)) == 0) {
                    /* truncated: check that what is there is a valid start */
                    struct tok_buf probe = {0};
                    bool ok =
                        tok_utf8_lossy(&probe, (unsigned char *)bytes->p + k - 1, nb - (k - 1));
                    /* one U+FFFD for the whole tail means a single truncated
                     * sequence, which later bytes may complete */
                    bool single = ok && probe.n == 3;
                    tok_buf_fini(&probe);
                    if (!ok)
                        return false;
                    if (single) {
                        nb = k - 1;
                        st->held = true;
                    }
                }
            }
        }
        if (!tok_list_push_empty(out, false))
            return false;
        size_t start = out->b.n;
        if (!tok_utf8_lossy(&out->b, (unsigned char *)bytes->p, nb))
            return false;
        out->p[0].len = (uint32_t)(out->b.n - start);
        st->fused = true;
        break;
    }
    }
    *cur = out;
    *alt = in;
    return true;
}

inf_status_t tok_decode_run(const tok_tokenizer_t *tok, const int32_t *ids, size_t n,
                                bool skip_special, bool cont, bool partial, struct tok_buf *out,
                                bool *settled, struct inf_err *err)
{
    tok_bytelevel_init();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_ids || tok->id_len[ids[i]] == UINT32_MAX)
            return inf_err_set(err, INF_E_RANGE, "token id %d is outside the vocabulary (%d)",
                               ids[i], tok->n_ids);
    struct tok_list la = {0}, lb = {0};
    struct dstate st = {.cont = cont, .partial = partial};
    inf_status_t rc = INF_OK;
    size_t keep = n;
    if (partial && tok->dec && chain_has(tok->dec, DEC_BYTEFALLBACK)) {
        /* A trailing run of byte tokens decodes as a whole (valid UTF-8, or
         * one U+FFFD per byte): hold it back until a non-byte token ends it. */
        size_t k = n;
        while (k > 0) {
            int32_t id = ids[k - 1];
            if (skip_special && tok->is_special[id]) {
                k--;
                continue;
            }
            if (byte_token(tok->id_str[id], tok->id_len[id]) < 0)
                break;
            k--;
            keep = k;
        }
        if (keep < n)
            st.held = true;
    }
    for (size_t i = 0; i < keep; i++) {
        int32_t id = ids[i];
        if (skip_special && tok->is_special[id])
            continue;
        if (!tok_list_push(&la, tok->id_str[id], tok->id_len[id], false)) {
            rc = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto done;
        }
    }
    struct tok_list *cur = &la, *alt = &lb;
    if (tok->dec) {
        st.md = pcre2_match_data_create(1, NULL);
        if (!st.md || !dec_apply(tok->dec, &cur, &alt, &st)) {
            rc = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto done;
        }
    }
    for (size_t i = 0; i < cur->n; i++) {
        bool sep = !tok->dec && (i > 0 || cont);
        if ((sep && !tok_buf_put(out, " ", 1)) ||
            !tok_buf_put(out, PIECE(cur, i), cur->p[i].len)) {
            rc = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto done;
        }
    }
    if (settled)
        *settled = !st.held;
done:
    tok_list_fini(&la);
    tok_list_fini(&lb);
    tok_buf_fini(&st.scratch);
    if (st.md)
        pcre2_match_data_free(st.md);
    return rc;
}

inf_status_t tok_decode(const tok_tokenizer_t *tok, const int32_t *ids, size_t n, bool skip_special,
                            char **text, size_t *text_len, struct inf_err *err)
{
    struct tok_buf out = {0};
    inf_status_t rc = tok_decode_run(tok, ids, n, skip_special, false, false, &out, NULL, err);
    if (rc == INF_OK && !tok_buf_put(&out, "", 1))
        rc = inf_err_set(err, INF_E_NOMEM, "out of memory");
    if (rc != INF_OK) {
        tok_buf_fini(&out);
        return rc;
    }
    *text = out.p;
    if (text_len)
        *text_len = out.n - 1;
    return INF_OK;
}

/* ---- streaming ------------------------------------------------------------------------ */
struct tok_stream {
    const tok_tokenizer_t *tok;
    struct tok_stream_opts opts;
    int32_t *ids; /* the unsettled window: ids since the last settled point */
    size_t n, cap;
    bool cont;      /* the window continues earlier text */
    size_t emitted; /* bytes of the window's decode already returned */
    struct tok_buf text, delta;
};

inf_status_t tok_stream_create(const tok_tokenizer_t *tok, const struct tok_stream_opts *opts,
                                   tok_stream_t **out, struct inf_err *err)
{
    tok_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    s->tok = tok;
    if (opts)
        s->opts = *opts;
    s->cont = s->opts.continuation;
    *out = s;
    return INF_OK;
}

void tok_stream_destroy(tok_stream_t *s)
{
    if (!s)
        return;
    free(s->ids);
    tok_buf_fini(&s->text);
    tok_buf_fini(&s->delta);
    free(s);
}

static inf_status_t stream_step(tok_stream_t *s, bool final, const char **delta,
                                size_t *delta_len, struct inf_err *err)
{
    bool settled = false;
    s->text.n = 0;
    inf_status_t rc = tok_decode_run(s->tok, s->ids, s->n, s->opts.skip_special, s->cont,
                                         !final, &s->text, &settled, err);
    if (rc != INF_OK)
        return rc;
    s->delta.n = 0;
    if (s->text.n > s->emitted &&
        !tok_buf_put(&s->delta, s->text.p + s->emitted, s->text.n - s->emitted))
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    if (s->text.n > s->emitted)
        s->emitted = s->text.n;
    /* A settled window with visible text can be closed: what follows decodes
     * on its own as a continuation. */
    if (final || (settled && s->text.n > 0)) {
        s->n = 0;
        s->emitted = 0;
        s->cont = final ? s->opts.continuation : true;
    }
    *delta = s->delta.p ? s->delta.p : "";
    *delta_len = s->delta.n;
    return INF_OK;
}

inf_status_t tok_stream_push(tok_stream_t *s, int32_t id, const char **delta,
                                 size_t *delta_len, struct inf_err *err)
{
    const tok_tokenizer_t *tok = s->tok;
    if (id < 0 || id >= tok->n_ids || tok->id_len[id] == UINT32_MAX)
        return inf_err_set(err, INF_E_RANGE, "token id %d is outside the vocabulary (%d)", id,
                           tok->n_ids);
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        int32_t *p = realloc(s->ids, cap * sizeof *p);
        if (!p)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        s->ids = p;
        s->cap = cap;
    }
    s->ids[s->n++] = id;
    inf_status_t rc = stream_step(s, false, delta, delta_len, err);
    if (rc != INF_OK)
        s->n--;
    return rc;
}

inf_status_t tok_stream_finish(tok_stream_t *s, const char **delta, size_t *delta_len,
                                   struct inf_err *err)
{
    return stream_step(s, true, delta, delta_len, err);
}
