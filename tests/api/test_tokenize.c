/* POST /tokenize and POST /detokenize: parsing and the response bodies. */
#include "api/api.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static struct api_limits lim;
static struct inf_arena arena;

static void setup(void)
{
    api_limits_init(&lim, "tiny-llama", 32000, 2048);
    inf_arena_init(&arena, 0);
}

static void teardown(void)
{
    inf_arena_fini(&arena);
}

struct bad {
    const char *body;
    int http;
    const char *param, *code, *msg;
};

static void check_bad(const struct bad *b, inf_status_t st, const struct api_fault *f,
                      const struct inf_err *e)
{
    ck_assert_msg(st != INF_OK, "%s: accepted", b->body);
    ck_assert_msg(api_status_http(st) == b->http, "%s: HTTP %d", b->body, api_status_http(st));
    if (b->param)
        ck_assert_msg(f->param && strcmp(f->param, b->param) == 0, "%s: param %s", b->body,
                      f->param ? f->param : "null");
    else
        ck_assert_msg(f->param == NULL, "%s: param %s", b->body, f->param);
    if (b->code)
        ck_assert_msg(f->code && strcmp(f->code, b->code) == 0, "%s: code", b->body);
    else
        ck_assert_msg(f->code == NULL, "%s: code %s", b->body, f->code);
    ck_assert_msg(strcmp(e->msg, b->msg) == 0, "%s:\n got  [%s]\n want [%s]", b->body, e->msg,
                  b->msg);
}

/* ---- /tokenize ---------------------------------------------------------------- */
START_TEST(tokenize_ok)
{
    struct api_tokenize_req r;
    struct inf_err e;
    const char *body = "{\"prompt\":\"Hello\\nworld\"}";
    ck_assert_int_eq(api_tokenize_parse(body, strlen(body), &lim, &arena, &r, NULL, &e), INF_OK);
    ck_assert_ptr_null(r.model);
    ck_assert_str_eq(r.prompt.s, "Hello\nworld");
    ck_assert_uint_eq(r.prompt.len, 11);
    ck_assert(r.add_special_tokens);
    ck_assert_uint_eq(r.n_ignored, 0);

    body = "{\"model\":\"tiny-llama\",\"prompt\":\"\",\"add_special_tokens\":false,"
           "\"return_token_strs\":true}";
    ck_assert_int_eq(api_tokenize_parse(body, strlen(body), &lim, &arena, &r, NULL, &e), INF_OK);
    ck_assert_str_eq(r.model, "tiny-llama");
    ck_assert_str_eq(r.prompt.s, "");
    ck_assert_uint_eq(r.prompt.len, 0);
    ck_assert(!r.add_special_tokens);
    ck_assert_uint_eq(r.n_ignored, 1);
    ck_assert_str_eq(r.ignored[0], "return_token_strs");
}
END_TEST

static const struct bad tokenize_bad[] = {
    {"", 400, NULL, NULL, "The request body is empty; expected a JSON object"},
    {"[\"a\"]", 400, NULL, NULL, "The request body must be a JSON object, got an array"},
    {"{\"prompt\":\"a\",\"prompt\":\"a\"}", 400, NULL, NULL,
     "We could not parse the JSON body of your request: duplicate object key near '\"prompt\"' "
     "(line 1, column 22)"},
    {"{}", 400, "prompt", NULL, "'prompt' is required"},
    {"{\"prompt\":[1,2]}", 400, "prompt", NULL, "'prompt' must be a string, got an array"},
    {"{\"prompt\":\"a\",\"add_special_tokens\":\"no\"}", 400, "add_special_tokens", NULL,
     "'add_special_tokens' must be a boolean, got a string"},
    {"{\"prompt\":\"a\",\"model\":\"other\"}", 404, "model", "model_not_found",
     "The model `other` does not exist or you do not have access to it."},
};

START_TEST(tokenize_bad_input)
{
    const struct bad *b = &tokenize_bad[_i];
    struct api_tokenize_req r;
    struct api_fault f;
    struct inf_err e;
    inf_status_t st = api_tokenize_parse(b->body, strlen(b->body), &lim, &arena, &r, &f, &e);
    check_bad(b, st, &f, &e);
}
END_TEST

