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


FULL_SRC = """
#include "act.h"
__kernel void exps(__global const float* x, __global float* e1, __global float* e16) {
    const int i = get_global_id(0);
    for (int j = 0; j < 16; ++j) e1[16 * i + j] = EXP_FULL(x[16 * i + j]);
    vstore16(EXP_FULL(vload16(i, x)), i, e16);
}
"""


def test_exp_full_over_the_whole_float_range(d):
    """act.h's EXP_FULL (the Exp, ELU, sigmoid, swish and BNLL ops of
    unary_op.h): within 1 ulp of float64's exp wherever the result is a
    normal float, denormal results within one denormal step, overflow to
    inf past 88.72, 0 far below, NaN kept, and the same at 1 and 16 lanes."""
    dev = d.dev
    cpu = [CPU_MACRO] if dev.is_cpu else []
    prog = cl.Program(dev.context, FULL_SRC).build(options=["-I", KERNEL_DIR] + cpu)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, -87.33, -103.2, -200.0]
    x = np.concatenate([specials, np.linspace(-110, 95, 400006)]).astype(np.float32)
    x = x[:x.size // 16 * 16]
    mf = cl.mem_flags
    xb = cl.Buffer(dev.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    outs = [cl.Buffer(dev.context, mf.WRITE_ONLY, x.nbytes) for _ in range(2)]
    prog.exps(dev.queue, (x.size // 16,), None, xb, *outs)
    e1, e16 = np.empty_like(x), np.empty_like(x)
    cl.enqueue_copy(dev.queue, e1, outs[0])
    cl.enqueue_copy(dev.queue, e16, outs[1])
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
    ref32 = ref.astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    for got in (e1, e16):
        normal = np.isfinite(ref32) & (ref32 >= tiny)
        ulp = np.abs(got[normal].astype(np.float64) - ref[normal]) / np.spacing(ref32[normal])
        assert ulp.max() <= (1.0 if dev.is_cpu else 4.0)
        small = ref < tiny
        assert np.abs(got[small] - ref[small]).max() <= 2 * np.spacing(np.float32(0))
        assert np.isinf(got[np.isinf(ref32) & ~np.isnan(x)]).all()
        assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0
        assert got[9] == 0.0        # exp(-200)
