"""The ONNX -> Caffe converter's shared pieces (to_caffe.py and its
operator groups, e.g. _resize.py): ``Var`` (a tensor as a Caffe blob read
through a view), ``NodeError`` (a node the converter cannot take, named),
attribute checks, and the Caffe parameter and weight-blob writers."""
import math

import numpy as np

from ..proto import caffe_pb2
from ._common import OnnxConversionError, node_name, set_caffe_hw

# BlobProto.data is field 5, packed floats: its wire tag (5 << 3 | 2)
_BLOB_DATA_TAG = b"\x2a"


class Var:
    """A non-constant tensor: ``shape`` is its ONNX shape; its values are the
    Caffe blob ``blob`` (shape ``blob_shape``) read through ``index`` (None:
    row-major, same order; else an int array of ``shape`` with flat
    positions in the blob).

    ``perm``: the view is the blob transposed by ``perm`` (same rank; a
    channels-last tensor of ConvNeXt's blocks over an NCHW blob). Operators
    that work per element or along named axes run on the blob itself
    (``_layout.py``); ``index`` is then computed only when something else
    reads the view, so a network of such views keeps no index arrays."""

    def __init__(self, name, blob, blob_shape, shape=None, index=None, origin=None,
                 perm=None, transposed_from=None):
        self.name = name
        self.blob = blob
        self.blob_shape = tuple(blob_shape)
        self.shape = tuple(blob_shape if shape is None else shape)
        self.perm = tuple(perm) if perm is not None else None
        # (S, p): the view is the blob reshaped to S, transposed by p and
        # reshaped to ``shape`` (a Permute writes it: --extension_layers)
        if transposed_from is None and self.perm is not None:
            transposed_from = (self.blob_shape, self.perm)
        self.transposed_from = transposed_from
        self._index = index
        self.origin = origin
        self.materialized = blob if (index is None and perm is None
                                     and self.shape == self.blob_shape) else None

    @property
    def index(self):
        if self._index is None and self.perm is not None:
            return np.arange(int(np.prod(self.blob_shape))).reshape(
                self.blob_shape).transpose(self.perm)
        return self._index

    def view(self, name, shape=None, index=None, origin=None):
        if index is None and self.perm is not None:
            if shape is None or tuple(shape) == self.shape:
                return Var(name, self.blob, self.blob_shape, self.shape, None,
                           origin or self.origin, self.perm)
            index = np.ascontiguousarray(self.index).reshape(shape)
        return Var(name, self.blob, self.blob_shape, shape, index, origin or self.origin)


def desc(node):
    return (node.op_type, node_name(node))


class NodeError(OnnxConversionError):
    """A malformed node (an attribute or constant ONNX does not allow): one
    error naming it (the CLI adds the file); ``node`` and ``reason`` let the
    converter list it with the unsupported nodes met before it."""

    def __init__(self, node, reason):
        op, name = desc(node)
        super().__init__(f"{op} '{name}': {reason}")
        self.node = node
        self.reason = reason


def ints_attr(node, a, key, n, lo, default=None):
    """Attribute ``key`` as ``n`` integers in [lo, 2^31): the range of
    Caffe's fields, checked here so that a stride 0 or a group 2^40 is an
    error naming the node and attribute, not protobuf's "Value out of
    range" or a ZeroDivisionError."""
    v = a.get(key, default)
    if v is None:
        raise NodeError(node, f"attribute {key} is required")
    if (not isinstance(v, list) or len(v) != n or not all(isinstance(x, int) for x in v)
            or not all(lo <= x < 2 ** 31 for x in v)):
        raise NodeError(node, f"{key} {v!r} must be {n} integers from {lo} to 2^31 - 1")
    return list(v)


def group_attr(node, a):
    """A convolution's group, an integer in Caffe's range (as ints_attr; 0
    is left to the Net build, whose error names the layer)."""
    g = a.get("group", 1)
    if not isinstance(g, int) or not 0 <= g < 2 ** 31:
        raise NodeError(node, f"group {g!r} must be a positive integer")
    return g


