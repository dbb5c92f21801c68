"""Training-iteration time of LeNet (batch 64) and CIFAR-10 quick (batch 100)
in caffe_ocl against PyTorch running the same nets, batch and SGD settings
on the same machine in the same run. Prints a Markdown table with ratios
(PyTorch time / caffe_ocl time: above 1 means caffe_ocl is faster).

    python benchmarks/bench_train_small.py [--iters 20] [--threads N]

PyTorch is optional; without it only caffe_ocl's times are printed.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import caffe_ocl  # noqa: E402
from caffe_ocl.solvers import SGDSolver  # noqa: E402
from common import fill_inputs, solver_for, timed, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NETS = {
    "lenet": dict(proto="models/lenet/lenet_train_test.prototxt", batch=64, shape=(1, 28, 28)),
    "cifar10_quick": dict(proto="models/cifar10_quick/cifar10_quick_train_test.prototxt",
                          batch=100, shape=(3, 32, 32)),
}


def torch_net(name):
    import torch.nn as nn
    if name == "lenet":
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                             nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                             nn.Linear(500, 10))
    return nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True),
                         nn.ReLU(), nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(),
                         nn.AvgPool2d(3, 2, ceil_mode=True), nn.Conv2d(32, 64, 5, padding=2),
                         nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True), nn.Flatten(),
                         nn.Linear(64 * 4 * 4, 64), nn.Linear(64, 10))


def time_torch(name, cfg, iters):
    import torch
    m = torch_net(name)
    x = torch.randn(cfg["batch"], *cfg["shape"])
    y = torch.randint(0, 10, (cfg["batch"],))
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return timed(step, lambda: None, runs=iters)


def time_caffe_ocl(cfg, iters):
    net_param = with_inputs(os.path.join(ROOT, cfg["proto"]), cfg["batch"], cfg["shape"])
    solver = SGDSolver(solver_for(net_param))
    fill_inputs(solver.net, 10)
    dev = solver.net.device
    return timed(lambda: solver.step(1), dev.finish, runs=iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="PyTorch threads (0: its default)")
    a = ap.parse_args()
    dev = caffe_ocl.get_device()
    try:
        import torch
        if a.threads:
            torch.set_num_threads(a.threads)
        tver = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        torch, tver = None, "PyTorch not installed"
    print(f"device: {dev.name} ({dev.info['platform_name']}); reference: {tver}\n")
    print("| net | batch | caffe_ocl ms/iter | PyTorch ms/iter | ratio (PyTorch/caffe_ocl) |")
    print("|---|---|---|---|---|")
    for name, cfg in NETS.items():
        ours = time_caffe_ocl(cfg, a.iters)
        ref = time_torch(name, cfg, a.iters) if torch else float("nan")
        print(f"| {name} | {cfg['batch']} | {ours:.1f} | {ref:.1f} | {ref / ours:.2f} |")


if __name__ == "__main__":
    main()
