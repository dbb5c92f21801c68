/* Direct convolution forward for CPU drivers, for layers with few input
 * channels (a net's first convolution: 3 -> 16..64 channels, 3 x 3 stride 2
 * in the mobile nets). As a GEMM such a layer has K = C*KH*KW = 27: the
 * CPU GEMM (gemm_cpu.cl) then spends most of its time packing columns and
 * the zero-padded copy of the image, about 2.5x ONNX Runtime's time on
 * MobileNet v2's first layer. Here a work-item owns one output row of OCB
 * output channels of one image and walks it 8 pixels at a time: per kernel
 * tap one vector of 8 input pixels (run8: one load at stride 1, two at
 * stride 2) feeds OCB multiply-adds of float8, with no copies and no
 * padding buffer: taps falling outside the image are skipped by row, and
 * the few pixels at a row's ends whose taps reach into the padding are
 * computed one at a time.
 *
 * Macros: C_IN (input channels), KH KW SH SW PH PW DH DW, BIAS, ACT (act.h).
 * Layouts: x [n][C_IN][H][W], weights [CO][C_IN][KH][KW], y images ych*HO*WO
 * floats apart from offY (a Concat's slice: ych > CO). */
#include "common.h"
#include "act.h"

#ifndef BIAS
#define BIAS 0
#endif
#define OCB 8
#define TAPS (C_IN * KH * KW)

/* acc[o] += w[o][tap] * X over every tap (c, kh, kw) of output row ho:
 * LOAD is the tap's input (row, kw in scope), T its type (float8: 8
 * pixels; float: one) */
#define TAP_LOOPS(T, LOAD)                                                 \
    _Pragma("unroll")                                                      \
    for (int c = 0; c < C_IN; ++c) {                                       \
        _Pragma("unroll")                                                  \
        for (int kh = 0; kh < KH; ++kh) {                                  \
            const int h = hbase + kh * DH;                                 \
            if (h < 0 || h >= H) continue;                                 \
            __global const float* row = xi + (c * H + h) * W;              \
            _Pragma("unroll")                                              \
            for (int kw = 0; kw < KW; ++kw) {                              \
                const T xv = LOAD;                                         \
                const float* wt = wl + ((c * KH + kh) * KW + kw) * OCB;    \
                _Pragma("unroll")                                          \
                for (int o = 0; o < OCB; ++o)                              \
                    acc[o] = fma((T)wt[o], xv, acc[o]);                    \
            }                                                              \
        }                                                                  \
    }

__kernel void conv_direct_fwd(int NIMG, int H, int W, int CO, int HO, int WO,
                              __global const float* X, __global const float* Wt,
                              __global const float* bias, __global float* Y, int offY,
                              int ych, float act_a, float act_b) {
    const int nb = (CO + OCB - 1) / OCB;
    /* the current block's weights tap-major (wl[t][o]), so a tap's OCB
     * weights are adjacent; rows past CO are zero and never stored. A
     * work-item's run of items holds consecutive rows of one block (items
     * are image-, block-, row-major), so they are gathered when the block
     * changes, not for every row (per row they cost ~1/8 of its
     * arithmetic) */
    float wl[TAPS * OCB];
    int wl_block = -1;
    GLOBAL_LOOP(item, NIMG * nb * HO) {
        const int img = item / (nb * HO), r = item - img * nb * HO;
        const int ob = r / HO, ho = r - ob * HO;
        const int co0 = ob * OCB;
        if (ob != wl_block) {
            for (int o = 0; o < OCB; ++o)
                for (int t = 0; t < TAPS; ++t)
                    wl[t * OCB + o] = co0 + o < CO ? Wt[(co0 + o) * TAPS + t] : 0.0f;
            wl_block = ob;
        }
        __global const float* xi = X + img * C_IN * H * W;
        __global float* yrow = Y + offY + (img * ych + co0) * HO * WO + ho * WO;
        const int hbase = ho * SH - PH;
        /* output pixels whose taps all lie inside the row: [lo, hi] */
        const int lo = min(WO, (PW + SW - 1) / SW);
        const int room = W - 1 + PW - (KW - 1) * DW;     /* may be < 0: no such pixel */
        const int hi = room < 0 ? -1 : min(WO - 1, room / SW);
        const int nvec = (SW <= 2 && hi - lo + 1 >= 8) ? (hi - lo + 1 + 7) / 8 : 0;
        /* vector blocks of 8 over [lo, hi], the last one moved back to end
         * at hi (it recomputes a few pixels of the one before: same values) */
        for (int b = 0; b < nvec; ++b) {
            const int wo0 = min(lo + 8 * b, hi - 7);
            const int wi0 = wo0 * SW - PW;
            float8 acc[OCB];
#pragma unroll
            for (int o = 0; o < OCB; ++o) acc[o] = (float8)0.0f;
            TAP_LOOPS(float8, run8(row + wi0 + kw * DW, SW))
            for (int o = 0; o < OCB && co0 + o < CO; ++o) {
                float8 v = acc[o];
#if BIAS
                v += (float8)bias[co0 + o];
#endif
                vstore8(APPLY_ACT8_CH(v, PRELU_SLOPE(bias, co0 + o)), 0, yrow + o * HO * WO + wo0);
            }
        }
        /* the rest one pixel at a time: the row's ends, where taps fall in
         * the padding (skipped), or every pixel of a row too short */
        for (int wo = 0; wo < WO; ++wo) {
            if (nvec && wo == lo) wo = hi + 1;
            if (wo >= WO) break;
            const int wi = wo * SW - PW;
            float acc[OCB];
#pragma unroll
            for (int o = 0; o < OCB; ++o) acc[o] = 0.0f;
            TAP_LOOPS(float, (wi + kw * DW >= 0 && wi + kw * DW < W) ? row[wi + kw * DW] : 0.0f)
            for (int o = 0; o < OCB && co0 + o < CO; ++o) {
                float v = acc[o];
#if BIAS
                v += bias[co0 + o];
#endif
                yrow[o * HO * WO + wo] = APPLY_ACT_CH(v, PRELU_SLOPE(bias, co0 + o));
            }
        }
    }
}

