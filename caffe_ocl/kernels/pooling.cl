/* 2-D pooling as Caffe's PoolingLayer: MAX (records argmax in `mask`),
 * AVE (divisor counts padding up to H+PH / W+PW, as Caffe), and
 * STOCHASTIC at test time (weighted average by value). */
#include "common.h"

/* MAX backward with GATE == 1: the gradient of an in-place ReLU (slope:
 * its negative_slope) directly before the pooling, fused (fusion_train.py
 * ReLUMaxPoolBackward). Only a window's chosen element receives gradient,
 * and its ReLU output is the window's pooled value top[o], so the ReLU's
 * gate is that of top[o]: the ReLU's own pass over the (larger) bottom is
 * not needed. */
#ifndef GATE
#define GATE 0
#endif
#if GATE
#define GATED(g, o) ((g) * (top[o] > 0.0f ? 1.0f : slope))
#else
#define GATED(g, o) (g)
#endif

__kernel void max_pool_fwd(int total, int C, int H, int W, int HO, int WO,
                           int KH, int KW, int SH, int SW, int PH, int PW,
                           __global const float* x, __global float* y,
                           __global float* mask, int use_mask) {
    GLOBAL_LOOP(idx, total) {
        int wo = idx % WO, ho = (idx / WO) % HO, nc = idx / (WO * HO);
        int hs = ho * SH - PH, ws = wo * SW - PW;
        int he = min(hs + KH, H), we = min(ws + KW, W);
        hs = max(hs, 0); ws = max(ws, 0);
        __global const float* p = x + nc * H * W;
        float best = -FLT_MAX;
        int arg = -1;
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w)
                if (p[h * W + w] > best) { best = p[h * W + w]; arg = h * W + w; }
        y[idx] = best;
        if (use_mask) mask[idx] = (float)arg;
    }
}

__kernel void ave_pool_fwd(int total, int C, int H, int W, int HO, int WO,
                           int KH, int KW, int SH, int SW, int PH, int PW,
                           __global const float* x, __global float* y) {
    GLOBAL_LOOP(idx, total) {
        int wo = idx % WO, ho = (idx / WO) % HO, nc = idx / (WO * HO);
        int hs = ho * SH - PH, ws = wo * SW - PW;
        int he = min(hs + KH, H + PH), we = min(ws + KW, W + PW);
        int size = (he - hs) * (we - ws);
        hs = max(hs, 0); ws = max(ws, 0);
        he = min(he, H); we = min(we, W);
        __global const float* p = x + nc * H * W;
        float s = 0.0f;
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w) s += p[h * W + w];
        y[idx] = s / size;
    }
}

/* Global average pooling on GPUs (the window is the whole plane, no
 * padding: SE blocks' squeeze, the classifiers' final pool): one work-group
 * per plane, its work-items summing strided (coalesced) runs, then a tree
 * in local memory. ave_pool_fwd's one work-item per output gave such a
 * layer as many work-items as planes, each summing its plane alone:
 * EfficientNet-B0's first squeeze (96 planes of 112 x 112) was one
 * work-group and took 0.5 ms on the H200. */
#ifndef GP_LOCAL
#define GP_LOCAL 256
#endif
__kernel __attribute__((reqd_work_group_size(GP_LOCAL, 1, 1)))
void ave_pool_global_fwd(int m, __global const float* x, __global float* y) {
    __local float part[GP_LOCAL];
    const int t = get_local_id(0);
    const size_t pl = get_group_id(0);
    __global const float* p = x + pl * (size_t)m;
    float s = 0.0f;
    for (int j = t; j < m; j += GP_LOCAL) s += p[j];
    part[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = GP_LOCAL / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) y[pl] = part[0] / m;
}

__kernel void sto_pool_test_fwd(int total, int C, int H, int W, int HO, int WO,
                                int KH, int KW, int SH, int SW, int PH, int PW,
                                __global const float* x, __global float* y) {
    GLOBAL_LOOP(idx, total) {
        int wo = idx % WO, ho = (idx / WO) % HO, nc = idx / (WO * HO);
        int hs = ho * SH, ws = wo * SW;
        int he = min(hs + KH, H), we = min(ws + KW, W);
        __global const float* p = x + nc * H * W;
        float s = FLT_MIN, s2 = 0.0f;
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w) { float v = p[h * W + w]; s += v; s2 += v * v; }
        y[idx] = s2 / s;
    }
}

