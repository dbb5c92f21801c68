/* Element-wise steps of Caffe's recurrent layers (layers/recurrent.py): the
 * LSTMUnit cell, the sequence-continuation scaling and RNN's tanh step.
 * The matrix products around them are ops/gemm launches. Every kernel
 * covers one time step of N streams x D units; offsets are in floats. */
#include "common.h"

inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp(-x)); }

/* dst[n, d] = cont[n] * src[n, d]  (Caffe: h_conted_{t-1} = cont_t * h_{t-1}) */
__kernel void cont_scale(int N, int D, __global const float* cont, int off_cont,
                         __global const float* src, int off_src,
                         __global float* dst, int off_dst) {
    GLOBAL_LOOP(i, N * D) {
        dst[off_dst + i] = cont[off_cont + i / D] * src[off_src + i];
    }
}

/* Caffe's LSTMUnit forward for one step. X: gate inputs [N][4D] (i, f, o, g
 * blocks); writes the activated gates to A (same layout; backward reads
 * them), c_t and h_t:
 *   i, o = sigmoid, f = cont * sigmoid (0 where cont == 0), g = tanh,
 *   c_t = f * c_{t-1} + i * g,  h_t = o * tanh(c_t). */
__kernel void lstm_unit_fwd(int N, int D, __global const float* X, int off_x,
                            __global const float* c_prev, int off_cp,
                            __global const float* cont, int off_cont,
                            __global float* A, int off_a,
                            __global float* c, int off_c,
                            __global float* h, int off_h) {
    GLOBAL_LOOP(idx, N * D) {
        const int n = idx / D, d = idx - n * D;
        const int xb = off_x + 4 * D * n + d, ab = off_a + 4 * D * n + d;
        const float ct = cont[off_cont + n];
        const float i = sigmoid_f(X[xb]);
        const float f = ct == 0.0f ? 0.0f : ct * sigmoid_f(X[xb + D]);
        const float o = sigmoid_f(X[xb + 2 * D]);
        const float g = tanh(X[xb + 3 * D]);
        const float cv = f * c_prev[off_cp + idx] + i * g;
        A[ab] = i;
        A[ab + D] = f;
        A[ab + 2 * D] = o;
        A[ab + 3 * D] = g;
        c[off_c + idx] = cv;
        h[off_h + idx] = o * tanh(cv);
    }
}

/* Caffe's LSTMUnit backward for one step, from the activated gates A,
 * c_{t-1} and c_t. The gradient of h_t is dh[off_dh..] plus, where REC
 * (has_rec != 0), cont_{t+1} * dhc[...] (the next step's gradient through
 * h_conted_t); the gradient of c_t is dc_in (may alias dc_prev: each
 * element is read before it is written). Writes the gate inputs' gradient
 * dX [N][4D] and dc_prev = dc_term * f. */
__kernel void lstm_unit_bwd(int N, int D, __global const float* A, int off_a,
                            __global const float* c_prev, int off_cp,
                            __global const float* c, int off_c,
                            __global const float* dh, int off_dh,
                            __global const float* dhc, int off_dhc,
                            __global const float* cont_next, int off_cn, int has_rec,
                            __global const float* dc_in, int off_dci,
                            __global float* dc_prev, int off_dcp,
                            __global float* dX, int off_dx) {
    GLOBAL_LOOP(idx, N * D) {
        const int n = idx / D, d = idx - n * D;
        const int ab = off_a + 4 * D * n + d, xb = off_dx + 4 * D * n + d;
        const float i = A[ab], f = A[ab + D], o = A[ab + 2 * D], g = A[ab + 3 * D];
        float dhv = dh[off_dh + idx];
        if (has_rec)
            dhv += cont_next[off_cn + n] * dhc[off_dhc + idx];
        const float tc = tanh(c[off_c + idx]);
        const float dct = dc_in[off_dci + idx] + dhv * o * (1.0f - tc * tc);
        const float cp = c_prev[off_cp + idx];
        dc_prev[off_dcp + idx] = dct * f;
        dX[xb] = dct * g * i * (1.0f - i);
        dX[xb + D] = dct * cp * f * (1.0f - f);
        dX[xb + 2 * D] = dhv * tc * o * (1.0f - o);
        dX[xb + 3 * D] = dct * i * (1.0f - g * g);
    }
}

/* RNN step backward: h_t = tanh(pre_t), its gradient dh[..] plus, where
 * has_rec, cont_{t+1} * dhc[..]; writes dpre = dh_total * (1 - h_t^2). */
__kernel void rnn_tanh_bwd(int N, int D, __global const float* h, int off_h,
                           __global const float* dh, int off_dh,
                           __global const float* dhc, int off_dhc,
                           __global const float* cont_next, int off_cn, int has_rec,
                           __global float* dpre, int off_dp) {
    GLOBAL_LOOP(idx, N * D) {
        float dhv = dh[off_dh + idx];
        if (has_rec)
            dhv += cont_next[off_cn + idx / D] * dhc[off_dhc + idx];
        const float hv = h[off_h + idx];
        dpre[off_dp + idx] = dhv * (1.0f - hv * hv);
    }
}

/* dst[i] (+)= sum over t < T of src[t * count + i]  (a static input's
 * gradient summed over the time steps) */
__kernel void sum_steps(int T, int count, __global const float* src,
                        __global float* dst, int accumulate) {
    GLOBAL_LOOP(i, count) {
        float s = accumulate ? dst[i] : 0.0f;
        for (int t = 0; t < T; ++t)
            s += src[t * count + i];
        dst[i] = s;
    }
}

/* dst[t * count + i] += src[i] for every t < T (a static input's term added
 * to every step's gate input) */
__kernel void add_steps(int T, int count, __global const float* src, __global float* dst) {
    GLOBAL_LOOP(j, T * count) {
        dst[j] += src[j % count];
    }
}
