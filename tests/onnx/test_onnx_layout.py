"""Operators on transposed tensors run on the blob under the transpose
(caffe_ocl/onnx/_layout.py): ConvNeXt's channels-last blocks, LayerNorm
over the last axis (as ReduceMean ... before opset 17, LayerNormalization
from 17), MLP-Mixer-style token mixing. Every case is converted, run in
caffe_ocl and compared with ONNX Runtime."""
import numpy as np
import pytest

import os
import sys
sys.path.insert(0, os.path.dirname(__file__))
from onnx_helpers import check_onnx, make_model, node, rand, types  # noqa: E402

from caffe_ocl.onnx import UnsupportedModelError, to_caffe  # noqa: E402


def layer_norm_nodes(x, out, c, tag, inits, opset):
    """LayerNorm over the last axis of ``x`` (``c`` values), as PyTorch
    exports it: LayerNormalization from opset 17, else written out."""
    g, b = f"{tag}_g", f"{tag}_b"
    inits[g] = (np.random.default_rng(len(tag)).random(c) + 0.5).astype(np.float32)
    inits[b] = rand(c, scale=0.1)
    if opset >= 17:
        return [node("LayerNormalization", [x, g, b], [out], axis=-1, epsilon=1e-6)]
    inits[f"{tag}_two"] = np.array(2.0, np.float32)
    inits[f"{tag}_eps"] = np.array(1e-6, np.float32)
    return [node("ReduceMean", [x], [f"{tag}_m"], axes=[-1]),
            node("Sub", [x, f"{tag}_m"], [f"{tag}_d"]),
            node("Pow", [f"{tag}_d", f"{tag}_two"], [f"{tag}_sq"]),
            node("ReduceMean", [f"{tag}_sq"], [f"{tag}_v"], axes=[-1]),
            node("Add", [f"{tag}_v", f"{tag}_eps"], [f"{tag}_ve"]),
            node("Sqrt", [f"{tag}_ve"], [f"{tag}_s"]),
            node("Div", [f"{tag}_d", f"{tag}_s"], [f"{tag}_n"]),
            node("Mul", [f"{tag}_n", g], [f"{tag}_ng"]),
            node("Add", [f"{tag}_ng", b], [out])]


def convnext_block(opset, n=1, c=8, hw=5):
    """x -> depthwise 7x7 -> permute NHWC -> LayerNorm -> Linear 4c -> GELU
    (tanh form: Tanh is in opset 13) -> Linear c -> permute back -> layer
    scale -> + x (torchvision's CNBlock)."""
    inits = {"dw": rand(c, 1, 7, 7, scale=0.2), "dwb": rand(c, scale=0.1),
             "w1": rand(c, 4 * c, scale=0.3), "b1": rand(4 * c, scale=0.1),
             "w2": rand(4 * c, c, scale=0.2), "b2": rand(c, scale=0.1),
             "ls": rand(c, 1, 1), "half": np.array(0.5, np.float32)}
    nodes = [node("Conv", ["x", "dw", "dwb"], ["d"], kernel_shape=[7, 7], pads=[3] * 4,
                  group=c),
             node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1])]
    nodes += layer_norm_nodes("t", "ln", c, "ln", inits, opset)
    nodes += [node("MatMul", ["ln", "w1"], ["h0"]), node("Add", ["h0", "b1"], ["h"]),
              node("Tanh", ["h"], ["th"]), node("Mul", ["h", "th"], ["g0"]),
              node("Mul", ["g0", "half"], ["g"]),
              node("MatMul", ["g", "w2"], ["o0"]), node("Add", ["o0", "b2"], ["o"]),
              node("Transpose", ["o"], ["ot"], perm=[0, 3, 1, 2]),
              node("Mul", ["ot", "ls"], ["s"]), node("Add", ["s", "x"], ["y"])]
    return make_model(nodes, {"x": (n, c, hw, hw)}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset,n", [(13, 1), (13, 2), (17, 1), (17, 3)])
def test_convnext_block_runs_on_nchw_blobs(opset, n):
    m = convnext_block(opset, n)
    net = check_onnx(m, tol=1e-5, inputs={"x": rand(n, 8, 5, 5)})
    t = types(net)
    # the MatMuls are 1x1 convolutions of the NCHW blob; nothing transposes
    assert t.count("Convolution") >= 3 and "InnerProduct" not in t


def test_layer_norm_over_channels_first_transposed_back():
    """timm's LayerNorm2d: permute, LayerNorm, permute back, then a conv."""
    inits = {"w": rand(4, 6, 1, 1)}
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1])]
    nodes += layer_norm_nodes("t", "n", 6, "ln", inits, 17)
    nodes += [node("Transpose", ["n"], ["nb"], perm=[0, 3, 1, 2]),
              node("Conv", ["nb", "w"], ["y"], kernel_shape=[1, 1])]
    check_onnx(make_model(nodes, {"x": (2, 6, 3, 4)}, ["y"], inits, opset=17), tol=1e-5,
               inputs={"x": rand(2, 6, 3, 4) * 3 + 1})


