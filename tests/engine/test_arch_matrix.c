/* Every architecture the loader takes (tests/engine/arch_matrix.h), on the
 * CPU backend, x {fused, unfused q/k/v and gate/up} x {fp32, INT4 group 32}
 * x {one token, a batch of 16 sequences of mixed lengths}. On this backend
 * every result is the same whatever the batch or the fusion, so each
 * comparison is bit for bit: fused against unfused for the one token and for
 * every sequence of the batch (prefill and decode), and each sequence in the
 * batch against the same sequence alone. And the two builds really differ:
 * the fused model has fewer linears. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#define AM_REQUIRE(cond, ...) ck_assert_msg(cond, __VA_ARGS__)
#include "arch_matrix.h"

static char dir[256];
static struct eng_backend *be;

static eng_model_t *load(enum eng_quant q, bool fuse)
{
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.quant = q;
    o.group_size = 32;
    o.fuse_qkv = fuse;
    o.max_tokens = 512;
    o.n_kv_blocks = 64;
    eng_model_t *m = NULL;
    struct inf_err err = {0};
    inf_status_t s = eng_model_load(dir, be, &o, &m, &err);
    ck_assert_msg(s == INF_OK, "load: %s", err.msg);
    return m;
}

static void same(const char *arch, const char *quant, const char *what, const float *a,
                 const float *b, int n)
{
    if (memcmp(a, b, sizeof(float) * (size_t)n) == 0)
        return;
    int i = 0;
    while (a[i] == b[i])
        i++;
    ck_abort_msg("%s %s %s: differ first at %d (%.9g against %.9g)", arch, quant, what, i,
                 (double)a[i], (double)b[i]);
}

static void arch_case(int a)
{
    const struct tm_spec *sp = &ARCHS[a];
    const char *arch = ARCH_NAMES[a];
    const int V = sp->vocab;
    ck_assert_int_le(V, 128);
    snprintf(dir, sizeof dir, "/tmp/int4serve-arch-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(tm_write(dir, sp), 0);
    struct eng_backend_cpu_opts bo = {.n_threads = 2};
    struct inf_err err;
    ck_assert_int_eq(eng_backend_cpu_create(&bo, &be, &err), INF_OK);
    am_prompts(sp);
    static struct am_run f, u;
    const enum eng_quant quants[2] = {ENG_QUANT_NONE, ENG_QUANT_INT4};
    const char *const qnames[2] = {"fp32", "int4"};
    for (int qi = 0; qi < 2; qi++) {
        const char *q = qnames[qi];
        eng_model_t *mf = load(quants[qi], true), *mu = load(quants[qi], false);
        ck_assert_msg(eng_model_layer_count(mf) < eng_model_layer_count(mu),
                      "%s %s: fused %d linears, unfused %d", arch, q, eng_model_layer_count(mf),
                      eng_model_layer_count(mu));
        memset(&f, 0, sizeof f);
        memset(&u, 0, sizeof u);
        am_run_model(mf, V, &f);
        am_run_model(mu, V, &u);
        same(arch, q, "one token, fused vs unfused", f.one, u.one, V);
        for (int s = 0; s < N_SEQ; s++) {
            char what[96];
            snprintf(what, sizeof what, "batch seq %d (prompt %d) prefill, fused vs unfused", s,
                     plen[s]);
            same(arch, q, what, f.pre + s * V, u.pre + s * V, V);
            snprintf(what, sizeof what, "batch seq %d decode, fused vs unfused", s);
            same(arch, q, what, f.dec + s * V, u.dec + s * V, V);
            snprintf(what, sizeof what, "seq %d (prompt %d) prefill, batch vs alone", s, plen[s]);
            same(arch, q, what, f.pre + s * V, f.alone_pre + s * V, V);
            snprintf(what, sizeof what, "seq %d decode, batch vs alone", s);
            same(arch, q, what, f.dec + s * V, f.alone_dec + s * V, V);
            same(arch, q, "unfused, batch vs alone", u.dec + s * V, u.alone_dec + s * V, V);
        }
        /* the logits are a model's: finite and not flat */
        float lo = f.one[0], hi = f.one[0];
        for (int i = 0; i < V; i++) {
            ck_assert_msg(f.one[i] == f.one[i], "%s %s: NaN logit", arch, q);
            lo = f.one[i] < lo ? f.one[i] : lo;
            hi = f.one[i] > hi ? f.one[i] : hi;
        }
        ck_assert_msg(hi - lo > 0.1f, "%s %s: flat logits (%g to %g)", arch, q, (double)lo,
                      (double)hi);
        eng_model_destroy(mf);
        eng_model_destroy(mu);
    }
    eng_backend_destroy(be);
    be = NULL;
    tm_rmdir(dir);
}

START_TEST(arch_matrix)
{
    arch_case(_i);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("arch_matrix");
    TCase *t = tcase_create("cpu");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, arch_matrix, 0, (int)(sizeof ARCHS / sizeof ARCHS[0]));
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
