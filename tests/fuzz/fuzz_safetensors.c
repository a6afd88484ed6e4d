/* libFuzzer target: the safetensors header parser and the whole-file parse
 * (8-byte length, JSON header, data area). Whatever the bytes, parsing must
 * answer with a status, never crash, and an accepted file's tensors must lie
 * inside the buffer without overlapping. */
#include "engine/weights/safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct inf_err err;
    struct eng_st_header *h = NULL;
    if (eng_st_buffer_parse(data, size, "fuzz.safetensors", &h, &err) == INF_OK) {
        const uint8_t *prev_end = NULL;
        for (int64_t i = 0; i < eng_st_header_count(h); i++) {
            const struct eng_st_tensor *t = eng_st_header_at(h, i);
            const uint8_t *p = t->data;
            if (p < data || p > data + size || t->nbytes > (size_t)(data + size - p))
                __builtin_trap();
            if (t->nbytes != (size_t)t->numel * eng_dtype_size(t->dtype))
                __builtin_trap();
            if (t->nbytes > 0) {
                if (prev_end && p < prev_end)
                    __builtin_trap();
                prev_end = p + t->nbytes;
            }
            float f[16];
            int64_t n = t->numel < 16 ? t->numel : 16;
            eng_st_read_f32(t, 0, n, f, &err);
            eng_st_read_f32(t, t->numel - n, n, f, &err);
        }
        eng_st_header_free(h);
    } else if (err.code == INF_OK || err.msg[0] == '\0') {
        __builtin_trap(); /* a refusal always says why */
    }
    /* The header parser alone: the first 8 bytes give the data length. */
    if (size >= 8) {
        uint64_t data_len;
        memcpy(&data_len, data, 8);
        if (eng_st_header_parse((const char *)data + 8, size - 8, data_len, "fuzz.safetensors", &h,
                                &err) == INF_OK)
            eng_st_header_free(h);
    }
    return 0;
}
