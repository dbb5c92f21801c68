"""TRAIN-phase BatchNorm -> Scale (-> activation) fusion (caffe_ocl/plan/train.py):
a fused net gives the unfused net's outputs, blob/parameter gradients and
moving averages (float32 tolerance), over solver steps too; ranges that cut
a chain run it layer by layer."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.plan import train as fusion_train
from caffe_ocl.proto import caffe_pb2, parse_net_text

NET = """
name: "f" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 2 dim: 6 dim: 5 } shape { dim: 3 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "s1" type: "Scale" bottom: "c1" top: "c1"
        scale_param { bias_term: true filler { type: "gaussian" mean: 1 std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" relu_param { negative_slope: 0.1 } }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn2" type: "BatchNorm" bottom: "c2" top: "c2" }
layer { name: "s2" type: "Scale" bottom: "c2" top: "c2"
        scale_param { filler { type: "gaussian" mean: 1 std: 0.3 } } }
layer { name: "sum" type: "Eltwise" bottom: "c1" bottom: "c2" top: "sum" }
layer { name: "bn3" type: "BatchNorm" bottom: "sum" top: "sum" }
layer { name: "s3" type: "Scale" bottom: "sum" top: "sum"
        scale_param { bias_term: true filler { type: "constant" value: 0.8 } } }
layer { name: "r3" type: "ReLU6" bottom: "sum" top: "sum" }
layer { name: "fc" type: "InnerProduct" bottom: "sum" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def _net(monkeypatch, fuse, seed=3, text=NET, data_seed=0):
    """The TRAIN net of ``text`` (fusion on or off), its x and labels set."""
    monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
    caffe_ocl.set_random_seed(seed)
    net = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)
    rng = np.random.default_rng(data_seed)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape) * 2 + 1
    net.blobs["label"].data[...] = [0, 2, 1]
    return net


def test_chains_found(monkeypatch):
    net = _net(monkeypatch, True)
    chains = net.plan.train_groups
    assert [c.describe() for c in chains] == ["bn1 -> s1 -> r1", "bn2 -> s2",
                                               "bn3 -> s3 -> r3", "c1_r1_0_split -> c2"]
    assert _net(monkeypatch, False).plan.train_groups == []


def test_fused_equals_layer_by_layer(monkeypatch):
    ref, fused = _net(monkeypatch, False), _net(monkeypatch, True)
    for net in (ref, fused):
        for _ in range(2):      # twice: the moving averages accumulate
            net.forward()
            net.backward()
    for name in ("c1", "c2", "sum", "fc", "loss"):
        np.testing.assert_allclose(fused.blobs[name].data, ref.blobs[name].data,
                                   rtol=1e-4, atol=1e-5, err_msg=name)
    for name in ("x", "c1", "c2", "sum"):
        np.testing.assert_allclose(fused.blobs[name].diff, ref.blobs[name].diff,
                                   rtol=1e-3, atol=1e-5, err_msg=name)
    assert_params_close(fused, ref, ("c1", "c2", "bn1", "s1", "s2", "s3", "bn3", "fc"))


def assert_params_close(fused, ref, names):
    """The layers' parameters and their gradients agree (float32 tolerance)."""
    for lname in names:
        for i, (a, b) in enumerate(zip(fused.params[lname], ref.params[lname])):
            np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{lname}[{i}] data")
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-3, atol=1e-5,
                                       err_msg=f"{lname}[{i}] diff")


def test_ranges_cutting_a_chain_run_unfused(monkeypatch):
    ref, fused = _net(monkeypatch, False), _net(monkeypatch, True)
    for net in (ref, fused):
        net.forward(end="s1")            # stops inside chain bn1 -> s1 -> r1
        net.forward(start="r1")
        net.backward(end="s2")           # stops inside chain bn2 -> s2
        net.backward(start="bn2")
    np.testing.assert_allclose(fused.blobs["loss"].data, ref.blobs["loss"].data, rtol=1e-5)
    np.testing.assert_allclose(fused.blobs["x"].diff, ref.blobs["x"].diff, rtol=1e-3,
                               atol=1e-5)


