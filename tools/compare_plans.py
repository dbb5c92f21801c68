"""Run a prototxt (a real model from anywhere) with random weights through
the optimised TEST plan and through the plain one, at several batch sizes
in turn (the same net object reshaped, as a user's script does), and
compare: every output, and the input of a final Softmax (a random net's
softmax saturates to 0/1 and would compare equal whatever the logits).

    python tools/compare_plans.py deploy.prototxt [more.prototxt ...] [--batches 1,4,2]

The plain net is built in the same process with folding, Concat in place
and Winograd off (settings FOLD, CONCAT_IN_PLACE, WINOGRAD), so any
difference beyond float32 rounding (relative L2 over ~1e-5) is a planning
or kernel-choice bug on that model; a crash names the batch size it came
at. Weights: He-scaled normal for convolutions and inner products, BatchNorm
means ~N(0, 0.1) and variances 0.5 + |N(0, 1)|, Scale ~1 + N(0, 0.1).
Models with inputs the net cannot shape alone (Python layers, im_info) are
reported as errors, not skipped.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _fill(net, seed):
    rng = np.random.default_rng(seed)
    for name, params in net.params.items():
        kind = net.layer_dict[name].type
        for i, p in enumerate(params):
            shape = p.data.shape
            if kind == "BatchNorm":
                v = (rng.normal(0, 0.1, shape) if i == 0 else
                     0.5 + np.abs(rng.normal(0, 1, shape)) if i == 1 else np.ones(shape))
            elif kind == "Scale":
                v = 1 + rng.normal(0, 0.1, shape) if i == 0 else rng.normal(0, 0.1, shape)
            elif i == 0:
                fan_in = max(int(np.prod(shape[1:])), 1)
                v = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
            else:
                v = rng.normal(0, 0.01, shape)
            p.data[...] = v


def _compared_blobs(net):
    """The net's outputs, plus the bottom of each output-writing Softmax."""
    names = list(net.outputs)
    for li, layer in enumerate(net.layers):
        if layer.type == "Softmax":
            tops = net.top_names[net._layer_names[li]]
            if any(t in net.outputs for t in tops):
                names += net.bottom_names[net._layer_names[li]]
    return list(dict.fromkeys(names))


def _run(net, inputs):
    for name, x in inputs.items():
        net.blobs[name].reshape(*x.shape)
    net.reshape()
    for name, x in inputs.items():
        net.blobs[name].data[...] = x
    net.forward()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(path, batches, seed=0):
    """[(batch, blob, relative L2)] of the optimised net against the plain one."""
    import caffe
    from caffe_ocl import config
    fast = caffe.Net(path, caffe.TEST)
    with config.override(FOLD=False, CONCAT_IN_PLACE=False, WINOGRAD=False):
        plain = caffe.Net(path, caffe.TEST)
    _fill(fast, seed)
    _fill(plain, seed)
    rng = np.random.default_rng(seed + 1)
    out = []
    for b in batches:
        inputs = {}
        for name in fast.inputs:
            shape = (b,) + tuple(fast.blobs[name].data.shape[1:])
            inputs[name] = rng.standard_normal(shape).astype(np.float32)
        _run(fast, inputs)
        with config.override(FOLD=False, CONCAT_IN_PLACE=False, WINOGRAD=False):
            _run(plain, inputs)     # the algorithms are chosen when launches are built
        for name in _compared_blobs(fast):
            out.append((b, name, _rel(fast.blobs[name].data, plain.blobs[name].data)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prototxt", nargs="+")
    ap.add_argument("--batches", default="1,4,2")
    ap.add_argument("--tol", type=float, default=1e-5, help="relative L2 reported as a mismatch")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    bad = 0
    for path in a.prototxt:
        try:
            rows = compare(path, batches)
        except Exception as e:          # report and go on: one broken model is one line
            print(f"{path}: ERROR {type(e).__name__}: {e}")
            bad += 1
            continue
        worst = max(r for _, _, r in rows)
        status = "ok" if worst <= a.tol else "MISMATCH"
        bad += status != "ok"
        detail = ", ".join(f"b{b} {n} {r:.1e}" for b, n, r in rows)
        print(f"{path}: {status} (worst {worst:.1e}; {detail})", flush=True)
        _release_memory()
    return 1 if bad else 0


def _release_memory():
    """Give the finished model's device buffers back to the driver: the
    buffer pool keeps freed blocks for reuse, and blocks of one model's
    sizes piled up over a list of them (17 GB after 13 models on PoCL,
    where device memory is the host's)."""
    import gc
    from caffe_ocl.device import get_device
    gc.collect()
    get_device().allocator.free_held()


if __name__ == "__main__":
    sys.exit(main())
