"""Faster R-CNN test-time post-processing on the device
(kernels/frcnn_detect.cl): per-class box regression and clipping, score
threshold, and per-class greedy NMS, as py-faster-rcnn's im_detect and its
test/demo scripts. ``detect_post`` runs it and returns host arrays."""
import numpy as np

from . import work_size

SRC = "frcnn_detect.cl"


def _launch(dev, n, name, args):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args)


def detect_post(dev, R, K, rois, deltas, scores, im_scale, im_hw, thresh, nms_thresh):
    """rois (R x 5), deltas (R x 4K, or None) and scores (R x K): device
    buffers. Returns per class k >= 1 the kept (roi index, score, box)
    arrays, best first: a list of K (idx int32 (n,), scores (n,), boxes
    (n, 4)) tuples (class 0, the background, empty)."""
    total = R * K
    words = (R + 63) // 64
    boxes, keys, valid = dev.alloc(16 * total), dev.alloc(4 * total), dev.alloc(4 * total)
    srt, skeys, sidx = dev.alloc(16 * total), dev.alloc(4 * total), dev.alloc(4 * total)
    mask, removed = dev.alloc(8 * total * words), dev.alloc(8 * K * words)
    kept, count = dev.alloc(4 * total), dev.alloc(4 * K)
    launches = [
        _launch(dev, total, "frcnn_decode",
                [total, R, K, float(im_scale), float(im_hw[0]), float(im_hw[1]), float(thresh),
                 int(deltas is not None), rois, deltas if deltas is not None else rois, scores,
                 boxes, keys, valid]),
        _launch(dev, total, "frcnn_rank", [total, R, keys, valid, boxes, srt, skeys, sidx]),
        _launch(dev, total * words, "frcnn_nms_mask",
                [total * words, R, words, float(nms_thresh), srt, mask]),
        _launch(dev, K, "frcnn_nms_select", [K, R, words, valid, mask, removed, kept, count]),
    ]
    for launch in launches:
        launch.run(dev.queue)
    h_count = np.empty(K, np.int32)
    h_kept, h_idx = np.empty(total, np.int32), np.empty(total, np.int32)
    h_keys, h_boxes = np.empty(total, np.float32), np.empty((total, 4), np.float32)
    for host, buf in ((h_count, count), (h_kept, kept), (h_idx, sidx), (h_keys, skeys),
                      (h_boxes, srt)):
        dev.download(host, buf)
    out = []
    for k in range(K):
        pos = k * R + h_kept[k * R:k * R + h_count[k]]
        out.append((h_idx[pos], h_keys[pos], h_boxes[pos]))
    return out
