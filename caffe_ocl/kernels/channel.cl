/* Broadcast over an "outer x D x inner" pattern (Scale and Bias layers).
 * y[o, d, i] = x[o, d, i] * scale[d] + bias[d], with HAS_SCALE / HAS_BIAS
 * choosing the terms; y may alias x. */
#include "common.h"
#include "reduce.h"
#include "act.h"

#ifndef HAS_SCALE
#define HAS_SCALE 1
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif

/* v * s + b with the terms HAS_SCALE / HAS_BIAS choose (an absent term's
 * argument is not read) */
#if HAS_SCALE && HAS_BIAS
#define AFFINE(v, s, b) ((v) * (s) + (b))
#elif HAS_SCALE
#define AFFINE(v, s, b) ((v) * (s))
#elif HAS_BIAS
#define AFFINE(v, s, b) ((v) + (b))
#else
#define AFFINE(v, s, b) (v)
#endif

__kernel void chan_affine(int n, int D, int I, __global const float* x,
                          __global const float* scale, __global const float* bias,
                          __global float* y) {
    GLOBAL_LOOP(k, n) {
        float v = x[k];
#if HAS_SCALE
        v *= scale[(k / I) % D];
#endif
#if HAS_BIAS
        v += bias[(k / I) % D];
#endif
        y[k] = v;
    }
}

/* CPU drivers (work-groups of one item, ops.work_size): the same result,
 * each work-item's contiguous chunk walked as runs of one channel, so the
 * channel index is found once per chunk and stepped (chan_affine divides
 * twice per element: PoCL ran EfficientNet-B0's SE channel scales at
 * ~0.6 GB/s) and each run is a plain loop with one scale and bias that the
 * compiler vectorises. */
__kernel void chan_affine_runs(int n, int D, int I, __global const float* x,
                               __global const float* scale, __global const float* bias,
                               __global float* y) {
    CHANNEL_RUNS_BEGIN(n, D, I)
#if HAS_SCALE
        const float s = scale[c];
#else
        const float s = 1.0f;
#endif
#if HAS_BIAS
        const float b = bias[c];
#else
        const float b = 0.0f;
#endif
        __global const float* xs = x + k;
        __global float* ys = y + k;
        for (int j = 0; j < len; ++j) ys[j] = AFFINE(xs[j], s, b);
    CHANNEL_RUNS_END(D)
}

/* CPU drivers, inner size 1 (a Scale/Bias whose parameter covers the
 * trailing axes: a per-pixel statistic of a LayerNorm over channels, axis
 * 2 of N x C x H x W): chan_affine_runs' runs would be one element long,
 * so each chunk is walked as pieces of rows, the parameters read alongside
 * the data (one vectorisable loop a piece). */
__kernel void chan_affine_rows(int n, int D, int I, __global const float* x,
                               __global const float* scale, __global const float* bias,
                               __global float* y) {
    const int chunk = _gl_chunk(n);
    int k = (int)get_global_id(0) * chunk;
    const int end = min(n, k + chunk);
    int d = k < end ? k % D : 0;
    while (k < end) {
        const int len = min(D - d, end - k);
        __global const float* xs = x + k;
        __global float* ys = y + k;
        for (int j = 0; j < len; ++j) ys[j] = AFFINE(xs[j], scale[d + j], bias[d + j]);
        k += len;
        d = 0;
    }
}

/* ---- Split per-channel reductions ------------------------------------------
 * One work-group per channel leaves a GPU mostly idle when channels are few
 * and long (ResNet's first BatchNorm: 64 channels of 800k elements), so the
 * O*I elements of channel d are cut into `chunks` contiguous ranges; work
 * item t = d*chunks + g of the grid (groups stride over t) sums range g into
 * part[2t] and part[2t+1], and a second small kernel adds the chunks.
 *   PART_MODE 0: s1 = sum a, s2 = sum a*b           (b unused when !PART_B)
 *   PART_MODE 1: s1 = sum (a-K), s2 = sum (a-K)^2   K = first element of the
 *                channel: shifted data keep E(x^2)-E(x)^2 accurate in one pass
 *   PART_MODE 2: s1 = sum g, s2 = sum g*b with g = a * ACT_GRAD(gamma*b + beta)
 *                (the fused TRAIN BatchNorm -> Scale -> act backward,
 *                a = dy, b = x_norm; normalization.cl)
 *   PART_MODE 3: s1 = sum c_t*g, s2 = sum c_t*g*b with g = a * relu'(gate)
 *                (the fused residual-block tail BatchNorm -> Scale ->
 *                Eltwise SUM -> in-place ReLU: a = dy of the sum, gate =
 *                its output, b = x_norm); also writes out_s = c_s*g (the
 *                shortcut's gradient) when WRITE_S and out_g = g (the
 *                ReLU's input gradient, in dy's place) when WRITE_G
 * The arguments of a mode it does not use may be any buffer / value.
 * Index walk: o/i advance incrementally, no division per element. */
#ifndef PART_MODE
#define PART_MODE 0
#endif
#ifndef PART_B
#define PART_B 1
#endif

