"""ONNX -> Caffe at model level: small graphs built with onnx.helper that
repeat the patterns torch.onnx.export writes for the torchvision
classifiers (the layers, attributes and opsets PyTorch uses, at toy widths),
converted and run in caffe_ocl and ONNX Runtime on the same input: largest
difference at most 1e-4 x the output's scale and the same top-5 classes.
Then ONNX -> Caffe -> ONNX round trips, and caffe2onnx of the shipped
(V1) CIFAR-10 quick model."""
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx_helpers import GraphBuilder, assert_close  # noqa: E402

from caffe_ocl.onnx import check, from_caffe, to_caffe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NCLS = 10


# ---------------------------------------------------------------------------
# architectures (toy widths, torchvision structure)
# ---------------------------------------------------------------------------

def alexnet(opset):
    g = GraphBuilder(opset)
    x = g.op("Relu", [g.conv("x", 3, 8, 11, 4, 2, bias=True)])
    x = g.maxpool(x, 3, 2)
    x = g.maxpool(g.op("Relu", [g.conv(x, 8, 12, 5, 1, 2, bias=True)]), 3, 2)
    for cin, cout in ((12, 16), (16, 12), (12, 12)):
        x = g.op("Relu", [g.conv(x, cin, cout, 3, 1, 1, bias=True)])
    x = g.maxpool(x, 3, 2)
    x = g.flatten(x)
    x = g.op("Relu", [g.gemm(g.dropout(x), 12, 24)])
    x = g.op("Relu", [g.gemm(g.dropout(x), 24, 24)])
    return g.model((1, 3, 67, 67), g.gemm(x, 24, NCLS), "alexnet")


def vgg16(opset):
    g = GraphBuilder(opset)
    x, c = "x", 3
    for cout, n in ((8, 2), (12, 2), (16, 3)):
        for _ in range(n):
            x = g.op("Relu", [g.conv(x, c, cout, 3, 1, 1, bias=True)])
            c = cout
        x = g.maxpool(x, 2, 2)
    x = g.view_flatten(x)                    # older torchvision: x.view(x.size(0), -1)
    x = g.dropout(g.op("Relu", [g.gemm(x, 16 * 2 * 2, 32)]))
    return g.model((1, 3, 16, 16), g.gemm(x, 32, NCLS), "vgg16")


def _basic(g, x, cin, cout, s):
    y = g.cbr(x, cin, cout, 3, s)
    y = g.bn(g.conv(y, cout, cout, 3), cout)
    sc = x if (s == 1 and cin == cout) else g.bn(g.conv(x, cin, cout, 1, s), cout)
    return g.op("Relu", [g.add(y, sc)])


def resnet18(opset):
    g = GraphBuilder(opset)
    x = g.maxpool(g.cbr("x", 3, 8, 7, 2), 3, 2, 1)
    x = _basic(g, x, 8, 8, 1)
    x = _basic(g, x, 8, 16, 2)
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 32, 32), g.gemm(x, 16, NCLS), "resnet18")


def _bottleneck(g, x, cin, width, cout, s, groups):
    y = g.cbr(x, cin, width, 1)
    y = g.cbr(y, width, width, 3, s, g=groups)
    y = g.bn(g.conv(y, width, cout, 1), cout)
    sc = x if (s == 1 and cin == cout) else g.bn(g.conv(x, cin, cout, 1, s), cout)
    return g.op("Relu", [g.add(y, sc)])


def _resnet_bottleneck(opset, width_mult, groups, name):
    g = GraphBuilder(opset)
    x = g.maxpool(g.cbr("x", 3, 8, 7, 2), 3, 2, 1)
    w = 4 * width_mult * (groups if groups > 1 else 1)
    x = _bottleneck(g, x, 8, w, 16, 1, groups)
    x = _bottleneck(g, x, 16, w, 16, 1, groups)
    x = _bottleneck(g, x, 16, 2 * w, 32, 2, groups)
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 32, 32), g.gemm(x, 32, NCLS), name)


