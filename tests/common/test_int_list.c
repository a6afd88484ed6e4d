/* Comma-separated integer lists: values, counting past cap, refusals. */
#include "common/inf.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

START_TEST(values)
{
    int64_t v[4] = {0};
    ck_assert_int_eq(inf_int_list_parse("0,1, 2 ,-3", v, 4), 4);
    ck_assert_int_eq(v[0], 0);
    ck_assert_int_eq(v[1], 1);
    ck_assert_int_eq(v[2], 2);
    ck_assert_int_eq(v[3], -3);
    ck_assert_int_eq(inf_int_list_parse("9223372036854775807", v, 1), 1);
    ck_assert(v[0] == INT64_MAX);
    ck_assert_int_eq(inf_int_list_parse("", v, 4), 0);
}
END_TEST

START_TEST(counts_past_cap)
{
    int64_t v[2] = {0, 0};
    ck_assert_int_eq(inf_int_list_parse("5,6,7", NULL, 0), 3);
    ck_assert_int_eq(inf_int_list_parse("5,6,7", v, 1), 3);
    ck_assert_int_eq(v[0], 5);
    ck_assert_int_eq(v[1], 0); /* beyond cap: untouched */
}
END_TEST

START_TEST(refused)
{
    int64_t v[4];
    ck_assert_int_eq(inf_int_list_parse("0,a", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse("1,,2", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse("1,2,", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse(",", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse(" ", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse("1 2", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse("9223372036854775808", v, 4), -1);
    ck_assert_int_eq(inf_int_list_parse("1234567890123456789012345678901234", v, 4), -1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("int_list");
    TCase *t = tcase_create("parse");
    tcase_add_test(t, values);
    tcase_add_test(t, counts_past_cap);
    tcase_add_test(t, refused);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
