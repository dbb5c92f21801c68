"""ONNX -> Caffe: ``convert(model) -> NetParameter`` (layers with their
weight blobs), ``onnx2caffe(onnx, prototxt, caffemodel, check=False)`` and
the ``caffe_ocl onnx2caffe`` command.

Only standard BVLC Caffe layer types are written (no caffe_ocl extension:
ReLU6 is written as Clip), so the result also loads in other Caffe builds
that know Clip and PoolingParameter.round_mode (BVLC master). Decisions a user
notices are listed in README.md next to this file; in short:

- Shapes are fixed at conversion: dynamic dims become ``batch`` (axis 0) or
  must be given. Initializer-only subgraphs (and Shape of a known shape)
  are folded first, so PyTorch's Shape->Gather->Unsqueeze->Concat->Reshape
  chains become a plain Reshape.
- ONNX floor pooling uses ``round_mode: FLOOR`` where Caffe's default CEIL
  would give other windows; otherwise (and for ceil pooling) the default. Window counts or divisors that Caffe cannot reproduce are
  fixed exactly: extra trailing windows are cut with Slice (+Silence),
  asymmetric padding becomes an explicit zero (-FLT_MAX for MAX) border made
  of DummyData + Concat, and an averaging divisor that differs (e.g.
  count_include_pad=0 with padding) is corrected by a Scale layer over the
  output's spatial axes (axis 2, num_axes 2) holding caffe_divisor/onnx_divisor.
- Reshape/Flatten/Squeeze/Unsqueeze/Transpose are tracked as index views and
  only written when a real layer needs the tensor: a pure reshape becomes
  Flatten/Reshape, a channel permutation (ShuffleNet's channel shuffle)
  becomes a 1x1 Convolution with a 0/1 permutation matrix; any other
  transpose is reported as unsupported. Such constants of the conversion
  (the permutation, the pooling divisor) get lr_mult 0 and decay_mult 0, so
  a solver training the converted net does not change them.
- BatchNormalization -> BatchNorm (use_global_stats; moving_average_fraction =
  ONNX momentum, statistics stored with the scale factor 1/(1-momentum), so a
  TRAIN net's running averages update as PyTorch's) + Scale
  (bias_term). Gemm/MatMul with constant weights -> InnerProduct (alpha
  folded into the weights, beta into the bias). Scalar Add/Mul/Sub/Div with a
  constant -> Power; tensor constants -> Scale/Bias with the constant as a
  blob; two tensors of the same shape -> Eltwise; a broadcast tensor (SE
  block's [N,C,1,1] gate) -> Scale/Bias with two bottoms.
"""
import logging
import math
import os
import sys

import numpy as np

from ..errors import CaffeOclError
from ..net import Net
from ..proto import array_to_blobproto, caffe_pb2, write_binary, write_text
from ._common import (OnnxConversionError, Unsupported, UnsupportedModelError,
                      caffe_divisor_2d, caffe_pool_outs, error_line, node_attrs,
                      onnx_divisor_2d, onnx_pool_outs, pad_pairs, set_caffe_hw)
from ._graph import load_model, prepare
from ._nodes import (NodeError, Var, axis_in, blob_proto, check_kernel, conv_param,
                     desc, group_attr, ints_attr, reshape_target, same_pads)
from ._erf import ErfOps
from ._fuse import fuse_affine_into_linear
from ._layout import LayoutOps
from ._resize import ResizeOps
from .check import compare, format_report

log = logging.getLogger("caffe_ocl")
FLT_MAX = 3.4028234663852886e38
_AUTO_PADS = ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER")
# A .caffemodel is one protobuf message, under 2 GiB: the weights may take
# that less 16 MiB (left for names and parameters). Past it protobuf refused
# to serialize the net only when the file was written.
WEIGHT_BYTES_MAX = 2 ** 31 - 2 ** 24



