/*
 * int4_repack.c — the canonical INT4 form (kernels/q4.h) into the layout of
 * the CUDA INT4 GEMM (kernels/int4_gemm.h). Host code, run once per layer at
 * load; it needs no GPU, so the round trip is unit-tested in CI.
 *
 * The nibble order inside one lane's 16-byte word follows from how the kernel
 * turns codes into fp16 pairs (kernels/cuda/int4_gemm.cu, "Dequantization"):
 * a u32 word w yields four half2 values
 *     pair 0 = nibbles (0, 4)   from  (w      & 0x000f000f) | 0x64006400
 *     pair 1 = nibbles (1, 5)   from  (w      & 0x00f000f0) | 0x64006400
 *     pair 2 = nibbles (2, 6)   from  (w >> 8 & 0x000f000f) | 0x64006400
 *     pair 3 = nibbles (3, 7)   from  (w >> 8 & 0x00f000f0) | 0x64006400
 * (low half from the lower nibble). Word j of lane l feeds the B fragments of
 * the n8 tiles 2j and 2j+1 of a 64-column chunk: pair 0 / 1 are fragment 2j's
 * registers b0 (k = 2c, 2c+1) / b1 (k = 2c+8, 2c+9), pairs 2 / 3 fragment
 * 2j+1's, where c = l % 4 and the column within the n8 tile is l / 4, as the
 * mma.m16n8k16 B-operand layout defines.
 */
#include "kernels/int4_gemm.h"

#include <math.h>
#include <string.h>

#define SECTION_ALIGN 256

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

inf_status_t krn_int4_gemm_layout_make(const struct krn_q4_weight *w,
                                       struct krn_int4_gemm_layout *lay, struct inf_err *err)
{
    if (!w || !lay)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm layout: NULL argument");
    if (w->n < 1 || w->k < 1 || w->group < 1 || w->kp < w->k || w->kp % w->group != 0)
        return inf_err_set(err, INF_E_INVALID,
                           "int4 gemm layout: inconsistent weight n=%d k=%d kp=%d group=%d",
                           (int)w->n, (int)w->k, (int)w->kp, (int)w->group);
    bool per_channel = w->group == w->kp;
    if (!per_channel && w->group != 32 && w->group != 64 && w->group != 128 && w->group != 256)
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: group size %d not supported",
                           (int)w->group);
    /* Bound the sizes so every element offset fits the kernel's int64 and the
     * unit counts its int32 arithmetic. */
    if (w->n > (1 << 24) || w->kp > (1 << 24))
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: n=%d k=%d too large", (int)w->n,
                           (int)w->k);
    memset(lay, 0, sizeof *lay);
    lay->n = w->n;
    lay->k = w->k;
    lay->n_pad = (int32_t)align_up((size_t)w->n, KRN_INT4_GEMM_N_ALIGN);
    lay->k_pad = (int32_t)align_up((size_t)w->k, KRN_INT4_GEMM_K_ALIGN);
    lay->group = w->group;
    lay->symmetric = w->symmetric;
    if (per_channel) {
        lay->group_steps = lay->k_pad / 16;
        lay->groups = 1;
    } else {
        lay->group_steps = w->group / 16;
        lay->groups = (lay->k_pad + w->group - 1) / w->group;
    }
    size_t q_bytes = (size_t)lay->n_pad * (size_t)lay->k_pad / 2;
    size_t s_bytes = (size_t)lay->n_pad * (size_t)lay->groups * 2;
    lay->q_offset = 0;
    lay->scale_offset = align_up(q_bytes, SECTION_ALIGN);
    lay->zero_offset = align_up(lay->scale_offset + s_bytes, SECTION_ALIGN);
    lay->bytes =
        lay->symmetric ? lay->zero_offset : align_up(lay->zero_offset + s_bytes, SECTION_ALIGN);
    return INF_OK;
}

/* Canonical scale / zero of row n, kernel group g (0 / 8 past the canonical
 * groups, where only padding lives). */
static uint16_t canon_scale(const struct krn_q4_weight *w, int32_t n, int32_t g)
{
    if (g >= krn_q4_groups(w))
        return 0;
    return w->scale[(int64_t)n * krn_q4_groups(w) + g];
}

static uint16_t canon_zero(const struct krn_q4_weight *w, int32_t n, int32_t g)
{
    if (g >= krn_q4_groups(w))
        return 0x4800; /* 8.0 */
    return w->zero[(int64_t)n * krn_q4_groups(w) + g];
}

