"""The CPU drivers' 1x1 convolutions read straight from the images
(kernels/conv1x1_rows.cl, ops/conv.py pointwise_rows) against a float64
reference: output channels not a multiple of the 4-channel blocks, planes
not a multiple of the 24-pixel runs (the last run moved back), planes past
one chunk of pixels (several work-items an image), chunks of many runs
(each block of channels going over 4 at a time), exactly one run,
several images, bias or none, each activation kind, a residual added
before the activation; and the rule."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from refs import rel_err

G = conv_ops.ConvGeometry
GEOMS = [  # (n, c, h, w, co): 1x1, stride 1, no padding
    (1, 16, 12, 12, 13),     # 144 pixels: runs of 24 exactly, 13 channels
    (2, 8, 7, 11, 4),        # 77 pixels: the last run moved back, 2 images
    (1, 5, 15, 15, 6),       # 225 pixels: 3 chunks of 96, the last one short
    (3, 3, 4, 6, 9),         # 24 pixels: one run, 3 images
    (1, 5, 30, 30, 5),       # 900 pixels: chunks of 4 runs, the last of 9.5
    (1, 6, 60, 61, 6),       # 3660 pixels: chunks of 18 runs, blocks over 4 at a time
]


def _ref(x, w, b, r):
    y = np.einsum("mk,nkp->nmp", w, x.reshape(x.shape[0], x.shape[1], -1))
    if b is not None:
        y = y + b[None, :, None]
    if r is not None:
        y = y + r.reshape(y.shape)
    return y


ACTS = {None: lambda v: v, ("relu", 0.1): lambda v: np.where(v > 0, v, 0.1 * v),
        ("clip", 0.0, 6.0): lambda v: np.clip(v, 0.0, 6.0),
        ("hardswish", 1 / 6, 0.5): lambda v: v * np.clip(v / 6 + 0.5, 0, 1)}


@pytest.fixture
def cpu_driver(d):
    if not d.dev.is_cpu:
        pytest.skip("a CPU-driver kernel (the rule's test runs everywhere)")


@pytest.mark.usefixtures("cpu_driver")
@pytest.mark.parametrize("i", range(len(GEOMS)))
def test_pointwise_rows_forward(d, rng, monkeypatch, i):
    n, c, h, w_, co = GEOMS[i]
    g = G(n, c, h, w_, co, 1, 1)
    monkeypatch.setattr(conv_ops, "POINTWISE_ROWS_MAX_WEIGHTS", 1 << 20)
    monkeypatch.setattr(conv_ops, "CHANVEC_SMALL_PIXELS", 0)    # the rule's small planes
    monkeypatch.setattr(conv_ops, "CHANVEC_MAX_PIXELS", 0)
    assert conv_ops.pointwise_rows(d.dev, g)
    x = rng.standard_normal((n, c, h, w_))
    wt = rng.standard_normal((co, c))
    b = rng.standard_normal(co)
    r = rng.standard_normal((n, co, h, w_))
    xb, wb, bb, rb = d.buf(x), d.buf(wt), d.buf(b), d.buf(r)
    col = d.buf(np.zeros(max(conv_ops.workspace_floats(d.dev, g), 1)))
    cases = [(True, None, False), (False, ("relu", 0.1), False), (True, ("clip", 0.0, 6.0), True),
             (False, ("hardswish", 1 / 6, 0.5), True)]
    for bias, act, res in cases:
        y = d.buf(np.full((n, co, h, w_), np.nan))
        launches = conv_ops.forward(d.dev, g, xb, wb, y, col, bias=bb if bias else None,
                                    act=act, residual=rb if res else None)
        assert [ln.name for ln in launches] == ["conv1x1_rows"]
        d.run(launches)
        want = ACTS[act](_ref(x, wt, b if bias else None, r if res else None))
        assert rel_err(d.get(y, (n, co, h * w_)), want) < 1e-5, (bias, act, res)


def test_pointwise_rows_rule(d, monkeypatch):
    """CPU drivers, 1x1 stride 1 unpadded one-group layers on planes the
    channel-vector kernel does not take, weights of at most 10 K floats;
    off by the constant, and on GPUs."""
    monkeypatch.setattr(d.dev, "is_cpu", True)
    rule = lambda *a: conv_ops.pointwise_rows(d.dev, G(*a))   # noqa: E731
    assert rule(1, 32, 112, 112, 16, 1, 1)
    assert rule(16, 24, 56, 56, 144, 1, 1)          # expanding on 56 x 56, any batch
    assert rule(1, 192, 28, 28, 32, 1, 1)
    assert rule(1, 240, 28, 28, 40, 1, 1)           # 9600 floats of weights
    assert not rule(1, 64, 56, 56, 256, 1, 1)       # 16 K
    assert not rule(1, 32, 112, 112, 16, 1, 1, 0, 0, 2, 2)     # strided
    assert not rule(1, 32, 112, 112, 16, 3, 3, 1, 1)           # 3 x 3
    assert not rule(1, 32, 112, 112, 32, 1, 1, 0, 0, 1, 1, 1, 1, 2)   # groups
    assert not rule(1, 64, 7, 7, 32, 1, 1)          # the channel-vector kernel's plane
    with config.override(DETERMINISTIC=True):
        assert rule(1, 32, 112, 112, 16, 1, 1)      # one kernel at every batch anyway
    monkeypatch.setattr(conv_ops, "POINTWISE_ROWS", False)
    assert not rule(1, 32, 112, 112, 16, 1, 1)
    monkeypatch.setattr(conv_ops, "POINTWISE_ROWS", True)
    monkeypatch.setattr(d.dev, "is_cpu", False)
    assert not rule(1, 32, 112, 112, 16, 1, 1)


@pytest.mark.usefixtures("cpu_driver")
@pytest.mark.parametrize("per_image", [False, True], ids=["one-gate", "gate-per-image"])
def test_pointwise_rows_gated(d, rng, monkeypatch, per_image):
    """An SE gate on the input channels (x[n, k] * gate[n * stride + k]):
    the weights scaled in local memory once per image a work-item runs
    (12 images of 50 pixels: work-items running two images each), with a
    residual."""
    n, c, h, w_, co = 12, 6, 5, 10, 7
    g = G(n, c, h, w_, co, 1, 1)
    monkeypatch.setattr(conv_ops, "CHANVEC_SMALL_PIXELS", 0)
    monkeypatch.setattr(conv_ops, "CHANVEC_MAX_PIXELS", 0)
    assert conv_ops.pointwise_takes_gate(d.dev, g)
    with config.override(SE_GATED_1X1=True):
        assert conv_ops.takes_gate(d.dev, g)
    x = rng.standard_normal((n, c, h, w_))
    wt = rng.standard_normal((co, c))
    b = rng.standard_normal(co)
    r = rng.standard_normal((n, co, h, w_))
    gate = rng.uniform(0, 1, (n, c) if per_image else (c,))
    xs = x * gate.reshape(-1, c, 1, 1)
    y = d.buf(np.full((n, co, h, w_), np.nan))
    col = d.buf(np.zeros(max(conv_ops.workspace_floats(d.dev, g), 1)))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(wt), y, col, bias=d.buf(b),
                                act=("relu", 0.0), residual=d.buf(r), gate=d.buf(gate),
                                gate_stride=c if per_image else 0)
    assert [ln.name for ln in launches] == ["conv1x1_rows"]
    d.run(launches)
    want = np.maximum(_ref(xs, wt, b, r), 0)
    assert rel_err(d.get(y, (n, co, h * w_)), want) < 1e-5
    monkeypatch.setattr(conv_ops, "POINTWISE_ROWS_GATE", False)
    assert not conv_ops.pointwise_takes_gate(d.dev, g)
