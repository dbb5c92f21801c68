/* Element-wise kernels, one source specialised by -DOP=<n>.
 * Forward:  y = f(x; a, b, c)
 * Backward: dx = dy * f'(x, y; a, b, c)  (BETA=1 adds to dx instead)
 * The op numbers live in caffe_ocl/ops/pointwise.py (UNARY_OPS). */
#include "common.h"
#include "act.h"

#ifndef OP
#define OP 0
#endif
#ifndef BETA
#define BETA 0
#endif

/* [i0, i1): this work-item's contiguous chunk of [0, n) when work-groups
 * have one item (CPU drivers), as GLOBAL_LOOP in common.h */
#define GLOBAL_RANGE(i0, i1, n) \
    const int _rc = ((n) + (int)get_global_size(0) - 1) / (int)get_global_size(0); \
    const int i0 = min((n), (int)get_global_id(0) * _rc), i1 = min((n), i0 + _rc)

#include "unary_op.h"

/* derivative dy/dx given x and y */
inline float grad_op(float x, float y, float a, float b, float c) {
#if OP == OP_IDENTITY
    return 1.0f;
#elif OP == OP_RELU
    return x > 0.0f ? 1.0f : a;
#elif OP == OP_SIGMOID
    return y * (1.0f - y);
#elif OP == OP_TANH
    return 1.0f - y * y;
#elif OP == OP_SCALE
    return a;
#elif OP == OP_ABSVAL
    return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
#elif OP == OP_ELU
    return x > 0.0f ? 1.0f : y + a;
#elif OP == OP_POWER
    /* Caffe: power * scale == 0 -> dy/dx = 0 (also where pow(.., a - 1) is inf) */
    if (a == 0.0f || b == 0.0f) return 0.0f;
    return a == 1.0f ? b : (a == 2.0f ? 2.0f * b * (b * x + c)
                                      : a * b * pow(b * x + c, a - 1.0f));
#elif OP == OP_EXP
    return a * b * y;
#elif OP == OP_LOG
    return a * b / (b * x + c);
#elif OP == OP_BNLL
    float e = exp(fmin(x, 50.0f));
    return e / (e + 1.0f);
#elif OP == OP_THRESHOLD
    return 0.0f;
#elif OP == OP_CLIP
    return (x >= a && x <= b) ? 1.0f : 0.0f;
#elif OP == OP_SWISH
    float s = 1.0f / (1.0f + exp(-a * x));
    return s + a * y * (1.0f - s);
#elif OP == OP_SQUARE
    return 2.0f * x;
#elif OP == OP_SQRT
    return 0.5f / y;
#endif
}

__kernel void unary_fwd(int n, __global const float* x, int offx,
                        __global float* y, int offy, float a, float b, float c) {
    GLOBAL_LOOP(i, n) { y[offy + i] = fwd_op(x[offx + i], a, b, c); }
}

__kernel void unary_bwd(int n, __global const float* x, __global const float* y,
                        __global const float* dy, __global float* dx,
                        float a, float b, float c) {
    GLOBAL_LOOP(i, n) {
        float g = dy[i] * grad_op(x[i], y[i], a, b, c);
#if BETA
        dx[i] += g;
#else
        dx[i] = g;
#endif
    }
}

__kernel void fill(int n, float v, __global float* y, int offy) {
    GLOBAL_LOOP(i, n) { y[offy + i] = v; }
}

/* y = alpha * x + beta * y (beta == 0 never reads y) */
__kernel void axpby(int n, float alpha, __global const float* x, int offx,
                    float beta, __global float* y, int offy) {
    GLOBAL_LOOP(i, n) {
        float v = alpha * x[offx + i];
        if (beta != 0.0f) v += beta * y[offy + i];
        y[offy + i] = v;
    }
}

/* y = act(c0*x0 + c1*x1): a two-bottom Eltwise SUM in one pass (two
 * axpby passes read y once more), Split's backward (c0 = c1 = 1, ACT 0),
 * and an Eltwise with its in-place ReLU/Clip fused in (ACT, act.h). */
