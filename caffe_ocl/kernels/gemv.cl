/* C = act(alpha * A B^T + bias + beta * C) for few rows on GPUs (a
 * fully-connected layer at batch 1-8: a matrix-vector product bound by
 * reading its weight once): A [GV_M][K] (lda), B [N][K] (ldb: the layer's
 * weight), C [GV_M][N] (ldc). The tiled GEMM spent a 64-row tile on one
 * row of A and few work-groups per column tile (AlexNet's fc6 at batch 1).
 *
 * Work-groups of GV_WG work-items, GV_T of them per column n (a row of B),
 * GV_WG / GV_T columns per group. Each work-item walks its row of B with a
 * stride of GV_T (float4s when GV_VEC: rows and offsets on 16 bytes), so a
 * warp reads consecutive 16-byte words (coalesced), multiplying each by the
 * same words of A's GV_M rows (read through the cache: every column reads
 * them); the GV_T partial sums are added in local memory. BIAS: 0 none,
 * 1 per row of C, 2 per column (ops.gemm's convention); ACT: act.h. */
#include "common.h"
#include "act.h"

#ifndef GV_M
#define GV_M 1
#endif
#ifndef GV_T
#define GV_T 64
#endif
#ifndef GV_WG
#define GV_WG 256
#endif
#ifndef GV_VEC
#define GV_VEC 0
#endif
#ifndef BIAS
#define BIAS 0
#endif
#define GV_COLS (GV_WG / GV_T)

__kernel __attribute__((reqd_work_group_size(GV_WG, 1, 1)))
void gemv_t(int N, int K, float alpha,
            __global const float* A, int off_a, int lda,
            __global const float* B, int off_b, int ldb, float beta,
            __global float* C, int off_c, int ldc,
            __global const float* bias, float act_a, float act_b) {
    __local float red[GV_M * GV_WG];
    const int lid = get_local_id(0);
    const int t = lid % GV_T, r = lid / GV_T;
    const int n = get_group_id(0) * GV_COLS + r;
    float acc[GV_M];
#pragma unroll
    for (int m = 0; m < GV_M; ++m) acc[m] = 0.0f;
    if (n < N) {
        __global const float* a = A + off_a;
        __global const float* b = B + off_b + (size_t)n * ldb;
        int k0 = 0;
#if GV_VEC
        const int K4 = K / 4;
        __global const float4* b4 = (__global const float4*)b;
#pragma unroll 4
        for (int k = t; k < K4; k += GV_T) {
            const float4 bv = b4[k];
#pragma unroll
            for (int m = 0; m < GV_M; ++m) {
                const float4 av = ((__global const float4*)(a + m * lda))[k];
                acc[m] = fma(bv.x, av.x, acc[m]);
                acc[m] = fma(bv.y, av.y, acc[m]);
                acc[m] = fma(bv.z, av.z, acc[m]);
                acc[m] = fma(bv.w, av.w, acc[m]);
            }
        }
        k0 = K4 * 4;
#endif
        for (int k = k0 + t; k < K; k += GV_T) {
            const float bv = b[k];
#pragma unroll
            for (int m = 0; m < GV_M; ++m) acc[m] = fma(bv, a[m * lda + k], acc[m]);
        }
    }
#pragma unroll
    for (int m = 0; m < GV_M; ++m) red[m * GV_WG + lid] = acc[m];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GV_T / 2; s > 0; s >>= 1) {
        if (t < s) {
#pragma unroll
            for (int m = 0; m < GV_M; ++m) red[m * GV_WG + lid] += red[m * GV_WG + lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (n < N && t < GV_M) {
        const int m = t;
        float v = alpha * red[m * GV_WG + r * GV_T];
#if BIAS == 1
        v += bias[m];
#elif BIAS == 2
        v += bias[n];
#endif
        __global float* c = C + off_c + m * ldc + n;
        if (beta != 0.0f) v += beta * *c;
#if BIAS == 2
        *c = APPLY_ACT_CH(v, PRELU_SLOPE(bias, n));
#else
        *c = APPLY_ACT_CH(v, PRELU_SLOPE(bias, m));
#endif
    }
}
