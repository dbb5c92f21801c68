"""Dropout's fork fields: ``scale_train`` (Fast R-CNN's fork and OpenCV's
caffe.proto, field 2) and ``sample_weights_test`` (SegNet/ENet forks,
Bayesian SegNet's Monte Carlo dropout at TEST)."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.proto import caffe_pb2
from google.protobuf import text_format

NET = """name: "d"
input: "x"
input_shape { dim: 2 dim: 3 dim: 4 dim: 5 }
layer { name: "drop" type: "Dropout" bottom: "x" top: "y" dropout_param { PARAM } }
"""


def _net(tmp_path, param, phase, force_backward=False):
    p = tmp_path / "d.prototxt"
    p.write_text(NET.replace("PARAM", param) + ("force_backward: true\n" if force_backward else ""))
    return caffe_ocl.Net(str(p), phase), str(p)


def test_field_numbers():
    f = caffe_pb2.DropoutParameter.DESCRIPTOR.fields_by_name
    assert f["scale_train"].number == 2 and f["scale_train"].default_value is True
    assert f["sample_weights_test"].number == 1002


def test_scale_train_false_test_phase_scales_by_keep(tmp_path):
    net, _ = _net(tmp_path, "dropout_ratio: 0.3 scale_train: false", caffe_ocl.TEST, True)
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    y = net.forward(x=x)["y"]
    np.testing.assert_allclose(y, x * 0.7, rtol=1e-6)
    net.blobs["y"].diff[...] = 1.0
    net.backward()
    np.testing.assert_allclose(net.blobs["x"].diff, np.full_like(x, 0.7), rtol=1e-6)


def test_scale_train_false_train_phase_keeps_survivors_unscaled(tmp_path):
    net, _ = _net(tmp_path, "dropout_ratio: 0.5 scale_train: false", caffe_ocl.TRAIN)
    x = np.random.default_rng(1).uniform(1, 2, (2, 3, 4, 5)).astype(np.float32)
    y = net.forward(x=x)["y"]
    kept = y != 0
    assert 0 < kept.sum() < y.size
    np.testing.assert_array_equal(y[kept], x[kept])


def test_sample_weights_test_drops_at_test(tmp_path):
    net, _ = _net(tmp_path, "dropout_ratio: 0.5 sample_weights_test: true", caffe_ocl.TEST)
    x = np.random.default_rng(2).uniform(1, 2, (2, 3, 4, 5)).astype(np.float32)
    y1 = net.forward(x=x)["y"].copy()
    y2 = net.forward(x=x)["y"].copy()
    kept = y1 != 0
    assert 0 < kept.sum() < y1.size
    np.testing.assert_allclose(y1[kept], 2 * x[kept], rtol=1e-6)
    assert (y1 != y2).any()                  # a new mask every pass (Monte Carlo)


def test_plain_dropout_test_is_identity(tmp_path):
    net, _ = _net(tmp_path, "dropout_ratio: 0.5", caffe_ocl.TEST)
    x = np.random.default_rng(3).normal(size=(2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(net.forward(x=x)["y"], x)


def test_scale_train_matches_opencv(tmp_path):
    from conftest import opencv_with_caffe_importer
    cv2 = opencv_with_caffe_importer()
    net, proto = _net(tmp_path, "dropout_ratio: 0.25 scale_train: false", caffe_ocl.TEST)
    x = np.random.default_rng(4).normal(size=(2, 3, 4, 5)).astype(np.float32)
    cvn = cv2.dnn.readNetFromCaffe(proto)
    cvn.setInput(x)
    np.testing.assert_allclose(net.forward(x=x)["y"], cvn.forward("drop"), rtol=1e-6)
