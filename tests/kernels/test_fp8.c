/* FP8 E4M3 (kernels/fp8.h) against a table of all 256 codes built here from
 * the format's definition in double precision (and a few values written
 * out), then the encoder: every finite code back to itself, each midpoint
 * between neighbours to the even code, values just off a midpoint to the
 * nearer one, saturation at 448, NaN, signed zero and the subnormals. */
#include "kernels/fp8.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>

/* The value of code c: sign, exponent field E (bias 7), mantissa M. */
static double table_value(int c)
{
    const int s = c >> 7, E = (c >> 3) & 15, M = c & 7;
    double v;
    if (E == 15 && M == 7)
        return NAN;
    if (E == 0)
        v = (M / 8.0) * pow(2.0, -6);
    else
        v = (1.0 + M / 8.0) * pow(2.0, E - 7);
    return s ? -v : v;
}

START_TEST(decode_every_code)
{
    for (int c = 0; c < 256; c++) {
        const double want = table_value(c);
        const float got = krn_e4m3_decode((uint8_t)c);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "code 0x%02x: %g, want NaN", c, (double)got);
            continue;
        }
        ck_assert_msg((double)got == want, "code 0x%02x: %.9g, want %.9g", c, (double)got, want);
        ck_assert_int_eq(signbit(got) != 0, (c & 0x80) != 0);
    }
    /* values of the format's definition, written out */
    ck_assert(krn_e4m3_decode(0x7e) == 448.0f);
    ck_assert(krn_e4m3_decode(0x38) == 1.0f);
    ck_assert(krn_e4m3_decode(0x08) == 0x1p-6f);
    ck_assert(krn_e4m3_decode(0x01) == 0x1p-9f);
    ck_assert(krn_e4m3_decode(0x07) == 7 * 0x1p-9f);
    ck_assert(krn_e4m3_decode(0xc0) == -2.0f);
    ck_assert(krn_e4m3_decode(0x80) == 0.0f && signbit(krn_e4m3_decode(0x80)));
}
END_TEST

START_TEST(encode_round_trip_and_ties)
{
    /* positive finite codes in order: 0x00..0x7e */
    for (int c = 0; c <= 0x7e; c++) {
        const float v = (float)table_value(c);
        ck_assert_int_eq(krn_e4m3_encode(v), c);
        ck_assert_int_eq(krn_e4m3_encode(-v), c | 0x80);
        if (c == 0x7e)
            break;
        const double lo = table_value(c), hi = table_value(c + 1), mid = (lo + hi) / 2;
        /* a tie goes to the even code (its mantissa's last bit 0) */
        ck_assert_int_eq(krn_e4m3_encode((float)mid), (c & 1) ? c + 1 : c);
        /* just off the midpoint: the nearer code */
        const double eps = (hi - lo) / 64;
        ck_assert_int_eq(krn_e4m3_encode((float)(mid - eps)), c);
        ck_assert_int_eq(krn_e4m3_encode((float)(mid + eps)), c + 1);
    }
}
END_TEST

START_TEST(encode_edges)
{
    /* saturation */
    ck_assert_int_eq(krn_e4m3_encode(448.0f), 0x7e);
    ck_assert_int_eq(krn_e4m3_encode(449.0f), 0x7e);
    ck_assert_int_eq(krn_e4m3_encode(464.0f), 0x7e);
    ck_assert_int_eq(krn_e4m3_encode(1e30f), 0x7e);
    ck_assert_int_eq(krn_e4m3_encode(INFINITY), 0x7e);
    ck_assert_int_eq(krn_e4m3_encode(-INFINITY), 0xfe);
    ck_assert_int_eq(krn_e4m3_encode(-1000.0f), 0xfe);
    /* NaN keeps its sign */
    ck_assert_int_eq(krn_e4m3_encode(NAN), 0x7f);
    ck_assert_int_eq(krn_e4m3_encode(-NAN), 0xff);
    /* zeros and the subnormals (steps of 2^-9) */
    ck_assert_int_eq(krn_e4m3_encode(0.0f), 0x00);
    ck_assert_int_eq(krn_e4m3_encode(-0.0f), 0x80);
    ck_assert_int_eq(krn_e4m3_encode(0x1p-11f), 0x00);     /* a quarter step */
    ck_assert_int_eq(krn_e4m3_encode(0x1p-10f), 0x00);     /* half a step: to even 0 */
    ck_assert_int_eq(krn_e4m3_encode(3 * 0x1p-10f), 0x02); /* 1.5 steps: to even 2 */
    ck_assert_int_eq(krn_e4m3_encode(3 * 0x1p-11f), 0x01); /* 0.75 steps */
    ck_assert_int_eq(krn_e4m3_encode(1e-30f), 0x00);
    ck_assert_int_eq(krn_e4m3_encode(15 * 0x1p-10f), 0x08); /* 7.5 steps: to even 8, 2^-6 */
}
END_TEST

/* The integer decode the cache readers use: every finite code's value,
 * signed zeros kept. */
START_TEST(decode_finite_every_code)
{
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f)
            continue; /* the NaNs, which the encoder only makes from NaN */
        const float got = krn_e4m3_decode_finite((uint8_t)c);
        ck_assert_msg((double)got == table_value(c), "code 0x%02x: %.9g, want %.9g", c,
                      (double)got, table_value(c));
        ck_assert_int_eq(signbit(got) != 0, (c & 0x80) != 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fp8");
    TCase *t = tcase_create("e4m3");
    tcase_add_test(t, decode_every_code);
    tcase_add_test(t, encode_round_trip_and_ties);
    tcase_add_test(t, encode_edges);
    tcase_add_test(t, decode_finite_every_code);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
