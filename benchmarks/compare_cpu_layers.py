"""Per-convolution comparison against ONNX Runtime on the CPU: the
per-layer times of a caffe_ocl inference pass (profile_kernels.py --infer
--by-layer --json F) beside ONNX Runtime's own node profile of the same
architecture (bench_cpu_infer.py's PyTorch model, exported to ONNX), same
machine, ms per pass.

    python3 benchmarks/profile_kernels.py --nets mobilenet_v2 --batch 16 \\
        --infer --by-layer --iters 5 --json mb.json
    python3 benchmarks/compare_cpu_layers.py mb.json --net mobilenet_v2 [--runs 5]

Convolutions are paired by their shapes (input channels and size, output
channels and size), in network order among equal shapes: the nets order a
ResNet block's shortcut and branch differently. ONNX Runtime's Conv node
includes what it fused into it (BatchNorm, Clip / ReLU, a residual Add in
its NCHWc layout); ours includes the folded BatchNorm / Scale and the
activation. Both sides run under profiling, which inflates short layers,
so only differences of a few tenths of a millisecond mean something.
"""
import argparse
import json
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_cpu_infer import NETS, export_onnx, torch_model  # noqa: E402


def _shape_chw(entry):
    """(C, H, W) of a profiled tensor shape: [N, C, H, W], or NCHWc's
    [N, C / b, H, W, b]."""
    dims = next(iter(entry.values()))
    if len(dims) == 5:
        return dims[1] * dims[4], dims[2], dims[3]
    if len(dims) == 4:
        return tuple(dims[1:4])
    return None


def _round_up(n, b):
    return -(-n // b) * b


def ort_node_ms(name, runs):
    """[(op type, ms per run, (C, H, Co, HO))] of ONNX Runtime's nodes in
    execution order."""
    import onnxruntime as ort
    import torch
    cfg = NETS[name]
    model = torch_model(name).eval()
    x = torch.randn(cfg["batch"], *cfg["shape"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        export_onnx(model, x, path)
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(d, "profile")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = {"data": x.numpy()}
        for _ in range(runs):
            sess.run(None, feed)
        with open(sess.end_profiling()) as fh:
            events = json.load(fh)
    nodes = {}
    for e in events:     # "<node>_kernel_time" events, one per node per run
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            key = e["name"][:-len("_kernel_time")]
            args = e["args"]
            op, ms, sig = nodes.get(key, (args.get("op_name"), 0.0, None))
            if sig is None and args.get("input_type_shape") and args.get("output_type_shape"):
                i, o = (_shape_chw(args["input_type_shape"][0]),
                        _shape_chw(args["output_type_shape"][0]))
                sig = (i[0], i[1], o[0], o[1]) if i and o else ("?", args["input_type_shape"])
            nodes[key] = (op, ms + e["dur"] / 1000.0 / runs, sig)
    return list(nodes.values())


def main():
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    ap = argparse.ArgumentParser()
    ap.add_argument("layers", help="JSON from profile_kernels.py --infer --by-layer --json")
    ap.add_argument("--net", default="mobilenet_v2", choices=sorted(NETS))
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with open(a.layers) as fh:
        rows = json.load(fh)
    ours = [r for r in rows if r["conv"]]
    queues = {}          # ONNX Runtime's Conv times by shape, in order
    for op, ms, sig in ort_node_ms(a.net, a.runs):
        if op == "Conv":
            queues.setdefault(sig, []).append(ms)
    theirs = []
    for r in ours:
        c = r["conv"]
        # NCHWc shapes count channels padded to the block (AVX-512: 16, so
        # MobileNet v2's 24 channels show as 32)
        keys = [(_round_up(c["c"], bi), c["h"], _round_up(c["co"], bo), c["ho"])
                for bi in (1, 8, 16) for bo in (1, 8, 16)]
        q = next((queues[k] for k in keys if queues.get(k)), None)
        if not q:
            sys.exit(f"{r['name']}: no Conv of its shape left in ONNX Runtime's profile")
        theirs.append(q.pop(0))
    left = {k: len(v) for k, v in queues.items() if v}
    if left:
        sys.exit(f"ONNX Runtime ran Conv nodes that match no layer here: {left}")
    print("| layer | shape (C,H,W -> Co, k/s, groups) | ours ms | ORT ms | ours - ORT |")
    print("|---|---|---|---|---|")
    for r, ms in zip(ours, theirs):
        c = r["conv"]
        shape = (f"{c['c']},{c['h']},{c['w']} -> {c['co']}, {c['kh']}x{c['kw']}/{c['sh']}"
                 + (f", g{c['groups']}" if c["groups"] > 1 else ""))
        print(f"| {r['name']} | {shape} | {r['fwd_ms']:.2f} | {ms:.2f} | "
              f"{r['fwd_ms'] - ms:+.2f} |")
    so, st = sum(r["fwd_ms"] for r in ours), sum(theirs)
    print(f"\nconvolutions: ours {so:.1f} ms, ONNX Runtime {st:.1f} ms (ratio ORT/ours "
          f"{st / so:.2f}); all layers: ours {sum(r['fwd_ms'] for r in rows):.1f} ms")


if __name__ == "__main__":
    main()
