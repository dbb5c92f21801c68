/* Direct depthwise 2-D convolution (groups == channels == num_output):
 * y[n,c] = x[n,c] (*) w[c] -- each output reads KH*KW inputs of its own
 * channel, so the dense GEMM tiles of conv_igemm.cl / im2col+gemm would
 * be mostly zeros. Launch helpers: caffe_ocl/ops/depthwise.py.
 *
 * Layouts: x [N][C][H][W], y / dy [N][C][HO][WO], w [C][1][KH][KW].
 * Geometry macros: KH KW SH SW PH PW DH DW (compile-time, so the tap loops
 * unroll and a stride of 1 needs no division); sizes are arguments.
 * ACT epilogue: act.h. WG: work-group size of dw_bwd_weight (several
 * work-groups per channel, summed by dw_bwd_weight_sum). */
#include "common.h"

/* DW_RUNTIME=1 (ops/depthwise.py, kernels larger than 7 x 7): the geometry
 * is read from the kernels' g_* arguments instead of -D macros, so one
 * program serves every large geometry and no tap loop has a compile-time
 * trip count to unroll (a 32 x 32 kernel, fully unrolled in every kernel of
 * this file, took PoCL 5 minutes to build). The g_* arguments are passed in
 * both modes; specialised programs ignore them. DW_GEO_PARAMS / DW_GEO hand
 * them on to the helper functions. */
#ifndef DW_RUNTIME
#define DW_RUNTIME 0
#endif
#define DW_GEO_ARGS int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, \
    int g_dh, int g_dw
#if DW_RUNTIME
#define KH g_kh
#define KW g_kw
#define SH g_sh
#define SW g_sw
#define PH g_ph
#define PW g_pw
#define DH g_dh
#define DW g_dw
#define DW_GEO_PARAMS , DW_GEO_ARGS
#define DW_GEO , g_kh, g_kw, g_sh, g_sw, g_ph, g_pw, g_dh, g_dw
#else
#define DW_GEO_PARAMS
#define DW_GEO
#endif

#include "conv_geom.h"
#ifndef BIAS
#define BIAS 0
#endif
#ifndef WG
#define WG 256
#endif
#include "act.h"
#define PAD_ROWS_GEO_PARAMS DW_GEO_PARAMS
#include "pad_rows.h"

#define TAPS (KH * KW)
/* dw_forward_band: __local floats of a band of padded input rows (set by
 * ops/depthwise.py, which sizes bands to it), and the zeros after its last
 * row that the last vector loads may read (8 lanes at stride SW). Programs
 * built for the other kernels leave it unset: the tiny default keeps their
 * __local footprint small (Oclgrind charges every kernel of a program with
 * all its __local arrays and refused launches needing 64 KiB). */
#ifndef DW_BAND_FLOATS
#define DW_BAND_FLOATS 8
#endif
#define DW_SLACK (8 * SW + (KW - 1) * DW)
/* dw_forward_band: output chunks of 8 computed together (4, 2 or 1) */
#ifndef DW_CHUNKS
#define DW_CHUNKS 4
#endif

/* the CPU forward kernels' per-plane constants: channel c's taps (wv) and
 * bias (b; 0 without BIAS) */
#if BIAS
#define DW_BIAS_OF(c) bias[c]
#else
#define DW_BIAS_OF(c) 0.0f
#endif
/* channel c's PReLU slope (ACT 7, act.h) */
#if ACT == 7
#define DW_SLOPE_OF(c) PRELU_SLOPE(bias, c)
#else
#define DW_SLOPE_OF(c) 0.0f
#endif
#if DW_RUNTIME
#define DW_CHANNEL_TAPS(c)                                          \
    __global const float* wv = w + (c) * TAPS;                      \
    const float slope_ = DW_SLOPE_OF(c);                            \
    const float b = DW_BIAS_OF(c)
#else
#define DW_CHANNEL_TAPS(c)                                          \
    float wv[TAPS];                                                 \
    _Pragma("unroll")                                               \
    for (int t_ = 0; t_ < TAPS; ++t_) wv[t_] = w[(c) * TAPS + t_];  \
    const float slope_ = DW_SLOPE_OF(c);                            \
    const float b = DW_BIAS_OF(c)
#endif

/* y = act(x (*) w + bias); one output element per index. */
__kernel void dw_forward(int total, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                         __global const float* x, __global const float* w,
                         __global const float* bias, __global float* y,
                         float act_a, float act_b) {
    GLOBAL_LOOP(i, total) {
        int ow = i % WO;
        int t = i / WO;
        int oh = t % HO;
        int nc = t / HO;
        int c = nc % C;
        __global const float* xp = x + (size_t)nc * H * W;
        __global const float* wp = w + c * TAPS;
        int ih0 = oh * SH - PH, iw0 = ow * SW - PW;
        float acc = 0.0f;
        if (ih0 >= 0 && ih0 + (KH - 1) * DH < H && iw0 >= 0 && iw0 + (KW - 1) * DW < W) {
            __global const float* xr = xp + ih0 * W + iw0;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                for (int kw = 0; kw < KW; ++kw)
                    acc = fma(xr[kh * DH * W + kw * DW], wp[kh * KW + kw], acc);
        } else {
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                int ih = ih0 + kh * DH;
                if (ih < 0 || ih >= H) continue;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    int iw = iw0 + kw * DW;
                    if (iw >= 0 && iw < W)
                        acc = fma(xp[ih * W + iw], wp[kh * KW + kw], acc);
                }
            }
        }