class Converter(ResizeOps, ErfOps, LayoutOps):
    def __init__(self, model, input_shapes=None, batch=1, extension_layers=False):
        self.extension_layers = extension_layers
        self.const_blobs = {}
        self.p = prepare(model, input_shapes, batch)
        self.p.nodes = fuse_affine_into_linear(self.p.nodes, self.p.consts, self.p.shapes,
                                               self.p.outputs)
        self.opset = self.p.opset
        self.net = caffe_pb2.NetParameter()
        self.net.name = self.p.name
        self.refs = {}
        self.unsupported = []
        self.layer_names = set()
        self.blob_names = set(self.p.shapes) | set(self.p.inputs)
        self.node = None
        self.tops = set()
        self.blob_values = 0

    # ---- bookkeeping -------------------------------------------------------
    def uniq(self, base, taken):
        name, k = base, 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name

    def new_blob(self, base):
        return self.uniq(base, self.blob_names)

    def layer(self, type_, name, bottoms, tops, blobs=()):
        lp = self.net.layer.add()
        lp.name = self.uniq(name, self.layer_names)
        lp.type = type_
        lp.bottom.extend(bottoms)
        lp.top.extend(tops)
        self.tops.update(tops)
        for arr in blobs:
            arr = np.asarray(arr, np.float32)
            # checked before the blob is made (WEIGHT_BYTES_MAX)
            self.blob_values += arr.size
            if self.blob_values * 4 > WEIGHT_BYTES_MAX:
                raise OnnxConversionError(
                    f"layer {lp.name!r}: the converted weights reach {self.blob_values} values "
                    f"({self.blob_values * 4 / 2 ** 30:.3g} GiB), more than a .caffemodel (one "
                    "protobuf message, under 2 GiB) can hold")
            lp.blobs.add().CopyFrom(blob_proto(arr))
        return lp

    @staticmethod
    def fixed(lp):
        """Mark ``lp``'s blobs as constants of the conversion, not weights:
        lr_mult 0 and decay_mult 0, so that a solver training the converted
        net leaves them alone (a channel permutation, a pooling divisor)."""
        del lp.param[:]
        for _ in lp.blobs:
            ps = lp.param.add()
            ps.lr_mult, ps.decay_mult = 0.0, 0.0
        return lp

    def lname(self):
        n = self.node
        return n.name or n.output[0]

    def shape(self, name):
        s = self.p.shapes.get(name)
        if s is None:
            raise Unsupported(f"the shape of {name!r} is not known statically")
        return s

    def is_const(self, name):
        return name in self.p.consts

    def const(self, name, what="input"):
        if name not in self.p.consts:
            raise Unsupported(f"{what} {name!r} must be a constant (initializer)")
        return self.p.consts[name]

    def opt_const(self, i):
        n = self.node.input
        if len(n) > i and n[i]:
            return self.const(n[i])
        return None

    def var(self, name):
        r = self.refs.get(name)
        if r is None:
            if name in self.p.consts:
                raise Unsupported(f"input {name!r} is a constant; a Caffe layer needs a "
                                  "computed tensor here")
            raise Unsupported(f"input {name!r} is not produced by any node")
        return r

    def blob(self, name):
        return self.materialize(self.var(name))

    def out(self, i=0, blob=None, shape=None):
        """Register output i of the current node as a fresh blob (named as the
        ONNX tensor) and return the blob name."""
        name = self.node.output[i]
        shape = self.p.shapes.get(name) if shape is None else shape
        if shape is None:
            raise Unsupported(f"the shape of output {name!r} is not known statically")
        self.refs[name] = Var(name, blob or name, shape)
        return blob or name

    def alias(self, i, src_name):
        self.refs[self.node.output[i]] = self.var(src_name)

    # ---- views -------------------------------------------------------------
    def materialize(self, r):
        if r.materialized:
            return r.materialized
        count = int(np.prod(r.shape))
        idx = r.index
        if idx is not None and np.array_equal(idx.ravel(), np.arange(count)):
            idx = None
        if idx is None:
            top = r.name if r.name not in self.tops else self.new_blob(r.name)
            shape = r.shape
            if (len(shape) == 2 and len(r.blob_shape) >= 2 and shape[0] == r.blob_shape[0]):
                lp = self.layer("Flatten", top, [r.blob], [top])
            else:
                lp = self.layer("Reshape", top, [r.blob], [top])
                dims = list(shape)
                if len(shape) and len(r.blob_shape) and shape[0] == r.blob_shape[0]:
                    dims[0] = 0
                lp.reshape_param.shape.dim.extend(dims)
            r.materialized = top
            return top
        perm = _channel_permutation(idx, r.shape)
        if perm is None or len(r.shape) not in (2, 4):
            moved = self._space_depth(r, idx)
            if moved is not None:
                return moved
            if self.extension_layers and r.transposed_from is not None:
                return self._permuted_blob(r)
            raise Unsupported("this Transpose (with the reshapes around it) moves data in a "
                              "way no Caffe layer expresses (only reshapes, channel "
                              "permutations and space-to-depth / depth-to-space moves are "
                              "supported; --extension_layers writes the SSD fork's Permute)",
                              node=r.origin)
        src = r.blob
        if r.blob_shape != r.shape:
            src = self.materialize(Var(self.new_blob(r.name + "_reshaped"), r.blob, r.blob_shape, r.shape,
                                       None, r.origin))
        c = r.shape[1]
        w = np.zeros((c, c), np.float32)
        w[np.arange(c), perm] = 1.0
        top = r.name if r.name not in self.tops else self.new_blob(r.name)
        if len(r.shape) == 4:
            lp = self.fixed(self.layer("Convolution", top + "_permute", [src], [top],
                                       [w.reshape(c, c, 1, 1)]))
            cp = lp.convolution_param
            cp.num_output = c
            cp.kernel_size.append(1)
            cp.bias_term = False
        else:
            lp = self.fixed(self.layer("InnerProduct", top + "_permute", [src], [top], [w]))
            lp.inner_product_param.num_output = c
            lp.inner_product_param.bias_term = False
        r.materialized = top
        return top

    def _const_blob(self, name):
        """A blob holding constant ``name``: BVLC's Parameter layer (its
        value a learnable blob, as the model's other initializers)."""
        if name not in self.const_blobs:
            value = np.asarray(self.p.consts[name], np.float32)
            blob = self.new_blob(name + "_const")
            lp = self.layer("Parameter", blob, [], [blob], [value])
            lp.parameter_param.shape.dim.extend(int(d) for d in value.shape)
            self.const_blobs[name] = blob
        return self.const_blobs[name]

    def _permuted_blob(self, r):
        """A view no BVLC layer moves (--extension_layers): the blob
        reshaped to S (Reshape), the SSD fork's Permute with order p, and
        a Reshape to the view's shape, where each is needed."""
        S, p = r.transposed_from
        src = r.blob
        if tuple(S) != r.blob_shape:
            src = self.materialize(Var(self.new_blob(r.name + "_unflattened"), r.blob,
                                       r.blob_shape, S))
        moved_shape = tuple(S[i] for i in p)
        top = r.name if (r.name not in self.tops and moved_shape == r.shape) \
            else self.new_blob(r.name + "_permuted")
        lp = self.layer("Permute", top, [src], [top])
        lp.permute_param.order.extend(int(i) for i in p)
        if moved_shape != r.shape:
            top = self.materialize(Var(self.new_blob(r.name), top, moved_shape, r.shape))
        r.materialized = top
        return top

    def _matmul_computed(self, node):
        """MatMul of two computed tensors (attention): caffe_ocl's MatMul
        layer (--extension_layers), both operands (..., M, K) and
        (..., K, N) with the same leading axes."""
        sa, sb = self.shape(node.input[0]), self.shape(node.input[1])
        try:
            lead = tuple(np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
        except ValueError:
            lead = None
        if len(sa) < 2 or len(sb) < 2 or lead is None:
            raise Unsupported(f"MatMul of computed tensors of shapes {list(sa)} and "
                              f"{list(sb)}: caffe_ocl's MatMul takes (..., M, K) x "
                              "(..., K, N) with leading axes that broadcast")
        ins = []
        for name, shape in ((node.input[0], sa), (node.input[1], sb)):
            full = (1,) * (len(lead) - len(shape) + 2) + tuple(shape)
            axes = [i for i, (d, o) in enumerate(zip(full[:-2], lead)) if d != o]
            if axes:
                # a broadcast operand (MobileNet v4's multi-query attention:
                # one key/value head for all query heads): tiled (Caffe's Tile)
                name = self._tiled(name, full, axes, lead + tuple(shape[-2:]))
            ins.append(self._reshaped(name, lead + tuple(shape[-2:]), name + "_ranked")
                       if len(full) != len(shape) else self.blob(name))
        self.layer("MatMul", self.lname(), ins, [self.out()])

    def _reshaped(self, src_name, shape, blob_name):
        """A blob holding tensor ``src_name``'s values in order as Caffe
        shape ``shape`` (a permuted view materialized first, then a Reshape
        where the shape differs)."""
        r = self.var(src_name)
        if r.index is not None:
            r = Var(r.name, self.materialize(r), r.shape)
        return self.materialize(Var(self.new_blob(blob_name), r.blob, r.blob_shape,
                                    tuple(shape)))

    def _space_depth(self, r, idx):
        """A permuted view that moves s x s blocks of pixels into channels
        (space-to-depth: TResNet's stem, PixelUnshuffle, ONNX SpaceToDepth)
        or back (depth-to-space: PixelShuffle in super-resolution nets, ONNX
        DepthToSpace), in any channel order: a Convolution (kernel = stride
        = s) or a Deconvolution (the same) whose weights pick one input per
        output (ones and zeros; grouped where every output channel reads a
        block of its own), or None for any other move. Exact for finite
        inputs (an inf or NaN also reaches the other outputs of its block,
        as 0 * inf)."""
        if len(r.shape) != 4 or len(r.blob_shape) != 4 or r.shape[0] != r.blob_shape[0]:
            return None
        n, c, h, w = r.blob_shape
        _, co, ho, wo = r.shape
        if ho > h and ho % h == 0 and ho // h == wo // w and wo % w == 0:
            s, deconv = ho // h, True
            if c != co * s * s:
                return None
        elif h > ho and h % ho == 0 and h // ho == w // wo and w % wo == 0:
            s, deconv = h // ho, False
            if co != c * s * s:
                return None
        else:
            return None
        if s < 2:
            return None
        i4 = idx.reshape(r.shape)
        if deconv:
            # view[., k, s*y + i, s*x + j] = blob[., m(k, i, j), y, x]
            first = i4[0, :, :s, :s]
            m, rem = np.divmod(first, h * w)
            if np.any(rem) or np.any(m >= c):
                return None
            y, x = np.arange(h), np.arange(w)
            nn = np.arange(n)[:, None, None, None, None, None]
            want = ((nn * c + m[None, :, :, :, None, None]) * h
                    + y[None, None, None, None, :, None]) * w + x[None, None, None, None, None, :]
            got = i4.reshape(n, co, h, s, w, s).transpose(0, 1, 3, 5, 2, 4)
            if not np.array_equal(got, want):
                return None
            grouped = np.array_equal(m // (s * s), np.broadcast_to(
                np.arange(co)[:, None, None], m.shape))
            # weight [input m, output k (0: its group's one), i, j]
            kk, ii, jj = np.indices(m.shape)
            wt = np.zeros((c, 1 if grouped else co, s, s), np.float32)
            wt[m, 0 if grouped else kk, ii, jj] = 1.0
            kind, group = "Deconvolution", co if grouped else 1
        else:
            # view[., k, y, x] = blob[., c(k), s*y + i(k), s*x + j(k)]
            cc, rem = np.divmod(i4[0, :, 0, 0], h * w)
            ii, jj = np.divmod(rem, w)
            if np.any(cc >= c) or np.any(ii >= s) or np.any(jj >= s):
                return None
            y, x = np.arange(ho), np.arange(wo)
            nn = np.arange(n)[:, None, None, None]
            want = ((nn * c + cc[None, :, None, None]) * h
                    + s * y[None, None, :, None] + ii[None, :, None, None]) * w \
                + s * x[None, None, None, :] + jj[None, :, None, None]
            if not np.array_equal(i4, want):
                return None
            wt = np.zeros((co, c, s, s), np.float32)
            wt[np.arange(co), cc, ii, jj] = 1.0
            kind, group = "Convolution", 1
        top = r.name if r.name not in self.tops else self.new_blob(r.name)
        lp = self.fixed(self.layer(kind, top + "_move", [r.blob], [top], [wt]))
        conv_param(lp.convolution_param, co, [s, s], [0, 0], [s, s], [1, 1], group, False)
        r.materialized = top
        return top

    def set_view(self, i, src_name, shape, transpose=None):
        r = self.var(src_name)
        shape = tuple(int(d) for d in shape)
        name = self.node.output[i]
        if transpose is None and r.index is None:
            self.refs[name] = r.view(name, shape)
            return
        if transpose is not None and r.index is None and r.shape != r.blob_shape \
                and len(r.shape) <= 4:
            # a transpose of a reshape (MLP-Mixer's stem: flatten(2) then
            # transpose(1, 2)): the reshape becomes a blob (a Reshape
            # layer), the transpose a view of it
            r = Var(r.name, self.materialize(r), r.shape, origin=r.origin)
        if transpose is not None and (r.perm is not None or (
                r.index is None and r.shape == r.blob_shape)):
            # a transpose of the blob (or of such a view): kept as a
            # permutation, run on the blob by the operators that can
            # (_layout.py), an index only if something else reads it
            base = r.perm if r.perm is not None else tuple(range(len(r.shape)))
            perm = tuple(base[t] for t in transpose)
            if perm == tuple(range(len(perm))):
                self.refs[name] = Var(name, r.blob, r.blob_shape, shape, origin=r.origin)
            else:
                self.refs[name] = Var(name, r.blob, r.blob_shape, shape, None, self.node, perm)
            return
        if transpose is not None and self.extension_layers and r.index is not None \
                and r.transposed_from is not None:
            S, p = r.transposed_from
            if r.shape != tuple(S[i] for i in p):
                # two moves in a row (attention's heads split from a
                # transposed tensor): the first one written (a Permute),
                # the transpose then a view of its blob
                r = Var(r.name, self.materialize(r), r.shape, origin=r.origin)
        idx = r.index if r.index is not None else np.arange(
            int(np.prod(r.shape))).reshape(r.shape)
        # the same move as one reshape -> transpose -> reshape, if it is one
        moved = r.transposed_from
        if transpose is not None:
            idx = idx.transpose(transpose)
            origin = self.node
            if r.index is None:
                moved = (r.shape, tuple(transpose))
            elif moved is not None and r.shape == tuple(moved[0][i] for i in moved[1]):
                moved = (moved[0], tuple(moved[1][t] for t in transpose))
            else:
                moved = None
        else:
            origin = r.origin
        idx = np.ascontiguousarray(idx).reshape(shape)
        if np.array_equal(idx.ravel(), np.arange(idx.size)):
            self.refs[name] = Var(name, r.blob, r.blob_shape, shape, origin=r.origin)
        else:
            self.refs[name] = r.view(name, shape, idx, origin)
            self.refs[name].transposed_from = moved

    # ---- explicit padding and cropping ------------------------------------
    def pad(self, blob, shape, pads, value, base):
        """pads: {axis: (before, after)} (non-negative). DummyData + Concat."""
        shape = list(shape)
        for axis in sorted(pads):
            b, e = pads[axis]
            if not b and not e:
                continue
            pieces = []
            for amount, where in ((b, "before"), (e, "after")):
                if not amount:
                    continue
                s = list(shape)
                s[axis] = amount
                d = self.new_blob(f"{base}_pad{axis}_{where}")
                lp = self.layer("DummyData", d, [], [d])
                dp = lp.dummy_data_param
                f = dp.data_filler.add()
                f.type = "constant"
                f.value = float(value)
                dp.shape.add().dim.extend(s)
                pieces.append((where, d))
            order = [p for w, p in pieces if w == "before"] + [blob] + \
                [p for w, p in pieces if w == "after"]
            top = self.new_blob(f"{base}_padded{axis}")
            lp = self.layer("Concat", top, order, [top])
            lp.concat_param.axis = axis
            shape[axis] += b + e
            blob = top
        return blob, tuple(shape)

    def crop(self, blob, shape, axis, start, length, base, top=None):
        """Keep [start, start+length) of ``axis`` (Slice; the rest Silenced)."""
        L = shape[axis]
        if start == 0 and length == L:
            return blob
        points = [p for p in (start, start + length) if 0 < p < L]
        tops, keep = [], None
        pos = 0
        for k, p in enumerate(points + [L]):
            if pos == start:
                keep = top or self.new_blob(f"{base}_crop{axis}")
                tops.append(keep)
            else:
                tops.append(self.new_blob(f"{base}_crop{axis}_unused{k}"))
            pos = p
        lp = self.layer("Slice", f"{base}_crop{axis}", [blob], tops)
        lp.slice_param.axis = axis
        lp.slice_param.slice_point.extend(points)
        unused = [t for t in tops if t != keep]
        if unused:
            self.layer("Silence", f"{base}_crop{axis}_silence", unused, [])
        return keep

    # ---- the conversion ----------------------------------------------------
    def run(self):
        for name, shape in self.p.inputs.items():
            lp = self.layer("Input", name, [], [name])
            lp.input_param.shape.add().dim.extend(shape)
            self.refs[name] = Var(name, name, shape)
        producer = {name: "a graph input" for name in self.p.inputs}
        for node in self.p.nodes:
            self.node = node
            handler = getattr(self, "op_" + node.op_type, None)
            try:
                for o in node.output:
                    # ONNX assigns each tensor once; a second writer silently
                    # became a second Caffe layer writing the same top
                    if o and o in producer:
                        raise NodeError(node, f"output {o!r} is already {producer[o]} (an "
                                              "ONNX graph assigns each tensor once)")
                    if o:
                        producer[o] = f"the output of {desc(node)[0]} {desc(node)[1]!r}"
                if node.domain not in ("", "ai.onnx") or handler is None:
                    raise Unsupported("no Caffe equivalent for this operator"
                                      + (f" (domain {node.domain})" if node.domain else ""))
                a = node_attrs(node)
                if not self.run_permuted(node, a):
                    handler(node, a)
            except Unsupported as e:
                self._unsupported(node, e.node or node, e.reason)
            except NodeError as e:
                self._malformed(node, e)
            except (ValueError, TypeError, IndexError, KeyError, ArithmeticError) as e:
                # an attribute or constant of a shape or type no check above
                # foresaw: one line naming the node (this was "malformed ONNX
                # model (IndexError: list index out of range)", naming nothing)
                self._malformed(node, NodeError(node, f"malformed node ({error_line(e)})"))
            except MemoryError:
                self._malformed(node, NodeError(node, "out of host memory converting this "
                                                      "node (an input, attribute or constant "
                                                      "claims a huge shape?)"))
        if not self.unsupported:
            for name in self.p.outputs:
                self.node = None
                try:
                    self._finish_output(name)
                except Unsupported as e:
                    op, nm = desc(e.node) if e.node is not None else ("output", name)
                    self.unsupported.append((op, nm, e.reason))
        if self.unsupported:
            raise UnsupportedModelError(self.unsupported)
        return self.net

    def _unsupported(self, node, bad, reason):
        """List ``bad`` (``node`` or the one it depends on) with ``reason``
        and give ``node``'s outputs placeholder shapes, to go on listing."""
        item = (*desc(bad), reason)
        if item not in self.unsupported:
            self.unsupported.append(item)
        for o in node.output:
            if o and o not in self.refs:
                self.refs[o] = Var(o, o, self.p.shapes.get(o, (1,)))

    def _malformed(self, node, err):
        """A malformed node ends the conversion with ``err``, unless an
        unsupported node came first: past it, shapes and values are
        placeholders, and the error (a Gemm whose input has the wrong width)
        may be theirs; it is listed after the unsupported node rather than
        hiding it."""
        if not self.unsupported:
            raise err from None
        self._unsupported(node, err.node, err.reason)

    def _finish_output(self, name):
        if name in self.p.consts:
            raise Unsupported("the graph output is a constant")
        if name not in self.refs:
            raise Unsupported("no node produces this graph output")
        b = self.materialize(self.refs[name])
        if b == name:
            return
        # a one-top Split, so the graph output keeps its ONNX name
        self.layer("Split", name + "_output", [b], [name])

    # ---- convolution -------------------------------------------------------
    def _spatial_pads(self, a, in_hw, kernel, strides, dil):
        node = self.node
        auto = a.get("auto_pad", "NOTSET")
        # an unknown auto_pad was read as SAME_LOWER (and pads next to an
        # auto_pad ignored), converting with exit status 0 what ONNX Runtime
        # refuses
        if auto not in _AUTO_PADS:
            raise NodeError(node, f"auto_pad {auto!r} is not one of NOTSET, VALID, "
                                  "SAME_UPPER, SAME_LOWER")
        if auto in ("NOTSET", ""):
            return pad_pairs(ints_attr(node, a, "pads", 4, 0, [0] * 4))
        if "pads" in a:
            raise NodeError(node, f"auto_pad {auto} and pads are both given (ONNX allows "
                                  "one of them)")
        if auto == "VALID":
            return [(0, 0), (0, 0)]
        out = []
        for H, K, S, D in zip(in_hw, kernel, strides, dil):
            total = max((-(-H // S) - 1) * S + (K - 1) * D + 1 - H, 0)
            out.append(same_pads(total, lower=auto != "SAME_UPPER"))
        return out

    def op_Conv(self, node, a):
        W = self.const(node.input[1], "weight")
        if W.ndim == 3:
            self._conv1d(node, a, W)
            return
        if W.ndim != 4:
            raise Unsupported(f"only 1-D and 2-D convolutions map to Caffe (weight has "
                              f"{W.ndim} dims)")
        self._conv2d(node, a, W, self.blob(node.input[0]), self.shape(node.input[0]))

    def _conv1d(self, node, a, W):
        """A 1-D Conv (ECA's channel attention, audio and sequence CNNs) as
        the 2-D one of kernel (1, k) over the input seen as (N, C, 1, L)."""
        shape = self.shape(node.input[0])
        if len(shape) != 3:
            raise NodeError(node, f"input {node.input[0]!r} has shape {list(shape)}; a Conv "
                                  "with a 3-D weight takes a 3-D input")
        n, c, length = shape
        x = self._reshaped(node.input[0], (n, c, 1, length), node.input[0] + "_2d")
        a2 = dict(a)
        for key in ("kernel_shape", "strides", "dilations"):
            if key in a:
                a2[key] = [1] + list(a[key])
        if "pads" in a:
            if len(a["pads"]) != 2:
                raise NodeError(node, f"pads {a['pads']!r}: a 1-D Conv takes 2 values")
            a2["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
        top = self.new_blob(node.output[0] + "_2d")
        self._conv2d(node, a2, W.reshape(W.shape[:2] + (1, W.shape[2])), x, (n, c, 1, length),
                     top)
        out = self.shape(node.output[0])
        self.refs[node.output[0]] = Var(node.output[0], top, (out[0], out[1], 1, out[2]), out)

    def _conv2d(self, node, a, W, x, shape, top=None):
        """The 2-D Conv of ``x`` (shape ``shape``) into ``top`` (None: the
        node's output, registered once the node's attributes are checked)."""
        B = self.opt_const(2)
        if len(shape) != 4:
            # (was "the shape of output is not known statically")
            raise NodeError(node, f"input {node.input[0]!r} has shape {list(shape)}; a Conv "
                                  "with a 4-D weight takes a 4-D input")
        kernel = list(W.shape[2:])
        check_kernel(node, a, kernel)
        strides = ints_attr(node, a, "strides", 2, 1, [1, 1])
        dil = ints_attr(node, a, "dilations", 2, 1, [1, 1])
        group = group_attr(node, a)
        pads = self._spatial_pads(a, shape[2:], kernel, strides, dil)
        sym = [min(b, e) for b, e in pads]
        extra = {2 + i: (b - s, e - s) for i, ((b, e), s) in enumerate(zip(pads, sym))
                 if (b, e) != (s, s)}
        if extra:
            x, shape = self.pad(x, shape, extra, 0.0, self.lname())
        top = top or self.out()
        lp = self.layer("Convolution", self.lname(), [x], [top],
                        [W] + ([B] if B is not None else []))
        conv_param(lp.convolution_param, W.shape[0], kernel, sym, strides, dil,
                    group, B is not None)

    def op_ConvTranspose(self, node, a):
        W = self.const(node.input[1], "weight")
        if W.ndim != 4:
            raise Unsupported("only 2-D transposed convolution maps to Caffe")
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID") and "output_shape" not in a:
            raise Unsupported(f"auto_pad {a['auto_pad']} is not supported for ConvTranspose")
        B = self.opt_const(2)
        x = self.blob(node.input[0])
        shape = self.shape(node.input[0])
        g = group_attr(node, a)
        kernel = list(W.shape[2:])
        check_kernel(node, a, kernel)
        strides = ints_attr(node, a, "strides", 2, 1, [1, 1])
        dil = ints_attr(node, a, "dilations", 2, 1, [1, 1])
        opad = ints_attr(node, a, "output_padding", 2, 0, [0, 0])
        if "pads" in a:
            ints_attr(node, a, "pads", 4, 0)
        out_shape = self.shape(node.output[0])
        full, begin = [], []
        for i in range(2):
            f = strides[i] * (shape[2 + i] - 1) + (kernel[i] - 1) * dil[i] + 1
            full.append(f)
            if "pads" in a and "output_shape" not in a:
                begin.append(a["pads"][i])
            else:
                total = f + opad[i] - out_shape[2 + i]
                lower = a.get("auto_pad", "NOTSET") == "SAME_LOWER"
                begin.append(same_pads(total, lower)[0])
        P = []
        for i in range(2):
            end_room = full[i] - begin[i] - out_shape[2 + i]   # cut from the end
            if end_room < 0:
                raise Unsupported("output_padding beyond the kernel footprint is not "
                                  "expressible with Deconvolution")
            P.append(min(begin[i], end_room))
        cshape = (shape[0], W.shape[1] * g, full[0] - 2 * P[0], full[1] - 2 * P[1])
        needs_crop = any(cshape[2 + i] != out_shape[2 + i] for i in range(2))
        top = self.new_blob(node.output[0] + "_full") if needs_crop else self.out()
        lp = self.layer("Deconvolution", self.lname(), [x], [top],
                        [W] + ([B] if B is not None else []))
        conv_param(lp.convolution_param, W.shape[1] * g, kernel, P, strides, dil, g,
                    B is not None)
        if needs_crop:
            b, s = top, list(cshape)
            axes = [i for i in range(2) if cshape[2 + i] != out_shape[2 + i]]
            for i in axes:
                b = self.crop(b, s, 2 + i, begin[i] - P[i], out_shape[2 + i], self.lname(),
                              top=node.output[0] if i == axes[-1] else None)
                s[2 + i] = out_shape[2 + i]
            self.out()

    # ---- pooling -----------------------------------------------------------
    def _pool(self, node, a, method):
        x = self.blob(node.input[0])
        shape = self.shape(node.input[0])
        if len(shape) != 4:
            raise Unsupported(f"only 2-D pooling maps to Caffe (input {shape})")
        K = ints_attr(node, a, "kernel_shape", 2, 1)
        S = ints_attr(node, a, "strides", 2, 1, [1, 1])
        if list(a.get("dilations", [1, 1])) != [1, 1]:
            raise Unsupported("dilated pooling has no Caffe equivalent")
        pads = self._spatial_pads(a, shape[2:], K, S, [1, 1])
        ceil = bool(a.get("ceil_mode", 0))
        cip = bool(a.get("count_include_pad", 0))
        H = shape[2:]
        P = [pads[0][0], pads[1][0]]    # Caffe pads both ends by the begin pad
        want = onnx_pool_outs(H, K, S, pads, ceil)
        extra = [max(pads[i][1] - pads[i][0], 0) for i in range(2)]
        best = None
        # Caffe's default rounding (CEIL) first where it gives the same
        # windows: no round_mode written, which OpenCV's caffe.proto reads
        # as another field (its ceil_mode; the Pooling then failed to load)
        for exact in (True, False):
            for ex in ([0, 0], extra):
                for c in (True, False):
                    outs = caffe_pool_outs([H[0] + ex[0], H[1] + ex[1]], K, S, P, c)
                    ok = outs == want if exact else all(o >= w for o, w in zip(outs, want))
                    if ok and best is None:
                        best = (ex, c, outs)
        if best is None or any(pads[i][0] >= K[i] for i in range(2)):
            raise Unsupported(f"pooling geometry (kernel {K}, stride {S}, pads {pads}) has "
                              "no Caffe equivalent")
        ex, c, outs = best
        base = self.lname()
        if any(ex):
            value = -FLT_MAX if method == "MAX" else 0.0
            x, shape = self.pad(x, shape, {2 + i: (0, ex[i]) for i in range(2) if ex[i]},
                                value, base)
        fix = None
        if method == "AVE":
            dc = caffe_divisor_2d(shape[2:], K, S, P, want)
            do = onnx_divisor_2d(H, K, S, pads, want, cip)
            ratio = dc.astype(np.float64) / do
            if not np.all(ratio == 1.0):
                fix = ratio.astype(np.float32)
        need_crop = outs != want
        final = node.output[0]
        top = self.new_blob(final + "_pool") if (need_crop or fix is not None) else self.out()
        lp = self.layer("Pooling", base, [x], [top])
        pp = lp.pooling_param
        pp.pool = getattr(caffe_pb2.PoolingParameter, method)
        set_caffe_hw(pp, "kernel_size", K)
        set_caffe_hw(pp, "pad", P, 0)
        set_caffe_hw(pp, "stride", S, 1)
        if not c:
            pp.round_mode = caffe_pb2.PoolingParameter.FLOOR
        cur, cshape = top, [shape[0], shape[1]] + outs
        if need_crop:
            for i in range(2):
                if cshape[2 + i] != want[i]:
                    last = fix is None and (i == 1 or cshape[3] == want[1])
                    cur = self.crop(cur, cshape, 2 + i, 0, want[i], base,
                                    top=final if last else None)
                    cshape[2 + i] = want[i]
        if fix is not None:
            lp = self.fixed(self.layer("Scale", base + "_divisor", [cur], [final], [fix]))
            lp.scale_param.axis = 2
            lp.scale_param.num_axes = 2
            cur = final
        if cur != final:
            raise Unsupported("internal: pooling naming")
        if need_crop or fix is not None:
            self.out()

    def op_MaxPool(self, node, a):
        if len(node.output) > 1 and node.output[1]:
            raise Unsupported("MaxPool's Indices output has no Caffe equivalent")
        if a.get("storage_order", 0):
            raise Unsupported("storage_order 1 is not supported")
        self._pool(node, a, "MAX")

    def op_AveragePool(self, node, a):
        self._pool(node, a, "AVE")

    def _global_pool(self, x, top, method):
        """Caffe global Pooling (``method`` "AVE" or "MAX") of blob x into top."""
        lp = self.layer("Pooling", self.lname(), [x], [top])
        lp.pooling_param.pool = getattr(caffe_pb2.PoolingParameter, method)
        lp.pooling_param.global_pooling = True

    def _global(self, node, method):
        x = self.blob(node.input[0])
        if len(self.shape(node.input[0])) != 4:
            raise Unsupported("only 4-D global pooling maps to Caffe")
        self._global_pool(x, self.out(), method)

    def op_GlobalAveragePool(self, node, a):
        self._global(node, "AVE")

    def op_GlobalMaxPool(self, node, a):
        self._global(node, "MAX")

    def _reduce_axes(self, node, a, rank):
        """A Reduce node's axes, sorted and non-negative: the attribute
        (opset < 18), the second input (18), else every axis."""
        if "axes" in a:
            axes = list(a["axes"])
        elif len(node.input) > 1 and node.input[1]:
            axes = [int(v) for v in self.const(node.input[1]).ravel()]
        else:
            axes = list(range(rank))
        return sorted(axis_in(ax, rank, node) for ax in axes)

    def _reduce(self, node, a, kind):
        shape = self.shape(node.input[0])
        axes = self._reduce_axes(node, a, len(shape))
        keep = bool(a.get("keepdims", 1))
        out_shape = self.shape(node.output[0])
        x = self.blob(node.input[0])
        if len(shape) == 4 and axes == [2, 3] and kind in ("MEAN", "MAX"):
            top = self.new_blob(node.output[0] + "_pool") if not keep else self.out()
            self._global_pool(x, top, "AVE" if kind == "MEAN" else "MAX")
            if not keep:
                self.refs[node.output[0]] = Var(node.output[0], top, shape[:2] + (1, 1),
                                                out_shape)
            return
        if kind != "MAX" and axes == list(range(axes[0], axes[-1] + 1)) \
                and axes[-1] < len(shape) - 1:
            self._reduce_inner(node, shape, axes, kind, out_shape)
            return
        if kind == "MAX" or axes != list(range(axes[0], len(shape))):
            raise Unsupported(f"reduction over axes {axes} of a {len(shape)}-D tensor has no "
                              "Caffe equivalent (Caffe's Reduction works on trailing axes)")
        top = self.new_blob(node.output[0] + "_reduced")
        lp = self.layer("Reduction", self.lname(), [x], [top])
        lp.reduction_param.operation = getattr(caffe_pb2.ReductionParameter, kind)
        lp.reduction_param.axis = axes[0]
        self.refs[node.output[0]] = Var(node.output[0], top, shape[:axes[0]], out_shape)

    def _reduce_inner(self, node, shape, axes, kind, out_shape):
        """SUM / MEAN over a run of axes followed by others (ResNeSt's and
        SKNet's sum over the radix axis of an (N, R, C, H, W) tensor):
        the input seen as (P, R, T, 1) (P: the axes before, R: the reduced
        ones, T: the ones after), then a 1x1 Convolution of one output
        channel with weights 1 (SUM) or 1 / R (MEAN), no bias."""
        P = int(np.prod(shape[:axes[0]]))
        R = int(np.prod(shape[axes[0]:axes[-1] + 1]))
        T = int(np.prod(shape[axes[-1] + 1:]))
        rows = self._reshaped(node.input[0], (P, R, T, 1), node.output[0] + "_rows")
        top = self.new_blob(node.output[0] + "_reduced")
        w = np.full((1, R, 1, 1), 1.0 if kind == "SUM" else 1.0 / R, np.float32)
        lp = self.fixed(self.layer("Convolution", self.lname(), [rows], [top], [w]))
        conv_param(lp.convolution_param, 1, [1, 1], [0, 0], [1, 1], [1, 1], 1, False)
        self.refs[node.output[0]] = Var(node.output[0], top, (P, 1, T, 1), out_shape)

    def op_ReduceMean(self, node, a):
        self._reduce(node, a, "MEAN")

    def op_ReduceSum(self, node, a):
        self._reduce(node, a, "SUM")

    def op_ReduceMax(self, node, a):
        self._reduce(node, a, "MAX")

    # ---- dense -------------------------------------------------------------
    def _inner_product(self, x, axis, W, b, name):
        """W: [N, K] (Caffe's layout)."""
        top = self.out()
        lp = self.layer("InnerProduct", name, [x], [top], [W] + ([b] if b is not None else []))
        ip = lp.inner_product_param
        ip.num_output = W.shape[0]
        if axis != 1:
            ip.axis = axis
        if b is None:
            ip.bias_term = False

    def op_Gemm(self, node, a):
        if a.get("transA", 0):
            raise Unsupported("Gemm with transA=1 on a computed input has no Caffe equivalent")
        B = self.const(node.input[1], "B")
        C = self.opt_const(2)
        shape = self.shape(node.input[0])
        if B.ndim != 2:
            raise NodeError(node, f"B {node.input[1]!r} has shape {list(B.shape)}; Gemm "
                                  "takes a 2-D B")
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        W = (B if a.get("transB", 0) else B.T).astype(np.float64) * alpha
        n = W.shape[0]
        # B must fit the input (the error was a shape mismatch of the Net
        # build, or "the shape of output is not known statically")
        k = math.prod(shape[1:])
        if W.shape[1] != k:
            raise NodeError(node, f"B {node.input[1]!r} of shape {list(B.shape)} (transB "
                                  f"{a.get('transB', 0)}) takes {W.shape[1]} input columns; "
                                  f"input {node.input[0]!r} {list(shape)} has {k}")
        bias = None
        if C is not None and beta != 0:
            C = np.asarray(C, np.float64) * beta
            if C.size == 1:
                bias = np.full(n, C.ravel()[0])
            else:
                try:
                    c2 = np.broadcast_to(C, (shape[0], n))
                except ValueError:
                    raise NodeError(node, f"C {node.input[2]!r} of shape {list(C.shape)} does "
                                          f"not broadcast to the output [{shape[0]}, {n}]") \
                        from None
                if not np.all(c2 == c2[:1]):
                    raise Unsupported("Gemm's C varies along the rows; InnerProduct's bias "
                                      "cannot express it")
                bias = np.array(c2[0])
        x = self.blob(node.input[0])
        self._inner_product(x, 1, W.astype(np.float32), bias, self.lname())

    def op_MatMul(self, node, a):
        if not self.is_const(node.input[1]):
            if not self.extension_layers:
                raise Unsupported("MatMul of two computed tensors (attention) has no BVLC "
                                  "Caffe layer (--extension_layers writes caffe_ocl's MatMul)")
            self._matmul_computed(node)
            return
        B = self.const(node.input[1], "the second operand")
        if B.ndim != 2:
            raise Unsupported("MatMul maps to InnerProduct only with a 2-D constant weight")
        shape = self.shape(node.input[0])
        if len(shape) < 2:
            raise Unsupported("MatMul on a 1-D input")
        x = self.blob(node.input[0])
        bias = self.opt_const(2)    # an Add folded in (_fuse.py)
        self._inner_product(x, len(shape) - 1, np.ascontiguousarray(B.T),
                            None if bias is None else bias.reshape(-1), self.lname())

    # ---- normalization -------------------------------------------------------
    def op_BatchNormalization(self, node, a):
        if a.get("training_mode", 0):
            raise Unsupported("training_mode=1 (batch statistics) is not an inference op")
        if len([o for o in node.output if o]) > 1:
            raise Unsupported("BatchNormalization's running-statistics outputs are not "
                              "supported")
        gamma, beta, mean, var = (self.const(n) for n in node.input[1:5])
        x = self.blob(node.input[0])
        mid = self.new_blob(node.output[0] + "_bn")
        # ONNX's momentum m (PyTorch's 1 - momentum) as Caffe's
        # moving_average_fraction, the statistics stored as sums with the
        # scale factor 1 / (1 - m): Caffe's update (sum = m * sum + batch
        # stat, factor = m * factor + 1) then keeps the factor and gives
        # m * old + (1 - m) * batch, as ONNX/PyTorch do when the net trains.
        m = float(a.get("momentum", 0.9))
        factor = np.float32(1.0 / (1.0 - m)) if 0.0 < m < 1.0 else np.float32(1.0)
        lp = self.layer("BatchNorm", self.lname(), [x], [mid],
                        [np.asarray(mean, np.float32) * factor,
                         np.asarray(var, np.float32) * factor, np.full(1, factor, np.float32)])
        if 0.0 < m < 1.0:
            lp.batch_norm_param.moving_average_fraction = m
        lp.batch_norm_param.use_global_stats = True
        lp.batch_norm_param.eps = float(a.get("epsilon", 1e-5))
        lp = self.layer("Scale", self.lname() + "_scale", [mid], [self.out()], [gamma, beta])
        lp.scale_param.bias_term = True

    def op_InstanceNormalization(self, node, a):
        """y = scale * (x - mean) / sqrt(var + eps) + B per (image, channel)
        over the other axes (GroupNorm exports as this over an (N, G, -1)
        reshape: PoolFormer, BiT, detection heads). Caffe's MVN divides by
        sqrt(var) + eps instead, so only its mean subtraction is used and the
        rest is written out: MVN (normalize_variance false) -> Power 2 ->
        Reduction MEAN over the (N, C, L, 1) view's last axes -> Power
        (shift eps, power -0.5) -> Scale by that (axis 0) -> Scale with
        ``scale`` and ``B`` (left out where they are ones and zeros)."""
        shape = self.shape(node.input[0])
        if len(shape) < 3:
            raise Unsupported(f"a {len(shape)}-D input (InstanceNormalization takes N, C and "
                              "at least one more axis)")
        gamma = self.const(node.input[1], "scale").astype(np.float32).ravel()
        beta = self.const(node.input[2], "B").astype(np.float32).ravel()
        n, c = shape[0], shape[1]
        if gamma.size != c or beta.size != c:
            raise NodeError(node, f"scale and B have {gamma.size} and {beta.size} values; "
                                  f"the input has {c} channels")
        eps = float(a.get("epsilon", 1e-5))
        L = int(np.prod(shape[2:]))
        base = self.lname()
        x4 = self._reshaped(node.input[0], (n, c, L, 1), f"{base}_x")
        xc = self.new_blob(f"{base}_centred")
        lp = self.layer("MVN", f"{base}_centred", [x4], [xc])
        lp.mvn_param.normalize_variance = False
        sq = self._power(xc, self.new_blob(f"{base}_sq"), f"{base}_sq", power=2.0)
        var = self.new_blob(f"{base}_var")
        lp = self.layer("Reduction", f"{base}_var", [sq], [var])
        lp.reduction_param.operation = caffe_pb2.ReductionParameter.MEAN
        lp.reduction_param.axis = 2
        inv = self._power(var, self.new_blob(f"{base}_inv"), f"{base}_inv", power=-0.5,
                          shift=eps)
        affine = not (np.all(gamma == 1) and np.all(beta == 0))
        y = self.new_blob(f"{base}_normed") if affine else self.new_blob(f"{base}_y")
        self._scale_or_bias("Scale", xc, 0, (n, c), bottom2=inv, top=y)
        if affine:
            top = self.new_blob(f"{base}_y")
            lp = self.layer("Scale", f"{base}_affine", [y], [top], [gamma, beta])
            lp.scale_param.bias_term = True
            y = top
        self.refs[node.output[0]] = Var(node.output[0], y, (n, c, L, 1), shape)

    def op_LRN(self, node, a):
        lp = self.layer("LRN", self.lname(), [self.blob(node.input[0])], [self.out()])
        p = lp.lrn_param
        p.local_size = int(a["size"])
        p.alpha = float(a.get("alpha", 1e-4))
        p.beta = float(a.get("beta", 0.75))
        p.k = float(a.get("bias", 1.0))

    # ---- activations -------------------------------------------------------
    def _unary(self, type_, setup=None):
        lp = self.layer(type_, self.lname(), [self.blob(self.node.input[0])], [self.out()])
        if setup:
            setup(lp)
        return lp

    def op_Relu(self, node, a):
        self._unary("ReLU")

    def op_LeakyRelu(self, node, a):
        self._unary("ReLU", lambda lp: setattr(lp.relu_param, "negative_slope",
                                               float(a.get("alpha", 0.01))))

    def op_Sigmoid(self, node, a):
        self._unary("Sigmoid")

    def op_Tanh(self, node, a):
        self._unary("TanH")

    def op_Abs(self, node, a):
        self._unary("AbsVal")

    def op_Exp(self, node, a):
        self._unary("Exp")

    def op_Log(self, node, a):
        self._unary("Log")

    def op_Softplus(self, node, a):
        self._unary("BNLL")

    def op_Elu(self, node, a):
        self._unary("ELU", lambda lp: setattr(lp.elu_param, "alpha",
                                              float(a.get("alpha", 1.0))))

    def _power(self, src, top, name, power=1.0, scale=1.0, shift=0.0):
        lp = self.layer("Power", name, [src], [top])
        pp = lp.power_param
        if power != 1.0:
            pp.power = power
        if scale != 1.0:
            pp.scale = scale
        if shift != 0.0:
            pp.shift = shift
        return top

    def _eltwise(self, name, bottoms, top, op="PROD", coeffs=None):
        """An Eltwise ``op`` (PROD, SUM or MAX; SUM's ``coeffs``) of
        ``bottoms`` into ``top``; returns ``top``."""
        lp = self.layer("Eltwise", name, bottoms, [top])
        lp.eltwise_param.operation = getattr(caffe_pb2.EltwiseParameter, op)
        if coeffs is not None:
            lp.eltwise_param.coeff.extend(coeffs)
        return top

    def op_Sqrt(self, node, a):
        self._power(self.blob(node.input[0]), self.out(), self.lname(), power=0.5)

    def op_Neg(self, node, a):
        self._power(self.blob(node.input[0]), self.out(), self.lname(), scale=-1.0)

    def op_Reciprocal(self, node, a):
        self._power(self.blob(node.input[0]), self.out(), self.lname(), power=-1.0)

    def op_Pow(self, node, a):
        e = self.const(node.input[1], "exponent")
        if e.size != 1:
            raise Unsupported("Pow maps to Power only with a scalar constant exponent")
        self._power(self.blob(node.input[0]), self.out(), self.lname(), power=float(e.ravel()[0]))

    def op_PRelu(self, node, a):
        slope = self.const(node.input[1], "slope")
        shape = self.shape(node.input[0])
        x = self.blob(node.input[0])
        lp = self.layer("PReLU", self.lname(), [x], [self.out()])
        if slope.size == 1:
            lp.prelu_param.channel_shared = True
            lp.blobs.add().CopyFrom(array_to_blobproto(slope.reshape(()).astype(np.float32)))
            return
        full = np.broadcast_to(slope, shape)
        ch = full.reshape(shape[0], shape[1], -1)[0, :, 0]
        if len(shape) < 2 or not np.array_equal(full, np.broadcast_to(
                ch.reshape((1, -1) + (1,) * (len(shape) - 2)), shape)):
            raise Unsupported("PRelu slope must be per channel (axis 1) or one value")
        lp.blobs.add().CopyFrom(array_to_blobproto(ch.astype(np.float32)))

    def _clip_bounds(self, node, a):
        if self.opset < 11:
            return a.get("min", -FLT_MAX), a.get("max", FLT_MAX)
        lo = self.opt_const(1)
        hi = self.opt_const(2)
        return (-FLT_MAX if lo is None else float(lo)), (FLT_MAX if hi is None else float(hi))

    def op_Clip(self, node, a):
        lo, hi = self._clip_bounds(node, a)
        if lo == 0.0 and hi >= FLT_MAX:
            self._unary("ReLU")
            return
        lp = self._unary("Clip")
        lp.clip_param.min = lo
        lp.clip_param.max = hi

    def _hard_sigmoid(self, src, top, alpha, beta, name):
        mid = self.new_blob(top + "_affine")
        self._power(src, mid, name + "_affine", scale=alpha, shift=beta)
        lp = self.layer("Clip", name, [mid], [top])
        lp.clip_param.min = 0.0
        lp.clip_param.max = 1.0
        return top

    def op_HardSigmoid(self, node, a):
        self._hard_sigmoid(self.blob(node.input[0]), self.out(), float(a.get("alpha", 0.2)),
                           float(a.get("beta", 0.5)), self.lname())

    def op_HardSwish(self, node, a):
        x = self.blob(node.input[0])
        gate = self._hard_sigmoid(x, self.new_blob(node.output[0] + "_gate"), 1.0 / 6, 0.5,
                                  self.lname() + "_gate")
        self._eltwise(self.lname(), [x, gate], self.out())

    def _softmax(self, log_):
        node, shape = self.node, self.shape(self.node.input[0])
        a = node_attrs(node)
        default = -1 if self.opset >= 13 else 1
        axis = axis_in(a.get("axis", default), len(shape), node)
        x = self.blob(node.input[0])
        trailing = int(np.prod(shape[axis + 1:]))
        if self.opset >= 13 or trailing == 1:
            top = self.new_blob(node.output[0] + "_softmax") if log_ else self.out()
            lp = self.layer("Softmax", self.lname(), [x], [top])
            if axis != 1:
                lp.softmax_param.axis = axis
        else:   # opset < 13: softmax over the flattened [axis:] block
            flat = self.new_blob(node.output[0] + "_flat")
            lp = self.layer("Reshape", flat, [x], [flat])
            lp.reshape_param.shape.dim.extend([int(np.prod(shape[:axis])), -1])
            sm = self.new_blob(node.output[0] + "_softmax")
            self.layer("Softmax", self.lname(), [flat], [sm])
            if log_:
                lg = self.new_blob(node.output[0] + "_log")
                self.layer("Log", self.lname() + "_log", [sm], [lg])
                sm = lg
            self.refs[node.output[0]] = Var(node.output[0], sm,
                                            (int(np.prod(shape[:axis])),
                                             int(np.prod(shape[axis:]))), shape)
            return
        if log_:
            self.layer("Log", self.lname() + "_log", [top], [self.out()])

    def op_Softmax(self, node, a):
        self._softmax(False)

    def op_LogSoftmax(self, node, a):
        self._softmax(True)

    def op_Dropout(self, node, a):
        if len(node.output) > 1 and node.output[1]:
            raise Unsupported("Dropout's mask output is not supported")
        ratio = a.get("ratio", 0.5)
        if self.opset >= 12 and len(node.input) > 1 and node.input[1]:
            ratio = float(self.const(node.input[1]))
        lp = self._unary("Dropout")
        lp.dropout_param.dropout_ratio = float(ratio)

    def op_Identity(self, node, a):
        self.alias(0, node.input[0])

    def op_Cast(self, node, a):
        from onnx import TensorProto
        if a.get("to") not in (TensorProto.FLOAT,):
            raise Unsupported("Cast of a computed tensor to a non-float type")
        self.alias(0, node.input[0])

    # ---- elementwise with broadcasting ---------------------------------------
    def _scale_or_bias(self, kind, x, axis, nax_shape, blob=None, bottom2=None, top=None):
        top = top or self.out()
        bottoms = [x] + ([bottom2] if bottom2 else [])
        lp = self.layer(kind, self.lname(), bottoms, [top],
                        [blob] if blob is not None else [])
        p = lp.scale_param if kind == "Scale" else lp.bias_param
        if axis != 1:
            p.axis = axis
        if blob is not None and len(nax_shape) != 1:
            p.num_axes = len(nax_shape)
        return top

    def _binary(self, node, op):
        A, B = node.input[0], node.input[1]
        out_shape = self.shape(node.output[0])
        ca, cb = self.is_const(A), self.is_const(B)
        if ca and not cb and op in ("Add", "Mul"):
            A, B, ca, cb = B, A, False, True
        if ca and not cb:   # c - x, c / x
            c = self.const(A)
            x = self.blob(B)
            if self.shape(B) != out_shape:
                raise Unsupported("the computed operand must have the output's shape")
            mid = self.new_blob(node.output[0] + "_pre")
            if op == "Sub":
                self._power(x, mid, self.lname() + "_neg", scale=-1.0)
                self._const_op("Add", mid, out_shape, c)
            else:
                self._power(x, mid, self.lname() + "_recip", power=-1.0)
                self._const_op("Mul", mid, out_shape, c)
            return
        if cb:
            c = self.const(B).astype(np.float64)
            if self.shape(A) != out_shape:
                raise Unsupported("broadcasting that enlarges the computed operand has no "
                                  "Caffe equivalent")
            if op == "Sub":
                op, c = "Add", -c
            elif op == "Div":
                op, c = "Mul", 1.0 / c
            self._const_op(op, self.blob(A), out_shape, c)
            return
        sa, sb = self.shape(A), self.shape(B)
        if sa == sb:
            xa, xb = self.blob(A), self.blob(B)
            if op == "Div":
                inv = self._power(xb, self.new_blob(node.output[0] + "_recip"),
                                  self.lname() + "_recip", power=-1.0)
                xb, op = inv, "Mul"
            self._eltwise(self.lname(), [xa, xb], self.out(), "PROD" if op == "Mul" else "SUM",
                          [1.0, -1.0] if op == "Sub" else None)
            return
        # broadcast between two computed tensors: the small one must cover a
        # contiguous block of the big one's axes
        if sa == out_shape:
            big, small = A, B
        elif sb == out_shape and op in ("Add", "Mul"):
            big, small = B, A
        else:
            # the first operand enlarged by broadcasting (FocalNet's
            # (N, C, 1, 1) * (N, 1, H, W); c - x for a computed c): tiled
            # to the output's shape, the second then broadcast as usual
            full = (1,) * (len(out_shape) - len(sa)) + tuple(sa)
            if len(sa) > len(out_shape) or any(d not in (1, o) for d, o in
                                                zip(full, out_shape)):
                raise Unsupported(f"broadcasting {sa} with {sb} has no Caffe equivalent")
            big, small = self._tiled(A, full, [i for i, (d, o) in enumerate(
                zip(full, out_shape)) if d != o], out_shape), B
        bs, ss = self.shape(big), self.shape(small)
        ss_full = (1,) * (len(bs) - len(ss)) + tuple(ss)
        nz = [i for i, d in enumerate(ss_full) if d != 1]
        if not nz:
            # one value (a per-image statistic at batch 1: PoolFormer's
            # GroupNorm(1) written as ReduceMean over C, H, W): the block is
            # an axis of size 1 of the big tensor, e.g. its batch axis
            nz = [i for i, d in enumerate(bs) if d == 1][:1]
            if not nz:
                raise Unsupported(f"broadcasting a computed scalar over {tuple(bs)} (no axis "
                                  "of size 1 to carry it) has no Caffe equivalent")
        lo, hi = nz[0], nz[-1]
        if ss_full[lo:hi + 1] != bs[lo:hi + 1]:
            if any(d not in (1, b) for d, b in zip(ss_full, bs)):
                raise Unsupported(f"broadcasting {sa} with {sb} has no Caffe equivalent")
            # axes of size 1 between the small operand's others (a
            # per-pixel statistic (N, 1, H, W) against (N, C, H, W): a
            # LayerNorm over channels): tiled, then the block is contiguous
            small = self._tiled(small, ss_full, [i for i in range(lo, hi + 1)
                                                 if ss_full[i] != bs[i]], bs)
            ss_full = tuple(self.shape(small))
        block = bs[lo:hi + 1]
        r = self.var(small)
        v = r.view(self.new_blob(small + "_block"), block, None if r.index is None else
                   r.index.reshape(block))
        sblob = self.materialize(v)
        xbig = self.blob(big)
        if op == "Mul":
            self._scale_or_bias("Scale", xbig, lo, block, bottom2=sblob)
        elif op == "Add":
            self._scale_or_bias("Bias", xbig, lo, block, bottom2=sblob)
        elif op == "Sub":
            neg = self._power(sblob, self.new_blob(small + "_neg"), self.lname() + "_neg",
                              scale=-1.0)
            self._scale_or_bias("Bias", xbig, lo, block, bottom2=neg)
        else:
            inv = self._power(sblob, self.new_blob(small + "_recip"), self.lname() + "_recip",
                              power=-1.0)
            self._scale_or_bias("Scale", xbig, lo, block, bottom2=inv)

    def _tiled(self, name, shape, axes, big, top=None):
        """Tensor ``name`` seen as ``shape`` with each of ``axes`` tiled to
        its size in ``big`` (Caffe's Tile, an axis at a time; the last one
        writes blob ``top`` where given): the name of the tiled tensor."""
        x = self._reshaped(name, shape, name + "_ranked")
        cur = list(shape)
        for k, ax in enumerate(axes):
            cur[ax] = big[ax]
            out = top if top and k == len(axes) - 1 else self.new_blob(f"{name}_tiled{ax}")
            lp = self.layer("Tile", f"{self.lname()}_tile{ax}", [x], [out])
            lp.tile_param.axis = ax
            lp.tile_param.tiles = big[ax]
            x = out
        # a name of its own: with no axis to tile, x is the input's blob,
        # whose tensor keeps its shape for its other readers
        key = self.new_blob(f"{name}_tiled")
        self.refs[key] = Var(key, x, tuple(cur))
        self.p.shapes[key] = tuple(cur)
        return key

    def _const_op(self, op, x, shape, c):
        """x (op) c for a constant c that broadcasts to x's shape."""
        c = np.asarray(c, np.float64)
        if c.size == 1:
            v = float(c.ravel()[0])
            if op == "Add":
                self._power(x, self.out(), self.lname(), shift=v)
            else:
                self._power(x, self.out(), self.lname(), scale=v)
            return
        if c.ndim > len(shape):
            raise Unsupported("constant has more dimensions than the computed operand")
        full = (1,) * (len(shape) - c.ndim) + c.shape
        c = c.reshape(full)
        nz = [i for i, d in enumerate(full) if d != 1]
        lo, hi = nz[0], nz[-1]
        block = tuple(shape[lo:hi + 1])
        blob = np.broadcast_to(c.reshape(full[lo:hi + 1]), block).astype(np.float32)
        self._scale_or_bias("Scale" if op == "Mul" else "Bias", x, lo, block, blob=blob)

    def op_Add(self, node, a):
        self._binary(node, "Add")

    def op_Sub(self, node, a):
        self._binary(node, "Sub")

    def op_Mul(self, node, a):
        self._binary(node, "Mul")

    def op_Div(self, node, a):
        self._binary(node, "Div")

    def _variadic(self, op):
        node = self.node
        if len(node.input) == 1:
            self.alias(0, node.input[0])
            return
        shapes = {self.shape(i) for i in node.input}
        if len(shapes) != 1:
            raise Unsupported(f"{node.op_type} with broadcasting has no Caffe equivalent")
        self._eltwise(self.lname(), [self.blob(i) for i in node.input], self.out(), op)

    def op_Sum(self, node, a):
        self._variadic("SUM")

    def op_Max(self, node, a):
        self._variadic("MAX")

    # ---- shape and data movement ---------------------------------------------
    def op_Concat(self, node, a):
        # the rank from an input, the axis checked first: an axis out of
        # range left the output's shape unknown, and the error said only that
        def dims(i):
            return tuple(self.p.consts[i].shape) if self.is_const(i) else self.shape(i)
        first = next((i for i in node.input if i), None)
        axis = axis_in(a["axis"], len(dims(first)) if first else 0, node)
        self.shape(node.output[0])
        ins = [i for i in node.input if i and int(np.prod(dims(i)))]
        if len(ins) == 1 and not self.is_const(ins[0]):
            self.alias(0, ins[0])
            return
        # a constant piece (ViT's class token before the patches): a
        # Parameter layer holding it
        lp = self.layer("Concat", self.lname(), [self._const_blob(i) if self.is_const(i)
                                                 else self.blob(i) for i in ins], [self.out()])
        if axis != 1:
            lp.concat_param.axis = axis

    def _slice_pieces(self, x, shape, axis, sizes, outputs, base):
        """Slice ``x`` along ``axis`` into ``sizes``; outputs[i] None = unused."""
        points = list(np.cumsum(sizes)[:-1])
        tops = [o if o else self.new_blob(f"{base}_unused{i}") for i, o in enumerate(outputs)]
        if len(tops) == 1:
            return
        lp = self.layer("Slice", base, [x], tops)
        lp.slice_param.axis = axis
        lp.slice_param.slice_point.extend(int(p) for p in points)
        unused = [t for t, o in zip(tops, outputs) if not o]
        if unused:
            self.layer("Silence", base + "_silence", unused, [])

    def op_Split(self, node, a):
        shape = self.shape(node.input[0])
        axis = axis_in(a.get("axis", 0), len(shape), node)
        n = len(node.output)
        if "split" in a:
            sizes = list(a["split"])
        elif len(node.input) > 1 and node.input[1]:
            sizes = [int(v) for v in self.const(node.input[1])]
        else:
            L = shape[axis]
            k = -(-L // n)
            sizes = [k] * (n - 1) + [L - k * (n - 1)]
        x = self.blob(node.input[0])
        if n == 1:
            self.alias(0, node.input[0])
            return
        outs = []
        for i, o in enumerate(node.output):
            if o:
                self.out(i)
            outs.append(o or None)
        self._slice_pieces(x, shape, axis, sizes, outs, self.lname())

    def _slice_arg(self, node, a, i, key, default):
        """Slice's starts/ends/axes/steps (input i from opset 10, else the
        attribute ``key``) as a list of ints; a float, bool or 2-D tensor
        (or a missing attribute) is an error naming the node, where it was
        "the shape of output is not known statically" or a KeyError."""
        if self.opset < 10:
            v = a.get(key, default)
            if v is None:
                raise NodeError(node, f"at opset {self.opset} Slice takes {key} as an "
                                      "attribute (none given)")
            if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
                raise NodeError(node, f"{key} {v!r} must be a list of integers")
            return list(v)
        if len(node.input) <= i or not node.input[i]:
            if default is None:
                raise NodeError(node, f"Slice needs its {key} input")
            return default
        c = self.const(node.input[i], key)
        if c.dtype not in (np.int32, np.int64) or c.ndim != 1:
            raise NodeError(node, f"{key} {node.input[i]!r} is a {c.ndim}-D {c.dtype} tensor; "
                                  "Slice takes a 1-D int32 or int64 one")
        return [int(v) for v in c]

    def op_Slice(self, node, a):
        shape = self.shape(node.input[0])
        starts = self._slice_arg(node, a, 1, "starts", None)
        ends = self._slice_arg(node, a, 2, "ends", None)
        axes = self._slice_arg(node, a, 3, "axes", list(range(len(starts))))
        steps = self._slice_arg(node, a, 4, "steps", [1] * len(starts)) \
            if self.opset >= 10 else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            # zip() cut them to the shortest: empty starts made the Slice an
            # identity, and the error named the next node
            raise NodeError(node, f"starts {starts}, ends {ends}, axes {axes} and steps "
                                  f"{steps} differ in length")
        norm = [axis_in(ax, len(shape), node) for ax in axes]
        if len(set(norm)) != len(norm):
            raise NodeError(node, f"axes {axes} name an axis twice")
        x = self.blob(node.input[0])
        cur_shape = list(shape)
        todo = []
        for st, en, ax, sp in zip(starts, ends, norm, steps):
            if sp < 1:
                raise Unsupported("Slice with a step below 1 has no Caffe equivalent")
            L = shape[ax]
            b = min(max(st + L if st < 0 else st, 0), L)
            e = min(max(en + L if en < 0 else en, 0), L)
            if e <= b:
                raise Unsupported("empty slice")
            count = -(-(e - b) // sp)
            if count == 1:
                # one value (a step past the end: x[i::2**31]): a plain
                # slice, no run of count * sp values (nor its padding)
                e, sp = b + 1, 1
            # a run of count * sp values holding the kept ones at offset r
            # (where none fits inside the axis: from b, the axis padded)
            r = max(0, b + count * sp - L)
            if r > min(b, sp - 1):
                r = 0
            if (b, e, sp) != (0, L, 1):
                todo.append((ax, b, e, sp, count, r))
        if not todo:
            self.alias(0, node.input[0])
            return
        for k, (ax, b, e, sp, count, r) in enumerate(todo):
            last = k == len(todo) - 1
            top = node.output[0] if last else None
            if sp == 1:
                x = self.crop(x, cur_shape, ax, b, e - b, self.lname(), top=top)
                cur_shape[ax] = e - b
                continue
            # every sp-th value (Swin's and LeViT's x[:, 0::2]): a run of
            # count * sp values seen as (count, sp), the one at offset r of
            # each kept (Slice, Reshape, Slice, Reshape)
            extra = b - r + count * sp - cur_shape[ax]
            if extra > 0:
                # LeViT's x[:, ::2] of 7 rows: the run 0..8 needs one more
                # row (zeros, never kept: DummyData + Concat)
                x, padded = self.pad(x, cur_shape, {ax: (0, extra)}, 0.0, self.lname())
                cur_shape = list(padded)
            x = self.crop(x, cur_shape, ax, b - r, count * sp, self.lname())
            pairs = cur_shape[:ax] + [count, sp] + cur_shape[ax + 1:]
            x = self.materialize(Var(self.new_blob(f"{self.lname()}_steps{ax}"), x,
                                     cur_shape[:ax] + [count * sp] + cur_shape[ax + 1:],
                                     pairs))
            x = self.crop(x, pairs, ax + 1, r, 1, self.lname())
            cur_shape[ax] = count
            x = self.materialize(Var(top or self.new_blob(f"{self.lname()}_step{ax}"), x,
                                     pairs[:ax + 1] + [1] + pairs[ax + 2:], cur_shape))
        self.out()

    def op_Gather(self, node, a):
        """x[:, i] / x[:, i:j] with constant indices -> Slice (+ a view)."""
        shape = self.shape(node.input[0])
        axis = axis_in(a.get("axis", 0), len(shape), node)
        idx = self.const(node.input[1], "indices").astype(np.int64)
        flat = np.where(idx < 0, idx + shape[axis], idx).ravel()
        if idx.ndim > 1 or not len(flat) or np.any(np.diff(flat) != 1):
            raise Unsupported("Gather maps to Slice only with a scalar or a contiguous "
                              "increasing run of constant indices")
        x = self.blob(node.input[0])
        piece = list(shape)
        piece[axis] = len(flat)
        top = self.crop(x, shape, axis, int(flat[0]), len(flat), self.lname())
        self.refs[node.output[0]] = Var(node.output[0], top, piece,
                                        self.shape(node.output[0]))

    def op_Pad(self, node, a):
        mode = a.get("mode", "constant")
        if mode not in ("constant", "reflect", "edge", "wrap"):
            raise Unsupported(f"Pad mode {mode!r} is not an ONNX Pad mode")
        shape = self.shape(node.input[0])
        if self.opset < 11:
            pads = list(a["pads"])
            value = float(a.get("value", 0.0))
        else:
            pads = [int(v) for v in self.const(node.input[1])]
            v = self.opt_const(2)
            value = 0.0 if v is None else float(v)
            axes_c = self.opt_const(3)
            if axes_c is not None:
                full = [0] * (2 * len(shape))
                axes = [axis_in(x, len(shape), node) for x in axes_c]
                for i, ax in enumerate(axes):
                    full[ax] = pads[i]
                    full[ax + len(shape)] = pads[i + len(axes)]
                pads = full
        n = len(shape)
        if any(p < 0 for p in pads):
            raise Unsupported("negative pads (cropping) are not supported")
        spec = {ax: (pads[ax], pads[ax + n]) for ax in range(n) if pads[ax] or pads[ax + n]}
        if not spec:
            self.alias(0, node.input[0])
            return
        if mode != "constant":
            # reflect / edge / wrap: each padded axis a 0/1 matrix (numpy.pad's
            # modes are ONNX's), applied as for resizing
            if n != 4 or set(spec) - {2, 3}:
                raise Unsupported(f"Pad mode {mode!r} maps to Caffe only on the H and W axes "
                                  "of a 4-D tensor")
            mats = []
            for ax in (2, 3):
                before, after = spec.get(ax, (0, 0))
                if mode == "reflect" and max(before, after) >= shape[ax]:
                    raise NodeError(node, f"reflect pads {before}, {after} on an axis of "
                                          f"{shape[ax]}: at most {shape[ax] - 1}")
                mats.append(None if ax not in spec else np.pad(
                    np.eye(shape[ax]), ((before, after), (0, 0)), mode=mode))
            self._axis_products(node, mats, shape)
            return
        x = self.blob(node.input[0])
        b, s = x, shape
        for ax in sorted(spec):
            b, s = self.pad(b, s, {ax: spec[ax]}, value, self.lname())
        self.refs[node.output[0]] = Var(node.output[0], b, s)

    def op_Expand(self, node, a):
        """Broadcast to a shape. Where every reader is an elementwise
        operator that broadcasts by itself (Add, Sub, Mul, Div, Sum, Max)
        to the same result, they read the input as it is (ECA's and SE's
        ``x * y.expand_as(x)``: no copy); else the input is tiled (Caffe's
        Tile, an axis at a time)."""
        shape = tuple(self.shape(node.input[0]))
        target = [int(v) for v in self.const(node.input[1], "shape").ravel()]
        try:
            out = tuple(np.broadcast_shapes(shape, tuple(target)))
        except ValueError:
            raise NodeError(node, f"shape {target} does not broadcast with the input's "
                                  f"{list(shape)}") from None
        name = node.output[0]
        readers = [m for m in self.p.nodes if name in m.input]
        if name not in self.p.outputs and readers and all(
                self._broadcasts_alike(m, name, shape) for m in readers):
            self.p.shapes[name] = shape
            self.alias(0, node.input[0])
            return
        cur = (1,) * (len(out) - len(shape)) + shape
        axes = [i for i, (c, o) in enumerate(zip(cur, out)) if c != o]
        if not axes:
            self.alias(0, node.input[0])
            return
        self._tiled(node.input[0], cur, axes, out, top=self.out(shape=out))

    def _broadcasts_alike(self, reader, name, shape):
        """Whether ``reader`` (an ONNX node reading ``name``) gives its own
        output shape with ``shape`` in place of ``name``'s: an elementwise
        broadcasting operator whose other inputs carry the full shape."""
        if reader.op_type not in ("Add", "Sub", "Mul", "Div", "Sum", "Max"):
            return False
        others = []
        for i in reader.input:
            if i == name:
                continue
            s = self.p.shapes.get(i)
            if s is None and i in self.p.consts:
                s = self.p.consts[i].shape
            if s is None:
                return False
            others.append(tuple(s))
        want = self.p.shapes.get(reader.output[0])
        try:
            return want is not None and tuple(np.broadcast_shapes(shape, *others)) == tuple(want)
        except ValueError:
            return False

    def _moved_view(self, node, reshape, perm, out_shape):
        """The node's output as a view of its input: reshaped, transposed by
        ``perm``, reshaped to ``out_shape`` (materialized by ``_space_depth``
        when read)."""
        r = self.var(node.input[0])
        idx = r.index if r.index is not None else np.arange(
            int(np.prod(r.shape))).reshape(r.shape)
        idx = np.ascontiguousarray(idx.reshape(reshape).transpose(perm)).reshape(out_shape)
        self.refs[node.output[0]] = r.view(node.output[0], tuple(out_shape), idx, node)

    def op_SpaceToDepth(self, node, a):
        n, c, h, w = self._block_shape(node, a)
        b = int(a["blocksize"])
        if h % b or w % b:
            raise NodeError(node, f"blocksize {b} does not divide {h} x {w}")
        self._moved_view(node, (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4),
                         (n, c * b * b, h // b, w // b))

    def op_DepthToSpace(self, node, a):
        n, c, h, w = self._block_shape(node, a)
        b = int(a["blocksize"])
        if c % (b * b):
            raise NodeError(node, f"blocksize {b}: {c} channels are no multiple of {b * b}")
        if a.get("mode", "DCR") == "DCR":
            reshape, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            reshape, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
        self._moved_view(node, reshape, perm, (n, c // (b * b), h * b, w * b))

    def _block_shape(self, node, a):
        shape = self.shape(node.input[0])
        if len(shape) != 4:
            raise NodeError(node, f"input of shape {list(shape)}: {node.op_type} takes 4-D")
        if int(a.get("blocksize", 0)) < 1:
            raise NodeError(node, f"blocksize {a.get('blocksize')!r}: a positive integer")
        return shape

    def op_Flatten(self, node, a):
        shape = self.shape(node.input[0])
        axis = axis_in(a.get("axis", 1), len(shape), node, extra=1) if shape else 0
        out = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
        self.set_view(0, node.input[0], out)

    def op_Reshape(self, node, a):
        shape = self.shape(node.input[0])
        if self.opset < 5:
            raise Unsupported("Reshape before opset 5 (its shape an attribute) is not supported")
        if len(node.input) < 2 or not node.input[1]:
            raise NodeError(node, "Reshape needs its shape input")
        spec = self.const(node.input[1], "shape")
        # ONNX's shape is a 1-D int64 tensor; a float or 2-D one left onnx's
        # inference without a shape and the error without a reason
        if spec.dtype != np.int64 or spec.ndim != 1:
            raise NodeError(node, f"shape {node.input[1]!r} is a {spec.ndim}-D {spec.dtype} "
                                  "tensor; Reshape takes a 1-D int64 one")
        allowzero = int(a.get("allowzero", 0)) if self.opset >= 14 else 0
        out = reshape_target(node, shape, [int(v) for v in spec], allowzero)
        self.p.shapes[node.output[0]] = out
        self.set_view(0, node.input[0], out)

    def op_Squeeze(self, node, a):
        self.set_view(0, node.input[0], self.shape(node.output[0]))

    def op_Unsqueeze(self, node, a):
        self.set_view(0, node.input[0], self.shape(node.output[0]))

    def op_Transpose(self, node, a):
        shape = self.shape(node.input[0])
        perm = a.get("perm", list(reversed(range(len(shape)))))
        # a repeated, missing or out-of-range axis left onnx's inference
        # without a shape (no reason given); a short perm was numpy's "axes
        # don't match array"
        if (not isinstance(perm, list) or not all(isinstance(p, int) for p in perm)
                or sorted(perm) != list(range(len(shape)))):
            raise NodeError(node, f"perm {perm!r} is not a permutation of the {len(shape)} "
                                  f"axes of its input {list(shape)}")
        out = tuple(shape[p] for p in perm)
        self.p.shapes[node.output[0]] = out
        self.set_view(0, node.input[0], out, transpose=perm)


def _channel_permutation(idx, shape):
    """perm such that view[n, c, ...] == blob(as shape)[n, perm[c], ...], or None."""
    if len(shape) < 2:
        return None
    n, c = shape[0], shape[1]
    inner = int(np.prod(shape[2:]))
    i3 = idx.reshape(n, c, inner)
    first = i3[0, :, 0]
    if np.any(first % inner):
        return None
    perm = first // inner
    if sorted(perm.tolist()) != list(range(c)):
        return None
    base = np.arange(n * c * inner).reshape(n, c, inner)
    if not np.array_equal(i3, base[:, perm, :]):
        return None
    return perm


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------

def convert(model, input_shapes=None, batch=1, extension_layers=False):
    """ONNX model (path, bytes or ModelProto) -> caffe_pb2.NetParameter whose
    layers carry their weight blobs. Raises UnsupportedModelError listing every
    node without a Caffe equivalent. ``extension_layers``: where no BVLC
    layer expresses a node, caffe_ocl's MatMul (two computed inputs) and
    the SSD fork's Permute (any transpose) are written."""
    m, where = load_model(model)
    try:
        return Converter(m, input_shapes, batch, extension_layers).run()
    except UnsupportedModelError as e:
        if where.startswith("<"):
            raise
        raise UnsupportedModelError(e.items, e.what, where) from None
    except CaffeOclError as e:
        if where.startswith("<") or where in str(e):
            raise
        raise OnnxConversionError(f"{where}: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise OnnxConversionError(f"{where}: the graph is nested too deeply") from None
    except MemoryError:
        raise OnnxConversionError(f"{where}: out of host memory converting it (a tensor "
                                  "claims a huge shape?)") from None
    except Exception as e:   # noqa: BLE001 - a malformed graph reaching onnx/numpy
        # (a node reading a tensor nothing makes, an initializer whose data
        # does not fill its dims, an attribute of the wrong type): one line
        msg = " ".join(str(e).split())[:300]
        raise OnnxConversionError(f"{where}: malformed ONNX model ({type(e).__name__}: "
                                  f"{msg})") from None


def _model_where(onnx_path):
    """The ONNX model as its errors name it: its path, or "<ONNX model>"
    for one given as a ModelProto or bytes."""
    return os.fspath(onnx_path) if isinstance(onnx_path, (str, os.PathLike)) else "<ONNX model>"


def _check_loads(deploy, weights, onnx_path):
    """Build the converted net as caffe_ocl.Net and copy its weights in
    before anything is written: a model whose attributes or initializers
    the converter took as given (a Conv bias of the wrong length, group 0,
    an axis past the rank) is an error naming the ONNX file and the layer,
    not a pair of files that do not load."""
    where = _model_where(onnx_path)
    try:
        Net(deploy, caffe_pb2.TEST, fold=False).copy_from(weights)
    except CaffeOclError as e:
        raise OnnxConversionError(f"{where}: the converted net does not load in caffe_ocl, "
                                  f"nothing written: {' '.join(str(e).split())}") from None


def split_weights(net):
    """(deploy NetParameter without blobs, NetParameter with blobs)."""
    deploy = caffe_pb2.NetParameter()
    deploy.CopyFrom(net)
    for lp in deploy.layer:
        del lp.blobs[:]
    return deploy, net


def onnx2caffe(onnx_path, prototxt_path, caffemodel_path, check=False, input_shapes=None,
               batch=1, out=None, extension_layers=False):
    """Convert and write both files (nothing is written when conversion fails).
    With ``check``, run caffe_ocl and ONNX Runtime on one random input and
    print the largest difference per output; returns that dict (or None)."""
    net = convert(onnx_path, input_shapes, batch, extension_layers)
    deploy, weights = split_weights(net)
    _check_loads(deploy, weights, onnx_path)
    write_text(deploy, os.fspath(prototxt_path))
    write_binary(weights, os.fspath(caffemodel_path))
    log.info("wrote %s and %s (%d layers)", prototxt_path, caffemodel_path, len(net.layer))
    if not check:
        return None
    try:
        report = compare(onnx_path, net)
    except OnnxConversionError as e:
        # the files are written; the comparison is what failed (ONNX Runtime
        # refusing the model): say so, naming the model (the line named none)
        raise OnnxConversionError(f"{_model_where(onnx_path)}: wrote {os.fspath(prototxt_path)} and "
                                  f"{os.fspath(caffemodel_path)}, but --check could not compare: "
                                  f"{e}") from None
    print(format_report(report), file=out or sys.stdout)
    return report
