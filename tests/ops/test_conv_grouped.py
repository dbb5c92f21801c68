"""The direct grouped-convolution forward (ops/grouped.py,
kernels/conv_grouped.cl: few channels per group, GPUs) against float64,
on every shape its indexing distinguishes: output blocks of 8, 4, 2 and 1
channels, rows not a multiple of its pixel run, stride, padding, dilation,
1 x 1, bias and activation; and the rule that sends a GPU's automatic
forward to it (and keeps the shortcut epilogue and depthwise off it)."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import grouped as grouped_ops
from refs import rel_err
from test_small_batch_gpu import _conv_ref

# (num, channels, height, width, out_channels, kh, kw, ph, pw, sh, sw, dh, dw, groups)
CASES = {
    "resnext-like": (2, 16, 6, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1, 4),      # 4 per group, OB 4
    "ob8-stride2": (1, 32, 9, 11, 32, 3, 3, 1, 1, 2, 2, 1, 1, 2),     # 16 per group, OB 8
    "ob2-dilated": (1, 12, 8, 9, 6, 3, 3, 2, 2, 1, 1, 2, 2, 3),       # 4 in, 2 out per group
    "ob1-5x5": (1, 6, 7, 5, 3, 5, 5, 2, 2, 1, 1, 1, 1, 3),            # 1 out per group, WO 5
    "1x1": (3, 8, 3, 2, 12, 1, 1, 0, 0, 1, 1, 1, 1, 2),               # 4 -> 6 per group, OB 2
    "unpadded-narrow": (1, 8, 5, 3, 8, 3, 3, 0, 0, 1, 1, 1, 1, 2),    # WO 1: PB 1
}


@pytest.mark.parametrize("bias,act", [(False, None), (True, ("relu", 0.1)),
                                      (True, ("clip", -0.5, 0.5))],
                         ids=["plain", "bias-relu", "bias-clip"])
@pytest.mark.parametrize("p", list(CASES.values()), ids=list(CASES))
def test_forward_matches_float64(d, rng, p, bias, act):
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    want = _conv_ref(x, w, g)
    if bias:
        want = want + b.reshape(1, -1, 1, 1)
    if act and act[0] == "relu":
        want = np.where(want > 0, want, act[1] * want)
    elif act:
        want = np.clip(want, act[1], act[2])
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    yb = d.buf(np.full(yshape, np.nan))
    d.run([grouped_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb,
                               d.buf(b) if bias else None, act)])
    assert rel_err(d.get(yb, yshape), want) < 1e-5


def test_outputs_per_item():
    assert [grouped_ops.outputs_per_item(conv_ops.ConvGeometry(1, 64, 4, 4, co, 3, 3,
                                                               groups=4))
            for co in (64, 16, 8, 24, 12)] == [8, 4, 2, 2, 1]


def test_gpu_forward_takes_it(d, rng, monkeypatch):
    """On a GPU the automatic forward of a grouped convolution with few
    channels per group is this kernel (not with the setting off, not for
    wider groups or depthwise); it adds no shortcut (writes_residual)."""
    monkeypatch.setattr(d.dev, "is_cpu", False)
    monkeypatch.setattr(grouped_ops, "MIN_ITEMS", 1)      # a test-sized layer
    g = conv_ops.ConvGeometry(*CASES["resnext-like"])
    assert grouped_ops.applies(d.dev, g)
    assert not conv_ops.writes_residual(d.dev, g)
    wide = conv_ops.ConvGeometry(1, 64, 4, 4, 64, 3, 3, 1, 1, groups=2)     # 32 per group
    depthwise = conv_ops.ConvGeometry(1, 8, 4, 4, 8, 3, 3, 1, 1, groups=8)
    dense = conv_ops.ConvGeometry(1, 8, 4, 4, 8, 3, 3, 1, 1)
    assert not any(grouped_ops.applies(d.dev, h) for h in (wide, depthwise, dense))
    with config.override(GROUPED_DIRECT=False):
        assert not grouped_ops.applies(d.dev, g)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    yb = d.buf(np.zeros(yshape))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None)
    assert [ln.name for ln in launches] == ["grouped_fwd"]
    d.run(launches)
    assert rel_err(d.get(yb, yshape), _conv_ref(x, w, g)) < 1e-5


def test_cpu_drivers_keep_the_gemm(d):
    if not d.dev.is_cpu:
        pytest.skip("a CPU driver's rule")
    assert not grouped_ops.applies(d.dev, conv_ops.ConvGeometry(*CASES["resnext-like"]))


def test_few_work_items_keep_the_implicit_gemm(d, monkeypatch):
    """At batch 1 on small planes the kernel has too few work-items to pay
    (MIN_ITEMS); a bigger batch of the same layer takes it."""
    monkeypatch.setattr(d.dev, "is_cpu", False)
    one = conv_ops.ConvGeometry(1, 440, 7, 7, 440, 3, 3, 1, 1, groups=55)
    assert grouped_ops._work_items(one) < grouped_ops.MIN_ITEMS
    assert not grouped_ops.applies(d.dev, one)
    sixteen = conv_ops.ConvGeometry(16, 440, 7, 7, 440, 3, 3, 1, 1, groups=55)
    assert grouped_ops.applies(d.dev, sixteen)
    with config.override(DETERMINISTIC=True):     # the same choice at every batch
        assert not grouped_ops.applies(d.dev, sixteen)
