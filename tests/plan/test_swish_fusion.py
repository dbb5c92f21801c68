"""TEST rewrites of Swish/SiLU and Sigmoid into the producer's epilogue
(caffe_ocl/plan/swish.py, elide.py, fold.py; kernels/act.h ACT 3 and 4):
ONNX's conv -> Sigmoid -> Eltwise PROD (a Split inserted), Caffe's Swish
layer in place after conv -> BatchNorm -> Scale and into a new top, a
depthwise and an InnerProduct producer, and an SE block (global pooling
-> 1x1 conv -> SiLU -> 1x1 conv -> Sigmoid -> channel Scale). Every blob
read equals the net without the rewrite; ranges and backward too."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import chain, elide, se, swish
from caffe_ocl.proto import parse_net_text

_W = 'weight_filler { type: "gaussian" std: 0.4 }'
_B = 'bias_filler { type: "gaussian" std: 0.4 }'


def _conv(name, bottom, top, n, k=1, pad=0, group=1, bias=True):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} group: {group} '
            f'bias_term: {"true" if bias else "false"} {_W} {_B if bias else ""} }} }}\n')


def _silu(name, x, y, swap=False):
    """ONNX's x * sigmoid(x) as onnx2caffe writes it."""
    bots = f'bottom: "{name}_s" bottom: "{x}"' if swap else f'bottom: "{x}" bottom: "{name}_s"'
    return (f'layer {{ name: "{name}_sig" type: "Sigmoid" bottom: "{x}" top: "{name}_s" }}\n'
            f'layer {{ name: "{name}_mul" type: "Eltwise" {bots} top: "{y}" '
            f'eltwise_param {{ operation: PROD }} }}\n')


def _hardswish(name, x, y, swap=False):
    """ONNX's HardSwish as onnx2caffe writes it: x * clip(x / 6 + 0.5, 0, 1)."""
    bots = f'bottom: "{name}_g" bottom: "{x}"' if swap else f'bottom: "{x}" bottom: "{name}_g"'
    return (_hardsigmoid(name, x, f"{name}_g", 1 / 6, 0.5)
            + f'layer {{ name: "{name}_mul" type: "Eltwise" {bots} top: "{y}" '
              f'eltwise_param {{ operation: PROD }} }}\n')


def _hardsigmoid(name, x, y, a, b):
    return (f'layer {{ name: "{name}_aff" type: "Power" bottom: "{x}" top: "{name}_m" '
            f'power_param {{ scale: {a!r} shift: {b!r} }} }}\n'
            f'layer {{ name: "{name}_clip" type: "Clip" bottom: "{name}_m" top: "{y}" '
            f'clip_param {{ min: 0 max: 1 }} }}\n')


HEAD = ('name: "silu" layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } } }\n')

# the converted form (EfficientNet): stem conv + SiLU, depthwise conv +
# SiLU (PROD bottoms swapped), an SE block, a projection, an
# InnerProduct + SiLU
CONVERTED = (HEAD + _conv("stem", "data", "c1", 8, k=3, pad=1) + _silu("a1", "c1", "y1")
             + _conv("dw", "y1", "c2", 8, k=3, pad=1, group=8) + _silu("a2", "c2", "y2", True)
             + 'layer { name: "gap" type: "Pooling" bottom: "y2" top: "gap" '
               'pooling_param { pool: AVE global_pooling: true } }\n'
             + _conv("fc1", "gap", "f1", 2) + _silu("a3", "f1", "g1")
             + _conv("fc2", "g1", "f2", 8)
             + 'layer { name: "gate" type: "Sigmoid" bottom: "f2" top: "gate" }\n'
             + 'layer { name: "flat" type: "Flatten" bottom: "gate" top: "gate_flat" }\n'
             + 'layer { name: "se" type: "Scale" bottom: "y2" bottom: "gate_flat" top: "se" '
               'scale_param { axis: 0 } }\n'
             + _conv("proj", "se", "p", 4, bias=False)
             + 'layer { name: "fc" type: "InnerProduct" bottom: "p" top: "fc" '
               f'inner_product_param {{ num_output: 5 {_W} {_B} }} }}\n'
             + _silu("a4", "fc", "out"))

