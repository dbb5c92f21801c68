"""Shape/data-movement primitives (kernels/shape.cl): Concat/Slice pieces
(``multi_copy``), Eltwise PROD/MAX, Tile, Crop, ArgMax, row gathers, Embed."""
from ..errors import DeviceError
from . import cpu_units_work_size, rows_2d, work_size

SRC = "shape.cl"


def _launch(dev, n, name, args):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args)


# pieces one multi_copy launch takes (the kernel's p0..p7)
MULTI_COPY_MAX = 8


def multi_copy(dev, rows, y, offy, ldy, pieces, gather):
    """Launches copying ``pieces`` [(buffer, cols, off, dcol)] -- each a
    ``rows`` x ``cols`` block stored densely at ``buffer`` + ``off`` -- to
    (``gather``) or from columns ``dcol`` .. ``dcol + cols`` of the
    strided block ``y`` (row r at ``offy + r * ldy``): Concat forward /
    Slice backward gather, Concat backward / Slice forward scatter. One
    launch per MULTI_COPY_MAX pieces; empty pieces need none."""
    pieces = [p for p in pieces if p[1] > 0]
    if rows <= 0 or not pieces:
        return []
    out = []
    for i in range(0, len(pieces), MULTI_COPY_MAX):
        chunk = pieces[i:i + MULTI_COPY_MAX]
        total = sum(int(c) for _, c, _, _ in chunk)
        if rows * total >= 2**31:
            raise DeviceError(f"multi_copy: {rows} x {total} elements in one launch, "
                              "more than its int indices address")
        args = [int(rows), y, int(offy), int(ldy), int(bool(gather))]
        for k in range(MULTI_COPY_MAX):
            buf, c, o, d = chunk[k] if k < len(chunk) else (y, 0, 0, 0)
            args += [buf, int(c), int(o), int(d)]
        out.append(_launch(dev, rows * total, "multi_copy", args))
    return out


def gather_axis_rows(dev, outer, cout, cin, inner, idx, x, y, per_float=None):
    """y[o][c][k] = x[o][idx[c]][k] for an int buffer ``idx`` of ``cout``
    indices below ``cin``, rows of ``inner`` floats (kernels/shape.cl): a
    float per work-item on GPUs, a row per work-item elsewhere
    (``per_float`` forces either: tests)."""
    rows = outer * cout
    if dev.is_gpu if per_float is None else per_float:
        g, l = rows_2d(inner, rows)
        return dev.launch(SRC, "gather_axis_rows", g, l,
                          [rows, inner, cout, cin, idx, x, y], {"GATHER_2D": 1})
    g, l = cpu_units_work_size(dev, rows, rows * inner)
    return dev.launch(SRC, "gather_axis_rows", g, l, [rows, inner, cout, cin, idx, x, y])


def mul(dev, n, a, b, y):
    """y = a * b (y may alias a or b)."""
    return _launch(dev, n, "eltwise_mul", [n, a, b, y])


def div_mul(dev, n, top, b, dy, dx):
    """dx = top / b * dy."""
    return _launch(dev, n, "eltwise_div_mul", [n, top, b, dy, dx])


def eltwise_max(dev, n, a, b, y, mask, bidx):
    """bidx == 1: y, mask from bottoms a, b; bidx >= 2: fold bottom b into y (a unused)."""
    return _launch(dev, n, "eltwise_max", [n, a, b, y, mask, int(bidx)])


def eltwise_max_backward(dev, n, dy, mask, dx, bidx):
    return _launch(dev, n, "eltwise_max_bwd", [n, dy, mask, dx, int(bidx)])


def tile(dev, outer, tiles, inner, x, y):
    return _launch(dev, outer * tiles * inner, "tile_fwd_runs" if dev.is_cpu else "tile_fwd",
                   [outer, tiles, inner, x, y])


def tile_backward(dev, outer, tiles, inner, dy, dx):
    return _launch(dev, outer * inner, "tile_bwd", [outer, tiles, inner, dy, dx])


