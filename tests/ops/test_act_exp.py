"""kernels/act.h's exp for swish and sigmoid on CPU drivers (act_exp,
built where device.py defines CAFFE_OCL_CPU): against float64 over the
whole float range it is used on, past its clamps, at every vector width
that the kernels use; and the swish / sigmoid epilogues made of it."""
import numpy as np
import pyopencl as cl
import pytest

from caffe_ocl.device import CPU_MACRO, KERNEL_DIR

SRC = """
#include "act.h"
__kernel void exps(__global const float* x, __global float* e1, __global float* e4,
                   __global float* e8, __global float* e16, __global float* act,
                   float act_a, float act_b) {
    const int i = get_global_id(0);
    for (int j = 0; j < 16; ++j) e1[16 * i + j] = act_exp(x[16 * i + j]);
    for (int j = 0; j < 4; ++j) vstore4(act_exp(vload4(4 * i + j, x)), 4 * i + j, e4);
    vstore8(act_exp(vload8(2 * i, x)), 2 * i, e8);
    vstore8(act_exp(vload8(2 * i + 1, x)), 2 * i + 1, e8);
    vstore16(act_exp(vload16(i, x)), i, e16);
    vstore16(APPLY_ACT_VEC(vload16(i, x), float16), i, act);
}
"""


def _run(d, x, act):
    """act_exp at 1, 4, 8 and 16 lanes, and the ``act`` epilogue, as the
    device's programs are built (the CPU's exp on CPU drivers only)."""
    dev = d.dev
    cpu = [CPU_MACRO] if dev.is_cpu else ["-Dact_exp=exp"]
    prog = cl.Program(dev.context, SRC).build(
        options=["-I", KERNEL_DIR, f"-DACT={act}"] + cpu)
    mf = cl.mem_flags
    xb = cl.Buffer(dev.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    outs = [cl.Buffer(dev.context, mf.WRITE_ONLY, x.nbytes) for _ in range(5)]
    prog.exps(dev.queue, (x.size // 16,), None, xb, *outs, np.float32(1.0), np.float32(0.0))
    res = [np.empty_like(x) for _ in outs]
    for r, b in zip(res, outs):
        cl.enqueue_copy(dev.queue, r, b)
    dev.queue.finish()
    return res


@pytest.fixture
def x(rng):
    # the whole range the clamps keep, past them, and where swish lives
    return np.concatenate([np.linspace(-120.0, 120.0, 4096), rng.standard_normal(4096) * 6,
                           [0.0, -0.0, 1e-30, -1e-30, 88.0, -87.3] * 16]).astype(np.float32)


def test_act_exp_within_two_ulp(d, x):
    if not d.dev.is_cpu:
        pytest.skip("CPU drivers' exp (GPUs keep the driver's)")
    x64 = x.astype(np.float64)
    # the clamps (float32 constants): normal floats only
    ref = np.exp(np.clip(x64, float(np.float32(-87.3)), 88.0))
    for got in _run(d, x, 3)[:4]:               # float, float4, float8, float16
        assert np.all(np.isfinite(got))
        assert np.max(np.abs(got - ref) / ref) < 2 * 2.0 ** -23


@pytest.mark.parametrize("act", [3, 4], ids=["swish", "sigmoid"])
def test_swish_and_sigmoid_epilogues(d, x, act):
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + np.exp(-x64))
    ref = x64 * sig if act == 3 else sig
    got = _run(d, x, act)[4]
    assert np.all(np.isfinite(got))
    big = np.abs(ref) > 1e-30
    assert np.max(np.abs(got[big] - ref[big]) / np.abs(ref[big])) < 4 * 2.0 ** -23
    assert np.max(np.abs(got[~big])) < 1e-30
