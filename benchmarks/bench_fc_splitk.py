"""Fully-connected forwards at batch 16-64 on a GPU (AlexNet's and
VGG-16's classifiers: few rows, long K), ms per pass, by the K split's
target of work-groups per compute unit (ops.gemm_splitk.SPLIT_WGS_PER_CU),
and cuBLAS (torch.nn.functional.linear) on the same shape when PyTorch
sees a CUDA device. Best of --rounds means of --runs back-to-back passes.

    python3 benchmarks/bench_fc_splitk.py [--targets 2,4,8]
    python3 benchmarks/bench_fc_splitk.py --tf32    # both sides in TF32
    python3 benchmarks/bench_fc_splitk.py --min-chunks 512,256   # K chunk floors too
    # a ViT's token-major products (M = tokens), an LSTM's recurrence:
    python3 benchmarks/bench_fc_splitk.py --batches 197 --min-chunks 128,512 \
        --shapes "fc1=192:768,fc2=768:192,lstm=256:1024"
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from caffe_ocl.ops import gemm_splitk  # noqa: E402
from common import cuda_ms, cuda_torch, random_buffers, time_launches  # noqa: E402

# (name, K inputs, N outputs)
LAYERS = [("alexnet fc6", 9216, 4096), ("fc7", 4096, 4096), ("fc8", 4096, 1000),
          ("vgg16 fc6", 25088, 4096)]


def torch_ms(m, k, n, runs, tf32=False):
    torch = cuda_torch()
    if torch is None:
        return None
    torch.backends.cuda.matmul.allow_tf32 = tf32
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    b = torch.randn(n, device="cuda")
    return min(cuda_ms(lambda: torch.relu(torch.nn.functional.linear(x, w, b)), runs=runs)
               for _ in range(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--targets", default="2,4,8")
    ap.add_argument("--tf32", action="store_true", help="TF32 tensor cores on both sides")
    ap.add_argument("--shapes", default=None,
                    help="name=K:N,... instead of the classifiers (K inputs, N outputs)")
    ap.add_argument("--min-chunks", default=None,
                    help="floors of the K chunk (ops.gemm_splitk.MIN_CHUNK(_SHORT), MIN_CHUNK_FP32) "
                         "to time (default: the precision's)")
    args = ap.parse_args()
    dev = get_device()
    gemm_ops.set_allow_tf32(args.tf32)
    buf = random_buffers(dev)
    chunks = args.min_chunks or str(gemm_splitk.MIN_CHUNK if args.tf32
                                    else gemm_splitk.MIN_CHUNK_FP32)
    configs = [(int(t), int(c)) for c in chunks.split(",") for t in args.targets.split(",")]
    print(f"# {dev.name}; {'TF32' if args.tf32 else 'FP32'}; ms per pass (split factor)")
    print("| layer | batch | " + " | ".join(f"{t} per CU, chunks >= {c}" for t, c in configs)
          + " | cuBLAS |\n|---|---|" + "---|" * (len(configs) + 1))
    knobs = ("SPLIT_WGS_PER_CU", "MIN_CHUNK", "MIN_CHUNK_SHORT", "SPLIT_WGS_PER_CU_FP32",
             "MIN_CHUNK_FP32")
    saved = {k: getattr(gemm_splitk, k) for k in knobs}
    layers = LAYERS if not args.shapes else [
        (nm, int(kn.split(":")[0]), int(kn.split(":")[1]))
        for nm, kn in (item.split("=") for item in args.shapes.split(","))]
    for m in (int(b) for b in args.batches.split(",")):
        for name, k, n in layers:
            x, w, b, y = buf(m * k), buf(n * k), buf(n), buf(m * n)
            cells = []
            try:
                for t, c in configs:
                    for knob, v in zip(knobs, (t, c, c, t, c)):  # whichever the precision reads
                        setattr(gemm_splitk, knob, v)
                    ln = gemm_splitk.gemm_launches(dev, m, n, k, x, w, y, trans_b=True,
                                                   bias=b, bias_axis=1, act=("relu", 0.0))
                    ms = min(time_launches(dev, ln, warmup=3, runs=args.runs)
                             for _ in range(args.rounds))
                    cells.append(f"{ms:.4f} ({gemm_splitk.splitk_factor(dev, m, n, k)})")
            finally:
                for knob, v in saved.items():
                    setattr(gemm_splitk, knob, v)
            ref = torch_ms(m, k, n, args.runs, args.tf32)
            print(f"| {name} | {m} | " + " | ".join(cells) + " | "
                  + (f"{ref:.4f} |" if ref is not None else "- |"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
