/* Gradient averaging across data-parallel ranks (caffe_ocl.parallel).
 *
 * sum_ranks: the node-local (shared-memory) reduction. Every rank holds its
 * own contribution in its parameter diff and the other ranks' in a staging
 * buffer laid out [nranks - 1][pstride] (rank r at slot r, or r - 1 when
 * r > me). The sum runs in rank order 0..nranks-1 on every rank and is then
 * multiplied by scale (1 / nranks), so all ranks get bitwise identical
 * results (Caffe: ncclAllReduce SUM, then scal(1 / solver_count)).
 *
 * scale_inplace: x *= a (the MPI path scales the summed gradients on the
 * device after uploading them). */
#include "common.h"

__kernel void sum_ranks(int n, __global float* diff, int doff,
                        __global const float* peers, int poff, int pstride,
                        int nranks, int me, float scale) {
    GLOBAL_LOOP(i, n) {
        float acc = 0.0f;
        for (int r = 0; r < nranks; ++r) {
            float v;
            if (r == me) {
                v = diff[doff + i];
            } else {
                long slot = (long)(r < me ? r : r - 1);
                v = peers[slot * (long)pstride + (long)(poff + i)];
            }
            acc = (r == 0) ? v : acc + v;
        }
        diff[doff + i] = acc * scale;
    }
}

__kernel void scale_inplace(int n, __global float* x, int off, float a) {
    GLOBAL_LOOP(i, n) {
        x[off + i] = x[off + i] * a;
    }
}
