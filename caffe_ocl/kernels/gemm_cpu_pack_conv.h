/* pack_conv_fwd of kernels/gemm_cpu.cl (CONV_B == 1), included there
 * twice: PC_NAME pack_conv_fwd with PC_SPACE __local (the GEMM's own
 * panels) and pack_conv_fwd_g with PC_SPACE __global (pack_b_conv, the
 * panels packed once for every block of rows: PACKED_B). */
/* [kb][NR] panel of op(B) for column rows k0.. and the NR output pixels
 * from column n (``cols`` of them valid; the rest repeat the last one).
 * Each pixel's offset in the padded images is found once; per k the
 * (c, kh, kw) offset is stepped, and each group of 8 pixels lying along
 * one or two image rows at stride 1 or 2 is packed by vector loads
 * (run_split; groups of 8 also with VW 16, so that rows shorter than 16
 * keep them). Stride 2 by vectors: ResNet-50's stride-2 1x1
 * convolutions packed by scalar gathers ran at 32-44 GFLOP/s against
 * 70-80 for their stride-1 neighbours. */
inline void PC_NAME(PC_SPACE float* bp, __global const float* B, int k0, int kb,
                    int n, int cols, int nsplit, int nsB, CONV_ARGS) {
    int off[NR];
    for (int j = 0; j < NR; ++j) {
        const int col = n + min(j, cols - 1);
        const int img = col / nsplit, p = col - img * nsplit;
        const int ho = p / cv_wo, wo = p - ho * cv_wo;
        off[j] = img * nsB + ho * cv_sh * cv_wp + wo * cv_sw;
    }
    const int kk = cv_kh * cv_kw, c = k0 / kk, r = k0 - c * kk;
    int kh = r / cv_kw, kw = r - kh * cv_kw;
    int split[NR / 8];
    for (int q = 0; q < NR / 8; ++q)
        split[q] = cv_sw <= 2 ? run_split(off + 8 * q, cv_sw) : 0;
    __global const float* s = B + c * cv_hwp + kh * cv_dh * cv_wp + kw * cv_dw;
    const int step_row = cv_dh * cv_wp - cv_kw * cv_dw;          /* kw wraps */
    const int step_chan = cv_hwp - cv_kh * cv_dh * cv_wp;        /* kh wraps */
    const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
    for (int k = 0; k < kb; ++k) {
        for (int q = 0; q < NR / 8; ++q) {
            const int L = split[q];
            __global const float* s0 = s + off[8 * q];
            if (L == 8) {
                vstore8(run8(s0, cv_sw), NR / 8 * k + q, bp);
            } else if (L > 0) {
                /* lane j of the second run is pixel j from its start L back */
                const float8 a = run8(s0, cv_sw);
                const float8 b = run8(s + off[8 * q + L] - L * cv_sw, cv_sw);
                vstore8(select(a, b, lane >= L), NR / 8 * k + q, bp);
            } else {
                for (int j = 8 * q; j < 8 * q + 8; ++j) bp[k * NR + j] = s[off[j]];
            }
        }
        s += cv_dw;
        if (++kw == cv_kw) {
            kw = 0;
            s += step_row;
            if (++kh == cv_kh) { kh = 0; s += step_chan; }
        }
    }
}