# MobileNet v3 as converted: conv + HardSwish, depthwise conv + HardSwish
# (PROD bottoms swapped), an SE block with a ReLU and a hard-sigmoid gate,
# an InnerProduct + HardSwish
MOBILENET_V3 = (HEAD + _conv("stem", "data", "c1", 8, k=3, pad=1) + _hardswish("h1", "c1", "y1")
                + _conv("dw", "y1", "c2", 8, k=3, pad=1, group=8)
                + _hardswish("h2", "c2", "y2", True)
                + 'layer { name: "gap" type: "Pooling" bottom: "y2" top: "gap" '
                  'pooling_param { pool: AVE global_pooling: true } }\n'
                + _conv("fc1", "gap", "f1", 2)
                + 'layer { name: "r" type: "ReLU" bottom: "f1" top: "g1" }\n'
                + _conv("fc2", "g1", "f2", 8) + _hardsigmoid("hs", "f2", "gate", 0.2, 0.5)
                + 'layer { name: "flat" type: "Flatten" bottom: "gate" top: "gate_flat" }\n'
                + 'layer { name: "se" type: "Scale" bottom: "y2" bottom: "gate_flat" '
                  'top: "se" scale_param { axis: 0 } }\n'
                + 'layer { name: "fc" type: "InnerProduct" bottom: "se" top: "fc" '
                  f'inner_product_param {{ num_output: 5 {_W} {_B} }} }}\n'
                + _hardswish("h4", "fc", "out"))

# Caffe's forms: Swish in place after conv -> BatchNorm -> Scale (folded
# chain), Swish with beta into a new top (an elide pair)
CAFFE = (HEAD + _conv("conv1", "data", "c1", 6, k=3, pad=1, bias=False)
         + 'layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }\n'
         + 'layer { name: "sc1" type: "Scale" bottom: "c1" top: "c1" '
           'scale_param { bias_term: true } }\n'
         + 'layer { name: "sw1" type: "Swish" bottom: "c1" top: "c1" }\n'
         + _conv("conv2", "c1", "c2", 4)
         + 'layer { name: "sw2" type: "Swish" bottom: "c2" top: "s2" '
           'swish_param { beta: 1.5 } }\n')


@pytest.fixture(autouse=True)
def no_squeeze_groups():
    """The SE squeeze's one-launch group (GPUs, plan/se_squeeze.py) would
    take in the products' groups that these tests look at: off here
    (tests/plan/test_se_squeeze.py checks it with them)."""
    with config.override(FUSE_SE_SQUEEZE=False):
        yield


def _nets(text, rng):
    with config.override(FUSE_SE_SCALE=True):       # off by default (se.py)
        fused = Net(parse_net_text(text), TEST, fold=True)
    plain = Net(parse_net_text(text), TEST, fold=False)
    with config.override(FUSE_SWISH=False, FUSE_SE_SCALE=True):
        no_swish = Net(parse_net_text(text), TEST, fold=True)
    for name, blobs in plain.params.items():
        for d, s, n in zip(fused.params[name], blobs, no_swish.params[name]):
            v = rng.normal(0, 0.5, s.shape)
            if len(s.shape) == 1 and name.startswith("bn") and d is fused.params[name][1]:
                v = np.abs(v) + 0.5          # variance
            if name.startswith("bn") and d is fused.params[name][2]:
                v = np.ones(s.shape)         # moving-average factor
            d.data[...] = v
            s.data[...] = v
            n.data[...] = v
    return fused, plain, no_swish


def _assert_blobs_equal(a, b, names=None):
    for name in names or b.blobs:
        x, y = a.blobs[name].data, b.blobs[name].data
        scale = max(float(np.abs(y).max()), 1.0)
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-5 * scale, err_msg=name)


def _x(rng):
    return rng.normal(0, 1, (2, 3, 6, 5)).astype(np.float32)


def test_converted_form(rng):
    fused, plain, no_swish = _nets(CONVERTED, rng)
    groups = fused.plan.groups
    sw = [c.describe().split(" -> ")[0] for c in groups if isinstance(c, swish.SwishGroup)]
    assert sw == ["stem", "dw", "fc1", "fc"]
    # the SE gate: fc2 -> Sigmoid into a new top, the sigmoid in the epilogue
    pairs = [c for c in groups if isinstance(c, elide.ProducerActPair)]
    assert [(c.describe(), c.act) for c in pairs] == [("fc2 -> gate", ("sigmoid",))]
    assert not any(isinstance(c, swish.SwishGroup) for c in no_swish.plan.groups)
    assert not any(getattr(c, "act", None) == ("sigmoid",) for c in no_swish.plan.groups)
    # the SE block's channel scale folded into the projection's weights
    assert [c.describe() for c in groups if isinstance(c, se.SEScaleConv)] == \
        ["se -> proj (channel scale in the weights)"]
    with config.override(FUSE_SE_SCALE=False, SE_GATED_1X1=False):
        assert not any(isinstance(c, se.SEScaleConv)
                       for c in Net(parse_net_text(CONVERTED), TEST).plan.groups)
    assert plain.plan.describe() == []
    for it in range(2):
        x = _x(rng)
        for net in (fused, plain, no_swish):
            net.forward(data=x)
        assert fused.blobs["a1_s"].compute_on_read is not None
        # the outputs first, then every blob (the pending ones computed)
        _assert_blobs_equal(fused, plain, ["out", "se", "y2"])
        _assert_blobs_equal(fused, plain)
        _assert_blobs_equal(no_swish, plain)