/* Backward, gather form: each bottom element sums the top gradients of the
 * windows that chose it (MAX) or cover it (AVE). */
__kernel void max_pool_bwd(int total, int C, int H, int W, int HO, int WO,
                           int KH, int KW, int SH, int SW, int PH, int PW,
                           __global const float* dy, __global const float* mask,
                           __global float* dx, __global const float* top, float slope) {
    GLOBAL_LOOP(idx, total) {
        int w = idx % W, h = (idx / W) % H, nc = idx / (W * H);
        int phs = (h + PH < KH) ? 0 : (h + PH - KH) / SH + 1;
        int phe = min((h + PH) / SH + 1, HO);
        int pws = (w + PW < KW) ? 0 : (w + PW - KW) / SW + 1;
        int pwe = min((w + PW) / SW + 1, WO);
        float g = 0.0f;
        int me = h * W + w;
        const int plane = nc * HO * WO;
        __global const float* pd = dy + plane;
        __global const float* pm = mask + plane;
        for (int ph = phs; ph < phe; ++ph)
            for (int pw = pws; pw < pwe; ++pw)
                if ((int)pm[ph * WO + pw] == me) g += GATED(pd[ph * WO + pw], plane + ph * WO + pw);
        dx[idx] = g;
    }
}

/* GPUs: max_pool_bwd over a 3-D range (w, h, n*c) with the window as
 * macros (FKH FKW FSH FSW FPH FPW). The 1-D form above divides its index by
 * W and H and the window bounds by the strides at run time, for every input
 * element: on the H200 VGG-16's first pooling backward (64x64x224x224) took
 * 2.4 ms, 8x its memory traffic. */
#ifdef FSH
__kernel void max_pool_bwd_grid(int H, int W, int HO, int WO,
                                __global const float* dy, __global const float* mask,
                                __global float* dx, __global const float* top, float slope) {
    const int w = get_global_id(0), h = get_global_id(1), nc = get_global_id(2);
    if (w >= W || h >= H) return;
    const int phs = (h + FPH < FKH) ? 0 : (h + FPH - FKH) / FSH + 1;
    const int phe = min((h + FPH) / FSH + 1, HO);
    const int pws = (w + FPW < FKW) ? 0 : (w + FPW - FKW) / FSW + 1;
    const int pwe = min((w + FPW) / FSW + 1, WO);
    const int me = h * W + w, plane = nc * HO * WO;
    __global const float* pd = dy + plane;
    __global const float* pm = mask + plane;
    float g = 0.0f;
    for (int ph = phs; ph < phe; ++ph)
        for (int pw = pws; pw < pwe; ++pw)
            if ((int)pm[ph * WO + pw] == me) g += GATED(pd[ph * WO + pw], plane + ph * WO + pw);
    dx[nc * H * W + me] = g;
}

/* GPUs, strides of 2 or more (ResNet's 3 x 3 / 2 stem pooling): one
 * work-item per 2 x 2 block of inputs. The windows that may have chosen any
 * of the four are read once for the block (max_pool_bwd_grid reads each
 * window for every input it covers: 2.25 times per window for 3 x 3 / 2),
 * and each window's choice lands in at most one of them. */
__kernel void max_pool_bwd_blocks(int H, int W, int HO, int WO,
                                  __global const float* dy, __global const float* mask,
                                  __global float* dx, __global const float* top, float slope) {
    const int w0 = 2 * (int)get_global_id(0), h0 = 2 * (int)get_global_id(1);
    const int nc = get_global_id(2);
    if (w0 >= W || h0 >= H) return;
    const int phs = (h0 + FPH < FKH) ? 0 : (h0 + FPH - FKH) / FSH + 1;
    const int phe = min((h0 + 1 + FPH) / FSH + 1, HO);
    const int pws = (w0 + FPW < FKW) ? 0 : (w0 + FPW - FKW) / FSW + 1;
    const int pwe = min((w0 + 1 + FPW) / FSW + 1, WO);
    const int plane = nc * HO * WO, me = h0 * W + w0;
    const int right = w0 + 1 < W, below = h0 + 1 < H;   /* the block's other inputs exist */
    float g00 = 0.0f, g01 = 0.0f, g10 = 0.0f, g11 = 0.0f;
    for (int ph = phs; ph < phe; ++ph)
        for (int pw = pws; pw < pwe; ++pw) {
            const int o = plane + ph * WO + pw;
            const int r = (int)mask[o] - me;       /* 0, 1, W, W + 1 inside the block */
            if (r == 0) g00 += GATED(dy[o], o);
            else if (r == 1 && right) g01 += GATED(dy[o], o);
            else if (r == W && below) g10 += GATED(dy[o], o);
            else if (r == W + 1 && right && below) g11 += GATED(dy[o], o);
        }
    __global float* px = dx + nc * H * W + me;
    px[0] = g00;
    if (right) px[1] = g01;
    if (below) {
        px[W] = g10;
        if (right) px[W + 1] = g11;
    }
}

