/*
 * int4_gemm.cu — krn_int4_gemm (kernels/int4_gemm.h): C[M,N] = A[M,K] ·
 *          dequant(W)[N,K]ᵀ (+ bias), A and C fp16 row-major, W repacked by
 *          krn_int4_gemm_repack().
 * Launcher validates the arguments, asks the weight's plan which
 *          configuration and grid this launch takes (krn_int4_gemm_choose,
 *          kernels/int4_gemm_policy.c: plain C, no device or occupancy
 *          query) and launches it on the caller's stream, with programmatic
 *          dependent launch where the plan says (sm_90 and newer).
 * Families each in its file, configurations named in
 *          kernels/int4_gemm_configs.h:
 *            int4_gemm_sm80.cu       mma.sync pipeline, persistent (sm_80+)
 *            int4_gemm_stream.cu     one round of loads a block, M <= 8
 *            sm90/int4_gemm_sm90.cu  wgmma, persistent (sm_90a)
 *            int4_gemm_sm75.cu       the Turing fallback
 *          The fixed-point words' readers are int4_gemm_words.cu, the fp16
 *          dequantization int4_gemm_dequant.cu.
 * Device   krn_cuda_device_describe (device.cu) runs each family's prepare
 *          once per device: the kernels' shared-memory limits raised, their
 *          residency measured for the plans.
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/int4_gemm.h"
#include "kernels/int4_gemm_policy.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

using namespace int4gemm;

static_assert(krncuda::kAcc64MaxParts == KRN_INT4_GEMM_ACC64_MAX_PARTS,
              "the policy's bound on a word's contributions is the fixed point's");

/* The plan was made for this layout. */
static bool plan_matches(const krn_int4_gemm_plan *pl, const krn_int4_gemm_layout *lay)
{
    return pl->n == lay->n && pl->k == lay->k && pl->n_pad == lay->n_pad &&
           pl->k_pad == lay->k_pad && pl->group_steps == lay->group_steps &&
           pl->groups == lay->groups && pl->symmetric == lay->symmetric;
}

/* The caller's fixed-point words and the words to zero (KRN_INT4_GEMM_ACC64). */
static AccParams acc_params_of(const krn_int4_gemm_args *args)
{
    AccParams x = {};
    x.acc = reinterpret_cast<long long *>(args->acc);
    x.acc_clear = reinterpret_cast<long long *>(args->acc_clear);
    x.acc_clear_n = args->acc_clear ? args->acc_clear_words : 0;
    return x;
}

