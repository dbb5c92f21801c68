"""Operators on transposed tensors, run on the blob under the transpose
(a mixin of to_caffe.Converter).

ConvNeXt's blocks, and any model written channels-last in places, do
``x.permute(0, 2, 3, 1)`` -> LayerNorm over the last axis -> Linear ->
GELU -> Linear -> ``permute(0, 3, 1, 2)``. Caffe has no transpose layer
(BVLC's types only), but none is needed: a Transpose of a blob is kept as
a view ``Var.perm`` (to_caffe.set_view), and an operator whose inputs are
all views under one permutation is converted on the blobs themselves:

- element-wise operators (unary, and Add/Sub/Mul/Div/Pow/... with their
  constants transposed to the blob's axis order), the output the same view
  of the new blob;
- reductions, Softmax and Concat with their axes mapped to the blob's;
- MatMul with a constant weight contracting the axis that is the blob's
  channel axis: a 1x1 Convolution;
- LayerNormalization (opset 17) over the trailing axes, written out as
  ONNX writes it before opset 17 (ReduceMean, Sub, Pow, ReduceMean, Add,
  Sqrt, Div, Mul, Add) and converted node by node.

The Transpose back composes to the identity and reads the blob as it is.
A view that reaches any other operator is moved by to_caffe.materialize
(channel permutations, space-to-depth) or reported as before.
"""
import numpy as np
from onnx import NodeProto, helper

from ._common import Unsupported, node_attrs
from ._nodes import Var, axis_in

# operators computing each output element from the inputs' elements at the
# same (broadcast) position: they commute with any transpose of all inputs
_ELEMENTWISE = frozenset((
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Abs", "Exp", "Log", "Softplus", "Elu",
    "Erf", "Gelu", "Sqrt", "Neg", "Reciprocal", "Pow", "PRelu", "Clip", "HardSigmoid",
    "HardSwish", "Dropout", "Add", "Sub", "Mul", "Div", "Sum", "Max"))
_REDUCE = frozenset(("ReduceMean", "ReduceSum", "ReduceMax"))