#if BIAS
        acc += bias[c];
#endif
        y[i] = APPLY_ACT_CH(acc, PRELU_SLOPE(bias, c));
    }
}

/* dx = conv^T(dy) (+ dx if accumulate), gathered: each input element sums
 * the outputs whose window covers it (no atomics). */
__kernel void dw_bwd_data(int total, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                          __global const float* dy, __global const float* w,
                          __global float* dx, int accumulate) {
    GLOBAL_LOOP(i, total) {
        int iw = i % W;
        int t = i / W;
        int ih = t % H;
        int nc = t / H;
        int c = nc % C;
        __global const float* dyp = dy + (size_t)nc * HO * WO;
        __global const float* wp = w + c * TAPS;
        float acc = 0.0f;
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
            int ohs = ih + PH - kh * DH;
            if (ohs < 0 || (SH > 1 && ohs % SH)) continue;
            int oh = ohs / SH;
            if (oh >= HO) continue;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                int ows = iw + PW - kw * DW;
                if (ows < 0 || (SW > 1 && ows % SW)) continue;
                int ow = ows / SW;
                if (ow < WO)
                    acc = fma(dyp[oh * WO + ow], wp[kh * KW + kw], acc);
            }
        }
        dx[i] = accumulate ? dx[i] + acc : acc;
    }
}

/* Stride 2 (dw_forward_band): each padded row is kept de-interleaved,
 * its even columns then its odd ones ([rs / 2] each, rs = wp rounded up to
 * even), so that every tap of 8 consecutive outputs is one contiguous
 * 8-float load (padded column 2 * ow + t is entry ow + t / 2 of the half
 * of t's parity). Reading the even lanes of a 16-wide load at every tap
 * took two loads and a shuffle per tap: MobileNet v3's stride-2 layers ran
 * at 0.36-0.57 of ONNX Runtime's speed. */
#define DW_DEINT PAD_ROWS_DEINT      /* the rows' layout, kernels/pad_rows.h */

/* 8 inputs of (padded) row xr for 8 consecutive outputs from column ow,
 * tap column kw (compile-time stride: one unaligned vector load at stride
 * 1 and, from the de-interleaved halves (``odd_at`` floats apart), at stride
 * 2; gathered otherwise). */
inline float8 dw_row8(__local const float* xr, int ow, int kw, int odd_at DW_GEO_PARAMS) {
    if (SW == 1) return vload8(0, xr + ow + kw * DW);
    if (DW_DEINT) {
        const int t = kw * DW;
        return vload8(0, xr + ((t & 1) ? odd_at : 0) + ow + (t >> 1));
    }
    __local const float* s = xr + ow * SW + kw * DW;
    return (float8)(s[0], s[SW], s[2 * SW], s[3 * SW], s[4 * SW], s[5 * SW], s[6 * SW],
                    s[7 * SW]);
}

/* CPU drivers (work-groups of one item, GLOBAL_LOOP giving each a run of
 * (image, channel) planes): each band of ``band`` output rows copies the
 * input rows it reads into __local memory, zero-padded, then computes its
 * outputs 8 at a time in a float8 register summed over the taps (one
 * vector load + fma per tap, no bounds tests, each output stored once; a
 * row's last 8 overlap the previous ones, rows under 8 store their lanes
 * one by one). The per-tap row sweeps with bounds-tested segments it
 * replaces read and wrote each y row once per tap and ran the edge columns
 * scalar: MobileNet v2's depthwise layers at batch 16 took 49 ms per pass
 * against 17 ms without their edge columns. */
