/* test_tokenizer_diff.c — differential test against a second implementation:
 * the pure-JS @huggingface/tokenizers package (run with node, fetched with the
 * tokenizers by scripts/fetch-tokenizers.sh into INT4SERVE_TOKENIZER_CACHE)
 * encodes a few thousand generated strings, random mixes of the corpus's
 * character classes, and ours must give the same ids. The seed is printed;
 * INT4SERVE_TOKENIZER_SEED=<n> replays a run. A disagreement prints the string
 * and both id lists. Missing node or the cache fails under CI=true and skips
 * visibly elsewhere. */
#include "tokenizer/tokenizer.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N_STRINGS 1500

static bool in_ci(void)
{
    const char *ci = getenv("CI");
    return ci && !strcmp(ci, "true");
}

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

/* Character classes of the corpus, including the whitespace whose status
 * differs between regex engines (U+0085, U+FEFF, U+2028). */
static const char *const WORDS[] = {"the",      "quick",      "Hello",     "WORLD", "naïve",
                                    "café",     "straße",     "I",         "a",     "xyz",
                                    "token",    "Tokenizer",  "return",    "def",   "int",
                                    "__init__", "snake_case", "camelCase", "ab12",  "x"};
static const char *const SPACES[] = {
    " ",    "  ",   "   ",    "\t",     "\n",       "\n\n",   "\r\n",   " \n",
    "\t\t", "    ", "\u00a0", "\u3000", "\xC2\x85", "\ufeff", "\u2028", " \xC2\x85 "};
static const char *const PUNCT[] = {
    ".",  ",", "!",  "?", "...", ";", ":",  "-",  "--", "—",  "(",  ")",  "[",  "]",
    "{",  "}", "\"", "'", "`",   "/", "\\", "#",  "$",  "%",  "&",  "*",  "+",  "=",
    "<",  ">", "|",  "~", "^",   "@", "_",  "!!", "?!", "::", "->", "=>", "//", "/*",
    "*/", "«", "»",  "“", "”",   "‘", "’",  "…",  "€",  "£",  "¥",  "©",  "°",  "±"};
static const char *const CONTRACTIONS[] = {"'s", "'t", "'re", "'ve", "'m",  "'ll",
                                           "'d", "'S", "'T",  "'RE", "'LL", "n't"};
static const char *const UNICODE[] = {"中文",
                                      "你好",
                                      "世界",
                                      "我",
                                      "的",
                                      "日本語",
                                      "ひらがな",
                                      "カタカナ",
                                      "한국어",
                                      "안녕",
                                      "😀",
                                      "😃",
                                      "🙂",
                                      "👍",
                                      "👍🏽",
                                      "👨‍👩‍👧",
                                      "👨‍👩‍👧‍👦",
                                      "🏳️‍🌈",
                                      "🇺🇸",
                                      "❤️",
                                      "1️⃣",
                                      "🧑🏿‍🚀",
                                      "🤖",
                                      "é",
                                      "e\u0301",
                                      "ü",
                                      "ñ",
                                      "ß",
                                      "Å",
                                      "A\u030a",
                                      "ﬁ",
                                      "Ω",
                                      "مرحبا",
                                      "بالعالم",
                                      "שלום",
                                      "עולם",
                                      "Привет",
                                      "мир",
                                      "Γειά",
                                      "नमस्ते",
                                      "สวัสดี",
                                      "ქართული",
                                      "𝔘𝔫𝔦",
                                      "∀x∈ℝ",
                                      "²",
                                      "½",
                                      "٣",
                                      "१२",
                                      "①",
                                      "Ⅻ",
                                      "\U0001f9ec",
                                      "\U00010348",
                                      "𓀀",
                                      "ꙮ",
                                      "\u200b",
                                      "\u200d",
                                      "\u202e",
                                      "\ufffd",
                                      "ſ"};
static const char *const SPECIALS[] = {"<s>",
                                       "</s>",
                                       "<unk>",
                                       "<|begin_of_text|>",
                                       "<|end_of_text|>",
                                       "<|eot_id|>",
                                       "<|start_header_id|>",
                                       "<|im_start|>",
                                       "<|im_end|>",
                                       "<|endoftext|>",
                                       "<think>",
                                       "<|reserved_special_token_3|>",
                                       "<|",
                                       "|>"};

#define PICK(a) (a)[rnd(sizeof(a) / sizeof *(a))]

static void gen_string(char *buf, size_t cap)
{
    size_t n = 0;
    int parts = 1 + (int)rnd(12);
    buf[0] = 0;
    for (int i = 0; i < parts; i++) {
        char tmp[64];
        const char *p;
        switch (rnd(9)) {
        case 0:
        case 1:
            p = PICK(WORDS);
            break;
        case 2:
            p = PICK(SPACES);
            break;
        case 3:
            p = PICK(PUNCT);
            break;
        case 4: {
            size_t d = 1 + rnd(15);
            for (size_t k = 0; k < d; k++)
                tmp[k] = (char)('0' + rnd(10));
            tmp[d] = 0;
            p = tmp;
            break;
        }
        case 5:
            p = PICK(CONTRACTIONS);
            break;
        case 6:
        case 7:
            p = PICK(UNICODE);
            break;
        default:
            p = rnd(3) ? PICK(SPACES) : PICK(SPECIALS);
            break;
        }
        size_t l = strlen(p);
        if (n + l + 1 >= cap)
            break;
        memcpy(buf + n, p, l + 1);
        n += l;
    }
}

