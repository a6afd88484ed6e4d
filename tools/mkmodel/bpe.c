/* tools/mkmodel/bpe.c — see bpe.h.
 *
 * Training: the text is split into words the way GPT-2's pre-tokenizer
 * does for ASCII (contractions, an optional space followed by letters,
 * digits or punctuation, runs of white space), each word becomes its bytes,
 * and the most frequent adjacent pair (weighted by word count; ties to the
 * lowest pair of ids) is merged until max_merges or no pair repeats. */
#include "tools/mkmodel/bpe.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The training text: plain English about everyday things, written for this
 * tool. */
static const char corpus[] =
    "The morning was cold and clear, and the river ran quietly under the old stone bridge. "
    "People walked to the market with baskets in their hands, talking about the weather, the "
    "price of bread and the news from the town on the other side of the hill. A small boy "
    "stopped to watch the boats moving slowly on the water, and his mother called him back "
    "because they were late. In the market there were apples, pears, onions and potatoes, "
    "fresh fish from the coast, cheese from the farms in the valley, and flowers of every "
    "colour. The baker had opened his shop before the sun came up, and the smell of warm "
    "bread filled the street. He said that the harvest had been good this year, better than "
    "the last one, and that the price of flour would fall before the winter.\n\n"
    "In the afternoon the teacher read a story to the children. It was about a fox who "
    "wanted to cross the river but could not swim, and about the clever ways he tried to "
    "reach the other side. First he asked the heron, then the turtle, and at last he waited "
    "for the winter, when the water turned to ice and he could walk across. The children "
    "laughed and asked her to read it again. She told them that patience is often the best "
    "answer to a hard question, and that a good idea can take a long time to grow.\n\n"
    "Later that evening the family sat down together for dinner. They talked about their "
    "day: the father had repaired the roof of the barn, the daughter had finished her "
    "lessons, and the grandmother had written a letter to her sister who lived in the city. "
    "After dinner they played cards by the fire while the wind moved through the trees "
    "outside. It's the kind of evening we'll remember, the grandmother said, and they all "
    "agreed. The light from the window fell on the snow in the garden, and the night was "
    "very still.\n\n"
    "A computer is a machine that follows instructions. It reads numbers from its memory, "
    "adds and multiplies them, compares them and writes the results back, billions of times "
    "each second. A program is a list of such instructions written by people, and a good "
    "program is one that other people can read, test and change without fear. When a "
    "program answers a question, it should answer quickly and correctly, and when it cannot "
    "answer, it should say why. The first computers filled whole rooms; the ones we carry "
    "today are smaller than a book and much faster.\n\n"
    "The weather report for the weekend says that the rain will stop on Saturday and the "
    "sun will return on Sunday, with temperatures between 12 and 18 degrees. Farmers are "
    "glad, because the fields need a few dry days before the next planting. The road to the "
    "north will be closed for repairs from Monday to Thursday, so travellers should take the "
    "coast road instead. The museum in the town square will open its new exhibition about "
    "the history of the river, with old maps, photographs and models of the boats that once "
    "carried wool and grain to the sea.\n\n"
    "Learning a new language takes time. You start with simple words: hello, thank you, "
    "water, bread, house, friend. Then you learn to make sentences, to ask questions and to "
    "understand the answers. You make mistakes, and that is how you learn. After a year you "
    "can read a newspaper, and after a few years you can think in the new language without "
    "translating. The most important thing is to practise every day, even for a few minutes, "
    "and to talk with people who speak it well.\n";

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
 * others are moved to U+0100 and up, so every byte is a visible character. */
static void byte_symbol(int b, char out[3])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

struct word {
    int32_t *sym;
    int32_t len;
    int32_t count;
    const char *text; /* into the corpus, not NUL-terminated */
    int32_t text_len;
};

/* Length of the pre-tokenizer chunk starting at s (ASCII approximation of
 * GPT-2's pattern). */
