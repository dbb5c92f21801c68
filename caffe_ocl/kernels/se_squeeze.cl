/* An SE block's squeeze in one launch (GPUs, small batches; plan/se_squeeze.py):
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