__kernel void sum2_act(int n, float c0, __global const float* x0, float c1,
                       __global const float* x1, __global float* y,
                       float act_a, float act_b) {
    GLOBAL_LOOP(i, n) {
        float v = c0 * x0[i] + c1 * x1[i];
        y[i] = APPLY_ACT(v);
    }
}

#ifndef PD0
#define PD0 1
#endif
#ifndef PD1
#define PD1 1
#endif
#ifndef KEEP_G
#define KEEP_G 1
#endif
/* Backward of sum2_act whose ReLU (ACT 1) ran in place on y: the gate
 * comes from the output, as Caffe's in-place ReLU computes it (its backward
 * reads the bottom, which in place is the top). g = dy * relu'(y);
 * dx0 = c0 * g, dx1 = c1 * g for the bottoms that take a gradient (PD0,
 * PD1); g is written back into dy (KEEP_G) unless the net shares diffs,
 * where no one can read it afterwards. One pass instead of three (ReLU's
 * backward, then a copy per bottom). */
__kernel void sum2_act_bwd(int n, __global float* dy, __global const float* y,
                           float c0, __global float* dx0, float c1, __global float* dx1,
                           float act_a, float act_b, __global float* gout) {
    GLOBAL_LOOP(i, n) {
#if ACT == 0
        float g = dy[i];
#else
        float g = dy[i] * ACT_GRAD(y[i]);
#if KEEP_G
        gout[i] = g;      /* dy itself for an in-place activation */
#endif
#endif
#if PD0
        dx0[i] = c0 * g;
#endif
#if PD1
        dx1[i] = c1 * g;
#endif
    }
}

/* Copy a [rows x cols] block between strided layouts (concat/slice/crop-like). */
__kernel void copy2d(int rows, int cols, __global const float* x, int offx, int ldx,
                     __global float* y, int offy, int ldy, int accumulate) {
    int n = rows * cols;
    if (get_local_size(0) == 1) {
        /* CPU drivers (work-groups of one, see ops.work_size): a contiguous
         * chunk of the flat index, walked row by row without div/mod */
        GLOBAL_RANGE(i0, i1, n);
        int r = i0 / max(cols, 1), col = i0 - r * cols;
        for (int i = i0; i < i1; ) {
            int len = min(cols - col, i1 - i);
            __global const float* src = x + offx + r * ldx + col;
            __global float* dst = y + offy + r * ldy + col;
            if (accumulate) for (int j = 0; j < len; ++j) dst[j] += src[j];
            else for (int j = 0; j < len; ++j) dst[j] = src[j];
            i += len; ++r; col = 0;
        }
        return;
    }
    GLOBAL_LOOP(i, n) {
        int r = i / cols, col = i - r * cols;
        float v = x[offx + r * ldx + col];
        if (accumulate) y[offy + r * ldy + col] += v;
        else y[offy + r * ldy + col] = v;
    }
}

/* y[n, c, s] = x[n, c, s] + bias[c] * bmul  over outer x channels x inner */
__kernel void add_bias(int outer, int channels, int inner,
                       __global const float* x, __global float* y,
                       __global const float* bias) {
    int n = outer * channels * inner;
    if (get_local_size(0) == 1) {   /* CPU drivers: see copy2d */
        GLOBAL_RANGE(i0, i1, n);
        int row = i0 / max(inner, 1), s = i0 - row * inner;
        for (int i = i0; i < i1; ) {
            int len = min(inner - s, i1 - i);
            float b = bias[row % channels];
            for (int j = 0; j < len; ++j) y[i + j] = x[i + j] + b;
            i += len; ++row; s = 0;
        }
        return;
    }
    GLOBAL_LOOP(i, n) {
        int c = (i / inner) % channels;
        y[i] = x[i] + bias[c];
    }
}

