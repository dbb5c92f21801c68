"""Eltwise SUM -> in-place activation run as one kernel
(caffe_ocl/plan/eltwise.py): fused nets give the layer-by-layer outputs,
blob and parameter gradients, at TRAIN (also through solver steps with
shared diffs) and at TEST; the kernels against NumPy."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.plan import eltwise as fusion_eltwise, fold as fusion, train as fusion_train
from caffe_ocl.plan import permute
from caffe_ocl.errors import NetError
from caffe_ocl.ops import pointwise
from caffe_ocl.proto import parse_net_text
from test_fusion_train import sgd_solver

# Block 1: coefficients, leaky ReLU; block 2: a bottom without
# propagate_down; then an Eltwise in place and a PROD (neither fused); last
# a Clip, fused at TEST only (this Clip's in-place backward gates by its
# saved input, which the fused kernel does not keep).
NET = """
name: "e" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 2 dim: 5 dim: 4 } shape { dim: 3 } } }
layer { name: "a" type: "Convolution" bottom: "x" top: "a"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "b" type: "Convolution" bottom: "x" top: "b"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum1" type: "Eltwise" bottom: "a" bottom: "b" top: "s1"
        eltwise_param { coeff: 0.7 coeff: -1.3 } }
layer { name: "r1" type: "ReLU" bottom: "s1" top: "s1" relu_param { negative_slope: 0.1 } }
layer { name: "c" type: "Convolution" bottom: "s1" top: "c"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum2" type: "Eltwise" bottom: "c" bottom: "s1" top: "s2"
        propagate_down: true propagate_down: false }
