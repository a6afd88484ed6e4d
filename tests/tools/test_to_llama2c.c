/* int4serve-to-llama2c: the model file it writes, run by a forward written
 * here the way llama2.c's run.c computes (adjacent-pair RoPE, the legacy
 * layout and header), gives the logits int4serve-generate gives in fp32 on
 * the original checkpoint, tied and untied; its tokenizer file spells id i
 * as " i"; bad arguments are refused. */
#include "common/inf.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], bin_mk[512], bin_gen[512], bin_conv[512];

static void setup(void)
{
    const char *bd = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(bd != NULL, "INT4SERVE_BUILD_DIR is not set");
    snprintf(bin_mk, sizeof bin_mk, "%s/tools/mkmodel/int4serve-mkmodel", bd);
    snprintf(bin_gen, sizeof bin_gen, "%s/tools/generate/int4serve-generate", bd);
    snprintf(bin_conv, sizeof bin_conv, "%s/bench/cpu_decode/int4serve-to-llama2c", bd);
    snprintf(dir, sizeof dir, "/tmp/int4serve-test-l2c-%d", (int)getpid());
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static int sh(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*len ? *len : 1);
    ck_assert_uint_eq(fread(p, 1, *len, f), *len);
    fclose(f);
    return p;
}

/* ---- run.c's forward, in double, over the legacy file ---------------------- */

struct l2c {
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
    const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
};

static void l2c_map(const void *file, size_t len, struct l2c *m)
{
    const int32_t *h = file;
    m->dim = h[0], m->hidden = h[1], m->layers = h[2], m->heads = h[3], m->kv_heads = h[4];
    m->vocab = abs(h[5]), m->seq = h[6];
    bool shared = h[5] > 0;
    int64_t D = m->dim, F = m->hidden, L = m->layers, hs = D / m->heads,
            kvd = D * m->kv_heads / m->heads;
    const float *p = (const float *)(h + 7);
    m->emb = p, p += (int64_t)m->vocab * D;
    m->rms_att = p, p += L * D;
    m->wq = p, p += L * D * D;
    m->wk = p, p += L * kvd * D;
    m->wv = p, p += L * kvd * D;
    m->wo = p, p += L * D * D;
    m->rms_ffn = p, p += L * D;
    m->w1 = p, p += L * F * D;
    m->w2 = p, p += L * D * F;
    m->w3 = p, p += L * F * D;
    m->rms_final = p, p += D;
    p += (int64_t)m->seq * hs; /* freq_cis_real and imag */
    m->wcls = shared ? m->emb : p;
    if (!shared)
        p += (int64_t)m->vocab * D;
    ck_assert_uint_eq((size_t)((const char *)p - (const char *)file), len);
}

static void mv(double *y, const float *w, const double *x, int n, int k)
{
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < k; j++)
            s += (double)w[(int64_t)i * k + j] * x[j];
        y[i] = s;
    }
}

static void rms(double *o, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * (inv * x[i]);
}

/* Logits of every position of ids[0..n) into out [n][vocab]. */
static void l2c_forward(const struct l2c *m, const int32_t *ids, int n, double *out)
{
    const int D = m->dim, F = m->hidden, hs = D / m->heads, kvd = D * m->kv_heads / m->heads;
    const int kv_mul = m->heads / m->kv_heads;
    double *x = calloc(D, 8), *xb = calloc(D, 8), *q = calloc(D, 8), *hb = calloc(F, 8),
           *hb2 = calloc(F, 8), *att = calloc((size_t)n, 8), *tmp = calloc(D, 8);
    double *kc = calloc((size_t)m->layers * n * kvd, 8),
           *vc = calloc((size_t)m->layers * n * kvd, 8);
    for (int pos = 0; pos < n; pos++) {
        for (int i = 0; i < D; i++)
            x[i] = m->emb[(int64_t)ids[pos] * D + i];
        for (int l = 0; l < m->layers; l++) {
            double *k = kc + ((int64_t)l * n + pos) * kvd, *v = vc + ((int64_t)l * n + pos) * kvd;
            rms(xb, x, m->rms_att + (int64_t)l * D, D);
            mv(q, m->wq + (int64_t)l * D * D, xb, D, D);
            mv(k, m->wk + (int64_t)l * kvd * D, xb, kvd, D);
            mv(v, m->wv + (int64_t)l * kvd * D, xb, kvd, D);
            for (int i = 0; i < D; i += 2) { /* adjacent pairs, as run.c */
                double f = 1.0 / pow(10000.0, (double)(i % hs) / hs), c = cos(pos * f),
                       s = sin(pos * f);
                for (int t = 0; t < (i < kvd ? 2 : 1); t++) {
                    double *vec = t == 0 ? q : k, v0 = vec[i], v1 = vec[i + 1];
                    vec[i] = v0 * c - v1 * s;
                    vec[i + 1] = v0 * s + v1 * c;
                }
            }
            for (int h = 0; h < m->heads; h++) {
                double mx = -1e300, sum = 0;
                for (int t = 0; t <= pos; t++) {
                    const double *kt = kc + ((int64_t)l * n + t) * kvd + (h / kv_mul) * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++)
                        s += q[h * hs + i] * kt[i];
                    att[t] = s / sqrt(hs);
                    mx = fmax(mx, att[t]);
                }
                for (int t = 0; t <= pos; t++)
                    sum += (att[t] = exp(att[t] - mx));
                for (int i = 0; i < hs; i++) {
                    double a = 0;
                    for (int t = 0; t <= pos; t++)
                        a += att[t] / sum * vc[((int64_t)l * n + t) * kvd + (h / kv_mul) * hs + i];
                    xb[h * hs + i] = a;
                }
            }
            mv(tmp, m->wo + (int64_t)l * D * D, xb, D, D);
            for (int i = 0; i < D; i++)
                x[i] += tmp[i];
            rms(xb, x, m->rms_ffn + (int64_t)l * D, D);
            mv(hb, m->w1 + (int64_t)l * F * D, xb, F, D);
            mv(hb2, m->w3 + (int64_t)l * F * D, xb, F, D);
            for (int i = 0; i < F; i++)
                hb[i] = hb[i] / (1.0 + exp(-hb[i])) * hb2[i];
            mv(tmp, m->w2 + (int64_t)l * D * F, hb, D, F);
            for (int i = 0; i < D; i++)
                x[i] += tmp[i];
        }
        rms(xb, x, m->rms_final, D);
        mv(out + (int64_t)pos * m->vocab, m->wcls, xb, m->vocab, D);
    }
    free(x), free(xb), free(q), free(hb), free(hb2), free(att), free(tmp), free(kc), free(vc);
}

