/* Sampler: greedy, temperature with per-request seeds, top-k, top-p, min-p,
 * penalties with exact arithmetic, logit_bias, raw logprobs, and the
 * validation of every setting. */
#include "engine/sched/sampler.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static eng_sampler_t *mk(const struct eng_sampler_params *p, int vocab)
{
    eng_sampler_t *s;
    struct inf_err err = {0};
    inf_status_t st = eng_sampler_create(p, vocab, &s, &err);
    ck_assert_msg(st == INF_OK, "%s", err.msg);
    return s;
}

static int draw(eng_sampler_t *s, const float *lg)
{
    struct eng_sample out;
    ck_assert_int_eq(eng_sampler_sample(s, lg, &out, NULL), INF_OK);
    return out.token;
}

START_TEST(greedy_argmax_lowest_on_ties)
{
    struct eng_sampler_params p;
    eng_sampler_params_default(&p);
    float lg[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -INFINITY};
    eng_sampler_t *s = mk(&p, 6);
    ck_assert_int_eq(draw(s, lg), 1);
    eng_sampler_destroy(s);
    eng_sampler_destroy(NULL);
}
END_TEST

START_TEST(seed_reproducible_and_distribution)
{
    struct eng_sampler_params p;
    eng_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 1234;
    float lg[4] = {0.0f, logf(2.0f), logf(3.0f), logf(4.0f)}; /* p = .1 .2 .3 .4 */
    eng_sampler_t *a = mk(&p, 4), *b = mk(&p, 4);
    p.seed = 99;
    eng_sampler_t *c = mk(&p, 4);
    int count[4] = {0}, differ = 0;
    for (int i = 0; i < 20000; i++) {
        int x = draw(a, lg), y = draw(b, lg), z = draw(c, lg);
        ck_assert_int_eq(x, y);
        differ += x != z;
        count[x]++;
    }
    ck_assert_int_gt(differ, 1000);
    for (int t = 0; t < 4; t++) /* within 5 standard deviations of 20000 * p */
        ck_assert_msg(fabs(count[t] - 2000.0 * (t + 1)) < 5 * sqrt(20000 * 0.1 * (t + 1)),
                      "token %d drawn %d times", t, count[t]);
    eng_sampler_destroy(a), eng_sampler_destroy(b), eng_sampler_destroy(c);
}
END_TEST

START_TEST(top_k_top_p_min_p_restrict)
{
    float lg[5] = {3.0f, 2.9f, 2.8f, 0.0f, -1.0f};
    struct eng_sampler_params p;
    eng_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 2;
    eng_sampler_t *s = mk(&p, 5);
    int seen[5] = {0};
    for (int i = 0; i < 2000; i++)
        seen[draw(s, lg)]++;
    ck_assert(seen[0] > 0 && seen[1] > 0 && !seen[2] && !seen[3] && !seen[4]);
    eng_sampler_destroy(s);
    /* top_p: probabilities ~ .35 .32 .29 .02 .01: 0.6 keeps the first two */
    p.top_k = 0;
    p.top_p = 0.6f;
    s = mk(&p, 5);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 2000; i++)
        seen[draw(s, lg)]++;
    ck_assert(seen[0] > 0 && seen[1] > 0 && !seen[2] && !seen[3]);
    eng_sampler_destroy(s);
    /* min_p 0.5: keeps tokens with p >= p_max / 2: the first three */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    s = mk(&p, 5);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 3000; i++)
        seen[draw(s, lg)]++;
    ck_assert(seen[0] && seen[1] && seen[2] && !seen[3] && !seen[4]);
    eng_sampler_destroy(s);
    /* top_k 1 is greedy */
    p.min_p = 0.0f;
    p.top_k = 1;
    s = mk(&p, 5);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(draw(s, lg), 0);
    eng_sampler_destroy(s);
}
END_TEST

