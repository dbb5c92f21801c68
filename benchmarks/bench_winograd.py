"""Winograd F(2x2, 3x3), F(4x4, 3x3) and F(2x2, 5x5) against the dense
convolution of the device (implicit GEMM on GPUs, im2col + GEMM on CPU
drivers) on the 3x3 stride-1 layers of VGG-16 and ResNet-50 and the 5x5
ones of AlexNet, GoogLeNet and Inception-v3: forward and backward-data,
milliseconds (device-synchronised, mean of --runs after --warmup), the
ratio dense / Winograd (> 1: Winograd faster), the cost model's estimate
(ops.winograd.estimated_speedup), what the automatic choice picks, and
the relative L2 error of Winograd's forward and backward-data against a
float64 reference on image 0. Backward-weight (dW += ...): dense vs
Winograd for the tiles of --wtiles (default F4), with the split-K count
and the relative L2 error of dW of image 0 alone (dense / Winograd,
against float64).

    source .gpu/prelude.sh && python3 benchmarks/bench_winograd.py      # GPU, batch 64
    python benchmarks/bench_winograd.py --small                           # CPU / PoCL

--small: batch 2, channels / 8, spatial / 4, 3 runs (a minute on PoCL).
5x5 layers have only F2 (F(2x2, 5x5)); their F4 columns read "-".
Output: a Markdown table to paste into BENCHMARKS.md.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from caffe_ocl.ops import winograd as wino_ops  # noqa: E402
from common import time_launches  # noqa: E402

LAYERS = [  # name, C, Co, H (= W)[, kernel side k]; stride 1, pad (k - 1) / 2
    ("vgg conv1_2", 64, 64, 224),
    ("vgg conv2_1", 64, 128, 112),
    ("vgg conv2_2", 128, 128, 112),
    ("vgg conv3_1", 128, 256, 56),
    ("vgg conv3_2", 256, 256, 56),
    ("vgg conv4_1", 256, 512, 28),
    ("vgg conv4_2", 512, 512, 28),
    ("vgg conv5_x", 512, 512, 14),
    ("resnet50 3x3 64", 64, 64, 56),
    ("resnet50 3x3 128", 128, 128, 28),
    ("resnet50 3x3 256", 256, 256, 14),
    ("resnet50 3x3 512", 512, 512, 7),
    ("densenet 3x3 128->32 56", 128, 32, 56),
    ("densenet 3x3 128->32 28", 128, 32, 28),
    ("googlenet 3x3 32->96", 32, 96, 28),
    ("alexnet (torchvision) conv2 5x5", 64, 192, 27, 5),
    ("googlenet inception_3b 5x5", 32, 96, 28, 5),
    ("googlenet inception_4e 5x5", 32, 128, 14, 5),
    ("inception-v3 mixed_5b 5x5", 48, 64, 35, 5),
]


def _ref_image0(x, w, dy, g):
    """float64 forward and backward-data of image 0 (im2col + matmul)."""
    from numpy.lib.stride_tricks import sliding_window_view as sw
    k = g.kh
    x0 = np.pad(x[0].astype(np.float64), ((0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    w64 = w.astype(np.float64).reshape(g.out_channels, -1)
    col = sw(x0, (k, k), axis=(1, 2)).transpose(0, 3, 4, 1, 2).reshape(g.channels * k * k, -1)
    y0 = (w64 @ col).reshape(g.out_channels, g.out_h, g.out_w)
    # dx = correlation of dy padded by k - 1 - pad with rot180(w), channels swapped
    p = k - 1 - g.ph
    dy0 = np.pad(dy[0].astype(np.float64), ((0, 0), (p, p), (p, p)))
    wt = w.astype(np.float64)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3).reshape(g.channels, -1)
    dcol = sw(dy0, (k, k), axis=(1, 2)).transpose(0, 3, 4, 1, 2).reshape(
        g.out_channels * k * k, -1)
    dx0 = (wt @ dcol).reshape(g.channels, g.height, g.width)
    return y0, dx0


def _ref_dw_image0(x, dy, g):
    """float64 weight gradient of image 0: dy[0] x im2col(x[0])^T."""
    from numpy.lib.stride_tricks import sliding_window_view as sw
    k = g.kh
    x0 = np.pad(x[0].astype(np.float64), ((0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    col = sw(x0, (k, k), axis=(1, 2)).transpose(0, 3, 4, 1, 2).reshape(g.channels * k * k, -1)
    dw = dy[0].astype(np.float64).reshape(g.out_channels, -1) @ col.T
    return dw.reshape(g.out_channels, g.channels, k, k)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized shapes (see docstring)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tiles", default="2,4", help="Winograd output tiles to time (2, 4)")
    ap.add_argument("--wtiles", default="4",
                    help="Winograd output tiles to time for backward-weight")
    ap.add_argument("--layers", default="", help="comma-separated substrings of layer names")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 accuracy check")
    a = ap.parse_args()
    batch = a.batch or (2 if a.small else 64)
    runs = a.runs or (3 if a.small else 20)
    tiles = [int(t) for t in a.tiles.split(",") if t]
    wtiles = [int(t) for t in a.wtiles.split(",") if t]
    dev = get_device()
    dense = "im2col" if dev.is_cpu else "igemm"
    rng = np.random.default_rng(0)
    print(f"device: {dev.name}; batch {batch}; mean of {runs} runs after {a.warmup} warm-up; "
          f"Winograd workspace cap {wino_ops.MAX_WS_FLOATS * 4 >> 20} MiB; "
          f"automatic choice: env {wino_ops.ENV}={os.environ.get(wino_ops.ENV, '(unset)')}, "
          f"tile {wino_ops.default_tile()}")
    print(f"ms (speedup = {dense} / Winograd); err = relative L2 vs float64 (image 0), "
          "forward / backward-data; model = ops.winograd.estimated_speedup")
    hdr = ["layer", "C->Co @ HxW", f"{dense} fwd"] + [f"F{t} fwd" for t in tiles] + \
        [f"{dense} bwd-data"] + [f"F{t} bwd-data" for t in tiles] + \
        [f"{dense} bwd-weight"] + [f"F{t} bwd-weight (nsplit)" for t in wtiles] + \
        [f"model F{t}" for t in tiles] + ["auto"] + [f"err F{t}" for t in tiles] + \
        [f"err dW {dense} / " + " / ".join(f"F{t}" for t in wtiles)]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    tot = {}
    wanted = [s for s in a.layers.split(",") if s]
    for name, c, co, hw, *kk in LAYERS:
        if wanted and not any(s in name for s in wanted):
            continue
        k = kk[0] if kk else 3
        if a.small:
            c, co, hw = max(c // 8, 4), max(co // 8, 4), max(hw // 4, 4)
        g = conv_ops.ConvGeometry(batch, c, hw, hw, co, k, k, k // 2, k // 2)
        ltiles = [t for t in tiles if t in wino_ops.KERNELS[k]]       # this kernel's tiles
        lwtiles = [t for t in wtiles if t in wino_ops.KERNELS[k]] or [wino_ops.KERNELS[k][0]]
        x = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
        np.maximum(x, 0, out=x)                                     # post-ReLU activations
        w = (rng.standard_normal((co, c, k, k)) * np.sqrt(2.0 / (k * k * c))).astype(np.float32)
        dy = (rng.standard_normal((batch, co, g.out_h, g.out_w)) * 1e-3).astype(np.float32)
        bufs = {}
        for key, arr in (("x", x), ("w", w), ("dy", dy)):
            bufs[key] = dev.alloc(arr.nbytes)
            dev.upload(bufs[key], arr)
        y, dx, dwt = dev.alloc(dy.nbytes), dev.alloc(x.nbytes), dev.alloc(w.nbytes)
        ws = conv_ops.workspace_floats(dev, g, dense)
        col = dev.alloc(4 * ws) if ws else None
        fwd = {dense: conv_ops.forward(dev, g, bufs["x"], bufs["w"], y, col, algo=dense)}
        bwd = {dense: conv_ops.backward_data(dev, g, bufs["dy"], bufs["w"], dx, col, algo=dense)}
        for t in ltiles:
            fwd[t] = wino_ops.forward(dev, g, bufs["x"], bufs["w"], y, tile=t)
            bwd[t] = wino_ops.backward_data(dev, g, bufs["dy"], bufs["w"], dx, tile=t)
        bww = {dense: conv_ops.backward_weight(dev, g, bufs["x"], bufs["dy"], dwt, col,
                                               algo=dense)}
        for t in lwtiles:
            bww[t] = wino_ops.backward_weight(dev, g, bufs["x"], bufs["dy"], dwt, tile=t)
        tf = {k: time_launches(dev, v, a.warmup, runs) for k, v in fwd.items()}
        tb = {k: time_launches(dev, v, a.warmup, runs) for k, v in bwd.items()}
        tw = {k: time_launches(dev, v, a.warmup, runs) for k, v in bww.items()}
        if k == 3:                      # totals over the 3x3 layers (both tiles timed)
            for key in tf:
                tot[("f", key)] = tot.get(("f", key), 0.0) + tf[key]
                tot[("b", key)] = tot.get(("b", key), 0.0) + tb[key]
            for key in tw:
                tot[("w", key)] = tot.get(("w", key), 0.0) + tw[key]
        nsp = {t: [ln.gsize[2] for ln in bww[t] if ln.name == "gemm"][0] //
               wino_ops._points(t, k) for t in lwtiles}
        errs = {t: "-" for t in tiles}
        if not a.no_check:
            y0, dx0 = _ref_image0(x, w, dy, g)
            yh = np.empty(dy.shape, np.float32)
            dxh = np.empty(x.shape, np.float32)
            for t in ltiles:
                for ln in fwd[t] + bwd[t]:
                    ln.run(dev.queue)
                dev.download(yh, y)
                dev.download(dxh, dx)
                errs[t] = f"{_rel(yh[0], y0):.1e} / {_rel(dxh[0], dx0):.1e}"
            # dW of image 0 alone: the same buffers (image 0 comes first), num = 1
            g0 = conv_ops.ConvGeometry(1, c, hw, hw, co, k, k, k // 2, k // 2)
            dw0 = _ref_dw_image0(x, dy, g)
            dwh = np.empty(w.shape, np.float32)
            werr = []
            for key in [dense] + lwtiles:
                dev.upload(dwt, np.zeros_like(w))
                col0 = dev.alloc(4 * max(conv_ops.workspace_floats(dev, g0, dense), 1))
                ls = (conv_ops.backward_weight(dev, g0, bufs["x"], bufs["dy"], dwt, col0,
                                               algo=dense) if key == dense else
                      wino_ops.backward_weight(dev, g0, bufs["x"], bufs["dy"], dwt, tile=key))
                for ln in ls:
                    ln.run(dev.queue)
                dev.download(dwh, dwt)
                werr.append(f"{_rel(dwh, dw0):.1e}")
            errs["w"] = " / ".join(werr)
        row = [name, f"{c}->{co} @ {hw}x{hw}", f"{tf[dense]:.3f}"]
        row += [f"{tf[t]:.3f} ({tf[dense] / tf[t]:.2f}x)" if t in tf else "-" for t in tiles]
        row += [f"{tb[dense]:.3f}"]
        row += [f"{tb[t]:.3f} ({tb[dense] / tb[t]:.2f}x)" if t in tb else "-" for t in tiles]
        row += [f"{tw[dense]:.3f}"]
        row += [f"{tw[t]:.3f} ({tw[dense] / tw[t]:.2f}x, {nsp[t]})" if t in tw else "-"
                for t in wtiles]
        row += [f"{wino_ops.estimated_speedup(g, t, wino_ops.model_tf32(dev)):.2f}"
                if t in ltiles else "-"
                for t in tiles]
        row += [conv_ops.algorithm(dev, g)] + [errs[t] for t in tiles] + [errs.get("w", "-")]
        print("| " + " | ".join(row) + " |", flush=True)
        del fwd, bwd, bww, bufs, y, dx, dwt, col
    if tot:
        row = ["**total**", "", f"{tot[('f', dense)]:.2f}"]
        row += [f"{tot[('f', t)]:.2f} ({tot[('f', dense)] / tot[('f', t)]:.2f}x)" for t in tiles]
        row += [f"{tot[('b', dense)]:.2f}"]
        row += [f"{tot[('b', t)]:.2f} ({tot[('b', dense)] / tot[('b', t)]:.2f}x)" for t in tiles]
        row += [f"{tot[('w', dense)]:.2f}"]
        row += [f"{tot[('w', t)]:.2f} ({tot[('w', dense)] / tot[('w', t)]:.2f}x)" for t in wtiles]
        row += [""] * (2 * len(tiles) + 2)
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