def test_mobilenet_v3_form(rng):
    fused, plain, no_swish = _nets(MOBILENET_V3, rng)
    groups = [(c.describe().split(" -> ")[0], c.act) for c in fused.plan.groups
              if isinstance(c, swish.SwishGroup)]
    sixth = float(np.float32(1 / 6))       # power_param's scale is a float
    assert groups == [("stem", ("hardswish", sixth, 0.5)), ("dw", ("hardswish", sixth, 0.5)),
                      ("fc2", ("hardsigmoid", float(np.float32(0.2)), 0.5)),
                      ("fc", ("hardswish", sixth, 0.5))]
    assert not any(isinstance(c, swish.SwishGroup) for c in no_swish.plan.groups)
    for it in range(2):
        x = _x(rng) * 4          # both clip ends of the hard sigmoid reached
        for net in (fused, plain, no_swish):
            net.forward(data=x)
        assert fused.blobs["h1_m"].compute_on_read is not None
        _assert_blobs_equal(fused, plain, ["out", "se", "gate"])
        _assert_blobs_equal(fused, plain)
        _assert_blobs_equal(no_swish, plain)
    m = plain.blobs["h1_m"].data
    assert (m < 0).any() and (m > 1).any()


def test_caffe_forms(rng):
    fused, plain, _ = _nets(CAFFE, rng)
    groups = fused.plan.groups
    chains = [c for c in groups if isinstance(c, chain.Chain)]
    assert [(c.describe(), c.act) for c in chains] == [("conv1 <- bn1, sc1, sw1",
                                                        ("swish", 1.0))]
    pairs = [c for c in groups if isinstance(c, elide.ProducerActPair)]
    assert [(c.describe(), c.act) for c in pairs] == [("conv2 -> sw2", ("swish", 1.5))]
    x = _x(rng)
    for net in (fused, plain):
        net.forward(data=x)
    _assert_blobs_equal(fused, plain)


def test_winograd_producer_keeps_its_layers(rng):
    text = HEAD + _conv("c", "data", "c", 4, k=3, pad=1) + _silu("a", "c", "y")
    with config.override(WINOGRAD=True):
        fused, plain, _ = _nets(text, rng)
        assert fused.plan.describe() == []
        x = _x(rng)
        for net in (fused, plain):
            net.forward(data=x)
        _assert_blobs_equal(fused, plain)
    with config.override(WINOGRAD=False):
        assert len(Net(parse_net_text(text), TEST).plan.describe()) == 1


def test_se_scale_with_bias_and_batch_sizes(rng):
    """The channel scale folded into a projection with a bias at batch 1;
    at batch 3 (a gate per image) the layers run one by one; a Scale read
    elsewhere is kept."""
    assert CONVERTED.count("bias_term: false") == 1          # the projection's
    text = CONVERTED.replace("bias_term: false", "bias_term: true " + _B)
    fused, plain, _ = _nets(text, rng)
    assert any(isinstance(c, se.SEScaleConv) for c in fused.plan.groups)
    for n in (1, 3):
        x = rng.normal(0, 1, (n, 3, 6, 5)).astype(np.float32)
        for net in (fused, plain):
            net.blobs["data"].reshape(*x.shape)
            net.reshape()
            net.forward(data=x)
        # one gate for the batch, or a kernel applying a gate per image (GPUs)
        assert (fused.blobs["se"].compute_on_read is not None) == \
            (n == 1 or se.gated(fused.layer_dict["proj"]))
        _assert_blobs_equal(fused, plain, ["p", "out"])
        _assert_blobs_equal(fused, plain)
    peek = CONVERTED + ('layer { name: "peek" type: "Pooling" bottom: "se" top: "peek" '
                        'pooling_param { pool: MAX kernel_size: 2 } }\n')
    with config.override(FUSE_SE_SCALE=True):
        assert not any(isinstance(c, se.SEScaleConv)
                       for c in Net(parse_net_text(peek), TEST).plan.groups)
    # the default: only where the projection's kernel applies the gate
    # itself (GPUs, test_se_gated.py)
    net = Net(parse_net_text(CONVERTED), TEST)
    assert any(isinstance(c, se.SEScaleConv) for c in net.plan.groups) == \
        se.gated(net.layer_dict["proj"])


