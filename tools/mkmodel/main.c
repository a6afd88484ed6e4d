/* int4serve-mkmodel — write a synthetic checkpoint folder in Hugging Face's
 * layout: config.json, model.safetensors (or shards with
 * model.safetensors.index.json), tokenizer.json, tokenizer_config.json and
 * generation_config.json. Random weights, deterministic from --seed, any
 * Llama / Mistral / Qwen2 shape, streamed to disk so a 7B-shaped checkpoint
 * never sits whole in memory.
 *
 * Weight scales keep activations in a realistic range through every layer
 * (checked by tests/engine/test_mkmodel.c):
 *   embed_tokens     N(0, 1); N(0, 1/hidden) when tied, so the logits of the
 *                    tied head have unit scale too
 *   q/k/v, gate/up   N(0, 1/fan_in)                  (fan_in = hidden)
 *   o, down          N(0, 1/fan_in) x 0.5/sqrt(2 x layers): residual branches,
 *                    so 2 x layers of them add about 0.5 to the stream's std
 *   q/k/v biases     N(0, 0.02^2)                    (qwen2)
 *   norm weights     1 + N(0, 0.02^2)
 *   lm_head          N(0, 1/hidden)
 * Each chunk of 65536 values of a tensor has its own random stream seeded
 * from (--seed, tensor index, chunk index), so chunks are generated on every
 * core, while a writer thread writes the batch before, and the bytes do not
 * depend on the thread count.
 *
 * --format awq | gptq | gptq-actorder | ct writes an INT4 checkpoint
 * instead (tools/mkmodel/packed.h): the same float weights of every linear
 * layer quantized and stored as that format stores them, everything else
 * (embeddings, norms, lm_head, biases) in --dtype (default f16), and the
 * format's quantization_config in config.json (gptq also writes it to
 * quantize_config.json, as AutoGPTQ does). */
#include "common/inf.h"
#include "engine/weights/model_config.h"
#include "engine/par.h"
#include "engine/weights/safetensors_write.h"
#include "tools/mkmodel/bpe.h"
#include "tools/mkmodel/packed.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_MERGES 400
#define CHUNK (1 << 16) /* elements generated and written at a time */

struct opts {
    const char *out, *preset, *tokenizer;
    const char *arch;
    int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
    int64_t sliding_window; /* mistral: config.json's sliding_window, 0 null */
    double rope_theta;
    int tie, rope_llama3; /* -1 unset */
    enum eng_dtype dtype;
    bool dtype_set;
    uint64_t seed;
    int32_t shards;
    struct mk_quant quant; /* --format, --group-size, --symmetric, --checkpoint-format */
};

struct preset {
    const char *name, *arch;
    int64_t hidden, intermediate, layers, heads, kv_heads, vocab, max_pos;
    double rope_theta;
    int tie, rope_llama3;
    enum eng_dtype dtype;
};

/* vocab 0: the tokenizer's size. */
static const struct preset presets[] = {
    {"tiny", "llama", 288, 768, 6, 6, 6, 0, 1024, 10000.0, 0, 0, ENG_DT_F32},
    {"small", "llama", 512, 1408, 8, 8, 2, 0, 2048, 10000.0, 0, 0, ENG_DT_F32},
    /* the shapes of llama2.c's TinyStories models (tied classifier, fp32) */
    {"stories15m", "llama", 288, 768, 6, 6, 6, 32000, 256, 10000.0, 1, 0, ENG_DT_F32},
    {"stories110m", "llama", 768, 2048, 12, 12, 12, 32000, 1024, 10000.0, 1, 0, ENG_DT_F32},
    {"llama2-7b", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0, 0, 0, ENG_DT_F16},
    {"llama3-8b", "llama", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, 0, 1, ENG_DT_F16},
};

