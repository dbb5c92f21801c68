"""Upsampling as onnx2caffe converts it (nearest or bilinear x2: a grouped
Deconvolution, bilinear with its edge-repeating Slice + Concat), timed
through the converted net against a reference in the same run,
interleaved: ONNX Runtime (2 threads) on the CPU device, PyTorch eager on
a GPU. For nearest also the Deconvolution through the general
backward-data kernel instead of the one-tap-a-pixel one
(``depthwise.BWD_DATA_TILE`` off: ``rows``, dw_bwd_data_rows, on the CPU;
``general``, dw_bwd_data, on a GPU); on the CPU also the older scatter
kernel (both off) as a further caffe_ocl column.

    python3 benchmarks/bench_resize.py [--device cpu|gpu] [--shapes 1x64x56x56,4x32x112x112]

Prints per mode and shape the medians (ms) and reference / ours; the
largest difference to PyTorch's own result is checked first. On the CPU
ours is ``net.forward()`` (the output read into host memory, as ONNX
Runtime returns it), on a GPU the forward left on the device, as eager.
"""
import argparse
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def model(mode):
    import torch
    F = torch.nn.functional

    class Up(torch.nn.Module):
        def forward(self, x):
            extra = {} if mode == "nearest" else {"align_corners": False}
            return F.interpolate(torch.relu(x), scale_factor=2.0, mode=mode, **extra)
    return Up().eval()


def interleave(fns, rounds, runs):
    res = {k: [] for k in fns}
    for r in range(rounds):
        for k, fn in (list(fns.items()) if r % 2 else list(fns.items())[::-1]):
            time.sleep(0.05)
            fn()
            t = time.perf_counter()
            for _ in range(runs):
                fn()
            res[k].append((time.perf_counter() - t) / runs * 1e3)
    return {k: statistics.median(v) for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--shapes", default="1x64x56x56,1x256x28x28,4x32x112x112,1x21x64x64")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    import onnx
    import torch

    import caffe_ocl
    from caffe_ocl.onnx import check, to_caffe
    from caffe_ocl.ops import depthwise as dw_ops
    caffe_ocl.set_mode_cpu() if a.device == "cpu" else caffe_ocl.set_mode_gpu()
    dev = caffe_ocl.get_device()
    print(f"# {dev.name}")
    for mode in ("nearest", "bilinear"):
        for text in a.shapes.split(","):
            shape = tuple(int(v) for v in text.split("x"))
            x = torch.randn(*shape)
            m = model(mode)
            buf = io.BytesIO()
            torch.onnx.export(m, x, buf, opset_version=13, dynamo=False)
            converted = to_caffe.convert(onnx.load_from_string(buf.getvalue()))
            ref = m(x).numpy()
            fns = {}
            untiled = "rows" if a.device == "cpu" else "general"
            for name, tile, rows in (("ours", True, True), (untiled, False, True),
                                     ("scatter", False, False)):
                if (a.device == "gpu" and not rows) or (mode != "nearest" and name == untiled):
                    continue            # (bilinear's kernel 4, stride 2, pad 1 never tiles)
                # read when the launches are built
                dw_ops.BWD_DATA_TILE, dw_ops.BWD_DATA_ROWS = tile, rows
                net = check.caffe_net(converted)
                net.blobs[net.inputs[0]].data[...] = x.numpy()
                got = net.forward()[net.outputs[0]]
                err = float(np.abs(got - ref).max())
                assert err <= 1e-5 * max(1.0, float(np.abs(ref).max())), (mode, text, err)
                last = len(net.layers) - 1
                if a.device == "cpu":       # the result in host memory, as ORT returns it
                    fns[name] = lambda net=net: net.forward()
                else:                       # left on the device, as eager leaves it
                    fns[name] = lambda net=net, last=last: (net.forward_from_to(0, last),
                                                            dev.finish())
            dw_ops.BWD_DATA_TILE, dw_ops.BWD_DATA_ROWS = True, True
            if a.device == "cpu":
                import onnxruntime as ort
                so = ort.SessionOptions()
                so.intra_op_num_threads = os.cpu_count()
                sess = ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])
                feed = {sess.get_inputs()[0].name: x.numpy()}
                fns["ort"] = lambda: sess.run(None, feed)
                refname = "ort"
            else:
                xc = x.cuda()
                mc = m.cuda()

                def eager():
                    with torch.no_grad():
                        mc(xc)
                    torch.cuda.synchronize()
                fns["eager"] = eager
                refname = "eager"
            med = interleave(fns, a.rounds, a.runs)
            line = " ".join(f"{k} {v:.3f} ms" for k, v in med.items())
            ratios = f"{refname}/ours {med[refname] / med['ours']:.2f}"
            for k in (untiled, "scatter"):
                if k in med:
                    ratios += f", {k}/ours {med[k] / med['ours']:.2f}"
            print(f"{mode} {text}: {line}; {ratios}; max diff {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
