"""Runs of element-wise layers as one generated kernel (caffe_ocl/plan/
pointwise.py): a converted GELU (onnx/_erf.py's fifteen layers) and a
Caffe-written mix of every neuron kind, Eltwise SUM / PROD / MAX and
Splits, against the same nets with the rewrite off: outputs within a few
float32 steps, every intermediate blob (computed on read by the layers'
own forwards) equal, forward ranges cutting a chain, reshapes, and where a
chain must stop (a net output or a blob read outside it, in-place
layers)."""
import math

import numpy as np

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import pointwise
from caffe_ocl.plan.patterns import consumers
from caffe_ocl.proto import parse_net_text

HEAD = ('layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 2 dim: 3 dim: 5 dim: 4 } } }\n'
        'layer { name: "conv" type: "Convolution" bottom: "data" top: "x" '
        'convolution_param { num_output: 4 kernel_size: 3 pad: 1 '
        'weight_filler { type: "gaussian" std: 0.5 } } }\n')


def _layer(name, type_, bottoms, top, param=""):
    bs = " ".join(f'bottom: "{b}"' for b in bottoms)
    return f'layer {{ name: "{name}" type: "{type_}" {bs} top: "{top}" {param} }}\n'


# every neuron kind of the chain, Eltwise SUM (coefficients), PROD and MAX,
# and the Splits Net inserts where a blob has several readers
MIX = HEAD + (
    _layer("abs", "AbsVal", ["x"], "a")
    + _layer("pow", "Power", ["a"], "p", "power_param { power: 1.5 scale: 0.7 shift: 0.2 }")
    + _layer("exp", "Exp", ["x"], "e", "exp_param { base: 2 scale: 0.3 shift: -0.1 }")
    + _layer("log", "Log", ["p"], "l", "log_param { shift: 1 }")
    + _layer("tanh", "TanH", ["e"], "t")
    + _layer("sig", "Sigmoid", ["x"], "s")
    + _layer("relu", "ReLU", ["x"], "r", "relu_param { negative_slope: 0.1 }")
    + _layer("elu", "ELU", ["r"], "u", "elu_param { alpha: 0.5 }")
    + _layer("bnll", "BNLL", ["u"], "b")
    + _layer("clip", "Clip", ["b"], "c", "clip_param { min: -0.5 max: 2 }")
    + _layer("sum", "Eltwise", ["l", "t", "c"], "sm",
             "eltwise_param { operation: SUM coeff: 0.5 coeff: -2 coeff: 1.5 }")
    + _layer("prod", "Eltwise", ["sm", "s"], "pr", "eltwise_param { operation: PROD }")
    + _layer("max", "Eltwise", ["pr", "x", "e"], "y", "eltwise_param { operation: MAX }"))


def _nets(text, rng):
    with config.override(FUSE_POINTWISE=True):
        fused = Net(parse_net_text(text), TEST)
    with config.override(FUSE_POINTWISE=False):
        plain = Net(parse_net_text(text), TEST)
    for name, blobs in fused.params.items():
        for f, p in zip(blobs, plain.params[name]):
            v = rng.normal(0, 0.5, f.shape)
            f.data[...] = v
            p.data[...] = v
    return fused, plain


def _chains(net):
    return [c for c in net.plan.fold_groups if isinstance(c, pointwise.PointwiseChain)]


def _compare(fused, plain, x, rtol=2e-6):
    outs = [net.forward(data=x)["y"].copy() for net in (fused, plain)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=rtol, atol=rtol)
    for name in plain.blobs:            # intermediates: the layers' own forwards
        if name != "y":
            np.testing.assert_array_equal(fused.blobs[name].data, plain.blobs[name].data,
                                          err_msg=name)
    return outs[0]


def test_mixed_chain_is_one_kernel_with_the_layers_values(rng):
    fused, plain = _nets(MIX, rng)
    chains = _chains(fused)
    assert len(chains) == 1 and len(chains[0].layers) >= 13
    assert not _chains(plain)
    for _ in range(4):                  # passes 3 and 4 are replayed traces
        _compare(fused, plain, rng.normal(0, 1.5, (2, 3, 5, 4)).astype(np.float32))


