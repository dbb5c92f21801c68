/* Batched SGEMM for CPU OpenCL drivers (PoCL): same contract and argument
 * list as gemm.cl, but shaped for a CPU core instead of a GPU SM.
 * GPU-style tiles (hundreds of work-items sharing local memory through
 * barriers) run at 5-10 GFLOP/s on PoCL; here one work-item (work-group of
 * one) owns a BM x BN block of C, packs a KC x BN panel of op(B) into local
 * memory (zero-padded, so the inner loop has no edge tests) and sweeps it
 * with a 4 x 16 register tile of float8 accumulators.
 * ACT (activation epilogue) as in gemm.cl; it is applied once, when the
 * last KC panel has been accumulated. */
#include "common.h"

#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef KC
#define KC 128
#endif
#ifndef MR
#define MR 4            /* rows of the register tile: 4 or 6 (x 16 columns) */
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
#if ACT == 1
#define APPLY_ACT(v) ((v) > 0.0f ? (v) : act_a * (v))
#elif ACT == 2
#define APPLY_ACT(v) fmax(act_a, fmin(act_b, (v)))
#else
#define APPLY_ACT(v) (v)
#endif
#if MR != 4 && MR != 6
#error "MR must be 4 or 6"
#endif
#if (BN % 16) || (BM % MR)
#error "BN must be a multiple of 16 and BM of MR"
#endif

#if TRANS_A
#define A_AT(m, k) A[(k) * lda + (m)]
#else
#define A_AT(m, k) A[(m) * lda + (k)]
#endif
#if TRANS_B
#define B_AT(k, n) B[(n) * ldb + (k)]
#else
#define B_AT(k, n) B[(k) * ldb + (n)]
#endif

/* A row-major and op(B) = B^T (InnerProduct forward, x * W^T): both
 * operands are contiguous along K, so no packing: dot products of 4 rows of
 * A with 2 rows of B in float8 accumulators, K blocked by KC so the A block
 * stays in cache. Packing B costs as much as the arithmetic when M is small
 * (batch 16 fully-connected layers), which this form avoids. */
#if TRANS_B && !TRANS_A && !defined(NO_DOT)
#define DOT_PATH 1
#else
#define DOT_PATH 0
#endif

inline float hsum8(float8 v) {
    float4 a = v.lo + v.hi;
    float2 b = a.lo + a.hi;
    return b.x + b.y;
}