/* GPUs, windows that tile the input (kernel == stride, no padding, every
 * input in a window): scatter form, one work-item per window over a 3-D
 * range (wo, ho, n*c) writing its FKH x FKW inputs, the chosen one dy and
 * the others 0 (a warp writes whole runs of rows; the gather form reads
 * dy and mask once per input instead of once per window). */
__kernel void max_pool_bwd_tiles(int H, int W, int HO, int WO,
                                 __global const float* dy, __global const float* mask,
                                 __global float* dx, __global const float* top, float slope) {
    const int wo = get_global_id(0), ho = get_global_id(1), nc = get_global_id(2);
    if (wo >= WO || ho >= HO) return;
    const int o = (nc * HO + ho) * WO + wo;
    const int chosen = (int)mask[o];
    const float g = GATED(dy[o], o);
    __global float* px = dx + nc * H * W;
    #pragma unroll
    for (int i = 0; i < FKH; ++i) {
        const int h = ho * FSH + i;
        if (h < H) {
            #pragma unroll
            for (int j = 0; j < FKW; ++j) {
                const int w = wo * FSW + j;
                if (w < W) px[h * W + w] = (h * W + w == chosen) ? g : 0.0f;
            }
        }
    }
}
#endif

__kernel void ave_pool_bwd(int total, int C, int H, int W, int HO, int WO,
                           int KH, int KW, int SH, int SW, int PH, int PW,
                           __global const float* dy, __global float* dx) {
    GLOBAL_LOOP(idx, total) {
        int w = idx % W + PW, h = (idx / W) % H + PH, nc = idx / (W * H);
        int phs = (h < KH) ? 0 : (h - KH) / SH + 1;
        int phe = min(h / SH + 1, HO);
        int pws = (w < KW) ? 0 : (w - KW) / SW + 1;
        int pwe = min(w / SW + 1, WO);
        float g = 0.0f;
        __global const float* pd = dy + nc * HO * WO;
        for (int ph = phs; ph < phe; ++ph)
            for (int pw = pws; pw < pwe; ++pw) {
                int hs = ph * SH - PH, ws = pw * SW - PW;
                int he = min(hs + KH, H + PH), we = min(ws + KW, W + PW);
                g += pd[ph * WO + pw] / ((he - hs) * (we - ws));
            }
        dx[idx] = g;
    }
}

/* ---- CPU drivers (ops/pool.py picks these when dev.is_cpu) ----------------
 * One work-item (work-group of one) owns a contiguous range of whole
 * (n, c) planes: plain nested loops over rows and columns (no div/mod per
 * element, sequential memory), and backward scatters each top gradient
 * into its plane, which no other work-item touches (no races), after
 * zeroing the plane. PoCL runs the items of a group one after another, so
 * the per-element GPU mapping above walks memory with large strides there. */

#define PLANE_RANGE(p0, p1, planes) \
    const int _pc = ((planes) + (int)get_global_size(0) - 1) / (int)get_global_size(0); \
    const int p0 = (int)get_global_id(0) * _pc; \
    const int p1 = min((planes), p0 + _pc)

#if defined(FKH) && defined(FSW) && (FSW == 1 || FSW == 2)
#define POOL_RUN 1      /* CPU plane kernels: FRUN outputs at a time */
/* FRUN (host: ops/pool.py): 8, or 4 where a row has fewer than 8 outputs
 * with whole windows (LeNet's 8 x 8 -> 4 x 4 pooling ran every output
 * through the scalar window loop, 4x ONNX Runtime's time for that layer). */
