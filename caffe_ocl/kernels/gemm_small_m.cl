/* C = act(alpha * A B^T + bias + beta * C) for few rows (CPU drivers):
 * A [M][K] (lda), B [N][K] (ldb: a fully-connected layer's weight), C
 * [M][N] (ldc), M <= SM_MAXM. A fully-connected layer at a small batch
 * streams its weight once; the packed-panel GEMM (gemm_cpu.cl) packs all of
 * B into local memory for only M uses of each element, and ran AlexNet's
 * fc6/fc7 at batch 16 at ~4 GB/s of weight.
 *
 * One work-item per run of ``per`` columns (rows of B). Per 4 rows of B and
 * a K chunk of SM_KB floats (32 KiB of B, in L1/L2), pairs of A rows are
 * multiplied against them with 8 float8 accumulators; the chunk's sums are
 * added into a private per-(row, column) total. BIAS: 0 none, 1 per row of
 * C, 2 per column (ops.gemm's convention); ACT: act.h. */
#include "common.h"
#include "act.h"

#ifndef SM_MAXM
#define SM_MAXM 32
#endif
#ifndef SM_KB
#define SM_KB 2048
#endif
#ifndef BIAS
#define BIAS 0
#endif
/* the bias of C's row m, column col */
#if BIAS == 1
#define BIAS_OF(m, col) bias[m]
#define SLOPE_OF(m, col) PRELU_SLOPE(bias, m)
#elif BIAS == 2
#define BIAS_OF(m, col) bias[col]
#define SLOPE_OF(m, col) PRELU_SLOPE(bias, col)
#else
#define BIAS_OF(m, col) 0.0f
#endif
#if ACT != 7
#undef SLOPE_OF
#define SLOPE_OF(m, col) 0.0f
#endif
#ifndef SM_ONE_ROW
#define SM_ONE_ROW 0
#endif

/* C's element c from its sum: alpha * sum + bias (b: 0 without), plus
 * beta * c where beta is not 0, activated (slope: its channel's PReLU
 * slope under ACT 7) */
inline void store_c(__global float* c, float sum, float alpha, float b, float slope,
                    float beta, float act_a, float act_b) {
    float v = alpha * sum;
#if BIAS
    v += b;
#endif
    if (beta != 0.0f) v += beta * *c;
    *c = APPLY_ACT_CH(v, slope);
}

__kernel void gemm_small_m(int M, int N, int K, float alpha,
                           __global const float* A, int off_a, int lda,
                           __global const float* B, int off_b, int ldb, float beta,
                           __global float* C, int off_c, int ldc,
                           __global const float* bias, float act_a, float act_b, int per) {
    const int n_begin = get_global_id(0) * per;
    const int n_end = min(N, n_begin + per);
    A += off_a;
    B += off_b;
    C += off_c;
#if SM_ONE_ROW
    /* one row of A (batch 1): SM_ONE_ROW rows of B at a time against it, no
     * second row computed and dropped */
    for (int n = n_begin; n < n_end; n += SM_ONE_ROW) {
        const int nb = min(SM_ONE_ROW, n_end - n);
        float8 acc[SM_ONE_ROW];
        __global const float* bp[SM_ONE_ROW];
        for (int j = 0; j < SM_ONE_ROW; ++j) {
            acc[j] = 0.0f;
            bp[j] = B + (size_t)(n + min(j, nb - 1)) * ldb;
        }
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            const float8 x = vload8(0, A + k);
#pragma unroll
            for (int j = 0; j < SM_ONE_ROW; ++j) acc[j] = fma(x, vload8(0, bp[j] + k), acc[j]);
        }
        for (int j = 0; j < nb; ++j) {
            float v = hsum8(acc[j]);
            for (int kk = k; kk < K; ++kk) v = fma(A[kk], bp[j][kk], v);
            store_c(C + n + j, v, alpha, BIAS_OF(0, n + j), SLOPE_OF(0, n + j), beta, act_a,
                    act_b);
        }
    }
    return;
#endif
    for (int n = n_begin; n < n_end; n += 4) {
        const int nb = min(4, n_end - n);
        /* rows past the run repeat the last one; their sums are dropped */
        __global const float* b0 = B + (size_t)n * ldb;
        __global const float* b1 = B + (size_t)(n + min(1, nb - 1)) * ldb;
        __global const float* b2 = B + (size_t)(n + min(2, nb - 1)) * ldb;
        __global const float* b3 = B + (size_t)(n + min(3, nb - 1)) * ldb;
        float tot[SM_MAXM][4];
        for (int m = 0; m < M; ++m)
            for (int j = 0; j < 4; ++j) tot[m][j] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += SM_KB) {
            const int k1 = min(K, k0 + SM_KB);
            for (int m = 0; m < M; m += 2) {
                __global const float* a0 = A + (size_t)m * lda;
                __global const float* a1 = A + (size_t)min(m + 1, M - 1) * lda;
                float8 c00 = 0.0f, c01 = 0.0f, c02 = 0.0f, c03 = 0.0f;
                float8 c10 = 0.0f, c11 = 0.0f, c12 = 0.0f, c13 = 0.0f;
                int k = k0;
                for (; k + 8 <= k1; k += 8) {
                    const float8 x0 = vload8(0, a0 + k), x1 = vload8(0, a1 + k);
                    const float8 y0 = vload8(0, b0 + k), y1 = vload8(0, b1 + k);
                    const float8 y2 = vload8(0, b2 + k), y3 = vload8(0, b3 + k);
                    c00 = fma(x0, y0, c00); c01 = fma(x0, y1, c01);
                    c02 = fma(x0, y2, c02); c03 = fma(x0, y3, c03);
                    c10 = fma(x1, y0, c10); c11 = fma(x1, y1, c11);
                    c12 = fma(x1, y2, c12); c13 = fma(x1, y3, c13);
                }
                float s[2][4] = {{hsum8(c00), hsum8(c01), hsum8(c02), hsum8(c03)},
                                 {hsum8(c10), hsum8(c11), hsum8(c12), hsum8(c13)}};
                for (; k < k1; ++k) {
                    const float x0 = a0[k], x1 = a1[k];
                    s[0][0] = fma(x0, b0[k], s[0][0]); s[0][1] = fma(x0, b1[k], s[0][1]);
                    s[0][2] = fma(x0, b2[k], s[0][2]); s[0][3] = fma(x0, b3[k], s[0][3]);
                    s[1][0] = fma(x1, b0[k], s[1][0]); s[1][1] = fma(x1, b1[k], s[1][1]);
                    s[1][2] = fma(x1, b2[k], s[1][2]); s[1][3] = fma(x1, b3[k], s[1][3]);
                }
                for (int j = 0; j < 4; ++j) {
                    tot[m][j] += s[0][j];
                    if (m + 1 < M) tot[m + 1][j] += s[1][j];
                }
            }
        }
        for (int m = 0; m < M; ++m) {
            for (int j = 0; j < nb; ++j)
                store_c(C + (size_t)m * ldc + n + j, tot[m][j], alpha, BIAS_OF(m, n + j),
                        SLOPE_OF(m, n + j), beta,
                        act_a, act_b);
        }
    }
}
