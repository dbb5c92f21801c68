"""OpenCL device choice, context, queue, program cache and buffer pool.

One process uses one current ``Device`` (as Caffe uses one current GPU):
one context, one in-order queue, a program cache keyed by
(kernel file, sorted -D macros) and pyopencl's on-disk binary cache under
``$CAFFE_OCL_CACHE`` (default ``~/.cache/caffe_ocl``), so a second process
starts without recompiling.

Choice of device (first rule that applies):
1. ``CAFFE_OCL_DEVICE`` = ``N`` (index in ``device_query``'s list) or
   ``P:D`` (platform index : device index within that platform);
2. ``set_device(n)`` / ``set_mode_gpu()`` / ``set_mode_cpu()`` (pycaffe);
3. a GPU if any OpenCL GPU exists, else the best CPU driver (newest PoCL),
   never the Oclgrind simulator unless asked for by name/index.
"""
import hashlib
import logging
import os
import re
import site
import struct
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from . import cl_enqueue, config
from .errors import ArgumentError, DeviceError, FlagError

log = logging.getLogger("caffe_ocl")

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")

try:
    import pyopencl as cl
    import pyopencl.tools as cl_tools
except ImportError as exc:  # pragma: no cover - exercised only without pyopencl
    cl = None
    _IMPORT_ERROR = exc


def _require_cl():
    if cl is None:
        raise DeviceError(f"pyopencl is not installed ({_IMPORT_ERROR}); "
                          "pip install pyopencl")


# --------------------------------------------------------------------------
# Enumeration and choice
# --------------------------------------------------------------------------

def _pocl_version(platform_version):
    m = re.search(r"PoCL\s+(\d+)\.(\d+)", platform_version, re.I)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pocl_binary_intact(binary):
    """False for a PoCL program binary holding an empty file record, True
    for any other binary (other drivers' included).

    PoCL serialises a program with the files of its kernel cache directory,
    which processes sharing POCL_CACHE_DIR (MPI ranks, test workers) write
    concurrently: a file caught mid-write comes out as an empty record, and
    loading such a binary later makes PoCL abort the whole process on an
    assertion (pocl_binary.c, "len > 0") -- no error to catch. Layout read
    here (PoCL binary versions 9-11): 8-byte magic, device id (u64),
    version (u32), kernel count (u32), flags (u64), root entries (u32), a
    41-byte build hash, [u64 if version >= 10 with program-scope
    variables], then per root entry a u64 length and that many bytes."""
    b = bytes(binary)
    if b[:8] != b"poclbin\0" or len(b) < 77:
        return True
    (version,) = struct.unpack_from("<I", b, 16)
    flags, root_entries = struct.unpack_from("<QI", b, 24)
    off = 36 + 41
    if version >= 10 and flags & 2:
        off += 8
    for _ in range(root_entries):
        if off + 8 > len(b):
            return False
        (n,) = struct.unpack_from("<Q", b, off)
        off += 8
        if n == 0 or off + n > len(b):
            return False
        off += n
    return True


# A kernel cache entry, {key}.v2.bin: magic, the key it was built for (64 hex
# digits, the file's name), the binary's SHA-256, its length (u64), the
# binary. Reading checks all of them, and PoCL's file records, before the
# driver sees the bytes: a flipped bit aborted PoCL, a valid binary under
# another entry's name ran the wrong kernels (all-NaN outputs).
# (a suffix of its own: older caffe_ocl versions sharing the folder keep
# their raw .bin entries, and neither rebuilds the other's)
_CACHE_MAGIC = b"caffe_ocl-kcache-1\n"
CACHE_SUFFIX = ".v2.bin"


def write_cache_entry(path, binary):
    """Store ``binary`` as the cache entry ``path`` (temp file + rename)."""
    binary = bytes(binary)
    key = os.path.basename(path).split(".")[0].encode()
    data = (_CACHE_MAGIC + key + hashlib.sha256(binary).digest()
            + struct.pack("<Q", len(binary)) + binary)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_cache_entry(path):
    """The binary of the cache entry ``path``; OSError saying what is wrong
    when it is not an intact entry made for this key."""
    with open(path, "rb") as f:
        data = f.read()
    key = os.path.basename(path).split(".")[0].encode()
    n = len(_CACHE_MAGIC)
    if not data.startswith(_CACHE_MAGIC) or len(data) < n + len(key) + 40:
        raise OSError("not a caffe_ocl cache entry (an old format or damaged header)")
    if data[n:n + len(key)] != key:
        raise OSError("it was stored for another key")
    off = n + len(key)
    digest, (length,) = data[off:off + 32], struct.unpack_from("<Q", data, off + 32)
    binary = data[off + 40:]
    if len(binary) != length:
        raise OSError(f"{len(binary)} bytes of binary where {length} were stored")
    if hashlib.sha256(binary).digest() != digest:
        raise OSError("checksum mismatch")
    if not pocl_binary_intact(binary):
        raise OSError("a PoCL binary with an empty file record")
    return binary


def pocl_affinity_default(environ=None, allowed=None, ncpu=None):
    """Whether caffe_ocl turns on PoCL's POCL_AFFINITY (its CPU driver pins
    worker thread i to CPU i). Pinned, a small net's first passes after the
    process was idle run at the steady-state speed (2-core VM, LeNet batch
    64, median of the five passes after a 1 s pause: 4.6-5.1 ms against
    7.0-8.0 unpinned; back to back 4.3-4.9 against 4.2-5.0; MobileNet v2
    and training unchanged). Not when the user set POCL_AFFINITY (either way) or
    CAFFE_OCL_POCL_AFFINITY=0, nor unless this process may run on every CPU
    0..n-1: PoCL pins blindly, and newer versions abort when a pin fails
    (a container restricted to other CPUs)."""
    env = os.environ if environ is None else environ      # PoCL's own variable
    if "POCL_AFFINITY" in env or not config.get("POCL_AFFINITY", environ=environ):
        return False
    try:
        allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    except (AttributeError, OSError):     # not Linux
        return False
    ncpu = (os.cpu_count() or 0) if ncpu is None else ncpu
    return ncpu > 0 and allowed == set(range(ncpu))


