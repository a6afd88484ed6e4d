/* int4serve-generate — greedy generation from token ids, on the CPU backend
 * (or the CUDA backend with --backend cuda).
 *
 *   int4serve-generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) --max-tokens N
 *       [--quantization auto|int4|awq|gptq|compressed-tensors|none] [--group-size G]
 *       [--symmetric] [--no-fuse]
 *       [--threads T] [--dump-logits FILE] [--batch B] [--backend cpu|cuda]
 *       [--device N]
 *
 * --backend cuda runs the model on GPU --device (fp16 activations; fp16
 * weights with --quantization none): what tests/parity/hf_parity.py
 * compares with transformers in fp16.
 * --prompt TEXT encodes TEXT with the model folder's tokenizer.json (BOS
 * and EOS as its post-processor says) instead of taking ids.
 * Prints the generated ids (one line), then, when the model folder has a
 * tokenizer, a line "text: " followed by their decoded text (special tokens
 * skipped) as a JSON-style escaped string, then the prefill time and the
 * decode time per token. --batch B runs B copies of the prompt as B sequences of one
 * batch (each decode step then carries B tokens); the ids printed are those
 * of sequence 0 and the tool fails if any copy differs.
 *
 * --dump-logits FILE writes the fp32 logits of sequence 0 for every prompt
 * position and every generated token that was fed back: rows =
 * n_prompt + max_tokens - 1, row i being the logits after token i of
 * (prompt ++ generated), i.e. what a Hugging Face forward over those ids
 * returns at position i. Layout [rows][vocab], row-major, little-endian
 * fp32. When FILE ends in ".npy" it is a NumPy .npy file (format 1.0,
 * dtype '<f4', shape (rows, vocab)); otherwise raw fp32 with no header. */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/sched/greedy.h"
#include "engine/model.h"
#include "tokenizer/tokenizer.h"
#include "tools/common/model_args.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: int4serve-generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT)\n"
               "       --max-tokens N [--dump-logits FILE] [--batch B]\n" TOOL_MODEL_USAGE
               "Greedy generation on the CPU backend (or GPU N with --backend cuda); prints\n"
               "the ids of sequence 0, their text (when the model has a tokenizer.json),\n"
               "then the prefill time and the decode time per token. --group-size 0 is\n"
               "per-channel.\n"
               "--dump-logits: fp32 logits of sequence 0, [n_prompt + N - 1][vocab], row i\n"
               "after token i of prompt ++ generated; raw little-endian fp32, or a NumPy\n"
               ".npy file (dtype <f4, 2-D) when FILE ends in .npy.\n");
}

/* A non-empty comma-separated list of ids in [0, INT32_MAX]; *out is malloc'd. */
static int parse_ids(const char *s, int32_t **out, int *n)
{
    *out = NULL;
    long count = inf_int_list_parse(s, NULL, 0);
    if (count <= 0 || count > INT32_MAX)
        return -1;
    int64_t *v = malloc(sizeof *v * (size_t)count);
    *out = malloc(sizeof **out * (size_t)count);
    int rc = v && *out ? 0 : -1;
    if (rc == 0)
        inf_int_list_parse(s, v, (size_t)count);
    for (long i = 0; rc == 0 && i < count; i++) {
        if (v[i] < 0 || v[i] > INT32_MAX)
            rc = -1;
        else
            (*out)[i] = (int32_t)v[i];
    }
    free(v);
    *n = (int)count;
    return rc;
}

static int write_logits(const char *path, const float *lg, int rows, int vocab)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t len = strlen(path);
    if (len > 4 && strcmp(path + len - 4, ".npy") == 0) {
        char hdr[128];
        int h =
            snprintf(hdr, sizeof hdr,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, vocab);
        /* magic(6) + version(2) + header length(2) + header, padded to 64 with '\n' last */
        int total = (10 + h + 1 + 63) / 64 * 64;
        int pad = total - 10 - h - 1;
        uint16_t hl = (uint16_t)(total - 10);
        unsigned char pre[10] = "\x93NUMPY\x01\x00";
        pre[8] = (unsigned char)(hl & 0xff);
        pre[9] = (unsigned char)(hl >> 8);
        fwrite(pre, 1, 10, f);
        fwrite(hdr, 1, (size_t)h, f);
        for (int i = 0; i < pad; i++)
            fputc(' ', f);
        fputc('\n', f);
    }
    size_t n = (size_t)rows * (size_t)vocab;
    int rc = fwrite(lg, sizeof(float), n, f) == n ? 0 : -1;
    return fclose(f) == 0 ? rc : -1;
}

