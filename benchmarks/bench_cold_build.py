"""Cold start: how long a net takes from nothing to its first forward pass
when no kernel binary is cached anywhere (issue #23 item 6).

For each net (every deploy net under models/ by default, the train nets with
--train, and any prototxt named on the command line) a fresh Python process
builds the net with an empty CAFFE_OCL_CACHE and an empty POCL_CACHE_DIR (two
new temporary folders), fills its inputs with random numbers and runs one
forward pass (train nets: forward and backward, their data layers replaced by
Input layers). A second process then does the same with the caches the first
one filled ("warm"). Reported per net: wall time to the end of the first pass
(process start included, Python imports too), OpenCL programs compiled, the
slowest program's build time and which one it was.

    python3 benchmarks/bench_cold_build.py                  # shipped deploy nets
    python3 benchmarks/bench_cold_build.py --train          # and the train nets
    python3 benchmarks/bench_cold_build.py path/to/deploy.prototxt --batch 1
    python3 benchmarks/bench_cold_build.py --only lenet --details --pocl-apart

"compile s" sums clBuildProgram (and cache loads) as the device's build_log
records them, "cache write s" the time spent fetching the built binaries
(clGetProgramInfo BINARIES) and writing them to CAFFE_OCL_CACHE (0 on PoCL,
where caffe_ocl stores no binaries unless CAFFE_OCL_BINARY_CACHE=1; the
child processes inherit that variable). PoCL also generates code at a
kernel's first launch, cached in POCL_CACHE_DIR (BENCHMARKS.md, "Cold
build"). On PoCL a warm run's programs count as "compiled" (built from
source again, answered by PoCL's cache) and "from cache" is 0.

Prints a Markdown table (BENCHMARKS.md, "Cold build").
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
t_start = float(sys.argv[4])
sys.path.insert(0, sys.argv[5])
import numpy as np
import caffe_ocl
from caffe_ocl.proto import caffe_pb2, read_net_prototxt
path, kind, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
dev = caffe_ocl.get_device()
if kind == "train":
    from common import with_inputs
    deploy = read_net_prototxt(sys.argv[6])
    shape = list(deploy.layer[0].input_param.shape[0].dim)[1:] if deploy.layer and \
        deploy.layer[0].type == "Input" else list(deploy.input_shape[0].dim)[1:]
    netp = with_inputs(path, batch, shape)
    phase = caffe_ocl.TRAIN
else:
    netp = read_net_prototxt(path)
    for lp in netp.layer:
        if lp.type == "Input":
            for s in lp.input_param.shape:
                s.dim[0] = batch
    for s in netp.input_shape:
        s.dim[0] = batch
    if len(netp.input_dim) >= 4:
        for i in range(0, len(netp.input_dim), 4):
            netp.input_dim[i] = batch
    phase = caffe_ocl.TEST
t0 = time.perf_counter()
net = caffe_ocl.Net(netp, phase)
t_built = time.perf_counter()
rng = np.random.RandomState(0)
for name in net.inputs:
    blob = net.blobs[name]
    if name == "label":
        blob.data[...] = rng.randint(0, 10, blob.data.shape)
    else:
        blob.data[...] = rng.uniform(-1, 1, blob.data.shape)
net.forward()
if kind == "train":
    net.backward()
dev.finish() if hasattr(dev, "finish") else dev.queue.finish()
t_end = time.perf_counter()
compiled = [(f, m, s) for f, m, s, cached, _ in dev.build_log if not cached]
slow = max(compiled, key=lambda r: r[2]) if compiled else ("", "", 0.0)
print("RESULT " + json.dumps({
    "build_s": t_built - t0, "first_pass_s": t_end - t_built,
    "process_s": time.time() - t_start, "compiled": len(compiled),
    "cached": sum(1 for r in dev.build_log if r[3]),
    "compile_s": sum(r[2] for r in compiled),
    "cache_write_s": sum(r[4] for r in dev.build_log),
    "slowest_s": slow[2], "slowest": (slow[0] + " " + slow[1]).strip(),
    "layers": len(net.layers), "device": dev.name}))
"""


