/* Solver kernels: the fused parameter update of Caffe's SGD-family solvers,
 * the global gradient L2 norm for clip_gradients, the loss accumulator and
 * the non-finite check. Specialised with -D macros:
 *   SOLVER  0 SGD, 1 Nesterov, 2 AdaGrad, 3 RMSProp, 4 AdaDelta, 5 Adam
 *   REG     0 none, 1 L2, 2 L1           (Caffe's Regularize)
 *   CLIP    1: scale the gradient by clip_scale[0] (Caffe's ClipGradients)
 *   NORM    1: scale by accum_norm = 1/iter_size (Caffe's Normalize)
 *   RED_LSIZE  work-group size of the reduction kernels (power of two)
 * The update order is Caffe's: clip, normalize, regularize, update rule
 * (the GPU kernels of src/caffe/solvers/ *.cu), then Net::Update
 * (data -= diff). diff keeps the update value, as in Caffe. */
#include "common.h"

#ifndef SOLVER
#define SOLVER 0
#endif
#ifndef REG
#define REG 0
#endif
#ifndef CLIP
#define CLIP 0
#endif
#ifndef NORM
#define NORM 0
#endif
#ifndef RED_LSIZE
#define RED_LSIZE 64
#endif
#if (RED_LSIZE & (RED_LSIZE - 1)) != 0
#error "RED_LSIZE must be a power of two"
#endif

/* One element of the update. REG's term is skipped where local_decay is 0
 * (Caffe regularizes only params with a decay; the solver compiles REG in
 * only when some parameter has one). */
inline void update_element(int i, __global float* data, __global float* diff,
                           __global float* h, __global float* h2,
                           __global const float* clip_scale,
                           float accum_norm, float local_decay, float local_rate,
                           float momentum, float momentum2, float delta) {
    float g = diff[i];
#if CLIP
    g *= clip_scale[0];
#endif
#if NORM
    g *= accum_norm;
#endif
#if REG == 1
    if (local_decay != 0.0f) g += local_decay * data[i];
#elif REG == 2
    if (local_decay != 0.0f) {
        float w = data[i];
        g += local_decay * (float)((0.0f < w) - (w < 0.0f));
    }
#endif
    float u;
#if SOLVER == 0     /* SGD */
    u = h[i] = momentum * h[i] + local_rate * g;
#elif SOLVER == 1   /* Nesterov */
    {
        float hi = h[i];
        float hi_new = h[i] = momentum * hi + local_rate * g;
        u = (1.0f + momentum) * hi_new - momentum * hi;
    }
#elif SOLVER == 2   /* AdaGrad */
    {
        float hi = h[i] = h[i] + g * g;
        u = local_rate * g / (sqrt(hi) + delta);
    }
#elif SOLVER == 3   /* RMSProp: momentum2 carries rms_decay */
    {
        float hi = h[i] = momentum2 * h[i] + (1.0f - momentum2) * g * g;
        u = local_rate * g / (sqrt(hi) + delta);
    }
#elif SOLVER == 4   /* AdaDelta */
    {
        float hi = h[i] = momentum * h[i] + (1.0f - momentum) * g * g;
        float gi = g * sqrt((h2[i] + delta) / (hi + delta));
        h2[i] = momentum * h2[i] + (1.0f - momentum) * gi * gi;
        u = local_rate * gi;
    }
#elif SOLVER == 5   /* Adam: momentum = beta1, momentum2 = beta2, delta = eps_hat */
    {
        float mi = h[i] = h[i] * momentum + g * (1.0f - momentum);
        float vi = h2[i] = h2[i] * momentum2 + g * g * (1.0f - momentum2);
        u = local_rate * mi / (sqrt(vi) + delta);
    }
#else
#error "unknown SOLVER"
#endif
    diff[i] = u;
    data[i] = data[i] - u;
}

/* arguments 6.. are per-iteration scalars (rebound with set_arg):
 * local_rate = rate * lr_mult (Adam: times the bias correction) */
__kernel void solver_update(int n, __global float* data, __global float* diff,
                            __global float* h, __global float* h2,
                            __global const float* clip_scale,
                            float accum_norm, float local_decay, float local_rate,
                            float momentum, float momentum2, float delta) {
    GLOBAL_LOOP(i, n) {
        update_element(i, data, diff, h, h2, clip_scale, accum_norm, local_decay,
                       local_rate, momentum, momentum2, delta);
    }
}

