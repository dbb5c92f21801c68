/* Work-group reductions shared by the per-channel kernels
 * (normalization.cl, channel.cl). WG is the work-group size, a power of
 * two fixed at build time (-DWG=...); every work-item of the group must
 * call wg_sum (it contains barriers). */
#ifndef CAFFE_OCL_REDUCE_H
#define CAFFE_OCL_REDUCE_H

#ifndef WG
#define WG 64
#endif
#if (WG & (WG - 1)) != 0
#error "WG must be a power of two"
#endif

/* Sum of v over the work-group, returned to every work-item. */
inline float wg_sum(float v, __local float* buf) {
    const int lid = get_local_id(0);
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) buf[lid] += buf[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);   /* buf may be reused right after */
    return r;
}

/* Element j (0 <= j < O*I) of channel c in a [O][C][I] layout. */
#define CHAN_INDEX(j, c, C, I) ((((j) / (I)) * (C) + (c)) * (I) + (j) % (I))

#endif