/* The code stored for (n, k): the canonical code inside the logical matrix,
 * else the group's zero point so the padding dequantizes to exactly 0. */
static unsigned code_at(const struct krn_q4_weight *w, const struct krn_int4_gemm_layout *lay,
                        int32_t n, int32_t k)
{
    if (n < w->n && k < w->k)
        return (unsigned)krn_q4_code(w, n, k);
    if (n >= w->n)
        return 8;
    int32_t g = lay->groups == 1 ? 0 : k / w->group;
    return (unsigned)inf_f16_to_f32(canon_zero(w, n, g));
}

/* Chunk (t, s) of the codes section, any tile: code_at for every nibble. */
static void chunk_slow(const struct krn_q4_weight *w, const struct krn_int4_gemm_layout *lay,
                       int32_t t, int32_t s, uint32_t *chunk)
{
    for (int lane = 0; lane < 32; lane++) {
        int r = lane / 4, c = lane % 4;
        for (int j = 0; j < 4; j++) {
            uint32_t word = 0;
            for (int nib = 0; nib < 8; nib++) {
                int p = nib % 4, odd = nib / 4;
                int frag = 2 * j + p / 2, hi8 = p % 2;
                int32_t n = t * 64 + frag * 8 + r;
                int32_t k = s * 16 + 2 * c + odd + 8 * hi8;
                word |= (code_at(w, lay, n, k) & 0xfu) << (4 * nib);
            }
            chunk[lane * 4 + j] = word;
        }
    }
}

/* Chunk (t, s) whose 64 rows and 16 k all lie inside the logical matrix:
 * the same words, from whole bytes. Codes k = 16s + 2c + 8h (low nibble)
 * and k + 1 (high nibble) are byte 8s + c + 4h of a row, so nibble p of a
 * word comes from the low nibble and nibble p + 4 from the high nibble of
 * byte c + 4 (p % 2) of row 8 (2j + p / 2) + r. */
static void chunk_fast(const struct krn_q4_weight *w, int32_t t, int32_t s, uint32_t *chunk)
{
    const uint8_t *rows[64];
    for (int i = 0; i < 64; i++)
        rows[i] = w->q + (int64_t)(t * 64 + i) * (w->kp / 2) + (int64_t)s * 8;
    for (int lane = 0; lane < 32; lane++) {
        int r = lane / 4, c = lane % 4;
        for (int j = 0; j < 4; j++) {
            uint32_t word = 0;
            for (int p = 0; p < 4; p++) {
                uint32_t b = rows[(2 * j + p / 2) * 8 + r][c + 4 * (p % 2)];
                word |= (b & 0xfu) << (4 * p) | (b >> 4) << (4 * (p + 4));
            }
            chunk[lane * 4 + j] = word;
        }
    }
}