/* dbias[c] (+)= sum over outer, inner of dy[o, c, s] */
__kernel void bias_grad(int outer, int channels, int inner,
                        __global const float* dy, __global float* dbias, int accumulate) {
    int c = get_global_id(0);
    if (c >= channels) return;
    /* eight running sums: one waits on every add's latency (CIFAR-10
     * quick's 32-channel bias gradients summed at ~1.4 GB/s on PoCL) */
    float8 s8 = (float8)(0.0f);
    float s = 0.0f;
    for (int o = 0; o < outer; ++o) {
        __global const float* p = dy + (o * channels + c) * inner;
        int k = 0;
        for (; k + 8 <= inner; k += 8) s8 += vload8(0, p + k);
        for (; k < inner; ++k) s += p[k];
    }
    const float4 s4 = s8.lo + s8.hi;
    s += (s4.x + s4.y) + (s4.z + s4.w);
    dbias[c] = accumulate ? dbias[c] + s : s;
}

/* Random fills from Philox(seed, index). */
__kernel void rng_uniform(int n, __global float* y, float lo, float hi, uint seed, uint stream) {
    GLOBAL_LOOP(i, n) {
        uint2 r = philox2x32((uint2)(i, stream), seed);
        y[i] = lo + (hi - lo) * u01(r.x);
    }
}

__kernel void rng_gaussian(int n, __global float* y, float mean, float stdv, uint seed, uint stream) {
    GLOBAL_LOOP(i, n) {
        uint2 r = philox2x32((uint2)(i, stream), seed);
        float u1 = 1.0f - u01(r.x);            /* (0, 1] */
        float u2 = u01(r.y);
        y[i] = mean + stdv * sqrt(-2.0f * log(u1)) * cos(6.283185307179586f * u2);
    }
}

/* Dropout: mask = u >= p, y = x * mask * scale */
__kernel void dropout_fwd(int n, __global const float* x, __global float* y,
                          __global float* mask, float p, float scale, uint seed, uint stream) {
    GLOBAL_LOOP(i, n) {
        uint2 r = philox2x32((uint2)(i, stream), seed);
        float m = u01(r.x) >= p ? 1.0f : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m * scale;
    }
}

__kernel void dropout_bwd(int n, __global const float* dy, __global const float* mask,
                          __global float* dx, float scale) {
    GLOBAL_LOOP(i, n) { dx[i] = dy[i] * mask[i] * scale; }
}

/* Each of `rows` rows of length `dim`: x /= sum(x) (positive_unitball filler). */
__kernel void normalize_rows_l1(int rows, int dim, __global float* y) {
    int r = get_global_id(0);
    if (r >= rows) return;
    float s = 0.0f;
    for (int k = 0; k < dim; ++k) s += y[r * dim + k];
    for (int k = 0; k < dim; ++k) y[r * dim + k] /= s;
}

/* Keep each element with probability p, zero it otherwise (sparse gaussian filler). */
__kernel void rng_sparsify(int n, __global float* y, float p, uint seed, uint stream) {
    GLOBAL_LOOP(i, n) {
        uint2 r = philox2x32((uint2)(i, stream), seed);
        if (u01(r.x) >= p) y[i] = 0.0f;
    }
}

/* Bilinear upsampling weights for a [.., .., K, K] blob (Caffe's bilinear filler). */
__kernel void bilinear_fill(int n, int kh, int kw, __global float* y) {
    float fh = ceil(kh / 2.0f), fw = ceil(kw / 2.0f);
    float ch = (2.0f * fh - 1.0f - fmod(fh, 2.0f)) / (2.0f * fh);
    float cw = (2.0f * fw - 1.0f - fmod(fw, 2.0f)) / (2.0f * fw);
    GLOBAL_LOOP(i, n) {
        float x = (float)(i % kw), yy = (float)((i / kw) % kh);
        y[i] = (1.0f - fabs(x / fw - cw)) * (1.0f - fabs(yy / fh - ch));
    }
}
