/* Detection forks' layers (issue #23): R-FCN's PSROIPooling
 * (daijifeng001/caffe-rfcn psroi_pooling_layer.cu) and the YOLO v2 ports'
 * Reorg (darknet's reorg_cpu, copied by the Caffe ports). Launch helpers:
 * caffe_ocl/ops/fork_detect.py. Layouts are NCHW. */
#include "common.h"

/* The fork's bin of roi r at (ph, pw): rounded roi corners times
 * spatial_scale, end + 1, at least 0.1 wide, bins floor/ceil'd and clipped. */
inline void psroi_bin(__global const float* roi, float scale, int G, int H, int W, int ph,
                      int pw, int* hs, int* he, int* ws, int* we) {
    const float sw = round(roi[1]) * scale, sh = round(roi[2]) * scale;
    const float ew = (round(roi[3]) + 1.0f) * scale, eh = (round(roi[4]) + 1.0f) * scale;
    const float rw = fmax(ew - sw, 0.1f), rh = fmax(eh - sh, 0.1f);
    const float bh = div_rn(rh, (float)G), bw = div_rn(rw, (float)G);
    *hs = min(max((int)floor((float)ph * bh + sh), 0), H);
    *ws = min(max((int)floor((float)pw * bw + sw), 0), W);
    *he = min(max((int)ceil((float)(ph + 1) * bh + sh), 0), H);
    *we = min(max((int)ceil((float)(pw + 1) * bw + sw), 0), W);
}

/* PSROIPoolingForward: one (roi, ctop, ph, pw) per index; the average of
 * input channel (ctop * G + ph) * G + pw over the bin (0 when empty). */
__kernel void psroi_pool_fwd(int total, float scale, int C, int H, int W, int D, int G,
                             __global const float* x, __global const float* rois,
                             __global float* y) {
    GLOBAL_LOOP(t, total) {
        const int pw = t % G;
        int r = t / G;
        const int ph = r % G;
        r /= G;
        const int ctop = r % D;
        const int n = r / D;
        __global const float* roi = rois + n * 5;
        int hs, he, ws, we;
        psroi_bin(roi, scale, G, H, W, ph, pw, &hs, &he, &ws, &we);
        const int b = (int)roi[0];
        const int c = (ctop * G + ph) * G + pw;
        __global const float* xp = x + ((size_t)b * C + c) * H * W;
        float sum = 0.0f;
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w)
                sum += xp[h * W + w];
        const int area = (he - hs) * (we - ws);
        y[t] = (he <= hs || we <= ws) ? 0.0f : sum / (float)area;
    }
}

/* PSROIPoolingBackward as a gather (the fork scatters with atomicAdd): each
 * input element sums dy / bin area over the rois of its image whose bin of
 * its channel's (ph, pw) covers it. */
__kernel void psroi_pool_bwd(int total, float scale, int R, int C, int H, int W, int D, int G,
                             __global const float* dy, __global const float* rois,
                             __global float* dx) {
    GLOBAL_LOOP(t, total) {
        const int w = t % W;
        int r = t / W;
        const int h = r % H;
        r /= H;
        const int c = r % C;
        const int b = r / C;
        const int pw = c % G, ph = (c / G) % G, ctop = c / (G * G);
        float g = 0.0f;
        for (int n = 0; n < R; ++n) {
            __global const float* roi = rois + n * 5;
            if ((int)roi[0] != b) continue;
            int hs, he, ws, we;
            psroi_bin(roi, scale, G, H, W, ph, pw, &hs, &he, &ws, &we);
            if (h < hs || h >= he || w < ws || w >= we) continue;
            g += dy[((n * D + ctop) * G + ph) * G + pw] / (float)((he - hs) * (we - ws));
        }
        dx[t] = g;
    }
}

/* darknet reorg_cpu(x, w, h, c, batch, stride, forward, out) with w, h, c the
 * bottom's dims: index t walks the bottom's (b, k, j, i); its partner index
 * walks (b, k % (c/s^2), j*s + (k/(c/s^2)) / s, i*s + (k/(c/s^2)) % s) in a
 * (c/s^2, h*s, w*s) layout. gather: y[t] = x[partner]; else y[partner] = x[t]. */
__kernel void reorg(int total, int C, int H, int W, int s, int gather,
                    __global const float* x, __global float* y) {
    const int oc = C / (s * s);
    GLOBAL_LOOP(t, total) {
        const int i = t % W;
        int r = t / W;
        const int j = r % H;
        r /= H;
        const int k = r % C;
        const int b = r / C;
        const int c2 = k % oc, off = k / oc;
        const int w2 = i * s + off % s, h2 = j * s + off / s;
        const int o = w2 + W * s * (h2 + H * s * (c2 + oc * b));
        if (gather) y[t] = x[o];
        else y[o] = x[t];
    }
}
