"""The GPU GEMM's tile shapes (ops.gemm.GEMM_TILE_NAMES) and its K split on
the products attention and MLP nets make, ms per pass, against cuBLAS
(torch.matmul) on the same shapes when PyTorch sees a CUDA device; the
column "rule" is ops.gemm.fill_tiles' choice (setting GEMM_TILES=rule). Best of --rounds means of
--runs back-to-back passes, FP32.

    python3 benchmarks/bench_gemm_tiles.py
    python3 benchmarks/bench_gemm_tiles.py --shapes "qkv=3152x576x192,win=49x49x32x3072t"

``--splits``: instead, the usual tiles with the K split forced to each of
SPLIT_FACTORS chunks beside the rule's own (ops.gemm_splitk.splitk_factor),
on single products (default: SPLIT_SHAPES, long fully-connected layers).

A shape is MxNxK, optionally xB (a batch of B products, as a MatMul layer
over heads makes) and a trailing t (op(B) = B^T: a fully-connected layer's
weights, or K^T in attention).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from caffe_ocl.ops import gemm_splitk  # noqa: E402
from common import cuda_ms, cuda_torch, random_buffers, time_launches  # noqa: E402

# DeiT-Tiny at batch 16 (3152 tokens of 192) and 1 (197), Swin-T's last
# stage at batch 16 (784 tokens of 768) and its 7 x 7 windows (16 x 64
# windows x 3 heads), MLP-Mixer S/16's token mixing at batch 16 (16 x 512
# rows of 196 tokens), BERT-base at 128 tokens.
SHAPES = ("deit16_qkv=3152x576x192t,deit16_proj=3152x192x192t,deit16_fc1=3152x768x192t,"
          "deit16_fc2=3152x192x768t,deit16_qk=197x197x64x48t,deit16_av=197x64x197x48,"
          "deit1_qkv=197x576x192t,deit1_fc1=197x768x192t,deit1_fc2=197x192x768t,"
          "deit1_qk=197x197x64x3t,"
          "swin16_s4qkv=784x2304x768t,swin16_s4fc2=784x768x3072t,"
          "swin16_win_qk=49x49x32x3072t,swin16_win_av=49x32x49x3072,"
          "mixer16_tok1=8192x256x196t,mixer16_tok2=8192x196x256t,"
          "bert_qkv=128x2304x768t,bert_fc1=128x3072x768t")


# DeiT III-S at batch 16 (3152 tokens: fc2, fc1, qkv, proj), ViT-B b16's
# fc2, Swin-T b16's third-stage fc2, BERT-base at 1024 tokens, Swin-T b16's
# last-stage fc2, DeiT-S b64's fc2
SPLIT_SHAPES = ("d3s16_fc2=3152x384x1536t,d3s16_fc1=3152x1536x384t,d3s16_qkv=3152x1152x384t,"
                "d3s16_proj=3152x384x384t,vitb16_fc2=3152x768x3072t,swin16_s3fc2=3136x384x1536t,"
                "bert_fc2=1024x768x3072t,swin16_s4fc2=784x768x3072t,deits64_fc2=12608x384x1536t")
SPLIT_FACTORS = (1, 2, 3, 4, 6)


def parse(spec):
    out = []
    for item in spec.split(","):
        name, dims = item.split("=")
        trans_b = dims.endswith("t")
        parts = [int(v) for v in dims.rstrip("t").split("x")]
        m, n, k = parts[:3]
        out.append((name, m, n, k, parts[3] if len(parts) > 3 else 1, trans_b))
    return out


def torch_ms(m, n, k, batch, trans_b, runs):
    torch = cuda_torch()
    if torch is None:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(batch, m, k, device="cuda")
    if trans_b:
        b = torch.randn(batch, n, k, device="cuda")
        product = lambda: torch.matmul(a, b.transpose(1, 2))   # noqa: E731
    else:
        b = torch.randn(batch, k, n, device="cuda")
        product = lambda: torch.matmul(a, b)                    # noqa: E731
    return min(cuda_ms(product, runs=runs) for _ in range(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--splits", action="store_true",
                    help="time each K split factor instead of each tile shape")
    ap.add_argument("--factors", default=",".join(map(str, SPLIT_FACTORS)),
                    help="--splits: the factors to force, beside the rule's own")
    args = ap.parse_args()
    dev = get_device()
    gemm_ops.set_allow_tf32(False)
    buf = random_buffers(dev)
    if args.splits:
        return splits(dev, buf, args)
    args.shapes = args.shapes or SHAPES
    # (label, GEMM_TILES, K split): "rule" is ops.gemm.fill_tiles' choice with
    # gemm_launches' own split, what the setting's "rule" runs
    variants = [("rule", "rule", None)] + [(t, t, 1) for t in gemm_ops.GEMM_TILE_NAMES] \
        + [(t + "+split", t, None) for t in ("usual", "small")]
    print(f"# {dev.name}; FP32; ms per pass; {dev.compute_units} compute units")
    print("| shape | M x N x K x batch | " + " | ".join(v[0] for v in variants)
          + " | cuBLAS | best / rule |\n|---|---|" + "---|" * (len(variants) + 2))
    for name, m, n, k, batch, trans_b in parse(args.shapes):
        a, b, c = buf(batch * m * k), buf(batch * n * k), buf(batch * m * n)
        cells, times = [], {}
        for label, tiles, nsplit in variants:
            config.set("GEMM_TILES", tiles)
            try:
                if batch == 1:
                    ln = gemm_splitk.gemm_launches(dev, m, n, k, a, b, c, trans_b=trans_b,
                                                   nsplit=nsplit)
                elif nsplit is None and label != "rule":
                    cells.append("-")
                    continue
                else:
                    ln = [gemm_ops.gemm(dev, m, n, k, a, b, c, trans_b=trans_b, batch=batch,
                                        stride_a=(m * k, 0), stride_b=(n * k, 0),
                                        stride_c=(m * n, 0), tiles="auto")]
                ms = min(time_launches(dev, ln, warmup=3, runs=args.runs)
                         for _ in range(args.rounds))
            finally:
                config.set("GEMM_TILES", "usual")
            times[label] = ms
            cells.append(f"{ms:.4f}" + (f" (x{len(ln) and ln[0].gsize[2]})"
                                        if label.endswith("split") or label == "rule" else ""))
        print_row(name, m, n, k, batch, trans_b, cells, times, times["rule"], args.runs)
    return 0


def print_row(name, m, n, k, batch, trans_b, cells, times, rule_ms, runs):
    """A table row: the shape, ``cells``, cuBLAS's time, best / rule."""
    ref = torch_ms(m, n, k, batch, trans_b, runs)
    print(f"| {name} | {m}x{n}x{k}x{batch}{'t' if trans_b else ''} | " + " | ".join(cells)
          + " | " + (f"{ref:.4f}" if ref is not None else "-")
          + f" | {min(times.values()) / rule_ms:.2f} |")