/* ---- random numbers --------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s;
    bool have;
    double spare;
};

/* Standard normal by Box-Muller. */
static double rng_normal(struct rng *r)
{
    if (r->have) {
        r->have = false;
        return r->spare;
    }
    double u1 = ((double)(splitmix64(&r->s) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    double u2 = (double)(splitmix64(&r->s) >> 11) * 0x1p-53;
    double m = sqrt(-2.0 * log(u1));
    r->spare = m * sin(2.0 * M_PI * u2);
    r->have = true;
    return m * cos(2.0 * M_PI * u2);
}

/* ---- tensors ---------------------------------------------------------------- */

struct spec {
    char name[96];
    int32_t ndim;
    int64_t shape[2];
    double mean, std; /* values are mean + std * N(0, 1) */
};

static void spec_set(struct spec *s, const char *name, int64_t rows, int64_t cols, double mean,
                     double std)
{
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = cols > 0 ? 2 : 1;
    s->shape[0] = rows;
    s->shape[1] = cols;
    s->mean = mean;
    s->std = std;
}

/* Every tensor of the model in file order; returns the count. */
static int32_t build_specs(const struct eng_model_config *c, struct spec *sp)
{
    int32_t n = 0;
    int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim,
            kv = (int64_t)c->n_kv_heads * c->head_dim, f = c->intermediate;
    double branch = 0.5 / sqrt(2.0 * c->n_layers);
    char name[96];
    spec_set(&sp[n++], "model.embed_tokens.weight", c->vocab, h, 0.0,
             c->tie_embeddings ? 1.0 / sqrt((double)h) : 1.0);
    for (int32_t l = 0; l < c->n_layers; l++) {
#define T(fmt, rows, cols, mean, std)                                                              \
    do {                                                                                           \
        snprintf(name, sizeof name, "model.layers.%d." fmt, l);                                    \
        spec_set(&sp[n++], name, rows, cols, mean, std);                                           \
    } while (0)
        T("input_layernorm.weight", h, 0, 1.0, 0.02);
        T("self_attn.q_proj.weight", q, h, 0.0, 1.0 / sqrt((double)h));
        if (c->qkv_bias)
            T("self_attn.q_proj.bias", q, 0, 0.0, 0.02);
        T("self_attn.k_proj.weight", kv, h, 0.0, 1.0 / sqrt((double)h));
        if (c->qkv_bias)
            T("self_attn.k_proj.bias", kv, 0, 0.0, 0.02);
        T("self_attn.v_proj.weight", kv, h, 0.0, 1.0 / sqrt((double)h));
        if (c->qkv_bias)
            T("self_attn.v_proj.bias", kv, 0, 0.0, 0.02);
        T("self_attn.o_proj.weight", h, q, 0.0, branch / sqrt((double)q));
        T("post_attention_layernorm.weight", h, 0, 1.0, 0.02);
        T("mlp.gate_proj.weight", f, h, 0.0, 1.0 / sqrt((double)h));
        T("mlp.up_proj.weight", f, h, 0.0, 1.0 / sqrt((double)h));
        T("mlp.down_proj.weight", h, f, 0.0, branch / sqrt((double)f));
#undef T
    }
    spec_set(&sp[n++], "model.norm.weight", h, 0, 1.0, 0.02);
    if (!c->tie_embeddings)
        spec_set(&sp[n++], "lm_head.weight", c->vocab, h, 0.0, 1.0 / sqrt((double)h));
    return n;
}

/* Generation runs on every core (engine/par.h): chunk c of tensor i has its
 * own stream seeded from (seed, i, c), so the bytes do not depend on the
 * thread count. A batch of chunks of one tensor is generated in parallel
 * into one of two buffers while a writer thread writes the other, in order,
 * so the disk and the generators work at the same time. */
#define BATCH_CHUNKS 256 /* 16 Mi values: 32 MiB of fp16 */

struct gen_job {
    const struct spec *sp;
    int32_t tensor;
    uint64_t seed;
    enum eng_dtype dt;
    int64_t numel;
    int64_t c0;         /* first chunk of the batch */
    unsigned char *out; /* bytes of chunk c0 */
};

/* Chunks [c0 + i0, c0 + i1) of the batch. */
static void gen_chunks(void *arg, int64_t i0, int64_t i1)
{
    const struct gen_job *j = arg;
    size_t es = eng_dtype_size(j->dt);
    for (int64_t c = j->c0 + i0; c < j->c0 + i1; c++) {
        int64_t first = c * CHUNK;
        int64_t k = j->numel - first < CHUNK ? j->numel - first : CHUNK;
        /* chunk 0 keeps the tensor's own stream (tensors of one chunk are
         * what they always were) */
        struct rng r = {.s = j->seed * 0x9e3779b97f4a7c15ull ^
                             ((uint64_t)j->tensor + 1) * 0xd1b54a32d192ed03ull ^
                             (uint64_t)c * 0xa0761d6478bd642full};
        unsigned char *buf = j->out + (size_t)(c - j->c0) * CHUNK * es;
        for (int64_t e = 0; e < k; e++) {
            float v = (float)(j->sp->mean + j->sp->std * rng_normal(&r));
            if (j->dt == ENG_DT_F32) {
                memcpy(buf + 4 * e, &v, 4);
            } else {
                uint16_t b = j->dt == ENG_DT_F16 ? inf_f32_to_f16(v) : inf_f32_to_bf16(v);
                memcpy(buf + 2 * e, &b, 2);
            }
        }
    }
}

/* The writer thread: writes one handed-over buffer at a time. */
struct writer {
    eng_st_writer_t *w;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const unsigned char *data; /* pending buffer, NULL when idle */
    size_t len;
    bool stop;
    pthread_t th;
    inf_status_t st; /* first write error */
    struct inf_err err;
};

static void *writer_run(void *arg)
{
    struct writer *wr = arg;
    pthread_mutex_lock(&wr->mu);
    for (;;) {
        while (!wr->data && !wr->stop)
            pthread_cond_wait(&wr->cv, &wr->mu);
        if (!wr->data)
            break;
        const unsigned char *d = wr->data;
        size_t n = wr->len;
        pthread_mutex_unlock(&wr->mu);
        struct inf_err e = {0};
        inf_status_t st = wr->st == INF_OK ? eng_st_writer_write(wr->w, d, n, &e) : INF_OK;
        pthread_mutex_lock(&wr->mu);
        if (st != INF_OK) {
            wr->st = st;
            wr->err = e;
        }
        wr->data = NULL;
        pthread_cond_broadcast(&wr->cv);
    }
    pthread_mutex_unlock(&wr->mu);
    return NULL;
}

/* Wait until the writer is idle; its status so far. */
static inf_status_t writer_wait(struct writer *wr)
{
    pthread_mutex_lock(&wr->mu);
    while (wr->data)
        pthread_cond_wait(&wr->cv, &wr->mu);
    inf_status_t st = wr->st;
    pthread_mutex_unlock(&wr->mu);
    return st;
}

static void writer_submit(struct writer *wr, const unsigned char *d, size_t n)
{
    pthread_mutex_lock(&wr->mu);
    wr->data = d;
    wr->len = n;
    pthread_cond_broadcast(&wr->cv);
    pthread_mutex_unlock(&wr->mu);
}

/* A linear layer's weight ("..._proj.weight"): its module name in layer
 * (the name without ".weight"); false for every other tensor. */
static bool linear_layer(const struct spec *sp, char *layer, size_t cap)
{
    size_t len = strlen(sp->name);
    if (sp->ndim != 2 || len < 13 || strcmp(sp->name + len - 12, "_proj.weight") != 0)
        return false;
    snprintf(layer, cap, "%.*s", (int)(len - 7), sp->name);
    return true;
}

/* Generate tensor i's values in fp32 into buf (numel of them). */
static void gen_f32(eng_par_t *par, const struct spec *sp, int32_t i, uint64_t seed, int64_t numel,
                    float *buf)
{
    struct gen_job job = {.sp = sp,
                          .tensor = i,
                          .seed = seed,
                          .dt = ENG_DT_F32,
                          .numel = numel,
                          .c0 = 0,
                          .out = (unsigned char *)buf};
    eng_par_run(par, (numel + CHUNK - 1) / CHUNK, 1, gen_chunks, &job);
}

/* Whether q's format can store every linear layer of c (before anything
 * is written). */
static inf_status_t check_format(const struct eng_model_config *c, const struct mk_quant *q,
                                 struct inf_err *err)
{
    if (q->fmt == MK_FP)
        return INF_OK;
    struct spec *sp = calloc(3 + 12 * (size_t)c->n_layers, sizeof *sp);
    if (!sp)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    int32_t n = build_specs(c, sp);
    inf_status_t st = INF_OK;
    char layer[96];
    for (int32_t i = 0; i < n && st == INF_OK; i++)
        if (linear_layer(&sp[i], layer, sizeof layer))
            st = mk_packed_check(q, layer, sp[i].shape[0], sp[i].shape[1], err);
    free(sp);
    return st;
}

static inf_status_t write_weights(const char *dir, const struct eng_model_config *c,
                                  enum eng_dtype dt, uint64_t seed, int32_t shards,
                                  const struct mk_quant *q, uint64_t *total_bytes,
                                  struct inf_err *err)
{
    size_t max_specs = 3 + 12 * (size_t)c->n_layers;
    struct spec *sp = calloc(max_specs, sizeof *sp);
    size_t es = eng_dtype_size(dt), bbytes = (size_t)BATCH_CHUNKS * CHUNK * es;
    unsigned char *buf[2] = {malloc(bbytes), malloc(bbytes)};
    struct writer wr = {.st = INF_OK};
    bool writer_started = false;
    eng_par_t *par = NULL;
    inf_status_t st = INF_OK;
    pthread_mutex_init(&wr.mu, NULL);
    pthread_cond_init(&wr.cv, NULL);
    if (!sp || !buf[0] || !buf[1]) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto out;
    }
    int32_t n = build_specs(c, sp);
    if ((st = eng_par_create(0, &par, err)) != INF_OK ||
        (st = eng_st_writer_create(dir, shards, &wr.w, err)) != INF_OK)
        goto out;
    for (int32_t i = 0; i < n; i++) {
        char layer[96];
        if (q->fmt != MK_FP && linear_layer(&sp[i], layer, sizeof layer)) {
            if ((st = mk_packed_declare(wr.w, q, layer, sp[i].shape[0], sp[i].shape[1], err)))
                goto out;
        } else if ((st = eng_st_writer_add(wr.w, sp[i].name, dt, sp[i].ndim, sp[i].shape, err)) !=
                   INF_OK) {
            goto out;
        }
    }
    if (pthread_create(&wr.th, NULL, writer_run, &wr) != 0) {
        st = inf_err_set(err, INF_E_NOMEM, "cannot start the writer thread");
        goto out;
    }
    writer_started = true;
    *total_bytes = 0;
    int cur = 0;
    for (int32_t i = 0; i < n && st == INF_OK; i++) {
        int64_t numel = sp[i].shape[0] * (sp[i].ndim == 2 ? sp[i].shape[1] : 1);
        int64_t n_chunks = (numel + CHUNK - 1) / CHUNK;
        char layer[96];
        if (q->fmt != MK_FP && linear_layer(&sp[i], layer, sizeof layer)) {
            /* the whole matrix, then its packed tensors, written here while
             * the writer thread is idle */
            float *wf = malloc((size_t)numel * sizeof *wf);
            if (!wf) {
                st = inf_err_set(err, INF_E_NOMEM, "out of memory for %s", sp[i].name);
                break;
            }
            gen_f32(par, &sp[i], i, seed, numel, wf);
            if ((st = writer_wait(&wr)) == INF_OK)
                st = mk_packed_write(wr.w, q, layer, wf, sp[i].shape[0], sp[i].shape[1], seed, err);
            free(wf);
            *total_bytes += (uint64_t)numel / 2;
            continue;
        }
        for (int64_t b0 = 0; b0 < n_chunks; b0 += BATCH_CHUNKS) {
            int64_t b1 = b0 + BATCH_CHUNKS < n_chunks ? b0 + BATCH_CHUNKS : n_chunks;
            struct gen_job job = {.sp = &sp[i],
                                  .tensor = i,
                                  .seed = seed,
                                  .dt = dt,
                                  .numel = numel,
                                  .c0 = b0,
                                  .out = buf[cur]};
            /* buf[cur] was handed to the writer two batches ago and is free
             * once the writer took the last one: it works on one at a time */
            eng_par_run(par, b1 - b0, 1, gen_chunks, &job);
            int64_t k = (b1 * CHUNK < numel ? b1 * CHUNK : numel) - b0 * CHUNK;
            if ((st = writer_wait(&wr)) != INF_OK)
                break;
            writer_submit(&wr, buf[cur], (size_t)k * es);
            *total_bytes += (uint64_t)k * es;
            cur ^= 1;
        }
    }
    if (st == INF_OK)
        st = writer_wait(&wr);
    if (st != INF_OK) {
        if (wr.st != INF_OK)
            st = inf_err_set(err, wr.st, "%s", wr.err.msg);
        goto out;
    }
    st = eng_st_writer_finish(wr.w, err);
out:
    if (writer_started) {
        writer_wait(&wr);
        pthread_mutex_lock(&wr.mu);
        wr.stop = true;
        pthread_cond_broadcast(&wr.cv);
        pthread_mutex_unlock(&wr.mu);
        pthread_join(wr.th, NULL);
    }
    eng_st_writer_destroy(wr.w);
    eng_par_destroy(par);
    pthread_cond_destroy(&wr.cv);
    pthread_mutex_destroy(&wr.mu);
    free(sp);
    free(buf[0]);
    free(buf[1]);
    return st;
}

/* ---- JSON files -------------------------------------------------------------- */

static inf_status_t dump(json_t *root, const char *dir, const char *name, struct inf_err *err)
{
    if (!root)
        return inf_err_set(err, INF_E_NOMEM, "%s: out of memory", name);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(root);
    if (rc != 0)
        return inf_err_set(err, INF_E_IO, "%s: cannot write", name);
    return INF_OK;
}

static const char *arch_class(const char *arch)
{
    if (strcmp(arch, "mistral") == 0)
        return "MistralForCausalLM";
    if (strcmp(arch, "qwen2") == 0)
        return "Qwen2ForCausalLM";
    return "LlamaForCausalLM";
}

static const char *dtype_torch(enum eng_dtype dt)
{
    return dt == ENG_DT_F32 ? "float32" : dt == ENG_DT_F16 ? "float16" : "bfloat16";
}

static json_t *make_config(const struct opts *o, int32_t bos, int32_t eos)
{
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", arch_class(o->arch)));
    json_object_set_new(c, "model_type", json_string(o->arch));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(o->intermediate));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->kv_heads));
    if (o->head_dim > 0)
        json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_pos));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-5));
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    if (o->rope_llama3 == 1)
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", 8.0, "low_freq_factor",
                                      1.0, "high_freq_factor", 4.0,
                                      "original_max_position_embeddings", 8192, "rope_type",
                                      "llama3"));
    else
        json_object_set_new(c, "rope_scaling", json_null());
    if (strcmp(o->arch, "mistral") == 0)
        json_object_set_new(c, "sliding_window",
                            o->sliding_window > 0 ? json_integer(o->sliding_window) : json_null());
    if (strcmp(o->arch, "qwen2") == 0)
        json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tie == 1));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(c, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    json_object_set_new(c, "torch_dtype", json_string(dtype_torch(o->dtype)));
    json_object_set_new(c, "use_cache", json_true());
    return c;
}

