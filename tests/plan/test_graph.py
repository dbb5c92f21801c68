"""Net's public, read-only graph (``net.graph``, caffe_ocl.net.NetGraph) and
the execution plan built from it (``net.plan``, caffe_ocl/plan/execution.py)."""
import dataclasses

import numpy as np
import pytest

from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST, TRAIN
from caffe_ocl.plan import execution
from caffe_ocl.plan import patterns
from caffe_ocl.proto import parse_net_text

# A small ResNet-style block (conv -> BN -> Scale -> ReLU on one blob, a
# shortcut, Eltwise SUM -> ReLU) with a loss; shared and lr-scaled params.
BLOCK = """
name: "block"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 2 decay_mult: 0 name: "w1" }
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn2" type: "BatchNorm" bottom: "conv2" top: "conv2" }
layer { name: "scale2" type: "Scale" bottom: "conv2" top: "conv2"
        scale_param { bias_term: true } }
layer { name: "short" type: "Convolution" bottom: "data" top: "short"
        param { name: "w1" }
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "sum" type: "Eltwise" bottom: "conv2" bottom: "short" top: "sum" }
layer { name: "relu2" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "fc" type: "InnerProduct" bottom: "sum" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss"
        loss_weight: 0.5 }
"""

# conv -> ReLU written to a new top, read by two layers (a Split)
CHAIN = """
name: "chain"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "act" }
layer { name: "p1" type: "Pooling" bottom: "act" top: "p1"
        pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "p2" type: "Pooling" bottom: "act" top: "p2"
        pooling_param { pool: AVE kernel_size: 2 } }
"""


def _net(text, phase, **kw):
    return Net(parse_net_text(text), phase, **kw)


def test_graph_matches_the_prototxt():
    net = _net(BLOCK, TRAIN)
    g = net.graph
    param = parse_net_text(BLOCK)
    names = [lp.name for lp in param.layer]
    # Caffe inserts one Split for "data" (read by conv1 and short)
    assert g.layer_names == tuple(names[:1] + ["data_data_0_split"] + names[1:])
    assert g.layer_types[1] == "Split" and g.layer_types[2] == "Convolution"
    assert len(g) == len(net.layers) and g.layers == tuple(net.layers)
    assert g.phase == TRAIN and g.name == "block"
    assert g.param.layer[1].type == "Split"
    by = dict(zip(g.layer_names, range(len(g))))
    for lp in param.layer:
        li = by[lp.name]
        tops = [n for n in lp.top]
        assert list(g.top_names[li]) == tops
        assert [t.name for t in g.tops[li]] == tops
        assert all(t is net.blobs[t.name] for t in g.tops[li])
    # in place: the same Blob object as bottom and top
    li = by["bn1"]
    assert g.bottoms[li][0] is g.tops[li][0] is net.blobs["conv1"]
    assert g.bottom_names[by["sum"]] == ("conv2", "short")
    assert g.inputs == ("data", "label") and g.outputs == ("loss",)
    assert g.loss_weights[by["loss"]] == (0.5,)
    assert g.blob_loss_weights["loss"] == 0.5 and g.blob_loss_weights["fc"] == 0.0
    # need backward: the data layer and its Split do not, the rest does
    assert not g.layer_need_backward[0] and not g.layer_need_backward[1]
    assert all(g.layer_need_backward[2:])
    assert g.bottom_need_backward[by["conv1"]] == (False,)
    assert g.bottom_need_backward[by["loss"]] == (True, False)
    assert g.blob_need_backward["conv1"] and not g.blob_need_backward["data"]
    assert g.layer_index("sum") == by["sum"]
    with pytest.raises(NetError, match="no layer named 'nope'"):
        g.layer_index("nope")


def test_graph_params_owners_and_mults():
    net = _net(BLOCK, TRAIN)
    g = net.graph
    by = dict(zip(g.layer_names, range(len(g))))
    # net params in layer order; "short" shares conv1's weight (w1)
    assert len(g.params) == len(g.param_layer) == len(g.param_owners)
    k_short = g.param_layer.index((by["short"], 0))
    k_conv1 = g.param_layer.index((by["conv1"], 0))
    assert g.param_owners[k_short] == k_conv1 and g.param_owners[k_conv1] == -1
    assert g.params[k_short].data_mem is g.params[k_conv1].data_mem
    # learnable: owners only, with their multipliers
    assert len(g.learnable_params) == len(g.params) - 1
    assert all(any(p is q for q in g.params) for p in g.learnable_params)
    assert len(g.params_lr) == len(g.params_weight_decay) == len(g.learnable_params)
    lid = g.layer_learnable_ids[by["conv1"]][0]
    assert g.learnable_params[lid] is net.layers[by["conv1"]].blobs[0]
    assert (g.params_lr[lid], g.params_weight_decay[lid]) == (2.0, 0.0)
    assert g.layer_learnable_ids[by["short"]] == (lid,)
    fc = g.layer_learnable_ids[by["fc"]]
    assert [g.params_lr[i] for i in fc] == [1.0, 1.0]
    assert g.layer_learnable_ids[by["relu1"]] == ()
    assert tuple(net.learnable_params) == g.learnable_params


