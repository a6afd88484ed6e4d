#pragma once
/* kernels/cuda/attn_decode.cuh — the tensor-core decode kernel of paged
 * attention (attn_decode.cu), as attention.cu's launcher sees it. Internal to
 * kernels/cuda. */
#include "kernels/attn_cuda.h"

#include <cuda_runtime.h>

namespace krnattn
{

constexpr int kDecodeRows = 16;       /* query rows per item: the mma's M */
constexpr int kDecodeTile = 16;       /* keys per pipeline stage */
constexpr int kDecodeMaxSplits = 256; /* splits a group may have */

/* Compiled configurations (warps per block x pipeline stages per warp). */
int decode_variant_count();
const char *decode_variant_name(int v);
/* Configuration v runs on the current device's kernels (the sm_75 paths
 * take only their own, krncuda::sm75_paths()). */
bool decode_variant_runs(int v);
/* The configuration chosen automatically for padded head_dim hdp, for a
 * decode step of row_sets items before any split (kDecodeRows query rows
 * of one KV head each; 0: not known). */
int decode_variant_auto(int hdp, long long row_sets, bool fp8);
/* Fewest keys worth a split of their own: one tile a warp, NW * kDecodeTile. */
int decode_split_keys(int v);
/* Resident blocks per SM of configuration v for hdp on the current device
 * (raises the kernel's shared-memory limit first; cached per device). */
cudaError_t decode_ctas_per_sm(int hdp, int v, bool fp8, int *out);
/* Launch configuration v for hdp (64 or 128) over p's items (its fp16 or,
 * p.kv_fp8, its E4M3 kernel). */
cudaError_t decode_launch(const krn_cuda_attn_params &p, int hdp, int v, cudaStream_t s);

} // namespace krnattn
