"""R-FCN's PSROIPooling and the YOLO v2 ports' Reorg (layers/fork_detect.py)
against float64 NumPy references worked from the forks' source, with
gradient checks."""
import math

import numpy as np
import pytest

from caffe_ocl import LayerError, ShapeError
from caffe_ocl.testing import check_gradient, forward, make_layer


def _round(v):
    """C's round(): halves away from zero."""
    return math.floor(abs(v) + 0.5) * (1 if v >= 0 else -1)


def psroi_bins(roi, scale, g, h, w):
    """The bins of PSROIPoolingForward (caffe-rfcn psroi_pooling_layer.cu),
    its float arithmetic in float32 as the fork's."""
    f = np.float32
    sw, sh = f(_round(roi[1])) * f(scale), f(_round(roi[2])) * f(scale)
    ew, eh = f(_round(roi[3]) + 1) * f(scale), f(_round(roi[4]) + 1) * f(scale)
    rw, rh = max(ew - sw, f(0.1)), max(eh - sh, f(0.1))
    bh, bw = rh / f(g), rw / f(g)
    for ph in range(g):
        for pw in range(g):
            hs = min(max(math.floor(f(ph) * bh + sh), 0), h)
            ws = min(max(math.floor(f(pw) * bw + sw), 0), w)
            he = min(max(math.ceil(f(ph + 1) * bh + sh), 0), h)
            we = min(max(math.ceil(f(pw + 1) * bw + sw), 0), w)
            yield ph, pw, hs, he, ws, we


def psroi_ref(x, rois, dim, g, scale):
    n, c, h, w = x.shape
    y = np.zeros((len(rois), dim, g, g))
    for r, roi in enumerate(rois):
        b = int(roi[0])
        for ph, pw, hs, he, ws, we in psroi_bins(roi, scale, g, h, w):
            if he <= hs or we <= ws:
                continue
            for ct in range(dim):
                y[r, ct, ph, pw] = x[b, (ct * g + ph) * g + pw, hs:he, ws:we].mean()
    return y


ROIS = np.array([[0, 0, 0, 39, 47],       # the whole image at scale 1/4
                 [1, 5, 6, 20, 30],
                 [0, 12, 3, 13, 4],       # smaller than the bins
                 [1, 30, 30, 25, 20],     # malformed: at least 0.1 wide
                 [0, 60, 60, 80, 80],     # outside the image: zeros
                 [1, -8, -8, 10, 6.4]])   # partly outside, fractional corner


@pytest.mark.parametrize("dim,g", [(2, 3), (3, 2), (1, 1)])
def test_psroi_pooling(rng, dim, g):
    x = rng.standard_normal((2, dim * g * g, 12, 10))
    text = (f'type: "PSROIPooling" psroi_pooling_param {{ spatial_scale: 0.25 '
            f'output_dim: {dim} group_size: {g} }}')
    layer, b, t = make_layer(text, [x, ROIS])
    (y,) = forward(layer, b, t)
    assert y.shape == (6, dim, g, g)
    np.testing.assert_allclose(y, psroi_ref(x, ROIS, dim, g, 0.25), rtol=1e-5, atol=1e-6)
    assert not y[4].any()
    check_gradient(layer, b, t, check_bottom=[0], stepsize=1e-2)


def test_psroi_pooling_bad_input(rng):
    x = rng.standard_normal((1, 8, 4, 4))
    with pytest.raises(ShapeError, match="output_dim \\* group_size"):
        make_layer('type: "PSROIPooling" psroi_pooling_param { output_dim: 2 group_size: 3 }',
                   [x, ROIS[:1]])
    with pytest.raises(LayerError, match="positive"):
        make_layer('type: "PSROIPooling" psroi_pooling_param { output_dim: 0 group_size: 2 }',
                   [x, ROIS[:1]])


def reorg_ref(x, s, forward):
    """darknet's reorg_cpu(x, w, h, c, batch, stride, forward, out) with the
    bottom's dims, flat in and out."""
    n, c, h, w = x.shape
    flat, out = x.ravel(), np.zeros(x.size)
    oc = c // (s * s)
    for b in range(n):
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    ii = i + w * (j + h * (k + c * b))
                    c2, off = k % oc, k // oc
                    w2, h2 = i * s + off % s, j * s + off // s
                    oi = w2 + w * s * (h2 + h * s * (c2 + oc * b))
                    if forward:
                        out[oi] = flat[ii]
                    else:
                        out[ii] = flat[oi]
    return out


@pytest.mark.parametrize("shape,s,reverse,top",
                         [((2, 8, 4, 6), 2, False, (2, 32, 2, 3)),
                          ((1, 9, 6, 3), 3, False, (1, 81, 2, 1)),
                          ((2, 8, 2, 3), 2, True, (2, 2, 4, 6))])
def test_reorg(rng, shape, s, reverse, top):
    x = rng.standard_normal(shape)
    extra = " reverse: true" if reverse else ""
    layer, b, t = make_layer(f'type: "Reorg" reorg_param {{ stride: {s}{extra} }}', [x])
    (y,) = forward(layer, b, t)
    assert y.shape == top
    np.testing.assert_array_equal(y.ravel(), reorg_ref(x, s, reverse).astype(np.float32))
    check_gradient(layer, b, t)


def test_reorg_bad_shape(rng):
    with pytest.raises(ShapeError, match="divide by stride"):
        make_layer('type: "Reorg" reorg_param { stride: 2 }', [rng.standard_normal((1, 4, 3, 4))])
