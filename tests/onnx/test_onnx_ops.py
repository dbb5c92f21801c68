"""ONNX -> Caffe: one small onnx.helper graph per operator mapping, run in
caffe_ocl and in ONNX Runtime on the same input (largest difference at most
1e-4 x the output's scale)."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_helpers import assert_close, check_onnx, make_model, node, rand, types  # noqa: E402

from caffe_ocl.onnx import UnsupportedModelError, to_caffe  # noqa: E402

X4 = (2, 3, 7, 6)


@pytest.mark.parametrize("attrs", [
    dict(pads=[1, 1, 1, 1]),
    dict(pads=[0, 1, 2, 0], strides=[2, 1]),          # asymmetric
    dict(pads=[1, 2, 1, 2], strides=[2, 2], dilations=[2, 1]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
])
def test_conv(attrs):
    w, b = rand(4, 3, 3, 3), rand(4)
    m = make_model([node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": X4}, ["y"],
                   {"w": w, "b": b})
    net = check_onnx(m, layer_types=["Convolution"])
    conv = [lp for lp in net.layer if lp.type == "Convolution"][0]
    assert tuple(conv.blobs[0].shape.dim) == (4, 3, 3, 3)   # OIHW, as Caffe


def test_conv_grouped_depthwise_no_bias():
    w1 = rand(6, 1, 3, 3)          # depthwise, multiplier 2
    w2 = rand(4, 3, 1, 1)          # grouped 1x1
    m = make_model([node("Conv", ["x", "w1"], ["d"], group=3, pads=[1, 1, 1, 1]),
                    node("Conv", ["d", "w2"], ["y"], group=2)],
                   {"x": X4}, ["y"], {"w1": w1, "w2": w2.reshape(4, 3, 1, 1)})
    # w2 with group 2 over 6 channels: 3 inputs per group
    check_onnx(m)


@pytest.mark.parametrize("attrs,group", [
    (dict(pads=[1, 1]), 1),
    (dict(pads=[2, 0], strides=[2], dilations=[2]), 1),
    (dict(auto_pad="SAME_UPPER"), 2),
], ids=["pad1", "asym-stride-dil", "same-grouped"])
def test_conv_1d(attrs, group):
    """1-D Conv (ECA's channel attention, sequence CNNs): the 2-D one of
    kernel (1, k) over the input seen as (N, C, 1, L), its output viewed back."""
    m = make_model([node("Conv", ["x", "w", "b"], ["c"], group=group, **attrs),
                    node("Relu", ["c"], ["y"])],
                   {"x": (2, 4, 11)}, ["y"], {"w": rand(6, 4 // group, 3), "b": rand(6)})
    check_onnx(m, layer_types=["Convolution"])


def test_expand_read_by_broadcasting_ops_is_not_copied():
    """ECA's ``x * y.expand_as(x)``: the Mul reads y as it is (no Tile); an
    Expand that another operator reads (or that adds leading axes) tiles."""
    m = make_model([node("Expand", ["g", "sx"], ["ge"]), node("Mul", ["x", "ge"], ["a"]),
                    node("Expand", ["v", "s3"], ["ve"]), node("Relu", ["ve"], ["b"])],
                   {"x": (2, 4, 3, 5), "g": (2, 4, 1, 1), "v": (3, 1)}, ["a", "b"],
                   {"sx": np.array([2, 4, 3, 5], np.int64), "s3": np.array([2, 3, 4], np.int64)})
    net = check_onnx(m)
    tiles = [lp for lp in net.layer if lp.type == "Tile"]
    assert len(tiles) == 2
    assert all("g" not in lp.bottom for lp in tiles)


def test_conv_transpose():
    w, b = rand(3, 2, 3, 3), rand(2)
    for attrs in (dict(strides=[2, 2]), dict(strides=[2, 2], pads=[1, 1, 1, 1]),
                  dict(strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 1])):
        m = make_model([node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)],
                       {"x": (1, 3, 4, 5)}, ["y"], {"w": w, "b": b})
        check_onnx(m, layer_types=["Deconvolution"])


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2]),                      # floor
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),         # ceil
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 0]),   # asymmetric
    dict(kernel_shape=[1, 1], strides=[3, 3], ceil_mode=1),         # dropped last window
])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool(op, attrs):
    cases = [attrs]
    if op == "AveragePool":
        cases = [dict(attrs, count_include_pad=0), dict(attrs, count_include_pad=1)]
    for a in cases:
        m = make_model([node(op, ["x"], ["y"], **a)], {"x": X4}, ["y"])
        net = check_onnx(m, layer_types=["Pooling"])
        pool = [lp for lp in net.layer if lp.type == "Pooling"][0]
        if not a.get("ceil_mode"):
            assert pool.pooling_param.round_mode == pool.pooling_param.FLOOR


def test_global_pools_and_reduce_mean():
    m = make_model([node("GlobalAveragePool", ["x"], ["a"]),
                    node("GlobalMaxPool", ["x"], ["b"]),
                    node("ReduceMean", ["x"], ["c"], axes=[2, 3], keepdims=0),
                    node("ReduceSum", ["x", "axes"], ["d"], keepdims=1)],
                   {"x": X4}, ["a", "b", "c", "d"], {"axes": np.array([1, 2, 3], np.int64)})
    check_onnx(m)


def test_reduce_over_inner_axes_of_5d():
    """ResNeSt's and SKNet's sum over the radix axis of an (N, R, C, H, W)
    view, a mean over two inner axes, and a sum over the rows of a
    channel-shuffled view: a 1x1 Convolution of one output channel over the
    input seen as (P, R, T, 1)."""
    shape5 = np.array([2, 3, 2, 3, 4], np.int64)
    m = make_model([node("Reshape", ["x", "s5"], ["r"]),
                    node("ReduceSum", ["r", "ax1"], ["a"], keepdims=0),
                    node("ReduceMean", ["r"], ["b"], axes=[1, 2], keepdims=1),
                    # a channel shuffle (a permuted view), then summed over rows
                    node("Reshape", ["x", "s4"], ["g"]),
                    node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3]),
                    node("Reshape", ["t", "sx"], ["sh"]),
                    node("ReduceSum", ["sh", "ax2"], ["c"], keepdims=1)],
                   {"x": (2, 6, 3, 4)}, ["a", "b", "c"],
                   {"s5": shape5, "ax1": np.array([1], np.int64), "ax2": np.array([2], np.int64),
                    "s4": np.array([2, 2, 3, 12], np.int64),
                    "sx": np.array([2, 6, 3, 4], np.int64)})
    net = check_onnx(m)
    sums = [lp for lp in net.layer
            if lp.type == "Convolution" and lp.convolution_param.num_output == 1]
    assert len(sums) == 3


@pytest.mark.parametrize("opset", [13, 15])
def test_training_mode_batchnorm_of_constants_is_folded(opset):
    """timm's weight-standardised convolutions (NFNet) export their weights
    as BatchNormalization in training mode (opset 13: five outputs) over
    the reshaped constant weight: folded with the weight's own statistics,
    as ONNX defines training mode, not with the mean / var inputs (given
    wrong here on purpose)."""
    w = rand(4, 3, 3, 3)
    gain = np.abs(rand(4)) + 0.5
    # opset 13: training mode by its five outputs; 15: by training_mode
    bn_out, extra = (["wn", "rm", "rv", "sm", "sv"], {}) if opset < 14 else (
        ["wn", "rm", "rv"], {"training_mode": 1})
    m = make_model([node("Reshape", ["w", "s3"], ["w3"]),
                    node("BatchNormalization", ["w3", "g", "z", "z", "one"], bn_out,
                         epsilon=1e-5, momentum=0.0, **extra),
                    node("Reshape", ["wn", "s4"], ["w4"]),
                    node("Conv", ["x", "w4"], ["y"], pads=[1, 1, 1, 1])],
                   {"x": (1, 3, 6, 5)}, ["y"],
                   {"w": w, "s3": np.array([1, 4, 27], np.int64), "g": gain,
                    "z": np.zeros(4, np.float32), "one": np.ones(4, np.float32),
                    "s4": np.array([4, 3, 3, 3], np.int64)}, opset=opset)
    net = to_caffe.convert(m)
    w64 = w.reshape(4, -1).astype(np.float64)
    std = ((w64 - w64.mean(1, keepdims=True)) / np.sqrt(w64.var(1, keepdims=True) + 1e-5)
           * gain[:, None]).astype(np.float32).reshape(w.shape)
    ref = make_model([node("Conv", ["x", "w4"], ["y"], pads=[1, 1, 1, 1])],
                     {"x": (1, 3, 6, 5)}, ["y"], {"w4": std})
    from caffe_ocl.onnx import check
    assert_close(check.compare(ref, net))
    conv = [lp for lp in net.layer if lp.type == "Convolution"][0]
    np.testing.assert_allclose(np.array(conv.blobs[0].data).reshape(w.shape), std, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("attrs,trans_b", [
    (dict(), False), (dict(transB=1, alpha=0.5, beta=2.0), True)])
def test_gemm(attrs, trans_b):
    b = rand(5, 4) if trans_b else rand(4, 5)
    m = make_model([node("Gemm", ["x", "b", "c"], ["y"], **attrs)], {"x": (3, 4)}, ["y"],
                   {"b": b, "c": rand(5)})
    net = check_onnx(m, layer_types=["InnerProduct"])
    ip = [lp for lp in net.layer if lp.type == "InnerProduct"][0]
    assert tuple(ip.blobs[0].shape.dim) == (5, 4)     # [out, in], as Caffe


def test_matmul_constant_weight_3d():
    m = make_model([node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])],
                   {"x": (2, 3, 4)}, ["y"], {"w": rand(4, 6), "b": rand(6)})
    net = check_onnx(m, layer_types=["InnerProduct"])
    # the Add is the InnerProduct's bias (onnx/_fuse.py)
    assert "Bias" not in types(net)
    assert net.layer[-1].inner_product_param.bias_term


@pytest.mark.parametrize("flatten,bias", [(True, True), (False, True), (True, False)])
def test_batchnorm_after_matmul_folds_into_its_weights(flatten, bias):
    """LeViT's Linear + BatchNorm1d on flatten(0, 1) (and the plain 2-D
    form): the BatchNorm goes into the product's weights and bias
    (onnx/_fuse.py), no BatchNorm layer is left, the values match ONNX
    Runtime's."""
    c = 6
    inits = {"w": rand(4, c), "g": rand(c), "be": rand(c), "mu": rand(c),
             "var": np.abs(rand(c)) + 0.5}
    nodes = [node("MatMul", ["x", "w"], ["m"])]
    if bias:
        inits["b"] = rand(c)
        nodes.append(node("Add", ["m", "b"], ["mb"]))
    last = nodes[-1].output[0]
    shape = (2, 3, 4) if flatten else (5, 4)
    if flatten:
        inits["rows"] = np.array([6, c], np.int64)
        nodes.append(node("Reshape", [last, "rows"], ["flat"]))
        last = "flat"
    nodes.append(node("BatchNormalization", [last, "g", "be", "mu", "var"], ["y"],
                      epsilon=1e-3))
    net = check_onnx(make_model(nodes, {"x": shape}, ["y"], inits))
    assert "BatchNorm" not in types(net) and "Scale" not in types(net)


