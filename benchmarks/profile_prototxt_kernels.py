"""Where a Caffe prototxt's forward spends its device time, kernel by
kernel, on whatever device caffe_ocl picks (issue #27: real published
models, not only our own or converted nets). Seeded random weights (as
bench_caffe_opencv.py), one input shape per net, profiling events around
every launch of a forward; prints per net the forward's wall time through
``net.forward()``, the kernels' summed device time, the device time of a
forward released at once behind a gate (kernels plus the gaps between
them), the launch count, the time per layer type, and the costliest
kernels with their layer, global size and effective GB/s (the layer's
bottoms, tops and weights read / written once: a kernel far below the device's
memory rate on a light layer is a slow path to look at).

    CAFFE_OCL_PROFILE=1 python3 benchmarks/profile_prototxt_kernels.py NET.prototxt [...]
        [--batch N] [--size H,W] [--top 10] [--torch]

``--torch`` (a CUDA machine): every Convolution layer's kernels beside
cuDNN's time for the same geometry alone (F.conv2d with bias, benchmark
mode), the net's sum and the layers furthest behind.

Without CAFFE_OCL_PROFILE the queue has no profiling and only the wall
and gated times are printed.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench_caffe_opencv import _build, _random_weights, _time_ours, net_arguments  # noqa: E402
from profile_zoo_kernels import gated_ms, profile, step_launches  # noqa: E402


def layer_bytes(net):
    """{layer name: bytes of its bottoms, tops and parameters} (float32,
    each once)."""
    out = {}
    for li, name in enumerate(net.graph.layer_names):
        blobs = (list(net.graph.bottoms[li]) + list(net.graph.tops[li])
                 + list(net.params.get(name, ())))
        out[name] = 4 * sum(b.count for b in blobs)
    return out


def run_one(proto, args):
    net = _build(proto, None, args.batch, {}, args.size)
    _random_weights(net)
    name = net.inputs[0]
    x = np.random.default_rng(2).normal(0, 1, net.blobs[name].shape).astype(np.float32)
    net.blobs[name].data[...] = x
    wall = min(_time_ours(net, args.runs) for _ in range(args.rounds))
    launches = step_launches(net)
    gated = gated_ms(net, args.iters)
    print(f"\n## {os.path.basename(proto)} input {'x'.join(map(str, x.shape))}: "
          f"forward {wall:.3f} ms, gated {gated:.3f} ms, {len(launches)} launches")
    if not net.layers[0].device.profiling:
        return
    rows = profile(net, args.iters)
    total = sum(r[0] for r in rows)
    types = {n: net.layers[i].type for i, n in enumerate(net.graph.layer_names)}
    by_type = collections.defaultdict(float)
    for us, lab, _ in rows:
        by_type[types.get(lab, "?")] += us
    print(f"kernels {total / 1e3:.3f} ms; by layer type: " + ", ".join(
        f"{t} {us / 1e3:.3f}" for t, us in sorted(by_type.items(), key=lambda kv: -kv[1])))
    nbytes = layer_bytes(net)
    for us, lab, ln in sorted(rows, key=lambda r: -r[0])[:args.top]:
        gbs = nbytes.get(lab, 0) / (us * 1e-6) / 1e9 if us > 0 else 0.0
        print(f"{us:9.1f} us {lab[:30]:30s} {types.get(lab, '?')[:14]:14s} "
              f"{ln.kernel.function_name[:26]:26s} g{tuple(ln.gsize)} {gbs:7.1f} GB/s")
    if args.torch:
        compare_convolutions(net, rows, args.top)


def compare_convolutions(net, rows, top):
    """Each Convolution layer's kernels (all launches labelled with it: a
    K split's reduction, a folded BatchNorm's epilogue included) beside
    PyTorch's F.conv2d of the same geometry timed alone (cuDNN, benchmark
    mode, bias; CUDA events), us; the worst layers by the difference."""
    import torch
    from common import cuda_ms
    torch.backends.cudnn.benchmark = True
    ours = collections.defaultdict(float)
    for us, lab, _ in rows:
        ours[lab] += us
    seen, out = {}, []
    for li, name in enumerate(net.graph.layer_names):
        layer = net.layers[li]
        g = getattr(layer, "geom", None)
        if layer.type != "Convolution" or g is None or name not in ours:
            continue
        key = (g.num, g.channels, g.height, g.width, g.out_channels, g.kh, g.kw, g.sh, g.sw,
               g.ph, g.pw, g.dh, g.dw, g.groups)
        if key not in seen:
            x = torch.randn(g.num, g.channels, g.height, g.width, device="cuda")
            w = torch.randn(g.out_channels, g.channels // g.groups, g.kh, g.kw, device="cuda")
            b = torch.randn(g.out_channels, device="cuda")
            f = torch.nn.functional.conv2d
            with torch.no_grad():
                seen[key] = 1e3 * cuda_ms(lambda: f(x, w, b, (g.sh, g.sw), (g.ph, g.pw),
                                                    (g.dh, g.dw), g.groups))
        out.append((ours[name], seen[key], name, g))
    if not out:
        return
    t_ours, t_torch = sum(r[0] for r in out), sum(r[1] for r in out)
    print(f"convolutions: ours {t_ours / 1e3:.3f} ms, cuDNN alone {t_torch / 1e3:.3f} ms "
          f"(cuDNN / ours {t_torch / t_ours:.2f}) over {len(out)} layers; worst by us behind:")
    for o, t, name, g in sorted(out, key=lambda r: r[1] - r[0])[:top]:
        print(f"  {name[:28]:28s} {g.channels}x{g.height}x{g.width}->{g.out_channels} "
              f"{g.kh}x{g.kw}/{g.sh} d{g.dh} grp{g.groups}: ours {o:8.1f} us, cuDNN {t:8.1f} us "
              f"({t / o:.2f})")


def main(argv=None):
    ap = net_arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--torch", action="store_true",
                    help="also each convolution's geometry through PyTorch's cuDNN (GPU)")
    args = ap.parse_args(argv)
    for p in args.prototxt:
        run_one(p, args)


if __name__ == "__main__":
    main()
