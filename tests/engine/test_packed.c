/* INT4 checkpoints (AutoAWQ gemm, GPTQ with and without act-order,
 * compressed-tensors pack-quantized) written by int4serve-mkmodel and
 * loaded by the engine:
 *   - every linear layer's canonical form (engine/weights/packed.h) equals
 *     an unpacking written here from the formats' definitions (the packers'
 *     own bit order, not the loader's tables): codes, fp16 scales, zero
 *     points, the act-order column order and its contiguous groups, the
 *     padding past K;
 *   - the whole model's logprobs on the CPU equal those of an fp32
 *     checkpoint of the dequantized weights (written here with the
 *     safetensors writer) within 1e-4, per format, group size (32, 64,
 *     128, per channel) and symmetry, with K not a multiple of the group;
 *   - fused q/k/v and gate/up give the logits of the unfused layers bit for
 *     bit, and projections whose g_idx differ are kept apart;
 *   - malformed checkpoints (shapes, dtypes, bits 3 and 8, missing tensors,
 *     g_idx out of range or uneven, zero points the format forbids, scales
 *     not exact in fp16) and quantization choices that contradict the
 *     checkpoint are refused at load, naming the file and the tensor or
 *     key. Runs the tool from INT4SERVE_BUILD_DIR. */
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/sched/kv_cache.h"
#include "engine/weights/packed.h"
#include "engine/weights/qconfig.h"
#include "engine/weights/quant.h"
#include "engine/weights/safetensors.h"
#include "engine/weights/safetensors_write.h"

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
static struct eng_backend *be;

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

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/int4serve-packed-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    struct eng_backend_cpu_opts o = {.n_threads = 2};
    ck_assert_int_eq(eng_backend_cpu_create(&o, &be, NULL), INF_OK);
}

static void teardown(void)
{
    eng_backend_destroy(be);
    be = NULL;
    rm_tree(tmpdir);
}

static const char *sub(const char *name)
{
    static char p[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(p[i], sizeof p[i], "%s/%s", tmpdir, name);
    return p[i];
}

/* Run int4serve-mkmodel --out tmpdir/out with the space-separated args. */
static void mkmodel(const char *out, const char *args)
{
    const char *bd = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(bd != NULL, "INT4SERVE_BUILD_DIR is not set");
    char tool[1024], buf[1024];
    snprintf(tool, sizeof tool, "%s/tools/mkmodel/int4serve-mkmodel", bd);
    ck_assert_msg(access(tool, X_OK) == 0, "%s not built", tool);
    snprintf(buf, sizeof buf, "%s", args);
    const char *argv[48] = {tool, "--out", sub(out)};
    int argc = 3;
    for (char *t = strtok(buf, " "); t && argc < 47; t = strtok(NULL, " "))
        argv[argc++] = t;
    argv[argc] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 1);
        execv(tool, (char *const *)argv);
        _exit(127);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "mkmodel %s failed", args);
}

/* ---- the formats, unpacked from their definitions ----------------------------- */

enum fmt { F_AWQ, F_GPTQ, F_GPTQ_V2, F_CT };

/* One linear layer as its format defines it, in the checkpoint's own
 * column order: W[r][c] = (code[r][c] - zero[r][gidx[c]]) * scale[r][gidx[c]]. */
struct ref {
    int32_t n, k, g, G; /* g: the format's group (k per channel), G groups */
    uint8_t *code;      /* [n][k], 0..15 */
    int *zero;          /* [n][G] */
    float *scale;       /* [n][G] */
    int32_t *gidx;      /* [k] */
};

static void ref_free(struct ref *r)
{
    free(r->code);
    free(r->zero);
    free(r->scale);
    free(r->gidx);
    memset(r, 0, sizeof *r);
}

static const struct eng_st_tensor *tensor(const eng_st_t *st, const char *layer, const char *sfx)
{
    char name[256];
    snprintf(name, sizeof name, "%.200s.%s", layer, sfx);
    const struct eng_st_tensor *t = eng_st_find(st, name);
    ck_assert_msg(t != NULL, "%s missing", name);
    return t;
}

static uint32_t word(const struct eng_st_tensor *t, int64_t i)
{
    if (t->dtype != ENG_DT_I32 || i < 0 || i >= t->numel)
        ck_abort_msg("%s: element %lld of a %s tensor", t->name, (long long)i,
                     eng_dtype_name(t->dtype));
    uint32_t w;
    memcpy(&w, (const char *)t->data + 4 * i, 4);
    return w;
}

static float scale_at(const struct eng_st_tensor *t, int64_t i)
{
    uint16_t h;
    float f;
    switch (t->dtype) {
    case ENG_DT_F16:
        memcpy(&h, (const char *)t->data + 2 * i, 2);
        return inf_f16_to_f32(h);
    case ENG_DT_BF16:
        memcpy(&h, (const char *)t->data + 2 * i, 2);
        return inf_bf16_to_f32(h);
    default:
        memcpy(&f, (const char *)t->data + 4 * i, 4);
        return f;
    }
}