def test_layer_norm_on_plain_tokens():
    """LayerNormalization over the last axis of an (N, L, C) tensor and
    over the last two axes: the plain (untransposed) layout."""
    inits = {"g": rand(5) + 1, "b": rand(5), "g2": rand(4, 5) + 1}
    m = make_model([node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1),
                    node("LayerNormalization", ["x", "g2"], ["z"], axis=1, epsilon=1e-3)],
                   {"x": (2, 4, 5)}, ["y", "z"], inits, opset=17)
    check_onnx(m, tol=1e-5, inputs={"x": rand(2, 4, 5) * 2})


def test_token_mixing_over_a_transposed_axis():
    """MLP-Mixer's token mixing: (N, L, C) -> transpose -> Linear over L ->
    transpose back: the Linear over the blob's axis 1 is a 1x1
    convolution; softmax and concat along logical axes map to the blob's."""
    inits = {"wt": rand(6, 6, scale=0.4), "bt": rand(6, scale=0.1)}
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),          # (N, C, L)
             node("MatMul", ["t", "wt"], ["m0"]), node("Add", ["m0", "bt"], ["m"]),
             node("Relu", ["m"], ["r"]),
             node("Softmax", ["r"], ["sm"], axis=1),
             node("Concat", ["sm", "r"], ["cat"], axis=2),
             node("Transpose", ["cat"], ["y"], perm=[0, 2, 1])]
    net = check_onnx(make_model(nodes, {"x": (2, 6, 3)}, ["y"], inits), tol=1e-5,
                     inputs={"x": rand(2, 6, 3)})
    assert "InnerProduct" not in types(net)


def test_computed_statistic_tiled_over_channels():
    """A per-pixel statistic (N, 1, H, W) against (N, C, H, W) at batch > 1:
    the statistic is tiled over the channels."""
    m = make_model([node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
                    node("Sub", ["x", "m"], ["y"])], {"x": (3, 4, 2, 5)}, ["y"])
    net = check_onnx(m, inputs={"x": rand(3, 4, 2, 5)})
    assert "Tile" in types(net)


def test_transposed_view_read_by_a_layer_that_needs_the_order_is_reported():
    m = make_model([node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                    node("Relu", ["t"], ["r"]),
                    node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2])],
                   {"x": (1, 3, 4, 6)}, ["y"])
    with pytest.raises(UnsupportedModelError, match="Transpose 'transpose_t'.*moves data"):
        to_caffe.convert(m)


@pytest.mark.parametrize("opset", [13, 18])
def test_grn_reduce_l2_over_transposed_spatial_axes(opset):
    """ConvNeXt v2's global response norm on a channels-last view:
    ReduceL2 over H, W, a mean over C, a gated residual; ReduceSumSquare
    alike. Opset 18 gives the reduce axes as an input."""
    n, c = 2, 4
    inits = {"eps": np.array(1e-6, np.float32), "gamma": rand(c), "beta": rand(c)}
    if opset >= 18:
        inits.update(hw=np.array([1, 2], np.int64), last=np.array([-1], np.int64))
        red = [node("ReduceL2", ["t", "hw"], ["gx"], keepdims=1),
               node("ReduceSumSquare", ["t", "hw"], ["ss"], keepdims=1),
               node("ReduceMean", ["gx", "last"], ["gm"], keepdims=1)]
    else:
        red = [node("ReduceL2", ["t"], ["gx"], axes=[1, 2], keepdims=1),
               node("ReduceSumSquare", ["t"], ["ss"], axes=[1, 2], keepdims=1),
               node("ReduceMean", ["gx"], ["gm"], axes=[-1], keepdims=1)]
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1])] + red + [
        node("Add", ["gm", "eps"], ["gme"]), node("Div", ["gx", "gme"], ["nx"]),
        node("Mul", ["t", "nx"], ["tn"]), node("Mul", ["tn", "gamma"], ["tg"]),
        node("Add", ["tg", "beta"], ["tb"]), node("Add", ["tb", "t"], ["o"]),
        node("Add", ["o", "ss"], ["o2"]),
        node("Transpose", ["o2"], ["y"], perm=[0, 3, 1, 2])]
    check_onnx(make_model(nodes, {"x": (n, c, 3, 5)}, ["y"], inits, opset=opset),
               tol=1e-5, inputs={"x": rand(n, c, 3, 5)})