def binary_cache_default(platform_version, environ=None):
    """Whether caffe_ocl stores (and loads) compiled program binaries in
    CAFFE_OCL_CACHE on a device of this platform: the BINARY_CACHE setting
    when set, else yes except on PoCL while its own kernel cache is on.

    Asking PoCL for a program's binary (clGetProgramInfo BINARIES) makes it
    generate machine code for every kernel of the program, most of them never
    launched by the net at hand: on a cold start that took 2-3x the
    compilation itself (BENCHMARKS.md, "Cold build"). PoCL keeps a cache of
    its own (POCL_CACHE_DIR, ~/.cache/pocl/kcache; off with
    POCL_KERNEL_CACHE=0) holding each program's compiled form and the code of
    each kernel launched, so a second process rebuilds from source in about
    0.1 s a program without caffe_ocl's copy (a cold MobileNet v2: 38 s with
    binaries stored, 13 s without; warm: 2.1 s against 2.7 s, loaded
    2-core machine)."""
    want = config.get("BINARY_CACHE", environ=environ)
    if want is not None:
        return want
    return not pocl_kernel_cache_on(platform_version, environ)


def pocl_kernel_cache_on(platform_version, environ=None):
    """Whether the platform is PoCL with its kernel cache on (it is unless
    POCL_KERNEL_CACHE=0)."""
    env = os.environ if environ is None else environ      # PoCL's own variable
    return (_pocl_version(platform_version) is not None
            and env.get("POCL_KERNEL_CACHE", "1").strip() != "0")


def pocl_cache_dir(environ=None):
    """Where PoCL keeps its kernel cache (POCL_CACHE_DIR, else
    $XDG_CACHE_HOME/pocl/kcache, else ~/.cache/pocl/kcache)."""
    env = os.environ if environ is None else environ      # PoCL's own variables
    if env.get("POCL_CACHE_DIR"):
        return env["POCL_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pocl", "kcache")


# A build from source that PoCL answered from its kernel cache takes ~0.1 s
# (it preprocesses the source to find the entry); compiling takes 0.4 s and
# more: shorter builds are not counted as compilations by BuildProgress
DRIVER_CACHE_HIT_S = 0.25


def counts_as_compilation(seconds, driver_caches_source):
    """Whether a build from source that took ``seconds`` is announced as a
    compilation: always, except a short one where the driver caches builds
    from source (it was a cache hit, not a first run)."""
    return not (driver_caches_source and seconds < DRIVER_CACHE_HIT_S)


def _set_pocl_affinity():
    """Before the first platform query (PoCL reads its options then)."""
    if pocl_affinity_default():
        os.environ["POCL_AFFINITY"] = "1"


def pip_cpu_driver(prefixes=None):
    """Intel's CPU OpenCL driver as `pip install intel-opencl-rt` (the
    ``[cpu]`` extra) lays it out (``<prefix>/lib/libintelocl.so``), or None."""
    if prefixes is None:
        prefixes = [sys.prefix, site.getuserbase(), sys.base_prefix]
    for base in prefixes:
        lib = os.path.join(base, "lib", "libintelocl.so")
        if os.path.isfile(lib):
            return lib
    return None


def _icd_vendors_empty(environ):
    """True when the ICD loader will find no driver: the vendor folder in
    effect (OCL_ICD_VENDORS, OPENCL_VENDOR_PATH or /etc/OpenCL/vendors)
    holds no ``.icd`` file."""
    where = environ.get("OCL_ICD_VENDORS") or environ.get("OPENCL_VENDOR_PATH") \
        or "/etc/OpenCL/vendors"
    if os.path.isfile(where):
        return False
    try:
        return not any(n.endswith(".icd") for n in os.listdir(where))
    except OSError:
        return True


def register_pip_cpu_driver(environ=None, lib=None):
    """Before the first platform query: when no OpenCL driver is registered
    (no root, no `pocl-opencl-icd`) but the ``[cpu]`` extra installed Intel's
    CPU runtime, point the ICD loader at it (OCL_ICD_VENDORS may name the
    driver library itself). Returns the library registered, or None."""
    environ = os.environ if environ is None else environ
    if not _icd_vendors_empty(environ):
        return None
    lib = lib or pip_cpu_driver()
    if lib:
        environ["OCL_ICD_VENDORS"] = lib
    return lib


def list_devices():
    """All OpenCL devices as dicts, in the order `device_query` numbers them."""
    _require_cl()
    _set_pocl_affinity()
    register_pip_cpu_driver()
    out = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    for pi, plat in enumerate(platforms):
        try:
            devs = plat.get_devices()
        except cl.Error:
            continue
        for di, dev in enumerate(devs):
            out.append(dict(index=len(out), platform_index=pi, device_index=di,
                            platform=plat, device=dev,
                            platform_name=plat.name.strip(),
                            platform_version=plat.version.strip(),
                            name=dev.name.strip(),
                            type=cl.device_type.to_string(dev.type),
                            is_gpu=bool(dev.type & cl.device_type.GPU),
                            is_cpu=bool(dev.type & cl.device_type.CPU),
                            compute_units=dev.max_compute_units,
                            global_mem=dev.global_mem_size,
                            local_mem=dev.local_mem_size,
                            version=dev.version.strip(),
                            driver=dev.driver_version.strip()))
    return out


def is_simulator(d):
    """Oclgrind (a device dict of list_devices): never chosen unless named.
    It reports CL_DEVICE_TYPE_ALL, so its ``is_gpu`` is true."""
    return "oclgrind" in d["platform_name"].lower()