/* group: the config's (-1 per channel). */
static void ref_unpack(const eng_st_t *st, enum fmt f, bool sym, const char *layer, int32_t group,
                       struct ref *r)
{
    memset(r, 0, sizeof *r);
    int32_t n, k;
    if (f == F_CT) {
        const struct eng_st_tensor *ws = tensor(st, layer, "weight_shape");
        int64_t v[2];
        for (int i = 0; i < 2; i++) {
            if (ws->dtype == ENG_DT_I64) {
                memcpy(&v[i], (const char *)ws->data + 8 * i, 8);
            } else {
                int32_t x;
                memcpy(&x, (const char *)ws->data + 4 * i, 4);
                v[i] = x;
            }
        }
        n = (int32_t)v[0];
        k = (int32_t)v[1];
    } else {
        const struct eng_st_tensor *qw = tensor(st, layer, "qweight");
        n = (int32_t)(f == F_AWQ ? qw->shape[1] * 8 : qw->shape[1]);
        k = (int32_t)(f == F_AWQ ? qw->shape[0] : qw->shape[0] * 8);
    }
    r->n = n;
    r->k = k;
    r->g = group < 0 ? k : group;
    r->G = (k + r->g - 1) / r->g;
    r->code = malloc((size_t)n * k);
    r->zero = malloc(sizeof(int) * (size_t)n * r->G);
    r->scale = malloc(sizeof(float) * (size_t)n * r->G);
    r->gidx = malloc(sizeof(int32_t) * (size_t)k);
    for (int32_t c = 0; c < k; c++)
        r->gidx[c] = c / r->g;
    if (f == F_AWQ) {
        /* WQLinear_GEMM.from_linear: bits 4i of word (row, col) hold column
         * col * 8 + order_map[i] */
        static const int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
        const struct eng_st_tensor *qw = tensor(st, layer, "qweight"),
                                   *qz = tensor(st, layer, "qzeros"),
                                   *sc = tensor(st, layer, "scales");
        for (int32_t row = 0; row < k; row++)
            for (int32_t col = 0; col < n / 8; col++)
                for (int i = 0; i < 8; i++)
                    r->code[(int64_t)(col * 8 + order_map[i]) * k + row] =
                        (word(qw, (int64_t)row * (n / 8) + col) >> (4 * i)) & 15;
        for (int32_t gi = 0; gi < r->G; gi++)
            for (int32_t col = 0; col < n / 8; col++)
                for (int i = 0; i < 8; i++)
                    r->zero[(int64_t)(col * 8 + order_map[i]) * r->G + gi] =
                        (word(qz, (int64_t)gi * (n / 8) + col) >> (4 * i)) & 15;
        for (int32_t gi = 0; gi < r->G; gi++)
            for (int32_t c = 0; c < n; c++)
                r->scale[(int64_t)c * r->G + gi] = scale_at(sc, (int64_t)gi * n + c);
    } else if (f == F_GPTQ || f == F_GPTQ_V2) {
        /* QuantLinear.pack: input row 8 * row + j in bits 4j; qzeros column
         * 8 * col + j in bits 4j, zero - 1 unless gptq_v2 */
        const struct eng_st_tensor *qw = tensor(st, layer, "qweight"),
                                   *qz = tensor(st, layer, "qzeros"),
                                   *sc = tensor(st, layer, "scales"),
                                   *gi = tensor(st, layer, "g_idx");
        for (int32_t row = 0; row < k / 8; row++)
            for (int32_t col = 0; col < n; col++)
                for (int j = 0; j < 8; j++)
                    r->code[(int64_t)col * k + 8 * row + j] =
                        (word(qw, (int64_t)row * n + col) >> (4 * j)) & 15;
        for (int32_t g = 0; g < r->G; g++)
            for (int32_t col = 0; col < n / 8; col++)
                for (int j = 0; j < 8; j++)
                    r->zero[(int64_t)(col * 8 + j) * r->G + g] =
                        (int)((word(qz, (int64_t)g * (n / 8) + col) >> (4 * j)) & 15) +
                        (f == F_GPTQ ? 1 : 0);
        for (int32_t g = 0; g < r->G; g++)
            for (int32_t c = 0; c < n; c++)
                r->scale[(int64_t)c * r->G + g] = scale_at(sc, (int64_t)g * n + c);
        for (int32_t c = 0; c < k; c++)
            r->gidx[c] = (int32_t)word(gi, c);
    } else {
        /* pack_to_int32: value + 8 of column 8 * col + i in bits 4i; the
         * zero point packed along the rows */
        const struct eng_st_tensor *wp = tensor(st, layer, "weight_packed"),
                                   *sc = tensor(st, layer, "weight_scale");
        const int32_t kw = (k + 7) / 8;
        for (int32_t row = 0; row < n; row++)
            for (int32_t c = 0; c < k; c++)
                r->code[(int64_t)row * k + c] =
                    (word(wp, (int64_t)row * kw + c / 8) >> (4 * (c % 8))) & 15;
        const struct eng_st_tensor *zp = sym ? NULL : tensor(st, layer, "weight_zero_point");
        for (int32_t row = 0; row < n; row++)
            for (int32_t g = 0; g < r->G; g++) {
                r->zero[(int64_t)row * r->G + g] =
                    zp ? (int)((word(zp, (int64_t)(row / 8) * r->G + g) >> (4 * (row % 8))) & 15)
                       : 8;
                r->scale[(int64_t)row * r->G + g] = scale_at(sc, (int64_t)row * r->G + g);
            }
    }
}

static float ref_w(const struct ref *r, int32_t row, int32_t c)
{
    int64_t gi = (int64_t)row * r->G + r->gidx[c];
    return (float)(r->code[(int64_t)row * r->k + c] - r->zero[gi]) * r->scale[gi];
}

/* The canonical form against the unpacking: the stored column i of row n is
 * input column perm[i], in group i / g (so g_idx[perm[i]] == i / g), with
 * the code, fp16 scale and zero point the format gives it; padding
 * dequantizes to 0; the group is the format's (256 for a multiple of 256,
 * the row for per channel). */
