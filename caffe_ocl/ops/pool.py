"""Pooling primitives (kernels/pooling.cl)."""
from . import work_size

SRC = "pooling.cl"


def _geom(n, c, h, w, ho, wo, kh, kw, sh, sw, ph, pw):
    return [c, h, w, ho, wo, kh, kw, sh, sw, ph, pw]


def max_forward(dev, shape, out_hw, k, s, p, x, y, mask=None):
    n, c, h, w = shape
    total = n * c * out_hw[0] * out_hw[1]
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "max_pool_fwd", gs, ls,
                      [total] + _geom(n, c, h, w, *out_hw, *k, *s, *p)
                      + [x, y, mask if mask is not None else y, int(mask is not None)])


def ave_forward(dev, shape, out_hw, k, s, p, x, y):
    n, c, h, w = shape
    total = n * c * out_hw[0] * out_hw[1]
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "ave_pool_fwd", gs, ls,
                      [total] + _geom(n, c, h, w, *out_hw, *k, *s, *p) + [x, y])


def stochastic_test_forward(dev, shape, out_hw, k, s, x, y):
    n, c, h, w = shape
    total = n * c * out_hw[0] * out_hw[1]
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "sto_pool_test_fwd", gs, ls,
                      [total] + _geom(n, c, h, w, *out_hw, *k, *s, 0, 0) + [x, y])


def max_backward(dev, shape, out_hw, k, s, p, dy, mask, dx):
    n, c, h, w = shape
    total = n * c * h * w
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "max_pool_bwd", gs, ls,
                      [total] + _geom(n, c, h, w, *out_hw, *k, *s, *p) + [dy, mask, dx])


def ave_backward(dev, shape, out_hw, k, s, p, dy, dx):
    n, c, h, w = shape
    total = n * c * h * w
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "ave_pool_bwd", gs, ls,
                      [total] + _geom(n, c, h, w, *out_hw, *k, *s, *p) + [dy, dx])
