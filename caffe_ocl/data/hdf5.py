"""Reading HDF5 files that may be damaged or hostile (HDF5 weights,
HDF5 solver states, HDF5Data files): h5py's exceptions on a bad heap or
object header become one line naming the file, special files are refused
before h5py opens them, and a dataset is checked (numeric, its shape, its
size against the host memory budget) before it is read."""
import contextlib
import math
import os
import stat

import numpy as np

from ..device import check_host_alloc
from ..errors import CaffeOclError, DeviceError, FileNotFound, NetError

# what h5py raises on a damaged file (a bad heap, a bad object header, a
# dtype with no conversion, a name that is not a dataset)
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError)


@contextlib.contextmanager
def h5_errors(where, error=NetError):
    """h5py's exceptions while reading ``where`` become one ``error`` line
    naming it (a damaged HDF5 file is bad input, not a crash)."""
    try:
        yield
    except CaffeOclError:
        raise
    except MemoryError:
        raise DeviceError(f"{where}: out of host memory reading HDF5") from None
    except H5_ERRORS as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        raise error(f"{where}: damaged or unreadable HDF5 file ({msg})") from None


def open_h5(h5py, path, where=None, error=NetError):
    """h5py.File(path, "r") of a regular file; one ``error`` line otherwise
    (a FIFO would block, a device never end)."""
    where = where or path
    what = "" if path in where else f" HDF5 file {path!r}"
    try:
        st = os.stat(path)
    except OSError as e:
        raise FileNotFound(f"{where}:{what} not found ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{where}:{what} not a regular file")
    with h5_errors(where, error):
        return h5py.File(path, "r")


def read_dataset(h5py, obj, where, error=NetError, max_count=None, shape_ok=None):
    """A numeric HDF5 dataset as float32, checked before it is read: a
    group, a string or compound dtype, a count past ``max_count`` or a shape
    ``shape_ok(shape)`` refuses is one ``error`` line naming ``where``."""
    if not isinstance(obj, h5py.Dataset):
        raise error(f"{where} is not a dataset")
    if obj.dtype.kind not in "fiub":
        raise error(f"{where} holds {obj.dtype} values, not numbers")
    shape = tuple(int(d) for d in obj.shape) if obj.shape is not None else None
    if shape is None:
        raise error(f"{where} is an empty (null) dataset")
    if shape_ok is not None:
        shape_ok(shape)
    count = math.prod(shape)
    if max_count is not None and count > max_count:
        raise error(f"{where} has shape {list(shape)} ({count} values), more than the "
                    f"{max_count} expected")
    check_host_alloc(count * 4, where)      # a never-written dataset can claim terabytes
    with h5_errors(where, error):
        return np.asarray(obj[()], dtype=np.float32).reshape(shape)