def run_child(path, kind, batch, cache, pocl_cache, deploy, timeout):
    env = dict(os.environ, CAFFE_OCL_CACHE=cache, POCL_CACHE_DIR=pocl_cache)
    env.pop("CAFFE_OCL_PROGRESS", None)
    cmd = [sys.executable, "-c", CHILD, path, kind, str(batch), repr(time.time()),
           os.path.join(ROOT, "benchmarks"), deploy or ""]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s"}
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = wall
            return res
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": tail[:200]}


def nets_to_run(args):
    nets = []
    for d in sorted(glob.glob(os.path.join(ROOT, "models", "*"))):
        deploys = [f for f in ("deploy.prototxt", os.path.basename(d) + ".prototxt")
                   if os.path.exists(os.path.join(d, f))]
        if deploys and not args.paths:
            nets.append((os.path.join(d, deploys[0]), "deploy", None))
        if args.train and deploys and os.path.exists(os.path.join(d, "train.prototxt")):
            nets.append((os.path.join(d, "train.prototxt"), "train",
                         os.path.join(d, deploys[0])))
    for p in args.paths:
        nets.append((os.path.abspath(p), "deploy", None))
    if args.only:
        keep = set(args.only.split(","))
        nets = [n for n in nets if os.path.basename(os.path.dirname(n[0])) in keep]
    return nets


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="more deploy prototxts to time")
    ap.add_argument("--train", action="store_true", help="also the shipped train nets")
    ap.add_argument("--only", default="", help="comma-separated model folder names")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per process")
    ap.add_argument("--details", action="store_true",
                    help="after each row, each process's measurements as JSON (net build "
                         "and first pass apart, Python start included in process_s)")
    ap.add_argument("--pocl-apart", action="store_true",
                    help="with --details: a third process with the filled CAFFE_OCL_CACHE and a "
                         "new, empty POCL_CACHE_DIR (what PoCL's own cache saves; on PoCL "
                         "only with CAFFE_OCL_BINARY_CACHE=1)")
    args = ap.parse_args()
    rows = []
    print("| net | kind | layers | cold s | compiled | compile s | cache write s | slowest s "
          "| slowest program | warm s | from cache |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for path, kind, deploy in nets_to_run(args):
        with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
            cold = run_child(path, kind, args.batch, c1, c2, deploy, args.timeout)
            warm = run_child(path, kind, args.batch, c1, c2, deploy, args.timeout) \
                if "error" not in cold else {"error": "-"}
            apart = None
            if args.pocl_apart and "error" not in cold:
                with tempfile.TemporaryDirectory() as c3:
                    apart = run_child(path, kind, args.batch, c1, c3, deploy, args.timeout)
        name = os.path.relpath(path, ROOT) if path.startswith(ROOT) else path
        if "error" in cold:
            print(f"| {name} | {kind} | | failed: {cold['error']} | | | | | | | |", flush=True)
            continue
        w = f"{warm['wall_s']:.1f}" if "error" not in warm else warm["error"]
        print(f"| {name} | {kind} | {cold['layers']} | {cold['wall_s']:.1f} | {cold['compiled']} "
              f"| {cold['compile_s']:.1f} | {cold['cache_write_s']:.1f} | {cold['slowest_s']:.2f} | `{cold['slowest']}` "
              f"| {w} | {warm.get('cached', '')} |", flush=True)
        rows.append((name, kind, cold, warm))
        if args.details:
            print(f"<!-- cold {json.dumps(cold)} -->\n<!-- warm {json.dumps(warm)} -->",
                  flush=True)
            if apart is not None:
                print(f"<!-- empty POCL_CACHE_DIR only {json.dumps(apart)} -->", flush=True)
    if rows:
        print(f"\ndevice: {rows[0][2]['device']}")


if __name__ == "__main__":
    main()