extern "C" inf_status_t krn_int4_gemm(const struct krn_int4_gemm_args *args, struct inf_err *err)
{
    if (!args || !args->lay || !args->plan)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: NULL arguments");
    const krn_int4_gemm_layout *lay = args->lay;
    if (args->m < 0)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: m=%d", (int)args->m);
    if (args->acc_taken)
        *args->acc_taken = 0; /* C written, unless the launch below takes acc */
    if ((args->flags & KRN_INT4_GEMM_ACC64) &&
        (!args->acc || (uintptr_t)args->acc % 8 || (uintptr_t)args->acc_clear % 8 ||
         args->acc_clear_words < 0))
        return inf_err_set(err, INF_E_INVALID,
                           "int4 gemm: KRN_INT4_GEMM_ACC64 needs 8-byte aligned acc and acc_clear");
    if (args->m == 0)
        return INF_OK;
    if (!args->a || !args->b || !args->c || !args->workspace)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: NULL device pointer");
    if ((uintptr_t)args->workspace % 16)
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: workspace not 16-byte aligned");
    if (!krn_int4_gemm_layout_ok(lay))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: layout n=%d k=%d n_pad=%d k_pad=%d group_steps=%d not "
                           "supported by this build",
                           (int)lay->n, (int)lay->k, (int)lay->n_pad, (int)lay->k_pad,
                           (int)lay->group_steps);
    if (!plan_matches(args->plan, lay))
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: the plan is another layout's");
    if ((uintptr_t)args->b % 16 || (uintptr_t)args->a % 2 || (uintptr_t)args->c % 2 ||
        (uintptr_t)args->bias % 2)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: misaligned pointer (weights need 16 bytes, fp16 2)");
    if (args->m > (1 << 24))
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: m=%d too large", (int)args->m);
    const bool glu = (args->flags & KRN_INT4_GEMM_GLU) != 0;
    if (glu && (lay->n % 16 || (uintptr_t)args->c % 4))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: GLU output needs n %% 16 == 0 (n=%d) and C 4-byte aligned",
                           (int)lay->n);

    const bool a_rows16 = lay->k % 8 == 0 && (uintptr_t)args->a % 16 == 0;
    const krn_int4_gemm_call call = {args->m,
                                     args->flags,
                                     args->config,
                                     !!args->bias,
                                     a_rows16,
                                     (uintptr_t)args->a % 4 == 0,
                                     args->workspace_bytes};
    krn_int4_gemm_choice ch;
    inf_status_t st = krn_int4_gemm_choose(args->plan, &call, &ch, err);
    if (st != INF_OK)
        return st;

    Params p = params_of(lay, args->b);
    p.a = reinterpret_cast<const half *>(args->a);
    p.bias = reinterpret_cast<const half *>(args->bias);
    p.c = reinterpret_cast<half *>(args->c);
    p.m = args->m;
    p.c_vec = lay->n % 2 == 0 && (uintptr_t)args->c % 4 == 0;
    p.m_tiles = ch.m_tiles;
    p.n_tiles = ch.n_tiles;
    p.k_tiles = ch.k_tiles;
    p.units = ch.units;
    p.slot_rows = ch.slot_rows;
    /* Workspace: the counters first, then the stream kernel's words, then
     * the persistent kernels' partial tiles (KRN_INT4_GEMM_FIXED_BYTES on). */
    unsigned char *ws = static_cast<unsigned char *>(args->workspace);
    p.counters = reinterpret_cast<int *>(ws);
    p.partials = reinterpret_cast<float *>(ws + (ch.family == KRN_INT4_GEMM_FAMILY_STREAM
                                                     ? KRN_INT4_GEMM_COUNTER_BYTES
                                                     : KRN_INT4_GEMM_FIXED_BYTES));
    const AccParams x = ch.words ? acc_params_of(args) : AccParams{};
    cudaStream_t stream = static_cast<cudaStream_t>(args->stream);
    const bool pdl = args->plan->pdl;

    cudaError_t e = cudaSuccess;
    const char *family = "";
    switch (ch.family) {
    case KRN_INT4_GEMM_FAMILY_SM75:
        family = " (sm75)";
        e = launch_sm75(p, glu, stream);
        break;
    case KRN_INT4_GEMM_FAMILY_STREAM:
        family = " (stream)";
        e = launch_stream(p, x, ch.config - KRN_INT4_GEMM_STREAM_FIRST, ch.out, pdl, stream);
        break;
    case KRN_INT4_GEMM_FAMILY_SM90:
        family = " (sm90)";
#ifdef INT4SERVE_GEMM_SM90
        e = launch_sm90(p, ch.config - KRN_INT4_GEMM_SM90_FIRST, ch.grid, glu, pdl, stream);
#else
        e = cudaErrorNotSupported; /* plans on this build never have wgmma */
#endif
        break;
    case KRN_INT4_GEMM_FAMILY_SM80:
        e = launch_sm80(p, x, ch.config - KRN_INT4_GEMM_SM80_FIRST, a_rows16, ch.swapped, glu,
                        ch.words, ch.grid, pdl, stream);
        break;
    }
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm%s: %s", family, cudaGetErrorString(e));
    if (args->acc_taken)
        *args->acc_taken = ch.words;
    return INF_OK;
}
