#pragma once
/* Test helper (header only, included by the engine and kernel tests and the
 * CPU benchmark): a synthetic Hugging Face checkpoint folder written with the
 * engine's safetensors writer, and the deterministic generator behind it.
 *
 * Weights are uniform with standard deviation 1/sqrt(fan_in) (embeddings 1),
 * norm weights around 1, biases small: a random model whose logits are far
 * from flat, so greedy decoding is meaningful. Tensors are written in the
 * order Hugging Face uses, fp32 unless dtype says otherwise. */
#include "engine/weights/safetensors_write.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tm_spec {
    const char *arch; /* "llama" | "mistral" | "qwen2" */
    int hidden, intermediate, layers, heads, kv_heads, vocab;
    int tie;    /* tie_word_embeddings */
    int llama3; /* rope_scaling llama3 */
    float rope_theta;
    enum eng_dtype dtype; /* F32, F16 or BF16 */
    float head_std;       /* lm_head std times sqrt(hidden); 0 means 3 */
    float out_scale;      /* o_proj and down_proj std multiplier; 0 means 1 */
    int sliding_window;   /* mistral: config.json's sliding_window; 0 means null */
    float kv_scale;       /* nonzero: each layer carries self_attn.k_scale = kv_scale and
                             self_attn.v_proj.output_scale = 2 x kv_scale (FP8 KV scales as
                             vLLM reads them) */
    uint64_t seed;
};

