"""The model definitions shipped in models/: deploy nets build at their
declared shapes and run forward (at a small input where the architecture
allows it), train nets build in TRAIN and run one forward+backward, and the
generated files match tools/make_models.py."""
import importlib.util

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.proto import read_net_prototxt

from conftest import ROOT

MODELS = ROOT / "models"

# name -> (expected shapes of some blobs in the deploy net at its declared
#          size, forward input size (None: shapes only), forward batch)
DEPLOY = {
    "alexnet": ({"data": (10, 3, 227, 227), "pool5": (10, 256, 6, 6), "fc6": (10, 4096),
                 "prob": (10, 1000)}, 227, 1),
    "vgg16": ({"data": (1, 3, 224, 224), "pool5": (1, 512, 7, 7), "fc6": (1, 4096),
               "prob": (1, 1000)}, None, None),
    "googlenet": ({"data": (1, 3, 224, 224), "inception_3a/output": (1, 256, 28, 28),
                   "inception_4e/output": (1, 832, 14, 14),
                   "inception_5b/output": (1, 1024, 7, 7),
                   "pool5/7x7_s1": (1, 1024, 1, 1), "prob": (1, 1000)}, 224, 1),
    "resnet18": ({"data": (1, 3, 224, 224), "res2b": (1, 64, 56, 56),
                  "res5b": (1, 512, 7, 7), "pool5": (1, 512, 1, 1), "prob": (1, 1000)}, 64, 2),
    "resnet50": ({"data": (1, 3, 224, 224), "res2c": (1, 256, 56, 56),
                  "res4f": (1, 1024, 14, 14), "res5c": (1, 2048, 7, 7),
                  "prob": (1, 1000)}, 48, 1),
    "squeezenet1_1": ({"data": (1, 3, 224, 224), "fire2/concat": (1, 128, 55, 55),
                       "fire9/concat": (1, 512, 13, 13), "pool10": (1, 1000, 1, 1),
                       "prob": (1, 1000, 1, 1)}, 64, 2),
    "mobilenet_v2": ({"data": (1, 3, 224, 224), "conv2_1/linear": (1, 16, 112, 112),
                      "block3_2": (1, 24, 56, 56), "conv8_1/linear": (1, 320, 7, 7),
                      "pool9": (1, 1280, 1, 1), "prob": (1, 1000)}, 64, 2),
}

# learnable parameter counts (BatchNorm statistics excluded) as published
PARAMS = {"alexnet": 60965224, "vgg16": 138357544, "googlenet": 6998552,
          "resnet18": 11689512, "resnet50": 25557032, "squeezenet1_1": 1235496,
          "mobilenet_v2": 3504872}

# name -> (train input size, batch) for the forward+backward check
TRAIN = {"alexnet": (67, 2), "vgg16": (32, 2), "googlenet": (224, 1), "resnet18": (32, 2),
         "resnet50": (32, 2), "squeezenet1_1": (48, 2), "mobilenet_v2": (32, 2)}
SLOW_TRAIN = {"googlenet", "resnet50", "mobilenet_v2"}


def _make_models():
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "tools" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _set_inputs(param, size=None, batch=None):
    for lp in param.layer:
        if lp.type != "Input":
            continue
        for shape in lp.input_param.shape:
            if batch is not None:
                shape.dim[0] = batch
            if size is not None and len(shape.dim) == 4:
                shape.dim[2] = shape.dim[3] = size
    return param


def _sane_batchnorm(net, rng):
    """Fresh BatchNorm statistics are all zero (x / sqrt(eps) at TEST); give
    them a plausible mean/variance so deep nets stay in float range."""
    for layer in net.layers:
        if layer.type == "BatchNorm":
            mean, var, factor = layer.blobs
            mean.data[...] = rng.normal(0, 0.1, mean.shape)
            var.data[...] = rng.uniform(0.5, 1.5, var.shape)
            factor.data[...] = 1


def _learnable_count(net):
    return sum(b.count for layer in net.layers if layer.type != "BatchNorm"
               for b in layer.blobs)