layer { name: "r2" type: "ReLU" bottom: "s2" top: "s2" }
layer { name: "d" type: "Convolution" bottom: "s2" top: "d"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum3" type: "Eltwise" bottom: "d" bottom: "s2" top: "d" }
layer { name: "r3" type: "ReLU" bottom: "d" top: "d" }
layer { name: "prod" type: "Eltwise" bottom: "d" bottom: "s2" top: "p" eltwise_param { operation: PROD } }
layer { name: "r4" type: "ReLU" bottom: "p" top: "p" }
layer { name: "e" type: "Convolution" bottom: "p" top: "e"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum4" type: "Eltwise" bottom: "e" bottom: "p" top: "s4" }
layer { name: "r5" type: "Clip" bottom: "s4" top: "s4" clip_param { min: -0.2 max: 0.6 } }
layer { name: "fc" type: "InnerProduct" bottom: "s4" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def _net(monkeypatch, fuse, phase=caffe_ocl.TRAIN, text=NET, fold=None):
    monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
    monkeypatch.setenv(fusion.ENV, "1" if fuse else "0")
    caffe_ocl.set_random_seed(3)
    net = caffe_ocl.Net(parse_net_text(text), phase, fold=fold)
    rng = np.random.default_rng(0)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape)
    net.blobs["label"].data[...] = [0, 2, 1]
    return net


def test_chains_found(monkeypatch):
    chains = _net(monkeypatch, True).plan.train_groups
    assert [c.describe() for c in chains
            if isinstance(c, fusion_eltwise.EltwiseActChain)] == ["sum1 -> r1", "sum2 -> r2"]
    assert _net(monkeypatch, False).plan.train_groups == []


def test_fused_equals_layer_by_layer(monkeypatch):
    ref, fused = _net(monkeypatch, False), _net(monkeypatch, True)
    for net in (ref, fused):
        net.forward()
        net.backward()
    for name in ("s1", "s2", "d", "p", "s4", "loss"):
        np.testing.assert_allclose(fused.blobs[name].data, ref.blobs[name].data,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    # s1/s2 diffs: the activation's g kept, as after the in-place ReLU
    for name in ("x", "a", "b", "c", "s1", "s2", "e", "p"):
        assert np.abs(ref.blobs[name].diff).max() > 0, name    # the test sees gradients
        np.testing.assert_allclose(fused.blobs[name].diff, ref.blobs[name].diff,
                                   rtol=1e-4, atol=1e-6, err_msg=name)
    for lname in ("a", "b", "c", "d", "e", "fc"):
        for a, b in zip(fused.params[lname], ref.params[lname]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-6, err_msg=lname)


def test_ranges_cutting_a_chain_run_unfused(monkeypatch):
    ref, fused = _net(monkeypatch, False), _net(monkeypatch, True)
    for net in (ref, fused):
        net.forward(end="sum1")          # stops inside chain sum1 -> r1
        net.forward(start="r1")
        net.backward(end="r2")           # stops inside chain sum2 -> r2
        net.backward(start="sum2")
    np.testing.assert_allclose(fused.blobs["loss"].data, ref.blobs["loss"].data, rtol=1e-5)
    np.testing.assert_allclose(fused.blobs["x"].diff, ref.blobs["x"].diff, rtol=1e-4,
                               atol=1e-6)


def test_solver_steps_with_shared_diffs_match(monkeypatch):
    """Through a Solver (its net shares activation diffs, so the fused
    backward skips writing g) the weights end where the unfused ones do."""
    results = []
    for fuse in (False, True):
        monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
        s = sgd_solver(NET)
        assert s.net.memory_plan is not None
        if fuse:
            assert not any(c._keep_g() for c in s.net.plan.train_groups
                           if isinstance(c, fusion_eltwise.EltwiseActChain))
        rng = np.random.default_rng(1)
        s.net.blobs["x"].data[...] = rng.standard_normal(s.net.blobs["x"].shape)
        s.net.blobs["label"].data[...] = [1, 0, 2]
        s.step(3)
        results.append({k: [b.data.copy() for b in v] for k, v in s.net.params.items()})
    for k in results[0]:
        for a, b in zip(results[0][k], results[1][k]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=k)


def test_test_phase_folds(monkeypatch):
    """At TEST the chains fold into the plan (Clip too); backward
    (force_backward) is refused while a Clip chain is folded (its saved
    input was never made) and runs layer by layer when only ReLU chains
    are, giving the unfolded net's gradients."""
    text = NET.replace("force_backward: true", "")      # folding's default needs it off
    ref = _net(monkeypatch, False, caffe_ocl.TEST, text)
    fused = _net(monkeypatch, True, caffe_ocl.TEST, text)
    assert fused.plan.fold_groups != [] and ref.plan.fold_groups == []
    # (the 1x1 convolutions c, ... are permute.py's candidates too: their
    # random weights are no permutation, they run as convolutions)
    # (sum2's and sum4's inputs c and e come straight from convolutions,
    # which add the shortcut in their epilogue: residual.py)
    assert [c.describe() for c in fused.plan.fold_groups
            if not isinstance(c, permute.PermutationGather)] == [
        "c -> sum2 -> r2 (shortcut added in the convolution's epilogue)",
        "e -> sum4 -> r5 (shortcut added in the convolution's epilogue)", "sum1 -> r1"]
    for net in (ref, fused):
        net.forward()
    for name in ("s1", "s2", "p", "s4", "loss"):
        np.testing.assert_allclose(fused.blobs[name].data, ref.blobs[name].data,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    with pytest.raises(NetError, match="sum4 -> r5"):
        fused.backward()
    relu_only = NET.replace('type: "Clip" bottom: "s4" top: "s4" clip_param { min: -0.2 max: 0.6 }',
                            'type: "ReLU" bottom: "s4" top: "s4"')
    assert relu_only != NET
    ref = _net(monkeypatch, False, caffe_ocl.TEST, relu_only, fold=True)
    fused = _net(monkeypatch, True, caffe_ocl.TEST, relu_only, fold=True)
    assert len([c for c in fused.plan.fold_groups
                if not isinstance(c, permute.PermutationGather)]) == 3
    for net in (ref, fused):
        net.forward()
        net.backward()
    np.testing.assert_allclose(fused.blobs["x"].diff, ref.blobs["x"].diff, rtol=1e-4, atol=1e-6)
    assert np.abs(ref.blobs["x"].diff).max() > 0


# each case is its own pointwise.cl program (ACT, PD0, PD1, KEEP_G), a few
# seconds to build on PoCL: the cases cover each flag once, not all products
@pytest.mark.parametrize("act,pd,keep_g", [
    (None, (True, True), True), (("relu", 0.2), (True, True), True),
    (("relu", 0.2), (False, True), False), (("relu", 0.0), (True, False), True),
    (("clip", -0.3, 0.5), (True, True), True)])
def test_sum2_kernels(d, rng, act, pd, keep_g):
    """sum2 with each activation; its backward (ReLU or none: a fused Clip
    would need its saved input) with either bottom left out and g kept or
    not."""
    n, c0, c1 = 1037, 0.6, -1.4
    x0, x1, dy = (rng.standard_normal(n) for _ in range(3))
    y_ref = c0 * x0 + c1 * x1
    gate = np.ones(n)
    if act is not None and act[0] == "relu":
        y_ref = np.where(y_ref > 0, y_ref, act[1] * y_ref)
        gate = np.where(y_ref > 0, 1.0, act[1])
    elif act is not None:
        y_ref = np.clip(y_ref, act[1], act[2])
    y = d.buf(np.zeros(n))
    d.run([pointwise.sum2(d.dev, n, c0, d.buf(x0), c1, d.buf(x1), y, act)])
    np.testing.assert_allclose(d.get(y, (n,)), y_ref, rtol=1e-5, atol=1e-6)
    if act is not None and act[0] == "clip":
        with pytest.raises(ValueError, match="ReLU"):
            pointwise.sum2_backward(d.dev, n, y, y, c0, y, c1, y, act)
        return
    marker = -7.0
    dyb = d.buf(dy)
    dxs = [d.buf(np.full(n, marker)) if want else None for want in pd]
    d.run([pointwise.sum2_backward(d.dev, n, dyb, y, c0, dxs[0], c1, dxs[1], act, keep_g)])
    g = dy * gate
    for dx, c in zip(dxs, (c0, c1)):
        if dx is not None:
            np.testing.assert_allclose(d.get(dx, (n,)), c * g, rtol=1e-5, atol=1e-6)
    want_dy = g if (keep_g and act is not None) else dy
    np.testing.assert_allclose(d.get(dyb, (n,)), want_dy, rtol=1e-5, atol=1e-6)
