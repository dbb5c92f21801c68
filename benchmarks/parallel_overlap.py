"""Backward/communication overlap of data-parallel training (caffe_ocl.parallel).

    python benchmarks/parallel_overlap.py [--ranks 2] [--iters 30]

Trains an MLP (DummyData -> 4 InnerProduct layers, ~3.4 MB of gradients)
with `mpiexec -n R caffe_ocl train` under three bucket settings and prints,
from rank 0's "Data-parallel:" line and its iteration timings: the time per
iteration, the Allreduce time per iteration, how much of it was hidden behind
the backward pass and the overlap fraction.
  CAFFE_OCL_BUCKET_MB=0     one bucket per layer (Caffe's layer_wise_reduce)
  CAFFE_OCL_BUCKET_MB=1     1 MiB buckets (the default)
  CAFFE_OCL_BUCKET_MB=1e6   one bucket after the whole backward (no overlap)
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = """name: "mlp"
layer { name: "d" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 32 dim: 256 } shape { dim: 32 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h1"
  inner_product_param { num_output: 512 weight_filler { type: "xavier" } } }
layer { name: "r1" type: "ReLU" bottom: "h1" top: "h1" }
layer { name: "ip2" type: "InnerProduct" bottom: "h1" top: "h2"
  inner_product_param { num_output: 512 weight_filler { type: "xavier" } } }
layer { name: "r2" type: "ReLU" bottom: "h2" top: "h2" }
layer { name: "ip3" type: "InnerProduct" bottom: "h2" top: "h3"
  inner_product_param { num_output: 512 weight_filler { type: "xavier" } } }
layer { name: "r3" type: "ReLU" bottom: "h3" top: "h3" }
layer { name: "ip4" type: "InnerProduct" bottom: "h3" top: "z"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" }
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--reduce", choices=("default", "shm", "mpi"), default="default",
                    help="CAFFE_OCL_REDUCE for the ranks (default: shm on one machine)")
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    try:
        with open(os.path.join(d, "net.prototxt"), "w") as f:
            f.write(NET)
        with open(os.path.join(d, "solver.prototxt"), "w") as f:
            f.write(f'net: "{d}/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
                    f'momentum: 0.9\nmax_iter: {a.iters}\ndisplay: 10\nrandom_seed: 1\n'
                    f'snapshot_after_train: false\nsnapshot_prefix: "{d}/s"\n')
        mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep
                               + os.environ.get("PATH", ""))
        print(f"{a.ranks} ranks, {a.iters} iterations, MLP 256-512-512-512-10, batch 32/rank")
        print(f"{'buckets':>22} {'ms/iter':>8} {'comm ms':>8} {'hidden':>7} {'exposed':>8} "
              f"{'overlap':>8}")
        for mb, what in (("0", "per layer"), ("1", "1 MiB (default)"),
                         ("1e6", "one, at the end")):
            env = dict(os.environ, PYTHONPATH=ROOT, CAFFE_OCL_BUCKET_MB=mb)
            if a.reduce != "default":
                env["CAFFE_OCL_REDUCE"] = a.reduce
            t = time.time()
            p = subprocess.run([mpiexec, "-n", str(a.ranks), sys.executable, "-m",
                                "caffe_ocl", "train", f"--solver={d}/solver.prototxt"],
                               env=env, capture_output=True, text=True)
            if p.returncode:
                print(p.stderr[-2000:])
                return 1
            path = re.search(r"reduction (\w+ \([^)]*\))", p.stderr)
            if path and what == "per layer":
                print(f"reduction path: {path.group(1)}")
            m = re.search(r"(\d+) buckets, .*communication ([\d.e+-]+) ms/iter, ([\d.e+-]+) ms "
                          r"hidden behind backward, ([\d.e+-]+) ms exposed \(overlap (\d+)%\)",
                          p.stderr)
            its = [float(x) for x in re.findall(r"Iteration \d+ \(([\d.e+-]+) iter/s", p.stderr)]
            ms = 1e3 / (sum(its[1:]) / len(its[1:])) if len(its) > 1 else float("nan")
            print(f"{m.group(1) + ' ' + what:>22} {ms:8.2f} {float(m.group(2)):8.2f} "
                  f"{float(m.group(3)):7.2f} {float(m.group(4)):8.2f} {m.group(5):>7}%")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