static int32_t chunk_len(const char *s)
{
    static const char *contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t i = 0; i < sizeof contractions / sizeof contractions[0]; i++) {
        size_t n = strlen(contractions[i]);
        if (strncmp(s, contractions[i], n) == 0)
            return (int32_t)n;
    }
    int32_t i = 0;
    if (s[0] == ' ' && s[1] != '\0' && !isspace((unsigned char)s[1])) {
        i = 1; /* " word": the space joins what follows */
    } else if (isspace((unsigned char)s[0])) {
        while (isspace((unsigned char)s[i]))
            i++;
        /* a run of spaces before a word leaves its last space to the word */
        if (s[i] != '\0' && i > 1 && s[i - 1] == ' ')
            i--;
        return i;
    }
    const char *p = s + i;
    int32_t k = 0;
    if (isalpha((unsigned char)p[0])) {
        while (isalpha((unsigned char)p[k]))
            k++;
    } else if (isdigit((unsigned char)p[0])) {
        while (isdigit((unsigned char)p[k]))
            k++;
    } else {
        while (p[k] && !isspace((unsigned char)p[k]) && !isalnum((unsigned char)p[k]))
            k++;
    }
    return i + (k ? k : 1);
}

void bpe_free(struct bpe_vocab *v)
{
    if (!v)
        return;
    for (int32_t i = 0; v->symbols && i < v->n_symbols; i++)
        free(v->symbols[i]);
    free(v->symbols);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

inf_status_t bpe_train(int32_t max_merges, struct bpe_vocab *v, struct inf_err *err)
{
    memset(v, 0, sizeof *v);
    int32_t cap = 256 + max_merges;
    struct word *words = NULL;
    int32_t n_words = 0;
    int32_t *counts = NULL;
    inf_status_t st = INF_OK;
    v->symbols = calloc((size_t)cap, sizeof *v->symbols);
    v->merges = calloc(max_merges > 0 ? (size_t)max_merges : 1, sizeof *v->merges);
    words = calloc(sizeof corpus, sizeof *words);
    counts = calloc((size_t)cap * (size_t)cap, sizeof *counts);
    if (!v->symbols || !v->merges || !words || !counts)
        goto nomem;
    for (int b = 0; b < 256; b++) {
        char s[3];
        byte_symbol(b, s);
        if (!(v->symbols[b] = strdup(s)))
            goto nomem;
        v->n_symbols++;
    }
    /* words with their counts, in order of first appearance */
    for (const char *p = corpus; *p;) {
        int32_t n = chunk_len(p);
        int32_t w = 0;
        while (w < n_words && !(words[w].text_len == n && memcmp(words[w].text, p, (size_t)n) == 0))
            w++;
        if (w == n_words) {
            words[w].text = p;
            words[w].text_len = n;
            words[w].len = n;
            if (!(words[w].sym = malloc((size_t)n * sizeof *words[w].sym)))
                goto nomem;
            for (int32_t i = 0; i < n; i++)
                words[w].sym[i] = (unsigned char)p[i];
            n_words++;
        }
        words[w].count++;
        p += n;
    }
    while (v->n_merges < max_merges) {
        int32_t ns = v->n_symbols;
        memset(counts, 0, (size_t)ns * (size_t)ns * sizeof *counts);
        for (int32_t w = 0; w < n_words; w++)
            for (int32_t i = 0; i + 1 < words[w].len; i++)
                counts[words[w].sym[i] * ns + words[w].sym[i + 1]] += words[w].count;
        int32_t best = -1, best_count = 1;
        for (int32_t k = 0; k < ns * ns; k++) {
            if (counts[k] > best_count) {
                best_count = counts[k];
                best = k;
            }
        }
        if (best < 0)
            break; /* no pair occurs twice */
        int32_t a = best / ns, b = best % ns;
        size_t la = strlen(v->symbols[a]), lb = strlen(v->symbols[b]);
        char *joined = malloc(la + lb + 1);
        if (!joined)
            goto nomem;
        memcpy(joined, v->symbols[a], la);
        memcpy(joined + la, v->symbols[b], lb + 1);
        /* the same text reached through another pair keeps its first id */
        int32_t id = -1;
        for (int32_t i = 0; i < ns; i++)
            if (strcmp(v->symbols[i], joined) == 0)
                id = i;
        if (id < 0) {
            id = v->n_symbols;
            v->symbols[v->n_symbols++] = joined;
        } else {
            free(joined);
        }
        v->merges[v->n_merges][0] = a;
        v->merges[v->n_merges][1] = b;
        v->n_merges++;
        for (int32_t w = 0; w < n_words; w++) {
            int32_t o = 0;
            for (int32_t i = 0; i < words[w].len; i++) {
                if (i + 1 < words[w].len && words[w].sym[i] == a && words[w].sym[i + 1] == b) {
                    words[w].sym[o++] = id;
                    i++;
                } else {
                    words[w].sym[o++] = words[w].sym[i];
                }
            }
            words[w].len = o;
        }
    }
    v->bos_id = v->n_symbols;
    v->eos_id = v->n_symbols + 1;
    v->size = v->n_symbols + 2;
    goto out;
nomem:
    st = inf_err_set(err, INF_E_NOMEM, "out of memory training the tokenizer");
    bpe_free(v);
out:
    for (int32_t w = 0; words && w < n_words; w++)
        free(words[w].sym);
    free(words);
    free(counts);
    return st;
}

static json_t *added_token(int32_t id, const char *content)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *byte_level(bool add_prefix_space)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                     add_prefix_space, "trim_offsets", 1, "use_regex", 1);
}

