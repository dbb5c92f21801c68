"""Convolution forwards whose outer taps read only padding run as the
convolution of the live taps (ops/conv_taps.py): DeepLab v3's ASPP
branches (3 x 3, dilation 24 / 36 on 14 x 14 or 28 x 28) become 1 x 1
layers. Checked: which taps are live (against a brute-force walk over the
outputs), the forwards against float64 on every kernel family they land on
(GEMM, channel-vector, 1x1, depthwise, grouped, strided), bias + activation,
weights written after the first pass, slices and residuals, and a layer's
gradients (backward keeps the whole kernel)."""
import itertools

import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import conv_taps
from caffe_ocl.testing import check_gradient, forward, make_layer
from refs import rel_err
from test_small_batch_gpu import _conv_ref

G = conv_ops.ConvGeometry
RELU = ("relu", 0.1)


def _live_brute(out, stride, pad, dil, taps, size):
    live = [t for t in range(taps)
            if any(0 <= o * stride - pad + t * dil < size for o in range(out))]
    return (live[0], live[-1]) if live else None


def test_live_taps_match_a_walk_over_the_outputs():
    for n, k, s, p, d in itertools.product([1, 2, 3, 7, 14], [1, 2, 3, 5], [1, 2, 3],
                                           [0, 1, 3, 12], [1, 2, 12, 36]):
        out = (n + 2 * p - ((k - 1) * d + 1)) // s + 1
        if out >= 1:
            assert conv_taps._live(out, s, p, d, k, n) == _live_brute(out, s, p, d, k, n), \
                (n, k, s, p, d)


def test_aspp_branches_become_1x1():
    """MobileNet v3 DeepLab at 224: a 14 x 14 map; ResNet-50 DeepLab: 28 x 28."""
    for hw, d, pruned in [(14, 12, False), (14, 24, True), (14, 36, True),
                          (28, 12, False), (28, 24, False), (28, 36, True)]:
        g = G(1, 960, hw, hw, 256, 3, 3, d, d, 1, 1, d, d)
        p = conv_taps.pruned(g)
        assert (p is not None) == pruned, (hw, d)
        if p:
            g2, kh0, kw0 = p
            assert g2.is_1x1 and (kh0, kw0) == (1, 1)
            assert (g2.out_h, g2.out_w) == (g.out_h, g.out_w)
    assert conv_taps.pruned(G(1, 8, 14, 14, 8, 3, 3, 1, 1)) is None      # every tap live
    with config.override(CONV_PRUNE_TAPS=False):
        assert conv_taps.pruned(G(1, 8, 14, 14, 8, 3, 3, 24, 24, 1, 1, 24, 24)) is None


def test_windows_off_centre_and_refused():
    # 5 x 5 on a 2 x 2 plane: the middle 3 x 3 (pad 2 -> 1)
    g2, kh0, kw0 = conv_taps.pruned(G(1, 4, 2, 2, 4, 5, 5, 2, 2))
    assert (g2.kh, g2.kw, g2.ph, g2.pw, kh0, kw0) == (3, 3, 1, 1, 1, 1)
    # 7 x 7 stride 2 on 2 x 2 (one output): taps 3-4 of each axis, no padding
    g2, kh0, kw0 = conv_taps.pruned(G(1, 4, 2, 2, 4, 7, 7, 3, 3, 2, 2))
    assert (g2.kh, g2.kw, g2.ph, g2.pw, g2.sh, kh0) == (2, 2, 0, 0, 2, 3)
    # a window that would need more padding after the plane than before it
    # (1 x 1 plane, 2 x 2 stride 2 pad 2: only tap 0 live, but a 1 x 1
    # kernel with pad 2 gives 3 outputs, not 2) is left alone
    g = G(1, 4, 1, 1, 4, 2, 2, 2, 2, 2, 2)
    assert conv_taps._live(g.out_h, g.sh, g.ph, g.dh, g.kh, g.height) == (0, 0)
    assert conv_taps.pruned(g) is None


CASES = [
    (1, 6, 5, 5, 7, 3, 3, 24, 24, 1, 1, 24, 24),      # ASPP-like: 1 x 1
    (2, 5, 6, 4, 3, 3, 3, 4, 4, 1, 1, 4, 4),          # rows and columns differ
    (1, 4, 2, 3, 6, 5, 5, 2, 2),                      # 5 x 5 -> 3 x 3 window
    (2, 3, 2, 2, 5, 7, 7, 3, 3, 2, 2),                # strided, 2 x 2 window
    (1, 8, 3, 3, 8, 3, 3, 6, 6, 1, 1, 6, 6, 8),       # depthwise -> per-channel scale
    (1, 8, 4, 4, 6, 3, 3, 5, 5, 1, 1, 5, 5, 2),       # grouped
    (3, 16, 7, 7, 24, 3, 3, 12, 12, 1, 1, 12, 12),    # batch of 3, 16 channels
]


def _case(rng, p):
    g = G(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    return g, x, w, b


@pytest.mark.parametrize("p", CASES, ids=["aspp", "rows-cols", "5x5", "stride2", "depthwise",
                                          "grouped", "batch3"])
def test_forward_matches_float64(d, rng, p):
    g, x, w, b = _case(rng, p)
    assert conv_taps.pruned(g) is not None
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    want = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    want = np.where(want > 0, want, 0.1 * want)
    cf = conv_ops.workspace_floats(d.dev, g)
    col = d.dev.alloc(4 * cf) if cf else None
    wb = d.buf(w)
    yb = d.buf(np.full(yshape, np.nan))
    launches = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, bias=d.buf(b), act=RELU,
                                weight_version=lambda: 1)
    copies = ("crop_rows", "crop_copy")          # the weights' window (ops/shape.py)
    assert launches[0].name in copies
    d.run(launches)
    assert rel_err(d.get(yb, yshape), want) < 1e-5
    with config.override(CONV_PRUNE_TAPS=False):        # the whole kernel: the same sums
        whole = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, bias=d.buf(b), act=RELU,
                                 weight_version=lambda: 1)
    assert not set(copies) & {ln.name for ln in whole}
    d.run(whole)
    assert rel_err(d.get(yb, yshape), want) < 1e-5