__kernel void dw_forward_band(int units, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw, int band,
                              __global const float* x, __global const float* w,
                              __global const float* bias, __global float* y,
                              float act_a, float act_b) {
    __local float buf[DW_BAND_FLOATS];
    /* floats per padded row in buf (even at stride 2: two equal halves) */
    const int wp = DW_DEINT ? ((W + 2 * PW + 1) & ~1) : W + 2 * PW;
    const int odd_at = wp >> 1;
    /* planes of one band find its padding in buf from the work-item's
     * previous plane: only their values are copied */
    int padded = 0;
    GLOBAL_LOOP(u, units) {
        const int c = u % C;
        __global const float* xp = x + (size_t)u * H * W;
        __global float* yp = y + (size_t)u * HO * WO;
        DW_CHANNEL_TAPS(c);
        for (int oh0 = 0; oh0 < HO; oh0 += band) {
            const int nr = min(band, HO - oh0);
            pad_rows_local(buf, xp, oh0 * SH - PH, (nr - 1) * SH + (KH - 1) * DH + 1, H, W, wp,
                           !padded, DW_SLACK DW_GEO);
            padded = band >= HO;
            for (int r = 0; r < nr; ++r) {
                __local const float* xr = buf + r * SH * wp;
                __global float* yr = yp + (oh0 + r) * WO;
                int ow0 = 0;
#if DW_CHUNKS >= 4
                /* 32 outputs at a time: four independent fma chains (one
                 * chain of KH * KW dependent fmas per 8 outputs waited on
                 * the fma latency) */
                for (; ow0 + 32 <= WO; ow0 += 32) {
                    float8 a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                        for (int kw = 0; kw < KW; ++kw) {
                            __local const float* xk = xr + kh * DH * wp;
                            const float8 t = (float8)wv[kh * KW + kw];
                            a0 = fma(dw_row8(xk, ow0, kw, odd_at DW_GEO), t, a0);
                            a1 = fma(dw_row8(xk, ow0 + 8, kw, odd_at DW_GEO), t, a1);
                            a2 = fma(dw_row8(xk, ow0 + 16, kw, odd_at DW_GEO), t, a2);
                            a3 = fma(dw_row8(xk, ow0 + 24, kw, odd_at DW_GEO), t, a3);
                        }
                    vstore8(APPLY_ACT8_CH(a0 + b, slope_), 0, yr + ow0);
                    vstore8(APPLY_ACT8_CH(a1 + b, slope_), 0, yr + ow0 + 8);
                    vstore8(APPLY_ACT8_CH(a2 + b, slope_), 0, yr + ow0 + 16);
                    vstore8(APPLY_ACT8_CH(a3 + b, slope_), 0, yr + ow0 + 24);
                }
#endif
#if DW_CHUNKS >= 2
                for (; ow0 + 16 <= WO; ow0 += 16) {
                    float8 a0 = 0.0f, a1 = 0.0f;
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                        for (int kw = 0; kw < KW; ++kw) {
                            __local const float* xk = xr + kh * DH * wp;
                            const float8 t = (float8)wv[kh * KW + kw];
                            a0 = fma(dw_row8(xk, ow0, kw, odd_at DW_GEO), t, a0);
                            a1 = fma(dw_row8(xk, ow0 + 8, kw, odd_at DW_GEO), t, a1);
                        }
                    vstore8(APPLY_ACT8_CH(a0 + b, slope_), 0, yr + ow0);
                    vstore8(APPLY_ACT8_CH(a1 + b, slope_), 0, yr + ow0 + 8);
                }
#endif
                for (int ow = ow0; ow < WO; ow += 8) {
                    const int o = max(0, min(ow, WO - 8));
                    float8 acc = 0.0f;
#pragma unroll
                    for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                        for (int kw = 0; kw < KW; ++kw)
                            acc = fma(dw_row8(xr + kh * DH * wp, o, kw, odd_at DW_GEO),
                                      (float8)wv[kh * KW + kw], acc);
                    acc = APPLY_ACT8_CH(acc + b, slope_);
                    if (WO >= 8) {
                        vstore8(acc, 0, yr + o);
                    } else {
                        float v[8];
                        vstore8(acc, 0, v);
                        for (int j = 0; j < WO; ++j) yr[j] = v[j];
                    }
                }
            }
        }
    }
}

/* CPU drivers, small planes at stride 1 keeping their size (HO == H,
 * WO == W: 2*PH == DH*(KH-1), 2*PW == DW*(KW-1)): the plane is one run of
 * H*W floats, so output p and its tap (kh, kw) are p + (kh*DH - PH)*W +
 * kw*DW - PW in it. The plane goes into __local memory between FLAT_PAD =
 * PH*W + PW zeros on each side (the rows above and below), and the outputs
 * are computed 8 at a time along the run (the last 8 overlapping the
 * previous ones), each tap's column masked where it would wrap into the
 * neighbouring row. 7 x 7 planes by dw_forward_band's rows ran one 8-wide
 * vector with 7 lanes used per row and stored it lane by lane, after
 * padding 9 rows: MobileNet v2's 7 x 7 depthwise layers took twice ONNX
 * Runtime's time. Host (ops/depthwise.py flat_fits): H*W in [8, FLAT_MAX]
 * and H*W + 2*FLAT_PAD <= FLAT_BUF. */
#define FLAT_MAX 256
#define FLAT_BUF (3 * FLAT_MAX)
#define FLAT_PAD (PH * W + PW)
__kernel void dw_forward_flat(int units, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                              __global const float* x, __global const float* w,
                              __global const float* bias, __global float* y,
                              float act_a, float act_b) {
    __local float buf[FLAT_BUF];
    const int hw = H * W, nv = (hw + 7) / 8;
    /* column of each lane of each 8-output step (the same for every plane) */
    int8 col[FLAT_MAX / 8];
    for (int v = 0; v < nv; ++v) {
        const int p0 = min(8 * v, hw - 8);
        col[v] = (int8)(p0 % W, (p0 + 1) % W, (p0 + 2) % W, (p0 + 3) % W,
                        (p0 + 4) % W, (p0 + 5) % W, (p0 + 6) % W, (p0 + 7) % W);
    }
    for (int j = 0; j < FLAT_PAD; ++j) {
        buf[j] = 0.0f;
        buf[FLAT_PAD + hw + j] = 0.0f;
    }
    GLOBAL_LOOP(u, units) {
        const int c = u % C;
        __global const float* xp = x + (size_t)u * hw;
        __global float* yp = y + (size_t)u * hw;
        int j = 0;
        for (; j + 8 <= hw; j += 8) vstore8(vload8(0, xp + j), 0, buf + FLAT_PAD + j);
        for (; j < hw; ++j) buf[FLAT_PAD + j] = xp[j];
        DW_CHANNEL_TAPS(c);
        for (int v = 0; v < nv; ++v) {
            const int p0 = min(8 * v, hw - 8);
            __local const float* s = buf + p0;      /* tap (0, 0) of output p0 */
            float8 acc = 0.0f;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                const int8 cw = col[v] + (kw * DW - PW);
                const int8 ok = cw >= 0 && cw < W;
                float8 part = 0.0f;
#pragma unroll
                for (int kh = 0; kh < KH; ++kh)
                    part = fma(vload8(0, s + kh * DH * W + kw * DW), (float8)wv[kh * KW + kw],
                               part);
                acc += select((float8)0.0f, part, ok);
            }
            vstore8(APPLY_ACT8_CH(acc + b, slope_), 0, yp + p0);
        }
    }
}

