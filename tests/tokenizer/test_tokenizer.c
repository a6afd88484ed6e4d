/* test_tokenizer.c — the tokenizer against ground truth: ids and decodes that
 * Hugging Face's `tokenizers` produced for tests/tokenizer/corpus.json
 * (tests/tokenizer/fixtures/, made by tests/tokenizer/gen_fixtures.py) on the
 * real Llama-2, Llama-3.1 and Qwen3 tokenizers; the streaming detokenizer
 * against the full decode; small hand-checked tokenizers for each
 * pre-tokenizer behaviour; and the errors. The real tokenizers come from
 * scripts/fetch-tokenizers.sh through INT4SERVE_TOKENIZER_CACHE; missing, they
 * fail the suite under CI=true and skip it visibly elsewhere. */
#include "tokenizer/tokenizer.h"

#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *src_dir(void)
{
    const char *s = getenv("INT4SERVE_SOURCE_DIR");
    return s ? s : ".";
}

static bool in_ci(void)
{
    const char *ci = getenv("CI");
    return ci && !strcmp(ci, "true");
}

/* The real tokenizer NAME from the cache, or NULL (and a visible skip) when
 * absent outside CI. */
static tok_tokenizer_t *load_real(const char *name)
{
    const char *cache = getenv("INT4SERVE_TOKENIZER_CACHE");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", cache ? cache : "", name);
    struct inf_err err = {0};
    tok_tokenizer_t *tok = NULL;
    if (cache && tok_load(dir, &tok, &err) == INF_OK)
        return tok;
    if (cache && err.code != INF_E_IO)
        ck_abort_msg("loading %s: %s", name, err.msg);
    if (in_ci())
        ck_abort_msg("tokenizer %s missing from the cache: run scripts/fetch-tokenizers.sh", name);
    printf("SKIPPED: tokenizer %s not fetched (run scripts/fetch-tokenizers.sh)\n", name);
    return NULL;
}

static json_t *load_json_file(const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", src_dir(), rel);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    ck_assert_msg(j != NULL, "%s: %s", rel, je.text);
    return j;
}

static bool ids_equal(const struct tok_ids *got, const json_t *want)
{
    if (!json_is_array(want) || got->n != json_array_size(want))
        return false;
    for (size_t i = 0; i < got->n; i++)
        if (got->ids[i] != json_integer_value(json_array_get(want, i)))
            return false;
    return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    printf("  %s [", label);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? "," : "", ids[i]);
    printf("]\n");
}

static void print_mismatch(const char *what, const char *s, size_t len,
                           const struct tok_ids *got, const json_t *want)
{
    json_t *js = json_stringn(s, len);
    char *q = json_dumps(js, JSON_ENCODE_ANY);
    char *w = json_dumps(want, JSON_ENCODE_ANY | JSON_COMPACT);
    printf("MISMATCH %s for %s\n", what, q);
    print_ids("ours", got->ids, got->n);
    printf("  want %s\n", w);
    free(q);
    free(w);
    json_decref(js);
}

struct tally {
    int total, encode, plain, nosplit, nosplit_total, decode, decode_skip, roundtrip,
        roundtrip_total;
};

static void check_fixtures_with(const char *name, tok_tokenizer_t *tok, bool real);

static void check_fixtures(const char *name)
{
    tok_tokenizer_t *tok = load_real(name);
    if (tok)
        check_fixtures_with(name, tok, true);
}

/* A variant of tests/tokenizer/variants.json: its base tokenizer.json with
 * the same changes gen_fixtures.py's apply_variant makes. */
static tok_tokenizer_t *load_variant(const json_t *v)
{
    const char *base = json_string_value(json_object_get(v, "base"));
    const char *cache = getenv("INT4SERVE_TOKENIZER_CACHE");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", cache ? cache : "", base);
    json_error_t je;
    json_t *root = cache ? json_load_file(path, JSON_ALLOW_NUL, &je) : NULL;
    if (!root) {
        if (in_ci())
            ck_abort_msg("tokenizer %s missing from the cache: run scripts/fetch-tokenizers.sh",
                         base);
        printf("SKIPPED: tokenizer %s not fetched (run scripts/fetch-tokenizers.sh)\n", base);
        return NULL;
    }
    const char *key;
    json_t *val;
    json_object_foreach(json_object_get(v, "set"), key, val) json_object_set(root, key, val);
    json_object_foreach(json_object_get(v, "model_set"), key, val)
        json_object_set(json_object_get(root, "model"), key, val);
    json_t *added = json_object_get(root, "added_tokens");
    size_t i, k;
    json_t *upd, *t;
    json_array_foreach(json_object_get(v, "added_tokens_update"), i, upd)
    {
        json_array_foreach(added, k, t)
        {
            if (json_equal(json_object_get(t, "content"), json_object_get(upd, "content")))
                json_object_update(t, upd);
        }
    }
    json_array_foreach(json_object_get(v, "added_tokens_append"), i, t) json_array_append(added, t);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    ck_assert_ptr_nonnull(text);
    tok_tokenizer_t *tok = NULL;
    struct inf_err err = {0};
    inf_status_t st = tok_load_json(text, strlen(text), NULL, 0, &tok, &err);
    free(text);
    ck_assert_msg(st == INF_OK, "variant %s: %s", json_string_value(json_object_get(v, "name")),
                  err.msg);
    return tok;
}

