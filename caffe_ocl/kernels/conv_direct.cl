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
                vstore8(APPLY_ACT8(v), 0, yrow + o * HO * WO + wo0);
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
                yrow[o * HO * WO + wo] = APPLY_ACT(v);
            }
        }
    }
}
