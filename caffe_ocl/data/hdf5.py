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


def check_vlen_string(h5py, obj, path, where, error=NetError):
    """Check a scalar variable-length string dataset's global-heap reference
    against the file before HDF5 follows it: a damaged reference (its heap
    address zeroed) makes libhdf5 loop forever inside the read. The stored
    value is (length uint32, heap collection address uint64, index uint32);
    the address must point at a "GCOL" collection inside the file."""
    tid = obj.id.get_type()
    if not (isinstance(tid, h5py.h5t.TypeStringID) and tid.is_variable_str()):
        return
    offset = obj.id.get_offset()
    if offset is None:            # compact or not allocated: nothing to follow
        return
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(16)
        if len(raw) < 16:
            raise error(f"{where}: its string lies past the end of the file")
        length = int.from_bytes(raw[:4], "little")
        addr = int.from_bytes(raw[4:12], "little")
        index = int.from_bytes(raw[12:16], "little")
        if length == 0:
            return
        bad = f"{where}: its string reference is damaged"
        if length > size or addr + 16 > size:
            raise error(f"{bad} (length {length}, heap at {addr} in a file of {size} bytes)")
        f.seek(addr)
        head = f.read(16)
        coll = int.from_bytes(head[8:16], "little")
        if head[:4] != b"GCOL" or coll < 16 or addr + coll > size:
            raise error(f"{bad} (no heap collection at {addr})")
        # walk the collection's objects (index u16, refcount u16, reserved,
        # size u64, data padded to 8): an object of size 0 is never passed
        data = f.read(coll - 16)
        pos = 0
        while pos + 16 <= len(data):
            idx = int.from_bytes(data[pos:pos + 2], "little")
            osize = int.from_bytes(data[pos + 8:pos + 16], "little")
            if idx == 0:               # the free space that ends the collection
                break
            if osize == 0 or pos + 16 + osize > len(data):
                raise error(f"{bad} (heap object {idx} has size {osize})")
            if idx == index:
                if osize < length:
                    raise error(f"{bad} (heap object {idx} holds {osize} bytes, the "
                                f"string {length})")
                return
            pos += 16 + (osize + 7) // 8 * 8
        raise error(f"{bad} (heap object {index} not found)")
