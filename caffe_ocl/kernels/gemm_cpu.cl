/* Batched SGEMM for CPU OpenCL drivers (PoCL): the contract and argument
 * list of gemm.cl plus three trailing ints (bm, bn, nsplit), shaped for a
 * CPU core instead of a GPU SM (BLIS-style).
 *
 * One work-item (work-group of one; PoCL hands work-groups to its threads
 * dynamically) owns a bm x bn block of C (bm a multiple of MR = 6, at most
 * BM_MAX; bn a multiple of NR = 2 * VW, at most BN_MAX). For each panel of
 * KC values of K it packs op(A)[block rows, panel] into micro-panels of 6
 * rows ([k][6]) and op(B)[panel, block cols] into micro-panels of NR
 * columns ([k][NR]), zero-padded (no edge tests in the inner loop), in
 * __local memory (the L2 of the core running it), then sweeps every 6 x NR
 * tile of the block with 12 accumulators of VW floats and explicit fma()
 * (mad() compiled to separate multiplies and adds on PoCL: half the speed).
 *
 * VW, the vector width (host: ops.gemm.cpu_vw): 16 on devices with 512-bit
 * vectors (AVX-512: 12 float16 accumulators ran 1.9x the float8 rate in
 * the same loop on a 2-core EPYC Zen 5, PoCL 3.1; 6 x 32 tiles matched
 * 12 x 16, 14 x 16 and 8 x 32 ones there within the noise, 12 x 32 spilled),
 * 8 elsewhere (AVX2 has 16 registers of 8 floats; OpenCL emulates float16
 * on narrower hardware, so both variants run, and are tested, anywhere).
 *
 Images folded into a GEMM dimension (tensors [image][C][H*W] as they are,
 * no transpose; a convolution is one GEMM whatever the batch):
 * nsplit > 0 folds them into N: column n of op(B) and of C lies in image
 * i = n / nsplit at column n % nsplit, image i starting i*nsB (B) and
 * i*nsC (C) floats further (op(B) must not be transposed);
 * ksplit > 0 folds them into K: index k of op(A) and op(B) lies in image
 * i = k / ksplit at k % ksplit, image i starting i*ksA / i*ksB floats
 * further (op(A) not transposed, op(B) transposed: a weight gradient
 * dy * col^T summed over images). K panels never straddle two images.
 *
 * CONV_B packs op(B) straight from images instead of an im2col buffer
 * (a convolution without columns; B is the images zero-padded by PH, PW,
 * [image][C][Hp][Wp], so no read needs a bounds test):
 * CONV_B == 1 (forward, with nsplit = HO*WO): op(B)[k][n] is column row
 * k = (c, kh, kw) of output pixel n; CONV_B == 2 (weight gradient, with
 * ksplit = HO*WO, TRANS_B): op(B)[k][n] is column row n of pixel k.
 * Geometry in the trailing ints (cv_*); Wp, Hp*Wp of the padded image.
 *
 * PACKED_A: op(A) comes packed already ([group][ceil(M/6)][K][6], rows
 * past M zero; ops.gemm.pack_a writes it once per weight change): the
 * micro-kernel reads its 6-row panels straight from there instead of
 * packing them in every block. Not with TRANS_A or ksplit.
 *
 * Epilogue as in gemm.cl: C = act(alpha*op(A)*op(B) + bias + beta*C
 * (+ R)); the bias and beta are applied when the first K panel is stored,
 * the residual and the activation when the last is (in between C holds the
 * partial sums). RESIDUAL: R (+offR) is a tensor laid out as C whose value
 * is added before the activation (a convolution's output summed with a
 * shortcut by an Eltwise, plan/residual.py), in the order an Eltwise after
 * the product would add it. */
#include "common.h"

