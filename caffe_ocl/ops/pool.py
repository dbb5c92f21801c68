"""Pooling primitives (kernels/pooling.cl).

GPUs: one work-item per output (forward) or input (backward, gather form;
MAX over a 3-D grid with the window compiled in).
CPU drivers: the ``*_cpu`` kernels, one work-item per contiguous range of
whole (n, c) planes, a few work-items per core (see pooling.cl)."""
from .. import config
from . import cpu_chunks, work_size

SRC = "pooling.cl"


def _geom(n, c, h, w, ho, wo, kh, kw, sh, sw, ph, pw):
    return [c, h, w, ho, wo, kh, kw, sh, sw, ph, pw]


def run_width(w, wo, kw, sw, pw):
    """Outputs per vector step of the CPU max-pooling kernel (pooling.cl
    FRUN): 8, or 4 where fewer than 8 outputs of a row have whole windows."""
    wlo, whi = -(-pw // sw), min(wo - 1, (w + pw - kw) // sw)
    return 8 if whi - wlo >= 7 else 4


def _launch(dev, name, shape, out_hw, total, geom, bufs, planes=None, defines=None):
    """planes: the CPU plane kernel (``name``_cpu) or not; None: CPU drivers."""
    n, c, h, w = shape
    defines = dict(defines or {})
    if dev.is_cpu if planes is None else planes:
        planes = n * c
        per_plane = max(h * w + out_hw[0] * out_hw[1], 1)
        g = cpu_chunks(dev, planes, min_chunk=max(1, 8192 // per_plane))
        if geom[5] * geom[6] <= 25:
            defines.update(FKH=geom[5], FKW=geom[6], FSW=geom[8])
            defines["FRUN"] = run_width(w, out_hw[1], geom[6], geom[8], geom[10])
        return dev.launch(SRC, name + "_cpu", (g,), (1,), [planes] + geom + bufs,
                          defines or None)
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, name, gs, ls, [total] + geom + bufs, defines or None)


# pooling.cl max_pool_fwd_band: most __local floats of a band of padded
# input rows (64 KiB, an eighth of PoCL's local memory; less where the
# device has less)
BAND_FLOATS = 16384


def band_rows(dev, shape, out_hw, k, s):
    """Output rows per band of max_pool_fwd_band (0: not even one fits)."""
    wp = (out_hw[1] - 1) * s[1] + k[1]
    room = min(BAND_FLOATS, getattr(dev, "local_mem", 1 << 19) // 8) - (8 * s[1] + k[1])
    rows_in = room // wp
    return 0 if rows_in < k[0] else min(out_hw[0], (rows_in - k[0]) // s[0] + 1)


def _band_launch(dev, kernel, shape, out_hw, k, s, p, x, y):
    """The launch of pooling.cl ``kernel`` (max_pool_fwd_band or
    ave_pool_fwd_band) where it applies -- CPU drivers, windows of at most
    25 taps, a band of at least one output row fitting, setting
    CPU_POOL_BANDS -- else None."""
    n, c, h, w = shape
    band = band_rows(dev, shape, out_hw, k, s)
    if not (dev.is_cpu and k[0] * k[1] <= 25 and band > 0 and config.get("CPU_POOL_BANDS")):
        return None
    planes = n * c
    per_plane = max(h * w + out_hw[0] * out_hw[1], 1)
    g = cpu_chunks(dev, planes, min_chunk=max(1, 8192 // per_plane))
    bf = min(BAND_FLOATS, getattr(dev, "local_mem", 1 << 19) // 8)
    return dev.launch(SRC, kernel, (g,), (1,),
                      [planes, h, w, out_hw[0], out_hw[1], p[0], p[1], band, x, y],
                      dict(FKH=k[0], FKW=k[1], PB_SH=s[0], FSW=s[1], POOL_BAND_FLOATS=bf))


def max_forward(dev, shape, out_hw, k, s, p, x, y, mask=None):
    """y = max over each window (Caffe's MAX pooling); ``mask``: also its
    argmax. CPU drivers without a mask (inference) and windows of at most
    25 taps: bands of -FLT_MAX-padded rows (pooling.cl max_pool_fwd_band,
    setting CPU_POOL_BANDS)."""
    n, c, h, w = shape
    band = _band_launch(dev, "max_pool_fwd_band", shape, out_hw, k, s, p, x, y) \
        if mask is None else None
    if band is not None:
        return band
    return _launch(dev, "max_pool_fwd", shape, out_hw, n * c * out_hw[0] * out_hw[1],
                   _geom(n, c, h, w, *out_hw, *k, *s, *p),
                   [x, y, mask if mask is not None else y, int(mask is not None)])


# Global average pooling on GPUs: one work-group per plane
# (pooling.cl ave_pool_global_fwd), 256 work-items from planes of
# GLOBAL_WIDE_PLANE values up, else 64 (a 7 x 7 plane is 49 values).
GLOBAL_WIDE_PLANE = 2048


def is_global(shape, out_hw, k, p):
    """The one window covers each whole plane, no padding."""
    _, _, h, w = shape
    return tuple(out_hw) == (1, 1) and tuple(k) == (h, w) and tuple(p) == (0, 0)


def ave_forward(dev, shape, out_hw, k, s, p, x, y, impl=None):
    """impl: None (by device), "global" (the GPU global-pooling kernel; tests
    run it on CPU drivers), "band" (CPU drivers, windows of at most 25 taps:
    bands of zero-padded rows, pooling.cl ave_pool_fwd_band, setting
    CPU_POOL_BANDS; by default where they apply, but for global pooling,
    which the plane kernel sums by vectors) or "window"."""
    n, c, h, w = shape
    if impl is None:
        whole = is_global(shape, out_hw, k, p)
        impl = ("window" if whole else "band") if dev.is_cpu else ("global" if whole else "window")
    if impl == "global":
        local = 256 if h * w >= GLOBAL_WIDE_PLANE else 64
        return dev.launch(SRC, "ave_pool_global_fwd", (n * c * local,), (local,),
                          [h * w, x, y], dict(GP_LOCAL=local))
    if impl == "band":
        band = _band_launch(dev, "ave_pool_fwd_band", shape, out_hw, k, s, p, x, y)
        if band is not None:
            return band
    return _launch(dev, "ave_pool_fwd", shape, out_hw, n * c * out_hw[0] * out_hw[1],
                   _geom(n, c, h, w, *out_hw, *k, *s, *p), [x, y])


def stochastic_test_forward(dev, shape, out_hw, k, s, x, y):
    n, c, h, w = shape
    return _launch(dev, "sto_pool_test_fwd", shape, out_hw, n * c * out_hw[0] * out_hw[1],
                   _geom(n, c, h, w, *out_hw, *k, *s, 0, 0), [x, y])


# max_pool_bwd_grid: work-groups of 32 x 8 (w, h); the third grid
# dimension (n*c) stays within what every driver accepts.
GRID_LOCAL = (32, 8, 1)
GRID_MAX_PLANES = 65535


def tiles_input(shape, out_hw, k, s, p):
    """Windows that tile the input: kernel == stride, no padding, and every
    input inside a window (VGG's 2 x 2 / 2)."""
    _, _, h, w = shape
    return (tuple(k) == tuple(s) and tuple(p) == (0, 0)
            and out_hw[0] * s[0] >= h and out_hw[1] * s[1] >= w)


# GPUs: the scatter form (max_pool_bwd_tiles) where windows tile the input
# (setting POOL_BWD_TILES); strides >= 2 otherwise: 2 x 2 blocks of inputs
# per work-item (max_pool_bwd_blocks, setting POOL_BWD_BLOCKS)


def max_backward(dev, shape, out_hw, k, s, p, dy, mask, dx, impl=None, gate=None):
    """impl: None (by device), "cpu" (planes per work-item), "gpu" (the 3-D
    grid kernel; tests run it on PoCL), "tiles" (its scatter form, windows
    that tile the input), "blocks" (its 2 x 2-input blocks, strides >= 2)
    or "flat" (the 1-D gather form).
    gate: (top, slope): also the backward of an in-place ReLU before the
    pooling (negative_slope ``slope``), ``top`` the pooling's output
    (kernels/pooling.cl GATE)."""
    n, c, h, w = shape
    if impl is None:
        impl = "cpu" if dev.is_cpu else ("gpu" if n * c <= GRID_MAX_PLANES else "flat")
        if impl == "gpu" and config.get("POOL_BWD_TILES") and tiles_input(shape, out_hw, k, s, p):
            impl = "tiles"
        elif impl == "gpu" and config.get("POOL_BWD_BLOCKS") and min(s) >= 2:
            impl = "blocks"
    top, slope = gate if gate is not None else (dy, 0.0)
    defines = dict(GATE=1) if gate is not None else {}
    if impl in ("gpu", "tiles", "blocks"):
        lx, ly, _ = GRID_LOCAL
        gx, gy = {"tiles": (out_hw[1], out_hw[0]), "blocks": (-(-w // 2), -(-h // 2))}.get(
            impl, (w, h))
        gs = (-(-gx // lx) * lx, -(-gy // ly) * ly, n * c)
        defines.update(FKH=k[0], FKW=k[1], FSH=s[0], FSW=s[1], FPH=p[0], FPW=p[1])
        name = {"tiles": "max_pool_bwd_tiles", "blocks": "max_pool_bwd_blocks"}.get(
            impl, "max_pool_bwd_grid")
        return dev.launch(SRC, name, gs, GRID_LOCAL,
                          [h, w, out_hw[0], out_hw[1], dy, mask, dx, top, float(slope)],
                          defines)
    return _launch(dev, "max_pool_bwd", shape, out_hw, n * c * h * w,
                   _geom(n, c, h, w, *out_hw, *k, *s, *p), [dy, mask, dx, top, float(slope)],
                   planes=impl == "cpu", defines=defines)


def ave_backward(dev, shape, out_hw, k, s, p, dy, dx):
    n, c, h, w = shape
    return _launch(dev, "ave_pool_bwd", shape, out_hw, n * c * h * w,
                   _geom(n, c, h, w, *out_hw, *k, *s, *p), [dy, dx])
