/* int4serve-mkmodel: its checkpoints load through the engine's readers,
 * shapes match config.json, values are finite and scaled as documented,
 * activations stay in range through every layer of a reference forward
 * pass written here, output is deterministic, and tokenizer.json is a
 * consistent byte-level BPE; --format writes the INT4 formats' tensors.
 * Runs the tool from INT4SERVE_BUILD_DIR. */
#include "engine/weights/model_config.h"
#include "engine/weights/safetensors.h"
#include "tokenizer/tokenizer.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/int4serve-mk-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void teardown(void)
{
    rm_tree(tmpdir);
}

/* Run the tool with args (NULL-terminated) writing into tmpdir/sub; returns
 * its exit status. */
static int mkmodel(const char *sub, ...)
{
    const char *bd = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(bd != NULL, "INT4SERVE_BUILD_DIR is not set");
    char tool[1024], out[512];
    snprintf(tool, sizeof tool, "%s/tools/mkmodel/int4serve-mkmodel", bd);
    ck_assert_msg(access(tool, X_OK) == 0, "%s not built", tool);
    snprintf(out, sizeof out, "%s/%s", tmpdir, sub);
    const char *argv[32] = {tool, "--out", out};
    int argc = 3;
    va_list ap;
    va_start(ap, sub);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && argc < 31)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        if (devnull >= 0)
            dup2(devnull, 1);
        execv(tool, (char *const *)argv);
        _exit(127);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static char *dir_of(const char *sub)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, sub);
    return p;
}

/* ---- weights: names, shapes, statistics -------------------------------------- */

struct expect {
    char name[96];
    int32_t ndim;
    int64_t shape[2];
    double mean, std;
};

/* The tensors a LlamaForCausalLM state dict has, with the scales the tool
 * documents (see tools/mkmodel/main.c). */
static int expected_tensors(const struct eng_model_config *c, struct expect *e)
{
    int n = 0;
    int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim,
            kv = (int64_t)c->n_kv_heads * c->head_dim, f = c->intermediate;
    double br = 0.5 / sqrt(2.0 * c->n_layers);
#define E(rows, cols, m, s, ...)                                                                   \
    do {                                                                                           \
        snprintf(e[n].name, sizeof e[n].name, __VA_ARGS__);                                        \
        e[n].ndim = (cols) ? 2 : 1;                                                                \
        e[n].shape[0] = rows;                                                                      \
        e[n].shape[1] = cols;                                                                      \
        e[n].mean = m;                                                                             \
        e[n].std = s;                                                                              \
        n++;                                                                                       \
    } while (0)
    E(c->vocab, h, 0, c->tie_embeddings ? 1 / sqrt((double)h) : 1.0, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layers; l++) {
        E(h, 0, 1, 0.02, "model.layers.%d.input_layernorm.weight", l);
        E(h, 0, 1, 0.02, "model.layers.%d.post_attention_layernorm.weight", l);
        E(q, h, 0, 1 / sqrt((double)h), "model.layers.%d.self_attn.q_proj.weight", l);
        E(kv, h, 0, 1 / sqrt((double)h), "model.layers.%d.self_attn.k_proj.weight", l);
        E(kv, h, 0, 1 / sqrt((double)h), "model.layers.%d.self_attn.v_proj.weight", l);
        E(h, q, 0, br / sqrt((double)q), "model.layers.%d.self_attn.o_proj.weight", l);
        E(f, h, 0, 1 / sqrt((double)h), "model.layers.%d.mlp.gate_proj.weight", l);
        E(f, h, 0, 1 / sqrt((double)h), "model.layers.%d.mlp.up_proj.weight", l);
        E(h, f, 0, br / sqrt((double)f), "model.layers.%d.mlp.down_proj.weight", l);
        if (c->qkv_bias) {
            E(q, 0, 0, 0.02, "model.layers.%d.self_attn.q_proj.bias", l);
            E(kv, 0, 0, 0.02, "model.layers.%d.self_attn.k_proj.bias", l);
            E(kv, 0, 0, 0.02, "model.layers.%d.self_attn.v_proj.bias", l);
        }
    }
    E(h, 0, 1, 0.02, "model.norm.weight");
    if (!c->tie_embeddings)
        E(c->vocab, h, 0, 1 / sqrt((double)h), "lm_head.weight");
#undef E
    return n;
}