/* Timings of the steps, and the rows of sequence 0 when dumping. */
struct run {
    int np, vocab;
    float *dump; /* [np + max_tokens - 1][vocab] or NULL */
    uint64_t t_prefill, t_decode;
};

static void on_step(void *user, int32_t step, const float *logits, uint64_t ns)
{
    struct run *r = user;
    if (step == 0)
        r->t_prefill = ns;
    else
        r->t_decode += ns;
    /* sequence 0's rows come first: the whole prompt at step 0, then one */
    if (r->dump)
        memcpy(r->dump + (size_t)(step == 0 ? 0 : r->np + step - 1) * (size_t)r->vocab, logits,
               sizeof(float) * (size_t)(step == 0 ? r->np : 1) * (size_t)r->vocab);
}

/* Print "text: " and the decoded ids as one escaped line (quotes, backslash
 * and control bytes escaped; UTF-8 passed through). Ids past the tokenizer's
 * vocabulary (a model's vocabulary padding) give no text, as when serving. */
static int print_text(const tok_tokenizer_t *tok, const int32_t *ids, int n)
{
    char *text = NULL;
    size_t len = 0, kept = 0;
    int32_t *known = malloc(sizeof *known * (size_t)n);
    if (!known)
        return -1;
    for (int i = 0; i < n; i++)
        if (ids[i] < tok_vocab_size(tok))
            known[kept++] = ids[i];
    inf_status_t st = tok_decode(tok, known, kept, true, &text, &len, NULL);
    free(known);
    if (st != INF_OK)
        return -1;
    fputs("text: \"", stdout);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    fputs("\"\n", stdout);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *ids_arg = NULL, *text_arg = NULL, *dump = NULL;
    int max_tokens = -1, batch = 1;
    struct tool_model_args ma;
    tool_model_args_init(&ma);
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"prompt-ids", required_argument, 0, 'p'},
                                       {"prompt", required_argument, 0, 'P'},
                                       {"max-tokens", required_argument, 0, 'n'},
                                       {"dump-logits", required_argument, 0, 'd'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"help", no_argument, 0, 'h'},
                                       TOOL_MODEL_LONGOPTS,
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int took = tool_model_args_take(&ma, c, optarg, "int4serve-generate");
        if (took < 0)
            return 2;
        if (took > 0)
            continue;
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'p':
            ids_arg = optarg;
            break;
        case 'P':
            text_arg = optarg;
            break;
        case 'n':
            max_tokens = atoi(optarg);
            break;
        case 'd':
            dump = optarg;
            break;
        case 'b':
            batch = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    int32_t *prompt = NULL;
    int np = 0;
    if (!model || !ids_arg == !text_arg || max_tokens < 1 || batch < 1 || batch > 256) {
        usage(stderr);
        return 2;
    }
    struct inf_err err = {0};
    /* The tokenizer is optional for --prompt-ids (ids only), required for
     * --prompt. */
    tok_tokenizer_t *tok = NULL;
    if (tok_load(model, &tok, &err) != INF_OK) {
        if (text_arg) {
            fprintf(stderr, "int4serve-generate: %s\n", err.msg);
            return 1;
        }
        tok = NULL;
    }
    if (text_arg) {
        struct tok_ids ids = {0};
        if (tok_encode(tok, text_arg, strlen(text_arg), NULL, &ids, &err) != INF_OK) {
            fprintf(stderr, "int4serve-generate: --prompt: %s\n", err.msg);
            tok_destroy(tok);
            return 2;
        }
        prompt = ids.ids; /* ownership moves to prompt (malloc'd) */
        np = (int)ids.n;
        if (np == 0) {
            fprintf(stderr, "int4serve-generate: --prompt encodes to no tokens\n");
            tok_ids_fini(&ids);
            tok_destroy(tok);
            return 2;
        }
    } else if (parse_ids(ids_arg, &prompt, &np) != 0) {
        fprintf(stderr, "int4serve-generate: --prompt-ids must be a comma-separated list of ids\n");
        free(prompt);
        tok_destroy(tok);
        return 2;
    }
    struct eng_model_opts mo = ma.mo;
    eng_greedy_size(&mo, batch, np, max_tokens);

    struct eng_backend *be = NULL;
    eng_model_t *m = NULL;
    int rc = 1;
    int32_t *gen = NULL;
    const int32_t **prompts = NULL;
    int32_t *lens = NULL;
    struct run run = {.np = np};
    if (tool_model_args_backend(&ma, &be, &err) != INF_OK ||
        eng_model_load(model, be, &mo, &m, &err) != INF_OK) {
        fprintf(stderr, "int4serve-generate: %s\n", err.msg);
        goto out;
    }
    const struct eng_model_config *cfg = eng_model_config(m);
    for (int i = 0; i < np; i++)
        if (prompt[i] >= cfg->vocab) {
            fprintf(stderr, "int4serve-generate: prompt id %d is outside the vocabulary (%d)\n",
                    prompt[i], cfg->vocab);
            goto out;
        }
    int V = cfg->vocab, total = np + max_tokens;
    run.vocab = V;
    gen = malloc(sizeof(int32_t) * (size_t)batch * (size_t)max_tokens);
    prompts = malloc(sizeof *prompts * (size_t)batch);
    lens = malloc(sizeof *lens * (size_t)batch);
    if (dump)
        run.dump = malloc(sizeof(float) * (size_t)(total - 1) * (size_t)V);
    if (!gen || !prompts || !lens || (dump && !run.dump)) {
        fprintf(stderr, "int4serve-generate: out of memory\n");
        goto out;
    }
    for (int s = 0; s < batch; s++) {
        prompts[s] = prompt;
        lens[s] = np;
    }
    /* sequence 0 wants every row when dumping, the others only the last */
    struct eng_greedy g = {.n_seq = batch,
                           .prompts = prompts,
                           .n_prompt = lens,
                           .n_new = max_tokens,
                           .all_logits0 = dump != NULL,
                           .on_step = on_step,
                           .user = &run};
    if (eng_greedy_run(m, &g, gen, &err) != INF_OK) {
        fprintf(stderr, "int4serve-generate: %s\n", err.msg);
        goto out;
    }
    uint64_t t_prefill = run.t_prefill, t_decode = run.t_decode;
    for (int s = 1; s < batch; s++)
        if (memcmp(gen, gen + s * max_tokens, sizeof(int32_t) * (size_t)max_tokens) != 0) {
            fprintf(stderr, "int4serve-generate: sequence %d of the batch generated other ids\n",
                    s);
            goto out;
        }
    for (int i = 0; i < max_tokens; i++)
        printf("%s%d", i ? "," : "", gen[i]);
    printf("\n");
    if (tok && print_text(tok, gen, max_tokens) != 0) {
        fprintf(stderr, "int4serve-generate: cannot decode the generated ids\n");
        goto out;
    }
    printf("prefill: %d tokens x %d in %.3f ms\n", np, batch, (double)t_prefill / 1e6);
    if (max_tokens > 1)
        printf("decode: %.3f ms/token (batch %d, %.1f tokens/s)\n",
               (double)t_decode / 1e6 / (max_tokens - 1), batch,
               (double)batch * (max_tokens - 1) / ((double)t_decode / 1e9));
    if (dump && write_logits(dump, run.dump, total - 1, V) != 0) {
        fprintf(stderr, "int4serve-generate: cannot write the logits file\n");
        goto out;
    }
    rc = 0;
out:
    free(gen), free(prompts), free(lens), free(run.dump);
    free(prompt);
    eng_model_destroy(m);
    eng_backend_destroy(be);
    tok_destroy(tok);
    return rc;
}
