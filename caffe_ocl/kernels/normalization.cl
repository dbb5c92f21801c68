/* Per-channel normalization: BatchNorm and MVN.
 * Data layout [O][C][I]: statistics of channel c run over (o, i).
 * BatchNorm: O = num, C = channels, I = spatial size.
 * MVN: O = 1, C = rows (N*C or N), I = elements per row.
 * Reductions: one work-group per channel (groups stride over channels). */
#include "common.h"
#include "reduce.h"

/* mean and biased variance E((x - mean)^2) of channel c (two passes). */
inline float2 chan_mean_var(int O, int C, int I, int c, __global const float* x,
                            __local float* buf) {
    const int m = O * I;
    float s = 0.0f;
    for (int j = get_local_id(0); j < m; j += WG) s += x[CHAN_INDEX(j, c, C, I)];
    const float mu = wg_sum(s, buf) / m;
    float v = 0.0f;
    for (int j = get_local_id(0); j < m; j += WG) {
        float d = x[CHAN_INDEX(j, c, C, I)] - mu;
        v += d * d;
    }
    return (float2)(mu, wg_sum(v, buf) / m);
}

/* BatchNorm TRAIN, second pass of the split statistics (channel.cl's
 * chan_partial with shifted sums, `chunks` partial pairs per channel):
 * mean, biased variance, stdv = sqrt(var + eps), and Caffe's moving
 * averages: run_scale = run_scale*maf + 1, run_mean = maf*run_mean + mean,
 * run_var = maf*run_var + corr*var. */
__kernel void bn_stats_finalize(int C, int I, int chunks, float inv_m,
                                __global const float* x, __global const float* part,
                                __global float* mean, __global float* stdv, float eps,
                                __global float* run_mean, __global float* run_var,
                                __global float* run_scale, float maf, float corr) {
    GLOBAL_LOOP(c, C) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int g = 0; g < chunks; ++g) {
            s1 += part[2 * (c * chunks + g)];
            s2 += part[2 * (c * chunks + g) + 1];
        }
        const float d = s1 * inv_m;                 /* mean - K */
        const float var = fmax(s2 * inv_m - d * d, 0.0f);
        const float mu = x[c * I] + d;
        mean[c] = mu;
        stdv[c] = sqrt(var + eps);
        run_mean[c] = mu + maf * run_mean[c];
        run_var[c] = corr * var + maf * run_var[c];
        if (c == 0) run_scale[0] = run_scale[0] * maf + 1.0f;
    }
}

/* BatchNorm TRAIN backward, after the split sums s1 = sum dy, s2 = sum dy*y
 * per channel (sums[2c], sums[2c+1]):
 * dx = (dy - (s1 + s2*y) / m) / stdv. dx may alias dy. */
__kernel void bn_backward_apply(int n, int C, int I, float inv_m, __global const float* dy,
                                __global const float* y, __global const float* sums,
                                __global const float* stdv, __global float* dx) {
    GLOBAL_LOOP(k, n) {
        const int c = (k / I) % C;
        dx[k] = (dy[k] - inv_m * (sums[2 * c] + sums[2 * c + 1] * y[k])) / stdv[c];
    }
}

/* BatchNorm with global statistics: mean = run_mean / run_scale,
 * var = run_var / run_scale (a scale of 0 gives 0), stdv = sqrt(var + eps). */
__kernel void bn_global_stats(int C, __global const float* run_mean,
                              __global const float* run_var, __global const float* run_scale,
                              __global float* mean, __global float* stdv, float eps) {
    GLOBAL_LOOP(c, C) {
        const float s = run_scale[0];
        const float f = s == 0.0f ? 0.0f : 1.0f / s;
        mean[c] = f * run_mean[c];
        stdv[c] = sqrt(f * run_var[c] + eps);
    }
}

/* MVN: mean and stdv = sqrt(var) + eps per row. */
__kernel void mvn_stats(int O, int C, int I, __global const float* x,
                        __global float* mean, __global float* stdv, float eps) {
    __local float buf[WG];
    for (int c = get_group_id(0); c < C; c += get_num_groups(0)) {
        float2 mv = chan_mean_var(O, C, I, c, x, buf);
        if (get_local_id(0) == 0) {
            mean[c] = mv.x;
            stdv[c] = sqrt(mv.y) + eps;
        }
    }
}

