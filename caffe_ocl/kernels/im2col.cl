/* im2col / col2im for 2-D convolution, over a chunk of images.
 * Image layout: [img][C][H][W] (images `img_stride` floats apart).
 * Column layout per image: [C*KH*KW][HO*WO], images `col_stride` apart. */
#include "common.h"

__kernel void im2col(int nimg, int C, int H, int W, int KH, int KW,
                     int PH, int PW, int SH, int SW, int DH, int DW, int HO, int WO,
                     __global const float* im, int off_im, int img_stride,
                     __global float* col, int col_stride) {
    const int total = nimg * C * HO * WO;
    GLOBAL_LOOP(idx, total) {
        int wo = idx % WO;
        int t = idx / WO;
        int ho = t % HO; t /= HO;
        int c = t % C;
        int n = t / C;
        __global const float* src = im + off_im + n * img_stride + c * H * W;
        __global float* dst = col + n * col_stride + (c * KH * KW) * (HO * WO) + ho * WO + wo;
        int h0 = ho * SH - PH, w0 = wo * SW - PW;
        for (int i = 0; i < KH; ++i) {
            int h = h0 + i * DH;
            for (int j = 0; j < KW; ++j) {
                int w = w0 + j * DW;
                *dst = (h >= 0 && h < H && w >= 0 && w < W) ? src[h * W + w] : 0.0f;
                dst += HO * WO;
            }
        }
    }
}

/* Sum columns back into images (the adjoint of im2col). Each work-item
 * owns one image element, so no atomics are needed. ACCUM adds to `im`. */
__kernel void col2im(int nimg, int C, int H, int W, int KH, int KW,
                     int PH, int PW, int SH, int SW, int DH, int DW, int HO, int WO,
                     __global const float* col, int col_stride,
                     __global float* im, int off_im, int img_stride, int accumulate) {
#ifdef C2I_FIXED
    /* the geometry as compile-time constants (ops/conv.py col2im on GPUs):
     * the index's divisions become multiplications, the window's loops
     * have known bounds; with them as arguments a strided backward-data's
     * col2im ran at ~0.4 TB/s on an H200 (2 ms of Wide-ResNet-50's step) */
    C = C2I_C; H = C2I_H; W = C2I_W; KH = C2I_KH; KW = C2I_KW; PH = C2I_PH; PW = C2I_PW;
    SH = C2I_SH; SW = C2I_SW; DH = C2I_DH; DW = C2I_DW; HO = C2I_HO; WO = C2I_WO;
#endif
    const int total = nimg * C * H * W;
    const int ext_h = (KH - 1) * DH + 1, ext_w = (KW - 1) * DW + 1;
    GLOBAL_LOOP(idx, total) {
        int w = idx % W;
        int t = idx / W;
        int h = t % H; t /= H;
        int c = t % C;
        int n = t / C;
        int hp = h + PH, wp = w + PW;
        int ho0 = hp < ext_h ? 0 : (hp - ext_h) / SH + 1;
        int ho1 = min(hp / SH + 1, HO);
        int wo0 = wp < ext_w ? 0 : (wp - ext_w) / SW + 1;
        int wo1 = min(wp / SW + 1, WO);
        __global const float* src = col + n * col_stride;
        float v = 0.0f;
        for (int ho = ho0; ho < ho1; ++ho) {
            int kh = hp - ho * SH;
            if (kh % DH) continue;
            kh /= DH;
            for (int wo = wo0; wo < wo1; ++wo) {
                int kw = wp - wo * SW;
                if (kw % DW) continue;
                kw /= DW;
                v += src[((c * KH + kh) * KW + kw) * (HO * WO) + ho * WO + wo];
            }
        }
        int o = off_im + n * img_stride + (c * H + h) * W + w;
        im[o] = accumulate ? im[o] + v : v;
    }
}

