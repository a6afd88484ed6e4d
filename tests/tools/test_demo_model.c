/* The committed demo model (models/kjv-demo) against what transformers and
 * tokenizers gave when it was trained (its reference.json, written by
 * tools/demo-model/train.py on the GPU machine):
 * - our tokenizer gives tokenizers' ids for the reference strings and for
 *   the whole held-out text (count and FNV-1a fingerprint);
 * - greedy generation on the CPU backend, fp32 weights, gives transformers'
 *   greedy ids for every reference prompt;
 * - int4serve-perplexity in fp32 gives transformers' held-out perplexity
 *   within 1e-4, and every INT4 setting (group 128, 64, 32, per-channel;
 *   asymmetric and symmetric) stays within its bound of it, and an FP8 KV
 *   cache adds at most QUALITY_FP8_KV_BOUND to fp32 and to INT4 weights
 *   (quality.h);
 * - the tool refuses a window longer than the model and a missing file. */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/sched/greedy.h"
#include "tests/tools/quality.h"
#include "tokenizer/tokenizer.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *sd, *bd;
static char model_dir[1024];
static json_t *ref;

static void setup(void)
{
    sd = getenv("INT4SERVE_SOURCE_DIR");
    bd = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(sd && bd, "INT4SERVE_SOURCE_DIR and INT4SERVE_BUILD_DIR must be set");
    snprintf(model_dir, sizeof model_dir, "%s/models/kjv-demo", sd);
    ref = quality_reference(sd);
    ck_assert_msg(ref != NULL, "cannot read %s/reference.json", model_dir);
}

static void teardown(void)
{
    json_decref(ref);
}

static void ids_of(const json_t *a, int32_t *out, size_t *n, size_t cap)
{
    *n = json_array_size(a);
    ck_assert_uint_le(*n, cap);
    for (size_t i = 0; i < *n; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(a, i));
}

START_TEST(tokenizer_matches_reference)
{
    struct inf_err err = {0};
    tok_tokenizer_t *tok = NULL;
    ck_assert_msg(tok_load(model_dir, &tok, &err) == INF_OK, "%s", err.msg);
    size_t i;
    json_t *e;
    int32_t want[256];
    size_t nw;
    json_array_foreach(json_object_get(ref, "tokenize"), i, e)
    {
        const char *text = json_string_value(json_object_get(e, "text"));
        ids_of(json_object_get(e, "ids"), want, &nw, 256);
        struct tok_ids got = {0};
        ck_assert_int_eq(tok_encode(tok, text, strlen(text), NULL, &got, &err), INF_OK);
        ck_assert_uint_eq(got.n, nw);
        for (size_t k = 0; k < nw; k++)
            ck_assert_msg(got.ids[k] == want[k], "'%s' id %zu: %d, want %d", text, k, got.ids[k],
                          want[k]);
        tok_ids_fini(&got);
    }
    ck_assert_uint_gt(i, 0);
    tok_destroy(tok);
}
END_TEST

START_TEST(cpu_greedy_matches_transformers)
{
    struct inf_err err = {0};
    struct eng_backend *be = NULL;
    eng_model_t *m = NULL;
    struct eng_backend_cpu_opts bo = {.n_threads = 0};
    struct eng_model_opts mo;
    eng_model_opts_default(&mo);
    mo.quant = ENG_QUANT_NONE;
    eng_greedy_size(&mo, 1, 64, 32);
    ck_assert_int_eq(eng_backend_cpu_create(&bo, &be, &err), INF_OK);
    ck_assert_msg(eng_model_load(model_dir, be, &mo, &m, &err) == INF_OK, "%s", err.msg);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ref, "greedy"), i, e)
    {
        int32_t prompt[64], want[64], got[32];
        size_t np, nw;
        ids_of(json_object_get(e, "prompt_ids"), prompt, &np, 64);
        ids_of(json_object_get(e, "ids"), want, &nw, 32);
        const int32_t *const prompts[1] = {prompt};
        const int32_t n_prompt = (int32_t)np;
        struct eng_greedy g = {
            .n_seq = 1, .prompts = prompts, .n_prompt = &n_prompt, .n_new = (int32_t)nw};
        ck_assert_msg(eng_greedy_run(m, &g, got, &err) == INF_OK, "%s", err.msg);
        for (size_t k = 0; k < nw; k++)
            ck_assert_msg(got[k] == want[k], "prompt '%s' token %zu: %d, transformers %d",
                          json_string_value(json_object_get(e, "prompt")), k, got[k], want[k]);
    }
    ck_assert_uint_eq(i, 5);
    eng_model_destroy(m);
    eng_backend_destroy(be);
}
END_TEST