def test_graph_is_read_only():
    net = _net(BLOCK, TEST, fold=False)
    g = net.graph
    with pytest.raises(AttributeError):
        g.layer_names = ("x",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.tops = ()
    with pytest.raises(TypeError):
        g.layer_need_backward[0] = True
    with pytest.raises(TypeError):
        g.tops[2][0] = None
    with pytest.raises(TypeError):
        g.blobs["new"] = None
    with pytest.raises(TypeError):
        g.blob_need_backward["conv1"] = True


def test_patterns_on_the_graph():
    net = _net(BLOCK, TEST, fold=False)
    g = net.graph
    by = dict(zip(g.layer_names, range(len(g))))
    conv1 = net.blobs["conv1"]
    assert patterns.in_place_run(g, by["conv1"], conv1) == [by["bn1"], by["scale1"],
                                                            by["relu1"]]
    assert patterns.in_place_on(g, by["bn1"], conv1)
    assert not patterns.in_place_on(g, by["conv2"], conv1)
    assert patterns.consumers(g, conv1) == [(by["bn1"], 0), (by["scale1"], 0),
                                           (by["relu1"], 0), (by["conv2"], 0)]
    assert patterns.writers(g, conv1) == [by["conv1"], by["bn1"], by["scale1"],
                                          by["relu1"]]
    assert patterns.producer(g, net.blobs["sum"]) == by["sum"]
    assert patterns.act_of(net.layers[by["relu1"]]) == ("relu", 0.0)
    assert patterns.act_of(net.layers[by["sum"]]) is None


def _steps(plan, names):
    return [tuple(names[i] for i in s.layers) for s in plan]


def test_plan_of_a_resnet_block_at_test():
    net = _net(BLOCK, TEST)
    g, plan = net.graph, net.plan
    n = g.layer_names
    assert _steps(plan.forward_steps, n) == [
        ("data",), ("data_data_0_split",), ("conv1", "bn1", "scale1", "relu1"),
        ("conv2", "bn2", "scale2"), ("short", "sum", "relu2"), ("fc",), ("loss",)]
    # the shortcut convolution next to the sum adds its result in the epilogue
    assert plan.describe() == ["conv1 <- bn1, scale1, relu1", "conv2 <- bn2, scale2",
                               "short -> sum -> relu2 (shortcut added in the convolution's "
                               "epilogue)"]
    # TEST: backward is never fused
    assert all(s.group is None for s in plan.backward_steps)
    assert [s.layers[0] for s in plan.backward_steps] == list(range(len(g) - 1, -1, -1))
    # a range cutting a group runs its layers: conv2's group is cut at bn2
    by = dict(zip(n, range(len(n))))
    sched = plan.forward_schedule(by["conv1"], by["bn2"])
    acts = {n[li]: a for li, a in sched}
    assert acts["conv1"] is not execution.LAYER and acts["bn1"] is execution.SKIP
    # (each alone: the layer's own pass, or its group's run_member of it)
    for name in ("conv2", "bn2"):
        assert acts[name] is execution.LAYER or getattr(acts[name], "li", None) == by[name]
    assert plan.forward_schedule(by["conv1"], by["bn2"]) is sched     # resolved once
    with pytest.raises(NetError, match="backward through a folded net"):
        net.backward()
    net.unfold()
    assert not net.plan.fold_groups
    assert all(s.group is None for s in net.plan.forward_steps)


def test_plan_of_a_resnet_block_at_train():
    net = _net(BLOCK, TRAIN)
    n, plan = net.graph.layer_names, net.plan
    assert plan.fold_groups == []
    # (bn2, scale2) is no residual tail here: "short" runs between it and the sum
    assert _steps(plan.forward_steps, n) == [
        ("data",), ("data_data_0_split",), ("conv1",), ("bn1", "scale1", "relu1"),
        ("conv2",), ("bn2", "scale2"), ("short",), ("sum", "relu2"), ("fc",), ("loss",)]
    bwd = _steps(plan.backward_steps, n)
    # every layer appears once, groups at their last layer, in backward order
    covered = [name for s in bwd for name in s]
    assert sorted(covered) == sorted(n)
    assert ("bn1", "scale1", "relu1") in bwd
    assert bwd[0] == ("loss",) and bwd[-1] == ("data",)


def test_plan_of_a_chain_not_in_place():
    for phase in (TEST, TRAIN):
        net = _net(CHAIN, phase)
        n = net.graph.layer_names
        assert n == ("data", "conv", "relu", "act_relu_0_split", "p1", "p2")
        assert net.plan.diff_shares == []
        assert all(s.group is None for s in net.plan.backward_steps)
        if phase == TRAIN:
            # the ReLU writes a new top: no training fusion matches
            assert not net.plan
            assert _steps(net.plan.forward_steps, n) == [(x,) for x in n]
        else:
            # at TEST the convolution writes the ReLU's top from its epilogue
            # (plan/elide.py); "conv" is computed when read
            assert net.plan.describe() == ["conv -> relu"]
            assert _steps(net.plan.forward_steps, n) == [
                ("data",), ("conv", "relu"), ("act_relu_0_split",), ("p1",), ("p2",)]


def test_plan_runs_like_the_layers(rng):
    """The plan's forward and backward leave every blob as the layers one by
    one do (the block at TRAIN: fused groups; unfused by CAFFE_OCL_FUSE_TRAIN=0)."""
    from caffe_ocl import config
    nets = []
    for fuse in (True, False):
        with config.override(FUSE_TRAIN=fuse):
            nets.append(_net(BLOCK, TRAIN))
    fused, plain = nets
    assert fused.plan.train_groups and not plain.plan
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            d.data[...] = s.host_data()
    x = rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32)
    label = np.array([0, 2], np.float32)
    for net in nets:
        net.forward(data=x, label=label)
        net.backward()
    for name in ("conv1", "sum", "fc", "loss"):
        np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data,
                                   rtol=1e-4, atol=1e-5)
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            np.testing.assert_allclose(d.diff, s.diff, rtol=1e-3, atol=1e-5)
