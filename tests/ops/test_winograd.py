"""Winograd F(2x2, 3x3), F(4x4, 3x3) and F(2x2, 5x5) convolution (ops/winograd.py,
kernels/winograd.cl) against float64 references: forward (bias +
activation epilogue, beta accumulate, poisoned output), backward-data
(overwrite / accumulate) and backward-weight (accumulate; split-K forced)
on odd sizes, pads 0/1/2 (and unequal), batch 1 and 3, channel counts off
the GEMM tiles, chunked over images; the dispatch rules of ops.conv
(CAFFE_OCL_WINOGRAD_BWD_WEIGHT); a Convolution layer forced onto Winograd
through the env switch.

Every geometry is a kernel argument (one program per tile size) and the
GEMM is the device's own (gemm_cpu.cl on PoCL); the GPU tiles of gemm.cl
run on PoCL only under `-m slow` (25-30 s to build)."""
import types

import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import winograd as wino_ops
from caffe_ocl.testing import check_gradient, forward, make_layer
from refs import rel_err as _rel
from test_conv_algorithms import _refs

# (n, c, h, w, co, ph, pw)
GEOMS = [
    (3, 5, 7, 9, 6, 1, 1),       # odd H, W, pad 1, batch 3
    (1, 4, 6, 5, 3, 0, 0),       # batch 1, pad 0, odd W
    (2, 3, 5, 5, 4, 2, 2),       # pad 2 (backward-data pads 0)
    (1, 3, 4, 7, 2, 1, 0),       # unequal pads
    (2, 33, 5, 6, 70, 1, 1),     # C, Co off the GEMM tiles, Co > 64
    (1, 2, 3, 3, 3, 0, 0),       # single output pixel (one tile, 3/4 wasted)
    (2, 3, 6, 8, 5, 1, 1),       # width 8: F(4x4) rows as float4s, a partial tile row
]
# grouped (AlexNet's conv4/conv5 are two-group 3x3): (n, c, h, w, co, ph, pw, groups)
GROUPED = [
    (2, 8, 7, 6, 12, 1, 1, 2),   # groups of 4 in, 6 out
    (1, 20, 5, 9, 20, 0, 1, 5),  # 5 groups of 4 (the fewest taken), pads 0/1
]
# 5x5 kernels, F(2x2, 5x5): (n, c, h, w, co, ph, pw[, groups])
GEOMS5 = [
    (3, 5, 9, 8, 6, 2, 2),       # pad 2 (AlexNet's conv2 form), batch 3, odd H
    (1, 4, 6, 7, 3, 0, 0),       # pad 0: 2x3 output, odd W
    (2, 3, 5, 5, 4, 4, 1),       # pads 4/1: backward-data pads 0 / 3
    (1, 3, 4, 6, 2, 1, 3),       # unequal pads, input smaller than the kernel's rows
    (2, 33, 7, 6, 70, 2, 2),     # C, Co off the GEMM tiles
    (2, 8, 9, 7, 12, 2, 2, 2),   # two groups (BVLC AlexNet's conv2)
]


def _id(p):
    return "n{}c{}h{}w{}co{}p{}{}".format(*p) + (f"g{p[7]}" if len(p) > 7 else "")


def _geom(p, k=3):
    n, c, h, w, co, ph, pw = p[:7]
    return conv_ops.ConvGeometry(n, c, h, w, co, k, k, ph, pw,
                                 groups=p[7] if len(p) > 7 else 1)


def _data(rng, g):
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    return x, w, dy


# relative L2 error allowed: F(4x4)'s transforms (1/6, 1/24, 8) lose a few bits
# (as do F(2x2, 5x5)'s, the same points: checked at TOL[4])
TOL = {2: 1e-5, 4: 2e-5}


def _check_fwd_bwd(d, rng, g, gemm_impl=None, tile=2):
    tol = TOL[tile if g.kh == 3 else 4]
    x, w, dy = _data(rng, g)
    b = rng.standard_normal(g.out_channels)
    y_ref, _, dx_ref = _refs(g, x, w, dy)
    xb, wb, bb, dyb = d.buf(x), d.buf(w), d.buf(b), d.buf(dy)
    yshape = dy.shape

    # forward, bias + leaky ReLU epilogue, poisoned output
    yb = d.buf(np.full(yshape, np.nan))
    d.run(wino_ops.forward(d.dev, g, xb, wb, yb, bias=bb, act=("relu", 0.1),
                           gemm_impl=gemm_impl, tile=tile))
    v = y_ref + b.reshape(1, -1, 1, 1)
    assert _rel(d.get(yb, yshape), np.where(v > 0, v, 0.1 * v)) < tol

    # forward with beta accumulation and the clip epilogue, no bias
    y0 = rng.standard_normal(yshape)
    yb = d.buf(y0)
    d.run(wino_ops.forward(d.dev, g, xb, wb, yb, act=("clip", -1.0, 2.0), beta=0.5,
                           gemm_impl=gemm_impl, tile=tile))
    assert _rel(d.get(yb, yshape), np.clip(y_ref + 0.5 * y0, -1.0, 2.0)) < tol

    # backward-data overwrites (poisoned), or accumulates
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(wino_ops.backward_data(d.dev, g, dyb, wb, dxb, gemm_impl=gemm_impl, tile=tile))
    assert _rel(d.get(dxb, x.shape), dx_ref) < tol
    dx0 = rng.standard_normal(x.shape)
    dxb = d.buf(dx0)
    d.run(wino_ops.backward_data(d.dev, g, dyb, wb, dxb, accumulate=True,
                                 gemm_impl=gemm_impl, tile=tile))
    assert _rel(d.get(dxb, x.shape), dx0 + dx_ref) < tol


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("p", GEOMS, ids=_id)
def test_winograd_matches_reference(d, rng, p, tile):
    _check_fwd_bwd(d, rng, _geom(p), tile=tile)