/* ---- a copied tokenizer -------------------------------------------------------- */

static const char *bos_names[] = {"<|begin_of_text|>", "<s>", "<|im_start|>", NULL};
static const char *eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<|im_end|>", NULL};

/* Size the vocabulary from a real tokenizer.json (max id + 1 over the model's
 * vocab and the added tokens) and find its BOS / EOS among common names. */
static inf_status_t scan_tokenizer(const char *path, int64_t *size, int32_t *bos, int32_t *eos,
                                   const char **bos_name, const char **eos_name,
                                   struct inf_err *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return inf_err_set(err, INF_E_FORMAT, "--tokenizer: not valid JSON: %s (line %d)",
                           jerr.text, jerr.line);
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    if (json_is_object(vocab)) {
        json_object_foreach(vocab, key, v) if (json_is_integer(v) && json_integer_value(v) > max_id)
            max_id = json_integer_value(v);
    } else if (json_is_array(vocab)) { /* Unigram: [[piece, score], ...] */
        max_id = (int64_t)json_array_size(vocab) - 1;
    }
    *bos = *eos = -1;
    *bos_name = *eos_name = NULL;
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, v)
    {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        const char *content = json_string_value(json_object_get(v, "content"));
        if (id > max_id)
            max_id = id;
        if (!content)
            continue;
        for (int k = 0; bos_names[k]; k++)
            if (*bos < 0 && strcmp(content, bos_names[k]) == 0) {
                *bos = (int32_t)id;
                *bos_name = bos_names[k];
            }
        for (int k = 0; eos_names[k]; k++)
            if (*eos < 0 && strcmp(content, eos_names[k]) == 0) {
                *eos = (int32_t)id;
                *eos_name = eos_names[k];
            }
    }
    json_decref(root);
    if (max_id < 0)
        return inf_err_set(err, INF_E_FORMAT, "--tokenizer: no vocabulary found");
    *size = max_id + 1;
    return INF_OK;
}

