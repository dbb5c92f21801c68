"""Where a training step spends its time, by layer type and by layer:
runs `caffe_ocl time`'s per-layer timing (queue drained around each layer)
on a shipped net fed by Input layers and prints the sums per type and the
slowest layers with their shapes. Guides kernel work (issue 7).

    python3 benchmarks/profile_layers.py --nets resnet50,vgg16 --batch 64
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import caffe_ocl  # noqa: E402
from caffe_ocl.timing import time_net  # noqa: E402
from common import fill_inputs, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def describe(net, li):
    layer = net.layers[li]
    bots = [tuple(b.shape) for b in net.graph.bottoms[li]]
    extra = ""
    if layer.type in ("Convolution", "Deconvolution"):
        cp = layer.param.convolution_param
        k = list(cp.kernel_size) or [cp.kernel_h, cp.kernel_w]
        s = list(cp.stride) or [1]
        extra = f" k{k} s{s} g{cp.group} out{cp.num_output}"
    return f"{layer.type}{extra} in{bots[:1]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    for name in a.nets.split(","):
        param = with_inputs(os.path.join(ROOT, "models", name, "train.prototxt"), a.batch,
                            (3, 224, 224))
        net = caffe_ocl.Net(param, caffe_ocl.TRAIN)
        fill_inputs(net, 1000)
        r = time_net(net, a.iters, out=lambda *_: None)
        fw, bw = r["forward"], r["backward"]
        by_type = collections.defaultdict(lambda: [0.0, 0.0])
        for li, layer in enumerate(net.layers):
            by_type[layer.type][0] += fw[li] / a.iters * 1e3
            by_type[layer.type][1] += bw[li] / a.iters * 1e3
        tf, tb = sum(v[0] for v in by_type.values()), sum(v[1] for v in by_type.values())
        print(f"\n## {name} batch {a.batch}: forward {tf:.1f} ms, backward {tb:.1f} ms "
              f"(layers timed one by one)")
        print("| type | forward ms | backward ms |\n|---|---|---|")
        for t, (f, b) in sorted(by_type.items(), key=lambda kv: -sum(kv[1])):
            print(f"| {t} | {f:.2f} | {b:.2f} |")
        order = sorted(range(len(net.layers)), key=lambda i: -(fw[i] + bw[i]))[:a.top]
        print("| layer | what | forward ms | backward ms |\n|---|---|---|---|")
        for li in order:
            print(f"| {net.graph.layer_names[li]} | {describe(net, li)} | "
                  f"{fw[li] / a.iters * 1e3:.2f} | {bw[li] / a.iters * 1e3:.2f} |")


if __name__ == "__main__":
    main()
