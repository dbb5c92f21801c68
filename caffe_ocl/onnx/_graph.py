"""Loading an ONNX model, fixing its input shapes, folding every
initializer-only subgraph into constants (with onnx's reference evaluator,
node by node, under the model's own opset) and inferring the static shape
of every remaining tensor with onnx.shape_inference.

PyTorch's ``x.view(x.size(0), -1)`` exports as Shape -> Gather -> Unsqueeze
-> Concat -> Reshape; once the input shape is fixed, Shape becomes a
constant and the whole chain folds into one constant shape tensor."""
import faulthandler
import math
import os
import sys
import tempfile
import warnings

import numpy as np

from ..errors import FileNotFound
from ._common import OnnxConversionError, error_line, node_name

# ops whose value is not a function of their inputs
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                     "RandomUniformLike", "Multinomial", "Bernoulli"}
_BIG = 4096   # initializers with more elements are given to shape inference as inputs
# A .caffemodel is one protobuf message, under 2 GiB: no tensor of 2^29 or
# more values (2 GiB as float32) can be written into one, so such a tensor
# is refused from its declared dims, before its data is read or a folded
# value allocated (a 2 GiB initializer was read, copied and expanded into a
# Python list by the blob writer, and ended in MemoryError naming nothing).
_MAX_VALUES = 2 ** 29


