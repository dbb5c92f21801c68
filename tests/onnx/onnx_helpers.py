"""Shared helpers of the ONNX converter tests: graphs built with
onnx.helper, converted, run in caffe_ocl and in ONNX Runtime."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from caffe_ocl.onnx import check, to_caffe

RNG = np.random.default_rng(1234)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def make_model(nodes, inputs, outputs, inits=None, opset=13, name="t"):
    """inputs: {name: shape}; outputs: [name]; inits: {name: ndarray}."""
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k)
                     for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    import onnx
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    for o, io in zip(m.graph.output, inferred.graph.output):
        if io.type.tensor_type.HasField("shape"):
            o.CopyFrom(io)
    if not all(o.type.tensor_type.HasField("shape") for o in m.graph.output):
        # shape inference cannot see through every Shape chain: ask ORT
        import onnxruntime as ort
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {k: np.zeros(v, np.float32) for k, v in inputs.items()}
        for o, val in zip(m.graph.output, s.run(None, feeds)):
            o.CopyFrom(helper.make_tensor_value_info(o.name, TensorProto.FLOAT, val.shape))
    return m


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def assert_close(report, tol=1e-4):
    assert report, "no outputs compared"
    for name, (diff, scale) in report.items():
        assert diff <= tol * max(scale, 1e-6), (name, diff, scale)


def check_onnx(model, tol=1e-4, inputs=None, layer_types=None):
    """Convert, compare with onnxruntime; returns the NetParameter."""
    net = to_caffe.convert(model)
    report = check.compare(model, net, inputs=inputs)
    assert_close(report, tol)
    if layer_types is not None:
        got = [lp.type for lp in net.layer]
        for t in layer_types:
            assert t in got, (t, got)
    return net


def types(net):
    return [lp.type for lp in net.layer]


class GraphBuilder:
    """Builds ONNX graphs the way torch.onnx.export writes torchvision
    models (random weights, He-scaled so deep stacks keep O(1) values)."""

    def __init__(self, opset=13, seed=0):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.k = [], {}, 0

    def _name(self, p):
        self.k += 1
        return f"{p}_{self.k}"

    def init(self, arr, p="w"):
        n = self._name(p)
        self.inits[n] = np.asarray(arr)
        return n

    def op(self, op, ins, n_out=1, **attrs):
        outs = [self._name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(ins), outs, name=self._name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def randn(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    # layers
    def conv(self, x, cin, cout, k, s=1, p=None, g=1, bias=False):
        p = k // 2 if p is None else p
        w = self.randn(cout, cin // g, k, k, scale=np.sqrt(2.0 / (cin // g * k * k)))
        ins = [x, self.init(w)] + ([self.init(self.randn(cout, scale=0.1), "b")] if bias else [])
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                       group=g, dilations=[1, 1])

    def bn(self, x, c, eps=1e-5):
        r = self.rng
        ins = [x, self.init(r.uniform(0.5, 1.5, c).astype(np.float32), "gamma"),
               self.init(self.randn(c, scale=0.1), "beta"),
               self.init(self.randn(c, scale=0.1), "mean"),
               self.init(r.uniform(0.5, 1.5, c).astype(np.float32), "var")]
        return self.op("BatchNormalization", ins, epsilon=eps, momentum=0.9)

    def cbr(self, x, cin, cout, k, s=1, g=1, act="relu"):
        y = self.bn(self.conv(x, cin, cout, k, s, g=g), cout)
        return self.act(y, act)

    def act(self, x, act):
        if act == "relu":
            return self.op("Relu", [x])
        if act == "relu6":
            return self.clip(x, 0.0, 6.0)
        if act == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if act == "hardswish":
            return self.op("HardSwish", [x])
        return x

    def clip(self, x, lo, hi):
        if self.opset < 11:
            return self.op("Clip", [x], min=lo, max=hi)
        return self.op("Clip", [x, self.init(np.array(lo, np.float32), "min"),
                                self.init(np.array(hi, np.float32), "max")])

    def maxpool(self, x, k, s, p=0, ceil=0):
        extra = dict(ceil_mode=ceil) if (ceil or self.opset >= 10) else {}
        return self.op("MaxPool", [x], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                       **extra)

    def avgpool(self, x, k, s, p=0, ceil=0, cip=0):
        extra = dict(ceil_mode=ceil) if (ceil or self.opset >= 10) else {}
        return self.op("AveragePool", [x], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                       count_include_pad=cip, **extra)

    def gap(self, x):
        return self.op("GlobalAveragePool", [x])

    def add(self, a, b):
        return self.op("Add", [a, b])

    def mul(self, a, b):
        return self.op("Mul", [a, b])

    def concat(self, xs, axis=1):
        return self.op("Concat", xs, axis=axis)

    def unsqueeze(self, x, axes):
        if self.opset < 13:
            return self.op("Unsqueeze", [x], axes=axes)
        return self.op("Unsqueeze", [x, self.init(np.array(axes, np.int64), "axes")])

    def flatten(self, x):                         # torch.flatten(x, 1)
        return self.op("Flatten", [x], axis=1)

    def view_flatten(self, x):                    # x.view(x.size(0), -1)
        shp = self.op("Shape", [x])
        n = self.op("Gather", [shp, self.init(np.array(0, np.int64), "zero")], axis=0)
        n1 = self.unsqueeze(n, [0])
        new = self.op("Concat", [n1, self.init(np.array([-1], np.int64), "m1")], axis=0)
        return self.op("Reshape", [x, new])

    def mean_hw(self, x):                         # x.mean([2, 3])
        if self.opset < 18:
            return self.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
        return self.op("ReduceMean", [x, self.init(np.array([2, 3], np.int64))], keepdims=0)

    def dropout(self, x):
        return self.op("Dropout", [x], ratio=0.5) if self.opset < 12 else self.op("Dropout", [x])

    def gemm(self, x, cin, cout):
        w = self.randn(cout, cin, scale=np.sqrt(1.0 / cin))
        return self.op("Gemm", [x, self.init(w), self.init(self.randn(cout, scale=0.1), "b")],
                       alpha=1.0, beta=1.0, transB=1)

    def split2(self, x, c):                       # x.chunk(2, dim=1)
        if self.opset < 13:
            return self.op("Split", [x], n_out=2, axis=1, split=[c // 2, c // 2])
        return self.op("Split", [x, self.init(np.array([c // 2, c // 2], np.int64))],
                       n_out=2, axis=1)

    def channel_shuffle(self, x, n, c, h, w, groups=2):
        a = self.op("Reshape", [x, self.init(np.array([n, groups, c // groups, h, w],
                                                      np.int64))])
        b = self.op("Transpose", [a], perm=[0, 2, 1, 3, 4])
        return self.op("Reshape", [b, self.init(np.array([n, -1, h, w], np.int64))])

    def model(self, x_shape, out, name="net"):
        m = make_model(self.nodes, {"x": x_shape}, [out], self.inits, opset=self.opset,
                       name=name)
        return m
