/* Layers of the segmentation / mobile / detection Caffe forks (issue #23):
 * ShuffleChannel (farmingyard/ShuffleNet), Axpy (hujie-frank/SENet),
 * Interp (hszhao/PSPNet, DeepLab v2's caffe_gpu_interp2), Upsample
 * (alexgkendall/caffe-segnet max-unpooling; the YOLO ports' nearest) and
 * ROIPooling (rbgirshick/caffe-fast-rcnn). Launch helpers:
 * caffe_ocl/ops/fork_vision.py; each kernel follows the fork's source
 * (named at the kernel). Layouts are NCHW. */
#include "common.h"
#include "act.h"

/* ShuffleChannel: y channel j*G + i = x channel i*(C/G) + j, per image
 * (the fork's Resize_cpu(top, bottom, G, C/G, spatial)); its backward is the
 * same copy with G and C/G swapped. */
__kernel void shuffle_channel(int total, int C, int G, int spatial,
                              __global const float* x, __global float* y) {
    const int K = C / G;
    GLOBAL_LOOP(t, total) {
        const int s = t % spatial;
        const int r = t / spatial;
        const int c = r % C;          /* output channel = j*G + i */
        const int n = r / C;
        const int j = c / G, i = c - j * G;
        y[t] = x[((size_t)n * C + i * K + j) * spatial + s];
    }
}

/* Axpy: top = a * x + y, a of shape (N, C) broadcast over the spatial axes;
 * ACT: the activation after it (SENet's in-place ReLU, plan/axpy.py),
 * applied before the store (act.h; 0: none). */
__kernel void axpy_fwd(int total, int spatial, __global const float* a,
                       __global const float* x, __global const float* yb,
                       __global float* top, float act_a, float act_b) {
    GLOBAL_LOOP(t, total) {
        const float v = fma(a[t / spatial], x[t], yb[t]);
        top[t] = APPLY_ACT(v);
    }
}

/* dx = a * dtop (the fork's Backward for bottom[1]). */
__kernel void axpy_bwd_x(int total, int spatial, __global const float* a,
                         __global const float* dtop, __global float* dx) {
    GLOBAL_LOOP(t, total) dx[t] = a[t / spatial] * dtop[t];
}

/* da[nc] = sum over the spatial axes of x * dtop (one (n, c) per index). */
__kernel void axpy_bwd_a(int planes, int spatial, __global const float* x,
                         __global const float* dtop, __global float* da) {
    GLOBAL_LOOP(p, planes) {
        __global const float* xp = x + (size_t)p * spatial;
        __global const float* dp = dtop + (size_t)p * spatial;
        float s = 0.0f;
        for (int k = 0; k < spatial; ++k) s = fma(xp[k], dp[k], s);
        da[p] = s;
    }
}

/* One axis of Interp's bilinear taps (caffe_gpu_interp2): output o at ratio
 * r = (in - 1) / (out - 1) (0 for one output) reads input i and i + step
 * (step 0 at the last input) with weights l0, l1. The ratio comes from
 * div_rn: the index is the truncated product, so a quotient off by an ulp
 * (NVIDIA's OpenCL division) would move a tap, as it did ROIPooling's bins. */
inline float interp_ratio(int in, int out) {
    return (out > 1) ? div_rn((float)(in - 1), (float)(out - 1)) : 0.0f;
}

inline void interp_tap(float r, int o, int in, int* i, int* step, float* l0, float* l1) {
    const float x = r * o;
    *i = (int)x;
    *step = (*i < in - 1) ? 1 : 0;
    *l1 = x - *i;
    *l0 = 1.0f - *l1;
}

/* Interp (DeepLab v2 / PSPNet caffe_gpu_interp2<Dtype, false>): bilinear,
 * corners aligned, from the [h1 x w1] window at (y1, x1) of each [H1 x W1]
 * input plane into the whole [h2 x w2] output plane; the same size copies.
 * One output element per index. */
