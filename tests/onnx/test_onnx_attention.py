"""Attention with --extension_layers (to_caffe.convert(extension_layers=
True)): MatMul of two computed tensors as caffe_ocl's MatMul layer, any
transpose as the SSD fork's Permute, a constant Concat input (ViT's class
token) as BVLC's Parameter layer. Converted, run in caffe_ocl, compared
with ONNX Runtime; without the option the same model is refused, naming
the option."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from onnx_helpers import make_model, node, rand, types  # noqa: E402

from caffe_ocl.onnx import UnsupportedModelError, check, to_caffe  # noqa: E402


def attention_model(n=2, tokens=5, heads=2, d=3, opset=13):
    """ViT's block as timm exports it: class token concatenated, qkv
    Linear, reshape to (N, L, 3, h, d), permute (2, 0, 3, 1, 4), split,
    q k^T scaled, softmax, times v, heads merged back, projection."""
    c = heads * d
    L = tokens + 1
    inits = {"cls": rand(n, 1, c), "wqkv": rand(c, 3 * c, scale=0.4),
             "bqkv": rand(3 * c, scale=0.1), "wp": rand(c, c, scale=0.4),
             "shape5": np.array([n, L, 3, heads, d], np.int64),
             "shape3": np.array([n, L, c], np.int64),
             "scale": np.array(d ** -0.5, np.float32)}
    if opset >= 13:
        inits["three"] = np.array([1, 1, 1], np.int64)
        split = node("Split", ["qkv5", "three"], ["qs", "ks", "vs"], axis=0)
    else:
        split = node("Split", ["qkv5"], ["qs", "ks", "vs"], axis=0, split=[1, 1, 1])
    sq = [node("Squeeze", [f"{t}s", "zero"] if opset >= 13 else [f"{t}s"], [t],
               **({} if opset >= 13 else {"axes": [0]})) for t in "qkv"]
    if opset >= 13:
        inits["zero"] = np.array([0], np.int64)
    nodes = [node("Concat", ["cls", "x"], ["t"], axis=1),
             node("MatMul", ["t", "wqkv"], ["qkv0"]), node("Add", ["qkv0", "bqkv"], ["qkv"]),
             node("Reshape", ["qkv", "shape5"], ["qkv4"]),
             node("Transpose", ["qkv4"], ["qkv5"], perm=[2, 0, 3, 1, 4]),
             split, *sq,
             node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], ["s0"]), node("Mul", ["s0", "scale"], ["s"]),
             node("Softmax", ["s"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["o"]),
             node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             node("Reshape", ["ot", "shape3"], ["o3"]),
             node("MatMul", ["o3", "wp"], ["y"])]
    return make_model(nodes, {"x": (n, tokens, c)}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("n,opset", [(1, 13), (2, 13), (2, 11)])
def test_attention_block_with_extension_layers(n, opset):
    m = attention_model(n=n, opset=opset)
    net = to_caffe.convert(m, extension_layers=True)
    report = check.compare(m, net, inputs={"x": rand(n, 5, 6)})
    diff, scale = report["y"]
    assert diff <= 1e-5 * max(scale, 1.0), report
    t = types(net)
    assert t.count("MatMul") == 2 and "Permute" in t and "Parameter" in t


def test_attention_without_extension_layers_names_the_option():
    with pytest.raises(UnsupportedModelError, match="extension_layers"):
        to_caffe.convert(attention_model())


def test_extension_layers_flag_writes_loadable_files(tmp_path):
    import onnx
    path = tmp_path / "attn.onnx"
    onnx.save(attention_model(), str(path))
    from caffe_ocl.commands import onnx2caffe as cmd
    proto, weights = tmp_path / "a.prototxt", tmp_path / "a.caffemodel"
    assert cmd.main([str(path), str(proto), str(weights), "--extension_layers"]) == 0
    import caffe_ocl
    net = caffe_ocl.Net(str(proto), str(weights), caffe_ocl.TEST)
    assert net.blobs["y"].data.shape == (2, 6, 6)


def test_matmul_with_broadcast_leading_axes():
    """Multi-query attention (MobileNet v4): queries (N, 4, L, d) against
    one key head (N, 1, d, S): the key tiled over the heads; and a 3-D
    operand against a 4-D one."""
    m = make_model([node("MatMul", ["q", "k"], ["s"]),
                    node("Softmax", ["s"], ["p"], axis=-1),
                    node("MatMul", ["p", "v"], ["y"])],
                   {"q": (2, 4, 5, 3), "k": (2, 1, 3, 6), "v": (6, 2)}, ["y"])
    net = to_caffe.convert(m, extension_layers=True)
    feeds = {"q": rand(2, 4, 5, 3), "k": rand(2, 1, 3, 6), "v": rand(6, 2)}
    diff, scale = check.compare(m, net, inputs=feeds)["y"]
    assert diff <= 1e-5 * max(scale, 1.0)
    assert "Tile" in types(net)


def test_converted_attention_exports_back_to_onnx():
    """caffe2onnx of the converted block (MatMul -> MatMul, Permute ->
    Transpose, Parameter -> a constant) gives the original's outputs."""
    import onnxruntime as ort
    from caffe_ocl.onnx import from_caffe
    m = attention_model(n=2)
    net = to_caffe.convert(m, extension_layers=True)
    back = from_caffe.export(net)
    x = rand(2, 5, 6)

    def run(model):
        s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, {s.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(run(back), run(m), rtol=1e-5, atol=1e-5)
