"""The CPU drivers' direct convolution forward for few input channels
(kernels/conv_direct.cl, ops/conv.py direct_forward): a net's first layer
against a float64 reference over the shapes its code paths split on --
vector blocks of 8 pixels at stride 1 and 2, the last block moved back to
the row's end, pixels whose taps reach into the padding, rows too short
for a vector block, output channels not a multiple of 8, dilation, bias or
none, each activation kind, several images, and an output written into a
Concat's channel slice. The launches are made as for a CPU driver
whatever device runs them."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from refs import rel_err

# (n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw)
GEOMS = [
    (1, 3, 32, 32, 32, 3, 3, 1, 1, 2, 2, 1, 1),     # MobileNet's first layer, shrunk
    (2, 3, 19, 37, 13, 3, 3, 1, 1, 1, 1, 1, 1),     # stride 1, 13 channels, 2 images
    (1, 1, 20, 29, 8, 3, 3, 0, 0, 2, 2, 1, 1),      # no padding, odd width
    (1, 4, 12, 30, 9, 3, 3, 2, 2, 1, 1, 2, 2),      # dilation 2
    (1, 2, 9, 17, 5, 1, 3, 0, 2, 1, 1, 1, 1),       # 1 x 3, padding past a tap
    (1, 3, 10, 16, 6, 3, 3, 1, 1, 2, 2, 1, 1),      # 8 pixels: the scalar path only
]


def _ref(x, w, b, g):
    n = x.shape[0]
    xp = np.zeros((n, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw))
    xp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width] = x
    y = np.zeros((n, g.out_channels, g.out_h, g.out_w))
    for i in range(g.kh):
        for j in range(g.kw):
            patch = xp[:, :, i * g.dh: i * g.dh + g.sh * (g.out_h - 1) + 1: g.sh,
                       j * g.dw: j * g.dw + g.sw * (g.out_w - 1) + 1: g.sw]
            y += np.einsum("mc,nchw->nmhw", w[:, :, i, j], patch)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def _acts(v):
    return {None: v, ("relu", 0.1): np.where(v > 0, v, 0.1 * v),
            ("clip", 0.0, 6.0): np.clip(v, 0.0, 6.0),
            ("swish", 1.0): v / (1.0 + np.exp(-v))}


def _launches(d, monkeypatch, g, *args, **kw):
    """The direct kernel's launches for ``g``, also where the rule would
    give a batch of wider layers to the GEMM."""
    monkeypatch.setattr(d.dev, "is_cpu", True)
    monkeypatch.setattr(conv_ops, "DIRECT_MAX_IMAGES", 64)
    monkeypatch.setattr(conv_ops, "DIRECT_MAX_FEW_IMAGES_OUT_CHANNELS", 1 << 20)
    assert conv_ops.direct_forward(d.dev, g)
    launches = conv_ops.forward(d.dev, g, *args, **kw)
    monkeypatch.undo()
    assert [ln.name for ln in launches] == ["conv_direct_fwd"]
    return launches


@pytest.mark.parametrize("p", GEOMS, ids=["mobilenet", "stride1", "nopad", "dilation",
                                          "1x3", "short-rows"])
def test_direct_forward(d, rng, p, monkeypatch):
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    xb, wb, bb = d.buf(x), d.buf(w), d.buf(b)
    for bias in (bb, None):
        want = _acts(_ref(x, w, b if bias is not None else None, g))
        for act, v in want.items():
            yb = d.buf(np.full(yshape, np.nan))
            d.run(_launches(d, monkeypatch, g, xb, wb, yb, None, bias=bias, act=act))
            assert rel_err(d.get(yb, yshape), v) < 1e-5, (act, bias is None)


def test_direct_forward_into_concat_slice(d, rng, monkeypatch):
    """y_off / y_channels: the images' outputs land in channels 5..17 of a
    30-channel blob; the rest untouched."""
    g = conv_ops.ConvGeometry(2, 3, 11, 20, 13, 3, 3, 1, 1, 1, 1)
    x = rng.standard_normal((2, 3, 11, 20))
    w = rng.standard_normal((13, 3, 3, 3))
    big = rng.standard_normal((2, 30, 11, 20))
    yb = d.buf(big)
    d.run(_launches(d, monkeypatch, g, d.buf(x), d.buf(w), yb, None, act=("relu", 0.0),
                    y_off=5 * 11 * 20, y_channels=30))
    got = d.get(yb, big.shape)
    v = _ref(x, w, None, g)
    assert rel_err(got[:, 5:18], np.maximum(v, 0)) < 1e-5
    np.testing.assert_array_equal(got[:, :5], big[:, :5].astype(np.float32))
    np.testing.assert_array_equal(got[:, 18:], big[:, 18:].astype(np.float32))


def test_direct_forward_rule(d, monkeypatch):
    """CPU drivers, automatic algorithm, one group, at most 4 input
    channels and 9 taps, rows of at least 8 pixels, at most 16 output
    channels, or 32 for at most 4 images (one in deterministic mode); off
    by the setting."""
    G = conv_ops.ConvGeometry
    monkeypatch.setattr(d.dev, "is_cpu", True)
    first = G(1, 3, 224, 224, 32, 3, 3, 1, 1, 2, 2)
    assert conv_ops.direct_forward(d.dev, first)
    assert conv_ops.direct_forward(d.dev, G(16, 3, 224, 224, 16, 3, 3, 1, 1, 2, 2))
    batch = G(16, 3, 224, 224, 32, 3, 3, 1, 1, 2, 2)
    assert not conv_ops.direct_forward(d.dev, batch)
    with config.override(DETERMINISTIC=True):
        assert conv_ops.direct_forward(d.dev, batch)
    assert not conv_ops.direct_forward(d.dev, G(1, 3, 224, 224, 64, 7, 7, 3, 3, 2, 2))
    assert not conv_ops.direct_forward(d.dev, G(1, 3, 224, 224, 64, 3, 3, 0, 0, 2, 2))
    assert not conv_ops.direct_forward(d.dev, G(1, 8, 56, 56, 32, 3, 3, 1, 1))
    assert not conv_ops.direct_forward(d.dev, G(1, 4, 56, 56, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2))
    assert not conv_ops.direct_forward(d.dev, G(1, 3, 7, 7, 32, 3, 3, 1, 1))
    with config.override(CPU_DIRECT_CONV=False):
        assert not conv_ops.direct_forward(d.dev, first)
    buf = d.buf(np.zeros(3 * 16 * 16 * 8))
    g = G(1, 3, 16, 16, 8, 3, 3, 1, 1)
    names = [ln.name for ln in conv_ops.forward(d.dev, g, buf, buf, buf, buf, algo="im2col")]
    assert "conv_direct_fwd" not in names          # asked for by name: the GEMM
    monkeypatch.setattr(d.dev, "is_cpu", False)
    assert not conv_ops.direct_forward(d.dev, first)

