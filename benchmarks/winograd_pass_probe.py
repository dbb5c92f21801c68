"""bench_zoo_train.py with chosen Winograd passes forced to F(2x2,3x3)
(issue #27, twenty-sixth session: which pass made ResNet-18's TF32
gradients 3x further from float64 than cuDNN's).

    PROBE=forward python3 benchmarks/winograd_pass_probe.py --nets resnet18 \\
        --batches 64 --precisions tf32 --check-only

PROBE: comma-separated ops.winograd functions (forward, backward_data,
backward_weight) that get ``tile=2``; every other argument goes to
bench_zoo_train.py.
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from caffe_ocl.ops import winograd  # noqa: E402
import bench_zoo_train  # noqa: E402

for name in filter(None, os.environ.get("PROBE", "").split(",")):
    setattr(winograd, name, functools.partial(getattr(winograd, name), tile=2))

if __name__ == "__main__":
    sys.exit(bench_zoo_train.main(sys.argv[1:]))
