/* im2col / col2im over NAXES spatial axes (Caffe's im2col_nd), for
 * convolutions that are not 2-D (1-D, 3-D, ...). One image at a time.
 * geo (ints): [0] channels, then per axis (NAXES each, first axis first):
 * input size, output size, kernel, pad, stride, dilation.
 * Columns: row (c, k_0, .., k_{A-1}) of output pixel (o_0, .., o_{A-1}),
 * last axis fastest, as Caffe's. */
#include "common.h"

#ifndef NAXES
#define NAXES 3
#endif
#define G_IN(a) geo[1 + (a)]
#define G_OUT(a) geo[1 + NAXES + (a)]
#define G_K(a) geo[1 + 2 * NAXES + (a)]
#define G_PAD(a) geo[1 + 3 * NAXES + (a)]
#define G_STRIDE(a) geo[1 + 4 * NAXES + (a)]
#define G_DIL(a) geo[1 + 5 * NAXES + (a)]

/* kernel taps, output pixels and input pixels of one channel */
#define GEO_SIZES(kprod, oprod, iprod)              \
    int kprod = 1, oprod = 1, iprod = 1;            \
    for (int a_ = 0; a_ < NAXES; ++a_) {            \
        kprod *= G_K(a_);                           \
        oprod *= G_OUT(a_);                         \
        iprod *= G_IN(a_);                          \
    }

__kernel void im2col_nd(int n, __global const float* im, int off_im,
                        __global float* col, __global const int* geo) {
    GEO_SIZES(kprod, oprod, iprod);
    GLOBAL_LOOP(i, n) {
        const int c_col = i / oprod;
        int rem_p = i - c_col * oprod;
        const int c_im = c_col / kprod;
        int rem_k = c_col - c_im * kprod;
        int index = 0, mult = 1, inside = 1;
        for (int a = NAXES - 1; a >= 0; --a) {
            const int kd = rem_k % G_K(a), od = rem_p % G_OUT(a);
            rem_k /= G_K(a);
            rem_p /= G_OUT(a);
            const int d = od * G_STRIDE(a) - G_PAD(a) + kd * G_DIL(a);
            inside &= d >= 0 && d < G_IN(a);
            index += d * mult;
            mult *= G_IN(a);
        }
        col[i] = inside ? im[off_im + c_im * iprod + index] : 0.0f;
    }
}

/* im[i] (+)= the sum of the column entries that im2col_nd copied from it */
__kernel void col2im_nd(int n, __global const float* col, __global float* im,
                        int off_im, __global const int* geo, int accumulate) {
    GEO_SIZES(kprod, oprod, iprod);
    GLOBAL_LOOP(i, n) {
        const int c_im = i / iprod;
        int d[NAXES];
        int rem = i - c_im * iprod;
        for (int a = NAXES - 1; a >= 0; --a) {
            d[a] = rem % G_IN(a);
            rem /= G_IN(a);
        }
        float sum = 0.0f;
        for (int k = 0; k < kprod; ++k) {
            int rem_k = k, out_index = 0, mult = 1, ok = 1;
            for (int a = NAXES - 1; a >= 0; --a) {
                const int kd = rem_k % G_K(a);
                rem_k /= G_K(a);
                const int t = d[a] + G_PAD(a) - kd * G_DIL(a);
                const int od = t / G_STRIDE(a);
                ok &= t >= 0 && od * G_STRIDE(a) == t && od < G_OUT(a);
                out_index += od * mult;
                mult *= G_OUT(a);
            }
            if (ok)
                sum += col[(c_im * kprod + k) * oprod + out_index];
        }
        im[off_im + i] = accumulate ? im[off_im + i] + sum : sum;
    }
}
