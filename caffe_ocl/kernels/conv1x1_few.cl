/* 1x1 convolutions (stride 1, no padding, one group) with few outputs, on
 * GPUs: y[n][m][p] = act(sum_k W[m][k] x[n][k][p] + bias[m] + r[n][m][p]).
 *
 * Why: at batch 1 a 1x1 layer on a 7 x 7 or 14 x 14 plane is an M x 49..196
 * product. The tile kernels make 1-8 work-groups of it (ShuffleNet v2's 232
 * -> 232 at 7 x 7: four 64 x 64 tiles on the H200's 132 compute units),
 * each walking K in steps of 16 with a global-memory wait per step: ~21 us
 * for 5 MFLOP. Here a work-group takes MB output channels of PB pixels of
 * one image and splits K over SL slices of work-items (k = s, s + SL, ...),
 * so a layer makes M / MB * HW / PB work-groups whose work-items each walk
 * K / SL steps with MB independent sums; the block of weights goes through
 * local memory (read once per work-group, broadcast to its work-items),
 * the input straight from global memory (each value read by one work-item
 * of the group, coalesced over pixels). The SL partial sums of a result
 * are added in slice order: the same rounding whatever the batch.
 *
 * Work-group (PB * SL, 1, 1); groups (ceil(HW / PB), ceil(M / MB), images).
 * y_off / ych: the output images lie ych * HW floats apart from y_off (a
 * slice of a Concat's top); R (RESIDUAL 1) is laid out as y.
 * GATE 1: the input channels scaled by a gate first, x[n][k][p] * G[n *
 * gstride + k] (an SE block's channel scale before its projection,
 * plan/se.py, plan/residual.py; gstride 0: one gate for every image),
 * applied to the block of weights as it goes to local memory.
 * DWP 1: x is not read; its values are a depthwise convolution's output
 * computed where they are loaded, x[n][k][p] = DW_ACT(sum_taps Wd[k][t] *
 * Xd[n][k][pixel p's tap t] (+ Bd[k])) over the DKH x DKW taps (stride,
 * padding, dilation DSH, DSW, DPH, DPW, DDH, DDW) of Xd's DIH x DIW planes;
 * the output plane is DOW wide (plan/dw_pointwise.py: a depthwise layer and
 * the 1x1 layer reading it as one launch at batch 1, where a launch costs
 * more than the depthwise sums each block of output channels repeats). */
#include "common.h"
#include "act.h"

#ifndef MB
#define MB 8
#endif
#ifndef PB
#define PB 64
#endif
#ifndef SL
#define SL 4
#endif
#ifndef KC
#define KC 256          /* weights in local memory per step: MB x KC floats */
#endif
#ifndef XB
#define XB 8            /* loads of x in flight per work-item */
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#ifndef GATE
#define GATE 0
#endif
#ifndef DWP
#define DWP 0
#endif

#if DWP
#ifndef DBIAS
#define DBIAS 0
#endif
#ifndef DACT
#define DACT 0
#endif
/* the depthwise layer's activation (act.h's kinds, its own arguments) */
#if DACT == 0
#define DW_ACT(v) (v)
#elif DACT == 1
#define DW_ACT(v) ((v) > 0.0f ? (v) : dact_a * (v))
#elif DACT == 2
#define DW_ACT(v) fmax(dact_a, fmin(dact_b, (v)))
#elif DACT == 3
#define DW_ACT(v) ((v) / (1.0f + ACT_EXP(-dact_a * (v))))
#elif DACT == 4
#define DW_ACT(v) (1.0f / (1.0f + ACT_EXP(-(v))))
#elif DACT == 5
#define DW_ACT(v) ((v) * fmax(0.0f, fmin(1.0f, dact_a * (v) + dact_b)))
#elif DACT == 6
#define DW_ACT(v) fmax(0.0f, fmin(1.0f, dact_a * (v) + dact_b))
#else
#error "DACT: an act.h kind, 0-6"
#endif
/* channel k of the depthwise output at the output pixel whose first tap
 * row / column are iy0, ix0 (taps outside the plane are zero padding) */
