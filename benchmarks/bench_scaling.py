"""Data-parallel scaling: training throughput of one net on 1 rank and on
N ranks (one device each), through the same code as `mpiexec -n N
caffe_ocl train`. Input-fed net (random data), so only compute and
gradient reduction are measured.

    python benchmarks/bench_scaling.py --net resnet50 --batch 64          # 1 rank
    mpiexec -n 2 python benchmarks/bench_scaling.py --net resnet50 --batch 64
Rank 0 prints images/s (all ranks together), the reduction path and staging
(CAFFE_OCL_REDUCE=shm|mpi, CAFFE_OCL_STAGING=hostptr|plain; see
caffe_ocl/parallel/data_parallel.py) and the reduction statistics;
scaling efficiency = rate(N) / (N x rate(1)).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import caffe_ocl  # noqa: E402
from caffe_ocl import parallel  # noqa: E402
from common import fill_inputs, solver_for, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="resnet50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--independent", action="store_true",
                    help="under mpiexec: every rank trains alone (no reduction); shows "
                         "what running N processes side by side costs by itself")
    ap.add_argument("--drain", action="store_true",
                    help="wait on the host for the device before every update (what a "
                         "host-side wait for the reduction costs a single rank)")
    a = ap.parse_args()
    caffe_ocl.init_log()
    group = parallel.init() if parallel.launched_size() > 1 else None
    param = with_inputs(os.path.join(ROOT, "models", a.net, "train.prototxt"), a.batch,
                        (3, a.size, a.size))
    solver = caffe_ocl.solvers.SGDSolver(solver_for(param))
    fill_inputs(solver.net, 1000)
    sync = parallel.DataParallel(solver, group) if group and not a.independent else None
    dev = solver.net.device
    ranks = group.size if group else 1
    if a.drain:
        solver.add_callback(lambda: None, dev.finish)

    def barrier():
        dev.finish()
        if group:
            group.barrier()
    solver.step(3)
    barrier()
    if sync:
        sync.reset_stats()         # warm-up (kernel builds) out of the statistics
    t0 = time.perf_counter()
    solver.step(a.iters)
    host = (time.perf_counter() - t0) / a.iters     # until the host enqueued the last step
    barrier()
    dt = (time.perf_counter() - t0) / a.iters
    if not group or group.rank == 0:
        print(f"{a.net} batch {a.batch}/rank, {ranks} rank(s) on {dev.name}, "
              f"bucket MB {os.environ.get('CAFFE_OCL_BUCKET_MB', 'default')}: "
              f"{dt * 1000:.1f} ms/iter, {ranks * a.batch / dt:.1f} images/s "
              f"(host done enqueuing after {host * 1000:.1f} ms/iter)"
              f"{' independent ranks' if a.independent else ''}"
              f"{' drained before each update' if a.drain else ''}", flush=True)
        if sync:
            st = sync.stats()
            print(f"reduction: {sync.describe_path()}; {st['buckets']} buckets, "
                  f"{st['mb_per_iter']:.1f} MB/iter; comm {st['comm_ms']:.1f} ms/iter "
                  f"(node barriers {st['sync_ms']:.1f}), hidden {st['hidden_ms']:.1f}, "
                  f"exposed {st['exposed_ms']:.1f}, update waited {st['wait_ms']:.1f}",
                  flush=True)
            print(st, flush=True)


if __name__ == "__main__":
    main()
