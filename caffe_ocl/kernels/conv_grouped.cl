/* Direct forward of a grouped convolution with few channels per group
 * (ResNeXt's 32 groups of 4-16 channels, RegNet's groups of 8-16): as an
 * implicit GEMM each group is an M = 4..16 row product, so a GPU's 64-128
 * row tiles were 75-95% zeros (ResNeXt-50's first 3 x 3 stage at batch 64:
 * 1.26 ms per layer on the H200, 1.5 TFLOP/s). Launch helpers:
 * caffe_ocl/ops/grouped.py.
 *
 * A work-item owns OB output channels (one block of a group) x PB adjacent
 * output pixels of one row: per input channel and kernel row it loads the
 * input run those PB pixels read (PB strided pixels plus the kernel's
 * reach) once into registers, then each tap's OB weights and PB inputs
 * feed OB * PB multiply-adds. Consecutive work-items take consecutive
 * pixel runs of the same rows and channel block, so a warp's weight
 * reads are one address (broadcast) and its input reads are contiguous.
 *
 * Macros: KH KW SH SW PH PW DH DW (conv_geom.h), CIG (input channels per
 * group), OB (output channels per work-item; divides the group's), PB
 * (output pixels per work-item), BIAS, ACT (act.h).
 * Layouts: x [n][C][H][W], w [CO][CIG][KH][KW], y [n][CO][HO][WO]. */
#include "common.h"
#include "conv_geom.h"
#include "act.h"

#ifndef BIAS
#define BIAS 0
#endif
/* inputs one kernel row of PB outputs reads */
#define XR ((PB - 1) * SW + (KW - 1) * DW + 1)

__kernel void grouped_fwd(int total, int C, int H, int W, int CO, int HO, int WO, int COG,
                          __global const float* X, __global const float* Wt,
                          __global const float* bias, __global float* Y,
                          float act_a, float act_b) {
    const int runs = (WO + PB - 1) / PB;
    const int blocks = CO / OB;
    GLOBAL_LOOP(item, total) {
        /* item = ((img * blocks + block) * HO + ho) * runs + run */
        const int run = item % runs;
        int t = item / runs;
        const int ho = t % HO;
        t /= HO;
        const int block = t % blocks, img = t / blocks;
        const int co0 = block * OB, grp = co0 / COG;
        const int wo0 = run * PB;
        const int hi0 = ho * SH - PH, wi0 = wo0 * SW - PW;
        __global const float* xg = X + ((size_t)img * C + grp * CIG) * H * W;
        __global const float* wg = Wt + (size_t)co0 * CIG * KH * KW;
        float acc[OB][PB];
#pragma unroll
        for (int o = 0; o < OB; ++o)
#pragma unroll
            for (int p = 0; p < PB; ++p) acc[o][p] = 0.0f;
        /* whole input run inside the row: no per-load tests */
        const int inside = wi0 >= 0 && wi0 + XR <= W;
        for (int ci = 0; ci < CIG; ++ci) {
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const int h = hi0 + kh * DH;
                if (h < 0 || h >= H) continue;
                __global const float* row = xg + (ci * H + h) * W;
                float xr[XR];
                if (inside) {
#pragma unroll
                    for (int i = 0; i < XR; ++i) xr[i] = row[wi0 + i];
                } else {
#pragma unroll
                    for (int i = 0; i < XR; ++i) {
                        const int w = wi0 + i;
                        xr[i] = (w >= 0 && w < W) ? row[w] : 0.0f;
                    }
                }
                __global const float* wt = wg + (ci * KH + kh) * KW;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                    for (int o = 0; o < OB; ++o) {
                        const float wv = wt[o * CIG * KH * KW + kw];
#pragma unroll
                        for (int p = 0; p < PB; ++p)
                            acc[o][p] = fma(wv, xr[p * SW + kw * DW], acc[o][p]);
                    }
            }
        }
        __global float* yp = Y + (((size_t)img * CO + co0) * HO + ho) * WO + wo0;
        const int np = min(PB, WO - wo0);
#pragma unroll
        for (int o = 0; o < OB; ++o) {
#if BIAS
            const float b = bias[co0 + o];
#else
            const float b = 0.0f;
#endif
#pragma unroll
            for (int p = 0; p < PB; ++p)
                if (p < np)
                    yp[o * HO * WO + p] = APPLY_ACT_CH(acc[o][p] + b,
                                                       PRELU_SLOPE(bias, co0 + o));
        }
    }
}
