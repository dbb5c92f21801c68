/* The op(A) operand of kernels/gemm_cpu.cl packed once (PACKED_A): for each
 * of G groups, the M x K row-major matrix src + g * M * K laid out as
 * ceil(M / 6) panels of [K][6] (panel p holds rows 6p .. 6p+5; rows past M
 * are zeros). dst + g * Mp * K, Mp = ceil(M / 6) * 6. One work-item per
 * packed float. */
__kernel void pack_a_panels(int total, int M, int K, int Mp,
                            __global const float* src, int off_src,
                            __global float* dst) {
    const int i = get_global_id(0);
    if (i >= total) return;
    const int per_group = Mp * K;
    const int g = i / per_group, r = i - g * per_group;
    const int p = r / (6 * K), q = r - p * 6 * K;
    const int k = q / 6, m = 6 * p + (q - k * 6);
    dst[i] = m < M ? src[off_src + (g * M + m) * K + k] : 0.0f;
}