/* C[m, n] <- epilogue(alpha * acc) for one K panel (first/last as above) */
inline void store_c(__global float* crow, int j, float acc, float alpha, float beta,
                    int first, int last, __global const float* bias, int bidx,
                    float act_a, float act_b) {
    float v = alpha * acc;
    if (first) {
#if BIAS
        v += bias[bidx];
#endif
        if (beta != 0.0f) v += beta * crow[j];
    } else {
        v += crow[j];
    }
#if ACT
    if (last) v = APPLY_ACT(v);
#endif
    crow[j] = v;
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm(int M, int N, int K, float alpha,
          __global const float* A, int offA, int lda, int sA_n, int sA_g,
          __global const float* B, int offB, int ldb, int sB_n, int sB_g,
          float beta,
          __global float* C, int offC, int ldc, int sC_n, int sC_g,
          __global const float* bias, int offBias, float act_a, float act_b) {
    const int z = get_global_id(2);
    const int zn = z / GROUPS, zg = z - zn * GROUPS;
    A += offA + zn * sA_n + zg * sA_g;
    B += offB + zn * sB_n + zg * sB_g;
    C += offC + zn * sC_n + zg * sC_g;
    const int n0 = get_global_id(0) * BN, m0 = get_global_id(1) * BM;
    if (n0 >= N || m0 >= M) return;
    const int nb = min(BN, N - n0), mb = min(BM, M - m0);

#if DOT_PATH
    for (int k0 = 0; k0 < K; k0 += 2 * KC) {   /* no packed panel: longer K runs */
        const int kb = min(2 * KC, K - k0);
        const int first = (k0 == 0), last = (k0 + 2 * KC >= K);
        for (int ni = 0; ni < nb; ni += 2) {
            const int nn = min(2, nb - ni);
            __global const float* pb0 = B + (n0 + ni) * ldb + k0;
            __global const float* pb1 = B + (n0 + ni + nn - 1) * ldb + k0;
            for (int mi = 0; mi < mb; mi += 4) {
                const int rows = min(4, mb - mi);
                __global const float* pa0 = A + (m0 + mi) * lda + k0;
                __global const float* pa1 = A + (m0 + mi + min(1, rows - 1)) * lda + k0;
                __global const float* pa2 = A + (m0 + mi + min(2, rows - 1)) * lda + k0;
                __global const float* pa3 = A + (m0 + mi + min(3, rows - 1)) * lda + k0;
                float8 c00 = 0.0f, c01 = 0.0f, c10 = 0.0f, c11 = 0.0f;
                float8 c20 = 0.0f, c21 = 0.0f, c30 = 0.0f, c31 = 0.0f;
                int k = 0;
                for (; k + 8 <= kb; k += 8) {
                    float8 b0 = vload8(0, pb0 + k), b1 = vload8(0, pb1 + k);
                    float8 a0 = vload8(0, pa0 + k), a1 = vload8(0, pa1 + k);
                    float8 a2 = vload8(0, pa2 + k), a3 = vload8(0, pa3 + k);
                    c00 = mad(a0, b0, c00); c01 = mad(a0, b1, c01);
                    c10 = mad(a1, b0, c10); c11 = mad(a1, b1, c11);
                    c20 = mad(a2, b0, c20); c21 = mad(a2, b1, c21);
                    c30 = mad(a3, b0, c30); c31 = mad(a3, b1, c31);
                }
                float acc[4][2] = {{hsum8(c00), hsum8(c01)}, {hsum8(c10), hsum8(c11)},
                                   {hsum8(c20), hsum8(c21)}, {hsum8(c30), hsum8(c31)}};
                for (; k < kb; ++k) {
                    float b0 = pb0[k], b1 = pb1[k];
                    float a0 = pa0[k], a1 = pa1[k], a2 = pa2[k], a3 = pa3[k];
                    acc[0][0] += a0 * b0; acc[0][1] += a0 * b1;
                    acc[1][0] += a1 * b0; acc[1][1] += a1 * b1;
                    acc[2][0] += a2 * b0; acc[2][1] += a2 * b1;
                    acc[3][0] += a3 * b0; acc[3][1] += a3 * b1;
                }
                for (int i = 0; i < rows; ++i) {
                    const int m = m0 + mi + i;
                    __global float* crow = C + m * ldc + n0 + ni;
                    for (int j = 0; j < nn; ++j)
                        store_c(crow, j, acc[i][j], alpha, beta, first, last, bias,
#if BIAS == 1
                                offBias + zg * M + m,
#else
                                offBias + n0 + ni + j,
#endif
                                act_a, act_b);
                }
            }
        }
    }
#else
    __local float Bp[KC * BN];

    for (int k0 = 0; k0 < K; k0 += KC) {
        const int kb = min(KC, K - k0);
        const int first = (k0 == 0);
#if ACT
        const int last = (k0 + KC >= K);
#endif
        /* pack op(B)[k0:k0+kb, n0:n0+BN] row-major, zero beyond N */
#if TRANS_B
        /* op(B) rows are B's columns: read each B row contiguously */
        for (int n = 0; n < nb; ++n) {
            __global const float* brow = B + (n0 + n) * ldb + k0;
            for (int k = 0; k < kb; ++k) Bp[k * BN + n] = brow[k];
        }
        for (int k = 0; k < kb; ++k)
            for (int n = nb; n < BN; ++n) Bp[k * BN + n] = 0.0f;
#else
        for (int k = 0; k < kb; ++k) {
            __global const float* brow = B + (k0 + k) * ldb + n0;
            for (int n = 0; n < nb; ++n) Bp[k * BN + n] = brow[n];
            for (int n = nb; n < BN; ++n) Bp[k * BN + n] = 0.0f;
        }
#endif
        for (int mi = 0; mi < mb; mi += MR) {
            /* rows past M read row m0 + mb - 1 (valid) and are never stored */
            int r0 = m0 + mi, r1 = m0 + min(mi + 1, mb - 1);
            int r2 = m0 + min(mi + 2, mb - 1), r3 = m0 + min(mi + 3, mb - 1);
#if MR == 6
            int r4 = m0 + min(mi + 4, mb - 1), r5 = m0 + min(mi + 5, mb - 1);
#endif
            for (int ni = 0; ni < nb; ni += 16) {
                float8 c00 = 0.0f, c01 = 0.0f, c10 = 0.0f, c11 = 0.0f;
                float8 c20 = 0.0f, c21 = 0.0f, c30 = 0.0f, c31 = 0.0f;
#if MR == 6
                float8 c40 = 0.0f, c41 = 0.0f, c50 = 0.0f, c51 = 0.0f;
#endif
                __local const float* bp = Bp + ni;
                for (int k = 0; k < kb; ++k) {
                    float8 b0 = vload8(0, bp + k * BN), b1 = vload8(1, bp + k * BN);
                    float a0 = A_AT(r0, k0 + k), a1 = A_AT(r1, k0 + k);
                    float a2 = A_AT(r2, k0 + k), a3 = A_AT(r3, k0 + k);
                    c00 = mad((float8)a0, b0, c00); c01 = mad((float8)a0, b1, c01);
                    c10 = mad((float8)a1, b0, c10); c11 = mad((float8)a1, b1, c11);
                    c20 = mad((float8)a2, b0, c20); c21 = mad((float8)a2, b1, c21);
                    c30 = mad((float8)a3, b0, c30); c31 = mad((float8)a3, b1, c31);
#if MR == 6
                    float a4 = A_AT(r4, k0 + k), a5 = A_AT(r5, k0 + k);
                    c40 = mad((float8)a4, b0, c40); c41 = mad((float8)a4, b1, c41);
                    c50 = mad((float8)a5, b0, c50); c51 = mad((float8)a5, b1, c51);
#endif
                }
                float acc[MR][16];
                vstore8(c00, 0, acc[0]); vstore8(c01, 1, acc[0]);
                vstore8(c10, 0, acc[1]); vstore8(c11, 1, acc[1]);
                vstore8(c20, 0, acc[2]); vstore8(c21, 1, acc[2]);
                vstore8(c30, 0, acc[3]); vstore8(c31, 1, acc[3]);
#if MR == 6
                vstore8(c40, 0, acc[4]); vstore8(c41, 1, acc[4]);
                vstore8(c50, 0, acc[5]); vstore8(c51, 1, acc[5]);
#endif
                const int rows = min(MR, mb - mi), cols = min(16, nb - ni);
                for (int i = 0; i < rows; ++i) {
                    const int m = m0 + mi + i;
                    __global float* crow = C + m * ldc + n0 + ni;
                    for (int j = 0; j < cols; ++j) {
                        float v = alpha * acc[i][j];
                        if (first) {
#if BIAS == 1
                            v += bias[offBias + zg * M + m];
#elif BIAS == 2
                            v += bias[offBias + n0 + ni + j];
#endif
                            if (beta != 0.0f) v += beta * crow[j];
                        } else {
                            v += crow[j];
                        }
#if ACT
                        if (last) v = APPLY_ACT(v);
#endif
                        crow[j] = v;
                    }
                }
            }
        }
    }
#endif
    if (K <= 0) {   /* degenerate: C = beta*C (+ bias) */
        for (int i = 0; i < mb; ++i)
            for (int j = 0; j < nb; ++j) {
                int m = m0 + i, n = n0 + j;
                float v = beta != 0.0f ? beta * C[m * ldc + n] : 0.0f;
#if BIAS == 1
                v += bias[offBias + zg * M + m];
#elif BIAS == 2
                v += bias[offBias + n];
#endif
                C[m * ldc + n] = APPLY_ACT(v);
            }
    }
}