/* mvn_stats for CPU drivers (work-groups of one item): each work-item
 * takes whole rows [c][I] (O = 1: MVN's rows), both passes 8 floats a
 * step (the work-group reductions ran MVN at 0.43x OpenCV's speed on PoCL). */
__kernel void mvn_stats_rows(int C, int I, __global const float* x,
                             __global float* mean, __global float* stdv, float eps) {
    GLOBAL_LOOP(c, C) {
        __global const float* r = x + (size_t)c * I;
        float8 s8 = (float8)(0.0f);
        int j = 0;
        for (; j + 8 <= I; j += 8) s8 += vload8(0, r + j);
        float s = (s8.s0 + s8.s1) + (s8.s2 + s8.s3) + (s8.s4 + s8.s5) + (s8.s6 + s8.s7);
        for (; j < I; ++j) s += r[j];
        const float mu = s / I;
        float8 v8 = (float8)(0.0f);
        for (j = 0; j + 8 <= I; j += 8) {
            const float8 d = vload8(0, r + j) - mu;
            v8 = fma(d, d, v8);
        }
        float v = (v8.s0 + v8.s1) + (v8.s2 + v8.s3) + (v8.s4 + v8.s5) + (v8.s6 + v8.s7);
        for (; j < I; ++j) {
            const float d = r[j] - mu;
            v += d * d;
        }
        mean[c] = mu;
        stdv[c] = sqrt(v / I) + eps;
    }
}

/* y = (x - mean[c]) / stdv[c]  (no division when !use_std); y may alias x.
 * save: also keep a copy in xnorm (BatchNorm's x_norm_ for in-place nets). */
__kernel void chan_normalize(int n, int C, int I, __global const float* x,
                             __global const float* mean, __global const float* stdv,
                             __global float* y, __global float* xnorm, int use_std, int save) {
    GLOBAL_LOOP(k, n) {
        const int c = (k / I) % C;
        float v = x[k] - mean[c];
        if (use_std) v = v / stdv[c];
        y[k] = v;
        if (save) xnorm[k] = v;
    }
}

/* y = x / d[c] (BatchNorm backward with global statistics). */
__kernel void chan_div(int n, int C, int I, __global const float* x,
                       __global const float* d, __global float* y) {
    GLOBAL_LOOP(k, n) { y[k] = x[k] / d[(k / I) % C]; }
}

/* CPU drivers (work-groups of one item, ops.work_size): chan_normalize and
 * chan_div walking each work-item's chunk as runs of one channel
 * (common.h CHANNEL_RUNS_*; per element, the two divisions made MVN 0.36x
 * OpenCV's speed on PoCL). */
__kernel void chan_normalize_runs(int n, int C, int I, __global const float* x,
                                  __global const float* mean, __global const float* stdv,
                                  __global float* y, __global float* xnorm, int use_std,
                                  int save) {
    CHANNEL_RUNS_BEGIN(n, C, I)
        const float m = mean[c], sd = stdv[c];
        for (int j = k; j < k + len; ++j) {
            float v = x[j] - m;
            if (use_std) v = v / sd;
            y[j] = v;
            if (save) xnorm[j] = v;
        }
    CHANNEL_RUNS_END(C)
}

__kernel void chan_div_runs(int n, int C, int I, __global const float* x,
                            __global const float* d, __global float* y) {
    CHANNEL_RUNS_BEGIN(n, C, I)
        const float dc = d[c];
        for (int j = k; j < k + len; ++j) y[j] = x[j] / dc;
    CHANNEL_RUNS_END(C)
}

/* Gradient of y = (x - mean) / stdv with batch statistics:
 * dx = (dy - mean(dy) - mean(dy * y) * y) / stdv, or dx = dy - mean(dy) when
 * !use_std (MVN without variance). dx may alias dy. */
