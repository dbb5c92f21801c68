/* Second step of a GEMM split along K (ops/gemm_splitk.py): the nsplit
 * partial products ws[s][M][N] (alpha already applied) are summed into C
 * with gemm.cl's epilogue in the same order: + bias, + beta*C, + R (a
 * residual laid out as C from offR, RESIDUAL 1), then the activation.
 * BIAS 1: per row (bias[m]), 2: per column (bias[n]). */
#include "common.h"

#ifndef BIAS
#define BIAS 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#include "act.h"

__kernel void gemm_splitk_reduce(int M, int N, int nsplit, __global const float* ws,
                                 float beta, __global float* C, int offC, int ldc,
                                 __global const float* bias, int offBias,
                                 float act_a, float act_b,
                                 __global const float* R, int offR) {
    const int MN = M * N;
    GLOBAL_LOOP(i, MN) {
        const int m = i / N, n = i - m * N;
        float v = 0.0f;
        for (int s = 0; s < nsplit; ++s) v += ws[s * MN + i];
#if BIAS == 1
        v += bias[offBias + m];
#elif BIAS == 2
        v += bias[offBias + n];
#endif
        __global float* c = C + offC + m * ldc + n;
        if (beta != 0.0f) v += beta * *c;
#if RESIDUAL
        v += R[offR + m * ldc + n];
#endif
#if BIAS == 2
        *c = APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + n));
#else
        *c = APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + m));
#endif
    }
}

/* Second step of a convolution forward split along K (ops/conv.py,
 * conv_igemm.cl FWD_KCHUNK): the nsplit partial outputs ws[s][n][CO][HOWO]
 * summed into y with conv_fwd's epilogue: + bias[channel] (BIAS 1), +
 * beta*y, + R[i] (RESIDUAL: a tensor laid out as y), then the activation. */
__kernel void conv_splitk_reduce(int total, int HOWO, int CO, int nsplit,
                                 __global const float* ws, float beta, __global float* Y,
                                 __global const float* bias, float act_a, float act_b,
                                 __global const float* R, int offY, int YCO) {
    /* y's images lie YCO planes apart from offY on (YCO > CO: a slice of a
     * Concat's top, plan/concat.py); ws and R are shaped as y itself */
    const int gap = (YCO - CO) * HOWO, image = CO * HOWO;
    GLOBAL_LOOP(i, total) {
        float v = 0.0f;
        for (int s = 0; s < nsplit; ++s) v += ws[s * total + i];
#if BIAS
        v += bias[(i / HOWO) % CO];
#endif
        __global float* y = Y + offY + i + (i / image) * gap;
        if (beta != 0.0f) v += beta * *y;
#if RESIDUAL
        v += R[i];
#endif
        *y = APPLY_ACT_CH(v, PRELU_SLOPE(bias, (i / HOWO) % CO));
    }
}
