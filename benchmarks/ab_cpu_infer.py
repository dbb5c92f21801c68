"""Interleaved A/B of CPU inference: net A is built with some kernel files
taken from a git revision (--old, --rev) and/or some caffe_ocl settings
(--config-a NAME=value, caffe_ocl/config.py) or module constants (--set-a)
changed, net B from the working tree; both live in one process and their
forward passes alternate, so machine load (+-30% on shared 2-core VMs) hits
both alike. Prints each side's median pass and the ratio A/B (above 1: B
is faster).

    python3 benchmarks/ab_cpu_infer.py --net mobilenet_v2 --old depthwise.cl
    python3 benchmarks/ab_cpu_infer.py --net resnet50 \\
        --set-a caffe_ocl.ops.gemm:CPU_BM_MAX=96
    python3 benchmarks/ab_cpu_infer.py --net resnet50 --config-a SKIP_UNREAD_MASK=0
"""
import argparse
import ast
import importlib
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import caffe_ocl  # noqa: E402
from caffe_ocl import config  # noqa: E402
from caffe_ocl import device as device_mod  # noqa: E402
from bench_cpu_infer import NETS, deploy_net  # noqa: E402
from common import interleaved  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def old_sources(dev, files, rev):
    """Register each kernel file as of ``rev`` under the name "<rev>:<file>"
    in the device's source table; returns {file: that name}."""
    names = {}
    for f in files:
        src = subprocess.check_output(["git", "-C", ROOT, "show",
                                       f"{rev}:caffe_ocl/kernels/{f}"], text=True)
        names[f] = f"{rev}:{f}"
        dev._sources[names[f]] = (src, device_mod.kernel_arg_dtypes(src))
    return names


def parse_sets(specs):
    """[(module, attr, value)] from "module:ATTR=literal" strings."""
    out = []
    for s in specs:
        mod, rest = s.split(":", 1)
        attr, val = rest.split("=", 1)
        out.append((importlib.import_module(mod), attr, ast.literal_eval(val)))
    return out


def parse_configs(specs):
    """{setting: raw value} from "NAME=value" strings (config.override parses)."""
    return dict(s.split("=", 1) for s in specs)


def build(cfg, renames, sets, configs=None):
    """A TEST net of ``cfg`` whose launches of renamed kernel files go to
    the registered old sources, built with ``sets`` applied and under the
    settings ``configs`` (both restored after)."""
    orig_launch = device_mod.Device.launch
    saved = [(m, a, getattr(m, a)) for m, a, _ in sets]

    def launch(dev, filename, *args, **kw):
        return orig_launch(dev, renames.get(filename, filename), *args, **kw)
    device_mod.Device.launch = launch
    for m, a, v in sets:
        setattr(m, a, v)
    try:
        with config.override(**(configs or {})):
            net = deploy_net(cfg["proto"], cfg["batch"], cfg["shape"])
            net.forward_from_to(0, len(net.layers) - 1)
            net.device.finish()
    finally:
        device_mod.Device.launch = orig_launch
        for m, a, v in saved:
            setattr(m, a, v)
    return net


def pass_ms(net, iters):
    last = len(net.layers) - 1
    t0 = time.perf_counter()
    for _ in range(iters):
        net.forward_from_to(0, last)
    net.device.finish()
    return (time.perf_counter() - t0) / iters * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="mobilenet_v2", choices=sorted(NETS))
    ap.add_argument("--old", default="", help="kernel files (comma-separated) for A")
    ap.add_argument("--rev", default="HEAD", help="git revision of --old")
    ap.add_argument("--set-a", action="append", default=[],
                    help="module:ATTR=literal applied while building A")
    ap.add_argument("--config-a", action="append", default=[],
                    help="NAME=value: a caffe_ocl setting while building A")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2, help="passes per timing")
    a = ap.parse_args()
    dev = caffe_ocl.get_device()
    files = [f for f in a.old.split(",") if f]
    cfg = NETS[a.net]
    nets = {"A": build(cfg, old_sources(dev, files, a.rev), parse_sets(a.set_a),
                      parse_configs(a.config_a)),
            "B": build(cfg, {}, [])}
    med = interleaved({k: (lambda n=n: pass_ms(n, a.iters)) for k, n in nets.items()},
                      a.rounds)
    print(f"{a.net}: A/B {med['A'] / med['B']:.2f}x")


if __name__ == "__main__":
    main()