static float *load(const eng_st_t *st, const char *name, int64_t *numel)
{
    const struct eng_st_tensor *t = eng_st_find(st, name);
    ck_assert_msg(t != NULL, "%s missing", name);
    float *v = malloc((size_t)t->numel * sizeof *v);
    struct inf_err err;
    ck_assert_int_eq(eng_st_read_f32(t, 0, t->numel, v, &err), INF_OK);
    if (numel)
        *numel = t->numel;
    return v;
}

/* Every tensor present with its shape and dtype, nothing extra, finite,
 * mean and std where the documented rule puts them. */
static void check_weights(const char *dir, const struct eng_model_config *c, enum eng_dtype dt)
{
    eng_st_t *st;
    struct inf_err err;
    ck_assert_msg(eng_st_open(dir, &st, &err) == INF_OK, "%s", err.msg);
    struct expect *e = calloc(16 + 12 * (size_t)c->n_layers, sizeof *e);
    int n = expected_tensors(c, e);
    ck_assert_int_eq(eng_st_count(st), n);
    for (int i = 0; i < n; i++) {
        const struct eng_st_tensor *t;
        ck_assert_msg(eng_st_require(st, e[i].name, e[i].ndim, e[i].shape, &t, &err) == INF_OK,
                      "%s", err.msg);
        ck_assert_int_eq(t->dtype, dt);
        int64_t numel;
        float *v = load(st, e[i].name, &numel);
        /* assertions stay out of the element loops: each one costs Check a
         * write to its pipe */
        double sum = 0, sq = 0;
        int64_t bad = -1;
        for (int64_t j = 0; j < numel; j++) {
            if (!isfinite(v[j]) && bad < 0)
                bad = j;
            sum += v[j];
        }
        ck_assert_msg(bad < 0, "%s[%lld] is not finite", e[i].name, (long long)bad);
        double mean = sum / (double)numel;
        for (int64_t j = 0; j < numel; j++)
            sq += (v[j] - mean) * (v[j] - mean);
        double sd = sqrt(sq / (double)(numel - 1));
        /* sampling error of the mean is std/sqrt(n); allow 6 of those plus
         * the dtype's rounding */
        double tol_mean = 6 * e[i].std / sqrt((double)numel) + (dt == ENG_DT_BF16 ? 4e-3 : 1e-4);
        ck_assert_msg(fabs(mean - e[i].mean) < tol_mean, "%s: mean %g, want %g +- %g", e[i].name,
                      mean, e[i].mean, tol_mean);
        /* norm weights near 1 carry bf16's 2^-8 steps on top of 0.02 noise */
        double tol_sd = 0.1 + (dt == ENG_DT_BF16 && e[i].mean == 1 ? 0.15 : 0);
        ck_assert_msg(fabs(sd / e[i].std - 1) < tol_sd, "%s: std %g, want %g", e[i].name, sd,
                      e[i].std);
        free(v);
    }
    free(e);
    eng_st_close(st);
}

/* ---- a reference forward pass ------------------------------------------------------ */

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++)
        o[i] = x[i] * r * w[i];
}

/* o[rows] = W[rows][cols] x + b */
static void matvec(float *o, const float *W, const float *x, const float *b, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int k = 0; k < cols; k++)
            s += (double)W[(size_t)r * cols + k] * x[k];
        o[r] = (float)s;
    }
}

static double rms(const float *x, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return sqrt(ss / n);
}

/* Run T tokens through the model; every layer's residual stream must keep
 * its RMS in [0.2, 5] ([0.02, 5] when tied) and the logits a spread that is neither flat nor
 * saturated. */
