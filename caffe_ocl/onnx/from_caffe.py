"""Caffe -> ONNX: ``export(net, weights=None) -> onnx.ModelProto`` and the
``caffe_ocl caffe2onnx NET.prototxt WEIGHTS.caffemodel OUT.onnx`` command.

The net is read as Caffe reads it (V0/V1 prototxts and caffemodels are
upgraded), filtered for the TEST phase, and written with ONNX opset 13.
In-place Caffe blobs get one ONNX tensor per write (``blob/layer``); the last
write keeps the Caffe blob name, so graph outputs are named as Caffe's.

Caffe pooling is exported exactly: the ONNX pooling uses floor mode with an
explicit trailing pad chosen so the window count equals Caffe's (ceil or
floor, including the dropped last window), and an average whose Caffe
divisor differs from ONNX's is followed by a Mul with a constant per-window
correction. BatchNorm becomes BatchNormalization (scale 1, bias 0, statistics
divided by the stored scale factor); Scale/Bias become Mul/Add with the blob
reshaped to broadcast; Power/Exp/Log become Mul/Add/Pow/Exp/Log.

Before anything is exported the net is built as ``caffe_ocl.Net`` (TEST,
the weights copied in; nothing runs), so a net caffe_ocl rejects -- a layer
parameter out of range, a bottom shape a layer cannot take, weights that do
not fit the net -- ends in that one-line error naming the file and layer,
and the exporter works from the shapes and weights caffe_ocl would run.
Layer types without a mapping are reported first (their layers are never
built: no data source is opened, no Python layer imported).
"""
import logging
import math
import os
import sys
from contextlib import nullcontext

import numpy as np

from ..errors import FileNotFound, LayerError, naming
from ..net import Net, filter_net
from ..proto import caffe_pb2, read_net, read_net_prototxt, upgrade_net, write_binary
from .check import compare, format_report
from ._common import (OnnxConversionError, Unsupported, UnsupportedModelError,
                      caffe_divisor_2d, caffe_hw, caffe_pool_outs, onnx_divisor_2d,
                      onnx_pads, per_axis)
from ._graph import infer_shapes_isolated

log = logging.getLogger("caffe_ocl")
OPSET = 13
PP = caffe_pb2.PoolingParameter


class InvalidOnnxModel(OnnxConversionError):
    """The exported graph fails onnx.checker (nothing is written)."""


def _axis(axis, rank, what="axis"):
    """Caffe's CanonicalAxisIndex: ``axis`` in [-rank, rank) -> [0, rank)."""
    if not -rank <= axis < rank:
        raise LayerError(f"{what} {axis} out of range for a {rank}-D bottom")
    return axis % rank


