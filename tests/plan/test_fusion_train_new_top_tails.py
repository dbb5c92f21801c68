"""TRAIN ResNet block ends in ONNX's form (plan/train.py
NewTopResidualTail, plan/eltwise.py's new-top pairs): BatchNorm -> Scale
writing new tops, an Eltwise SUM with the shortcut (a projection branch may
run between the Scale and the Eltwise, as ONNX export orders a block's
first unit), a ReLU writing a new top or in place on the sum. The fused
net gives the unfused net's loss, outputs, input and parameter gradients,
BatchNorm statistics, shortcut gradients and the sum's diff; the sum, left
pending by the fused forward, holds its value when read; ranges cutting
the group run its layers one by one on the right values."""
import numpy as np
import pytest

from caffe_ocl.plan import eltwise as fusion_eltwise
from caffe_ocl.plan import train as fusion_train
from test_fusion_train import _net as fused_net
from test_fusion_train_new_tops import _solver

HEAD = """
name: "tails" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 3 dim: 5 dim: 6 } shape { dim: 3 } } }
layer { name: "c0" type: "Convolution" bottom: "x" top: "c0"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn0" type: "BatchNorm" bottom: "c0" top: "b0" }
layer { name: "s0" type: "Scale" bottom: "b0" top: "t0"
        scale_param { bias_term: true filler { type: "gaussian" mean: 1 std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "r0" type: "ReLU" bottom: "t0" top: "a0" }
layer { name: "c3" type: "Convolution" bottom: "a0" top: "c3"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn3" type: "BatchNorm" bottom: "c3" top: "b3" }
layer { name: "s3" type: "Scale" bottom: "b3" top: "t3"
        scale_param { bias_term: true filler { type: "gaussian" mean: 1 std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.3 } } }
"""

PROJECTION = """
layer { name: "cp" type: "Convolution" bottom: "a0" top: "cp"
        convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bnp" type: "BatchNorm" bottom: "cp" top: "bp" }
layer { name: "sp" type: "Scale" bottom: "bp" top: "short"
        scale_param { bias_term: true filler { type: "gaussian" mean: 1 std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.3 } } }
"""

TAIL = """
layer { name: "sum" type: "Eltwise" bottom: "t3" bottom: "%(short)s" top: "sum"
        eltwise_param { operation: SUM %(coeffs)s } }
layer { name: "relu" type: "ReLU" bottom: "sum" top: "%(out)s" relu_param { negative_slope: %(slope)s } }
layer { name: "fc" type: "InnerProduct" bottom: "%(out)s" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def net_text(projection=True, out="y", coeffs="", slope=0.0, short=None):
    short = short or ("short" if projection else "a0")
    return HEAD + (PROJECTION if projection else "") + TAIL % dict(
        short=short, out=out, coeffs=coeffs, slope=slope)


def _pair(monkeypatch, text):
    return (fused_net(monkeypatch, False, seed=5, text=text, data_seed=1),
            fused_net(monkeypatch, True, seed=5, text=text, data_seed=1))


def _close(a, b, what, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def _tails(net):
    return [c for c in net.plan.train_groups if isinstance(c, fusion_train.NewTopResidualTail)]


def _compare(ref, fused, blobs, diffs, layers):
    for name in blobs:
        _close(fused.blobs[name].data, ref.blobs[name].data, name)
    for name in diffs:
        _close(fused.blobs[name].diff, ref.blobs[name].diff, name + " diff", rtol=1e-3)
    for lname in layers:
        for i, (a, b) in enumerate(zip(fused.params[lname], ref.params[lname])):
            _close(a.data, b.data, f"{lname}[{i}] data", rtol=1e-5, atol=1e-6)
            _close(a.diff, b.diff, f"{lname}[{i}] diff", rtol=1e-3)


@pytest.mark.parametrize("projection,out,coeffs,slope", [
    (True, "y", "", 0.0),                       # a block's first unit (ONNX's order)
    (False, "y", "", 0.0),                      # identity shortcut (Caffe inserts a Split)
    (True, "sum", "", 0.0),                     # the ReLU in place on the sum
    (False, "y", "coeff: 0.5 coeff: -1.5", 0.2),
])
def test_tail_fused_equals_layer_by_layer(monkeypatch, projection, out, coeffs, slope):
    text = net_text(projection, out, coeffs, slope)
    ref, fused = _pair(monkeypatch, text)
    assert not _tails(ref)
    assert [c.describe() for c in _tails(fused)] == [f"bn3 -> s3 -> sum -> relu"]
    # one forward where the four layers are consecutive (identity shortcut),
    # else the chain and the Eltwise/ReLU pair run theirs
    assert _tails(fused)[0].fuses_forward == (not projection)
    fwd_groups = [c.describe() for c in fused.plan.train_groups
                  if getattr(c, "fuses_forward", True)]
    assert ("bn3 -> s3" in fwd_groups) == projection
    for net in (ref, fused):
        for _ in range(2):              # twice: the moving averages accumulate
            net.forward()
            net.backward()
    short = "short" if projection else "a0"
    blobs = ["loss", "fc", out, "sum", "t3", "c3", "a0", "b3"] + (["short", "cp"] if projection else [])
    diffs = ["x", "c0", "a0", "c3", short, "sum", out] + (["cp"] if projection else [])
    layers = ["c0", "bn0", "s0", "c3", "bn3", "s3", "fc"] + (
        ["cp", "bnp", "sp"] if projection else [])
    _compare(ref, fused, blobs, diffs, layers)
    if out != "sum":        # the sum is left pending by the forward, computed when read
        fused.forward()
        assert fused.blobs["sum"].compute_on_read is not None
        ref.forward()
        _close(fused.blobs["sum"].data, ref.blobs["sum"].data, "pending sum")


def test_tail_without_shortcut_gradient(monkeypatch):
    """The shortcut is the net's input (no backward into it)."""
    text = net_text(False, short="x").replace("dim: 3 dim: 3 dim: 5 dim: 6",
                                              "dim: 3 dim: 4 dim: 5 dim: 6")
    text = text.replace("force_backward: true", "")
    ref, fused = _pair(monkeypatch, text)
    assert len(_tails(fused)) == 1
    for net in (ref, fused):
        net.forward()
        net.backward()
    _compare(ref, fused, ["loss", "y"], ["c3", "a0", "c0"],
             ["c0", "bn0", "s0", "c3", "bn3", "s3", "fc"])