#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef KC
#define KC 256
#endif
#ifndef BM_MAX
#define BM_MAX 96
#endif
#ifndef B_ROWS_FIRST
#define B_ROWS_FIRST 1
#endif
#ifndef BN_MAX
#define BN_MAX 256
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef GROUPS
#define GROUPS 1
#endif
#ifndef CONV_B
#define CONV_B 0
#endif
#ifndef PACKED_A
#define PACKED_A 0
#endif
#ifndef PACKED_B
#define PACKED_B 0
#endif
#ifndef VW
#define VW 8
#endif
#ifndef NTAIL
#define NTAIL 1
#endif
#if PACKED_A && TRANS_A
#error "PACKED_A is op(A) = A packed"
#endif
#if PACKED_B && (CONV_B == 2 || TRANS_B || GROUPS != 1)
#error "PACKED_B is op(B) of one group packed by pack_b_conv (CONV_B 1) or pack_b_panels"
#endif
#if CONV_B == 1 && TRANS_B || CONV_B == 2 && !TRANS_B
#error "CONV_B 1 packs op(B) = B, CONV_B 2 op(B) = B^T"
#endif
#include "act.h"
#if VW == 16
#define floatV float16
#define intV int16
#define vloadV vload16
#define vstoreV vstore16
#define LANES (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#elif VW == 8
#define floatV float8
#define intV int8
#define vloadV vload8
#define vstoreV vstore8
#define LANES (int8)(0, 1, 2, 3, 4, 5, 6, 7)
#else
#error "VW is 8 or 16"
#endif
#define MR 6
#define NR (2 * VW)
#define ROWS_OUTER_MAX_K 96
#if (BM_MAX % MR) || (BN_MAX % NR)
#error "BM_MAX must be a multiple of 6 and BN_MAX of NR"
#endif

/* offset of column n of op(B) / C inside its image (nsplit > 0) */
inline int split_off(int n, int nsplit, int stride) {
    if (nsplit <= 0) return n;
    int i = n / nsplit;
    return i * stride + (n - i * nsplit);
}

/* the epilogue of one row of VW results: first/last K panel as above */
#define BIAS_ROW_ADD(v, m, col)
#if BIAS == 1
#undef BIAS_ROW_ADD
#define BIAS_ROW_ADD(v, m, col) v += bias[offBias + zg * M + (m)]
#elif BIAS == 2
#undef BIAS_ROW_ADD
#define BIAS_ROW_ADD(v, m, col) v += vloadV(0, bias + offBias + (col))
#endif

#if ACT == 7 && BIAS == 2
#define ACT_IF_LAST(v, m, col) \
    if (last) v = APPLY_ACT_VEC_LANES(v, floatV, vloadV(0, bias + (int)act_a + offBias + (col)))
#elif ACT == 7
#define ACT_IF_LAST(v, m, col) \
    if (last) v = APPLY_ACT_VEC_CH(v, floatV, PRELU_SLOPE(bias, offBias + zg * M + (m)))
#elif ACT
#define ACT_IF_LAST(v, m, col) if (last) v = APPLY_ACT_VEC(v, floatV)
#else
#define ACT_IF_LAST(v, m, col)
#endif
/* the scalar epilogues' activation of C's (m, n) (ACT 7: its channel's slope) */
#if BIAS == 2
#define ACT_AT(v, m, n) APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + (n)))
#else
#define ACT_AT(v, m, n) APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + zg * M + (m)))
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#if RESIDUAL
#define RES_IF_LAST(v, cp) if (last) v += vloadV(0, R + ((cp) - C))
#else
#define RES_IF_LAST(v, cp)
#endif

#define STOREV(acc, m, col, cp)                                  \
    do {                                                          \
        floatV v_ = alpha * (acc);                                \
        if (first) {                                              \
            BIAS_ROW_ADD(v_, m, col);                             \
            if (beta != 0.0f) v_ = fma((floatV)beta, vloadV(0, cp), v_); \
        } else {                                                  \
            v_ += vloadV(0, cp);                                  \
        }                                                         \
        RES_IF_LAST(v_, cp);                                      \
        ACT_IF_LAST(v_, m, col);                                  \
        vstoreV(v_, 0, cp);                                       \
    } while (0)