def test_converted_gelu(rng):
    import sys
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "onnx"))
    from onnx_helpers import make_model, node
    from caffe_ocl.onnx import to_caffe
    nodes = [node("Div", ["x", "s2"], ["d"]), node("Erf", ["d"], ["e"]),
             node("Add", ["e", "one"], ["a"]), node("Mul", ["x", "a"], ["m"]),
             node("Mul", ["m", "half"], ["y"])]
    inits = {"s2": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    npm = to_caffe.convert(make_model(nodes, {"x": (1, 8, 6, 6)}, ["y"], inits))
    with config.override(FUSE_POINTWISE=True):
        fused = Net(npm, TEST)
    with config.override(FUSE_POINTWISE=False):
        plain = Net(npm, TEST)
    chains = _chains(fused)
    assert len(chains) == 1 and len(chains[0].layers) >= 20
    for _ in range(4):
        x = rng.normal(0, 2, (1, 8, 6, 6)).astype(np.float32)
        outs = [net.forward(x=x)["y"].copy() for net in (fused, plain)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=2e-6, atol=1e-7)
        want = 0.5 * x * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))
        np.testing.assert_allclose(outs[0], want, rtol=4e-7, atol=4e-7)
    for name in plain.blobs:
        if name != "y":
            np.testing.assert_array_equal(fused.blobs[name].data, plain.blobs[name].data,
                                          err_msg=name)


def test_chain_stops_at_a_blob_read_outside_and_at_in_place_layers(rng):
    text = HEAD + (
        _layer("abs", "AbsVal", ["x"], "a")
        + _layer("pow", "Power", ["a"], "p", "power_param { power: 2 }")
        + _layer("sig", "Sigmoid", ["p"], "s")
        + _layer("tanh", "TanH", ["s"], "t")
        + 'layer { name: "relu" type: "ReLU" bottom: "t" top: "t" }\n'   # in place
        + _layer("exp", "Exp", ["t"], "e")
        + _layer("abs2", "AbsVal", ["e"], "a2")
        + _layer("sum", "Eltwise", ["a2", "p"], "y", "eltwise_param { operation: SUM }"))
    fused, plain = _nets(text, rng)
    chains = _chains(fused)
    names = fused.graph.layer_names
    # p is read by the last Eltwise: abs -> pow -> sig -> tanh cannot end
    # at tanh (p leaves it); no chain may hold the in-place ReLU
    for c in chains:
        assert "relu" not in [names[i] for i in c.layers]
        made = [t for li in c.layers[:-1] for t in fused.graph.tops[li]]
        assert all(li in c.layers for t in made
                   for li, _ in consumers(fused.graph, t))
    for _ in range(3):
        _compare(fused, plain, rng.normal(0, 1, (2, 3, 5, 4)).astype(np.float32))


def test_ranges_cutting_a_chain_and_a_new_batch(rng):
    fused, plain = _nets(MIX, rng)
    x = rng.normal(0, 1, (2, 3, 5, 4)).astype(np.float32)
    for _ in range(3):
        _compare(fused, plain, x)
    for net in (fused, plain):
        net.blobs["c"].data[...] = 0.25       # then forward from the middle of the chain
        net.forward(start="sum")
    np.testing.assert_allclose(fused.blobs["y"].data, plain.blobs["y"].data, rtol=2e-6,
                               atol=2e-6)
    y = rng.normal(0, 1, (3, 3, 4, 6)).astype(np.float32)
    for net in (fused, plain):
        net.blobs["data"].reshape(*y.shape)
    for _ in range(3):
        _compare(fused, plain, y)


def test_off_by_setting(rng):
    with config.override(FUSE_POINTWISE=False):
        assert not _chains(Net(parse_net_text(MIX), TEST))


def test_a_driver_refusing_the_generated_kernel_runs_the_layers(rng, monkeypatch, caplog):
    from caffe_ocl.device import Device
    from caffe_ocl.errors import DeviceError
    real = Device.program

    def refuse(self, filename, defines=None):
        if filename.startswith("generated/"):
            raise DeviceError("building kernels/generated/x.cl failed: planted")
        return real(self, filename, defines)
    monkeypatch.setattr(Device, "program", refuse)
    fused, plain = _nets(MIX, rng)
    assert _chains(fused)
    with caplog.at_level("WARNING", logger="caffe_ocl"):
        for _ in range(3):
            _compare(fused, plain, rng.normal(0, 1, (2, 3, 5, 4)).astype(np.float32), rtol=0)
    assert "did not build" in caplog.text
