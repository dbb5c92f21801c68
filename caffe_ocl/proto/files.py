"""Reading and writing Caffe's protobuf files.

Nets (``.prototxt`` text, ``.caffemodel`` binary), solvers (``.prototxt``),
means and other blobs (``.binaryproto``).  Every net and solver that comes
out of here is already upgraded to the current format (see ``upgrade.py``),
so the rest of caffe_ocl only ever sees ``layer { type: "..." }`` and blobs
with a ``shape``.

Errors: a missing path raises :class:`~caffe_ocl.errors.FileNotFound`; a file
that does not parse raises :class:`~caffe_ocl.errors.ParseError` whose
message starts with the path -- for text files ``"{path}:{line}:{col}: {what}"``
with a 1-based line and column, as compilers and editors print them.

Writes are atomic: the bytes go to ``{path}.tmp-{pid}`` which is then renamed
over ``path``, so a crash (or an error while serializing) never leaves a
half-written snapshot behind and an existing file stays intact.
"""

import os
import re

import numpy as np
from google.protobuf import message as _message
from google.protobuf import text_format

from ..errors import FileNotFound, ParseError, ShapeError, require_file
from . import caffe_pb2 as pb
from . import forks
from .upgrade import upgrade_net, upgrade_solver

__all__ = [
    "parse_net_text", "read_net_prototxt", "read_net_binary", "read_net",
    "parse_solver_text", "read_solver_prototxt",
    "read_blobproto", "blobproto_to_array", "array_to_blobproto",
    "write_binary", "write_text", "parse_text", "read_text", "read_binary",
]

# Suffixes that always hold a binary protobuf.
_BINARY_SUFFIXES = (".caffemodel", ".binaryproto", ".solverstate", ".pb")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# protobuf prefixes its ParseError text with "line:col : "; we put our own.
_LOC_PREFIX = re.compile(r"^\d+(?::\d+)? : ")


# --------------------------------------------------------------------------
# Generic helpers

def _read_bytes(path, what):
    path = os.fspath(path)
    require_file(path, what)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFound(f"{what} not found: {path}") from None
    except OSError as e:
        raise ParseError(f"{path}: cannot read {what}: {e.strerror or e}") from e


def _decode_text(data, source):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        # Line/column of the first bad byte, so the message points at it.
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ParseError(
            f"{source}:{line}:{col}: not UTF-8 text (byte 0x{data[e.start]:02x});"
            f" is this a binary file?") from None


def parse_text(text, msg, source="<string>"):
    """Parse protobuf text format into ``msg`` (merged, like Caffe's
    TextFormat::Parse into a fresh message).  Raises ParseError
    "source:line:col: what"."""
    if isinstance(text, (bytes, bytearray)):
        text = _decode_text(bytes(text), source)
    try:
        text_format.Merge(text, msg)
    except text_format.ParseError as e:
        line, col = e.GetLine(), e.GetColumn()
        what = _LOC_PREFIX.sub("", str(e))
        if line is None:
            raise ParseError(f"{source}: {what}") from None
        # protobuf's line and column are both 1-based already.
        raise ParseError(f"{source}:{line}:{col or 1}: {what}") from None
    return msg


def read_text(path, msg, what="prototxt"):
    """Read a text-format protobuf file into ``msg`` (no upgrade)."""
    path = os.fspath(path)
    return parse_text(_read_bytes(path, what), msg, path)


def read_binary(path, msg, what="binary proto"):
    """Read a binary protobuf file into ``msg`` (no upgrade)."""
    path = os.fspath(path)
    data = _read_bytes(path, what)
    _parse_binary(data, msg, path, what)
    return msg


def _parse_binary(data, msg, source, what):
    if data.startswith(_HDF5_MAGIC):
        raise ParseError(
            f"{source}: this is an HDF5 file, not a binary protobuf {what}; "
            f"HDF5 weights need the HDF5 loader")
    try:
        msg.ParseFromString(data)
    except (_message.DecodeError, RuntimeError, ValueError) as e:
        raise ParseError(
            f"{source}: not a valid {msg.DESCRIPTOR.name} binary protobuf "
            f"({what}): {e}") from None
    return msg


# --------------------------------------------------------------------------
# Nets

def parse_net_text(text, source="<string>"):
    """Parse a net prototxt given as a string; returns the upgraded
    NetParameter."""
    if isinstance(text, (bytes, bytearray)):
        text = _decode_text(bytes(text), source)
    text, custom = forks.extract_custom_params(text)     # register_layer types' *_param
    try:
        net = parse_text(text, pb.NetParameter(), source)
    except ParseError as e:
        raise ParseError(forks.explained(str(e), text, source)) from None
    forks.attach_custom_params(net, custom)
    return upgrade_net(net, source)