static void check_fixtures_with(const char *name, tok_tokenizer_t *tok, bool real)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/tokenizer/fixtures/%s.jsonl", name);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", src_dir(), rel);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", rel);
    json_t *corpus = load_json_file("tests/tokenizer/corpus.json");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, f);
    ck_assert_int_gt(n, 0); /* header */
    struct tally t = {0};
    int shown = 0;
    const struct tok_encode_opts plain = {.add_special = false, .parse_special = true};
    const struct tok_encode_opts raw = {.add_special = false, .parse_special = false};
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *row = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        ck_assert_msg(json_is_array(row) && json_array_size(row) == 5, "%s line %d: %s", rel,
                      t.total + 2, je.text);
        json_t *sv = json_array_get(corpus, (size_t)t.total);
        ck_assert_ptr_nonnull(sv);
        const char *s = json_string_value(sv);
        size_t len = json_string_length(sv);
        struct inf_err err;
        struct tok_ids a = {0}, p = {0}, r = {0};
        ck_assert_int_eq(tok_encode(tok, s, len, NULL, &a, &err), INF_OK);
        ck_assert_int_eq(tok_encode(tok, s, len, &plain, &p, &err), INF_OK);
        ck_assert_int_eq(tok_encode(tok, s, len, &raw, &r, &err), INF_OK);
        t.total++;
        if (ids_equal(&a, json_array_get(row, 0)))
            t.encode++;
        else if (shown++ < 10)
            print_mismatch("encode", s, len, &a, json_array_get(row, 0));
        if (ids_equal(&p, json_array_get(row, 1)))
            t.plain++;
        else if (shown++ < 10)
            print_mismatch("encode(add_special=false)", s, len, &p, json_array_get(row, 1));
        if (!json_is_null(json_array_get(row, 2))) {
            t.nosplit_total++;
            if (ids_equal(&r, json_array_get(row, 2)))
                t.nosplit++;
            else if (shown++ < 10)
                print_mismatch("encode(parse_special=false)", s, len, &r, json_array_get(row, 2));
        }
        /* decode the reference's ids, so a decode check does not hang on encode */
        json_t *want_ids = json_array_get(row, 0);
        size_t nw = json_array_size(want_ids);
        int32_t *ids = calloc(nw + 1, sizeof *ids);
        for (size_t i = 0; i < nw; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(want_ids, i));
        for (int skip = 0; skip < 2; skip++) {
            char *text;
            size_t tl;
            ck_assert_int_eq(tok_decode(tok, ids, nw, skip, &text, &tl, &err), INF_OK);
            json_t *want = json_array_get(row, 3 + skip);
            if (tl == json_string_length(want) && memcmp(text, json_string_value(want), tl) == 0)
                skip ? t.decode_skip++ : t.decode++;
            else if (shown++ < 10) {
                json_t *g = json_stringn(text, tl);
                char *gq = json_dumps(g, JSON_ENCODE_ANY), *wq = json_dumps(want, JSON_ENCODE_ANY);
                printf("MISMATCH decode(skip=%d) of string %d\n  ours %s\n  want %s\n", skip,
                       t.total - 1, gq, wq);
                free(gq);
                free(wq);
                json_decref(g);
            }
            free(text);
        }
        /* Round trip: where the reference gives the text back, so must we. */
        json_t *dskip = json_array_get(row, 4);
        if (json_string_length(dskip) == len && memcmp(json_string_value(dskip), s, len) == 0) {
            char *text;
            size_t tl;
            t.roundtrip_total++;
            ck_assert_int_eq(tok_decode(tok, p.ids, p.n, false, &text, &tl, &err), INF_OK);
            if (tl == len && memcmp(text, s, len) == 0)
                t.roundtrip++;
            else if (shown++ < 10)
                printf("MISMATCH round trip of string %d\n", t.total - 1);
            free(text);
        }
        free(ids);
        tok_ids_fini(&a);
        tok_ids_fini(&p);
        tok_ids_fini(&r);
        json_decref(row);
    }
    printf("fixtures %s: encode %d/%d, add_special=false %d/%d, parse_special=false %d/%d, "
           "decode %d/%d, decode skip_special %d/%d, round trip %d/%d\n",
           name, t.encode, t.total, t.plain, t.total, t.nosplit, t.nosplit_total, t.decode, t.total,
           t.decode_skip, t.total, t.roundtrip, t.roundtrip_total);
    free(line);
    fclose(f);
    ck_assert_int_eq(t.total, (int)json_array_size(corpus));
    ck_assert_int_ge(t.total, 500);
    ck_assert_int_eq(t.encode, t.total);
    ck_assert_int_eq(t.plain, t.total);
    ck_assert_int_eq(t.nosplit, t.nosplit_total);
    ck_assert_int_eq(t.decode, t.total);
    ck_assert_int_eq(t.decode_skip, t.total);
    ck_assert_int_eq(t.roundtrip, t.roundtrip_total);
    /* the real tokenizers give most strings back; the variants are lossy */
    ck_assert_int_gt(t.roundtrip_total, real ? t.total / 2 : 0);
    json_decref(corpus);
    tok_destroy(tok);
}

