"""Before/after of two source trees on the converted zoo, net by net:
``bench_zoo.py --nets NET`` run from tree A then tree B (the order
swapped every repetition), so both read the same minutes of a shared
machine; prints one row per net (medians over repetitions) with both
trees' times against ONNX Runtime's (issue #27; e.g. main's worktree
against a branch's):

    python3 benchmarks/ab_trees_zoo.py --base /tmp/wt_base --ours . \\
        --nets resnet18,mobilenet_v2 --reps 2 --export-dir /tmp/zoocpu
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="tree A (the 'before')")
    ap.add_argument("--ours", default=".", help="tree B (the 'after')")
    ap.add_argument("--nets", required=True)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--export-dir", default=None)
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()
    trees = {"base": os.path.abspath(args.base), "ours": os.path.abspath(args.ours)}
    nets = args.nets.split(",")
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        export = args.export_dir or tmp
        for rep in range(args.reps):
            for net in nets:
                for name in (["base", "ours"] if rep % 2 == 0 else ["ours", "base"]):
                    out = os.path.join(tmp, f"{name}_{net}_{rep}.json")
                    subprocess.run([sys.executable, "benchmarks/bench_zoo.py", "--device", args.device,
                                    "--batches", str(args.batch), "--nets", net, "--export-dir",
                                    export, "--rounds", str(args.rounds), "--json", out],
                                   cwd=trees[name], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, check=True)
                    r = json.load(open(out))["records"][0]
                    res.setdefault(net, {}).setdefault(name, []).append(
                        (r["ours_ms"], r["ort_ms"], r["status"]))
                b, o = res[net]["base"][-1], res[net]["ours"][-1]
                print(f"{net} rep {rep}: base {b[0]:.2f} ms, ours {o[0]:.2f} ms "
                      f"(ORT {b[1]:.2f} / {o[1]:.2f}), base/ours {b[0] / o[0]:.2f} "
                      f"[{b[2]}, {o[2]}]", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    print("\n| net | base ms | ours ms | ORT ms | base/ours | ORT/base | ORT/ours |")
    print("|---|---|---|---|---|---|---|")
    cols = {"bo": [], "rb": [], "ro": []}
    for net in nets:
        bm = statistics.median(x[0] for x in res[net]["base"])
        om = statistics.median(x[0] for x in res[net]["ours"])
        rm = statistics.median(x[1] for x in res[net]["base"] + res[net]["ours"])
        cols["bo"].append(bm / om)
        cols["rb"].append(rm / bm)
        cols["ro"].append(rm / om)
        print(f"| {net} | {bm:.2f} | {om:.2f} | {rm:.2f} | {bm / om:.2f} | {rm / bm:.2f} | "
              f"{rm / om:.2f} |")

    def gm(v):
        return math.exp(sum(map(math.log, v)) / len(v))
    print(f"| **geomean** | | | | **{gm(cols['bo']):.2f}** | **{gm(cols['rb']):.2f}** | "
          f"**{gm(cols['ro']):.2f}** |")
    print(f"| **worst** | | | | | {min(cols['rb']):.2f} | {min(cols['ro']):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