def check_kernel(node, a, kernel):
    """kernel_shape, where given, must be the weight's: it was ignored, and
    a Conv with kernel_shape [2^40, 2^40] and a 3x3 weight converted with
    exit status 0 (ONNX Runtime refuses it)."""
    if "kernel_shape" in a and a["kernel_shape"] != list(kernel):
        raise NodeError(node, f"kernel_shape {a['kernel_shape']!r} does not match the "
                              f"weight's spatial shape {list(kernel)}")


def reshape_target(node, in_shape, spec, allowzero):
    """ONNX Reshape's output shape for input ``in_shape`` and shape tensor
    ``spec``, computed here rather than taken from shape inference: onnx's
    inference ignored allowzero (a 0 was converted as "copy" where the model
    meant a literal 0) and left the shape unknown, with no reason given, for
    a -4 or two -1s."""
    count = math.prod(in_shape)
    out, infer = [], None
    for i, d in enumerate(spec):
        if d == -1:
            if infer is not None:
                raise NodeError(node, f"shape {spec} holds more than one -1")
            infer = i
            out.append(1)
        elif d == 0 and not allowzero:
            if i >= len(in_shape):
                raise NodeError(node, f"shape {spec}: the 0 at position {i} copies a dimension "
                                      f"the {len(in_shape)}-D input {list(in_shape)} lacks")
            out.append(in_shape[i])
        elif d < 0:
            raise NodeError(node, f"shape {spec} holds {d} (a size is -1, 0 or positive)")
        else:
            out.append(d)
    known = math.prod(out)
    if infer is not None and known and count % known == 0:
        out[infer] = count // known
        known = count
    if known != count or (infer is not None and not count):
        raise NodeError(node, f"shape {spec} does not fit the input {list(in_shape)} "
                              f"({count} values{', allowzero 1' if allowzero else ''})")
    return tuple(out)


def blob_proto(arr):
    """array_to_blobproto's BlobProto (shape, then the float32 data), the data
    parsed from its packed bytes: array_to_blobproto goes through a Python
    list of floats (about 32 bytes a value), and a 1 GiB weight needed ~8 GiB
    of host memory to convert."""
    a = np.asarray(arr, dtype="<f4")
    bp = caffe_pb2.BlobProto()
    bp.shape.SetInParent()
    bp.shape.dim.extend(int(d) for d in a.shape)
    raw = a.tobytes()
    if raw:
        n, head = len(raw), bytearray()
        while n >= 0x80:                     # the length as a protobuf varint
            head.append(n & 0x7F | 0x80)
            n >>= 7
        head.append(n)
        bp.MergeFromString(_BLOB_DATA_TAG + bytes(head) + raw)
    return bp


def axis_in(ax, rank, node, extra=0):
    """ONNX axis ``ax`` of a rank-``rank`` input, in [-rank, rank - 1 +
    ``extra``] (Flatten: extra 1), as a non-negative index; outside that an
    error naming the node (a modulo wrapped axis 99 to a valid one and
    wrote a wrong net)."""
    ax = int(ax)
    if not -rank <= ax < rank + extra:
        msg = f"axis {ax} out of range for a {rank}-D input"
        if node is None:
            raise OnnxConversionError(f"node '?': {msg}")
        raise NodeError(node, msg)
    return ax % (rank + extra) if rank + extra else 0


def same_pads(total, lower):
    """(begin, end) of an auto_pad SAME total: the odd pixel goes at the end
    (SAME_UPPER) or, with ``lower``, at the beginning (SAME_LOWER)."""
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def conv_param(cp, num_output, kernel, pad, strides, dil, group, bias):
    """Convolution/Deconvolution geometry, spelled as Caffe prototxts are."""
    cp.num_output = num_output
    set_caffe_hw(cp, "kernel_size", kernel)
    set_caffe_hw(cp, "pad", pad, 0)
    set_caffe_hw(cp, "stride", strides, 1)
    if dil != [1, 1]:
        cp.dilation.extend(dil if dil[0] != dil[1] else dil[:1])
    if group != 1:
        cp.group = group
    if not bias:
        cp.bias_term = False