def _check_bwd_weight(d, rng, g, gemm_impl=None, tile=2):
    """dW0 + dW(x, dy) against float64; returns the launches."""
    x, w, dy = _data(rng, g)
    _, dw_ref, _ = _refs(g, x, w, dy)
    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    ls = wino_ops.backward_weight(d.dev, g, d.buf(x), d.buf(dy), dwb,
                                  gemm_impl=gemm_impl, tile=tile)
    d.run(ls)
    got = d.get(dwb, w.shape)
    tol = TOL[tile if g.kh == 3 else 4]
    assert _rel(got, dw0 + dw_ref) < tol
    assert _rel(got - dw0, dw_ref) < 2 * tol             # the increment itself
    return ls


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("p", GEOMS, ids=_id)
def test_winograd_backward_weight_matches_reference(d, rng, p, tile):
    ls = _check_bwd_weight(d, rng, _geom(p), tile=tile)
    assert [ln.name for ln in ls] == [_input_kernel(d), "wino_output_grad", "gemm",
                                      "wino_filter_grad"]


@pytest.mark.parametrize("p", GEOMS5, ids=_id)
def test_winograd_5x5_matches_reference(d, rng, p):
    """F(2x2, 5x5): forward (epilogues), backward-data (padding 4 - pad,
    a crop where pad > 4), backward-weight, grouped or not."""
    g = _geom(p, 5)
    assert wino_ops.eligible(g) and wino_ops.tile_for(g) == 2
    _check_fwd_bwd(d, rng, g)
    ls = _check_bwd_weight(d, rng, g)
    assert [ln.name for ln in ls].count("gemm") == g.groups


@pytest.mark.parametrize("strips", [False, True], ids=["per-tile", "strips"])
def test_winograd_5x5_both_input_kernels(d, rng, monkeypatch, strips):
    """Both input transforms read the 6 x 6 patches of F(2x2, 5x5) (strips:
    2 * TW + 4 columns per row of tiles)."""
    orig = wino_ops._input_launch
    monkeypatch.setattr(wino_ops, "_input_launch",
                        lambda *a, **k: orig(*a, **dict(k, strips=strips)))
    g = _geom((2, 3, 6, 19, 4, 2, 1), 5)
    _check_fwd_bwd(d, rng, g)
    ls = _check_bwd_weight(d, rng, g)
    assert ls[0].name == ("wino_input_rows" if strips else "wino_input")


def test_winograd_5x5_tiles():
    """5x5 runs F(2x2, 5x5) whatever the 3x3 tile setting; other tiles and
    kernel sides are refused."""
    g5 = _geom(GEOMS5[0], 5)
    assert wino_ops.tile_for(g5) == 2 and wino_ops._points(2, 5) == 36
    with pytest.raises(ValueError, match="tile 4 for a 5x5"):
        wino_ops.tile_for(g5, 4)
    assert not wino_ops.eligible(_geom(GEOMS5[0], 7))


def _input_kernel(d):
    """The input transform the device gets: by strips of tiles on CPU
    drivers, one work-item per tile on GPUs."""
    return "wino_input_rows" if d.dev.is_cpu else "wino_input"


def _filter_kernel(d):
    """The filter transform the device gets: blocks of filters (whole
    cache lines of U) on CPU drivers, one per work-item on GPUs."""
    return "wino_filter_lines" if d.dev.is_cpu else "wino_filter"


# rows of 37: strips of 10 tiles (the others have at most 3)
WIDE = (2, 3, 5, 37, 4, 1, 1)


@pytest.mark.parametrize("strips", [False, True], ids=["per-tile", "strips"])
@pytest.mark.parametrize("p,tile", [(GEOMS[0], 4), (GEOMS[2], 4), (GEOMS[4], 4), (WIDE, 4),
                                    (WIDE, 2)], ids=lambda v: _id(v) if isinstance(v, tuple) else f"F{v}")
def test_winograd_both_input_kernels(d, rng, p, tile, strips, monkeypatch):
    """Both input transforms (wino_input, wino_input_rows) on any device:
    forward, backward-data and the zero padding tiles of backward-weight.
    WIDE's strips hold 10 (F4) or 19 (F2) tiles: wino_input_rows's runs of
    8 tiles (the last overlapping the one before)."""
    orig = wino_ops._input_launch
    monkeypatch.setattr(wino_ops, "_input_launch",
                        lambda *a, **k: orig(*a, **dict(k, strips=strips)))
    _check_fwd_bwd(d, rng, _geom(p), tile=tile)
    ls = _check_bwd_weight(d, rng, _geom(p), tile=tile)
    assert ls[0].name == ("wino_input_rows" if strips else "wino_input")