def test_se_scale_batch_one_axis_one(rng):
    """onnx2caffe's form at batch 1: the gate a (C,) vector, Scale axis 1."""
    text = (CONVERTED.replace("dim: 2 dim: 3 dim: 6 dim: 5", "dim: 1 dim: 3 dim: 6 dim: 5")
            .replace('type: "Flatten" bottom: "gate" top: "gate_flat" }',
                     'type: "Reshape" bottom: "gate" top: "gate_flat" '
                     'reshape_param { shape { dim: -1 } } }')
            .replace("scale_param { axis: 0 }", "scale_param { axis: 1 }"))
    fused, plain, _ = _nets(text, rng)
    assert fused.blobs["gate_flat"].shape == (8,)
    assert any(isinstance(c, se.SEScaleConv) for c in fused.plan.groups)
    x = rng.normal(0, 1, (1, 3, 6, 5)).astype(np.float32)
    for net in (fused, plain):
        net.forward(data=x)
    assert fused.blobs["se"].compute_on_read is not None
    _assert_blobs_equal(fused, plain, ["p", "out"])
    _assert_blobs_equal(fused, plain)


def test_not_applied_when_a_blob_is_read_elsewhere():
    # the Sigmoid's top also read by another layer; the product with coefficients
    text = CONVERTED + ('layer { name: "peek" type: "Pooling" bottom: "a1_s" top: "peek" '
                        'pooling_param { pool: MAX kernel_size: 2 } }\n')
    net = Net(parse_net_text(text), TEST)
    sw = [c.describe().split(" -> ")[0] for c in net.plan.groups
          if isinstance(c, swish.SwishGroup)]
    assert sw == ["dw", "fc1", "fc"]


def test_ranges_and_backward(rng):
    """No BatchNorm: the groups lose no value, so backward runs at TEST
    (a loss on the output) after the pending blobs are computed."""
    text = (CONVERTED.replace('top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } }',
                              'top: "data" top: "t" input_param { shape { dim: 2 dim: 3 '
                              'dim: 6 dim: 5 } shape { dim: 2 dim: 5 } }')
            + 'layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "t" '
              'top: "loss" }\n')
    fused, plain, _ = _nets(text, rng)
    assert any(isinstance(c, swish.SwishGroup) for c in fused.plan.groups)
    x, t = _x(rng), rng.normal(0, 1, (2, 5)).astype(np.float32)
    for net in (fused, plain):
        net.forward(data=x, t=t)
    # ranges cutting groups: pending blobs computed, then layer by layer
    for net in (fused, plain):
        net.forward(start="a1_sig", end="fc1")
        net.forward(start="a3_sig")
    _assert_blobs_equal(fused, plain)
    for net in (fused, plain):
        net.forward(data=x * 0.5, t=t)
    gf, gp = fused.backward(diffs=["data"]), plain.backward(diffs=["data"])
    np.testing.assert_allclose(gf["data"], gp["data"], rtol=1e-4, atol=1e-5)
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            np.testing.assert_allclose(d.diff, s.diff, rtol=1e-4, atol=1e-5, err_msg=name)
    _assert_blobs_equal(fused, plain)


@pytest.mark.parametrize("act", [("swish", 1.0), ("swish", 0.7), ("sigmoid",),
                                 ("hardswish", 1 / 6, 0.5), ("hardsigmoid", 0.3, 0.4)])
def test_gemm_epilogue_acts(act, rng):
    """ops.gemm's epilogue (kernels/act.h ACT 3, 4) against NumPy."""
    from caffe_ocl.blob import Blob
    from caffe_ocl.ops import gemm as gemm_ops
    a = rng.normal(0, 2, (5, 7)).astype(np.float32)
    b = rng.normal(0, 1, (7, 9)).astype(np.float32)
    A, B, C = Blob(a.shape), Blob(b.shape), Blob((5, 9))
    A.data[...] = a
    B.data[...] = b
    for m in (A, B):
        m.data_mem.to_device()
    dev = A.data_mem.device
    gemm_ops.gemm(dev, 5, 9, 7, A.data_buffer(), B.data_buffer(), C.data_buffer(),
                  act=act).run(dev.queue)
    C.data_mem.device_written()
    v = a.astype(np.float64) @ b
    if act[0] == "swish":
        want = v / (1 + np.exp(-act[1] * v))
    elif act[0] == "sigmoid":
        want = 1 / (1 + np.exp(-v))
    else:
        want = np.clip(act[1] * v + act[2], 0, 1) * (v if act[0] == "hardswish" else 1)
    np.testing.assert_allclose(C.data, want, rtol=1e-5, atol=1e-6)
