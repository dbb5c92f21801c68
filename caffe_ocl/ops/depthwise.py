"""Direct depthwise convolution (kernels/depthwise.cl): groups == channels
== out_channels, each output channel reads only its own input channel.

Dispatched from ops.conv (``algo="depthwise"``, the automatic choice for
such geometries on every device), so layers and fusion get it through
ops.conv.forward / backward_data / backward_weight. Takes a
``ops.conv.ConvGeometry``; no column workspace.
"""
from . import cpu_chunks, work_size
from .channel import split_chunks
from .gemm import act_defines

SRC = "depthwise.cl"
# work-group size of the GPU backward-weight reduction (power of two)
WG = 256
# kernels/depthwise.cl dw_forward_band: most __local floats per band of
# padded input rows (DW_BAND_FLOATS there; 64 KiB, an eighth of PoCL's
# local memory, less where the device has less)
BAND_FLOATS = 16384
# CPU backward-data (and Deconvolution forward) of undilated layers
# gathered row by row in float8 runs (kernels/depthwise.cl
# dw_bwd_data_rows) instead of scattered tap by tap (dw_bwd_data_plane):
# BENCHMARKS.md, forty-first session
BWD_DATA_ROWS = True
# Backward-data (and Deconvolution forward) of layers whose kernel equals
# their stride, pad 0, undilated (onnx2caffe's nearest Resize, learned k x k
# stride-k upsampling): each dx pixel takes one tap, written row by row in
# float8 runs on CPU drivers (kernels/depthwise.cl dw_bwd_data_tile_rows),
# one element a work-item on GPUs (dw_bwd_data_tile); off: the general
# kernels above. BENCHMARKS.md, forty-second session
BWD_DATA_TILE = True
# ... and of strides 4 or a multiple of 8 whose kernel width is a multiple
# of the stride (bilinear x4 / x8 / x16 / x32 upsamplings): 8 consecutive
# phases of one dy column a float8 (depthwise.cl dw_bwd_row_phases);
# off: phase by phase. BENCHMARKS.md, forty-second session
BWD_DATA_PHASE_RUNS = True


def eligible(g):
    """True for a depthwise geometry this module handles (not 1x1)."""
    return (g.groups == g.channels == g.out_channels
            and not (g.kh == 1 and g.kw == 1))


# Largest kernel side built with its geometry as -D macros (tap loops
# unrolled at compile time); larger kernels use one program with the
# geometry passed as arguments (DW_RUNTIME in kernels/depthwise.cl). The
# unrolled 32 x 32 program took PoCL 5 minutes to build (HED's upsampling
# Deconvolutions), 16 x 16 half a minute.
SPECIALISE_MAX = 7


def specialised(g):
    """Whether ``g``'s programs are built with its geometry compiled in."""
    return g.kh <= SPECIALISE_MAX and g.kw <= SPECIALISE_MAX


def _defines(dev, g, **extra):
    """-D macros of ``g``'s programs. Large kernels: every pass shares one
    program (the macros a forward, backward-data or backward-weight launch
    would set all given, at their defaults where that pass does not care)."""
    if specialised(g):
        d = dict(KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw, PH=g.ph, PW=g.pw, DH=g.dh, DW=g.dw)
    else:
        d = dict(DW_RUNTIME=1, BIAS=0, ACT=0, DW_BAND_FLOATS=band_floats(dev), WG=WG)
    if not BWD_DATA_PHASE_RUNS:
        d["DW_PHASE_RUNS"] = 0
    d.update(extra)
    return d


def _geo(g):
    """The g_* geometry arguments every kernel takes (read only by DW_RUNTIME
    programs)."""
    return [g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw]


def _sizes(g):
    return [g.channels, g.height, g.width, g.out_h, g.out_w] + _geo(g)


def tiles(g):
    """Whether every dx pixel of ``g``'s backward-data takes exactly one tap
    (kernel == stride, no padding, no dilation): dw_bwd_data_tile*."""
    return ((g.kh, g.kw) == (g.sh, g.sw) and (g.ph, g.pw) == (0, 0)
            and (g.dh, g.dw) == (1, 1))


def _impl(dev, impl):
    if impl is None:
        impl = "cpu" if dev.is_cpu else "gpu"
    if impl not in ("cpu", "gpu"):
        raise ValueError(f"depthwise impl {impl!r}: expected 'cpu' or 'gpu'")
    return impl


def _plane_size(dev, g):
    """(global, local) of the CPU plane kernels: runs of (image, channel) planes."""
    n = cpu_chunks(dev, g.num * g.channels, min_chunk=1)
    return (n,), (1,)


