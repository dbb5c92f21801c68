/* Batched SGEMM for GPUs:  C = alpha * op(A) * op(B) + beta * C   (row-major)
 *   op(A) is M x K, op(B) is K x N, C is M x N.
 *   TRANS_A: A is stored K x M;  TRANS_B: B is stored N x K.
 * Batch index z = get_group_id(2) splits as (z / GROUPS, z % GROUPS) and
 * each operand moves by  (z / GROUPS) * s*_n + (z % GROUPS) * s*_g
 * (images x groups of a grouped convolution).
 * KFOLD > 0 (A not transposed, B transposed: a weight gradient over
 * images): index k of both lies in image k / KFOLD at k % KFOLD, images
 * kstride_a / kstride_b floats apart, and the batch index zn is a slice
 * of K instead, [zn * kchunk, + kchunk) (split-K; C moves by sC_n per
 * slice, partial results summed by the caller).
 * NFOLD > 0 (a 1x1 convolution's images): column n of C, and with
 * NFOLD_B of B (not transposed), lies in image n / NFOLD at n % NFOLD,
 * images nstride_c / nstride_b floats apart (one launch over the batch, no
 * per-image tile edges; NFOLD_B 0: B is a plain matrix, e.g. the images'
 * pixels gathered into rows by channel).
 * Epilogue: BIAS == 1 adds bias[g*M + m] (per row, g = group), BIAS == 2 adds bias[n]
 * (per column) -- bias is fused so a convolution is one launch.
 * Activation epilogue, applied last (after alpha, bias and beta):
 * ACT == 1: ReLU, v > 0 ? v : act_a * v (act_a = negative_slope);
 * ACT == 2: clip, fmax(act_a, fmin(act_b, v)). ACT == 0 (default): none.
 *
 * Tiling (tile_mainloop.h): a 1-D work-group of TM*TN/64 work-items computes
 * a TM x TN block (TM 64 or 128, TN 128), 8 x 8 results per work-item,
 * double-buffered local tiles of TK; TF32 == 1 uses tensor cores (NVIDIA).
 * ASYNC == 1 (TF32 only): tile_mainloop_async.h instead, a work-group of
 * (TM / 64) * (TN / WN) warps fed by asynchronous copies, STAGES deep. */
#include "common.h"

#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef TM
#define TM 128
#endif
#ifndef TN
#define TN 128
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef GROUPS
#define GROUPS 1
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef KFOLD
#define KFOLD 0
#endif
#ifndef NFOLD
#define NFOLD 0
#endif
#ifndef NFOLD_B
#define NFOLD_B 1
#endif
#ifndef READ_AHEAD
#define READ_AHEAD 1
#endif
#include "act.h"
#include "mma_tf32.h"
#include "tile_config.h"
#include "tile_raster.h"