def load_model(src):
    import onnx
    if isinstance(src, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(src)
        return m, "<ModelProto>"
    if isinstance(src, (bytes, bytearray)):
        return onnx.load_model_from_string(bytes(src)), "<bytes>"
    path = os.fspath(src)
    if not os.path.exists(path):
        raise FileNotFound(f"ONNX model not found: {path}")
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception as e:   # onnx raises DecodeError and friends
        raise OnnxConversionError(f"{path}: not a readable ONNX model ({e})") from None
    # external data is read only after the declared sizes are checked: a
    # 2 GiB external initializer was read whole before anything refused it
    _skip_or_refuse_external(m, path)
    try:
        onnx.load_external_data_for_model(m, os.path.dirname(os.path.abspath(path)))
    except Exception as e:   # a missing file, a path outside the folder, a short file
        raise OnnxConversionError(f"{path}: not a readable ONNX model ({e})") from None
    return m, path


def _used_names(g):
    return {i for n in g.node for i in n.input} | {o.name for o in g.output}


def _skip_or_refuse_external(m, path):
    """Before external data is loaded: an initializer nothing reads is not
    read (its data never reaches the net), one that is read must declare a
    size a .caffemodel can hold."""
    g = m.graph
    used = _used_names(g)
    for t in g.initializer:
        if t.data_location != t.EXTERNAL:
            continue
        if t.name in used:
            _declared_values(t, f"{path}: initializer {t.name!r}")
        else:
            del t.external_data[:]
            t.data_location = t.DEFAULT
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t") and a.t.data_location == a.t.EXTERNAL:
                _declared_values(a.t, f"{path}: {n.op_type} {node_name(n)!r}")


def _declared_values(t, what):
    """The number of values a TensorProto's dims declare, checked before its
    data is read: no negative dimension, fewer than _MAX_VALUES values."""
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise OnnxConversionError(f"{what}: negative dimension in dims {dims}")
    n = math.prod(dims)
    if n >= _MAX_VALUES:
        raise OnnxConversionError(
            f"{what}: dims {dims} declare {n} values ({n * 4 / 2 ** 30:.3g} GiB as float32), "
            "more than a .caffemodel (one protobuf message, under 2 GiB) can hold")
    return n


def _tensor_array(t, what, to_array):
    """TensorProto -> ndarray (``to_array``: onnx.numpy_helper.to_array),
    any failure one error naming the tensor (``what``): numpy's "cannot
    reshape array of size 0 into shape (...)" or a KeyError for an unknown
    data type named neither the initializer nor the model's fault."""
    _declared_values(t, what)
    kind = {v: k for k, v in t.DataType.items()}.get(t.data_type)
    if kind in (None, "UNDEFINED", "STRING"):
        raise OnnxConversionError(f"{what}: data type {kind or t.data_type} is not numeric "
                                  "(a Caffe net holds numbers)")
    try:
        return to_array(t)
    except Exception as e:   # noqa: BLE001 - onnx/numpy's classes, one line naming the tensor
        raise OnnxConversionError(f"{what} ({kind}, dims {list(t.dims)}): its data does not "
                                  f"match its type and dims ({error_line(e)})") from None


def opset_version(model):
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 1


def _check_model(model, newest_opset):
    """What a file must hold before anything is converted: a graph with
    outputs (an empty or truncated file parses as a ModelProto without one,
    and was converted into an empty net with exit status 0), and one default
    ONNX opset that onnx knows (the converter reads attributes and inputs by
    the opset; opset 99 was converted under guessed semantics)."""
    if not model.HasField("graph"):
        raise OnnxConversionError("the file holds no ONNX graph (an empty or truncated file?)")
    if not model.graph.output:
        raise OnnxConversionError("the graph declares no outputs: nothing to compute")
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if len(versions) > 1:
        raise OnnxConversionError(f"opset_import names the default ONNX domain {len(versions)} "
                                  f"times (opsets {versions})")
    if not versions:
        if any(n.domain in ("", "ai.onnx") for n in model.graph.node):
            raise OnnxConversionError("opset_import has no entry for the default ONNX domain "
                                      "(a truncated file?): the opset of its nodes is unknown")
        return
    if not 1 <= versions[0] <= newest_opset:
        raise OnnxConversionError(f"ONNX opset {versions[0]} is not one onnx knows "
                                  f"(1 to {newest_opset})")


def _static(vi):
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


class Prepared:
    """The folded graph: ``nodes`` (remaining NodeProtos, topological),
    ``consts`` (name -> ndarray), ``shapes`` (name -> tuple), ``inputs``
    (name -> shape), ``outputs`` (names), ``opset``."""


def prepare(model, input_shapes=None, batch=1):
    """Fold constants and infer shapes. ``input_shapes`` maps input names to
    shapes; dynamic dims left unset become ``batch`` for axis 0."""
    from onnx import defs, numpy_helper
    _check_model(model, defs.onnx_opset_version())
    g = model.graph
    # only the initializers that nodes or outputs read are converted: the
    # others never reach the net (and may be left unloaded by load_model)
    used = _used_names(g)
    consts = {t.name: _tensor_array(t, f"initializer {t.name!r}", numpy_helper.to_array)
              for t in g.initializer if t.name in used}
    init_names = {t.name for t in g.initializer}
    input_shapes = dict(input_shapes or {})
    inputs = {}
    elem_types = {}
    for vi in g.input:
        if vi.name in init_names:
            continue
        # an input that is no tensor, or declares no shape, left every node
        # after it with "the shape of output is not known statically"
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise OnnxConversionError(f"input {vi.name!r} is a {kind or 'type-less value'}, not "
                                      "a tensor: a Caffe net takes tensors")
        if vi.name not in input_shapes and not vi.type.tensor_type.HasField("shape"):
            raise OnnxConversionError(f"input {vi.name!r} declares no shape; give it "
                                      "(--input_shape)")
        if vi.name in input_shapes:
            shape = tuple(int(d) for d in input_shapes.pop(vi.name))
        else:
            dims = []
            for i, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(int(d.dim_value))
                elif i == 0:
                    dims.append(int(batch))
                else:
                    raise OnnxConversionError(
                        f"input {vi.name!r} has a dynamic dimension {i} "
                        f"({d.dim_param or '?'}); give its shape (--input_shape)")
            shape = tuple(dims)
        inputs[vi.name] = shape
        elem_types[vi.name] = vi.type.tensor_type.elem_type
    if input_shapes:
        raise OnnxConversionError(f"input_shapes names unknown inputs: {sorted(input_shapes)}")
    opsets = list(model.opset_import)
    nodes = list(g.node)
    out_names = [o.name for o in g.output]
    shapes = {}
    for _ in range(100):
        shapes = _infer(model, nodes, consts, inputs, elem_types, opsets)
        changed = False
        kept = []
        for node in nodes:
            try:
                folded = _try_fold(node, consts, shapes, opsets)
            except (ValueError, TypeError, IndexError, KeyError) as e:
                # one line naming the node (was "malformed ONNX model
                # (IndexError: list index out of range)" for a Constant
                # without attributes)
                raise OnnxConversionError(f"{node.op_type} {node_name(node)!r}: malformed node "
                                          f"({error_line(e)})") from None
            if folded is None:
                kept.append(node)
                continue
            for name, val in folded.items():
                consts[name] = val
            changed = True
        nodes = kept
        if not changed:
            break
    used = {i for n in nodes for i in n.input} | set(out_names)
    p = Prepared()
    p.nodes = nodes
    p.consts = {k: v for k, v in consts.items() if k in used}
    p.shapes = shapes
    for k, v in p.consts.items():
        p.shapes[k] = tuple(v.shape)
    p.inputs = inputs
    p.outputs = out_names
    p.opset = opset_version(model)
    p.opsets = opsets
    p.name = g.name or "onnx_model"
    return p


def _infer(model, nodes, consts, inputs, elem_types, opsets):
    """Static shapes of every tensor, by onnx shape inference on a skeleton
    graph (large constants passed as typed inputs, small ones as
    initializers so data propagation can use them)."""
    from onnx import helper, numpy_helper
    graph_inputs, inits = [], []
    for name, shape in inputs.items():
        graph_inputs.append(helper.make_tensor_value_info(name, elem_types[name], shape))
    used = {i for n in nodes for i in n.input}
    for name, arr in consts.items():
        if name not in used:
            continue
        if arr.size > _BIG:
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        else:
            inits.append(numpy_helper.from_array(arr, name))
    outs = [o for o in model.graph.output]
    g = helper.make_graph(nodes, "skeleton", graph_inputs, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = model.ir_version or 8
    m = infer_shapes_isolated(m)
    shapes = dict(inputs)
    for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
        s = _static(vi)
        if s is not None:
            shapes.setdefault(vi.name, s)
    for name, arr in consts.items():
        shapes[name] = tuple(arr.shape)
    return shapes


def infer_shapes_isolated(m):
    """onnx.shape_inference.infer_shapes(m) in a forked child where fork
    exists: onnx's C++ inference asserts (abort, SIGABRT) or reads out of
    bounds on some hostile graphs -- a ConvTranspose whose pads exceed its
    output, then a Slice of it, hits std::clamp(x, 0, dim) with a negative
    dim -- and that must end in one error line, not kill the caller."""
    import onnx
    infer = onnx.shape_inference.infer_shapes
    if not hasattr(os, "fork"):
        return _infer_shapes(infer, m)
    errf = tempfile.TemporaryFile()      # the child's stderr: the assertion's text
    rfd, wfd = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns of fork() in a threaded process (prefetch threads,
        # the OpenCL runtime's); the child only runs onnx's inference and exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:      # the child: infer, write the tag and bytes, leave at once
        status = 1
        try:
            os.close(rfd)
            os.dup2(errf.fileno(), 2)
            faulthandler.disable()      # the parent's report is the one line
            try:
                out = b"M" + infer(m, strict_mode=False, data_prop=True).SerializeToString()
            except Exception as e:   # noqa: BLE001 - sent to the parent as text
                out = b"E" + " ".join(str(e).split()).encode("utf-8", "replace")
            with os.fdopen(wfd, "wb") as f:
                f.write(out)
            status = 0
        finally:
            os._exit(status)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        data = f.read()
    _, wstatus = os.waitpid(pid, 0)
    with errf:
        errf.seek(0)
        said = errf.read(4096).decode("utf-8", "replace").strip().splitlines()
    if os.WIFSIGNALED(wstatus) or not data:
        sig = os.WTERMSIG(wstatus) if os.WIFSIGNALED(wstatus) else None
        how = f"signal {sig}" if sig is not None else f"exit {os.WEXITSTATUS(wstatus)}"
        last = f": {said[-1][-300:]}" if said else ""
        raise OnnxConversionError(
            f"ONNX shape inference crashed ({how}) on this graph: a node's attributes or "
            f"inputs give a tensor an impossible (negative or huge) shape{last}")
    for line in said:        # warnings of a successful inference, as they would be
        print(line, file=sys.stderr)
    if data[:1] == b"E":
        raise OnnxConversionError(f"ONNX shape inference failed: {data[1:].decode()}")
    out = onnx.ModelProto()
    out.ParseFromString(data[1:])
    return out


def _infer_shapes(infer, m):
    try:
        return infer(m, strict_mode=False, data_prop=True)
    except Exception as e:
        raise OnnxConversionError(f"ONNX shape inference failed: {e}") from None


def _try_fold(node, consts, shapes, opsets):
    from onnx import helper, numpy_helper
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or op in _NONDETERMINISTIC:
        return None
    if op == "Constant":
        if len(node.attribute) != 1:
            raise OnnxConversionError(f"Constant {node_name(node)!r} has "
                                      f"{len(node.attribute)} attributes; ONNX gives it one value")
        a = node.attribute[0]
        if a.name == "value":
            val = _tensor_array(a.t, f"Constant {node_name(node)!r}", numpy_helper.to_array)
        elif a.name in ("value_float", "value_int"):
            val = np.array(helper.get_attribute_value(a),
                           np.float32 if a.name == "value_float" else np.int64)
        elif a.name in ("value_floats", "value_ints"):
            val = np.array(helper.get_attribute_value(a),
                           np.float32 if a.name == "value_floats" else np.int64)
        else:
            return None
        return {node.output[0]: val}
    if op in ("Shape", "Size"):
        s = shapes.get(node.input[0])
        if s is None:
            return None
        if op == "Size":
            return {node.output[0]: np.array(int(np.prod(s)), np.int64)}
        at = {a.name: a.i for a in node.attribute}
        start, end = at.get("start", 0), at.get("end", len(s))
        return {node.output[0]: np.array(s[slice(start, end)], np.int64)}
    ins = [i for i in node.input if i]
    if not ins or not all(i in consts for i in ins):
        if op == "ConstantOfShape" and ins and ins[0] in consts:
            pass
        else:
            return None
    for o in node.output:
        # a folded value lands in the .caffemodel (or feeds one that does):
        # refused from its inferred shape before the evaluator allocates it
        s = shapes.get(o)
        if s is not None and all(d >= 0 for d in s) and math.prod(s) >= _MAX_VALUES:
            raise OnnxConversionError(
                f"{op} {node_name(node)!r}: output {o!r} of shape {list(s)} holds "
                f"{math.prod(s)} values, more than a .caffemodel (one protobuf message, "
                "under 2 GiB) can hold")
    if op == "BatchNormalization" and _bn_training(node, opsets):
        return _fold_training_batchnorm(node, consts)
    return _evaluate(node, consts, opsets)


def _bn_training(node, opsets):
    """Whether a BatchNormalization runs in training mode: opset 14 and
    later say so in ``training_mode`` (onnx's evaluator folds those
    itself; folded here alike); 9-13 by asking for more than Y."""
    ver = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 0)
    if ver >= 14:
        return any(a.name == "training_mode" and a.i == 1 for a in node.attribute)
    return sum(1 for o in node.output if o) > 1


def _fold_training_batchnorm(node, consts):
    """A BatchNormalization in training mode (opset 9-13: more than one
    output; 14+: training_mode 1) over constants: normalised by the
    input's own statistics over every axis but 1 (population variance), as
    ONNX defines it; also the running mean and variance outputs (input *
    momentum + current * (1 - momentum)). timm's weight-standardised
    convolutions (NFNet, ScaledStdConv) export their weights so; onnx's
    reference evaluator gives only Y there. The saved mean / variance
    outputs (opset 9-13) are not given: a node reading them is reported."""
    at = {a.name: a for a in node.attribute}
    eps = at["epsilon"].f if "epsilon" in at else 1e-5
    momentum = at["momentum"].f if "momentum" in at else 0.9
    x, scale, bias, mean_in, var_in = (consts[i].astype(np.float64) for i in node.input[:5])
    if x.ndim < 2:
        return None
    axes = tuple(i for i in range(x.ndim) if i != 1)
    cur_mean, cur_var = x.mean(axis=axes), x.var(axis=axes)
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    y = ((x - cur_mean.reshape(bshape)) / np.sqrt(cur_var.reshape(bshape) + eps)
         * scale.reshape(bshape) + bias.reshape(bshape))
    dtype = consts[node.input[0]].dtype
    out = {node.output[0]: y.astype(dtype)}
    for o, run, cur in zip(node.output[1:3], (mean_in, var_in), (cur_mean, cur_var)):
        if o:
            out[o] = (run * momentum + cur * (1 - momentum)).astype(dtype)
    return out


def _evaluate(node, consts, opsets):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    ins = [i for i in node.input if i]
    vis = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(consts[i].dtype),
                                         consts[i].shape) for i in ins]
    outs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
    g = helper.make_graph([node], "fold", vis, outs)
    m = helper.make_model(g, opset_imports=opsets)
    try:
        res = ReferenceEvaluator(m).run(None, {i: consts[i] for i in ins})
    except Exception:
        return None
    return {o.name: np.asarray(r) for o, r in zip(outs, res)}
