"""SSD-style nets against OpenCV 4's Caffe importer (cv2.dnn) on the same
input: a small prototxt in the SSD fork's style with random weights saved as
a caffemodel, and -- when CAFFE_OCL_TEST_MODELS names a folder holding them
-- real published models (every NAME.prototxt with a NAME.caffemodel; no
download here). OpenCV orders DetectionOutput rows by score when keep_top_k
trims; the fork (and caffe_ocl) by label, so rows are compared sorted."""
import glob
import os

import numpy as np
import pytest

import caffe_ocl
from conftest import opencv_with_caffe_importer
from caffe_ocl import config

cv2 = opencv_with_caffe_importer()   # skips the module without one

MINI_SSD = """name: "mini_ssd"
input: "data"
input_shape { dim: 1 dim: 3 dim: 32 dim: 32 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2
    weight_filler { type: "gaussian" std: 0.2 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv1_norm" type: "Normalize" bottom: "conv1" top: "conv1_norm"
  norm_param { across_spatial: false channel_shared: false
    scale_filler { type: "gaussian" mean: 20 std: 2 } } }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2
    weight_filler { type: "gaussian" std: 0.2 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "l1_loc" type: "Convolution" bottom: "conv1_norm" top: "l1_loc"
  convolution_param { num_output: LOC1 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: LOCSTD } bias_filler { type: "gaussian" std: 0.05 } } }
layer { name: "l1_loc_perm" type: "Permute" bottom: "l1_loc" top: "l1_loc_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "l1_loc_flat" type: "Flatten" bottom: "l1_loc_perm" top: "l1_loc_flat"
  flatten_param { axis: 1 } }
layer { name: "l1_conf" type: "Convolution" bottom: "conv1_norm" top: "l1_conf"
  convolution_param { num_output: 12 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.02 } bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "l1_conf_perm" type: "Permute" bottom: "l1_conf" top: "l1_conf_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "l1_conf_flat" type: "Flatten" bottom: "l1_conf_perm" top: "l1_conf_flat"
  flatten_param { axis: 1 } }
layer { name: "l1_prior" type: "PriorBox" bottom: "conv1_norm" bottom: "data" top: "l1_prior"
  prior_box_param { min_size: 6.0 max_size: 12.0 aspect_ratio: 2 flip: true clip: false
    variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 2 offset: 0.5 } }
layer { name: "l2_loc" type: "Convolution" bottom: "conv2" top: "l2_loc"
  convolution_param { num_output: LOC2 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: LOCSTD } bias_filler { type: "gaussian" std: 0.05 } } }
layer { name: "l2_loc_perm" type: "Permute" bottom: "l2_loc" top: "l2_loc_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "l2_loc_flat" type: "Flatten" bottom: "l2_loc_perm" top: "l2_loc_flat"
  flatten_param { axis: 1 } }
layer { name: "l2_conf" type: "Convolution" bottom: "conv2" top: "l2_conf"
  convolution_param { num_output: 18 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "l2_conf_perm" type: "Permute" bottom: "l2_conf" top: "l2_conf_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "l2_conf_flat" type: "Flatten" bottom: "l2_conf_perm" top: "l2_conf_flat"
  flatten_param { axis: 1 } }
layer { name: "l2_prior" type: "PriorBox" bottom: "conv2" bottom: "data" top: "l2_prior"
  prior_box_param { min_size: 12.0 max_size: 24.0 aspect_ratio: 2 aspect_ratio: 3 flip: true
    clip: true variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }
layer { name: "mbox_loc" type: "Concat" bottom: "l1_loc_flat" bottom: "l2_loc_flat"
  top: "mbox_loc" concat_param { axis: 1 } }
layer { name: "mbox_conf" type: "Concat" bottom: "l1_conf_flat" bottom: "l2_conf_flat"
  top: "mbox_conf" concat_param { axis: 1 } }
layer { name: "mbox_priorbox" type: "Concat" bottom: "l1_prior" bottom: "l2_prior"
  top: "mbox_priorbox" concat_param { axis: 2 } }
layer { name: "mbox_conf_reshape" type: "Reshape" bottom: "mbox_conf"
  top: "mbox_conf_reshape" reshape_param { shape { dim: 0 dim: -1 dim: 3 } } }
layer { name: "mbox_conf_softmax" type: "Softmax" bottom: "mbox_conf_reshape"
  top: "mbox_conf_softmax" softmax_param { axis: 2 } }
layer { name: "mbox_conf_flatten" type: "Flatten" bottom: "mbox_conf_softmax"
  top: "mbox_conf_flatten" flatten_param { axis: 1 } }
layer { name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc"
  bottom: "mbox_conf_flatten" bottom: "mbox_priorbox" top: "detection_out"
  include { phase: TEST }
  detection_output_param { num_classes: 3 DETPARAMS } }
"""

