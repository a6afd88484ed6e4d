#pragma once
/* The demo model's held-out perplexity, as the CPU test
 * (tests/tools/test_demo_model.c) and the GPU test (tests/gpu/gpu_quality.c)
 * both measure it: int4serve-perplexity over tests/fixtures/kjv_heldout.txt,
 * 16 windows of 256 tokens, against the fp32 figure transformers gave when
 * the model was trained (models/kjv-demo/reference.json,
 * "ctx256_windows16"). Each INT4 setting may lose at most its bound:
 * ppl / ppl_fp32 - 1 <= bound. The bounds are what the CPU measured on
 * these 4080 ids (docs/QUALITY.md: +0.37% to +0.91%, one setting -0.10%)
 * plus about half a point: a quantization that went wrong costs far more
 * (rounding to the wrong code, a scale off by a group, a lost zero point
 * each cost tens of percent), while the order between settings on so few
 * ids is within noise. The GPU adds GPU_QUALITY_MARGIN for fp16
 * activations. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUALITY_CTX 256
#define QUALITY_WINDOWS 16
#define QUALITY_FP32_TOL 1e-4 /* relative, fp32 CPU against transformers fp32 */
#define QUALITY_FP16_TOL 1e-3 /* relative, fp16 GPU against transformers fp32 */
/* What an FP8 E4M3 KV cache may add to the same weights' perplexity, relative
 * (measured on the CPU on these ids: +0.12% for fp32 weights, +0.14% for
 * INT4 group 128) */
#define QUALITY_FP8_KV_BOUND 0.005

struct quality_case {
    int group; /* 0: per-channel */
    bool symmetric;
    double bound; /* largest ppl / ppl_fp32 - 1 */
};

static const struct quality_case quality_cases[] = {
    {128, false, 0.010}, {128, true, 0.012}, {64, false, 0.011}, {64, true, 0.010},
    {32, false, 0.010},  {32, true, 0.005},  {0, false, 0.015},  {0, true, 0.012},
};
#define QUALITY_N_CASES ((int)(sizeof quality_cases / sizeof quality_cases[0]))

/* What one int4serve-perplexity run printed. */
struct quality_run {
    double ppl;
    long tokens, predicted, fnv1a32;
};

/* Run the perplexity tool of build dir bd on the demo model of source dir
 * sd with extra flags; false when it fails or prints no JSON object. */
static bool quality_run_tool(const char *bd, const char *sd, const char *flags,
                             struct quality_run *out)
{
    char cmd[2048], buf[4096];
    snprintf(cmd, sizeof cmd,
             "%s/tools/perplexity/int4serve-perplexity --model %s/models/kjv-demo "
             "--text %s/tests/fixtures/kjv_heldout.txt --ctx %d --windows %d %s 2>/dev/null",
             bd, sd, sd, QUALITY_CTX, QUALITY_WINDOWS, flags);
    FILE *p = popen(cmd, "r");
    if (!p)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    if (pclose(p) != 0)
        return false;
    json_t *o = json_loads(buf, 0, NULL);
    if (!o)
        return false;
    out->ppl = json_real_value(json_object_get(o, "ppl"));
    out->tokens = (long)json_integer_value(json_object_get(o, "tokens"));
    out->predicted = (long)json_integer_value(json_object_get(o, "predicted"));
    out->fnv1a32 = (long)json_integer_value(json_object_get(o, "fnv1a32"));
    json_decref(o);
    return out->ppl > 0;
}

/* reference.json of the demo model in source dir sd (json_decref it). */
static json_t *quality_reference(const char *sd)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/kjv-demo/reference.json", sd);
    return json_load_file(path, 0, NULL);
}

/* The fp32 perplexity transformers gave over the windows this test scores. */
static double quality_ref_ppl(const json_t *ref)
{
    char key[64];
    snprintf(key, sizeof key, "ctx%d_windows%d", QUALITY_CTX, QUALITY_WINDOWS);
    return json_real_value(
        json_object_get(json_object_get(json_object_get(ref, "perplexity"), key), "ppl_fp32"));
}
