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

import math
import os
import re
import stat

import numpy as np
from google.protobuf import message as _message
from google.protobuf import text_format

from ..errors import FileNotFound, FileWriteError, ParseError, ShapeError, check_replaceable
from . import caffe_pb2 as pb
from . import forks
from .upgrade import upgrade_net, upgrade_solver

__all__ = [
    "parse_net_text", "read_net_prototxt", "read_net_binary", "read_net",
    "parse_solver_text", "read_solver_prototxt",
    "read_blobproto", "blobproto_to_array", "array_to_blobproto",
    "write_binary", "write_text", "parse_text", "read_text", "read_binary",
    "read_file_bytes", "require_regular_file", "read_blob_array", "MAX_FILE_BYTES",
    "non_utf8_field",
]

# Suffixes that always hold a binary protobuf.
_BINARY_SUFFIXES = (".caffemodel", ".binaryproto", ".solverstate", ".pb")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# protobuf prefixes its ParseError text with "line:col : "; we put our own.
_LOC_PREFIX = re.compile(r"^\d+(?::\d+)? : ")


# --------------------------------------------------------------------------
# Generic helpers

# Caffe's kMaxBlobAxes (blob.MAX_AXES; numpy itself stops at 64)
MAX_BLOB_AXES = 32

# protobuf cannot parse a message of 2 GiB or more; no file caffe_ocl reads
# as a whole (prototxt, caffemodel, binaryproto, solverstate) can be larger
MAX_FILE_BYTES = 2**31 - 1


def require_regular_file(path, what="file"):
    """``path`` if it names a regular file (symlinks followed); FileNotFound
    when it is missing, ParseError for a folder, device (/dev/zero), FIFO
    or socket, which would otherwise be read without end or block forever."""
    path = os.fsdecode(path)
    if "\0" in path:
        raise ParseError(f"{what} path {path!r} holds a NUL byte")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFound(f"{what} not found: {path}") from None
    except OSError as e:
        raise ParseError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileNotFound(f"{what} is a directory, expected a file: {path}")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        raise ParseError(f"{path}: {what} is {kind}, not a regular file")
    return path


def _read_capped(f, size, max_bytes):
    """At most ``max_bytes + 1`` bytes of the open file ``f`` of ``size``
    bytes (as fstat saw it), read in pieces no larger than that size (plus
    one byte, to see EOF or growth) and 1 MiB after that: Python 3.12's
    ``read(n)`` allocates all n bytes before reading, so ``read(2**31)`` on
    a 1 KiB prototxt was a MemoryError under a memory limit (ulimit -v, a
    container)."""
    want = min(size, max_bytes) + 1
    parts, total = [], 0
    while total <= max_bytes:
        ask = min(want, max_bytes + 1 - total)
        chunk = f.read(ask)
        parts.append(chunk)
        total += len(chunk)
        if len(chunk) < ask:        # a regular file's read is short only at its end
            break
        want = 1 << 20
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_file_bytes(path, what="file", max_bytes=MAX_FILE_BYTES):
    """The bytes of the regular file ``path``: at most ``max_bytes``
    (ParseError past it, also for a file that grows while read)."""
    path = require_regular_file(path, what)
    try:
        # O_NONBLOCK: a FIFO swapped in after the check cannot block
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ParseError(f"{path}: {what} is not a regular file")
            data = _read_capped(f, st.st_size, max_bytes)
    except FileNotFoundError:
        raise FileNotFound(f"{what} not found: {path}") from None
    except OSError as e:
        raise ParseError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise ParseError(f"{path}: {what} is larger than {max_bytes} bytes (the most "
                         "caffe_ocl reads)")
    return data


def _read_bytes(path, what):
    return read_file_bytes(path, what)


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
    """Parse protobuf text format into ``msg`` as Caffe's TextFormat::Parse
    does: a singular field given twice is an error (not "the last one
    wins"), and so is a NUL byte.  Raises ParseError "source:line:col: what"."""
    if isinstance(text, (bytes, bytearray)):
        text = _decode_text(bytes(text), source)
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        col = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise ParseError(f"{source}:{line}:{col}: NUL byte in text; is this a binary file?")
    try:
        text_format.Parse(text, msg)
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
    path = os.fsdecode(path)
    return parse_text(_read_bytes(path, what), msg, path)


def read_binary(path, msg, what="binary proto"):
    """Read a binary protobuf file into ``msg`` (no upgrade)."""
    path = os.fsdecode(path)
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
    bad = non_utf8_field(msg)
    if bad:
        raise ParseError(
            f"{source}: not a valid {msg.DESCRIPTOR.name} binary protobuf "
            f"({what}): string field {bad} is not UTF-8 text")
    return msg


_STRING = 9    # FieldDescriptor.TYPE_STRING
_MESSAGE = 11  # FieldDescriptor.TYPE_MESSAGE


def _is_repeated(fd):
    rep = getattr(fd, "is_repeated", None)    # protobuf >= 6 (no .label)
    return rep if rep is not None else fd.label == 3    # LABEL_REPEATED


