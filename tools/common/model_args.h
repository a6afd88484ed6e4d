#pragma once
/* tools/common/model_args.h — the flags every tool that loads a model takes:
 *   --quantization auto|int4|awq|gptq|compressed-tensors|none
 *   --group-size G (0 or -1: per-channel)  --symmetric  --no-fuse
 *   --threads T (CPU)  --backend cpu|cuda  --device N (CUDA)
 *   --kv-cache-dtype auto|fp8 (fp8: FP8 E4M3 KV pools, engine.kv_cache_dtype)
 *   --cuda-kernels auto|sm75 (sm75: the compute capability 7.5 paths on any
 *     GPU, engine.cuda_kernels)
 * One parser, so every tool spells and checks them alike. */
#include "engine/backend.h"
#include "engine/model.h"

#include <getopt.h>
#include <stdbool.h>

struct tool_model_args {
    struct eng_model_opts mo;
    int threads, device;
    bool cuda, kv_fp8, sm75;
};

/* getopt_long entries for the flags above, to put in a tool's option table;
 * their values are TOOL_ARG_FIRST and up, above any character a tool uses. */
enum { TOOL_ARG_FIRST = 0x100 };
/* (kept by hand: the formatter breaks the list's last entry apart) */
/* clang-format off */
#define TOOL_MODEL_LONGOPTS                                                                        \
    {"quantization", required_argument, 0, TOOL_ARG_FIRST + 0},                                    \
    {"group-size", required_argument, 0, TOOL_ARG_FIRST + 1},                                      \
    {"symmetric", no_argument, 0, TOOL_ARG_FIRST + 2},                                             \
    {"no-fuse", no_argument, 0, TOOL_ARG_FIRST + 3},                                               \
    {"threads", required_argument, 0, TOOL_ARG_FIRST + 4},                                         \
    {"backend", required_argument, 0, TOOL_ARG_FIRST + 5},                                         \
    {"device", required_argument, 0, TOOL_ARG_FIRST + 6},                                          \
    {"kv-cache-dtype", required_argument, 0, TOOL_ARG_FIRST + 7},                                  \
    {"cuda-kernels", required_argument, 0, TOOL_ARG_FIRST + 8}
/* clang-format on */
#define TOOL_MODEL_USAGE                                                                           \
    "       [--quantization auto|int4|awq|gptq|compressed-tensors|none]\n"                         \
    "       [--group-size G] [--symmetric] [--no-fuse]\n"                                          \
    "       [--threads T] [--backend cpu|cuda] [--device N] [--kv-cache-dtype auto|fp8]\n"         \
    "       [--cuda-kernels auto|sm75]\n"

/* The engine's defaults: AUTO (INT4), group 128, asymmetric, fused, CPU. */
void tool_model_args_init(struct tool_model_args *a);

/* Take getopt_long's result c with optarg arg: 1 when c is one of these
 * flags, 0 when it is not, -1 when its value is bad (said on stderr,
 * prefixed with prog). */
int tool_model_args_take(struct tool_model_args *a, int c, const char *arg, const char *prog);

/* The backend the flags ask for. */
inf_status_t tool_model_args_backend(const struct tool_model_args *a, struct eng_backend **be,
                                     struct inf_err *err);
