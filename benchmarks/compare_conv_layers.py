"""Per-convolution comparison against PyTorch: the per-layer times of a
real caffe_ocl step (profile_kernels.py --by-layer --json F) beside
PyTorch + cuDNN timing each convolution shape alone (forward; forward +
both gradients minus forward), same device, ms per layer.

    CAFFE_OCL_TF32=1 python3 benchmarks/profile_kernels.py --nets resnet50 \
        --by-layer --json r50.json
    python3 benchmarks/compare_conv_layers.py r50.json [--tf32]

PyTorch's column includes its NCHW <-> NHWC transposes (cuDNN's Hopper
kernels work in NHWC); ours includes any activation fused into the
convolution. Our first convolution computes no data gradient (nor does
PyTorch's here: its input needs none)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import cuda_ms as t  # noqa: E402

tf32 = "--tf32" in sys.argv
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = tf32
torch.backends.cudnn.allow_tf32 = tf32
rows = json.load(open(sys.argv[1]))
print("| layer | shape | ours fwd | torch fwd | ours bwd | torch bwd | ours-torch ms |")
print("|---|---|---|---|---|---|---|")
tot = [0.0] * 4
diffs = []
seen = {}
for r in rows:
    c = r["conv"]
    if not c:
        continue
    key = tuple(c[k] for k in ("num", "c", "h", "w", "co", "kh", "kw", "sh", "sw", "ph", "pw", "groups"))
    if key not in seen:
        conv = torch.nn.Conv2d(c["c"], c["co"], (c["kh"], c["kw"]), (c["sh"], c["sw"]),
                               (c["ph"], c["pw"]), groups=c["groups"], bias=False).cuda()
        x = torch.randn(c["num"], c["c"], c["h"], c["w"], device="cuda",
                        requires_grad=c["c"] != 3)
        y = conv(x); g = torch.randn_like(y)
        f = t(lambda: conv(x))
        ins = ([x] if x.requires_grad else []) + [conv.weight]
        fb = t(lambda: torch.autograd.grad(conv(x), ins, g))
        seen[key] = (f, fb - f)
        del x, y, g, conv
    f, b = seen[key]
    d = r["fwd_ms"] + r["bwd_ms"] - f - b
    diffs.append((d, r["name"]))
    tot = [tot[0] + r["fwd_ms"], tot[1] + f, tot[2] + r["bwd_ms"], tot[3] + b]
    shape = f"{c['c']},{c['h']},{c['w']}->{c['co']} {c['kh']}x{c['kw']}/{c['sh']}"
    print(f"| {r['name']} | {shape} | {r['fwd_ms']:.3f} | {f:.3f} | {r['bwd_ms']:.3f} | {b:.3f} | {d:+.3f} |")
print(f"| total | | {tot[0]:.2f} | {tot[1]:.2f} | {tot[2]:.2f} | {tot[3]:.2f} | {tot[0]+tot[2]-tot[1]-tot[3]:+.2f} |")
