"""The CIFAR-10 quick net (the shipped train_test prototxt, its data layers
replaced by inputs) trains on random data without diverging: with a
learnable rule behind the labels the loss stays finite and falls."""
import numpy as np

import caffe_ocl as caffe
from caffe_ocl.proto import caffe_pb2, read_net_prototxt
from conftest import ROOT


def _input_fed(batch):
    src = read_net_prototxt(str(ROOT / "models/cifar10_quick/cifar10_quick_train_test.prototxt"))
    net = caffe_pb2.NetParameter()
    inp = net.layer.add()
    inp.name, inp.type = "input", "Input"
    inp.top.extend(["data", "label"])
    inp.input_param.shape.add().dim.extend([batch, 3, 32, 32])
    inp.input_param.shape.add().dim.extend([batch])
    for lp in src.layer:
        if lp.type not in ("Data", "Accuracy"):
            net.layer.add().CopyFrom(lp)
    return net


def test_cifar10_quick_trains_on_random_data():
    batch = 20
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(_input_fed(batch))
    sp.base_lr, sp.momentum, sp.weight_decay = 0.001, 0.9, 0.004   # Caffe's cifar10_quick settings
    sp.lr_policy, sp.display, sp.max_iter, sp.random_seed = "fixed", 0, 1000, 3
    sp.snapshot_after_train = False
    solver = caffe.SGDSolver(sp)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 3, 32, 32)).astype(np.float32) * 40
    # label = which of 10 fixed random directions the image is most like
    dirs = rng.standard_normal((10, 3 * 32 * 32))
    y = np.argmax(x.reshape(200, -1) @ dirs.T, axis=1).astype(np.float32)
    losses = []
    for it in range(40):
        i = (it * batch) % 200
        solver.net.blobs["data"].data[...] = x[i:i + batch]
        solver.net.blobs["label"].data[...] = y[i:i + batch]
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    # no divergence: finite, never far above the start, and going down
    assert np.all(np.isfinite(losses))
    assert max(losses) < losses[0] + 0.5
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert last < first - 0.02, (first, last)
