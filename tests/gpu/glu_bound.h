#pragma once
/* tests/gpu/glu_bound.h — how far a GLU output SiLU(g)·u, rounded to fp16,
 * can move when its g and u are each rounded to the other fp16 neighbour:
 * the bound the GPU tests allow between the fixed-point gate/up sums
 * (KRN_INT4_GEMM_ACC64, krn_int4_gemm_acc_reduce_glu) and the plain path. */
#include <math.h>

/* One fp16 step at |x| (the smallest normal's below it). */
static inline float glu_half_step(float x)
{
    int e = 0;
    frexpf(fabsf(x) < 6.1035e-5f ? 6.1035e-5f : fabsf(x), &e);
    return ldexpf(1.0f, e - 11);
}

/* |fp16(SiLU(g') u') - ref| for g', u' at most one step from the plain
 * path's fp16 g and u, ref = fp16(SiLU(g) u): the product's change (the
 * derivative of SiLU stays below 1.1) plus both outputs' rounding. A fixed
 * number of output steps is no bound: with |u| large and the output small,
 * one step of g moves the output by many of its own steps. g_min, u_min:
 * the least change of g and u to allow, where their sums may differ by
 * more than a step of a small g or u (fp32 sums whose terms cancel). */
static inline float glu_step_bound_floor(float g, float u, float ref, float g_min, float u_min)
{
    const float dg = fmaxf(glu_half_step(g), g_min), du = fmaxf(glu_half_step(u), u_min);
    const float silu = g / (1.0f + expf(-g));
    return 1.1f * fabsf(u) * dg + fabsf(silu) * du + 1.1f * dg * du + 2.0f * glu_half_step(ref);
}

static inline float glu_step_bound(float g, float u, float ref)
{
    return glu_step_bound_floor(g, u, ref, 0.0f, 0.0f);
}
