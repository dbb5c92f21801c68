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

/* ---- eric612/MobileNet-YOLO's YoloDetectionOutput / Yolov3DetectionOutput --
 * yolo_decode: one work-item per (image b, position s, anchor n) of one
 * bottom (channels n * len + k, len = 5 + ncls). Candidates are numbered as
 * the fork pushes them: base + ((b * hw + s) * num + n) * per + c (per =
 * ncls for v3, 1 for v2). label = -1 marks a candidate below the threshold.
 * v3: score_c = sigmoid(class c) * sigmoid(obj), kept when > thresh, every
 *     class its own candidate; x = (col + sigmoid(tx)) / W,
 *     y = (row + sigmoid(ty)) / H, w = exp(tw) * bw / (W * anchors_scale),
 *     h = exp(th) * bh / (H * anchors_scale) (correct_yolo_boxes is the
 *     identity there). div_* = W, H, W * as, H * as.
 * v2: softmax over the classes, the first best one; score = sigmoid(obj) *
 *     its probability, kept when >= thresh; every divisor the width.
 * anchors: (bw, bh) per anchor of this bottom. */
__kernel void yolo_decode(int total, int version, int hw, int width, int num, int ncls,
                          float div_x, float div_y, float div_w, float div_h,
                          float thresh, int base,
                          __global const float* x, __global const float* anchors,
                          __global float* score, __global int* label,
                          __global float* box) {
    GLOBAL_LOOP(t, total) {
        const int n = t % num, s = (t / num) % hw, b = t / (num * hw);
        const int len = 5 + ncls;
        __global const float* p = x + ((size_t)b * num * len + (size_t)n * len) * hw + s;
        const float sx = 1.0f / (1.0f + exp(-p[0]));
        const float sy = 1.0f / (1.0f + exp(-p[hw]));
        const float4 bx = (float4)(((float)(s % width) + sx) / div_x,
                                   ((float)(s / width) + sy) / div_y,
                                   exp(p[2 * hw]) * anchors[2 * n] / div_w,
                                   exp(p[3 * hw]) * anchors[2 * n + 1] / div_h);
        const float obj = 1.0f / (1.0f + exp(-p[4 * hw]));
        if (version == 3) {
            const int k0 = base + t * ncls;
            for (int c = 0; c < ncls; ++c) {
                const float sc = 1.0f / (1.0f + exp(-p[(5 + c) * hw])) * obj;
                score[k0 + c] = sc;
                label[k0 + c] = sc > thresh ? c : -1;
                vstore4(bx, k0 + c, box);
            }
        } else {
            float large = p[5 * hw];
            for (int c = 1; c < ncls; ++c) large = fmax(large, p[(5 + c) * hw]);
            float sum = 0.0f;
            for (int c = 0; c < ncls; ++c) sum += exp(p[(5 + c) * hw] - large);
            int best = 0;
            float bp = exp(p[5 * hw] - large) / sum;
            for (int c = 1; c < ncls; ++c) {
                const float q = exp(p[(5 + c) * hw] - large) / sum;
                if (q > bp) { bp = q; best = c; }
            }
            const float sc = obj * bp;
            score[base + t] = sc;
            label[base + t] = sc >= thresh ? best : -1;
            vstore4(bx, base + t, box);
        }
    }
}

/* (score desc, index asc): a comes before b */
inline int yolo_before(float sa, int a, float sb, int b) {
    return sa > sb || (sa == sb && a < b);
}

/* The fork's box_iou on (x, y, w, h) boxes (no +1, no clipping). */
inline float yolo_iou(float4 a, float4 b) {
    const float w = fmin(a.x + a.z / 2, b.x + b.z / 2) - fmax(a.x - a.z / 2, b.x - b.z / 2);
    const float h = fmin(a.y + a.w / 2, b.y + b.w / 2) - fmax(a.y - a.w / 2, b.y - b.w / 2);
    const float inter = (w < 0 || h < 0) ? 0.0f : w * h;
    return inter / (a.z * a.w + b.z * b.w - inter);
}

/* One work-item: the candidates over the threshold, heap-sorted into
 * (score desc, index asc) order, then the fork's class-agnostic greedy NMS
 * (a box goes when its IoU with a kept one is >= nms_thresh). keep: the
 * kept candidates in order; nkeep[0]: their count. */
__kernel void yolo_nms(int total, float nms_thresh, __global const float* score,
                       __global const int* label, __global const float* box,
                       __global int* cand, __global int* keep, __global int* nkeep) {
    if (get_global_id(0) != 0) return;
    int m = 0;
    for (int k = 0; k < total; ++k)
        if (label[k] >= 0) cand[m++] = k;
    for (int start = m / 2 - 1; start >= -m + 1; --start) {
        int root = start >= 0 ? start : 0, end = start >= 0 ? m : m + start;
        if (start < 0) {
            const int t = cand[0]; cand[0] = cand[end]; cand[end] = t;
        }
        for (;;) {  /* sift down: a max-heap of "comes later" */
            int child = 2 * root + 1;
            if (child >= end) break;
            if (child + 1 < end && yolo_before(score[cand[child]], cand[child],
                                               score[cand[child + 1]], cand[child + 1]))
                ++child;
            if (!yolo_before(score[cand[root]], cand[root], score[cand[child]], cand[child]))
                break;
            const int t = cand[root]; cand[root] = cand[child]; cand[child] = t;
            root = child;
        }
    }
    int k = 0;
    for (int q = 0; q < m; ++q) {
        const float4 a = vload4(cand[q], box);
        int ok = 1;
        for (int j = 0; j < k && ok; ++j) ok = !(yolo_iou(vload4(keep[j], box), a) >= nms_thresh);
        if (ok) keep[k++] = cand[q];
    }
    nkeep[0] = k;
}

/* Rows [0, label + 1, score, x - w/2, y - h/2, x + w/2, y + h/2] of the kept
 * candidates (image id 0 for all, as the fork); none kept: `images` rows
 * [i, -1, -1, -1, -1, -1, -1]. */
__kernel void yolo_write(int rows, int none, __global const int* keep,
                         __global const float* score, __global const int* label,
                         __global const float* box, __global float* top) {
    GLOBAL_LOOP(r, rows) {
        __global float* o = top + (size_t)r * 7;
        if (none) {
            o[0] = (float)r;
            for (int j = 1; j < 7; ++j) o[j] = -1.0f;
        } else {
            const int k = keep[r];
            const float4 b = vload4(k, box);
            o[0] = 0.0f;
            o[1] = (float)(label[k] + 1);
            o[2] = score[k];
            o[3] = b.x - b.z / 2;
            o[4] = b.y - b.w / 2;
            o[5] = b.x + b.z / 2;
            o[6] = b.y + b.w / 2;
        }
    }
}
