/* GET /v1/models: the list body; GET /v1/models/{id}: one model. */
#include "api/api.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

START_TEST(one_model)
{
    struct inf_arena a;
    inf_arena_init(&a, 0);
    struct api_model_card card = {"tiny-llama", 1764474000, 2048};
    char *out;
    size_t len;
    ck_assert_int_eq(api_models_encode(&card, 1, &a, &out, &len, NULL), INF_OK);
    const char *want = "{\"object\":\"list\",\"data\":[{\"id\":\"tiny-llama\",\"object\":\"model\","
                       "\"created\":1764474000,\"owned_by\":\"int4serve\","
                       "\"max_model_len\":2048}]}";
    ck_assert_str_eq(out, want);
    ck_assert_uint_eq(len, strlen(want));
    inf_arena_fini(&a);
}
END_TEST

START_TEST(several_and_none)
{
    struct inf_arena a;
    inf_arena_init(&a, 0);
    struct api_model_card cards[] = {
        {"org/Llama-3-8B-Instruct \"int4\"", 0, 8192},
        {"caf\xC3\xA9", 1, 4294967295u},
    };
    char *out;
    ck_assert_int_eq(api_models_encode(cards, 2, &a, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "{\"object\":\"list\",\"data\":["
                          "{\"id\":\"org/Llama-3-8B-Instruct \\\"int4\\\"\",\"object\":\"model\","
                          "\"created\":0,\"owned_by\":\"int4serve\",\"max_model_len\":8192},"
                          "{\"id\":\"caf\xC3\xA9\",\"object\":\"model\",\"created\":1,"
                          "\"owned_by\":\"int4serve\",\"max_model_len\":4294967295}]}");
    json_error_t je;
    json_t *j = json_loads(out, JSON_REJECT_DUPLICATES, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "data")), 2);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "org/Llama-3-8B-Instruct \"int4\"");
    json_decref(j);

    ck_assert_int_eq(api_models_encode(NULL, 0, &a, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "{\"object\":\"list\",\"data\":[]}");
    inf_arena_fini(&a);
}
END_TEST

START_TEST(retrieve_one)
{
    /* OpenAI's retrieve answers the model object alone: the list's item. */
    struct inf_arena a;
    inf_arena_init(&a, 0);
    struct api_model_card card = {"org/tiny \"x\"", 1764474000, 2048};
    char *out, *list;
    size_t len;
    ck_assert_int_eq(api_model_encode(&card, &a, &out, &len, NULL), INF_OK);
    const char *want = "{\"id\":\"org/tiny \\\"x\\\"\",\"object\":\"model\",\"created\":1764474000,"
                       "\"owned_by\":\"int4serve\",\"max_model_len\":2048}";
    ck_assert_str_eq(out, want);
    ck_assert_uint_eq(len, strlen(want));
    ck_assert_int_eq(api_models_encode(&card, 1, &a, &list, NULL, NULL), INF_OK);
    ck_assert_ptr_nonnull(strstr(list, want));
    inf_arena_fini(&a);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_models");
    TCase *tc = tcase_create("encode");
    tcase_add_test(tc, one_model);
    tcase_add_test(tc, retrieve_one);
    tcase_add_test(tc, several_and_none);
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
