"""Kernels that only GPU devices choose, run on the CPU driver CI uses
(PoCL) with results checked against float64 NumPy (issue #25 item 9): the
GPU pooling kernels (one work-item per output / input), the GPU im2col and
col2im (one work-item per element) and the GPU LRN across channels. The
device is made to look like a GPU for the call (``is_cpu`` False), so the
ops pick the GPU kernel the way they do on a GPU.

Other GPU-only kernels have their tests elsewhere: gemm.cl tiles and the
implicit-GEMM conv_igemm.cl (test_conv_algorithms, test_gemm_splitk through
the gpu_kernels_unoptimized_on_cpu fixture), max_pool_bwd_grid/_tiles/
_blocks and the flat max_pool_bwd (test_layers_vision, impl=...),
winograd's GPU tilings (test_winograd), depthwise's (test_depthwise)."""
import numpy as np
import pytest

import refs
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import lrn as lrn_ops
from caffe_ocl.ops import pool as pool_ops


@pytest.fixture
def gpu(d, monkeypatch):
    """The device as the ops see a GPU: GPU kernels, GPU work sizes."""
    monkeypatch.setattr(d.dev, "is_cpu", False)
    return d


def launched(d, monkeypatch):
    """Kernel names launched from now on (to prove the GPU kernel ran)."""
    names = []
    orig = d.dev.launch

    def launch(filename, name, *a, **kw):
        names.append(name)
        return orig(filename, name, *a, **kw)
    monkeypatch.setattr(d.dev, "launch", launch)
    return names


# a padded geometry whose last window Caffe drops (5 -> 3 rows), one whose
# last windows hang over the image's end (ceil rounding), and a plain one
POOL_GEOMS = [((2, 3, 5, 6), (2, 3), (2, 2), (1, 1)), ((1, 2, 6, 6), (3, 3), (2, 2), (0, 0)),
              ((1, 2, 7, 8), (3, 2), (3, 3), (1, 1)), ((1, 2, 7, 7), (3, 3), (2, 2), (0, 0))]


def pool_out(shape, k, s, p):
    return tuple(refs.pool_out_size(shape[2 + i], k[i], s[i], p[i]) for i in range(2))


@pytest.mark.parametrize("shape,k,s,p", POOL_GEOMS)
def test_gpu_max_and_ave_pool_forward(gpu, monkeypatch, rng, shape, k, s, p):
    names = launched(gpu, monkeypatch)
    x = rng.standard_normal(shape).astype(np.float32)
    ho, wo = pool_out(shape, k, s, p)
    n, c = shape[:2]
    xb = gpu.buf(x)
    yb, mb = gpu.buf(np.zeros(n * c * ho * wo)), gpu.buf(np.zeros(n * c * ho * wo))
    gpu.run([pool_ops.max_forward(gpu.dev, shape, (ho, wo), k, s, p, xb, yb, mb)])
    np.testing.assert_array_equal(gpu.get(yb, (n, c, ho, wo)),
                                  refs.pool2d(x, k, s, p).astype(np.float32))
    # the mask holds the flat h * W + w index of each maximum
    m = gpu.get(mb, (n, c, ho, wo)).astype(np.int64)
    flat = x.reshape(n, c, -1)
    np.testing.assert_array_equal(np.take_along_axis(flat, m.reshape(n, c, -1), 2),
                                  gpu.get(yb, (n, c, ho, wo)).reshape(n, c, -1))
    gpu.run([pool_ops.ave_forward(gpu.dev, shape, (ho, wo), k, s, p, xb, yb)])
    np.testing.assert_allclose(gpu.get(yb, (n, c, ho, wo)), refs.pool2d(x, k, s, p, "ave"),
                               rtol=1e-5, atol=1e-6)
    assert names == ["max_pool_fwd", "ave_pool_fwd"]