static void check_canonical(const struct krn_q4_weight *w, const struct ref *r, int32_t group,
                            const char *what)
{
    ck_assert_int_eq(w->n, r->n);
    ck_assert_int_eq(w->k, r->k);
    int32_t cg = group < 0 ? r->k + (r->k & 1) : group > 256 ? 256 : group;
    ck_assert_msg(w->group == cg, "%s: group %d, want %d", what, w->group, cg);
    ck_assert_int_eq(w->kp, (r->k + cg - 1) / cg * cg);
    bool plain = true;
    for (int32_t c = 0; c < r->k; c++)
        plain = plain && r->gidx[c] == c / r->g;
    ck_assert_msg((w->perm == NULL) == plain, "%s: perm %s, g_idx %s", what,
                  w->perm ? "set" : "NULL", plain ? "plain" : "permuted");
    /* element checks fail through ck_abort_msg only: a passing ck_assert
     * costs Check a write, and there are millions */
    uint8_t *seen = calloc((size_t)(r->k > 0 ? r->k : 1), 1);
    for (int32_t i = 0; i < r->k; i++) {
        int32_t c = w->perm ? w->perm[i] : i;
        if (c < 0 || c >= r->k || seen[c])
            ck_abort_msg("%s: perm[%d] = %d", what, i, c);
        seen[c] = 1;
        if (r->gidx[c] != i / r->g)
            ck_abort_msg("%s: stored column %d (input %d) in group %d", what, i, c, r->gidx[c]);
    }
    free(seen);
    bool sym = true;
    const int32_t ng = krn_q4_groups(w);
    for (int32_t row = 0; row < r->n; row++) {
        for (int32_t i = 0; i < w->kp; i++) {
            int64_t cgi = (int64_t)row * ng + i / w->group;
            if (i >= r->k) {
                if (eng_q4_dequant_at(w, row, i) != 0.0f)
                    ck_abort_msg("%s: padding [%d][%d]", what, row, i);
                continue;
            }
            int32_t c = w->perm ? w->perm[i] : i;
            int64_t fgi = (int64_t)row * r->G + r->gidx[c];
            if (krn_q4_code(w, row, i) != r->code[(int64_t)row * r->k + c])
                ck_abort_msg("%s: code [%d][%d]", what, row, i);
            if (w->zero[cgi] != inf_f32_to_f16((float)r->zero[fgi]))
                ck_abort_msg("%s: zero [%d][%d]", what, row, i);
            if (w->scale[cgi] != inf_f32_to_f16(r->scale[fgi]))
                ck_abort_msg("%s: scale [%d][%d]", what, row, i);
            if (eng_q4_dequant_at(w, row, i) != ref_w(r, row, c))
                ck_abort_msg("%s: value [%d][%d]", what, row, i);
        }
        for (int32_t gi = 0; gi < r->G; gi++)
            sym = sym && r->zero[(int64_t)row * r->G + gi] == 8;
    }
    ck_assert_msg(w->symmetric == sym, "%s: symmetric %d", what, w->symmetric);
}

/* ---- the dequantized checkpoint ------------------------------------------------ */

static const char *const suffixes[] = {
    "qweight",           "qzeros",       "scales",      "g_idx", "weight_packed", "weight_scale",
    "weight_zero_point", "weight_shape", "weight_g_idx"};

/* The module name of a packed tensor (its name without the suffix), or
 * false for any other tensor; primary: the tensor that stands for the
 * layer (qweight, weight_packed). */
static bool packed_layer(const char *name, char *layer, size_t cap, bool *primary)
{
    const char *dot = strrchr(name, '.');
    if (!dot)
        return false;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (strcmp(dot + 1, suffixes[i]) == 0) {
            snprintf(layer, cap, "%.*s", (int)(dot - name), name);
            *primary = strcmp(dot + 1, "qweight") == 0 || strcmp(dot + 1, "weight_packed") == 0;
            return true;
        }
    return false;
}

/* config.json of src with `edit` applied to its JSON (NULL: none) into dst. */
static void copy_config(const char *src, const char *dst, void (*edit)(json_t *root))
{
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", src);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    ck_assert_ptr_nonnull(root);
    if (edit)
        edit(root);
    mkdir(dst, 0755);
    snprintf(p, sizeof p, "%s/config.json", dst);
    ck_assert_int_eq(json_dump_file(root, p, JSON_INDENT(1)), 0);
    json_decref(root);
}

static void del_quant(json_t *root)
{
    json_object_del(root, "quantization_config");
}

static void drop_quant(json_t *root)
{
    json_object_del(root, "quantization_config");
    json_object_set_new(root, "torch_dtype", json_string("float32"));
}

/* dst: src's model with every packed layer replaced by its dequantized
 * fp32 weight (ref_unpack) and every other tensor in fp32, no
 * quantization_config. */
static void write_dequantized(const char *src, const char *dst, enum fmt f, bool sym, int32_t group)
{
    copy_config(src, dst, drop_quant);
    eng_st_t *st;
    struct inf_err err;
    ck_assert_int_eq(eng_st_open(src, &st, &err), INF_OK);
    eng_st_writer_t *w;
    ck_assert_int_eq(eng_st_writer_create(dst, 1, &w, &err), INF_OK);
    int64_t nt = eng_st_count(st);
    for (int pass = 0; pass < 2; pass++) /* declare, then write */
        for (int64_t i = 0; i < nt; i++) {
            const struct eng_st_tensor *t = eng_st_at(st, i);
            char layer[256], name[300];
            bool primary;
            if (packed_layer(t->name, layer, sizeof layer, &primary)) {
                if (!primary)
                    continue;
                struct ref r;
                ref_unpack(st, f, sym, layer, group, &r);
                snprintf(name, sizeof name, "%s.weight", layer);
                if (pass == 0) {
                    int64_t shape[2] = {r.n, r.k};
                    ck_assert_int_eq(eng_st_writer_add(w, name, ENG_DT_F32, 2, shape, &err),
                                     INF_OK);
                } else {
                    float *v = malloc(sizeof(float) * (size_t)r.n * r.k);
                    for (int32_t row = 0; row < r.n; row++)
                        for (int32_t c = 0; c < r.k; c++)
                            v[(int64_t)row * r.k + c] = ref_w(&r, row, c);
                    ck_assert_int_eq(
                        eng_st_writer_write(w, v, sizeof(float) * (size_t)r.n * r.k, &err), INF_OK);
                    free(v);
                }
                ref_free(&r);
            } else if (pass == 0) {
                ck_assert_int_eq(eng_st_writer_add(w, t->name, ENG_DT_F32, t->ndim, t->shape, &err),
                                 INF_OK);
            } else {
                float *v = malloc(sizeof(float) * (size_t)t->numel);
                ck_assert_int_eq(eng_st_read_f32(t, 0, t->numel, v, &err), INF_OK);
                ck_assert_int_eq(eng_st_writer_write(w, v, sizeof(float) * (size_t)t->numel, &err),
                                 INF_OK);
                free(v);
            }
        }
    ck_assert_int_eq(eng_st_writer_finish(w, &err), INF_OK);
    eng_st_writer_destroy(w);
    eng_st_close(st);
}