def test_batchnorm_to_batchnorm_scale():
    c = 3
    inits = {"g": rand(c), "be": rand(c), "mu": rand(c), "var": np.abs(rand(c)) + 0.5}
    m = make_model([node("BatchNormalization", ["x", "g", "be", "mu", "var"], ["y"],
                         epsilon=1e-3)], {"x": X4}, ["y"], inits)
    net = check_onnx(m)
    assert types(net)[1:] == ["BatchNorm", "Scale"]
    bn = net.layer[1]
    # Caffe's stored sums: ONNX's default momentum 0.9 -> factor 10, and the
    # moving_average_fraction that keeps it there (PyTorch's running-average update)
    assert len(bn.blobs) == 3 and list(bn.blobs[2].data) == [np.float32(10.0)]
    np.testing.assert_allclose(np.array(bn.blobs[0].data) / 10, inits["mu"], rtol=1e-6)
    np.testing.assert_allclose(np.array(bn.blobs[1].data) / 10, inits["var"], rtol=1e-6)
    assert bn.batch_norm_param.moving_average_fraction == pytest.approx(0.9)


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_activations(opset):
    nodes = [node("Relu", ["x"], ["r"]),
             node("LeakyRelu", ["x"], ["lr"], alpha=0.1),
             node("Sigmoid", ["x"], ["s"]),
             node("Tanh", ["x"], ["t"]),
             node("Elu", ["x"], ["e"], alpha=0.7),
             node("HardSigmoid", ["x"], ["hs"], alpha=0.25, beta=0.4),
             node("Abs", ["x"], ["ab"]),
             node("Exp", ["x"], ["ex"]),
             node("Softplus", ["x"], ["sp"])]
    outs = ["r", "lr", "s", "t", "e", "hs", "ab", "ex", "sp"]
    inits = {}
    if opset >= 11:
        nodes.append(node("Clip", ["x", "lo", "hi"], ["c6"]))
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
    else:
        nodes.append(node("Clip", ["x"], ["c6"], min=0.0, max=6.0))
    outs.append("c6")
    if opset >= 14:
        nodes.append(node("HardSwish", ["x"], ["hw"]))
        outs.append("hw")
    # SiLU as PyTorch exports it
    nodes += [node("Sigmoid", ["x"], ["sg"]), node("Mul", ["x", "sg"], ["silu"])]
    outs.append("silu")
    m = make_model(nodes, {"x": (2, 3, 4, 5)}, outs, inits, opset=opset)
    x = {"x": rand(2, 3, 4, 5, scale=4.0)}
    check_onnx(m, inputs=x)