__kernel void chan_normalize_bwd(int O, int C, int I, __global const float* dy,
                                 __global const float* y, __global const float* stdv,
                                 __global float* dx, int use_std) {
    __local float buf[WG];
    const int m = O * I;
    const float inv_m = -1.0f / m;
    for (int c = get_group_id(0); c < C; c += get_num_groups(0)) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int j = get_local_id(0); j < m; j += WG) {
            const int k = CHAN_INDEX(j, c, C, I);
            s1 += dy[k];
            if (use_std) s2 += dy[k] * y[k];
        }
        s1 = wg_sum(s1, buf);
        s2 = use_std ? wg_sum(s2, buf) : 0.0f;
        for (int j = get_local_id(0); j < m; j += WG) {
            const int k = CHAN_INDEX(j, c, C, I);
            float v = dy[k] + inv_m * (use_std ? s2 * y[k] + s1 : s1);
            if (use_std) v = v / stdv[c];
            dx[k] = v;
        }
    }
}

/* ---- TRAIN-phase BatchNorm -> Scale -> activation on one blob (fusion_train.py)
 * y2 = gamma[c] * xn + beta[c] with xn = (x - mean[c]) / stdv[c], y = act(y2).
 * ACT as act.h; the backward gates with act'(y2), recomputed from xn
 * (Caffe's non-in-place activation semantics, which its in-place ReLU
 * equals). Its first pass is channel.cl's chan_partial, PART_MODE 2. */
#include "act.h"

/* forward after the statistics: xnorm = xn (kept for backward), y = act(y2);
 * y may alias x. */
/* VEC 4 (the host checks that 4 divides I): float4 loads and stores, one
 * channel index per four elements. */
#ifndef VEC
#define VEC 1
#endif
#if VEC == 4
#define VLOAD(k, p) vload4((k), (p))
#define VSTORE(v, k, p) vstore4((v), (k), (p))
typedef float4 floatv;
#else
#define VLOAD(k, p) ((p)[k])
#define VSTORE(v, k, p) ((p)[k] = (v))
typedef float floatv;
#endif
#ifndef SNAP
#define SNAP 0
#endif
/* SNAP: also copy gamma and beta to gsnap/bsnap (a TRAIN chain writing new
 * tops, plan/train.py NewTopTrainChain: the Scale's top is computed when
 * read, with the parameters of this forward, not the solver's update);
 * without SNAP they are not touched (the callers pass gamma and beta). */
inline void bn_snap_params(int C, __global const float* gamma, __global const float* beta,
                           __global float* gsnap, __global float* bsnap) {
    for (int c = get_global_id(0); c < C; c += get_global_size(0)) {
        gsnap[c] = gamma[c];
        bsnap[c] = beta[c];
    }
}

__kernel void bn_scale_act_fwd(int n, int C, int I, __global const float* x,
                               __global const float* mean, __global const float* stdv,
                               __global const float* gamma, __global const float* beta,
                               __global float* xnorm, __global float* y,
                               float act_a, float act_b,
                               __global float* gsnap, __global float* bsnap) {
#if SNAP
    bn_snap_params(C, gamma, beta, gsnap, bsnap);
#endif
    const int IV = I / VEC;
    GLOBAL_LOOP(k, n / VEC) {
        const int c = (k / IV) % C;
        const floatv xn = (VLOAD(k, x) - mean[c]) / stdv[c];
        VSTORE(xn, k, xnorm);
        floatv v = fma((floatv)gamma[c], xn, (floatv)beta[c]);
#if ACT == 1
        v = select(act_a * v, v, v > (floatv)0.0f);
#elif ACT == 2
        v = fmax((floatv)act_a, fmin((floatv)act_b, v));
#endif
        VSTORE(v, k, y);
    }
}

/* bn_scale_act_fwd for CPU drivers: each work-item one contiguous chunk of
 * the n elements, walked channel run by channel run (no division per
 * element; the GPU form's k / IV per vector cost PoCL most of the pass:
 * DenseNet-121's BatchNorm/ReLU chains were 16 of its 85 ms at batch 1).
 * Same operations per element, so the same values.
 * XNORM 0 (inference chains, plan/affine.py; the host passes y as xnorm):
 * no normalized copy, and each run 16 lanes at a time. With the copy aimed
 * at y every element was stored twice, and the two pointers (may alias)
 * kept PoCL from vectorising the loop: DenseNet-121's 62 chains at batch 1
 * took ~12% of its forward at ~13 GB/s. */