/* ---- running a model ------------------------------------------------------------- */

static eng_model_t *load(const char *dir, enum eng_quant q, bool fuse)
{
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.quant = q;
    o.fuse_qkv = fuse;
    o.max_tokens = 64;
    o.n_kv_blocks = 8;
    eng_model_t *m = NULL;
    struct inf_err err = {0};
    inf_status_t s = eng_model_load(dir, be, &o, &m, &err);
    ck_assert_msg(s == INF_OK, "load %s: %s", dir, err.msg);
    return m;
}

enum { SEQ = 24, PRE = 17 };

/* Logprobs [SEQ][vocab]: a prefill of PRE tokens, then one decode step a
 * token, slot 0. */
static double *logprobs(eng_model_t *m, float **raw)
{
    const int V = eng_model_config(m)->vocab;
    int32_t tok[SEQ], pos[SEQ], slot[SEQ];
    uint8_t want[SEQ];
    uint64_t s = 77;
    for (int i = 0; i < SEQ; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)V);
        pos[i] = i;
        slot[i] = 0;
        want[i] = 1;
    }
    eng_kv_cache_t *kv;
    struct inf_err err = {0};
    ck_assert_int_eq(eng_kv_cache_create(eng_model_n_kv_blocks(m), 1, 8, &kv, &err), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, SEQ, &err), INF_OK);
    float *lg = malloc(sizeof(float) * SEQ * V);
    for (int t = 0; t < SEQ;) {
        int len = t == 0 ? PRE : 1;
        struct eng_batch b = {.n_tokens = len,
                              .tokens = tok + t,
                              .pos = pos + t,
                              .slot = slot,
                              .want_logits = want,
                              .n_logits = len,
                              .block_table = eng_kv_cache_block_table(kv),
                              .n_slots = 1,
                              .max_blocks = 8};
        inf_status_t st = eng_model_forward(m, &b, lg + (int64_t)t * V, &err);
        ck_assert_msg(st == INF_OK, "forward: %s", err.msg);
        t += len;
    }
    eng_kv_cache_destroy(kv);
    double *lp = malloc(sizeof(double) * SEQ * V);
    for (int t = 0; t < SEQ; t++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            mx = fmax(mx, lg[t * V + i]);
        for (int i = 0; i < V; i++)
            sum += exp(lg[t * V + i] - mx);
        for (int i = 0; i < V; i++)
            lp[t * V + i] = lg[t * V + i] - mx - log(sum);
    }
    if (raw)
        *raw = lg;
    else
        free(lg);
    return lp;
}

/* ---- per format, group and symmetry ------------------------------------------------- */

struct pcase {
    const char *mk; /* --format and more */
    enum fmt f;
    int32_t group;
    bool sym;
    const char *shape; /* the model's shape */
};

/* K = 96 (hidden) and 160 (intermediate): groups 64 and 128 do not divide
 * them (padded); act-order at group 128 takes K = 192 and 320 so that every
 * layer has several groups to permute; AutoAWQ needs in_features divisible
 * by the group, so its model is 128 / 256. compressed-tensors with K = 100 and 150 (not multiples
 * of 8: the last packed word is padded) and bf16 scales. */
#define SHAPE_AWQ "--hidden 128 --intermediate 256 --layers 2 --heads 4 --kv-heads 2"
#define SHAPE_GPTQ "--hidden 96 --intermediate 160 --layers 2 --heads 3 --kv-heads 1"
#define SHAPE_CT "--hidden 100 --intermediate 150 --layers 2 --heads 2 --kv-heads 1 --dtype bf16"

