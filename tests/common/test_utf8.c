/* UTF-8 helpers: every well-formed character round-trips, ill-formed input
 * is measured by its maximal valid-so-far prefix. */
#include "common/inf.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

/* Naive reference: the bit layout of RFC 3629, table 3-6 of Unicode. */
static size_t ref_encode(uint32_t cp, unsigned char *o)
{
    if (cp <= 0x7F) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp <= 0x7FF) {
        o[0] = (unsigned char)(0xC0 + cp / 64);
        o[1] = (unsigned char)(0x80 + cp % 64);
        return 2;
    }
    if (cp <= 0xFFFF) {
        o[0] = (unsigned char)(0xE0 + cp / 4096);
        o[1] = (unsigned char)(0x80 + cp / 64 % 64);
        o[2] = (unsigned char)(0x80 + cp % 64);
        return 3;
    }
    o[0] = (unsigned char)(0xF0 + cp / 262144);
    o[1] = (unsigned char)(0x80 + cp / 4096 % 64);
    o[2] = (unsigned char)(0x80 + cp / 64 % 64);
    o[3] = (unsigned char)(0x80 + cp % 64);
    return 4;
}

START_TEST(encode_known)
{
    char b[4];
    ck_assert_uint_eq(inf_utf8_encode(0x24, b), 1);
    ck_assert_int_eq(memcmp(b, "$", 1), 0);
    ck_assert_uint_eq(inf_utf8_encode(0xA2, b), 2);
    ck_assert_int_eq(memcmp(b, "\xC2\xA2", 2), 0);
    ck_assert_uint_eq(inf_utf8_encode(0x20AC, b), 3);
    ck_assert_int_eq(memcmp(b, "\xE2\x82\xAC", 3), 0);
    ck_assert_uint_eq(inf_utf8_encode(0x10348, b), 4);
    ck_assert_int_eq(memcmp(b, "\xF0\x90\x8D\x88", 4), 0);
    ck_assert_uint_eq(inf_utf8_encode(0x10FFFF, b), 4);
    ck_assert_int_eq(memcmp(b, "\xF4\x8F\xBF\xBF", 4), 0);
}
END_TEST

START_TEST(round_trip_all)
{
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        char b[4];
        unsigned char r[4];
        size_t n = inf_utf8_encode(cp, b);
        ck_assert_uint_eq(n, ref_encode(cp, r));
        ck_assert_int_eq(memcmp(b, r, n), 0);
        bool valid = false;
        ck_assert_uint_eq(inf_utf8_next(b, n, &valid), n);
        ck_assert(valid);
        /* cut short: the whole prefix is valid so far */
        if (n > 1) {
            ck_assert_uint_eq(inf_utf8_next(b, n - 1, &valid), n - 1);
            ck_assert(!valid);
        }
    }
}
END_TEST

START_TEST(ill_formed)
{
    bool valid = true;
    /* stray continuation, C0/C1 leads, F5..FF */
    ck_assert_uint_eq(inf_utf8_next("\x80", 1, &valid), 1);
    ck_assert(!valid);
    ck_assert_uint_eq(inf_utf8_next("\xC0\xAF", 2, &valid), 1);
    ck_assert(!valid);
    ck_assert_uint_eq(inf_utf8_next("\xC1\xBF", 2, &valid), 1);
    ck_assert_uint_eq(inf_utf8_next("\xF5\x80\x80\x80", 4, &valid), 1);
    ck_assert_uint_eq(inf_utf8_next("\xFF", 1, &valid), 1);
    /* overlong 3- and 4-byte forms stop at the second byte */
    ck_assert_uint_eq(inf_utf8_next("\xE0\x80\xAF", 3, &valid), 1);
    ck_assert(!valid);
    ck_assert_uint_eq(inf_utf8_next("\xF0\x8F\xBF\xBF", 4, &valid), 1);
    /* a surrogate, above U+10FFFF */
    ck_assert_uint_eq(inf_utf8_next("\xED\xA0\x80", 3, &valid), 1);
    ck_assert(!valid);
    ck_assert_uint_eq(inf_utf8_next("\xF4\x90\x80\x80", 4, &valid), 1);
    /* a bad third byte: two bytes are the maximal prefix */
    ck_assert_uint_eq(inf_utf8_next("\xE2\x82\x41", 3, &valid), 2);
    ck_assert(!valid);
    ck_assert_uint_eq(inf_utf8_next("\xF0\x9F\x98\x41", 4, &valid), 3);
    ck_assert(!valid);
    /* the edges that are valid */
    ck_assert_uint_eq(inf_utf8_next("\xED\x9F\xBF", 3, &valid), 3);
    ck_assert(valid);
    ck_assert_uint_eq(inf_utf8_next("\xEE\x80\x80", 3, &valid), 3);
    ck_assert(valid);
    ck_assert_uint_eq(inf_utf8_next("\x7F", 1, &valid), 1);
    ck_assert(valid);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("utf8");
    TCase *t = tcase_create("utf8");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, encode_known);
    tcase_add_test(t, round_trip_all);
    tcase_add_test(t, ill_formed);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
