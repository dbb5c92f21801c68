"""Convolution, Deconvolution, Pooling and LRN against float64 NumPy
references, and their gradients by finite differences."""
import numpy as np
import pytest

import refs
from caffe_ocl import ShapeError, LayerError, NetError
from caffe_ocl.testing import check_gradient, forward, make_layer

CONV_CASES = [
    # (input shape, num_output, conv_param text, kwargs for the reference)
    ((2, 3, 6, 5), 4, "kernel_size: 3", dict()),
    ((1, 2, 7, 7), 3, "kernel_size: 3 pad: 1 stride: 2", dict(pad=(1, 1), stride=(2, 2))),
    ((2, 4, 5, 6), 6, "kernel_h: 2 kernel_w: 3 pad_h: 1 pad_w: 0 stride_h: 1 stride_w: 2 group: 2",
     dict(pad=(1, 0), stride=(1, 2), group=2)),
    ((1, 3, 9, 8), 2, "kernel_size: 3 dilation: 2 pad: 2", dict(pad=(2, 2), dil=(2, 2))),
    ((3, 5, 4, 4), 7, "kernel_size: 1", dict()),                      # 1x1 = plain GEMM
    ((2, 4, 5, 5), 4, "kernel_size: 3 group: 4 pad: 1", dict(pad=(1, 1), group=4)),  # depthwise
    ((1, 1, 3, 3), 1, "kernel_size: 3 stride: 4", dict(stride=(4, 4))),  # stride > kernel
    ((2, 3, 65, 7), 70, "kernel_size: 2 bias_term: false", dict()),  # > one GEMM tile
]


def _conv_text(num_output, extra, type_="Convolution"):
    return (f'type: "{type_}" convolution_param {{ num_output: {num_output} {extra} '
            'weight_filler { type: "gaussian" std: 0.5 } '
            'bias_filler { type: "uniform" min: -1 max: 1 } }')


@pytest.mark.parametrize("shape,nout,extra,kw", CONV_CASES)
def test_convolution_forward(rng, shape, nout, extra, kw):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(_conv_text(nout, extra), [x])
    w = layer.blobs[0].data.copy()
    bias = layer.blobs[1].data.copy() if len(layer.blobs) > 1 else None
    (y,) = forward(layer, b, t)
    ref = refs.conv2d(x, w, bias, **kw)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,nout,extra,kw", [CONV_CASES[i] for i in (0, 1, 2, 4)])
def test_convolution_gradient(rng, shape, nout, extra, kw):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(_conv_text(nout, extra), [x])
    check_gradient(layer, b, t, max_checks=40)


DECONV_CASES = [
    ((2, 3, 3, 4), 2, "kernel_size: 3 stride: 2", dict(stride=(2, 2))),
    ((1, 4, 4, 4), 4, "kernel_size: 4 stride: 2 pad: 1 group: 2", dict(stride=(2, 2), pad=(1, 1), group=2)),
    ((2, 2, 3, 3), 3, "kernel_size: 1", dict()),
]


@pytest.mark.parametrize("shape,nout,extra,kw", DECONV_CASES)
def test_deconvolution_forward(rng, shape, nout, extra, kw):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(_conv_text(nout, extra, "Deconvolution"), [x])
    w = layer.blobs[0].data.copy()
    bias = layer.blobs[1].data.copy()
    (y,) = forward(layer, b, t)
    ref = refs.deconv2d(x, w, bias, **kw)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_deconvolution_gradient(rng):
    shape, nout, extra, _ = DECONV_CASES[1]
    layer, b, t = make_layer(_conv_text(nout, extra, "Deconvolution"), [rng.standard_normal(shape)])
    check_gradient(layer, b, t, max_checks=30)