static void check_forward(const char *dir, const struct eng_model_config *c)
{
    eng_st_t *st;
    struct inf_err err;
    ck_assert_int_eq(eng_st_open(dir, &st, &err), INF_OK);
    enum { T = 12 };
    const int H = c->hidden, D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads,
              F = c->intermediate, V = c->vocab;
    const int Q = NH * D, KV = NKV * D;
    float *x = calloc((size_t)T * H, sizeof *x), *xn = malloc(H * sizeof *xn);
    float *q = malloc((size_t)T * Q * sizeof *q), *k = malloc((size_t)T * KV * sizeof *k);
    float *v = malloc((size_t)T * KV * sizeof *v), *att = malloc(Q * sizeof *att);
    float *tmp = malloc((size_t)(F > H ? F : H) * sizeof *tmp);
    float *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u);
    float *logits = malloc((size_t)V * sizeof *logits);
    float *emb = load(st, "model.embed_tokens.weight", NULL);
    for (int t = 0; t < T; t++)
        memcpy(&x[(size_t)t * H], &emb[(size_t)((t * 37 + 5) % V) * H], H * sizeof *x);
    /* a tied embedding is scaled by 1/sqrt(hidden), so its stream starts small */
    const double lo = c->tie_embeddings ? 0.02 : 0.2;
    char name[128];
    for (int l = 0; l < c->n_layers; l++) {
#define W(suffix)                                                                                  \
    (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), load(st, name, NULL))
        float *win = W("input_layernorm.weight"), *wpost = W("post_attention_layernorm.weight");
        float *wq = W("self_attn.q_proj.weight"), *wk = W("self_attn.k_proj.weight");
        float *wv = W("self_attn.v_proj.weight"), *wo = W("self_attn.o_proj.weight");
        float *wg = W("mlp.gate_proj.weight"), *wu = W("mlp.up_proj.weight");
        float *wd = W("mlp.down_proj.weight");
        float *bq = NULL, *bk = NULL, *bv = NULL;
        if (c->qkv_bias) {
            bq = W("self_attn.q_proj.bias");
            bk = W("self_attn.k_proj.bias");
            bv = W("self_attn.v_proj.bias");
        }
#undef W
        for (int t = 0; t < T; t++) {
            rmsnorm(xn, &x[(size_t)t * H], win, H, c->rms_eps);
            matvec(&q[(size_t)t * Q], wq, xn, bq, Q, H);
            matvec(&k[(size_t)t * KV], wk, xn, bk, KV, H);
            matvec(&v[(size_t)t * KV], wv, xn, bv, KV, H);
            /* rotate_half RoPE at position t */
            for (int hh = 0; hh < NH + NKV; hh++) {
                float *vec =
                    hh < NH ? &q[(size_t)t * Q + hh * D] : &k[(size_t)t * KV + (hh - NH) * D];
                for (int i = 0; i < D / 2; i++) {
                    double ang = t * pow(c->rope_theta, -2.0 * i / D);
                    float a = vec[i], b = vec[i + D / 2];
                    vec[i] = (float)(a * cos(ang) - b * sin(ang));
                    vec[i + D / 2] = (float)(b * cos(ang) + a * sin(ang));
                }
            }
        }
        for (int t = 0; t < T; t++) {
            for (int hh = 0; hh < NH; hh++) {
                int kh = hh / (NH / NKV);
                double sc[T], mx = -1e30, den = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++)
                        d += (double)q[(size_t)t * Q + hh * D + i] * k[(size_t)s * KV + kh * D + i];
                    sc[s] = d / sqrt((double)D);
                    mx = sc[s] > mx ? sc[s] : mx;
                }
                for (int s = 0; s <= t; s++)
                    den += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++)
                        o += sc[s] / den * v[(size_t)s * KV + kh * D + i];
                    att[hh * D + i] = (float)o;
                }
            }
            float *xt = &x[(size_t)t * H];
            matvec(tmp, wo, att, NULL, H, Q);
            for (int i = 0; i < H; i++)
                xt[i] += tmp[i];
            rmsnorm(xn, xt, wpost, H, c->rms_eps);
            matvec(g, wg, xn, NULL, F, H);
            matvec(u, wu, xn, NULL, F, H);
            for (int i = 0; i < F; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            matvec(tmp, wd, g, NULL, H, F);
            for (int i = 0; i < H; i++)
                xt[i] += tmp[i];
            double r = rms(xt, H);
            ck_assert_msg(isfinite(r) && r > lo && r < 5, "layer %d token %d: rms %g", l, t, r);
        }
        free(win), free(wpost), free(wq), free(wk), free(wv), free(wo), free(wg), free(wu);
        free(wd), free(bq), free(bk), free(bv);
    }
    float *wn = load(st, "model.norm.weight", NULL);
    float *lm = c->tie_embeddings ? emb : load(st, "lm_head.weight", NULL);
    for (int t = 0; t < T; t++) {
        rmsnorm(xn, &x[(size_t)t * H], wn, H, c->rms_eps);
        matvec(logits, lm, xn, NULL, V, H);
        double mean = 0, mx = -1e30, den = 0;
        int finite = 1;
        for (int i = 0; i < V; i++) {
            finite &= isfinite(logits[i]) != 0;
            mean += logits[i] / V;
            mx = logits[i] > mx ? logits[i] : mx;
        }
        double sd = 0;
        for (int i = 0; i < V; i++) {
            sd += (logits[i] - mean) * (logits[i] - mean) / V;
            den += exp(logits[i] - mx);
        }
        sd = sqrt(sd);
        ck_assert_msg(finite, "token %d: logits not finite", t);
        ck_assert_msg(sd > 0.3 && sd < 3, "token %d: logit std %g", t, sd);
        ck_assert_msg(1.0 / den < 0.9, "token %d: top probability %g", t, 1.0 / den);
    }
    if (!c->tie_embeddings)
        free(lm);
    free(wn), free(emb), free(x), free(xn), free(q), free(k), free(v), free(att), free(tmp);
    free(g), free(u), free(logits);
    eng_st_close(st);
}

