/* bench_tokenize — encode and decode throughput of tok_* on one thread.
 *
 *   bench_tokenize --corpus tests/tokenizer/corpus.json [--mb 8] NAME=DIR...
 *
 * The text is generated from the corpus exactly as hf_tokenize.py generates
 * it (documents of 64 corpus strings chosen by a 64-bit LCG, joined by a
 * space or a newline), so both print comparable JSON lines: bytes, tokens,
 * MB/s and tokens/s for encode (add_special on) and decode. */
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct doc {
    char *s;
    size_t n;
};

static struct doc *make_docs(json_t *corpus, double mb, size_t *n_docs, size_t *bytes)
{
    uint64_t x = 0x2545F4914F6CDD1Dull;
    size_t cap = 0, n = 0, total = 0, nc = json_array_size(corpus);
    struct doc *docs = NULL;
    while ((double)total < mb * 1e6) {
        size_t len = 0;
        char *s = NULL;
        for (int k = 0; k < 64; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            json_t *v = json_array_get(corpus, (size_t)((x >> 33) % nc));
            size_t l = json_string_length(v);
            s = realloc(s, len + l + 2);
            memcpy(s + len, json_string_value(v), l);
            len += l;
            s[len++] = (x >> 20) & 1 ? '\n' : ' ';
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            docs = realloc(docs, cap * sizeof *docs);
        }
        docs[n++] = (struct doc){s, len};
        total += len;
    }
    *n_docs = n;
    *bytes = total;
    return docs;
}

int main(int argc, char **argv)
{
    const char *corpus_path = NULL;
    double mb = 8;
    int first = 1;
    for (; first < argc; first++) {
        if (!strcmp(argv[first], "--corpus") && first + 1 < argc)
            corpus_path = argv[++first];
        else if (!strcmp(argv[first], "--mb") && first + 1 < argc)
            mb = atof(argv[++first]);
        else
            break;
    }
    if (!corpus_path || first >= argc) {
        fprintf(stderr, "usage: %s --corpus corpus.json [--mb 8] NAME=DIR...\n", argv[0]);
        return 2;
    }
    json_error_t je;
    json_t *corpus = json_load_file(corpus_path, JSON_ALLOW_NUL, &je);
    if (!json_is_array(corpus) || json_array_size(corpus) == 0) {
        fprintf(stderr, "bench_tokenize: cannot read %s\n", corpus_path);
        return 1;
    }
    size_t n_docs, bytes;
    struct doc *docs = make_docs(corpus, mb, &n_docs, &bytes);
    int rc = 0;
    for (int a = first; a < argc; a++) {
        char *spec = argv[a], *eq = strchr(spec, '=');
        if (!eq) {
            fprintf(stderr, "bench_tokenize: expected NAME=DIR, got %s\n", spec);
            rc = 2;
            break;
        }
        *eq = 0;
        struct inf_err err;
        tok_tokenizer_t *tok;
        uint64_t l0 = inf_now_ns();
        if (tok_load(eq + 1, &tok, &err) != INF_OK) {
            fprintf(stderr, "bench_tokenize: %s: %s\n", spec, err.msg);
            rc = 1;
            continue;
        }
        uint64_t l1 = inf_now_ns();
        struct tok_ids *ids = calloc(n_docs, sizeof *ids);
        for (size_t i = 0; i < 16 && i < n_docs; i++) {
            struct tok_ids w = {0};
            tok_encode(tok, docs[i].s, docs[i].n, NULL, &w, &err);
            tok_ids_fini(&w);
        }
        uint64_t t0 = inf_now_ns();
        size_t ntok = 0;
        for (size_t i = 0; i < n_docs; i++) {
            if (tok_encode(tok, docs[i].s, docs[i].n, NULL, &ids[i], &err) != INF_OK) {
                fprintf(stderr, "bench_tokenize: encode: %s\n", err.msg);
                return 1;
            }
            ntok += ids[i].n;
        }
        uint64_t t1 = inf_now_ns();
        size_t outb = 0;
        for (size_t i = 0; i < n_docs; i++) {
            char *text;
            size_t tl;
            if (tok_decode(tok, ids[i].ids, ids[i].n, false, &text, &tl, &err) != INF_OK) {
                fprintf(stderr, "bench_tokenize: decode: %s\n", err.msg);
                return 1;
            }
            outb += tl;
            free(text);
        }
        uint64_t t2 = inf_now_ns();
        double te = (double)(t1 - t0) / 1e9, td = (double)(t2 - t1) / 1e9;
        printf("{\"impl\": \"int4serve\", \"tokenizer\": \"%s\", \"docs\": %zu, \"bytes\": %zu, "
               "\"tokens\": %zu, \"load_s\": %.3f, \"encode_MBps\": %.2f, \"encode_tokps\": %.0f, "
               "\"decode_MBps\": %.2f, \"decode_tokps\": %.0f}\n",
               spec, n_docs, bytes, ntok, (double)(l1 - l0) / 1e9, (double)bytes / te / 1e6,
               (double)ntok / te, (double)outb / td / 1e6, (double)ntok / td);
        fflush(stdout);
        for (size_t i = 0; i < n_docs; i++)
            tok_ids_fini(&ids[i]);
        free(ids);
        tok_destroy(tok);
    }
    for (size_t i = 0; i < n_docs; i++)
        free(docs[i].s);
    free(docs);
    json_decref(corpus);
    return rc;
}
