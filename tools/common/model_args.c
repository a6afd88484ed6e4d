/* tools/common/model_args.c — see model_args.h. */
#include "tools/common/model_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tool_model_args_init(struct tool_model_args *a)
{
    memset(a, 0, sizeof *a);
    eng_model_opts_default(&a->mo);
}

static const struct {
    const char *name;
    enum eng_quant q;
} quants[] = {{"auto", ENG_QUANT_AUTO},
              {"int4", ENG_QUANT_INT4},
              {"awq", ENG_QUANT_AWQ},
              {"gptq", ENG_QUANT_GPTQ},
              {"compressed-tensors", ENG_QUANT_CT},
              {"none", ENG_QUANT_NONE}};

int tool_model_args_take(struct tool_model_args *a, int c, const char *arg, const char *prog)
{
    switch (c - TOOL_ARG_FIRST) {
    case 0:
        for (size_t i = 0; i < sizeof quants / sizeof quants[0]; i++)
            if (strcmp(arg, quants[i].name) == 0) {
                a->mo.quant = quants[i].q;
                return 1;
            }
        fprintf(stderr,
                "%s: --quantization must be auto, int4, awq, gptq, compressed-tensors or "
                "none\n",
                prog);
        return -1;
    case 1:
        a->mo.group_size = atoi(arg);
        if (a->mo.group_size == -1) /* -1 or 0: per-channel */
            a->mo.group_size = 0;
        return 1;
    case 2:
        a->mo.symmetric = true;
        return 1;
    case 3:
        a->mo.fuse_qkv = false;
        return 1;
    case 4:
        a->threads = atoi(arg);
        if (a->threads < 0) {
            fprintf(stderr, "%s: --threads must be 0 or more\n", prog);
            return -1;
        }
        return 1;
    case 5:
        if (strcmp(arg, "cpu") != 0 && strcmp(arg, "cuda") != 0) {
            fprintf(stderr, "%s: --backend must be cpu or cuda\n", prog);
            return -1;
        }
        a->cuda = strcmp(arg, "cuda") == 0;
        return 1;
    case 7:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "fp16") != 0 && strcmp(arg, "fp8") != 0) {
            fprintf(stderr, "%s: --kv-cache-dtype must be auto, fp16 or fp8\n", prog);
            return -1;
        }
        a->kv_fp8 = strcmp(arg, "fp8") == 0;
        return 1;
    case 8:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "sm75") != 0) {
            fprintf(stderr, "%s: --cuda-kernels must be auto or sm75\n", prog);
            return -1;
        }
        a->sm75 = strcmp(arg, "sm75") == 0;
        return 1;
    case 6:
        a->device = atoi(arg);
        if (a->device < 0) {
            fprintf(stderr, "%s: --device must be 0 or more\n", prog);
            return -1;
        }
        return 1;
    default:
        return 0;
    }
}

inf_status_t tool_model_args_backend(const struct tool_model_args *a, struct eng_backend **be,
                                     struct inf_err *err)
{
    if (a->cuda) {
        struct eng_backend_cuda_opts co = {
            .device = a->device, .kv_fp8 = a->kv_fp8, .sm75 = a->sm75};
        return eng_backend_cuda_create(&co, be, err);
    }
    struct eng_backend_cpu_opts bo = {.n_threads = a->threads, .kv_fp8 = a->kv_fp8};
    return eng_backend_cpu_create(&bo, be, err);
}
