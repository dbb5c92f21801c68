"""TRAIN fusions of a ResNet block's ends (fusion_train.py): the tail
BatchNorm -> Scale -> Eltwise SUM with the shortcut -> in-place ReLU as one
chain (``ResidualTailChain``; identity and projection blocks, Eltwise
coefficients, a leaky ReLU, a shortcut without gradient, channels of whole
float4s and not), and the block input's Split summed by the first
convolution's backward-data (``SplitConvBackward``, with a diff memory
plan). Both give the layer-by-layer values, gradients and solver steps."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.plan import train as fusion_train
from caffe_ocl.proto import parse_net_text

from test_fusion_train import assert_params_close, sgd_solver

CONV = 'convolution_param {{ num_output: 4 kernel_size: {k} pad: {p} bias_term: false ' \
       'weight_filler {{ type: "gaussian" std: 0.5 }} }}'
SCALE = 'scale_param {{ bias_term: {bias} filler {{ type: "gaussian" mean: 1 std: 0.3 }} ' \
        'bias_filler {{ type: "gaussian" std: 0.3 }} }}'


def block_net(h, w, coeffs="", slope=0.0, force_backward=True):
    """conv -> BN -> Scale -> ReLU, then an identity block (its sum's
    bottoms: the shortcut first) and a projection block (the branch first,
    Eltwise ``coeffs`` there), then a classifier. The input's second top
    "y" (same shape as a block) is added by a third sum (no gradient into it
    without force_backward)."""
    bn_scale = lambda n, bias: (
        f'layer {{ name: "bn{n}" type: "BatchNorm" bottom: "c{n}" top: "c{n}" }}\n'
        f'layer {{ name: "s{n}" type: "Scale" bottom: "c{n}" top: "c{n}" '
        + SCALE.format(bias=bias) + ' }\n')
    conv = lambda n, bottom, k=1, p=0: (
        f'layer {{ name: "c{n}" type: "Convolution" bottom: "{bottom}" top: "c{n}" '
        + CONV.format(k=k, p=p) + ' }\n')
    relu = f'relu_param {{ negative_slope: {slope} }}'
    return (f'name: "res" force_backward: {str(force_backward).lower()}\n'
            f'layer {{ name: "in" type: "Input" top: "x" top: "y" top: "label" input_param {{ '
            f'shape {{ dim: 3 dim: 2 dim: {h} dim: {w} }} shape {{ dim: 3 dim: 4 dim: {h} '
            f'dim: {w} }} shape {{ dim: 3 }} }} }}\n'
            + conv(0, "x", 3, 1) + bn_scale(0, "true")
            + 'layer { name: "r0" type: "ReLU" bottom: "c0" top: "c0" }\n'
            + conv(1, "c0", 3, 1) + bn_scale(1, "true")
            + 'layer { name: "sum1" type: "Eltwise" bottom: "c0" bottom: "c1" top: "sum1" }\n'
            + f'layer {{ name: "relu1" type: "ReLU" bottom: "sum1" top: "sum1" {relu} }}\n'
            + conv(2, "sum1") + bn_scale(2, "true") + conv(3, "sum1") + bn_scale(3, "false")
            + 'layer { name: "sum2" type: "Eltwise" bottom: "c3" bottom: "c2" top: "sum2" '
            + f'eltwise_param {{ {coeffs} }} }}\n'
            + f'layer {{ name: "relu2" type: "ReLU" bottom: "sum2" top: "sum2" {relu} }}\n'
            + conv(4, "sum2") + bn_scale(4, "true")
            + 'layer { name: "sum3" type: "Eltwise" bottom: "c4" bottom: "y" top: "sum3" }\n'
            + 'layer { name: "relu3" type: "ReLU" bottom: "sum3" top: "sum3" }\n'
            + 'layer { name: "fc" type: "InnerProduct" bottom: "sum3" top: "fc" '
            + 'inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }\n'
            + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" '
            + 'top: "loss" }\n')


def _fill(net, seed):
    rng = np.random.default_rng(seed)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape) * 2 + 0.5
    net.blobs["y"].data[...] = rng.standard_normal(net.blobs["y"].shape)
    net.blobs["label"].data[...] = [0, 2, 1]


def _pair(monkeypatch, text, steps=2):
    """The net built unfused and fused (same weights, inputs), after
    ``steps`` forward + backward passes."""
    nets = []
    for fuse in (False, True):
        monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
        caffe_ocl.set_random_seed(7)
        net = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)
        _fill(net, 1)
        for _ in range(steps):
            net.forward()
            net.backward()
        nets.append(net)
    return nets


def _tails(net):
    return [c.describe() for c in net.plan.train_groups
            if isinstance(c, fusion_train.ResidualTailChain)]


@pytest.mark.parametrize("h, w, coeffs, slope", [
    (6, 5, "", 0.0),                                  # 30 per channel: scalar kernels
    (4, 4, "coeff: 0.5 coeff: -2", 0.1),              # 16: float4 kernels; coefficients, leaky
    (4, 4, "coeff: 0 coeff: 1.5", 0.0),               # zero shortcut coefficient
])
def test_tail_fused_equals_layer_by_layer(monkeypatch, h, w, coeffs, slope):
    ref, fused = _pair(monkeypatch, block_net(h, w, coeffs, slope))
    assert _tails(fused) == ["bn1 -> s1 -> sum1 -> relu1", "bn3 -> s3 -> sum2 -> relu2",
                             "bn4 -> s4 -> sum3 -> relu3"]
    assert (ref.blobs["sum1"].data == 0).any() or (ref.blobs["sum1"].data < 0).any()
    for name in ref.blobs:
        np.testing.assert_allclose(fused.blobs[name].data, ref.blobs[name].data,
                                   rtol=1e-4, atol=1e-5, err_msg=name + " data")
        np.testing.assert_allclose(fused.blobs[name].diff, ref.blobs[name].diff,
                                   rtol=1e-3, atol=1e-5, err_msg=name + " diff")
    assert_params_close(fused, ref, ref.params)


def test_tail_without_shortcut_gradient(monkeypatch):
    """Without force_backward the input "y" gets no gradient: the fused
    backward reads g back from the sum's own diff."""
    ref, fused = _pair(monkeypatch, block_net(4, 4, force_backward=False))
    assert "bn4 -> s4 -> sum3 -> relu3" in _tails(fused)
    assert not fused.graph.bottom_need_backward[list(fused.graph.layer_names).index("sum3")][1]
    for lname in ("c4", "s4", "c1", "s1", "c0"):
        for a, b in zip(fused.params[lname], ref.params[lname]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-3, atol=1e-5, err_msg=lname)