/* CPU drivers (work-groups of one item, GLOBAL_LOOP giving each a contiguous
 * range): one work-item per (image, channel) unit writes that channel's
 * KH*KW*HO*WO column rows front to back, reading image rows in order. The
 * element-per-item kernels above scatter each item's KH*KW writes HO*WO
 * floats apart, which ran at ~3 GB/s on PoCL (LeNet's conv2: im2col +
 * col2im were 60% of its backward). */
__kernel void im2col_chan(int nimg, int C, int H, int W, int KH, int KW,
                          int PH, int PW, int SH, int SW, int DH, int DW, int HO, int WO,
                          __global const float* im, int off_im, int img_stride,
                          __global float* col, int col_stride) {
    const int units = nimg * C;
    GLOBAL_LOOP(u, units) {
        const int n = u / C, c = u - n * C;
        __global const float* src = im + off_im + n * img_stride + c * H * W;
        __global float* dst = col + n * col_stride + c * KH * KW * HO * WO;
        for (int kh = 0; kh < KH; ++kh) {
            for (int kw = 0; kw < KW; ++kw) {
                /* the valid output columns depend on kw only: computed once
                 * here, not per row (its divisions cost more than copying a
                 * LeNet / CIFAR row of 8-32 values) */
                const int2 r = valid_wo(kw * DW - PW, SW, W, WO);
                for (int ho = 0; ho < HO; ++ho, dst += WO) {
                    const int h = ho * SH - PH + kh * DH;
                    if (h < 0 || h >= H) {
                        for (int wo = 0; wo < WO; ++wo) dst[wo] = 0.0f;
                        continue;
                    }
                    __global const float* row = src + h * W + kw * DW - PW;
                    for (int wo = 0; wo < r.x; ++wo) dst[wo] = 0.0f;
                    if (SW == 1)            /* contiguous: a plain copy */
                        for (int wo = r.x; wo < r.y; ++wo) dst[wo] = row[wo];
                    else
                        for (int wo = r.x; wo < r.y; ++wo) dst[wo] = row[wo * SW];
                    for (int wo = r.y; wo < WO; ++wo) dst[wo] = 0.0f;
                }
            }
        }
    }
}

/* The adjoint on CPU drivers: one work-item per (image, channel) owns that
 * image channel (no races), clears it unless accumulating, then adds the
 * channel's column rows in the order im2col_chan wrote them. */
__kernel void col2im_chan(int nimg, int C, int H, int W, int KH, int KW,
                          int PH, int PW, int SH, int SW, int DH, int DW, int HO, int WO,
                          __global const float* col, int col_stride,
                          __global float* im, int off_im, int img_stride, int accumulate) {
    const int units = nimg * C;
    GLOBAL_LOOP(u, units) {
        const int n = u / C, c = u - n * C;
        __global float* dst = im + off_im + n * img_stride + c * H * W;
        __global const float* src = col + n * col_stride + c * KH * KW * HO * WO;
        if (!accumulate)
            for (int k = 0; k < H * W; ++k) dst[k] = 0.0f;
        for (int kh = 0; kh < KH; ++kh) {
            for (int kw = 0; kw < KW; ++kw) {
                const int2 r = valid_wo(kw * DW - PW, SW, W, WO);   /* per kw, as above */
                for (int ho = 0; ho < HO; ++ho, src += WO) {
                    const int h = ho * SH - PH + kh * DH;
                    if (h < 0 || h >= H) continue;
                    __global float* row = dst + h * W + kw * DW - PW;
                    if (SW == 1)
                        for (int wo = r.x; wo < r.y; ++wo) row[wo] += src[wo];
                    else
                        for (int wo = r.x; wo < r.y; ++wo) row[wo * SW] += src[wo];
                }
            }
        }
    }
}

/* CPU drivers: planes [unit = (image, channel)][H][W] copied into planes
 * with a zero border ([unit][H + 2PH][W + 2PW]), the operand from which
 * gemm_cpu.cl (CONV_B) packs convolution columns with no bounds tests: a
 * copy 1-2x the image instead of im2col's KH*KW-fold columns. One
 * work-item per range of planes, written front to back. */