def test_bilinear_filler_deconvolution_upsamples():
    # FCN's fixed upsampling: bilinear weights, group = channels
    x = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)
    layer, b, t = make_layer('type: "Deconvolution" convolution_param { num_output: 1 '
                             'kernel_size: 4 stride: 2 pad: 1 bias_term: false '
                             'weight_filler { type: "bilinear" } }', [x])
    w = layer.blobs[0].data[0, 0]
    f = 2.0
    c = (2 * f - 1 - f % 2) / (2 * f)
    ref1 = 1 - np.abs(np.arange(4) / f - c)
    np.testing.assert_allclose(w, np.outer(ref1, ref1), rtol=1e-6)
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, refs.deconv2d(x, layer.blobs[0].data, None, stride=(2, 2),
                                                pad=(1, 1)), rtol=1e-5, atol=1e-5)


def test_convolution_bad_params(rng):
    x = rng.standard_normal((1, 3, 4, 4))
    with pytest.raises(ShapeError, match="multiples of group"):
        make_layer(_conv_text(4, "kernel_size: 3 group: 2"), [x])
    with pytest.raises(ShapeError, match="does not fit"):
        make_layer(_conv_text(4, "kernel_size: 7"), [x])
    with pytest.raises(LayerError, match="kernel_size is required"):
        make_layer(_conv_text(4, ""), [x])
    with pytest.raises(ShapeError, match="needs at least 1 spatial axis"):
        make_layer(_conv_text(4, "kernel_size: 1"), [rng.standard_normal((2, 3))])


POOL_CASES = [
    ((2, 3, 6, 6), "MAX", (2, 2), (2, 2), (0, 0)),
    ((1, 2, 7, 5), "MAX", (3, 3), (2, 2), (0, 0)),     # ceil rounding adds a window
    ((2, 2, 7, 7), "MAX", (3, 3), (2, 2), (1, 1)),
    ((1, 3, 5, 6), "AVE", (3, 2), (2, 1), (1, 0)),
    ((2, 2, 6, 6), "AVE", (3, 3), (2, 2), (1, 1)),
    ((1, 1, 4, 4), "AVE", (2, 2), (3, 3), (0, 0)),      # stride > kernel
]


def _pool_text(method, k, s, p, extra=""):
    return (f'type: "Pooling" pooling_param {{ pool: {method} kernel_h: {k[0]} kernel_w: {k[1]} '
            f'stride_h: {s[0]} stride_w: {s[1]} pad_h: {p[0]} pad_w: {p[1]} {extra} }}')


@pytest.mark.parametrize("shape,method,k,s,p", POOL_CASES)
def test_pooling_forward(rng, shape, method, k, s, p):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(_pool_text(method, k, s, p), [x])
    (y,) = forward(layer, b, t)
    ref = refs.pool2d(x, k, s, p, method.lower()[:3])
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [0, 2, 3, 4])
def test_pooling_gradient(rng, case):
    shape, method, k, s, p = POOL_CASES[case]
    # distinct values keep MAX away from ties (Caffe's test does the same)
    x = rng.permutation(np.prod(shape)).reshape(shape) * 0.1
    layer, b, t = make_layer(_pool_text(method, k, s, p), [x])
    check_gradient(layer, b, t, stepsize=1e-2, threshold=1e-2)


def test_pooling_output_size_rounds_up_like_caffe(rng):
    # 13x13, kernel 3 stride 2: Caffe gives 6 (ceil), a floor framework 6 too;
    # 14x14 gives 7 in Caffe and 6 with floor.
    layer, b, t = make_layer(_pool_text("MAX", (3, 3), (2, 2), (0, 0)), [rng.standard_normal((1, 1, 14, 14))])
    assert t[0].shape == (1, 1, 7, 7)
    layer, b, t = make_layer(_pool_text("MAX", (3, 3), (2, 2), (0, 0), "round_mode: FLOOR"),
                             [rng.standard_normal((1, 1, 14, 14))])
    assert t[0].shape == (1, 1, 6, 6)