def _rank(d):
    """Sort key: higher is better. GPUs first, then CPU drivers by PoCL version."""
    if is_simulator(d):
        return (-1,)
    pocl = _pocl_version(d["platform_version"]) or (0, 0)
    return (2 if d["is_gpu"] else 1, pocl, d["compute_units"])


def choose_device(devices, want=None, mode=None):
    """Return (device dict, reason). ``want`` is the CAFFE_OCL_DEVICE spelling
    or an int index; ``mode`` is None, "gpu" or "cpu"."""
    if not devices:
        raise DeviceError(
            "no OpenCL device found. Install a driver: your GPU vendor's "
            "OpenCL driver, or for the CPU `apt-get install pocl-opencl-icd` "
            "(fast) or `pip install 'caffe_ocl[cpu]'` (no root: Intel's CPU runtime, "
            "which caffe_ocl registers itself)")
    if want is not None and str(want).strip() != "":
        s = str(want).strip()
        if ":" in s:
            try:
                p, q = (int(x) for x in s.split(":", 1))
            except ValueError:
                raise DeviceError(f"CAFFE_OCL_DEVICE={s!r}: expected N or P:D")
            for d in devices:
                if d["platform_index"] == p and d["device_index"] == q:
                    return d, f"platform {p} device {q} as asked"
            raise DeviceError(f"no OpenCL device {s} (platform:device); "
                              f"run `caffe_ocl device_query` to list them")
        try:
            n = int(s)
        except ValueError:
            matches = [d for d in devices
                       if s.lower() in (d["name"] + " " + d["platform_name"]).lower()]
            if matches:
                return matches[0], f"name matches {s!r}"
            raise DeviceError(f"CAFFE_OCL_DEVICE={s!r}: expected N, P:D or a name")
        pool = devices
        if mode == "gpu":   # --gpu N on a machine without GPUs: a real CPU
            gpus = [d for d in devices if d["is_gpu"] and not is_simulator(d)]  # driver,
            # not the simulator
            pool = gpus or [d for d in devices if not is_simulator(d)] or devices
        if 0 <= n < len(pool):
            return pool[n], f"device {n} as asked"
        raise DeviceError(f"no OpenCL device {n}: {len(pool)} found; "
                          "run `caffe_ocl device_query` to list them")
    pool = [d for d in devices if not is_simulator(d)] or devices
    if mode == "cpu":
        cpus = [d for d in pool if d["is_cpu"]]
        if not cpus:
            raise DeviceError("CPU mode asked for, but no OpenCL CPU device "
                              "exists (install pocl-opencl-icd)")
        best = max(cpus, key=_rank)
        return best, _cpu_reason(best, cpus)
    gpus = [d for d in pool if d["is_gpu"]]
    if gpus:
        return max(gpus, key=_rank), "first GPU found"
    best = max(pool, key=_rank)
    return best, "no GPU; " + _cpu_reason(best, pool)


def _cpu_reason(best, cands):
    v = _pocl_version(best["platform_version"])
    why = "best CPU driver"
    if v:
        why = f"newest PoCL ({v[0]}.{v[1]})"
    if len(cands) > 1:
        why += f" of {len(cands)} CPU drivers"
    return why


def parse_device_ids(flag):
    """Device ids of a ``--gpu`` value as Caffe takes it: "" -> [], "N" or
    "N,M,..." -> the ids, "all" -> [0] (the first device)."""
    flag = (flag or "").strip()
    if not flag:
        return []
    if flag == "all":
        return [0]
    try:
        return [int(x) for x in flag.split(",") if x.strip()]
    except ValueError:
        raise FlagError(f"--gpu expects N, N,M,... or all, got {flag!r}") from None


# --------------------------------------------------------------------------
# Kernel signatures: declare scalar argument dtypes from the .cl source so
# pyopencl takes plain Python numbers at ~5 us per launch instead of ~35 us.
# --------------------------------------------------------------------------

_SCALAR_TYPES = {
    "int": np.int32, "uint": np.uint32, "unsigned": np.uint32,
    "long": np.int64, "ulong": np.uint64, "float": np.float32,
    "double": np.float64, "short": np.int16, "char": np.int8,
    "uchar": np.uint8, "size_t": np.uint64,
}

_KERNEL_RE = re.compile(
    r"\b(?:__kernel|kernel)\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)\s*\(([^)]*)\)",
    re.S)


def _strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def kernel_arg_dtypes(source):
    """{kernel name: [dtype or None per argument]} parsed from OpenCL C."""
    out = {}
    for name, args in _KERNEL_RE.findall(_strip_comments(source)):
        dts = []
        for a in args.split(","):
            a = a.strip()
            if not a:
                continue
            if "*" in a or "__global" in a or "global " in a or "__local" in a \
                    or "image" in a:
                dts.append(None)
                continue
            words = [w for w in re.split(r"\s+", a) if w not in ("const", "__private")]
            t = words[0] if len(words) > 1 else "float"
            if t not in _SCALAR_TYPES:
                raise DeviceError(f"kernel {name}: cannot declare argument {a!r}")
            dts.append(_SCALAR_TYPES[t])
        out[name] = dts
    return out


# --------------------------------------------------------------------------
# Progress while kernels compile on a cold cache
# --------------------------------------------------------------------------