def band_floats(dev):
    """__local floats of dw_forward_band's band on ``dev``."""
    return min(BAND_FLOATS, getattr(dev, "local_mem", 1 << 19) // 8)


def band_rows(dev, g):
    """Output rows per band of dw_forward_band: as many as fit their padded
    input rows (and the vector loads' slack) in band_floats; 0 when not
    even one does (rows wider than ~5000 on PoCL)."""
    wp = g.width + 2 * g.pw
    if g.sw == 2:       # rows de-interleaved in two equal halves (DW_DEINT)
        wp += wp % 2
    room = band_floats(dev) - (8 * g.sw + (g.kw - 1) * g.dw)
    rows_in = room // wp - (g.kh - 1) * g.dh - 1
    return 0 if rows_in < 0 else min(g.out_h, rows_in // g.sh + 1)


# kernels/depthwise.cl dw_forward_flat: most floats of a plane (FLAT_MAX)
# and of a plane with its zero rows around it (FLAT_BUF)
FLAT_MAX, FLAT_BUF = 256, 768


def flat_fits(g):
    """Whether dw_forward_flat takes ``g``: stride 1, output the input's size,
    planes of 8 .. FLAT_MAX floats that fit FLAT_BUF with their padding."""
    hw = g.height * g.width
    return ((g.sh, g.sw) == (1, 1) and (g.out_h, g.out_w) == (g.height, g.width)
            and 8 <= hw <= FLAT_MAX and hw + 2 * (g.ph * g.width + g.pw) <= FLAT_BUF)


def forward(dev, g, x, weight, y, bias=None, act=None, impl=None):
    """y = act(depthwise(x, weight) (+ bias)); ``act`` as ops.gemm.gemm.
    ``impl``: "gpu" (one work-item per output element), "cpu" (whole planes
    per work-item, bands of zero-padded rows; the element kernel where not
    one row fits a band); None: by device."""
    act_kind, act_a, act_b = act_defines(act)
    defs = _defines(dev, g, BIAS=int(bias is not None), ACT=act_kind)
    tail = [x, weight, bias if bias is not None else weight, y, act_a, act_b]
    rows = band_rows(dev, g)
    if _impl(dev, impl) == "cpu" and flat_fits(g):
        gs, ls = _plane_size(dev, g)
        return [dev.launch(SRC, "dw_forward_flat", gs, ls,
                           [g.num * g.channels] + _sizes(g) + tail, defs)]
    if _impl(dev, impl) == "cpu" and rows > 0:
        gs, ls = _plane_size(dev, g)
        return [dev.launch(SRC, "dw_forward_band", gs, ls,
                           [g.num * g.channels] + _sizes(g) + [rows] + tail,
                           dict(defs, DW_BAND_FLOATS=band_floats(dev)))]
    total = g.num * g.channels * g.out_spatial
    gs, ls = work_size(dev, total)
    return [dev.launch(SRC, "dw_forward", gs, ls, [total] + _sizes(g) + tail, defs)]


def backward_data(dev, g, dy, weight, dx, accumulate=False, impl=None):
    """dx = depthwise^T(dy) (+ dx if accumulate): gathered per input element
    ("gpu") or plane by plane ("cpu": gathered row by row, scattered tap by
    tap when dilated); None: by device. Kernel == stride, pad 0, undilated
    (``tiles``): one tap a dx pixel, dw_bwd_data_tile*."""
    tail = [dy, weight, dx, int(bool(accumulate))]
    tile = BWD_DATA_TILE and tiles(g)
    if _impl(dev, impl) == "cpu":
        gs, ls = _plane_size(dev, g)
        if tile:
            kernel = "dw_bwd_data_tile_rows"
        elif BWD_DATA_ROWS and (g.dh, g.dw) == (1, 1):
            kernel = "dw_bwd_data_rows"
        else:
            kernel = "dw_bwd_data_plane"
        return [dev.launch(SRC, kernel, gs, ls,
                           [g.num * g.channels] + _sizes(g) + tail, _defines(dev, g))]
    total = g.num * g.channels * g.height * g.width
    gs, ls = work_size(dev, total)
    return [dev.launch(SRC, "dw_bwd_data_tile" if tile else "dw_bwd_data", gs, ls,
                       [total] + _sizes(g) + tail, _defines(dev, g))]


def backward_weight(dev, g, x, dy, dweight, impl=None):
    """dweight += sum over images and output positions (Caffe's accumulating
    param gradient), reduced inside the kernel. ``impl``: "gpu" (one
    work-group per channel, local-memory tree reduction) or "cpu"
    (contiguous chunks of channels per work-item); None: by device."""
    impl = _impl(dev, impl)
    args = [g.num] + _sizes(g) + [x, dy, dweight]
    if impl == "cpu":
        n = cpu_chunks(dev, g.channels, min_chunk=1)
        return [dev.launch(SRC, "dw_bwd_weight_serial", (n,), (1,), args, _defines(dev, g))]
    taps = g.kh * g.kw
    chunks = split_chunks(dev, g.channels, g.num * g.out_spatial, WG)
    part = dev.alloc(4 * g.channels * chunks * taps)
    groups = min(g.channels * chunks, 65536)
    gs, ls = work_size(dev, g.channels * taps)
    return [dev.launch(SRC, "dw_bwd_weight", (groups * WG,), (WG,),
                       [g.num] + _sizes(g) + [chunks, x, dy, part], _defines(dev, g, WG=WG)),
            dev.launch(SRC, "dw_bwd_weight_sum", gs, ls,
                       [g.channels] + _geo(g) + [chunks, part, dweight], _defines(dev, g))]
