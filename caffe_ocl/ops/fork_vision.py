"""Segmentation / mobile / Faster R-CNN fork primitives (kernels/fork_vision.cl):
ShuffleChannel, Axpy, Interp, Upsample (max-unpooling and nearest) and
ROIPooling. Each returns a list of Launch objects."""
from . import cpu_chunks, cpu_units_work_size, work_size
from .gemm import act_defines

SRC = "fork_vision.cl"


def _launch(dev, n, name, args, defines=None):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args, defines)


def _planes(dev, n, name, args):
    """One work-item per run of whole planes (kernels that own a plane)."""
    if dev.is_cpu:
        k = cpu_chunks(dev, n, min_chunk=1)
        return dev.launch(SRC, name, (k,), (1,), args)
    return _launch(dev, n, name, args)


# ---- ShuffleChannel ---------------------------------------------------------
def shuffle_channel(dev, num, channels, group, spatial, x, y):
    """y channel j*group + i = x channel i*(channels/group) + j; with
    ``group`` = channels/group it is the inverse (the backward)."""
    total = num * channels * spatial
    return [_launch(dev, total, "shuffle_channel", [total, channels, group, spatial, x, y])]


# ---- Axpy -------------------------------------------------------------------
def axpy_forward(dev, planes, spatial, a, x, y, top, act=None):
    """top = act(a * x + y) (``act``: ops.gemm.act_defines' spec or None)."""
    total = planes * spatial
    kind, act_a, act_b = act_defines(act)
    return [_launch(dev, total, "axpy_fwd", [total, spatial, a, x, y, top, act_a, act_b],
                    dict(ACT=kind) if kind else None)]


def axpy_backward_x(dev, planes, spatial, a, dtop, dx):
    total = planes * spatial
    return [_launch(dev, total, "axpy_bwd_x", [total, spatial, a, dtop, dx])]


def axpy_backward_a(dev, planes, spatial, x, dtop, da):
    return [_planes(dev, planes, "axpy_bwd_a", [planes, spatial, x, dtop, da])]


# ---- Interp -----------------------------------------------------------------
def interp_forward(dev, planes, crop, in_hw, eff_hw, out_hw, x, y):
    """Bilinear (corners aligned) from the eff_hw window at ``crop`` (x, y)
    of each in_hw plane to out_hw."""
    total = planes * out_hw[0] * out_hw[1]
    if dev.is_cpu and total:        # by output rows (fork_vision.cl interp_fwd_rows)
        g, l = cpu_units_work_size(dev, planes * out_hw[0], total)
        return [dev.launch(SRC, "interp_fwd_rows", g, l,
                           [planes * out_hw[0], crop[0], crop[1], eff_hw[0], eff_hw[1],
                            in_hw[0], in_hw[1], out_hw[0], out_hw[1], x, y])]
    return [_launch(dev, total, "interp_fwd",
                    [total, crop[0], crop[1], eff_hw[0], eff_hw[1], in_hw[0], in_hw[1],
                     out_hw[0], out_hw[1], x, y])]


def interp_backward(dev, planes, crop, in_hw, eff_hw, out_hw, dx, dy):
    """dx (cleared, then accumulated) from dy, plane by plane."""
    return [_planes(dev, planes, "interp_bwd",
                    [planes, crop[0], crop[1], eff_hw[0], eff_hw[1], in_hw[0], in_hw[1],
                     out_hw[0], out_hw[1], dx, dy])]


# ---- Upsample ---------------------------------------------------------------
def unpool_forward(dev, planes, in_sp, out_sp, x, mask, y):
    return [_planes(dev, planes, "unpool_fwd", [planes, in_sp, out_sp, x, mask, y])]


def unpool_backward(dev, planes, in_sp, out_sp, dy, mask, dx):
    total = planes * in_sp
    return [_launch(dev, total, "unpool_bwd", [total, in_sp, out_sp, dy, mask, dx])]


def upsample_nearest_forward(dev, planes, h, w, scale, x, y):
    total = planes * h * w * scale * scale
    return [_launch(dev, total, "upsample_nearest_fwd", [total, h, w, scale, x, y])]


def upsample_nearest_backward(dev, planes, h, w, scale, dy, dx):
    total = planes * h * w
    return [_launch(dev, total, "upsample_nearest_bwd", [total, h, w, scale, dy, dx])]


# ---- ROIPooling -------------------------------------------------------------
def roi_pool_forward(dev, rois_n, shape, pooled, scale, x, rois, y, argmax):
    _, c, h, w = shape
    total = rois_n * c * pooled[0] * pooled[1]
    return [_launch(dev, total, "roi_pool_fwd",
                    [total, float(scale), c, h, w, pooled[0], pooled[1], x, rois, y, argmax])]


def roi_pool_backward(dev, rois_n, shape, pooled, scale, dy, argmax, rois, dx):
    n, c, h, w = shape
    total = n * c * h * w
    return [_launch(dev, total, "roi_pool_bwd",
                    [total, float(scale), rois_n, c, h, w, pooled[0], pooled[1], dy, argmax,
                     rois, dx])]


# ---- ENet's spatial dropout ---------------------------------------------------
def spatial_dropout_forward(dev, total, inner, x, y, mask, p, scale):
    """One Launch; its seed and stream (args 7, 8) are set per forward."""
    return _launch(dev, total, "spatial_dropout_fwd",
                   [total, inner, x, y, mask, float(p), float(scale), 0, 0])


def dropout_backward(dev, total, dy, mask, dx, scale):
    g, l = work_size(dev, total)
    return dev.launch("pointwise.cl", "dropout_bwd", g, l, [total, dy, mask, dx, float(scale)])


# ---- PSPNet's BN with moving statistics -------------------------------------------
def bn_global_forward(dev, num, channels, inner, eps, x, slope, bias, mean, var, xnorm, y):
    total = num * channels * inner
    return [_launch(dev, total, "bn_global_fwd", [total, channels, inner, float(eps), x, slope,
                                                  bias, mean, var, xnorm, y])]


def bn_global_backward(dev, num, channels, inner, eps, dy, slope, var, dx):
    total = num * channels * inner
    return [_launch(dev, total, "bn_global_bwd", [total, channels, inner, float(eps), dy, slope,
                                                  var, dx])]
