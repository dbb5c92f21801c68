"""Local response normalisation primitives (kernels/lrn.cl)."""
from . import cpu_chunks, cpu_units_work_size, work_size

SRC = "lrn.cl"


def _across_size(dev, outer, c, inner, name):
    """GPUs: one work-item per pixel; CPU drivers: the *_cpu kernels, one
    work-item per range of (image, 8-pixel group) units (see lrn.cl)."""
    if dev.is_cpu:
        units = outer * (-(-inner // 8))
        return name + "_cpu", (cpu_chunks(dev, units, max(1, 512 // max(c, 1))),), (1,)
    gs, ls = work_size(dev, outer * inner)
    return name, gs, ls


def _beta_defs(beta):
    """beta = 0.75 (the common LRN setting) raises by square roots."""
    return {"BETA_075": int(float(beta) == 0.75)}


def across_forward(dev, outer, c, inner, size, alpha, beta, k, x, scale, y):
    name, gs, ls = _across_size(dev, outer, c, inner, "lrn_across_fwd")
    return dev.launch(SRC, name, gs, ls,
                      [outer, c, inner, size, alpha / size, beta, k, x, scale, y],
                      _beta_defs(beta))


def across_backward(dev, outer, c, inner, size, alpha, beta, x, y, scale, dy, dx):
    name, gs, ls = _across_size(dev, outer, c, inner, "lrn_across_bwd")
    return dev.launch(SRC, name, gs, ls,
                      [outer, c, inner, size, 2.0 * alpha * beta / size, beta,
                       x, y, scale, dy, dx], _beta_defs(beta))


def _within(dev, name, nc, h, w, args, beta):
    """GPUs: an output a work-item; CPU drivers: rows of planes (*_rows)."""
    total = nc * h * w
    if dev.is_cpu and total:
        g, l = cpu_units_work_size(dev, nc * h, total)
        return dev.launch(SRC, name + "_rows", g, l, [nc * h, h, w] + args, _beta_defs(beta))
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, name, gs, ls, [total, h, w] + args, _beta_defs(beta))


def within_forward(dev, nc, h, w, size, alpha, beta, x, scale, y):
    return _within(dev, "lrn_within_fwd", nc, h, w, [size, alpha, beta, x, scale, y], beta)


def within_backward(dev, nc, h, w, size, alpha, beta, x, y, scale, dy, dx):
    return _within(dev, "lrn_within_bwd", nc, h, w, [size, alpha, beta, x, y, scale, dy, dx],
                   beta)
