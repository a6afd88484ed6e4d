/* libFuzzer target: quantization_config (engine/weights/qconfig.c), read as a
 * whole config.json and as a quantize_config.json. Whatever the bytes, the
 * parser answers with a status and never crashes or leaks; an accepted
 * config answers layer queries with a method it parsed and a group size the
 * canonical INT4 form can hold. */
#include "engine/weights/qconfig.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const layers[] = {"model.layers.0.self_attn.q_proj",
                                     "model.layers.1.mlp.down_proj", "lm_head", ""};

static void check(const struct eng_qcfg *q)
{
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        struct eng_qlayer l;
        if (!eng_qcfg_layer(q, layers[i], &l))
            continue;
        if (l.method == ENG_QM_NONE || q->method == ENG_QM_NONE)
            __builtin_trap();
        if (!(l.group == -1 || l.group == 32 || l.group == 64 || l.group == 128 ||
              (l.group >= 256 && l.group % 256 == 0)))
            __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int whole = 0; whole < 2; whole++) {
        struct eng_qcfg q;
        struct inf_err err;
        if (eng_qcfg_parse((const char *)data, size, "config.json", whole, &q, &err) == INF_OK) {
            check(&q);
            eng_qcfg_free(&q);
        } else if (q.method != ENG_QM_NONE || q.groups || q.skip) {
            __builtin_trap(); /* a refusal leaves nothing behind */
        }
    }
    return 0;
}
