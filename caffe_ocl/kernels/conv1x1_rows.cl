/* 1x1 convolutions (stride 1, no padding, one group) on CPU drivers, read
 * straight from the images: y[n][m][p] = act(sum_k W[m][k] x[n][k][p]
 * (+ bias[m]) (+ R[n][m][p])).
 *
 * Why: on the large planes of the mobile nets' first stages (112 x 112,
 * 56 x 56) their 1x1 layers have few channels (MobileNet v2's 32 -> 16
 * projection, 16 -> 96 expansion, 144 -> 24). As a GEMM (gemm_cpu.cl) each
 * block of pixels is first packed into local memory, then swept by 6 x 16
 * tiles: with K = 16..144 the packing is a large share of the work, and 16
 * or 24 rows fill 6-row tiles with 2 idle rows of 18 (16). Here a pixel's
 * column of x is already contiguous across the tile: each work-item takes
 * runs of PIX = 8 * PV pixels of one image and, for every block of CB
 * output channels, sums over K with CB x PV float8 accumulators, PV vector
 * loads of x and CB broadcast weights per k (x's run stays in L1 across
 * the channel blocks). The last run of a plane moves back to end at the
 * plane's end (recomputing a few pixels of the run before: the same
 * values, written by the same work-item).
 *
 * GATE (an SE block's channel scale before its projection, plan/se.py):
 * x's channels scaled by G[img * gstride + k] -- the weights times the
 * gate, copied into __local memory once per image a work-item runs (once
 * for all where gstride is 0), read there instead of Wt.
 *
 * Macros: K, M (channels in / out), CB, PV, BIAS, RESIDUAL, GATE, ACT (act.h).
 * Work-items (work-groups of one) over (image, chunk of CHUNK pixels,
 * the last one longer), CHUNK a multiple of PIX. y images lie ych * HW floats apart from offY. */
#include "common.h"
#include "act.h"

#ifndef BIAS
#define BIAS 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#ifndef GATE
#define GATE 0
#endif
#define PIX (8 * PV)
#ifndef SUB
#define SUB 4
#endif
/* where the weights are read: their gated copy (GATE) or Wt */
#if GATE
#define W_SPACE __local
#define W_BASE wg
#else
#define W_SPACE __global
#define W_BASE Wt
#endif
#define MBLOCKS ((M + CB - 1) / CB)

/* acc[o][v] += w[o][k] * x[k][run's vector v] (w, xp, acc in scope) */
#define R1_STEP(k)                                                         \
    do {                                                                   \
        float8 xv[PV];                                                     \
        _Pragma("unroll")                                                  \
        for (int v = 0; v < PV; ++v) xv[v] = vload8(v, xp + (size_t)(k) * HW); \
        _Pragma("unroll")                                                  \
        for (int o = 0; o < CB; ++o) {                                     \
            const float8 wv = (float8)w[o][k];                             \
            _Pragma("unroll")                                              \
            for (int v = 0; v < PV; ++v) acc[o][v] = fma(wv, xv[v], acc[o][v]); \
        }                                                                  \
    } while (0)

__kernel void conv1x1_rows(int NIMG, int HW, int CHUNK, __global const float* X,
                           __global const float* Wt, __global const float* bias,
                           __global float* Y, int offY, int ych, __global const float* R,
                           float act_a, float act_b, __global const float* G, int gstride) {
#if GATE
    __local float wg[M * K];
    int wg_img = -1;
#endif
    /* the last chunk of a plane takes its remainder too (no chunk is
     * shorter than a run: the last run moves back inside its own chunk) */
    const int chunks = max(1, HW / CHUNK);
    GLOBAL_LOOP(item, NIMG * chunks) {
        const int img = item / chunks, ch = item - img * chunks;
        const int p_end = ch == chunks - 1 ? HW : (ch + 1) * CHUNK;
        __global const float* x = X + (size_t)img * K * HW;
#if GATE
        if (wg_img < 0 || (gstride && img != wg_img)) {
            __global const float* gi = G + (size_t)img * gstride;
            for (int m = 0; m < M; ++m)
                for (int k = 0; k < K; ++k) wg[m * K + k] = Wt[m * K + k] * gi[k];
            wg_img = img;
        }
#endif
        /* runs of SUB tiles: each block of channels goes over the run's
         * tiles (its rows of y written SUB * PIX pixels at a time; one tile
         * at a time, ResNet's 64 -> 256 layers with 256 rows of 24-pixel
         * pieces ran 1.25x the GEMM's time in the net) */
        for (int s0 = ch * CHUNK; s0 < p_end; s0 += SUB * PIX)
        for (int mb = 0; mb < MBLOCKS; ++mb)
        for (int p0 = s0; p0 < min(p_end, s0 + SUB * PIX); p0 += PIX) {
            const int p = min(p0, HW - PIX);
            __global const float* xp = x + p;
            /* rows past M repeat row M - 1 (never stored) */
            W_SPACE const float* w[CB];
#pragma unroll
            for (int o = 0; o < CB; ++o) w[o] = W_BASE + (size_t)min(mb * CB + o, M - 1) * K;
            float8 acc[CB][PV];
#pragma unroll
            for (int o = 0; o < CB; ++o)
#pragma unroll
                for (int v = 0; v < PV; ++v) acc[o][v] = (float8)0.0f;
            /* K in steps of 4, then the rest: `#pragma unroll 4` over K
             * = 58 or 62 (ShuffleNet v2) ran 1.7x slower than K = 56 or
             * 60 on PoCL */
            int k = 0;
            for (; k + 4 <= K; k += 4) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) R1_STEP(k + kk);
            }
#pragma unroll
            for (; k < K; ++k) R1_STEP(k);
#pragma unroll
            for (int o = 0; o < CB; ++o) {
                const int m = mb * CB + o;
                if (m >= M) break;
                __global float* yo = Y + offY + ((size_t)img * ych + m) * HW + p;
#if RESIDUAL
                __global const float* ro = R + ((size_t)img * M + m) * HW + p;
#endif
#pragma unroll
                for (int v = 0; v < PV; ++v) {
                    float8 r = acc[o][v];
#if BIAS
                    r += (float8)bias[m];
#endif
#if RESIDUAL
                    r += vload8(v, ro);
#endif
                    vstore8(APPLY_ACT8_CH(r, PRELU_SLOPE(bias, m)), v, yo);
                }
            }
        }
    }
}