/* The CPU backward-data kernels' (image, channel) plane u: its dy plane
 * dyp, dx plane dxp and the channel's taps wp. */
#define DW_BWD_PLANE(u)                                                        \
    __global const float* dyp = dy + (size_t)(u) * HO * WO;                    \
    __global float* dxp = dx + (size_t)(u) * H * W;                            \
    __global const float* wp = w + ((u) % C) * TAPS;

/* dx = depthwise^T(dy) on CPU drivers: each work-item owns whole dx planes
 * (no races), clears them unless accumulating, then scatters every dy row
 * through the taps into the dx rows it reaches (contiguous segments). */
__kernel void dw_bwd_data_plane(int units, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                                __global const float* dy, __global const float* w,
                                __global float* dx, int accumulate) {
    GLOBAL_LOOP(u, units) {
        DW_BWD_PLANE(u)
        if (!accumulate)
            for (int i = 0; i < H * W; ++i) dxp[i] = 0.0f;
        for (int oh = 0; oh < HO; ++oh) {
            __global const float* dyr = dyp + oh * WO;
            for (int kh = 0; kh < KH; ++kh) {
                const int ih = oh * SH - PH + kh * DH;
                if (ih < 0 || ih >= H) continue;
                __global float* dxr = dxp + ih * W;
                for (int kw = 0; kw < KW; ++kw) {
                    const float wv = wp[kh * KW + kw];
                    const int off = kw * DW - PW;
                    const int2 r = valid_wo(off, SW, W, WO);
                    for (int ow = r.x; ow < r.y; ++ow)
                        dxr[ow * SW + off] = fma(dyr[ow], wv, dxr[ow * SW + off]);
                }
            }
        }
    }
}

/* one dx value of dw_bwd_data_rows: the phase-r column taps (kw = r + jw *
 * SW, jw < JW) of weight rows kh = rh + jh * SH (jh < JH) against dy row
 * p - jh, column q - jw, those inside dy */
inline float dw_deconv_at(__global const float* dyp, __global const float* wp, int HO, int WO,
                          int p, int rh, int JH, int q, int r, int JW DW_GEO_PARAMS) {
    float acc = 0.0f;
    for (int jh = 0; jh < JH; ++jh) {
        const int oh = p - jh;
        if (oh < 0 || oh >= HO) continue;
        const int kh = rh + jh * SH;
        for (int jw = 0; jw < JW; ++jw) {
            const int ow = q - jw;
            if (ow >= 0 && ow < WO)
                acc = fma(dyp[(size_t)oh * WO + ow], wp[kh * KW + r + jw * SW], acc);
        }
    }
    return acc;
}

/* One dx row of dw_bwd_data_rows for strides of 4 or a multiple of 8
 * whose kernel width is a multiple of the stride (the bilinear x4, x8,
 * x16, x32 upsamplings of FCN-style nets and of onnx2caffe's Resize: kernel
 * 2 * stride): every column then takes JW = KW / SW taps, so the 8 columns
 * from one where iw + PW is a multiple of 8 are 8 consecutive phases of
 * one dy column q (stride 4: 4 phases of q, then 4 of q + 1). Each tap is
 * one broadcast dy value times 8 consecutive weights (a float8 load of the
 * weight row), and the 8 outputs one float8 store. The phase-by-phase loop
 * below stored them one by one, SW floats apart: DeepLab's x8 output
 * upsampling (21 channels to 224 x 224) took 1.0 ms, a quarter of a
 * float an ns. Columns whose taps reach past dy's edge go one by one. */