class Exporter:
    def __init__(self, net, weights, opset=OPSET):
        from onnx import helper
        self.h = helper
        self.net = net
        self.weights = weights
        self.opset = opset
        self.nodes = []
        self.inits = {}
        self.inputs = []
        self.cur = {}
        self.names = set()
        self.unsupported = []
        self._shapes = {}
        self._shapes_at = -1
        self.lp = None

    # ---- bookkeeping -------------------------------------------------------
    def uniq(self, base):
        name, k = base, 1
        while name in self.names:
            name = f"{base}_{k}"
            k += 1
        self.names.add(name)
        return name

    def const(self, base, arr, dtype=np.float32):
        name = self.uniq(f"{self.lp.name}/{base}" if self.lp is not None else base)
        self.inits[name] = np.asarray(arr, dtype)
        return name

    def add(self, op, ins, outs=None, suffix="", **attrs):
        if outs is None:
            outs = [self.uniq(f"{self.lp.name}/{op.lower()}")]
        nm = self.lp.name + (f"/{suffix}" if suffix else "")
        self.nodes.append(self.h.make_node(op, list(ins), list(outs),
                                           name=self.uniq("node:" + nm)[5:], **attrs))
        return outs[0] if len(outs) == 1 else outs

    def shape(self, name):
        if name in self._shapes and self._shapes_at == len(self.nodes):
            return self._shapes[name]
        import onnx
        h = self.h
        vis = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in self.inputs]
        vis += [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                for n, a in self.inits.items() if a.size > 64]
        small = [onnx.numpy_helper.from_array(a, n) for n, a in self.inits.items()
                 if a.size <= 64]
        g = h.make_graph(self.nodes, "s", vis, [], initializer=small)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", self.opset)])
        m.ir_version = 8
        m = infer_shapes_isolated(m)     # onnx's C++ may abort on a bad graph
        self._shapes = {n: tuple(s) for n, s in self.inputs}
        for vi in m.graph.value_info:
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                self._shapes[vi.name] = tuple(d.dim_value for d in dims)
        self._shapes_at = len(self.nodes)
        if name not in self._shapes:
            raise Unsupported(f"cannot infer the shape of {name!r}")
        return self._shapes[name]

    def blobs(self, n=None):
        arrs = self.weights.get(self.lp.name, [])
        if n is not None and len(arrs) < n:
            raise Unsupported(f"needs {n} weight blob(s), the weights have {len(arrs)} "
                              "(no caffemodel, or a layer name that is not in it)")
        return arrs

    # ---- driver ------------------------------------------------------------
    def run(self):
        layers = list(self.net.layer)
        last_write = {}
        for i, lp in enumerate(layers):
            for t in lp.top:
                last_write[t] = i
        available = []
        for i, lp in enumerate(layers):
            self.lp = lp
            try:
                bottoms = []
                for b in lp.bottom:
                    if b not in self.cur:
                        raise Unsupported(f"unknown bottom blob {b!r}")
                    bottoms.append(self.cur[b])
                tops = []
                for t in lp.top:
                    nm = t if last_write[t] == i else f"{t}/{lp.name}"
                    if nm in self.names:
                        nm = self.uniq(nm)
                    self.names.add(nm)
                    tops.append(nm)
                handler = getattr(self, "l_" + lp.type, None)
                if handler is None:
                    raise Unsupported("no ONNX mapping for this layer type")
                self._call(handler, lp, bottoms, tops)
            except Unsupported as e:
                self.unsupported.append((lp.type, lp.name, e.reason))
                tops = [f"{t}/{lp.name}" for t in lp.top]
            for b in lp.bottom:
                if b in available:
                    available.remove(b)
            for t, nm in zip(lp.top, tops):
                self.cur[t] = nm
                if t not in available:
                    available.append(t)
        if self.unsupported:
            raise UnsupportedModelError(self.unsupported, what="Caffe layer")
        return self._model(available)

    def _call(self, handler, lp, bottoms, tops):
        """Run one layer's handler; any error it meets (a caffe_ocl error, an
        absurd value's arithmetic, host memory) is one line naming the layer.
        Unsupported passes through to be collected."""
        where = f"layer {lp.name!r} ({lp.type})"
        try:
            with naming(where, f"{lp.name!r}"):
                handler(lp, bottoms, tops)
        except (ValueError, IndexError) as e:
            raise OnnxConversionError(f"{where}: cannot export it: "
                                      f"{' '.join(str(e).split())}") from None

    def _model(self, outputs):
        import onnx
        h = self.h
        ins = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in self.inputs]
        outs = [h.make_tensor_value_info(self.cur[o], onnx.TensorProto.FLOAT, None)
                for o in outputs]
        inits = [onnx.numpy_helper.from_array(a, n) for n, a in self.inits.items()]
        g = h.make_graph(self.nodes, self.net.name or "caffe_net", ins, outs, initializer=inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", self.opset)],
                         producer_name="caffe_ocl")
        m.ir_version = 8
        try:
            m = onnx.shape_inference.infer_shapes(m)
            onnx.checker.check_model(m)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
                ValueError) as e:       # ValueError: a model over protobuf's 2 GB
            raise InvalidOnnxModel("the exported model fails onnx.checker: "
                                   + " ".join(str(e).split())[:500]) from None
        return m

    # ---- layers ------------------------------------------------------------
    def l_Input(self, lp, b, t):
        shapes = list(lp.input_param.shape)
        for i, name in enumerate(t):
            s = shapes[i if len(shapes) > 1 else 0]
            self.inputs.append((name, tuple(int(d) for d in s.dim)))

    def l_Convolution(self, lp, b, t, reverse=False):
        p = lp.convolution_param
        if p.axis != 1:
            raise Unsupported("convolution axis other than 1")
        k = caffe_hw(p, "kernel_size", None)
        pad = caffe_hw(p, "pad", 0)
        st = caffe_hw(p, "stride", 1)
        dil = per_axis(p.dilation, 0, 0, False, 1)
        if None in k or len(p.kernel_size) > 2:
            raise Unsupported("only 2-D convolution")
        g = p.group
        arrs = self.blobs(1 + int(p.bias_term))
        w = arrs[0]
        o = p.num_output
        if w.ndim != 4:     # the net's weight shape: 2 + its spatial axes
            raise Unsupported("only 2-D convolution")
        if o <= 0 or g <= 0 or o % g:
            raise LayerError(f"num_output {o} and group {g} must be positive, num_output a "
                             "multiple of group")
        if reverse:
            w = w.reshape(-1, o // g, k[0], k[1])
        else:
            w = w.reshape(o, -1, k[0], k[1])
        ins = [None, self.const("W", w)]
        if p.bias_term:
            ins.append(self.const("B", arrs[1].reshape(-1)))
        for x, y in zip(b, t):
            ins[0] = x
            self.add("ConvTranspose" if reverse else "Conv", ins, [y], kernel_shape=k,
                     pads=onnx_pads(pad, pad), strides=st, dilations=dil, group=g)

    def l_Deconvolution(self, lp, b, t):
        self.l_Convolution(lp, b, t, reverse=True)

    def l_InnerProduct(self, lp, b, t):
        p = lp.inner_product_param
        arrs = self.blobs(1 + int(p.bias_term))
        n = p.num_output
        w = arrs[0].reshape(-1, n) if p.transpose else arrs[0].reshape(n, -1)
        rank = len(self.shape(b[0]))
        axis = _axis(p.axis, rank)
        bias = arrs[1].reshape(-1) if p.bias_term else None
        if axis == 1:
            x = b[0] if rank == 2 else self.add("Flatten", [b[0]], axis=1)
            ins = [x, self.const("W", w)] + ([self.const("B", bias)] if bias is not None else [])
            self.add("Gemm", ins, [t[0]], transB=0 if p.transpose else 1)
            return
        x = self.add("Reshape", [b[0], self.const("shape", [0] * axis + [-1], np.int64)])
        wt = w if p.transpose else w.T
        if bias is None:
            self.add("MatMul", [x, self.const("W", wt)], [t[0]])
        else:
            m = self.add("MatMul", [x, self.const("W", wt)])
            self.add("Add", [m, self.const("B", bias)], [t[0]])

    def l_Pooling(self, lp, b, t):
        p = lp.pooling_param
        if p.pool == PP.STOCHASTIC:
            raise Unsupported("STOCHASTIC pooling has no ONNX equivalent")
        if len(t) > 1:
            raise Unsupported("the argmax mask top has no ONNX equivalent")
        if p.global_pooling:
            self.add("GlobalMaxPool" if p.pool == PP.MAX else "GlobalAveragePool", b, t)
            return
        k = caffe_hw(p, "kernel_size")
        pad = caffe_hw(p, "pad")
        st = caffe_hw(p, "stride")
        ceil = p.round_mode == PP.CEIL
        shape = self.shape(b[0])
        H = shape[2:]
        outs = caffe_pool_outs(H, k, st, pad, ceil)
        # floor mode, trailing pad chosen so the window count is Caffe's
        pe = [max((outs[i] - 1) * st[i] + k[i] - H[i] - pad[i], 0) for i in range(2)]
        pads = onnx_pads(pad, pe)
        if p.pool == PP.MAX:
            self.add("MaxPool", b, t, kernel_shape=k, strides=st, pads=pads)
            return
        dc = caffe_divisor_2d(H, k, st, pad, outs)
        for cip in (1, 0):
            do = onnx_divisor_2d(H, k, st, list(zip(pad, pe)), outs, cip)
            if np.array_equal(do, dc):
                fix = None
                break
        else:   # count_include_pad 0, corrected per window
            fix = (do / dc).astype(np.float32).reshape(1, 1, *outs)
        y = t[0] if fix is None else None
        r = self.add("AveragePool", b, [y] if y else None, kernel_shape=k, strides=st,
                     pads=pads, count_include_pad=cip)
        if fix is not None:
            self.add("Mul", [r, self.const("divisor_fix", fix)], t, suffix="divisor")

    def _act(self, op, b, t, **attrs):
        self.add(op, b, t, **attrs)

    def l_ReLU(self, lp, b, t):
        s = lp.relu_param.negative_slope
        if s:
            self._act("LeakyRelu", b, t, alpha=s)
        else:
            self._act("Relu", b, t)

    def l_Sigmoid(self, lp, b, t):
        self._act("Sigmoid", b, t)

    def l_TanH(self, lp, b, t):
        self._act("Tanh", b, t)

    def l_AbsVal(self, lp, b, t):
        self._act("Abs", b, t)

    def l_BNLL(self, lp, b, t):
        self._act("Softplus", b, t)

    def l_ELU(self, lp, b, t):
        self._act("Elu", b, t, alpha=lp.elu_param.alpha)

    def l_Dropout(self, lp, b, t):
        p = lp.dropout_param
        if p.sample_weights_test:
            raise Unsupported("sample_weights_test (a random mask at TEST) has no "
                              "deterministic ONNX equivalent")
        if p.scale_train:
            self._act("Identity", b, t)
        else:   # survivors unscaled in TRAIN: TEST multiplies by 1 - ratio
            self.add("Mul", [b[0], self.const("scale", np.float32(1.0 - p.dropout_ratio))], t)

    def l_Split(self, lp, b, t):
        for y in t:
            self.add("Identity", b, [y])

    def l_Silence(self, lp, b, t):
        pass

    def l_PReLU(self, lp, b, t):
        slope = self.blobs(1)[0].reshape(-1)
        rank = len(self.shape(b[0]))
        if lp.prelu_param.channel_shared:
            s = slope.reshape(1)
        else:
            s = slope.reshape((-1,) + (1,) * (rank - 2))
        self.add("PRelu", [b[0], self.const("slope", s)], t)

    def _clip(self, b, t, lo, hi):
        self.add("Clip", [b[0], self.const("min", np.float32(lo)),
                          self.const("max", np.float32(hi))], t)

    def l_Clip(self, lp, b, t):
        self._clip(b, t, lp.clip_param.min, lp.clip_param.max)

    def l_ReLU6(self, lp, b, t):
        self._clip(b, t, 0.0, 6.0)

    def l_Swish(self, lp, b, t):
        beta = lp.swish_param.beta
        x = b[0]
        z = x if beta == 1 else self.add("Mul", [x, self.const("beta", np.float32(beta))])
        s = self.add("Sigmoid", [z])
        self.add("Mul", [x, s], t)

    def _affine(self, x, scale, shift, out=None):
        """scale * x + shift with scalar constants, skipping identities."""
        if scale != 1.0:
            x = self.add("Mul", [x, self.const("scale", np.float32(scale))],
                         [out] if out and shift == 0.0 else None, suffix="scale")
        if shift != 0.0:
            x = self.add("Add", [x, self.const("shift", np.float32(shift))],
                         [out] if out else None, suffix="shift")
        return x

    def l_Power(self, lp, b, t):
        p = lp.power_param
        if p.power == 1.0:
            y = self._affine(b[0], p.scale, p.shift, t[0])
            if y != t[0]:
                self.add("Identity", [y], t)
            return
        y = self._affine(b[0], p.scale, p.shift)
        self.add("Pow", [y, self.const("power", np.float32(p.power))], t)

    def l_Exp(self, lp, b, t):
        p = lp.exp_param
        lb = 1.0 if p.base == -1 else math.log(p.base)
        y = self._affine(b[0], lb * p.scale, lb * p.shift)
        self.add("Exp", [y], t)

    def l_Log(self, lp, b, t):
        p = lp.log_param
        y = self._affine(b[0], p.scale, p.shift)
        if p.base == -1:
            self.add("Log", [y], t)
        else:
            ln = self.add("Log", [y])
            self.add("Mul", [ln, self.const("inv_log_base", np.float32(1 / math.log(p.base)))],
                     t)

    def l_BatchNorm(self, lp, b, t):
        p = lp.batch_norm_param
        if p.HasField("use_global_stats") and not p.use_global_stats:
            raise Unsupported("use_global_stats: false (each batch's own statistics at "
                              "TEST) has no ONNX BatchNormalization-13 equivalent")
        mean, var, f = self.blobs(3)[:3]
        f = float(f.reshape(-1)[0])
        s = 0.0 if f == 0 else 1.0 / f
        c = mean.size
        self.add("BatchNormalization",
                 [b[0], self.const("gamma", np.ones(c)), self.const("beta", np.zeros(c)),
                  self.const("mean", mean.reshape(-1) * s),
                  self.const("var", var.reshape(-1) * s)],
                 t, epsilon=lp.batch_norm_param.eps)

    def _broadcast_shape(self, x, axis, pshape):
        rank = len(self.shape(x))
        axis = _axis(axis, rank) if rank else 0
        if axis + len(pshape) > rank:
            raise LayerError(f"a blob of shape {tuple(pshape)} does not fit a {rank}-D "
                             f"bottom at axis {axis}")
        return tuple(pshape) + (1,) * (rank - axis - len(pshape))

    def l_Scale(self, lp, b, t):
        p = lp.scale_param
        x = b[0]
        if len(b) == 2:
            k = len(self.shape(b[1]))
            rank = len(self.shape(x))
            axis = _axis(p.axis, rank)
            shp = self.const("shape", [0] * k + [1] * (rank - axis - k), np.int64)
            s = self.add("Reshape", [b[1], shp], suffix="scale_shape")
            arrs = self.blobs(1 if p.bias_term else 0)
            bias = arrs[0] if p.bias_term else None
        else:
            arrs = self.blobs(2 if p.bias_term else 1)
            s = self.const("scale", arrs[0].reshape(
                self._broadcast_shape(x, p.axis, arrs[0].shape)))
            bias = arrs[1] if p.bias_term else None
        if bias is None:
            self.add("Mul", [x, s], t)
            return
        m = self.add("Mul", [x, s])
        self.add("Add", [m, self.const("bias", bias.reshape(
            self._broadcast_shape(x, p.axis, bias.shape)))], t, suffix="bias")

    def l_Bias(self, lp, b, t):
        p = lp.bias_param
        x = b[0]
        if len(b) == 2:
            k = len(self.shape(b[1]))
            rank = len(self.shape(x))
            axis = _axis(p.axis, rank)
            shp = self.const("shape", [0] * k + [1] * (rank - axis - k), np.int64)
            c = self.add("Reshape", [b[1], shp], suffix="bias_shape")
        else:
            arr = self.blobs(1)[0]
            c = self.const("bias", arr.reshape(self._broadcast_shape(x, p.axis, arr.shape)))
        self.add("Add", [x, c], t)

    def l_Eltwise(self, lp, b, t):
        p = lp.eltwise_param
        E = caffe_pb2.EltwiseParameter
        if p.operation == E.SUM:
            coeffs = list(p.coeff) or [1.0] * len(b)
            terms = [x if c == 1.0 else self.add("Mul", [x, self.const("coeff", np.float32(c))])
                     for x, c in zip(b, coeffs)]
            op = "Add"
        else:
            terms = list(b)
            op = "Mul" if p.operation == E.PROD else "Max"
        if op == "Max":
            self.add("Max", terms, t)
            return
        acc = terms[0]
        for i, x in enumerate(terms[1:]):
            last = i == len(terms) - 2
            acc = self.add(op, [acc, x], t if last else None)

    def l_Concat(self, lp, b, t):
        p = lp.concat_param
        axis = p.concat_dim if p.HasField("concat_dim") else p.axis
        if len(b) == 1:
            self.add("Identity", b, t)
        else:
            self.add("Concat", b, t, axis=axis)

    def l_Slice(self, lp, b, t):
        p = lp.slice_param
        axis = p.slice_dim if p.HasField("slice_dim") else p.axis
        shape = self.shape(b[0])
        axis = _axis(axis, len(shape))
        L = shape[axis]
        if len(p.slice_point):
            pts = [0] + list(p.slice_point) + [L]
            sizes = [pts[i + 1] - pts[i] for i in range(len(pts) - 1)]
        else:
            sizes = [L // len(t)] * len(t)
        if len(t) == 1:
            self.add("Identity", b, t)
            return
        self.add("Split", [b[0], self.const("split", sizes, np.int64)], t, axis=axis)

    def l_Flatten(self, lp, b, t):
        p = lp.flatten_param
        shape = self.shape(b[0])
        r = len(shape)
        a, e = _axis(p.axis, r), _axis(p.end_axis, r, "end_axis")
        if e < a:
            raise LayerError(f"end_axis {p.end_axis} comes before axis {p.axis}")
        if e == r - 1 and a == 1:
            self.add("Flatten", b, t, axis=1)
            return
        out = list(shape[:a]) + [int(np.prod(shape[a:e + 1]))] + list(shape[e + 1:])
        self.add("Reshape", [b[0], self.const("shape", out, np.int64)], t)

    def l_Reshape(self, lp, b, t):
        p = lp.reshape_param
        shape = list(self.shape(b[0]))
        r = len(shape)
        start = p.axis if p.axis >= 0 else r + p.axis + 1
        end = r if p.num_axes == -1 else start + p.num_axes
        if not (0 <= start <= r and start <= end <= r):
            raise LayerError(f"axis {p.axis} and num_axes {p.num_axes} out of range for a "
                             f"{r}-D bottom")
        dims = list(p.shape.dim)
        out = shape[:start] + dims + shape[end:]
        for i, d in enumerate(dims):
            if d == 0:
                out[start + i] = shape[start + i]
        if -1 in out:
            known = int(np.prod([d for d in out if d != -1]))
            out[out.index(-1)] = int(np.prod(shape)) // known
        self.add("Reshape", [b[0], self.const("shape", out, np.int64)], t)

    def l_MatMul(self, lp, b, t):
        # caffe_ocl's two-bottom product (onnx2caffe --extension_layers)
        self.add("MatMul", b, t)

    def l_Permute(self, lp, b, t):
        # the SSD fork's: the order given, the axes it leaves out after it
        rank = len(self.shape(b[0]))
        order = [_axis(o, rank, "order") for o in lp.permute_param.order]
        self.add("Transpose", b, t, perm=order + [i for i in range(rank) if i not in order])

    def l_Parameter(self, lp, b, t):
        # its blob as a constant (ONNX graphs have no learnable tensors)
        arr = self.blobs(1)[0]
        self.add("Identity", [self.const("value", arr)], t)

    def l_Softmax(self, lp, b, t):
        self.add("Softmax", b, t, axis=lp.softmax_param.axis)

    def l_LRN(self, lp, b, t):
        p = lp.lrn_param
        if p.norm_region != caffe_pb2.LRNParameter.ACROSS_CHANNELS:
            raise Unsupported("WITHIN_CHANNEL LRN has no ONNX equivalent")
        if p.local_size <= 0 or p.local_size % 2 == 0:
            raise LayerError(f"local_size must be odd and positive, got {p.local_size}")
        self.add("LRN", b, t, size=p.local_size, alpha=p.alpha, beta=p.beta, bias=p.k)

    def l_Crop(self, lp, b, t):
        p = lp.crop_param
        shape, ref = self.shape(b[0]), self.shape(b[1])
        axis = _axis(p.axis, len(shape))
        starts, ends, axes = [], [], []
        for i, ax in enumerate(range(axis, len(shape))):
            off = 0 if not len(p.offset) else (p.offset[0] if len(p.offset) == 1
                                               else p.offset[i])
            starts.append(off)
            ends.append(off + ref[ax])
            axes.append(ax)
        self.add("Slice", [b[0], self.const("starts", starts, np.int64),
                           self.const("ends", ends, np.int64),
                           self.const("axes", axes, np.int64)], t)


def _load_net(net):
    if isinstance(net, caffe_pb2.NetParameter):
        p = caffe_pb2.NetParameter()
        p.CopyFrom(net)
        p = upgrade_net(p, "<NetParameter>")
    else:
        path = os.fspath(net)
        if not os.path.exists(path):
            raise FileNotFound(f"net prototxt not found: {path}")
        p = read_net_prototxt(path)
    p.state.phase = caffe_pb2.TEST
    return filter_net(p)


def _load_weights(weights):
    """(NetParameter, the name its errors give) of a caffemodel path or a
    NetParameter with blobs."""
    if isinstance(weights, caffe_pb2.NetParameter):
        w = caffe_pb2.NetParameter()
        w.CopyFrom(weights)
        return upgrade_net(w, "<weights>"), "<weights>"
    path = os.fspath(weights)
    if not os.path.exists(path):
        raise FileNotFound(f"caffemodel not found: {path}")
    return read_net(path), path


def _unmapped(p):
    """Layers whose type has no ONNX mapping, as UnsupportedModelError items."""
    return [(lp.type, lp.name, "no ONNX mapping for this layer type") for lp in p.layer
            if not callable(getattr(Exporter, "l_" + lp.type, None))]


def _validated_weights(p, where, w, wwhere):
    """Build the TEST net ``p`` as caffe_ocl.Net and copy its weights in (the
    blobs ``p`` carries, then those of ``w``), so that every check caffe_ocl
    makes -- each layer's parameters and bottom shapes, the weights' count
    and shapes against the net -- ends in its usual one-line error naming
    the file and layer. Nothing runs on the device. Returns {layer name:
    [weight arrays in the net's shapes]} for the layers given weights."""
    deploy = caffe_pb2.NetParameter()
    deploy.CopyFrom(p)
    for lp in deploy.layer:
        del lp.blobs[:]
        del lp.include[:]         # p is filtered already (its own state)
        del lp.exclude[:]
    with naming(where) if where else nullcontext():
        net = Net(deploy, caffe_pb2.TEST, fold=False)
    carried = [lp for lp in p.layer if len(lp.blobs)]
    given = {lp.name for lp in carried}
    if carried:
        net._copy_layers(carried, where or "<NetParameter>", warn=False)
    if w is not None:
        net._copy_layers(list(w.layer), wwhere, warn=False)
        given.update(lp.name for lp in w.layer if len(lp.blobs))
    return {name: [b.host_data() for b in layer.blobs]
            for name, layer in zip(net.graph.layer_names, net.layers)
            if name in given and layer.blobs}


def export(net, weights=None, opset=OPSET):
    """A Caffe net (NetParameter, or a prototxt path; or a (prototxt,
    caffemodel) pair) and its weights (caffemodel path or NetParameter with
    blobs; default: the blobs inside ``net``) -> onnx.ModelProto, checked by
    onnx.checker. Raises UnsupportedModelError listing every layer without
    an ONNX mapping; then the net is built as caffe_ocl.Net (see the module
    doc), so a net or weights caffe_ocl rejects raise its error (a
    CaffeOclError naming the file and layer); a graph onnx.checker rejects
    raises InvalidOnnxModel."""
    if isinstance(net, (tuple, list)):
        net, weights = net
    where = None if isinstance(net, caffe_pb2.NetParameter) else os.fspath(net)
    p = _load_net(net)
    w, wwhere = _load_weights(weights) if weights is not None else (None, None)
    unmapped = _unmapped(p)
    if unmapped:
        raise UnsupportedModelError(unmapped, what="Caffe layer")
    wmap = _validated_weights(p, where, w, wwhere)
    del w
    for lp in p.layer:
        del lp.blobs[:]
    return Exporter(p, wmap, opset).run()


def caffe2onnx(prototxt, caffemodel, onnx_path, check=False, out=None):
    """Export and write ``onnx_path`` (nothing is written when a layer has no
    mapping). With ``check``, run caffe_ocl and ONNX Runtime on one random
    input and print the largest difference per output; returns that dict."""
    try:
        model = export(prototxt, caffemodel)
    except InvalidOnnxModel as e:
        raise InvalidOnnxModel(f"{os.fspath(onnx_path)}: not written: {e}") from None
    write_binary(model, os.fspath(onnx_path))
    log.info("wrote %s (%d nodes)", onnx_path, len(model.graph.node))
    if not check:
        return None
    p = _load_net(prototxt)
    w = read_net(os.fspath(caffemodel))
    by_name = {lp.name: lp for lp in w.layer}
    for lp in p.layer:
        if lp.name in by_name and not len(lp.blobs):
            lp.blobs.extend(by_name[lp.name].blobs)
    try:
        report = compare(model, p)
    except OnnxConversionError as e:
        raise OnnxConversionError(f"{os.fspath(onnx_path)}: written, but --check failed: "
                                  f"{e}") from None
    print(format_report(report), file=out or sys.stdout)
    return report
