"""Compatibility with a real model written by BVLC Caffe: the legacy V1
CIFAR-10 quick caffemodel (models/cifar10_quick) and the V1 prototxt that
came with it (tests/proto/cifar10_quick_v1_prediction_example.prototxt)."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.proto import caffe_pb2, read_net_prototxt
from conftest import ROOT

MEAN_BGR = np.array([113.9, 123.0, 125.3], np.float32).reshape(3, 1, 1)
EXPECTED = {"cat10.png": (3, 0.388), "dog10.png": (5, 0.997), "truck10.png": (9, 1.000)}


def _image(path):
    import cv2
    return cv2.imread(str(path)).astype(np.float32).transpose(2, 0, 1) - MEAN_BGR


V1_PROTOTXT = ROOT / "tests" / "proto" / "cifar10_quick_v1_prediction_example.prototxt"


def _v1_deploy():
    """The V1 prototxt with its IMAGE_DATA layer replaced by a 1x3x32x32 input."""
    src = V1_PROTOTXT
    net = read_net_prototxt(str(src))          # upgraded from V1
    assert net.layer[0].type == "ImageData"
    assert net.layer[1].type == "Convolution" and net.layer[1].param[1].lr_mult == 2
    out = caffe_pb2.NetParameter()
    out.name = net.name
    inp = out.layer.add()
    inp.name, inp.type = "data", "Input"
    inp.top.append("data")
    inp.input_param.shape.add().dim.extend([1, 3, 32, 32])
    for lp in net.layer[1:]:
        if lp.type in ("Accuracy", "SoftmaxWithLoss", "ArgMax"):
            continue
        out.layer.add().CopyFrom(lp)
    assert out.layer[-1].type == "Softmax" and out.layer[-1].top[0] == "prob"
    return out


def test_v1_model_classifies_its_images():
    d = ROOT / "models" / "cifar10_quick"
    param = _v1_deploy()
    net = caffe.Net(param, caffe.TEST, weights=str(d / "cifar10_quick_iter_5000.caffemodel"))
    # V1 ip weights are stored as 1x1xMxN; they load into MxN
    assert net.params["ip1"][0].shape == (64, 1024)
    for name, (cls, p) in EXPECTED.items():
        prob = net.forward(data=_image(d / name)[None])["prob"][0]
        assert prob.argmax() == cls, name
        assert prob.max() == pytest.approx(p, abs=2e-3), name


def test_shipped_copy_and_deploy_prototxt_match():
    d = ROOT / "models" / "cifar10_quick"
    net = caffe.Net(str(d / "cifar10_quick.prototxt"), str(d / "cifar10_quick_iter_5000.caffemodel"),
                    caffe.TEST)
    batch = np.stack([_image(d / n) for n in EXPECTED])
    net.blobs["data"].reshape(*batch.shape)
    prob = net.forward(data=batch)["prob"]
    assert [int(c) for c in prob.argmax(1)] == [c for c, _ in EXPECTED.values()]


def test_against_opencv_caffe_importer():
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2, "dnn") or not hasattr(cv2.dnn, "readNetFromCaffe"):
        pytest.skip("this OpenCV has no Caffe importer (OpenCV 5 removed it; the [compare] "
                    "extra installs opencv<5)")
    d = ROOT / "models" / "cifar10_quick"
    ref = cv2.dnn.readNetFromCaffe(str(d / "cifar10_quick.prototxt"),
                                   str(d / "cifar10_quick_iter_5000.caffemodel"))
    net = caffe.Net(str(d / "cifar10_quick.prototxt"), str(d / "cifar10_quick_iter_5000.caffemodel"),
                    caffe.TEST)
    for name in EXPECTED:
        x = _image(d / name)[None]
        ref.setInput(x)
        want = ref.forward("ip2")
        got = net.forward(data=x, blobs=["ip2"])["ip2"]
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_classify_command_default(capsys):
    from caffe_ocl.commands import main
    assert main(["classify"]) == 0
    out = capsys.readouterr().out
    assert "0.9971  dog" in out and "cat" in out and "truck" in out