#ifndef DW_PHASE_RUNS
#define DW_PHASE_RUNS 1
#endif
inline void dw_bwd_row_phases(__global const float* dyp, __global const float* wp,
                              __global float* dxr, int HO, int WO, int W, int p, int rh,
                              int JH, int accumulate DW_GEO_PARAMS) {
    const int JW = KW / SW;
    /* run m: dx columns 8m - PW .. 8m - PW + 7 (t = 8m, q = 8m / SW). Runs
     * m0 <= m < m1 lie inside the row and read dy columns q - JW + 1 ..
     * q (stride 4: .. q + 1) only, so they need no checks; the columns
     * before and after go one by one. Worked out once a row: dividing and
     * checking run by run took most of a x8 upsampling's time (21
     * channels to 224 x 224: 0.9 ms, 4.7 GB/s of stores) */
    const int m0 = max((PW + 7) / 8, ((JW - 1) * SW + 7) / 8);
    const int m1 = min((W + PW) / 8, SW == 4 ? WO / 2 : WO * (SW / 8));
    const int v0 = m1 > m0 ? 8 * m0 - PW : W, v1 = m1 > m0 ? 8 * m1 - PW : W;
    /* the taps' dy rows p - jh inside dy */
    const int jlo = max(0, p - HO + 1), jhi = min(JH, p + 1);
    for (int iw = 0; iw < W; ++iw) {
        if (iw == v0) {
            __global float* o = dxr + v0;
            if (SW == 4) {
                for (int q = 2 * m0; q < 2 * m1; q += 2, o += 8) {
                    float8 acc = 0.0f;
                    for (int jh = jlo; jh < jhi; ++jh) {
                        __global const float* dyr = dyp + (size_t)(p - jh) * WO + q;
                        __global const float* wk = wp + (rh + jh * SH) * KW;
                        for (int jw = 0; jw < JW; ++jw) {
                            const float a = dyr[-jw], b = dyr[1 - jw];
                            const float4 w4 = vload4(0, wk + jw * SW);
                            acc = fma((float8)(a, a, a, a, b, b, b, b), (float8)(w4, w4), acc);
                        }
                    }
                    vstore8(accumulate ? vload8(0, o) + acc : acc, 0, o);
                }
            } else {
                const int runs = SW / 8;            /* runs per dy column */
                int q = m0 / runs, rb = m0 - q * runs;
                for (int m = m0; m < m1; ++m, o += 8) {
                    float8 acc = 0.0f;
                    for (int jh = jlo; jh < jhi; ++jh) {
                        __global const float* dyr = dyp + (size_t)(p - jh) * WO + q;
                        __global const float* wk = wp + (rh + jh * SH) * KW + 8 * rb;
                        for (int jw = 0; jw < JW; ++jw)
                            acc = fma((float8)dyr[-jw], vload8(0, wk + jw * SW), acc);
                    }
                    vstore8(accumulate ? vload8(0, o) + acc : acc, 0, o);
                    if (++rb == runs) { rb = 0; ++q; }
                }
            }
            iw = v1 - 1;
            continue;
        }
        const int t = iw + PW;
        const float acc = dw_deconv_at(dyp, wp, HO, WO, p, rh, JH, t / SW, t % SW, JW DW_GEO);
        dxr[iw] = accumulate ? dxr[iw] + acc : acc;
    }
}

/* dx = depthwise^T(dy) on CPU drivers, gathered row by row (dilation 1):
 * Caffe's Deconvolution forward with one group a channel (upsampling: the
 * bilinear layers of FCN-style nets, onnx2caffe's Resize) and the
 * depthwise layers' backward-data. dx column iw takes the weight columns
 * kw = r, r + SW, ... (r = (iw + PW) % SW, its phase) from dy columns
 * q, q - 1, ... (q = (iw + PW) / SW); rows likewise (kh = rh + jh * SH from
 * dy row p - jh). So the outputs of one phase at q, q + 1, ..., q + 7 are
 * one float8 over consecutive dy columns, summed in registers and stored
 * once (with stride SW); columns whose taps reach past dy's edge are done
 * one by one. dw_bwd_data_plane scattered every tap into dx in memory
 * with strided scalar stores: a 2x nearest or bilinear upsampling took
 * 4-5x ONNX Runtime's Resize. */