static void run_diff(const char *name)
{
    const char *cache = getenv("INT4SERVE_TOKENIZER_CACHE");
    const char *src = getenv("INT4SERVE_SOURCE_DIR");
    char dir[4096], pkg[4096], script[4096];
    snprintf(dir, sizeof dir, "%s/%s", cache ? cache : "", name);
    snprintf(pkg, sizeof pkg, "%s/node_modules/@huggingface/tokenizers/package.json",
             cache ? cache : "");
    snprintf(script, sizeof script, "%s/tests/tokenizer/js_encode.mjs", src ? src : ".");
    struct inf_err err;
    tok_tokenizer_t *tok = NULL;
    bool have = cache && access(pkg, R_OK) == 0 && tok_load(dir, &tok, &err) == INF_OK &&
                system("node --version >/dev/null 2>&1") == 0;
    if (!have) {
        tok_destroy(tok);
        if (in_ci())
            ck_abort_msg("differential test needs node and scripts/fetch-tokenizers.sh's cache");
        printf("SKIPPED: node or the tokenizer cache missing (run scripts/fetch-tokenizers.sh)\n");
        return;
    }
    const char *seed_env = getenv("INT4SERVE_TOKENIZER_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    rng_state = seed ^ 0x9E3779B97F4A7C15ull;
    printf("differential %s: seed %llu (INT4SERVE_TOKENIZER_SEED=%llu replays it)\n", name,
           (unsigned long long)seed, (unsigned long long)seed);

    char in_path[] = "/tmp/int4serve-tokdiff-in-XXXXXX";
    char out_path[] = "/tmp/int4serve-tokdiff-out-XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path);
    ck_assert(fi >= 0 && fo >= 0);
    close(fo);
    FILE *f = fdopen(fi, "w");
    static char strs[N_STRINGS][512];
    for (int i = 0; i < N_STRINGS; i++) {
        gen_string(strs[i], sizeof strs[i]);
        json_t *j = json_string(strs[i]);
        ck_assert_ptr_nonnull(j);
        char *line = json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        fprintf(f, "%s\n", line);
        free(line);
        json_decref(j);
    }
    fclose(f);
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "node '%s' '%s' '%s' '%s' '%s'", script, cache, dir, in_path,
             out_path);
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "node failed (%d): %s", rc, cmd);
    FILE *g = fopen(out_path, "r");
    ck_assert_ptr_nonnull(g);
    char *line = NULL;
    size_t cap = 0;
    int agree = 0, total = 0, shown = 0;
    for (int i = 0; i < N_STRINGS; i++) {
        ssize_t n = getline(&line, &cap, g);
        ck_assert_msg(n > 0, "node wrote %d lines, expected %d", i, N_STRINGS);
        json_error_t je;
        json_t *want = json_loadb(line, (size_t)n, 0, &je);
        ck_assert(json_is_array(want));
        struct tok_ids ids = {0};
        ck_assert_int_eq(tok_encode(tok, strs[i], strlen(strs[i]), NULL, &ids, &err), INF_OK);
        bool same = ids.n == json_array_size(want);
        for (size_t k = 0; same && k < ids.n; k++)
            same = ids.ids[k] == json_integer_value(json_array_get(want, k));
        total++;
        if (same)
            agree++;
        else if (shown++ < 10) {
            json_t *js = json_string(strs[i]);
            char *q = json_dumps(js, JSON_ENCODE_ANY);
            char *w = json_dumps(want, JSON_COMPACT);
            printf("DISAGREE %s on %s\n  ours [", name, q);
            for (size_t k = 0; k < ids.n; k++)
                printf("%s%d", k ? "," : "", ids.ids[k]);
            printf("]\n  js   %s\n", w);
            free(q);
            free(w);
            json_decref(js);
        }
        tok_ids_fini(&ids);
        json_decref(want);
    }
    free(line);
    fclose(g);
    unlink(in_path);
    unlink(out_path);
    printf("differential %s: %d/%d agree (seed %llu)\n", name, agree, total,
           (unsigned long long)seed);
    tok_destroy(tok);
    ck_assert_int_eq(agree, total);
}

START_TEST(diff_llama2)
{
    run_diff("llama2");
}
END_TEST

START_TEST(diff_llama3_1)
{
    run_diff("llama3_1");
}
END_TEST

START_TEST(diff_qwen3)
{
    run_diff("qwen3");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tokenizer_diff");
    TCase *tc = tcase_create("js");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, diff_llama2);
    tcase_add_test(tc, diff_llama3_1);
    tcase_add_test(tc, diff_qwen3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
