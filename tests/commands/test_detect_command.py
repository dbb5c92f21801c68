"""`caffe_ocl detect` and caffe_ocl.detection.detect on a small SSD-style
net with random weights, against cv2.dnn on the same image and
preprocessing (blobFromImage: resize, swapRB, (x - mean) * scale)."""
import json

import numpy as np
import pytest

import caffe_ocl
from caffe_ocl import detection
from caffe_ocl.commands import detect as detect_cmd
from conftest import opencv_with_caffe_importer

cv2 = pytest.importorskip("cv2")

NET = """name: "tiny_ssd"
input: "data"
input_shape { dim: 1 dim: 3 dim: 24 dim: 32 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 stride: 4
    weight_filler { type: "gaussian" std: 0.02 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loc" type: "Convolution" bottom: "conv" top: "loc"
  convolution_param { num_output: 8 kernel_size: 1
    weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "loc_perm" type: "Permute" bottom: "loc" top: "loc_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "loc_flat" type: "Flatten" bottom: "loc_perm" top: "loc_flat" }
layer { name: "conf" type: "Convolution" bottom: "conv" top: "conf"
  convolution_param { num_output: 6 kernel_size: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 1 } } }
layer { name: "conf_perm" type: "Permute" bottom: "conf" top: "conf_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "conf_flat" type: "Flatten" bottom: "conf_perm" top: "conf_flat" }
layer { name: "conf_r" type: "Reshape" bottom: "conf_flat" top: "conf_r"
  reshape_param { shape { dim: 0 dim: -1 dim: 3 } } }
layer { name: "conf_sm" type: "Softmax" bottom: "conf_r" top: "conf_sm"
  softmax_param { axis: 2 } }
layer { name: "conf_sm_flat" type: "Flatten" bottom: "conf_sm" top: "conf_sm_flat" }
layer { name: "prior" type: "PriorBox" bottom: "conv" bottom: "data" top: "prior"
  prior_box_param { min_size: 8 aspect_ratio: 2 flip: false clip: false
    variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }
layer { name: "detection_out" type: "DetectionOutput" bottom: "loc_flat"
  bottom: "conf_sm_flat" bottom: "prior" top: "detection_out"
  detection_output_param { num_classes: 3 share_location: true background_label_id: 0
    nms_param { nms_threshold: 0.45 top_k: 100 } code_type: CENTER_SIZE keep_top_k: 100
    confidence_threshold: 0.2 } }
"""


@pytest.fixture
def model(tmp_path):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(NET)
    caffe_ocl.set_random_seed(11)
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    weights = tmp_path / "w.caffemodel"
    net.save(str(weights))
    img = (np.random.default_rng(2).uniform(0, 255, (45, 61, 3))).astype(np.uint8)
    path = tmp_path / "img.png"
    cv2.imwrite(str(path), img)
    return str(proto), str(weights), str(path), img


def _cv2_rows(proto, weights, img, mean, scale, swap_rb):
    opencv_with_caffe_importer()
    cvn = cv2.dnn.readNetFromCaffe(proto, weights)
    blob = cv2.dnn.blobFromImage(img, scale, (32, 24), mean, swapRB=swap_rb, crop=False)
    cvn.setInput(blob)
    rows = cvn.forward().reshape(-1, 7)
    return rows[(rows[:, 1] >= 0) & (np.abs(rows).max(1) > 0)]


def test_detect_helper_matches_opencv(model):
    proto, weights, path, img = model
    net = caffe_ocl.Net(proto, weights, caffe_ocl.TEST)
    mean, scale = (104.0, 117.0, 123.0), 0.017
    dets = detection.detect(net, path, mean=mean, scale=scale, channel_swap=(2, 1, 0),
                            labels=["bg", "cat", "dog"])
    # both swap the channels first, then subtract the mean in the new order
    ref = _cv2_rows(proto, weights, img, mean, scale, True)
    assert len(dets) == len(ref) > 0
    got = sorted((d["label"], d["score"], *d["box_normalized"]) for d in dets)
    want = sorted(tuple(r[1:]) for r in ref)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
    h, w = img.shape[:2]
    for d in dets:
        x0, y0, x1, y1 = d["box_normalized"]
        assert d["box"] == pytest.approx([min(max(x0 * w, 0), w), min(max(y0 * h, 0), h),
                                          min(max(x1 * w, 0), w), min(max(y1 * h, 0), h)])
        assert d["name"] == ["bg", "cat", "dog"][d["label"]]


def test_detect_command_writes_json_and_png(model, tmp_path, capsys):
    proto, weights, path, img = model
    out = tmp_path / "out"
    labels = tmp_path / "labelmap.prototxt"
    labels.write_text('item { name: "none" label: 0 display_name: "background" }\n'
                      'item { name: "c1" label: 1 display_name: "cat" }\n'
                      'item { name: "c2" label: 2 display_name: "dog" }\n')
    rc = detect_cmd.main(["--model", proto, "--weights", weights, "--mean_value", "104,117,123",
                          "--scale", "0.017", "--threshold", "0.3", "--labels", str(labels),
                          "--output_dir", str(out), path])
    assert rc == 0
    data = json.loads((out / "img.json").read_text())
    assert data["size"] == [61, 45]
    ref = _cv2_rows(proto, weights, img, (104.0, 117.0, 123.0), 0.017, False)
    ref = ref[ref[:, 2] >= 0.3]
    assert len(data["detections"]) == len(ref)
    assert {d["name"] for d in data["detections"]} <= {"cat", "dog"}
    drawn = cv2.imread(str(out / "img.png"))
    assert drawn.shape == img.shape
    if len(ref):
        assert (drawn != img).any()
    assert "detection(s)" in capsys.readouterr().out


def test_detect_needs_a_detection_net(tmp_path):
    proto = tmp_path / "p.prototxt"
    proto.write_text('input: "data" input_shape { dim: 1 dim: 3 dim: 4 dim: 4 }\n'
                     'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n')
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    with pytest.raises(caffe_ocl.NetError, match="no DetectionOutput layer"):
        detection.detect(net, np.zeros((4, 4, 3), np.uint8))