__kernel void interp_fwd(int total, int x1, int y1, int h1, int w1, int H1, int W1,
                         int h2, int w2, __global const float* src, __global float* dst) {
    const float rh = interp_ratio(h1, h2), rw = interp_ratio(w1, w2);
    GLOBAL_LOOP(t, total) {
        const int ow = t % w2;
        const int r = t / w2;
        const int oh = r % h2;
        const int p = r / h2;
        __global const float* s = src + (size_t)p * H1 * W1;
        if (h1 == h2 && w1 == w2) {
            dst[t] = s[(y1 + oh) * W1 + (x1 + ow)];
            continue;
        }
        int ih, hp, iw, wp;
        float hl0, hl1, wl0, wl1;
        interp_tap(rh, oh, h1, &ih, &hp, &hl0, &hl1);
        interp_tap(rw, ow, w1, &iw, &wp, &wl0, &wl1);
        __global const float* q = s + (y1 + ih) * W1 + (x1 + iw);
        dst[t] = hl0 * (wl0 * q[0] + wl1 * q[wp])
               + hl1 * (wl0 * q[hp * W1] + wl1 * q[hp * W1 + wp]);
    }
}

/* interp_fwd by output rows, for CPU drivers (ops/fork_vision.py): the
 * row's tap once, then along the row (per element, the index decode and
 * both taps cost more than the interpolation: 0.75x OpenCV's speed on
 * PoCL). The same arithmetic in the same order as interp_fwd. */
__kernel void interp_fwd_rows(int rows, int x1, int y1, int h1, int w1, int H1, int W1,
                              int h2, int w2, __global const float* src, __global float* dst) {
    const float rh = interp_ratio(h1, h2), rw = interp_ratio(w1, w2);
    GLOBAL_LOOP(r, rows) {
        const int oh = r % h2, p = r / h2;
        __global const float* s = src + (size_t)p * H1 * W1;
        __global float* d = dst + (size_t)r * w2;
        if (h1 == h2 && w1 == w2) {
            for (int ow = 0; ow < w2; ++ow) d[ow] = s[(y1 + oh) * W1 + (x1 + ow)];
            continue;
        }
        int ih, hp;
        float hl0, hl1;
        interp_tap(rh, oh, h1, &ih, &hp, &hl0, &hl1);
        __global const float* q0 = s + (y1 + ih) * W1 + x1;
        __global const float* q1 = q0 + hp * W1;
        for (int ow = 0; ow < w2; ++ow) {
            int iw, wp;
            float wl0, wl1;
            interp_tap(rw, ow, w1, &iw, &wp, &wl0, &wl1);
            d[ow] = hl0 * (wl0 * q0[iw] + wl1 * q0[iw + wp])
                  + hl1 * (wl0 * q1[iw] + wl1 * q1[iw + wp]);
        }
    }
}

/* Interp backward (caffe_gpu_interp2_backward): the input diff (cleared
 * first, as the fork's caffe_gpu_set) receives each output diff at its four
 * taps. The fork adds with atomics; here one work-item owns whole planes
 * and adds in the fork's CPU order (no races, deterministic). */
__kernel void interp_bwd(int planes, int x1, int y1, int h1, int w1, int H1, int W1,
                         int h2, int w2, __global float* dsrc, __global const float* ddst) {
    const float rh = interp_ratio(h1, h2), rw = interp_ratio(w1, w2);
    GLOBAL_LOOP(p, planes) {
        __global float* s = dsrc + (size_t)p * H1 * W1;
        __global const float* d = ddst + (size_t)p * h2 * w2;
        for (int k = 0; k < H1 * W1; ++k) s[k] = 0.0f;
        for (int oh = 0; oh < h2; ++oh) {
            for (int ow = 0; ow < w2; ++ow) {
                const float g = d[oh * w2 + ow];
                if (h1 == h2 && w1 == w2) {
                    s[(y1 + oh) * W1 + (x1 + ow)] += g;
                    continue;
                }
                int ih, hp, iw, wp;
                float hl0, hl1, wl0, wl1;
                interp_tap(rh, oh, h1, &ih, &hp, &hl0, &hl1);
                interp_tap(rw, ow, w1, &iw, &wp, &wl0, &wl1);
                __global float* q = s + (y1 + ih) * W1 + (x1 + iw);
                q[0] += hl0 * wl0 * g;
                q[wp] += hl0 * wl1 * g;
                q[hp * W1] += hl1 * wl0 * g;
                q[hp * W1 + wp] += hl1 * wl1 * g;
            }
        }
    }
}

