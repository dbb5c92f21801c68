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