static const struct pcase cases[] = {
    {"--format awq", F_AWQ, 32, false, SHAPE_AWQ},
    {"--format awq", F_AWQ, 64, false, SHAPE_AWQ},
    {"--format awq", F_AWQ, 128, false, SHAPE_AWQ},
    {"--format awq", F_AWQ, -1, false, SHAPE_AWQ},
    {"--format gptq", F_GPTQ, 32, false, SHAPE_GPTQ},
    {"--format gptq", F_GPTQ, 64, false, SHAPE_GPTQ},
    {"--format gptq", F_GPTQ, 128, false, SHAPE_GPTQ},
    {"--format gptq", F_GPTQ, -1, false, SHAPE_GPTQ},
    {"--format gptq --symmetric", F_GPTQ, 32, true, SHAPE_GPTQ},
    {"--format gptq --symmetric", F_GPTQ, 64, true, SHAPE_GPTQ},
    {"--format gptq --symmetric", F_GPTQ, 128, true, SHAPE_GPTQ},
    {"--format gptq --symmetric", F_GPTQ, -1, true, SHAPE_GPTQ},
    {"--format gptq-actorder", F_GPTQ, 32, false, SHAPE_GPTQ},
    {"--format gptq-actorder", F_GPTQ, 64, false, SHAPE_GPTQ},
    {"--format gptq-actorder", F_GPTQ, 128, false, SHAPE_GPTQ " --hidden 192 --intermediate 320"},
    {"--format gptq-actorder", F_GPTQ, -1, false, SHAPE_GPTQ},
    {"--format gptq-actorder --symmetric", F_GPTQ, 32, true, SHAPE_GPTQ},
    {"--format gptq-actorder --symmetric", F_GPTQ, 64, true, SHAPE_GPTQ},
    {"--format gptq-actorder --symmetric", F_GPTQ, 128, true,
     SHAPE_GPTQ " --hidden 192 --intermediate 320"},
    {"--format gptq-actorder --checkpoint-format gptq_v2", F_GPTQ_V2, 32, false, SHAPE_GPTQ},
    {"--format gptq --checkpoint-format gptq_v2", F_GPTQ_V2, 512, false,
     SHAPE_GPTQ " --intermediate 640"},
    {"--format ct", F_CT, 32, false, SHAPE_CT},
    {"--format ct", F_CT, 64, false, SHAPE_CT},
    {"--format ct", F_CT, 128, false, SHAPE_CT},
    {"--format ct", F_CT, -1, false, SHAPE_CT},
    {"--format ct --symmetric", F_CT, 32, true, SHAPE_CT},
    {"--format ct --symmetric", F_CT, 64, true, SHAPE_CT},
    {"--format ct --symmetric", F_CT, 128, true, SHAPE_CT},
    {"--format ct --symmetric", F_CT, -1, true, SHAPE_CT},
    /* q/k/v biases, tied embeddings */
    {"--format gptq-actorder --arch qwen2 --tie", F_GPTQ, 32, false, SHAPE_GPTQ},
    {"--format ct --symmetric --arch qwen2 --tie", F_CT, 64, true, SHAPE_CT},
};

static void make_case(const struct pcase *c, const char *out)
{
    char args[512];
    snprintf(args, sizeof args, "%s %s --group-size %d", c->mk, c->shape, c->group);
    mkmodel(out, args);
}

static const char *const layer_parts[] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

/* The canonical form of every linear layer of case c's checkpoint in
 * tmpdir/m against the unpacking. */
static void canonical_equals_unpacking(const struct pcase *c)
{
    eng_st_t *st;
    struct eng_qcfg qc;
    struct inf_err err = {0};
    ck_assert_int_eq(eng_st_open(sub("m"), &st, &err), INF_OK);
    ck_assert_msg(eng_qcfg_load(sub("m"), &qc, &err) == INF_OK, "%s", err.msg);
    int n_perm = 0;
    for (int l = 0; l < 2; l++)
        for (size_t p = 0; p < sizeof layer_parts / sizeof layer_parts[0]; p++) {
            char layer[128], what[200];
            snprintf(layer, sizeof layer, "model.layers.%d.%s", l, layer_parts[p]);
            snprintf(what, sizeof what, "%s g %d %s: %s", c->mk, c->group, c->sym ? "sym" : "asym",
                     layer);
            struct eng_qlayer lq;
            ck_assert(eng_qcfg_layer(&qc, layer, &lq));
            struct ref r;
            ref_unpack(st, c->f, c->sym, layer, c->group, &r);
            struct krn_q4_weight w;
            inf_status_t s = eng_q4_from_checkpoint(st, layer, &lq, r.n, r.k, NULL, &w, &err);
            ck_assert_msg(s == INF_OK, "%s: %s", what, err.msg);
            check_canonical(&w, &r, c->group, what);
            n_perm += w.perm != NULL;
            eng_q4_free(&w);
            ref_free(&r);
        }
    /* act-order with more than one group permutes every layer */
    bool act = strstr(c->mk, "actorder") && c->group > 0;
    ck_assert_int_eq(n_perm, act ? 14 : 0);
    eng_qcfg_free(&qc);
    eng_st_close(st);
}

/* Per case: the canonical forms against the unpacking; the model against
 * the fp32 checkpoint of its dequantized weights; fused against unfused,
 * bit for bit. */
START_TEST(format_case)
{
    const struct pcase *c = &cases[_i];
    make_case(c, "m");
    canonical_equals_unpacking(c);
    write_dequantized(sub("m"), sub("deq"), c->f, c->sym, c->group);
    eng_model_t *mq = load(sub("m"), ENG_QUANT_AUTO, true);
    eng_model_t *mf = load(sub("deq"), ENG_QUANT_NONE, true);
    int n_ck = 0, n_act = 0;
    for (int32_t i = 0; i < eng_model_layer_count(mq); i++) {
        const struct eng_layer_info *li = eng_model_layer_info(mq, i);
        n_ck += li->from_ckpt;
        n_act += li->act_order;
        ck_assert(li->from_ckpt || strstr(li->name, "lm_head"));
        /* an act-order down's order moves into gate/up's rows at load, and
         * q/k/v's and gate/up's into the norms before them: only o gathers */
        ck_assert(!(li->act_order && strstr(li->name, "down_proj")));
        ck_assert_msg(li->norm_ordered == (li->act_order && !strstr(li->name, "o_proj")),
                      "%s: act-order %d, norm-ordered %d", li->name, li->act_order,
                      li->norm_ordered);
    }
    ck_assert_int_eq(n_ck, 8); /* fused: qkv, o, gate_up, down per layer */
    ck_assert_int_eq(n_act, strstr(c->mk, "actorder") && c->group > 0 ? 6 : 0);
    const int V = eng_model_config(mq)->vocab;
    float *rq;
    double *a = logprobs(mq, &rq), *b = logprobs(mf, NULL);
    double worst = 0;
    for (int i = 0; i < SEQ * V; i++)
        worst = fmax(worst, fabs(a[i] - b[i]));
    fprintf(stderr, "%s g %d %s: max |logprob - dequantized| %.3g\n", c->mk, c->group,
            c->sym ? "sym" : "asym", worst);
    ck_assert_msg(worst <= 1e-4, "%s g %d %s: max |logprob - dequantized| %g", c->mk, c->group,
                  c->sym ? "sym" : "asym", worst);
    eng_model_destroy(mf);
    eng_model_t *mu = load(sub("m"), ENG_QUANT_AUTO, false);
    ck_assert_int_gt(eng_model_layer_count(mu), eng_model_layer_count(mq));
    float *ru;
    double *u = logprobs(mu, &ru);
    ck_assert_msg(memcmp(rq, ru, sizeof(float) * SEQ * V) == 0, "fused and unfused differ");
    free(a), free(b), free(u), free(rq), free(ru);
    eng_model_destroy(mq);
    eng_model_destroy(mu);
}
END_TEST