@pytest.mark.parametrize("name", sorted(DEPLOY))
def test_deploy_builds_and_runs(name, rng):
    shapes, size, batch = DEPLOY[name]
    net = caffe.Net(str(MODELS / name / "deploy.prototxt"), caffe.TEST)
    for blob, shape in shapes.items():
        assert net.blobs[blob].shape == shape, blob
    assert net.inputs == ["data"] and net.outputs == ["prob"]
    assert _learnable_count(net) == PARAMS[name]
    if size is None:
        return                                  # VGG-16: shapes only (15 GFLOP forward)
    _sane_batchnorm(net, rng)
    net.blobs["data"].reshape(batch, 3, size, size)
    net.reshape()
    x = rng.uniform(-1, 1, (batch, 3, size, size)).astype(np.float32)
    prob = net.forward(data=x)["prob"].copy()
    prob = prob.reshape(batch, -1)
    assert prob.shape == (batch, 1000)
    assert np.all(np.isfinite(prob)) and np.all(prob >= 0)
    np.testing.assert_allclose(prob.sum(1), 1, rtol=1e-4)
    if batch > 1:   # different images, different outputs (the logits: with random
        # weights the softmax may saturate to the same one-hot row for both)
        logits = net.blobs[net.bottom_names[net.graph.layer_names[-1]][0]].data.reshape(batch, -1)
        assert not np.allclose(logits[0], logits[1])
    again = net.forward(data=x)["prob"].reshape(batch, -1)   # TEST: no dropout noise
    np.testing.assert_allclose(again, prob, rtol=1e-5, atol=1e-7)


def _without(param, drop):
    return [lp for lp in param.layer if not drop(lp)]


@pytest.mark.parametrize("name", sorted(DEPLOY))
def test_train_matches_deploy(name):
    train = read_net_prototxt(str(MODELS / name / "train.prototxt"))
    deploy = read_net_prototxt(str(MODELS / name / "deploy.prototxt"))
    ins = {lp.top[0]: tuple(lp.input_param.shape[0].dim) for lp in train.layer
           if lp.type == "Input"}
    assert ins == {"data": (64, 3, 224, 224), "label": (64,)}
    losses = [lp for lp in train.layer if lp.type == "SoftmaxWithLoss"]
    main = [lp for lp in losses if lp.name == "loss"]
    assert len(main) == 1 and list(main[0].bottom)[1] == "label"
    prob = [lp for lp in deploy.layer if lp.type == "Softmax"]
    assert [lp.name for lp in prob] == ["prob"]
    assert list(main[0].bottom)[0] == prob[0].bottom[0]      # same scores

    def aux(lp):
        return lp.name.startswith(("loss1/", "loss2/"))
    body_t = _without(train, lambda lp: lp.type in ("Input", "SoftmaxWithLoss") or aux(lp))
    body_d = _without(deploy, lambda lp: lp.type in ("Input", "Softmax"))
    assert len(body_t) == len(body_d)
    for lt, ld in zip(body_t, body_d):
        assert lt == ld, (lt.name, ld.name)
    if name == "googlenet":                   # BVLC's two auxiliary classifiers
        assert sorted(lp.name for lp in losses) == ["loss", "loss1/loss", "loss2/loss"]
        assert all(lp.loss_weight[0] == pytest.approx(0.3) for lp in losses if aux(lp))


@pytest.mark.parametrize("name", sorted(DEPLOY))
def test_generated_files_are_current(name):
    mm = _make_models()
    forms = [True] if name in mm.TRAIN_ONLY else [False, True]
    for train in forms:
        path = MODELS / name / ("train.prototxt" if train else "deploy.prototxt")
        assert path.read_text() == mm.render(name, train), \
            f"{path} is stale: run python tools/make_models.py"
        assert path.read_text().startswith("# ")            # names the paper
    if "mobilenet_v2" == name:
        text = (MODELS / name / "deploy.prototxt").read_text()
        assert 'type: "ReLU6"' in text and 'group: 144' in text


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n in SLOW_TRAIN else n for n in sorted(TRAIN)])
def test_train_forward_backward(name, rng):
    size, batch = TRAIN[name]
    param = _set_inputs(read_net_prototxt(str(MODELS / name / "train.prototxt")), size, batch)
    net = caffe.Net(param, caffe.TRAIN)
    assert net.inputs == ["data", "label"]
    net.blobs["data"].data[...] = rng.uniform(-1, 1, net.blobs["data"].shape)
    net.blobs["label"].data[...] = rng.integers(0, 1000, batch)
    net.forward()
    loss = float(net.blobs["loss"].data)
    assert np.isfinite(loss) and loss > 0
    net.clear_param_diffs()
    net.backward()
    first = next(layer for layer in net.layers if layer.blobs)
    g = first.blobs[0].diff
    assert np.all(np.isfinite(g)) and np.any(g != 0)
    for layer in net.layers:
        for b in layer.blobs:
            assert np.all(np.isfinite(b.diff)), layer.name
    if any(layer.type == "BatchNorm" for layer in net.layers):
        bn = next(layer for layer in net.layers if layer.type == "BatchNorm")
        assert float(bn.blobs[2].data[0]) > 0        # TRAIN: running statistics updated