def test_hardswish_relu6_opset14():
    m = make_model([node("HardSwish", ["x"], ["y"]),
                    node("Clip", ["x", "", "hi"], ["z"])],
                   {"x": (1, 4, 3, 3)}, ["y", "z"], {"hi": np.array(6, np.float32)}, opset=14)
    check_onnx(m, inputs={"x": rand(1, 4, 3, 3, scale=5.0)})


def test_prelu_and_power_ops():
    m = make_model([node("PRelu", ["x", "slope"], ["p"]),
                    node("PRelu", ["x", "one"], ["q"]),
                    node("Abs", ["x"], ["a"]),
                    node("Sqrt", ["a"], ["s"]),
                    node("Neg", ["x"], ["n"]),
                    node("Pow", ["x", "two"], ["pw"])],
                   {"x": X4}, ["p", "q", "s", "n", "pw"],
                   {"slope": rand(3, 1, 1), "one": np.array([0.3], np.float32),
                    "two": np.array(2.0, np.float32)})
    check_onnx(m)


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax(opset):
    m = make_model([node("Softmax", ["x"], ["y"], axis=1),
                    node("Flatten", ["x"], ["f"], axis=1),
                    node("Softmax", ["f"], ["z"], axis=1),
                    node("LogSoftmax", ["f"], ["l"], axis=1)],
                   {"x": (2, 3, 2, 2)}, ["y", "z", "l"], opset=opset)
    check_onnx(m)