/* geometry of a CONV_B operand: kernel, stride, dilation, padded row
 * length Wp, padded plane Hp*Wp, output row length WO (the kernel's last
 * arguments, spelled out there for the host's signature parser) */
#define CONV_ARGS int cv_kh, int cv_kw, int cv_sh, int cv_sw, int cv_dh, int cv_dw, \
                  int cv_wp, int cv_hwp, int cv_wo
#define CONV_PASS cv_kh, cv_kw, cv_sh, cv_sw, cv_dh, cv_dw, cv_wp, cv_hwp, cv_wo

#if CONV_B == 1

/* How 8 pixels at offsets o[0..7] are packed by pack_conv_fwd: 8, one run
 * at stride sw (run8); L in 1..7, two runs, o[0..L-1] and o[L..7], split
 * by a jump (an image row or image ends at L), blended from two run8
 * loads; 0, gathered (three rows or more, or the repeated last pixel at
 * N's edge). The two runs' reads stay inside o[0] .. o[7] (+ 14 at stride
 * 2, as run8's). Gathered lane by lane, the 8-pixel groups of 7 x 7
 * planes held ResNet's batch-1 3x3 512-channel layers at 140 GFLOP/s;
 * two runs: 177 (2-core EPYC Zen 5, PoCL 3.1, VW 16, interleaved A/B). */
inline int run_split(const int* o, int sw) {
    int L = 1;
    while (L < 8 && o[L] - o[L - 1] == sw) ++L;
    if (L == 8) return 8;
    if (o[L] - o[L - 1] <= sw) return 0;
    for (int j = L + 1; j < 8; ++j)
        if (o[j] - o[j - 1] != sw) return 0;
    return L;
}

#define PC_NAME pack_conv_fwd
#define PC_SPACE __local
#include "gemm_cpu_pack_conv.h"
#undef PC_NAME
#undef PC_SPACE
#define PC_NAME pack_conv_fwd_g
#define PC_SPACE __global
#include "gemm_cpu_pack_conv.h"
#undef PC_NAME
#undef PC_SPACE

/* PACKED_B: op(B) packed once for all blocks of rows (a fully-connected
 * layer's weights: gemm_cpu_pack.cl pack_b_panels), or that of a CONV_B == 1
 * product packed once for all its blocks
 * of rows (a batch-1 layer on a small plane has one or a few blocks of
 * columns and several of rows, and each packed the same columns from the
 * images again: ResNet-18's 3 x 3 512-channel layers on 7 x 7 planes
 * spent a quarter of their time there). Layout: panel p (columns
 * p*NR .. p*NR + NR-1, past N repeating column N-1) at PB + p*K*NR, its K
 * rows of NR floats one after another; one work-item per (panel, chunk of
 * kchunk rows). Host: ops.gemm.pack_b_conv. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_b_conv(int N, int K, int kchunk, __global const float* B, int offB,
                 int nsplit, int nsB, int cv_kh, int cv_kw, int cv_sh, int cv_sw,
                 int cv_dh, int cv_dw, int cv_wp, int cv_hwp, int cv_wo,
                 __global float* PB, int offPB) {
    const int nkc = (K + kchunk - 1) / kchunk, np = (N + NR - 1) / NR;
    const int item = get_global_id(0);
    if (item >= np * nkc) return;
    const int p = item / nkc, k0 = (item - p * nkc) * kchunk;
    pack_conv_fwd_g(PB + offPB + (size_t)p * K * NR + k0 * NR, B + offB, k0,
                    min(kchunk, K - k0), p * NR, min(NR, N - p * NR), nsplit, nsB, CONV_PASS);
}
#elif CONV_B == 2
/* store_transposed8(d, NR, r0..r7): d[i * NR] = column i of the 8 x 8
 * block r0..r7 (row j = rj) */
#define T8_NAME store_transposed8
#define T8_SPACE __local
#include "transpose8.h"
#undef T8_NAME
#undef T8_SPACE

