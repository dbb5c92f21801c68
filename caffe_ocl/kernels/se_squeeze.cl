/* An SE block's squeeze in one launch (small batches; plan/se_squeeze.py):
 *   pooled[c] = mean over the plane of x[n][c]                (global AVE pooling)
 *   hid[s]    = act1(sum_c W1[s][c] pooled[c] + b1[s])        (1x1 conv / InnerProduct)
 *   gate[n][o] = act2(sum_s W2[o][s] hid[s] + b2[o])          (1x1 conv / InnerProduct)
 * Why: at batch 1 these are three launches of a few microseconds of work
 * each, and a batch-1 forward on a GPU waits on the host's enqueues (5-15
 * us a launch on NVIDIA's OpenCL), three per SE block (EfficientNet-B0:
 * 16 blocks). One work-group per image; all of its work-items keep loads
 * in flight (no barrier inside a loop over memory: a first version with a
 * barrier per 8 channels ran 50-90 us a block on the H200, latency-bound):
 *   1. groups of SQ_LANES work-items sum a plane each (lanes strided over
 *      the plane), partial sums to local memory, then one work-item per
 *      channel adds its lanes' sums in lane order;
 *   2. warps of 32 take rows of W1 (lanes strided over C), their sums
 *      added in lane order;
 *   3. one work-item per output of the second product.
 * Activations as act.h (kinds k1, k2 with their a, b). */
#include "common.h"
#include "act.h"

#ifndef SQ_THREADS
#define SQ_THREADS 1024
#endif
#ifndef SQ_LANES
#define SQ_LANES 8
#endif
#define SQ_WARPS (SQ_THREADS / 32)
#define SQ_GROUPS (SQ_THREADS / SQ_LANES)
#ifndef HAS_B1
#define HAS_B1 0
#endif
#ifndef HAS_B2
#define HAS_B2 0
#endif

#ifndef SQ_CPU
#define SQ_CPU 0
#endif

#if SQ_CPU
/* CPU drivers (work-groups of one item): SQ_PARTS work-items an image,
 * each pooling every plane of its image and computing every hidden unit
 * (the same sums in each: no work-item waits on another), then its own
 * share of the second product's outputs. At batch 1 the three launches
 * this replaces cost PoCL ~10-15 us each besides their work (the host's
 * enqueue, the driver's gap between kernels, threads waking); the
 * repeated pooling and first product are what a small SE block's input
 * costs one core (ops/se_squeeze.py bounds it). Sums by float8 vectors
 * (common.h hsum8). */
/* out[r] = rows r of A (n floats each, ``lda`` apart) . b, r < 4: four
 * independent fma chains (one chain waited on fma's latency: a 1152-wide
 * product ran ~4x slower) */
inline float4 sq_dot4(__global const float* a, int lda, __local const float* b, int n) {
    float8 s0 = (float8)0.0f, s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const float8 v = vload8(0, b + i);
        s0 = fma(vload8(0, a + i), v, s0);
        s1 = fma(vload8(0, a + lda + i), v, s1);
        s2 = fma(vload8(0, a + 2 * lda + i), v, s2);
        s3 = fma(vload8(0, a + 3 * lda + i), v, s3);
    }
    float4 t = (float4)(hsum8(s0), hsum8(s1), hsum8(s2), hsum8(s3));
    for (; i < n; ++i)
        t += (float4)(a[i], a[lda + i], a[2 * lda + i], a[3 * lda + i]) * b[i];
    return t;
}

inline float sq_dot(__global const float* a, __local const float* b, int n) {
    float8 s = (float8)0.0f;
    int i = 0;
    for (; i + 8 <= n; i += 8) s = fma(vload8(0, a + i), vload8(0, b + i), s);
    float t = hsum8(s);
    for (; i < n; ++i) t = fma(a[i], b[i], t);
    return t;
}

/* y[o] = act(A[o] . b + bias[o]) for o in [o0, o1): four rows at a time */
inline void sq_product(__global const float* A, int n, __local const float* b,
                       __global const float* bias, int has_bias, int o0, int o1, int k,
                       float ka, float kb, __global float* yg, __local float* yl) {
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
        float4 t = sq_dot4(A + (size_t)o * n, n, b, n);
        if (has_bias) t += vload4(0, bias + o);
        const float4 r = (float4)(act_eval(k, t.x, ka, kb), act_eval(k, t.y, ka, kb),
                                  act_eval(k, t.z, ka, kb), act_eval(k, t.w, ka, kb));
        if (yg) vstore4(r, 0, yg + o); else vstore4(r, 0, yl + o);
    }
    for (; o < o1; ++o) {
        float t = sq_dot(A + (size_t)o * n, b, n);
        if (has_bias) t += bias[o];
        t = act_eval(k, t, ka, kb);
        if (yg) yg[o] = t; else yl[o] = t;
    }
}