inf_status_t bpe_write_tokenizer_json(const struct bpe_vocab *v, const char *path,
                                      struct inf_err *err)
{
    json_t *vocab = json_object(), *merges = json_array();
    json_t *root = NULL;
    if (!vocab || !merges)
        goto nomem;
    for (int32_t i = 0; i < v->n_symbols; i++)
        if (json_object_set_new(vocab, v->symbols[i], json_integer(i)))
            goto nomem;
    for (int32_t i = 0; i < v->n_merges; i++) {
        const char *a = v->symbols[v->merges[i][0]], *b = v->symbols[v->merges[i][1]];
        size_t n = strlen(a) + strlen(b) + 2;
        char *m = malloc(n);
        if (!m)
            goto nomem;
        snprintf(m, n, "%s %s", a, b);
        int rc = json_array_append_new(merges, json_string(m));
        free(m);
        if (rc)
            goto nomem;
    }
    json_t *single = json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}]", "SpecialToken", "id", BPE_BOS,
                               "type_id", 0, "Sequence", "id", "A", "type_id", 0);
    json_t *pair =
        json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}]",
                  "SpecialToken", "id", BPE_BOS, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                  "SpecialToken", "id", BPE_BOS, "type_id", 1, "Sequence", "id", "B", "type_id", 1);
    json_t *special = json_pack("{s:{s:s, s:[i], s:[s]}}", BPE_BOS, "id", BPE_BOS, "ids",
                                (int)v->bos_id, "tokens", BPE_BOS);
    json_t *post = json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single,
                             "pair", pair, "special_tokens", special);
    json_t *model =
        json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:O, s:O}", "type", "BPE", "dropout",
                  "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                  "byte_fallback", 0, "vocab", vocab, "merges", merges);
    json_t *added =
        json_pack("[o, o]", added_token(v->bos_id, BPE_BOS), added_token(v->eos_id, BPE_EOS));
    root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:o, s:o}", "version", "1.0",
                     "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer",
                     byte_level(false), "post_processor", post, "decoder", byte_level(true),
                     "model", model);
    if (!root)
        goto nomem;
    json_decref(vocab);
    json_decref(merges);
    if (json_dump_file(root, path, JSON_INDENT(2)) != 0) {
        json_decref(root);
        return inf_err_set(err, INF_E_IO, "tokenizer.json: write failed");
    }
    json_decref(root);
    return INF_OK;
nomem:
    json_decref(vocab);
    json_decref(merges);
    json_decref(root);
    return inf_err_set(err, INF_E_NOMEM, "out of memory writing tokenizer.json");
}
