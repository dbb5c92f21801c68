/* Fold a per-output-channel affine map y = a[c] * z + s[c] (TEST-phase
 * BatchNorm with global statistics and/or Scale) into the weights and bias
 * of the producer z = W x + b (Convolution, InnerProduct):
 *     W'[i] = a[c(i)] * W[i],   b'[c] = a[c] * b[c] + s[c].
 * Weight element i belongs to output channel c(i) = (i / inner) % C
 * (Convolution Co x (C/G*KH*KW): inner = C/G*KH*KW; InnerProduct N x K:
 * inner = K; transposed K x N: inner = 1).
 * BatchNorm (Caffe): mean = m/sf, var = v/sf (sf == 0 -> 0),
 *     a = 1/sqrt(var + eps), s = -mean * a;  Scale: a *= gamma, s = s*gamma + beta.
 * Pointers of absent parts are never read (any valid buffer may be passed). */
#include "common.h"

#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef HAS_BN
#define HAS_BN 0
#endif
#ifndef HAS_SCALE
#define HAS_SCALE 0
#endif
#ifndef HAS_SHIFT
#define HAS_SHIFT 0
#endif
#if HAS_SHIFT && !HAS_SCALE
#error "HAS_SHIFT (Scale bias) needs HAS_SCALE"
#endif

__kernel void fold_affine(int nw, int C, int inner,
                          __global const float* w, __global const float* bias,
                          __global const float* bn_mean, __global const float* bn_var,
                          __global const float* bn_sf, float eps,
                          __global const float* gamma, __global const float* beta,
                          __global float* w_out, __global float* b_out) {
    GLOBAL_LOOP(i, nw + C) {
        const int c = i < nw ? (i / inner) % C : i - nw;
        float a = 1.0f, s = 0.0f;
#if HAS_BN
        const float sf = bn_sf[0];
        const float f = sf == 0.0f ? 0.0f : 1.0f / sf;
        a = 1.0f / sqrt(f * bn_var[c] + eps);
        s = -(f * bn_mean[c]) * a;
#endif
#if HAS_SCALE
        a *= gamma[c];
        s *= gamma[c];
#if HAS_SHIFT
        s += beta[c];
#endif
#endif
        if (i < nw) {
            w_out[i] = a * w[i];
        } else {
#if HAS_BIAS
            b_out[c] = a * bias[c] + s;
#else
            b_out[c] = s;
#endif
        }
    }
}

/* A PReLU folded into its producer's epilogue (caffe_ocl/plan/chain.py,
 * act.h ACT 7): the producer's bias buffer b_out holds C biases, then the C
 * slopes (slope[0] for all where shared). FOLD_BIAS: the biases are
 * written here too (bias, or 0 without HAS_BIAS) -- a chain without
 * BatchNorm / Scale, whose fold_affine does not run. */
__kernel void fold_prelu(int C, int shared, __global const float* bias,
                         __global const float* slope, __global float* b_out) {
    GLOBAL_LOOP(c, C) {
        b_out[C + c] = slope[shared ? 0 : c];
#if FOLD_BIAS
#if HAS_BIAS
        b_out[c] = bias[c];
#else
        b_out[c] = 0.0f;
#endif
#endif
    }
}

/* An SE block's channel scale folded into the 1x1 convolution after it
 * (caffe_ocl/plan/se.py): w_out[n][o][c] = w[o][c] * g[n][c] (M x K
 * weights, mk = M * K, n < total / mk, g: one K-vector per n). */
__kernel void scale_weight_columns(int total, int mk, int k, __global const float* w,
                                   __global const float* g, __global float* w_out) {
    GLOBAL_LOOP(i, total) {
        const int n = i / mk, r = i - n * mk;
        w_out[i] = w[r] * g[n * k + r % k];
    }
}
