"""CPU inference time of caffe_ocl against PyTorch CPU and ONNX Runtime on
the same machine in the same run: LeNet (batch 64), CaffeNet (batch 16,
227x227), ResNet-18 / ResNet-50 / MobileNetV2 (batch 16, 224x224), random
weights and data. caffe_ocl runs the shipped deploy prototxts
(models/*/deploy.prototxt, models/lenet/lenet.prototxt); PyTorch runs compact
definitions of the same architectures written below (torchvision is not
needed); ONNX Runtime runs those PyTorch models exported to ONNX.

    python benchmarks/bench_cpu_infer.py [--nets lenet,caffenet,...] [--runs 3]
        [--warmup 1] [--rounds 1] [--threads N] [--no-ort] [--pipelined]

Prints a Markdown table; ratio = other time / caffe_ocl time (above 1 means
caffe_ocl is faster). Times are the mean of --runs timed forward passes
after --warmup untimed ones; with --rounds R > 1 the three frameworks are
timed in turn R times (each round: every framework's mean of --runs) and
the table gives each one's median round, so a slow spell of this shared
machine falls on all of them alike instead of on whichever ran during it
(the rounds' spread is printed below the table). Each caffe_ocl pass ends
with the device synchronised, as a pycaffe ``forward()`` returning its
outputs and as the PyTorch and ONNX Runtime calls, which return when done.
``--pipelined`` synchronises only after the last pass instead: on PoCL
that is slower (the host enqueuing the next pass competes with the
kernels for the 2 cores; LeNet 4.2-5.0 ms per pass against 3.4
synchronised).
"""
import argparse
import warnings
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import caffe_ocl  # noqa: E402
from common import timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NETS = {
    "lenet": dict(proto="models/lenet/lenet.prototxt", batch=64, shape=(1, 28, 28)),
    "caffenet": dict(proto="models/caffenet/deploy.prototxt", batch=16, shape=(3, 227, 227)),
    "resnet18": dict(proto="models/resnet18/deploy.prototxt", batch=16, shape=(3, 224, 224)),
    "resnet50": dict(proto="models/resnet50/deploy.prototxt", batch=16, shape=(3, 224, 224)),
    "mobilenet_v2": dict(proto="models/mobilenet_v2/deploy.prototxt", batch=16,
                         shape=(3, 224, 224)),
}


# --------------------------------------------------------------------------
# PyTorch definitions matching the deploy prototxts
# --------------------------------------------------------------------------

def torch_model(name):
    import torch.nn as nn

    if name == "lenet":
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                             nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500),
                             nn.ReLU(inplace=True), nn.Linear(500, 10), nn.Softmax(dim=1))
    if name == "caffenet":
        lrn = lambda: nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)  # noqa: E731
        return nn.Sequential(
            nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True), lrn(),
            nn.Conv2d(96, 256, 5, padding=2, groups=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True), lrn(),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True), nn.Flatten(),
            nn.Linear(9216, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 1000), nn.Softmax(dim=1))
    if name in ("resnet18", "resnet50"):
        return _resnet(name)
    if name == "mobilenet_v2":
        return _mobilenet_v2()
    raise KeyError(name)


def _resnet(name):
    import torch.nn as nn

    def cbn(cin, cout, k, s=1, p=0):
        return [nn.Conv2d(cin, cout, k, s, p, bias=False), nn.BatchNorm2d(cout)]

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, c, s):
            super().__init__()
            self.body = nn.Sequential(*cbn(cin, c, 3, s, 1), nn.ReLU(inplace=True),
                                      *cbn(c, c, 3, 1, 1))
            self.short = (nn.Sequential(*cbn(cin, c, 1, s)) if s != 1 or cin != c
                          else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.short(x))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, c, s):
            super().__init__()
            self.body = nn.Sequential(*cbn(cin, c, 1, s), nn.ReLU(inplace=True),
                                      *cbn(c, c, 3, 1, 1), nn.ReLU(inplace=True),
                                      *cbn(c, 4 * c, 1))
            self.short = (nn.Sequential(*cbn(cin, 4 * c, 1, s)) if s != 1 or cin != 4 * c
                          else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.short(x))

    block, depths = (Basic, (2, 2, 2, 2)) if name == "resnet18" else (Bottleneck, (3, 4, 6, 3))
    layers = [*cbn(3, 64, 7, 2, 3), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True)]
    cin = 64
    for i, (c, n) in enumerate(zip((64, 128, 256, 512), depths)):
        for j in range(n):
            layers.append(block(cin, c, 2 if (j == 0 and i > 0) else 1))
            cin = c * block.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000), nn.Softmax(dim=1)]
    return nn.Sequential(*layers)


