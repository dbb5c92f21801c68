"""TRAIN BatchNorm -> Scale (-> activation) chains in ONNX's form, each
member writing a new top (plan/train.py NewTopTrainChain): the fused net
gives the unfused net's loss, outputs, input gradients, parameter
gradients and moving averages; the blobs between the members are computed
when read, with the values of the forward that made them (also after a
solver's update changed the Scale's parameters, and in a view kept across
steps)."""
import numpy as np

import caffe_ocl
from caffe_ocl.plan import train as fusion_train
from caffe_ocl.proto import caffe_pb2, parse_net_text
from test_fusion_train import _net as fused_net

NET = """
name: "nt" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 2 dim: 6 dim: 5 } shape { dim: 3 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "b1" }
layer { name: "s1" type: "Scale" bottom: "b1" top: "t1"
        scale_param { bias_term: true filler { type: "gaussian" mean: 1 std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "r1" type: "ReLU" bottom: "t1" top: "a1" relu_param { negative_slope: 0.1 } }
layer { name: "c2" type: "Convolution" bottom: "a1" top: "c2"
        convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn2" type: "BatchNorm" bottom: "c2" top: "b2" }
layer { name: "s2" type: "Scale" bottom: "b2" top: "b2"
        scale_param { filler { type: "gaussian" mean: 1 std: 0.3 } } }
layer { name: "r2" type: "ReLU6" bottom: "b2" top: "b2" }
layer { name: "c3" type: "Convolution" bottom: "b2" top: "c3"
        convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn3" type: "BatchNorm" bottom: "c3" top: "b3" }
layer { name: "s3" type: "Scale" bottom: "b3" top: "t3"
        scale_param { bias_term: true filler { type: "constant" value: 0.8 } } }
layer { name: "sum" type: "Eltwise" bottom: "t3" bottom: "a1" top: "sum" }
layer { name: "fc" type: "InnerProduct" bottom: "sum" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def _net(monkeypatch, fuse):
    return fused_net(monkeypatch, fuse, seed=5, text=NET, data_seed=1)


def test_new_top_chains_found(monkeypatch):
    net = _net(monkeypatch, True)
    got = [c.describe() for c in net.plan.train_groups
           if isinstance(c, fusion_train.NewTopTrainChain)]
    # bn1 -> s1 -> r1 all new tops; bn3 -> s3 without an activation (the
    # Eltwise reads t3); not bn2, whose Scale and ReLU6 run in place on its
    # top (Caffe's in-place backward leaves b2's diff as BatchNorm's output
    # gradient, which the fused backward does not write)
    assert got == ["bn1 -> s1 -> r1", "bn3 -> s3"]


def _close(a, b, what, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def test_fused_equals_layer_by_layer(monkeypatch):
    ref, fused = _net(monkeypatch, False), _net(monkeypatch, True)
    assert not any(isinstance(c, fusion_train.NewTopTrainChain) for c in ref.plan.train_groups)
    for net in (ref, fused):
        for _ in range(2):          # twice: the moving averages accumulate
            net.forward()
            net.backward()
    for name in ("loss", "fc", "sum", "a1", "b2", "t3", "c1", "c2", "c3"):
        _close(fused.blobs[name].data, ref.blobs[name].data, name)
    # the blobs between the members, computed when read
    for name in ("b1", "t1", "b3"):
        _close(fused.blobs[name].data, ref.blobs[name].data, name)
    for name in ("x", "c1", "a1", "c2", "b2", "c3", "t3", "sum"):
        _close(fused.blobs[name].diff, ref.blobs[name].diff, name + " diff", rtol=1e-3)
    for lname in ("c1", "bn1", "s1", "c2", "bn2", "s2", "c3", "bn3", "s3", "fc"):
        for i, (a, b) in enumerate(zip(fused.params[lname], ref.params[lname])):
            _close(a.data, b.data, f"{lname}[{i}] data", rtol=1e-5, atol=1e-6)
            _close(a.diff, b.diff, f"{lname}[{i}] diff", rtol=1e-3)


def _solver(net_text, monkeypatch, fuse, tmp_path):
    monkeypatch.setenv(fusion_train.ENV, "1" if fuse else "0")
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(parse_net_text(net_text))
    sp.base_lr, sp.momentum, sp.lr_policy = 0.5, 0.9, "fixed"
    sp.max_iter, sp.display, sp.random_seed = 100, 0, 7
    sp.snapshot_prefix = str(tmp_path / ("f" if fuse else "r"))
    path = tmp_path / ("solver_f.prototxt" if fuse else "solver_r.prototxt")
    path.write_text(str(sp))
    return caffe_ocl.get_solver(str(path))


def test_pending_blobs_keep_the_forwards_values_after_an_update(monkeypatch, tmp_path):
    """A script reading the Scale's top after solver.step(): the value its
    forward computed, not one recomputed with the updated gamma/beta; and a
    view kept across steps follows each step."""
    ref = _solver(NET, monkeypatch, False, tmp_path)
    fused = _solver(NET, monkeypatch, True, tmp_path)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 2, 6, 5)) * 2 + 1).astype(np.float32)
    views = []
    for s in (ref, fused):
        for name, blobs in ref.net.params.items():
            for a, b in zip(s.net.params[name], blobs):
                a.data[...] = b.data
        s.net.blobs["x"].data[...] = x
        s.net.blobs["label"].data[...] = [0, 2, 1]
        views.append(s.net.blobs["t1"].data)          # kept across the steps
    for _ in range(3):
        for s in (ref, fused):
            s.step(1)
        _close(views[1], views[0], "kept t1 view", rtol=1e-3, atol=1e-4)
    _close(fused.net.blobs["t3"].data, ref.net.blobs["t3"].data, "t3", rtol=1e-3, atol=1e-4)
    _close(fused.net.blobs["b1"].data, ref.net.blobs["b1"].data, "b1", rtol=1e-3, atol=1e-4)
    # the update did move the Scale's parameters (so the check above means something)
    assert not np.allclose(fused.net.params["s1"][0].data, ref.net.params["s1"][0].data * 0 + 1)


def test_ranges_cutting_a_chain(monkeypatch):
    """After a fused forward leaves b1/t1 pending, forward and backward
    ranges starting inside the chain run its layers one by one on the
    right inputs (the pending blobs computed first)."""
    ref, fused = _net(monkeypatch, False), _net(monkeypatch, True)
    for net in (ref, fused):
        net.forward()
        net.backward()
    assert fused.blobs["t1"].compute_on_read is not None
    for net in (ref, fused):
        net.params["s1"][0].data[...] *= 1.5        # the Scale's own forward reads these
        net.forward(start="s1")                    # the Scale reads b1 (pending in fused)
        net.backward(start="loss", end="s1")       # the Scale's backward reads b1 too
    for name in ("t1", "a1", "fc", "loss"):
        _close(fused.blobs[name].data, ref.blobs[name].data, name)
    for lname in ("s1",):
        for i, (a, b) in enumerate(zip(fused.params[lname], ref.params[lname])):
            _close(a.diff, b.diff, f"{lname}[{i}] diff", rtol=1e-3)
    _close(fused.blobs["b1"].diff, ref.blobs["b1"].diff, "b1 diff", rtol=1e-3)
