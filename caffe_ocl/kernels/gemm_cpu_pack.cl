/* The op(A) operand of kernels/gemm_cpu.cl packed once (PACKED_A): for each
 * of G groups, the M x K row-major matrix src + off_src + g * M * K laid
 * out as ceil(M / 6) panels of [K][6] (panel p holds rows 6p .. 6p+5; rows
 * past M are zeros), group g from dst + g * Mp * K, Mp = ceil(M / 6) * 6.
 * One work-item per (group, panel): six row streams in, one stream out
 * (a work-item per packed float, reading 6 rows K apart in turn, took
 * 4.5 ms for 1.2 MB on PoCL). */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_a_panels(int panels, int M, int K, int Mp,
                   __global const float* src, int off_src, __global float* dst) {
    const int i = get_global_id(0);
    if (i >= panels) return;
    const int per = Mp / 6;
    const int g = i / per, p = i - g * per;
    __global const float* s = src + off_src + (g * M + 6 * p) * K;
    __global float* d = dst + (g * Mp + 6 * p) * K;
    const int rows = min(6, M - 6 * p);
    for (int k = 0; k < K; ++k)
        for (int r = 0; r < 6; ++r)
            d[6 * k + r] = r < rows ? s[r * K + k] : 0.0f;
}


/* The op(B) operand of kernels/gemm_cpu.cl packed once (PACKED_B without
 * CONV_B: a fully-connected layer's weights), as pack_b_conv lays it out:
 * panel p (columns p*NR .. p*NR + NR-1 of op(B), past N repeating column
 * N-1) at dst + p*K*NR, its K rows of NR floats one after another. src is
 * op(B) = src^T stored N x K (TRANS 1: Caffe's InnerProduct weights) or
 * op(B) = src stored K x N (TRANS 0). One work-item per (panel, chunk of
 * kchunk rows). */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_b_panels(int N, int K, int nr, int kchunk, int trans,
                   __global const float* src, __global float* dst) {
    const int nkc = (K + kchunk - 1) / kchunk, np = (N + nr - 1) / nr;
    const int item = get_global_id(0);
    if (item >= np * nkc) return;
    const int p = item / nkc, k0 = (item - p * nkc) * kchunk;
    const int k1 = min(K, k0 + kchunk);
    __global float* d = dst + (size_t)p * K * nr;
    if (trans) {        /* nr row streams of K, each read along k */
        for (int j = 0; j < nr; ++j) {
            __global const float* s = src + (size_t)min(p * nr + j, N - 1) * K;
            for (int k = k0; k < k1; ++k) d[k * nr + j] = s[k];
        }
    } else {            /* rows of N, nr columns of each */
        for (int k = k0; k < k1; ++k)
            for (int j = 0; j < nr; ++j)
                d[k * nr + j] = src[(size_t)k * N + min(p * nr + j, N - 1)];
    }
}
