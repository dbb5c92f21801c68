"""Local response normalisation primitives (kernels/lrn.cl)."""
from . import work_size

SRC = "lrn.cl"


def across_forward(dev, outer, c, inner, size, alpha, beta, k, x, scale, y):
    gs, ls = work_size(dev, outer * inner)
    return dev.launch(SRC, "lrn_across_fwd", gs, ls,
                      [outer, c, inner, size, alpha / size, beta, k, x, scale, y])


def across_backward(dev, outer, c, inner, size, alpha, beta, x, y, scale, dy, dx):
    gs, ls = work_size(dev, outer * inner)
    return dev.launch(SRC, "lrn_across_bwd", gs, ls,
                      [outer, c, inner, size, 2.0 * alpha * beta / size, beta,
                       x, y, scale, dy, dx])


def within_forward(dev, nc, h, w, size, alpha, beta, x, scale, y):
    total = nc * h * w
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "lrn_within_fwd", gs, ls,
                      [total, h, w, size, alpha, beta, x, scale, y])


def within_backward(dev, nc, h, w, size, alpha, beta, x, y, scale, dy, dx):
    total = nc * h * w
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "lrn_within_bwd", gs, ls,
                      [total, h, w, size, alpha, beta, x, y, scale, dy, dx])
