"""Device choice, kernel signature parsing, the on-disk program cache, and
the command line's one-line errors."""
import os
import subprocess
import sys

import numpy as np
import pytest

from caffe_ocl.device import choose_device, kernel_arg_dtypes
from caffe_ocl.errors import DeviceError
from conftest import ROOT, child_env


def _dev(i, name, platform, version, gpu=False, pi=0, di=0, cu=2):
    return dict(index=i, platform_index=pi, device_index=di, name=name, platform_name=platform,
                platform_version=version, is_gpu=gpu, is_cpu=not gpu, compute_units=cu)


OCLGRIND = _dev(0, "Oclgrind Simulator", "Oclgrind", "OpenCL 1.2 (Oclgrind 21.10)", pi=0)
OCLGRIND.update(is_gpu=True, is_cpu=True)     # it reports CL_DEVICE_TYPE_ALL
POCL_PIP = _dev(1, "cpu", "Portable Computing Language", "OpenCL 3.0 PoCL 3.0-rc2", pi=1)
POCL_DEB = _dev(2, "cpu", "Portable Computing Language", "OpenCL 3.0 PoCL 3.1+debian", pi=2)
GPU = _dev(3, "NVIDIA H200", "NVIDIA CUDA", "OpenCL 3.0 CUDA", gpu=True, pi=3, cu=132)


def test_prefers_gpu_then_newest_pocl_never_the_simulator():
    d, why = choose_device([OCLGRIND, POCL_PIP, POCL_DEB, GPU])
    assert d is GPU and "GPU" in why
    d, why = choose_device([OCLGRIND, POCL_PIP, POCL_DEB])
    assert d is POCL_DEB and "3.1" in why and "2 CPU drivers" in why
    d, _ = choose_device([OCLGRIND, POCL_DEB, GPU], mode="cpu")
    assert d is POCL_DEB


def test_explicit_choice_by_index_platform_device_or_name():
    devs = [OCLGRIND, POCL_PIP, POCL_DEB, GPU]
    assert choose_device(devs, "1")[0] is POCL_PIP
    assert choose_device(devs, "2:0")[0] is POCL_DEB
    assert choose_device(devs, "oclgrind")[0] is OCLGRIND
    with pytest.raises(DeviceError, match="no OpenCL device 9"):
        choose_device(devs, "9")
    # `--gpu 0` on a machine without GPUs: the real CPU driver, not the
    # simulator that happens to be listed first
    assert choose_device([OCLGRIND, POCL_DEB], "0", mode="gpu")[0] is POCL_DEB
    with pytest.raises(DeviceError, match="no OpenCL device found"):
        choose_device([])
    with pytest.raises(DeviceError, match="no OpenCL CPU device"):
        choose_device([GPU], mode="cpu")


def test_kernel_signature_dtypes():
    src = """
    // comment (int a)
    __kernel __attribute__((reqd_work_group_size(16, 16, 1)))
    void k1(int n, __global const float* x, const float alpha, uint seed, __local float* tmp) {}
    kernel void k2(long big, __global float *y) {}
    """
    d = kernel_arg_dtypes(src)
    assert d["k1"] == [np.int32, None, np.float32, np.uint32, None]
    assert d["k2"] == [np.int64, None]


def _build_in_subprocess(cache, binary_cache="1"):
    code = ("import caffe_ocl as c, json; n = c.Net(%r, c.TEST); n.forward(); "
            "print(json.dumps(n.device.build_stats))") % str(ROOT / "models/lenet/lenet.prototxt")
    # caffe_ocl's own binary store, also on PoCL (where it is off by default)
    env = dict(os.environ, CAFFE_OCL_CACHE=str(cache), CAFFE_OCL_BINARY_CACHE=binary_cache)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_programs_from_disk_cache(tmp_path):
    first = _build_in_subprocess(tmp_path)
    assert first["built"] > 0 and first["cached"] == 0
    assert any(f.endswith(".bin") for f in os.listdir(tmp_path))
    second = _build_in_subprocess(tmp_path)
    assert second["built"] == 0 and second["cached"] == first["built"]


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    first = _build_in_subprocess(tmp_path)
    for f in os.listdir(tmp_path):
        (tmp_path / f).write_bytes(b"garbage")
    again = _build_in_subprocess(tmp_path)
    assert again["built"] == first["built"]


