"""caffe_ocl against PyTorch on the big nets: inference (forward) and a
training step (forward, backward, SGD update), batch 16 and 64, 224x224,
random weights and data, on the chosen device, mean of --runs timed runs
after warm-up, device-synchronised. If PyTorch (+ torchvision) is
importable, the same architecture and batch are timed with PyTorch on the
matching device in the same run and the ratio printed (PyTorch time /
caffe_ocl time: >= 1.0 means caffe_ocl is at least as fast). Also the peak
device memory of each (caffe_ocl's buffer pool, for the Solver's net with its
diff memory plan, see caffe_ocl/memory_plan.py; torch.cuda.max_memory_allocated).

    python benchmarks/bench_nets.py [--nets alexnet,resnet18,...] [--batches 16,64]
        [--runs 10] [--tf32] [--no-train] [--tune] [--torch-device cuda|cpu]

AlexNet: the shipped model is BVLC AlexNet (96-256-384-384-256 channels,
two-group conv2/4/5, LRN after conv1 and conv2, Caffe's ceil-mode pooling);
torchvision's ``alexnet`` is a different net (64-192-384-256-256, no groups,
no LRN). The reference is therefore BVLC AlexNet written in PyTorch
(``bvlc_alexnet`` below, nn.LocalResponseNorm for LRN); ``--torch-alexnet
torchvision`` times torchvision's variant instead.

Output: a Markdown table to paste into BENCHMARKS.md.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import caffe_ocl  # noqa: E402
from caffe_ocl import config  # noqa: E402
from common import fill_inputs, fresh_pool, solver_for, timed, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_NAMES = {"alexnet": "alexnet", "resnet18": "resnet18", "resnet50": "resnet50",
               "vgg16": "vgg16", "mobilenet_v2": "mobilenet_v2", "googlenet": "googlenet",
               "squeezenet1_1": "squeezenet1_1"}


def _infer_net(name, batch):
    net = caffe_ocl.Net(os.path.join(ROOT, "models", name, "deploy.prototxt"), caffe_ocl.TEST)
    inp = net.inputs[0]
    shape = net.blobs[inp].shape
    net.blobs[inp].reshape(batch, *shape[1:])
    net.reshape()
    net.blobs[inp].data[...] = np.random.default_rng(0).standard_normal(
        net.blobs[inp].shape).astype(np.float32)
    return net


def caffe_ocl_infer(name, batch, runs):
    net = _infer_net(name, batch)
    dev = net.device
    ms = timed(lambda: net.forward_from_to(0, len(net.layers) - 1), dev.finish, runs=runs)
    return ms


def _solver(name, batch):
    shape = (3, 224, 224)
    param = with_inputs(os.path.join(ROOT, "models", name, "train.prototxt"), batch, shape)
    solver = caffe_ocl.solvers.SGDSolver(solver_for(param))
    fill_inputs(solver.net, 1000)
    return solver


def caffe_ocl_train(name, batch, runs):
    solver = _solver(name, batch)
    dev = solver.net.device
    return timed(lambda: solver.step(1), dev.finish, runs=runs)


def tune(name, batch, train):
    """`caffe_ocl tune` on the nets timed here (their convolutions' choices
    stored for this device; the nets built afterwards use them)."""
    from caffe_ocl import tuning
    tuning.tune_net(_infer_net(name, batch), out=lambda s: print("  tune:", s, file=sys.stderr))
    if train:
        tuning.tune_net(_solver(name, batch).net,
                        out=lambda s: print("  tune:", s, file=sys.stderr))
    fresh_pool(caffe_ocl.get_device())


def bvlc_alexnet():
    """models/alexnet in PyTorch: same layers, shapes, groups, LRN and pooling."""
    from torch import nn

    def lrn():
        return nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)

    def pool():
        return nn.MaxPool2d(3, 2, ceil_mode=True)     # Caffe rounds pooled sizes up
    return nn.Sequential(
        nn.Conv2d(3, 96, 11, 4), nn.ReLU(True), lrn(), pool(),
        nn.Conv2d(96, 256, 5, padding=2, groups=2), nn.ReLU(True), lrn(), pool(),
        nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(True),
        nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(True),
        nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(True), pool(),
        nn.Flatten(), nn.Linear(9216, 4096), nn.ReLU(True), nn.Dropout(0.5),
        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(4096, 1000))


TORCH_ALEXNET = "bvlc"


def torch_times(name, batch, runs, device, tf32, train):
    import torch
    import torchvision
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if name == "alexnet" and TORCH_ALEXNET == "bvlc":
        m = bvlc_alexnet().to(device)
    else:
        m = getattr(torchvision.models, TORCH_NAMES[name])(
            **({"aux_logits": False, "init_weights": True} if name == "googlenet"
               else {})).to(device)
    x = torch.rand(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    m.eval()
    with torch.no_grad():
        infer = timed(lambda: m(x), sync, runs=runs)
    step_ms = mem = float("nan")
    if train:
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        step_ms = timed(step, sync, runs=runs)
        if device == "cuda":
            mem = torch.cuda.max_memory_allocated() / 2 ** 20

    return infer, step_ms, mem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="alexnet,resnet18,resnet50,vgg16,mobilenet_v2")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--tune", action="store_true",
                    help="first run `caffe_ocl tune` on each net and batch (stored per "
                         "device), then time ours with the stored choices and, in the "
                         "'rules' columns, without them (CAFFE_OCL_TUNED=0)")
    ap.add_argument("--torch-device", default=None)
    ap.add_argument("--torch-alexnet", choices=("bvlc", "torchvision"), default="bvlc",
                    help="the PyTorch AlexNet: the shipped BVLC architecture (default) or "
                         "torchvision's different variant")
    a = ap.parse_args()
    global TORCH_ALEXNET
    TORCH_ALEXNET = a.torch_alexnet
    dev = caffe_ocl.get_device()
    caffe_ocl.set_allow_tf32(a.tf32)     # ours too (NVIDIA tensor cores)
    tdev = a.torch_device or ("cuda" if dev.is_gpu else "cpu")
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    print(f"caffe_ocl device: {dev.name} ({dev.info['platform_name']}, {dev.info['driver']}); "
          f"PyTorch: {'on ' + tdev if have_torch else 'not installed'}; TF32: {a.tf32}; "
          f"{time.strftime('%Y-%m-%d')}; PyTorch AlexNet: {a.torch_alexnet}\n")
    rules = " infer ms (rules) | train ms (rules) |" if a.tune else ""
    print("| net | batch | infer ms (ours) | infer ms (torch) | ratio | train ms (ours) "
          "| train ms (torch) | ratio | peak MiB (ours) | peak MiB (torch) |" + rules)
    print("|---" * (12 if a.tune else 10) + "|")
    for name in a.nets.split(","):
        for batch in (int(b) for b in a.batches.split(",")):
            import gc
            if a.tune:
                tune(name, batch, not a.no_train)
            ours_i = caffe_ocl_infer(name, batch, a.runs)
            ours_t = peak = float("nan")
            if not a.no_train:
                fresh_pool(dev)
                ours_t = caffe_ocl_train(name, batch, a.runs)
                peak = dev.peak_bytes / 2 ** 20       # peak of the training step
            gc.collect()
            dev.allocator.free_held()
            extra = ""
            if a.tune:                              # the same without the stored choices
                with config.override(TUNED=False):
                    rules_i = caffe_ocl_infer(name, batch, a.runs)
                    rules_t = (float("nan") if a.no_train
                               else caffe_ocl_train(name, batch, a.runs))
                gc.collect()
                dev.allocator.free_held()
                extra = f" {rules_i:.1f} | {rules_t:.1f} |"
            ti = tt = tm = float("nan")
            if have_torch:
                ti, tt, tm = torch_times(name, batch, a.runs, tdev, a.tf32, not a.no_train)
            print(f"| {name} | {batch} | {ours_i:.1f} | {ti:.1f} | {ti / ours_i:.2f} | "
                  f"{ours_t:.1f} | {tt:.1f} | {tt / ours_t:.2f} | {peak:.0f} | {tm:.0f} |"
                  + extra, flush=True)


if __name__ == "__main__":
    main()