/* ---- tokenizer ----------------------------------------------------------------- */

/* GPT-2's byte-to-unicode map, written independently of the tool's. */
static void gpt2_char(int b, char out[3])
{
    static int map[256];
    static bool init;
    if (!init) {
        int n = 0;
        for (int i = 0; i < 256; i++) {
            bool keep = (i >= '!' && i <= '~') || (i >= 0xa1 && i <= 0xac) || (i >= 0xae);
            map[i] = keep ? i : 256 + n++;
        }
        init = true;
    }
    int cp = map[b];
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
    }
}

static json_t *load_json(const char *dir, const char *file)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    json_error_t jerr;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
    ck_assert_msg(j != NULL, "%s: %s", file, jerr.text);
    return j;
}

/* Returns the tokenizer's size (max id + 1). */
static int64_t check_tokenizer(const char *dir, const struct eng_model_config *c)
{
    json_t *tok = load_json(dir, "tokenizer.json");
    json_t *model = json_object_get(tok, "model");
    ck_assert_str_eq(json_string_value(json_object_get(model, "type")), "BPE");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(tok, "pre_tokenizer"), "type")),
        "ByteLevel");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(tok, "decoder"), "type")),
                     "ByteLevel");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    int64_t n = (int64_t)json_object_size(vocab);
    /* ids are exactly 0..n-1 */
    char *seen = calloc((size_t)n, 1);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        json_int_t id = json_integer_value(v);
        if (id >= 0 && id < n)
            seen[id]++;
    }
    int64_t once = 0;
    for (int64_t i = 0; i < n; i++)
        once += seen[i] == 1;
    ck_assert_int_eq(once, n);
    free(seen);
    /* every byte has its symbol */
    for (int b = 0; b < 256; b++) {
        char s[3];
        gpt2_char(b, s);
        ck_assert_msg(json_object_get(vocab, s) != NULL, "byte %d missing", b);
    }
    ck_assert_int_eq(json_integer_value(json_object_get(vocab, "\xc4\xa0")), 32); /* Ġ = space */
    /* a few hundred merges, each joining two known symbols into a known one */
    size_t nm = json_array_size(merges);
    ck_assert_uint_ge(nm, 200);
    ck_assert_uint_le(nm, 1000);
    ck_assert_int_eq(n, 256 + (int64_t)nm); /* no merge repeats a symbol here */
    size_t i;
    json_array_foreach(merges, i, v)
    {
        const char *m = json_string_value(v);
        const char *sp = strchr(m, ' ');
        ck_assert_ptr_nonnull(sp);
        char a[64], b[64], ab[128];
        snprintf(a, sizeof a, "%.*s", (int)(sp - m), m);
        snprintf(b, sizeof b, "%s", sp + 1);
        snprintf(ab, sizeof ab, "%s%s", a, b);
        ck_assert_msg(json_object_get(vocab, a) && json_object_get(vocab, b) &&
                          json_object_get(vocab, ab),
                      "merge %zu '%s'", i, m);
    }
    /* common English words became single tokens */
    ck_assert_ptr_nonnull(json_object_get(vocab, "\xc4\xa0"
                                                 "the"));
    ck_assert_ptr_nonnull(json_object_get(vocab, "\xc4\xa0"
                                                 "and"));
    /* special tokens follow the vocabulary and match config.json */
    json_t *added = json_object_get(tok, "added_tokens");
    ck_assert_uint_eq(json_array_size(added), 2);
    json_t *bos = json_array_get(added, 0), *eos = json_array_get(added, 1);
    ck_assert_str_eq(json_string_value(json_object_get(bos, "content")), "<|begin_of_text|>");
    ck_assert_str_eq(json_string_value(json_object_get(eos, "content")), "<|end_of_text|>");
    ck_assert_int_eq(json_integer_value(json_object_get(bos, "id")), n);
    ck_assert_int_eq(json_integer_value(json_object_get(eos, "id")), n + 1);
    ck_assert(json_is_true(json_object_get(bos, "special")));
    ck_assert_int_eq(c->bos_id, n);
    ck_assert_int_eq(c->n_eos, 1);
    ck_assert_int_eq(c->eos_ids[0], n + 1);
    /* the post-processor adds BOS by id */
    json_t *post = json_object_get(tok, "post_processor");
    ck_assert_str_eq(json_string_value(json_object_get(post, "type")), "TemplateProcessing");
    json_t *sp = json_object_get(json_object_get(post, "special_tokens"), "<|begin_of_text|>");
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(sp, "ids"), 0)), n);
    json_decref(tok);

    json_t *tc = load_json(dir, "tokenizer_config.json");
    ck_assert_str_eq(json_string_value(json_object_get(tc, "bos_token")), "<|begin_of_text|>");
    ck_assert_str_eq(json_string_value(json_object_get(tc, "eos_token")), "<|end_of_text|>");
    ck_assert(json_is_true(json_object_get(tc, "add_bos_token")));
    json_decref(tc);
    json_t *gc = load_json(dir, "generation_config.json");
    ck_assert_int_eq(json_integer_value(json_object_get(gc, "bos_token_id")), n);
    ck_assert_int_eq(json_integer_value(json_object_get(gc, "eos_token_id")), n + 1);
    json_decref(gc);
    return n + 2;
}

