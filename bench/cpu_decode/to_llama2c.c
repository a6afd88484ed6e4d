/* int4serve-to-llama2c — write a Llama checkpoint folder (config.json +
 * safetensors, e.g. from int4serve-mkmodel) as llama2.c's legacy model file
 * and a tokenizer file its run.c reads, so that run.c and the CPU backend
 * run the same weights (docs/PERF.md, "CPU decode").
 *
 *   int4serve-to-llama2c DIR MODEL.bin TOKENIZER.bin
 *
 * MODEL.bin: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, negative when the classifier is not tied to the embedding,
 * seq_len), then fp32 token_embedding [vocab][dim], rms_att [layers][dim],
 * wq [layers][dim][dim], wk, wv [layers][kv_dim][dim], wo [layers][dim][dim],
 * rms_ffn [layers][dim], w1 (gate) [layers][hidden][dim], w2 (down)
 * [layers][dim][hidden], w3 (up) [layers][hidden][dim], rms_final [dim],
 * freq_cis_real / imag [seq_len][head_dim / 2] (not read by run.c), and the
 * classifier [vocab][dim] when not tied.
 *
 * RoPE: Hugging Face's rotate_half pairs element i of a head with
 * i + head_dim / 2; llama2.c rotates the adjacent pairs (2i, 2i + 1) at the
 * same frequency. Rows of wq and wk are reordered so that llama2.c's row
 * 2i + j of a head is Hugging Face's row j * head_dim / 2 + i (the inverse
 * of the permutation llama2.c's export.py applies): both models then
 * compute the same scores (q and k are permuted alike within a head, and
 * v, wo are untouched).
 *
 * TOKENIZER.bin: max_token_length, then per id a score (0) and its piece,
 * " <id>": run.c prints the generated ids, whitespace-separated. */
#include "common/inf.h"
#include "engine/weights/model_config.h"
#include "engine/weights/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *g_out;
static float *g_row;

static int put_f32(const float *v, size_t n)
{
    return fwrite(v, sizeof(float), n, g_out) == n ? 0 : -1;
}

/* Write tensor name ([rows][cols], cols 0 for 1-D) as fp32; with perm_heads
 * > 0, its rows reordered per head of head_dim (the RoPE permutation). */
static int put_tensor(const eng_st_t *st, const char *name, int64_t rows, int64_t cols,
                      int32_t perm_heads, int32_t head_dim)
{
    struct inf_err err = {0};
    int64_t shape[2] = {rows, cols};
    const struct eng_st_tensor *t;
    if (eng_st_require(st, name, cols ? 2 : 1, shape, &t, &err) != INF_OK) {
        fprintf(stderr, "int4serve-to-llama2c: %s\n", err.msg);
        return -1;
    }
    int64_t w = cols ? cols : rows, n_rows = cols ? rows : 1;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t src = r;
        if (perm_heads > 0) {
            int64_t h = r / head_dim, e = r % head_dim, half = head_dim / 2;
            src = h * head_dim + (e % 2) * half + e / 2;
        }
        if (eng_st_read_f32(t, src * w, w, g_row, &err) != INF_OK) {
            fprintf(stderr, "int4serve-to-llama2c: %s\n", err.msg);
            return -1;
        }
        if (put_f32(g_row, (size_t)w))
            return -1;
    }
    return 0;
}

/* One tensor of every layer, in layer order. */
static int put_layers(const eng_st_t *st, const struct eng_model_config *c, const char *part,
                      int64_t rows, int64_t cols, int32_t perm_heads)
{
    char name[160];
    for (int32_t l = 0; l < c->n_layers; l++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", l, part);
        if (put_tensor(st, name, rows, cols, perm_heads, c->head_dim))
            return -1;
    }
    return 0;
}

