/* Local response normalisation across channels, as Caffe's LRNLayer:
 *   scale = k + alpha/size * sum_{c' in [c-pre, c+post]} x[c']^2
 *   y = x * scale^-beta            (pre = (size-1)/2, post = size-1-pre) */
#include "common.h"

__kernel void lrn_across_fwd(int outer, int C, int inner, int size, float alpha_over_size,
                             float beta, float k, __global const float* x,
                             __global float* scale, __global float* y) {
    int total = outer * inner;
    int pre = (size - 1) / 2, post = size - 1 - pre;
    GLOBAL_LOOP(idx, total) {
        int s = idx % inner, o = idx / inner;
        __global const float* px = x + o * C * inner + s;
        for (int c = 0; c < C; ++c) {
            float acc = 0.0f;
            int c0 = max(c - pre, 0), c1 = min(c + post, C - 1);
            for (int j = c0; j <= c1; ++j) { float v = px[j * inner]; acc += v * v; }
            float sc = k + alpha_over_size * acc;
            int o2 = o * C * inner + c * inner + s;
            scale[o2] = sc;
            y[o2] = px[c * inner] * pow(sc, -beta);
        }
    }
}

__kernel void lrn_across_bwd(int outer, int C, int inner, int size, float cache_ratio,
                             float beta, __global const float* x, __global const float* y,
                             __global const float* scale, __global const float* dy,
                             __global float* dx) {
    int total = outer * inner;
    int pre = (size - 1) / 2, post = size - 1 - pre;
    GLOBAL_LOOP(idx, total) {
        int s = idx % inner, o = idx / inner;
        int base = o * C * inner + s;
        for (int c = 0; c < C; ++c) {
            float acc = 0.0f;
            int c0 = max(c - post, 0), c1 = min(c + pre, C - 1);
            for (int j = c0; j <= c1; ++j) {
                int q = base + j * inner;
                acc += dy[q] * y[q] / scale[q];
            }
            int p = base + c * inner;
            dx[p] = dy[p] * pow(scale[p], -beta) - cache_ratio * x[p] * acc;
        }
    }
}

/* WITHIN_CHANNEL, as Caffe composes it: square -> AVE pool (size, pad
 * (size-1)/2, stride 1, divisor counting padding) -> (1 + alpha*pool)^-beta
 * -> times x. `scale` keeps 1 + alpha*pool for backward. */
__kernel void lrn_within_fwd(int total, int H, int W, int size, float alpha, float beta,
                             __global const float* x, __global float* scale,
                             __global float* y) {
    int pad = (size - 1) / 2;
    GLOBAL_LOOP(idx, total) {
        int w = idx % W, h = (idx / W) % H, nc = idx / (W * H);
        int hs = h - pad, ws = w - pad;
        int he = min(hs + size, H + pad), we = min(ws + size, W + pad);
        int cnt = (he - hs) * (we - ws);
        hs = max(hs, 0); ws = max(ws, 0); he = min(he, H); we = min(we, W);
        __global const float* p = x + nc * H * W;
        float acc = 0.0f;
        for (int i = hs; i < he; ++i)
            for (int j = ws; j < we; ++j) { float v = p[i * W + j]; acc += v * v; }
        float sc = 1.0f + alpha * (acc / cnt);
        scale[idx] = sc;
        y[idx] = x[idx] * pow(sc, -beta);
    }
}

/* d/dx of y = x * (1 + alpha*avgpool(x^2))^-beta:
 * dx = dy*scale^-beta - 2*alpha*beta*x * sum_{windows q covering me}
 *        dy[q]*y[q]/scale[q] / cnt(q) */
__kernel void lrn_within_bwd(int total, int H, int W, int size, float alpha, float beta,
                             __global const float* x, __global const float* y,
                             __global const float* scale, __global const float* dy,
                             __global float* dx) {
    int pad = (size - 1) / 2;
    GLOBAL_LOOP(idx, total) {
        int w = idx % W, h = (idx / W) % H, nc = idx / (W * H);
        int base = nc * H * W;
        float acc = 0.0f;
        /* window of output q=(qh,qw) covers rows qh-pad .. qh-pad+size-1 */
        for (int qh = max(h - (size - 1 - pad), 0); qh <= min(h + pad, H - 1); ++qh)
            for (int qw = max(w - (size - 1 - pad), 0); qw <= min(w + pad, W - 1); ++qw) {
                int hs = qh - pad, ws = qw - pad;
                int he = min(hs + size, H + pad), we = min(ws + size, W + pad);
                int cnt = (he - hs) * (we - ws);
                int q = base + qh * W + qw;
                acc += dy[q] * y[q] / scale[q] / cnt;
            }
        dx[idx] = dy[idx] * pow(scale[idx], -beta) - 2.0f * alpha * beta * x[idx] * acc;
    }
}