/* The engine's own tokenizer loads the file: BOS added by the template, a
 * common word is one token, and decoding gives the text back byte for byte. */
static void check_engine_tokenizer(const char *dir, int64_t size)
{
    tok_tokenizer_t *tok;
    struct inf_err err;
    ck_assert_msg(tok_load(dir, &tok, &err) == INF_OK, "%s", err.msg);
    int32_t n = (int32_t)size - 2;
    ck_assert_int_eq(tok_vocab_size(tok), size);
    ck_assert_int_eq(tok_bos_id(tok), n);
    ck_assert_int_eq(tok_eos_id(tok), n + 1);
    ck_assert_int_eq(tok_token_to_id(tok, "<|end_of_text|>"), n + 1);
    const char *text = "The river ran under the bridge, caf\xc3\xa9 na\xc3\xafve 42!\n";
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(tok, text, strlen(text), NULL, &ids, &err), INF_OK);
    ck_assert_uint_ge(ids.n, 8);
    ck_assert_uint_lt(ids.n, strlen(text)); /* merges shortened it */
    ck_assert_int_eq(ids.ids[0], n);
    for (size_t i = 1; i < ids.n; i++)
        ck_assert_int_lt(ids.ids[i], n);
    char *back;
    size_t blen;
    ck_assert_int_eq(tok_decode(tok, ids.ids, ids.n, true, &back, &blen, &err), INF_OK);
    ck_assert_str_eq(back, text);
    free(back);
    tok_ids_fini(&ids);
    struct tok_encode_opts plain = tok_encode_defaults();
    plain.add_special = false;
    ck_assert_int_eq(tok_encode(tok, " the", 4, &plain, &ids, &err), INF_OK);
    ck_assert_uint_eq(ids.n, 1);
    ck_assert_str_eq(tok_id_to_token(tok, ids.ids[0]), "\xc4\xa0the");
    tok_ids_fini(&ids);
    tok_destroy(tok);
}

