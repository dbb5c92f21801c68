"""profile_gemm_shapes.py for CPU inference: one TEST forward pass of a
bench_cpu_infer.py net with each GEMM launch named by shape (M x N x K,
images folded, block) and its GFLOP/s, the heaviest first.

    python3 benchmarks/profile_gemm_infer.py [--net mobilenet_v2] [--top 30]
"""
import argparse
import os
import sys

os.environ["CAFFE_OCL_PROFILE"] = "1"     # before the device is created

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ab_cpu_infer import build  # noqa: E402
from bench_cpu_infer import NETS  # noqa: E402
from profile_gemm_shapes import install, labelled_profile  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="mobilenet_v2", choices=sorted(NETS))
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    install()
    net = build(NETS[a.net], {}, [])
    last = len(net.layers) - 1
    print(f"{a.net} batch {NETS[a.net]['batch']}:")
    labelled_profile(lambda: net.forward_from_to(0, last), net.device, a.iters, "pass", a.top)


if __name__ == "__main__":
    main()
