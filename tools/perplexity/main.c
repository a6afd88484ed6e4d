/* int4serve-perplexity — a model's perplexity over a text file, on the CPU
 * backend or a GPU, at any quantization the engine loads.
 *
 *   int4serve-perplexity --model DIR --text FILE [--ctx C] [--windows N]
 *       [model flags: tools/common/model_args.h]
 *
 * The definition tools/demo-model/train.py shares, so the figures compare
 * with transformers': FILE is encoded with the model's tokenizer.json, no
 * special tokens; window k is BOS followed by ids [k (C - 1), (k + 1)(C - 1));
 * each window runs alone as one prefill and is scored on its C - 1 predicted
 * ids (log-softmax in double over the fp32 logits); perplexity is
 * exp(mean NLL) over every predicted id of the first N whole windows (all of
 * them when N is 0). C defaults to 256 and may not pass the model's
 * max_position_embeddings.
 *
 * Prints one JSON object: the model folder, quantization, group size,
 * symmetry, backend, ctx, windows, predicted ids, the text's token count and
 * FNV-1a 32 fingerprint of its ids (train.py's, to prove both sides scored
 * the same ids), nll, ppl and the seconds the windows took. */
#include "common/inf.h"
#include "engine/model.h"
#include "engine/sched/greedy.h"
#include "tokenizer/tokenizer.h"
#include "tools/common/model_args.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: int4serve-perplexity --model DIR --text FILE [--ctx C] [--windows "
               "N]\n" TOOL_MODEL_USAGE
               "Perplexity over FILE in windows of C tokens (BOS, then C - 1 ids of the\n"
               "text), each scored alone; N: the first N windows (0: all). Prints one JSON\n"
               "object.\n");
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = '\0';
                *len = (size_t)n;
            } else {
                free(buf);
                buf = NULL;
            }
        }
    }
    fclose(f);
    return buf;
}

static uint32_t fnv1a_ids(const int32_t *ids, size_t n)
{
    uint32_t h = 0x811C9DC5u;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint32_t)ids[i] >> (8 * b) & 0xffu;
            h *= 0x01000193u;
        }
    return h;
}

/* The window being scored and the NLL summed over every window so far. */
struct score {
    const int32_t *win;
    int ctx, vocab;
    double nll;
};

static void on_step(void *user, int32_t step, const float *logits, uint64_t ns)
{
    (void)ns;
    struct score *s = user;
    if (step != 0)
        return;
    for (int i = 0; i + 1 < s->ctx; i++) {
        const float *l = logits + (size_t)i * (size_t)s->vocab;
        double mx = l[0], sum = 0;
        for (int v = 1; v < s->vocab; v++)
            mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < s->vocab; v++)
            sum += exp((double)l[v] - mx);
        s->nll += mx + log(sum) - (double)l[s->win[i + 1]];
    }
}

