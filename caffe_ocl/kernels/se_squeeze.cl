/* An SE block's squeeze in one launch (GPUs, small batches; plan/se_squeeze.py):
 *   pooled[c] = mean over the plane of x[n][c]                (global AVE pooling)
 *   hid[s]    = act1(sum_c W1[s][c] pooled[c] + b1[s])        (1x1 conv / InnerProduct)
 *   gate[n][o] = act2(sum_s W2[o][s] hid[s] + b2[o])          (1x1 conv / InnerProduct)
 * Why: at batch 1 these are three launches of a few microseconds of work
 * each, and a batch-1 forward on a GPU waits on the host's enqueues (5-15
 * us a launch on NVIDIA's OpenCL), three per SE block (EfficientNet-B0:
 * 16 blocks). One work-group per image (SQ_THREADS work-items in warps of
 * 32): each warp sums planes (lanes strided over the plane, the lanes'
 * sums added in lane order by lane 0), then dots of W1's rows with the
 * pooled vector the same way; each work-item then computes outputs of the
 * second product. Activations as act.h (kinds k1, k2 with their a, b). */
#include "common.h"
#include "act.h"

#ifndef SQ_THREADS
#define SQ_THREADS 256
#endif
#define SQ_WARPS (SQ_THREADS / 32)
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
    __local float pooled[SQ_MAX_C];
    __local float hid[SQ_MAX_S];
    __local float red[SQ_THREADS];
    const int lid = get_local_id(0), lane = lid & 31, warp = lid >> 5;
    const int img = get_group_id(0);
    __global const float* x = X + (size_t)img * C * HW;
    /* 1. the planes' means: warp w sums channels w, w + SQ_WARPS, ... */
    for (int c0 = 0; c0 < C; c0 += SQ_WARPS) {
        const int c = c0 + warp;
        float s = 0.0f;
        if (c < C)
            for (int p = lane; p < HW; p += 32) s += x[(size_t)c * HW + p];
        red[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lane == 0 && c < C) {
            float t = 0.0f;
            for (int l = 0; l < 32; ++l) t += red[lid + l];
            pooled[c] = t / HW;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    /* 2. the first product: warp w the rows w, w + SQ_WARPS, ... of W1 */
    for (int s0 = 0; s0 < S; s0 += SQ_WARPS) {
        const int s = s0 + warp;
        float acc = 0.0f;
        if (s < S)
            for (int c = lane; c < C; c += 32) acc = fma(W1[(size_t)s * C + c], pooled[c], acc);
        red[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lane == 0 && s < S) {
            float t = 0.0f;
            for (int l = 0; l < 32; ++l) t += red[lid + l];
#if HAS_B1
            t += B1[s];
#endif
            hid[s] = act_eval(k1, t, a1, b1);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    /* 3. the second product: one output per work-item */
    for (int o = lid; o < CO; o += SQ_THREADS) {
        float acc = 0.0f;
        __global const float* w = W2 + (size_t)o * S;
        for (int s = 0; s < S; ++s) acc = fma(w[s], hid[s], acc);
#if HAS_B2
        acc += B2[o];
#endif
        Y[(size_t)img * CO + o] = act_eval(k2, acc, a2, b2);
    }
}
