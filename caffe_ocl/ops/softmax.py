"""Softmax over one axis of [outer][C][inner] (kernels/softmax.cl).

One work-item per (outer, inner) pair, or on GPUs, when there are few
pairs with many channels (a classifier: 64 images x 1000 classes), one
work-group per pair sharing the pass over C (``use_groups``)."""
from . import cpu_units_work_size, work_size

SRC = "softmax.cl"
GROUP_LSIZE = 256
# group kernels when pairs x GROUP_MAX_PAIRS_PER_CU stays small and C is wide
GROUP_MIN_C = 64
GROUP_MAX_PAIRS = 1 << 14


def use_groups(dev, outer, c, inner):
    return bool(getattr(dev, "is_gpu", False)) and c >= GROUP_MIN_C and \
        outer * inner <= GROUP_MAX_PAIRS


def _launch(dev, kernel, outer, c, inner, args, groups=None):
    if use_groups(dev, outer, c, inner) if groups is None else groups:
        n = outer * inner
        return dev.launch(SRC, kernel + "_group", (n * GROUP_LSIZE,), (GROUP_LSIZE,),
                          [outer, c, inner] + args, {"SM_LSIZE": GROUP_LSIZE})
    gs, ls = work_size(dev, outer * inner)
    return dev.launch(SRC, kernel, gs, ls, [outer, c, inner] + args)


def forward(dev, outer, c, inner, x, y, groups=None):
    """``groups``: force (True) or forbid (False) the work-group kernels.
    CPU drivers: softmax_fwd_cpu (runs of 8 positions as vectors)."""
    if dev.is_cpu and not groups:
        g, l = cpu_units_work_size(dev, outer * -(-inner // 8), outer * c * inner)
        return dev.launch(SRC, "softmax_fwd_cpu", g, l, [outer, c, inner, x, y])
    return _launch(dev, "softmax_fwd", outer, c, inner, [x, y], groups)


def backward(dev, outer, c, inner, y, dy, dx, groups=None):
    return _launch(dev, "softmax_bwd", outer, c, inner, [y, dy, dx], groups)
