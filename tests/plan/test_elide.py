"""TEST rewrite of a producer -> activation writing a new top (the form of
ONNX-converted nets; caffe_ocl/plan/elide.py): the producer's GEMM writes
the activation's top, its own top is computed when read. Every blob read
equals the unfused net's; backward and cut ranges give Caffe's values."""
import numpy as np
import pytest

from caffe_ocl.net import Net, TEST, TRAIN
from caffe_ocl.plan import elide
from caffe_ocl.proto import parse_net_text

# conv(bias) -> ReLU(new top) -> Split (an ONNX ResNet stem), conv -> ReLU6
# (new top), InnerProduct -> leaky ReLU (new top), a conv whose top is read
# twice (left alone), and a loss so that backward runs at TEST.
NET = """
name: "elide"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 7 dim: 6 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "r1" }
layer { name: "conv2" type: "Convolution" bottom: "r1" top: "c2"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu2" type: "ReLU6" bottom: "c2" top: "r2" }
layer { name: "sum" type: "Eltwise" bottom: "r1" bottom: "r2" top: "sum"
        eltwise_param { coeff: 0.5 coeff: -1.5 } }
layer { name: "sumrelu" type: "ReLU" bottom: "sum" top: "sumr" }
layer { name: "conv3" type: "Convolution" bottom: "sumr" top: "c3"
        convolution_param { num_output: 2 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu3" type: "ReLU" bottom: "c3" top: "r3" }
layer { name: "side" type: "Pooling" bottom: "c3" top: "side"
        pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "r3" top: "fc"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "lrelu" type: "ReLU" bottom: "fc" top: "fcr"
        relu_param { negative_slope: 0.2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fcr" bottom: "label" top: "loss" }
"""


def _net(phase=TEST, **kw):
    return Net(parse_net_text(NET), phase, **kw)


def _pair(rng):
    fused, plain = _net(), _net(fold=False)
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            d.data[...] = rng.normal(0, 0.6, s.shape)
            s.data[...] = d.host_data()
    return fused, plain


def _inputs(rng, n=2):
    return dict(data=rng.normal(0, 1, (n, 3, 7, 6)).astype(np.float32),
                label=rng.integers(0, 5, n).astype(np.float32))


def _assert_blobs_equal(a, b, names=None):
    for name in names or b.blobs:
        x, y = a.blobs[name].data, b.blobs[name].data
        scale = max(float(np.abs(y).max()), 1.0)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_pairs_found():
    net = _net()
    assert net.plan.describe() == ["conv1 -> relu1", "conv2 -> relu2", "fc -> lrelu",
                                   "sum -> sumrelu"]
    assert all(isinstance(c, elide.PendingPair) for c in net.plan.fold_groups)
    assert _net(fold=False).plan.describe() == []
    assert not any(isinstance(c, elide.PendingPair) for c in _net(TRAIN).plan.groups)


def test_blobs_equal_when_read(rng):
    fused, plain = _pair(rng)
    inputs = _inputs(rng)
    fused.forward(**inputs)
    plain.forward(**inputs)
    # the producers' tops were not computed: they are when read
    for name in ("c1", "c2", "fc", "sum"):
        assert fused.blobs[name].compute_on_read is not None
    assert fused.blobs["c3"].compute_on_read is None          # read twice: not elided
    _assert_blobs_equal(fused, plain)
    assert all(fused.blobs[n].compute_on_read is None for n in ("c1", "c2", "fc", "sum"))
    # forward(blobs=[...]) and a new batch size
    big = _inputs(rng, 3)
    for net in (fused, plain):
        for k, v in big.items():
            net.blobs[k].reshape(*v.shape)
        net.reshape()
    out_f = fused.forward(blobs=["c2"], **big)
    out_p = plain.forward(blobs=["c2"], **big)
    np.testing.assert_allclose(out_f["c2"], out_p["c2"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out_f["loss"], out_p["loss"], rtol=1e-5, atol=1e-6)
    _assert_blobs_equal(fused, plain)


def test_cut_ranges_and_backward(rng):
    fused, plain = _pair(rng)
    inputs = _inputs(rng)
    fused.forward(**inputs)
    plain.forward(**inputs)
    # relu2 alone: conv2's top is computed first (it was left pending)
    for net in (fused, plain):
        net.forward(start="relu2", end="relu2")
    assert fused.blobs["c2"].compute_on_read is None
    _assert_blobs_equal(fused, plain, ["c2", "r2"])
    for net in (fused, plain):
        net.forward(end="conv1")
        net.forward(start="relu1", end="sum")
        net.forward(start="sumrelu")
    _assert_blobs_equal(fused, plain)
    # backward runs on Caffe's values (the pending tops computed first)
    fused.forward(**inputs)
    plain.forward(**inputs)
    want = ["c1", "c2", "sum"]
    gf, gp = fused.backward(diffs=want), plain.backward(diffs=want)
    for name in ["data"] + want:
        np.testing.assert_allclose(gf[name], gp[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            np.testing.assert_allclose(d.diff, s.diff, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("other", ["Split", "in_place"])
def test_producer_top_read_elsewhere_is_left_alone(other):
    text = NET
    if other == "Split":      # c1 also read by another layer
        text += """layer { name: "extra" type: "Pooling" bottom: "c1" top: "extra"
        pooling_param { pool: AVE kernel_size: 2 } }\n"""
        want = ["conv2 -> relu2", "fc -> lrelu", "sum -> sumrelu"]
    else:                     # the activation in place: fold.py folds it instead
        text = text.replace('bottom: "fc" top: "fcr"', 'bottom: "fc" top: "fc"') \
            .replace('bottom: "fcr" bottom: "label"', 'bottom: "fc" bottom: "label"')
        want = ["fc <- lrelu", "conv1 -> relu1", "conv2 -> relu2", "sum -> sumrelu"]
    net = Net(parse_net_text(text), TEST)
    assert net.plan.describe() == want


def test_unfold_computes_pending_tops(rng):
    fused, plain = _pair(rng)
    inputs = _inputs(rng)
    fused.forward(**inputs)
    plain.forward(**inputs)
    assert fused.blobs["c1"].compute_on_read is not None
    fused.unfold()
    assert fused.plan.describe() == []
    assert all(fused.blobs[n].compute_on_read is None for n in ("c1", "c2", "fc", "sum"))
    gf, gp = fused.backward(diffs=["c1"]), plain.backward(diffs=["c1"])
    np.testing.assert_allclose(gf["c1"], gp["c1"], rtol=1e-4, atol=1e-6)
    _assert_blobs_equal(fused, plain)