@pytest.mark.parametrize("opset", [9, 13])
def test_split_slice_and_mean_of_a_transposed_view(opset):
    """gMLP's gating: chunk along the last (channel) axis of a channels-last
    view, Slice of it, and MLP-Mixer's head: the mean over the tokens with
    keepdims=0, giving (N, C) as a plain reshape of the blob."""
    split = (node("Split", ["t"], ["u", "v"], axis=-1, split=[2, 4]) if opset < 13 else
             node("Split", ["t", "sizes"], ["u", "v"], axis=-1))
    if opset < 10:
        sl = node("Slice", ["v"], ["vs"], starts=[1], ends=[3], axes=[2])
    else:
        sl = node("Slice", ["v", "st", "en"], ["vs"])   # default axes: 0, 1, 2
    inits = {"sizes": np.array([2, 4], np.int64), "st": np.array([0, 0, 1], np.int64),
             "en": np.array([9, 9, 3], np.int64)}
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),      # (N, L, C)
             split, sl, node("Mul", ["u", "vs"], ["g"]),
             node("ReduceMean", ["g"], ["y"], axes=[1], keepdims=0)]
    if opset < 10:
        inits = {}
    elif opset < 13:
        inits = {k: inits[k] for k in ("st", "en")}
    check_onnx(make_model(nodes, {"x": (2, 6, 5)}, ["y"], inits, opset=opset), tol=1e-5,
               inputs={"x": rand(2, 6, 5)})


def affine_then(linear, nodes_after=(), shape=(2, 5, 6), extra=None, outputs=("y",)):
    """x * g + b, then ``linear`` (a node reading "ab")."""
    c = shape[-1] if linear.op_type == "MatMul" else shape[1]
    cshape = (c,) if linear.op_type == "MatMul" else (c, 1, 1)
    inits = {"g": rand(*cshape) + 1, "b": rand(*cshape), "w": rand(c, 4),
             "wc": rand(3, c, 2, 2), "wb": rand(3)}
    inits.update(extra or {})
    nodes = [node("Mul", ["x", "g"], ["xg"]), node("Add", ["xg", "b"], ["ab"]), linear]
    return make_model(nodes + list(nodes_after), {"x": shape}, list(outputs), inits)


def test_affine_folded_into_the_matmul_after_it():
    m = affine_then(node("MatMul", ["ab", "w"], ["y"]))
    net = check_onnx(m, tol=1e-5, inputs={"x": rand(2, 5, 6)})
    assert types(net) == ["Input", "InnerProduct"]


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1]])
def test_affine_folded_into_a_conv_without_padding(pads):
    m = affine_then(node("Conv", ["ab", "wc", "wb"], ["y"], kernel_shape=[2, 2],
                         strides=[2, 2], pads=pads), shape=(2, 6, 4, 4))
    net = check_onnx(m, tol=1e-5, inputs={"x": rand(2, 6, 4, 4)})
    # with padding the border pixels would see the shift b: not folded
    assert ("Scale" in types(net)) == any(pads)


def test_affine_read_twice_is_not_folded():
    m = affine_then(node("MatMul", ["ab", "w"], ["y"]), [node("Relu", ["ab"], ["z"])],
                    outputs=("y", "z"))
    net = check_onnx(m, tol=1e-5, inputs={"x": rand(2, 5, 6)})
    assert "Scale" in types(net) and "Bias" in types(net)