START_TEST(fixtures_llama2)
{
    check_fixtures("llama2");
}
END_TEST

START_TEST(fixtures_llama3_1)
{
    check_fixtures("llama3_1");
}
END_TEST

START_TEST(fixtures_qwen3)
{
    check_fixtures("qwen3");
}
END_TEST

START_TEST(fixtures_variants)
{
    json_t *vs = load_json_file("tests/tokenizer/variants.json");
    ck_assert_uint_eq(json_array_size(vs), 4); /* one loop iteration each */
    json_t *v = json_array_get(vs, (size_t)_i);
    ck_assert_ptr_nonnull(v);
    const char *name = json_string_value(json_object_get(v, "name"));
    tok_tokenizer_t *tok = load_variant(v);
    if (tok)
        check_fixtures_with(name, tok, false);
    json_decref(vs);
}
END_TEST

/* ---- streaming ----------------------------------------------------------------- */
static bool valid_utf8(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n); /* jansson validates UTF-8 */
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

/* Push ids one by one; every delta must be whole UTF-8 characters and the
 * deltas together the full decode. */
static void check_stream(tok_tokenizer_t *tok, const int32_t *ids, size_t n, bool skip)
{
    struct inf_err err;
    char *full;
    size_t full_len;
    ck_assert_int_eq(tok_decode(tok, ids, n, skip, &full, &full_len, &err), INF_OK);
    tok_stream_t *s;
    struct tok_stream_opts o = {.skip_special = skip};
    ck_assert_int_eq(tok_stream_create(tok, &o, &s, &err), INF_OK);
    char *acc = malloc(full_len + 1);
    size_t an = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *d;
        size_t dl;
        if (i < n)
            ck_assert_int_eq(tok_stream_push(s, ids[i], &d, &dl, &err), INF_OK);
        else
            ck_assert_int_eq(tok_stream_finish(s, &d, &dl, &err), INF_OK);
        ck_assert_msg(valid_utf8(d, dl), "delta %zu ends inside a character", i);
        ck_assert_msg(an + dl <= full_len, "deltas run past the full decode");
        memcpy(acc + an, d, dl);
        an += dl;
        ck_assert_msg(memcmp(acc, full, an) == 0, "deltas diverge from the decode at id %zu", i);
    }
    ck_assert_uint_eq(an, full_len);
    free(acc);
    free(full);
    tok_stream_destroy(s);
}

static void stream_corpus_with(tok_tokenizer_t *tok);

static void stream_corpus(const char *name)
{
    tok_tokenizer_t *tok = load_real(name);
    if (tok)
        stream_corpus_with(tok);
}

static void stream_corpus_with(tok_tokenizer_t *tok)
{
    json_t *corpus = load_json_file("tests/tokenizer/corpus.json");
    size_t i;
    json_t *v;
    json_array_foreach(corpus, i, v)
    {
        struct tok_ids ids = {0};
        struct inf_err err;
        ck_assert_int_eq(
            tok_encode(tok, json_string_value(v), json_string_length(v), NULL, &ids, &err),
            INF_OK);
        check_stream(tok, ids.ids, ids.n, false);
        check_stream(tok, ids.ids, ids.n, true);
        tok_ids_fini(&ids);
    }
    /* Random ids, weighted to the byte tokens that make partial characters. */
    uint64_t x = 12345;
    int32_t nv = tok_vocab_size(tok);
    int32_t bytes[512];
    int nb = 0;
    for (int b = 0; b < 256; b++) {
        char nm[8];
        snprintf(nm, sizeof nm, "<0x%02X>", b);
        int32_t id = tok_token_to_id(tok, nm);
        if (id < 0) {
            /* byte-level: the single-character token of byte b */
            static const char *hi[] = {"\xC4\xA0", "\xC4\x8A"}; /* "Ġ", "Ċ" */
            id = tok_token_to_id(tok, b == ' ' ? hi[0] : b == '\n' ? hi[1] : nm);
        }
        if (id >= 0)
            bytes[nb++] = id;
    }
    for (int b = 0x80; b < 0x100; b++) {
        /* byte-level characters of high bytes: U+00A1.. and U+0100.. */
        char nm[4];
        uint32_t cp = (b >= 0xA1 && b != 0xAD) ? (uint32_t)b : 0;
        if (!cp)
            continue;
        nm[0] = (char)(0xC0 | (cp >> 6));
        nm[1] = (char)(0x80 | (cp & 0x3F));
        nm[2] = 0;
        int32_t id = tok_token_to_id(tok, nm);
        if (id >= 0)
            bytes[nb++] = id;
    }
    for (int trial = 0; trial < 300; trial++) {
        int32_t ids[40];
        size_t n = 1 + (size_t)(trial % 40);
        for (size_t k = 0; k < n; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(x >> 33);
            ids[k] =
                (nb && r % 3) ? bytes[(r / 3) % (uint32_t)nb] : (int32_t)((r / 3) % (uint32_t)nv);
            if (!tok_id_to_token(tok, ids[k]))
                ids[k] = 0;
        }
        check_stream(tok, ids, n, trial % 2);
    }
    json_decref(corpus);
    tok_destroy(tok);
}