@pytest.mark.parametrize("projection", [True, False])
def test_ranges_cutting_the_tail(monkeypatch, projection):
    """Ranges that cut the group run its layers one by one on the right
    inputs: a forward from the Scale (reading BatchNorm's pending top), a
    backward that ends at the ReLU (reading the pending sum)."""
    text = net_text(projection)
    ref, fused = _pair(monkeypatch, text)
    for net in (ref, fused):
        net.forward()
        net.backward()
    for net in (ref, fused):
        net.params["s3"][0].data[...] *= 1.5
        net.forward(start="s3")                     # the Scale reads b3 (pending)
        net.backward(start="loss", end="relu")    # the ReLU alone: cuts the group
        net.backward(start="sum", end="c0")
    short = "short" if projection else "a0"
    _compare(ref, fused, ["loss", "t3", "sum", "y"], ["sum", short, "c3", "a0"],
             ["c3", "bn3", "s3", "c0"] + (["cp", "bnp", "sp"] if projection else []))


def test_not_when_the_relu_top_is_written_later(monkeypatch):
    """An in-place Dropout on the ReLU's new top would change the gate the
    fused backward reads (Caffe gates by the sum): no pairing then."""
    text = net_text(False).replace(
        'layer { name: "fc"',
        'layer { name: "drop" type: "Dropout" bottom: "y" top: "y" }\nlayer { name: "fc"')
    ref, fused = _pair(monkeypatch, text)
    assert not _tails(fused)
    assert not any(isinstance(c, fusion_eltwise.EltwiseActChain)
                   for c in fused.plan.train_groups)


@pytest.mark.parametrize("projection", [True, False])
def test_solver_steps_with_shared_diffs(monkeypatch, tmp_path, projection):
    """A Solver's net shares activation diffs by liveness (plan/memory.py):
    the group writes the diffs of BatchNorm's bottom and of the projection
    shortcut at the ReLU, before the projection's own backward; the plan
    must not hand those buffers to the projection's diffs meanwhile. The
    blobs the fused forward leaves pending hold that forward's values after
    the update changed the Scale's parameters."""
    text = net_text(projection).replace("force_backward: true", "")
    ref = _solver(text, monkeypatch, False, tmp_path)
    fused = _solver(text, monkeypatch, True, tmp_path)
    assert fused.net.memory_plan is not None and len(_tails(fused.net)) == 1
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 3, 5, 6)) * 2 + 1).astype(np.float32)
    for s in (ref, fused):
        for name, blobs in ref.net.params.items():
            for a, b in zip(s.net.params[name], blobs):
                a.data[...] = b.data
        s.net.blobs["x"].data[...] = x
        s.net.blobs["label"].data[...] = [0, 2, 1]
    for _ in range(3):
        for s in (ref, fused):
            s.step(1)
    layers = ["c0", "bn0", "s0", "c3", "bn3", "s3", "fc"] + (
        ["cp", "bnp", "sp"] if projection else [])
    for lname in layers:
        for i, (a, b) in enumerate(zip(fused.net.params[lname], ref.net.params[lname])):
            _close(a.data, b.data, f"{lname}[{i}] after 3 steps", rtol=1e-3, atol=1e-5)
    for name in ("b3", "t3", "sum", "y"):
        _close(fused.net.blobs[name].data, ref.net.blobs[name].data, name, rtol=1e-3, atol=1e-4)


def test_diff_plan_sees_the_writes_at_the_relu(monkeypatch):
    """The liveness the diff memory plan colours by: BatchNorm's bottom and
    the shortcut are written at the ReLU (where the group runs), so their
    diffs live from there, over the projection's backward."""
    from caffe_ocl.plan import memory
    text = net_text(True).replace("force_backward: true", "")
    ref, fused = _pair(monkeypatch, text)
    relu = fused.graph.layer_names.index("relu")
    bn3 = fused.graph.layer_names.index("bn3")

    def stretch(net, name):
        blob = net.blobs[name]
        g = next(g for g in memory.diff_groups(net) if any(b is blob for b in g.blobs))
        return g.hi, g.first_is_write
    for name in ("c3", "short"):
        assert stretch(fused, name) == (relu, True), name
    assert stretch(ref, "c3") == (bn3, True)
