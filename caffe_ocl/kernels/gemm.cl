/* Batched SGEMM:  C = alpha * op(A) * op(B) + beta * C   (row-major)
 *   op(A) is M x K, op(B) is K x N, C is M x N.
 *   TRANS_A: A is stored K x M;  TRANS_B: B is stored N x K.
 * Batch index z = get_group_id(2) splits as (z / GROUPS, z % GROUPS) and
 * each operand moves by  (z / GROUPS) * s*_n + (z % GROUPS) * s*_g
 * (images x groups of a grouped convolution).
 * Epilogue: BIAS == 1 adds bias[g*M + m] (per row, g = group), BIAS == 2 adds bias[n]
 * (per column) -- bias is fused so a convolution is one launch.
 * Activation epilogue, applied last (after alpha, bias and beta):
 * ACT == 1: ReLU, v > 0 ? v : act_a * v (act_a = negative_slope);
 * ACT == 2: clip, fmax(act_a, fmin(act_b, v)). ACT == 0 (default): none,
 * act_a/act_b unused.
 *
 * Tiling: a work-group computes a TM x TN block of C with
 * (TN/WN) x (TM/WM) work-items, each holding a WM x WN register tile;
 * K advances TK at a time through local memory. */
#include "common.h"

#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef TK
#define TK 16
#endif
#ifndef WM
#define WM 4
#endif
#ifndef WN
#define WN 4
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef GROUPS
#define GROUPS 1
#endif
#ifndef ACT
#define ACT 0
#endif
#if ACT < 0 || ACT > 2
#error "ACT must be 0 (none), 1 (relu) or 2 (clip)"
#endif

#define LX (TN / WN)
#define LY (TM / WM)
#define NT (LX * LY)

#if (TM % WM) || (TN % WN)
#error "TM must be a multiple of WM and TN of WN"
#endif

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void gemm(int M, int N, int K, float alpha,
          __global const float* A, int offA, int lda, int sA_n, int sA_g,
          __global const float* B, int offB, int ldb, int sB_n, int sB_g,
          float beta,
          __global float* C, int offC, int ldc, int sC_n, int sC_g,
          __global const float* bias, int offBias, float act_a, float act_b) {
    const int z = get_group_id(2);
    const int zn = z / GROUPS, zg = z - zn * GROUPS;
    A += offA + zn * sA_n + zg * sA_g;
    B += offB + zn * sB_n + zg * sB_g;
    C += offC + zn * sC_n + zg * sC_g;

    __local float As[TK][TM + 1];
    __local float Bs[TK][TN + 1];

    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * LX + tx;
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;

    float acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int t = lid; t < TM * TK; t += NT) {
#if TRANS_A
            int mm = t % TM, kk = t / TM;
            int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? A[k * lda + m] : 0.0f;
#else
            int kk = t % TK, mm = t / TK;
            int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? A[m * lda + k] : 0.0f;
#endif
        }
        for (int t = lid; t < TN * TK; t += NT) {
#if TRANS_B
            int kk = t % TK, nn = t / TK;
            int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? B[n * ldb + k] : 0.0f;
#else
            int nn = t % TN, kk = t / TN;
            int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? B[k * ldb + n] : 0.0f;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; ++kk) {
            float a[WM], b[WN];
            for (int i = 0; i < WM; ++i) a[i] = As[kk][ty + i * LY];
            for (int j = 0; j < WN; ++j) b[j] = Bs[kk][tx + j * LX];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < WM; ++i) {
        int m = m0 + ty + i * LY;
        if (m >= M) continue;
        for (int j = 0; j < WN; ++j) {
            int n = n0 + tx + j * LX;
            if (n >= N) continue;
            float v = alpha * acc[i][j];
#if BIAS == 1
            v += bias[offBias + zg * M + m];
#elif BIAS == 2
            v += bias[offBias + n];
#endif
            if (beta != 0.0f) v += beta * C[m * ldc + n];
#if ACT == 1
            v = v > 0.0f ? v : act_a * v;
#elif ACT == 2
            v = fmax(act_a, fmin(act_b, v));
#endif
            C[m * ldc + n] = v;
        }
    }
}