# the forward's activations with their float64 form (the output
# transforms' epilogues)
BIASED_ACTS = ((None, lambda v: v), (("relu", 0.1), lambda v: np.where(v > 0, v, 0.1 * v)),
               (("clip", -1.0, 1.5), lambda v: np.clip(v, -1.0, 1.5)))


def _biased_case(rng, g):
    """(x, w, bias, reference output with the bias, output shape) of g."""
    x, w, _ = _data(rng, g)
    b = rng.standard_normal(g.out_channels)
    y_ref = _refs(g, x, w, np.zeros((g.num, g.out_channels, g.out_h, g.out_w)))[0]
    return x, w, b, y_ref + b.reshape(1, -1, 1, 1), (g.num, g.out_channels, g.out_h, g.out_w)


# strips of 8 tiles and more (wino_input_rows' runs of 8 tiles, the last
# overlapping): 16 tiles (F(4x4) on width 64), 10 and 19 (width 37 at both
# tiles), pad 0 (a crop at the right) and 2
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("p", [WIDE, (1, 2, 6, 64, 3, 1, 1), (1, 3, 5, 35, 2, 0, 0),
                               (1, 2, 4, 30, 3, 2, 2)], ids=_id)
def test_winograd_strips_of_eight_tiles(d, rng, p, tile, monkeypatch):
    """Also the CPU output transform by strips (wino_output_rows: F(4x4),
    forward without beta, rows of 8+ tiles), with bias and each activation."""
    orig = wino_ops._input_launch
    monkeypatch.setattr(wino_ops, "_input_launch",
                        lambda *a, **k: orig(*a, **dict(k, strips=True)))
    _check_fwd_bwd(d, rng, _geom(p), tile=tile)
    g = _geom(p)
    x, w, b, y_ref, yshape = _biased_case(rng, g)
    for act, f in BIASED_ACTS:
        yb = d.buf(np.full(yshape, np.nan))
        ls = wino_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, d.buf(b), act, tile=tile)
        assert (ls[-1].name == "wino_output_rows") == (d.dev.is_cpu and tile == 4)
        d.run(ls)
        assert _rel(d.get(yb, yshape), f(y_ref)) < TOL[tile]


# rows under 8 tiles (wino_output_runs: runs of 8 tiles across rows and
# images): 13 x 13 (4 x 4 tiles, the last row and column cropped), 27 x 27
# in two images (7 x 7 tiles: runs cross rows and images), 10 x 10 (3 x 3
# tiles: the channel's last run overlaps the one before), 4 x 10 in 3
# images (1 x 3 tiles each)
@pytest.mark.parametrize("p", [(1, 3, 13, 13, 5, 1, 1), (2, 2, 27, 27, 4, 1, 1),
                               (1, 3, 10, 10, 4, 1, 1), (3, 2, 6, 10, 3, 0, 1)], ids=_id)
