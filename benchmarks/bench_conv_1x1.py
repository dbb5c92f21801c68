"""ResNet-50's 1x1 convolution passes (forward, backward-data, weight
gradient), ms per pass: as ops/conv.py plans them now against the
implicit-GEMM kernel alone (GEMM_1X1_MIN_K raised out of reach and
FOLDED_WEIGHT_GEMM off), and
against PyTorch + cuDNN on the same shape when PyTorch sees a CUDA device.
With --tf32 (NVIDIA) the folded / gathered-rows GEMMs of _gemm_1x1_plan
take the TF32 cp.async loop; without it (or on other devices) both columns
run the same kernels, which is itself a check that the plan is TF32-only.
Each time is the best of three means of --runs passes.

    python3 benchmarks/bench_conv_1x1.py [--tf32] [--batch 64] [--runs 20]

(BENCHMARKS.md, tenth session: the per-pass table came from this script's
timing code in a session-local form.)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from common import conv_pass, cuda_ms, cuda_torch, random_buffers, time_launches  # noqa: E402

SHAPES = [  # (in channels, input size, out channels, stride): ResNet-50's 1x1 layers
    (64, 56, 64, 1), (64, 56, 256, 1), (256, 56, 64, 1), (128, 28, 512, 1), (512, 28, 128, 1),
    (256, 14, 1024, 1), (1024, 14, 256, 1), (512, 7, 2048, 1), (2048, 7, 512, 1),
    (1024, 14, 2048, 2), (1024, 14, 512, 2), (512, 28, 1024, 2), (512, 28, 256, 2),
    (256, 56, 512, 2), (256, 56, 128, 2)]
PASSES = ("fwd", "bwd_data", "bwd_weight")


def torch_timer(batch, tf32):
    """timer(c, h, co, stride) -> {pass: ms} with PyTorch + cuDNN, or None
    when PyTorch or its CUDA device is missing."""
    torch = cuda_torch()
    if torch is None:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32

    def timer(c, h, co, st):
        x = torch.randn(batch, c, h, h, device="cuda")
        w = torch.randn(co, c, 1, 1, device="cuda")
        dy = torch.randn_like(torch.nn.functional.conv2d(x, w, stride=st))

        def bwd(mask):
            return lambda: torch.ops.aten.convolution_backward(
                dy, x, w, None, (st, st), (0, 0), (1, 1), False, (0, 0), 1, mask)
        return {"fwd": cuda_ms(lambda: torch.nn.functional.conv2d(x, w, stride=st), 30),
                "bwd_data": cuda_ms(bwd((True, False, False)), 30),
                "bwd_weight": cuda_ms(bwd((False, True, False)), 30)}
    return timer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    gemm_ops.set_allow_tf32(a.tf32)
    reference = torch_timer(a.batch, a.tf32) if dev.is_gpu else None
    print(f"device: {dev.name}; TF32: {a.tf32}; batch {a.batch}")
    print("| 1x1 layer | pass | implicit GEMM ms | planned ms (first kernel) | cuDNN ms |")
    print("|---|---|---|---|---|")
    totals = {}
    for c, h, co, st in SHAPES:
        g = conv_ops.ConvGeometry(a.batch, c, h, h, co, 1, 1, 0, 0, st, st, 1, 1, 1)
        x, w = buf(a.batch * c * h * h), buf(co * c)
        y, dx, dw = buf(a.batch * co * g.out_spatial), buf(a.batch * c * h * h), buf(co * c)
        ref = reference(c, h, co, st) if reference else {}
        for what in PASSES:
            row = []
            for name in ("implicit", "planned"):
                # "implicit": every GEMM form of a 1x1 pass off
                off = dict(GEMM_1X1=False, FOLDED_WEIGHT_GEMM=False) if name == "implicit" else {}
                with config.override(**off):
                    ls = conv_pass(dev, g, what, x, w, y, dx, dw, None, "igemm")
                    t = min(time_launches(dev, ls, 2, a.runs) for _ in range(3))
                totals[(what, name)] = totals.get((what, name), 0.0) + t
                row.append(f"{t:.3f}" + (f" ({ls[0].name})" if name == "planned" else ""))
            r = ref.get(what)
            if r is not None:
                totals[(what, "cuDNN")] = totals.get((what, "cuDNN"), 0.0) + r
            print(f"| {c}->{co} at {h}, stride {st} | {what} | " + " | ".join(row) +
                  f" | {'-' if r is None else f'{r:.3f}'} |", flush=True)
    print("\nsums (ms): " + ", ".join(f"{w} {n} {v:.2f}" for (w, n), v in sorted(totals.items())))
    gemm_ops.set_allow_tf32(False)


if __name__ == "__main__":
    main()