def test_binary_cache_default_is_off_only_where_pocl_caches_itself():
    from caffe_ocl.device import binary_cache_default
    pocl = "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, LLVM 15.0.6"
    intel = "OpenCL 3.0 LINUX"
    assert binary_cache_default(pocl, {}) is False
    assert binary_cache_default(pocl, {"POCL_KERNEL_CACHE": "0"}) is True
    assert binary_cache_default(intel, {}) is True
    assert binary_cache_default(pocl, {"CAFFE_OCL_BINARY_CACHE": "1"}) is True
    assert binary_cache_default(intel, {"CAFFE_OCL_BINARY_CACHE": "off"}) is False


def test_no_binaries_stored_where_pocl_keeps_its_own_cache(tmp_path, monkeypatch):
    """On PoCL (default settings) the second process compiles from source
    again and PoCL's kernel cache answers: nothing in CAFFE_OCL_CACHE."""
    from caffe_ocl.device import get_device
    if not get_device().driver_caches_source:
        pytest.skip("not PoCL with its kernel cache on")
    env_pocl = tmp_path / "pocl"
    monkeypatch.setenv("POCL_CACHE_DIR", str(env_pocl))
    first = _build_in_subprocess(tmp_path / "own", binary_cache="")
    second = _build_in_subprocess(tmp_path / "own", binary_cache="")
    assert first["cached"] == second["cached"] == 0
    assert second["built"] == first["built"] > 0
    assert not (tmp_path / "own").exists() or not any(
        f.endswith(".bin") for f in os.listdir(tmp_path / "own"))
    assert os.listdir(env_pocl)                        # PoCL's cache holds them


def test_driver_cache_hits_are_not_announced_as_compilations():
    from caffe_ocl.device import counts_as_compilation
    assert counts_as_compilation(0.1, False)           # our cache is the cache
    assert not counts_as_compilation(0.1, True)        # PoCL answered from its cache
    assert counts_as_compilation(0.6, True)


def _empty_first_record(binary):
    """A PoCL binary whose first root file record claims 0 bytes, as when
    PoCL serialised a file that another process was still writing."""
    b = bytearray(binary)
    b[77:85] = bytes(8)
    return bytes(b)


def test_pocl_binary_with_an_empty_record_is_refused():
    from caffe_ocl.device import get_device, pocl_binary_intact
    import pyopencl as cl
    dev = get_device()
    (binary,) = dev.program("shape.cl").get_info(cl.program_info.BINARIES)
    assert pocl_binary_intact(binary)
    assert pocl_binary_intact(b"not a pocl binary")       # other drivers' binaries
    if binary[:8] != b"poclbin\0":
        pytest.skip("not a PoCL device")
    assert not pocl_binary_intact(_empty_first_record(binary))
    assert not pocl_binary_intact(binary[:100])


def test_cache_entry_with_an_empty_pocl_record_is_rebuilt_not_loaded(tmp_path):
    """Loading it would abort the process inside PoCL (seen in CI: MPI ranks
    sharing POCL_CACHE_DIR); it is rebuilt from source and overwritten."""
    from caffe_ocl.device import read_cache_entry, write_cache_entry
    first = _build_in_subprocess(tmp_path)
    bins = [tmp_path / f for f in os.listdir(tmp_path) if f.endswith(".bin")]
    if not read_cache_entry(str(bins[0])).startswith(b"poclbin"):
        pytest.skip("not a PoCL device")
    for f in bins:   # stored with a matching checksum: only PoCL's record check refuses it
        write_cache_entry(str(f), _empty_first_record(read_cache_entry(str(f))))
    again = _build_in_subprocess(tmp_path)
    assert again["built"] == first["built"] and again["cached"] == 0
    third = _build_in_subprocess(tmp_path)             # the rewritten entries load
    assert third["built"] == 0


def test_device_query_lists_and_marks_the_chosen_device(capsys):
    from caffe_ocl.commands import main
    assert main(["device_query"]) == 0
    out = capsys.readouterr().out
    assert "chosen:" in out and "compute units" in out and "OpenCL" in out


