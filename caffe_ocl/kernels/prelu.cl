/* PReLU: y = max(x, 0) + slope[c] * min(x, 0), c = (i / dim) % channels / div_factor
 * (div_factor = channels when the slope is shared). The slope gradient is
 * reduce.cl's channel_sum with TERM_PRELU. */
#include "common.h"

__kernel void prelu_fwd(int n, int channels, int dim, int div_factor,
                        __global const float* x, __global float* y,
                        __global const float* slope) {
    GLOBAL_LOOP(i, n) {
        int c = (i / dim) % channels / div_factor;
        float v = x[i];
        y[i] = fmax(v, 0.0f) + slope[c] * fmin(v, 0.0f);
    }
}

__kernel void prelu_bwd(int n, int channels, int dim, int div_factor,
                        __global const float* x, __global const float* dy,
                        __global float* dx, __global const float* slope) {
    GLOBAL_LOOP(i, n) {
        int c = (i / dim) % channels / div_factor;
        float v = x[i];
        dx[i] = dy[i] * (v > 0.0f ? 1.0f : slope[c]);
    }
}