__kernel void pad_planes(int units, int H, int W, int PH, int PW,
                         __global const float* im, int off_im, __global float* out) {
    const int Wp = W + 2 * PW;
    GLOBAL_LOOP(u, units) {
        __global const float* src = im + off_im + u * H * W;
        __global float* dst = out + u * (H + 2 * PH) * Wp;
        for (int i = 0; i < PH * Wp; ++i) *dst++ = 0.0f;
        for (int h = 0; h < H; ++h, src += W) {
            for (int i = 0; i < PW; ++i) *dst++ = 0.0f;
            for (int w = 0; w < W; ++w) *dst++ = src[w];
            for (int i = 0; i < PW; ++i) *dst++ = 0.0f;
        }
        for (int i = 0; i < PH * Wp; ++i) *dst++ = 0.0f;
    }
}

/* CPU drivers: the weight of a stride-1 convolution's backward-data taken
 * as a forward convolution of dy: wt[g][c][co][KK-1-k] = w[g][co][c][k]
 * (kernel taps reversed, k = kh*KW + kw; M output and C input channels
 * per group), written in order. */
__kernel void flip_weights(int total, int M, int C, int KK,
                           __global const float* w, __global float* wt, int off_wt) {
    /* each work-item's contiguous chunk (CPU launches: work-groups of one)
     * walked with counters: five divisions per element made this pass 52
     * of a 460 ms converted ResNet-50 step on PoCL */
    const int chunk = _gl_chunk(total);
    const int i0 = min(total, (int)get_global_id(0) * chunk), i1 = min(total, i0 + chunk);
    if (i0 >= i1) return;
    int k = i0 % KK, t = i0 / KK, co = t % M, t2 = t / M, c = t2 % C, g = t2 / C;
    for (int i = i0; i < i1; ++i) {
        wt[off_wt + i] = w[((g * M + co) * C + c) * KK + (KK - 1 - k)];
        if (++k == KK) {
            k = 0;
            if (++co == M) {
                co = 0;
                if (++c == C) { c = 0; ++g; }
            }
        }
    }
}

/* GPUs: a convolution's columns (im2col) laid out as rows over the whole
 * batch, out[off + (c * KH*KW + kh * KW + kw) * nimg*HO*WO + n * HO*WO + p] =
 * im[off_im + n][c][ho * SH - PH + kh * DH][wo * SW - PW + kw * DW] (0 outside;
 * p = ho*WO + wo): a plain GEMM operand whose rows start on 16 bytes
 * whatever an image's pixel count (ops/conv.py _gathered_rows: 1x1 passes
 * on 7 x 7 planes or strided, and TF32 forwards of k x k layers on the
 * async loop). Grid (pixels, n * C): no division per element but the
 * pixel's row; each work-item writes its pixel's KH*KW rows. */
__kernel void conv_rows(int nimg, int C, int H, int W, int KH, int KW,
                        int PH, int PW, int SH, int SW, int DH, int DW, int HO, int WO,
                        __global const float* im, int off_im, __global float* out, int off) {
    const int p = get_global_id(0), plane = get_global_id(1);     /* plane n * C + c */
    const int HOWO = HO * WO;
    if (p >= HOWO || plane >= nimg * C) return;
    const int n = plane / C, c = plane - n * C;
    const int ho = p / WO, wo = p - ho * WO;
    const int h0 = ho * SH - PH, w0 = wo * SW - PW;
    __global const float* src = im + off_im + (size_t)plane * H * W;
    __global float* dst = out + off + ((size_t)c * KH * KW * nimg + n) * HOWO + p;
    const size_t row = (size_t)nimg * HOWO;
    for (int kh = 0; kh < KH; ++kh) {
        const int h = h0 + kh * DH;
        for (int kw = 0; kw < KW; ++kw, dst += row) {
            const int w = w0 + kw * DW;
            *dst = (h >= 0 && h < H && w >= 0 && w < W) ? src[h * W + w] : 0.0f;
        }
    }
}
