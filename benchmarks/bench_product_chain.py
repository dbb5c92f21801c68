"""A transformer MLP's fc1 -> GELU as onnx2caffe writes it (InnerProduct
and about twenty element-wise layers), with the element-wise run in the
product's GEMM epilogue (plan/pointwise.py ProductChain,
CAFFE_OCL_FUSE_PRODUCT_CHAIN=1) against the product plus the run as its
own generated kernel (=0), on the default device. Each net's whole
forward (replayed), the two alternated round by round; median of
--rounds means of --runs passes. Ratio = separate / fused (>= 1: the
epilogue pays). Also checks that both give the same output.

    python3 benchmarks/bench_product_chain.py
    python3 benchmarks/bench_product_chain.py --shapes 197x768x192 --rounds 9

A shape is TxNxK: T rows (tokens), N outputs, K inputs.
"""
import argparse
import math
import os
import sys
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.net import Net, TEST  # noqa: E402
from caffe_ocl.onnx import to_caffe  # noqa: E402
from caffe_ocl.plan import pointwise  # noqa: E402

# DeiT-Tiny (197 tokens), Swin-T's first stage (3136), LeViT's stages (49, 16)
SHAPES = "197x768x192,3136x384x96,49x1024x256,16x768x384"


def gelu_mlp(t, n, k, rng):
    """The ONNX graph x (1, t, k) -> MatMul + Add -> GELU (Div, Erf, Add,
    Mul, Mul), converted."""
    inits = {"w": rng.normal(0, 0.1, (k, n)).astype(np.float32),
             "b": rng.normal(0, 0.1, (n,)).astype(np.float32),
             "s2": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}

    def node(op, ins, out):
        return helper.make_node(op, ins, [out], name=f"{op}_{out}")
    nodes = [node("MatMul", ["x", "w"], "h0"), node("Add", ["h0", "b"], "h"),
             node("Div", ["h", "s2"], "d"), node("Erf", ["d"], "e"),
             node("Add", ["e", "one"], "a"), node("Mul", ["h", "a"], "m"),
             node("Mul", ["m", "half"], "y")]
    g = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, t, k))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, t, n))],
        initializer=[numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return to_caffe.convert(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| T x N x K | fused ms | separate ms | separate / fused |")
    print("|---|---|---|---|")
    for spec in args.shapes.split(","):
        t, n, k = (int(v) for v in spec.split("x"))
        npm = gelu_mlp(t, n, k, rng)
        nets = {}
        for on in (True, False):
            with config.override(FUSE_PRODUCT_CHAIN=on):
                nets[on] = Net(npm, TEST)
        fused = [gr for gr in nets[True].plan.fold_groups
                 if isinstance(gr, pointwise.ProductChain)]
        if not fused:
            raise SystemExit(f"{spec}: the product and its chain were not fused")
        x = rng.normal(0, 1, (1, t, k)).astype(np.float32)
        outs = [nets[on].forward(x=x)["y"].copy() for on in (True, False)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        times = {True: [], False: []}
        for net in nets.values():
            for _ in range(3):
                net.forward()
        for _ in range(args.rounds):
            for on, net in nets.items():
                q = net.device.queue
                q.finish()
                t0 = time.perf_counter()
                for _ in range(args.runs):
                    net.forward()
                q.finish()
                times[on].append((time.perf_counter() - t0) / args.runs * 1e3)
        f, s = float(np.median(times[True])), float(np.median(times[False]))
        print(f"| {spec} | {f:.3f} | {s:.3f} | {s / f:.2f} |", flush=True)


if __name__ == "__main__":
    main()
