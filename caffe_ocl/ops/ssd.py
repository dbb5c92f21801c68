"""SSD fork primitives (kernels/ssd.cl): Normalize, Permute, PriorBox and
DetectionOutput's decoding, NMS, keep_top_k and output rows."""
import math

from . import cpu_units_work_size, rows_2d, work_size

SRC = "ssd.cl"


def _launch(dev, n, name, args):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args)


# ---- Normalize -------------------------------------------------------------
def norm_sumsq(dev, num, channels, spatial, eps, add_eps, x, ss):
    return _launch(dev, num * spatial, "norm_sumsq_channels",
                   [num, channels, spatial, eps, int(add_eps), x, ss])


def norm_finish(dev, num, spatial, eps, across, ss, norm):
    return _launch(dev, num if across else num * spatial, "norm_finish",
                   [num, spatial, eps, int(across), ss, norm])


def norm_forward(dev, num, channels, spatial, across, shared, x, norm, scale, y):
    return _launch(dev, num * channels * spatial, "norm_fwd",
                   [num, channels, spatial, int(across), int(shared), x, norm, scale, y])


def norm_dot(dev, num, channels, spatial, across, shared, x, dy, scale, dot):
    out = [_launch(dev, num * spatial, "norm_dot_channels",
                   [num, channels, spatial, int(shared), x, dy, scale, dot])]
    if across:
        out.append(_launch(dev, num, "norm_dot_finish", [num, spatial, dot]))
    return out


def norm_backward(dev, num, channels, spatial, across, shared, x, dy, norm, dot, scale, dx):
    return _launch(dev, num * channels * spatial, "norm_bwd",
                   [num, channels, spatial, int(across), int(shared), x, dy, norm, dot,
                    scale, dx])


def norm_scale_grad(dev, num, channels, spatial, shared, y, dy, scale, dscale):
    return _launch(dev, 1 if shared else channels, "norm_scale_grad",
                   [num, channels, spatial, int(shared), y, dy, scale, dscale])


# ---- Permute ---------------------------------------------------------------
def permute(dev, n, ndim, geom, src, dst, forward=True):
    """geom: int buffer [new_steps(ndim), old_steps[order[j]] (ndim)]."""
    return _launch(dev, n, "permute", [n, ndim, geom, src, dst, int(bool(forward))])


def row_plan(shape, orders):
    """(run, stride, ndim) of a Permute walked as rows of the output: the
    last axes ``orders`` keeps in place as one row of stride 1, else the
    output's last axis, read at its input stride; ``ndim`` axes decoded
    per row. None for an order that moves nothing."""
    n, m = len(orders), 0
    while m < n and orders[n - 1 - m] == n - 1 - m:
        m += 1
    if m == n:
        return None
    if m:
        return math.prod(shape[n - m:]), 1, n - m
    last = orders[-1]
    return shape[last], math.prod(shape[last + 1:]), n - 1


def permute_rows(dev, plan, count, geom, src, dst, forward=True):
    """Permute of ``count`` floats on a CPU driver, a row of the output at a
    time (``plan``: row_plan's; geom: ``permute_geom`` of its ndim axes)."""
    run, stride, nd = plan
    nrows = count // run
    g, l = cpu_units_work_size(dev, nrows, count)
    return dev.launch(SRC, "permute_rows", g, l, [nrows, nd, run, stride, geom, src, dst,
                                                  int(bool(forward))])


def permute_geom(shape, orders, ndim=None):
    """The permute kernels' geom for ``shape`` reordered by ``orders``: the
    steps of the first ``ndim`` output axes (default all; permute_rows:
    row_plan's, counted in rows), then the old steps (floats) of the input
    axes they come from."""
    nd = len(orders) if ndim is None else ndim
    new = [shape[o] for o in orders[:nd]]
    new_steps = [math.prod(new[i + 1:]) for i in range(nd)]
    old_steps = [math.prod(shape[o + 1:]) for o in orders[:nd]]
    return new_steps + old_steps


# columns a transpose_rs work-item takes (its TR_SB)
TRANSPOSE_COL_BLOCK = 64