def test_dropout_and_identity():
    m = make_model([node("Dropout", ["x"], ["d"]), node("Relu", ["d"], ["r"]),
                    node("Identity", ["r"], ["y"])], {"x": (2, 5)}, ["y"])
    net = check_onnx(m)
    assert "Dropout" in types(net)


def test_broadcast_binary_ops():
    c = rand(3, 1, 1)
    nodes = [node("Mul", ["x", "c"], ["m"]),              # per-channel constant -> Scale
             node("Add", ["m", "row"], ["a"]),            # constant over W -> Bias
             node("Sub", ["a", "two"], ["s"]),            # scalar -> Power
             node("Div", ["s", "three"], ["d"]),
             node("Sub", ["two", "d"], ["r"]),            # scalar - x
             node("GlobalAveragePool", ["r"], ["g"]),
             node("Sigmoid", ["g"], ["gs"]),
             node("Mul", ["r", "gs"], ["se"]),            # SE gate [N,C,1,1] -> Scale
             node("Add", ["gs", "se"], ["y"]),            # broadcast add, small first
             node("Sub", ["y", "g"], ["z"]),
             node("Add", ["z", "x"], ["w"]),              # same shape -> Eltwise
             node("Sub", ["w", "x"], ["v"]),
             node("Mul", ["v", "x"], ["u"]),
             node("Div", ["u", "pos"], ["t"])]
    pos_inits = {"c": c, "row": rand(6), "two": np.array(2.0, np.float32),
                 "three": np.array([3.0], np.float32), "pos": np.abs(rand(1, 3, 7, 6)) + 1}
    m = make_model(nodes, {"x": X4}, ["t"], pos_inits)
    net = check_onnx(m)
    got = types(net)
    for t in ("Scale", "Bias", "Power", "Eltwise"):
        assert t in got


