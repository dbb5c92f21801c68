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


# ---- real published prototxts with random weights against OpenCV ----------
# tests/data/real_models holds a few MIT-licensed deploy prototxts (NOTICE.md
# there names their sources); each gets seeded random weights, is saved as a
# caffemodel and loaded by OpenCV 4's Caffe importer, and every blob OpenCV
# can name is compared on the same input.
REAL = ROOT / "tests" / "data" / "real_models"


def _random_weights(net, rng):
    """He-style weights (the prototxts' own fillers leave most of them 0),
    positive variances for BatchNorm, scale factor 1."""
    for name, blobs in net.params.items():
        kind = net.layer_dict[name].type
        for i, b in enumerate(blobs):
            shape = b.data.shape
            if kind == "BatchNorm":
                b.data[...] = (rng.normal(0, 0.1, shape), rng.uniform(0.5, 1.5, shape), 1.0)[i]
            elif i == 0 and len(shape) >= 2:
                b.data[...] = rng.normal(0, 1 / np.sqrt(np.prod(shape[1:])), shape)
            elif kind in ("Scale", "PReLU") and i == 0:
                b.data[...] = rng.uniform(0.5, 1.5, shape)
            else:
                b.data[...] = rng.normal(0, 0.1, shape)


def _feed(net, rng):
    feed = {}
    for name in net.inputs:
        shape = net.blobs[name].shape
        if name == "rois":             # Fast R-CNN: [batch index, x1, y1, x2, y2]
            h, w = net.blobs["data"].shape[2:]
            x1, y1 = rng.uniform(0, 0.6 * w, shape[0]), rng.uniform(0, 0.6 * h, shape[0])
            feed[name] = np.stack([np.zeros(shape[0]), x1, y1,
                                   x1 + rng.uniform(4, 0.4 * w, shape[0]),
                                   y1 + rng.uniform(4, 0.4 * h, shape[0])], 1).astype(np.float32)
        else:
            feed[name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return feed


def _compare_with_opencv(cv2, proto, tmp_path, shapes, atol=2e-5):
    caffe.set_random_seed(0)
    net = caffe.Net(str(proto), caffe.TEST)
    for name, shape in shapes.items():
        net.blobs[name].reshape(*shape)
    net.reshape()
    _random_weights(net, np.random.default_rng(0))
    model = tmp_path / "random.caffemodel"
    net.save(str(model))
    feed = _feed(net, np.random.default_rng(1))
    net.forward(**feed)
    ref = cv2.dnn.readNetFromCaffe(str(proto), str(model))
    ref.enableFusion(False)
    for name, x in feed.items():
        ref.setInput(x, name)
    # the last layer writing each blob (in-place layers included); a layer's
    # first top only (OpenCV's forward names layers)
    last = {}
    for lname, tops in net.top_names.items():
        if tops:
            last[tops[0]] = lname
    known = set(ref.getLayerNames())
    blobs = [b for b, l in last.items() if l in known and b not in feed]
    assert len(blobs) > 3
    compared = 0
    for blob, theirs in zip(blobs, ref.forward([last[b] for b in blobs])):
        ours = net.blobs[blob].data
        if net.layer_dict[last[blob]].type == "DetectionOutput":
            rows = ours.reshape(-1, 7)
            rows = rows[rows[:, 1] >= 0]
            want = theirs.reshape(-1, 7)
            want = want[np.abs(want).max(1) > 0]
            assert len(rows) == len(want), blob
            continue
        assert ours.size == theirs.size, (blob, ours.shape, theirs.shape)
        scale = max(1.0, float(np.abs(theirs).max()))
        np.testing.assert_allclose(ours, theirs.reshape(ours.shape), rtol=0, atol=atol * scale,
                                   err_msg=f"{proto.name}: blob {blob!r}")
        compared += 1
    return net, compared


@pytest.mark.parametrize("name,shapes", [
    ("mtcnn_det1", {"data": (1, 3, 24, 30)}),      # PReLU, a fully convolutional P-Net
    ("mtcnn_det2", {}),
    ("mtcnn_det3", {}),
    ("zf_fast_rcnn_test", {"data": (1, 3, 96, 128), "rois": (6, 5)}),   # ROIPooling
])
def test_real_prototxt_matches_opencv(name, shapes, tmp_path):
    from conftest import opencv_with_caffe_importer
    cv2 = opencv_with_caffe_importer()
    _, compared = _compare_with_opencv(cv2, REAL / f"{name}.prototxt", tmp_path, shapes)
    assert compared > 3


@pytest.mark.slow
def test_real_mobilenet_ssd_matches_opencv(tmp_path):
    """chuanqi305's MobileNet-SSD (grouped depthwise convolutions, SSD's
    Permute/PriorBox/DetectionOutput) at its 300x300 input."""
    from conftest import opencv_with_caffe_importer
    cv2 = opencv_with_caffe_importer()
    net, compared = _compare_with_opencv(cv2, REAL / "MobileNetSSD_deploy.prototxt", tmp_path,
                                         {})
    assert compared > 50
    assert net.blobs["mbox_priorbox"].shape == (1, 2, 1917 * 4)
