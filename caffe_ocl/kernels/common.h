/* Shared macros of caffe_ocl kernels. Every kernel bounds-checks its
 * global id, because the host rounds global sizes up to the work-group. */
#ifndef CAFFE_OCL_COMMON_H
#define CAFFE_OCL_COMMON_H

#define GLOBAL_LOOP(i, n) for (int i = get_global_id(0); i < (n); i += get_global_size(0))

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

#endif