__kernel void dw_bwd_data_rows(int units, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                               __global const float* dy, __global const float* w,
                               __global float* dx, int accumulate) {
    GLOBAL_LOOP(u, units) {
        DW_BWD_PLANE(u)
        for (int ih = 0; ih < H; ++ih) {
            const int th = ih + PH, p = th / SH, rh = th % SH;
            const int JH = rh < KH ? (KH - rh + SH - 1) / SH : 0;
            __global float* dxr = dxp + (size_t)ih * W;
            if (SW == 2) {
                /* 16 columns from an even iw0 at a time: the even ones one
                 * phase (re, from dy column qe + i), the odd ones the other,
                 * two float8 sums interleaved into one 16-float store (8
                 * scalar stores a phase were half the time of a 2x upsampling) */
                const int re = PW % 2, ro = 1 - re;
                const int JWe = re < KW ? (KW - re + 1) / 2 : 0;
                const int JWo = ro < KW ? (KW - ro + 1) / 2 : 0;
                /* the row's last 16 (from an even column) move back over
                 * columns already stored, unless adding into dx */
                const int back = (W - 16) & ~1;            /* even, ends at W or W - 1 */
                int iw = 0;
                while (iw < W) {
                    const int i0 = !accumulate && (iw & 1) == 0 && iw + 16 > W && W >= 16
                                   && back + 16 > iw ? min(iw, back) : iw;
                    const int qe = (i0 + PW) / 2, qo = (i0 + 1 + PW) / 2;
                    const bool vec = (i0 & 1) == 0 && i0 + 16 <= W
                                     && qe - JWe + 1 >= 0 && qe + 8 <= WO
                                     && qo - JWo + 1 >= 0 && qo + 8 <= WO;
                    if (vec) {
                        float8 ae = 0.0f, ao = 0.0f;
                        for (int jh = 0; jh < JH; ++jh) {
                            const int oh = p - jh;
                            if (oh < 0 || oh >= HO) continue;
                            __global const float* dyr = dyp + (size_t)oh * WO;
                            const int kh = rh + jh * SH;
                            for (int jw = 0; jw < JWe; ++jw)
                                ae = fma(vload8(0, dyr + qe - jw),
                                         (float8)wp[kh * KW + re + 2 * jw], ae);
                            for (int jw = 0; jw < JWo; ++jw)
                                ao = fma(vload8(0, dyr + qo - jw),
                                         (float8)wp[kh * KW + ro + 2 * jw], ao);
                        }
                        const float16 v = (float16)(ae.s0, ao.s0, ae.s1, ao.s1, ae.s2, ao.s2,
                                                    ae.s3, ao.s3, ae.s4, ao.s4, ae.s5, ao.s5,
                                                    ae.s6, ao.s6, ae.s7, ao.s7);
                        vstore16(accumulate ? vload16(0, dxr + i0) + v : v, 0, dxr + i0);
                        iw = i0 + 16;
                        continue;
                    }
                    const int rr = (iw + PW) % 2;
                    const float acc = dw_deconv_at(dyp, wp, HO, WO, p, rh, JH, (iw + PW) / 2, rr,
                                                   rr == re ? JWe : JWo DW_GEO);
                    dxr[iw] = accumulate ? dxr[iw] + acc : acc;
                    ++iw;
                }
                continue;
            }
            if (DW_PHASE_RUNS && (SW == 4 || SW % 8 == 0) && KW % SW == 0) {
                dw_bwd_row_phases(dyp, wp, dxr, HO, WO, W, p, rh, JH, accumulate DW_GEO);
                continue;
            }
            for (int r = 0; r < SW; ++r) {
                /* this phase's columns iw = q * SW + r - PW in [0, W) */
                const int qlo = PW - r > 0 ? (PW - r + SW - 1) / SW : 0;
                const int qhi = W - 1 + PW - r >= 0 ? (W - 1 + PW - r) / SW + 1 : 0;
                const int JW = r < KW ? (KW - r + SW - 1) / SW : 0;
                /* columns whose JW taps all read inside dy: float8 runs */
                const int vlo = max(qlo, JW - 1), vhi = min(qhi, WO);
                int q = qlo;
                while (q < qhi) {
                    /* the last run moves back over outputs already stored
                     * (the same values again), but not when adding into dx */
                    const bool vec = q >= vlo && q < vhi
                                     && (accumulate ? q + 8 <= vhi : vhi - vlo >= 8);
                    if (vec) {
                        const int q0 = min(q, vhi - 8);
                        float8 acc = 0.0f;
                        for (int jh = 0; jh < JH; ++jh) {
                            const int oh = p - jh;
                            if (oh < 0 || oh >= HO) continue;
                            __global const float* dyr = dyp + (size_t)oh * WO + q0;
                            const int kh = rh + jh * SH;
                            for (int jw = 0; jw < JW; ++jw)
                                acc = fma(vload8(0, dyr - jw), (float8)wp[kh * KW + r + jw * SW],
                                          acc);
                        }
                        if (SW == 1) {
                            __global float* o = dxr + q0 + r - PW;
                            vstore8(accumulate ? vload8(0, o) + acc : acc, 0, o);
                        } else {
                            float a8[8];
                            vstore8(acc, 0, a8);
                            for (int i = 0; i < 8; ++i) {
                                __global float* o = dxr + (q0 + i) * SW + r - PW;
                                *o = accumulate ? *o + a8[i] : a8[i];
                            }
                        }
                        q = q0 + 8;
                        continue;
                    }
                    const float acc = dw_deconv_at(dyp, wp, HO, WO, p, rh, JH, q, r, JW DW_GEO);
                    __global float* o = dxr + q * SW + r - PW;
                    *o = accumulate ? *o + acc : acc;
                    ++q;
                }
            }
        }
    }
}

/* Kernel == stride, no padding, undilated (onnx2caffe's nearest Resize as
 * a Deconvolution, a learned k x k stride-k depthwise Deconvolution, and
 * the backward-data of k x k stride-k depthwise layers): every dx pixel
 * takes exactly one tap, dx[ih][iw] = dy[ih / SH][iw / SW] *
 * w[ih % SH][iw % SW]. Where the forward input's size is not a multiple of
 * the stride, dx rows from HO * SH and columns from WO * SW take no tap
 * (written 0, or left as they are when accumulating). */

/* dy[q0 .. q0 + 7] of one dy row times the weight row wr of the dx row's
 * phase, stored interleaved into dx row dxr from column q0 * SW (added to it
 * when accumulating). */
inline void dw_tile8(__global const float* dyr, __global const float* wr, __global float* dxr,
                     int q0, int accumulate DW_GEO_PARAMS) {
    const float8 v = vload8(0, dyr + q0);
    __global float* o = dxr + q0 * SW;
    if (SW == 1) {
        const float8 a = v * wr[0];
        vstore8(accumulate ? vload8(0, o) + a : a, 0, o);
    } else if (SW == 2) {
        /* the even columns one phase, the odd ones the other: two products,
         * interleaved into one 16-float store */
        const float8 a = v * wr[0], b = v * wr[1];
        const float16 s = (float16)(a.s0, b.s0, a.s1, b.s1, a.s2, b.s2, a.s3, b.s3,
                                    a.s4, b.s4, a.s5, b.s5, a.s6, b.s6, a.s7, b.s7);
        vstore16(accumulate ? vload16(0, o) + s : s, 0, o);
    } else {
        float v8[8];
        vstore8(v, 0, v8);
        for (int i = 0; i < 8; ++i)
            for (int r = 0; r < SW; ++r) {
                const float a = v8[i] * wr[r];
                o[i * SW + r] = accumulate ? o[i * SW + r] + a : a;
            }
    }
}

