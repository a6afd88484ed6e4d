/* int4serve-generate: --prompt TEXT encodes with the model's tokenizer and
 * generates exactly what --prompt-ids gives for those ids; the "text:" line
 * is the decode of the printed ids; bad flags are refused. */
#include "common/inf.h"
#include "tokenizer/tokenizer.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char model_dir[256];
static char bin_gen[512], bin_mk[512];

static void setup(void)
{
    const char *bd = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(bd != NULL, "INT4SERVE_BUILD_DIR is not set");
    snprintf(bin_gen, sizeof bin_gen, "%s/tools/generate/int4serve-generate", bd);
    snprintf(bin_mk, sizeof bin_mk, "%s/tools/mkmodel/int4serve-mkmodel", bd);
    snprintf(model_dir, sizeof model_dir, "/tmp/int4serve-test-generate-%d", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --out %s --preset tiny --seed 7 >/dev/null 2>&1", bin_mk,
             model_dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", model_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Run cmd, capture stdout (up to cap-1 bytes) into out; return the exit status. */
static int run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The first line of s, copied into line. */
static void first_line(const char *s, char *line, size_t cap)
{
    size_t n = strcspn(s, "\n");
    ck_assert_uint_lt(n, cap);
    memcpy(line, s, n);
    line[n] = '\0';
}

START_TEST(prompt_text_equals_prompt_ids)
{
    const char *text = "The quick brown fox jumps";
    tok_tokenizer_t *tok = NULL;
    struct inf_err err = {0};
    ck_assert_int_eq(tok_load(model_dir, &tok, &err), INF_OK);
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(tok, text, strlen(text), NULL, &ids, &err), INF_OK);
    ck_assert_uint_gt(ids.n, 2);

    char idlist[1024] = "";
    for (size_t i = 0; i < ids.n; i++) {
        char one[16];
        snprintf(one, sizeof one, "%s%d", i ? "," : "", ids.ids[i]);
        strcat(idlist, one);
    }
    char cmd[2048], out_text[8192], out_ids[8192];
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt '%s' --max-tokens 12 2>/dev/null", bin_gen,
             model_dir, text);
    ck_assert_int_eq(run(cmd, out_text, sizeof out_text), 0);
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt-ids %s --max-tokens 12 2>/dev/null", bin_gen,
             model_dir, idlist);
    ck_assert_int_eq(run(cmd, out_ids, sizeof out_ids), 0);

    char l1[1024], l2[1024];
    first_line(out_text, l1, sizeof l1);
    first_line(out_ids, l2, sizeof l2);
    ck_assert_str_eq(l1, l2); /* same generated ids */

    /* Parse the ids and check the "text:" line is their decode (ids past
     * the tokenizer's vocabulary give no text). */
    int32_t gen[12];
    int n = 0;
    for (char *p = l1; *p && n < 12;) {
        gen[n++] = (int32_t)strtol(p, &p, 10);
        if (*p == ',')
            p++;
    }
    ck_assert_int_eq(n, 12);
    int32_t known[12];
    size_t kept = 0;
    for (int i = 0; i < n; i++)
        if (gen[i] < tok_vocab_size(tok))
            known[kept++] = gen[i];
    char *dec = NULL;
    size_t dlen = 0;
    ck_assert_int_eq(tok_decode(tok, known, kept, true, &dec, &dlen, &err), INF_OK);
    const char *tl = strstr(out_text, "\ntext: \"");
    ck_assert_ptr_nonnull(tl);
    tl += strlen("\ntext: \"");
    /* Unescape the tool's line: \" \\ \n and \u00XX. */
    char got[4096];
    size_t g = 0;
    while (*tl && *tl != '\n' && g + 1 < sizeof got) {
        if (*tl == '"' && tl[1] == '\n')
            break;
        if (*tl == '\\') {
            tl++;
            if (*tl == 'n')
                got[g++] = '\n', tl++;
            else if (*tl == 'u')
                got[g++] = (char)strtol(tl + 1, NULL, 16), tl += 5;
            else
                got[g++] = *tl++;
        } else {
            got[g++] = *tl++;
        }
    }
    got[g] = '\0';
    ck_assert_uint_eq(g, dlen);
    ck_assert(memcmp(got, dec, dlen) == 0);
    free(dec);
    tok_ids_fini(&ids);
    tok_destroy(tok);
}
END_TEST

START_TEST(bad_flags_refused)
{
    char cmd[1024], out[4096];
    /* both prompt forms at once */
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt x --prompt-ids 1 --max-tokens 2 2>/dev/null",
             bin_gen, model_dir);
    ck_assert_int_eq(run(cmd, out, sizeof out), 2);
    /* neither */
    snprintf(cmd, sizeof cmd, "%s --model %s --max-tokens 2 2>/dev/null", bin_gen, model_dir);
    ck_assert_int_eq(run(cmd, out, sizeof out), 2);
    /* empty text encodes to BOS only for this tokenizer: still generates */
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt '' --max-tokens 2 2>/dev/null", bin_gen,
             model_dir);
    int st = run(cmd, out, sizeof out);
    ck_assert_msg(st == 0 || st == 2, "exit %d", st);
    /* a model folder without a tokenizer: --prompt is an error naming it */
    snprintf(cmd, sizeof cmd, "%s --model /nonexistent --prompt x --max-tokens 2 2>&1", bin_gen);
    ck_assert_int_eq(run(cmd, out, sizeof out), 1);
    ck_assert_ptr_nonnull(strstr(out, "tokenizer"));
    /* an unknown backend is a usage error naming the flag */
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt-ids 1 --max-tokens 2 --backend tpu 2>&1",
             bin_gen, model_dir);
    ck_assert_int_eq(run(cmd, out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "--backend"));
    /* --backend cuda: four generated ids where a GPU is usable (whether they
     * equal the CPU's is the GPU tests' business: near ties may flip), else
     * a clear error naming the backend; never a crash */
    char line[256];
    snprintf(cmd, sizeof cmd,
             "%s --model %s --prompt-ids 1,5,9 --max-tokens 4 --backend cuda 2>/dev/null", bin_gen,
             model_dir);
    st = run(cmd, out, sizeof out);
    if (st == 0) {
        first_line(out, line, sizeof line);
        int commas = 0;
        for (const char *q = line; *q; q++) {
            ck_assert_msg(*q == ',' || (*q >= '0' && *q <= '9'), "ids line: %s", line);
            commas += *q == ',';
        }
        ck_assert_int_eq(commas, 3);
    } else {
        ck_assert_int_eq(st, 1);
        snprintf(cmd, sizeof cmd,
                 "%s --model %s --prompt-ids 1,5,9 --max-tokens 4 --backend cuda 2>&1", bin_gen,
                 model_dir);
        ck_assert_int_eq(run(cmd, out, sizeof out), 1);
        ck_assert_ptr_nonnull(strstr(out, "backend cuda"));
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("generate");
    TCase *tc = tcase_create("prompt");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, prompt_text_equals_prompt_ids);
    tcase_add_test(tc, bad_flags_refused);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