/* The update of every learnable parameter in one launch (caffe_ocl/param_arena.py):
 * data, diff, h, h2 are arenas with one layout; work-group b updates block b,
 * blocks[3b .. 3b+2] = (first element, length, parameter index); the
 * parameter's local rate is (rate * lr_mults[p]) * factor, the float32
 * products the per-blob path forms on the host (rate and factor are
 * per-iteration scalar arguments: no upload, no synchronisation), its
 * decay decays[p]. */
__kernel void solver_update_blocks(__global const int* blocks,
                                   __global const float* lr_mults,
                                   __global const float* decays,
                                   __global float* data, __global float* diff,
                                   __global float* h, __global float* h2,
                                   __global const float* clip_scale,
                                   float accum_norm, float momentum, float momentum2,
                                   float delta, float rate, float factor) {
    int b = get_group_id(0);
    int start = blocks[3 * b], len = blocks[3 * b + 1], seg = blocks[3 * b + 2];
    float local_rate = (rate * lr_mults[seg]) * factor, local_decay = decays[seg];
    for (int k = get_local_id(0); k < len; k += get_local_size(0)) {
        update_element(start + k, data, diff, h, h2, clip_scale, accum_norm, local_decay,
                       local_rate, momentum, momentum2, delta);
    }
}

/* x = value over every block of the table (clearing all parameter gradients) */
__kernel void fill_blocks(__global const int* blocks, __global float* x, float value) {
    int b = get_group_id(0);
    int start = blocks[3 * b], len = blocks[3 * b + 1];
    for (int k = get_local_id(0); k < len; k += get_local_size(0)) x[start + k] = value;
}

inline float group_sum(__local float* s, float v) {
    int lid = get_local_id(0);
    s[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = RED_LSIZE / 2; st > 0; st >>= 1) {
        if (lid < st) s[lid] += s[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return s[0];
}

/* partials[offset + group] = sum of x^2 over this group's grid-stride share */
__kernel __attribute__((reqd_work_group_size(RED_LSIZE, 1, 1)))
void sumsq_partial(int n, __global const float* x, __global float* partials, int offset) {
    __local float s[RED_LSIZE];
    float acc = 0.0f;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) {
        float v = x[i];
        acc += v * v;
    }
    float t = group_sum(s, acc);
    if (get_local_id(0) == 0) partials[offset + get_group_id(0)] = t;
}

/* one work-group: out[1] = L2 norm = sqrt(sum partials),
 * out[0] = clip / norm when norm > clip, else 1 */
__kernel __attribute__((reqd_work_group_size(RED_LSIZE, 1, 1)))
void clip_scale(int m, __global const float* partials, __global float* out, float clip) {
    __local float s[RED_LSIZE];
    float acc = 0.0f;
    for (int i = get_local_id(0); i < m; i += RED_LSIZE) acc += partials[i];
    float t = group_sum(s, acc);
    if (get_local_id(0) == 0) {
        float norm = sqrt(t);
        out[1] = norm;
        out[0] = norm > clip ? clip / norm : 1.0f;
    }
}

/* one work-group: out[slot] = ((accumulate ? out[slot] : 0) + w * sum(x)) / divisor */
__kernel __attribute__((reqd_work_group_size(RED_LSIZE, 1, 1)))
void loss_accum(int n, __global const float* x, float w, __global float* out,
                int slot, int accumulate, float divisor) {
    __local float s[RED_LSIZE];
    float acc = 0.0f;
    for (int i = get_local_id(0); i < n; i += RED_LSIZE) acc += x[i];
    float t = group_sum(s, acc);
    if (get_local_id(0) == 0) {
        float prev = accumulate ? out[slot] : 0.0f;
        out[slot] = (prev + w * t) / divisor;
    }
}

/* flags[idx] = 1 when any of x[0:n] is NaN or Inf */
__kernel void check_finite(int n, __global const float* x, __global float* flags, int idx) {
    GLOBAL_LOOP(i, n) {
        if (!isfinite(x[i])) flags[idx] = 1.0f;
    }
}
