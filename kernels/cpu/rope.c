/* kernels/cpu/rope.c — rotary position embedding (kernels/rope.h). */
#include "kernels/rope.h"

#include <math.h>

void krn_rope_inv_freq(float theta, bool llama3, float factor, float low_freq, float high_freq,
                       int32_t orig_max_pos, int32_t head_dim, float *inv_freq)
{
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        /* As Hugging Face: exponent 2i/dim in fp32, power and reciprocal in fp32. */
        float e = (float)(2 * i) / (float)head_dim;
        float f = 1.0f / powf(theta, e);
        if (llama3) {
            float low_wavelen = (float)orig_max_pos / low_freq;
            float high_wavelen = (float)orig_max_pos / high_freq;
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / factor;
            } else if (!(wavelen < high_wavelen)) {
                float smooth = ((float)orig_max_pos / wavelen - low_freq) / (high_freq - low_freq);
                f = (1.0f - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

void krn_cpu_rope(float *x, int64_t ldx, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                  const float *inv_freq, int32_t r0, int32_t r1)
{
    int32_t half = head_dim / 2;
    float cs[256], sn[256]; /* head_dim <= 512 is checked by the caller */
    for (int32_t r = r0; r < r1; r++) {
        for (int32_t i = 0; i < half; i++) {
            float a = (float)pos[r] * inv_freq[i];
            cs[i] = cosf(a);
            sn[i] = sinf(a);
        }
        float *xr = x + r * ldx;
        for (int32_t h = 0; h < n_heads; h++) {
            float *hp = xr + (int64_t)h * head_dim;
            for (int32_t i = 0; i < half; i++) {
                float a = hp[i], b = hp[i + half];
                hp[i] = a * cs[i] - b * sn[i];
                hp[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}
