/* Which output tile a work-group of the GPU tile kernels (gemm.cl,
 * conv_igemm.cl) computes: TILE_ORIGIN(m0, n0) declares them.
 *
 * Why not simply m0 = group(1) * TM, n0 = group(0) * TN: GPUs start
 * work-groups roughly in order of group(0) + group(1) * groups(0), so the
 * whole first row of tiles (every column block of B, read once each) runs
 * before the second row starts. When B is larger than the L2 cache (a
 * convolution's columns at batch 64: 103 MB for 128 channels of 56 x 56),
 * each row of tiles reads all of B again from memory: a 256-row product
 * reads its 103 MB twice, an 512-row one four times.
 *
 * With RASTER > 1 the work-groups are walked in bands of RASTER rows of
 * tiles, row fastest within a band (the grouped order of Triton's matmul
 * tutorial): the RASTER work-groups that share a column block of B start
 * one after another, so B comes from memory about once per band, and a
 * band's rows of A (RASTER * TM rows, weights) stay in L2. The grid is
 * unchanged (the host's sizes and group(2) mean what they meant); RASTER 1
 * (or undefined) is the plain order. */
#ifndef CAFFE_OCL_TILE_RASTER_H
#define CAFFE_OCL_TILE_RASTER_H
#ifndef RASTER
#define RASTER 1
#endif
#if RASTER > 1
#define TILE_ORIGIN(m0, n0)                                                       \
    int m0, n0;                                                                   \
    {                                                                             \
        const int ngn_ = get_num_groups(0), ngm_ = get_num_groups(1);             \
        const int pid_ = get_group_id(1) * ngn_ + get_group_id(0);                \
        const int band_ = pid_ / (RASTER * ngn_);                                 \
        const int first_ = band_ * RASTER;                                        \
        const int rows_ = min(ngm_ - first_, RASTER);                             \
        const int r_ = pid_ - band_ * (RASTER * ngn_);                            \
        m0 = (first_ + r_ % rows_) * TM;                                          \
        n0 = (r_ / rows_) * TN;                                                   \
    }
#else
#define TILE_ORIGIN(m0, n0) const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
#endif
#endif