/* ---- editing a checkpoint ----------------------------------------------------------- */

/* One change to a copied checkpoint: drop the tensor, or replace its dtype,
 * shape and bytes. */
struct edit {
    const char *name;
    bool drop;
    enum eng_dtype dtype;
    int32_t ndim;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
};

static void copy_edited(const char *src, const char *dst, const struct edit *ed, int n_ed,
                        void (*cfg_edit)(json_t *))
{
    copy_config(src, dst, cfg_edit);
    eng_st_t *st;
    struct inf_err err;
    ck_assert_int_eq(eng_st_open(src, &st, &err), INF_OK);
    eng_st_writer_t *w;
    ck_assert_int_eq(eng_st_writer_create(dst, 1, &w, &err), INF_OK);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < eng_st_count(st); i++) {
            const struct eng_st_tensor *t = eng_st_at(st, i);
            const struct edit *e = NULL;
            for (int j = 0; j < n_ed; j++)
                if (strcmp(ed[j].name, t->name) == 0)
                    e = &ed[j];
            if (e && e->drop)
                continue;
            if (pass == 0)
                ck_assert_int_eq(eng_st_writer_add(w, t->name, e ? e->dtype : t->dtype,
                                                   e ? e->ndim : t->ndim, e ? e->shape : t->shape,
                                                   &err),
                                 INF_OK);
            else
                ck_assert_int_eq(
                    eng_st_writer_write(w, e ? e->data : t->data, e ? e->nbytes : t->nbytes, &err),
                    INF_OK);
        }
    ck_assert_int_eq(eng_st_writer_finish(w, &err), INF_OK);
    eng_st_writer_destroy(w);
    eng_st_close(st);
}

/* A copy of tensor name's bytes, to edit. */
static void *bytes_of(const char *dir, const char *name, struct eng_st_tensor *out)
{
    eng_st_t *st;
    ck_assert_int_eq(eng_st_open(dir, &st, NULL), INF_OK);
    const struct eng_st_tensor *t = eng_st_find(st, name);
    ck_assert_msg(t != NULL, "%s", name);
    void *p = malloc(t->nbytes);
    memcpy(p, t->data, t->nbytes);
    *out = *t;
    out->data = p;
    out->name = NULL;
    out->file = NULL;
    eng_st_close(st);
    return p;
}

/* Load dir and expect code with each needle in the message. */
static void load_fails(const char *dir, enum eng_quant q, inf_status_t code, const char *n1,
                       const char *n2)
{
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.quant = q;
    o.max_tokens = 16;
    o.n_kv_blocks = 2;
    eng_model_t *m = NULL;
    struct inf_err err = {0};
    inf_status_t s = eng_model_load(dir, be, &o, &m, &err);
    ck_assert_msg(s == code, "%s: status %d (%s), want %d", dir, s, err.msg, code);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err.msg, n1), "'%s' lacks '%s'", err.msg, n1);
    if (n2)
        ck_assert_msg(strstr(err.msg, n2), "'%s' lacks '%s'", err.msg, n2);
}

static int cfg_bits;
static void set_bits(json_t *root)
{
    json_object_set_new(json_object_get(root, "quantization_config"), "bits",
                        json_integer(cfg_bits));
}

static void set_sym(json_t *root)
{
    json_object_set_new(json_object_get(root, "quantization_config"), "sym", json_true());
}

#define GQ "model.layers.0.self_attn.q_proj"