#ifndef FRUN
#define FRUN 8
#endif
#if FRUN == 4
typedef float4 float_run;
typedef int4 int_run;
#define RUN_LOAD(s, sw) run4((s), (sw))
#define RUN_STORE vstore4
#define RUN_TO_FLOAT convert_float4
#define RUN_LANES ((int4)(0, 1, 2, 3))
#else
typedef float8 float_run;
typedef int8 int_run;
#define RUN_LOAD(s, sw) run8((s), (sw))
#define RUN_STORE vstore8
#define RUN_TO_FLOAT convert_float8
#define RUN_LANES ((int8)(0, 1, 2, 3, 4, 5, 6, 7))
#endif
/* Outputs wo..wo+FRUN-1 of row ho whose windows lie wholly inside the image
 * (q: the first window's top-left input), as the scalar loop below: the
 * first maximum in raster order and its plane index. Scalar windows ran
 * at ~40 instructions per output (CIFAR-10 quick's 3x3/2 pooling 4.6 ms of
 * a ~100 ms training step, LeNet's 2x2/2 18% of its inference). */
inline void max_pool_run(__global const float* q, int W, int base,
                         __global float* py, __global float* pm, int use_mask) {
    float_run best = (float_run)(-FLT_MAX);
    int_run arg = (int_run)(-1);
    #pragma unroll
    for (int i = 0; i < FKH; ++i)
        #pragma unroll
        for (int j = 0; j < FKW; ++j) {
            const float_run v = RUN_LOAD(q + i * W + j, FSW);   /* common.h */
            const int_run gt = v > best;
            arg = select(arg, (int_run)(i * W + j), gt);
            best = select(best, v, gt);
        }
    RUN_STORE(best, 0, py);
    if (use_mask)
        RUN_STORE(RUN_TO_FLOAT(arg + base + FSW * RUN_LANES), 0, pm);
}

/* wo of the next run of FRUN whole-width windows from wo (a row's last run
 * ends at whi, redoing a few outputs with the same values rather than
 * leaving up to FRUN-1 scalar), or -1 */
inline int pool_run_start(int wo, int wlo, int whi) {
    return (wo >= wlo && wo <= whi && whi - wlo >= FRUN - 1) ? min(wo, whi - (FRUN - 1)) : -1;
}
#endif

__kernel void max_pool_fwd_cpu(int planes, int C, int H, int W, int HO, int WO,
                               int KH, int KW, int SH, int SW, int PH, int PW,
                               __global const float* x, __global float* y,
                               __global float* mask, int use_mask) {
#ifdef POOL_RUN
    /* outputs whose windows are whole in width: wo in [wlo, whi] */
    const int wlo = (PW + FSW - 1) / FSW, whi = min(WO - 1, (W + PW - FKW) / FSW);
#endif
    PLANE_RANGE(p0, p1, planes);
    for (int pl = p0; pl < p1; ++pl) {
        __global const float* p = x + (size_t)pl * H * W;
        __global float* py = y + (size_t)pl * HO * WO;
        __global float* pm = mask + (size_t)pl * HO * WO;
        for (int ho = 0; ho < HO; ++ho) {
            int hs = ho * SH - PH;
            int he = min(hs + KH, H);
            hs = max(hs, 0);
            const int full_h = (he - hs == KH);
            for (int wo = 0; wo < WO; ++wo) {
#ifdef POOL_RUN
                const int w0 = full_h ? pool_run_start(wo, wlo, whi) : -1;
                if (w0 >= 0) {
                    const int ws0 = w0 * FSW - PW;
                    max_pool_run(p + hs * W + ws0, W, hs * W + ws0, py + ho * WO + w0,
                                 pm + ho * WO + w0, use_mask);
                    wo = w0 + FRUN - 1;
                    continue;
                }
#endif
                int ws = wo * SW - PW;
                int we = min(ws + KW, W);
                ws = max(ws, 0);
                float best = -FLT_MAX;
                int arg = -1;
#ifdef FKH
                if (full_h && we - ws == FKW) {
                    /* whole window inside: fixed-size, fully unrolled */
                    __global const float* q = p + hs * W + ws;
                    #pragma unroll
                    for (int i = 0; i < FKH; ++i)
                        #pragma unroll
                        for (int j = 0; j < FKW; ++j) {
                            float v = q[i * W + j];
                            int gt = v > best;          /* branch-free: random */
                            arg = select(arg, i * W + j, gt);   /* data mispredicts */
                            best = gt ? v : best;
                        }
                    py[ho * WO + wo] = best;
                    if (use_mask) pm[ho * WO + wo] = (float)(arg + hs * W + ws);
                    continue;
                }
#endif
                for (int h = hs; h < he; ++h)
                    for (int w = ws; w < we; ++w) {
                        float v = p[h * W + w];
                        if (v > best) { best = v; arg = h * W + w; }
                    }
                py[ho * WO + wo] = best;
                if (use_mask) pm[ho * WO + wo] = (float)arg;
            }
        }
    }
}

