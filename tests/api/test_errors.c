/* Status → HTTP status and OpenAI error type, and the error body. */
#include "api/api.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static struct inf_arena arena;

static void setup(void)
{
    inf_arena_init(&arena, 0);
}

static void teardown(void)
{
    inf_arena_fini(&arena);
}

START_TEST(http_status)
{
    ck_assert_int_eq(api_status_http(INF_OK), 200);
    ck_assert_int_eq(api_status_http(INF_E_INVALID), 400);
    ck_assert_int_eq(api_status_http(INF_E_FORMAT), 400);
    ck_assert_int_eq(api_status_http(INF_E_RANGE), 400);
    ck_assert_int_eq(api_status_http(INF_E_CONTEXT), 400);
    ck_assert_int_eq(api_status_http(INF_E_UNSUPPORTED), 400);
    ck_assert_int_eq(api_status_http(INF_E_AUTH), 401);
    ck_assert_int_eq(api_status_http(INF_E_NOTFOUND), 404);
    ck_assert_int_eq(api_status_http(INF_E_METHOD), 405);
    ck_assert_int_eq(api_status_http(INF_E_TOOBIG), 413);
    ck_assert_int_eq(api_status_http(INF_E_BUSY), 429);
    ck_assert_int_eq(api_status_http(INF_E_SHUTDOWN), 503);
    ck_assert_int_eq(api_status_http(INF_E_NOMEM), 500);
    ck_assert_int_eq(api_status_http(INF_E_IO), 500);
    ck_assert_int_eq(api_status_http(INF_E_DEVICE), 500);
    ck_assert_int_eq(api_status_http(INF_E_INTERNAL), 500);
    ck_assert_int_eq(api_status_http((inf_status_t)-999), 500);
}
END_TEST

START_TEST(error_type)
{
    ck_assert_str_eq(api_error_type(INF_E_INVALID), "invalid_request_error");
    ck_assert_str_eq(api_error_type(INF_E_CONTEXT), "invalid_request_error");
    ck_assert_str_eq(api_error_type(INF_E_AUTH), "invalid_request_error");
    ck_assert_str_eq(api_error_type(INF_E_NOTFOUND), "invalid_request_error");
    ck_assert_str_eq(api_error_type(INF_E_METHOD), "invalid_request_error");
    ck_assert_str_eq(api_error_type(INF_E_TOOBIG), "invalid_request_error");
    ck_assert_str_eq(api_error_type(INF_E_BUSY), "requests");
    ck_assert_str_eq(api_error_type(INF_E_SHUTDOWN), "server_error");
    ck_assert_str_eq(api_error_type(INF_E_INTERNAL), "server_error");
    ck_assert_str_eq(api_error_type(INF_E_DEVICE), "server_error");
}
END_TEST

START_TEST(error_code)
{
    ck_assert_str_eq(api_error_code(INF_E_BUSY), "rate_limit_exceeded");
    ck_assert_ptr_null(api_error_code(INF_OK));
    ck_assert_ptr_null(api_error_code(INF_E_INVALID));
    ck_assert_ptr_null(api_error_code(INF_E_AUTH));
    ck_assert_ptr_null(api_error_code(INF_E_SHUTDOWN));
    ck_assert_ptr_null(api_error_code(INF_E_INTERNAL));
}
END_TEST

struct body_case {
    inf_status_t st;
    const char *message, *param, *code;
    const char *want;
};