# global average pooling: planes under and over GLOBAL_WIDE_PLANE (64 and
# 256 work-items per plane), one plane shorter than the work-group, batch 2
@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 2, 48, 45), (1, 5, 3, 2)])
def test_gpu_global_ave_pool_forward(gpu, monkeypatch, rng, shape):
    names = launched(gpu, monkeypatch)
    n, c, h, w = shape
    x = (rng.standard_normal(shape) + 3.0).astype(np.float32)
    xb, yb = gpu.buf(x), gpu.buf(np.zeros(n * c))
    assert pool_ops.is_global(shape, (1, 1), (h, w), (0, 0))
    gpu.run([pool_ops.ave_forward(gpu.dev, shape, (1, 1), (h, w), (1, 1), (0, 0), xb, yb)])
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(gpu.get(yb, (n, c, 1, 1)), want, rtol=1e-6)
    assert names == ["ave_pool_global_fwd"]
    # a padded whole-plane window is not global: Caffe divides by the padded size
    assert not pool_ops.is_global(shape, (1, 1), (h, w), (1, 0))


def test_gpu_stochastic_pool_test_forward(gpu, monkeypatch, rng):
    names = launched(gpu, monkeypatch)
    shape, k, s = (2, 2, 6, 5), (3, 2), (2, 1)
    x = rng.uniform(0.1, 2.0, shape).astype(np.float32)
    n, c, h, w = shape
    ho, wo = pool_out(shape, k, s, (0, 0))
    want = np.empty((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = x[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].astype(np.float64)
            want[:, :, i, j] = (win ** 2).sum(axis=(2, 3)) / win.sum(axis=(2, 3))
    xb, yb = gpu.buf(x), gpu.buf(np.zeros(n * c * ho * wo))
    gpu.run([pool_ops.stochastic_test_forward(gpu.dev, shape, (ho, wo), k, s, xb, yb)])
    np.testing.assert_allclose(gpu.get(yb, (n, c, ho, wo)), want, rtol=1e-5)
    assert names == ["sto_pool_test_fwd"]


@pytest.mark.parametrize("shape,k,s,p", POOL_GEOMS)
def test_gpu_ave_pool_backward(gpu, monkeypatch, rng, shape, k, s, p):
    names = launched(gpu, monkeypatch)
    n, c, h, w = shape
    ho, wo = pool_out(shape, k, s, p)
    dy = rng.standard_normal((n, c, ho, wo)).astype(np.float32)
    want = np.zeros((n, c, h + 2 * p[0] + k[0], w + 2 * p[1] + k[1]))
    for i in range(ho):            # the adjoint of the forward (Caffe's divisor)
        for j in range(wo):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            size = (he - hs) * (we - ws)
            want[:, :, hs + p[0]:he + p[0], ws + p[1]:we + p[1]] += \
                dy[:, :, i:i + 1, j:j + 1].astype(np.float64) / size
    want = want[:, :, p[0]:p[0] + h, p[1]:p[1] + w]
    dyb, dxb = gpu.buf(dy), gpu.buf(np.full(n * c * h * w, 7.0))
    gpu.run([pool_ops.ave_backward(gpu.dev, shape, (ho, wo), k, s, p, dyb, dxb)])
    np.testing.assert_allclose(gpu.get(dxb, shape), want, rtol=1e-5, atol=1e-6)
    assert names == ["ave_pool_bwd"]


def im2col_ref(x, g):
    n = x.shape[0]
    xp = np.zeros((n, g.channels, g.height + 2 * g.ph + g.kh * g.dh,
                   g.width + 2 * g.pw + g.kw * g.dw))
    xp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width] = x
    col = np.empty((n, g.channels, g.kh, g.kw, g.out_h, g.out_w))
    for i in range(g.kh):
        for j in range(g.kw):
            col[:, :, i, j] = xp[:, :, i * g.dh:i * g.dh + g.sh * g.out_h:g.sh,
                                 j * g.dw:j * g.dw + g.sw * g.out_w:g.sw]
    return col.reshape(n, g.col_rows, g.out_spatial)


GEOMS = [dict(num=2, channels=3, height=6, width=5, out_channels=4, kh=3, kw=2, ph=1, pw=1,
              sh=2, sw=1),
         dict(num=2, channels=2, height=7, width=7, out_channels=2, kh=3, kw=3, ph=2, pw=2,
              dh=2, dw=2)]


@pytest.mark.parametrize("geom", GEOMS)
def test_gpu_im2col_and_col2im(gpu, monkeypatch, rng, geom):
    names = launched(gpu, monkeypatch)
    g = conv_ops.ConvGeometry(**geom)
    n = g.num
    x = rng.standard_normal((n, g.channels, g.height, g.width)).astype(np.float32)
    xb, colb = gpu.buf(x), gpu.buf(np.zeros(n * g.col_rows * g.out_spatial))
    gpu.run([conv_ops.im2col(gpu.dev, g, n, xb, 0, colb)])
    want = im2col_ref(x.astype(np.float64), g)
    np.testing.assert_array_equal(gpu.get(colb, want.shape), want.astype(np.float32))
    # col2im is the adjoint: <im2col(x), c> == <x, col2im(c)>
    c = rng.standard_normal(want.shape).astype(np.float32)
    cb, dxb = gpu.buf(c), gpu.buf(np.full(x.size, 5.0))
    gpu.run([conv_ops.col2im(gpu.dev, g, n, cb, dxb, 0)])
    dx = gpu.get(dxb, x.shape).astype(np.float64)
    np.testing.assert_allclose((want * c).sum(), (x * dx).sum(), rtol=1e-4)
    # per pixel: the sum of the column entries that read it
    ref = np.zeros_like(dx)
    for k in range(x.size):
        e = np.zeros(x.size)
        e[k] = 1
        ref.flat[k] = (im2col_ref(e.reshape(x.shape), g) * c).sum()
    np.testing.assert_allclose(dx, ref, rtol=1e-5, atol=1e-5)
    gpu.run([conv_ops.col2im(gpu.dev, g, n, cb, dxb, 0, accumulate=True)])
    np.testing.assert_allclose(gpu.get(dxb, x.shape), 2 * ref, rtol=1e-5, atol=1e-5)
    assert names == ["im2col", "col2im", "col2im"]


@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_gpu_lrn_across(gpu, monkeypatch, rng, beta):
    names = launched(gpu, monkeypatch)
    n, c, h, w, size, alpha, k = 2, 7, 3, 4, 5, 0.3, 1.5
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    xb, sb, yb = gpu.buf(x), gpu.buf(np.zeros(x.size)), gpu.buf(np.zeros(x.size))
    gpu.run([lrn_ops.across_forward(gpu.dev, n, c, h * w, size, alpha, beta, k, xb, sb, yb)])
    y = gpu.get(yb, x.shape)
    np.testing.assert_allclose(y, refs.lrn_across(x, size, alpha, beta, k), rtol=2e-5,
                               atol=1e-6)
    # backward against a float64 finite-difference-free analytic reference
    x64 = x.astype(np.float64)
    pre = (size - 1) // 2
    scale = np.empty_like(x64)
    for ch in range(c):
        lo, hi = max(ch - pre, 0), min(ch + size - 1 - pre, c - 1)
        scale[:, ch] = k + alpha / size * (x64[:, lo:hi + 1] ** 2).sum(axis=1)
    y64 = x64 * scale ** -beta
    dy = rng.standard_normal(x.shape)
    t = dy * y64 / scale
    dx = dy * scale ** -beta
    for ch in range(c):          # channels whose window holds ch
        lo, hi = max(ch - (size - 1 - pre), 0), min(ch + pre, c - 1)
        dx[:, ch] -= 2 * alpha * beta / size * x64[:, ch] * t[:, lo:hi + 1].sum(axis=1)
    dyb, dxb = gpu.buf(dy), gpu.buf(np.zeros(x.size))
    gpu.run([lrn_ops.across_backward(gpu.dev, n, c, h * w, size, alpha, beta, xb, yb, sb,
                                     dyb, dxb)])
    np.testing.assert_allclose(gpu.get(dxb, x.shape), dx, rtol=1e-4, atol=1e-5)
    assert names == ["lrn_across_fwd", "lrn_across_bwd"]


@pytest.mark.parametrize("I,act", [(12, ("relu", 0.1)), (7, ("clip", 0.0, 6.0)), (8, None)])
def test_bn_scale_act_forward_gpu_and_cpu_forms(d, monkeypatch, rng, I, act):
    """ops.normalization.bn_scale_act_forward: the GPU kernel (float4 when 4
    divides I) and the CPU drivers' channel-run kernel give the float64
    values, and the SNAP copies of gamma/beta."""
    from caffe_ocl.ops import normalization as norm_ops
    O, C = 3, 5
    x = rng.standard_normal((O, C, I)).astype(np.float32)
    mean, std = rng.standard_normal(C).astype(np.float32), rng.uniform(0.5, 2, C).astype(np.float32)
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    xn = (x.astype(np.float64) - mean[None, :, None]) / std[None, :, None]
    v = g[None, :, None] * xn + b[None, :, None]
    if act is not None and act[0] == "relu":
        v = np.where(v > 0, v, act[1] * v)
    elif act is not None:
        v = np.clip(v, act[1], act[2])
    for cpu in (True, False):
        monkeypatch.setattr(d.dev, "is_cpu", cpu)
        bufs = [d.buf(a) for a in (x, mean, std, g, b)]
        xnb, yb = d.buf(np.zeros(x.size)), d.buf(np.zeros(x.size))
        gs, bs = d.buf(np.zeros(C)), d.buf(np.zeros(C))
        launch = norm_ops.bn_scale_act_forward(d.dev, O, C, I, *bufs, xnb, yb, act=act,
                                               snap=(gs, bs))
        assert launch.name == ("bn_scale_act_fwd_runs" if cpu else "bn_scale_act_fwd")
        d.run([launch])
        np.testing.assert_allclose(d.get(xnb, x.shape), xn, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(d.get(yb, x.shape), v, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(d.get(gs, (C,)), g)
        np.testing.assert_array_equal(d.get(bs, (C,)), b)


@pytest.mark.parametrize("O,C,I,act", [(3, 5, 37, ("relu", 0.1)), (2, 4, 16, ("clip", 0.0, 6.0)),
                                       (1, 3, 7, None), (2, 6, 50, ("relu", 0.0))],
                         ids=["runs-and-tails", "whole-vectors", "short-runs", "relu"])
def test_bn_scale_act_inference_forms(d, monkeypatch, rng, O, C, I, act):
    """ops.normalization.bn_scale_act_forward without xnorm (an inference
    chain's pass, plan/affine.py): the CPU drivers' kernel built without the
    normalized copy (16-lane vectors along channel runs, scalar tails;
    chunks that start and end inside runs) gives the same bits as the TRAIN
    form writing y over its xnorm, which GPUs run; in place too."""
    from caffe_ocl.ops import normalization as norm_ops
    x = rng.standard_normal((O, C, I)).astype(np.float32)
    mean, std = rng.standard_normal(C).astype(np.float32), rng.uniform(0.5, 2, C).astype(np.float32)
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    bufs = [d.buf(a) for a in (x, mean, std, g, b)]
    want = d.buf(np.zeros(x.size))
    d.run([norm_ops.bn_scale_act_forward(d.dev, O, C, I, *bufs, want, want, act=act)])
    want = d.get(want, x.shape)
    launch_of = d.dev.launch
    built = []

    def recording(filename, name, gsize, lsize, args, defines=None):
        built.append(dict(defines or {}))
        return launch_of(filename, name, gsize, lsize, args, defines)
    monkeypatch.setattr(d.dev, "launch", recording)
    for cpu in (True, False):
        monkeypatch.setattr(d.dev, "is_cpu", cpu)
        yb = d.buf(np.full(x.size, np.nan))
        launch = norm_ops.bn_scale_act_forward(d.dev, O, C, I, *bufs, None, yb, act=act)
        assert launch.name == ("bn_scale_act_fwd_runs" if cpu else "bn_scale_act_fwd")
        assert built[-1].get("XNORM", 1) == (0 if cpu else 1)   # no copy on CPU drivers
        d.run([launch])
        np.testing.assert_array_equal(d.get(yb, x.shape), want)
    monkeypatch.setattr(d.dev, "is_cpu", True)
    xb = d.buf(x)                                   # in place: y is x
    d.run([norm_ops.bn_scale_act_forward(d.dev, O, C, I, xb, *bufs[1:], None, xb, act=act)])
    np.testing.assert_array_equal(d.get(xb, x.shape), want)
