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