static const char *quant_name(enum eng_quant q)
{
    switch (q) {
    case ENG_QUANT_NONE:
        return "none";
    case ENG_QUANT_INT4:
        return "int4";
    case ENG_QUANT_AWQ:
        return "awq";
    case ENG_QUANT_GPTQ:
        return "gptq";
    case ENG_QUANT_CT:
        return "compressed-tensors";
    default:
        return "auto";
    }
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text_path = NULL;
    int ctx = 256, max_windows = 0;
    struct tool_model_args ma;
    tool_model_args_init(&ma);
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"text", required_argument, 0, 'x'},
                                       {"ctx", required_argument, 0, 'c'},
                                       {"windows", required_argument, 0, 'w'},
                                       {"help", no_argument, 0, 'h'},
                                       TOOL_MODEL_LONGOPTS,
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int took = tool_model_args_take(&ma, c, optarg, "int4serve-perplexity");
        if (took < 0)
            return 2;
        if (took > 0)
            continue;
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'x':
            text_path = optarg;
            break;
        case 'c':
            ctx = atoi(optarg);
            break;
        case 'w':
            max_windows = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!model || !text_path || ctx < 2 || max_windows < 0) {
        usage(stderr);
        return 2;
    }
    struct inf_err err = {0};
    size_t text_len = 0;
    char *text = read_file(text_path, &text_len);
    if (!text) {
        fprintf(stderr, "int4serve-perplexity: cannot read %s\n", text_path);
        return 1;
    }
    tok_tokenizer_t *tok = NULL;
    struct tok_ids ids = {0};
    struct eng_backend *be = NULL;
    eng_model_t *m = NULL;
    int32_t *win = NULL;
    int rc = 1;
    struct tok_encode_opts eo = tok_encode_defaults();
    eo.add_special = false;
    if (tok_load(model, &tok, &err) != INF_OK ||
        tok_encode(tok, text, text_len, &eo, &ids, &err) != INF_OK) {
        fprintf(stderr, "int4serve-perplexity: %s\n", err.msg);
        goto out;
    }
    const int32_t bos = tok_bos_id(tok);
    size_t n_win = ids.n / (size_t)(ctx - 1);
    if (max_windows > 0 && (size_t)max_windows < n_win)
        n_win = (size_t)max_windows;
    if (bos < 0 || n_win == 0) {
        fprintf(stderr, "int4serve-perplexity: %s\n",
                bos < 0 ? "the tokenizer has no BOS token to start each window with"
                        : "the text is shorter than one window");
        goto out;
    }
    struct eng_model_opts mo = ma.mo;
    eng_greedy_size(&mo, 1, ctx, 1);
    if (tool_model_args_backend(&ma, &be, &err) != INF_OK ||
        eng_model_load(model, be, &mo, &m, &err) != INF_OK) {
        fprintf(stderr, "int4serve-perplexity: %s\n", err.msg);
        goto out;
    }
    const struct eng_model_config *cfg = eng_model_config(m);
    if (ctx > cfg->max_pos) {
        fprintf(stderr, "int4serve-perplexity: --ctx %d is longer than the model's %d positions\n",
                ctx, cfg->max_pos);
        goto out;
    }
    if (!(win = malloc(sizeof *win * (size_t)ctx))) {
        fprintf(stderr, "int4serve-perplexity: out of memory\n");
        goto out;
    }
    struct score sc = {.win = win, .ctx = ctx, .vocab = cfg->vocab};
    const int32_t *const prompts[1] = {win};
    int32_t gen;
    struct eng_greedy g = {.n_seq = 1,
                           .prompts = prompts,
                           .n_prompt = &ctx,
                           .n_new = 1,
                           .all_logits0 = true,
                           .on_step = on_step,
                           .user = &sc};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t k = 0; k < n_win; k++) {
        win[0] = bos;
        memcpy(win + 1, ids.ids + k * (size_t)(ctx - 1), sizeof *win * (size_t)(ctx - 1));
        if (eng_greedy_run(m, &g, &gen, &err) != INF_OK) {
            fprintf(stderr, "int4serve-perplexity: window %zu: %s\n", k, err.msg);
            goto out;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double predicted = (double)n_win * (ctx - 1), nll = sc.nll / predicted;
    json_t *o =
        json_pack("{s:s, s:s, s:i, s:b, s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:f, s:f, s:f}", "model",
                  model, "quantization", quant_name(mo.quant), "group_size", mo.group_size,
                  "symmetric", mo.symmetric, "backend", ma.cuda ? "cuda" : "cpu", "kv_cache_dtype",
                  eng_kv_dtype_name(be->kv_dtype), "ctx", ctx, "windows", (json_int_t)n_win,
                  "predicted", (json_int_t)predicted, "tokens", (json_int_t)ids.n, "fnv1a32",
                  (json_int_t)fnv1a_ids(ids.ids, ids.n), "nll", nll, "ppl", exp(nll), "seconds",
                  (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    char *js = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    if (js) {
        puts(js);
        rc = 0;
    }
    free(js);
    json_decref(o);
out:
    free(win);
    eng_model_destroy(m);
    eng_backend_destroy(be);
    tok_ids_fini(&ids);
    tok_destroy(tok);
    free(text);
    return rc;
}
