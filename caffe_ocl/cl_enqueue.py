"""Kernel enqueues straight through the OpenCL library (issue #27 item 3).

At batch 1 a forward on a GPU waits on the host: on NVIDIA's OpenCL each
``pyopencl.enqueue_nd_range_kernel`` costs ~13 us, whatever the kernel.
Part of that is pyopencl's wrapping: an event object is asked of the driver,
wrapped in a Python object and released again when that object dies.
A launch that nobody waits on needs no event, so ``DirectEnqueue`` calls
``clEnqueueNDRangeKernel`` through ctypes with the event pointer NULL, on
the cl_kernel and cl_command_queue handles pyopencl already holds
(``int_ptr``). benchmarks/bench_enqueue.py measures both ways.

Any error status falls back to pyopencl's own call, which then raises its
usual exception (out of resources, invalid work-group size, ...), so errors
read the same whichever way a launch went. Where no OpenCL library can be
found by ctypes, or with CAFFE_OCL_DIRECT_ENQUEUE=0, launches go through
pyopencl as before.
"""
import ctypes
import ctypes.util
import functools
import os

from . import config

_lib = None
_lib_searched = False


def _loaded_opencl_paths():
    """Paths of the OpenCL loaders already mapped into this process (the one
    pyopencl links against first), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            name = os.path.basename(path)
            if name.startswith("libOpenCL") and path not in out:
                out.append(path)
    return out


def opencl_library():
    """ctypes handle of the OpenCL ICD loader, or None where none is found.

    The loader pyopencl uses is preferred (already in the process); any ICD
    loader would do, since a call dispatches through the handle's own table."""
    global _lib, _lib_searched
    if _lib_searched:
        return _lib
    _lib_searched = True
    candidates = _loaded_opencl_paths()
    found = ctypes.util.find_library("OpenCL")
    if found:
        candidates.append(found)
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            fn = lib.clEnqueueNDRangeKernel
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.c_void_p]
        _lib = lib
        break
    return _lib


_raw_fn = None


def direct_enqueue_fn():
    """``clEnqueueNDRangeKernel`` for DirectEnqueue, or None where launches
    should go through pyopencl (setting off, or no library found). A
    function object of its own without ``argtypes``: DirectEnqueue hands it
    ready ctypes objects, which ctypes passes without converting them."""
    global _raw_fn
    if not config.get("DIRECT_ENQUEUE"):
        return None
    lib = opencl_library()
    if lib is None:
        return None
    if _raw_fn is None:
        fn = lib["clEnqueueNDRangeKernel"]      # not the argtypes-checked attribute
        fn.restype = ctypes.c_int32
        _raw_fn = fn
    return _raw_fn


class DirectEnqueue:
    """One launch's ctypes arguments, made once: the handles, the sizes as
    size_t arrays, bound with the function into one ``functools.partial``
    per queue. ``__call__(queue)`` returns the OpenCL status (0 =
    CL_SUCCESS). Converting nine arguments through ``argtypes`` at every
    call cost about as much as the driver's own enqueue on PoCL (a few us
    a launch; benchmarks/bench_enqueue.py)."""
    __slots__ = ("fn", "kernel_ptr", "dims", "gsize", "lsize", "queue", "call")

    def __init__(self, fn, kernel, gsize, lsize):
        self.fn = fn
        self.kernel_ptr = kernel.int_ptr
        self.dims = len(gsize)
        self.gsize = (ctypes.c_size_t * self.dims)(*gsize)
        self.lsize = None if lsize is None else (ctypes.c_size_t * self.dims)(*lsize)
        self.queue = self.call = None

    def __call__(self, queue):
        if queue is not self.queue:     # the launch holds the queue it binds
            self.call = functools.partial(
                self.fn, ctypes.c_void_p(queue.int_ptr), ctypes.c_void_p(self.kernel_ptr),
                ctypes.c_uint32(self.dims), None, self.gsize, self.lsize, ctypes.c_uint32(0),
                None, None)
            self.queue = queue
        return self.call()