__kernel void se_squeeze_cpu(int C, int HW, int S, int CO, __global const float* X,
                             __global const float* W1, __global const float* B1,
                             __global const float* W2, __global const float* B2,
                             __global float* Y, int k1, float a1, float b1, int k2, float a2,
                             float b2) {
    __local float pooled[SQ_MAX_C];
    __local float hid[SQ_MAX_S];
    const int img = get_group_id(0) / SQ_PARTS, part = get_group_id(0) % SQ_PARTS;
    __global const float* x = X + (size_t)img * C * HW;
    /* four planes at a time: four independent chains of adds */
    int c = 0;
    for (; c + 4 <= C; c += 4) {
        __global const float* pl = x + (size_t)c * HW;
        float8 s0 = (float8)0.0f, s1 = s0, s2 = s0, s3 = s0;
        int p = 0;
        for (; p + 8 <= HW; p += 8) {
            s0 += vload8(0, pl + p);
            s1 += vload8(0, pl + HW + p);
            s2 += vload8(0, pl + 2 * HW + p);
            s3 += vload8(0, pl + 3 * HW + p);
        }
        float4 t = (float4)(hsum8(s0), hsum8(s1), hsum8(s2), hsum8(s3));
        for (; p < HW; ++p)
            t += (float4)(pl[p], pl[HW + p], pl[2 * HW + p], pl[3 * HW + p]);
        vstore4(t / HW, 0, pooled + c);
    }
    for (; c < C; ++c) {
        __global const float* pl = x + (size_t)c * HW;
        float8 s0 = (float8)0.0f;
        int p = 0;
        for (; p + 8 <= HW; p += 8) s0 += vload8(0, pl + p);
        float t = hsum8(s0);
        for (; p < HW; ++p) t += pl[p];
        pooled[c] = t / HW;
    }
    sq_product(W1, C, pooled, B1, HAS_B1, 0, S, k1, a1, b1, 0, hid);
    const int per = (CO + SQ_PARTS - 1) / SQ_PARTS;
    sq_product(W2, S, hid, B2, HAS_B2, part * per, min(CO, (part + 1) * per), k2, a2, b2,
               Y + (size_t)img * CO, 0);
}
#else
__kernel __attribute__((reqd_work_group_size(SQ_THREADS, 1, 1)))
void se_squeeze(int C, int HW, int S, int CO, __global const float* X,
                __global const float* W1, __global const float* B1,
                __global const float* W2, __global const float* B2, __global float* Y,
                int k1, float a1, float b1, int k2, float a2, float b2) {
    /* the lanes' partial sums of the planes, then of W1's rows */
    __local float part[SQ_PART];
    __local float pooled[SQ_MAX_C];
    __local float hid[SQ_MAX_S];
    const int lid = get_local_id(0);
    const int img = get_group_id(0);
    __global const float* x = X + (size_t)img * C * HW;
    /* 1. the planes */
    {
        const int lane = lid % SQ_LANES, grp = lid / SQ_LANES;
        for (int c = grp; c < C; c += SQ_GROUPS) {
            __global const float* pl = x + (size_t)c * HW;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            int p = lane;
            for (; p + 3 * SQ_LANES < HW; p += 4 * SQ_LANES) {
                s0 += pl[p];
                s1 += pl[p + SQ_LANES];
                s2 += pl[p + 2 * SQ_LANES];
                s3 += pl[p + 3 * SQ_LANES];
            }
            for (; p < HW; p += SQ_LANES) s0 += pl[p];
            part[c * SQ_LANES + lane] = (s0 + s1) + (s2 + s3);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int c = lid; c < C; c += SQ_THREADS) {
        float t = 0.0f;
        for (int l = 0; l < SQ_LANES; ++l) t += part[c * SQ_LANES + l];
        pooled[c] = t / HW;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* 2. the first product: warp w the rows w, w + SQ_WARPS, ... */
    {
        const int lane = lid & 31, warp = lid >> 5;
        for (int s = warp; s < S; s += SQ_WARPS) {
            __global const float* w = W1 + (size_t)s * C;
            float a0 = 0.0f, a1_ = 0.0f;
            int c = lane;
            for (; c + 32 < C; c += 64) {
                a0 = fma(w[c], pooled[c], a0);
                a1_ = fma(w[c + 32], pooled[c + 32], a1_);
            }
            if (c < C) a0 = fma(w[c], pooled[c], a0);
            part[s * 32 + lane] = a0 + a1_;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = lid; s < S; s += SQ_THREADS) {
        float t = 0.0f;
        for (int l = 0; l < 32; ++l) t += part[s * 32 + l];
#if HAS_B1
        t += B1[s];
#endif
        hid[s] = act_eval(k1, t, a1, b1);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* 3. the second product: one output per work-item */
    for (int o = lid; o < CO; o += SQ_THREADS) {
        __global const float* w = W2 + (size_t)o * S;
        float a0 = 0.0f, a1_ = 0.0f;
        int s = 0;
        for (; s + 1 < S; s += 2) {
            a0 = fma(w[s], hid[s], a0);
            a1_ = fma(w[s + 1], hid[s + 1], a1_);
        }
        if (s < S) a0 = fma(w[s], hid[s], a0);
        float acc = a0 + a1_;
#if HAS_B2
        acc += B2[o];
#endif
        Y[(size_t)img * CO + o] = act_eval(k2, acc, a2, b2);
    }
}
#endif