def test_sum_max_concat_split_slice():
    nodes = [node("Sum", ["x", "x", "x"], ["s"]),
             node("Max", ["x", "s"], ["m"]),
             node("Concat", ["s", "m"], ["c"], axis=1),
             node("Split", ["c", "sp"], ["p0", "p1", "p2"], axis=1),
             node("Slice", ["p1", "st", "en", "ax"], ["q"]),
             node("Relu", ["p2"], ["r"])]
    m = make_model(nodes, {"x": X4}, ["p0", "q", "r"],
                   {"sp": np.array([1, 3, 2], np.int64), "st": np.array([1, -4], np.int64),
                    "en": np.array([3, 100], np.int64), "ax": np.array([1, 2], np.int64)})
    check_onnx(m, layer_types=["Concat", "Slice", "Silence"])


def test_pad_constant():
    m = make_model([node("Pad", ["x", "pads", "v"], ["y"])], {"x": (1, 2, 3, 4)}, ["y"],
                   {"pads": np.array([0, 0, 1, 0, 0, 1, 2, 3], np.int64),
                    "v": np.array(0.5, np.float32)}, opset=13)
    check_onnx(m, layer_types=["DummyData", "Concat"])


@pytest.mark.parametrize("scale", [1.0, 3e-3], ids=["unit", "small-variance"])
def test_instance_norm_and_group_norm(scale):
    """InstanceNormalization with an affine, and GroupNorm as PyTorch exports
    it (Reshape to (N, G, -1), InstanceNormalization of ones and zeros,
    Reshape back, per-channel Mul and Add). Small variances: ONNX divides
    by sqrt(var + eps), Caffe's MVN by sqrt(var) + eps (4% apart here)."""
    c, g = 6, 3
    inits = {"s": np.abs(rand(c)) + 0.5, "b": rand(c), "one": np.ones(g, np.float32),
             "zero": np.zeros(g, np.float32), "sg": np.array([2, g, -1], np.int64),
             "sx": np.array([2, c, 5, 4], np.int64), "gm": rand(c, 1, 1), "bt": rand(c, 1, 1)}
    m = make_model([node("InstanceNormalization", ["x", "s", "b"], ["a"], epsilon=1e-5),
                    node("Reshape", ["x", "sg"], ["r"]),
                    node("InstanceNormalization", ["r", "one", "zero"], ["n"], epsilon=1e-5),
                    node("Reshape", ["n", "sx"], ["nb"]),
                    node("Mul", ["nb", "gm"], ["m"]), node("Add", ["m", "bt"], ["gn"])],
                   {"x": (2, c, 5, 4)}, ["a", "gn"], inits)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, c, 5, 4)) * scale + 0.2).astype(np.float32)
    net = to_caffe.convert(m)
    from caffe_ocl.onnx import check
    assert_close(check.compare(m, net, inputs={"x": x}), tol=1e-5)
    assert "MVN" in types(net)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_reflect_and_edge(mode):
    """Non-constant Pad of H and W (TResNet's anti-aliasing blur): each axis
    a 0/1 matrix, applied as a 1x1 Convolution over rows and an InnerProduct
    over columns."""
    m = make_model([node("Relu", ["x"], ["r"]), node("Pad", ["r", "pads"], ["y"], mode=mode)],
                   {"x": (2, 3, 5, 4)}, ["y"],
                   {"pads": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)})
    check_onnx(m, tol=1e-6, layer_types=["Convolution", "InnerProduct"])