/* Max pooling without an argmax mask on CPU drivers (inference): each band
 * of ``band`` output rows copies the input rows its windows read into
 * __local memory, with -FLT_MAX around the image (left PW columns, the
 * rows and columns past it up to the last window), so that every output's
 * window is whole: rows are computed 8 outputs at a time (a row's last 8
 * overlapping the ones before; rows under 8 wide stored lane by lane), no
 * edge cases. -FLT_MAX never wins a comparison (Caffe's own start value;
 * windows always hold an input), and the comparisons are Caffe's (v >
 * best, in raster order), so the result is Caffe's bit for bit. The
 * max_pool_fwd_cpu path above ran windows at the image's edges one output
 * at a time: GoogLeNet's 3x3/1 pad-1 pooling on 7 x 7 to 28 x 28 planes
 * took 3-5x ONNX Runtime's time. Host (ops/pool.py band_rows): FKH FKW
 * PB_SH FSW and POOL_BAND_FLOATS as -D macros, band from the geometry.
 *
 * Average pooling (ave_pool_fwd_band) the same way with zeros around the
 * image: each window's sum runs over its whole FKH x FKW taps in raster
 * order -- the in-image values in ave_pool_fwd_cpu's order with zeros
 * between them, which leave a float sum as it is -- and is divided by
 * Caffe's pool size (the window clipped to the padded image, not to the
 * image), so the result is ave_pool_fwd_cpu's bit for bit. That kernel
 * ran Inception v3's 3x3/1 pad-1 pooling one output at a time, at 5x
 * ONNX Runtime's time. */
#if defined(FKH) && defined(FSW) && defined(PB_SH) && defined(POOL_BAND_FLOATS)
#define POOL_SLACK (8 * FSW + FKW)
inline float8 pool_row8(__local const float* s) {
    if (FSW == 1) return vload8(0, s);
    if (FSW == 2) return vload16(0, s).even;
    return (float8)(s[0], s[FSW], s[2 * FSW], s[3 * FSW], s[4 * FSW], s[5 * FSW],
                    s[6 * FSW], s[7 * FSW]);
}