static const struct body_case bodies[] = {
    {INF_E_INVALID, "'n' must be in [1, 16], got 0", "n", NULL,
     "{\"error\":{\"message\":\"'n' must be in [1, 16], got 0\",\"type\":\"invalid_request_error\","
     "\"param\":\"n\",\"code\":null}}"},
    {INF_E_AUTH, "Incorrect API key provided.", NULL, "invalid_api_key",
     "{\"error\":{\"message\":\"Incorrect API key provided.\",\"type\":\"invalid_request_error\","
     "\"param\":null,\"code\":\"invalid_api_key\"}}"},
    {INF_E_NOTFOUND, "Not found: /v2/x", NULL, NULL,
     "{\"error\":{\"message\":\"Not found: /v2/x\",\"type\":\"invalid_request_error\","
     "\"param\":null,\"code\":null}}"},
    {INF_E_METHOD, "Method GET is not allowed on /v1/completions", NULL, NULL,
     "{\"error\":{\"message\":\"Method GET is not allowed on /v1/completions\","
     "\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}"},
    {INF_E_TOOBIG, "The request body is larger than 1048576 bytes", NULL, NULL,
     "{\"error\":{\"message\":\"The request body is larger than 1048576 bytes\","
     "\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}"},
    /* queue full: OpenAI's 429 body for too many requests */
    {INF_E_BUSY, "the server is busy (admission queue full): retry later", NULL, NULL,
     "{\"error\":{\"message\":\"the server is busy (admission queue full): retry later\","
     "\"type\":\"requests\",\"param\":null,\"code\":\"rate_limit_exceeded\"}}"},
    /* a code the caller names wins over the status's own */
    {INF_E_BUSY, "busy", NULL, "other",
     "{\"error\":{\"message\":\"busy\",\"type\":\"requests\",\"param\":null,"
     "\"code\":\"other\"}}"},
    {INF_E_SHUTDOWN, NULL, NULL, NULL,
     "{\"error\":{\"message\":\"shutting down\",\"type\":\"server_error\",\"param\":null,"
     "\"code\":null}}"},
    /* quotes, backslashes, control bytes and bad UTF-8 in a message stay valid JSON */
    {INF_E_INVALID, "say \"hi\"\\\n\x01\xFF", "a\"b", "c\\d",
     "{\"error\":{\"message\":\"say \\\"hi\\\"\\\\\\n\\u0001\xEF\xBF\xBD\","
     "\"type\":\"invalid_request_error\",\"param\":\"a\\\"b\",\"code\":\"c\\\\d\"}}"},
};

START_TEST(error_body)
{
    const struct body_case *c = &bodies[_i];
    char *out = NULL;
    size_t len = 0;
    struct inf_err e;
    ck_assert_int_eq(api_error_encode(c->st, c->message, c->param, c->code, &arena, &out, &len, &e),
                     INF_OK);
    ck_assert_str_eq(out, c->want);
    ck_assert_uint_eq(len, strlen(c->want));
    /* Independently: jansson reads the four fields back. */
    json_error_t je;
    json_t *j = json_loads(out, JSON_REJECT_DUPLICATES, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_t *err = json_object_get(j, "error");
    ck_assert_uint_eq(json_object_size(j), 1);
    ck_assert_uint_eq(json_object_size(err), 4);
    ck_assert_str_eq(json_string_value(json_object_get(err, "type")), api_error_type(c->st));
    if (c->param)
        ck_assert_str_eq(json_string_value(json_object_get(err, "param")), c->param);
    else
        ck_assert(json_is_null(json_object_get(err, "param")));
    json_decref(j);
}
END_TEST

/* The body of a message as long as inf_err allows. */
START_TEST(long_message)
{
    struct inf_err e;
    char big[300];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    inf_err_set(&e, INF_E_INVALID, "%s", big);
    ck_assert_uint_eq(strlen(e.msg), INF_ERR_LEN - 1);
    char *out;
    size_t len;
    ck_assert_int_eq(api_error_encode(e.code, e.msg, NULL, NULL, &arena, &out, &len, NULL), INF_OK);
    ck_assert_uint_eq(len, strlen("{\"error\":{\"message\":\"\",\"type\":\"invalid_request_error\","
                                  "\"param\":null,\"code\":null}}") +
                               INF_ERR_LEN - 1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_errors");
    TCase *tc = tcase_create("map");
    tcase_add_test(tc, http_status);
    tcase_add_test(tc, error_type);
    tcase_add_test(tc, error_code);
    suite_add_tcase(s, tc);
    tc = tcase_create("body");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, error_body, 0, (int)(sizeof bodies / sizeof bodies[0]));
    tcase_add_test(tc, long_message);
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
