"""The split per-channel reductions (ops/channel.py channel_partials, the
first pass of BatchNorm's statistics and gradients) and the fused TRAIN
BatchNorm -> Scale -> ReLU passes, against float64 NumPy, for channels made
of whole float4s (the vectorised kernels) and not."""
import numpy as np
import pytest

from caffe_ocl.ops import channel, normalization

SHAPES = [(3, 5, 24), (3, 5, 30), (2, 3, 4)]     # O, D, I: float4 channels, scalar, tiny


def _sums(d, part, D, chunks):
    p = d.get(part, (D, chunks, 2)).astype(np.float64)
    return p[..., 0].sum(1), p[..., 1].sum(1)


@pytest.mark.parametrize("O,D,I", SHAPES)
def test_channel_partials_modes(d, rng, O, D, I):
    a = rng.standard_normal((O, D, I)) + 2.0
    b = rng.standard_normal((O, D, I))
    gamma, beta = rng.standard_normal(D), rng.standard_normal(D)
    ab, bb = d.buf(a), d.buf(b)
    axes = (0, 2)
    launch, part, chunks = channel.channel_partials(d.dev, O, D, I, ab, bb)
    d.run([launch])
    s1, s2 = _sums(d, part, D, chunks)
    np.testing.assert_allclose(s1, a.sum(axes), rtol=1e-5)
    np.testing.assert_allclose(s2, (a * b).sum(axes), rtol=1e-4, atol=1e-4)
    launch, part, chunks = channel.channel_partials(d.dev, O, D, I, ab, shifted=True)
    d.run([launch])
    s1, s2 = _sums(d, part, D, chunks)
    sh = a - a[0, :, 0][None, :, None]
    np.testing.assert_allclose(s1, sh.sum(axes), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s2, (sh * sh).sum(axes), rtol=1e-4, atol=1e-4)
    launch, part, chunks = channel.channel_partials(
        d.dev, O, D, I, ab, bb, gated=(d.buf(gamma), d.buf(beta), ("relu", 0.1)))
    d.run([launch])
    s1, s2 = _sums(d, part, D, chunks)
    pre = gamma[None, :, None] * b + beta[None, :, None]
    g = a * np.where(pre > 0, 1.0, 0.1)
    np.testing.assert_allclose(s1, g.sum(axes), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s2, (g * b).sum(axes), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("O,C,I", SHAPES)
@pytest.mark.parametrize("act", [None, ("relu", 0.1), ("clip", -0.5, 0.7)])
def test_bn_scale_act_passes(d, rng, O, C, I, act):
    x = rng.standard_normal((O, C, I)) * 1.5 + 0.5
    dy = rng.standard_normal((O, C, I))
    gamma, beta = rng.standard_normal(C), rng.standard_normal(C)
    mean, std = x.mean((0, 2)), x.std((0, 2)) + 0.1
    xn = (x - mean[None, :, None]) / std[None, :, None]
    pre = gamma[None, :, None] * xn + beta[None, :, None]
    if act is None:
        y, gate = pre, np.ones_like(pre)
    elif act[0] == "relu":
        y, gate = np.where(pre > 0, pre, act[1] * pre), np.where(pre > 0, 1.0, act[1])
    else:
        y, gate = np.clip(pre, act[1], act[2]), ((pre >= act[1]) & (pre <= act[2])) * 1.0
    gb, bb, sb = d.buf(gamma), d.buf(beta), d.buf(std)
    xnb, yb = d.buf(np.zeros_like(x)), d.buf(np.zeros_like(x))
    d.run([normalization.bn_scale_act_forward(d.dev, O, C, I, d.buf(x), d.buf(mean), sb,
                                              gb, bb, xnb, yb, act)])
    np.testing.assert_allclose(d.get(xnb, x.shape), xn, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.get(yb, x.shape), y, rtol=1e-5, atol=1e-5)
    dgamma, dbeta = d.buf(np.zeros(C)), d.buf(np.zeros(C))
    dxb = d.buf(np.zeros_like(x))
    d.run(normalization.bn_scale_act_backward(d.dev, O, C, I, d.buf(dy), xnb, gb, bb, sb,
                                              dxb, dgamma, dbeta, act))
    g = dy * gate
    m = O * I
    s1, s2 = g.sum((0, 2)), (g * xn).sum((0, 2))
    dx = (gamma / std)[None, :, None] * (g - (s1[None, :, None] + s2[None, :, None] * xn) / m)
    np.testing.assert_allclose(d.get(dbeta, (C,)), s1, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d.get(dgamma, (C,)), s2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d.get(dxb, x.shape), dx, rtol=1e-4, atol=1e-4)


class _FakeGPU:
    is_gpu, is_cpu, compute_units = True, False, 132


@pytest.mark.parametrize("dim,m", [(64, 200704), (256, 50176), (128, 12544), (1024, 3136),
                                   (2048, 3136), (3, 40)])
@pytest.mark.parametrize("tail", [False, True])
def test_partial_plan_fills_one_wave_on_gpus(dim, m, tail):
    """GPU plan: never more groups than one wave of resident slots unless
    one per channel is already more (a second, nearly empty wave doubled the
    pass on the H200), and every work-item gets several loads."""
    wg, chunks = channel.partial_plan(_FakeGPU(), dim, m, tail=tail)
    slots = 132 * (channel.GPU_ITEMS_PER_CU // wg)
    if tail:
        slots = int(slots * channel.TAIL_OCCUPANCY)
    assert wg in (128, 256) and chunks >= 1
    assert dim * chunks <= max(slots, dim)
    assert chunks == 1 or m // chunks >= 4 * wg
    if m >= 16 * 256 * 4 and dim * 2 <= slots:
        assert dim * chunks > slots // 2      # long channels are split to fill the device