/* the body of both band kernels; ``ave`` is a constant of the caller */
inline void pool_fwd_band(const int ave, __local float* buf, int planes, int H, int W,
                          int HO, int WO, int PH, int PW, int band,
                          __global const float* x, __global float* y) {
    const float pad = ave ? 0.0f : -FLT_MAX;
    const int wp = (WO - 1) * FSW + FKW;        /* buffer row: every window's columns */
    const int c0 = min(PW, wp), c1 = min(PW + W, wp);   /* image columns in it */
    PLANE_RANGE(p0, p1, planes);
    for (int pl = p0; pl < p1; ++pl) {
        __global const float* xp = x + (size_t)pl * H * W;
        __global float* yp = y + (size_t)pl * HO * WO;
        for (int oh0 = 0; oh0 < HO; oh0 += band) {
            const int nr = min(band, HO - oh0), rows = (nr - 1) * PB_SH + FKH;
            const int ih0 = oh0 * PB_SH - PH;
            for (int r = 0; r < rows; ++r) {
                __local float* d = buf + r * wp;
                const int ih = ih0 + r;
                if (ih < 0 || ih >= H) {
                    for (int j = 0; j < wp; ++j) d[j] = pad;
                    continue;
                }
                __global const float* s = xp + ih * W - PW;
                int j = 0;
                for (; j < c0; ++j) d[j] = pad;
                for (; j + 8 <= c1; j += 8) vstore8(vload8(0, s + j), 0, d + j);
                for (; j < c1; ++j) d[j] = s[j];
                for (; j < wp; ++j) d[j] = pad;
            }
            for (int j = 0; j < POOL_SLACK; ++j) buf[rows * wp + j] = pad;
            for (int r = 0; r < nr; ++r) {
                __local const float* xr = buf + r * PB_SH * wp;
                __global float* yr = yp + (oh0 + r) * WO;
                /* AVE: the window's rows inside the padded image */
                const int hs = (oh0 + r) * PB_SH - PH;
                const int size_h = min(hs + FKH, H + PH) - hs;
                for (int wo = 0; wo < WO; wo += 8) {
                    const int o = max(0, min(wo, WO - 8));
                    float8 best = (float8)(pad);
                    #pragma unroll
                    for (int i = 0; i < FKH; ++i)
                        #pragma unroll
                        for (int j = 0; j < FKW; ++j) {
                            const float8 v = pool_row8(xr + i * wp + o * FSW + j);
                            best = ave ? best + v : select(best, v, v > best);
                        }
                    if (ave) {
                        const int8 ws = (o + (int8)(0, 1, 2, 3, 4, 5, 6, 7)) * FSW - PW;
                        const int8 size_w = min(ws + FKW, (int8)(W + PW)) - ws;
                        best = best / convert_float8(size_w * size_h);
                    }
                    if (WO >= 8) {
                        vstore8(best, 0, yr + o);
                    } else {
                        float t[8];
                        vstore8(best, 0, t);
                        for (int j = 0; j < WO; ++j) yr[j] = t[j];
                    }
                }
            }
        }
    }
}

__kernel void max_pool_fwd_band(int planes, int H, int W, int HO, int WO, int PH, int PW,
                                int band, __global const float* x, __global float* y) {
    __local float buf[POOL_BAND_FLOATS];
    pool_fwd_band(0, buf, planes, H, W, HO, WO, PH, PW, band, x, y);
}

__kernel void ave_pool_fwd_band(int planes, int H, int W, int HO, int WO, int PH, int PW,
                                int band, __global const float* x, __global float* y) {
    __local float buf[POOL_BAND_FLOATS];
    pool_fwd_band(1, buf, planes, H, W, HO, WO, PH, PW, band, x, y);
}
#endif

__kernel void ave_pool_fwd_cpu(int planes, int C, int H, int W, int HO, int WO,
                               int KH, int KW, int SH, int SW, int PH, int PW,
                               __global const float* x, __global float* y) {
    PLANE_RANGE(p0, p1, planes);
    if (KH == H && KW == W && PH == 0 && PW == 0) {
        /* Global pooling (SE blocks' squeeze, the classifiers' pool): the
         * plane is one contiguous run, summed by 16 partial sums (one
         * scalar sum is a chain of dependent adds, 4 cycles each: PoCL ran
         * EfficientNet-B0's squeezes at ~1 GB/s). */
        const int m = H * W;
        for (int pl = p0; pl < p1; ++pl) {
            __global const float* p = x + (size_t)pl * m;
            float8 a0 = (float8)(0.0f), a1 = (float8)(0.0f);
            int j = 0;
            for (; j + 16 <= m; j += 16) {
                a0 += vload8(0, p + j);
                a1 += vload8(0, p + j + 8);
            }
            a0 += a1;
            float4 a4 = a0.lo + a0.hi;
            float s = (a4.x + a4.y) + (a4.z + a4.w);
            for (; j < m; ++j) s += p[j];
            y[pl] = s / m;
        }
        return;
    }
    for (int pl = p0; pl < p1; ++pl) {
        __global const float* p = x + (size_t)pl * H * W;
        __global float* py = y + (size_t)pl * HO * WO;
        for (int ho = 0; ho < HO; ++ho) {
            int hs = ho * SH - PH;
            int he = min(hs + KH, H + PH);
            int sh = he - hs;
            hs = max(hs, 0); he = min(he, H);
            for (int wo = 0; wo < WO; ++wo) {
                int ws = wo * SW - PW;
                int we = min(ws + KW, W + PW);
                int size = sh * (we - ws);
                ws = max(ws, 0); we = min(we, W);
                float s = 0.0f;
#ifdef FKH
                if (he - hs == FKH && we - ws == FKW) {
                    __global const float* q = p + hs * W + ws;
                    #pragma unroll
                    for (int i = 0; i < FKH; ++i)
                        #pragma unroll
                        for (int j = 0; j < FKW; ++j) s += q[i * W + j];
                    py[ho * WO + wo] = s / size;
                    continue;
                }
#endif
                for (int h = hs; h < he; ++h)
                    for (int w = ws; w < we; ++w) s += p[h * W + w];
                py[ho * WO + wo] = s / size;
            }
        }
    }
}