static inf_status_t copy_file(const char *from, const char *to, struct inf_err *err)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        return inf_err_set(err, INF_E_IO, "cannot open %s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return inf_err_set(err, INF_E_IO, "cannot create %s: %s", to, strerror(errno));
    }
    char buf[65536];
    size_t n;
    bool ok = true;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = ok && fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0 || !ok)
        return inf_err_set(err, INF_E_IO, "copying %s failed", from);
    return INF_OK;
}

/* ---- command line ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: int4serve-mkmodel --out DIR [options]\n"
            "Write a synthetic checkpoint folder in Hugging Face's layout.\n\n"
            "  --out DIR            folder to write (created if missing)\n"
            "  --preset NAME        tiny (default) | small | stories15m | stories110m |\n"
            "                       llama2-7b | llama3-8b\n"
            "  --arch A             llama | mistral | qwen2\n"
            "  --hidden N --intermediate N --layers N --heads N --kv-heads N\n"
            "  --head-dim N --vocab N --max-pos N --rope-theta X\n"
            "  --sliding-window N   mistral: config.json's sliding_window (default null)\n"
            "  --tie                tie lm_head to embed_tokens\n"
            "  --rope-llama3        llama3 rope scaling (factor 8, original 8192)\n"
            "  --dtype T            f32 | f16 | bf16\n"
            "  --seed N             random seed (default 1)\n"
            "  --shards N           write N shards and model.safetensors.index.json\n"
            "  --tokenizer FILE     copy this tokenizer.json instead of the built-in one\n"
            "  --format F           fp (default) | awq | gptq | gptq-actorder | ct: an INT4\n"
            "                       checkpoint in that format (other tensors --dtype, f16)\n"
            "  --group-size G       INT4 group along K: 32, 64, 128 (default), 256, ...;\n"
            "                       -1 per output channel\n"
            "  --symmetric          symmetric INT4 (gptq, gptq-actorder, ct)\n"
            "  --checkpoint-format gptq | gptq_v2   qzeros as zero - 1 (default) or zero\n"
            "The built-in tokenizer is a byte-level BPE of up to %d merges; vocab_size\n"
            "defaults to its size rounded up to a multiple of 8 (a copied tokenizer's\n"
            "size exactly: max id + 1). The stories and 7b/8b presets keep their real\n"
            "vocab_size.\n",
            N_MERGES);
}

static bool parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    struct opts o = {.tie = -1,
                     .rope_llama3 = -1,
                     .seed = 1,
                     .shards = 0,
                     .quant = {.fmt = MK_FP, .group = 128},
                     .hidden = -1,
                     .intermediate = -1,
                     .layers = -1,
                     .heads = -1,
                     .kv_heads = -1,
                     .head_dim = -1,
                     .vocab = -1,
                     .max_pos = -1,
                     .rope_theta = -1};
    enum {
        O_OUT = 256,
        O_PRESET,
        O_ARCH,
        O_HIDDEN,
        O_INTER,
        O_LAYERS,
        O_HEADS,
        O_KV,
        O_HD,
        O_VOCAB,
        O_MAXPOS,
        O_THETA,
        O_TIE,
        O_L3,
        O_DTYPE,
        O_SEED,
        O_SHARDS,
        O_TOK,
        O_FORMAT,
        O_GROUP,
        O_SYM,
        O_CKFMT,
        O_SW,
        O_HELP
    };
    static const struct option longopts[] = {
        {"out", 1, 0, O_OUT},
        {"preset", 1, 0, O_PRESET},
        {"arch", 1, 0, O_ARCH},
        {"hidden", 1, 0, O_HIDDEN},
        {"intermediate", 1, 0, O_INTER},
        {"layers", 1, 0, O_LAYERS},
        {"heads", 1, 0, O_HEADS},
        {"kv-heads", 1, 0, O_KV},
        {"head-dim", 1, 0, O_HD},
        {"vocab", 1, 0, O_VOCAB},
        {"max-pos", 1, 0, O_MAXPOS},
        {"rope-theta", 1, 0, O_THETA},
        {"tie", 0, 0, O_TIE},
        {"rope-llama3", 0, 0, O_L3},
        {"dtype", 1, 0, O_DTYPE},
        {"seed", 1, 0, O_SEED},
        {"shards", 1, 0, O_SHARDS},
        {"tokenizer", 1, 0, O_TOK},
        {"format", 1, 0, O_FORMAT},
        {"group-size", 1, 0, O_GROUP},
        {"symmetric", 0, 0, O_SYM},
        {"checkpoint-format", 1, 0, O_CKFMT},
        {"sliding-window", 1, 0, O_SW},
        {"help", 0, 0, O_HELP},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int64_t v = 0;
        bool num = c == O_HIDDEN || c == O_INTER || c == O_LAYERS || c == O_HEADS || c == O_KV ||
                   c == O_HD || c == O_VOCAB || c == O_MAXPOS || c == O_SEED || c == O_SHARDS ||
                   c == O_SW;
        if (num && !parse_i64(optarg, &v)) {
            fprintf(stderr, "int4serve-mkmodel: --%s needs a non-negative integer, got '%s'\n",
                    longopts[c - O_OUT].name, optarg);
            return 2;
        }
        switch (c) {
        case O_OUT:
            o.out = optarg;
            break;
        case O_PRESET:
            o.preset = optarg;
            break;
        case O_ARCH:
            o.arch = optarg;
            break;
        case O_SW:
            o.sliding_window = v;
            break;
        case O_HIDDEN:
            o.hidden = v;
            break;
        case O_INTER:
            o.intermediate = v;
            break;
        case O_LAYERS:
            o.layers = v;
            break;
        case O_HEADS:
            o.heads = v;
            break;
        case O_KV:
            o.kv_heads = v;
            break;
        case O_HD:
            o.head_dim = v;
            break;
        case O_VOCAB:
            o.vocab = v;
            break;
        case O_MAXPOS:
            o.max_pos = v;
            break;
        case O_THETA: {
            char *end;
            o.rope_theta = strtod(optarg, &end);
            if (*end || !(o.rope_theta > 0)) {
                fprintf(stderr, "int4serve-mkmodel: --rope-theta needs a positive number\n");
                return 2;
            }
            break;
        }
        case O_TIE:
            o.tie = 1;
            break;
        case O_L3:
            o.rope_llama3 = 1;
            break;
        case O_DTYPE:
            o.dtype_set = true;
            if (strcmp(optarg, "f32") == 0 || strcmp(optarg, "fp32") == 0)
                o.dtype = ENG_DT_F32;
            else if (strcmp(optarg, "f16") == 0 || strcmp(optarg, "fp16") == 0)
                o.dtype = ENG_DT_F16;
            else if (strcmp(optarg, "bf16") == 0)
                o.dtype = ENG_DT_BF16;
            else {
                fprintf(stderr, "int4serve-mkmodel: --dtype must be f32, f16 or bf16\n");
                return 2;
            }
            break;
        case O_SEED:
            o.seed = (uint64_t)v;
            break;
        case O_SHARDS:
            o.shards = (int32_t)(v > 99999 ? 0 : v);
            break;
        case O_TOK:
            o.tokenizer = optarg;
            break;
        case O_FORMAT:
            if (!mk_format_parse(optarg, &o.quant.fmt)) {
                fprintf(stderr, "int4serve-mkmodel: --format must be fp, awq, gptq, "
                                "gptq-actorder or ct\n");
                return 2;
            }
            break;
        case O_GROUP: {
            char *end;
            long g = strtol(optarg, &end, 10);
            if (*end || !(g == -1 || g == 32 || g == 64 || g == 128 || g == 256 ||
                          (g > 256 && g % 256 == 0 && g <= 65536))) {
                fprintf(stderr, "int4serve-mkmodel: --group-size must be 32, 64, 128, 256, a "
                                "multiple of 256 or -1\n");
                return 2;
            }
            o.quant.group = (int32_t)g;
            break;
        }
        case O_SYM:
            o.quant.sym = true;
            break;
        case O_CKFMT:
            if (strcmp(optarg, "gptq") != 0 && strcmp(optarg, "gptq_v2") != 0) {
                fprintf(stderr, "int4serve-mkmodel: --checkpoint-format must be gptq or "
                                "gptq_v2\n");
                return 2;
            }
            o.quant.v2 = strcmp(optarg, "gptq_v2") == 0;
            break;
        case O_HELP:
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || !o.out) {
        usage(stderr);
        return 2;
    }
    const struct preset *p = NULL;
    const char *pname = o.preset ? o.preset : "tiny";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, pname) == 0)
            p = &presets[i];
    if (!p) {
        fprintf(stderr, "int4serve-mkmodel: unknown --preset '%s'\n", pname);
        return 2;
    }
    if (!o.arch)
        o.arch = p->arch;
    if (strcmp(o.arch, "llama") != 0 && strcmp(o.arch, "mistral") != 0 &&
        strcmp(o.arch, "qwen2") != 0) {
        fprintf(stderr, "int4serve-mkmodel: --arch must be llama, mistral or qwen2\n");
        return 2;
    }
    bool kv_given = o.kv_heads >= 0;
#define DEF(f)                                                                                     \
    if (o.f < 0)                                                                                   \
    o.f = p->f
    DEF(hidden);
    DEF(intermediate);
    DEF(layers);
    DEF(heads);
    DEF(kv_heads);
    DEF(max_pos);
    DEF(rope_theta);
    DEF(tie);
    DEF(rope_llama3);
#undef DEF
    if (!o.dtype_set)
        o.dtype = o.quant.fmt != MK_FP ? ENG_DT_F16 : p->dtype;
    o.quant.sdtype = o.dtype;
    if (o.quant.sym && o.quant.fmt != MK_GPTQ && o.quant.fmt != MK_GPTQ_ACT &&
        o.quant.fmt != MK_CT) {
        fprintf(stderr, "int4serve-mkmodel: --symmetric needs --format gptq, gptq-actorder or ct "
                        "(AutoAWQ's gemm layers always have zero points)\n");
        return 2;
    }
    if (o.quant.v2 && o.quant.fmt != MK_GPTQ && o.quant.fmt != MK_GPTQ_ACT) {
        fprintf(stderr, "int4serve-mkmodel: --checkpoint-format needs --format gptq or "
                        "gptq-actorder\n");
        return 2;
    }
    if (o.sliding_window > 0 && strcmp(o.arch, "mistral") != 0) {
        fprintf(stderr, "int4serve-mkmodel: --sliding-window needs --arch mistral\n");
        return 2;
    }
    if (o.sliding_window > INT32_MAX) {
        fprintf(stderr, "int4serve-mkmodel: --sliding-window is too large\n");
        return 2;
    }
    if (!kv_given && o.kv_heads > o.heads)
        o.kv_heads = o.heads; /* --heads below the preset's KV heads */
    if (o.shards < 0 || o.shards > 99999) {
        fprintf(stderr, "int4serve-mkmodel: --shards must be in [1, 99999]\n");
        return 2;
    }

    struct inf_err err;
    inf_err_clear(&err);
    if (mkdir(o.out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "int4serve-mkmodel: cannot create %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    char path[4096];
    int32_t bos = -1, eos = -1;
    const char *bos_name = BPE_BOS, *eos_name = BPE_EOS;
    int64_t tok_size = 0;
    struct bpe_vocab bv = {0};
    snprintf(path, sizeof path, "%s/tokenizer.json", o.out);
    if (o.tokenizer) {
        if (scan_tokenizer(o.tokenizer, &tok_size, &bos, &eos, &bos_name, &eos_name, &err) ||
            copy_file(o.tokenizer, path, &err))
            goto fail;
    } else {
        if (bpe_train(N_MERGES, &bv, &err) || bpe_write_tokenizer_json(&bv, path, &err))
            goto fail;
        tok_size = bv.size;
        bos = bv.bos_id;
        eos = bv.eos_id;
    }
    if (o.vocab < 0)
        o.vocab = p->vocab > 0 ? p->vocab : o.tokenizer ? tok_size : (tok_size + 7) / 8 * 8;
    if (o.vocab < tok_size) {
        fprintf(stderr, "int4serve-mkmodel: --vocab %lld is smaller than the tokenizer's %lld\n",
                (long long)o.vocab, (long long)tok_size);
        bpe_free(&bv);
        return 2;
    }

    /* The config goes through the engine's own parser before anything big is
     * written, so a bad shape is refused with the key it breaks. */
    json_t *cj = make_config(&o, bos, eos);
    char *ctext = json_dumps(cj, JSON_INDENT(2));
    struct eng_model_config cfg;
    inf_status_t st = ctext ? eng_model_config_parse(ctext, strlen(ctext), &cfg, &err)
                            : inf_err_set(&err, INF_E_NOMEM, "out of memory");
    free(ctext);
    if (st == INF_OK)
        st = check_format(&cfg, &o.quant, &err);
    if (st != INF_OK) {
        json_decref(cj);
        goto fail;
    }
    if (o.quant.fmt != MK_FP) {
        json_t *qc = mk_quant_config(&o.quant);
        if (o.quant.fmt == MK_GPTQ || o.quant.fmt == MK_GPTQ_ACT) {
            if (dump(json_deep_copy(qc), o.out, "quantize_config.json", &err)) {
                json_decref(qc);
                json_decref(cj);
                goto fail;
            }
        }
        json_object_set_new(cj, "quantization_config", qc);
    }
    if (dump(cj, o.out, "config.json", &err))
        goto fail;
    json_t *tc =
        json_pack("{s:b, s:b, s:s, s:s, s:b, s:I, s:s}", "add_bos_token", bos >= 0, "add_eos_token",
                  0, "bos_token", bos_name ? bos_name : "", "eos_token", eos_name ? eos_name : "",
                  "clean_up_tokenization_spaces", 0, "model_max_length", (json_int_t)o.max_pos,
                  "tokenizer_class", "PreTrainedTokenizerFast");
    if (tc && bos < 0)
        json_object_set_new(tc, "bos_token", json_null());
    if (tc && eos < 0)
        json_object_set_new(tc, "eos_token", json_null());
    if (dump(tc, o.out, "tokenizer_config.json", &err))
        goto fail;
    json_t *gc = json_object();
    if (gc) {
        json_object_set_new(gc, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
        json_object_set_new(gc, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
        json_object_set_new(gc, "do_sample", json_false());
    }
    if (dump(gc, o.out, "generation_config.json", &err))
        goto fail;

    uint64_t t0 = inf_now_ns(), bytes = 0;
    if (write_weights(o.out, &cfg, o.dtype, o.seed, o.shards > 0 ? o.shards : 1, &o.quant, &bytes,
                      &err))
        goto fail;
    double secs = (double)(inf_now_ns() - t0) * 1e-9;
    printf("%s: %s hidden %d, intermediate %d, layers %d, heads %d/%d, head_dim %d, vocab %d "
           "(tokenizer %lld), %s, %.1f MB in %.1f s\n",
           o.out, arch_class(o.arch), cfg.hidden, cfg.intermediate, cfg.n_layers, cfg.n_heads,
           cfg.n_kv_heads, cfg.head_dim, cfg.vocab, (long long)tok_size, eng_dtype_name(o.dtype),
           (double)bytes / 1e6, secs);
    bpe_free(&bv);
    return 0;
fail:
    bpe_free(&bv);
    fprintf(stderr, "int4serve-mkmodel: %s\n", err.msg);
    return 1;
}