def _mobilenet_v2():
    import torch.nn as nn

    def cbr(cin, cout, k, s=1, g=1, relu=True):
        m = [nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=False), nn.BatchNorm2d(cout)]
        return m + [nn.ReLU6(inplace=True)] if relu else m

    class Inverted(nn.Module):
        def __init__(self, cin, cout, s, t):
            super().__init__()
            hid = cin * t
            body = (cbr(cin, hid, 1) if t != 1 else []) + cbr(hid, hid, 3, s, hid) \
                + cbr(hid, cout, 1, relu=False)
            self.body = nn.Sequential(*body)
            self.res = s == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.res else self.body(x)

    layers = cbr(3, 32, 3, 2)
    cin = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            layers.append(Inverted(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += cbr(cin, 1280, 1) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                   nn.Linear(1280, 1000), nn.Softmax(dim=1)]
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------
# Runners
# --------------------------------------------------------------------------

def deploy_net(proto, batch, shape=None):
    """A TEST net of ``proto`` (relative to the project) at ``batch`` (input
    ``shape`` per image, or the prototxt's), fed standard-normal data."""
    net = caffe_ocl.Net(os.path.join(ROOT, proto), caffe_ocl.TEST)
    inp = net.blobs[net.inputs[0]]
    inp.reshape(batch, *(shape or inp.shape[1:]))
    net.reshape()
    inp.data[...] = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
    return net


def caffe_ocl_timer(cfg, pipelined=False):
    """timer(warmup, runs) -> mean ms of a caffe_ocl forward pass."""
    net = deploy_net(cfg["proto"], cfg["batch"], cfg["shape"])
    dev = net.device
    last = len(net.layers) - 1
    if pipelined:
        return lambda warmup, runs: timed(lambda: net.forward_from_to(0, last), dev.finish,
                                          warmup, runs)

    def one_pass():
        net.forward_from_to(0, last)
        dev.finish()
    return lambda warmup, runs: timed(one_pass, dev.finish, warmup, runs)


def torch_timer(model, x):
    import torch

    def timer(warmup, runs):
        with torch.inference_mode():
            return timed(lambda: model(x), lambda: None, warmup, runs)
    return timer


def export_onnx(model, x, path):
    """The PyTorch reference model as ONNX (input "data", output "prob"),
    by the TorchScript exporter where this PyTorch has both."""
    import torch
    kw = {}
    try:
        import inspect
        if "dynamo" in inspect.signature(torch.onnx.export).parameters:
            kw["dynamo"] = False
    except (TypeError, ValueError):
        pass
    torch.onnx.export(model, (x,), path, input_names=["data"], output_names=["prob"],
                      opset_version=17, **kw)


def ort_timer(model, x, threads):
    import onnxruntime as ort
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        export_onnx(model, x, path)
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {"data": x.numpy()}
    return lambda warmup, runs: timed(lambda: sess.run(None, feed), lambda: None, warmup, runs)


def settle(seconds=1.0):
    """Pause before timing a framework: the thread pools of the one timed
    before (OpenMP's, ONNX Runtime's) spin-wait for a while after their last
    call and took cores from the next one (LeNet on PoCL: a median of 4.9 ms
    per pass alone, 6.6 ms right after a PyTorch op)."""
    time.sleep(seconds)


def main():
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the frameworks in turn this many times; report medians")
    ap.add_argument("--threads", type=int, default=0,
                    help="PyTorch / ONNX Runtime threads (0: their default)")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--pipelined", action="store_true",
                    help="caffe_ocl passes back to back, synchronised after the last only")
    a = ap.parse_args()
    dev = caffe_ocl.get_device()
    try:
        import torch
        if a.threads:
            torch.set_num_threads(a.threads)
        tver = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        torch, tver = None, "PyTorch not installed"
    ort_ok = False
    if torch is not None and not a.no_ort:
        try:
            import onnxruntime
            ort_ok = True
            tver += f", ONNX Runtime {onnxruntime.__version__}"
        except ImportError:
            tver += ", ONNX Runtime not installed"
    print(f"device: {dev.name} ({dev.info['platform_name']} "
          f"{dev.info['platform_version']}); reference: {tver}\n")
    print("| net | batch | caffe_ocl ms | PyTorch ms | ONNX Runtime ms | "
          "PyTorch/caffe_ocl | ORT/caffe_ocl |")
    print("|---|---|---|---|---|---|---|")
    spreads = []
    for name in a.nets.split(","):
        cfg = NETS[name]
        timers = {"caffe_ocl": caffe_ocl_timer(cfg, a.pipelined)}
        if torch is not None:
            torch.manual_seed(0)
            model = torch_model(name).eval()
            x = torch.randn(cfg["batch"], *cfg["shape"])
            timers["PyTorch"] = torch_timer(model, x)
            if ort_ok:
                try:
                    timers["ORT"] = ort_timer(model, x, a.threads)
                except Exception as e:  # noqa: BLE001 - report and carry on
                    print(f"<!-- ONNX Runtime failed on {name}: {e} -->")
        samples = {k: [] for k in timers}
        for r in range(max(a.rounds, 1)):
            for k, timer in timers.items():
                settle()        # after the previous framework's thread pool
                samples[k].append(timer(a.warmup, a.runs))
        ms = {k: statistics.median(v) for k, v in samples.items()}
        ours = ms["caffe_ocl"]
        ref, ortms = ms.get("PyTorch", float("nan")), ms.get("ORT", float("nan"))
        print(f"| {name} | {cfg['batch']} | {ours:.1f} | {ref:.1f} | {ortms:.1f} | "
              f"{ref / ours:.2f} | {ortms / ours:.2f} |", flush=True)
        if a.rounds > 1:
            spreads.append(f"{name}: " + "; ".join(
                f"{k} {' '.join(f'{v:.1f}' for v in vs)}" for k, vs in samples.items()))
    if spreads:
        print(f"\nms per round ({a.rounds} rounds, the table: medians):")
        for line in spreads:
            print(f"- {line}")


if __name__ == "__main__":
    main()
