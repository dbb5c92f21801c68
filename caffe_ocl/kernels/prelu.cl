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

/* CPU drivers (ops/prelu.py): work-items over (plane, piece of CHUNK floats
 * of the plane), the slope read once a piece, 8 floats a step. The
 * element-wise kernels above divide twice per float to find its channel:
 * on PoCL they ran at ~0.35 G floats/s, 60% of MTCNN's P-Net forward. */
#define PRELU_PLANES_LOOP(BODY8, BODY1)                                        \
    const int pieces = (dim + CHUNK - 1) / CHUNK;                              \
    GLOBAL_LOOP(item, planes * pieces) {                                       \
        const int plane = item / pieces, i0 = (item - plane * pieces) * CHUNK; \
        const int end = min(dim, i0 + CHUNK);                                  \
        const float a = slope[plane % channels / div_factor];                  \
        const size_t off = (size_t)plane * dim;                                \
        int i = i0;                                                            \
        for (; i + 8 <= end; i += 8) { BODY8 }                                 \
        for (; i < end; ++i) { BODY1 }                                         \
    }

#ifndef CHUNK
#define CHUNK 4096
#endif

__kernel void prelu_fwd_planes(int planes, int channels, int dim, int div_factor,
                               __global const float* x, __global float* y,
                               __global const float* slope) {
    PRELU_PLANES_LOOP(
        const float8 v = vload8(0, x + off + i);
        vstore8(fmax(v, 0.0f) + a * fmin(v, 0.0f), 0, y + off + i);,
        const float v = x[off + i];
        y[off + i] = fmax(v, 0.0f) + a * fmin(v, 0.0f);)
}

__kernel void prelu_bwd_planes(int planes, int channels, int dim, int div_factor,
                               __global const float* x, __global const float* dy,
                               __global float* dx, __global const float* slope) {
    PRELU_PLANES_LOOP(
        const float8 v = vload8(0, x + off + i);
        const float8 g = vload8(0, dy + off + i);
        vstore8(select((float8)a * g, g, v > 0.0f), 0, dx + off + i);,
        const float v = x[off + i];
        dx[off + i] = dy[off + i] * (v > 0.0f ? 1.0f : a);)
}