class LayoutOps:
    """Converter methods for operators on ``Var.perm`` views."""

    def run_permuted(self, node, a):
        """Convert ``node`` on the blobs under its inputs' transpose when
        every computed input is a view transposed by one permutation; False
        when it does not apply (the node is converted as usual)."""
        computed = [i for i in node.input if i and not self.is_const(i)]
        refs = [self.refs.get(i) for i in computed]
        if not refs or any(r is None for r in refs):
            return False
        perms = {r.perm for r in refs}
        if len(perms) != 1 or None in perms:
            return False
        (perm,) = perms
        op = node.op_type
        if op in _ELEMENTWISE:
            self._on_blobs(node, perm, transpose_consts=True)
        elif op in _REDUCE:
            return self._permuted_reduce(node, a, perm)
        elif op in ("Softmax", "LogSoftmax") and self.opset >= 13:
            self._on_blobs(node, perm, attrs={
                "axis": perm[axis_in(a.get("axis", -1), len(perm), node)]})
        elif op == "Concat":
            self._on_blobs(node, perm, attrs={"axis": perm[axis_in(a["axis"], len(perm), node)]},
                           transpose_consts=True)
        elif op == "Split":
            self._on_blobs(node, perm, attrs={
                "axis": perm[axis_in(a.get("axis", 0), len(perm), node)]})
        elif op == "Slice":
            self._permuted_slice(node, a, perm)
        elif op == "MatMul":
            return self._permuted_matmul(node, perm)
        else:
            return False
        return True

    # ---- the node on the blobs ---------------------------------------------
    def _on_blobs(self, node, perm, attrs=None, transpose_consts=False, consts=None):
        """Run ``node``'s handler on the blobs under its ``perm`` views
        (``attrs``: attributes replaced, mapped to the blobs' axes): constant
        inputs transposed to the blobs' axis order (``transpose_consts``;
        one-value constants stay) or replaced from ``consts`` (input
        position -> array); each output becomes the same view of its new
        blob."""
        k = len(perm)
        inv = tuple(int(i) for i in np.argsort(perm))
        n2 = NodeProto()
        n2.CopyFrom(node)
        del n2.input[:]
        del n2.output[:]
        for key, value in (attrs or {}).items():
            keep = [at for at in n2.attribute if at.name != key]
            del n2.attribute[:]
            n2.attribute.extend(keep + [helper.make_attribute(key, value)])
        for pos, name in enumerate(node.input):
            if not name:
                n2.input.append("")
            elif self.is_const(name):
                c = self.p.consts[name]
                if consts and pos in consts:
                    c = consts[pos]
                elif transpose_consts and c.size > 1:
                    if c.ndim > k:
                        raise Unsupported("constant has more dimensions than the computed "
                                          "operand")
                    c = c.reshape((1,) * (k - c.ndim) + c.shape).transpose(inv)
                else:
                    n2.input.append(name)
                    continue
                new = self.new_blob(f"{name}_untransposed")
                self.p.consts[new] = np.ascontiguousarray(c)
                n2.input.append(new)
            else:
                r = self.refs[name]
                new = self.new_blob(f"{name}_untransposed")
                self.refs[new] = Var(new, r.blob, r.blob_shape, origin=r.origin)
                self.p.shapes[new] = r.blob_shape
                n2.input.append(new)
        outs = []
        for name in node.output:
            if not name:
                n2.output.append("")
                continue
            shape = self.shape(name)
            if len(shape) != k:
                raise Unsupported(f"output of rank {len(shape)} from inputs of rank {k}")
            new = self.new_blob(f"{name}_untransposed")
            self.p.shapes[new] = tuple(shape[i] for i in inv)
            n2.output.append(new)
            outs.append((name, new, shape))
        outer, self.node = self.node, n2
        try:
            getattr(self, "op_" + node.op_type)(n2, node_attrs(n2))
        finally:
            self.node = outer
        # named in errors: the Transpose that made the layout
        origin = next(self.refs[i].origin for i in node.input if i and not self.is_const(i))
        for name, new, shape in outs:
            r = self.refs[new]
            blob = self.materialize(r) if r.perm is None else None
            if blob is None:
                raise Unsupported("an operator on a transposed tensor gave a transposed result")
            self.refs[name] = Var(name, blob, self.p.shapes[new], shape, None, origin, perm)

    def _permuted_reduce(self, node, a, perm):
        axes = self._reduce_axes(node, a, len(perm))
        mapped = sorted(perm[ax] for ax in axes)
        keep = bool(a.get("keepdims", 1))
        target = node
        if not keep:
            # reduced with keepdims on the blob, then the reduced axes
            # dropped from the view (a plain reshape where the axes left
            # keep their order: MLP-Mixer's mean over the tokens)
            target = NodeProto()
            target.CopyFrom(node)
            target.output[0] = self.new_blob(f"{node.output[0]}_keepdims")
            shape = list(self.shape(node.input[0]))
            for ax in axes:
                shape[ax] = 1
            self.p.shapes[target.output[0]] = tuple(shape)
        if "axes" in a or not (len(node.input) > 1 and node.input[1]):
            self._on_blobs(target, perm, attrs={"axes": mapped, "keepdims": 1})
        else:
            self._on_blobs(target, perm, attrs={"keepdims": 1},
                           consts={1: np.asarray(mapped, np.int64)})
        if not keep:
            self.set_view(0, target.output[0], self.shape(node.output[0]))
        return True

    def _permuted_slice(self, node, a, perm):
        k = len(perm)
        if self.opset < 10:
            axes = a.get("axes", list(range(len(a.get("starts", [])))))
            self._on_blobs(node, perm, attrs={
                "axes": [perm[axis_in(ax, k, node)] for ax in axes]})
            return
        starts = self._slice_arg(node, a, 1, "starts", None)
        axes = self._slice_arg(node, a, 3, "axes", list(range(len(starts))))
        padded = NodeProto()
        padded.CopyFrom(node)
        while len(padded.input) < 4:
            padded.input.append("")
        if not padded.input[3]:
            # the default axes (0, 1, ...) written out, to be mapped below
            padded.input[3] = self.new_blob(f"{node.output[0]}_axes")
            self.p.consts[padded.input[3]] = np.arange(len(starts), dtype=np.int64)
        mapped = [perm[axis_in(ax, k, node)] if -k <= ax < k else ax for ax in axes]
        self._on_blobs(padded, perm, consts={3: np.asarray(mapped, np.int64)})

    def _permuted_matmul(self, node, perm):
        """x @ W, x a view whose last axis is its blob's channel axis (axis
        1 of a 3- or 4-D blob), W a 2-D constant: a 1x1 Convolution of the
        blob (a 3-D blob seen as (N, C, L, 1))."""
        if not self.is_const(node.input[1]) or self.is_const(node.input[0]) \
                or any(i and not self.is_const(i) for i in node.input[2:]):
            return False
        W = self.const(node.input[1])
        r = self.refs[node.input[0]]
        if W.ndim != 2 or perm[-1] != 1 or len(r.blob_shape) not in (3, 4):
            return False
        k_in, m = W.shape
        if r.blob_shape[1] != k_in:
            return False
        x = r.blob
        if len(r.blob_shape) == 3:
            x = self.materialize(Var(self.new_blob(f"{r.blob}_4d"), r.blob, r.blob_shape,
                                     r.blob_shape + (1,)))
        shape = self.shape(node.output[0])
        inv = tuple(int(i) for i in np.argsort(perm))
        phys = tuple(shape[i] for i in inv)
        top = self.new_blob(f"{node.output[0]}_untransposed")
        bias = self.opt_const(2)    # an Add folded in (_fuse.py)
        blobs = [np.ascontiguousarray(W.T).reshape(m, k_in, 1, 1)]
        if bias is not None:
            blobs.append(bias.reshape(m))
        lp = self.layer("Convolution", self.lname(), [x], [top], blobs)
        cp = lp.convolution_param
        cp.num_output = m
        cp.kernel_size.append(1)
        cp.bias_term = bias is not None
        if len(phys) == 3:
            top = self.materialize(Var(self.new_blob(f"{top}_3d"), top, phys + (1,), phys))
        self.p.shapes[top] = phys
        self.refs[node.output[0]] = Var(node.output[0], top, phys, shape, None, r.origin, perm)
        return True

    def _is_one(self, name):
        return self.is_const(name) and bool(np.all(self.p.consts[name] == 1))

    # ---- LayerNormalization (opset 17) -------------------------------------
    def op_LayerNormalization(self, node, a):
        """LayerNormalization over axes ``axis``.. as the nodes PyTorch
        writes before opset 17, each converted as any node (on the blobs
        under a transposed input); its mean and inverse-deviation outputs
        are not supported."""
        if any(o for o in node.output[1:]):
            raise Unsupported("LayerNormalization's Mean and InvStdDev outputs are not "
                              "supported")
        x, scale = node.input[0], node.input[1]
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        shape = self.shape(x)
        axis = axis_in(a.get("axis", -1), len(shape), node)
        axes = list(range(axis, len(shape)))
        eps = np.asarray(a.get("epsilon", 1e-5), np.float32)
        base = node.output[0]
        names = {s: self.new_blob(f"{base}_{s}") for s in
                 ("mean", "centred", "two", "sq", "var", "eps", "vareps", "std", "normed")}
        self.p.consts[names["two"]] = np.asarray(2.0, np.float32)
        self.p.consts[names["eps"]] = eps
        stat_shape = tuple(shape[:axis]) + (1,) * len(axes)
        for s in ("mean", "var", "vareps", "std"):
            self.p.shapes[names[s]] = stat_shape
        for s in ("centred", "sq", "normed"):
            self.p.shapes[names[s]] = tuple(shape)
        steps = [
            ("ReduceMean", [x], names["mean"], {"axes": axes, "keepdims": 1}),
            ("Sub", [x, names["mean"]], names["centred"], {}),
            ("Pow", [names["centred"], names["two"]], names["sq"], {}),
            ("ReduceMean", [names["sq"]], names["var"], {"axes": axes, "keepdims": 1}),
            ("Add", [names["var"], names["eps"]], names["vareps"], {}),
            ("Sqrt", [names["vareps"]], names["std"], {}),
            ("Div", [names["centred"], names["std"]], names["normed"], {}),
        ]
        out = names["normed"]
        if not self._is_one(scale):
            scaled = self.new_blob(f"{base}_scaled") if bias else node.output[0]
            self.p.shapes[scaled] = tuple(shape)
            steps.append(("Mul", [out, scale], scaled, {}))
            out = scaled
        if bias:
            steps.append(("Add", [out, bias], node.output[0], {}))
        elif out != node.output[0]:
            steps.append(("Identity", [out], node.output[0], {}))
        self._run_steps(node, steps)

    def _reduce_of_power(self, node, a, power, root):
        """ReduceL2 (root) and ReduceSumSquare: Pow 2, ReduceSum, Sqrt."""
        shape = self.shape(node.input[0])
        base = node.output[0]
        two, sq = self.new_blob(f"{base}_two"), self.new_blob(f"{base}_sq")
        self.p.consts[two] = np.asarray(power, np.float32)
        self.p.shapes[sq] = tuple(shape)
        ins = [sq] + [i for i in node.input[1:2] if i]
        steps = [("Pow", [node.input[0], two], sq, {})]
        if root:
            total = self.new_blob(f"{base}_sumsq")
            self.p.shapes[total] = self.shape(base)
            steps += [("ReduceSum", ins, total, a), ("Sqrt", [total], base, {})]
        else:
            steps.append(("ReduceSum", ins, base, a))
        self._run_steps(node, steps)

    def op_ReduceL2(self, node, a):
        self._reduce_of_power(node, a, 2.0, True)

    def op_ReduceSumSquare(self, node, a):
        self._reduce_of_power(node, a, 2.0, False)

    def _run_steps(self, node, steps):
        """Convert ``node`` as the nodes ``steps`` ((op, inputs, output,
        attributes), the outputs' shapes registered), each as any node
        (on the blobs under transposed inputs where it can)."""
        prefix = node.name or node.output[0]
        for op, ins, out, attrs in steps:
            sub = helper.make_node(op, ins, [out], name=f"{prefix}/{op}_{len(self.net.layer)}",
                                   **attrs)
            self.node = sub
            try:
                if not self.run_permuted(sub, attrs):
                    getattr(self, "op_" + op)(sub, attrs)
            finally:
                self.node = node
