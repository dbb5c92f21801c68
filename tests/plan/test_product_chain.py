"""An InnerProduct and the element-wise chain reading its top as one
product whose GEMM epilogue computes the chain (caffe_ocl/plan/
pointwise.py ProductChain, act.h ACT 8): a transformer MLP's fc1 -> GELU
as onnx2caffe writes it, and a Caffe-written mix of every neuron kind and
Eltwise, against float64 and against the same nets with the rewrite off
(every intermediate, computed on read, the unfused net's), at row counts
that take each product kernel (CPU: the small-M kernel below 9 rows, the
packed-weight GEMM from 9; GPUs: the matrix-vector kernel, the K split
and the tiled GEMM), forward ranges, and where it must not fuse."""
import math
import os
import sys

import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import pointwise
from caffe_ocl.proto import parse_net_text

sys.path.insert(0, os.path.dirname(__file__))
from test_pointwise_chain import MIX, _compare, _layer   # noqa: E402  (the chain of every kind)


def _head(rows, k, n, bias=True):
    return ('layer { name: "data" type: "Input" top: "data" '
            f'input_param {{ shape {{ dim: {rows} dim: {k} }} }} }}\n'
            'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "x" '
            f'inner_product_param {{ num_output: {n} bias_term: {str(bias).lower()} '
            'weight_filler { type: "gaussian" std: 0.3 } '
            'bias_filler { type: "gaussian" std: 0.3 } } }\n')


def _mix(rows, k=24, n=20, bias=True):
    """The pointwise tests' chain of every neuron kind on the product's top."""
    return _head(rows, k, n, bias) + MIX[MIX.index('layer { name: "abs"'):]


def _nets(text, **settings):
    with config.override(**dict(dict(FUSE_POINTWISE=True, FUSE_PRODUCT_CHAIN=True), **settings)):
        fused = Net(parse_net_text(text), TEST)
    with config.override(FUSE_POINTWISE=False):
        plain = Net(parse_net_text(text), TEST)
    rng = np.random.default_rng(5)
    for name, blobs in fused.params.items():
        for f, p in zip(blobs, plain.params[name]):
            f.data[...] = p.data[...] = rng.normal(0, 0.3, f.shape)
    return fused, plain


def _groups(net, kind=pointwise.ProductChain):
    return [g for g in net.plan.fold_groups if isinstance(g, kind)]


@pytest.mark.parametrize("rows,k", [(1, 24), (4, 24), (10, 24), (70, 24), (2, 1536), (40, 1536)])
def test_product_with_the_chain_in_its_epilogue(rows, k, rng):
    """(a long K: GPUs read 2 rows by their matrix-vector kernel, split 40
    rows along K, the chain then in the reduction)"""
    fused, plain = _nets(_mix(rows, k=k))
    (group,) = _groups(fused)
    names = [fused.graph.layer_names[i] for i in group.layers]
    assert names[0] == "fc" and len(names) >= 14 and names[-1] == "max"
    assert not _groups(fused, pointwise.PointwiseChain) and not _groups(plain)
    for _ in range(4):                  # passes 3 and 4 are replayed traces
        _compare(fused, plain, rng.normal(0, 1.5 / k ** 0.5 * 5, (rows, k)).astype(np.float32))