def splits(dev, buf, args):
    """--splits: the rule's split (its factor in brackets) and each forced
    factor, usual tiles."""
    factors = tuple(int(f) for f in args.factors.split(","))
    print(f"# {dev.name}; FP32; ms per product; rule = gemm_launches' own split")
    print("| shape | M x N x K x batch | tiles | rule | " + " | ".join(f"x{f}" for f in factors)
          + " | cuBLAS | best / rule |\n|---|---|---|---|" + "---|" * (len(factors) + 2))
    for name, m, n, k, batch, trans_b in parse(args.shapes or SPLIT_SHAPES):
        if batch != 1:
            raise SystemExit(f"--splits: {name} is a batch of products; give single ones")
        a, b, c = buf(m * k), buf(n * k), buf(m * n)
        t = gemm_ops.gpu_tiles(dev, m)
        times = {}
        for f in (None,) + factors:
            if f is not None and k % f:
                continue
            ln = gemm_splitk.gemm_launches(dev, m, n, k, a, b, c, trans_b=trans_b, nsplit=f)
            times[f] = min(time_launches(dev, ln, warmup=3, runs=args.runs)
                           for _ in range(args.rounds))
            if f is None:
                rule = ln[0].gsize[2] if len(ln) == 2 else 1
        cells = [str(-(-m // t["TM"]) * -(-n // t["TN"])), f"{times[None]:.4f} (x{rule})"] + [
            f"{times[f]:.4f}" if f in times else "-" for f in factors]
        print_row(name, m, n, k, batch, trans_b, cells, times, times[None], args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