def resnet50(opset):
    return _resnet_bottleneck(opset, 1, 1, "resnet50")


def resnext50_32x4d(opset):
    return _resnet_bottleneck(opset, 1, 4, "resnext50_32x4d")     # grouped 3x3


def wide_resnet50_2(opset):
    return _resnet_bottleneck(opset, 2, 1, "wide_resnet50_2")


def _fire(g, x, cin, sq, e1, e3):
    s = g.op("Relu", [g.conv(x, cin, sq, 1, bias=True)])
    return g.concat([g.op("Relu", [g.conv(s, sq, e1, 1, bias=True)]),
                     g.op("Relu", [g.conv(s, sq, e3, 3, 1, 1, bias=True)])])


def _squeezenet(opset, version):
    g = GraphBuilder(opset)
    if version == "1_0":
        x = g.maxpool(g.op("Relu", [g.conv("x", 3, 16, 7, 2, 0, bias=True)]), 3, 2, ceil=1)
    else:
        x = g.maxpool(g.op("Relu", [g.conv("x", 3, 16, 3, 2, 0, bias=True)]), 3, 2, ceil=1)
    x = _fire(g, x, 16, 4, 8, 8)
    x = _fire(g, x, 16, 4, 8, 8)
    x = g.maxpool(x, 3, 2, ceil=1)
    x = _fire(g, x, 16, 6, 12, 12)
    x = g.dropout(x)
    x = g.op("Relu", [g.conv(x, 24, NCLS, 1, bias=True)])
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 39, 39), x, "squeezenet" + version)


def squeezenet1_0(opset):
    return _squeezenet(opset, "1_0")


def squeezenet1_1(opset):
    return _squeezenet(opset, "1_1")


def _inverted_residual(g, x, cin, cout, s, t, act="relu6", k=3, se=False):
    hid = cin * t
    y = g.cbr(x, cin, hid, 1, act=act) if t != 1 else x
    y = g.cbr(y, hid, hid, k, s, g=hid, act=act)                 # depthwise
    if se:
        sq = max(1, cin // 4)
        z = g.gap(y)
        z = g.act(g.conv(z, hid, sq, 1, bias=True), act)
        z = g.op("Sigmoid", [g.conv(z, sq, hid, 1, bias=True)])
        y = g.mul(y, z)                                          # SE gate [N,C,1,1]
    y = g.bn(g.conv(y, hid, cout, 1), cout)
    return g.add(x, y) if (s == 1 and cin == cout) else y


def mobilenet_v2(opset):
    g = GraphBuilder(opset)
    x = g.cbr("x", 3, 8, 3, 2, act="relu6")
    x = _inverted_residual(g, x, 8, 8, 1, 1)
    x = _inverted_residual(g, x, 8, 12, 2, 6)
    x = _inverted_residual(g, x, 12, 12, 1, 6)
    x = g.cbr(x, 12, 32, 1, act="relu6")
    x = g.flatten(g.gap(x))                  # adaptive_avg_pool2d((1, 1)) + flatten
    return g.model((1, 3, 32, 32), g.gemm(g.dropout(x), 32, NCLS), "mobilenet_v2")


def efficientnet_b0(opset):
    g = GraphBuilder(opset)
    x = g.cbr("x", 3, 8, 3, 2, act="silu")
    x = _inverted_residual(g, x, 8, 8, 1, 1, act="silu", se=True)
    x = _inverted_residual(g, x, 8, 12, 2, 6, act="silu", k=5, se=True)
    x = _inverted_residual(g, x, 12, 12, 1, 6, act="silu", k=5, se=True)
    x = g.cbr(x, 12, 32, 1, act="silu")
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 32, 32), g.gemm(g.dropout(x), 32, NCLS), "efficientnet_b0")


