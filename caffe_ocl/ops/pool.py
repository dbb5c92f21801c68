"""Pooling primitives (kernels/pooling.cl).

GPUs: one work-item per output (forward) or input (backward, gather form).
CPU drivers: the ``*_cpu`` kernels, one work-item per contiguous range of
whole (n, c) planes, a few work-items per core (see pooling.cl)."""
from . import cpu_chunks, work_size

SRC = "pooling.cl"


def _geom(n, c, h, w, ho, wo, kh, kw, sh, sw, ph, pw):
    return [c, h, w, ho, wo, kh, kw, sh, sw, ph, pw]


def _launch(dev, name, shape, out_hw, total, geom, bufs):
    n, c, h, w = shape
    if dev.is_cpu:
        planes = n * c
        per_plane = max(h * w + out_hw[0] * out_hw[1], 1)
        g = cpu_chunks(dev, planes, min_chunk=max(1, 8192 // per_plane))
        fixed = {"FKH": geom[5], "FKW": geom[6]} if geom[5] * geom[6] <= 25 else None
        return dev.launch(SRC, name + "_cpu", (g,), (1,), [planes] + geom + bufs, fixed)
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, name, gs, ls, [total] + geom + bufs)


def max_forward(dev, shape, out_hw, k, s, p, x, y, mask=None):
    n, c, h, w = shape
    return _launch(dev, "max_pool_fwd", shape, out_hw, n * c * out_hw[0] * out_hw[1],
                   _geom(n, c, h, w, *out_hw, *k, *s, *p),
                   [x, y, mask if mask is not None else y, int(mask is not None)])


def ave_forward(dev, shape, out_hw, k, s, p, x, y):
    n, c, h, w = shape
    return _launch(dev, "ave_pool_fwd", shape, out_hw, n * c * out_hw[0] * out_hw[1],
                   _geom(n, c, h, w, *out_hw, *k, *s, *p), [x, y])


def stochastic_test_forward(dev, shape, out_hw, k, s, x, y):
    n, c, h, w = shape
    return _launch(dev, "sto_pool_test_fwd", shape, out_hw, n * c * out_hw[0] * out_hw[1],
                   _geom(n, c, h, w, *out_hw, *k, *s, 0, 0), [x, y])


def max_backward(dev, shape, out_hw, k, s, p, dy, mask, dx):
    n, c, h, w = shape
    return _launch(dev, "max_pool_bwd", shape, out_hw, n * c * h * w,
                   _geom(n, c, h, w, *out_hw, *k, *s, *p), [dy, mask, dx])


def ave_backward(dev, shape, out_hw, k, s, p, dy, dx):
    n, c, h, w = shape
    return _launch(dev, "ave_pool_bwd", shape, out_hw, n * c * h * w,
                   _geom(n, c, h, w, *out_hw, *k, *s, *p), [dy, dx])
