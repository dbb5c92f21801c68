/* Zero-padded copies of input rows into __local memory for CPU kernels
 * that compute from a padded band (kernels/depthwise.cl dw_forward_band,
 * kernels/conv_direct.cl conv_direct_rows): the includer defines SW and PW
 * (macros, or parameters named so through PAD_ROWS_GEO_PARAMS, a list of
 * extra parameters starting with a comma). At stride 2 along rows each
 * padded row is stored de-interleaved -- its even columns, then its odd
 * ones, rs / 2 floats apart -- so that one tap of 8 consecutive outputs is
 * one contiguous 8-float load. */
#ifndef PAD_ROWS_H
#define PAD_ROWS_H
#ifndef PAD_ROWS_GEO_PARAMS
#define PAD_ROWS_GEO_PARAMS
#endif
#define PAD_ROWS_DEINT (SW == 2)

/* Rows ih0 .. ih0 + rows - 1 of plane xp, zero-padded (PW columns on each
 * side, rows outside the image all zeros) into buf ([rows][rs]; at stride
 * 2 each row de-interleaved, see PAD_ROWS_DEINT), then ``slack`` zeros that the
 * last row's vector loads may read. ``zeros`` 0: the image's values only,
 * onto a buffer that holds the same rows' padding already (the zeros are
 * never overwritten). */
inline void pad_rows_local(__local float* buf, __global const float* xp, int ih0, int rows,
                           int H, int W, int rs, int zeros, int slack PAD_ROWS_GEO_PARAMS) {
    const int wp = W + 2 * PW;
    for (int r = 0; r < rows; ++r) {
        __local float* d = buf + r * rs;
        const int ih = ih0 + r;
        if (ih < 0 || ih >= H) {
            if (zeros)
                for (int j = 0; j < rs; ++j) d[j] = 0.0f;
            continue;
        }
        __global const float* s = xp + ih * W;
        if (PAD_ROWS_DEINT) {
            /* padded column q goes to d[(q & 1) * odd_at + q / 2] */
            const int odd_at = rs >> 1;
            __local float* de = d + (PW & 1) * odd_at;        /* x's even columns */
            __local float* dod = d + (1 - (PW & 1)) * odd_at; /* x's odd columns */
            if (zeros)
                for (int q = 0; q < PW; ++q) d[(q & 1) * odd_at + (q >> 1)] = 0.0f;
            if (W >= 16) {
                int j = 0;
                for (; j + 16 <= W; j += 16) {
                    const float16 v = vload16(0, s + j);
                    vstore8(v.even, 0, de + ((PW + j) >> 1));
                    vstore8(v.odd, 0, dod + ((PW + j + 1) >> 1));
                }
                if (j < W) {    /* the last 16 columns again (overlapping) */
                    j = W - 16;
                    const float16 v = vload16(0, s + j);
                    const int a = (PW + j) & 1;
                    vstore8(v.even, 0, d + a * odd_at + ((PW + j) >> 1));
                    vstore8(v.odd, 0, d + (1 - a) * odd_at + ((PW + j + 1) >> 1));
                }
            } else if (W >= 8) {    /* columns 0..7 and W-8..W-1 */
                const float8 v = vload8(0, s);
                vstore4(v.even, 0, de + (PW >> 1));
                vstore4(v.odd, 0, dod + ((PW + 1) >> 1));
                const int j = W - 8, a = (PW + j) & 1;
                const float8 u = vload8(0, s + j);
                vstore4(u.even, 0, d + a * odd_at + ((PW + j) >> 1));
                vstore4(u.odd, 0, d + (1 - a) * odd_at + ((PW + j + 1) >> 1));
            } else {
                for (int j = 0; j < W; ++j) d[((PW + j) & 1) * odd_at + ((PW + j) >> 1)] = s[j];
            }
            if (zeros)
                for (int q = PW + W; q < rs; ++q) d[(q & 1) * odd_at + (q >> 1)] = 0.0f;
            continue;
        }
        int j = 0;
        if (zeros)
            for (; j < PW; ++j) d[j] = 0.0f;
        for (j = 0; j + 8 <= W; j += 8) vstore8(vload8(0, s + j), 0, d + PW + j);
        for (; j < W; ++j) d[PW + j] = s[j];
        if (zeros)
            for (j = PW + W; j < wp; ++j) d[j] = 0.0f;
    }
    if (zeros)
        for (int j = 0; j < slack; ++j) buf[rows * rs + j] = 0.0f;
}

#endif
