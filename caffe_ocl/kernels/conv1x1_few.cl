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
 * applied to the block of weights as it goes to local memory. */
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

__kernel __attribute__((reqd_work_group_size(PB * SL, 1, 1)))
void conv1x1_few(int M, int K, int HW, __global const float* X, __global const float* Wt,
                 __global float* Y, int y_off, int ych, __global const float* bias,
                 float act_a, float act_b, __global const float* R,
                 __global const float* G, int gstride) {
    __local float ws[MB * KC];
    __local float part[SL * MB * PB];
    const int lid = get_local_id(0);
    const int p = lid % PB, s = lid / PB;
    const int n = get_group_id(0) * PB + p;
    const int m0 = get_group_id(1) * MB;
    const int img = get_group_id(2);
    const int pok = n < HW;
    __global const float* x = X + (size_t)img * K * HW + (pok ? n : 0);

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
            for (int u = 0; u < XB; ++u) xv[u] = pok ? x[(size_t)(k0 + k + u * SL) * HW] : 0.0f;
#pragma unroll
            for (int u = 0; u < XB; ++u) {
#pragma unroll
                for (int j = 0; j < MB; ++j) acc[j] = fma(ws[j * KC + k + u * SL], xv[u], acc[j]);
            }
        }
        for (; k < kc; k += SL) {
            const float xv = pok ? x[(size_t)(k0 + k) * HW] : 0.0f;
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
        Y[at] = APPLY_ACT(v);
    }
}