static int write_tokenizer(const char *path, int32_t vocab)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "int4serve-to-llama2c: cannot create %s\n", path);
        return -1;
    }
    char piece[32];
    int32_t max_len = snprintf(piece, sizeof piece, " %d", vocab - 1);
    int ok = fwrite(&max_len, 4, 1, f) == 1;
    for (int32_t i = 0; i < vocab && ok; i++) {
        float score = 0.0f;
        int32_t len = snprintf(piece, sizeof piece, " %d", i);
        ok = fwrite(&score, 4, 1, f) == 1 && fwrite(&len, 4, 1, f) == 1 &&
             fwrite(piece, 1, (size_t)len, f) == (size_t)len;
    }
    if (fclose(f) != 0 || !ok) {
        fprintf(stderr, "int4serve-to-llama2c: writing %s failed\n", path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: int4serve-to-llama2c DIR MODEL.bin TOKENIZER.bin\n");
        return 2;
    }
    struct inf_err err = {0};
    struct eng_model_config c;
    eng_st_t *st = NULL;
    if (eng_model_config_load(argv[1], &c, &err) != INF_OK ||
        eng_st_open(argv[1], &st, &err) != INF_OK) {
        fprintf(stderr, "int4serve-to-llama2c: %s\n", err.msg);
        return 1;
    }
    /* what run.c hard-codes */
    if (c.arch != ENG_ARCH_LLAMA || c.head_dim * c.n_heads != c.hidden || c.rope_llama3 ||
        c.rope_theta != 10000.0f || c.rms_eps != 1e-5f || c.qkv_bias) {
        fprintf(stderr, "int4serve-to-llama2c: run.c needs a Llama with head_dim = hidden / "
                        "heads, rope_theta 10000, rms_norm_eps 1e-5 and no RoPE scaling\n");
        eng_st_close(st);
        return 1;
    }
    const int64_t D = c.hidden, F = c.intermediate, V = c.vocab, hd = c.head_dim,
                  kvd = (int64_t)c.n_kv_heads * hd;
    const int32_t S = c.max_pos;
    int rc = 1;
    g_row = malloc(sizeof(float) * (size_t)(D > F ? (D > S ? D : S) : (F > S ? F : S)));
    g_out = fopen(argv[2], "wb");
    if (!g_row || !g_out) {
        fprintf(stderr, "int4serve-to-llama2c: cannot create %s\n", argv[2]);
        goto out;
    }
    int32_t hdr[7] = {c.hidden,  c.intermediate, c.n_layers,
                      c.n_heads, c.n_kv_heads,   c.tie_embeddings ? c.vocab : -c.vocab,
                      S};
    if (fwrite(hdr, sizeof hdr, 1, g_out) != 1 ||
        put_tensor(st, "model.embed_tokens.weight", V, D, 0, 0) ||
        put_layers(st, &c, "input_layernorm.weight", D, 0, 0) ||
        put_layers(st, &c, "self_attn.q_proj.weight", D, D, c.n_heads) ||
        put_layers(st, &c, "self_attn.k_proj.weight", kvd, D, c.n_kv_heads) ||
        put_layers(st, &c, "self_attn.v_proj.weight", kvd, D, 0) ||
        put_layers(st, &c, "self_attn.o_proj.weight", D, D, 0) ||
        put_layers(st, &c, "post_attention_layernorm.weight", D, 0, 0) ||
        put_layers(st, &c, "mlp.gate_proj.weight", F, D, 0) ||
        put_layers(st, &c, "mlp.down_proj.weight", D, F, 0) ||
        put_layers(st, &c, "mlp.up_proj.weight", F, D, 0) ||
        put_tensor(st, "model.norm.weight", D, 0, 0, 0))
        goto out;
    for (int part = 0; part < 2; part++)
        for (int32_t p = 0; p < S; p++) {
            for (int64_t i = 0; i < hd / 2; i++) {
                double a = p * pow(10000.0, -2.0 * (double)i / (double)hd);
                g_row[i] = (float)(part == 0 ? cos(a) : sin(a));
            }
            if (put_f32(g_row, (size_t)(hd / 2)))
                goto out;
        }
    if (!c.tie_embeddings && put_tensor(st, "lm_head.weight", V, D, 0, 0))
        goto out;
    if (fclose(g_out) != 0) {
        g_out = NULL;
        fprintf(stderr, "int4serve-to-llama2c: writing %s failed\n", argv[2]);
        goto out;
    }
    g_out = NULL;
    rc = write_tokenizer(argv[3], c.vocab) ? 1 : 0;
out:
    if (g_out)
        fclose(g_out);
    free(g_row);
    eng_st_close(st);
    return rc;
}
