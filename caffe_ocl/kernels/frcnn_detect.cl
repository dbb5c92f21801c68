/* Faster R-CNN test-time post-processing (py-faster-rcnn's
 * fast_rcnn/test.py im_detect + the per-class NMS of test_net/demo.py):
 * each roi's box is regressed per class (bbox_transform_inv), clipped to
 * the image, and per class the boxes scoring above a threshold go through
 * greedy NMS (py_cpu_nms: areas with the +1 pixel, suppressed where
 * IoU > thresh). All classes at once; the same rank / mask / greedy scheme
 * as kernels/proposal.cl's, batched over classes. Launch helpers:
 * caffe_ocl/ops/frcnn_detect.py. */
#include "common.h"
#include "nms.h"

/* One (class k, roi r) per index: boxes[k][r] (x1, y1, x2, y2) in the
 * original image's pixels, keys[k][r] its score, valid[k][r] whether
 * k >= 1 and the score is above thresh. rois: (R, 5) rows in the net
 * input's pixels (divided by im_scale); deltas: (R, 4K) or none. */
__kernel void frcnn_decode(int total, int R, int K, float im_scale, float img_h, float img_w,
                           float thresh, int has_deltas, __global const float* rois,
                           __global const float* deltas, __global const float* scores,
                           __global float* boxes, __global float* keys, __global int* valid) {
    GLOBAL_LOOP(t, total) {
        const int k = t / R, r = t - k * R;
        const float x1 = rois[r * 5 + 1] / im_scale, y1 = rois[r * 5 + 2] / im_scale;
        const float x2 = rois[r * 5 + 3] / im_scale, y2 = rois[r * 5 + 4] / im_scale;
        float4 b = (float4)(x1, y1, x2, y2);
        if (has_deltas) {
            const float w = x2 - x1 + 1.0f, h = y2 - y1 + 1.0f;
            const float cx = x1 + 0.5f * w, cy = y1 + 0.5f * h;
            __global const float* d = deltas + (size_t)r * 4 * K + 4 * k;
            const float pcx = d[0] * w + cx, pcy = d[1] * h + cy;
            const float pw = exp(d[2]) * w, ph = exp(d[3]) * h;
            b = (float4)(pcx - 0.5f * pw, pcy - 0.5f * ph, pcx + 0.5f * pw, pcy + 0.5f * ph);
        }
        b.x = fmax(fmin(b.x, img_w - 1.0f), 0.0f);
        b.y = fmax(fmin(b.y, img_h - 1.0f), 0.0f);
        b.z = fmax(fmin(b.z, img_w - 1.0f), 0.0f);
        b.w = fmax(fmin(b.w, img_h - 1.0f), 0.0f);
        vstore4(b, t, boxes);
        const float s = scores[(size_t)r * K + k];
        keys[t] = s;
        valid[t] = k >= 1 && s > thresh;
    }
}

/* Descending rank of each valid box among its class's valid ones (ties:
 * the higher index first); sorted[k][rank] gets the box, its score and its
 * roi index. */
__kernel void frcnn_rank(int total, int R, __global const float* keys,
                         __global const int* valid, __global const float* boxes,
                         __global float* sorted, __global float* sorted_keys,
                         __global int* sorted_idx) {
    GLOBAL_LOOP(t, total) {
        if (!valid[t]) continue;
        const int k = t / R, i = t - k * R, base = k * R;
        const float key = keys[t];
        int r = 0;
        for (int j = 0; j < R; ++j)
            r += valid[base + j] && (keys[base + j] > key || (keys[base + j] == key && j > i));
        vstore4(vload4(t, boxes), base + r, sorted);
        sorted_keys[base + r] = key;
        sorted_idx[base + r] = i;
    }
}

/* Suppression bits per class: bit j of mask[(k R + i) words + j / 64] is
 * set when j > i and IoU(sorted box i, sorted box j) > thresh. */
__kernel void frcnn_nms_mask(int total, int R, int words, float thresh,
                             __global const float* sorted, __global ulong* mask) {
    GLOBAL_LOOP(t, total) {
        const int row = t / words, wd = t - row * words;
        const int k = row / R, i = row - k * R;
        const int j0 = wd * 64;
        mask[t] = nms_suppressed_bits(sorted + (size_t)4 * k * R, i, j0, min(R, j0 + 64),
                                      thresh);
    }
}

/* Greedy NMS, one work-item per class: over the class's m valid sorted
 * boxes, keeps a box unless an earlier kept one suppressed it; kept[k][n]
 * = the sorted position of the n-th kept box, count[k] = how many.
 * removed: K * words ulongs. */
__kernel void frcnn_nms_select(int K, int R, int words, __global const int* valid,
                               __global const ulong* mask, __global ulong* removed,
                               __global int* kept, __global int* count) {
    GLOBAL_LOOP(k, K) {
        const int base = k * R;
        int m = 0;
        for (int i = 0; i < R; ++i) m += valid[base + i];
        __global ulong* rm = removed + (size_t)k * words;
        for (int w = 0; w < words; ++w) rm[w] = 0;
        int n = 0;
        for (int i = 0; i < m; ++i) {
            if ((rm[i / 64] >> (i % 64)) & 1) continue;
            kept[base + n++] = i;
            for (int w = i / 64; w < words; ++w) rm[w] |= mask[(size_t)(base + i) * words + w];
        }
        count[k] = n;
    }
}