def crop_copy(dev, n, ndim, geom, src, dst, forward=True, row=None):
    """Copy the region described by ``geom`` (int buffer: top shape, bottom
    strides, offsets; ndim each) from src to dst (forward) or back. ``row``:
    the top's last axis, where CPU drivers copy row by row (crop_rows)."""
    if dev.is_cpu and row and ndim >= 1 and n:
        rows = n // row
        g, l = cpu_units_work_size(dev, rows, n)
        return dev.launch(SRC, "crop_rows", g, l, [rows, ndim, geom, src, dst, int(bool(forward))])
    return _launch(dev, n, "crop_copy", [n, ndim, geom, src, dst, int(bool(forward))])


def argmax(dev, num, dim, axis_dist, top_k, mode, x, y):
    """mode 0: indices, 1: values (axis given), 2: [index, value] pairs (no axis)."""
    return _launch(dev, num, "argmax", [num, dim, axis_dist, top_k, mode, x, y])


def gather_rows(dev, rows, dim, idx, x, y):
    """y[r] = x[idx[r]] (rows of length dim); rows can be rebound with set_arg(0, r)."""
    return _launch(dev, rows * dim, "gather_rows", [rows, dim, idx, x, y])


def gather_channels(dev, outer, channels, spatial, perm, x, y):
    """y[o, c, s] = x[o, perm[c], s] (``perm``: an int buffer of
    ``channels`` source channels; y must not alias x)."""
    n = outer * channels * spatial
    g, l = work_size(dev, n)
    kernel = "gather_channels_runs" if dev.is_cpu else "gather_channels"
    return dev.launch(SRC, kernel, g, l, [n, channels, spatial, perm, x, y])


GATHER_SOURCES_MAX = 4      # sources (and destinations) gather_channels_multi takes


def gather_channels_multi(dev, outer, rows, spatial, table, sources, dests):
    """Row c (of ``rows`` per image, ``spatial`` values each) of image o:
    source t's channel ch stored as destination u's channel dch, for (t,
    ch, u, dch) = ``table``[4c .. 4c + 4) (an int buffer of 4 * ``rows``
    entries). ``sources`` and ``dests``: 1 to GATHER_SOURCES_MAX (buffer,
    channels per image) pairs; no destination may alias a source."""
    for what, bufs in (("sources", sources), ("destinations", dests)):
        if not 1 <= len(bufs) <= GATHER_SOURCES_MAX:
            raise ValueError(f"gather_channels_multi: {len(bufs)} {what}")
    n = outer * rows * spatial
    g, l = work_size(dev, n)
    args = [n, rows, spatial, table]
    for bufs in (sources, dests):
        for buf, c in list(bufs) + [bufs[0]] * (GATHER_SOURCES_MAX - len(bufs)):
            args += [buf, c]
    kernel = "gather_channels_multi_runs" if dev.is_cpu else "gather_channels_multi"
    return dev.launch(SRC, kernel, g, l, args)


def scatter_rows(dev, rows, dim, idx, dy, dx):
    """dx[idx[r]] = dy[r] (idx unique)."""
    return _launch(dev, rows * dim, "scatter_rows", [rows, dim, idx, dy, dx])


def gather_sum_rows(dev, rows, dim, begin, count, top_idx, dy, dx):
    """dx[r] = sum of dy[top_idx[begin[r] + j]] for j < count[r]."""
    return _launch(dev, rows * dim, "gather_sum_rows",
                   [rows, dim, begin, count, top_idx, dy, dx])


def embed(dev, M, N, K, x, w, bias, y):
    return _launch(dev, M * N, "embed_fwd",
                   [M, N, K, x, w, w if bias is None else bias, y, int(bias is not None)])


def embed_weight_grad(dev, M, N, K, x, dy, dw):
    return _launch(dev, N, "embed_wgrad", [M, N, K, x, dy, dw])