def test_global_pooling_and_mask_top(rng):
    x = rng.standard_normal((2, 3, 5, 4))
    layer, b, t = make_layer('type: "Pooling" pooling_param { pool: AVE global_pooling: true }', [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y[..., 0, 0], x.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    layer, b, t = make_layer(_pool_text("MAX", (2, 2), (2, 2), (0, 0)), [x], ntop=2)
    y, mask = forward(layer, b, t)
    flat = x.reshape(2, 3, -1)
    picked = np.take_along_axis(flat, mask.reshape(2, 3, -1).astype(int), axis=2)
    np.testing.assert_allclose(picked.reshape(y.shape), y, rtol=1e-6)


@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (2, 3, 3, 5), (1, 4, 8, 4), (2, 5, 7, 7),
                                   (1, 2, 37, 29)])
def test_average_pooling_over_whole_planes(rng, shape):
    """A window of the whole plane (global pooling, or kernel = the plane's
    size with any stride): the CPU kernel sums the plane as 16 partial sums
    plus a tail; with padding it is a windowed pooling again."""
    x = rng.standard_normal(shape) + 3.0
    layer, b, t = make_layer('type: "Pooling" pooling_param { pool: AVE global_pooling: true }', [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y[..., 0, 0], x.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    k = shape[2:]
    layer, b, t = make_layer(_pool_text("AVE", k, (2, 3), (0, 0)), [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, refs.pool2d(x, k, (2, 3), (0, 0), "ave"), rtol=1e-5, atol=1e-6)
    if min(k) > 1:
        layer, b, t = make_layer(_pool_text("AVE", k, (1, 1), (1, 1)), [x])
        (y,) = forward(layer, b, t)
        np.testing.assert_allclose(y, refs.pool2d(x, k, (1, 1), (1, 1), "ave"),
                                   rtol=1e-5, atol=1e-6)


def test_stochastic_pooling_test_phase(rng):
    x = rng.uniform(0.1, 1.0, (1, 2, 4, 4))
    layer, b, t = make_layer(_pool_text("STOCHASTIC", (2, 2), (2, 2), (0, 0)), [x])
    (y,) = forward(layer, b, t)
    win = x.reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 2, 2, 4)
    ref = (win ** 2).sum(-1) / win.sum(-1)
    np.testing.assert_allclose(y, ref, rtol=1e-5)


def test_pooling_bad_params(rng):
    x = rng.standard_normal((1, 1, 4, 4))
    with pytest.raises(LayerError, match="smaller than kernel"):
        make_layer(_pool_text("MAX", (2, 2), (1, 1), (2, 2)), [x])
    with pytest.raises(LayerError, match="kernel_size"):
        make_layer('type: "Pooling" pooling_param { pool: MAX }', [x])


@pytest.mark.parametrize("shape,size,region", [((2, 7, 3, 3), 5, "ACROSS_CHANNELS"),
                                               ((1, 3, 2, 5), 3, "ACROSS_CHANNELS"),
                                               ((2, 2, 5, 4), 3, "WITHIN_CHANNEL")])
@pytest.mark.parametrize("beta", [0.75, 0.6])    # 0.75 (Caffe's default): square roots
def test_lrn_forward_and_gradient(rng, shape, size, region, beta):
    x = rng.standard_normal(shape)
    text = (f'type: "LRN" lrn_param {{ local_size: {size} alpha: 0.3 beta: {beta} k: 2 '
            f'norm_region: {region} }}')
    layer, b, t = make_layer(text, [x])
    (y,) = forward(layer, b, t)
    if region == "ACROSS_CHANNELS":
        ref = refs.lrn_across(x, size, 0.3, beta, 2.0)
    else:
        ref = refs.lrn_within(x, size, 0.3, beta)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    check_gradient(layer, b, t, max_checks=30)


def test_lrn_even_size_rejected(rng):
    with pytest.raises(LayerError, match="odd"):
        make_layer('type: "LRN" lrn_param { local_size: 4 }', [rng.standard_normal((1, 5, 2, 2))])


def test_wrong_number_of_bottoms(rng):
    with pytest.raises(NetError, match="bottom"):
        make_layer(_pool_text("MAX", (2, 2), (2, 2), (0, 0)),
                   [rng.standard_normal((1, 1, 4, 4))] * 2)


@pytest.mark.parametrize("w", [29, 11, 8])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 1, 1)])
def test_pool_forward_values_and_mask(rng, k, s, p, w):
    """Max- and average-pooling forward on the device's kernels (on CPU
    drivers the plane kernels, 8 outputs at a time where windows are whole
    at strides 1 and 2, 4 at a time in rows too short for 8) against
    float64: maxima, averages and the max mask, the first maximum's plane
    index in raster order (ties made on purpose), rows long enough for
    several runs of 8 plus ragged ends, and short ones (LeNet's 8 -> 4)."""
    from caffe_ocl.device import get_device
    from caffe_ocl.ops import pool as pool_ops
    dev = get_device()
    n, c, h = 2, 3, 7
    kk, ss, pp = (k, k), (s, s), (p, p)
    ho, wo = refs.pool_out_size(h, k, s, p), refs.pool_out_size(w, k, s, p)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 1, 2:5, :] = 1.5                           # ties: the first maximum wins
    if dev.is_cpu:
        widths = {29: 8, 11: 8 if s == 1 else 4, 8: 4}
        assert pool_ops.run_width(w, wo, k, s, p) == widths[w]
    xb = dev.alloc(4 * x.size)
    dev.upload(xb, x)
    yb, mb = dev.alloc(4 * n * c * ho * wo), dev.alloc(4 * n * c * ho * wo)
    pool_ops.max_forward(dev, x.shape, (ho, wo), kk, ss, pp, xb, yb, mb).run(dev.queue)
    y, m = np.empty((n, c, ho, wo), np.float32), np.empty((n, c, ho, wo), np.float32)
    dev.download(y, yb)
    dev.download(m, mb)
    np.testing.assert_array_equal(y, refs.pool2d(x, kk, ss, pp).astype(np.float32))
    ref_m = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            hs, ws = max(i * s - p, 0), max(j * s - p, 0)
            he, we = min(i * s - p + k, h), min(j * s - p + k, w)
            win = x[:, :, hs:he, ws:we].reshape(n, c, -1)
            a = win.argmax(axis=2)
            ref_m[:, :, i, j] = (hs + a // (we - ws)) * w + ws + a % (we - ws)
    np.testing.assert_array_equal(m, ref_m)
    pool_ops.ave_forward(dev, x.shape, (ho, wo), kk, ss, pp, xb, yb).run(dev.queue)
    dev.download(y, yb)
    np.testing.assert_allclose(y, refs.pool2d(x, kk, ss, pp, "ave"), rtol=1e-6, atol=1e-6)


def _uploader(dev):
    """buf(a): a device buffer holding ``a`` as float32."""
    def buf(a):
        b = dev.alloc(4 * a.size)
        dev.upload(b, np.ascontiguousarray(a, np.float32))
        return b
    return buf


@pytest.mark.parametrize("impl", ["gpu", "blocks", "flat"])
def test_max_pool_backward_gpu_kernels(rng, impl):
    """The GPU kernels of max-pooling backward (3-D grid with the window as
    macros; the 1-D gather form for huge n*c) on any device, against the
    layer's own path: overlapping 3x3 s2 windows with padding and ragged
    sizes, where an input gets gradient from several windows."""
    from caffe_ocl.device import get_device
    from caffe_ocl.ops import pool as pool_ops
    dev = get_device()
    n, c, h, w, k, s, p = 2, 3, 9, 37, (3, 3), (2, 2), (1, 1)
    ho, wo = refs.pool_out_size(h, k[0], s[0], p[0]), refs.pool_out_size(w, k[1], s[1], p[1])
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 0, :3, :3] = 5.0                          # ties: the first maximum wins
    dy = rng.standard_normal((n, c, ho, wo)).astype(np.float32)
    buf = _uploader(dev)
    xb, yb, mb, dyb = buf(x), buf(np.zeros((n, c, ho, wo))), buf(np.zeros((n, c, ho, wo))), buf(dy)
    out = {}
    for which in (impl, None):
        dxb = buf(np.full(x.shape, np.nan))
        for ln in [pool_ops.max_forward(dev, x.shape, (ho, wo), k, s, p, xb, yb, mb),
                   pool_ops.max_backward(dev, x.shape, (ho, wo), k, s, p, dyb, mb, dxb, impl=which)]:
            ln.run(dev.queue)
        got = np.empty(x.shape, np.float32)
        dev.download(got, dxb)
        out[which] = got
    # float64 reference: each top gradient goes to its window's first maximum
    ref = np.zeros(x.shape)
    for i in range(ho):
        for j in range(wo):
            h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
            hs, ws = max(h0, 0), max(w0, 0)
            win = x[:, :, hs:min(h0 + k[0], h), ws:min(w0 + k[1], w)].reshape(n, c, -1)
            arg = win.argmax(axis=2)
            ww = min(w0 + k[1], w) - ws
            for a in range(n):
                for b in range(c):
                    ref[a, b, hs + arg[a, b] // ww, ws + arg[a, b] % ww] += dy[a, b, i, j]
    np.testing.assert_allclose(out[impl], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[impl], out[None])


@pytest.mark.parametrize("impl", ["cpu", "gpu", "tiles", "blocks", "flat"])
@pytest.mark.parametrize("slope", [0.0, 0.25])
def test_max_pool_backward_gated_by_relu(rng, impl, slope):
    """max_backward with gate=(top, slope): the pooling's gradient times the
    gate of the in-place ReLU before it (1 where the pooled value is
    positive, else slope), in every kernel form; 2x2/2 windows tiling a
    9 x 37 input (the last row and column of windows ragged). Checks the
    plain tiles kernel too."""
    from caffe_ocl.device import get_device
    from caffe_ocl.ops import pool as pool_ops
    dev = get_device()
    n, c, h, w, k, s, p = 2, 3, 9, 37, (2, 2), (2, 2), (0, 0)
    ho, wo = refs.pool_out_size(h, k[0], s[0], p[0]), refs.pool_out_size(w, k[1], s[1], p[1])
    assert pool_ops.tiles_input((n, c, h, w), (ho, wo), k, s, p)
    pre = rng.standard_normal((n, c, h, w))
    pre[0, 0, :4, :4] = -1.0                       # whole windows below zero
    x = np.where(pre > 0, pre, slope * pre).astype(np.float32)     # the ReLU's output
    dy = rng.standard_normal((n, c, ho, wo)).astype(np.float32)
    buf = _uploader(dev)
    xb, yb, mb, dyb = buf(x), buf(np.zeros((n, c, ho, wo))), buf(np.zeros((n, c, ho, wo))), buf(dy)
    pool_ops.max_forward(dev, x.shape, (ho, wo), k, s, p, xb, yb, mb).run(dev.queue)
    ref = np.zeros(x.shape)
    for i in range(ho):
        for j in range(wo):
            win = x[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
            ww = win.shape[3]
            arg = win.reshape(n, c, -1).argmax(axis=2)
            for a in range(n):
                for b in range(c):
                    ref[a, b, 2 * i + arg[a, b] // ww, 2 * j + arg[a, b] % ww] += dy[a, b, i, j]
    for gate, want in ((None, ref), ((yb, slope), ref * np.where(x > 0, 1.0, slope))):
        dxb = buf(np.full(x.shape, np.nan))
        pool_ops.max_backward(dev, x.shape, (ho, wo), k, s, p, dyb, mb, dxb, impl=impl,
                              gate=gate).run(dev.queue)
        got = np.empty(x.shape, np.float32)
        dev.download(got, dxb)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