__kernel void sto_pool_test_fwd_cpu(int planes, int C, int H, int W, int HO, int WO,
                                    int KH, int KW, int SH, int SW, int PH, int PW,
                                    __global const float* x, __global float* y) {
    PLANE_RANGE(p0, p1, planes);
    for (int pl = p0; pl < p1; ++pl) {
        __global const float* p = x + (size_t)pl * H * W;
        __global float* py = y + (size_t)pl * HO * WO;
        for (int ho = 0; ho < HO; ++ho) {
            int hs = ho * SH, he = min(hs + KH, H);
            for (int wo = 0; wo < WO; ++wo) {
                int ws = wo * SW, we = min(ws + KW, W);
                float s = FLT_MIN, s2 = 0.0f;
                for (int h = hs; h < he; ++h)
                    for (int w = ws; w < we; ++w) { float v = p[h * W + w]; s += v; s2 += v * v; }
                py[ho * WO + wo] = s2 / s;
            }
        }
    }
}

__kernel void max_pool_bwd_cpu(int planes, int C, int H, int W, int HO, int WO,
                               int KH, int KW, int SH, int SW, int PH, int PW,
                               __global const float* dy, __global const float* mask,
                               __global float* dx, __global const float* top, float slope) {
    PLANE_RANGE(p0, p1, planes);
    const int hw = H * W, ohw = HO * WO;
    for (int pl = p0; pl < p1; ++pl) {
        __global float* pdx = dx + (size_t)pl * hw;
        __global const float* pd = dy + (size_t)pl * ohw;
        __global const float* pm = mask + (size_t)pl * ohw;
        for (int i = 0; i < hw; ++i) pdx[i] = 0.0f;
        for (int o = 0; o < ohw; ++o) {
            int a = (int)pm[o];
            if (a >= 0 && a < hw) pdx[a] += GATED(pd[o], (size_t)pl * ohw + o);
        }
    }
}

__kernel void ave_pool_bwd_cpu(int planes, int C, int H, int W, int HO, int WO,
                               int KH, int KW, int SH, int SW, int PH, int PW,
                               __global const float* dy, __global float* dx) {
    PLANE_RANGE(p0, p1, planes);
    const int hw = H * W;
    for (int pl = p0; pl < p1; ++pl) {
        __global float* pdx = dx + (size_t)pl * hw;
        __global const float* pd = dy + (size_t)pl * HO * WO;
        for (int i = 0; i < hw; ++i) pdx[i] = 0.0f;
        for (int ho = 0; ho < HO; ++ho) {
            int hs = ho * SH - PH;
            int he = min(hs + KH, H + PH);
            int sh = he - hs;
            hs = max(hs, 0); he = min(he, H);
            for (int wo = 0; wo < WO; ++wo) {
                int ws = wo * SW - PW;
                int we = min(ws + KW, W + PW);
                float g = pd[ho * WO + wo] / (sh * (we - ws));
                ws = max(ws, 0); we = min(we, W);
#ifdef FKH
                if (he - hs == FKH && we - ws == FKW) {
                    __global float* q = pdx + hs * W + ws;
                    #pragma unroll
                    for (int i = 0; i < FKH; ++i)
                        #pragma unroll
                        for (int j = 0; j < FKW; ++j) q[i * W + j] += g;
                    continue;
                }
#endif
                for (int h = hs; h < he; ++h)
                    for (int w = ws; w < we; ++w) pdx[h * W + w] += g;
            }
        }
    }
}