START_TEST(malformed_gptq_refused)
{
    /* act-order, group 32: K 96 in 3 groups */
    mkmodel("g", "--format gptq-actorder --group-size 32 " SHAPE_GPTQ);
    char g[512];
    snprintf(g, sizeof g, "%s", sub("g"));
    struct eng_st_tensor t;
    /* a qweight of the wrong shape */
    void *qw = bytes_of(g, GQ ".qweight", &t);
    struct edit e1 = {GQ ".qweight",
                      false,
                      ENG_DT_I32,
                      2,
                      {t.shape[0] - 1, t.shape[1]},
                      qw,
                      t.nbytes - (size_t)t.shape[1] * 4};
    copy_edited(g, sub("e1"), &e1, 1, NULL);
    load_fails(sub("e1"), ENG_QUANT_AUTO, INF_E_FORMAT, "model.safetensors",
               "tensor '" GQ ".qweight' has shape [11, 96], expected [12, 96]");
    /* packed codes that are not I32 */
    struct edit e2 = {GQ ".qweight", false, ENG_DT_F32, 2, {t.shape[0], t.shape[1]}, qw, t.nbytes};
    copy_edited(g, sub("e2"), &e2, 1, NULL);
    load_fails(sub("e2"), ENG_QUANT_AUTO, INF_E_FORMAT,
               "model.safetensors: tensor '" GQ ".qweight' is F32", NULL);
    free(qw);
    /* bits 3 and 8 */
    cfg_bits = 3;
    copy_edited(g, sub("e3"), NULL, 0, set_bits);
    load_fails(sub("e3"), ENG_QUANT_AUTO, INF_E_UNSUPPORTED, "config.json", "bits 3");
    cfg_bits = 8;
    copy_edited(g, sub("e4"), NULL, 0, set_bits);
    load_fails(sub("e4"), ENG_QUANT_AUTO, INF_E_UNSUPPORTED, "config.json", "bits 8");
    /* missing scales */
    struct edit e5 = {.name = "model.layers.1.mlp.down_proj.scales", .drop = true};
    copy_edited(g, sub("e5"), &e5, 1, NULL);
    load_fails(sub("e5"), ENG_QUANT_AUTO, INF_E_NOTFOUND, "model.safetensors",
               "'model.layers.1.mlp.down_proj.scales' is missing");
    /* a missing g_idx under desc_act */
    struct edit e6 = {.name = GQ ".g_idx", .drop = true};
    copy_edited(g, sub("e6"), &e6, 1, NULL);
    load_fails(sub("e6"), ENG_QUANT_AUTO, INF_E_NOTFOUND, GQ ".g_idx", "act-order");
    /* g_idx out of range, and groups that do not hold 32 rows */
    int32_t *gi = bytes_of(g, GQ ".g_idx", &t);
    int32_t keep = gi[5];
    gi[5] = 3;
    struct edit e7 = {GQ ".g_idx", false, ENG_DT_I32, 1, {96, 0}, gi, t.nbytes};
    copy_edited(g, sub("e7"), &e7, 1, NULL);
    load_fails(sub("e7"), ENG_QUANT_AUTO, INF_E_FORMAT, "model.safetensors",
               "'" GQ ".g_idx': g_idx[5] = 3 is outside [0, 3)");
    gi[5] = -1;
    copy_edited(g, sub("e8"), &e7, 1, NULL);
    load_fails(sub("e8"), ENG_QUANT_AUTO, INF_E_FORMAT, "g_idx[5] = -1", NULL);
    gi[5] = (keep + 1) % 3;
    copy_edited(g, sub("e9"), &e7, 1, NULL);
    load_fails(sub("e9"), ENG_QUANT_AUTO, INF_E_FORMAT, "model.safetensors", "rows, a group of 32");
    free(gi);
    /* a stored zero 15 (zero 16 under checkpoint_format gptq) */
    uint32_t *qz = bytes_of(g, GQ ".qzeros", &t);
    qz[2] |= 0xf0u;
    struct edit e10 = {GQ ".qzeros", false, ENG_DT_I32, 2, {t.shape[0], t.shape[1]}, qz, t.nbytes};
    copy_edited(g, sub("e10"), &e10, 1, NULL);
    load_fails(sub("e10"), ENG_QUANT_AUTO, INF_E_FORMAT, "'" GQ ".qzeros': zero point 16",
               "outside 0..15");
    free(qz);
    /* sym true over asymmetric zeros */
    copy_edited(g, sub("e11"), NULL, 0, set_sym);
    load_fails(sub("e11"), ENG_QUANT_AUTO, INF_E_FORMAT, "qzeros': zero point", "symmetric");
    /* explicit choices that contradict the checkpoint, naming both */
    load_fails(g, ENG_QUANT_AWQ, INF_E_INVALID, "'awq' contradicts config.json",
               "quant_method 'gptq'");
    load_fails(g, ENG_QUANT_NONE, INF_E_INVALID, "'none' contradicts", "'gptq'");
    load_fails(g, ENG_QUANT_INT4, INF_E_INVALID, "'int4' contradicts", "'gptq'");
    /* ... and an explicit match loads */
    eng_model_destroy(load(g, ENG_QUANT_GPTQ, true));
    /* a 16-bit checkpoint asked to be one */
    mkmodel("fp", SHAPE_GPTQ);
    load_fails(sub("fp"), ENG_QUANT_GPTQ, INF_E_INVALID, "'gptq'", "no quantization_config");
    load_fails(sub("fp"), ENG_QUANT_CT, INF_E_INVALID, "'compressed-tensors'", NULL);
}
END_TEST

#define CQ "model.layers.1.mlp.up_proj"

