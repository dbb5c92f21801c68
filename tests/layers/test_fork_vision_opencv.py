"""The Faster R-CNN and segmentation fork layers against OpenCV 4's Caffe
importer on the same prototxt and inputs: Proposal -> ROIPooling, Pooling
with ceil_mode: false, Interp, ShuffleChannel and Axpy (see its test).
All agree to float rounding."""
import numpy as np
import pytest

import caffe_ocl
from conftest import opencv_with_caffe_importer

cv2 = opencv_with_caffe_importer()   # skips the module without one


def _both(tmp_path, proto, inputs, outputs):
    """(OpenCV's, caffe_ocl's) outputs: OpenCV names a layer's output by the
    layer's name, caffe_ocl by the top's name (``outputs``: layer -> top)."""
    path = tmp_path / "net.prototxt"
    path.write_text(proto)
    cvnet = cv2.dnn.readNetFromCaffe(str(path))
    for name, v in inputs.items():
        cvnet.setInput(v.astype(np.float32), name)
    cv_outs = cvnet.forward(list(outputs))
    net = caffe_ocl.Net(str(path), caffe_ocl.TEST)
    for name, v in inputs.items():
        net.blobs[name].data[...] = v
    net.forward()
    return cv_outs, [net.blobs[top].data.copy() for top in outputs.values()]


def test_faster_rcnn_head_and_ceil_mode_match_opencv(rng, tmp_path):
    A, h, w = 9, 4, 5
    proto = f'''name: "head"
input: "cls" input_shape {{ dim: 1 dim: {2 * A} dim: {h} dim: {w} }}
input: "bbox" input_shape {{ dim: 1 dim: {4 * A} dim: {h} dim: {w} }}
input: "im_info" input_shape {{ dim: 1 dim: 3 }}
input: "feat" input_shape {{ dim: 1 dim: 2 dim: {h} dim: {w} }}
layer {{ name: "proposal" type: "Proposal" bottom: "cls" bottom: "bbox" bottom: "im_info"
  top: "rois" proposal_param {{ feat_stride: 16 min_size: 4 scale: 1 scale: 2 scale: 4
  ratio: 0.5 ratio: 1 ratio: 2 pre_nms_topn: 50 post_nms_topn: 10 nms_thresh: 0.7 }} }}
layer {{ name: "pool" type: "ROIPooling" bottom: "feat" bottom: "rois" top: "pooled"
  roi_pooling_param {{ pooled_h: 2 pooled_w: 2 spatial_scale: 0.0625 }} }}
layer {{ name: "floor" type: "Pooling" bottom: "feat" top: "fp"
  pooling_param {{ pool: MAX kernel_size: 2 stride: 2 ceil_mode: false }} }}
'''
    inputs = {"cls": rng.permutation(2 * A * h * w).reshape(1, 2 * A, h, w) / (2.0 * A * h * w),
              "bbox": rng.normal(0, 0.3, (1, 4 * A, h, w)),
              "im_info": np.array([[64, 80, 1.0]]),
              "feat": rng.standard_normal((1, 2, h, w))}
    cv_outs, ours = _both(tmp_path, proto, inputs,
                          {"proposal": "rois", "pool": "pooled", "floor": "fp"})
    for cv_o, o in zip(cv_outs, ours):
        assert cv_o.shape == o.shape
        np.testing.assert_allclose(o, cv_o, rtol=1e-5, atol=1e-4)
    assert ours[0].shape == (10, 5) and ours[2].shape == (1, 2, 2, 2)


@pytest.mark.parametrize("name,text", [
    ("interp", 'type: "Interp" interp_param { zoom_factor: 2 }'),
    ("interp_hw", 'type: "Interp" interp_param { height: 7 width: 3 }'),
    ("shuffle", 'type: "ShuffleChannel" shuffle_channel_param { group: 2 }'),
])
def test_one_bottom_layers_match_opencv(rng, tmp_path, name, text):
    proto = f'''name: "t"
input: "x" input_shape {{ dim: 1 dim: 4 dim: 5 dim: 6 }}
layer {{ name: "{name}" {text} bottom: "x" top: "{name}" }}
'''
    (cv_o,), (o,) = _both(tmp_path, proto, {"x": rng.standard_normal((1, 4, 5, 6))},
                          {name: name})
    assert cv_o.shape == o.shape
    np.testing.assert_allclose(o, cv_o, rtol=1e-5, atol=1e-5)


def test_axpy_matches_opencv_where_it_follows_the_fork(rng, tmp_path):
    """SENet's axpy_layer.cpp computes bottom[0] * bottom[1] + bottom[2]
    (test_fork_vision_layers.py checks that); OpenCV 4's importer turns Axpy
    into Scale(bottom[2], bottom[0]) + bottom[1], i.e. swaps the last two
    bottoms, so the outputs agree only where they are the same blob."""
    proto = '''name: "t"
input: "a" input_shape { dim: 1 dim: 4 dim: 1 dim: 1 }
input: "x" input_shape { dim: 1 dim: 4 dim: 5 dim: 6 }
layer { name: "axpy" type: "Axpy" bottom: "a" bottom: "x" bottom: "x" top: "axpy" }
'''
    a, x = rng.standard_normal((1, 4, 1, 1)), rng.standard_normal((1, 4, 5, 6))
    (cv_o,), (o,) = _both(tmp_path, proto, {"a": a, "x": x}, {"axpy": "axpy"})
    np.testing.assert_allclose(o, cv_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o, a * x + x, rtol=1e-5, atol=1e-5)