START_TEST(tokenize_encode)
{
    const int32_t ids[] = {1, 15043, 0, 31999};
    char *out;
    size_t len;
    ck_assert_int_eq(api_tokenize_encode(ids, 4, 2048, &arena, &out, &len, NULL), INF_OK);
    ck_assert_str_eq(out, "{\"count\":4,\"max_model_len\":2048,\"tokens\":[1,15043,0,31999]}");
    ck_assert_uint_eq(len, strlen(out));
    ck_assert_int_eq(api_tokenize_encode(NULL, 0, 4096, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "{\"count\":0,\"max_model_len\":4096,\"tokens\":[]}");
}
END_TEST

/* ---- /detokenize -------------------------------------------------------------- */
START_TEST(detokenize_ok)
{
    struct api_detokenize_req r;
    struct inf_err e;
    const char *body = "{\"tokens\":[1,15043,31999,0]}";
    ck_assert_int_eq(api_detokenize_parse(body, strlen(body), &lim, &arena, &r, NULL, &e), INF_OK);
    ck_assert_ptr_null(r.model);
    ck_assert_uint_eq(r.n_ids, 4);
    const int32_t want[] = {1, 15043, 31999, 0};
    ck_assert_mem_eq(r.ids, want, sizeof want);

    body = "{\"model\":\"tiny-llama\",\"tokens\":[],\"skip_special_tokens\":true}";
    ck_assert_int_eq(api_detokenize_parse(body, strlen(body), &lim, &arena, &r, NULL, &e), INF_OK);
    ck_assert_str_eq(r.model, "tiny-llama");
    ck_assert_uint_eq(r.n_ids, 0);
    ck_assert_uint_eq(r.n_ignored, 1);
    ck_assert_str_eq(r.ignored[0], "skip_special_tokens");
}
END_TEST

static const struct bad detokenize_bad[] = {
    {"null", 400, NULL, NULL, "The request body must be a JSON object, got null"},
    {"{\"tokens\":[1,2]", 400, NULL, NULL,
     "We could not parse the JSON body of your request: '}' expected near end of file (line 1, "
     "column 15)"},
    {"{}", 400, "tokens", NULL, "'tokens' is required"},
    {"{\"tokens\":\"1 2\"}", 400, "tokens", NULL,
     "'tokens' must be a list of token ids, got a string"},
    {"{\"tokens\":[1,32000]}", 400, "tokens", NULL,
     "'tokens' token id 32000 at index 1 is outside the vocabulary [0, 32000)"},
    {"{\"tokens\":[-1]}", 400, "tokens", NULL,
     "'tokens' token id -1 at index 0 is outside the vocabulary [0, 32000)"},
    {"{\"tokens\":[1,2.0]}", 400, "tokens", NULL,
     "'tokens' token ids must be integers, got 2.0 at index 1"},
    {"{\"tokens\":[[1]]}", 400, "tokens", NULL,
     "'tokens' token ids must be integers, got an array at index 0"},
    {"{\"tokens\":[1],\"model\":\"x\"}", 404, "model", "model_not_found",
     "The model `x` does not exist or you do not have access to it."},
};

START_TEST(detokenize_bad_input)
{
    const struct bad *b = &detokenize_bad[_i];
    struct api_detokenize_req r;
    struct api_fault f;
    struct inf_err e;
    inf_status_t st = api_detokenize_parse(b->body, strlen(b->body), &lim, &arena, &r, &f, &e);
    check_bad(b, st, &f, &e);
}
END_TEST

START_TEST(detokenize_encode)
{
    char *out;
    size_t len;
    const char text[] = "<s> Hello\t\"w\" \xE2\x82\xAC\xE2\x82";
    ck_assert_int_eq(api_detokenize_encode(text, sizeof text - 1, &arena, &out, &len, NULL),
                     INF_OK);
    ck_assert_str_eq(out, "{\"prompt\":\"<s> Hello\\t\\\"w\\\" \xE2\x82\xAC\xEF\xBF\xBD\"}");
    ck_assert_uint_eq(len, strlen(out));
    ck_assert_int_eq(api_detokenize_encode(NULL, 0, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "{\"prompt\":\"\"}");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_tokenize");
    TCase *tc = tcase_create("tokenize");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, tokenize_ok);
    tcase_add_loop_test(tc, tokenize_bad_input, 0,
                        (int)(sizeof tokenize_bad / sizeof tokenize_bad[0]));
    tcase_add_test(tc, tokenize_encode);
    suite_add_tcase(s, tc);
    tc = tcase_create("detokenize");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, detokenize_ok);
    tcase_add_loop_test(tc, detokenize_bad_input, 0,
                        (int)(sizeof detokenize_bad / sizeof detokenize_bad[0]));
    tcase_add_test(tc, detokenize_encode);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
