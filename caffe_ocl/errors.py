"""The one exception family of caffe_ocl.

Every error a user can cause (a bad file, a net that does not fit its
weights, a device that runs out of memory) is raised as a subclass of
``CaffeOclError`` with a message that names the file, layer, blob or record
involved, what was expected and what was found. The command line prints that
message alone and exits non-zero; Python callers can catch the class.
"""


import contextlib


class CaffeOclError(Exception):
    """Base class of every error caffe_ocl raises on purpose."""


class ParseError(CaffeOclError):
    """A prototxt/caffemodel/binaryproto/solver file could not be read."""


class ShapeError(CaffeOclError):
    """Shapes that do not fit: weights vs. net, bottoms of a layer, ..."""


class NetError(CaffeOclError):
    """A net that cannot be wired: unknown layer type, missing bottom, ..."""


class LayerError(CaffeOclError):
    """A layer parameter that Caffe would reject."""


class DeviceError(CaffeOclError):
    """OpenCL device trouble: no device, build failure, out of memory."""


class DataError(CaffeOclError):
    """A database or data file that cannot be read as expected."""


class LabelError(DataError):
    """A label outside the range its layer indexes (a loss or Accuracy
    layer's bottom 1), found by the device-side check."""


class SolverError(CaffeOclError):
    """A solver definition or state that cannot be used."""


class FlagError(CaffeOclError):
    """A command-line flag or argument that cannot be used (unknown flag,
    bad value, wrong number of arguments)."""


class MissingDependency(CaffeOclError):
    """An optional package (or program) that a command needs is not
    installed; the message names what to install."""


class ArgumentError(CaffeOclError, TypeError):
    """A Python API call given an argument of the wrong type (None, a
    string where a number or a list of names goes, an object that is no
    Net). Also a TypeError, which Python raises for such calls and pycaffe's
    Boost.Python bindings too (their ArgumentError is one)."""


class ArgumentValueError(CaffeOclError, ValueError):
    """A Python API call given an argument of the right type but a value it
    cannot use (out of range, an empty window). Also a ValueError, which
    Python and pycaffe's NumPy code raise for such values."""


class OutOfHostMemory(DeviceError, MemoryError):
    """A host array too large to make (an absurd size asked of a pycaffe
    helper), refused before allocating. Also a MemoryError, which NumPy
    raises in pycaffe for the same call."""


class FileNotFound(CaffeOclError, FileNotFoundError):
    """A path the user gave does not exist."""


class FileWriteError(CaffeOclError, OSError):
    """A file caffe_ocl was asked to write (a caffemodel, a prototxt) could
    not be written, or its name holds something that is not a regular file
    (a device, a folder), which saving would have replaced. An OSError too,
    so callers that catch OSError around a save still do, and they find the
    failed call's errno and strerror on it (``of``)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""

    @classmethod
    def of(cls, path, err):
        """The error for writing ``path`` having failed with OSError ``err``."""
        e = cls(f"cannot write {path}: {err.strerror or err}")
        e.errno, e.strerror, e.filename = err.errno, err.strerror, path
        return e


def check_replaceable(path):
    """FileWriteError unless ``path`` is free or a regular file (a link to
    one included): a save writes a new file and renames it over the name,
    which as root replaced /dev/full by a regular file."""
    import os
    import stat
    path = os.fspath(path)
    if not path:
        raise FileWriteError("cannot write a file with an empty name")
    try:
        st = os.stat(path)
    except OSError:
        return path         # free (or unreadable: the write itself will say)
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise FileWriteError(f"cannot write {path}: it is {kind}, which saving would "
                             "replace; give the name of a new or regular file")
    return path


def require_file(path, what="file"):
    """Raise FileNotFound with a readable message when ``path`` is missing."""
    import os
    if not os.path.exists(path):
        raise FileNotFound(f"{what} not found: {path}")
    if os.path.isdir(path) and what != "directory" and what != "database":
        raise FileNotFound(f"{what} is a directory, expected a file: {path}")
    return path


def _with_message(exc, msg):
    """An exception of ``exc``'s class with message ``msg`` (CaffeOclError
    when that class does not take one argument)."""
    try:
        new = type(exc)(msg)
    except Exception:  # noqa: BLE001 - a subclass with another signature
        new = CaffeOclError(msg)
    return new


@contextlib.contextmanager
def naming(where, key=None):
    """Errors raised in the block name ``where`` (a file, a layer): a
    CaffeOclError whose message does not mention it gets ``where: `` in
    front; arithmetic on absurd values (OverflowError, ZeroDivisionError, a
    math domain error) and a MemoryError become a CaffeOclError naming it,
    so that a bad input is one line, never a traceback. ``key`` (default
    ``where``) is the text whose presence means the message names it."""
    try:
        yield
    except CaffeOclError as e:
        msg = str(e)
        if (key or where) in msg:
            raise
        raise _with_message(e, f"{where}: {msg}") from None
    except MemoryError:
        raise DeviceError(f"{where}: out of host memory") from None
    except (ArithmeticError, ValueError) as e:
        if isinstance(e, ValueError) and "math domain error" not in str(e):
            raise
        raise LayerError(f"{where}: a parameter is out of range ({e})") from None


class ArrayShapeError(ShapeError, ValueError):
    """An array given to a Python API call (a net input, an output diff)
    whose shape does not fit its blob. Also a ValueError, which NumPy
    raises in pycaffe when the array does not broadcast."""


class UnknownLayerError(NetError, ValueError):
    """A layer name given to a Python API call (forward/backward's start=
    or end=) that the net has no layer of. Also a ValueError, which
    pycaffe's ``list.index`` raises for it."""


class ArgumentOverflowError(CaffeOclError, OverflowError):
    """A Python API call given a number beyond the C++ type it goes to (a
    solver's iteration count beyond int32). Also an OverflowError, which
    pycaffe's Boost.Python bindings raise for it."""