def test_tail_solver_steps_match(monkeypatch):
    """In a Solver's net (diff memory plan on: the sum's diff is not kept)
    SGD with momentum ends at the unfused weights."""
    results = []
    for fuse in (False, True):
        monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
        s = sgd_solver(block_net(6, 4, "coeff: 1 coeff: 0.7", 0.05))
        assert s.net.memory_plan is not None
        _fill(s.net, 2)
        s.step(3)
        if fuse:
            assert len(_tails(s.net)) == 3
        results.append({k: [b.data.copy() for b in v] for k, v in s.net.params.items()})
    for k in results[0]:
        for a, b in zip(results[0][k], results[1][k]):
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5, err_msg=k)


def test_split_into_convolution_backward(monkeypatch):
    """With shared diffs (a Solver's default) a Split's bottom gradient is
    accumulated by the earlier reader's backward-data (c0's split: c1 after
    the sum's write; sum1's split: c2 after c3's); the Split itself runs
    nothing. Same gradients as the unfused net without sharing; without
    sharing the fused net runs the layers' own backward."""
    text = block_net(4, 5, "coeff: 1 coeff: -0.5", 0.1)
    monkeypatch.setenv(fusion_train.ENV, "0")
    caffe_ocl.set_random_seed(7)
    ref = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)
    monkeypatch.setenv(fusion_train.ENV, "1")
    caffe_ocl.set_random_seed(7)
    fused = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN, share_diffs=True)
    splits = [c for c in fused.plan.train_groups
              if isinstance(c, fusion_train.SplitConvBackward)]
    assert [c.describe() for c in splits] == ["c0_r0_0_split -> c1", "sum1_relu1_0_split -> c2"]
    assert all(c.top_b.diff_mem is c.bottom.diff_mem for c in splits)
    calls = []
    for c in splits:
        monkeypatch.setattr(c.split, "backward", lambda *a, **k: calls.append(a))
    for net in (ref, fused):
        _fill(net, 3)
        net.clear_param_diffs()
        net.forward()
        net.backward()
    assert calls == []
    np.testing.assert_allclose(fused.blobs["x"].diff, ref.blobs["x"].diff, rtol=1e-4,
                               atol=1e-6)
    for lname in ref.params:
        for a, b in zip(fused.params[lname], ref.params[lname]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-6, err_msg=lname)
    fused.set_share_diffs(False)        # every diff its own again: the layers' backward
    assert all(c.top_b.diff_mem is not c.bottom.diff_mem for c in splits)
    fused.clear_param_diffs()
    fused.forward()
    fused.backward()
    assert len(calls) == 2
