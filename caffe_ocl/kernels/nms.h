/* Shared piece of the Faster R-CNN suppression masks (proposal.cl's
 * Proposal layer, frcnn_detect.cl's per-class detection NMS), as the fork's
 * GPU nms_kernel: the bits of boxes j in [max(j0, i + 1), j1) -- relative to
 * j0 -- whose IoU with box i exceeds thresh, areas counting the +1 pixel.
 * boxes: sorted (x1, y1, x2, y2) rows. */
#ifndef CAFFE_OCL_NMS_H
#define CAFFE_OCL_NMS_H

inline ulong nms_suppressed_bits(__global const float* boxes, int i, int j0, int j1,
                                 float thresh) {
    const float4 a = vload4(i, boxes);
    const float area_a = (a.z - a.x + 1.0f) * (a.w - a.y + 1.0f);
    ulong bits = 0;
    for (int j = max(j0, i + 1); j < j1; ++j) {
        const float4 b = vload4(j, boxes);
        const float iw = fmax(fmin(a.z, b.z) - fmax(a.x, b.x) + 1.0f, 0.0f);
        const float ih = fmax(fmin(a.w, b.w) - fmax(a.y, b.y) + 1.0f, 0.0f);
        const float inter = iw * ih;
        const float area_b = (b.z - b.x + 1.0f) * (b.w - b.y + 1.0f);
        if (inter / (area_a + area_b - inter) > thresh) bits |= (ulong)1 << (j - j0);
    }
    return bits;
}

#endif