/* conv_direct_rows: the same layers (few input channels, stride 1 or 2
 * along rows, output rows of at least DR_PIX pixels) computed from a
 * zero-padded copy of the input rows an output row reads, in __local
 * memory (kernels/pad_rows.h; at stride 2 each row de-interleaved), so
 * that every tap of 8 consecutive outputs is one contiguous 8-float load
 * and no pixel needs a bounds test. conv_direct_fwd above spent two loads
 * and a shuffle per tap at stride 2 and fed one input vector to 8
 * accumulators (10 loads per 8 fmas): MobileNet v2's first layer ran at
 * 0.56 of ONNX Runtime's in-net time. Here a work-item owns one output
 * row of one image and every output channel: tiles of DR_CB channels x
 * DR_PV vectors of 8 pixels (12 accumulators), DR_PV + DR_CB loads per
 * DR_CB * DR_PV fmas. A row's last tile moves back to end at the row's
 * end (it recomputes a few pixels: the same values).
 *
 * Host macros besides conv_direct_fwd's: DR_CO (output channels), RS (floats
 * of a staged row: the padded width, even at stride 2), NR (rows staged a
 * channel: (KH - 1) * DH + 1). __local: the rows, C_IN * NR * RS floats,
 * and the weights tap-major per block of DR_CB channels, copied once per
 * work-item. */
#ifndef DR_CB
#define DR_CB 4
#endif
#ifndef DR_PV
#define DR_PV 3
#endif
#define DR_PIX (8 * DR_PV)
#ifdef RS
#include "pad_rows.h"
#define DR_BLOCKS ((DR_CO + DR_CB - 1) / DR_CB)

__kernel void conv_direct_rows(int NIMG, int H, int W, int HO, int WO,
                               __global const float* X, __global const float* Wt,
                               __global const float* bias, __global float* Y, int offY,
                               int ych, float act_a, float act_b) {
    __local float rows[C_IN * NR * RS];
    __local float wl[DR_BLOCKS * TAPS * DR_CB];
    for (int b = 0; b < DR_BLOCKS; ++b)
        for (int t = 0; t < TAPS; ++t)
            for (int o = 0; o < DR_CB; ++o) {
                const int co = b * DR_CB + o;
                wl[(b * TAPS + t) * DR_CB + o] = co < DR_CO ? Wt[co * TAPS + t] : 0.0f;
            }
    /* the first item writes the rows' padding; later ones only the image's
     * values over it (the padding is never overwritten), but an item
     * reading rows outside the image zeroes those whole (zeros || edge) */
    int zeros = 1;
    GLOBAL_LOOP(item, NIMG * HO) {
        const int img = item / HO, ho = item - img * HO;
        const int ih0 = ho * SH - PH;
        const int edge = ih0 < 0 || ih0 + NR > H;
        for (int c = 0; c < C_IN; ++c)
            pad_rows_local(rows + c * NR * RS, X + (size_t)(img * C_IN + c) * H * W, ih0, NR,
                           H, W, RS, zeros || edge, 0);
        zeros = 0;
        __global float* yrow = Y + offY + (size_t)img * ych * HO * WO + ho * WO;
        for (int b = 0; b < DR_BLOCKS; ++b) {
            __local const float* wb = wl + b * TAPS * DR_CB;
            for (int p0 = 0; p0 < WO; p0 += DR_PIX) {
                const int p = min(p0, WO - DR_PIX);
                float8 acc[DR_CB][DR_PV];
#pragma unroll
                for (int o = 0; o < DR_CB; ++o)
#pragma unroll
                    for (int v = 0; v < DR_PV; ++v) acc[o][v] = (float8)0.0f;
#pragma unroll
                for (int c = 0; c < C_IN; ++c)
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                        for (int kw = 0; kw < KW; ++kw) {
                            const int t = kw * DW;
                            /* padded column SW * (p + i) + t */
                            __local const float* xr = rows + (c * NR + kh * DH) * RS + p
                                + (SW == 2 ? ((t & 1) ? RS / 2 : 0) + (t >> 1) : t);
                            float8 xv[DR_PV];
#pragma unroll
                            for (int v = 0; v < DR_PV; ++v) xv[v] = vload8(v, xr);
                            __local const float* wt = wb + ((c * KH + kh) * KW + kw) * DR_CB;
#pragma unroll
                            for (int o = 0; o < DR_CB; ++o) {
                                const float8 w = (float8)wt[o];
#pragma unroll
                                for (int v = 0; v < DR_PV; ++v) acc[o][v] = fma(w, xv[v], acc[o][v]);
                            }
                        }
                for (int o = 0; o < DR_CB; ++o) {
                    const int co = b * DR_CB + o;
                    if (co >= DR_CO) break;
#if BIAS
                    const float8 bv = (float8)bias[co];
#endif
                    for (int v = 0; v < DR_PV; ++v) {
                        float8 r = acc[o][v];
#if BIAS
                        r += bv;
#endif
                        vstore8(APPLY_ACT8_CH(r, PRELU_SLOPE(bias, co)), v, yrow + co * HO * WO + p);
                    }
                }
            }
        }
    }
}
#endif