#define DW_VALUE(k) dw_value(xd, Wd, Bd, (k), iy0, ix0, dact_a, dact_b)
inline float dw_value(__global const float* xd, __global const float* Wd,
                      __global const float* Bd, int k, int iy0, int ix0,
                      float dact_a, float dact_b) {
    __global const float* xp = xd + (size_t)k * (DIH * DIW);
    __global const float* wp = Wd + k * (DKH * DKW);
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < DKH; ++i) {
        const int iy = iy0 + i * DDH;
        if (iy < 0 || iy >= DIH) continue;
#pragma unroll
        for (int j = 0; j < DKW; ++j) {
            const int ix = ix0 + j * DDW;
            if (ix >= 0 && ix < DIW) v = fma(wp[i * DKW + j], xp[iy * DIW + ix], v);
        }
    }
#if DBIAS
    v += Bd[k];
#endif
    return DW_ACT(v);
}
#endif

__kernel __attribute__((reqd_work_group_size(PB * SL, 1, 1)))
void conv1x1_few(int M, int K, int HW, __global const float* X, __global const float* Wt,
                 __global float* Y, int y_off, int ych, __global const float* bias,
                 float act_a, float act_b, __global const float* R,
                 __global const float* G, int gstride, __global const float* Xd,
                 __global const float* Wd, __global const float* Bd, float dact_a,
                 float dact_b) {
    __local float ws[MB * KC];
    __local float part[SL * MB * PB];
    const int lid = get_local_id(0);
    const int p = lid % PB, s = lid / PB;
    const int n = get_group_id(0) * PB + p;
    const int m0 = get_group_id(1) * MB;
    const int img = get_group_id(2);
    const int pok = n < HW;
    __global const float* x = X + (size_t)img * K * HW + (pok ? n : 0);
#if DWP
    __global const float* xd = Xd + (size_t)img * K * (DIH * DIW);
    const int oy = (pok ? n : 0) / DOW, ox = (pok ? n : 0) - oy * DOW;
    const int iy0 = oy * DSH - DPH, ix0 = ox * DSW - DPW;
#define X_AT(k) DW_VALUE(k)
#else
#define X_AT(k) x[(size_t)(k) * HW]
#endif

    float acc[MB];
#pragma unroll
    for (int j = 0; j < MB; ++j) acc[j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int kc = min(KC, K - k0);
        barrier(CLK_LOCAL_MEM_FENCE);           /* the previous block's readers are done */
        for (int i = lid; i < MB * KC; i += PB * SL) {
            const int j = i / KC, k = i - j * KC;
#if GATE
            ws[i] = (m0 + j < M && k < kc)
                ? Wt[(size_t)(m0 + j) * K + k0 + k] * G[(size_t)img * gstride + k0 + k] : 0.0f;
#else
            ws[i] = (m0 + j < M && k < kc) ? Wt[(size_t)(m0 + j) * K + k0 + k] : 0.0f;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        int k = s;
        /* XB loads of x issued before their products: each is a wait on L2
         * of several hundred cycles, and a work-item walks up to MAX_STEPS
         * of them, so they go out together (same order of sums) */
        for (; k + (XB - 1) * SL < kc; k += XB * SL) {
            float xv[XB];
#pragma unroll
            for (int u = 0; u < XB; ++u) xv[u] = pok ? X_AT(k0 + k + u * SL) : 0.0f;
#pragma unroll
            for (int u = 0; u < XB; ++u) {
#pragma unroll
                for (int j = 0; j < MB; ++j) acc[j] = fma(ws[j * KC + k + u * SL], xv[u], acc[j]);
            }
        }
        for (; k < kc; k += SL) {
            const float xv = pok ? X_AT(k0 + k) : 0.0f;
#pragma unroll
            for (int j = 0; j < MB; ++j) acc[j] = fma(ws[j * KC + k], xv, acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < MB; ++j) part[(s * MB + j) * PB + p] = acc[j];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int o = lid; o < MB * PB; o += PB * SL) {
        const int j = o / PB, q = o - j * PB;
        const int m = m0 + j, nq = get_group_id(0) * PB + q;
        if (m >= M || nq >= HW) continue;
        float v = part[j * PB + q];
#pragma unroll
        for (int t = 1; t < SL; ++t) v += part[(t * MB + j) * PB + q];
#if BIAS
        v += bias[m];
#endif
        const size_t at = (size_t)y_off + (size_t)img * ych * HW + (size_t)m * HW + nq;
#if RESIDUAL
        v += R[at];
#endif
        Y[at] = APPLY_ACT_CH(v, PRELU_SLOPE(bias, m));
    }
}