@pytest.mark.parametrize("kind,mode", [("s2d", None), ("d2s", "DCR"), ("d2s", "CRD"),
                                       ("s2d-transpose", None), ("pixel-shuffle", None)])
def test_space_to_depth_and_back(kind, mode):
    """Blocks of pixels moved into channels or back: ONNX SpaceToDepth /
    DepthToSpace (both modes), TResNet's reshape-transpose space-to-depth
    and PixelShuffle's: a Convolution or Deconvolution, kernel = stride = 2,
    picking one input per output."""
    if kind == "s2d":
        nodes, shape = [node("SpaceToDepth", ["x"], ["y"], blocksize=2)], (2, 3, 4, 6)
        inits = {}
    elif kind == "d2s":
        nodes, shape = [node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)], (2, 8, 3, 2)
        inits = {}
    elif kind == "s2d-transpose":     # timm's SpaceToDepth: (N, C, H/2, 2, W/2, 2) -> (0, 3, 5, 1, 2, 4)
        nodes = [node("Reshape", ["x", "s6"], ["r"]),
                 node("Transpose", ["r"], ["t"], perm=[0, 3, 5, 1, 2, 4]),
                 node("Reshape", ["t", "s4"], ["y"])]
        shape, inits = (2, 3, 4, 6), {"s6": np.array([2, 3, 2, 2, 3, 2], np.int64),
                                       "s4": np.array([2, 12, 2, 3], np.int64)}
    else:                             # PixelShuffle(2): (N, C, 2, 2, H, W) -> (0, 1, 4, 2, 5, 3)
        nodes = [node("Reshape", ["x", "s6"], ["r"]),
                 node("Transpose", ["r"], ["t"], perm=[0, 1, 4, 2, 5, 3]),
                 node("Reshape", ["t", "s4"], ["y"])]
        shape, inits = (2, 8, 3, 2), {"s6": np.array([2, 2, 2, 2, 3, 2], np.int64),
                                       "s4": np.array([2, 2, 6, 4], np.int64)}
    nodes = [node("Relu", ["x"], ["x1"])] + [
        helper_node if "x" not in helper_node.input else _renamed(helper_node, "x", "x1")
        for helper_node in nodes]
    net = check_onnx(make_model(nodes, {"x": shape}, ["y"], inits), tol=1e-6)
    moves = [lp for lp in net.layer if lp.type in ("Convolution", "Deconvolution")]
    assert len(moves) == 1
    cp = moves[0].convolution_param
    assert list(cp.stride) == [2] and list(cp.kernel_size) == [2]


def _renamed(n, old, new):
    n.input[:] = [new if i == old else i for i in n.input]
    return n


def test_lrn():
    m = make_model([node("LRN", ["x"], ["y"], size=3, alpha=1e-2, beta=0.75, bias=2.0)],
                   {"x": X4}, ["y"])
    check_onnx(m, layer_types=["LRN"])


