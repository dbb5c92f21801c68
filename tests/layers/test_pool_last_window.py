"""Caffe's rule for padded pooling (PoolingLayer::Reshape): with pad > 0,
a last window that would start at or past the end of the image plus its
padding is dropped ((out - 1) * stride >= H + pad: out -= 1). Geometries
that hit the rule on one axis, on both, and (for contrast) on none."""
import numpy as np
import pytest

import refs
from caffe_ocl.testing import forward, make_layer

# (input H, W), kernel, stride, pad, the output (H, W) Caffe gives
CASES = [
    # H: ceil((5+2-2)/2)+1 = 4, (4-1)*2 = 6 >= 5+1 -> 3;  W: ceil((6+2-3)/2)+1 = 4 kept
    ((5, 6), (2, 3), (2, 2), (1, 1), (3, 4)),
    # both axes: 3x3 (k 2, s 2, p 1): ceil(3/2)+1 = 3, 2*2 = 4 >= 3+1 -> 2
    ((3, 3), (2, 2), (2, 2), (1, 1), (2, 2)),
    # no drop (contrast): H: ceil((7+4-3)/4)+1 = 3, 2*4 = 8 >= 7+2 is false;
    # W: ceil((4+2-2)/2)+1 = 3, 2*2 = 4 >= 4+1 is false
    ((7, 4), (3, 2), (4, 2), (2, 1), (3, 3)),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("hw,k,s,p,out", CASES)
def test_padded_last_window(rng, method, hw, k, s, p, out):
    x = rng.standard_normal((2, 3) + hw)
    layer, b, t = make_layer(
        f'type: "Pooling" pooling_param {{ pool: {method} kernel_h: {k[0]} kernel_w: {k[1]} '
        f'stride_h: {s[0]} stride_w: {s[1]} pad_h: {p[0]} pad_w: {p[1]} }}', [x])
    (y,) = forward(layer, b, t)
    assert y.shape == (2, 3) + out
    # the reference computes every window from the definition (AVE divides
    # by the window clipped to the padded image, as Caffe)
    want = refs.pool2d(x, k, s, p, method.lower()[:3])
    assert want.shape == y.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    # the last row's windows start inside the image: each sees real values
    if method == "MAX":
        hs = (out[0] - 1) * s[0] - p[0]
        assert hs < hw[0]
        np.testing.assert_allclose(
            y[:, :, -1, 0], x[:, :, max(hs, 0):hs + k[0], 0:max(k[1] - p[1], 1)].max(axis=(2, 3)),
            rtol=1e-6)