START_TEST(malformed_ct_refused_and_int32_shape)
{
    mkmodel("c", "--format ct --group-size 32 " SHAPE_CT);
    char c[512];
    snprintf(c, sizeof c, "%s", sub("c"));
    struct eng_st_tensor t;
    /* weight_shape as I32 loads like I64 */
    int32_t shape32[2] = {150, 100};
    struct edit e0 = {CQ ".weight_shape", false, ENG_DT_I32, 1, {2, 0}, shape32, 8};
    copy_edited(c, sub("e0"), &e0, 1, NULL);
    eng_model_destroy(load(sub("e0"), ENG_QUANT_CT, true));
    /* a weight_shape that is not the model's */
    int64_t bad[2] = {150, 96};
    struct edit e1 = {CQ ".weight_shape", false, ENG_DT_I64, 1, {2, 0}, bad, 16};
    copy_edited(c, sub("e1"), &e1, 1, NULL);
    load_fails(sub("e1"), ENG_QUANT_AUTO, INF_E_FORMAT,
               "model.safetensors: tensor '" CQ ".weight_shape' is [150, 96]", NULL);
    /* the asymmetric zero points missing */
    struct edit e2 = {.name = CQ ".weight_zero_point", .drop = true};
    copy_edited(c, sub("e2"), &e2, 1, NULL);
    load_fails(sub("e2"), ENG_QUANT_AUTO, INF_E_NOTFOUND, "model.safetensors",
               CQ ".weight_zero_point' is missing");
    /* scales of the wrong shape; scales not exact in fp16 */
    uint16_t *sc = bytes_of(c, CQ ".weight_scale", &t);
    struct edit e3 = {CQ ".weight_scale",       false, ENG_DT_BF16, 2,
                      {t.shape[1], t.shape[0]}, sc,    t.nbytes};
    copy_edited(c, sub("e3"), &e3, 1, NULL);
    load_fails(sub("e3"), ENG_QUANT_AUTO, INF_E_FORMAT, CQ ".weight_scale' has shape", NULL);
    float *f = malloc(sizeof(float) * (size_t)t.numel);
    for (int64_t i = 0; i < t.numel; i++)
        f[i] = inf_bf16_to_f32(sc[i]);
    f[7] = 0.1f; /* not an fp16 value */
    struct edit e4 = {CQ ".weight_scale",
                      false,
                      ENG_DT_F32,
                      2,
                      {t.shape[0], t.shape[1]},
                      f,
                      sizeof(float) * (size_t)t.numel};
    copy_edited(c, sub("e4"), &e4, 1, NULL);
    load_fails(sub("e4"), ENG_QUANT_AUTO, INF_E_FORMAT, "model.safetensors",
               "scale 0.1 of group 3, column 1 is not exact in fp16");
    f[7] = -f[6];
    copy_edited(c, sub("e5"), &e4, 1, NULL);
    load_fails(sub("e5"), ENG_QUANT_AUTO, INF_E_FORMAT, "is negative", NULL);
    free(f);
    free(sc);
    /* the codes missing: named with what the config says */
    struct edit e6 = {.name = CQ ".weight_packed", .drop = true};
    copy_edited(c, sub("e6"), &e6, 1, NULL);
    load_fails(sub("e6"), ENG_QUANT_AUTO, INF_E_NOTFOUND, "'" CQ ".weight_packed' is missing",
               "compressed-tensors");
    load_fails(c, ENG_QUANT_GPTQ, INF_E_INVALID, "'gptq' contradicts", "'compressed-tensors'");
}
END_TEST

/* Older AutoGPTQ folders: quantize_config.json and no quantization_config
 * in config.json; the same model either way. */
START_TEST(quantize_config_json_only)
{
    mkmodel("g", "--format gptq-actorder --group-size 64 --symmetric " SHAPE_GPTQ);
    char p[600], q[600];
    copy_edited(sub("g"), sub("old"), NULL, 0, del_quant);
    snprintf(p, sizeof p, "%s/quantize_config.json", sub("g"));
    snprintf(q, sizeof q, "%s/quantize_config.json", sub("old"));
    json_t *j = json_load_file(p, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_object_del(j, "quant_method"); /* AutoGPTQ's older files have none */
    ck_assert_int_eq(json_dump_file(j, q, 0), 0);
    json_decref(j);
    eng_model_t *a = load(sub("g"), ENG_QUANT_AUTO, true),
                *b = load(sub("old"), ENG_QUANT_GPTQ, true);
    float *ra, *rb;
    double *la = logprobs(a, &ra), *lb = logprobs(b, &rb);
    const int V = eng_model_config(a)->vocab;
    ck_assert_int_eq(memcmp(ra, rb, sizeof(float) * SEQ * V), 0);
    free(la), free(lb), free(ra), free(rb);
    eng_model_destroy(a);
    eng_model_destroy(b);
}
END_TEST

/* k_proj with another valid act-order g_idx than q_proj and v_proj (two
 * rows of different groups swapped): the q/k/v of that layer cannot share
 * one gathered x, so they run apart; gate/up stay fused; the logprobs
 * still equal the dequantized checkpoint's. */
START_TEST(differing_gidx_kept_apart)
{
    mkmodel("g", "--format gptq-actorder --group-size 32 " SHAPE_GPTQ);
    struct eng_st_tensor t;
    int32_t *gi = bytes_of(sub("g"), "model.layers.1.self_attn.k_proj.g_idx", &t);
    int a = 0, b = 1;
    while (gi[b] == gi[a])
        b++;
    int32_t x = gi[a];
    gi[a] = gi[b];
    gi[b] = x;
    struct edit e = {
        "model.layers.1.self_attn.k_proj.g_idx", false, ENG_DT_I32, 1, {96, 0}, gi, t.nbytes};
    copy_edited(sub("g"), sub("e"), &e, 1, NULL);
    free(gi);
    write_dequantized(sub("e"), sub("deq"), F_GPTQ, false, 32);
    eng_model_t *mq = load(sub("e"), ENG_QUANT_AUTO, true);
    int n_lin = eng_model_layer_count(mq);
    ck_assert_int_eq(n_lin, 4 + 6 + 1); /* layer 0 fused; layer 1's q, k, v apart; lm_head */
    bool apart = false;
    for (int32_t i = 0; i < n_lin; i++)
        apart = apart ||
                strcmp(eng_model_layer_info(mq, i)->name, "model.layers.1.self_attn.k_proj") == 0;
    ck_assert(apart);
    eng_model_t *mf = load(sub("deq"), ENG_QUANT_NONE, true);
    const int V = eng_model_config(mq)->vocab;
    double *la = logprobs(mq, NULL), *lb = logprobs(mf, NULL), worst = 0;
    for (int i = 0; i < SEQ * V; i++)
        worst = fmax(worst, fabs(la[i] - lb[i]));
    ck_assert_msg(worst <= 1e-4, "max |logprob - dequantized| %g", worst);
    free(la), free(lb);
    eng_model_destroy(mq);
    eng_model_destroy(mf);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("packed");
    TCase *t = tcase_create("formats");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 120);
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    tcase_add_loop_test(t, format_case, 0, nc);
    tcase_add_test(t, quantize_config_json_only);
    tcase_add_test(t, differing_gidx_kept_apart);
    suite_add_tcase(s, t);
    t = tcase_create("malformed");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, malformed_gptq_refused);
    tcase_add_test(t, malformed_ct_refused_and_int32_shape);
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
