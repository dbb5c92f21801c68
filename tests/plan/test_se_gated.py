"""An SE block's channel scale applied by the projection's own kernel
(GPUs: ops.conv.takes_gate, kernels/conv1x1_few.cl GATE; plan/se.py and
plan/residual.py): Scale(x, gate) -> 1x1 Convolution (-> Eltwise SUM with
a shortcut -> ReLU) as one launch. The rule is the GPU's; here it is made
to hold on whatever device runs the tests (the kernel runs on PoCL too),
so the plan, the launches and every blob's value are checked against the
same net layer by layer: one gate for the batch and one per image, the
residual form, a reshape to shapes where the kernel takes no gate, a
forward range cutting the group, and a backward after it."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.plan import residual, se
from caffe_ocl.proto import parse_net_text
from test_swish_fusion import _assert_blobs_equal

pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")

_W = 'weight_filler { type: "gaussian" std: 0.4 }'
_B = 'bias_filler { type: "gaussian" std: 0.4 }'


def _conv(name, bottom, top, n, k=1, pad=0, group=1):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} group: {group} '
            f'{_W} {_B} }} }}\n')


def _se_block(x, out, c, squeeze=3):
    """torchvision's SE block as onnx2caffe writes it (axis-0 Scale)."""
    return ('layer { name: "gap" type: "Pooling" bottom: "%s" top: "gap" '
            'pooling_param { pool: AVE global_pooling: true } }\n' % x
            + _conv("fc1", "gap", "f1", squeeze)
            + 'layer { name: "r1" type: "ReLU" bottom: "f1" top: "g1" }\n'
            + _conv("fc2", "g1", "f2", c)
            + 'layer { name: "sig" type: "Sigmoid" bottom: "f2" top: "gate" }\n'
            + 'layer { name: "flat" type: "Flatten" bottom: "gate" top: "gate_flat" }\n'
            + f'layer {{ name: "se" type: "Scale" bottom: "{x}" bottom: "gate_flat" '
              f'top: "{out}" scale_param {{ axis: 0 }} }}\n')


HEAD = ('name: "seg" layer { name: "data" type: "Input" top: "data" top: "t" '
        'input_param { shape { dim: 2 dim: 8 dim: 5 dim: 4 } shape { dim: 2 dim: 8 dim: 5 '
        'dim: 4 } } }\n')
BODY = (_conv("dw", "data", "d", 8, k=3, pad=1, group=8)
        + 'layer { name: "dr" type: "ReLU" bottom: "d" top: "dr" }\n'
        + _se_block("dr", "s", 8))
# the projection alone (then an InnerProduct), and with a residual shortcut
PLAIN = (HEAD + BODY + _conv("proj", "s", "p", 6)
         + f'layer {{ name: "fc" type: "InnerProduct" bottom: "p" top: "out" '
           f'inner_product_param {{ num_output: 5 {_W} }} }}\n')
RESIDUAL = (HEAD + BODY + _conv("proj", "s", "p", 8)
            + 'layer { name: "add" type: "Eltwise" bottom: "p" bottom: "data" top: "sum" }\n'
            + 'layer { name: "relu" type: "ReLU" bottom: "sum" top: "out" }\n'
            + 'layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "t" '
              'top: "loss" }\n')


@pytest.fixture
def gate_rule(monkeypatch):
    """ops.conv.takes_gate as on a GPU for 1x1 layers of at most 8 input
    channels (the projections here); ``rule["on"] = False`` turns it off
    (a reshape to shapes the kernel does not take)."""
    rule = {"on": True}

    def takes_gate(dev, g, algo=None):
        return (rule["on"] and config.get("SE_GATED_1X1") and g.is_1x1 and g.groups == 1
                and g.channels <= 8)
    monkeypatch.setattr(conv_ops, "takes_gate", takes_gate)
    # the GPU's kernel, not the CPU drivers' channel-vector one (below)
    monkeypatch.setattr(conv_ops, "CHANVEC_GATE", False)
    return rule


def _nets(text, rng):
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    for name, blobs in plain.params.items():
        for a, b in zip(fused.params[name], blobs):
            a.data[...] = b.data[...] = rng.normal(0, 0.5, b.shape)
    return fused, plain


def _forward(nets, rng, n=2):
    x = rng.normal(0, 1, (n, 8, 5, 4)).astype(np.float32)
    t = rng.normal(0, 1, (n, 8, 5, 4)).astype(np.float32)
    for net in nets:
        if net.blobs["data"].shape[0] != n:
            for b in ("data", "t"):
                net.blobs[b].reshape(n, 8, 5, 4)
            net.reshape()
        net.forward(data=x, t=t)