/* CPU drivers (work-groups of one item, a run of (image, channel) planes
 * each): every dx row is written once, from the dy row it reads, 8 dy
 * columns (8 * SW dx columns) at a time; when overwriting, a row's last 8
 * move back over columns already stored (the same values again), when
 * accumulating the remainder goes one by one. dw_bwd_data_rows, which
 * sums each phase's taps generally, took 2.3-3.5x ONNX Runtime's Resize
 * for a 2x nearest upsampling (BENCHMARKS.md, forty-second session). */
__kernel void dw_bwd_data_tile_rows(int units, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                                    __global const float* dy, __global const float* w,
                                    __global float* dx, int accumulate) {
    /* dy rows and columns whose taps lie inside dx (HO and WO for a conv
     * geometry; min() keeps stores inside dx whatever the host passes) */
    const int P = min(HO, H / SH), Q = min(WO, W / SW);
    GLOBAL_LOOP(u, units) {
        DW_BWD_PLANE(u)
        for (int ih = 0; ih < H; ++ih) {
            __global float* dxr = dxp + (size_t)ih * W;
            const int p = ih / SH;
            int iw = 0;
            if (p < P) {
                __global const float* dyr = dyp + (size_t)p * WO;
                __global const float* wr = wp + (ih - p * SH) * KW;
                int q = 0;
                while (q < Q) {
                    if (q + 8 <= Q || (!accumulate && Q >= 8)) {
                        const int q0 = min(q, Q - 8);
                        dw_tile8(dyr, wr, dxr, q0, accumulate DW_GEO);
                        q = q0 + 8;
                        continue;
                    }
                    const float d = dyr[q];
                    for (int r = 0; r < SW; ++r) {
                        const float a = d * wr[r];
                        dxr[q * SW + r] = accumulate ? dxr[q * SW + r] + a : a;
                    }
                    ++q;
                }
                iw = Q * SW;
            }
            if (!accumulate)
                for (; iw < W; ++iw) dxr[iw] = 0.0f;
        }
    }
}

/* The same on GPUs: one dx element per index (consecutive work-items write
 * consecutive dx columns). */
__kernel void dw_bwd_data_tile(int total, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                               __global const float* dy, __global const float* w,
                               __global float* dx, int accumulate) {
    GLOBAL_LOOP(i, total) {
        const int iw = i % W;
        const int t = i / W;
        const int ih = t % H;
        const int nc = t / H;
        const int p = ih / SH, q = iw / SW;
        float a = 0.0f;
        if (p < HO && q < WO && p < H / SH && q < W / SW)
            a = dy[((size_t)nc * HO + p) * WO + q]
                * w[(nc % C) * TAPS + (ih - p * SH) * KW + iw - q * SW];
        dx[i] = accumulate ? dx[i] + a : a;
    }
}

#if DW_RUNTIME
/* Tap (kh, kw) of one channel's weight gradient, summed over the output
 * positions p = start, start + step, ... < P. */
inline float dw_tap(int c, int C, int H, int W, int HO, int WO, int P, int start, int step,
                    int kh, int kw, __global const float* x, __global const float* dy
                    DW_GEO_PARAMS) {
    float acc = 0.0f;
    for (int p = start; p < P; p += step) {
        int ow = p % WO;
        int t = p / WO;
        int oh = t % HO;
        int n = t / HO;
        int ih = oh * SH - PH + kh * DH, iw = ow * SW - PW + kw * DW;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
            size_t nc = (size_t)n * C + c;
            acc = fma(dy[(nc * HO + oh) * WO + ow], x[(nc * H + ih) * W + iw], acc);
        }
    }
    return acc;
}
#else
/* The KH*KW taps of one channel's weight gradient, summed over the output
 * positions p = start, start + step, ... < N*HO*WO, into acc[]. */
inline void dw_taps(int c, int C, int H, int W, int HO, int WO, int P, int start, int step,
                    __global const float* x, __global const float* dy, float* acc) {
    for (int p = start; p < P; p += step) {
        int ow = p % WO;
        int t = p / WO;
        int oh = t % HO;
        int n = t / HO;
        size_t nc = (size_t)n * C + c;
        float d = dy[(nc * HO + oh) * WO + ow];
        __global const float* xp = x + nc * H * W;
        int ih0 = oh * SH - PH, iw0 = ow * SW - PW;
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
            int ih = ih0 + kh * DH;
            bool okh = ih >= 0 && ih < H;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                int iw = iw0 + kw * DW;
                if (okh && iw >= 0 && iw < W)
                    acc[kh * KW + kw] = fma(d, xp[ih * W + iw], acc[kh * KW + kw]);
            }
        }
    }
}
#endif