START_TEST(stream_llama2)
{
    stream_corpus("llama2");
}
END_TEST

START_TEST(stream_llama3_1)
{
    stream_corpus("llama3_1");
}
END_TEST

START_TEST(stream_qwen3)
{
    stream_corpus("qwen3");
}
END_TEST

START_TEST(stream_variants)
{
    json_t *vs = load_json_file("tests/tokenizer/variants.json");
    tok_tokenizer_t *tok = load_variant(json_array_get(vs, (size_t)_i));
    if (tok)
        stream_corpus_with(tok);
    json_decref(vs);
}
END_TEST

struct enc_job {
    tok_tokenizer_t *tok;
    json_t *corpus;
    int start;
    struct tok_ids *out;
};

static void *enc_thread(void *arg)
{
    struct enc_job *j = arg;
    size_t n = json_array_size(j->corpus);
    /* each thread walks the corpus from its own offset, twice, so the
     * threads meet in the shared word cache */
    for (size_t k = 0; k < 2 * n; k++) {
        size_t i = (k + (size_t)j->start) % n;
        json_t *v = json_array_get(j->corpus, i);
        struct tok_ids ids = {0};
        struct inf_err err;
        if (tok_encode(j->tok, json_string_value(v), json_string_length(v), NULL, &ids, &err) !=
            INF_OK)
            return (void *)1;
        bool same =
            ids.n == j->out[i].n && memcmp(ids.ids, j->out[i].ids, ids.n * sizeof *ids.ids) == 0;
        tok_ids_fini(&ids);
        if (!same)
            return (void *)1;
    }
    return NULL;
}