@pytest.mark.parametrize("args,msg", [
    (["time", "--model", "nowhere.prototxt"], "not found: nowhere.prototxt"),
    (["time", "--model", "{bad}"], ":1:"),
    (["tune", "--model", "nowhere.prototxt"], "not found: nowhere.prototxt"),
    (["tune", "--model", "{bad}", "--phase", "TEST"], ":1:"),
    (["classify", "--model", "{unknown}", "x.png"], "unknown layer type 'Convolutoin'"),
])
def test_command_errors_are_one_line_without_traceback(tmp_path, args, msg):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "x" layer { name: "a" type: "Input" top: "d" \n')
    unknown = tmp_path / "unknown.prototxt"
    unknown.write_text('layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 1 '
                       'dim: 3 dim: 8 dim: 8 } } }\n'
                       'layer { name: "c" type: "Convolutoin" bottom: "d" top: "c" }\n')
    args = [a.replace("{bad}", str(bad)).replace("{unknown}", str(unknown)) for a in args]
    (tmp_path / "x.png").write_bytes(b"")      # inputs are checked before the net is built
    env = child_env()
    out = subprocess.run([sys.executable, "-m", "caffe_ocl"] + args, capture_output=True,
                         text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert out.returncode == 1
    assert msg in out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, out.stderr


@pytest.mark.parametrize("environ,allowed,ncpu,want", [
    ({}, {0, 1}, 2, True),                                  # every CPU: pin
    ({}, {0, 1, 2, 3}, 4, True),
    ({}, {2, 3}, 4, False),                 # a cpuset without CPU 0: PoCL would pin outside it
    ({}, {0, 1}, 4, False),                 # fewer CPUs allowed than PoCL starts threads
    ({"POCL_AFFINITY": "0"}, {0, 1}, 2, False),             # the user's choice stands
    ({"POCL_AFFINITY": "1"}, {0, 1}, 2, False),             # (already set: nothing to do)
    ({"CAFFE_OCL_POCL_AFFINITY": "0"}, {0, 1}, 2, False),   # opted out
    ({}, {0}, 0, False),                                    # CPU count unknown
])
def test_pocl_affinity_only_where_every_pin_is_allowed(environ, allowed, ncpu, want):
    from caffe_ocl.device import pocl_affinity_default
    assert pocl_affinity_default(environ, allowed, ncpu) is want


def test_unoptimized_sources_build_their_own_programs(monkeypatch):
    """Device.unoptimized_sources (the tests' GPU kernels on CPU drivers):
    those files build with -cl-opt-disable into programs of their own cache
    key; the others keep the optimised ones."""
    from caffe_ocl.device import get_device
    dev = get_device()
    if not dev.is_cpu:
        # NVIDIA's compiler at -cl-opt-disable leaves the kernels' C99
        # ``inline`` helpers as unresolved externs (ptxas: "Unresolved
        # extern function '_gl_chunk'"); the facility is only ever set for
        # CPU drivers (test_conv_algorithms' fixture)
        pytest.skip("unoptimized_sources is a CPU-driver facility")
    optimised = dev.program("shape.cl")
    monkeypatch.setattr(dev, "unoptimized_sources", frozenset({"shape.cl"}))
    plain = dev.program("shape.cl")
    assert plain is not optimised
    assert ("shape.cl", (), ("-cl-opt-disable",)) in dev._programs
    monkeypatch.setattr(dev, "unoptimized_sources", frozenset())
    assert dev.program("shape.cl") is optimised


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _burst(progress, clock, seconds):
    """Compilations of ``seconds`` each, back to back."""
    for s in seconds:
        started = clock.t
        clock.t += s
        progress.compiled(started)


def test_build_progress_lines_after_a_second_then_periodically():
    from caffe_ocl.device import BuildProgress
    clock, out = _Clock(), []
    p = BuildProgress("Dev", "/c", "lines", announce_after=1.0, every=10.0, gap=5.0,
                      clock=clock, emit=out.append)
    _burst(p, clock, [0.3, 0.3])                # 0.6 s: a warm start says nothing
    assert out == []
    _burst(p, clock, [0.5])                     # 1.1 s into the burst
    assert len(out) == 1 and "Compiling OpenCL kernels for Dev (first run only" in out[0]
    assert "cached in /c" in out[0]
    clock2 = _Clock()
    pocl = BuildProgress("Dev", "/c", "lines", clock=clock2, emit=out.append,
                         where="cached by PoCL in /k")
    _burst(pocl, clock2, [1.5])
    assert out.pop().endswith("(first run only; the binaries are cached by PoCL in /k)")
    _burst(p, clock, [2.0] * 4)                 # 9.1 s: no line yet
    assert len(out) == 1
    _burst(p, clock, [2.5])                     # 11.6 s: one periodic line
    assert out[1] == "... compiled 8 kernel programs in 12 s"
    clock.t += 60                               # a later burst starts over
    _burst(p, clock, [0.2])
    assert len(out) == 2 and p.count == 1


def test_build_progress_bar_and_off(monkeypatch):
    from caffe_ocl import device as D
    clock, out = _Clock(), []
    off = D.BuildProgress("Dev", "", "off", clock=clock, emit=out.append)
    _burst(off, clock, [5.0, 5.0])
    assert out == []
    bars = []

    class FakeBar:
        def __init__(self, **kw):
            self.n, self.closed = kw["initial"], False
            bars.append(self)

        def update(self, k):
            self.n += k

        def close(self):
            self.closed = True
    monkeypatch.setattr(D, "_tqdm", lambda: FakeBar)
    bar = D.BuildProgress("Dev", "", "bar", clock=clock, emit=out.append)
    _burst(bar, clock, [0.6, 0.6, 0.6])
    assert "not cached: CAFFE_OCL_CACHE is empty" in out[0]
    assert len(bars) == 1 and bars[0].n == 3     # counts the programs before the line too
    bar.step_aside()                            # a log line: the bar is cleared
    assert bars[0].closed and bar.bar is None
    _burst(bar, clock, [0.6])
    assert len(bars) == 2 and bars[1].n == 4 and len(out) == 1


def test_progress_mode(monkeypatch):
    from caffe_ocl import device as D

    class Tty:
        def isatty(self):
            return True
    monkeypatch.setattr(D, "_tqdm", lambda: object)
    assert D.progress_mode("auto", Tty()) == "bar"
    assert D.progress_mode("auto", open(os.devnull, "w")) == "lines"
    monkeypatch.setattr(D, "_tqdm", lambda: None)
    assert D.progress_mode("auto", Tty()) == "lines"
    assert D.progress_mode("bar", Tty()) == "lines"       # no tqdm: plain lines
    assert D.progress_mode("off", Tty()) == "off"


def test_launch_builds_its_program_at_its_first_run():
    """A launch set up but never run compiles nothing (a folded convolution's
    own launches); run() builds, binds the arguments given then, and the
    ones changed by set_arg before it."""
    import numpy as np
    import pyopencl as cl
    from caffe_ocl.device import get_device
    dev = get_device()
    defines = {"MACRO_OF_THIS_TEST": 7}              # a program of its own
    buf = dev.alloc(4 * 8)
    builds = len(dev.build_log)
    launch = dev.launch("pointwise.cl", "fill", (8,), None, [8, 1.5, buf, 0], defines)
    assert launch.kernel is None and len(dev.build_log) == builds
    launch.set_arg(1, 2.5)
    launch.run(dev.queue)
    assert len(dev.build_log) == builds + 1 and launch.kernel is not None
    assert dev.build_log[-1][:2] == ("pointwise.cl", "-DMACRO_OF_THIS_TEST=7")
    out = np.empty(8, np.float32)
    cl.enqueue_copy(dev.queue, out, buf)
    assert (out == 2.5).all()
    launch.set_arg(1, -1.0)                          # bound: set on the kernel
    launch.run(dev.queue)
    cl.enqueue_copy(dev.queue, out, buf)
    assert (out == -1.0).all()
    again = dev.launch("pointwise.cl", "fill", (8,), None, [8, 0.0, buf, 0], defines)
    assert again.kernel is not None                  # built already: bound at once
    with pytest.raises(DeviceError, match="no signature"):
        dev.launch("pointwise.cl", "no_such_kernel", (8,), None, [], defines)