/* [kb][NR] panel of op(B) = col^T for output pixels k0.. of one image and
 * the NR column rows (c, kh, kw) from n (``cols`` valid, the rest repeat
 * the last): each row's offset is found once. Stride 1 with output rows
 * of a multiple of 8: 8 pixels of a row are contiguous for every column
 * row, so 8 x 8 blocks are loaded as vectors and transposed in registers
 * (the 16-way scalar gather otherwise, which held CIFAR-10 quick's weight
 * gradients at 6-34 GFLOP/s). */
inline void pack_conv_wgrad(__local float* bp, __global const float* B, int k0, int kb,
                            int n, int cols, CONV_ARGS) {
    const int kk = cv_kh * cv_kw;
    int off[NR];
    for (int j = 0; j < NR; ++j) {
        const int row = n + min(j, cols - 1);
        const int c = row / kk, r = row - c * kk, kh = r / cv_kw, kw = r - kh * cv_kw;
        off[j] = c * cv_hwp + kh * cv_dh * cv_wp + kw * cv_dw;
    }
    int ho = k0 / cv_wo, wo = k0 - ho * cv_wo;
    __global const float* s = B + ho * cv_sh * cv_wp + wo * cv_sw;
    const int step_row = cv_sh * cv_wp - cv_wo * cv_sw;          /* wo wraps */
    if (cv_sw == 1 && cv_wo % 8 == 0 && k0 % 8 == 0 && kb % 8 == 0) {
        for (int k = 0; k < kb; k += 8) {
            for (int h = 0; h < NR; h += 8)
                store_transposed8(bp + k * NR + h, NR,
                                  vload8(0, s + off[h]), vload8(0, s + off[h + 1]),
                                  vload8(0, s + off[h + 2]), vload8(0, s + off[h + 3]),
                                  vload8(0, s + off[h + 4]), vload8(0, s + off[h + 5]),
                                  vload8(0, s + off[h + 6]), vload8(0, s + off[h + 7]));
            s += 8;
            if ((wo += 8) == cv_wo) { wo = 0; s += step_row; }
        }
        return;
    }
    for (int k = 0; k < kb; ++k) {
        for (int j = 0; j < NR; ++j) bp[k * NR + j] = s[off[j]];
        s += cv_sw;
        if (++wo == cv_wo) { wo = 0; s += step_row; }
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm(int M, int N, int K, float alpha,
          __global const float* A, int offA, int lda, int sA_n, int sA_g,
          __global const float* B, int offB, int ldb, int sB_n, int sB_g,
          float beta,
          __global float* C, int offC, int ldc, int sC_n, int sC_g,
          __global const float* bias, int offBias, float act_a, float act_b,
          int bm, int bn, int nsplit, int nsB, int nsC, int ksplit, int ksA, int ksB,
          int cv_kh, int cv_kw, int cv_sh, int cv_sw, int cv_dh, int cv_dw,
          int cv_wp, int cv_hwp, int cv_wo, __global const float* R, int offR) {
    const int z = get_global_id(2);
    const int zn = z / GROUPS, zg = z - zn * GROUPS;
    __global const float* A0 = A + offA + zn * sA_n + zg * sA_g;
    __global const float* B0 = B + offB + zn * sB_n + zg * sB_g;
    C += offC + zn * sC_n + zg * sC_g;
    R += offR + zn * sC_n + zg * sC_g;      /* laid out as C */
    const int n0 = get_global_id(0) * bn, m0 = get_global_id(1) * bm;
    if (n0 >= N || m0 >= M) return;
    const int nb = min(bn, N - n0), mb = min(bm, M - m0);

    if (K <= 0) {   /* degenerate: C = act(beta*C + bias) */
        for (int i = 0; i < mb; ++i)
            for (int j = 0; j < nb; ++j) {
                int m = m0 + i, n = n0 + j;
                __global float* cp = C + m * ldc + split_off(n, nsplit, nsC);
                float v = beta != 0.0f ? beta * *cp : 0.0f;
#if BIAS == 1
                v += bias[offBias + zg * M + m];
#elif BIAS == 2
                v += bias[offBias + n];
#endif
#if RESIDUAL
                v += R[cp - C];
#endif
                *cp = ACT_AT(v, m, n);
            }
        return;
    }

    __local float Ap[KC * BM_MAX];   /* [bm / 6][KC][6]   */
    __local float Bp[KC * BN_MAX];   /* [bn / NR][KC][NR] */

    for (int k0 = 0, kb; k0 < K; k0 += kb) {
        kb = min(KC, K - k0);
        const int first = (k0 == 0);
        /* A, B: this panel's first k (k0, or its place inside an image) */
        __global const float* A = A0;
        __global const float* B = B0;
        int kk = k0;
        if (ksplit > 0) {
            const int img = k0 / ksplit;
            kk = k0 - img * ksplit;
            kb = min(kb, ksplit - kk);
            A += img * ksA;
            B += img * ksB;
        }
        const int last = (k0 + kb >= K);
        /* pack op(A) into [k][6] micro-panels; rows past M repeat row M-1
         * (their results are never stored) */
        for (int mi = 0; mi < (PACKED_A ? 0 : mb); mi += MR) {
            __local float* ap = Ap + mi * KC;
            const int m = m0 + mi, rl = mb - mi - 1;
#if TRANS_A
            __global const float* acol = A + kk * lda + m;
            if (rl >= MR - 1) {
                for (int k = 0; k < kb; ++k) {
                    __global const float* s = acol + k * lda;
                    ap[k * MR + 0] = s[0]; ap[k * MR + 1] = s[1]; ap[k * MR + 2] = s[2];
                    ap[k * MR + 3] = s[3]; ap[k * MR + 4] = s[4]; ap[k * MR + 5] = s[5];
                }
            } else {
                for (int k = 0; k < kb; ++k)
                    for (int r = 0; r < MR; ++r) ap[k * MR + r] = acol[k * lda + min(r, rl)];
            }
#else
            __global const float* a0 = A + m * lda + kk;
            __global const float* a1 = a0 + min(1, rl) * lda;
            __global const float* a2 = a0 + min(2, rl) * lda;
            __global const float* a3 = a0 + min(3, rl) * lda;
            __global const float* a4 = a0 + min(4, rl) * lda;
            __global const float* a5 = a0 + min(5, rl) * lda;
            for (int k = 0; k < kb; ++k) {
                ap[k * MR + 0] = a0[k]; ap[k * MR + 1] = a1[k]; ap[k * MR + 2] = a2[k];
                ap[k * MR + 3] = a3[k]; ap[k * MR + 4] = a4[k]; ap[k * MR + 5] = a5[k];
            }
#endif
        }
        /* pack op(B) into [k][NR] micro-panels; columns past N repeat
         * column N-1 (never stored) */
#if !CONV_B && !TRANS_B && B_ROWS_FIRST && !PACKED_B
        /* B as it lies (row-major): each row's run of the block read
         * once, front to back, into all whole micro-panels (k outer). Panel
         * by panel (k inner) took NR floats of each of kb rows far apart
         * in turn: 1x1 layers with few output rows (M 16, K 32, N 200704)
         * packed B at ~4 GB/s and ran at a third of their arithmetic
         * rate. Partial panels (N's edge, an image's edge) below. */
        {
            /* a whole panel inside one image: one run from poff. Across the
             * end of an image (nsplit >= NR), in a second sweep: its first
             * xsplit columns from xoff, the rest from image start xoff2 --
             * two vector loads blended (every lane read lies in image i's
             * row k .. image i+1's row k). Gathered lane by lane, column
             * by column (the path below), the straddling panels -- a third
             * of them for 7 x 7 planes -- cost those GEMMs 5-14%
             * (interleaved A/B, 2-core EPYC, PoCL 3.1). */
            int poff[BN_MAX / NR], xpan[BN_MAX / NR], xoff[BN_MAX / NR];
            int xoff2[BN_MAX / NR], xsplit[BN_MAX / NR], nx = 0;
            const int np = (nb + NR - 1) / NR;
            for (int pi = 0; pi < np; ++pi) {
                const int n = n0 + pi * NR;
                int p = n, img = 0;
                if (nsplit > 0) { img = n / nsplit; p = n - img * nsplit; }
                const int whole = pi * NR + NR <= nb;
                poff[pi] = (whole && (nsplit <= 0 || p + NR <= nsplit)) ? img * nsB + p : -1;
                if (whole && poff[pi] < 0 && nsplit >= NR) {
                    xpan[nx] = pi;
                    xoff[nx] = img * nsB + p;
                    xsplit[nx] = nsplit - p;
                    xoff2[nx] = (img + 1) * nsB - xsplit[nx];
                    ++nx;
                }
            }
            for (int k = 0; k < kb; ++k) {
                __global const float* brow = B + (kk + k) * ldb;
                for (int pi = 0; pi < np; ++pi)
                    if (poff[pi] >= 0) {
                        __local float* d = Bp + pi * NR * KC + k * NR;
                        vstoreV(vloadV(0, brow + poff[pi]), 0, d);
                        vstoreV(vloadV(1, brow + poff[pi]), 1, d);
                    }
            }
            if (nx > 0) {
                const intV lane = LANES;
                for (int k = 0; k < kb; ++k) {
                    __global const float* brow = B + (kk + k) * ldb;
                    for (int x = 0; x < nx; ++x) {   /* VW-wide selects: the vector unit's */
                        __local float* d = Bp + xpan[x] * NR * KC + k * NR;
                        __global const float* b1 = brow + xoff[x];
                        __global const float* b2 = brow + xoff2[x];
                        vstoreV(select(vloadV(0, b2), vloadV(0, b1), lane < xsplit[x]), 0, d);
                        vstoreV(select(vloadV(1, b2), vloadV(1, b1), lane < xsplit[x] - VW), 1, d);
                    }
                }
            }
        }
#endif
        for (int ni = 0; ni < (PACKED_B ? 0 : nb); ni += NR) {
            __local float* bp = Bp + ni * KC;
            const int n = n0 + ni;
#if CONV_B == 1
            pack_conv_fwd(bp, B, kk, kb, n, min(NR, nb - ni), nsplit, nsB, CONV_PASS);
#elif CONV_B == 2
            pack_conv_wgrad(bp, B, kk, kb, n, min(NR, nb - ni), CONV_PASS);
#else
#if !TRANS_B && B_ROWS_FIRST
            if (ni + NR <= nb && (nsplit <= 0 || nsplit >= NR)) {
                /* packed above */
#else
            int p = n, img = 0;
            if (nsplit > 0) { img = n / nsplit; p = n - img * nsplit; }
            if (ni + NR <= nb && (nsplit <= 0 || p + NR <= nsplit)) {
                const int off = img * nsB + p;
#endif
#if TRANS_B
                for (int h = 0; h < NR; h += 16) {   /* 16 row streams at a time */
                    __global const float* b0 = B + (off + h) * ldb + kk;
                    for (int k = 0; k < kb; ++k) {
                        __local float* d = bp + k * NR + h;
                        d[0] = b0[k]; d[1] = b0[ldb + k]; d[2] = b0[2 * ldb + k];
                        d[3] = b0[3 * ldb + k]; d[4] = b0[4 * ldb + k]; d[5] = b0[5 * ldb + k];
                        d[6] = b0[6 * ldb + k]; d[7] = b0[7 * ldb + k]; d[8] = b0[8 * ldb + k];
                        d[9] = b0[9 * ldb + k]; d[10] = b0[10 * ldb + k]; d[11] = b0[11 * ldb + k];
                        d[12] = b0[12 * ldb + k]; d[13] = b0[13 * ldb + k];
                        d[14] = b0[14 * ldb + k]; d[15] = b0[15 * ldb + k];
                    }
                }
#elif !B_ROWS_FIRST
                __global const float* brow = B + kk * ldb + off;
                for (int k = 0; k < kb; ++k) {
                    vstoreV(vloadV(0, brow + k * ldb), 2 * k, bp);
                    vstoreV(vloadV(1, brow + k * ldb), 2 * k + 1, bp);
                }
#endif
            } else {
                for (int j = 0; j < NR; ++j) {
                    const int o = split_off(n + min(j, nb - ni - 1), nsplit, nsB);
#if TRANS_B
                    for (int k = 0; k < kb; ++k) bp[k * NR + j] = B[o * ldb + kk + k];
#else
                    for (int k = 0; k < kb; ++k) bp[k * NR + j] = B[(kk + k) * ldb + o];
#endif
                }
            }
#endif
        }
        /* the 6 x NR tiles of the block, by NR-column strips (a B
         * micro-panel stays in L1 while the A panel streams from L2) or,
         * for short products (K <= ROWS_OUTER_MAX_K), by 6-row strips: C is
         * then written 6 rows of bn at a time instead of 64 bytes of every
         * row of the block in turn. 2-core EPYC, PoCL 3.1, A/B in one
         * process: MobileNet v2's 1x1 layers (K 16-96) 1.10-1.24x, K 144
         * and 256 0.97-1.03x by rows. */
        const int nmi = (mb + MR - 1) / MR, nni = (nb + NR - 1) / NR;
        const int rows_outer = K <= ROWS_OUTER_MAX_K;
        for (int t = 0; t < nmi * nni; ++t) {
            const int si = rows_outer ? t / nni : t % nmi;
            const int sj = rows_outer ? t - si * nni : t / nmi;
            const int mi = si * MR, ni = sj * NR;
#if PACKED_B
            /* panel (n0 + ni) / NR of pack_b_conv's layout, from k0 */
            __global const float* bp = B0 + (size_t)((n0 + ni) / NR) * K * NR + k0 * NR;
#else
            __local const float* bp = Bp + ni * KC;
#endif
            const int n = n0 + ni;
            int p = n, img = 0;
            if (nsplit > 0) { img = n / nsplit; p = n - img * nsplit; }
            const int cols = min(NR, nb - ni);
            const int cvec = cols == NR && (nsplit <= 0 || p + NR <= nsplit);
#if PACKED_A
            /* panel (m0 + mi) / 6 of the packed op(A), from k0 (m0, mi: multiples of 6) */
            __global const float* ap = A0 + (m0 + mi) * K + k0 * MR;
#else
            __local const float* ap = Ap + mi * KC;
#endif
            floatV c00 = 0.0f, c01 = 0.0f, c10 = 0.0f, c11 = 0.0f;
            floatV c20 = 0.0f, c21 = 0.0f, c30 = 0.0f, c31 = 0.0f;
            floatV c40 = 0.0f, c41 = 0.0f, c50 = 0.0f, c51 = 0.0f;
            if (NTAIL && cols <= VW) {
                /* a tile of at most VW columns (N's edge: 49-pixel planes
                 * end in a 1-column panel with VW 8): the left half only */
                for (int k = 0; k < kb; ++k) {
                    const floatV b0 = vloadV(0, bp + k * NR);
#if PACKED_A
                    __global const float* a = ap + k * MR;
#else
                    __local const float* a = ap + k * MR;
#endif
                    c00 = fma((floatV)a[0], b0, c00); c10 = fma((floatV)a[1], b0, c10);
                    c20 = fma((floatV)a[2], b0, c20); c30 = fma((floatV)a[3], b0, c30);
                    c40 = fma((floatV)a[4], b0, c40); c50 = fma((floatV)a[5], b0, c50);
                }
            } else
            for (int k = 0; k < kb; ++k) {
                const floatV b0 = vloadV(0, bp + k * NR), b1 = vloadV(1, bp + k * NR);
#if PACKED_A
                __global const float* a = ap + k * MR;
#else
                __local const float* a = ap + k * MR;
#endif
                c00 = fma((floatV)a[0], b0, c00); c01 = fma((floatV)a[0], b1, c01);
                c10 = fma((floatV)a[1], b0, c10); c11 = fma((floatV)a[1], b1, c11);
                c20 = fma((floatV)a[2], b0, c20); c21 = fma((floatV)a[2], b1, c21);
                c30 = fma((floatV)a[3], b0, c30); c31 = fma((floatV)a[3], b1, c31);
                c40 = fma((floatV)a[4], b0, c40); c41 = fma((floatV)a[4], b1, c41);
                c50 = fma((floatV)a[5], b0, c50); c51 = fma((floatV)a[5], b1, c51);
            }
            const int m = m0 + mi;
            /* whole NR-column rows by vectors, also in a block's last
             * row tile when M is not a multiple of 6 (the element path
             * below held MobileNet v2's M = 16 GEMM, a third of its
             * tiles partial, at 26 GFLOP/s) */
            const int rows = min(MR, mb - mi);
            if (cvec) {
                __global float* cp = C + m * ldc + img * nsC + p;
                STOREV(c00, m, n, cp); STOREV(c01, m, n + VW, cp + VW); cp += ldc;
                if (rows > 1) { STOREV(c10, m + 1, n, cp); STOREV(c11, m + 1, n + VW, cp + VW); }
                cp += ldc;
                if (rows > 2) { STOREV(c20, m + 2, n, cp); STOREV(c21, m + 2, n + VW, cp + VW); }
                cp += ldc;
                if (rows > 3) { STOREV(c30, m + 3, n, cp); STOREV(c31, m + 3, n + VW, cp + VW); }
                cp += ldc;
                if (rows > 4) { STOREV(c40, m + 4, n, cp); STOREV(c41, m + 4, n + VW, cp + VW); }
                cp += ldc;
                if (rows > 5) { STOREV(c50, m + 5, n, cp); STOREV(c51, m + 5, n + VW, cp + VW); }
                continue;
            }
            float acc[MR][NR];
            vstoreV(c00, 0, acc[0]); vstoreV(c01, 1, acc[0]);
            vstoreV(c10, 0, acc[1]); vstoreV(c11, 1, acc[1]);
            vstoreV(c20, 0, acc[2]); vstoreV(c21, 1, acc[2]);
            vstoreV(c30, 0, acc[3]); vstoreV(c31, 1, acc[3]);
            vstoreV(c40, 0, acc[4]); vstoreV(c41, 1, acc[4]);
            vstoreV(c50, 0, acc[5]); vstoreV(c51, 1, acc[5]);
            /* a tile across one image end (nsplit >= NR): the half of VW
             * columns lying in one image by vectors, the other below */
            int j0 = 0, j1 = cols;
            if (cols == NR && nsplit >= NR) {
                const int left = nsplit - p;        /* columns in image img */
                const int h = left >= VW ? 0 : 1;
                __global float* cp = C + m * ldc + (h == 0 ? img * nsC + p
                                                          : (img + 1) * nsC + VW - left);
                for (int i = 0; i < rows; ++i, cp += ldc)
                    STOREV(vloadV(h, acc[i]), m + i, n + VW * h, cp);
                j0 = VW - VW * h;
                j1 = j0 + VW;
            } else if (cols >= VW && (nsplit <= 0 || p + VW <= nsplit)) {
                /* N's edge past the left half (49-pixel planes end in a
                 * 17-column tile with VW 16): that half by vectors */
                __global float* cp = C + m * ldc + img * nsC + p;
                for (int i = 0; i < rows; ++i, cp += ldc)
                    STOREV(vloadV(0, acc[i]), m + i, n, cp);
                j0 = VW;
            }
            for (int j = j0; j < j1; ++j) {
                __global float* cp = C + m * ldc + split_off(n + j, nsplit, nsC);
                for (int i = 0; i < rows; ++i, cp += ldc) {
                    float v = alpha * acc[i][j];
                    if (first) {
#if BIAS == 1
                        v += bias[offBias + zg * M + m + i];
#elif BIAS == 2
                        v += bias[offBias + n + j];
#endif
                        if (beta != 0.0f) v += beta * *cp;
                    } else {
                        v += *cp;
                    }
#if RESIDUAL
                    if (last) v += R[cp - C];
#endif
#if ACT
                    if (last) v = ACT_AT(v, m + i, n + j);
#endif
                    *cp = v;
                }
            }
        }
    }
}