def sgd_solver(net_text):
    """An SGD solver with momentum (no display, no snapshots) on a net whose
    Input layer gives "x" and "label"."""
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(parse_net_text(net_text))
    sp.base_lr, sp.momentum, sp.lr_policy, sp.max_iter = 0.05, 0.9, "fixed", 100
    sp.random_seed, sp.display, sp.snapshot_after_train = 5, 0, False
    return caffe_ocl.SGDSolver(sp)


def test_solver_steps_match(monkeypatch, tmp_path):
    """SGD with momentum through the solver (fused backward plus the
    per-layer hooks path) ends at the unfused weights."""
    results = []
    for fuse in (False, True):
        monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
        s = sgd_solver(NET)
        rng = np.random.default_rng(1)
        s.net.blobs["x"].data[...] = rng.standard_normal(s.net.blobs["x"].shape)
        s.net.blobs["label"].data[...] = [1, 0, 2]
        calls = []
        s.on_backward_layer.append(calls.append)
        s.step(3)
        assert sorted(set(calls)) == list(range(len(s.net.layers)))
        results.append({k: [b.data.copy() for b in v] for k, v in s.net.params.items()})
    for k in results[0]:
        for a, b in zip(results[0][k], results[1][k]):
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5, err_msg=k)


CONV_RELU = """
name: "cr" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } shape { dim: 2 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 3 kernel_size: 1 bias_term: false weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "r2" type: "ReLU" bottom: "c2" top: "c2" relu_param { negative_slope: 0.2 } }
layer { name: "c3" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "r3" type: "ReLU" bottom: "c3" top: "r3" }
layer { name: "fc" type: "InnerProduct" bottom: "r3" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def _ref_and_fused(monkeypatch, text, seed, labels):
    """The net of ``text`` built unfused and fused (same weights and input),
    each after one forward and backward."""
    nets = []
    for fuse in (False, True):
        monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
        caffe_ocl.set_random_seed(seed)
        net = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)
        net.blobs["x"].data[...] = np.random.default_rng(seed).standard_normal(
            net.blobs["x"].shape)
        net.blobs["label"].data[...] = labels
        net.forward()
        net.backward()
        nets.append(net)
    return nets


def test_conv_relu_forward_fused(monkeypatch):
    """Convolution -> in-place ReLU: the ReLU in the convolution's epilogue
    (not for a ReLU into another blob), backward layer by layer; same
    values and gradients as unfused."""
    ref, fused = _ref_and_fused(monkeypatch, CONV_RELU, 4, [2, 0])
    assert [c.describe() for c in fused.plan.train_groups
            if isinstance(c, fusion_train.ConvReLUChain)] == ["c1 -> r1", "c2 -> r2"]
    for name in ("c1", "c2", "c3", "loss"):
        np.testing.assert_allclose(fused.blobs[name].data, ref.blobs[name].data,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    assert (ref.blobs["c1"].data == 0).any() and (ref.blobs["c2"].data < 0).any()
    for name in ("x", "c1", "c2"):
        np.testing.assert_allclose(fused.blobs[name].diff, ref.blobs[name].diff,
                                   rtol=1e-4, atol=1e-6, err_msg=name)
    for lname in ("c1", "c2", "c3"):
        for a, b in zip(fused.params[lname], ref.params[lname]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-6, err_msg=lname)


RELU_POOL = """
name: "rp" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 9 dim: 7 } shape { dim: 2 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "p1" type: "Pooling" bottom: "c1" top: "p1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "c2" type: "Convolution" bottom: "p1" top: "c2"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "r2" type: "ReLU" bottom: "c2" top: "c2" relu_param { negative_slope: 0.2 } }
layer { name: "p2" type: "Pooling" bottom: "c2" top: "p2"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "c3" type: "Convolution" bottom: "p2" top: "c3"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "r3" type: "ReLU" bottom: "c3" top: "c3" }
layer { name: "p3" type: "Pooling" bottom: "c3" top: "p3"
        pooling_param { pool: MAX kernel_size: 2 stride: 1 } }
layer { name: "r4" type: "ReLU" bottom: "p3" top: "p3" }
layer { name: "fc" type: "InnerProduct" bottom: "p3" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def test_relu_maxpool_backward_fused(monkeypatch):
    """In-place ReLU -> MAX pooling: the pooling's backward applies the
    ReLU's gate (tiling 2x2/2 windows with a ragged edge, overlapping
    padded 3x3/2 with a leaky ReLU); not where a later layer changes the
    pooled blob in place (p3 -> r4). Same gradients as layer by layer."""
    ref, fused = _ref_and_fused(monkeypatch, RELU_POOL, 5, [1, 2])
    assert [c.describe() for c in fused.plan.train_groups
            if isinstance(c, fusion_train.ReLUMaxPoolBackward)] == ["r1 -> p1", "r2 -> p2"]
    # windows whose pooled value is <= 0 (the gate closes) exist in both kinds
    assert (ref.blobs["p1"].data == 0).any() and (ref.blobs["p2"].data < 0).any()
    for name in ("x", "c1", "c2", "c3", "p1", "p2"):
        np.testing.assert_allclose(fused.blobs[name].diff, ref.blobs[name].diff,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    for lname in ("c1", "c2", "c3", "fc"):
        for a, b in zip(fused.params[lname], ref.params[lname]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-5, atol=1e-6, err_msg=lname)


RELU_CONV = """
name: "rc" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 9 dim: 8 } shape { dim: 2 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 5 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "r2" type: "ReLU" bottom: "c2" top: "c2" relu_param { negative_slope: 0.3 } }
layer { name: "c3" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "r3" type: "ReLU" bottom: "c3" top: "c3" }
layer { name: "c4" type: "Convolution" bottom: "c3" top: "c4"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "fc" type: "InnerProduct" bottom: "c4" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def test_relu_conv_backward_fused(monkeypatch):
    """In-place ReLU -> Convolution: Winograd's backward-data applies the
    ReLU's gate (plain and leaky ReLU); before a 1x1 convolution (not
    Winograd) the pair runs its layers' own backward. Same gradients as
    layer by layer, also after the per-layer backward (which must not gate
    twice) and over a second step."""
    from caffe_ocl.ops import winograd as wino_ops
    monkeypatch.setenv(wino_ops.ENV, "1")         # 3x3 layers by Winograd on any device
    ref, fused = _ref_and_fused(monkeypatch, RELU_CONV, 6, [0, 2])
    pairs = [c for c in fused.plan.train_groups if isinstance(c, fusion_train.ReLUConvBackward)]
    assert [c.describe() for c in pairs] == ["r1 -> c2", "r2 -> c3", "r3 -> c4"]
    assert (ref.blobs["c1"].data == 0).any() and (ref.blobs["c2"].data < 0).any()

    def same():
        for name in ("x", "c1", "c2", "c3"):
            np.testing.assert_allclose(fused.blobs[name].diff, ref.blobs[name].diff,
                                       rtol=1e-4, atol=1e-6, err_msg=name)
        for lname in ("c1", "c2", "c3", "c4"):
            for a, b in zip(fused.params[lname], ref.params[lname]):
                np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-6, err_msg=lname)
    same()
    # c2's backward launches were built with r1's gate, which is unset after the call
    c2 = fused.layers[3]
    assert c2._bwd_key[-1] == ("gate", fused.blobs["c1"], 0.0) and c2.bwd_variant is None
    # layer by layer through the fused net's layers (caffe_ocl time's way), then fused again
    for net in (ref, fused):
        net.clear_param_diffs()
        for li in range(len(net.layers) - 1, -1, -1):
            if net.graph.layer_need_backward[li]:
                net.layers[li].backward(net.graph.tops[li], net.graph.bottom_need_backward[li],
                                        net.graph.bottoms[li])
    same()
    for net in (ref, fused):
        net.clear_param_diffs()
        net.backward()
    same()