/* ---- tests ------------------------------------------------------------------------- */

START_TEST(tiny_preset)
{
    ck_assert_int_eq(mkmodel("tiny", "--preset", "tiny", NULL), 0);
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(eng_model_config_load(dir_of("tiny"), &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_LLAMA);
    ck_assert_int_eq(c.hidden, 288);
    ck_assert_int_eq(c.n_layers, 6);
    ck_assert_int_eq(c.n_heads, 6);
    ck_assert_int_eq(c.n_kv_heads, 6);
    ck_assert_int_eq(c.head_dim, 48);
    ck_assert_int_eq(c.intermediate, 768);
    ck_assert_str_eq(c.torch_dtype, "float32");
    int64_t tok = check_tokenizer(dir_of("tiny"), &c);
    ck_assert_int_eq(c.vocab, (tok + 7) / 8 * 8); /* the tokenizer's size rounded up to 8 */
    check_engine_tokenizer(dir_of("tiny"), tok);
    check_weights(dir_of("tiny"), &c, ENG_DT_F32);
    check_forward(dir_of("tiny"), &c);
}
END_TEST

START_TEST(small_preset_gqa)
{
    ck_assert_int_eq(mkmodel("small", "--preset", "small", "--seed", "7", NULL), 0);
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(eng_model_config_load(dir_of("small"), &c, &err), INF_OK);
    ck_assert_int_eq(c.hidden, 512);
    ck_assert_int_eq(c.n_layers, 8);
    ck_assert_int_eq(c.n_heads, 8);
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.intermediate, 1408);
    check_weights(dir_of("small"), &c, ENG_DT_F32);
    check_forward(dir_of("small"), &c);
}
END_TEST

START_TEST(qwen2_bf16_sharded_tied)
{
    ck_assert_int_eq(mkmodel("q", "--preset", "small", "--arch", "qwen2", "--dtype", "bf16",
                             "--shards", "3", "--tie", "--layers", "4", NULL),
                     0);
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(eng_model_config_load(dir_of("q"), &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_QWEN2);
    ck_assert(c.qkv_bias);
    ck_assert(c.tie_embeddings);
    ck_assert_int_eq(c.n_layers, 4);
    ck_assert_str_eq(c.torch_dtype, "bfloat16");
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir_of("q"));
    ck_assert_int_eq(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", dir_of("q"));
    ck_assert_int_eq(access(p, F_OK), 0);
    check_weights(dir_of("q"), &c, ENG_DT_BF16);
    check_forward(dir_of("q"), &c);
}
END_TEST

START_TEST(mistral_f16_llama3_rope_custom_shape)
{
    ck_assert_int_eq(mkmodel("m", "--arch", "mistral", "--dtype", "f16", "--hidden", "256",
                             "--intermediate", "512", "--layers", "3", "--heads", "4", "--kv-heads",
                             "1", "--head-dim", "32", "--max-pos", "4096", "--rope-theta", "500000",
                             "--rope-llama3", NULL),
                     0);
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(eng_model_config_load(dir_of("m"), &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_MISTRAL);
    ck_assert_int_eq(c.hidden, 256);
    ck_assert_int_eq(c.n_heads, 4);
    ck_assert_int_eq(c.n_kv_heads, 1);
    ck_assert_int_eq(c.head_dim, 32); /* 4 x 32 != 256: head_dim given */
    ck_assert_int_eq(c.max_pos, 4096);
    ck_assert_float_eq(c.rope_theta, 500000.0f);
    ck_assert(c.rope_llama3);
    ck_assert_float_eq(c.rope_factor, 8.0f);
    ck_assert_int_eq(c.rope_orig_max_pos, 8192);
    ck_assert_int_eq(c.sliding_window, 0); /* null */
    check_weights(dir_of("m"), &c, ENG_DT_F16);
    check_forward(dir_of("m"), &c);
    /* --sliding-window: config.json's sliding_window */
    ck_assert_int_eq(mkmodel("w", "--arch", "mistral", "--layers", "2", "--max-pos", "512",
                             "--sliding-window", "96", NULL),
                     0);
    ck_assert_int_eq(eng_model_config_load(dir_of("w"), &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_MISTRAL);
    ck_assert_int_eq(c.sliding_window, 96);
    check_forward(dir_of("w"), &c);
}
END_TEST

static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    ck_assert(fa && fb);
    bool same = true;
    int ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb)
            same = false;
    } while (same && ca != EOF);
    fclose(fa);
    fclose(fb);
    return same;
}

