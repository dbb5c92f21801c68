"""Detection forks' primitives (kernels/fork_detect.cl): R-FCN's
PSROIPooling and the YOLO v2 ports' Reorg. Each returns a list of Launch
objects."""
from . import work_size

SRC = "fork_detect.cl"


def _launch(dev, n, name, args):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args)


def psroi_pool_forward(dev, rois_n, shape, output_dim, group, scale, x, rois, y):
    _, c, h, w = shape
    total = rois_n * output_dim * group * group
    return [_launch(dev, total, "psroi_pool_fwd",
                    [total, float(scale), c, h, w, output_dim, group, x, rois, y])]


def psroi_pool_backward(dev, rois_n, shape, output_dim, group, scale, dy, rois, dx):
    n, c, h, w = shape
    total = n * c * h * w
    return [_launch(dev, total, "psroi_pool_bwd",
                    [total, float(scale), rois_n, c, h, w, output_dim, group, dy, rois, dx])]


def reorg(dev, shape, stride, gather, x, y):
    """darknet's reorg over ``shape`` (the dims reorg_cpu is given): gather
    (y[t] = x[partner]) or scatter (y[partner] = x[t])."""
    n, c, h, w = shape
    total = n * c * h * w
    return [_launch(dev, total, "reorg", [total, c, h, w, stride, int(bool(gather)), x, y])]


# ---- eric612/MobileNet-YOLO's detection outputs --------------------------------
def yolo_decode(dev, version, num_images, hw, width, num, ncls, div, thresh, base, x, anchors,
                score, label, box):
    """Candidates of one bottom (see kernels/fork_detect.cl yolo_decode);
    div = (x, y, w, h) divisors."""
    total = num_images * hw * num
    return _launch(dev, total, "yolo_decode",
                   [total, version, hw, width, num, ncls, *[float(d) for d in div],
                    float(thresh), base, x, anchors, score, label, box])


def yolo_nms(dev, total, nms_thresh, score, label, box, cand, keep, nkeep):
    return dev.launch(SRC, "yolo_nms", (1,), (1,),
                      [total, float(nms_thresh), score, label, box, cand, keep, nkeep])


def yolo_write(dev, rows, none, keep, score, label, box, top):
    return _launch(dev, max(rows, 1), "yolo_write", [rows, int(none), keep, score, label, box,
                                                      top])