def test_flatten_reshape_chain_as_pytorch_exports():
    """x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    nodes = [node("Relu", ["x"], ["r"]),
             node("Shape", ["r"], ["shp"]),
             node("Gather", ["shp", "zero"], ["n"], axis=0),
             node("Unsqueeze", ["n", "ax0"], ["n1"]),
             node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
             node("Reshape", ["r", "newshape"], ["flat"]),
             node("Gemm", ["flat", "w", "b"], ["y"], transB=1)]
    m = make_model(nodes, {"x": (2, 3, 2, 2)}, ["y"],
                   {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64),
                    "minus1": np.array([-1], np.int64), "w": rand(5, 12), "b": rand(5)})
    net = check_onnx(m)
    assert types(net) == ["Input", "ReLU", "Flatten", "InnerProduct"]


def test_flatten_opset9_and_squeeze():
    nodes = [node("Flatten", ["x"], ["f"], axis=1),
             node("Unsqueeze", ["f"], ["u"], axes=[2, 3]),
             node("Relu", ["u"], ["r"]),
             node("Squeeze", ["r"], ["y"], axes=[2, 3])]
    m = make_model(nodes, {"x": (2, 3, 2, 2)}, ["y"], opset=9)
    check_onnx(m)


def test_channel_shuffle_is_a_permutation_conv():
    n, c, h, w, g = 1, 6, 3, 3, 2
    nodes = [node("Reshape", ["x", "s5"], ["a"]),
             node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3, 4]),
             node("Reshape", ["b", "s4"], ["y0"]),
             node("Relu", ["y0"], ["y"])]
    m = make_model(nodes, {"x": (n, c, h, w)}, ["y"],
                   {"s5": np.array([n, g, c // g, h, w], np.int64),
                    "s4": np.array([n, c, h, w], np.int64)})
    net = check_onnx(m, layer_types=["Convolution"])
    conv = [lp for lp in net.layer if lp.type == "Convolution"][0]
    assert conv.convolution_param.bias_term is False


def test_unsupported_nodes_are_listed_and_nothing_written(tmp_path):
    # NHWC read by a pooling: no Caffe layer moves the data so
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             node("GlobalAveragePool", ["t"], ["r"]),
             node("Sin", ["r"], ["e"]),
             node("Pad", ["e", "pads"], ["y"], mode="reflect")]
    m = make_model(nodes, {"x": (1, 2, 3, 4)}, ["y"],
                   {"pads": np.array([0, 1, 0, 0, 0, 1, 0, 0], np.int64)})   # reflect on C
    path = tmp_path / "m.onnx"
    import onnx
    onnx.save(m, str(path))
    proto, model = tmp_path / "o.prototxt", tmp_path / "o.caffemodel"
    with pytest.raises(UnsupportedModelError) as ei:
        to_caffe.onnx2caffe(str(path), str(proto), str(model))
    items = ei.value.items
    assert [(op, name) for op, name, _ in items] == [
        ("Transpose", "transpose_t"), ("Sin", "sin_e"), ("Pad", "pad_y")]
    msg = str(ei.value)
    assert "transpose_t" in msg and "sin_e" in msg and "reflect" in msg and "H and W" in msg
    assert not proto.exists() and not model.exists()


@pytest.mark.parametrize("op", ["Sub", "Add", "Mul", "Div"])
def test_broadcast_of_a_computed_per_image_value_at_batch_1(op):
    """A statistic over C, H, W (PoolFormer's GroupNorm(1), as LayerNorm
    over all axes) is one value at batch 1: carried by the batch axis."""
    m = make_model([node("ReduceMean", ["x"], ["m"], axes=[1, 2, 3], keepdims=1),
                    node("Abs", ["m"], ["am"]),
                    node(op, ["x", "am"], ["y"])], {"x": (1, 4, 3, 5)}, ["y"])
    net = check_onnx(m, inputs={"x": rand(1, 4, 3, 5) + 0.3})
    assert "Bias" in types(net) or "Scale" in types(net)


def test_broadcast_of_one_computed_value_over_a_batch_is_refused():
    m = make_model([node("ReduceMean", ["x"], ["m"], axes=[0, 1, 2, 3], keepdims=1),
                    node("Sub", ["x", "m"], ["y"])], {"x": (2, 4, 3, 5)}, ["y"])
    with pytest.raises(UnsupportedModelError, match="computed scalar"):
        to_caffe.convert(m)