/* ---- tests ---------------------------------------------------------------------- */

static void check_model(bool tie, int kv_heads)
{
    char cmd[4096], model[300], tok[300], logits[300];
    snprintf(model, sizeof model, "%s/model.bin", dir);
    snprintf(tok, sizeof tok, "%s/tok.bin", dir);
    snprintf(logits, sizeof logits, "%s/logits.f32", dir);
    snprintf(cmd, sizeof cmd,
             "%s --out %s --hidden 64 --intermediate 96 --layers 2 --heads 4 --kv-heads %d "
             "--max-pos 64 --seed 3 %s >/dev/null",
             bin_mk, dir, kv_heads, tie ? "--tie" : "");
    ck_assert_int_eq(sh(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s %s %s %s", bin_conv, dir, model, tok);
    ck_assert_int_eq(sh(cmd), 0);
    static const int32_t ids[] = {5, 77, 300, 12, 9, 401, 33, 250, 7, 120, 64, 3};
    enum { N = sizeof ids / sizeof ids[0] };
    /* int4serve's fp32 logits of every prompt position (one generated id) */
    snprintf(cmd, sizeof cmd,
             "%s --model %s --quantization none --threads 1 --max-tokens 1 --dump-logits %s "
             "--prompt-ids 5,77,300,12,9,401,33,250,7,120,64,3 >/dev/null 2>&1",
             bin_gen, dir, logits);
    ck_assert_int_eq(sh(cmd), 0);
    size_t flen, llen;
    void *file = slurp(model, &flen);
    float *got = slurp(logits, &llen);
    struct l2c m;
    l2c_map(file, flen, &m);
    ck_assert_int_eq(m.dim, 64);
    ck_assert_int_eq(m.kv_heads, kv_heads);
    ck_assert_int_eq(m.seq, 64);
    ck_assert_int_eq(((const int32_t *)file)[5] > 0, tie);
    ck_assert_uint_eq(llen, sizeof(float) * N * (size_t)m.vocab);
    double *want = malloc(sizeof(double) * N * (size_t)m.vocab), err = 0, mag = 0;
    l2c_forward(&m, ids, N, want);
    for (int64_t i = 0; i < (int64_t)N * m.vocab; i++) {
        err = fmax(err, fabs(got[i] - want[i]));
        mag = fmax(mag, fabs(want[i]));
    }
    /* fp32 against double: rounding only; the wrong RoPE pairing (rows not
     * reordered) gives differences of the order of the logits themselves */
    ck_assert_msg(err <= 1e-4 * mag, "tie %d kv %d: max |diff| %g, max |logit| %g", tie, kv_heads,
                  err, mag);
    /* the tokenizer: max length, then score 0 and " <id>" for every id */
    size_t tlen;
    unsigned char *t = slurp(tok, &tlen);
    int32_t maxlen;
    memcpy(&maxlen, t, 4);
    char want_piece[32];
    ck_assert_int_eq(maxlen, snprintf(want_piece, sizeof want_piece, " %d", m.vocab - 1));
    size_t off = 4;
    for (int i = 0; i < m.vocab; i++) {
        float score;
        int32_t len;
        memcpy(&score, t + off, 4);
        memcpy(&len, t + off + 4, 4);
        int wl = snprintf(want_piece, sizeof want_piece, " %d", i);
        ck_assert(score == 0.0f && len == wl && off + 8 + (size_t)len <= tlen);
        ck_assert(memcmp(t + off + 8, want_piece, (size_t)len) == 0);
        off += 8 + (size_t)len;
    }
    ck_assert_uint_eq(off, tlen);
    free(file), free(got), free(want), free(t);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(sh(cmd), 0);
}

START_TEST(same_logits_as_int4serve)
{
    check_model(false, 4);
    check_model(true, 4);
    check_model(false, 2); /* GQA */
}
END_TEST

START_TEST(bad_arguments_refused)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", bin_conv, dir);
    ck_assert_int_eq(sh(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s %s/none %s/a.bin %s/b.bin 2>/dev/null", bin_conv, dir, dir, dir);
    ck_assert_int_eq(sh(cmd), 1);
    /* a shape run.c cannot take: head_dim * heads != hidden */
    snprintf(cmd, sizeof cmd,
             "%s --out %s --hidden 64 --intermediate 96 --layers 1 --heads 4 --head-dim 8 "
             ">/dev/null && %s %s %s/a.bin %s/b.bin 2>/dev/null",
             bin_mk, dir, bin_conv, dir, dir, dir);
    ck_assert_int_eq(sh(cmd), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("to_llama2c");
    TCase *t = tcase_create("convert");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, same_logits_as_int4serve);
    tcase_add_test(t, bad_arguments_refused);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
