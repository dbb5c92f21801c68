"""Blob: a shape plus data and diff, each kept on host and device lazily.

``SyncedMemory`` follows Caffe's head states: UNINITIALIZED, AT_HOST,
AT_DEVICE, SYNCED. Asking for the host array (``blob.data`` in pycaffe)
downloads if the device holds the newer copy and then marks the host as
head, because the caller may write into the array; the next device use
uploads it. Layers ask for ``device_buffer()`` (read) or mark their outputs
``device_written()``; nothing is copied unless a side actually changed.

Kept host arrays (pycaffe's views): an array from ``blob.data``/``blob.diff``
that Python keeps shows the blob's current values after every public
caffe_ocl call (net.forward/backward, solver.step, apply_update,
clear_param_diffs, copy_from, ...), as pycaffe's views of the blob's memory
do: ``.data``/``.diff`` note their memory in ``_kept`` (weakly), and
``refresh_kept()``, called at the end of those calls, downloads the memories
whose host array is still referenced from outside (its reference count says
so) and whose device copy is newer, and marks the host as head again, so
that writes through the kept array reach the device at its next use. Memory
nobody keeps an array of leaves the set at the next refresh: the fast path
copies nothing.

``version`` counts the times the contents may have changed (a mutable host
access, a device write, the first zero fill): anything derived from the
memory (e.g. folded weights, caffe_ocl.plan.fold) is stale when it differs.
"""
import math
import sys
import weakref
from collections.abc import Iterable, Mapping, Set

import numpy as np

from .device import RECORDER, check_host_alloc, get_device, register_blob
from .errors import ArgumentError, ShapeError
from .ops import pointwise

UNINITIALIZED, AT_HOST, AT_DEVICE, SYNCED = range(4)

_kept = weakref.WeakSet()       # SyncedMemory whose host array was handed to Python


class _Layout:
    """``epoch`` counts the changes of any blob's shape or of the memory
    behind one (a reshape to another shape, share_data/share_diff,
    use_diff_memory, adopt_buffer, a device buffer allocated): a check made
    at one epoch (every layer's bottoms have the shapes it was set up for,
    caffe_ocl/net.py) still holds while the epoch stays the same."""
    __slots__ = ("epoch",)

    def __init__(self):
        self.epoch = 0


LAYOUT = _Layout()


_kept_blobs = weakref.WeakSet()  # Blobs whose .data was handed to Python


def refresh_kept():
    """Bring the host arrays Python still holds (from ``.data``/``.diff``)
    up to date with the device; see the module doc. A blob an execution
    plan left to be computed on read (``compute_on_read``) whose array is
    still held is computed first: the array would show an older value."""
    if _kept_blobs:
        for blob in list(_kept_blobs):
            host = blob._data._host if blob._data is not None else None
            # references: the attribute, ``host`` and getrefcount's argument
            if host is None or sys.getrefcount(host) <= 3:
                _kept_blobs.discard(blob)
            elif blob.compute_on_read is not None:
                blob.compute_pending()
    if not _kept:
        return
    for mem in list(_kept):
        host = mem._host
        # references: the attribute, ``host`` and getrefcount's argument; any
        # more are arrays (views) handed out and still alive
        if host is None or sys.getrefcount(host) <= 3:
            _kept.discard(mem)
            continue
        if mem.head == AT_DEVICE:
            mem.device.download(host, mem._buf)
        if mem.head in (AT_DEVICE, SYNCED):
            mem.head = AT_HOST          # the caller may write through its array
            mem.version += 1


