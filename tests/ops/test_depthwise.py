"""Direct depthwise convolution (ops/depthwise.py, kernels/depthwise.cl),
reached through ops.conv (algo=None picks it for groups == channels ==
out_channels): forward with bias and the relu / clip epilogues,
backward-data (overwrite and accumulate), backward-weight (accumulating,
both the CPU and the GPU reduction kernels) against float64 NumPy, over
edge shapes; and a Convolution layer gradient check."""
import numpy as np
import pytest

from caffe_ocl import testing
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import depthwise as dw_ops
from refs import conv2d, deconv2d, rel_err as _rel

# (n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw)
GEOMS = [
    (2, 3, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1),      # odd sizes, pad 1
    (1, 4, 9, 8, 3, 3, 1, 1, 2, 2, 1, 1),      # batch 1, stride 2
    (2, 2, 7, 9, 3, 3, 0, 0, 1, 1, 1, 1),      # pad 0, non-square
    (2, 3, 9, 9, 3, 3, 2, 2, 1, 1, 2, 2),      # dilation 2
    (1, 5, 8, 7, 5, 5, 2, 2, 2, 2, 1, 1),      # kernel 5, stride 2
    (2, 3, 6, 8, 3, 5, 1, 0, 2, 1, 1, 1),      # non-square kernel, mixed stride/pad
    (3, 1, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1),      # one channel
    # kernels larger than dw_ops.SPECIALISE_MAX: geometry passed at run time
    (1, 2, 10, 9, 8, 8, 2, 2, 4, 4, 1, 1),     # kernel 8, stride 4 (upsampling-like)
    (2, 2, 9, 10, 9, 3, 4, 1, 1, 1, 1, 1),     # 9 x 3, stride 1, same size (flat path)
    (1, 2, 14, 13, 8, 9, 3, 2, 2, 3, 2, 1),    # dilation 2, mixed strides
]


def _geom(p):
    n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw = p
    return conv_ops.ConvGeometry(n, c, h, w, c, kh, kw, ph, pw, sh, sw, dh, dw, c)




def _case(g, rng):
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.channels, 1, g.kh, g.kw))
    b = rng.standard_normal(g.channels)
    dy = rng.standard_normal((g.num, g.channels, g.out_h, g.out_w))
    return x, w, b, dy


def _kw(g):
    return dict(pad=(g.ph, g.pw), stride=(g.sh, g.sw), dil=(g.dh, g.dw), group=g.groups)


def _check_cpu_forward(d, rng, g):
    """The CPU forward of ``g`` (bias, clip epilogue) against conv2d."""
    x, w, b, _ = _case(g, rng)
    yshape = (g.num, g.channels, g.out_h, g.out_w)
    ref = np.clip(conv2d(x, w, **_kw(g)) + b.reshape(1, -1, 1, 1), -0.5, 0.7)
    yb = d.buf(np.full(yshape, np.nan))
    d.run(dw_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, bias=d.buf(b),
                         act=("clip", -0.5, 0.7), impl="cpu"))
    assert _rel(d.get(yb, yshape), ref) < 1e-5


def _two_row_bands(monkeypatch, g):
    """A band budget of two output rows' padded input rows (and the slack)."""
    row = g.width + 2 * g.pw + (g.width % 2 if g.sw == 2 else 0)
    rows_in = (g.kh - 1) * g.dh + 1 + g.sh
    monkeypatch.setattr(dw_ops, "BAND_FLOATS", rows_in * row + 8 * g.sw + (g.kw - 1) * g.dw)


def _ref_grads(g, x, w, dy):
    """dW and dx of sum(y * dy) by the adjoint identities of conv2d: each is
    linear, so probe it with unit vectors (tiny shapes)."""
    dw = np.zeros(w.shape)
    for idx in np.ndindex(w.shape):
        e = np.zeros(w.shape)
        e[idx] = 1.0
        dw[idx] = np.sum(conv2d(x, e, **_kw(g)) * dy)
    dx = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        e = np.zeros(x.shape)
        e[idx] = 1.0
        dx[idx] = np.sum(conv2d(e, w, **_kw(g)) * dy)
    return dw, dx


def test_large_kernels_share_one_runtime_program():
    """Kernels up to SPECIALISE_MAX are compiled with their geometry; larger
    ones share one program with the geometry as arguments (a 32 x 32 kernel
    unrolled in every kernel took PoCL minutes to build)."""
    small, big, bigger = (_geom(GEOMS[4]), _geom(GEOMS[7]), _geom(GEOMS[9]))
    assert dw_ops.specialised(small)
    assert not dw_ops.specialised(big) and not dw_ops.specialised(bigger)


