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
    # conv_direct_rows (rows of at least 24 pixels)
    (1, 3, 20, 50, 32, 3, 3, 1, 1, 2, 2, 1, 1),     # stride 2, last tile moved back (25)
    (2, 3, 9, 61, 13, 3, 3, 1, 1, 1, 1, 1, 1),      # stride 1, odd width, 2 images
    (1, 2, 13, 63, 6, 3, 3, 0, 0, 2, 2, 1, 1),      # stride 2, no padding, odd width
    (1, 3, 11, 62, 5, 7, 7, 3, 3, 2, 2, 1, 1),      # 7 x 7 (ResNet's first layer, shrunk)
    (1, 4, 12, 40, 9, 3, 3, 2, 2, 1, 1, 2, 2),      # dilation 2
    (1, 3, 16, 54, 7, 3, 3, 2, 3, 2, 2, 1, 2),      # stride 2, odd dilated taps, odd padding
    (3, 1, 5, 48, 4, 1, 3, 0, 2, 1, 1, 1, 1),       # 1 x 3, padding past a tap, 3 images
    (2, 3, 7, 49, 3, 5, 5, 2, 2, 3, 2, 1, 1),       # stride 3 down the columns
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
    with monkeypatch.context() as m:
        m.setattr(d.dev, "is_cpu", True)
        m.setattr(conv_ops, "DIRECT_MAX_IMAGES", 64)
        m.setattr(conv_ops, "DIRECT_MAX_FEW_IMAGES_OUT_CHANNELS", 1 << 20)
        assert conv_ops.direct_forward(d.dev, g)
        launches = conv_ops.forward(d.dev, g, *args, **kw)
        want = "conv_direct_rows" if conv_ops.direct_rows(d.dev, g) else "conv_direct_fwd"
    assert [ln.name for ln in launches] == [want]
    return launches


GEOM_IDS = ["mobilenet", "stride1", "nopad", "dilation", "1x3", "short-rows", "rows-s2",
            "rows-s1", "rows-nopad", "rows-7x7", "rows-dilation", "rows-odd-taps", "rows-1x3",
            "rows-sh3"]


def _check(d, rng, monkeypatch, g, rows, cases):
    """Both kernels: conv_direct_rows where it applies (``rows``), else
    conv_direct_fwd (DIRECT_ROWS off), for each (bias?, act) of ``cases``."""
    monkeypatch.setattr(conv_ops, "DIRECT_ROWS", rows)
    monkeypatch.setattr(conv_ops, "DIRECT_ROWS_STRIDES", (1, 2))  # the kernel's both
    monkeypatch.setattr(conv_ops, "DIRECT_MAX_TAPS", 49)    # the 7 x 7 geometry
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    xb, wb, bb = d.buf(x), d.buf(w), d.buf(b)
    for with_bias, act in cases:
        v = _acts(_ref(x, w, b if with_bias else None, g))[act]
        yb = d.buf(np.full(yshape, np.nan))
        d.run(_launches(d, monkeypatch, g, xb, wb, yb, None, bias=bb if with_bias else None,
                        act=act))
        assert rel_err(d.get(yb, yshape), v) < 1e-5, (act, with_bias)


@pytest.mark.parametrize("i", range(len(GEOMS)), ids=GEOM_IDS)
@pytest.mark.parametrize("rows", [True, False], ids=["rows", "fwd"])
def test_direct_forward(d, rng, i, rows, monkeypatch):
    """Every geometry on each kernel that takes it, with or without a bias
    and one activation kind (by turns: every kind compiles a program, and
    PoCL builds them slowly; test_direct_forward_acts runs them all)."""
    g = conv_ops.ConvGeometry(*GEOMS[i])
    monkeypatch.setattr(conv_ops, "DIRECT_ROWS_STRIDES", (1, 2))
    if rows != conv_ops.direct_rows(d.dev, g):
        pytest.skip("the other kernel's geometry" if rows else "run by conv_direct_rows")
    acts = list(_acts(np.zeros(1)))
    _check(d, rng, monkeypatch, g, rows, [(i % 2 == 0, acts[i % len(acts)])])


@pytest.mark.parametrize("rows", [True, False], ids=["rows", "fwd"])
def test_direct_forward_acts(d, rng, rows, monkeypatch):
    """Each activation kind, with and without a bias, on both kernels."""
    g = conv_ops.ConvGeometry(1, 2, 6, 52, 5, 3, 3, 1, 1, 2, 2)
    assert conv_ops.direct_rows(d.dev, g)       # stride 2: the rule's own choice
    _check(d, rng, monkeypatch, g, rows,
           [(bias, act) for bias in (True, False) for act in _acts(np.zeros(1))])


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
    channels, or 32 for at most 4 images (one in deterministic mode), or 64
    at any batch on conv_direct_rows (stride 2, rows of at least 24
    pixels); off by the setting."""
    G = conv_ops.ConvGeometry
    monkeypatch.setattr(d.dev, "is_cpu", True)
    first = G(1, 3, 224, 224, 32, 3, 3, 1, 1, 2, 2)
    assert conv_ops.direct_forward(d.dev, first)
    assert conv_ops.direct_forward(d.dev, G(16, 3, 224, 224, 16, 3, 3, 1, 1, 2, 2))
    batch = G(16, 3, 224, 224, 32, 3, 3, 1, 1, 1, 1)
    assert not conv_ops.direct_forward(d.dev, batch)
    with config.override(DETERMINISTIC=True):
        assert conv_ops.direct_forward(d.dev, batch)
    # stride 2 along rows: conv_direct_rows, up to 64 output channels at any batch
    assert conv_ops.direct_rows(d.dev, first)
    assert conv_ops.direct_forward(d.dev, G(16, 3, 224, 224, 64, 3, 3, 1, 1, 2, 2))
    assert not conv_ops.direct_forward(d.dev, G(16, 3, 224, 224, 65, 3, 3, 1, 1, 2, 2))
    assert not conv_ops.direct_forward(d.dev, G(1, 3, 224, 224, 48, 3, 3, 1, 1, 1, 1))
    assert not conv_ops.direct_rows(d.dev, batch)                      # stride 1
    assert not conv_ops.direct_rows(d.dev, G(1, 3, 40, 40, 32, 3, 3, 1, 1, 2, 2))  # rows of 20
    monkeypatch.setattr(conv_ops, "DIRECT_ROWS", False)
    assert not conv_ops.direct_rows(d.dev, first)
    monkeypatch.setattr(conv_ops, "DIRECT_ROWS", True)
    assert not conv_ops.direct_forward(d.dev, G(1, 3, 224, 224, 64, 7, 7, 3, 3, 2, 2))
    assert conv_ops.direct_forward(d.dev, G(1, 3, 224, 224, 64, 3, 3, 0, 0, 2, 2))  # SqueezeNet
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