def read_net_prototxt(path):
    """Read a net .prototxt; returns the upgraded NetParameter."""
    path = os.fspath(path)
    return parse_net_text(_read_bytes(path, "net prototxt"), path)


def read_net_binary(path):
    """Read a binary net (.caffemodel); returns the upgraded NetParameter."""
    path = os.fspath(path)
    net = read_binary(path, pb.NetParameter(), "caffemodel")
    return upgrade_net(net, path)


def read_net(path):
    """Read a net from text or binary, whichever ``path`` holds.

    ``.caffemodel`` (and other binary suffixes) are read as binary.  Anything
    else is read as text; if it is not text (not UTF-8) it is tried as
    binary, and if that fails too the text error is raised.
    """
    path = os.fspath(path)
    lower = path.lower()
    if lower.endswith(_BINARY_SUFFIXES) or lower.endswith(".h5"):
        return read_net_binary(path)
    data = _read_bytes(path, "net file")
    try:
        text = _decode_text(data, path)
    except ParseError as text_error:
        net = pb.NetParameter()
        try:
            _parse_binary(data, net, path, "net file")
        except ParseError:
            raise text_error from None
        return upgrade_net(net, path)
    return parse_net_text(text, path)


# --------------------------------------------------------------------------
# Solvers

def parse_solver_text(text, source="<string>"):
    """Parse a solver prototxt given as a string; returns the upgraded
    SolverParameter (``solver_type`` enum turned into ``type``)."""
    solver = parse_text(text, pb.SolverParameter(), source)
    return upgrade_solver(solver, source)


def read_solver_prototxt(path):
    """Read a solver .prototxt; returns the upgraded SolverParameter."""
    path = os.fspath(path)
    return parse_solver_text(_read_bytes(path, "solver prototxt"), path)


# --------------------------------------------------------------------------
# Blobs

def read_blobproto(path):
    """Read a .binaryproto (e.g. a mean file) as a BlobProto."""
    return read_binary(path, pb.BlobProto(), "binaryproto")


def blobproto_to_array(blob, return_diff=False):
    """A BlobProto's data (or diff) as a float32 ndarray of its shape.

    Uses the legacy num/channels/height/width when any of them is set (as
    pycaffe and Caffe's Blob::FromProto do), ``shape`` otherwise; reads
    ``double_data``/``double_diff`` when the float field is empty.
    """
    if return_diff:
        values = blob.diff if len(blob.diff) else blob.double_diff
    else:
        values = blob.data if len(blob.data) else blob.double_data
    arr = np.asarray(values, dtype=np.float32)
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = (blob.num, blob.channels, blob.height, blob.width)
    else:
        shape = tuple(int(d) for d in blob.shape.dim)
    count = int(np.prod(shape, dtype=np.int64))
    if arr.size != count:
        field = "diff" if return_diff else "data"
        raise ShapeError(
            f"BlobProto has shape {list(shape)} ({count} values) but its "
            f"{field} holds {arr.size} values")
    return arr.reshape(shape)


def array_to_blobproto(arr, diff=None):
    """An ndarray (and optionally its diff) as a BlobProto with
    ``shape.dim`` set, as pycaffe's ``caffe.io.array_to_blobproto``."""
    arr = np.asarray(arr)
    blob = pb.BlobProto()
    blob.shape.SetInParent()
    blob.shape.dim.extend(int(d) for d in arr.shape)
    blob.data.extend(arr.astype(np.float32).ravel().tolist())
    if diff is not None:
        diff = np.asarray(diff)
        if diff.size != arr.size:
            raise ShapeError(
                f"array_to_blobproto: diff has {diff.size} values but the "
                f"array shape {list(arr.shape)} has {arr.size}")
        blob.diff.extend(diff.astype(np.float32).ravel().tolist())
    return blob


# --------------------------------------------------------------------------
# Writing

def _atomic_write(path, data):
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_binary(msg, path):
    """Serialize ``msg`` to ``path`` atomically (binary protobuf)."""
    _atomic_write(path, msg.SerializeToString())


def write_text(msg, path):
    """Write ``msg`` to ``path`` atomically in protobuf text format."""
    _atomic_write(path, text_format.MessageToString(msg).encode("utf-8"))
