/* Broadcast over an "outer x D x inner" pattern (Scale and Bias layers).
 * y[o, d, i] = x[o, d, i] * scale[d] + bias[d], with HAS_SCALE / HAS_BIAS
 * choosing the terms; y may alias x. */
#include "common.h"
#include "reduce.h"

#ifndef HAS_SCALE
#define HAS_SCALE 1
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef PRODUCT
#define PRODUCT 0
#endif

__kernel void chan_affine(int n, int D, int I, __global const float* x,
                          __global const float* scale, __global const float* bias,
                          __global float* y) {
    GLOBAL_LOOP(k, n) {
        float v = x[k];
#if HAS_SCALE
        v *= scale[(k / I) % D];
#endif
#if HAS_BIAS
        v += bias[(k / I) % D];
#endif
        y[k] = v;
    }
}

/* out[d] = (accumulate ? out[d] : 0) + sum over (o, i) of a[o, d, i]
 * (times b[o, d, i] when PRODUCT). One work-group per d. */
__kernel void chan_sum(int O, int D, int I, __global const float* a,
                       __global const float* b, __global float* out, int accumulate) {
    __local float buf[WG];
    const int m = O * I;
    for (int d = get_group_id(0); d < D; d += get_num_groups(0)) {
        float s = 0.0f;
        for (int j = get_local_id(0); j < m; j += WG) {
            const int k = CHAN_INDEX(j, d, D, I);
#if PRODUCT
            s += a[k] * b[k];
#else
            s += a[k];
#endif
        }
        s = wg_sum(s, buf);
        if (get_local_id(0) == 0) out[d] = accumulate ? out[d] + s : s;
    }
}