#ifndef XNORM
#define XNORM 1
#endif
__kernel void bn_scale_act_fwd_runs(int n, int C, int I, __global const float* x,
                                    __global const float* mean, __global const float* stdv,
                                    __global const float* gamma, __global const float* beta,
                                    __global float* xnorm, __global float* y,
                                    float act_a, float act_b,
                                    __global float* gsnap, __global float* bsnap) {
#if SNAP
    bn_snap_params(C, gamma, beta, gsnap, bsnap);
#endif
    CHANNEL_RUNS_BEGIN(n, C, I)
        const float m = mean[c], sd = stdv[c], g = gamma[c], b = beta[c];
        __global const float* xs = x + k;
        __global float* xn_ = xnorm + k;
        __global float* ys = y + k;
        int j = 0;
#if !XNORM
        for (; j + 16 <= len; j += 16) {
            const float16 v = fma((float16)g, (vload16(0, xs + j) - m) / sd, (float16)b);
            vstore16(APPLY_ACT_VEC(v, float16), 0, ys + j);
        }
#endif
        for (; j < len; ++j) {
            const float xn = (xs[j] - m) / sd;
#if XNORM
            xn_[j] = xn;
#endif
            const float v = fma(g, xn, b);
            ys[j] = APPLY_ACT(v);
        }
    CHANNEL_RUNS_END(C)
}

/* The TRAIN residual-block tail (fusion_train.ResidualTailChain): BatchNorm
 * -> Scale in place on x, Eltwise SUM with the shortcut s, in-place ReLU:
 *   xnorm = (x - mean) / stdv,  t = gamma * xnorm + beta,
 *   y = relu(c_t * t + c_s * s)  (act_a = negative_slope),
 * t written back into x (in place, as the unfused layers leave it) unless
 * WRITE_T is 0 (ONNX's form, plan/train.py NewTopResidualTail: x is
 * BatchNorm's bottom, kept; SNAP as bn_scale_act_fwd's). */
#ifndef WRITE_T
#define WRITE_T 1
#endif
__kernel void bn_scale_add_relu_fwd(int n, int C, int I, __global float* x,
                                    __global const float* mean, __global const float* stdv,
                                    __global const float* gamma, __global const float* beta,
                                    __global float* xnorm, float c_t,
                                    __global const float* s, float c_s,
                                    __global float* y, float act_a,
                                    __global float* gsnap, __global float* bsnap) {
#if SNAP
    bn_snap_params(C, gamma, beta, gsnap, bsnap);
#endif
    const int IV = I / VEC;
    GLOBAL_LOOP(k, n / VEC) {
        const int c = (k / IV) % C;
        const floatv xn = (VLOAD(k, x) - mean[c]) / stdv[c];
        VSTORE(xn, k, xnorm);
        const floatv t = fma((floatv)gamma[c], xn, (floatv)beta[c]);
#if WRITE_T
        VSTORE(t, k, x);
#endif
        const floatv v = fma((floatv)c_t, t, c_s * VLOAD(k, s));
        VSTORE(select(act_a * v, v, v > (floatv)0.0f), k, y);
    }
}

/* backward, last pass: g = gscale * dy (gated by ACT), sums[2c] = S1 =
 * sum g, sums[2c+1] = S2 = sum g*xn; dx = gamma/stdv * (g - (S1 + S2*xn)
 * / m). dx may alias dy. */
__kernel void bn_scale_act_bwd(int n, int C, int I, float inv_m, __global const float* dy,
                               float gscale,
                               __global const float* xnorm, __global const float* gamma,
                               __global const float* beta, __global const float* stdv,
                               __global const float* sums, __global float* dx,
                               float act_a, float act_b) {
    const int IV = I / VEC;
    GLOBAL_LOOP(k, n / VEC) {
        const int c = (k / IV) % C;
        const floatv xn = VLOAD(k, xnorm);
        floatv g = gscale * VLOAD(k, dy);
#if ACT == 1
        g *= select((floatv)act_a, (floatv)1.0f, fma((floatv)gamma[c], xn, (floatv)beta[c]) > (floatv)0.0f);
#elif ACT == 2
        const floatv pre = fma((floatv)gamma[c], xn, (floatv)beta[c]);
        g = select((floatv)0.0f, g, pre >= (floatv)act_a && pre <= (floatv)act_b);
#endif
        VSTORE(gamma[c] / stdv[c] * (g - inv_m * (sums[2 * c] + sums[2 * c + 1] * xn)), k, dx);
    }
}