def regnet_y_400mf(opset):
    g = GraphBuilder(opset)
    x = g.cbr("x", 3, 8, 3, 2)

    def yblock(x, cin, cout, s, gw=4):
        y = g.cbr(x, cin, cout, 1)
        y = g.cbr(y, cout, cout, 3, s, g=cout // gw)
        z = g.op("Relu", [g.conv(g.gap(y), cout, max(1, cin // 4), 1, bias=True)])
        z = g.op("Sigmoid", [g.conv(z, max(1, cin // 4), cout, 1, bias=True)])
        y = g.bn(g.conv(g.mul(y, z), cout, cout, 1), cout)
        sc = x if (s == 1 and cin == cout) else g.bn(g.conv(x, cin, cout, 1, s), cout)
        return g.op("Relu", [g.add(sc, y)])
    x = yblock(x, 8, 16, 2)
    x = yblock(x, 16, 16, 1)
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 32, 32), g.gemm(x, 16, NCLS), "regnet_y_400mf")


def densenet121(opset):
    g = GraphBuilder(opset)
    x = g.maxpool(g.cbr("x", 3, 8, 7, 2), 3, 2, 1)
    c, growth = 8, 4

    def dense_layer(x, c):
        y = g.conv(g.op("Relu", [g.bn(x, c)]), c, 8, 1)
        y = g.conv(g.op("Relu", [g.bn(y, 8)]), 8, growth, 3)
        return g.concat([x, y])
    for _ in range(2):
        x = dense_layer(x, c)
        c += growth
    x = g.conv(g.op("Relu", [g.bn(x, c)]), c, c // 2, 1)       # transition
    c //= 2
    x = g.avgpool(x, 2, 2)
    for _ in range(2):
        x = dense_layer(x, c)
        c += growth
    x = g.op("Relu", [g.bn(x, c)])
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 32, 32), g.gemm(x, c, NCLS), "densenet121")


def googlenet(opset):
    g = GraphBuilder(opset)

    def basic(x, cin, cout, k, s=1):
        return g.op("Relu", [g.bn(g.conv(x, cin, cout, k, s), cout, eps=1e-3)])
    # transform_input: x[:, 0] * (0.229 / 0.5) + (0.485 - 0.5) / 0.5, ...
    chans = []
    for i, (sd, mu) in enumerate(((0.229, 0.485), (0.224, 0.456), (0.225, 0.406))):
        ci = g.op("Gather", ["x", g.init(np.array(i, np.int64), "idx")], axis=1)
        ci = g.unsqueeze(ci, [1])
        ci = g.op("Mul", [ci, g.init(np.array(sd / 0.5, np.float32), "s")])
        chans.append(g.op("Add", [ci, g.init(np.array((mu - 0.5) / 0.5, np.float32), "t")]))
    x = g.concat(chans)
    x = g.maxpool(basic(x, 3, 8, 7, 2), 3, 2, ceil=1)
    x = g.maxpool(basic(basic(x, 8, 8, 1), 8, 12, 3), 3, 2, ceil=1)

    def inception(x, cin, c1, c3r, c3, c5r, c5, pp):
        b1 = basic(x, cin, c1, 1)
        b2 = basic(basic(x, cin, c3r, 1), c3r, c3, 3)
        b3 = basic(basic(x, cin, c5r, 1), c5r, c5, 3)
        b4 = basic(g.maxpool(x, 3, 1, 1, ceil=1), cin, pp, 1)
        return g.concat([b1, b2, b3, b4])
    x = inception(x, 12, 4, 4, 6, 2, 3, 3)
    x = g.maxpool(x, 3, 2, ceil=1)
    x = inception(x, 16, 4, 4, 6, 2, 3, 3)
    x = g.flatten(g.gap(x))
    return g.model((1, 3, 40, 40), g.gemm(g.dropout(x), 16, NCLS), "googlenet")


def shufflenet_v2(opset):
    g = GraphBuilder(opset)
    x = g.maxpool(g.cbr("x", 3, 8, 3, 2), 3, 2, 1)            # 8 x 8 x 8

    def block2(x, cin, cout, h):                               # stride 2
        bf = cout // 2
        b1 = g.bn(g.conv(x, cin, cin, 3, 2, g=cin), cin)
        b1 = g.cbr(b1, cin, bf, 1)
        b2 = g.cbr(x, cin, bf, 1)
        b2 = g.bn(g.conv(b2, bf, bf, 3, 2, g=bf), bf)
        b2 = g.cbr(b2, bf, bf, 1)
        return g.channel_shuffle(g.concat([b1, b2]), 1, cout, h, h)

    def block1(x, c, h):                                       # stride 1
        x1, x2 = g.split2(x, c)
        bf = c // 2
        b2 = g.cbr(x2, bf, bf, 1)
        b2 = g.bn(g.conv(b2, bf, bf, 3, 1, g=bf), bf)
        b2 = g.cbr(b2, bf, bf, 1)
        return g.channel_shuffle(g.concat([x1, b2]), 1, c, h, h)
    x = block2(x, 8, 16, 4)
    x = block1(x, 16, 4)
    x = g.cbr(x, 16, 32, 1)
    x = g.mean_hw(x)
    return g.model((1, 3, 32, 32), g.gemm(x, 32, NCLS), "shufflenet_v2")


MODELS = [  # (builder, opset): PyTorch's exports span opsets 9-17
    (alexnet, 9), (vgg16, 11), (resnet18, 9), (resnet50, 13), (resnext50_32x4d, 17),
    (wide_resnet50_2, 12), (squeezenet1_0, 10), (squeezenet1_1, 13), (mobilenet_v2, 11),
    (densenet121, 14), (efficientnet_b0, 13), (regnet_y_400mf, 15), (googlenet, 13),
    (shufflenet_v2, 13),
]


def _ort(model, x):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _top5(v):
    return set(np.argsort(-v.ravel())[:5].tolist())


@pytest.fixture(scope="module")
def converted():
    """(model, net, input) per architecture, converted once for all tests."""
    out = {}
    for build, opset in MODELS:
        m = build(opset)
        onnx.checker.check_model(m)
        net = to_caffe.convert(m)
        shape = tuple(net.layer[0].input_param.shape[0].dim)
        x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
        out[build.__name__] = (m, net, x)
    return out


@pytest.mark.parametrize("name", [b.__name__ for b, _ in MODELS])
def test_model_matches_onnxruntime(converted, name):
    m, net, x = converted[name]
    ref = _ort(m, x)
    got = check.run_caffe(net, {"x": x}, [m.graph.output[0].name])[m.graph.output[0].name]
    got = got.reshape(ref.shape)
    diff, scale = float(np.max(np.abs(got - ref))), float(np.max(np.abs(ref)))
    assert diff <= 1e-4 * scale, (diff, scale)
    assert _top5(got) == _top5(ref)


def test_layer_choices(converted):
    def types(name):
        return [lp.type for lp in converted[name][1].layer]
    assert "ReLU" in types("resnet18") and "BatchNorm" in types("resnet18")
    assert "Clip" in types("mobilenet_v2")
    assert "Concat" in types("squeezenet1_0") and "Concat" in types("densenet121")
    # SE gate: Scale with two bottoms
    se = [lp for lp in converted["efficientnet_b0"][1].layer
          if lp.type == "Scale" and len(lp.bottom) == 2]
    assert se
    # shuffle: 1x1 permutation convolutions, chunk: Slice
    assert "Slice" in types("shufflenet_v2")
    shufflenet_perm = [lp for lp in converted["shufflenet_v2"][1].layer
                       if lp.name.endswith("_permute")]
    assert len(shufflenet_perm) == 2
    # ... which a solver must not train: PyTorch's channel shuffle has no weights
    assert all([(ps.lr_mult, ps.decay_mult) for ps in lp.param] == [(0.0, 0.0)]
               for lp in shufflenet_perm)
    # googlenet ceil pooling keeps Caffe's CEIL; densenet's floor pooling uses
    # FLOOR where CEIL would give another window (the 3 x 3 stride-2 max
    # pooling), and leaves the field out where both agree (the transition's
    # 2 x 2 stride-2 average on an even plane), as OpenCV reads field 13 as
    # another one
    pools = [lp.pooling_param for lp in converted["densenet121"][1].layer
             if lp.type == "Pooling" and not lp.pooling_param.global_pooling]
    maxes = [p for p in pools if p.pool == p.MAX]
    aves = [p for p in pools if p.pool == p.AVE]
    assert maxes and all(p.round_mode == p.FLOOR for p in maxes)
    assert aves and not any(p.HasField("round_mode") for p in aves)
    # the Shape->Gather->Unsqueeze->Concat->Reshape chain became one Flatten
    assert types("vgg16").count("Flatten") == 1


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "efficientnet_b0",
                                  "googlenet", "shufflenet_v2", "squeezenet1_1",
                                  "densenet121"])
def test_round_trip_onnx_caffe_onnx(converted, name):
    m, net, x = converted[name]
    back = from_caffe.export(net)
    onnx.checker.check_model(back)
    a, b = _ort(m, x), _ort(back, x)
    assert_close({"y": (float(np.max(np.abs(a - b.reshape(a.shape)))),
                        float(np.max(np.abs(a))))})


def test_caffe2onnx_cifar10_quick_v1(tmp_path):
    proto = os.path.join(ROOT, "models", "cifar10_quick", "cifar10_quick.prototxt")
    weights = os.path.join(ROOT, "models", "cifar10_quick", "cifar10_quick_iter_5000.caffemodel")
    from caffe_ocl.proto import caffe_pb2
    raw = caffe_pb2.NetParameter()
    with open(weights, "rb") as f:
        raw.ParseFromString(f.read())
    assert len(raw.layers) and not len(raw.layer)          # a legacy V1 file
    out = tmp_path / "cifar.onnx"
    from caffe_ocl.commands import main
    assert main(["caffe2onnx", proto, weights, str(out)]) == 0
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    import caffe_ocl
    net = caffe_ocl.Net(proto, caffe_ocl.TEST, weights=weights)
    x = np.random.default_rng(3).uniform(-100, 100, (1, 3, 32, 32)).astype(np.float32)
    net.blobs["data"].data[...] = x
    want = net.forward()["prob"].copy()
    got = _ort(m, x)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))
    assert _top5(got) == _top5(want)


CAFFE_NET = """
name: "layers"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "lrelu" type: "ReLU" bottom: "conv" top: "conv" relu_param { negative_slope: 0.1 } }
layer { name: "ave" type: "Pooling" bottom: "conv" top: "ave"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "max" type: "Pooling" bottom: "conv" top: "max"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 round_mode: FLOOR } }
layer { name: "prelu" type: "PReLU" bottom: "max" top: "prelu" }
layer { name: "pow" type: "Power" bottom: "prelu" top: "pow"
  power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "sum" type: "Eltwise" bottom: "pow" bottom: "ave" top: "sum"
  eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "deconv" type: "Deconvolution" bottom: "sum" top: "deconv"
  convolution_param { num_output: 2 kernel_size: 2 stride: 2 group: 2 } }
layer { name: "slice" type: "Slice" bottom: "deconv" top: "s0" top: "s1"
  slice_param { axis: 1 slice_point: 1 } }
layer { name: "exp" type: "Exp" bottom: "s0" top: "exp" exp_param { base: 2 scale: 0.5 } }
layer { name: "log" type: "Log" bottom: "exp" top: "log" log_param { base: 10 shift: 1 } }
layer { name: "elu" type: "ELU" bottom: "s1" top: "elu" }
layer { name: "swish" type: "Swish" bottom: "elu" top: "swish" swish_param { beta: 1.5 } }
layer { name: "cat" type: "Concat" bottom: "swish" bottom: "log" top: "cat" }
layer { name: "clip" type: "Clip" bottom: "cat" top: "clip" clip_param { min: -0.5 max: 2 } }
layer { name: "bias" type: "Bias" bottom: "clip" top: "bias" bias_param { axis: 1 num_axes: 1 } }
layer { name: "resh" type: "Reshape" bottom: "bias" top: "resh"
  reshape_param { shape { dim: 0 dim: -1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "resh" top: "ip"
  inner_product_param { num_output: 5 } }
layer { name: "tanh" type: "TanH" bottom: "ip" top: "tanh" }
layer { name: "prob" type: "Softmax" bottom: "tanh" top: "prob" }
"""


def test_caffe2onnx_layer_mappings():
    import caffe_ocl
    from caffe_ocl.proto import parse_net_text
    param = parse_net_text(CAFFE_NET)
    net = caffe_ocl.Net(param, caffe_ocl.TEST)
    rng = np.random.default_rng(5)
    for name, blobs in net.params.items():
        for i, b in enumerate(blobs):
            b.data[...] = rng.standard_normal(b.data.shape).astype(np.float32)
    net.params["bn"][1].data[...] = rng.uniform(0.5, 1.5, net.params["bn"][1].data.shape)
    net.params["bn"][2].data[...] = 2.0                 # the scale factor is honoured
    model = from_caffe.export(param, net.to_proto())
    onnx.checker.check_model(model, full_check=True)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    net.blobs["data"].data[...] = x
    outs = net.forward()
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    assert set(names) == set(outs)
    for n, v in zip(names, s.run(None, {"data": x})):
        assert np.max(np.abs(v - outs[n])) <= 1e-4 * np.max(np.abs(outs[n])), n


def test_cli_onnx2caffe_check_and_load(tmp_path, capsys):
    import caffe_ocl
    from caffe_ocl.commands import main
    m = resnet18(13)
    path = tmp_path / "r.onnx"
    onnx.save(m, str(path))
    proto, weights = tmp_path / "r.prototxt", tmp_path / "r.caffemodel"
    assert main(["onnx2caffe", str(path), str(proto), str(weights), "--check"]) == 0
    out = capsys.readouterr().out
    assert "max |caffe_ocl - onnxruntime|" in out
    rel = float(out.strip().rsplit("relative", 1)[1].strip(" )"))
    assert rel <= 1e-4
    # the files alone load in caffe_ocl (no blobs in the prototxt)
    assert "blobs" not in proto.read_text()
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST, weights=str(weights))
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    net.blobs["x"].data[...] = x
    got = net.forward()[m.graph.output[0].name]
    ref = _ort(m, x)
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_cli_unsupported_prints_one_error(tmp_path, capsys):
    from onnx_helpers import make_model, node
    from caffe_ocl.commands import main
    m = make_model([node("Relu", ["x"], ["r"]), node("Sin", ["r"], ["e"]),
                    node("Cos", ["e"], ["y"])], {"x": (1, 2)}, ["y"], opset=20)
    path = tmp_path / "bad.onnx"
    onnx.save(m, str(path))
    proto, weights = tmp_path / "b.prototxt", tmp_path / "b.caffemodel"
    assert main(["onnx2caffe", str(path), str(proto), str(weights)]) == 1
    err = capsys.readouterr().err
    assert "2 unsupported ONNX node(s)" in err and "Sin" in err and "Cos" in err
    assert not proto.exists() and not weights.exists()


def test_cli_caffe2onnx_check(tmp_path, capsys):
    from caffe_ocl.commands import main
    proto = os.path.join(ROOT, "models", "cifar10_quick", "cifar10_quick.prototxt")
    weights = os.path.join(ROOT, "models", "cifar10_quick", "cifar10_quick_iter_5000.caffemodel")
    assert main(["caffe2onnx", proto, weights, str(tmp_path / "c.onnx"), "--check"]) == 0
    assert "prob: max |caffe_ocl - onnxruntime|" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# caffe2onnx on nets caffe_ocl rejects: the net is built as caffe_ocl.Net
# first, so each ends in that one-line error naming the file and layer (not
# a traceback, not an ONNX file with a wrong graph) and nothing is written
# ---------------------------------------------------------------------------

C2O_BASE = """
name: "c2o"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 3 pad: 1 group: 2 } }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true axis: 1 num_axes: 1 } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip" inner_product_param { num_output: 3 axis: 1 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


@pytest.fixture
def c2o_files(tmp_path):
    import caffe_ocl
    proto = tmp_path / "base.prototxt"
    proto.write_text(C2O_BASE)
    weights = tmp_path / "base.caffemodel"
    caffe_ocl.Net(str(proto), caffe_ocl.TEST).save(str(weights))
    return tmp_path, weights


def _c2o_one_line_error(capsys):
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    assert lines[0].startswith("caffe_ocl caffe2onnx: error: ")
    return lines[0]


def test_caffe2onnx_base_net_exports(c2o_files):
    from caffe_ocl.commands import main
    d, weights = c2o_files
    assert main(["caffe2onnx", str(d / "base.prototxt"), str(weights), str(d / "o.onnx")]) == 0
    onnx.checker.check_model(onnx.load(str(d / "o.onnx")), full_check=True)


@pytest.mark.parametrize("old,new,layer,in_weights", [
    # were tracebacks (a ValueError reshaping the weights, ZeroDivisionError)
    ("num_output: 2 kernel_size", "num_output: 0 kernel_size", "conv", False),
    ("kernel_size: 3 stride: 2", "kernel_size: 3 stride: 0", "pool", False),
    ("num_output: 3 axis: 1", "num_output: 4 axis: 1", "ip", True),
    # was an onnx.checker ValidationError traceback (an empty spatial axis)
    ("dim: 1 dim: 2 dim: 6 dim: 6", "dim: 1 dim: 2 dim: 0 dim: 6", "conv", False),
    # were written with a wrong graph (exit 0): ONNX group=0, an IP axis
    # wrapped modulo the rank, a scalar Scale exported per channel
    ("group: 2 }", "group: 0 }", "conv", False),
    ("num_output: 3 axis: 1", "num_output: 3 axis: 7", "ip", False),
    ("axis: 1 num_axes: 1", "axis: 1 num_axes: 0", "sc", True),
])
def test_caffe2onnx_rejects_what_caffe_ocl_rejects(c2o_files, capsys, old, new, layer,
                                                   in_weights):
    from caffe_ocl.commands import main
    d, weights = c2o_files
    assert old in C2O_BASE
    proto = d / "bad.prototxt"
    proto.write_text(C2O_BASE.replace(old, new, 1))
    out = d / "bad.onnx"
    assert main(["caffe2onnx", str(proto), str(weights), str(out)]) == 1
    line = _c2o_one_line_error(capsys)
    assert f"'{layer}'" in line
    assert str(weights if in_weights else proto) in line
    assert not out.exists()


def test_caffe2onnx_unmapped_types_listed_before_the_net_is_built(c2o_files, capsys):
    """A train prototxt: its Data layer (whose source does not exist) and
    loss are reported as unsupported, as before; the net is not built."""
    from caffe_ocl.commands import main
    d, weights = c2o_files
    proto = d / "train.prototxt"
    proto.write_text(C2O_BASE.replace(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 '
        'dim: 6 dim: 6 } } }',
        'layer { name: "data" type: "Data" top: "data" top: "label" '
        'data_param { source: "no_such_lmdb" batch_size: 1 backend: LMDB } }')
        + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" '
          'top: "loss" }\n')
    assert main(["caffe2onnx", str(proto), str(weights), str(d / "t.onnx")]) == 1
    line = _c2o_one_line_error(capsys)
    assert "2 unsupported Caffe layer(s)" in line
    assert "Data 'data'" in line and "SoftmaxWithLoss 'loss'" in line
    assert not (d / "t.onnx").exists()


def test_caffe2onnx_nd_convolution_is_unsupported(tmp_path, capsys):
    """caffe_ocl runs a 1-D convolution; its ONNX export is 2-D only."""
    import caffe_ocl
    from caffe_ocl.commands import main
    proto = tmp_path / "nd.prototxt"
    proto.write_text('layer { name: "data" type: "Input" top: "data" '
                     'input_param { shape { dim: 1 dim: 2 dim: 8 } } }\n'
                     'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
                     'convolution_param { num_output: 2 kernel_size: 3 } }\n')
    weights = tmp_path / "nd.caffemodel"
    caffe_ocl.Net(str(proto), caffe_ocl.TEST).save(str(weights))
    assert main(["caffe2onnx", str(proto), str(weights), str(tmp_path / "nd.onnx")]) == 1
    line = _c2o_one_line_error(capsys)
    assert "Convolution 'conv': only 2-D convolution" in line


def test_caffe2onnx_checker_failure_names_the_output(c2o_files, capsys, monkeypatch):
    """A graph onnx.checker rejects (simulated: an attribute Relu does not
    have) is one line naming the .onnx file, which is not written."""
    from caffe_ocl.commands import main
    d, weights = c2o_files
    proto = d / "relu.prototxt"
    proto.write_text(C2O_BASE + 'layer { name: "relu" type: "ReLU" bottom: "prob" '
                                'top: "prob" }\n')
    monkeypatch.setattr(from_caffe.Exporter, "l_ReLU",
                        lambda self, lp, b, t: self.add("Relu", b, t, bogus=1))
    out = d / "relu.onnx"
    assert main(["caffe2onnx", str(proto), str(weights), str(out)]) == 1
    line = _c2o_one_line_error(capsys)
    assert str(out) in line and "onnx.checker" in line
    assert not out.exists()


def test_caffe2onnx_dropout_and_batchnorm_at_test_as_caffe_ocl_runs_them():
    """Dropout with scale_train: false multiplies by 1 - ratio at TEST (was
    exported as Identity); BatchNorm with use_global_stats: false uses each
    batch's statistics at TEST, which ONNX BatchNormalization-13 cannot:
    reported, not exported with the stored ones."""
    import caffe_ocl
    from caffe_ocl.onnx import UnsupportedModelError
    from caffe_ocl.proto import parse_net_text
    head = ('layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 2 dim: 3 } } }\n')
    param = parse_net_text(head + 'layer { name: "drop" type: "Dropout" bottom: "data" '
                           'top: "y" dropout_param { dropout_ratio: 0.25 scale_train: false } }')
    net = caffe_ocl.Net(param, caffe_ocl.TEST)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    net.blobs["data"].data[...] = x
    want = net.forward()["y"].copy()
    assert np.allclose(want, 0.75 * x)
    got = _ort(from_caffe.export(param), x)
    assert np.allclose(got, want)
    param = parse_net_text(head + 'layer { name: "bn" type: "BatchNorm" bottom: "data" '
                           'top: "y" batch_norm_param { use_global_stats: false } }')
    weights = caffe_ocl.Net(param, caffe_ocl.TEST).to_proto()
    with pytest.raises(UnsupportedModelError, match="BatchNorm 'bn': use_global_stats"):
        from_caffe.export(param, weights)


def test_caffe2onnx_check_onnxruntime_refusal_is_one_line(tmp_path, capsys):
    """A valid export that onnxruntime refuses to load (its LRN requires
    alpha > 0; Caffe's does not) ends --check in one line naming the file."""
    import caffe_ocl
    from caffe_ocl.commands import main
    proto = tmp_path / "lrn.prototxt"
    proto.write_text('layer { name: "data" type: "Input" top: "data" '
                     'input_param { shape { dim: 1 dim: 3 dim: 2 dim: 2 } } }\n'
                     'layer { name: "lrn" type: "LRN" bottom: "data" top: "y" '
                     'lrn_param { local_size: 3 alpha: 0 beta: 0.75 } }\n')
    weights = tmp_path / "lrn.caffemodel"
    caffe_ocl.Net(str(proto), caffe_ocl.TEST).save(str(weights))
    out = tmp_path / "lrn.onnx"
    assert main(["caffe2onnx", str(proto), str(weights), str(out), "--check"]) == 1
    line = _c2o_one_line_error(capsys)
    assert f"{out}: written, but --check failed: onnxruntime cannot load the model" in line
