/* The TOML reader: values of every type, tables, and each kind of error with
 * the line and column it reports. */
#include "common/inf.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct inf_arena arena;
static struct inf_err err;

static void setup(void)
{
    inf_arena_init(&arena, 0);
    inf_err_clear(&err);
}

static void teardown(void)
{
    inf_arena_fini(&arena);
}

static const struct inf_toml_node *parse_ok(const char *text)
{
    struct inf_toml_node *root = NULL;
    inf_status_t st = inf_toml_parse(text, strlen(text), &arena, &root, &err);
    ck_assert_msg(st == INF_OK, "parse failed: %s", err.msg);
    ck_assert_ptr_nonnull(root);
    ck_assert_int_eq(root->type, INF_TOML_TABLE);
    return root;
}

/* Parse text expecting an error whose message is exactly want. */
static void parse_fails(const char *text, const char *want)
{
    struct inf_toml_node *root = (struct inf_toml_node *)1;
    inf_status_t st = inf_toml_parse(text, strlen(text), &arena, &root, &err);
    ck_assert_int_eq(st, INF_E_FORMAT);
    ck_assert_ptr_null(root);
    ck_assert_int_eq(err.code, INF_E_FORMAT);
    ck_assert_str_eq(err.msg, want);
}

static const struct inf_toml_node *get(const struct inf_toml_node *root, const char *table,
                                       const char *key, enum inf_toml_type type)
{
    const struct inf_toml_node *v = inf_toml_find(root, table, key);
    ck_assert_msg(v != NULL, "missing %s.%s", table ? table : "", key);
    ck_assert_msg(v->type == type, "%s: type %s", key, inf_toml_type_name(v->type));
    return v;
}

START_TEST(scalars)
{
    const struct inf_toml_node *r = parse_ok("# leading comment\n"
                                             "s = \"hello\"   # trailing comment\n"
                                             "lit = 'C:\\path\\no escapes'\n"
                                             "empty = \"\"\n"
                                             "i = 42\n"
                                             "neg = -17\n"
                                             "plus = +5\n"
                                             "zero = 0\n"
                                             "big = 9_223_372_036_854_775_807\n"
                                             "small = -9223372036854775808\n"
                                             "f = 3.25\n"
                                             "e = -1.5e3\n"
                                             "e2 = 2E-2\n"
                                             "fu = 1_000.000_5\n"
                                             "pinf = inf\n"
                                             "ninf = -inf\n"
                                             "nan = nan\n"
                                             "t = true\n"
                                             "fl = false\n");
    ck_assert_str_eq(get(r, NULL, "s", INF_TOML_STRING)->str, "hello");
    ck_assert_uint_eq(get(r, NULL, "s", INF_TOML_STRING)->str_len, 5);
    ck_assert_str_eq(get(r, NULL, "lit", INF_TOML_STRING)->str, "C:\\path\\no escapes");
    ck_assert_uint_eq(get(r, NULL, "empty", INF_TOML_STRING)->str_len, 0);
    ck_assert_int_eq(get(r, NULL, "i", INF_TOML_INT)->i, 42);
    ck_assert_int_eq(get(r, NULL, "neg", INF_TOML_INT)->i, -17);
    ck_assert_int_eq(get(r, NULL, "plus", INF_TOML_INT)->i, 5);
    ck_assert_int_eq(get(r, NULL, "zero", INF_TOML_INT)->i, 0);
    ck_assert(get(r, NULL, "big", INF_TOML_INT)->i == INT64_MAX);
    ck_assert(get(r, NULL, "small", INF_TOML_INT)->i == INT64_MIN);
    ck_assert(get(r, NULL, "f", INF_TOML_FLOAT)->f == 3.25);
    ck_assert(get(r, NULL, "e", INF_TOML_FLOAT)->f == -1500.0);
    ck_assert(get(r, NULL, "e2", INF_TOML_FLOAT)->f == 0.02);
    ck_assert(get(r, NULL, "fu", INF_TOML_FLOAT)->f == 1000.0005);
    ck_assert(get(r, NULL, "pinf", INF_TOML_FLOAT)->f == INFINITY);
    ck_assert(get(r, NULL, "ninf", INF_TOML_FLOAT)->f == -INFINITY);
    ck_assert(isnan(get(r, NULL, "nan", INF_TOML_FLOAT)->f));
    ck_assert(get(r, NULL, "t", INF_TOML_BOOL)->b);
    ck_assert(!get(r, NULL, "fl", INF_TOML_BOOL)->b);
    ck_assert_uint_eq(r->count, 18);
    ck_assert_ptr_null(inf_toml_get(r, "missing"));
}
END_TEST