def test_affine_on_a_channels_last_view_folded_through_the_transpose_back():
    """timm's LayerNorm2d ends with gamma and beta on the NHWC view, then
    permutes back to NCHW for the next convolution: folded into it."""
    inits = {"g": rand(6) + 1, "b": rand(6), "wc": rand(3, 6, 2, 2), "wb": rand(3)}
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             node("Mul", ["t", "g"], ["tg"]), node("Add", ["tg", "b"], ["tb"]),
             node("Transpose", ["tb"], ["nb"], perm=[0, 3, 1, 2]),
             node("Conv", ["nb", "wc", "wb"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    net = check_onnx(make_model(nodes, {"x": (2, 6, 4, 4)}, ["y"], inits), tol=1e-5,
                     inputs={"x": rand(2, 6, 4, 4)})
    assert types(net) == ["Input", "Convolution"]


@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
@pytest.mark.parametrize("n", [1, 2])
def test_both_operands_enlarged_by_broadcasting(op, n):
    """FocalNet's modulation: a per-channel (N, C, 1, 1) tensor times a
    per-pixel (N, 1, H, W) one; and a computed small operand on the left of
    Sub and Div against a full one."""
    nodes = [node("GlobalAveragePool", ["x"], ["c"]),
             node("ReduceMean", ["x"], ["p"], axes=[1], keepdims=1),
             node("Abs", ["p"], ["pa"]),
             node(op, ["c", "pa"], ["y"]),
             node(op, ["pa", "x"], ["z"])]
    m = make_model(nodes, {"x": (n, 3, 4, 5)}, ["y", "z"])
    net = check_onnx(m, tol=1e-5, inputs={"x": np.abs(rand(n, 3, 4, 5)) + 0.5})
    assert "Tile" in types(net)


def test_strided_slices_of_swin_patch_merging():
    """x[:, 0::2, 0::2], x[:, 1::2, 0::2], ... on a channels-last view
    concatenated along channels (Swin's and LeViT's patch merging): a
    Reshape, a Slice of the inner axis and a Reshape each."""
    inits = {}
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1])]       # (N, H, W, C)
    outs = []
    for i, (h0, w0) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        inits[f"st{i}"] = np.array([h0, w0], np.int64)
        inits[f"en{i}"] = np.array([1000, 1000], np.int64)
        inits[f"ax{i}"] = np.array([1, 2], np.int64)
        inits[f"sp{i}"] = np.array([2, 2], np.int64)
        nodes.append(node("Slice", ["t", f"st{i}", f"en{i}", f"ax{i}", f"sp{i}"], [f"s{i}"]))
        outs.append(f"s{i}")
    nodes += [node("Concat", outs, ["cat"], axis=-1),
              node("Transpose", ["cat"], ["y"], perm=[0, 3, 1, 2])]
    net = check_onnx(make_model(nodes, {"x": (2, 3, 6, 4)}, ["y"], inits), tol=1e-6,
                     inputs={"x": rand(2, 3, 6, 4)})
    assert "Slice" in types(net)


@pytest.mark.parametrize("start,end,step,padded", [
    (0, 7, 3, True), (1, 7, 3, False), (2, 6, 2, False), (6, 7, 2, False),
    (1, 7, 4, True), (1, 6, 2, False), (0, 7, 2, True),
    # one value: a plain slice (a hostile step allocated nothing huge)
    (2, 7, 2 ** 31 - 1, False), (5, 7, 9, False)])
def test_strided_slice_of_one_axis(start, end, step, padded):
    """Every step-th value from start: a run of count x step values holds
    them at one offset (6 of 7 by 2: the run 5..7, offset 1); where none
    fits inside the axis (0, 3, 6 of 7 by 3: 9 values) the axis is padded
    with zeros that are never kept."""
    inits = {"st": np.array([start], np.int64), "en": np.array([end], np.int64),
             "ax": np.array([3], np.int64), "sp": np.array([step], np.int64)}
    m = make_model([node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": (1, 2, 3, 7)},
                   ["y"], inits)
    net = check_onnx(m, tol=1e-6, inputs={"x": rand(1, 2, 3, 7)})
    assert ("DummyData" in types(net)) == padded


def test_lower_rank_computed_operand_keeps_its_shape_for_other_readers():
    """Sub(c, x) with c computed of shape (C, H, W) against x (1, C, H, W):
    c is seen as (1, C, H, W) for the Sub (nothing to tile); its other
    reader still sees (C, H, W), and a (C, 1, 1) one is tiled over H, W."""
    m = make_model([node("Reshape", ["x", "chw"], ["xr"]),
                    node("Abs", ["xr"], ["c"]),
                    node("Sub", ["c", "x"], ["y"]),
                    node("Neg", ["c"], ["z"]),
                    node("GlobalAveragePool", ["x"], ["g"]),
                    node("Reshape", ["g", "c11"], ["gc"]),
                    node("Div", ["gc", "x"], ["w"])],
                   {"x": (1, 3, 4, 5)}, ["y", "z", "w"],
                   {"chw": np.array([3, 4, 5], np.int64), "c11": np.array([3, 1, 1], np.int64)})
    net = check_onnx(m, tol=1e-5, inputs={"x": np.abs(rand(1, 3, 4, 5)) + 0.5})
    assert "Tile" in types(net)
