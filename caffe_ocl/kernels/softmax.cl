/* Softmax over the middle axis of [outer][C][inner], one work-item per
 * (outer, inner) pair; max-subtracted as Caffe does. The *_group kernels
 * give each (outer, inner) pair a work-group of SM_LSIZE that shares the
 * pass over C (a classifier's 64 x 1000 was 64 serial loops on a GPU). */
#include "common.h"

#ifndef SM_LSIZE
#define SM_LSIZE 256
#endif
#if (SM_LSIZE & (SM_LSIZE - 1)) != 0
#error "SM_LSIZE must be a power of two"
#endif

inline float sm_reduce(__local float* r, float v, int is_max) {
    int lid = get_local_id(0);
    r[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = SM_LSIZE / 2; st > 0; st >>= 1) {
        if (lid < st) r[lid] = is_max ? fmax(r[lid], r[lid + st]) : r[lid] + r[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float out = r[0];
    barrier(CLK_LOCAL_MEM_FENCE);      /* r is reused by the next reduction */
    return out;
}

/* Many short rows (inner == 1: attention's scores, 150528 rows of 49 in
 * Swin-T at batch 16): SM_RL lanes per row, SM_LSIZE / SM_RL rows per
 * work-group, the lanes reading neighbouring values. One work-item per row
 * read its row alone, 49 floats apart from its neighbours' (360 us for
 * 29 MB on an H100). The lanes of a row reduce in their segment of r. */
#ifdef SM_RL
inline float sm_lane_reduce(__local float* r, float v, int is_max) {
    const int lid = get_local_id(0), lane = lid % SM_RL;
    r[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = SM_RL / 2; st > 0; st >>= 1) {
        if (lane < st) r[lid] = is_max ? fmax(r[lid], r[lid + st]) : r[lid] + r[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float out = r[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);
    return out;
}

__kernel __attribute__((reqd_work_group_size(SM_LSIZE, 1, 1)))
void softmax_fwd_rows(int outer, int C, int inner,
                      __global const float* x, __global float* y) {
    __local float r[SM_LSIZE];
    const int lid = get_local_id(0), lane = lid % SM_RL;
    const int row = get_group_id(0) * (SM_LSIZE / SM_RL) + lid / SM_RL;
    const int n = row < outer ? C : 0;       /* every lane reaches the barriers */
    __global const float* px = x + (size_t)row * C;
    __global float* py = y + (size_t)row * C;
    float m = -FLT_MAX;
    for (int c = lane; c < n; c += SM_RL) m = fmax(m, px[c]);
    m = sm_lane_reduce(r, m, 1);
    float sum = 0.0f;
    for (int c = lane; c < n; c += SM_RL) {
        const float e = exp(px[c] - m);
        py[c] = e;
        sum += e;
    }
    const float inv = 1.0f / sm_lane_reduce(r, sum, 0);
    for (int c = lane; c < n; c += SM_RL) py[c] *= inv;
}
#endif

__kernel __attribute__((reqd_work_group_size(SM_LSIZE, 1, 1)))
void softmax_fwd_group(int outer, int C, int inner,
                       __global const float* x, __global float* y) {
    __local float r[SM_LSIZE];
    int idx = get_group_id(0), lid = get_local_id(0);
    int s = idx % inner, o = idx / inner;
    __global const float* px = x + o * C * inner + s;
    __global float* py = y + o * C * inner + s;
    float m = -FLT_MAX;
    for (int c = lid; c < C; c += SM_LSIZE) m = fmax(m, px[c * inner]);
    m = sm_reduce(r, m, 1);
    float sum = 0.0f;
    for (int c = lid; c < C; c += SM_LSIZE) {
        float e = exp(px[c * inner] - m);
        py[c * inner] = e;
        sum += e;
    }
    float inv = 1.0f / sm_reduce(r, sum, 0);
    for (int c = lid; c < C; c += SM_LSIZE) py[c * inner] *= inv;
}

/* Few pairs with very many channels (a face-recognition classifier's 79077
 * classes at batch 1: one work-group walked them in 150 us on an H100): a
 * pair's C is cut into `parts` runs of `chunk` channels, a work-group
 * each. softmax_fwd_parts writes each run's max and sum of exp(x - max)
 * to P[pair][part][2]; softmax_fwd_wide combines its pair's runs (the max
 * of the maxima M, the sums scaled by exp(max - M)) and writes its run of
 * y = exp(x - M) / sum. Groups (parts, pairs). */
__kernel __attribute__((reqd_work_group_size(SM_LSIZE, 1, 1)))
void softmax_fwd_parts(int outer, int C, int inner, int parts, int chunk,
                       __global const float* x, __global float* P) {
    __local float r[SM_LSIZE];
    const int part = get_group_id(0), idx = get_group_id(1), lid = get_local_id(0);
    const int s = idx % inner, o = idx / inner;
    __global const float* px = x + (size_t)o * C * inner + s;
    const int c1 = min(C, (part + 1) * chunk);
    float m = -FLT_MAX;
    for (int c = part * chunk + lid; c < c1; c += SM_LSIZE) m = fmax(m, px[(size_t)c * inner]);
    m = sm_reduce(r, m, 1);
    float sum = 0.0f;
    for (int c = part * chunk + lid; c < c1; c += SM_LSIZE) sum += exp(px[(size_t)c * inner] - m);
    sum = sm_reduce(r, sum, 0);
    if (lid == 0) {
        P[2 * ((size_t)idx * parts + part)] = m;
        P[2 * ((size_t)idx * parts + part) + 1] = sum;
    }
}

__kernel __attribute__((reqd_work_group_size(SM_LSIZE, 1, 1)))
void softmax_fwd_wide(int outer, int C, int inner, int parts, int chunk,
                      __global const float* x, __global const float* P, __global float* y) {
    __local float r[SM_LSIZE];
    const int part = get_group_id(0), idx = get_group_id(1), lid = get_local_id(0);
    const int s = idx % inner, o = idx / inner;
    __global const float* pp = P + 2 * (size_t)idx * parts;
    float m = -FLT_MAX;
    for (int q = lid; q < parts; q += SM_LSIZE) m = fmax(m, pp[2 * q]);
    m = sm_reduce(r, m, 1);
    float sum = 0.0f;
    for (int q = lid; q < parts; q += SM_LSIZE) sum += pp[2 * q + 1] * exp(pp[2 * q] - m);
    const float inv = 1.0f / sm_reduce(r, sum, 0);
    __global const float* px = x + (size_t)o * C * inner + s;
    __global float* py = y + (size_t)o * C * inner + s;
    const int c1 = min(C, (part + 1) * chunk);
    for (int c = part * chunk + lid; c < c1; c += SM_LSIZE)
        py[(size_t)c * inner] = exp(px[(size_t)c * inner] - m) * inv;
}

__kernel __attribute__((reqd_work_group_size(SM_LSIZE, 1, 1)))
void softmax_bwd_group(int outer, int C, int inner, __global const float* y,
                       __global const float* dy, __global float* dx) {
    __local float r[SM_LSIZE];
    int idx = get_group_id(0), lid = get_local_id(0);
    int s = idx % inner, o = idx / inner;
    int base = o * C * inner + s;
    float dot = 0.0f;
    for (int c = lid; c < C; c += SM_LSIZE) dot += dy[base + c * inner] * y[base + c * inner];
    dot = sm_reduce(r, dot, 0);
    for (int c = lid; c < C; c += SM_LSIZE) {
        int p = base + c * inner;
        dx[p] = y[p] * (dy[p] - dot);
    }
}

__kernel void softmax_fwd(int outer, int C, int inner,
                          __global const float* x, __global float* y) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int s = idx % inner, o = idx / inner;
        __global const float* px = x + o * C * inner + s;
        __global float* py = y + o * C * inner + s;
        float m = -FLT_MAX;
        for (int c = 0; c < C; ++c) m = fmax(m, px[c * inner]);
        float sum = 0.0f;
        for (int c = 0; c < C; ++c) { float e = exp(px[c * inner] - m); py[c * inner] = e; sum += e; }
        float inv = 1.0f / sum;
        for (int c = 0; c < C; ++c) py[c * inner] *= inv;
    }
}

/* dx = y * (dy - sum_c dy*y) */
__kernel void softmax_bwd(int outer, int C, int inner, __global const float* y,
                          __global const float* dy, __global float* dx) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int s = idx % inner, o = idx / inner;
        int base = o * C * inner + s;
        float dot = 0.0f;
        for (int c = 0; c < C; ++c) dot += dy[base + c * inner] * y[base + c * inner];
        for (int c = 0; c < C; ++c) {
            int p = base + c * inner;
            dx[p] = y[p] * (dy[p] - dot);
        }
    }
}

