/* Faster R-CNN region proposals (py-faster-rcnn rpn/proposal_layer.py;
 * OpenCV 4's Proposal layer): anchors shifted over the feature map, bbox
 * deltas decoded (bbox_transform_inv), clipped to the image, boxes under
 * min_size * im_scale dropped, the best pre_nms_topn by score kept, NMS,
 * the first post_nms_topn written. Batch of one image. Launch helpers:
 * caffe_ocl/ops/proposal.py. */
#include "common.h"
#include "nms.h"

/* Proposal i = (h * W + w) * A + a (the fork's transpose(0, 2, 3, 1)
 * order): its foreground score (channel A + a of bottom[0]), its box from
 * anchor a shifted by (w, h) * stride and deltas 4a .. 4a+3 of bottom[1],
 * and whether it passes the size filter. */
__kernel void proposal_decode(int n, int A, int H, int W, float stride, float min_size,
                              __global const float* cls, __global const float* deltas,
                              __global const float* info, __global const float* anchors,
                              __global float* boxes, __global float* keys,
                              __global int* valid) {
    const float im_h = info[0], im_w = info[1], ms = min_size * info[2];
    const int hw = H * W;
    GLOBAL_LOOP(i, n) {
        const int a = i % A;
        const int p = i / A;               /* h * W + w */
        const float sx = (float)(p % W) * stride, sy = (float)(p / W) * stride;
        __global const float* an = anchors + 4 * a;
        const float x1 = an[0] + sx, y1 = an[1] + sy, x2 = an[2] + sx, y2 = an[3] + sy;
        const float w = x2 - x1 + 1.0f, h = y2 - y1 + 1.0f;
        const float cx = x1 + 0.5f * w, cy = y1 + 0.5f * h;
        __global const float* d = deltas + (size_t)(4 * a) * hw + p;
        const float pcx = d[0] * w + cx, pcy = d[hw] * h + cy;
        const float pw = exp(d[2 * hw]) * w, ph = exp(d[3 * hw]) * h;
        const float bx1 = fmax(fmin(pcx - 0.5f * pw, im_w - 1.0f), 0.0f);
        const float by1 = fmax(fmin(pcy - 0.5f * ph, im_h - 1.0f), 0.0f);
        const float bx2 = fmax(fmin(pcx + 0.5f * pw, im_w - 1.0f), 0.0f);
        const float by2 = fmax(fmin(pcy + 0.5f * ph, im_h - 1.0f), 0.0f);
        vstore4((float4)(bx1, by1, bx2, by2), i, boxes);
        keys[i] = cls[(size_t)(A + a) * hw + p];
        valid[i] = (bx2 - bx1 + 1.0f >= ms) && (by2 - by1 + 1.0f >= ms);
    }
}

/* Descending rank of each valid proposal among the valid ones (ties: the
 * higher index first, as a stable ascending sort reversed); the first
 * ``cap`` go to sorted[rank] with their scores. */
__kernel void proposal_rank(int n, int cap, __global const float* keys,
                            __global const int* valid, __global const float* boxes,
                            __global float* sorted, __global float* sorted_keys) {
    GLOBAL_LOOP(i, n) {
        if (!valid[i]) continue;
        const float k = keys[i];
        int r = 0;
        for (int j = 0; j < n && r < cap; ++j)
            r += valid[j] && (keys[j] > k || (keys[j] == k && j > i));
        if (r < cap) {
            vstore4(vload4(i, boxes), r, sorted);
            sorted_keys[r] = k;
        }
    }
}

/* Suppression bits (the fork's GPU nms_kernel): bit j of mask[i * words +
 * j / 64] is set when j > i and IoU(box i, box j) > thresh, areas counting
 * the +1 pixel. One (row, word) pair per index. */
__kernel void proposal_nms_mask(int cap, int words, float thresh,
                                __global const float* sorted, __global ulong* mask) {
    GLOBAL_LOOP(t, cap * words) {
        const int i = t / words, wd = t - i * words;
        const int j0 = wd * 64;
        mask[t] = nms_suppressed_bits(sorted, i, j0, min(cap, j0 + 64), thresh);
    }
}

/* Greedy NMS over the m = min(#valid, cap) sorted proposals (one
 * work-item): keeps a box unless an earlier kept one suppressed it, up to
 * post_n (<= 0: all); writes rows (0, x1, y1, x2, y2) to rois, the scores
 * to scores and the number kept to count[0]. removed: words ulongs. */
__kernel void proposal_nms_select(int n, int cap, int words, int post_n,
                                  __global const int* valid, __global const float* sorted,
                                  __global const float* sorted_keys,
                                  __global const ulong* mask, __global ulong* removed,
                                  __global float* rois, __global float* scores,
                                  __global int* count) {
    if (get_global_id(0) != 0) return;
    int m = 0;
    for (int i = 0; i < n; ++i) m += valid[i];
    m = min(m, cap);
    for (int w = 0; w < words; ++w) removed[w] = 0;
    int kept = 0;
    for (int i = 0; i < m && (post_n <= 0 || kept < post_n); ++i) {
        if ((removed[i / 64] >> (i % 64)) & 1) continue;
        const float4 b = vload4(i, sorted);
        rois[5 * kept] = 0.0f;
        rois[5 * kept + 1] = b.x;
        rois[5 * kept + 2] = b.y;
        rois[5 * kept + 3] = b.z;
        rois[5 * kept + 4] = b.w;
        scores[kept] = sorted_keys[i];
        ++kept;
        for (int w = i / 64; w < words; ++w) removed[w] |= mask[(size_t)i * words + w];
    }
    count[0] = kept;
}