def test_converted_mlp_gelu_against_float64(rng):
    """ONNX's MatMul + Add + GELU (Div, Erf, Add, Mul, Mul) converts to an
    InnerProduct and about twenty element-wise layers: one product."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "onnx"))
    from onnx_helpers import make_model, node
    from caffe_ocl.onnx import to_caffe
    t, k, n = 7, 16, 24
    w = rng.normal(0, 0.4, (k, n)).astype(np.float32)
    b = rng.normal(0, 0.4, (n,)).astype(np.float32)
    nodes = [node("MatMul", ["x", "w"], ["h0"]), node("Add", ["h0", "b"], ["h"]),
             node("Div", ["h", "s2"], ["d"]), node("Erf", ["d"], ["e"]),
             node("Add", ["e", "one"], ["a"]), node("Mul", ["h", "a"], ["m"]),
             node("Mul", ["m", "half"], ["y"])]
    inits = {"w": w, "b": b, "s2": np.array(math.sqrt(2), np.float32),
             "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    npm = to_caffe.convert(make_model(nodes, {"x": (1, t, k)}, ["y"], inits))
    fused = Net(npm, TEST)
    with config.override(FUSE_POINTWISE=False):
        plain = Net(npm, TEST)
    (group,) = _groups(fused)
    assert fused.graph.layer_types[group.first] == "InnerProduct"
    for _ in range(3):
        x = rng.normal(0, 1, (1, t, k)).astype(np.float32)
        outs = [net.forward(x=x)["y"].copy() for net in (fused, plain)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=2e-6, atol=1e-6)
        h = x.astype(np.float64) @ w + b
        want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
    for name in plain.blobs:
        if name != "y":
            np.testing.assert_array_equal(fused.blobs[name].data, plain.blobs[name].data,
                                          err_msg=name)


def test_what_does_not_fuse():
    # the product's top read after the chain too; no bias; the setting off
    read = _mix(10) + _layer("also", "AbsVal", ["x"], "xa")
    fused, _ = _nets(read)
    assert not _groups(fused) and _groups(fused, pointwise.PointwiseChain)
    fused, _ = _nets(_mix(10), FUSE_PRODUCT_CHAIN=False)
    assert not _groups(fused) and _groups(fused, pointwise.PointwiseChain)
    fused, plain = _nets(_mix(10, bias=False))          # (no bias: still one product)
    assert _groups(fused)
    _compare(fused, plain, np.linspace(-2, 2, 240, dtype=np.float32).reshape(10, 24))


def test_ranges_and_a_new_batch(rng):
    fused, plain = _nets(_mix(6))
    x = rng.normal(0, 1, (6, 24)).astype(np.float32)
    for _ in range(3):
        _compare(fused, plain, x)
    for net in (fused, plain):
        net.blobs["x"].data[...] = 0.5        # a range from the chain's first layer
        net.forward(start="abs")
    np.testing.assert_allclose(fused.blobs["y"].data, plain.blobs["y"].data, rtol=2e-6,
                               atol=2e-6)
    y = rng.normal(0, 1, (12, 24)).astype(np.float32)
    for net in (fused, plain):
        net.blobs["data"].reshape(*y.shape)
    for _ in range(3):
        _compare(fused, plain, y)


def test_a_driver_refusing_the_generated_product_runs_the_layers(rng, monkeypatch, caplog):
    from caffe_ocl.device import Device
    from caffe_ocl.errors import DeviceError
    real = Device.program

    def refuse(self, filename, defines=None):
        if filename.startswith("generated/") and "gen_act" in self.kernel_text(filename):
            raise DeviceError("building kernels/generated/x.cl failed: planted")
        return real(self, filename, defines)
    monkeypatch.setattr(Device, "program", refuse)
    fused, plain = _nets(_mix(10))
    assert _groups(fused)
    with caplog.at_level("WARNING", logger="caffe_ocl"):
        for _ in range(3):
            _compare(fused, plain, rng.normal(0, 1, (10, 24)).astype(np.float32), rtol=0)
    assert "did not build" in caplog.text


def test_where_the_epilogue_does_not_pay_the_chain_runs_after_the_product(rng, monkeypatch):
    """(GPUs from one wave of tiles) the product, then the chain's own
    kernel: the same values, the intermediates computed on read, a range
    cutting the chain."""
    monkeypatch.setattr(pointwise, "epilogue_pays", lambda dev, M, N: False)
    fused, plain = _nets(_mix(10))
    (group,) = _groups(fused)
    for _ in range(3):
        _compare(fused, plain, rng.normal(0, 1, (10, 24)).astype(np.float32))
    assert not group._fused
    x = rng.normal(0, 1, (10, 24)).astype(np.float32)
    for net in (fused, plain):
        net.forward(data=x)                   # (intermediates left pending)
        net.forward(start="relu")             # then a range from inside the chain
    np.testing.assert_allclose(fused.blobs["y"].data, plain.blobs["y"].data, rtol=2e-6,
                               atol=2e-6)


def test_epilogue_rule():
    class Dev:
        is_gpu, compute_units = True, 132
    assert pointwise.epilogue_pays(Dev, 197, 768)            # 12 tiles
    assert pointwise.epilogue_pays(Dev, 16, 768)
    assert not pointwise.epilogue_pays(Dev, 3136, 768)       # 150 tiles
    Dev.is_gpu = False
    assert pointwise.epilogue_pays(Dev, 3136, 768)