def non_utf8_field(msg, prefix=""):
    """The path (``layer[3].name``) of the first string field of a parsed
    binary ``msg`` that is not UTF-8, or None. The binary parser keeps such
    bytes as they are (proto2) and reading the field later raised
    UnicodeDecodeError wherever the name was used (the V1 upgrader, layer
    wiring, a solver state's learned_net)."""
    for fd, value in msg.ListFields():
        name = f"{prefix}{fd.name}"
        repeated = _is_repeated(fd)
        if fd.type == _STRING:
            if not repeated:
                if isinstance(value, bytes):
                    return name
                continue
            for i in range(len(value)):
                try:
                    value[i]
                except UnicodeDecodeError:
                    return f"{name}[{i}]"
        elif fd.type == _MESSAGE:
            if repeated:
                for i, sub in enumerate(value):
                    bad = non_utf8_field(sub, f"{name}[{i}].")
                    if bad:
                        return bad
            else:
                bad = non_utf8_field(value, f"{name}.")
                if bad:
                    return bad
    return None


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
    path = os.fsdecode(path)
    return parse_net_text(_read_bytes(path, "net prototxt"), path)


def read_net_binary(path):
    """Read a binary net (.caffemodel); returns the upgraded NetParameter."""
    path = os.fsdecode(path)
    net = read_binary(path, pb.NetParameter(), "caffemodel")
    return upgrade_net(net, path)


def read_net(path, what="net file"):
    """Read a net from text or binary, whichever ``path`` holds; ``what``
    names the file's role in errors ("weights file" where it holds weights).

    ``.caffemodel`` (and other binary suffixes) are read as binary.  Anything
    else is read as text; if it is not text (not UTF-8) it is tried as
    binary, and if that fails too the text error is raised.
    """
    path = os.fsdecode(path)
    lower = path.lower()
    if lower.endswith(_BINARY_SUFFIXES) or lower.endswith(".h5"):
        return read_net_binary(path)
    data = _read_bytes(path, what)
    try:
        text = _decode_text(data, path)
    except ParseError as text_error:
        net = pb.NetParameter()
        try:
            _parse_binary(data, net, path, what)
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
    path = os.fsdecode(path)
    return parse_solver_text(_read_bytes(path, "solver prototxt"), path)


# --------------------------------------------------------------------------
# Blobs

def read_blobproto(path):
    """Read a .binaryproto (e.g. a mean file) as a BlobProto."""
    return read_binary(path, pb.BlobProto(), "binaryproto")


def read_blob_array(path):
    """A .binaryproto's data as a float32 array; errors name the file."""
    path = os.fsdecode(path)
    return blobproto_to_array(read_blobproto(path), where=path)


def blobproto_to_array(blob, return_diff=False, where=""):
    """A BlobProto's data (or diff) as a float32 ndarray of its shape.
    ``where`` (file, layer, param) starts error messages.

    Uses the legacy num/channels/height/width when any of them is set (as
    pycaffe and Caffe's Blob::FromProto do), ``shape`` otherwise; reads
    ``double_data``/``double_diff`` when the float field is empty.
    """
    if return_diff:
        values = blob.diff if len(blob.diff) else blob.double_diff
    else:
        values = blob.data if len(blob.data) else blob.double_data
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = (blob.num, blob.channels, blob.height, blob.width)
    else:
        shape = tuple(int(d) for d in blob.shape.dim)
    where = f"{where}: " if where else ""
    if len(shape) > MAX_BLOB_AXES:
        raise ShapeError(f"{where}BlobProto has {len(shape)} axes; a blob has at most "
                         f"{MAX_BLOB_AXES} (Caffe's kMaxBlobAxes)")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{where}BlobProto has shape {list(shape)}: negative dimension")
    count = math.prod(shape)       # exact (np.prod wraps past int64)
    if len(values) != count:
        field = "diff" if return_diff else "data"
        raise ShapeError(
            f"{where}BlobProto has shape {list(shape)} ({count} values) but its "
            f"{field} holds {len(values)} values")
    return np.asarray(values, dtype=np.float32).reshape(shape)


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
    """Write ``data`` to ``path`` through a temporary file beside it, renamed
    over the name when complete (a crash never leaves half a file); a
    failure is a FileWriteError naming ``path``, and a name holding a
    device or folder is refused (check_replaceable)."""
    path = check_replaceable(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        if os.path.lexists(tmp) and not os.path.islink(tmp) and os.path.isfile(tmp):
            os.unlink(tmp)      # our own leftover (same pid): a regular file
        # exclusive and not following links: a symlink planted at the temp
        # name makes the write fail instead of landing in the link's target
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                     getattr(os, "O_NOFOLLOW", 0), 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, FileWriteError):
            raise FileWriteError.of(path, e) from None
        raise


def write_binary(msg, path):
    """Serialize ``msg`` to ``path`` atomically (binary protobuf)."""
    _atomic_write(path, msg.SerializeToString())


def write_text(msg, path):
    """Write ``msg`` to ``path`` atomically in protobuf text format."""
    _atomic_write(path, text_format.MessageToString(msg).encode("utf-8"))