#ifdef CAFFE_OCL_CPU
#include "act.h"
/* CPU drivers: work-items over (outer, run of 8 positions of inner), the
 * run's C values as float8 vectors and act.h's inline exp; a run shorter
 * than 8 (inner % 8, or a classifier's inner of 1) position by position.
 * The kernel above walks each position alone with the library exp: a
 * 64-channel 56 x 56 map ran at ~1/3 of OpenCV's speed on PoCL (so did
 * MTCNN's P-Net and segmentation nets' per-pixel softmax). Divides by the
 * sum as Caffe does. act_exp clamps its argument at -87.3 (exp's smallest
 * normal result): below it the value is 0 here, as the library's exp
 * flushed (a loss's -log(max(p, FLT_MIN)) then reads FLT_MIN, as Caffe's). */
#define SM_EXP(d, T) select(ACT_EXP(d), (T)(0.0f), (d) < (T)(-87.3f))
__kernel void softmax_fwd_cpu(int outer, int C, int inner,
                              __global const float* x, __global float* y) {
    if (inner == 1) {
        /* over the last axis (attention's scores): each row vectorised
         * along C (one item a row; the loop below would run it one float
         * at a time) */
        GLOBAL_LOOP(o, outer) {
            __global const float* px = x + (size_t)o * C;
            __global float* py = y + (size_t)o * C;
            float8 m8 = (float8)(-FLT_MAX);
            int c = 0;
            for (; c + 8 <= C; c += 8) m8 = fmax(m8, vload8(0, px + c));
            float4 m4 = fmax(m8.lo, m8.hi);
            float m = fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w));
            for (; c < C; ++c) m = fmax(m, px[c]);
            float8 s8 = (float8)(0.0f);
            float sum = 0.0f;
            for (c = 0; c + 8 <= C; c += 8) {
                const float8 e = SM_EXP(vload8(0, px + c) - m, float8);
                vstore8(e, 0, py + c);
                s8 += e;
            }
            for (; c < C; ++c) {
                const float e = SM_EXP(px[c] - m, float);
                py[c] = e;
                sum += e;
            }
            sum += hsum8(s8);
            for (c = 0; c + 8 <= C; c += 8) vstore8(vload8(0, py + c) / sum, 0, py + c);
            for (; c < C; ++c) py[c] /= sum;
        }
        return;
    }
    const int runs = (inner + 7) / 8;
    GLOBAL_LOOP(item, outer * runs) {
        const int o = item / runs, s = (item - o * runs) * 8;
        __global const float* px = x + (size_t)o * C * inner;
        __global float* py = y + (size_t)o * C * inner;
        if (s + 8 <= inner) {
            float8 m = (float8)(-FLT_MAX);
            for (int c = 0; c < C; ++c) m = fmax(m, vload8(0, px + (size_t)c * inner + s));
            float8 sum = (float8)(0.0f);
            for (int c = 0; c < C; ++c) {
                const float8 d = vload8(0, px + (size_t)c * inner + s) - m;
                const float8 e = SM_EXP(d, float8);
                vstore8(e, 0, py + (size_t)c * inner + s);
                sum += e;
            }
            for (int c = 0; c < C; ++c)
                vstore8(vload8(0, py + (size_t)c * inner + s) / sum, 0, py + (size_t)c * inner + s);
        } else {
            for (int t = s; t < inner; ++t) {
                float m = -FLT_MAX;
                for (int c = 0; c < C; ++c) m = fmax(m, px[(size_t)c * inner + t]);
                float sum = 0.0f;
                for (int c = 0; c < C; ++c) {
                    const float d = px[(size_t)c * inner + t] - m;
                    const float e = SM_EXP(d, float);
                    py[(size_t)c * inner + t] = e;
                    sum += e;
                }
                for (int c = 0; c < C; ++c) py[(size_t)c * inner + t] /= sum;
            }
        }
    }
}
#endif