START_TEST(perplexity_fp32_and_int4)
{
    const double want = quality_ref_ppl(ref);
    const json_t *held = json_object_get(ref, "heldout");
    ck_assert(want > 1);
    struct quality_run fp;
    ck_assert(quality_run_tool(bd, sd, "--quantization none", &fp));
    /* the same ids on both sides: the held-out text as tokenizers encoded it */
    ck_assert_int_eq(fp.tokens, json_integer_value(json_object_get(held, "tokens")));
    ck_assert_int_eq(fp.fnv1a32, json_integer_value(json_object_get(held, "fnv1a32")));
    ck_assert_int_eq(fp.predicted, QUALITY_WINDOWS * (QUALITY_CTX - 1));
    printf("fp32: ppl %.5f, transformers %.5f\n", fp.ppl, want);
    ck_assert_msg(fabs(fp.ppl / want - 1) <= QUALITY_FP32_TOL, "fp32 ppl %.6f, transformers %.6f",
                  fp.ppl, want);
    /* an FP8 KV cache costs little more, with 16-bit or INT4 weights */
    struct quality_run f8, q4, q4f8;
    ck_assert(quality_run_tool(bd, sd, "--quantization none --kv-cache-dtype fp8", &f8));
    ck_assert(quality_run_tool(bd, sd, "--quantization int4", &q4));
    ck_assert(quality_run_tool(bd, sd, "--quantization int4 --kv-cache-dtype fp8", &q4f8));
    printf("fp8 KV: fp32 weights %.5f (%+.2f%%), int4 %.5f (%+.2f%% over int4)\n", f8.ppl,
           100 * (f8.ppl / fp.ppl - 1), q4f8.ppl, 100 * (q4f8.ppl / q4.ppl - 1));
    ck_assert(f8.ppl / fp.ppl - 1 <= QUALITY_FP8_KV_BOUND && f8.ppl != fp.ppl);
    ck_assert(q4f8.ppl / q4.ppl - 1 <= QUALITY_FP8_KV_BOUND && q4f8.ppl != q4.ppl);
    for (int c = 0; c < QUALITY_N_CASES; c++) {
        const struct quality_case *q = &quality_cases[c];
        char flags[128];
        snprintf(flags, sizeof flags, "--quantization int4 --group-size %d%s", q->group,
                 q->symmetric ? " --symmetric" : "");
        struct quality_run r;
        ck_assert_msg(quality_run_tool(bd, sd, flags, &r), "%s failed", flags);
        const double loss = r.ppl / want - 1;
        printf("int4 group %d %s: ppl %.5f (+%.2f%%, bound %.1f%%)\n", q->group,
               q->symmetric ? "symmetric" : "asymmetric", r.ppl, 100 * loss, 100 * q->bound);
        ck_assert_msg(loss <= q->bound, "%s: ppl %.5f is %.2f%% over fp32, bound %.1f%%", flags,
                      r.ppl, 100 * loss, 100 * q->bound);
    }
}
END_TEST

START_TEST(tool_refusals)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/tools/perplexity/int4serve-perplexity --model %s --text "
             "%s/tests/fixtures/kjv_heldout.txt --ctx 513 >/dev/null 2>&1",
             bd, model_dir, sd);
    ck_assert_int_ne(system(cmd), 0); /* max_position_embeddings is 512 */
    snprintf(cmd, sizeof cmd,
             "%s/tools/perplexity/int4serve-perplexity --model %s --text /nonexistent "
             ">/dev/null 2>&1",
             bd, model_dir);
    ck_assert_int_ne(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "%s/tools/perplexity/int4serve-perplexity --model %s --text "
             "%s/tests/fixtures/kjv_heldout.txt --quantization int3 >/dev/null 2>&1",
             bd, model_dir, sd);
    ck_assert_int_ne(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("demo_model");
    TCase *tc = tcase_create("reference");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, tokenizer_matches_reference);
    tcase_add_test(tc, cpu_greedy_matches_transformers);
    tcase_add_test(tc, perplexity_fp32_and_int4);
    tcase_add_test(tc, tool_refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
