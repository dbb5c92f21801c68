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

/* BatchNorm TRAIN: batch statistics, stdv = sqrt(var + eps), and Caffe's
 * moving averages: run_scale = run_scale*maf + 1,
 * run_mean = maf*run_mean + mean, run_var = maf*run_var + corr*var. */
__kernel void bn_train_stats(int O, int C, int I, __global const float* x,
                             __global float* mean, __global float* stdv, float eps,
                             __global float* run_mean, __global float* run_var,
                             __global float* run_scale, float maf, float corr) {
    __local float buf[WG];
    for (int c = get_group_id(0); c < C; c += get_num_groups(0)) {
        float2 mv = chan_mean_var(O, C, I, c, x, buf);
        if (get_local_id(0) == 0) {
            mean[c] = mv.x;
            stdv[c] = sqrt(mv.y + eps);
            run_mean[c] = mv.x + maf * run_mean[c];
            run_var[c] = corr * mv.y + maf * run_var[c];
        }
    }
    if (get_group_id(0) == 0 && get_local_id(0) == 0) run_scale[0] = run_scale[0] * maf + 1.0f;
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
