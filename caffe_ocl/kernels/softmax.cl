/* Softmax over the middle axis of [outer][C][inner], one work-item per
 * (outer, inner) pair; max-subtracted as Caffe does. */
#include "common.h"

__kernel void softmax_fwd(int outer, int C, int inner,
                          __global const float* x, __global float* y) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int s = idx % inner, o = idx / inner;
        __global const float* px = x + o * C * inner + s;
        __global float* py = y + o * C * inner + s;
        float m = -FLT_MAX;
        for (int c = 0; c < C; ++c) m = fmax(m, px[c * inner]);
        float sum = 0.0f;
        for (int c = 0; c < C; ++c) { float e = exp(px[c * inner] - m); py[c * inner] = e; sum += e; }
        float inv = 1.0f / sum;
        for (int c = 0; c < C; ++c) py[c * inner] *= inv;
    }
}

/* dx = y * (dy - sum_c dy*y) */
__kernel void softmax_bwd(int outer, int C, int inner, __global const float* y,
                          __global const float* dy, __global float* dx) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int s = idx % inner, o = idx / inner;
        int base = o * C * inner + s;
        float dot = 0.0f;
        for (int c = 0; c < C; ++c) dot += dy[base + c * inner] * y[base + c * inner];
        for (int c = 0; c < C; ++c) {
            int p = base + c * inner;
            dx[p] = y[p] * (dy[p] - dot);
        }
    }
}