START_TEST(escapes)
{
    const struct inf_toml_node *r = parse_ok("a = \"q\\\" b\\\\ n\\n t\\t r\\r\"\n"
                                             "u = \"\\u00e9\\u20AC\\U0001F600\"\n"
                                             "raw = \"é€\"\n"
                                             "ctl = \"\\b\\f\"\n");
    ck_assert_str_eq(get(r, NULL, "a", INF_TOML_STRING)->str, "q\" b\\ n\n t\t r\r");
    const struct inf_toml_node *u = get(r, NULL, "u", INF_TOML_STRING);
    ck_assert_str_eq(u->str, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
    ck_assert_uint_eq(u->str_len, 9);
    ck_assert_str_eq(get(r, NULL, "raw", INF_TOML_STRING)->str, "\xC3\xA9\xE2\x82\xAC");
    ck_assert_str_eq(get(r, NULL, "ctl", INF_TOML_STRING)->str, "\b\f");
}
END_TEST

START_TEST(tables_and_keys)
{
    const struct inf_toml_node *r = parse_ok("top = 1\n"
                                             "[server]\n"
                                             "host = \"0.0.0.0\"\n"
                                             "\n"
                                             "  [ a . b ]  # nested, spaces allowed\n"
                                             "x = 2\n"
                                             "\"quoted key\" = 3\n"
                                             "'lit.key' = 4\n"
                                             "dotted.inner = 5\n"
                                             "[a]\n"
                                             "y = 6\n"
                                             "[\"q t\"]\n"
                                             "z-1_b = 7\n");
    ck_assert_int_eq(get(r, NULL, "top", INF_TOML_INT)->i, 1);
    const struct inf_toml_node *host = get(r, "server", "host", INF_TOML_STRING);
    ck_assert_str_eq(host->str, "0.0.0.0");
    ck_assert_int_eq(host->line, 3);
    ck_assert_int_eq(host->col, 1);
    ck_assert_int_eq(get(r, "a.b", "x", INF_TOML_INT)->i, 2);
    ck_assert_int_eq(get(r, "a.b", "quoted key", INF_TOML_INT)->i, 3);
    ck_assert_int_eq(get(r, "a.b", "lit.key", INF_TOML_INT)->i, 4);
    ck_assert_int_eq(get(r, "a.b.dotted", "inner", INF_TOML_INT)->i, 5);
    ck_assert_int_eq(get(r, "a", "y", INF_TOML_INT)->i, 6);
    ck_assert_int_eq(get(r, "a", "y", INF_TOML_INT)->line, 11);
    ck_assert_int_eq(get(r, "q t", "z-1_b", INF_TOML_INT)->i, 7);
    /* Iteration keeps document order and each key's line. */
    const struct inf_toml_node *b = inf_toml_find(r, "a", "b");
    ck_assert_int_eq(b->type, INF_TOML_TABLE);
    ck_assert_int_eq(b->line, 5);
    ck_assert_int_eq(b->col, 3);
    const char *keys[] = {"x", "quoted key", "lit.key", "dotted"};
    const int lines[] = {6, 7, 8, 9};
    int n = 0;
    for (const struct inf_toml_node *c = b->first; c; c = c->next, n++) {
        ck_assert_str_eq(c->key, keys[n]);
        ck_assert_int_eq(c->line, lines[n]);
    }
    ck_assert_int_eq(n, 4);
    ck_assert_uint_eq(b->count, 4);
    /* Root iteration: top, server, a, "q t". */
    const char *roots[] = {"top", "server", "a", "q t"};
    n = 0;
    for (const struct inf_toml_node *c = r->first; c; c = c->next)
        ck_assert_str_eq(c->key, roots[n++]);
    ck_assert_int_eq(n, 4);
    ck_assert_ptr_null(inf_toml_find(r, "server.nope", "host"));
    ck_assert_ptr_null(inf_toml_find(r, "top", "x"));
    ck_assert_ptr_null(inf_toml_get(inf_toml_get(r, "top"), "x"));
}
END_TEST

START_TEST(arrays)
{
    const struct inf_toml_node *r = parse_ok("ints = [1, 2, -3]\n"
                                             "strs = [\n"
                                             "  \"embed_tokens\",  # first\n"
                                             "  'lm_head',\n"
                                             "]\n"
                                             "empty = []\n"
                                             "mixed = [1, 2.5, true, \"x\"]\n"
                                             "crlf = [\r\n 7 ,\r\n 8 ]\r\n"
                                             "after = 1\n");
    const struct inf_toml_node *a = get(r, NULL, "ints", INF_TOML_ARRAY);
    ck_assert_uint_eq(a->count, 3);
    int64_t want[] = {1, 2, -3};
    int n = 0;
    for (const struct inf_toml_node *it = a->first; it; it = it->next, n++) {
        ck_assert_int_eq(it->type, INF_TOML_INT);
        ck_assert_int_eq(it->i, want[n]);
        ck_assert_ptr_null(it->key);
    }
    a = get(r, NULL, "strs", INF_TOML_ARRAY);
    ck_assert_uint_eq(a->count, 2);
    ck_assert_str_eq(a->first->str, "embed_tokens");
    ck_assert_int_eq(a->first->line, 3);
    ck_assert_int_eq(a->first->col, 3);
    ck_assert_str_eq(a->first->next->str, "lm_head");
    ck_assert_uint_eq(get(r, NULL, "empty", INF_TOML_ARRAY)->count, 0);
    a = get(r, NULL, "mixed", INF_TOML_ARRAY);
    ck_assert_int_eq(a->first->next->type, INF_TOML_FLOAT);
    ck_assert_int_eq(a->first->next->next->type, INF_TOML_BOOL);
    ck_assert_int_eq(a->last->type, INF_TOML_STRING);
    a = get(r, NULL, "crlf", INF_TOML_ARRAY);
    ck_assert_int_eq(a->last->i, 8);
    ck_assert_int_eq(get(r, NULL, "after", INF_TOML_INT)->line, 11);
}
END_TEST

START_TEST(empty_and_bom)
{
    const struct inf_toml_node *r = parse_ok("");
    ck_assert_uint_eq(r->count, 0);
    r = parse_ok("\n# only a comment\n\n");
    ck_assert_uint_eq(r->count, 0);
    r = parse_ok("\xEF\xBB\xBFk = 1");
    ck_assert_int_eq(get(r, NULL, "k", INF_TOML_INT)->col, 1);
}
END_TEST

START_TEST(syntax_errors)
{
    parse_fails("a = 1\nb = 2\nport 8000\n", "line 3, column 6: expected '='");
    parse_fails("a = \n", "line 1, column 5: expected a value");
    parse_fails("a = cpu\n", "line 1, column 5: expected a value (strings need quotes)");
    parse_fails("a = 1 2\n", "line 1, column 7: expected end of line");
    parse_fails("= 1\n", "line 1, column 1: expected a key");
    parse_fails("[server\nx = 1\n", "line 1, column 8: expected ']'");
    parse_fails("[[t]]\n", "line 1, column 1: arrays of tables are not supported");
    parse_fails("t = {a = 1}\n", "line 1, column 5: inline tables are not supported");
    parse_fails("s = \"\"\"x\"\"\"\n", "line 1, column 5: multi-line strings are not supported");
    parse_fails("a = [[1]]\n", "line 1, column 6: nested arrays are not supported");
    parse_fails("a = 1\r\nb = 2\rc = 3\n", "line 2, column 6: expected end of line");
}
END_TEST

START_TEST(string_errors)
{
    parse_fails("s = \"abc\n", "line 1, column 5: unterminated string");
    parse_fails("x = 1\ns = 'abc", "line 2, column 5: unterminated string");
    parse_fails("s = \"a\\qb\"\n", "line 1, column 7: invalid escape '\\q'");
    parse_fails("s = \"\\u12\"\n", "line 1, column 6: escape \\u needs 4 hex digits");
    parse_fails("s = \"\\U0011FFFF\"\n", "line 1, column 6: escape is not a Unicode scalar value");
    parse_fails("s = \"\\uD800\"\n", "line 1, column 6: escape is not a Unicode scalar value");
    parse_fails("s = \"\\u0000\"\n", "line 1, column 6: U+0000 is not supported in strings");
    parse_fails("s = \"a\tb\x01\"\n", "line 1, column 9: control character in string");
    parse_fails("# bad \x7f comment\n", "line 1, column 7: control character in comment");
    /* Columns count characters, not bytes: "é" is one column. */
    parse_fails("s = \"\xC3\xA9\xC3\xA9\" x\n", "line 1, column 10: expected end of line");
    parse_fails("a = 1\nb = \"\xC3\x28\"\n", "line 2, column 6: invalid UTF-8");
    parse_fails("a = \"\xED\xA0\x80\"\n", "line 1, column 6: invalid UTF-8");
    parse_fails("a = \"\xC0\xAF\"\n", "line 1, column 6: invalid UTF-8");
}
END_TEST

START_TEST(number_errors)
{
    parse_fails("a = 9223372036854775808\n", "line 1, column 5: integer does not fit in 64 bits");
    parse_fails("a = -9_223_372_036_854_775_809\n",
                "line 1, column 5: integer does not fit in 64 bits");
    parse_fails("a = 1e999\n", "line 1, column 5: float is out of range");
    parse_fails("a = 01\n", "line 1, column 5: leading zeros are not allowed");
    parse_fails("a = 1__0\n", "line 1, column 6: '_' must stand between two digits");
    parse_fails("a = 10_\n", "line 1, column 7: '_' must stand between two digits");
    parse_fails("a = 1.\n", "line 1, column 7: expected digits after '.'");
    parse_fails("a = 1e\n", "line 1, column 7: expected digits in the exponent");
    parse_fails("a = 0x1F\n",
                "line 1, column 5: hexadecimal, octal and binary integers are not supported");
    parse_fails("a = 1979-05-27\n", "line 1, column 9: invalid number");
    parse_fails("a = .5\n", "line 1, column 5: expected a value (strings need quotes)");
    parse_fails("a = truex\n", "line 1, column 5: expected a value (strings need quotes)");
}
END_TEST

START_TEST(array_errors)
{
    parse_fails("a = [1, 2\n", "line 2, column 1: unterminated array (opened on line 1)");
    parse_fails("a = [1 2]\n", "line 1, column 8: expected ',' or ']' in array");
    parse_fails("a = [1,,2]\n", "line 1, column 8: expected a value (strings need quotes)");
    parse_fails("a = [\n 1,\n x]\n", "line 3, column 2: expected a value (strings need quotes)");
}
END_TEST

START_TEST(duplicates)
{
    parse_fails("port = 1\nhost = \"h\"\nport = 2\n",
                "line 3, column 1: duplicate key 'port' (first defined on line 1)");
    parse_fails("port = 1\n\"port\" = 2\n",
                "line 2, column 1: duplicate key 'port' (first defined on line 1)");
    parse_fails("[a]\nx = 1\n[b]\n[a]\n",
                "line 4, column 1: table 'a' is already defined on line 1");
    parse_fails("[a.b]\n[a]\n[a.b]\n", "line 3, column 1: table 'b' is already defined on line 1");
    parse_fails("a = 1\n[a]\n", "line 2, column 2: key 'a' is already defined on line 1 (integer)");
    parse_fails("a = 1\na.b = 2\n",
                "line 2, column 1: key 'a' is already defined on line 1 (integer)");
    parse_fails("a.b = 1\n[a]\n", "line 2, column 1: table 'a' is already defined on line 1");
    parse_fails("[a.b]\n[x]\n[a]\nb.c = 1\n",
                "line 4, column 1: table 'b' (line 1) cannot be extended by a dotted key");
    parse_fails("[s]\nk = 1\n[t]\nk = 1\n[s]\n",
                "line 5, column 1: table 's' is already defined on line 1");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("toml");
    TCase *tc = tcase_create("valid");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, scalars);
    tcase_add_test(tc, escapes);
    tcase_add_test(tc, tables_and_keys);
    tcase_add_test(tc, arrays);
    tcase_add_test(tc, empty_and_bom);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, syntax_errors);
    tcase_add_test(tc, string_errors);
    tcase_add_test(tc, number_errors);
    tcase_add_test(tc, array_errors);
    tcase_add_test(tc, duplicates);
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