START_TEST(encode_concurrent)
{
    tok_tokenizer_t *tok = load_real("llama3_1");
    if (!tok)
        return;
    json_t *corpus = load_json_file("tests/tokenizer/corpus.json");
    size_t n = json_array_size(corpus);
    struct tok_ids *serial = calloc(n, sizeof *serial);
    struct inf_err err;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(corpus, i);
        ck_assert_int_eq(tok_encode(tok, json_string_value(v), json_string_length(v), NULL,
                                        &serial[i], &err),
                         INF_OK);
    }
    pthread_t th[4];
    struct enc_job jobs[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (struct enc_job){tok, corpus, t * 97, serial};
        ck_assert_int_eq(pthread_create(&th[t], NULL, enc_thread, &jobs[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        void *r;
        pthread_join(th[t], &r);
        ck_assert_msg(r == NULL, "thread %d saw different ids", t);
    }
    for (size_t i = 0; i < n; i++)
        tok_ids_fini(&serial[i]);
    free(serial);
    json_decref(corpus);
    tok_destroy(tok);
}
END_TEST

START_TEST(stream_continuation)
{
    tok_tokenizer_t *tok = load_real("llama2");
    if (!tok)
        return;
    struct inf_err err;
    struct tok_ids p = {0}, g = {0};
    const struct tok_encode_opts plain = {.add_special = false, .parse_special = true};
    ck_assert_int_eq(tok_encode(tok, "Hello", 5, &plain, &p, &err), INF_OK);
    ck_assert_int_eq(tok_encode(tok, "world and more", 14, &plain, &g, &err), INF_OK);
    /* "▁world" continues "Hello": its space stays. */
    tok_stream_t *s;
    struct tok_stream_opts o = {.continuation = true};
    ck_assert_int_eq(tok_stream_create(tok, &o, &s, &err), INF_OK);
    char acc[64] = {0};
    for (size_t i = 0; i <= g.n; i++) {
        const char *d;
        size_t dl;
        if (i < g.n)
            ck_assert_int_eq(tok_stream_push(s, g.ids[i], &d, &dl, &err), INF_OK);
        else
            ck_assert_int_eq(tok_stream_finish(s, &d, &dl, &err), INF_OK);
        strncat(acc, d, dl);
    }
    ck_assert_str_eq(acc, " world and more");
    /* Out-of-range ids are refused and leave the stream as it was. */
    const char *d;
    size_t dl;
    ck_assert_int_eq(tok_stream_push(s, -1, &d, &dl, &err), INF_E_RANGE);
    ck_assert_int_eq(tok_stream_push(s, tok_vocab_size(tok), &d, &dl, &err), INF_E_RANGE);
    ck_assert_int_eq(tok_stream_finish(s, &d, &dl, &err), INF_OK);
    ck_assert_uint_eq(dl, 0);
    tok_stream_destroy(s);
    tok_ids_fini(&p);
    tok_ids_fini(&g);
    tok_destroy(tok);
}
END_TEST

START_TEST(real_metadata)
{
    tok_tokenizer_t *tok = load_real("llama3_1");
    if (!tok)
        return;
    ck_assert_int_eq(tok_vocab_size(tok), 128256);
    ck_assert_int_eq(tok_bos_id(tok), 128000);
    ck_assert_int_eq(tok_eos_id(tok), 128009); /* <|eot_id|> */
    ck_assert_int_eq(tok_pad_id(tok), -1);
    ck_assert(tok_is_special(tok, 128009));
    ck_assert(!tok_is_special(tok, 9906));
    ck_assert_str_eq(tok_id_to_token(tok, 9906), "Hello");
    ck_assert_int_eq(tok_token_to_id(tok, "<|eot_id|>"), 128009);
    ck_assert_ptr_null(tok_id_to_token(tok, 128256));
    tok_destroy(tok);
    /* tokenizer_config.json names: Llama-2 <s>/</s>; Qwen3 no BOS, <|im_end|>, <|endoftext|> */
    if ((tok = load_real("llama2"))) {
        ck_assert_int_eq(tok_bos_id(tok), 1);
        ck_assert_int_eq(tok_eos_id(tok), 2);
        tok_destroy(tok);
    }
    if ((tok = load_real("qwen3"))) {
        ck_assert_int_eq(tok_bos_id(tok), -1);
        ck_assert_int_eq(tok_eos_id(tok), 151645);
        ck_assert_int_eq(tok_pad_id(tok), 151643);
        tok_destroy(tok);
    }
}
END_TEST

/* ---- small tokenizers built here ------------------------------------------------ */
/* A BPE over single characters whose merges build exactly the words listed
 * (left to right), so encoding shows where the pre-tokenizer cut the text:
 * one id per piece that is a listed word. */
static tok_tokenizer_t *word_tokenizer(const char *pretok_json, const char *normalizer_json,
                                 const char *const *words, size_t n_words, int32_t *word_ids)
{
    json_t *vocab = json_object(), *merges = json_array();
    int32_t next = 0;
    for (int c = 32; c < 127; c++) {
        char k[2] = {(char)c, 0};
        json_object_set_new(vocab, k, json_integer(next++));
    }
    json_object_set_new(vocab, "\xE2\x96\x81", json_integer(next++)); /* ▁ */
    for (size_t w = 0; w < n_words; w++) {
        const char *s = words[w];
        size_t l = strlen(s), first = (unsigned char)s[0] >= 0x80 ? 3 : 1;
        char cur[64];
        memcpy(cur, s, first);
        cur[first] = 0;
        for (size_t i = first; i < l; i++) {
            char nx[64], m[160];
            memcpy(nx, s, i + 1);
            nx[i + 1] = 0;
            snprintf(m, sizeof m, "%s %c", cur, s[i]);
            if (!json_object_get(vocab, nx)) {
                json_object_set_new(vocab, nx, json_integer(next++));
                json_array_append_new(merges, json_string(m));
            }
            strcpy(cur, nx);
        }
        word_ids[w] = (int32_t)json_integer_value(json_object_get(vocab, s));
    }
    /* ignore_merges: a piece that is a listed word is its id, whatever the ranks */
    json_t *model = json_pack("{s:s, s:o, s:o, s:b}", "type", "BPE", "vocab", vocab, "merges",
                              merges, "ignore_merges", 1);
    json_t *root = json_pack("{s:o}", "model", model);
    json_error_t je;
    if (pretok_json)
        json_object_set_new(root, "pre_tokenizer", json_loads(pretok_json, 0, &je));
    if (normalizer_json)
        json_object_set_new(root, "normalizer", json_loads(normalizer_json, 0, &je));
    char *text = json_dumps(root, JSON_COMPACT);
    tok_tokenizer_t *tok = NULL;
    struct inf_err err = {0};
    inf_status_t st = tok_load_json(text, strlen(text), NULL, 0, &tok, &err);
    ck_assert_msg(st == INF_OK, "load: %s", err.msg);
    free(text);
    json_decref(root);
    return tok;
}

/* Encode s and expect exactly the words want[] (as their ids). */
static void expect_words(tok_tokenizer_t *tok, const char *s, const char *const *words, size_t n_words,
                         const int32_t *word_ids, const char *const *want, size_t n_want)
{
    struct tok_ids ids = {0};
    struct inf_err err;
    ck_assert_int_eq(tok_encode(tok, s, strlen(s), NULL, &ids, &err), INF_OK);
    bool ok = ids.n == n_want;
    for (size_t i = 0; ok && i < n_want; i++) {
        int32_t id = -1;
        for (size_t w = 0; w < n_words; w++)
            if (!strcmp(words[w], want[i]))
                id = word_ids[w];
        ok = id >= 0 && ids.ids[i] == id;
    }
    if (!ok)
        print_ids(s, ids.ids, ids.n);
    ck_assert_msg(ok, "pieces of \"%s\" differ from the expected %zu", s, n_want);
    tok_ids_fini(&ids);
}

#define N(a) (sizeof(a) / sizeof *(a))

START_TEST(split_behaviors)
{
    /* The reference documentation's example, "the-final--countdown" split on "-". */
    static const char *const words[] = {"the",  "final",  "countdown", "-",         "--",
                                        "the-", "final-", "-final",    "-countdown"};
    int32_t wid[N(words)];
    static const struct {
        const char *behavior;
        const char *want[6];
        size_t n;
    } cases[] = {
        {"Removed", {"the", "final", "countdown"}, 3},
        {"Isolated", {"the", "-", "final", "-", "-", "countdown"}, 6},
        {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}, 4},
        {"MergedWithNext", {"the", "-final", "-", "-countdown"}, 4},
        {"Contiguous", {"the", "-", "final", "--", "countdown"}, 5},
    };
    for (size_t c = 0; c < N(cases); c++) {
        char pj[256];
        snprintf(pj, sizeof pj,
                 "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\","
                 "\"invert\":false}",
                 cases[c].behavior);
        tok_tokenizer_t *tok = word_tokenizer(pj, NULL, words, N(words), wid);
        expect_words(tok, "the-final--countdown", words, N(words), wid, cases[c].want, cases[c].n);
        tok_destroy(tok);
    }
    /* invert: the regex's matches are the pieces kept */
    tok_tokenizer_t *tok = word_tokenizer("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-z]+\"},"
                                    "\"behavior\":\"Removed\",\"invert\":true}",
                                    NULL, words, N(words), wid);
    static const char *const inv[] = {"the", "final", "countdown"};
    expect_words(tok, "the-final--countdown", words, N(words), wid, inv, 3);
    tok_destroy(tok);
}
END_TEST

START_TEST(digits_and_metaspace)
{
    static const char *const words[] = {"123",
                                        "1",
                                        "2",
                                        "3",
                                        "ab",
                                        "\xE2\x96\x81"
                                        "ab",
                                        "\xE2\x96\x81"
                                        "cd",
                                        "cd"};
    int32_t wid[N(words)];
    tok_tokenizer_t *tok = word_tokenizer("{\"type\":\"Digits\",\"individual_digits\":false}", NULL,
                                    words, N(words), wid);
    static const char *const w1[] = {"ab", "123", "cd"};
    expect_words(tok, "ab123cd", words, N(words), wid, w1, 3);
    tok_destroy(tok);
    tok = word_tokenizer("{\"type\":\"Digits\",\"individual_digits\":true}", NULL, words, N(words),
                         wid);
    static const char *const w2[] = {"ab", "1", "2", "3", "cd"};
    expect_words(tok, "ab123cd", words, N(words), wid, w2, 5);
    tok_destroy(tok);
    /* Metaspace: spaces become ▁, a ▁ is prepended, and the text is split
     * before each ▁. */
    tok = word_tokenizer("{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\","
                         "\"prepend_scheme\":\"always\",\"split\":true}",
                         NULL, words, N(words), wid);
    static const char *const w3[] = {"\xE2\x96\x81"
                                     "ab",
                                     "\xE2\x96\x81"
                                     "cd"};
    expect_words(tok, "ab cd", words, N(words), wid, w3, 2);
    tok_destroy(tok);
    tok = word_tokenizer("{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\","
                         "\"prepend_scheme\":\"never\",\"split\":true}",
                         NULL, words, N(words), wid);
    static const char *const w4[] = {"ab", "\xE2\x96\x81"
                                           "cd"};
    expect_words(tok, "ab cd", words, N(words), wid, w4, 2);
    tok_destroy(tok);
}
END_TEST

static tok_tokenizer_t *tiny(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer_tiny.json", src_dir());
    tok_tokenizer_t *tok;
    struct inf_err err;
    ck_assert_msg(tok_load_files(path, NULL, &tok, &err) == INF_OK, "%s", err.msg);
    return tok;
}

static void expect_ids(tok_tokenizer_t *tok, const char *s, const struct tok_encode_opts *o,
                       const int32_t *want, size_t n)
{
    struct tok_ids ids = {0};
    struct inf_err err;
    ck_assert_int_eq(tok_encode(tok, s, strlen(s), o, &ids, &err), INF_OK);
    bool ok = ids.n == n && memcmp(ids.ids, want, n * sizeof *want) == 0;
    if (!ok)
        print_ids(s, ids.ids, ids.n);
    ck_assert_msg(ok, "ids of \"%s\"", s);
    tok_ids_fini(&ids);
}

START_TEST(tiny_byte_level)
{
    /* tests/fixtures/tokenizer_tiny.json: byte-level BPE; ids 0..255 are the
     * byte characters in byte order, then merges "h e" (256 "he"), "l l"
     * (257), "he ll" (258), "Ġ w" (259) in "a b" form and ["Ġw","o"] (260) in
     * pair form; added tokens <|bos|> (261, special), <|user|> (262,
     * special, lstrip+rstrip) and "magic" (263, not special, single_word);
     * template: <|bos|> $A. */
    tok_tokenizer_t *tok = tiny();
    const struct tok_encode_opts plain = {.add_special = false, .parse_special = true};
    const struct tok_encode_opts raw = {.add_special = false, .parse_special = false};
    /* "hello": h e l l o -> he l l o -> he ll o -> hell o */
    expect_ids(tok, "hello", &plain, (const int32_t[]){258, 'o'}, 2);
    expect_ids(tok, "hello", NULL, (const int32_t[]){261, 258, 'o'}, 3);
    /* " wo" -> Ġw o -> Ġwo (pair-form merge) */
    expect_ids(tok, " wo", &plain, (const int32_t[]){260}, 1);
    /* bytes of "é" are C3 A9: their characters are ids 0xC3 and 0xA9 */
    expect_ids(tok, "\xC3\xA9", &plain, (const int32_t[]){0xC3, 0xA9}, 2);
    /* lstrip/rstrip take the spaces around <|user|> */
    expect_ids(tok, "a  <|user|>  b", &plain, (const int32_t[]){'a', 262, 'b'}, 3);
    /* special tokens' text as text when parse_special is off */
    struct tok_ids ids = {0};
    struct inf_err err;
    ck_assert_int_eq(tok_encode(tok, "<|bos|>", 7, &raw, &ids, &err), INF_OK);
    ck_assert_uint_eq(ids.n, 7);
    ck_assert_int_eq(ids.ids[0], '<');
    tok_ids_fini(&ids);
    /* single_word: "magic" alone is the token, inside a word it is not */
    expect_ids(tok, "magic", &plain, (const int32_t[]){263}, 1);
    ck_assert_int_eq(tok_encode(tok, "magical", 7, &plain, &ids, &err), INF_OK);
    ck_assert_uint_eq(ids.n, 7);
    tok_ids_fini(&ids);
    /* decode: byte-level, with and without the special tokens */
    int32_t in[] = {261, 258, 'o', 260, 0xC3, 0xA9};
    char *text;
    size_t tl;
    ck_assert_int_eq(tok_decode(tok, in, 6, false, &text, &tl, &err), INF_OK);
    ck_assert_str_eq(text, "<|bos|>hello wo\xC3\xA9");
    free(text);
    ck_assert_int_eq(tok_decode(tok, in, 6, true, &text, &tl, &err), INF_OK);
    ck_assert_str_eq(text, "hello wo\xC3\xA9");
    free(text);
    /* a lone continuation byte decodes to U+FFFD */
    ck_assert_int_eq(tok_decode(tok, (const int32_t[]){0xA9, 'a'}, 2, false, &text, &tl, &err),
                     INF_OK);
    ck_assert_str_eq(text, "\xEF\xBF\xBD"
                           "a");
    free(text);
    tok_destroy(tok);
}
END_TEST

START_TEST(tiny_sentencepiece)
{
    /* tests/fixtures/tokenizer_tiny_sp.json: Llama-2 style (NFKC, Prepend and
     * Replace to "▁", byte fallback, unk fused), Digits pre-tokenizer,
     * template <s> $A </s>, decoder Replace/ByteFallback/Fuse/Strip. */
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer_tiny_sp.json", src_dir());
    tok_tokenizer_t *tok;
    struct inf_err err;
    ck_assert_msg(tok_load_files(path, NULL, &tok, &err) == INF_OK, "%s", err.msg);
    int32_t the = tok_token_to_id(tok, "\xE2\x96\x81the");
    int32_t world = tok_token_to_id(tok, "\xE2\x96\x81world");
    int32_t x = tok_token_to_id(tok, "x"), zh = tok_token_to_id(tok, "\xE4\xB8\xAD");
    int32_t sp = tok_token_to_id(tok, "\xE2\x96\x81"), one = tok_token_to_id(tok, "1");
    int32_t two = tok_token_to_id(tok, "2");
    ck_assert(the > 0 && world > 0 && x > 0 && zh > 0 && sp > 0 && one > 0 && two > 0);
    expect_ids(tok, "the world", NULL, (const int32_t[]){1, the, world, 2}, 4);
    /* "€" is not in the vocab: its UTF-8 bytes E2 82 AC through <0xXX> (id 3 + byte) */
    const struct tok_encode_opts plain = {.add_special = false, .parse_special = true};
    expect_ids(tok, "x\xE4\xB8\xAD\xE2\x82\xAC", &plain,
               (const int32_t[]){sp, x, zh, 3 + 0xE2, 3 + 0x82, 3 + 0xAC}, 6);
    /* Digits isolates each digit; NFKC folds the fullwidth "１" */
    expect_ids(tok, "12", &plain, (const int32_t[]){sp, one, two}, 3);
    expect_ids(tok, "\xEF\xBC\x91", &plain, (const int32_t[]){sp, one}, 2);
    /* decode: the leading space of the first piece is stripped, bytes fused */
    int32_t in[] = {1, the, world, 3 + 0xE2, 3 + 0x82, 3 + 0xAC, 2};
    char *text;
    size_t tl;
    ck_assert_int_eq(tok_decode(tok, in, 7, true, &text, &tl, &err), INF_OK);
    ck_assert_str_eq(text, "the world\xE2\x82\xAC");
    free(text);
    /* an unfinished byte sequence: one U+FFFD per byte token */
    ck_assert_int_eq(
        tok_decode(tok, (const int32_t[]){x, 3 + 0xE2, 3 + 0x82}, 3, false, &text, &tl, &err),
        INF_OK);
    ck_assert_str_eq(text, "x\xEF\xBF\xBD\xEF\xBF\xBD");
    free(text);
    check_stream(tok, in, 7, false);
    check_stream(tok, in, 7, true);
    check_stream(tok, (const int32_t[]){the, 3 + 0xE2, 3 + 0x82, world, 3 + 0xE2}, 5, false);
    tok_destroy(tok);
}
END_TEST

START_TEST(strip_end_stream)
{
    /* A Strip decoder that also cuts the end: streamed text holds back the
     * trailing spaces until it knows they are not the end. */
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer_tiny_sp.json", src_dir());
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    ck_assert_ptr_nonnull(root);
    json_object_set_new(root, "decoder",
                        json_loads("{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\","
                                   "\"pattern\":{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},"
                                   "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
                                   "\"start\":1,\"stop\":2}]}",
                                   0, &je));
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    tok_tokenizer_t *tok;
    struct inf_err err;
    ck_assert_int_eq(tok_load_json(text, strlen(text), NULL, 0, &tok, &err), INF_OK);
    free(text);
    int32_t the = tok_token_to_id(tok, "\xE2\x96\x81the");
    int32_t world = tok_token_to_id(tok, "\xE2\x96\x81world");
    int32_t sp = tok_token_to_id(tok, "\xE2\x96\x81");
    int32_t ids[] = {the, sp, sp, world, sp, sp, sp};
    char *out;
    ck_assert_int_eq(tok_decode(tok, ids, 7, false, &out, NULL, &err), INF_OK);
    ck_assert_str_eq(out, "the   world ");
    free(out);
    for (size_t n = 1; n <= 7; n++)
        check_stream(tok, ids, n, false);
    tok_destroy(tok);
}
END_TEST

START_TEST(errors)
{
    tok_tokenizer_t *tok = tiny();
    struct inf_err err;
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(tok, "ok", 2, NULL, &ids, &err), INF_OK);
    size_t before = ids.n;
    ck_assert_int_eq(tok_encode(tok, "bad \xC3(", 6, NULL, &ids, &err), INF_E_INVALID);
    ck_assert_uint_eq(ids.n, before);
    ck_assert_int_eq(tok_encode(tok, "\xED\xA0\x80", 3, NULL, &ids, &err), INF_E_INVALID);
    tok_ids_fini(&ids);
    char *text = NULL;
    ck_assert_int_eq(tok_decode(tok, (const int32_t[]){1, 264}, 2, false, &text, NULL, &err),
                     INF_E_RANGE);
    ck_assert_ptr_null(text);
    ck_assert_int_eq(tok_decode(tok, (const int32_t[]){-5}, 1, false, &text, NULL, &err),
                     INF_E_RANGE);
    tok_destroy(tok);

    ck_assert_int_eq(tok_load("/nonexistent/dir", &tok, &err), INF_E_IO);
    const char *bad = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []";
    ck_assert_int_eq(tok_load_json(bad, strlen(bad), NULL, 0, &tok, &err), INF_E_FORMAT);
    static const struct {
        const char *json, *name;
    } unsupported[] = {
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "WordPiece"},
        {"{\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},"
         "\"merges\":[]}}",
         "Lowercase"},
        {"{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},"
         "\"merges\":[]}}",
         "Whitespace"},
        {"{\"decoder\":{\"type\":\"CTC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "CTC"},
        {"{\"post_processor\":{\"type\":\"BertProcessing\"},\"model\":{\"type\":\"BPE\","
         "\"vocab\":{},\"merges\":[]}}",
         "BertProcessing"},
        /* refused inside a Sequence, after components that own memory */
        {"{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\","
         "\"pattern\":{\"Regex\":\"a+\"},\"content\":\"b\"},{\"type\":\"Lowercase\"}]},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "Lowercase"},
        {"{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Isolated\"},{\"type\":"
         "\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},{\"type\":\"Punctuation\"}]}]},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "Punctuation"},
        {"{\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
         "{\"String\":\"a\"},\"content\":\"b\"},{\"type\":\"WordPiece\"}]},\"model\":{\"type\":"
         "\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "WordPiece"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},"
         "\"behavior\":\"Sideways\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "Sideways"},
    };
    for (size_t i = 0; i < N(unsupported); i++) {
        tok = NULL;
        ck_assert_int_eq(tok_load_json(unsupported[i].json, strlen(unsupported[i].json), NULL,
                                           0, &tok, &err),
                         INF_E_UNSUPPORTED);
        ck_assert_ptr_null(tok);
        ck_assert_msg(strstr(err.msg, unsupported[i].name), "message \"%s\" names %s", err.msg,
                      unsupported[i].name);
    }
    const char *badmerge =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}";
    ck_assert_int_eq(tok_load_json(badmerge, strlen(badmerge), NULL, 0, &tok, &err),
                     INF_E_FORMAT);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("fixtures");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, fixtures_llama2);
    tcase_add_test(tc, fixtures_llama3_1);
    tcase_add_test(tc, fixtures_qwen3);
    tcase_add_loop_test(tc, fixtures_variants, 0, 4);
    suite_add_tcase(s, tc);
    tc = tcase_create("stream");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, stream_llama2);
    tcase_add_test(tc, stream_llama3_1);
    tcase_add_test(tc, stream_qwen3);
    tcase_add_loop_test(tc, stream_variants, 0, 4);
    tcase_add_test(tc, stream_continuation);
    tcase_add_test(tc, encode_concurrent);
    tcase_add_test(tc, real_metadata);
    suite_add_tcase(s, tc);
    tc = tcase_create("components");
    tcase_add_test(tc, split_behaviors);
    tcase_add_test(tc, digits_and_metaspace);
    tcase_add_test(tc, tiny_byte_level);
    tcase_add_test(tc, tiny_sentencepiece);
    tcase_add_test(tc, strip_end_stream);
    tcase_add_test(tc, errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tokenizer_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