def test_weights_written_later_are_read(d, rng):
    """The window is copied again when the weight version moves (an
    inference net's weights changed by the user or a solver)."""
    g, x, w, b = _case(rng, CASES[0])
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    version = [1]
    wb, yb = d.buf(w), d.buf(np.zeros(yshape))
    launches = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, None, bias=d.buf(b),
                                weight_version=lambda: version[0])
    d.run(launches)
    w2 = rng.standard_normal(w.shape)
    d.dev.upload(wb, w2.astype(np.float32))
    d.run(launches)                          # same version: the old window, as before
    assert rel_err(d.get(yb, yshape), _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)) < 1e-5
    version[0] = 2
    d.run(launches)
    assert rel_err(d.get(yb, yshape), _conv_ref(x, w2, g) + b.reshape(1, -1, 1, 1)) < 1e-5


def test_slice_and_residual(d, rng):
    """A pruned forward writes into a Concat's slice, or adds a residual,
    wherever the smaller convolution's kernels can; else the whole kernel
    runs (never an error the plan did not expect)."""
    g, x, w, b = _case(rng, CASES[6])
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    want = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    r = rng.standard_normal(yshape)
    if conv_ops.writes_residual(d.dev, g):
        yb = d.buf(np.full(yshape, np.nan))
        d.run(conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                               residual=d.buf(r)))
        assert rel_err(d.get(yb, yshape), want + r) < 1e-5
    if conv_ops.writes_slices(d.dev, g):
        total = g.out_channels + 5
        big = np.full((g.num, total, g.out_h, g.out_w), np.nan)
        yb = d.buf(big)
        d.run(conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                               y_off=2 * g.out_spatial, y_channels=total))
        got = d.get(yb, big.shape)
        assert rel_err(got[:, 2:2 + g.out_channels], want) < 1e-5
        assert np.isnan(got[:, :2]).all() and np.isnan(got[:, 2 + g.out_channels:]).all()


def test_layer_forward_and_gradients():
    """A Convolution layer (dilation 6 on a 5 x 5 map: only the centre taps
    live) forward against float64, and its gradients: the backward keeps
    the whole kernel, the dead taps' weight gradients stay zero."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, 3, 5, 5))
    text = ('type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 '
            'pad: 6 dilation: 6 weight_filler { type: "uniform" min: -0.5 max: 0.5 } '
            'bias_filler { type: "uniform" min: -0.2 max: 0.2 } }')
    layer, bl, tops = make_layer(text, [x])
    y = forward(layer, bl, tops)[0]
    w, b = (blob.host_data().astype(np.float64) for blob in layer.blobs)
    g = G(2, 3, 5, 5, 4, 3, 3, 6, 6, 1, 1, 6, 6)
    want = _conv_ref(x.astype(np.float32).astype(np.float64), w, g) + b.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    check_gradient(layer, bl, tops, stepsize=1e-2, threshold=1e-2, max_checks=40)


@pytest.mark.parametrize("p", [(1, 16, 7, 7, 32, 3, 3, 4, 4, 1, 1, 4, 4),     # tiles cross rows
                               (2, 8, 9, 9, 16, 3, 3, 5, 5, 2, 2, 5, 5),      # strided
                               (1, 24, 14, 14, 16, 3, 3, 12, 12, 1, 1, 12, 12),  # ASPP 14x14
                               (1, 16, 5, 9, 24, 3, 5, 3, 6, 1, 1, 3, 3),     # 3 x 5, unequal
                               (3, 16, 7, 7, 20, 3, 3, 4, 4, 1, 1, 4, 4)],    # 3 images
                         ids=["7x7", "stride2", "aspp14", "3x5", "batch3"])
def test_channel_vector_kernel_skips_padding_taps(d, rng, p):
    """Every tap live somewhere, most of them only near the far side: the
    CPU channel-vector kernel skips, tile by tile, the taps that read only
    padding (TAP_MASK): float64 results, and the same sums as the plain
    loop."""
    if not d.dev.is_cpu:
        pytest.skip("the channel-vector kernel runs on CPU drivers")
    g, x, w, b = _case(rng, p)
    assert conv_taps.pruned(g) is None and conv_ops.chanvec_tap_mask(g)
    assert conv_ops.chanvec_forward(d.dev, g)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    want = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    want = np.where(want > 0, want, 0.1 * want)
    cf = conv_ops.workspace_floats(d.dev, g)
    col = d.dev.alloc(4 * cf) if cf else None
    xb, wb, bb = d.buf(x), d.buf(w), d.buf(b)
    outs = []
    for min_dead in (conv_ops.CHANVEC_TAP_MASK_MIN_DEAD, 2.0):     # masked, then plain
        yb = d.buf(np.full(yshape, np.nan))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_ops, "CHANVEC_TAP_MASK_MIN_DEAD", min_dead)
            launches = conv_ops.forward(d.dev, g, xb, wb, yb, col, bias=bb, act=RELU,
                                        weight_version=lambda: 1)
        assert "conv_chanvec" in [ln.name for ln in launches]
        d.run(launches)
        outs.append(d.get(yb, yshape))
    assert rel_err(outs[0], want) < 1e-5
    np.testing.assert_array_equal(outs[0], outs[1])