START_TEST(deterministic_from_seed)
{
    const char *args[] = {"--hidden", "64", "--intermediate", "128", "--layers", "2",
                          "--heads",  "4",  "--kv-heads",     "2"};
    ck_assert_int_eq(mkmodel("a", args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                             args[7], args[8], args[9], "--seed", "3", NULL),
                     0);
    ck_assert_int_eq(mkmodel("b", args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                             args[7], args[8], args[9], "--seed", "3", NULL),
                     0);
    ck_assert_int_eq(mkmodel("c", args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                             args[7], args[8], args[9], "--seed", "4", NULL),
                     0);
    char a[600], b[600];
    const char *files[] = {"model.safetensors", "tokenizer.json", "config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", dir_of("a"), files[i]);
        snprintf(b, sizeof b, "%s/%s", dir_of("b"), files[i]);
        ck_assert_msg(same_file(a, b), "%s differs between two runs", files[i]);
    }
    snprintf(a, sizeof a, "%s/model.safetensors", dir_of("a"));
    snprintf(b, sizeof b, "%s/model.safetensors", dir_of("c"));
    ck_assert(!same_file(a, b));
}
END_TEST

START_TEST(copied_tokenizer)
{
    /* a tokenizer whose ids run to 1000 with </s> as an added token */
    char p[600];
    snprintf(p, sizeof p, "%s/tok.json", tmpdir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"added_tokens\":[{\"id\":1000,\"content\":\"</s>\",\"special\":true},"
               "{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int i = 0; i < 999; i++)
        fprintf(f, "%s\"t%d\":%d", i ? "," : "", i, i + 1);
    fprintf(f, "},\"merges\":[]}}");
    fclose(f);
    ck_assert_int_eq(mkmodel("t", "--tokenizer", p, "--layers", "1", NULL), 0);
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(eng_model_config_load(dir_of("t"), &c, &err), INF_OK);
    ck_assert_int_eq(c.vocab, 1001);
    ck_assert_int_eq(c.bos_id, 1);
    ck_assert_int_eq(c.eos_ids[0], 1000);
    char q[600];
    snprintf(q, sizeof q, "%s/tokenizer.json", dir_of("t"));
    ck_assert(same_file(p, q));
    json_t *tc = load_json(dir_of("t"), "tokenizer_config.json");
    ck_assert_str_eq(json_string_value(json_object_get(tc, "bos_token")), "<s>");
    ck_assert_str_eq(json_string_value(json_object_get(tc, "eos_token")), "</s>");
    json_decref(tc);
    check_weights(dir_of("t"), &c, ENG_DT_F32);
}
END_TEST

START_TEST(refuses_bad_shapes)
{
    /* heads not dividing hidden, kv heads not dividing heads, vocab below the
     * tokenizer, an unknown preset and dtype: refused, nothing half-written */
    ck_assert_int_ne(mkmodel("x", "--heads", "5", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--heads", "6", "--kv-heads", "4", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--heads", "4", "--kv-heads", "8", "--hidden", "256", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--vocab", "100", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--preset", "huge", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--dtype", "f64", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--layers", "abc", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--sliding-window", "64", NULL), 0); /* llama: none */
    ck_assert_int_ne(mkmodel("x", "--arch", "mistral", "--sliding-window", "-1", NULL), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir_of("x"));
    ck_assert_int_eq(access(p, F_OK), -1);
}
END_TEST

/* --format: the INT4 formats' tensors in place of each linear's weight,
 * the rest in f16, quantization_config in config.json (gptq also in
 * quantize_config.json), sharded too, the same bytes from the same seed;
 * option mistakes refused before anything is written. The values
 * themselves are checked by tests/engine/test_packed.c. */
START_TEST(packed_formats)
{
    ck_assert_int_eq(
        mkmodel("g", "--format", "gptq-actorder", "--group-size", "32", "--shards", "3", NULL), 0);
    ck_assert_int_eq(
        mkmodel("g2", "--format", "gptq-actorder", "--group-size", "32", "--shards", "3", NULL), 0);
    eng_st_t *st;
    struct inf_err err;
    ck_assert_int_eq(eng_st_open(dir_of("g"), &st, &err), INF_OK);
    ck_assert_ptr_null(eng_st_find(st, "model.layers.0.self_attn.q_proj.weight"));
    const struct eng_st_tensor *t = eng_st_find(st, "model.layers.5.mlp.down_proj.qweight");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, ENG_DT_I32);
    ck_assert_int_eq(t->shape[0], 768 / 8);
    ck_assert_int_eq(t->shape[1], 288);
    t = eng_st_find(st, "model.layers.5.mlp.down_proj.scales");
    ck_assert_int_eq(t->shape[0], 768 / 32);
    ck_assert_ptr_nonnull(eng_st_find(st, "model.layers.0.self_attn.v_proj.g_idx"));
    ck_assert_int_eq(eng_st_find(st, "model.embed_tokens.weight")->dtype, ENG_DT_F16);
    eng_st_close(st);
    char p[600], q[600];
    snprintf(p, sizeof p, "%s/config.json", dir_of("g"));
    json_t *cfg = json_load_file(p, 0, NULL);
    json_t *qc = json_object_get(cfg, "quantization_config");
    ck_assert_str_eq(json_string_value(json_object_get(qc, "quant_method")), "gptq");
    ck_assert(json_is_true(json_object_get(qc, "desc_act")));
    ck_assert_int_eq(json_integer_value(json_object_get(qc, "group_size")), 32);
    json_decref(cfg);
    snprintf(p, sizeof p, "%s/quantize_config.json", dir_of("g"));
    ck_assert_int_eq(access(p, F_OK), 0);
    for (int i = 1; i <= 3; i++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-00003.safetensors", dir_of("g"), i);
        snprintf(q, sizeof q, "%s/model-%05d-of-00003.safetensors", dir_of("g2"), i);
        ck_assert_msg(same_file(p, q), "shard %d differs between runs", i);
    }
    /* refused: an unknown format or group, symmetric AWQ, gptq_v2 outside
     * gptq, and shapes the format cannot store (AWQ: 288 % 128) */
    ck_assert_int_ne(mkmodel("x", "--format", "exl2", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--format", "gptq", "--group-size", "48", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--format", "awq", "--symmetric", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--format", "ct", "--checkpoint-format", "gptq_v2", NULL), 0);
    ck_assert_int_ne(mkmodel("x", "--format", "awq", "--group-size", "128", NULL), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir_of("x"));
    ck_assert_int_eq(access(p, F_OK), -1);
    snprintf(p, sizeof p, "%s/config.json", dir_of("x"));
    ck_assert_int_eq(access(p, F_OK), -1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("mkmodel");
    TCase *tc = tcase_create("presets");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, tiny_preset);
    tcase_add_test(tc, small_preset_gqa);
    tcase_add_test(tc, qwen2_bf16_sharded_tied);
    tcase_add_test(tc, mistral_f16_llama3_rope_custom_shape);
    suite_add_tcase(s, tc);
    tc = tcase_create("options");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, deterministic_from_seed);
    tcase_add_test(tc, copied_tokenizer);
    tcase_add_test(tc, refuses_bad_shapes);
    tcase_add_test(tc, packed_formats);
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