/* SegNet Upsample forward: top cleared, then top[mask[i]] = bottom[i] per
 * plane (mask: the plane index of the pooled maximum, as Pooling's second
 * top). One work-item per plane: masks from overlapping pooling windows may
 * repeat an index, and the fork's serial loop keeps the last. A mask index
 * outside the output plane (the fork CHECKs against it) is skipped. */
__kernel void unpool_fwd(int planes, int in_sp, int out_sp, __global const float* x,
                         __global const float* mask, __global float* y) {
    GLOBAL_LOOP(p, planes) {
        __global const float* xp = x + (size_t)p * in_sp;
        __global const float* mp = mask + (size_t)p * in_sp;
        __global float* yp = y + (size_t)p * out_sp;
        for (int k = 0; k < out_sp; ++k) yp[k] = 0.0f;
        for (int i = 0; i < in_sp; ++i) {
            const int idx = (int)mp[i];
            if (idx >= 0 && idx < out_sp) yp[idx] = xp[i];
        }
    }
}

/* SegNet Upsample backward: dx[i] = dy[mask[i]]. */
__kernel void unpool_bwd(int total, int in_sp, int out_sp, __global const float* dy,
                         __global const float* mask, __global float* dx) {
    GLOBAL_LOOP(t, total) {
        const int p = t / in_sp;
        const int idx = (int)mask[t];
        dx[t] = (idx >= 0 && idx < out_sp) ? dy[(size_t)p * out_sp + idx] : 0.0f;
    }
}

/* YOLO ports' Upsample: nearest, y[n, c, h, w] = x[n, c, h / s, w / s]. */
__kernel void upsample_nearest_fwd(int total, int H, int W, int s, __global const float* x,
                                   __global float* y) {
    const int HO = H * s, WO = W * s;
    GLOBAL_LOOP(t, total) {
        const int ow = t % WO;
        const int r = t / WO;
        const int oh = r % HO;
        const int p = r / HO;
        y[t] = x[((size_t)p * H + oh / s) * W + ow / s];
    }
}

/* dx[n, c, h, w] = sum of the s x s output diffs it was copied to. */
__kernel void upsample_nearest_bwd(int total, int H, int W, int s, __global const float* dy,
                                   __global float* dx) {
    const int WO = W * s;
    GLOBAL_LOOP(t, total) {
        const int iw = t % W;
        const int r = t / W;
        const int ih = r % H;
        const int p = r / H;
        __global const float* d = dy + ((size_t)p * H * s + ih * s) * WO + iw * s;
        float acc = 0.0f;
        for (int a = 0; a < s; ++a)
            for (int b = 0; b < s; ++b) acc += d[a * WO + b];
        dx[t] = acc;
    }
}

/* ROIPooling (caffe-fast-rcnn roi_pooling_layer.cu ROIPoolForward): one
 * (roi, channel, ph, pw) per index; rois are (batch, x1, y1, x2, y2) rows. */
inline void roi_box(__global const float* roi, float scale, int* b, int* sw, int* sh,
                    int* ew, int* eh) {
    *b = (int)roi[0];
    *sw = (int)round(roi[1] * scale);
    *sh = (int)round(roi[2] * scale);
    *ew = (int)round(roi[3] * scale);
    *eh = (int)round(roi[4] * scale);
}

__kernel void roi_pool_fwd(int total, float scale, int C, int H, int W, int PH, int PW,
                           __global const float* x, __global const float* rois,
                           __global float* y, __global int* argmax) {
    GLOBAL_LOOP(t, total) {
        const int pw = t % PW;
        int r = t / PW;
        const int ph = r % PH;
        r /= PH;
        const int c = r % C;
        const int n = r / C;
        int b, rsw, rsh, rew, reh;
        roi_box(rois + n * 5, scale, &b, &rsw, &rsh, &rew, &reh);
        const int rw = max(rew - rsw + 1, 1), rh = max(reh - rsh + 1, 1);
        const float bh = div_rn((float)rh, (float)PH), bw = div_rn((float)rw, (float)PW);
        int hs = (int)floor((float)ph * bh), ws = (int)floor((float)pw * bw);
        int he = (int)ceil((float)(ph + 1) * bh), we = (int)ceil((float)(pw + 1) * bw);
        hs = min(max(hs + rsh, 0), H);
        he = min(max(he + rsh, 0), H);
        ws = min(max(ws + rsw, 0), W);
        we = min(max(we + rsw, 0), W);
        const bool empty = (he <= hs) || (we <= ws);
        float m = empty ? 0.0f : -FLT_MAX;
        int mi = -1;
        __global const float* xp = x + ((size_t)b * C + c) * H * W;
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w)
                if (xp[h * W + w] > m) {
                    m = xp[h * W + w];
                    mi = h * W + w;
                }
        y[t] = m;
        argmax[t] = mi;
    }
}