def _group(net, cls):
    return [c for c in net.plan.groups if isinstance(c, cls)]


@pytest.mark.parametrize("n", [2, 1], ids=["gate-per-image", "batch-1"])
def test_projection_applies_the_gate(rng, gate_rule, n):
    fused, plain = _nets(PLAIN, rng)
    (group,) = _group(fused, se.SEScaleConv)
    assert group.describe() == "se -> proj (channel scale in the weights)"
    for _ in range(2):
        _forward((fused, plain), rng, n)
        assert [ln.name for ln in group.fwd] == ["conv1x1_few"]       # one launch for two
        assert fused.blobs["s"].compute_on_read is not None           # computed when read
        _assert_blobs_equal(fused, plain, ["p", "out"])
        _assert_blobs_equal(fused, plain)
    with config.override(SE_GATED_1X1=False):
        assert _group(Net(parse_net_text(PLAIN), TEST), se.SEScaleConv) == []


def test_residual_projection_applies_the_gate(rng, gate_rule):
    fused, plain = _nets(RESIDUAL, rng)
    (group,) = _group(fused, residual.ConvResidual)
    assert group.describe() == ("se -> proj -> add -> relu (shortcut added in the "
                                "convolution's epilogue, the channel scale by its kernel)")
    assert not _group(fused, se.SEScaleConv)
    for n in (2, 1):
        _forward((fused, plain), rng, n)
        assert [ln.name for ln in group.fwd] == ["conv1x1_few"]
        assert fused.blobs["s"].compute_on_read is not None
        assert fused.blobs["p"].compute_on_read is not None
        _assert_blobs_equal(fused, plain, ["out", "loss"])
        _assert_blobs_equal(fused, plain)
    with config.override(SE_GATED_1X1=False):
        net = Net(parse_net_text(RESIDUAL), TEST)
        assert [c.scale for c in _group(net, residual.ConvResidual)] == [None]


def test_shapes_without_the_gated_kernel(rng, gate_rule):
    """Where the kernel takes no gate at the current shapes the Scale runs
    first (residual form) or the layers run one by one (alone): the same
    values, and back to one launch when the rule holds again."""
    for text, cls in ((RESIDUAL, residual.ConvResidual), (PLAIN, se.SEScaleConv)):
        fused, plain = _nets(text, rng)
        (group,) = _group(fused, cls)
        gate_rule["on"] = False
        _forward((fused, plain), rng, 3)
        assert fused.blobs["s"].compute_on_read is None               # the Scale ran
        _assert_blobs_equal(fused, plain)
        gate_rule["on"] = True
        _forward((fused, plain), rng, 2)
        assert fused.blobs["s"].compute_on_read is not None
        _assert_blobs_equal(fused, plain)


def test_ranges_and_backward(rng, gate_rule):
    fused, plain = _nets(RESIDUAL, rng)
    _forward((fused, plain), rng)
    for net in (fused, plain):            # ranges cutting the group
        net.forward(start="se", end="proj")
        net.forward(start="add")
    _assert_blobs_equal(fused, plain)
    _forward((fused, plain), rng)
    gf, gp = fused.backward(diffs=["data"]), plain.backward(diffs=["data"])
    np.testing.assert_allclose(gf["data"], gp["data"], rtol=1e-4, atol=1e-5)
    for name, blobs in plain.params.items():
        for a, b in zip(fused.params[name], blobs):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("text,cls", [(PLAIN, se.SEScaleConv), (RESIDUAL, residual.ConvResidual)],
                         ids=["projection", "residual"])
def test_cpu_channel_vector_projection_applies_the_gate(d, rng, text, cls):
    """CPU drivers, the real rule: the projection runs the channel-vector
    kernel with the gate applied to its weights as it loads them (no Scale
    pass), one gate per image and one for the batch."""
    if not d.dev.is_cpu:
        pytest.skip("the CPU drivers' rule")
    fused, plain = _nets(text, rng)
    (group,) = _group(fused, cls)
    assert conv_ops.chanvec_takes_gate(d.dev, group.conv.geom)
    for n in (2, 1, 2):
        _forward((fused, plain), rng, n)
        names = [ln.name for ln in group.fwd]
        assert names[-1] in ("conv_chanvec", "conv_chanvec_kb") and "scale_weight_columns" \
            not in names and len(names) == 2       # the weights' packing, the convolution
        assert fused.blobs["s"].compute_on_read is not None
        _assert_blobs_equal(fused, plain)
