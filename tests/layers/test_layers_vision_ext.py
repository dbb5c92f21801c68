"""Im2col and SPP against float64 NumPy references, their gradients by
finite differences, and bad parameters."""
import math

import numpy as np
import pytest

import refs
from caffe_ocl import LayerError, ShapeError, caffe_pb2
from caffe_ocl.testing import check_gradient, forward, make_layer


def im2col_ref(x, k, p, s, d):
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = k, p, s, d
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + w] = x
    out = np.zeros((n, c, kh, kw, ho, wo))
    for i in range(kh):
        for j in range(kw):
            out[:, :, i, j] = xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh,
                                 j * dw: j * dw + sw * (wo - 1) + 1: sw]
    return out.reshape(n, c * kh * kw, ho, wo)


IM2COL_CASES = [
    ((2, 3, 5, 6), "kernel_size: 3", ((3, 3), (0, 0), (1, 1), (1, 1))),
    ((1, 2, 7, 7), "kernel_size: 3 pad: 1 stride: 2", ((3, 3), (1, 1), (2, 2), (1, 1))),
    ((2, 1, 6, 5), "kernel_h: 2 kernel_w: 3 pad_h: 1 stride_h: 3 stride_w: 1",
     ((2, 3), (1, 0), (3, 1), (1, 1))),
    ((1, 2, 7, 8), "kernel_size: 2 dilation: 2 pad: 1", ((2, 2), (1, 1), (1, 1), (2, 2))),
    ((3, 2, 1, 1), "kernel_size: 1", ((1, 1), (0, 0), (1, 1), (1, 1))),
]


@pytest.mark.parametrize("shape,extra,geom", IM2COL_CASES)
def test_im2col_forward(rng, shape, extra, geom):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "Im2col" convolution_param {{ {extra} }}', [x])
    (y,) = forward(layer, b, t)
    ref = im2col_ref(x.astype(np.float32), *geom)
    assert y.shape == ref.shape
    np.testing.assert_array_equal(y, ref.astype(np.float32))


@pytest.mark.parametrize("i", [1, 2, 3])
def test_im2col_gradient(rng, i):
    shape, extra, _ = IM2COL_CASES[i]
    shape = (1,) + shape[1:3] + (min(shape[3], 5),) if i != 2 else (1, 1, 5, 4)
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "Im2col" convolution_param {{ {extra} }}', [x])
    check_gradient(layer, b, t)


def test_im2col_bad_inputs():
    with pytest.raises(LayerError, match="'im2col' \\(Im2col\\).*kernel_size"):
        make_layer('type: "Im2col" convolution_param { }', [np.zeros((1, 1, 3, 3))])
    with pytest.raises(ShapeError, match="'im2col' \\(Im2col\\).*does not fit"):
        make_layer('type: "Im2col" convolution_param { kernel_size: 4 }',
                   [np.zeros((1, 1, 3, 3))])
    with pytest.raises(ShapeError, match="'im2col' \\(Im2col\\).*2-D"):
        make_layer('type: "Im2col" convolution_param { kernel_size: 1 }', [np.zeros((2, 3))])


def spp_params(h, w, level):
    bins = 2 ** level
    kh, kw = math.ceil(h / bins), math.ceil(w / bins)
    return (kh, kw), ((kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2)


def spp_ref(x, height, method):
    n, c, h, w = x.shape
    outs = []
    for level in range(height):
        k, p = spp_params(h, w, level)
        outs.append(refs.pool2d(x, k, k, p, method))
    if height == 1:
        return outs[0]
    return np.concatenate([o.reshape(n, -1) for o in outs], axis=1)


SPP_CASES = [
    ((2, 3, 8, 8), 3, "MAX"),
    ((2, 2, 7, 9), 3, "MAX"),
    ((1, 3, 7, 6), 3, "AVE"),
    ((2, 2, 5, 5), 2, "AVE"),
    ((3, 2, 4, 6), 1, "MAX"),
    ((1, 1, 15, 16), 4, "MAX"),
]


@pytest.mark.parametrize("shape,height,pool", SPP_CASES)
def test_spp_forward(rng, shape, height, pool):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "SPP" spp_param {{ pyramid_height: {height} '
                             f'pool: {pool} }}', [x])
    (y,) = forward(layer, b, t)
    ref = spp_ref(x.astype(np.float32), height, pool.lower())
    n, c = shape[:2]
    assert y.shape == ref.shape
    if height > 1:
        assert y.shape == (n, c * sum(4 ** i for i in range(height)))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,height,pool", [
    ((1, 2, 5, 5), 2, "MAX"), ((1, 2, 7, 4), 3, "AVE"), ((2, 1, 3, 4), 1, "AVE")])
def test_spp_gradient(rng, shape, height, pool):
    # distinct values keep MAX pooling away from ties
    x = rng.permutation(np.prod(shape)).reshape(shape) * 0.1
    layer, b, t = make_layer(f'type: "SPP" spp_param {{ pyramid_height: {height} '
                             f'pool: {pool} }}', [x], caffe_pb2.TRAIN)
    check_gradient(layer, b, t, stepsize=1e-2)


def test_spp_stochastic_test(rng):
    x = rng.uniform(0.1, 1.0, (1, 2, 4, 4))
    layer, b, t = make_layer('type: "SPP" spp_param { pyramid_height: 3 pool: STOCHASTIC }',
                             [x])
    (y,) = forward(layer, b, t)
    xf = x.astype(np.float64).astype(np.float32).astype(np.float64)
    outs = []
    for level in range(3):
        bins = 2 ** level
        k = 4 // bins
        win = xf.reshape(1, 2, bins, k, bins, k)
        outs.append(((win ** 2).sum(axis=(3, 5)) / win.sum(axis=(3, 5))).reshape(1, -1))
    np.testing.assert_allclose(y, np.concatenate(outs, axis=1), rtol=1e-5)


def test_spp_bad_inputs():
    with pytest.raises(LayerError, match="'spp' \\(SPP\\).*pyramid_height"):
        make_layer('type: "SPP" spp_param { pool: MAX }', [np.zeros((1, 1, 4, 4))])
    with pytest.raises(ShapeError, match="'spp' \\(SPP\\).*4 axes"):
        make_layer('type: "SPP" spp_param { pyramid_height: 2 }', [np.zeros((1, 4, 4))])
    # level 2 of a 5-wide input needs pad 2 with kernel 2: Caffe's pooling rejects it
    with pytest.raises(ShapeError, match="'spp' \\(SPP\\).*level 2"):
        make_layer('type: "SPP" spp_param { pyramid_height: 3 }', [np.zeros((1, 1, 5, 8))])
    with pytest.raises(LayerError, match="'spp' \\(SPP\\).*STOCHASTIC"):
        make_layer('type: "SPP" spp_param { pyramid_height: 1 pool: STOCHASTIC }',
                   [np.zeros((1, 1, 4, 4))], caffe_pb2.TRAIN)