def _tqdm():
    """tqdm's class, or None: an optional package (a bar on terminals when
    it is installed, plain log lines otherwise)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def progress_mode(setting=None, stream=None):
    """"bar", "lines" or "off" for the PROGRESS setting ("auto": a bar when
    ``stream`` (stderr) is a terminal and tqdm is installed, else lines)."""
    want = config.get("PROGRESS") if setting is None else setting
    stream = sys.stderr if stream is None else stream
    if want == "auto":
        isatty = getattr(stream, "isatty", None)
        want = "bar" if (isatty is not None and isatty() and _tqdm() is not None) else "lines"
    if want == "bar" and _tqdm() is None:
        want = "lines"
    return want


class BuildProgress:
    """Says that kernels are being compiled when that takes a while.

    Programs are compiled one by one as layers build their launches, so how
    many a net needs is not known beforehand. A burst of compilations (each
    starting within ``gap`` seconds of the previous one's end) that has
    lasted ``announce_after`` seconds gets one line saying so (first run
    only: the binaries are cached), then a tqdm bar counting programs on a
    terminal, or a plain log line every ``every`` seconds in logs; the bar
    steps aside (is cleared) whenever caffe_ocl logs a line."""

    def __init__(self, device_name, cache_dir, mode="lines", announce_after=1.0,
                 every=10.0, gap=5.0, clock=time.perf_counter, emit=None, where=None):
        self.device_name, self.cache_dir, self.mode = device_name, cache_dir, mode
        self.where = where          # "cached ..." when not in cache_dir (PoCL's cache)
        self.announce_after, self.every, self.gap = announce_after, every, gap
        self.clock = clock
        self.emit = emit if emit is not None else (lambda msg: log.info("%s", msg))
        self.start = self.last = None
        self.count = 0
        self.announced = False
        self.next_line = 0.0
        self.bar = None

    def compiled(self, started):
        """One program was compiled from source, starting at ``started``
        (the clock's time)."""
        if self.mode == "off":
            return
        now = self.clock()
        if self.last is None or started - self.last > self.gap:
            self.finish()
            self.start, self.count, self.announced = started, 0, False
        self.count += 1
        self.last = now
        elapsed = now - self.start
        if not self.announced:
            if elapsed < self.announce_after:
                return
            self.announced = True
            where = self.where or (f"cached in {self.cache_dir}" if self.cache_dir
                                   else "not cached: CAFFE_OCL_CACHE is empty")
            self.emit(f"Compiling OpenCL kernels for {self.device_name} (first run only; "
                      f"the binaries are {where})")
            self.next_line = elapsed + self.every
        if self.mode == "bar":
            self._bar_update()
        elif elapsed >= self.next_line:
            self.emit(f"... compiled {self.count} kernel programs in {elapsed:.0f} s")
            self.next_line = elapsed + self.every

    def _bar_update(self):
        if self.bar is None:
            tqdm = _tqdm()
            self.bar = tqdm(desc="compiling kernels", unit=" programs", leave=False,
                            initial=self.count - 1, file=sys.stderr, dynamic_ncols=True)
        self.bar.update(1)

    def step_aside(self):
        """Clear the bar (a log line is about to be written); the next
        compilation draws it again."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def finish(self):
        """End the current burst (its bar goes)."""
        self.step_aside()
        self.announced = False


class _ClearBarsBeforeLogging(logging.Filter):
    """On the caffe_ocl logger: progress bars are cleared before each record
    is written, so that log lines never land inside one."""

    def __init__(self):
        super().__init__()
        self.progress = weakref.WeakSet()

    def filter(self, record):
        for p in list(self.progress):
            p.step_aside()
        return True


_bar_filter = _ClearBarsBeforeLogging()
log.addFilter(_bar_filter)


# --------------------------------------------------------------------------
# Device
# --------------------------------------------------------------------------

# The commands' events, while timing.py records them (``record_events``):
# None, or a list each kernel launch, upload and download appends its event
# to (a profiling queue gives each its device start/end times).
_event_sink = None


class record_events:
    """``with record_events(sink):`` every command enqueued through
    ``Launch.run``, ``Device.upload``/``download`` (and ``note_event``)
    meanwhile appends its event to the list ``sink`` (per-step device times,
    caffe_ocl/timing.py). Not nested, one thread."""

    def __init__(self, sink):
        self.sink = sink

    def __enter__(self):
        global _event_sink
        _event_sink = self.sink
        return self.sink

    def __exit__(self, *exc):
        global _event_sink
        _event_sink = None


class _Recorder:
    """What the forward being traced (caffe_ocl/plan/trace.py) does: while
    ``ops`` is a list, the recording thread's kernel launches ("L", launch),
    device reads and writes of blob memories ("R"/"W", memory, from
    blob.py), host reads ("H") and direct uploads ("U") are appended to it.
    Other threads (data prefetch) are not recorded."""
    __slots__ = ("ops", "thread")

    def __init__(self):
        self.ops = None
        self.thread = None

    def start(self):
        self.ops, self.thread = [], threading.get_ident()

    def stop(self):
        ops, self.ops, self.thread = self.ops, None, None
        return ops

    def note(self, kind, obj=None):
        if threading.get_ident() == self.thread:
            self.ops.append((kind, obj))


RECORDER = _Recorder()


def note_event(event):
    """Record ``event`` while ``record_events`` is on (enqueues made outside
    Launch/Device, e.g. the data layers' uploads)."""
    if _event_sink is not None:
        _event_sink.append(event)


class Launch:
    """One kernel launch with its arguments bound once (at reshape time).

    ``run()`` only enqueues: no argument conversion, no lookups. The
    launch holds its buffer arguments: OpenCL kernels do not keep them
    alive, and a pooled buffer whose last Python reference went away (a
    workspace allocated only for this launch) would go back to the pool,
    be handed to another user or released, while the kernel still
    writes to it.

    A launch whose program is not built yet (``kernel`` None, ``pending``
    holding what to build and bind) builds it at its first ``run()``: nets
    set up launches they never run (a convolution's own launches where the
    TEST folding runs a fused one instead: a fifth to two fifths of the
    programs of the shipped nets), and compiling those was a good part of
    a cold start."""
    __slots__ = ("kernel", "gsize", "lsize", "name", "dtypes", "buffers", "pending",
                 "direct", "source")

    def __init__(self, kernel, gsize, lsize, name="", dtypes=None, buffers=None,
                 pending=None):
        self.kernel = kernel
        self.pending = pending      # (device, kernels file, defines, [args]) until built
        self.dtypes = dtypes
        self.buffers = buffers if buffers is not None else {}   # arg index -> buffer
        self.gsize = tuple(int(g) for g in gsize)
        self.lsize = None if lsize is None else tuple(int(x) for x in lsize)
        self.name = name
        # cl_enqueue.DirectEnqueue once the kernel exists (False: use pyopencl)
        self.direct = None
        # (device, kernels file, defines, [args]) kept after the build, for
        # ``rebound`` (None: made from a kernel, its arguments unknown)
        self.source = pending

    def set_arg(self, i, value):
        """Rebind one argument (for values that change per call: lr, seed)."""
        if self.source is not None:
            self.source[3][i] = value       # the same list as pending's while unbuilt
        if self.pending is None:
            dt = self.dtypes[i] if self.dtypes else None
            self.kernel.set_arg(i, value if dt is None else dt(value))
        if isinstance(value, cl.MemoryObjectHolder):
            self.buffers[i] = value
        else:
            self.buffers.pop(i, None)

    def rebound(self, buffers):
        """A new launch of the same kernel, sizes and arguments but with
        buffer arguments replaced by ``buffers`` ({buffer int_ptr: buffer}),
        its own kernel object (this one keeps its bindings); None where the
        arguments are unknown (a launch made from a kernel, or a subclass
        that runs conditionally). plan/activations.py runs a forward on
        shared buffers this way."""
        if type(self) is not Launch or self.source is None:
            return None
        dev, filename, defines, args = self.source
        args = [buffers.get(a.int_ptr, a) if isinstance(a, cl.MemoryObjectHolder) else a
                for a in args]
        bufs = {i: a for i, a in enumerate(args) if isinstance(a, cl.MemoryObjectHolder)}
        out = Launch(None, self.gsize, self.lsize, self.name, self.dtypes, bufs,
                     pending=(dev, filename, defines, args))
        out.bind()
        return out

    def bind(self):
        """Build the program (if not yet) and bind the arguments."""
        if self.pending is None:
            return
        dev, filename, defines, args = self.pending
        k = dev.kernel(filename, self.name, defines)
        try:
            k.set_args(*args)
        except (cl.Error, TypeError, ValueError, RuntimeError) as e:
            raise DeviceError(f"binding arguments of kernel {self.name}: {e}")
        self.kernel, self.pending = k, None

    def run(self, queue):
        if RECORDER.ops is not None:
            RECORDER.note("L", self)
        direct = self.direct
        if direct and _event_sink is None:
            # no event wanted: straight to clEnqueueNDRangeKernel (cl_enqueue.py);
            # on any error status pyopencl's call below raises its own error
            if direct(queue) == 0:
                return
        elif direct is None:
            if self.kernel is None:
                self.bind()
            fn = cl_enqueue.direct_enqueue_fn()
            self.direct = False if fn is None else cl_enqueue.DirectEnqueue(
                fn, self.kernel, self.gsize, self.lsize)
        ev = cl.enqueue_nd_range_kernel(queue, self.kernel, self.gsize, self.lsize)
        if _event_sink is not None:
            _event_sink.append(ev)


def round_up(x, m):
    return ((int(x) + m - 1) // m) * m


class Device:
    def __init__(self, info, reason=""):
        _require_cl()
        self.info = info
        self.reason = reason
        self.cl_device = info["device"]
        self.name = info["name"]
        self.is_gpu = info["is_gpu"]
        self.is_cpu = info["is_cpu"]
        self.vendor = self.cl_device.vendor.strip()
        self.is_nvidia = "nvidia" in self.vendor.lower()
        self.max_work_group = self.cl_device.max_work_group_size
        self.local_mem = self.cl_device.local_mem_size
        self.compute_units = self.cl_device.max_compute_units
        self.vector_width_float = self.cl_device.preferred_vector_width_float
        props = cl.command_queue_properties.PROFILING_ENABLE \
            if config.get("PROFILE") else 0
        try:
            self.context = cl.Context([self.cl_device])
            self.queue = cl.CommandQueue(self.context, properties=props)
        except cl.Error as e:
            raise DeviceError(f"cannot open OpenCL device {self.name}: {e}")
        # 8 leading bits per size bin: a block is rounded up by at most 1/256
        # (pyopencl's default 4 bits rounds every power-of-two size up 6%,
        # about 5% of a training net's memory); reuse is by exact bin anyway
        self.allocator = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue),
                                             leading_bits_in_bin_id=8)
        self._programs = {}
        self._sources = {}
        # kernel files built without LLVM's optimisations (-cl-opt-disable;
        # part of the program cache keys): the tests' GPU kernels on CPU
        # drivers, where optimising them took PoCL most of the suite's time
        # (tests/ops/test_conv_algorithms.py). CPU drivers only: NVIDIA's
        # compiler at -cl-opt-disable does not link the kernels' C99
        # ``inline`` helpers (unresolved externs)
        self.unoptimized_sources = frozenset()
        self.peak_bytes = 0          # most device memory the pool held at once
        self.unpooled_bytes = 0      # held by alloc_unpooled buffers
        self._lock = threading.Lock()
        self.cache_dir = config.get("CACHE")
        # program binaries in cache_dir (not on PoCL: binary_cache_default)
        self.binary_cache = bool(self.cache_dir) and binary_cache_default(
            info["platform_version"])
        # programs compiled from source vs. loaded from the disk cache
        self.build_stats = {"built": 0, "cached": 0, "seconds": 0.0}
        # (kernels file, -D macros, seconds, from the disk cache?, seconds
        # spent fetching and writing its binary to the disk cache) per program
        # build, in order (benchmarks/bench_cold_build.py reads it)
        self.build_log = []
        # PoCL's kernel cache keeps what was compiled from source (when
        # caffe_ocl stores no binaries of its own there)
        self.driver_caches_source = (not self.binary_cache
                                     and pocl_kernel_cache_on(info["platform_version"]))
        where = None
        if self.driver_caches_source:
            where = f"cached by PoCL in {pocl_cache_dir()}"
        elif self.cache_dir and not self.binary_cache:
            where = "not cached: CAFFE_OCL_BINARY_CACHE is off"
        self.build_progress = BuildProgress(self.name, self.cache_dir, progress_mode(),
                                            where=where)
        if self.build_progress.mode == "bar":
            _bar_filter.progress.add(self.build_progress)
        self.double_ok = "cl_khr_fp64" in self.cl_device.extensions
        self._scratch = []           # (floats, buffer) of shared_scratch, by size

    def __repr__(self):
        return f"<caffe_ocl Device {self.name} ({self.info['platform_name']})>"

    # ---- programs ------------------------------------------------------
    def _source(self, filename):
        src = self._sources.get(filename)
        if src is None:
            path = os.path.join(KERNEL_DIR, filename)
            with open(path) as f:
                src = f.read()
            self._sources[filename] = (src, kernel_arg_dtypes(src))
            src = self._sources[filename]
        return src

    def kernel_text(self, filename):
        """The source text of kernels/<filename> (or of a generated one)."""
        return self._source(filename)[0]

    def generated_source(self, text):
        """Register kernel source written at run time (plan/pointwise.py's
        fused chains) and return the name ``launch``/``program`` know it
        by (its hash: the same text is one program). It includes the
        kernels folder's headers as the files there do."""
        name = "generated/" + hashlib.sha256(text.encode()).hexdigest()[:20] + ".cl"
        if name not in self._sources:
            self._sources[name] = (text, kernel_arg_dtypes(text))
        return name

    def _program_key(self, filename, defines):
        return (filename, tuple(sorted((k, str(v)) for k, v in (defines or {}).items())),
                ("-cl-opt-disable",) if filename in self.unoptimized_sources else ())

    def program(self, filename, defines=None):
        """Built program for kernels/<filename> with -D macros (cached)."""
        key = self._program_key(filename, defines)
        prog = self._programs.get(key)
        if prog is not None:
            return prog
        with self._lock:
            prog = self._programs.get(key)
            if prog is not None:
                return prog
            src, _ = self._source(filename)
            opts = [f"-D{k}={v}" for k, v in key[1]]
            opts += ["-I", KERNEL_DIR, "-cl-mad-enable"] + list(key[2])
            if self.is_cpu:     # kernels/act.h: the CPU's own exp
                opts.append(CPU_MACRO)
            started, built = time.perf_counter(), self.build_stats["built"]
            prog = self._build(filename, src, opts)
            if self.build_stats["built"] > built and counts_as_compilation(
                    time.perf_counter() - started, self.driver_caches_source):
                self.build_progress.compiled(started)
            self._programs[key] = prog
            return prog

    def _cache_key(self, src, opts):
        """Hash of everything a binary depends on: source, every shared
        header, options, device and driver."""
        h = hashlib.sha256()
        h.update(src.encode())
        for hdr in sorted(f for f in os.listdir(KERNEL_DIR) if f.endswith(".h")):
            with open(os.path.join(KERNEL_DIR, hdr), "rb") as f:
                h.update(hdr.encode() + f.read())
        # the include folder's location is not part of the key (its headers'
        # contents are): a second checkout or install reuses the binaries
        h.update(" ".join("<dir>" if i and opts[i - 1] == "-I" else o
                          for i, o in enumerate(opts)).encode())
        info = self.info
        h.update(f"{info['platform_name']}|{info['platform_version']}|{self.name}|"
                 f"{info['driver']}|{info['version']}|{cl.VERSION_TEXT}".encode())
        return h.hexdigest()

    def _build(self, filename, src, opts):
        """Build from the on-disk binary cache when possible, else from
        source (and store the binary). ``build_stats`` counts both."""
        t0 = time.perf_counter()
        path = None
        if self.binary_cache:
            path = os.path.join(self.cache_dir, self._cache_key(src, opts) + CACHE_SUFFIX)
            if os.path.exists(path):
                try:
                    binary = read_cache_entry(path)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        prog = cl.Program(self.context, [self.cl_device], [binary]).build(
                            options=opts)
                    self.build_stats["cached"] += 1
                    self.build_stats["seconds"] += time.perf_counter() - t0
                    self.build_log.append((filename, _macros(opts), time.perf_counter() - t0, True,
                                           0.0))
                    return prog
                except (cl.Error, OSError) as e:
                    # stale or corrupt entry: rebuild below and overwrite it
                    log.warning("kernel cache entry %s not used (%s); rebuilding it", path, e)
        try:
            with warnings.catch_warnings():
                if not config.get("VERBOSE"):
                    warnings.simplefilter("ignore")
                prog = cl.Program(self.context, src).build(options=opts)
        except cl.RuntimeError as e:
            macros = " ".join(o for o in opts if o.startswith("-D"))
            raise DeviceError(f"building kernels/{filename} with {macros} "
                              f"failed on {self.name}:\n{e}")
        self.build_stats["built"] += 1
        self.build_stats["seconds"] += time.perf_counter() - t0
        built_s, t1 = time.perf_counter() - t0, time.perf_counter()
        if path:
            try:
                (binary,) = prog.get_info(cl.program_info.BINARIES)
                if binary and pocl_binary_intact(binary):
                    os.makedirs(self.cache_dir, exist_ok=True)
                    write_cache_entry(path, binary)
            except (cl.Error, OSError, ValueError):
                pass   # a read-only or full cache only costs rebuilds
        self.build_log.append((filename, _macros(opts), built_s, False, time.perf_counter() - t1))
        return prog

    def kernel(self, filename, name, defines=None):
        """A fresh Kernel object (its own bound arguments) with scalar dtypes
        declared from the source's signature."""
        prog = self.program(filename, defines)
        k = cl.Kernel(prog, name)
        dts = self._sources[filename][1].get(name)
        if dts is None:
            raise DeviceError(f"kernels/{filename}: no signature parsed for kernel {name}")
        k.set_scalar_arg_dtypes(dts)
        return k

    def launch(self, filename, name, gsize, lsize, args, defines=None):
        """A Launch of kernel ``name`` with ``args`` bound. ``gsize`` is
        rounded up to ``lsize`` so kernels must bounds-check. A program not
        built yet is built at the launch's first run (Launch.bind)."""
        if lsize is not None:
            gsize = [round_up(g, l) for g, l in zip(gsize, lsize)]
        dts = self._source(filename)[1].get(name)
        if dts is None:
            raise DeviceError(f"kernels/{filename}: no signature parsed for kernel {name}")
        for i, (a, dt) in enumerate(zip(args, dts)):
            if dt is not None and isinstance(a, (int, np.integer)) and \
                    np.dtype(dt).kind in "iu":
                lim = np.iinfo(dt)
                if not lim.min <= int(a) <= lim.max:
                    raise DeviceError(
                        f"kernel {name}: argument {i} is {int(a)}, outside "
                        f"{np.dtype(dt).name}: a size or parameter too large for "
                        "this kernel")
        bufs = {i: a for i, a in enumerate(args) if isinstance(a, cl.MemoryObjectHolder)}
        launch = Launch(None, gsize, lsize, name, dts, bufs,
                        pending=(self, filename, dict(defines or {}), list(args)))
        if self._program_key(filename, defines) in self._programs:
            launch.bind()           # built already: bind now (argument errors show here)
        return launch

    # ---- memory --------------------------------------------------------
    def memory_budget(self):
        """Bytes caffe_ocl may hold on this device: CAFFE_OCL_MEMORY_LIMIT_MB,
        else the device's global memory."""
        limit = config.get("MEMORY_LIMIT_MB")
        if limit is not None and limit > 0:
            return int(limit * 2**20)
        return int(self.cl_device.global_mem_size)

    def check_budget(self, nbytes, what="a buffer"):
        """DeviceError, before the driver sees it, when allocating ``nbytes``
        more would pass the budget or the device's single-buffer limit (PoCL
        aborts the process on allocations that fail)."""
        nbytes = int(nbytes)
        max_one = int(self.cl_device.max_mem_alloc_size)
        budget = self.memory_budget()
        in_use = int(self.allocator.active_bytes) + self.unpooled_bytes
        if nbytes > max_one and nbytes <= budget:
            raise DeviceError(
                f"out of device memory on {self.name}: {what} needs "
                f"{_mib(nbytes)} in one buffer; the device allows {_mib(max_one)} "
                "per buffer")
        if in_use + nbytes > budget:
            raise DeviceError(
                f"out of device memory on {self.name}: {what} needs {_mib(nbytes)} "
                f"more with {_mib(in_use)} in use; there is {_mib(budget)} "
                + ("(CAFFE_OCL_MEMORY_LIMIT_MB)" if config.is_set("MEMORY_LIMIT_MB")
                   else "(the device's global memory)"))

    def alloc(self, nbytes):
        """A device buffer from the pool (at least 4 bytes)."""
        self.check_budget(max(int(nbytes), 4))
        buf = self._allocate(lambda: self.allocator(max(int(nbytes), 4)), nbytes)
        self.peak_bytes = max(self.peak_bytes,
                              self.allocator.managed_bytes + self.unpooled_bytes)
        return buf

    def _allocate(self, make, nbytes):
        """``make()``, retried once after the pool gave its held blocks back
        to the driver; out of memory then is a DeviceError naming the size."""
        try:
            return make()
        except (cl.MemoryError, cl.Error) as e:
            self.allocator.free_held()
            try:
                return make()
            except (cl.MemoryError, cl.Error):
                raise DeviceError(f"out of device memory on {self.name}: could not "
                                  f"allocate {nbytes / 2**20:.1f} MiB ({e})")

    def alloc_unpooled(self, nbytes):
        """A plain ``cl.Buffer`` (not from the pool: sub-buffers can be cut
        from it, caffe_ocl/param_arena.py), counted in ``peak_bytes`` until
        its owner calls ``unpooled_freed(nbytes)``."""
        nbytes = max(int(nbytes), 4)
        self.check_budget(nbytes)
        buf = self._allocate(
            lambda: cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes), nbytes)
        self.unpooled_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes,
                              self.allocator.managed_bytes + self.unpooled_bytes)
        return buf

    def unpooled_freed(self, nbytes):
        self.unpooled_bytes -= nbytes

    def shared_scratch(self, nfloats):
        """A device buffer of at least ``nfloats`` floats, shared by every
        layer and primitive on this device: for workspaces that hold nothing
        between launches of one layer's forward or backward (convolution
        column buffers, split-K partials). Layers run one after another on
        the device's one in-order queue, so one buffer serves them all
        instead of one per layer (ResNet-50 on a CPU device: one 32 MiB
        buffer instead of 53). Sizes are rounded up to a power of two so
        that a few buffers cover every request; a bigger request adds a
        buffer (the smaller ones stay bound to the layers using them)."""
        for n, buf in self._scratch:
            if n >= nfloats:
                return buf
        n = 1 << max(int(nfloats) - 1, 1).bit_length()
        buf = self.alloc(4 * n)
        self._scratch.append((n, buf))
        self._scratch.sort(key=lambda e: e[0])
        return buf

    def drop_shared_scratch(self):
        """Forget the shared scratch buffers (benchmarks measuring memory;
        layers already bound to one keep it alive)."""
        self._scratch = []

    def upload(self, buf, host, blob_sync=False):
        """blob_sync: a blob memory's own upload (SyncedMemory.to_device,
        recorded there as a read), not one a forward trace must repeat."""
        if RECORDER.ops is not None and not blob_sync:
            RECORDER.note("U")
        if _event_sink is None:
            cl.enqueue_copy(self.queue, buf, np.ascontiguousarray(host), is_blocking=False)
            return
        # recorded (caffe_ocl time): the kept event holds the array it copies
        # from until the recording ends; a copy keeps it from holding the
        # blob's own host array, which blob.refresh_kept would take for a view
        # the user still holds (and mark for upload again at every pass)
        ev = cl.enqueue_copy(self.queue, buf, np.array(host, order="C", copy=True),
                             is_blocking=False)
        _event_sink.append(ev)

    def download(self, host, buf):
        if RECORDER.ops is not None:
            RECORDER.note("H")
        ev = cl.enqueue_copy(self.queue, host, buf, is_blocking=True)
        if _event_sink is not None:
            _event_sink.append(ev)

    @property
    def profiling(self):
        """Whether the queue records device start/end times per command."""
        return bool(self.queue.properties & cl.command_queue_properties.PROFILING_ENABLE)

    def enable_profiling(self):
        """Make the queue a profiling one from now on (``caffe_ocl time``'s
        per-step device times; ``CAFFE_OCL_PROFILE=1`` makes it one from
        the start): what was enqueued finishes first, so the one in-order
        queue's ordering holds across the switch."""
        if self.profiling:
            return
        self.queue.finish()
        try:
            self.queue = cl.CommandQueue(
                self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        except cl.Error as e:
            raise DeviceError(f"cannot open a profiling queue on {self.name}: {e}")

    def finish(self):
        self.queue.finish()


def _mib(nbytes):
    return f"{nbytes / 2**20:.1f} MiB"


def host_memory_budget():
    """Bytes one host buffer may take: CAFFE_OCL_HOST_MEMORY_LIMIT_MB, else
    the machine's physical memory."""
    limit = config.get("HOST_MEMORY_LIMIT_MB")
    if limit is not None and limit > 0:
        return int(limit * 2**20)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # not POSIX
        return 1 << 62


def check_host_alloc(nbytes, what="a host buffer"):
    """DeviceError naming the sizes when ``nbytes`` of host memory is past
    the host budget (numpy would raise MemoryError, or the kernel's OOM
    killer end the process)."""
    budget = host_memory_budget()
    if int(nbytes) > budget:
        raise DeviceError(f"out of host memory: {what} needs {_mib(int(nbytes))}; there is "
                          f"{_mib(budget)}"
                          + (" (CAFFE_OCL_HOST_MEMORY_LIMIT_MB)"
                             if config.is_set("HOST_MEMORY_LIMIT_MB") else ""))


# --------------------------------------------------------------------------
# Current device (pycaffe's set_mode_*/set_device)
# --------------------------------------------------------------------------

_current = None
_wanted_index = None
_wanted_mode = None
_live_blobs = weakref.WeakSet()      # Blobs alive (blob.py registers each)


def register_blob(blob):
    """Count ``blob`` among the live blobs until it is garbage-collected."""
    _live_blobs.add(blob)


def live_blob_count():
    return len(_live_blobs)


def current_device():
    """The current Device, or None while none has been created (unlike
    :func:`get_device`, this never creates one)."""
    return _current


# defined in every program built for a CPU driver (kernels/act.h)
CPU_MACRO = "-DCAFFE_OCL_CPU=1"


def _macros(opts):
    """The -D macros of a build's options (the program's own: not the
    device-wide CPU_MACRO), as one string."""
    return " ".join(o for o in opts if o.startswith("-D") and o != CPU_MACRO)


def get_device():
    """The current Device, created on first use."""
    global _current
    if _current is None:
        devices = list_devices()
        want = config.get("DEVICE")
        if not want and _wanted_index is not None:
            want = _wanted_index
        info, reason = choose_device(devices, want, _wanted_mode)
        _current = Device(info, reason)
        log.info("Using OpenCL device %s on %s (%s)", info["name"],
                 info["platform_name"], reason)
    return _current


def selection():
    """What set_mode_*/set_device chose and the current Device, for
    ``restore_selection`` (tests that run a command with --gpu put the
    process's device back with them)."""
    return _current, _wanted_index, _wanted_mode


def restore_selection(state):
    global _current, _wanted_index, _wanted_mode
    _current, _wanted_index, _wanted_mode = state


def _reset(index=None, mode=None):
    global _current, _wanted_index, _wanted_mode
    if _current is not None and index == _wanted_index and mode == _wanted_mode:
        return
    if _current is not None:
        if live_blob_count():
            log.warning("changing device while blobs exist on %s; they keep "
                        "their old device", _current.name)
    _wanted_index, _wanted_mode = index, mode
    _current = None


def set_mode_gpu():
    _reset(_wanted_index, "gpu")


def set_mode_cpu():
    _reset(None, "cpu")


def set_device(index):
    # pycaffe's binding takes an int only: int(0.5) chose device 0 unasked
    if not isinstance(index, (int, np.integer)):
        raise ArgumentError(f"set_device takes an int device index, got "
                            f"{type(index).__name__} {index!r}")
    _reset(int(index), _wanted_mode)


def describe_devices():
    """Text for `caffe_ocl device_query`."""
    devices = list_devices()
    lines = []
    try:
        chosen, reason = choose_device(devices, config.get("DEVICE") or None)
    except DeviceError as e:
        chosen, reason = None, str(e)
    for d in devices:
        mark = "*" if chosen is d else " "
        lines.append(
            f"{mark} [{d['index']}] {d['platform_index']}:{d['device_index']} "
            f"{d['name']}\n"
            f"      platform: {d['platform_name']} ({d['platform_version']})\n"
            f"      type: {d['type']}, compute units: {d['compute_units']}, "
            f"global memory: {d['global_mem'] / 2**20:.0f} MiB, "
            f"local memory: {d['local_mem'] // 1024} KiB\n"
            f"      OpenCL: {d['version']}, driver: {d['driver']}")
    if chosen is not None:
        lines.append(f"chosen: [{chosen['index']}] {chosen['name']} ({reason}); "
                     "override with CAFFE_OCL_DEVICE=N or P:D")
    else:
        lines.append(reason)
    return "\n".join(lines)
