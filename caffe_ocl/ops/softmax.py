"""Softmax over one axis of [outer][C][inner] (kernels/softmax.cl)."""
from . import work_size

SRC = "softmax.cl"


def forward(dev, outer, c, inner, x, y):
    gs, ls = work_size(dev, outer * inner)
    return dev.launch(SRC, "softmax_fwd", gs, ls, [outer, c, inner, x, y])


def backward(dev, outer, c, inner, y, dy, dx):
    gs, ls = work_size(dev, outer * inner)
    return dev.launch(SRC, "softmax_bwd", gs, ls, [outer, c, inner, y, dy, dx])