/* dw[c] += sum over n, oh, ow (CPU drivers): work-groups of one item, each
 * taking a contiguous chunk of channels; per image, output row and tap, one
 * dot product of a dy row segment with the x row segment it saw (valid_wo),
 * with no per-element index arithmetic (the per-position walk of dw_taps
 * was 5-10x slower on PoCL). */
__kernel void dw_bwd_weight_serial(int N, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw,
                                   __global const float* x, __global const float* dy,
                                   __global float* dw) {
    GLOBAL_LOOP(c, C) {
#if DW_RUNTIME   /* no private array of a runtime size: sum into dw itself */
#define DW_SERIAL_ACC(k) dw[c * TAPS + (k)]
#else
        float acc[TAPS];
        for (int k = 0; k < TAPS; ++k) acc[k] = 0.0f;
#define DW_SERIAL_ACC(k) acc[k]
#endif
        for (int n = 0; n < N; ++n) {
            __global const float* xp = x + ((size_t)n * C + c) * H * W;
            __global const float* dyp = dy + ((size_t)n * C + c) * HO * WO;
            for (int oh = 0; oh < HO; ++oh) {
                __global const float* dyr = dyp + oh * WO;
                for (int kh = 0; kh < KH; ++kh) {
                    const int ih = oh * SH - PH + kh * DH;
                    if (ih < 0 || ih >= H) continue;
                    __global const float* xr = xp + ih * W;
                    for (int kw = 0; kw < KW; ++kw) {
                        const int off = kw * DW - PW;
                        const int2 r = valid_wo(off, SW, W, WO);
                        /* independent partial sums: a single fma chain
                         * would run at its latency, not vectorized */
                        float8 s8 = 0.0f;
                        int ow = r.x;
                        if (SW == 1) {
                            for (; ow + 8 <= r.y; ow += 8)
                                s8 = fma(vload8(0, dyr + ow), vload8(0, xr + ow + off), s8);
                        }
                        for (; ow + 8 <= r.y; ow += 8) {
                            float8 d = vload8(0, dyr + ow);
                            float8 v = (float8)(xr[ow * SW + off], xr[(ow + 1) * SW + off],
                                                xr[(ow + 2) * SW + off], xr[(ow + 3) * SW + off],
                                                xr[(ow + 4) * SW + off], xr[(ow + 5) * SW + off],
                                                xr[(ow + 6) * SW + off], xr[(ow + 7) * SW + off]);
                            s8 = fma(d, v, s8);
                        }
                        float4 s4 = s8.lo + s8.hi;
                        float s = (s4.x + s4.y) + (s4.z + s4.w);
                        for (; ow < r.y; ++ow) s = fma(dyr[ow], xr[ow * SW + off], s);
                        DW_SERIAL_ACC(kh * KW + kw) += s;
                    }
                }
            }
        }
#if !DW_RUNTIME
        for (int k = 0; k < TAPS; ++k) dw[c * TAPS + k] += acc[k];
#endif
#undef DW_SERIAL_ACC
    }
}

/* Partial weight gradients (GPUs): channel c's N*HO*WO output positions are
 * cut into `chunks` ranges (one work-group per channel left the GPU idle:
 * MobileNet's 32-channel layers ran 15x slower backward than forward);
 * work-group t = c*chunks + g sums range g with a strided share per item,
 * reduces each tap in local memory and writes part[t*TAPS + tap]. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void dw_bwd_weight(int N, int C, int H, int W, int HO, int WO,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw, int chunks,
                   __global const float* x, __global const float* dy,
                   __global float* part) {
    __local float red[WG];
    const int lid = get_local_id(0);
    const int P = N * HO * WO, len = (P + chunks - 1) / chunks;
    for (int t = get_group_id(0); t < C * chunks; t += get_num_groups(0)) {
        const int c = t / chunks, g = t - c * chunks;
        const int p1 = min(P, (g + 1) * len);
#if DW_RUNTIME   /* tap by tap: no private array of a runtime size */
        for (int k = 0; k < TAPS; ++k) {
            red[lid] = dw_tap(c, C, H, W, HO, WO, p1, g * len + lid, WG, k / KW, k % KW, x,
                              dy DW_GEO);
#else
        float acc[TAPS];
        for (int k = 0; k < TAPS; ++k) acc[k] = 0.0f;
        dw_taps(c, C, H, W, HO, WO, p1, g * len + lid, WG, x, dy, acc);
        for (int k = 0; k < TAPS; ++k) {
            red[lid] = acc[k];
#endif
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int s = WG / 2; s > 0; s >>= 1) {
                if (lid < s) red[lid] += red[lid + s];
                barrier(CLK_LOCAL_MEM_FENCE);
            }
            if (lid == 0) part[t * TAPS + k] = red[0];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
}

/* dw[c*TAPS + k] += sum over the chunks of part[(c*chunks + g)*TAPS + k]. */
__kernel void dw_bwd_weight_sum(int C,
        int g_kh, int g_kw, int g_sh, int g_sw, int g_ph, int g_pw, int g_dh, int g_dw, int chunks, __global const float* part,
                                __global float* dw) {
    GLOBAL_LOOP(i, C * TAPS) {
        const int c = i / TAPS, k = i - c * TAPS;
        float s = 0.0f;
        for (int g = 0; g < chunks; ++g) s += part[(c * chunks + g) * TAPS + k];
        dw[i] += s;
    }
}