@pytest.mark.parametrize("items", [None, 3])
def test_winograd_output_runs(d, rng, p, items, settings, monkeypatch):
    """The CPU output transform by runs of 8 tiles (F(4x4), forward without
    beta, rows under 8 tiles), with bias and each activation, also split
    over work-items whose runs overlap at a channel's end; equal to the
    tile-by-tile transform (CPU_WINO_RUNS off)."""
    if not d.dev.is_cpu:
        pytest.skip("a CPU-driver path")
    if items is not None:
        monkeypatch.setattr(wino_ops, "cpu_chunks", lambda dev, n, min_chunk=1: items)
    g = _geom(p)
    x, w, b, y_ref, yshape = _biased_case(rng, g)
    for act, f in BIASED_ACTS:
        outs = {}
        for runs in (True, False):
            settings(CPU_WINO_RUNS=runs)
            yb = d.buf(np.full(yshape, np.nan))
            ls = wino_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, d.buf(b), act, tile=4)
            assert (ls[-1].name == "wino_output_runs") == runs
            d.run(ls)
            outs[runs] = d.get(yb, yshape)
        assert _rel(outs[True], f(y_ref)) < TOL[4]
        assert np.allclose(outs[True], outs[False], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("r,m", [(3, 4), (5, 2)])
@pytest.mark.parametrize("flip", [0, 1])
def test_filter_kernels_agree(d, rng, flip, r, m):
    """wino_filter (GPUs) and wino_filter_lines (CPU drivers: blocks of
    FILTER_BLOCK filters, a partial last block of 6 here) write the same U."""
    co, c = 10, 7
    w = d.buf(rng.standard_normal((co, c, r, r)))
    us = {}
    for name, gs in (("wino_filter", co * c), ("wino_filter_lines", 1)):
        ub = d.buf(np.full(36 * co * c, np.nan))
        d.run([d.dev.launch(wino_ops.SRC, name, (gs,), (1,), [co, c, flip, w, 0, ub, 0],
                            dict(WM=m, WR=r))])
        us[name] = d.get(ub, (36, co * c))
    assert np.isfinite(us["wino_filter"]).all()
    assert np.array_equal(us["wino_filter"], us["wino_filter_lines"])


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("p", GROUPED, ids=_id)
def test_winograd_grouped_matches_reference(d, rng, p, tile):
    """Grouped 3x3: per-group GEMMs (forward, backward-data with the
    per-group transposed filter, backward-weight one GEMM per group)."""
    g = _geom(p)
    assert wino_ops.eligible(g)
    _check_fwd_bwd(d, rng, g, tile=tile)
    ls = _check_bwd_weight(d, rng, g, tile=tile)
    assert [ln.name for ln in ls].count("gemm") == g.groups


def test_winograd_weight_split_plan():
    """Split-K of the backward-weight GEMMs on an H200-like device (132
    compute units): small Co x C products split the tiles, ~3 work-groups
    per compute unit, at least SPLIT_MIN_T tiles per split; big ones not."""
    gpu = types.SimpleNamespace(is_cpu=False, is_gpu=True, compute_units=132,
                                local_mem=48 << 10)
    vgg12 = 64 * 56 * 56                       # 64 images of 224x224, m = 4
    assert wino_ops.weight_split(gpu, 64, 64, vgg12, 4) == 11       # 36 * 11 >= 396
    assert wino_ops.weight_split(gpu, 64, 64, vgg12, 2) == 25       # 16 * 25 >= 396
    assert wino_ops.weight_split(gpu, 512, 512, 64 * 49, 4) == 1    # 36 * 16 groups
    assert wino_ops.weight_split(gpu, 64, 64, 3 * 256 + 5, 4) == 3  # short K
    assert wino_ops.weight_split(gpu, 64, 64, 100, 4) == 1
    for T, n in ((1000, 3), (5000, 7), (64, 2)):
        kc = wino_ops._split_len(T, n)
        assert n * kc >= T and (n - 1) * kc < T + 16 * n


@pytest.mark.parametrize("tile,cap_images", [(2, 1), (4, 2)])
def test_winograd_backward_weight_split_and_chunked(d, rng, monkeypatch, tile, cap_images):
    """Split-K forced to 3 (padding tiles in the last split) and a workspace
    cap of 1 or 2 images: the partials accumulate over the chunks (GEMM
    beta), one filter back-transform sums them into dW."""
    g = _geom((3, 5, 7, 9, 6, 1, 1))
    A = (tile + 2) ** 2
    tiles = -(-g.out_h // tile) * -(-g.out_w // tile)
    nsplit = 3
    monkeypatch.setattr(wino_ops, "weight_split", lambda *a, **k: nsplit)
    cap = (A * nsplit * g.channels * g.out_channels + cap_images * A * (g.channels + g.out_channels)
           * tiles + A * (g.channels + g.out_channels) * nsplit * 16)
    monkeypatch.setattr(wino_ops, "MAX_WS_FLOATS", cap)
    ls = _check_bwd_weight(d, rng, g, tile=tile)
    nchunks = -(-g.num // cap_images)
    assert len(ls) == 3 * nchunks + 1
    gemms = [ln for ln in ls if ln.name == "gemm"]
    assert len(gemms) == nchunks and all(ln.gsize[2] == A * nsplit for ln in gemms)


@pytest.mark.parametrize("num,most,tiles,want", [
    (64, 31, 49, 24),     # VGG-16 28x28: 31 + 31 + 2 -> 24 + 24 + 16, rows of 1176 tiles
    (64, 64, 49, 64),     # one chunk
    (3, 2, 20, 2),        # tiles already whole 16 bytes
    (10, 4, 6, 4),        # two images per 16 bytes: 4 + 4 + 2
    (9, 5, 49, 4),        # rounding up to 8 does not fit: down to 4 (three chunks)
    (5, 1, 49, 1),        # one image at most
])
def test_winograd_chunks_balanced_and_aligned(num, most, tiles, want):
    c = wino_ops.balanced_chunk(num, most, tiles)
    assert c == want and 1 <= c <= most


@pytest.mark.parametrize("tile,cap_images", [(2, 1), (2, 2), (4, 2)])
def test_winograd_chunked_over_images(d, rng, monkeypatch, tile, cap_images):
    """A workspace cap of 1 or 2 images: 3 images in 3 / 2 chunks
    (the last one partial), each chunk at its own image offset."""
    g = _geom((3, 5, 7, 9, 6, 1, 1))
    A = (tile + 2) ** 2
    tiles = -(-g.out_h // tile) * -(-g.out_w // tile)
    cap = A * g.channels * g.out_channels + cap_images * A * (g.channels + g.out_channels) * tiles
    monkeypatch.setattr(wino_ops, "MAX_WS_FLOATS", cap)
    assert wino_ops.chunk_images(g.num, g.channels, g.out_channels, tiles, tile=tile) == cap_images
    nchunks = -(-g.num // cap_images)
    z = d.buf(np.zeros(1))
    ls = wino_ops.forward(d.dev, g, z, z, z, tile=tile)
    assert len(ls) == 1 + 3 * nchunks          # filter transform + 3 per chunk
    _check_fwd_bwd(d, rng, g, tile=tile)


def test_winograd_through_conv_dispatch(d, rng, monkeypatch):
    """ops.conv.forward / backward_data / backward_weight with
    algo="winograd" (backward-weight: Winograd's, or the device's dense
    path under CAFFE_OCL_WINOGRAD_BWD_WEIGHT=0)."""
    monkeypatch.delenv(wino_ops.BWD_WEIGHT_ENV, raising=False)
    g = _geom((2, 4, 5, 6, 5, 1, 1))
    x, w, dy = _data(rng, g)
    y_ref, dw_ref, dx_ref = _refs(g, x, w, dy)
    ws = conv_ops.workspace_floats(d.dev, g, "winograd")
    col = d.buf(np.zeros(ws)) if ws else None
    xb, wb, dyb = d.buf(x), d.buf(w), d.buf(dy)
    yb = d.buf(np.full(dy.shape, np.nan))
    ls = conv_ops.forward(d.dev, g, xb, wb, yb, col, algo="winograd")
    assert [ln.name for ln in ls][:2] == [_filter_kernel(d), _input_kernel(d)]
    d.run(ls)
    assert _rel(d.get(yb, dy.shape), y_ref) < 1e-5
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(conv_ops.backward_data(d.dev, g, dyb, wb, dxb, col, algo="winograd"))
    assert _rel(d.get(dxb, x.shape), dx_ref) < 1e-5
    dw0 = rng.standard_normal(w.shape)
    for env, name in (("1", "wino_filter_grad"), ("0", None)):
        monkeypatch.setenv(wino_ops.BWD_WEIGHT_ENV, env)
        dwb = d.buf(dw0)
        ls = conv_ops.backward_weight(d.dev, g, xb, dyb, dwb, col, algo="winograd")
        names = [ln.name for ln in ls]
        assert (name in names) if name else not any(n.startswith("wino") for n in names)
        d.run(ls)
        assert _rel(d.get(dwb, w.shape), dw0 + dw_ref) < 1e-5


@pytest.mark.parametrize("kw", [dict(sh=2, sw=2), dict(kh=7, kw=7), dict(dh=2, dw=2),
                                dict(groups=2), dict(groups=4), dict(kh=3, kw=1),
                                dict(kh=5, kw=3), dict(kh=5, kw=5, sh=2, sw=2)],
                         ids=["stride2", "7x7", "dilation2", "groups-of-2", "depthwise",
                              "3x1", "5x3", "5x5-stride2"])
def test_winograd_rejects_ineligible_geometry(d, kw):
    base = dict(num=1, channels=4, height=9, width=9, out_channels=4, kh=3, kw=3, ph=1, pw=1)
    base.update(kw)
    g = conv_ops.ConvGeometry(**base)
    assert not wino_ops.eligible(g)
    with pytest.raises(ValueError, match="winograd"):
        conv_ops.algorithm(d.dev, g, "winograd")
    with pytest.raises(ValueError, match="winograd"):
        conv_ops.forward(d.dev, g, None, None, None, None, algo="winograd")
    with pytest.raises(ValueError, match="winograd"):
        conv_ops.backward_data(d.dev, g, None, None, None, None, algo="winograd")


def test_automatic_choice(d, monkeypatch):
    """GPUs: Winograd where the cost model says it pays (wide 3x3 layers),
    never for narrow or ineligible ones; CPU drivers keep im2col; the env
    switch forces it off or on for eligible geometries on any device."""
    monkeypatch.delenv(wino_ops.ENV, raising=False)
    gpu = types.SimpleNamespace(is_cpu=False, is_gpu=True)
    cpu = types.SimpleNamespace(is_cpu=True, is_gpu=False)

    def g(c, co, hw=28, **kw):
        return conv_ops.ConvGeometry(64, c, hw, hw, co, 3, 3, 1, 1, **kw)

    wide, narrow = g(256, 256), g(32, 32)    # default tile 4: 64->64 pays (1.6x)
    assert conv_ops.algorithm(gpu, g(64, 64)) == "winograd"
    assert conv_ops.algorithm(gpu, wide) == "winograd"
    assert conv_ops.algorithm(gpu, g(512, 512, hw=7)) == "winograd"
    assert conv_ops.algorithm(gpu, narrow) == "igemm"
    assert conv_ops.algorithm(gpu, g(3, 64, hw=224)) == "igemm"
    assert conv_ops.algorithm(gpu, g(256, 256, sh=2, sw=2)) == "igemm"
    assert conv_ops.algorithm(gpu, g(384, 384, hw=13, groups=2)) == "winograd"  # AlexNet
    # 5x5 (F(2x2, 5x5)): torchvision AlexNet's conv2 and GoogLeNet's 5x5
    # branch at batch 64; with TF32 tensor cores (NVIDIA) only AlexNet's;
    # not narrow ones
    alex_b64 = conv_ops.ConvGeometry(64, 64, 27, 27, 192, 5, 5, 2, 2)
    goog_b64 = conv_ops.ConvGeometry(64, 32, 28, 28, 96, 5, 5, 2, 2)
    assert conv_ops.algorithm(gpu, alex_b64) == "winograd"
    assert conv_ops.algorithm(gpu, goog_b64) == "winograd"
    nv = types.SimpleNamespace(is_cpu=False, is_gpu=True, is_nvidia=True)
    with config.override(TF32=True):
        assert conv_ops.algorithm(nv, alex_b64) == "winograd"
        assert conv_ops.algorithm(nv, goog_b64) == "igemm"
    assert conv_ops.algorithm(nv, goog_b64) == "winograd"            # FP32
    assert conv_ops.algorithm(gpu, conv_ops.ConvGeometry(64, 16, 14, 14, 32, 5, 5, 2, 2)) \
        == "igemm"
    # GPUs at batch 1: the small layers (231 MFLOP: ResNet's 64-channel 3x3
    # at 56 x 56; AlexNet's 448-MFLOP 5x5) keep their one launch; VGG's
    # conv3_1 (1.85 GFLOP) takes Winograd; setting WINOGRAD_MIN_MFLOP=0 lifts
    # the floor
    r64 = conv_ops.ConvGeometry(1, 64, 56, 56, 64, 3, 3, 1, 1)
    alex2 = conv_ops.ConvGeometry(1, 64, 27, 27, 192, 5, 5, 2, 2)
    vgg31 = conv_ops.ConvGeometry(1, 128, 56, 56, 256, 3, 3, 1, 1)
    assert conv_ops.algorithm(gpu, r64) == "igemm"
    assert conv_ops.algorithm(gpu, alex2) == "igemm"
    assert conv_ops.algorithm(gpu, vgg31) == "winograd"
    assert conv_ops.algorithm(cpu, alex2) == "winograd"         # 196 tiles, no floor on CPUs
    monkeypatch.setenv("CAFFE_OCL_WINOGRAD_MIN_MFLOP", "0")
    assert conv_ops.algorithm(gpu, r64) == "winograd"
    assert conv_ops.algorithm(gpu, alex2) == "winograd"
    monkeypatch.delenv("CAFFE_OCL_WINOGRAD_MIN_MFLOP")
    assert conv_ops.algorithm(gpu, g(64, 64, groups=64)) == "depthwise"
    assert conv_ops.algorithm(gpu, wide, "igemm") == "igemm"
    assert conv_ops.algorithm(cpu, wide) == "winograd"        # pays on CPUs too
    assert conv_ops.algorithm(cpu, narrow) == "im2col"
    # few tiles (batch 1, small maps): the per-call filter transform and the
    # narrow GEMMs lose; CPU drivers also need CPU_MIN_TILES tiles
    b1_7x7 = conv_ops.ConvGeometry(1, 512, 7, 7, 512, 3, 3, 1, 1)
    assert conv_ops.algorithm(gpu, b1_7x7) == "igemm"
    assert conv_ops.algorithm(cpu, b1_7x7) == "im2col"
    assert conv_ops.algorithm(cpu, conv_ops.ConvGeometry(1, 128, 28, 28, 128, 3, 3, 1, 1)) \
        == "winograd"                                       # 49 tiles
    assert conv_ops.algorithm(cpu, conv_ops.ConvGeometry(1, 256, 14, 14, 256, 3, 3, 1, 1)) \
        == "im2col"                                         # 16 tiles
    assert conv_ops.algorithm(cpu, conv_ops.ConvGeometry(16, 256, 14, 14, 256, 3, 3, 1, 1)) \
        == "winograd"                                       # 256 tiles
    assert conv_ops.algorithm(cpu, conv_ops.ConvGeometry(16, 512, 7, 7, 512, 3, 3, 1, 1)) \
        == "winograd"                                       # 64 tiles: ResNet's last stage
    assert conv_ops.algorithm(cpu, conv_ops.ConvGeometry(8, 512, 7, 7, 512, 3, 3, 1, 1)) \
        == "winograd"                                       # 32 tiles
    assert conv_ops.algorithm(cpu, conv_ops.ConvGeometry(6, 512, 7, 7, 512, 3, 3, 1, 1)) \
        == "im2col"                                         # 24 tiles
    huge = conv_ops.ConvGeometry(512, 512, 112, 112, 512, 3, 3, 1, 1)   # > 2^31 floats
    assert not wino_ops.fits(huge) and conv_ops.algorithm(gpu, huge) == "igemm"
    assert wino_ops.estimated_speedup(wide) > wino_ops.estimated_speedup(narrow)
    monkeypatch.setenv(wino_ops.ENV, "0")
    assert conv_ops.algorithm(gpu, wide) == "igemm"
    monkeypatch.setenv(wino_ops.ENV, "1")
    assert conv_ops.algorithm(gpu, narrow) == "winograd"
    assert conv_ops.algorithm(cpu, narrow) == "winograd"
    assert conv_ops.algorithm(gpu, g(256, 256, sh=2, sw=2)) == "igemm"
    # dW by the dense path: its workspace
    assert conv_ops.workspace_floats(cpu, narrow) == conv_ops.workspace_floats(cpu, narrow,
                                                                               "im2col")
    assert conv_ops.workspace_floats(gpu, narrow) == 0


@pytest.mark.parametrize("k,tile,tol", [(3, 2, 1e-6), (3, 4, 1e-5), (5, 2, 1e-5)],
                         ids=["F2x3", "F4x3", "F2x5"])
def test_winograd_accuracy_realistic(d, rng, k, tile, tol):
    """A VGG-like block, and an AlexNet-like 5x5 layer (He-initialised
    weights, ReLU-like inputs): float32 Winograd close to float64 for all
    three passes (relative L2; measured 2.3e-7 for F(2x2), 1.4e-6 for
    F(4x4), max element 6e-6 for F(4x4); backward-weight 2.4e-7 for F(2x2),
    8.4e-7 for F(4x4), im2col 1.5e-7; max element 2.1e-6 of max |dW| for
    F(4x4))."""
    g = _geom((2, 48, 12, 12, 40, 1, 1) if k == 3 else (2, 24, 11, 11, 20, 2, 2), k)
    x = np.maximum(rng.standard_normal((g.num, g.channels, g.height, g.width)), 0)
    w = rng.standard_normal((g.out_channels, g.channels, k, k)) * np.sqrt(2 / (k * k * g.channels))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w)) * 1e-3
    y_ref, dw_ref, dx_ref = _refs(g, x, w, dy)
    wb = d.buf(w)
    yb = d.buf(np.zeros(dy.shape))
    d.run(wino_ops.forward(d.dev, g, d.buf(x), wb, yb, tile=tile))
    assert _rel(d.get(yb, dy.shape), y_ref) < tol
    dxb = d.buf(np.zeros(x.shape))
    d.run(wino_ops.backward_data(d.dev, g, d.buf(dy), wb, dxb, tile=tile))
    assert _rel(d.get(dxb, x.shape), dx_ref) < tol
    dwb = d.buf(np.zeros(w.shape))
    d.run(wino_ops.backward_weight(d.dev, g, d.buf(x), d.buf(dy), dwb, tile=tile))
    assert _rel(d.get(dwb, w.shape), dw_ref) < tol


@pytest.mark.parametrize("tile", ["2", "4"])
def test_convolution_layer_forced_winograd(rng, monkeypatch, tile):
    """A Convolution layer (bias, pad 1, odd sizes) built with
    CAFFE_OCL_WINOGRAD=1 (and CAFFE_OCL_WINOGRAD_TILE): its launches are
    Winograd's, forward matches the reference and the gradients (dx and
    dW by Winograd) check."""
    import refs
    monkeypatch.setenv(wino_ops.ENV, "1")
    monkeypatch.setenv(wino_ops.TILE_ENV, tile)
    x = rng.standard_normal((2, 3, 5, 4))
    text = ('type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 pad: 1 '
            'weight_filler { type: "gaussian" std: 0.5 } '
            'bias_filler { type: "uniform" min: -1 max: 1 } }')
    layer, b, t = make_layer(text, [x])
    (y,) = forward(layer, b, t)
    assert "wino_output" in [ln.name for ln in layer.fwd]
    ref = refs.conv2d(x, layer.blobs[0].data, layer.blobs[1].data, pad=(1, 1))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # F(4x4)'s float32 forward noise (~1e-5 of |y| per element, test above)
    # divided by the 2e-2 finite-difference step is ~3e-3 of the gradient:
    # its dx itself is checked against float64 in _check_fwd_bwd.
    monkeypatch.delenv(wino_ops.BWD_WEIGHT_ENV, raising=False)
    check_gradient(layer, b, t, max_checks=30, threshold=1e-3 if tile == "2" else 1e-2)
    names = [ln.name for ln in layer.bwd]
    assert "wino_output" in names and "wino_filter_grad" in names


@pytest.mark.slow
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("p", [GEOMS[0], GEOMS[4]], ids=_id)
def test_winograd_gpu_gemm_tiles(d, rng, monkeypatch, p, tile):
    """The same pipeline with the GPU GEMM (gemm.cl 128x128 / 64x128 tiles);
    backward-weight with split-K forced to 3."""
    _check_fwd_bwd(d, rng, _geom(p), gemm_impl="tiled", tile=tile)
    monkeypatch.setattr(wino_ops, "weight_split", lambda *a, **k: 3)
    ls = _check_bwd_weight(d, rng, _geom(p), gemm_impl="tiled", tile=tile)
    assert [ln.gsize[2] for ln in ls if ln.name == "gemm"] == [3 * (tile + 2) ** 2]


def test_bad_tile_rejected(d):
    with pytest.raises(ValueError, match="tile"):
        wino_ops.forward(d.dev, _geom(GEOMS[0]), None, None, None, tile=3)


TRAIN_TILE_NET = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "y"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "Reduction" bottom: "y" top: "loss" loss_weight: 1
        reduction_param { operation: SUMSQ } }
"""


@pytest.mark.parametrize("tf32, phase, train_tile, want_fwd", [
    (True, "TRAIN", "2", 2), (True, "TRAIN", "4", 4), (True, "TEST", "2", 4),
    (False, "TRAIN", "2", 4)])
def test_train_forward_tile_under_tf32(tmp_path, rng, monkeypatch, settings, tf32, phase,
                                       train_tile, want_fwd):
    """A TRAIN net's Winograd forwards under TF32 (here the tests'
    emulation) take WINOGRAD_TILE_TF32_TRAIN's tile, built in its setup and
    on a reshape; its backward-data, a TEST net's forwards and FP32 nets keep
    WINOGRAD_TILE (4). The result matches the reference either way."""
    import caffe_ocl as caffe
    import refs
    settings(WINOGRAD=True, WINOGRAD_TILE="4", WINOGRAD_TILE_TF32_TRAIN=train_tile,
             TF32_EMULATE=tf32)
    seen = []
    real = wino_ops._pipeline

    def spy(dev, num, cin, h, w, cout, ho, wo, ph, pw, x, weight, flip, y, bias, act, beta,
            gemm_impl, tile, *a, **k):
        seen.append(("bwd" if flip else "fwd", wino_ops._tile(tile, k.get("r", 3))))
        return real(dev, num, cin, h, w, cout, ho, wo, ph, pw, x, weight, flip, y, bias, act,
                    beta, gemm_impl, tile, *a, **k)

    monkeypatch.setattr(wino_ops, "_pipeline", spy)
    p = tmp_path / "net.prototxt"
    p.write_text(TRAIN_TILE_NET)
    net = caffe.Net(str(p), getattr(caffe, phase))
    for shape in [(2, 3, 6, 5), (1, 3, 7, 7)]:
        net.blobs["x"].reshape(*shape)
        net.reshape()
        x = rng.standard_normal(shape)
        net.blobs["x"].data[...] = x
        net.forward()
        if phase == "TRAIN":
            net.backward()
        ref = refs.conv2d(x, net.params["conv"][0].data, net.params["conv"][1].data,
                          pad=(1, 1))
        # TF32 (emulated, or NVIDIA's) rounds the operands: F(4x4)'s error
        # is ~10x a direct TF32 convolution's
        assert _rel(net.blobs["y"].data, ref) < (2e-2 if tf32 else 1e-5)
    fwd = {t for kind, t in seen if kind == "fwd"}
    assert fwd == {want_fwd}, seen
    if phase == "TRAIN":
        assert {t for kind, t in seen if kind == "bwd"} == {4}, seen


def test_train_forward_tile_after_solver_rebind(monkeypatch, settings):
    """A solver's TRAIN net, whose layers rebuild their launches when the
    parameter arena moves their weights: its Winograd forwards keep the
    TF32 training tile."""
    import caffe_ocl as caffe
    from google.protobuf import text_format
    from caffe_ocl.proto import caffe_pb2
    settings(WINOGRAD=True, WINOGRAD_TILE="4", TF32_EMULATE=True)
    seen = []
    real = wino_ops.forward
    monkeypatch.setattr(wino_ops, "forward", lambda dev, g, *a, **k: seen.append(
        wino_ops.forward_tile(dev, g)) or real(dev, g, *a, **k))
    sp = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="fixed")
    text_format.Merge(TRAIN_TILE_NET, sp.net_param)
    solver = caffe.SGDSolver(sp)
    solver.step(1)
    assert seen and set(seen) == {2}, seen


def test_forward_choice_judges_the_tile_it_runs(d, monkeypatch, settings):
    """The automatic choice of a forward weighs Winograd with the tile the
    forward would take (F(2x2) in a TRAIN net under TF32); other passes
    with the setting's."""
    settings(TF32_EMULATE=True, WINOGRAD_TILE="4")
    got = []
    monkeypatch.setattr(wino_ops, "use_auto",
                        lambda dev, g, tile=None: got.append(tile) or False)
    g = _geom(GEOMS[0])
    assert g.kh == 3
    conv_ops.algorithm(d.dev, g, None, "forward")
    with wino_ops.train_forwards():
        conv_ops.algorithm(d.dev, g, None, "forward")
        conv_ops.algorithm(d.dev, g, None, "backward_data")
    assert got == [4, 2, None]


# (geometry, tile, images per chunk): each output kernel on CPU drivers
# (wino_output_rows: F(4x4) rows of >= 8 tiles; wino_output_runs: F(4x4)
# under 8; wino_output: F(2x2)) and two chunks of images; GPUs run
# wino_output for all
SLICE_CASES = [((2, 3, 6, 33, 5, 1, 1), 4, 2),
               ((3, 4, 7, 9, 6, 1, 1), 4, 3),
               ((3, 4, 7, 9, 6, 1, 1), 2, 3),
               ((3, 4, 7, 9, 6, 1, 1), 2, 2)]


@pytest.mark.parametrize("p,tile,cap_images", SLICE_CASES)
def test_winograd_writes_a_slice(d, rng, monkeypatch, p, tile, cap_images):
    """A forward into channels 3 .. 3 + Co of a blob of Co + 5 channels per
    image (a Concat's top: ops.conv.writes_slices, plan/concat.py), with
    bias and ReLU: the slice right, the other channels untouched. DenseNet
    at batch 16 and more runs its 3x3 layers by Winograd, each of whose
    outputs the Concat copied before."""
    g = _geom(p)
    A = (tile + 2) ** 2
    tiles = -(-g.out_h // tile) * -(-g.out_w // tile)
    monkeypatch.setattr(wino_ops, "MAX_WS_FLOATS", A * g.channels * g.out_channels
                        + cap_images * A * (g.channels + g.out_channels) * tiles)
    assert wino_ops.chunk_images(g.num, g.channels, g.out_channels, tiles, tile=tile) == cap_images
    assert conv_ops.writes_slices(d.dev, g, "winograd")
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, 3, 3))
    b = rng.standard_normal(g.out_channels)
    ref = np.maximum(_refs(g, x, w, np.zeros((g.num, g.out_channels, g.out_h, g.out_w)))[0]
                     + b[None, :, None, None], 0.0)
    wide = (g.num, g.out_channels + 5, g.out_h, g.out_w)
    y0 = rng.standard_normal(wide).astype(np.float32)
    yb = d.buf(y0)
    d.run(wino_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, d.buf(b), ("relu", 0.0),
                           tile=tile, y_off=3 * g.out_h * g.out_w, y_channels=wide[1]))
    got = d.get(yb, wide)
    assert _rel(got[:, 3:3 + g.out_channels], ref) < 1e-4
    np.testing.assert_array_equal(got[:, :3], y0[:, :3])
    np.testing.assert_array_equal(got[:, 3 + g.out_channels:], y0[:, 3 + g.out_channels:])
