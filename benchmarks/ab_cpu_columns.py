"""Interleaved A/B of a CPU training step: convolution columns packed by
the GEMM from the images (setting CPU_PACKED_COLUMNS, B) against im2col
into a workspace (A). Both solvers live in one process and their steps
alternate, so machine load (+-30% on shared 2-core VMs) hits both alike;
prints the median step of each and their ratio.

    python3 benchmarks/ab_cpu_columns.py [--net cifar10_quick] [--rounds 7]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.solvers import SGDSolver  # noqa: E402
from bench_train_small import NETS  # noqa: E402
from common import fill_inputs, interleaved, solver_for, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_solver(cfg, packed):
    with config.override(CPU_PACKED_COLUMNS=packed):   # read when the launches are built
        param = with_inputs(os.path.join(ROOT, cfg["proto"]), cfg["batch"], cfg["shape"])
        solver = SGDSolver(solver_for(param))
        fill_inputs(solver.net, 10)
        solver.step(2)                               # build, compile, warm up
        solver.net.device.finish()
    return solver


def step_ms(solver, iters):
    dev = solver.net.device
    t0 = time.perf_counter()
    solver.step(iters)
    dev.finish()
    return (time.perf_counter() - t0) / iters * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="cifar10_quick", choices=sorted(NETS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3, help="steps per timing")
    a = ap.parse_args()
    cfg = NETS[a.net]
    solvers = {"im2col (A)": make_solver(cfg, False), "packed (B)": make_solver(cfg, True)}
    med = interleaved({k: (lambda s=s: step_ms(s, a.iters)) for k, s in solvers.items()},
                      a.rounds)
    print(f"A/B: {med['im2col (A)'] / med['packed (B)']:.2f}x (ms per step)")


if __name__ == "__main__":
    main()