def transpose(dev, outer, rows, cols, src, dst):
    """[outer][rows][cols] -> [outer][cols][rows] (kernels/ssd.cl
    transpose_rs; for CPU drivers: work-groups of one, see ``transpose_shape``)."""
    g, l = cpu_units_work_size(dev, outer * -(-cols // TRANSPOSE_COL_BLOCK), outer * rows * cols)
    return dev.launch(SRC, "transpose_rs", g, l, [outer, rows, cols, src, dst],
                      {"TR_SB": TRANSPOSE_COL_BLOCK})


def transpose_gpu(dev, outer, rows, cols, src, dst):
    """[outer][rows][cols] -> [outer][cols][rows] on a GPU: 32 x 32 tiles
    through local memory (kernels/ssd.cl transpose_tiles)."""
    gx, gy = -(-cols // 32), outer * -(-rows // 32)
    return dev.launch(SRC, "transpose_tiles", (gx * 32, gy * 8), (32, 8),
                      [outer, rows, cols, src, dst])


def permute_runs(dev, plan, count, geom, src, dst, forward=True):
    """Permute of ``count`` floats on a GPU, a work-item per float along
    the output's rows (``plan``: row_plan's; geom: ``permute_geom`` of its
    ndim axes)."""
    run, stride, nd = plan
    nrows = count // run
    g, l = rows_2d(run, nrows)
    return dev.launch(SRC, "permute_runs", g, l,
                      [nrows, nd, run, stride, geom, src, dst, int(bool(forward))])


def transpose_shape(shape, orders):
    """(outer, rows, cols) where reordering ``shape``'s axes by ``orders``
    (new axis i = old axis orders[i]) swaps two runs of axes -- orders
    0..k-1, j..n-1, k..j-1 -- i.e. is a batched 2-D transpose; else None."""
    n = len(orders)
    for k in range(n):
        for j in range(k + 1, n):
            if list(orders) == list(range(k)) + list(range(j, n)) + list(range(k, j)):
                return math.prod(shape[:k]), math.prod(shape[k:j]), math.prod(shape[j:])
    return None


# ---- PriorBox ----------------------------------------------------------------
def prior_box(dev, lh, lw, nbox, noff, img_w, img_h, step_w, step_h, clip, nvar,
              boxes, offsets, var, top):
    return _launch(dev, lh * lw * nbox * noff * 4, "prior_box",
                   [lh, lw, nbox, noff, img_w, img_h, step_w, step_h, int(clip), nvar,
                    boxes, offsets, var, top])


# ---- DetectionOutput ---------------------------------------------------------
def detout_decode(dev, n, code_type, var_in_target, np_, nlc, share_location, background,
                  clip, loc, prior, bbox):
    return _launch(dev, n, "detout_decode",
                   [n, code_type, int(var_in_target), np_, nlc, int(share_location),
                    background, int(clip), loc, prior, bbox])


def detout_nms(dev, num, np_, ncls, nlc, share_location, background, conf_thresh,
               nms_thresh, eta, top_k, normalized, conf, bbox, cand, keep, nkeep):
    return _launch(dev, num * ncls, "detout_nms",
                   [num, np_, ncls, nlc, int(share_location), background, conf_thresh,
                    nms_thresh, eta, top_k, int(normalized), conf, bbox, cand, keep, nkeep])


def detout_keep_top_k(dev, num, np_, ncls, keep_top_k, conf, keep, nkeep, sel, count, best):
    """best: scratch of num * keep_top_k ints."""
    return _launch(dev, num, "detout_keep_top_k",
                   [num, np_, ncls, keep_top_k, conf, keep, nkeep, sel, count, best])


def detout_write(dev, num, np_, ncls, nlc, share_location, conf, bbox, keep, nkeep, sel,
                 count, top):
    """Rebind argument 5 (``empty``) per forward."""
    return _launch(dev, num, "detout_write",
                   [num, np_, ncls, nlc, int(share_location), 0, conf, bbox, keep, nkeep,
                    sel, count, top])