static uint64_t tm_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float tm_uniform(uint64_t *s)
{
    return (float)((double)(tm_rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

static void tm_fill(float *w, int64_t n, float std, float mean, uint64_t *s)
{
    /* uniform on [-a, a) has std a / sqrt(3) */
    float a = std * 1.7320508f;
    for (int64_t i = 0; i < n; i++)
        w[i] = mean + a * tm_uniform(s);
}

/* Writes dir/config.json and dir/model.safetensors. Returns 0 on success. */
static int tm_write(const char *dir, const struct tm_spec *sp)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    const char *archname = strcmp(sp->arch, "qwen2") == 0     ? "Qwen2ForCausalLM"
                           : strcmp(sp->arch, "mistral") == 0 ? "MistralForCausalLM"
                                                              : "LlamaForCausalLM";
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d,\n"
            " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
            " \"num_key_value_heads\": %d, \"vocab_size\": %d, \"max_position_embeddings\": 4096,\n"
            " \"rms_norm_eps\": 1e-05, \"rope_theta\": %g, \"tie_word_embeddings\": %s,\n"
            " \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2,\n"
            " \"torch_dtype\": \"float32\"",
            archname, sp->arch, sp->hidden, sp->intermediate, sp->layers, sp->heads, sp->kv_heads,
            sp->vocab, (double)sp->rope_theta, sp->tie ? "true" : "false");
    if (sp->llama3)
        fprintf(f, ",\n \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                   "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 64}");
    if (strcmp(sp->arch, "mistral") == 0 && sp->sliding_window > 0)
        fprintf(f, ",\n \"sliding_window\": %d", sp->sliding_window);
    else if (strcmp(sp->arch, "mistral") == 0)
        fprintf(f, ",\n \"sliding_window\": null");
    fprintf(f, "}\n");
    if (fclose(f) != 0)
        return -1;

    int H = sp->hidden, I = sp->intermediate, hd = H / sp->heads;
    int qd = sp->heads * hd, kvd = sp->kv_heads * hd;
    int qwen = strcmp(sp->arch, "qwen2") == 0;
    struct {
        char name[128];
        int64_t r, c; /* c 0: 1-D */
        float std, mean;
    } t[512];
    int nt = 0;
#define TM_ADD(nm, rr, cc, sd, mn)                                                                 \
    do {                                                                                           \
        snprintf(t[nt].name, sizeof t[nt].name, "%s", nm);                                         \
        t[nt].r = rr;                                                                              \
        t[nt].c = cc;                                                                              \
        t[nt].std = sd;                                                                            \
        t[nt].mean = mn;                                                                           \
        nt++;                                                                                      \
    } while (0)
    TM_ADD("model.embed_tokens.weight", sp->vocab, H, 1.0f, 0.0f);
    for (int l = 0; l < sp->layers && nt < 500; l++) {
        char n[128];
        const float os = sp->out_scale > 0 ? sp->out_scale : 1.0f;
        const float sh = 1.0f / sqrtf((float)H), si = os / sqrtf((float)I);
#define TM_L(suffix, rr, cc, sd, mn)                                                               \
    do {                                                                                           \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                    \
        TM_ADD(n, rr, cc, sd, mn);                                                                 \
    } while (0)
        TM_L("input_layernorm.weight", H, 0, 0.1f, 1.0f);
        TM_L("self_attn.q_proj.weight", qd, H, sh, 0.0f);
        TM_L("self_attn.k_proj.weight", kvd, H, sh, 0.0f);
        TM_L("self_attn.v_proj.weight", kvd, H, sh, 0.0f);
        if (qwen) {
            TM_L("self_attn.q_proj.bias", qd, 0, 0.1f, 0.0f);
            TM_L("self_attn.k_proj.bias", kvd, 0, 0.1f, 0.0f);
            TM_L("self_attn.v_proj.bias", kvd, 0, 0.1f, 0.0f);
        }
        TM_L("self_attn.o_proj.weight", H, qd, os / sqrtf((float)qd), 0.0f);
        if (sp->kv_scale != 0) {
            TM_L("self_attn.k_scale", 1, 0, 0.0f, sp->kv_scale);
            TM_L("self_attn.v_proj.output_scale", 1, 0, 0.0f, 2 * sp->kv_scale);
        }
        TM_L("post_attention_layernorm.weight", H, 0, 0.1f, 1.0f);
        TM_L("mlp.gate_proj.weight", I, H, sh, 0.0f);
        TM_L("mlp.up_proj.weight", I, H, sh, 0.0f);
        TM_L("mlp.down_proj.weight", H, I, si, 0.0f);
#undef TM_L
    }
    TM_ADD("model.norm.weight", H, 0, 0.1f, 1.0f);
    if (!sp->tie)
        TM_ADD("lm_head.weight", sp->vocab, H,
               (sp->head_std > 0 ? sp->head_std : 3.0f) / sqrtf((float)H), 0.0f);
#undef TM_ADD

    eng_st_writer_t *w = NULL;
    struct inf_err err;
    if (eng_st_writer_create(dir, 1, &w, &err) != INF_OK)
        return -1;
    int rc = -1;
    for (int i = 0; i < nt; i++) {
        int64_t shape[2] = {t[i].r, t[i].c};
        if (eng_st_writer_add(w, t[i].name, sp->dtype, t[i].c ? 2 : 1, shape, &err) != INF_OK)
            goto out;
    }
    uint64_t s = sp->seed;
    for (int i = 0; i < nt; i++) {
        int64_t n = t[i].r * (t[i].c ? t[i].c : 1);
        float *v = malloc((size_t)n * sizeof(float));
        uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
        if (!v || !h) {
            free(v);
            free(h);
            goto out;
        }
        tm_fill(v, n, t[i].std, t[i].mean, &s);
        inf_status_t st;
        if (sp->dtype == ENG_DT_F32) {
            st = eng_st_writer_write(w, v, (size_t)n * 4, &err);
        } else {
            for (int64_t j = 0; j < n; j++)
                h[j] = sp->dtype == ENG_DT_F16 ? inf_f32_to_f16(v[j]) : inf_f32_to_bf16(v[j]);
            st = eng_st_writer_write(w, h, (size_t)n * 2, &err);
        }
        free(v);
        free(h);
        if (st != INF_OK)
            goto out;
    }
    if (eng_st_writer_finish(w, &err) == INF_OK)
        rc = 0;
out:
    eng_st_writer_destroy(w);
    return rc;
}

/* rm -r of a flat folder made by mkdtemp. */
#include <dirent.h>
#include <unistd.h>
static void tm_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[768];
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}
