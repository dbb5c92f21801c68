/* Local response normalisation across channels, as Caffe's LRNLayer:
 *   scale = k + alpha/size * sum_{c' in [c-pre, c+post]} x[c']^2
 *   y = x * scale^-beta            (pre = (size-1)/2, post = size-1-pre) */
#include "common.h"

/* x^-beta for x > 0 (scalars and vectors). PoCL's pow() costs ~150 ns a
 * call (it dominated these kernels); exp2(-beta * log2(x)) is a few ns and
 * within a few ulp. BETA_075 (the host sets it for beta = 0.75: AlexNet,
 * CaffeNet, GoogLeNet): rsqrt(x) * sqrt(rsqrt(x)), square roots only. */
#if BETA_075
#define POW_NEG(x, beta) (rsqrt(x) * sqrt(rsqrt(x)))
#else
#define POW_NEG(x, beta) exp2(-(beta) * log2(x))
#endif

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
            y[o2] = px[c * inner] * POW_NEG(sc, beta);
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
            dx[p] = dy[p] * POW_NEG(scale[p], beta) - cache_ratio * x[p] * acc;
        }
    }
}

/* WITHIN_CHANNEL, as Caffe composes it: square -> AVE pool (size, pad
 * (size-1)/2, stride 1, divisor counting padding) -> (1 + alpha*pool)^-beta
 * -> times x. `scale` keeps 1 + alpha*pool for backward. */
/* one output of WITHIN_CHANNEL LRN: pixel (h, w) of plane nc */
inline void lrn_within_fwd_at(int nc, int h, int w, int H, int W, int size, float alpha,
                              float beta, __global const float* x, __global float* scale,
                              __global float* y) {
    const int pad = (size - 1) / 2;
    int hs = h - pad, ws = w - pad;
    int he = min(hs + size, H + pad), we = min(ws + size, W + pad);
    const int cnt = (he - hs) * (we - ws);
    hs = max(hs, 0); ws = max(ws, 0); he = min(he, H); we = min(we, W);
    __global const float* p = x + (size_t)nc * H * W;
    float acc = 0.0f;
    for (int i = hs; i < he; ++i)
        for (int j = ws; j < we; ++j) { float v = p[i * W + j]; acc += v * v; }
    const float sc = 1.0f + alpha * (acc / cnt);
    const size_t idx = ((size_t)nc * H + h) * W + w;
    scale[idx] = sc;
    y[idx] = x[idx] * POW_NEG(sc, beta);
}

__kernel void lrn_within_fwd(int total, int H, int W, int size, float alpha, float beta,
                             __global const float* x, __global float* scale,
                             __global float* y) {
    GLOBAL_LOOP(idx, total) {
        lrn_within_fwd_at(idx / (W * H), (idx / W) % H, idx % W, H, W, size, alpha, beta,
                          x, scale, y);
    }
}

/* d/dx of y = x * (1 + alpha*avgpool(x^2))^-beta:
 * dx = dy*scale^-beta - 2*alpha*beta*x * sum_{windows q covering me}
 *        dy[q]*y[q]/scale[q] / cnt(q) */
inline void lrn_within_bwd_at(int nc, int h, int w, int H, int W, int size, float alpha,
                              float beta, __global const float* x, __global const float* y,
                              __global const float* scale, __global const float* dy,
                              __global float* dx) {
    const int pad = (size - 1) / 2;
    const int base = nc * H * W;
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
    const int idx = base + h * W + w;
    dx[idx] = dy[idx] * POW_NEG(scale[idx], beta) - 2.0f * alpha * beta * x[idx] * acc;
}

__kernel void lrn_within_bwd(int total, int H, int W, int size, float alpha, float beta,
                             __global const float* x, __global const float* y,
                             __global const float* scale, __global const float* dy,
                             __global float* dx) {
    GLOBAL_LOOP(idx, total) {
        lrn_within_bwd_at(idx / (W * H), (idx / W) % H, idx % W, H, W, size, alpha, beta,
                          x, y, scale, dy, dx);
    }
}

/* CPU drivers (ops/lrn.py): the same outputs by rows of a plane, the row
 * found once (per element, three divisions: WITHIN_CHANNEL LRN -- BVLC's
 * CIFAR-10 full net -- ran at half OpenCV's speed on PoCL) */
__kernel void lrn_within_fwd_rows(int rows, int H, int W, int size, float alpha, float beta,
                                  __global const float* x, __global float* scale,
                                  __global float* y) {
    GLOBAL_LOOP(r, rows) {
        const int nc = r / H, h = r - nc * H;
        for (int w = 0; w < W; ++w)
            lrn_within_fwd_at(nc, h, w, H, W, size, alpha, beta, x, scale, y);
    }
}

__kernel void lrn_within_bwd_rows(int rows, int H, int W, int size, float alpha, float beta,
                                  __global const float* x, __global const float* y,
                                  __global const float* scale, __global const float* dy,
                                  __global float* dx) {
    GLOBAL_LOOP(r, rows) {
        const int nc = r / H, h = r - nc * H;
        for (int w = 0; w < W; ++w)
            lrn_within_bwd_at(nc, h, w, H, W, size, alpha, beta, x, y, scale, dy, dx);
    }
}