/* ROIPoolBackward: each input element gathers the diffs of the bins (over
 * every roi of its image) whose argmax it was, searching the fork's
 * feasible bin range. */
__kernel void roi_pool_bwd(int total, float scale, int R, int C, int H, int W, int PH,
                           int PW, __global const float* dy, __global const int* argmax,
                           __global const float* rois, __global float* dx) {
    GLOBAL_LOOP(t, total) {
        const int w = t % W;
        int r = t / W;
        const int h = r % H;
        r /= H;
        const int c = r % C;
        const int n = r / C;
        float g = 0.0f;
        for (int q = 0; q < R; ++q) {
            int b, rsw, rsh, rew, reh;
            roi_box(rois + q * 5, scale, &b, &rsw, &rsh, &rew, &reh);
            if (n != b) continue;
            if (!(w >= rsw && w <= rew && h >= rsh && h <= reh)) continue;
            const int off = (q * C + c) * PH * PW;
            const int rw = max(rew - rsw + 1, 1), rh = max(reh - rsh + 1, 1);
            const float bh = div_rn((float)rh, (float)PH), bw = div_rn((float)rw, (float)PW);
            int phs = (int)floor(div_rn((float)(h - rsh), bh)), phe = (int)ceil(div_rn((float)(h - rsh + 1), bh));
            int pws = (int)floor(div_rn((float)(w - rsw), bw)), pwe = (int)ceil(div_rn((float)(w - rsw + 1), bw));
            phs = min(max(phs, 0), PH);
            phe = min(max(phe, 0), PH);
            pws = min(max(pws, 0), PW);
            pwe = min(max(pwe, 0), PW);
            for (int ph = phs; ph < phe; ++ph)
                for (int pw = pws; pw < pwe; ++pw)
                    if (argmax[off + ph * PW + pw] == h * W + w) g += dy[off + ph * PW + pw];
        }
        dx[t] = g;
    }
}

/* ENet's spatial dropout (TimoSaemann/ENet's spatial_dropout.py, TRAIN):
 * whole planes of `inner` elements are kept with probability 1 - p (one
 * draw per plane) and the survivors scaled; the mask is stored per element
 * for pointwise.cl's dropout_bwd. */
__kernel void spatial_dropout_fwd(int n, int inner, __global const float* x,
                                  __global float* y, __global float* mask, float p,
                                  float scale, uint seed, uint stream) {
    GLOBAL_LOOP(i, n) {
        uint2 r = philox2x32((uint2)((uint)(i / inner), stream), seed);
        float m = u01(r.x) >= p ? 1.0f : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m * scale;
    }
}

/* PSPNet's BN (hszhao/PSPNet bn_layer.cpp, yjxiong's) with the moving
 * statistics (TEST or frozen): xnorm = (x - mean) * (var + eps)^-1/2,
 * y = xnorm * slope + bias, per channel c = (t / inner) % channels. */
__kernel void bn_global_fwd(int total, int channels, int inner, float eps,
                            __global const float* x, __global const float* slope,
                            __global const float* bias, __global const float* mean,
                            __global const float* var, __global float* xnorm,
                            __global float* y) {
    GLOBAL_LOOP(t, total) {
        const int c = (t / inner) % channels;
        const float xn = (x[t] - mean[c]) * pow(var[c] + eps, -0.5f);
        xnorm[t] = xn;
        y[t] = xn * slope[c] + bias[c];
    }
}

/* Its backward to the input: dx = dy * slope * (var + eps)^-1/2. */
__kernel void bn_global_bwd(int total, int channels, int inner, float eps,
                            __global const float* dy, __global const float* slope,
                            __global const float* var, __global float* dx) {
    GLOBAL_LOOP(t, total) {
        const int c = (t / inner) % channels;
        dx[t] = dy[t] * (slope[c] * pow(var[c] + eps, -0.5f));
    }
}