def test_dispatch_picks_depthwise(d):
    g = _geom(GEOMS[0])
    assert conv_ops.algorithm(d.dev, g) == "depthwise"
    assert conv_ops.workspace_floats(d.dev, g) == 0
    # an explicit choice is kept; not eligible: grouped but not depthwise, 1x1
    assert conv_ops.algorithm(d.dev, g, "im2col") == "im2col"
    dense = conv_ops.ConvGeometry(1, 4, 5, 5, 8, 3, 3, groups=4)
    one = conv_ops.ConvGeometry(1, 4, 5, 5, 4, 1, 1, groups=4)
    for h in (dense, one):
        assert conv_ops.algorithm(d.dev, h) != "depthwise"
        assert conv_ops.algorithm(d.dev, h, "depthwise") != "depthwise"


# each geometry is its own program (macros), 12-25 s to build on PoCL: the
# default run (CI) covers pad/stride/kernel-5/one-channel cases, the rest
# (pad 0, dilation, mixed stride) run with `-m slow` and on the GPU machine
_SLOW_GEOMS = (2, 3, 5)
GEOM_CASES = [pytest.param(p, id=str(i), marks=[pytest.mark.slow] if i in _SLOW_GEOMS else [])
              for i, p in enumerate(GEOMS)]


@pytest.mark.parametrize("impl", [None, "gpu"], ids=["dispatch", "element-kernels"])
@pytest.mark.parametrize("p", GEOM_CASES)
def test_depthwise_matches_reference(d, rng, p, impl):
    """impl None: through ops.conv (on the CPU test device: the plane
    kernels); "gpu": the one-element-per-work-item kernels of GPUs."""
    g = _geom(p)

    def fwd(*a, **kw):
        if impl is None:
            return conv_ops.forward(d.dev, g, *a[:3], None, **kw)
        return dw_ops.forward(d.dev, g, *a[:3], impl=impl, **kw)

    def bwd_data(*a, **kw):
        if impl is None:
            return conv_ops.backward_data(d.dev, g, *a, None, **kw)
        return dw_ops.backward_data(d.dev, g, *a, impl=impl, **kw)
    x, w, b, dy = _case(g, rng)
    yshape = dy.shape
    y_ref = conv2d(x, w, **_kw(g))
    xb, wb, bb, dyb = d.buf(x), d.buf(w), d.buf(b), d.buf(dy)

    # forward: plain, bias, bias + leaky relu, bias + clip (poisoned output)
    for bias, act in [(None, None), (bb, None), (bb, ("relu", 0.1)), (bb, ("clip", -0.5, 0.7))]:
        yb = d.buf(np.full(yshape, np.nan))
        d.run(fwd(xb, wb, yb, bias=bias, act=act))
        v = y_ref + (b.reshape(1, -1, 1, 1) if bias is not None else 0.0)
        if act is not None and act[0] == "relu":
            v = np.where(v > 0, v, 0.1 * v)
        elif act is not None:
            v = np.clip(v, -0.5, 0.7)
        assert _rel(d.get(yb, yshape), v) < 1e-5, (bias is not None, act)

    dw_ref, dx_ref = _ref_grads(g, x, w, dy)
    # backward-data overwrites (poisoned), or accumulates when asked
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(bwd_data(dyb, wb, dxb))
    assert _rel(d.get(dxb, x.shape), dx_ref) < 1e-5
    dx0 = rng.standard_normal(x.shape)
    dxb = d.buf(dx0)
    d.run(bwd_data(dyb, wb, dxb, accumulate=True))
    assert _rel(d.get(dxb, x.shape), dx0 + dx_ref) < 1e-5

    if impl is not None:
        return
    # backward-weight accumulates, by dispatch and by both reductions
    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    d.run(conv_ops.backward_weight(d.dev, g, xb, dyb, dwb, None))
    assert _rel(d.get(dwb, w.shape), dw0 + dw_ref) < 1e-5
    for impl in ("cpu", "gpu"):
        dwb = d.buf(dw0)
        launches = dw_ops.backward_weight(d.dev, g, xb, dyb, dwb, impl=impl)
        d.run(launches)
        d.run(launches)       # twice: accumulates twice
        assert _rel(d.get(dwb, w.shape), dw0 + 2 * dw_ref) < 1e-5, impl


