/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * Input: byte 0 picks the tokenizer (bit 0: tests/fixtures/tokenizer_tiny.json,
 * byte-level BPE with added tokens; or tokenizer_tiny_sp.json,
 * SentencePiece-style with NFKC, byte fallback and a Strip decoder) and the
 * operation (bits 1-2); the rest is the payload.
 *   op 0: encode the payload as text. Invalid UTF-8 must be refused with
 *         INF_E_INVALID; valid text must encode, and on the byte-level
 *         tokenizer (lossless) decode back to itself.
 *   op 1: decode the payload as little-endian int32 ids. Out-of-range ids
 *         must give INF_E_RANGE, in-range ones valid UTF-8 text.
 *   op 2: stream the same ids; the deltas must be valid UTF-8 and concatenate
 *         to the full decode.
 * Any broken promise traps. The tokenizers are loaded once and stay loaded. */
#include "engine/eng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tok_tokenizer_t *toks[2];

static tok_tokenizer_t *load(int which)
{
    if (toks[which])
        return toks[which];
    const char *name = which ? "tokenizer_tiny_sp.json" : "tokenizer_tiny.json";
    char path[4096];
    const char *src = getenv("INT4SERVE_SOURCE_DIR");
    if (src)
        snprintf(path, sizeof path, "%s/tests/fixtures/%s", src, name);
    else {
        /* beside this file: <src>/tests/fuzz/ -> <src>/tests/fixtures/ */
        const char *f = __FILE__, *slash = strrchr(f, '/');
        int dl = slash ? (int)(slash - f) : 1;
        snprintf(path, sizeof path, "%.*s/../fixtures/%s", dl, slash ? f : ".", name);
    }
    struct inf_err err;
    if (tok_load_files(path, NULL, &toks[which], &err) != INF_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", path, err.msg);
        abort();
    }
    return toks[which];
}

static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return 0;
        if (i + need >= n)
            return 0;
        for (size_t k = 1; k <= need; k++) {
            unsigned b = s[i + k];
            if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
                return 0;
        }
        i += need + 1;
    }
    return 1;
}

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int which = data[0] & 1, op = (data[0] >> 1) & 3;
    tok_tokenizer_t *tok = load(which);
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    struct inf_err err;
    if (op == 0 || op == 3) {
        struct tok_ids ids = {0};
        struct tok_encode_opts o = {.add_special = (data[0] >> 3) & 1,
                                        .parse_special = (data[0] >> 4) & 1};
        inf_status_t st = tok_encode(tok, (const char *)p, n, &o, &ids, &err);
        check(valid_utf8(p, n) ? st == INF_OK : st == INF_E_INVALID);
        if (st == INF_OK) {
            char *text;
            size_t tl;
            check(tok_decode(tok, ids.ids, ids.n, false, &text, &tl, &err) == INF_OK);
            check(valid_utf8((unsigned char *)text, tl));
            if (which == 0 && !o.add_special && !o.parse_special)
                check(tl == n && memcmp(text, p, n) == 0);
            free(text);
        }
        tok_ids_fini(&ids);
        return 0;
    }
    size_t nid = n / 4;
    int32_t *ids = malloc((nid + 1) * sizeof *ids);
    if (!ids)
        return 0;
    int in_range = 1;
    int32_t vs = tok_vocab_size(tok);
    for (size_t i = 0; i < nid; i++) {
        uint32_t v = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                     (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
        /* mostly small ids, so most inputs are decodable */
        ids[i] = (data[0] & 0x80) ? (int32_t)v : (int32_t)(v % (uint32_t)(vs + 2));
        if (ids[i] < 0 || ids[i] >= vs || !tok_id_to_token(tok, ids[i]))
            in_range = 0;
    }
    int skip = (data[0] >> 3) & 1;
    char *text = NULL;
    size_t tl = 0;
    inf_status_t st = tok_decode(tok, ids, nid, skip, &text, &tl, &err);
    check(in_range ? st == INF_OK : st == INF_E_RANGE);
    if (st == INF_OK)
        check(valid_utf8((unsigned char *)text, tl));
    if (op == 2 && st == INF_OK) {
        tok_stream_t *s;
        struct tok_stream_opts so = {.skip_special = skip};
        check(tok_stream_create(tok, &so, &s, &err) == INF_OK);
        size_t at = 0;
        for (size_t i = 0; i <= nid; i++) {
            const char *d;
            size_t dl;
            inf_status_t r = i < nid ? tok_stream_push(s, ids[i], &d, &dl, &err)
                                     : tok_stream_finish(s, &d, &dl, &err);
            check(r == INF_OK);
            check(valid_utf8((const unsigned char *)d, dl));
            check(at + dl <= tl && memcmp(text + at, d, dl) == 0);
            at += dl;
        }
        check(at == tl);
        tok_stream_destroy(s);
    }
    free(text);
    free(ids);
    return 0;
}
