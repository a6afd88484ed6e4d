/* Growing byte buffers: doubling from the minimum, content kept, refusals. */
#include "common/inf.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

START_TEST(doubles_and_keeps)
{
    char *p = NULL;
    size_t cap = 0;
    ck_assert(inf_grow(&p, &cap, 0, 32)); /* already enough: nothing taken */
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(cap, 0);
    ck_assert(inf_grow(&p, &cap, 1, 32));
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(cap, 32);
    memcpy(p, "abcdefghijklmnopqrstuvwxyz01234", 32);
    ck_assert(inf_grow(&p, &cap, 32, 32));
    ck_assert_uint_eq(cap, 32);
    ck_assert(inf_grow(&p, &cap, 33, 32));
    ck_assert_uint_eq(cap, 64);
    ck_assert(inf_grow(&p, &cap, 200, 32));
    ck_assert_uint_eq(cap, 256);
    ck_assert_str_eq(p, "abcdefghijklmnopqrstuvwxyz01234");
    free(p);
}
END_TEST

START_TEST(refuses_overflow)
{
    char *p = NULL;
    size_t cap = 0;
    ck_assert(inf_grow(&p, &cap, 10, 256));
    char *before = p;
    ck_assert(!inf_grow(&p, &cap, SIZE_MAX / 2 + 1, 256));
    ck_assert_ptr_eq(p, before);
    ck_assert_uint_eq(cap, 256);
    free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grow");
    TCase *t = tcase_create("grow");
    tcase_add_test(t, doubles_and_keeps);
    tcase_add_test(t, refuses_overflow);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