inf_status_t krn_int4_gemm_repack_tiles(const struct krn_q4_weight *w,
                                        const struct krn_int4_gemm_layout *lay, void *dst,
                                        size_t dst_bytes, int32_t t0, int32_t t1,
                                        struct inf_err *err)
{
    if (!w || !lay || !dst || !w->q || !w->scale || !w->zero)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm repack: NULL argument");
    struct krn_int4_gemm_layout want;
    inf_status_t st = krn_int4_gemm_layout_make(w, &want, err);
    if (st != INF_OK)
        return st;
    if (memcmp(&want, lay, sizeof want) != 0)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm repack: layout is not this weight's");
    if (dst_bytes < lay->bytes)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm repack: buffer %zu bytes, need %zu",
                           dst_bytes, lay->bytes);
    const int32_t tiles = lay->n_pad / 64;
    if (t0 < 0 || t1 < t0 || t1 > tiles)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm repack: tiles [%d, %d) outside [0, %d)",
                           (int)t0, (int)t1, (int)tiles);
    /* Zero points: integers in [0, 15] (8 when symmetric), so that 1024 + z is
     * exact in fp16 and the kernel's subtraction is exact. */
    int32_t ng = krn_q4_groups(w);
    int64_t row0 = (int64_t)t0 * 64, row1 = (int64_t)t1 * 64 < w->n ? (int64_t)t1 * 64 : w->n;
    for (int64_t i = row0 * ng; i < row1 * ng; i++) {
        float z = inf_f16_to_f32(w->zero[i]);
        if (!(z >= 0.0f && z <= 15.0f) || z != floorf(z) || (w->symmetric && z != 8.0f))
            return inf_err_set(
                err, INF_E_UNSUPPORTED, "int4 gemm: zero point %g of row %lld is not %s", (double)z,
                (long long)(i / ng), w->symmetric ? "8 (symmetric)" : "an integer in [0, 15]");
    }
    uint8_t *base = dst;
    size_t q_bytes = (size_t)lay->n_pad * (size_t)lay->k_pad / 2;
    size_t s_bytes = (size_t)lay->n_pad * (size_t)lay->groups * 2;
    if (t1 == tiles) {
        /* The alignment gaps: every other byte of the buffer is written below. */
        memset(base + q_bytes, 0, lay->scale_offset - q_bytes);
        memset(base + lay->scale_offset + s_bytes, 0,
               lay->zero_offset - (lay->scale_offset + s_bytes));
        if (!lay->symmetric)
            memset(base + lay->zero_offset + s_bytes, 0, lay->bytes - (lay->zero_offset + s_bytes));
    }

    /* Codes: chunk (t, s) covers columns 64t..64t+63 and k 16s..16s+15. */
    uint32_t *q = (uint32_t *)(base + lay->q_offset);
    int32_t ksteps = lay->k_pad / 16;
    for (int32_t t = t0; t < t1; t++) {
        bool rows_in = (t + 1) * 64 <= w->n;
        for (int32_t s = 0; s < ksteps; s++) {
            uint32_t *chunk = q + ((int64_t)t * ksteps + s) * 128;
            if (rows_in && (s + 1) * 16 <= w->k)
                chunk_fast(w, t, s, chunk);
            else
                chunk_slow(w, lay, t, s, chunk);
        }
    }

    /* Scales and zeros: element r*8 + f of a 64-column row is column 8f + r,
     * so lane l (r = l/4) reads its eight fragments' values as one word. */
    uint16_t *sc = (uint16_t *)(base + lay->scale_offset);
    uint16_t *zr = lay->symmetric ? NULL : (uint16_t *)(base + lay->zero_offset);
    for (int32_t t = t0; t < t1; t++) {
        for (int32_t g = 0; g < lay->groups; g++) {
            for (int i = 0; i < 64; i++) {
                int r = i / 8, f = i % 8;
                int32_t n = t * 64 + f * 8 + r;
                int64_t o = ((int64_t)t * lay->groups + g) * 64 + i;
                sc[o] = n < w->n ? canon_scale(w, n, g) : 0;
                if (zr)
                    zr[o] = n < w->n ? canon_zero(w, n, g) : 0x4800;
            }
        }
    }
    return INF_OK;
}

inf_status_t krn_int4_gemm_repack(const struct krn_q4_weight *w,
                                  const struct krn_int4_gemm_layout *lay, void *dst,
                                  size_t dst_bytes, struct inf_err *err)
{
    if (!lay)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm repack: NULL argument");
    return krn_int4_gemm_repack_tiles(w, lay, dst, dst_bytes, 0, lay->n_pad / 64, err);
}

inf_status_t krn_q4_glu_interleave(const struct krn_q4_weight *src, struct krn_q4_weight *dst,
                                   struct inf_err *err)
{
    if (!src || !dst || !src->q || !dst->q || !src->scale || !dst->scale)
        return inf_err_set(err, INF_E_INVALID, "glu interleave: NULL argument");
    if (src->n != dst->n || src->k != dst->k || src->kp != dst->kp || src->group != dst->group ||
        src->symmetric != dst->symmetric || (!src->zero) != (!dst->zero))
        return inf_err_set(err, INF_E_INVALID, "glu interleave: shapes differ");
    if (src->n % 16 != 0 || src->group < 1 || src->kp % src->group != 0)
        return inf_err_set(err, INF_E_INVALID, "glu interleave: n=%d not a multiple of 16",
                           (int)src->n);
    const int32_t dim = src->n / 2, groups = src->kp / src->group;
    const size_t qrow = (size_t)src->kp / 2, srow = (size_t)groups * sizeof(uint16_t);
    for (int32_t r = 0; r < src->n; r++) {
        /* destination row r: run r / 16, gate (r % 16 < 8) or up */
        const int32_t j = (r / 16) * 8 + r % 8, from = (r % 16 < 8) ? j : dim + j;
        memcpy(dst->q + (size_t)r * qrow, src->q + (size_t)from * qrow, qrow);
        memcpy(dst->scale + (size_t)r * groups, src->scale + (size_t)from * groups, srow);
        if (src->zero)
            memcpy(dst->zero + (size_t)r * groups, src->zero + (size_t)from * groups, srow);
    }
    return INF_OK;
}