class SyncedMemory:
    """float32 storage of ``capacity`` elements on host and device."""
    __slots__ = ("capacity", "_host", "_buf", "head", "_device", "version", "shared",
                 "__weakref__")

    def __init__(self, capacity, device=None):
        self.capacity = max(int(capacity), 1)
        self._host = None
        self._buf = None
        self.head = UNINITIALIZED
        self._device = device
        self.version = 0
        # the owner of a device buffer this memory shares with others from
        # its start (plan/concat_chain.py: growing Concats at batch 1, each
        # top the first floats of the next), or None; anything but that
        # owner's own launches writing here first asks it to ``dissolve()``
        self.shared = None

    @property
    def device(self):
        if self._device is None:
            self._device = get_device()
        return self._device

    def _host_array(self):
        if self._host is None:
            check_host_alloc(4 * self.capacity, f"a blob of {self.capacity} values")
            self._host = np.zeros(self.capacity, np.float32)
        return self._host

    def _device_buf(self):
        if self._buf is None:
            self._buf = self.device.alloc(self.capacity * 4)
            LAYOUT.epoch += 1
        return self._buf

    # -- host side
    def host(self):
        """Host array, up to date, read-only intent."""
        if RECORDER.ops is not None:
            RECORDER.note("H")
        if self.head == AT_DEVICE:
            self.device.download(self._host_array(), self._buf)
            self.head = SYNCED
        elif self.head == UNINITIALIZED:
            self._host_array()
            self.head = AT_HOST
        return self._host

    def mutable_host(self):
        """Host array the caller may write: marks the host as head."""
        h = self.host()
        self.head = AT_HOST
        self.version += 1
        return h

    # -- device side
    def buffer(self):
        """The device buffer (no sync). Used when binding kernel arguments."""
        return self._device_buf()

    def to_device(self):
        """Make the device copy current (upload if the host is newer)."""
        if RECORDER.ops is not None:
            RECORDER.note("R", self)
        if self.head == AT_HOST:
            if self.shared is not None:     # the upload would overwrite the others' floats
                self.shared.dissolve(keep=self)
            self.device.upload(self._device_buf(), self._host, blob_sync=True)
            self.head = SYNCED
        elif self.head == UNINITIALIZED:
            self.zero_device()
        return self._buf

    def adopt_buffer(self, buf, whatever_the_head=False):
        """Keep the device copy in ``buf`` from now on (a sub-buffer of a
        parameter arena, caffe_ocl/solvers/param_arena.py), copying the current
        device contents over (only where the device holds the current
        value, unless ``whatever_the_head``). Launch plans bound to the old
        buffer must be rebuilt by their owners."""
        if self._buf is not None and (whatever_the_head or self.head in (AT_DEVICE, SYNCED)):
            import pyopencl as cl
            cl.enqueue_copy(self.device.queue, buf, self._buf, byte_count=4 * self.capacity)
        self._buf = buf
        self.shared = None
        LAYOUT.epoch += 1

    def share_buffer(self, buf, owner, holding=False):
        """Keep the device copy in the first ``capacity`` floats of ``buf``,
        a buffer others use too, under ``owner`` (see ``shared``). Only
        while this memory holds nothing yet, or (``holding``) when ``buf``
        holds its device contents already; launch plans bound to a buffer
        it had are their owners' to rebuild."""
        assert holding or self.head == UNINITIALIZED
        self._buf = buf
        self.shared = owner
        LAYOUT.epoch += 1

    def unshare(self):
        """Leave the shared buffer: an own one, holding the device contents
        whatever the head says (a convolution may have written a slice in
        place since the host became the head: plan/concat.py's slice
        targets); launch plans bound to the old one are their owners' to
        rebuild."""
        if self.shared is None:
            return
        self.shared = None
        if self._buf is not None:
            self.adopt_buffer(self.device.alloc(self.capacity * 4), whatever_the_head=True)

    def zero_device(self):
        if self.shared is not None:
            self.shared.dissolve(keep=self)
        if RECORDER.ops is not None:
            RECORDER.note("W", self)
        buf = self._device_buf()
        pointwise.fill(self.device, buf, self.capacity, 0.0)
        self.head = AT_DEVICE
        self.version += 1

    def device_written(self, times=1):
        """A kernel wrote the device copy: it is now the only current one.
        ``times``: as many writes at once (a replayed forward, plan/trace.py,
        moves versions as the pass it replays did)."""
        if RECORDER.ops is not None:
            RECORDER.note("W", self)
        self._device_buf()
        self.head = AT_DEVICE
        self.version += times


# Caffe's kMaxBlobAxes (numpy itself stops at 64)
MAX_AXES = 32


