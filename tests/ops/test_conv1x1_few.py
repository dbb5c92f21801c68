"""The 1x1 forward for few outputs (ops/conv1x1_few.py,
kernels/conv1x1_few.cl: batch-1 pointwise layers on small planes, GPUs)
against float64: pixels past one block of 64 and short of it, K past one
local block of weights, output channels not a multiple of the block,
bias, activations, a shortcut added before the activation, a slice of a
Concat's top; and the rule that sends a GPU's automatic forward to it."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import conv1x1_few
from refs import rel_err
from test_small_batch_gpu import _conv_ref

CASES = {  # num, channels, height, width, out_channels
    "7x7": (1, 24, 7, 7, 20),            # one pixel block, 3 channel blocks (20 = 8 + 8 + 4)
    "two-images-81px": (2, 13, 9, 9, 8),  # pixels 64 + 17
    "k-past-local": (1, 300, 3, 5, 11),   # K 256 + 44; 32 pixels x 8 slices
    "k-1100": (1, 1100, 5, 4, 9),         # 16 pixels x 16 slices, 5 local blocks of K
    "k-520-40px": (1, 520, 5, 8, 3),      # 16 x 16, pixels 16 + 16 + 8
    "k-100": (1, 100, 6, 6, 10),          # 25 steps a slice: 3 batches of 8 loads and 1 more
}


def test_split():
    assert [conv1x1_few.split(k) for k in (24, 256, 257, 512, 513, 4096)] == \
        [(64, 4), (64, 4), (32, 8), (32, 8), (16, 16), (16, 16)]


def _geom(p):
    n, c, h, w, co = p
    return conv_ops.ConvGeometry(n, c, h, w, co, 1, 1)


@pytest.mark.parametrize("extras", ["plain", "bias-relu", "bias-residual-clip", "slice"])
@pytest.mark.parametrize("p", list(CASES.values()), ids=list(CASES))
def test_forward_matches_float64(d, rng, p, extras):
    g = _geom(p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, 1, 1))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    r = rng.standard_normal(yshape)
    want = _conv_ref(x, w, g)
    bias = act = res = None
    if extras != "plain" and extras != "slice":
        bias = d.buf(b)
        want = want + b.reshape(1, -1, 1, 1)
    if extras == "bias-relu":
        act = ("relu", 0.1)
        want = np.where(want > 0, want, 0.1 * want)
    if extras == "bias-residual-clip":
        res, act = d.buf(r), ("clip", -1.0, 1.5)
        want = np.clip(want + r, -1.0, 1.5)
    if extras == "slice":     # channels [3, 3 + Co) of a top of Co + 5 channels
        top = (g.num, g.out_channels + 5, g.out_h, g.out_w)
        yb = d.buf(np.full(top, np.nan))
        d.run([conv1x1_few.forward(d.dev, g, d.buf(x), d.buf(w), yb, y_off=3 * g.out_spatial,
                                   y_channels=top[1])])
        got = d.get(yb, top)
        assert rel_err(got[:, 3:3 + g.out_channels], want) < 1e-5
        assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 3 + g.out_channels:]).all()
        return
    yb = d.buf(np.full(yshape, np.nan))
    d.run([conv1x1_few.forward(d.dev, g, d.buf(x), d.buf(w), yb, bias, act, residual=res)])
    assert rel_err(d.get(yb, yshape), want) < 1e-5


def test_gpu_forward_takes_it(d, rng, monkeypatch):
    """On a GPU the automatic forward of a 1x1 layer whose output is a few
    tiles is this kernel; not for strided, padded, grouped or larger
    layers, not with the setting off or in deterministic mode, not on CPU
    drivers."""
    g = _geom(CASES["7x7"])
    if d.dev.is_cpu:
        assert not conv1x1_few.applies(d.dev, g)
    monkeypatch.setattr(d.dev, "is_cpu", False)
    monkeypatch.setattr(d.dev, "compute_units", 132)
    assert conv1x1_few.applies(d.dev, g)
    assert conv_ops.writes_residual(d.dev, g)
    big = conv_ops.ConvGeometry(1, 64, 56, 56, 256, 1, 1)        # 4 x 49 tiles of 64 x 64
    strided = conv_ops.ConvGeometry(1, 24, 7, 7, 20, 1, 1, 0, 0, 2, 2)
    padded = conv_ops.ConvGeometry(1, 24, 7, 7, 20, 1, 1, 1, 1)
    grouped = conv_ops.ConvGeometry(1, 24, 7, 7, 20, 1, 1, groups=4)
    three = conv_ops.ConvGeometry(1, 24, 7, 7, 20, 3, 3, 1, 1)
    long_k = conv_ops.ConvGeometry(1, 2048, 7, 7, 512, 1, 1)     # 8 tiles, 51 million MACs
    assert conv1x1_few.applies(d.dev, conv_ops.ConvGeometry(1, 832, 7, 7, 384, 1, 1))
    assert not any(conv1x1_few.applies(d.dev, h)
                   for h in (big, strided, padded, grouped, three, long_k))
    with config.override(CONV_1X1_FEW=False):
        assert not conv1x1_few.applies(d.dev, g)
    with config.override(DETERMINISTIC=True):
        assert not conv1x1_few.applies(d.dev, g)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, 1, 1))
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    yb = d.buf(np.zeros(yshape))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None)
    assert [ln.name for ln in launches] == ["conv1x1_few"]
    d.run(launches)
    assert rel_err(d.get(yb, yshape), _conv_ref(x, w, g)) < 1e-5


# The depthwise convolution computed where the kernel loads its input
# (DWP): depthwise geometry (num, channels, height, width, kernel, pad,
# stride, dilation) and the 1x1 layer's output channels. Stride 2 onto odd
# planes, 5 x 5 and dilated taps reaching past the edges, K past one
# local block of weights (300 channels), pixels past one block (two
# images of 9 x 10), 7 x 7 taps (the most unrolled).
DW_CASES = {
    "3x3-s1": ((1, 24, 7, 7, 3, 1, 1, 1), 20),
    "3x3-s2-odd": ((1, 16, 13, 11, 3, 1, 2, 1), 9),
    "5x5-s2": ((1, 40, 14, 14, 5, 2, 2, 1), 24),
    "dilated": ((2, 12, 9, 10, 3, 2, 1, 2), 8),
    "k300": ((1, 300, 5, 6, 3, 1, 1, 1), 11),
    "7x7-pad0": ((1, 8, 10, 9, 7, 0, 1, 1), 5),
}

DW_ACTS = {"none": (None, lambda v: v),
           "relu6": (("clip", 0.0, 6.0), lambda v: np.clip(v, 0.0, 6.0)),
           "swish": (("swish", 1.0), lambda v: v / (1 + np.exp(-v))),
           "hardswish": (("hardswish", 1 / 6, 0.5), lambda v: v * np.clip(v / 6 + 0.5, 0, 1))}


def _dw_case(p, co):
    (n, c, h, w, k, pad, s, dil), co = p, co
    gd = conv_ops.ConvGeometry(n, c, h, w, c, k, k, pad, pad, s, s, dil, dil, groups=c)
    return gd, conv_ops.ConvGeometry(n, c, gd.out_h, gd.out_w, co, 1, 1)


@pytest.mark.parametrize("dact", list(DW_ACTS))
@pytest.mark.parametrize("extras", ["plain", "bias-relu-residual"])
@pytest.mark.parametrize("name", list(DW_CASES))
def test_depthwise_input_matches_float64(d, rng, name, extras, dact):
    gd, g = _dw_case(*DW_CASES[name])
    assert conv1x1_few.takes_dw(g, gd)
    x = rng.standard_normal((gd.num, gd.channels, gd.height, gd.width))
    wd = rng.standard_normal((gd.channels, 1, gd.kh, gd.kw))
    bd = rng.standard_normal(gd.channels) if extras != "plain" else None
    w = rng.standard_normal((g.out_channels, g.channels, 1, 1))
    act_spec, act_ref = DW_ACTS[dact]
    mid = _conv_ref(x, wd, gd) + (bd.reshape(1, -1, 1, 1) if bd is not None else 0)
    want = _conv_ref(act_ref(mid), w, g)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    bias = res = act = None
    if extras != "plain":
        b, r = rng.standard_normal(g.out_channels), rng.standard_normal(yshape)
        bias, res, act = d.buf(b), d.buf(r), ("relu", 0.0)
        want = np.maximum(want + b.reshape(1, -1, 1, 1) + r, 0.0)
    dw = conv1x1_few.DwInput(gd, d.buf(x), d.buf(wd), d.buf(bd) if bd is not None else None,
                             act_spec)
    unread = d.buf(np.full((1,), np.nan))
    yb = d.buf(np.full(yshape, np.nan))
    d.run([conv1x1_few.forward(d.dev, g, unread, d.buf(w), yb, bias, act, residual=res, dw=dw)])
    assert rel_err(d.get(yb, yshape), want) < 1e-5


def test_depthwise_input_reach(d):
    """takes_dw: the depthwise output must be the 1x1 layer's input (its
    channels, images and plane), one channel a group, at most 7 x 7 taps,
    its sums repeated per block of output channels at most DW_MAX_MACS;
    conv_ops.takes_dw_input only where the kernel runs the 1x1 layer (not
    on CPU drivers), setting FUSE_DW_POINTWISE."""
    gd, g = _dw_case(*DW_CASES["3x3-s1"])
    assert conv1x1_few.takes_dw(g, gd)
    other = conv_ops.ConvGeometry(1, 24, 7, 7, 24, 3, 3, 1, 1, groups=8)   # 3 channels a group
    wide = conv_ops.ConvGeometry(1, 24, 9, 9, 24, 9, 9, 4, 4, groups=24)    # 81 taps
    strided = conv_ops.ConvGeometry(1, 24, 7, 7, 24, 3, 3, 1, 1, 2, 2, groups=24)  # 4 x 4 out
    fewer = conv_ops.ConvGeometry(1, 16, 7, 7, 16, 3, 3, 1, 1, groups=16)
    two = conv_ops.ConvGeometry(2, 24, 7, 7, 24, 3, 3, 1, 1, groups=24)
    assert not any(conv1x1_few.takes_dw(g, h) for h in (other, wide, strided, fewer, two))
    big_g = conv_ops.ConvGeometry(1, 960, 7, 7, 160, 1, 1)   # 20 blocks x 960 x 49 x 9 MACs
    big_d = conv_ops.ConvGeometry(1, 960, 7, 7, 960, 3, 3, 1, 1, groups=960)
    assert not conv1x1_few.takes_dw(big_g, big_d)
    small_d = conv_ops.ConvGeometry(1, 232, 7, 7, 232, 3, 3, 1, 1, groups=232)
    assert conv1x1_few.takes_dw(conv_ops.ConvGeometry(1, 232, 7, 7, 232, 1, 1), small_d)
    if d.dev.is_cpu:
        assert not conv_ops.takes_dw_input(d.dev, g, gd)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(d.dev, "is_cpu", False)
        m.setattr(d.dev, "compute_units", 132)
        assert not conv_ops.takes_dw_input(d.dev, g, gd)        # off by default
        with config.override(FUSE_DW_POINTWISE=True):
            assert conv_ops.takes_dw_input(d.dev, g, gd)
        with pytest.raises(ValueError, match="depthwise"):
            conv_ops.forward(d.dev, g, None, None, None, None,
                             dw_input=conv1x1_few.DwInput(other, None, None, None, None))