START_TEST(penalties_exact)
{
    /* repetition 2 on prompt token 0 (positive: 4 -> 2) and output token 1
     * (negative: -1 -> -2); frequency 0.5 and presence 0.25 on token 2 seen
     * twice in the output: 3 - 1 - 0.25 = 1.75 < token 3's 1.8. */
    float lg[4] = {4.0f, -1.0f, 3.0f, 1.8f};
    struct eng_sampler_params p;
    eng_sampler_params_default(&p);
    p.repetition_penalty = 2.0f;
    eng_sampler_t *s = mk(&p, 4);
    int32_t prompt[1] = {0};
    eng_sampler_add_prompt(s, prompt, 1);
    ck_assert_int_eq(draw(s, lg), 2); /* 4/2 = 2 < 3 */
    eng_sampler_destroy(s);
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    s = mk(&p, 4);
    eng_sampler_add_prompt(s, prompt, 1); /* prompt tokens do not count here */
    ck_assert_int_eq(draw(s, lg), 0);
    lg[0] = 0.0f;
    eng_sampler_accept(s, 2);
    ck_assert_int_eq(draw(s, lg), 2); /* 3 - 0.5 - 0.25 = 2.25 */
    eng_sampler_accept(s, 2);
    ck_assert_int_eq(draw(s, lg), 3); /* 3 - 1 - 0.25 = 1.75 */
    eng_sampler_destroy(s);
}
END_TEST

START_TEST(logit_bias_and_logprobs)
{
    float lg[6] = {1.0f, 3.0f, 2.0f, -2.0f, 3.0f, 0.5f};
    struct eng_logit_bias lb[1] = {{3, 10.0f}};
    struct eng_sampler_params p;
    eng_sampler_params_default(&p);
    p.logit_bias = lb;
    p.n_logit_bias = 1;
    p.n_logprobs = 5;
    eng_sampler_t *s = mk(&p, 6);
    lb[0].bias = 0.0f; /* the sampler kept its own copy */
    struct eng_sample out;
    ck_assert_int_eq(eng_sampler_sample(s, lg, &out, NULL), INF_OK);
    ck_assert_int_eq(out.token, 3);
    double lse = 0;
    for (int i = 0; i < 6; i++)
        lse += exp(lg[i]);
    lse = log(lse);
    /* logprobs of the raw logits, not the biased ones */
    ck_assert(fabs(out.logprob - (-2.0 - lse)) < 1e-5);
    ck_assert_int_eq(out.n_top, 5);
    int order[5] = {1, 4, 2, 0, 5};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(out.top_ids[i], order[i]);
        ck_assert(fabs(out.top_logprobs[i] - (lg[order[i]] - lse)) < 1e-5);
    }
    eng_sampler_destroy(s);
}
END_TEST

START_TEST(settings_validated)
{
    struct eng_sampler_params p;
    eng_sampler_t *s;
    struct inf_err err;
    eng_sampler_params_default(&p);
    p.temperature = -1.0f;
    ck_assert_int_eq(eng_sampler_create(&p, 10, &s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "temperature"));
    eng_sampler_params_default(&p);
    p.top_p = 0.0f;
    ck_assert_int_eq(eng_sampler_create(&p, 10, &s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "top_p"));
    eng_sampler_params_default(&p);
    p.min_p = 1.5f;
    ck_assert_int_eq(eng_sampler_create(&p, 10, &s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "min_p"));
    eng_sampler_params_default(&p);
    p.presence_penalty = 3.0f;
    ck_assert_int_eq(eng_sampler_create(&p, 10, &s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "presence_penalty"));
    eng_sampler_params_default(&p);
    p.n_logprobs = 21;
    ck_assert_int_eq(eng_sampler_create(&p, 10, &s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "logprobs"));
    eng_sampler_params_default(&p);
    struct eng_logit_bias lb = {10, 1.0f};
    p.logit_bias = &lb;
    p.n_logit_bias = 1;
    ck_assert_int_eq(eng_sampler_create(&p, 10, &s, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "10"));
    /* everything excluded */
    eng_sampler_params_default(&p);
    p.temperature = 0.7f;
    s = mk(&p, 3);
    float lg[3] = {-INFINITY, -INFINITY, -INFINITY};
    struct eng_sample out;
    ck_assert_int_eq(eng_sampler_sample(s, lg, &out, &err), INF_E_INVALID);
    eng_sampler_destroy(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sampler");
    TCase *t = tcase_create("sampling");
    tcase_add_test(t, greedy_argmax_lowest_on_ties);
    tcase_add_test(t, seed_reproducible_and_distribution);
    tcase_add_test(t, top_k_top_p_min_p_restrict);
    tcase_add_test(t, penalties_exact);
    tcase_add_test(t, logit_bias_and_logprobs);
    tcase_add_test(t, settings_validated);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