DET_VARIANTS = {
    "center_size_keep_top_k": ("share_location: true background_label_id: 0 "
                               "nms_param { nms_threshold: 0.45 top_k: 100 } "
                               "code_type: CENTER_SIZE keep_top_k: 50 confidence_threshold: 0.3",
                               True, 0.05),
    "corner_per_class_loc": ("share_location: false background_label_id: 0 "
                             "nms_param { nms_threshold: 0.5 top_k: 1000 } code_type: CORNER "
                             "keep_top_k: 1000 confidence_threshold: 0.5", False, 0.002),
}


def _assert_same_rows(a, b, atol):
    """Every row of ``a`` has its own row in ``b`` within ``atol`` (rows are
    matched, not sorted: near-equal scores may sort either way)."""
    assert a.shape == b.shape
    free = np.ones(len(b), bool)
    for r in a:
        d = np.abs(b - r).max(1)
        d[~free] = np.inf
        j = int(np.argmin(d))
        assert d[j] <= atol, f"row {r} has no match in OpenCV's output (nearest {b[j]})"
        free[j] = False


def _rows(a):
    """Rows sorted by (image, label, score), without the all-zero rows that
    OpenCV pads its output with up to keep_top_k."""
    a = a.reshape(-1, 7)
    a = a[np.abs(a).max(1) > 0]
    return a[np.lexsort((a[:, 2], a[:, 1], a[:, 0]))]


@pytest.mark.parametrize("variant", sorted(DET_VARIANTS))
def test_mini_ssd_matches_opencv(variant, tmp_path):
    # (CORNER offsets are kept small: inverted boxes, xmax < xmin, are
    # where the fork's and OpenCV's overlaps differ)
    det, share, loc_std = DET_VARIANTS[variant]
    nlc = 1 if share else 3
    text = (MINI_SSD.replace("DETPARAMS", det).replace("LOC1", str(4 * 4 * nlc))
            .replace("LOC2", str(6 * 4 * nlc)).replace("LOCSTD", str(loc_std)))
    proto = tmp_path / "mini_ssd.prototxt"
    proto.write_text(text)
    caffe_ocl.set_random_seed(5)
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    model = tmp_path / "mini_ssd.caffemodel"
    net.save(str(model))
    cvn = cv2.dnn.readNetFromCaffe(str(proto), str(model))
    names = ["conv1_norm", "mbox_loc", "mbox_conf_flatten", "mbox_priorbox", "detection_out"]
    for seed in range(2):
        x = np.random.default_rng(seed).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
        ours = {k: v.copy() for k, v in net.forward(data=x).items()}
        cvn.setInput(x)
        theirs = dict(zip(names, cvn.forward(names)))
        for k in names[:-1]:
            np.testing.assert_allclose(net.blobs[k].data, theirs[k].reshape(net.blobs[k].shape),
                                       rtol=1e-4, atol=1e-4, err_msg=k)
        det_ours, det_cv = ours["detection_out"], theirs["detection_out"]
        assert det_ours.shape[2] > 3          # the thresholds leave detections to compare
        _assert_same_rows(_rows(det_ours), _rows(det_cv), 1e-4)
        labels = det_ours[0, 0, :, 1]
        assert (np.diff(labels) >= 0).all()   # the fork's order: by label