#ifndef VEC
#define VEC 1
#endif
#ifndef WRITE_S
#define WRITE_S 0
#endif
#ifndef WRITE_G
#define WRITE_G 0
#endif
#define NEED_B (PART_MODE == 2 || (PART_MODE == 0 && PART_B))
#if PART_MODE == 1
#define PART_STEP(av, bv) { const float v_ = (av) - K; s1 += v_; s2 += v_ * v_; }
#elif PART_MODE == 2
#define PART_STEP(av, bv) { const float xn_ = (bv); \
                            const float g_ = (av) * ACT_GRAD(fma(ga, xn_, be)); \
                            s1 += g_; s2 += g_ * xn_; }
#elif PART_B
#define PART_STEP(av, bv) { s1 += (av); s2 += (av) * (bv); }
#else
#define PART_STEP(av, bv) { s1 += (av); }
#endif

/* VEC 4 (the host checks that 4 divides I): the walk goes over float4s,
 * four elements per 16-byte load (scalar loads ran ResNet-50's BatchNorm
 * reductions at ~1.7 TB/s on an H200). */
__kernel void chan_partial(int O, int D, int I, int chunks, __global const float* a,
                           __global const float* b, __global const float* gamma,
                           __global const float* beta, float act_a, float act_b,
                           __global float* part, __global const float* gate,
                           __global float* out_s, __global float* out_g, float c_t,
                           float c_s) {
    __local float buf[WG];
    const int IV = I / VEC;
    const int m = O * IV;
    const int len = (m + chunks - 1) / chunks;
    for (int t = get_group_id(0); t < D * chunks; t += get_num_groups(0)) {
        const int d = t / chunks, g = t - d * chunks;
        const int j0 = g * len, j1 = min(m, j0 + len);
        float s1 = 0.0f, s2 = 0.0f;
#if PART_MODE == 1
        const float K = a[d * I];
#elif PART_MODE == 2
        const float ga = gamma[d], be = beta[d];
#endif
        int j = j0 + (int)get_local_id(0);
        int o = j / IV, i = j - o * IV;
        for (; j < j1; j += WG) {
            const int k = (o * D + d) * IV + i;
#if PART_MODE == 3 && VEC == 4
            const float4 g4 = vload4(k, a) * select((float4)act_a, (float4)1.0f,
                                                    vload4(k, gate) > (float4)0.0f);
            const float4 gt4 = c_t * g4;
            s1 += (gt4.x + gt4.y) + (gt4.z + gt4.w);
            s2 += dot(gt4, vload4(k, b));
#if WRITE_S
            vstore4(c_s * g4, k, out_s);
#endif
#if WRITE_G
            vstore4(g4, k, out_g);
#endif
#elif PART_MODE == 3
            const float g_ = a[k] * (gate[k] > 0.0f ? 1.0f : act_a);
            s1 += c_t * g_;
            s2 += c_t * g_ * b[k];
#if WRITE_S
            out_s[k] = c_s * g_;
#endif
#if WRITE_G
            out_g[k] = g_;
#endif
#elif VEC == 4
            const float4 a4 = vload4(k, a);
#if NEED_B
            const float4 b4 = vload4(k, b);
#else
            const float4 b4 = a4;
#endif
            PART_STEP(a4.x, b4.x)
            PART_STEP(a4.y, b4.y)
            PART_STEP(a4.z, b4.z)
            PART_STEP(a4.w, b4.w)
#elif NEED_B
            PART_STEP(a[k], b[k])
#else
            PART_STEP(a[k], 0.0f)
#endif
            i += WG;
            while (i >= IV) { i -= IV; ++o; }
        }
        s1 = wg_sum(s1, buf);
        s2 = wg_sum(s2, buf);
        if (get_local_id(0) == 0) {
            part[2 * t] = s1;
            part[2 * t + 1] = s2;
        }
    }
}

/* out1[d] (+)= sum_g part[2(d*chunks+g)], out2 likewise with the second
 * sums; WANT1 / WANT2 choose the outputs (an unused one may be any
 * buffer); WANT_PAIRS also writes both sums to pairs[2d], pairs[2d+1]
 * (BatchNorm's backward needs them plain and accumulates them into the
 * Scale's gradients: one launch instead of two, ~4 us each on an H200). */
#ifndef WANT1
#define WANT1 1
#endif
#ifndef WANT2
#define WANT2 1
#endif
#ifndef WANT_PAIRS
#define WANT_PAIRS 0
#endif
__kernel void chan_partial_sum(int D, int chunks, __global const float* part,
                               __global float* out1, __global float* out2,
                               int acc1, int acc2, __global float* pairs) {
    GLOBAL_LOOP(d, D) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int g = 0; g < chunks; ++g) {
            s1 += part[2 * (d * chunks + g)];
            s2 += part[2 * (d * chunks + g) + 1];
        }
#if WANT1
        out1[d] = acc1 ? out1[d] + s1 : s1;
#endif
#if WANT2
        out2[d] = acc2 ? out2[d] + s2 : s2;
#endif
#if WANT_PAIRS
        pairs[2 * d] = s1;
        pairs[2 * d + 1] = s2;
#endif
    }
}
