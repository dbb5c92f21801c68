"""Max pooling without an argmax mask and average pooling on CPU drivers
by bands of -FLT_MAX- / zero-padded rows (pooling.cl max_pool_fwd_band,
ave_pool_fwd_band; ops.pool.max_forward, ave_forward):
against a float64 reference of Caffe's MAX pooling (windows clipped to the
image, ceil-mode output sizes) -- padding, strides 1, 2 and 3, rows under
8 outputs, 2x2 to 5x5 windows, bands split over a plane -- bit-equal to the
plane kernel it replaces (NaNs never chosen, as Caffe's ``>``; AVE
divided by Caffe's pool size, the window clipped to the padded image), and
the rules' choices."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import pool as pool_ops


@pytest.fixture(autouse=True)
def _cpu_only(d):
    if not d.dev.is_cpu:
        pytest.skip("a CPU-driver path")


def _out(h, k, s, p):
    o = -(-(h + 2 * p - k) // s) + 1
    if p and (o - 1) * s >= h + p:
        o -= 1
    return o


def _reference(x, k, s, p, out_hw):
    n, c, h, w = x.shape
    y = np.full((n, c) + out_hw, -np.finfo(np.float32).max, dtype=np.float64)
    for i in range(out_hw[0]):
        h0 = i * s[0] - p[0]
        h1, h0 = min(h0 + k[0], h), max(h0, 0)
        for j in range(out_hw[1]):
            w0 = j * s[1] - p[1]
            w1, w0 = min(w0 + k[1], w), max(w0, 0)
            win = x[:, :, h0:h1, w0:w1].reshape(n, c, -1)
            m = np.where(np.isnan(win), -np.inf, win).max(axis=2)
            y[:, :, i, j] = np.maximum(y[:, :, i, j], m)
    return y


# (n, c, h, w, k, s, p)
CASES = [
    (1, 3, 7, 7, 3, 1, 1),       # GoogLeNet's 3x3/1 pad 1 on 7 x 7: rows under 8
    (2, 2, 28, 28, 3, 1, 1),
    (1, 4, 11, 13, 3, 2, 0),     # ceil mode: the last window past the image
    (1, 2, 12, 12, 3, 2, 1),
    (1, 3, 9, 20, 2, 2, 0),
    (1, 2, 15, 17, 5, 3, 2),     # 25 taps, stride 3 (gathered loads)
    (1, 1, 5, 4, 3, 1, 1),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}x{c[3]}k{c[4]}s{c[5]}p{c[6]}" for c in CASES])
@pytest.mark.parametrize("small_bands", [False, True], ids=["bands", "small-bands"])
def test_band_pooling_equals_reference(d, rng, monkeypatch, case, small_bands):
    n, c, h, w, k, s, p = case
    if small_bands:     # bands of one or two output rows
        monkeypatch.setattr(pool_ops, "BAND_FLOATS", 2 * ((w + 2 * p + 8) * (k + s) + 32))
    out_hw = (_out(h, k, s, p), _out(w, k, s, p))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    x.flat[::7] = np.nan
    shape = (n, c) + out_hw
    xb = d.buf(x)
    yb, y0 = d.buf(np.zeros(shape)), d.buf(np.zeros(shape))
    launch = pool_ops.max_forward(d.dev, (n, c, h, w), out_hw, (k, k), (s, s), (p, p), xb, yb)
    assert launch.name == "max_pool_fwd_band"
    with config.override(CPU_POOL_BANDS=False):
        old = pool_ops.max_forward(d.dev, (n, c, h, w), out_hw, (k, k), (s, s), (p, p), xb, y0)
    assert old.name != "max_pool_fwd_band"
    d.run([launch, old])
    got = d.get(yb, shape)
    np.testing.assert_array_equal(got, _reference(x.astype(np.float64), (k, k), (s, s), (p, p),
                                                  out_hw).astype(np.float32))
    np.testing.assert_array_equal(got, d.get(y0, shape))


def _ave_reference(x, k, s, p, out_hw):
    """Caffe's AVE pooling: the sum over the window clipped to the image,
    divided by the window clipped to the padded image."""
    n, c, h, w = x.shape
    y = np.zeros((n, c) + out_hw)
    for i in range(out_hw[0]):
        h0 = i * s[0] - p[0]
        h1 = min(h0 + k[0], h + p[0])
        size_h = h1 - h0
        h0, h1 = max(h0, 0), min(h1, h)
        for j in range(out_hw[1]):
            w0 = j * s[1] - p[1]
            w1 = min(w0 + k[1], w + p[1])
            size = size_h * (w1 - w0)
            w0, w1 = max(w0, 0), min(w1, w)
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3)) / size
    return y


@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}x{c[3]}k{c[4]}s{c[5]}p{c[6]}" for c in CASES])
@pytest.mark.parametrize("small_bands", [False, True], ids=["bands", "small-bands"])
def test_band_average_pooling_equals_reference(d, rng, monkeypatch, case, small_bands):
    n, c, h, w, k, s, p = case
    if small_bands:
        monkeypatch.setattr(pool_ops, "BAND_FLOATS", 2 * ((w + 2 * p + 8) * (k + s) + 32))
    out_hw = (_out(h, k, s, p), _out(w, k, s, p))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    shape = (n, c) + out_hw
    xb = d.buf(x)
    yb, y0 = d.buf(np.zeros(shape)), d.buf(np.zeros(shape))
    geo = ((n, c, h, w), out_hw, (k, k), (s, s), (p, p))
    launch = pool_ops.ave_forward(d.dev, *geo, xb, yb)
    assert launch.name == "ave_pool_fwd_band"
    old = pool_ops.ave_forward(d.dev, *geo, xb, y0, impl="window")
    assert old.name == "ave_pool_fwd_cpu"
    d.run([launch, old])
    got = d.get(yb, shape)
    np.testing.assert_allclose(got, _ave_reference(x.astype(np.float64), (k, k), (s, s),
                                                   (p, p), out_hw), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got, d.get(y0, shape))


def test_average_rule(d, settings):
    """AVE by bands for windows up to 25 taps; global pooling, larger
    windows and the setting off keep the plane kernel."""
    settings(CPU_POOL_BANDS=True)
    x, y = d.buf(np.zeros(64)), d.buf(np.zeros(64))
    shape = (1, 1, 8, 8)
    ave = pool_ops.ave_forward
    assert ave(d.dev, shape, (8, 8), (3, 3), (1, 1), (1, 1), x, y).name == "ave_pool_fwd_band"
    assert ave(d.dev, shape, (1, 1), (8, 8), (1, 1), (0, 0), x, y).name == "ave_pool_fwd_cpu"
    assert ave(d.dev, shape, (2, 2), (6, 6), (2, 2), (0, 0), x, y).name == "ave_pool_fwd_cpu"
    settings(CPU_POOL_BANDS=False)
    assert ave(d.dev, shape, (8, 8), (3, 3), (1, 1), (1, 1), x, y).name == "ave_pool_fwd_cpu"


def test_rule(d, settings):
    """Bands without a mask and for windows up to 25 taps; the plane kernel
    with a mask (training), for larger windows, or with the setting off."""
    settings(CPU_POOL_BANDS=True)
    x, y = d.buf(np.zeros(64)), d.buf(np.zeros(64))
    shape, out = (1, 1, 8, 8), (4, 4)
    assert pool_ops.max_forward(d.dev, shape, out, (2, 2), (2, 2), (0, 0), x, y).name == \
        "max_pool_fwd_band"
    assert pool_ops.max_forward(d.dev, shape, out, (2, 2), (2, 2), (0, 0), x, y,
                                mask=d.buf(np.zeros(16))).name != "max_pool_fwd_band"
    assert pool_ops.max_forward(d.dev, shape, (1, 1), (6, 6), (1, 1), (0, 0), x, y).name != \
        "max_pool_fwd_band"
    settings(CPU_POOL_BANDS=False)
    assert pool_ops.max_forward(d.dev, shape, out, (2, 2), (2, 2), (0, 0), x, y).name != \
        "max_pool_fwd_band"