def _real_models():
    folder = config.get("TEST_MODELS")
    if not folder:
        return []
    return sorted(p[:-len(".prototxt")] for p in glob.glob(os.path.join(folder, "*.prototxt"))
                  if os.path.exists(p[:-len(".prototxt")] + ".caffemodel"))


@pytest.mark.slow
@pytest.mark.parametrize("stem", _real_models() or [pytest.param(None, marks=pytest.mark.skip(
    reason="set CAFFE_OCL_TEST_MODELS to a folder of NAME.prototxt + NAME.caffemodel"))])
def test_real_model_matches_opencv(stem):
    net = caffe_ocl.Net(stem + ".prototxt", stem + ".caffemodel", caffe_ocl.TEST)
    inp = net.inputs[0]
    shape = net.blobs[inp].shape
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    ours = {k: v.copy() for k, v in net.forward(**{inp: x}).items()}
    cvn = cv2.dnn.readNetFromCaffe(stem + ".prototxt", stem + ".caffemodel")
    cvn.setInput(x)
    names = list(ours)
    for k, theirs in zip(names, cvn.forward(names)):
        if net.layers[-1].type == "DetectionOutput" and k == net.outputs[-1]:
            _assert_same_rows(_rows(ours[k]), _rows(theirs), 1e-4)
            continue
        a, b = ours[k], theirs.reshape(ours[k].shape)
        scale = max(1.0, float(np.abs(b).max())) if b.size else 1.0
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale, err_msg=k)


PRIORS = """name: "pb"
input: "f"
input_shape { dim: 1 dim: 2 dim: 3 dim: 4 }
input: "im"
input_shape { dim: 1 dim: 3 dim: 30 dim: 44 }
layer { name: "p1" type: "PriorBox" bottom: "f" bottom: "im" top: "p1"
  prior_box_param { width: 10 height: 20 width: 30 height: 5 offset_h: 0.25 offset_w: 0.5
    offset_h: 0.75 offset_w: 0.5 clip: true
    variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }
layer { name: "p2" type: "PriorBox" bottom: "f" bottom: "im" top: "p2"
  prior_box_param { min_size: 16 max_size: 30 aspect_ratio: 2 aspect_ratio: 3 flip: true
    clip: false variance: 0.1 step_h: 10 step_w: 11 offset: 0.3 } }
layer { name: "p3" type: "PriorBox" bottom: "f" bottom: "im" top: "p3"
  prior_box_param { min_size: 8 min_size: 16 max_size: 12 max_size: 24 aspect_ratio: 2
    flip: false clip: false variance: 0.1 } }
"""


def test_prior_box_options_match_opencv(tmp_path):
    """OpenCV's width/height/offset lists, step_h/step_w, several min/max
    sizes. (img_size/img_h/img_w are the fork's: OpenCV 4 normalizes by the
    image bottom's size instead, so they are left out here.)"""
    proto = tmp_path / "pb.prototxt"
    proto.write_text(PRIORS)
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    rng = np.random.default_rng(0)
    f = rng.random((1, 2, 3, 4), np.float32)
    im = rng.random((1, 3, 30, 44), np.float32)
    ours = net.forward(f=f, im=im)
    cvn = cv2.dnn.readNetFromCaffe(str(proto))
    cvn.setInput(f, "f")
    cvn.setInput(im, "im")
    for name in ("p1", "p2", "p3"):
        theirs = cvn.forward(name)
        np.testing.assert_allclose(ours[name], theirs.reshape(ours[name].shape), rtol=1e-6,
                                   atol=1e-6, err_msg=name)