#if KFOLD
#if TRANS_A || !TRANS_B || NFOLD
#error "gemm.cl: KFOLD needs A not transposed and B transposed, and no NFOLD"
#endif
/* image k / KFOLD, pixel k % KFOLD (KFOLD a constant: a multiply) */
#define KIMG_(k) ((k) / KFOLD)
#define A_AT(m, k) A[KIMG_(k) * kstride_a + (m) * lda + (k) - KIMG_(k) * KFOLD]
#define A_KFAST 1
#define B_AT(k, n) B[KIMG_(k) * kstride_b + (n) * ldb + (k) - KIMG_(k) * KFOLD]
#define B_KFAST 1
#else
#if TRANS_A
#define A_AT(m, k) A[(k) * lda + (m)]
#define A_KFAST 0
#else
#define A_AT(m, k) A[(m) * lda + (k)]
#define A_KFAST 1
#endif
/* image n / NFOLD, pixel n % NFOLD (NFOLD a constant: a multiply) */
#define NIMG_(n) ((n) / NFOLD)
#if NFOLD && NFOLD_B
#if TRANS_B
#error "gemm.cl: NFOLD_B needs B not transposed"
#endif
#define B_AT(k, n) B[NIMG_(n) * nstride_b + (k) * ldb + (n) - NIMG_(n) * NFOLD]
#define B_KFAST 0
#elif TRANS_B
#define B_AT(k, n) B[(n) * ldb + (k)]
#define B_KFAST 1
#else
#define B_AT(k, n) B[(k) * ldb + (n)]
#define B_KFAST 0
#endif
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1)))
void gemm(int M, int N, int K, float alpha,
          __global const float* A, int offA, int lda, int sA_n, int sA_g,
          __global const float* B, int offB, int ldb, int sB_n, int sB_g,
          float beta,
          __global float* C, int offC, int ldc, int sC_n, int sC_g,
          __global const float* bias, int offBias, float act_a, float act_b,
          int kstride_a, int kstride_b, int kchunk,       /* KFOLD only */
          int nstride_b, int nstride_c,                   /* NFOLD only */
          __global const float* R, int offR) {            /* RESIDUAL only */
    const int z = get_group_id(2);
    const int zn = z / GROUPS, zg = z - zn * GROUPS;
    A += offA + zn * sA_n + zg * sA_g;
    B += offB + zn * sB_n + zg * sB_g;
    C += offC + zn * sC_n + zg * sC_g;
    R += offR + zn * sC_n + zg * sC_g;      /* laid out as C */
    const int lid = get_local_id(0);
    TILE_ORIGIN(m0, n0)
#if KFOLD
    const int kbeg = zn * kchunk, kend = min(K, kbeg + kchunk);
#else
    const int kbeg = 0, kend = K;
#endif
#define LOAD_A(m, k) (((m) < M && (k) < kend) ? A_AT(m, k) : 0.0f)
#define LOAD_B(k, n) (((n) < N && (k) < kend) ? B_AT(k, n) : 0.0f)
#include TILE_MAINLOOP

#if NFOLD
/* cb_: C at this work-item's column n (image n / NFOLD) */
#define STORE_COL(n)                                                    \
    const int cimg_ = NIMG_(n);                                         \
    __global float* cb_ = C + cimg_ * nstride_c + (n) - cimg_ * NFOLD;
#define C_AT(m, n) cb_[(m) * ldc]
#else
#define STORE_COL(n)
#define C_AT(m, n) C[(m) * ldc + (n)]
#endif
#if BIAS == 1
#define BIAS_AT(m, n) bias[offBias + zg * M + (m)]
#define ACT_AT(v, m, n) APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + zg * M + (m)))
#elif BIAS == 2
#define BIAS_AT(m, n) bias[offBias + (n)]
#define ACT_AT(v, m, n) APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + (n)))
#else
#define BIAS_AT(m, n) 0.0f
#define ACT_AT(v, m, n) APPLY_ACT(v)
#endif
/* RESIDUAL: + R at C's place before the activation (gemm_cpu.cl), read
 * ahead of the stores (tile_store.h ADDEND_AT) */
#if RESIDUAL
#define ADDEND_AT(m, n) R[&C_AT(m, n) - C]
#define RES_AT(m, n) addend_v
#else
#define RES_AT(m, n) 0.0f
#endif
#if READ_AHEAD
/* beta's old values read ahead of the stores (tile_store.h PRIOR_AT): a
 * weight gradient accumulating into a large dW (VGG-16's fc6, K = 64) is
 * nearly all store */
#define PRIOR_AT(m, n) C_AT(m, n)
#define STORE_ROW_PRIOR(m, n, acc_v, old) {                         \
        float v = alpha * (acc_v) + BIAS_AT(m, n);                  \
        if (beta != 0.0f) v += beta * (old);                        \
        v += RES_AT(m, n);                                          \
        C_AT(m, n) = ACT_AT(v, m, n);                               \
    }
#else
#define STORE_ROW(m, n, acc_v) {                                    \
        float v = alpha * (acc_v) + BIAS_AT(m, n);                  \
        if (beta != 0.0f) v += beta * C_AT(m, n);                   \
        v += RES_AT(m, n);                                          \
        C_AT(m, n) = ACT_AT(v, m, n);                               \
    }
#endif
/* the same, 4 adjacent columns at once (tile_store.h VSTORE4; the host sets
 * it where C's and R's rows start on 16 bytes): the same operations in the
 * same order per element, so the same bits */
#if BIAS == 1
#define BIAS4_AT(m, n) ((float4)(BIAS_AT(m, n)))
#elif BIAS == 2
#define BIAS4_AT(m, n) vload4(0, bias + offBias + (n))
#else
#define BIAS4_AT(m, n) ((float4)(0.0f))
#endif
#if READ_AHEAD
#define OLD4_AT(m, n, old4) (old4)
#else
#define OLD4_AT(m, n, old4) (*(__global const float4*)&C_AT(m, n))
#endif
#if RESIDUAL
#define ADD4_(v4, add4) v4 += (add4);
#else
#define ADD4_(v4, add4)
#endif
#define STORE_ROW4(m, n, acc4, old4, add4) {                        \
        float4 v4 = alpha * (acc4) + BIAS4_AT(m, n);                \
        if (beta != 0.0f) v4 += beta * OLD4_AT(m, n, old4);         \
        ADD4_(v4, add4)                                             \
        v4.x = ACT_AT(v4.x, m, n); v4.y = ACT_AT(v4.y, m, n + 1);   \
        v4.z = ACT_AT(v4.z, m, n + 2); v4.w = ACT_AT(v4.w, m, n + 3); \
        *(__global float4*)&C_AT(m, n) = v4;                        \
    }
#include "tile_store.h"
}