def test_depthwise_convolution_layer_gradient(rng):
    proto = """
    name: "dw" type: "Convolution" bottom: "x" top: "y"
    convolution_param { num_output: 3 group: 3 kernel_size: 3 pad: 1 stride: 2
      weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 } }
    """
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    layer, bottoms, tops = testing.make_layer(proto, [x])
    assert layer.geom.groups == 3 and conv_ops.algorithm(layer.device, layer.geom) == "depthwise"
    y = testing.forward(layer, bottoms, tops)[0]
    w = layer.blobs[0].data.astype(np.float64)
    b = layer.blobs[1].data.astype(np.float64)
    ref = conv2d(x, w, b, pad=(1, 1), stride=(2, 2), group=3)
    assert _rel(y, ref) < 1e-5
    testing.check_gradient(layer, bottoms, tops)


def test_backward_weight_split_over_work_groups(d, rng):
    """Few channels, many output positions: the GPU reduction cuts each
    channel into several work-groups' chunks (padding and stride 2 too);
    against a float64 tap-by-tap reference."""
    from caffe_ocl.ops.channel import split_chunks
    g = conv_ops.ConvGeometry(3, 2, 100, 45, 2, 3, 3, 1, 1, 1, 2, 1, 1, 2)
    assert split_chunks(d.dev, g.channels, g.num * g.out_spatial, dw_ops.WG) > 1
    x, w, _, dy = _case(g, rng)
    xp = np.pad(x, ((0, 0), (0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    ref = np.zeros(w.shape)
    for kh in range(g.kh):
        for kw in range(g.kw):
            win = xp[:, :, kh:kh + g.sh * (g.out_h - 1) + 1:g.sh,
                     kw:kw + g.sw * (g.out_w - 1) + 1:g.sw]
            ref[:, 0, kh, kw] = (win * dy).sum(axis=(0, 2, 3))
    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    d.run(dw_ops.backward_weight(d.dev, g, d.buf(x), d.buf(dy), dwb, impl="gpu"))
    assert _rel(d.get(dwb, w.shape), dw0 + ref) < 1e-5


# CPU forward: rows wide enough for the float8 runs of dw_forward_band
# (stride 1: unaligned loads; 2: even lanes; 3: gathered), with edges, a
# tail after the last run, and (stride 3, pad 3 > kernel reach) output
# rows and columns that read only padding.
# s1-wide: rows of 61 outputs take the 32-, 16- and 8-output steps and the
# overlapping tail.
CPU_VECTOR_GEOMS = [
    (2, 3, 5, 29, 3, 3, 1, 1, 1, 1, 1, 1),
    (1, 2, 6, 37, 3, 3, 1, 1, 2, 2, 1, 1),
    (1, 2, 7, 52, 3, 3, 3, 3, 3, 3, 1, 1),
    (1, 2, 5, 61, 3, 3, 1, 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("band_floats", [None, 200, 20], ids=["one-band", "bands", "no-band"])
@pytest.mark.parametrize("p", CPU_VECTOR_GEOMS, ids=["s1", "s2", "s3pad3", "s1-wide"])
def test_cpu_forward_vector_runs(d, rng, monkeypatch, p, band_floats):
    """band_floats: a smaller host budget cuts planes into several bands of
    rows, or (too small for one row) falls back to the element kernel."""
    if band_floats is not None:
        monkeypatch.setattr(dw_ops, "BAND_FLOATS", band_floats)
    g = _geom(p)
    rows = dw_ops.band_rows(d.dev, g)
    assert (rows == g.out_h, 0 < rows < g.out_h, rows == 0)[[None, 200, 20].index(band_floats)]
    x, w, b, _ = _case(g, rng)
    yshape = (g.num, g.channels, g.out_h, g.out_w)
    assert g.out_w >= 16
    ref = np.clip(conv2d(x, w, **_kw(g)) + b.reshape(1, -1, 1, 1), -0.5, 0.7)
    yb = d.buf(np.full(yshape, np.nan))
    d.run(dw_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, bias=d.buf(b),
                         act=("clip", -0.5, 0.7), impl="cpu"))
    assert _rel(d.get(yb, yshape), ref) < 1e-5


@pytest.mark.parametrize("p", [(1, 3, 6, 77, 5, 5, 2, 2, 2, 2, 1, 1),
                               (2, 2, 4, 70, 3, 3, 2, 2, 1, 1, 2, 2)],
                         ids=["5x5-s2-wide", "dilated-wide"])
def test_cpu_forward_wide_rows(d, rng, p):
    """Output rows of 39 and 70: dw_forward_band's 32-output step (four
    chains of fmas) with a 5 x 5 stride-2 and a dilated kernel."""
    g = _geom(p)
    assert g.out_w >= 32 and dw_ops.band_rows(d.dev, g) > 0
    _check_cpu_forward(d, rng, g)


@pytest.mark.parametrize("k,stride", [(3, 1), (5, 2)], ids=["3x3-s1", "5x5-s2"])
def test_cpu_forward_every_row_width(d, rng, k, stride):
    """Output rows of 8 to 41 outputs: every combination of
    dw_forward_band's 32-, 16- and 8-output steps and its overlapping
    tail. One program per kernel: the width is an argument."""
    for wo in range(8, 42):
        g = _geom((1, 2, 3 + k, (wo - 1) * stride + 1, k, k, k // 2, k // 2, stride, stride,
                   1, 1))
        assert g.out_w == wo and dw_ops.band_rows(d.dev, g) > 0
        _check_cpu_forward(d, rng, g)


@pytest.mark.parametrize("k,stride,pad", [(2, 2, 0), (4, 2, 1), (3, 2, 1), (8, 4, 2), (3, 1, 1),
                                           (16, 8, 4), (32, 16, 8), (5, 4, 1), (8, 4, 0),
                                           (16, 8, 0), (16, 8, 12), (4, 4, 1)],
                         ids=["nearest2", "bilinear2", "k3s2", "bilinear4", "k3s1", "bilinear8",
                              "bilinear16", "k5s4", "k8s4-unpadded", "k16s8-unpadded",
                              "bilinear8-edges", "k4s4-pad1"])
def test_cpu_backward_data_rows_every_width(d, rng, monkeypatch, k, stride, pad):
    """dw_bwd_data_rows (the CPU backward-data, and so Deconvolution's
    forward, of undilated layers) at dx widths whose float8 runs end on a
    remainder of every size, overwriting (the last run moved back over
    stored outputs) and accumulating (the remainder one by one). nearest2
    (kernel == stride) with dw_bwd_data_tile_rows switched off."""
    monkeypatch.setattr(dw_ops, "BWD_DATA_TILE", False)
    # bilinear4/8/16: the float8 runs of 8 phases (dw_bwd_row_phases); k5s4:
    # stride 4 with a kernel not a multiple of it (phase by phase). Unpadded:
    # runs that end at dy's last column, not at dx's last; bilinear8-edges:
    # onnx2caffe's x8 (pad 3f/2 over an edge-repeated input); pad 1: the first
    # run starts at column 7 (one tap a column: no run reaches back past dy)
    for width in range(9, 42, 4 if stride > 1 else 3):
        g = _geom((1, 2, max(6, k + stride + 3), width, k, k, pad, pad, stride, stride, 1, 1))
        if g.out_w < 1:
            continue
        assert g.out_h >= 2
        _, w, _, _ = _case(g, rng)
        dy = rng.standard_normal((g.num, g.channels, g.out_h, g.out_w))
        dx_ref = _dx_ref(g, w, dy)
        if k <= 4 and width < 20:           # the reference against the adjoint probes
            _, probed = _ref_grads(g, rng.standard_normal((g.num, g.channels, g.height,
                                                           g.width)), w, dy)
            np.testing.assert_allclose(dx_ref, probed, atol=1e-9)
        shape = (g.num, g.channels, g.height, g.width)
        dxb = d.buf(np.full(shape, np.nan))
        wb, dyb = d.buf(w), d.buf(dy)
        launches = dw_ops.backward_data(d.dev, g, dyb, wb, dxb, impl="cpu")
        assert [ln.name for ln in launches] == ["dw_bwd_data_rows"]
        d.run(launches)
        assert _rel(d.get(dxb, shape), dx_ref) < 1e-5, width
        dx0 = rng.standard_normal(shape)
        dxb = d.buf(dx0)
        d.run(dw_ops.backward_data(d.dev, g, dyb, wb, dxb, accumulate=True, impl="cpu"))
        assert _rel(d.get(dxb, shape), dx0 + dx_ref) < 1e-5, width


def _dx_ref(g, w, dy):
    """dx = depthwise^T(dy) in float64, scattered tap by tap into a padded
    plane (undilated; fast for the 32 x 32 kernels of x16 upsamplings,
    which the unit-vector probes of _ref_grads take minutes over)."""
    hp, wp = g.height + 2 * g.ph + g.kh, g.width + 2 * g.pw + g.kw
    dxp = np.zeros((g.num, g.channels, hp + g.sh * g.out_h, wp + g.sw * g.out_w))
    for kh in range(g.kh):
        for kw in range(g.kw):
            dxp[:, :, kh:kh + g.sh * g.out_h:g.sh, kw:kw + g.sw * g.out_w:g.sw] += \
                dy * w[:, 0, kh, kw].reshape(1, -1, 1, 1)
    return dxp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width]


def _tile_ref(g, w, dy):
    """dx of a kernel == stride, pad 0 geometry in float64: each dy pixel
    times the whole kernel, tiled; rows and columns past the last tile 0."""
    dx = np.zeros((g.num, g.channels, g.height, g.width))
    P, Q = g.out_h, g.out_w
    dx[:, :, :P * g.sh, :Q * g.sw] = (np.repeat(np.repeat(dy, g.sh, 2), g.sw, 3)
                                      * np.tile(w[:, 0], (1, P, Q)))
    return dx


# (kernel_h, kernel_w) == (stride_h, stride_w): 2 x 2 (the interleaved
# float8 pair), 3 x 3 (the general column loop), 2 x 1 (whole float8 rows,
# each dy row to two dx rows), 1 x 2, 3 x 2, and 8 x 8 (the runtime-geometry
# program, kernels past SPECIALISE_MAX)
TILE_FACTORS = [(2, 2), (3, 3), (2, 1), (1, 2), (3, 2), (8, 8)]


@pytest.mark.parametrize("impl", ["cpu", "gpu"])
@pytest.mark.parametrize("f", TILE_FACTORS, ids=lambda f: f"{f[0]}x{f[1]}")
def test_backward_data_tile(d, rng, f, impl):
    """dw_bwd_data_tile_rows (CPU) and dw_bwd_data_tile (GPU): the
    backward-data, and so the Deconvolution forward, of kernel == stride,
    pad 0 (onnx2caffe's nearest Resize; learned k x k stride-k layers) with
    random weights, 2 images x 3 channels; dy widths 1 .. 21 (under 8,
    multiples of 8 and not: the float8 runs, the overwriting tail moved
    back, the accumulating tail one by one), dx sizes that are multiples of
    the stride and ones with a last row / columns no tap reaches (written 0
    over the NaN poison, or left as they are when accumulating)."""
    fh, fw = f
    kernel = "dw_bwd_data_tile_rows" if impl == "cpu" else "dw_bwd_data_tile"
    for q in (1, 3, 7, 8, 9, 13, 16, 21):
        extra_h, extra_w = q % 2 * (fh - 1), (q + q // 8) % fw     # leftovers: 0 .. f - 1
        g = _geom((2, 3, 2 * fh + extra_h, q * fw + extra_w, fh, fw, 0, 0, fh, fw, 1, 1))
        assert dw_ops.tiles(g) and (g.out_h, g.out_w) == (2, q)
        w = rng.standard_normal((g.channels, 1, fh, fw))
        dy = rng.standard_normal((g.num, g.channels, g.out_h, g.out_w))
        ref = _tile_ref(g, w, dy)
        shape = ref.shape
        wb, dyb = d.buf(w), d.buf(dy)
        dxb = d.buf(np.full(shape, np.nan))
        launches = dw_ops.backward_data(d.dev, g, dyb, wb, dxb, impl=impl)
        assert [ln.name for ln in launches] == [kernel]
        d.run(launches)
        assert _rel(d.get(dxb, shape), ref) < 1e-6, (q, g.height, g.width)
        dx0 = rng.standard_normal(shape)
        dxb = d.buf(dx0)
        d.run(dw_ops.backward_data(d.dev, g, dyb, wb, dxb, accumulate=True, impl=impl))
        assert _rel(d.get(dxb, shape), dx0 + ref) < 1e-6, (q, g.height, g.width)


def test_backward_data_tile_dispatch(d, rng, monkeypatch):
    """ops.conv's backward-data takes the tile kernel for kernel == stride,
    pad 0, undilated only; BWD_DATA_TILE off gives the general kernels. The
    reference _tile_ref is the adjoint of conv2d (checked by unit probes)."""
    g = _geom((2, 2, 5, 7, 2, 2, 0, 0, 2, 2, 1, 1))
    w = rng.standard_normal((g.channels, 1, 2, 2))
    dy = rng.standard_normal((g.num, g.channels, g.out_h, g.out_w))
    _, dx_ref = _ref_grads(g, rng.standard_normal((g.num, g.channels, g.height, g.width)), w, dy)
    assert np.abs(_tile_ref(g, w, dy) - dx_ref).max() < 1e-12
    dxb = d.buf(np.full(dx_ref.shape, np.nan))
    launches = conv_ops.backward_data(d.dev, g, d.buf(dy), d.buf(w), dxb, None)
    assert [ln.name for ln in launches] == [
        "dw_bwd_data_tile_rows" if d.dev.is_cpu else "dw_bwd_data_tile"]
    d.run(launches)
    assert _rel(d.get(dxb, dx_ref.shape), dx_ref) < 1e-6
    for p in [(1, 2, 6, 6, 2, 2, 1, 1, 2, 2, 1, 1),       # padded
              (1, 2, 6, 6, 3, 3, 0, 0, 2, 2, 1, 1),       # kernel > stride
              (1, 2, 9, 9, 2, 2, 0, 0, 2, 2, 2, 2),       # dilated
              (1, 2, 6, 6, 2, 2, 0, 0, 2, 1, 1, 1)]:      # kernel_w != stride_w
        assert not dw_ops.tiles(_geom(p)), p
    monkeypatch.setattr(dw_ops, "BWD_DATA_TILE", False)
    names = {impl: dw_ops.backward_data(d.dev, g, dxb, dxb, dxb, impl=impl)[0].name
             for impl in ("cpu", "gpu")}
    assert names == {"cpu": "dw_bwd_data_rows", "gpu": "dw_bwd_data"}


@pytest.mark.parametrize("kind,x_hw", [("Deconvolution", (3, 5)), ("Convolution", (7, 9))])
def test_tile_layers(rng, kind, x_hw):
    """Layers whose kernel equals their stride, group = channels, learned
    (random) weights: a 2 x 2 stride-2 Deconvolution (forward through
    dw_bwd_data_tile*) and a Convolution on a 7 x 9 input (its
    backward-data leaves the last row and column untouched by taps),
    against float64 NumPy and by finite differences."""
    proto = f"""
    name: "t" type: "{kind}" bottom: "x" top: "y"
    convolution_param {{ num_output: 3 group: 3 kernel_size: 2 stride: 2
      weight_filler {{ type: "gaussian" std: 0.5 }} bias_filler {{ type: "gaussian" std: 0.5 }} }}
    """
    x = rng.standard_normal((2, 3) + x_hw).astype(np.float32)
    layer, bottoms, tops = testing.make_layer(proto, [x])
    assert layer.geom.groups == 3 and dw_ops.tiles(layer.geom)
    y = testing.forward(layer, bottoms, tops)[0]
    w = layer.blobs[0].data.astype(np.float64)
    b = layer.blobs[1].data.astype(np.float64)
    ref = (deconv2d if kind == "Deconvolution" else conv2d)(x, w, b, stride=(2, 2), group=3)
    assert y.shape == ref.shape and _rel(y, ref) < 1e-5
    testing.check_gradient(layer, bottoms, tops)


# CPU forward at stride 2 along rows: dw_forward_band keeps each padded
# row de-interleaved (even columns, then odd ones) so every tap is one
# contiguous load. Cases: padding 0 / 1 / 2 (x's even columns land in
# either half), odd and even row widths and 16-float copies with a scalar
# tail, rows of fewer than 8 outputs (14 x 14 -> 7 x 7 under 5 x 5), a
# dilation of 2 (every tap in the even half), an even kernel, stride 1
# down the columns, a 9 x 9 kernel (the runtime-geometry program), and
# rows of 8-15 and under 8 floats (copied by two overlapping float8 loads,
# and one by one).
STRIDE2_GEOMS = [
    (1, 3, 9, 23, 3, 3, 0, 0, 2, 2, 1, 1),
    (2, 2, 8, 35, 3, 3, 1, 1, 2, 2, 1, 1),
    (1, 3, 14, 14, 5, 5, 2, 2, 2, 2, 1, 1),
    (1, 2, 9, 40, 3, 3, 2, 2, 2, 2, 2, 2),
    (1, 2, 11, 33, 4, 4, 1, 1, 2, 2, 1, 1),
    (1, 2, 6, 37, 3, 3, 1, 1, 1, 2, 1, 1),
    (1, 2, 20, 30, 9, 9, 4, 3, 2, 2, 1, 1),
    (1, 2, 9, 11, 3, 3, 1, 1, 2, 2, 1, 1),
    (1, 2, 7, 7, 3, 3, 1, 1, 2, 2, 1, 1),
]


@pytest.mark.parametrize("bands", [False, True], ids=["one-band", "bands"])
@pytest.mark.parametrize("p", STRIDE2_GEOMS, ids=["pad0-odd-w", "pad1", "7-outputs-k5",
                                                   "dilated", "even-kernel", "rows-only",
                                                   "k9-runtime", "width-11", "width-7"])
def test_cpu_forward_stride2_rows(d, rng, monkeypatch, p, bands):
    """bands: a host budget of two output rows' input rows a band."""
    g = _geom(p)
    if bands:
        _two_row_bands(monkeypatch, g)
    rows = dw_ops.band_rows(d.dev, g)
    assert rows == (2 if bands else g.out_h)
    _check_cpu_forward(d, rng, g)


# CPU forward of small same-size planes as one flattened run
# (dw_forward_flat): a 5 x 9 plane under a 3 x 5 kernel (column masks for
# five taps, two columns of padding), and a 4 x 2 plane of exactly 8
# outputs under a dilated 3 x 3 kernel whose taps reach two rows and
# columns out.
FLAT_GEOMS = [
    (2, 3, 5, 9, 3, 5, 1, 2, 1, 1, 1, 1),
    (1, 2, 4, 2, 3, 3, 2, 2, 1, 1, 2, 2),
    (1, 3, 7, 7, 5, 5, 2, 2, 1, 1, 1, 1),
]


# 7 x 7 under 5 x 5: seven 8-output steps, three pairs and one alone
@pytest.mark.parametrize("p", FLAT_GEOMS, ids=["kernel3x5", "dilated-8-outputs", "7x7-k5"])
def test_cpu_forward_flat_planes(d, rng, p):
    g = _geom(p)
    assert dw_ops.flat_fits(g)
    assert not dw_ops.flat_fits(conv_ops.ConvGeometry(1, 2, 8, 8, 2, 3, 3, 1, 1, 2, 2,
                                                      groups=2))     # stride 2: bands
    x, w, b, _ = _case(g, rng)
    yshape = (g.num, g.channels, g.out_h, g.out_w)
    ref = np.clip(conv2d(x, w, **_kw(g)) + b.reshape(1, -1, 1, 1), -0.5, 0.7)
    yb = d.buf(np.full(yshape, np.nan))
    launches = dw_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, bias=d.buf(b),
                              act=("clip", -0.5, 0.7), impl="cpu")
    assert [ln.name for ln in launches] == ["dw_forward_flat"]
    d.run(launches)
    assert _rel(d.get(yb, yshape), ref) < 1e-5


@pytest.mark.parametrize("p", [(2, 24, 9, 11, 3, 3, 1, 1, 2, 2, 1, 1),
                               (2, 24, 6, 37, 3, 3, 1, 1, 1, 1, 1, 1),
                               (1, 40, 7, 7, 5, 5, 2, 2, 2, 2, 1, 1)],
                         ids=["stride2", "stride1", "7x7-to-4x4"])
@pytest.mark.parametrize("bands", [False, True], ids=["one-band", "bands"])
def test_cpu_forward_many_planes(d, rng, monkeypatch, p, bands):
    """Work-items running many planes in turn: planes of one band copy only
    their values onto the padding the work-item's first plane left in the
    buffer; planes of several bands pad every band (its rows differ)."""
    g = _geom(p)
    if bands:
        _two_row_bands(monkeypatch, g)
    assert (dw_ops.band_rows(d.dev, g) < g.out_h) == bands
    units = g.num * g.channels
    # a GPU's many compute units would give each work-item one plane: at
    # most 8 work-items on any device, so the walk over planes is checked
    monkeypatch.setattr(dw_ops, "cpu_chunks", lambda dev, n, min_chunk=1: min(n, 8))
    assert units >= 4 * dw_ops._plane_size(d.dev, g)[0][0]     # several planes a work-item
    _check_cpu_forward(d, rng, g)