/* ---- CPU drivers (ops/lrn.py picks these when dev.is_cpu) -----------------
 * One work-item walks a range of (image, 8 consecutive pixels) units; for
 * each it sweeps the channels once with a running window sum (as Caffe's
 * CPU code), in float8 along the contiguous pixel axis, so loads are
 * sequential and exp2/log2 run as vector built-ins. The last unit of a row
 * of `inner` pixels, when inner % 8 != 0, runs the same code on scalars. */
#define ACROSS_FWD_BODY(T, LD, ST, SQ)                                          \
    {                                                                           \
        T acc = (T)0.0f;                                                        \
        for (int j = 0; j < min(post, C); ++j) { T v = LD(px + j * inner); acc += SQ(v); } \
        for (int c = 0; c < C; ++c) {                                           \
            if (c + post < C) { T v = LD(px + (c + post) * inner); acc += SQ(v); } \
            if (c - pre - 1 >= 0) { T v = LD(px + (c - pre - 1) * inner); acc -= SQ(v); } \
            T sc = (T)k + alpha_over_size * acc;                                \
            ST(sc, ps + c * inner);                                             \
            ST(LD(px + c * inner) * POW_NEG(sc, beta), py + c * inner);   \
        }                                                                       \
    }

#define LD8(p) vload8(0, (p))
#define ST8(v, p) vstore8((v), 0, (p))
#define LD1(p) (*(p))
#define ST1(v, p) (*(p) = (v))
#define SQ(v) ((v) * (v))

__kernel void lrn_across_fwd_cpu(int outer, int C, int inner, int size, float alpha_over_size,
                                 float beta, float k, __global const float* x,
                                 __global float* scale, __global float* y) {
    const int pre = (size - 1) / 2, post = size - 1 - pre;
    const int ng = (inner + 7) / 8, units = outer * ng;
    const int per = (units + (int)get_global_size(0) - 1) / (int)get_global_size(0);
    const int u0 = (int)get_global_id(0) * per, u1 = min(units, u0 + per);
    for (int u = u0; u < u1; ++u) {
        const int o = u / ng, s0 = (u - o * ng) * 8;
        const size_t base = (size_t)o * C * inner;
        if (s0 + 8 <= inner) {
            __global const float* px = x + base + s0;
            __global float* ps = scale + base + s0;
            __global float* py = y + base + s0;
            ACROSS_FWD_BODY(float8, LD8, ST8, SQ)
        } else {
            for (int s = s0; s < inner; ++s) {
                __global const float* px = x + base + s;
                __global float* ps = scale + base + s;
                __global float* py = y + base + s;
                ACROSS_FWD_BODY(float, LD1, ST1, SQ)
            }
        }
    }
}

/* dx[c] = dy[c]*scale[c]^-beta - cache_ratio*x[c]*sum_{j=c-post..c+pre} dy*y/scale */
#define ACROSS_BWD_BODY(T, LD, ST)                                              \
    {                                                                           \
        T acc = (T)0.0f;                                                        \
        for (int j = 0; j < min(pre, C); ++j)                                   \
            acc += LD(pdy + j * inner) * LD(py + j * inner) / LD(ps + j * inner); \
        for (int c = 0; c < C; ++c) {                                           \
            int a = c + pre, r = c - post - 1;                                  \
            if (a < C) acc += LD(pdy + a * inner) * LD(py + a * inner) / LD(ps + a * inner); \
            if (r >= 0) acc -= LD(pdy + r * inner) * LD(py + r * inner) / LD(ps + r * inner); \
            T sc = LD(ps + c * inner);                                          \
            ST(LD(pdy + c * inner) * POW_NEG(sc, beta)                     \
               - cache_ratio * LD(px + c * inner) * acc, pdx + c * inner);      \
        }                                                                       \
    }

__kernel void lrn_across_bwd_cpu(int outer, int C, int inner, int size, float cache_ratio,
                                 float beta, __global const float* x, __global const float* y,
                                 __global const float* scale, __global const float* dy,
                                 __global float* dx) {
    const int pre = (size - 1) / 2, post = size - 1 - pre;
    const int ng = (inner + 7) / 8, units = outer * ng;
    const int per = (units + (int)get_global_size(0) - 1) / (int)get_global_size(0);
    const int u0 = (int)get_global_id(0) * per, u1 = min(units, u0 + per);
    for (int u = u0; u < u1; ++u) {
        const int o = u / ng, s0 = (u - o * ng) * 8;
        const size_t base = (size_t)o * C * inner;
        if (s0 + 8 <= inner) {
            __global const float* px = x + base + s0;
            __global const float* py = y + base + s0;
            __global const float* ps = scale + base + s0;
            __global const float* pdy = dy + base + s0;
            __global float* pdx = dx + base + s0;
            ACROSS_BWD_BODY(float8, LD8, ST8)
        } else {
            for (int s = s0; s < inner; ++s) {
                __global const float* px = x + base + s;
                __global const float* py = y + base + s;
                __global const float* ps = scale + base + s;
                __global const float* pdy = dy + base + s;
                __global float* pdx = dx + base + s;
                ACROSS_BWD_BODY(float, LD1, ST1)
            }
        }
    }
}