class Blob:
    """N-d float32 array with data and diff, as Caffe's Blob<float>."""

    def __init__(self, shape=(), name="", device=None):
        self.name = name
        self._device = device
        self._shape = ()
        self._count = 0
        self._data = None
        self._diff = None
        # a callable that fills the data when it is read from the host: an
        # execution plan that skipped computing this blob (caffe_ocl/plan/elide.py)
        self.compute_on_read = None
        self.reshape(shape)
        register_blob(self)

    # ---- shape -----------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            dims = shape[0]
            if isinstance(dims, np.ndarray):
                dims = dims.reshape(-1).tolist()
            # a string or a mapping iterates to something that int() took
            # ("5" -> 5, {1: 2} -> 1): pycaffe's binding accepts ints only
            if isinstance(dims, (str, bytes, Mapping, Set)) or not isinstance(dims, Iterable):
                raise ArgumentError(f"blob {self.name!r}: reshape takes int dimensions "
                                    f"(or one sequence of them), got {type(dims).__name__} "
                                    f"{dims!r}")
            shape = tuple(dims)
        for i, s in enumerate(shape):
            # int(2.5) was 2 without a word
            if not isinstance(s, (int, np.integer)):
                raise ArgumentError(f"blob {self.name!r}: reshape dimension {i} must be "
                                    f"an int, got {type(s).__name__} {s!r}")
        shape = tuple(int(s) for s in shape)
        if len(shape) > MAX_AXES:
            raise ShapeError(f"blob {self.name!r}: {len(shape)} axes; a blob has at most "
                             f"{MAX_AXES} (Caffe's kMaxBlobAxes)")
        for i, s in enumerate(shape):
            if s < 0:
                raise ShapeError(f"blob {self.name!r}: negative dimension {i} ({s}) in "
                                 f"{shape}; dimensions are counts, 0 or more")
        count = math.prod(shape)          # exact: np.prod wraps past int64
        if count > 2**31 - 1:
            raise ShapeError(f"blob {self.name!r}: shape {shape} exceeds 2^31 elements")
        if shape != self._shape:
            LAYOUT.epoch += 1
        self._shape = shape
        self._count = count
        if self._data is None or count > self._data.capacity:
            LAYOUT.epoch += 1
            self._data = SyncedMemory(count, self._device)
            self._diff = SyncedMemory(count, self._device)
        elif count > self._diff.capacity:
            # a diff shared with a smaller blob (share_diff, or a memory plan's
            # buffer, caffe_ocl/plan/memory.py) no longer fits: own one again
            self._diff = SyncedMemory(count, self._device)
            LAYOUT.epoch += 1
        return self

    def reshape_like(self, other):
        return self.reshape(other.shape)

    @property
    def shape(self):
        return self._shape

    @property
    def count(self):
        return self._count

    def count_range(self, start, end=None):
        end = len(self._shape) if end is None else end
        return math.prod(self._shape[start:end])

    def canonical_axis(self, axis):
        n = len(self._shape)
        if not -n <= axis < max(n, 1):
            raise ShapeError(f"axis {axis} out of range for blob {self.name!r} "
                             f"of shape {self._shape}")
        return axis + n if axis < 0 else axis

    @property
    def num_axes(self):
        return len(self._shape)

    def _legacy(self, i):
        if len(self._shape) > 4:
            raise ShapeError(f"blob {self.name!r} has {len(self._shape)} axes; "
                             "legacy num/channels/height/width need <= 4")
        return self._shape[i] if i < len(self._shape) else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    # ---- pycaffe host views --------------------------------------------
    def compute_pending(self):
        """Fill the data now if a plan left it to be computed on read."""
        fn, self.compute_on_read = self.compute_on_read, None
        if fn is not None:
            fn()

    @property
    def data(self):
        """Host view of the data; writes reach the device at next use; a
        kept view is refreshed after each public call (``refresh_kept``)."""
        if self.compute_on_read is not None:
            self.compute_pending()
        _kept.add(self._data)
        _kept_blobs.add(self)
        return self._data.mutable_host()[:self._count].reshape(self._shape)

    @data.setter
    def data(self, value):
        self.data[...] = value

    @property
    def diff(self):
        _kept.add(self._diff)
        return self._diff.mutable_host()[:self._count].reshape(self._shape)

    @diff.setter
    def diff(self, value):
        self.diff[...] = value

    def host_data(self):
        """Read-only copy-free view (does not mark the host as head)."""
        if self.compute_on_read is not None:
            self.compute_pending()
        return self._data.host()[:self._count].reshape(self._shape)

    def host_diff(self):
        return self._diff.host()[:self._count].reshape(self._shape)

    # ---- device access for layers ---------------------------------------
    @property
    def data_mem(self):
        return self._data

    @property
    def diff_mem(self):
        return self._diff

    def data_buffer(self):
        return self._data.buffer()

    def diff_buffer(self):
        return self._diff.buffer()

    def share_data(self, other):
        """Use ``other``'s data storage (Caffe's ShareData)."""
        if other.count != self._count:
            raise ShapeError(f"cannot share data of {other.name!r} {other.shape} "
                             f"with {self.name!r} {self._shape}: counts differ")
        self._data = other._data
        LAYOUT.epoch += 1

    def share_diff(self, other):
        if other.count != self._count:
            raise ShapeError(f"cannot share diff of {other.name!r} {other.shape} "
                             f"with {self.name!r} {self._shape}: counts differ")
        self._diff = other._diff
        LAYOUT.epoch += 1

    def use_diff_memory(self, mem):
        """Store the diff in ``mem`` (a ``SyncedMemory`` of at least ``count``
        floats), shared with whoever else uses it: the diff memory plan
        (caffe_ocl/plan/memory.py) hands blobs with disjoint lifetimes one
        buffer."""
        self._diff = mem
        LAYOUT.epoch += 1

    def __repr__(self):
        return f"<Blob {self.name!r} {self._shape}>"
