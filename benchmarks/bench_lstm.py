"""caffe_ocl's LSTM layer against PyTorch's nn.LSTM (one layer, same sizes)
on the chosen device, same run: forward, and forward + backward (gradient
of the sum of the outputs), mean ms of --runs after warm-up,
device-synchronised. Ratio = PyTorch time / caffe_ocl time.

    python benchmarks/bench_lstm.py [--T 20] [--N 32] [--I 256] [--H 512] [--runs 20]

The two differ in gate order and bias layout only (Caffe: one bias, gates
i, f, o, g; PyTorch: two biases, i, f, g, o): the same multiply-adds.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import caffe_ocl  # noqa: E402
from caffe_ocl.testing import make_layer  # noqa: E402
from common import timed  # noqa: E402


def ours(T, N, I, H, runs):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (T, N, I))
    cont = np.ones((T, N))
    cont[0] = 0
    layer, bl, tops = make_layer(
        f'type: "LSTM" recurrent_param {{ num_output: {H} '
        'weight_filler { type: "uniform" min: -0.05 max: 0.05 } }', [x, cont])
    dev = layer.device
    tops[0].diff[...] = 1.0

    def fwd():
        layer.forward(bl, tops)

    def step():
        layer.forward(bl, tops)
        layer.backward(tops, [True, False], bl)
    return timed(fwd, dev.finish, runs=runs), timed(step, dev.finish, runs=runs)


def torch_times(T, N, I, H, runs, device):
    import torch
    m = torch.nn.LSTM(I, H).to(device)
    x = torch.rand(T, N, I, device=device, requires_grad=True)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def fwd():
        with torch.no_grad():
            m(x)

    def step():
        m.zero_grad(set_to_none=True)
        m(x)[0].sum().backward()
    return timed(fwd, sync, runs=runs), timed(step, sync, runs=runs)


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("T", 20), ("N", 32), ("I", 256), ("H", 512), ("runs", 20)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    dev = caffe_ocl.get_device()
    o = ours(a.T, a.N, a.I, a.H, a.runs)
    try:
        import torch
        torch.set_num_threads(os.cpu_count() if dev.is_cpu else torch.get_num_threads())
        t = torch_times(a.T, a.N, a.I, a.H, a.runs, "cpu" if dev.is_cpu else "cuda")
    except ImportError:
        t = (float("nan"), float("nan"))
    print(f"device: {dev.name}; {time.strftime('%Y-%m-%d')}; T {a.T}, N {a.N}, I {a.I}, "
          f"H {a.H}\n")
    print("| pass | caffe_ocl ms | PyTorch ms | ratio |")
    print("|---|---|---|---|")
    for name, x, y in (("forward", o[0], t[0]), ("forward + backward", o[1], t[1])):
        print(f"| {name} | {x:.2f} | {y:.2f} | {y / x:.2f} |")


if __name__ == "__main__":
    main()
