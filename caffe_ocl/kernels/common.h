/* Shared macros of caffe_ocl kernels. Every kernel bounds-checks its
 * global id, because the host rounds global sizes up to the work-group. */
#ifndef CAFFE_OCL_COMMON_H
#define CAFFE_OCL_COMMON_H

/* Every index in [0, n) is visited exactly once by one work-item.
 * Work-groups of more than one item (GPUs): grid-stride, so neighbouring
 * work-items touch neighbouring elements (coalesced).
 * Work-groups of one item (what ops.work_size gives CPU drivers): each
 * work-item takes one contiguous chunk. On PoCL the work-items of a group
 * run one after another, so a grid stride would make every item walk memory
 * with a stride of the whole grid (15-25x slower than contiguous chunks). */
#define GLOBAL_LOOP(i, n) \
    for (int i = (get_local_size(0) == 1) ? (int)get_global_id(0) * _gl_chunk(n) \
                                          : (int)get_global_id(0), \
             _gl_end_##i = (get_local_size(0) == 1) \
                 ? min((n), ((int)get_global_id(0) + 1) * _gl_chunk(n)) : (n), \
             _gl_step_##i = (get_local_size(0) == 1) ? 1 : (int)get_global_size(0); \
         i < _gl_end_##i; i += _gl_step_##i)

inline int _gl_chunk(int n) {
    int g = (int)get_global_size(0);
    return (n + g - 1) / g;
}

/* the sum of a float8's lanes, as halves then pairs */
inline float hsum8(float8 v) {
    const float4 s = v.lo + v.hi;
    return (s.x + s.y) + (s.z + s.w);
}

/* CPU drivers (work-groups of one item): the work-item's GLOBAL_LOOP chunk
 * of an [outer][C][I] tensor of n floats walked as runs of one channel --
 * the channel `c` found once per chunk and stepped, not divided out per
 * element. Between BEGIN and END the body sees the run's first index `k`,
 * its length `len` and its channel `c` (channel.cl chan_affine_runs,
 * normalization.cl's *_runs kernels). */
#define CHANNEL_RUNS_BEGIN(n, C, I)                                            \
    const int chunk_ = _gl_chunk(n);                                           \
    int k = (int)get_global_id(0) * chunk_;                                    \
    const int end_ = min((n), k + chunk_);                                     \
    if (k >= end_) return;                                                     \
    int i_ = k % (I);                                                          \
    int c = (k / (I)) % (C);                                                   \
    while (k < end_) {                                                         \
        const int len = min((I) - i_, end_ - k);
#define CHANNEL_RUNS_END(C)                                                    \
        k += len;                                                              \
        i_ = 0;                                                                \
        if (++c == (C)) c = 0;                                                 \
    }

/* Philox2x32-10 counter-based generator: reproducible random numbers from
 * (seed, index) with no state on the device. */
inline uint2 philox2x32(uint2 ctr, uint key) {
    for (int r = 0; r < 10; ++r) {
        ulong prod = (ulong)0xD256D193u * (ulong)ctr.x;
        uint hi = (uint)(prod >> 32), lo = (uint)prod;
        ctr = (uint2)(hi ^ key ^ ctr.y, lo);
        key += 0x9E3779B9u;
    }
    return ctr;
}

/* uniform float in [0, 1) with 24 random bits */
inline float u01(uint x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* Convolution rows: the output columns wo in [x, y) whose input column
 * w0 + wo*sw lies in [0, W) (the others read padding). Used by the CPU
 * kernels that walk image rows (im2col.cl, depthwise.cl). */
inline int2 valid_wo(int w0, int sw, int W, int WO) {
    const int lo = w0 >= 0 ? 0 : min(WO, (-w0 + sw - 1) / sw);
    const int hi = w0 > W - 1 ? 0 : min(WO, (W - 1 - w0) / sw + 1);
    return (int2)(lo, max(lo, hi));
}

/* 8 elements of a row at stride sw (1 or 2) from s: one unaligned vector
 * load, or the even lanes of two overlapping ones (elements 0..14 only: the
 * 16th may lie past the buffer). The CPU kernels' vector runs (gemm_cpu.cl
 * column packing, pooling.cl windows; a compile-time sw folds the test). */
inline float8 run8(__global const float* s, int sw) {
    if (sw == 1) return vload8(0, s);
    const float8 a = vload8(0, s), b = vload8(0, s + 7);
    return (float8)(a.even, b.odd);
}

/* 4 elements at stride sw (1 or 2) from s, reading elements 0..6 only
 * (run8 for rows too short for 8 outputs: LeNet's 8 x 8 pooling). */
inline float4 run4(__global const float* s, int sw) {
    if (sw == 1) return vload4(0, s);
    const float4 a = vload4(0, s), b = vload4(0, s + 3);
    return (float4)(a.s02, b.s13);
}

/* a / b correctly rounded, as IEEE (and CUDA's default) division. OpenCL
 * lets float division be off by 2.5 ulp (NVIDIA's is), which moves a
 * floor/ceil bin edge computed from the quotient (ROIPooling's 7/3 * 3 gave
 * 7.0000005 -> ceil 8). fma's residual is exact, so the neighbour with the
 * smallest residual is the correctly rounded quotient. */
inline float div_rn(float a, float b) {
    float q = a / b;
    float r = fabs(fma(-q, b, a));
    const float up = nextafter(q, INFINITY), dn = nextafter(q, -INFINITY);
    const float ru = fabs(fma(-up, b, a)), rd = fabs(fma(-dn, b, a));
    if (ru < r) { q = up; r = ru; }
    if (rd < r) q = dn;
    return q;
}

#endif
