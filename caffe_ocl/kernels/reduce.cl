/* Reductions: per-channel sums over [outer][C][inner] layouts (Reduction,
 * PReLU slope gradient, bias gradients) and Reduction's backward.
 * -DTERM picks what is summed: SUM x, ASUM |x|, SUMSQ x*x,
 * PRELU w * x * (x <= 0) (w = top diff). -DLSIZE = work-group size (power of 2). */
#include "common.h"

#ifndef TERM
#define TERM 0
#endif
#ifndef LSIZE
#define LSIZE 64
#endif
#if (LSIZE & (LSIZE - 1)) != 0
#error "LSIZE must be a power of two"
#endif

#define TERM_SUM 0
#define TERM_ASUM 1
#define TERM_SUMSQ 2
#define TERM_PRELU 3

inline float term(float x, float w) {
#if TERM == TERM_SUM
    return x;
#elif TERM == TERM_ASUM
    return fabs(x);
#elif TERM == TERM_SUMSQ
    return x * x;
#elif TERM == TERM_PRELU
    return x <= 0.0f ? w * x : 0.0f;
#else
#error "unknown TERM"
#endif
}

/* out[c] = alpha * sum_{o, s} term(x[(o*C + c)*inner + s], w[same]) (+ out[c] if accumulate).
 * One work-group of LSIZE items per channel; groups stride over channels. */
__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void channel_sum(int outer, int C, int inner, __global const float* x,
                 __global const float* w, __global float* out, float alpha, int accumulate) {
    __local float part[LSIZE];
    int lid = get_local_id(0);
    int n = outer * inner;
    for (int c = get_group_id(0); c < C; c += get_num_groups(0)) {
        float s = 0.0f;
        for (int k = lid; k < n; k += LSIZE) {
            int o = k / inner, j = k - o * inner;
            int idx = (o * C + c) * inner + j;
            s += term(x[idx], w[idx]);
        }
        part[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int st = LSIZE / 2; st > 0; st >>= 1) {
            if (lid < st) part[lid] += part[lid + st];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (lid == 0) {
            float v = alpha * part[0];
            out[c] = accumulate ? out[c] + v : v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

#if TERM != TERM_PRELU
inline float8 term8(float8 x) {
#if TERM == TERM_SUM
    return x;
#elif TERM == TERM_ASUM
    return fabs(x);
#else
    return x * x;
#endif
}

/* CPU drivers, outer 1 (Reduction's rows: a LayerNorm's mean over the last
 * axis): work-items of one over chunks of rows, each row summed in float8
 * lanes (channel_sum's 64-item groups with barriers ran a 197 x 192 mean
 * in ~100 us on PoCL). Same result up to the order of the additions. */
__kernel void rows_sum_cpu(int rows, int dim, __global const float* x, __global float* out,
                           float alpha, int accumulate) {
    GLOBAL_LOOP(r, rows) {
        __global const float* px = x + (size_t)r * dim;
        float8 s8 = (float8)(0.0f);
        int k = 0;
        for (; k + 8 <= dim; k += 8) s8 += term8(vload8(0, px + k));
        float s = hsum8(s8);
        for (; k < dim; ++k) s += term(px[k], 0.0f);
        const float v = alpha * s;
        out[r] = accumulate ? out[r] + v : v;
    }
}

/* Reduction backward over rows of length dim:
 * dx[r*dim + k] = coeff * dy[r] * d term / dx  (SUM/MEAN: 1, ASUM: sign(x), SUMSQ: 2x). */
__kernel void reduction_bwd(int num, int dim, __global const float* x,
                            __global const float* dy, __global float* dx, float coeff) {
    int n = num * dim;
    GLOBAL_LOOP(i, n) {
        float g = dy[i / dim] * coeff;
#if TERM == TERM_SUM
        dx[i] = g;
#elif TERM == TERM_ASUM
        float v = x[i];
        dx[i] = ((0.0f < v) - (v < 0.0f)) * g;
#elif TERM == TERM_SUMSQ
        dx[i] = 2.0f * g * x[i];
#endif
    }
}
#endif
