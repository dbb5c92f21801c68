"""`caffe_ocl detect` and caffe_ocl.detection.detect on a Faster R-CNN test
net (py-faster-rcnn's layout: inputs data + im_info, RPN -> Proposal (the
built-in type, or the rpn.proposal_layer Python layer) -> ROIPooling ->
cls_prob + bbox_pred) with random weights, against a float64 NumPy
reference of py-faster-rcnn's im_detect post-processing (bbox_transform_inv,
clip_boxes) and its per-class score threshold + py_cpu_nms."""
import json

import numpy as np
import pytest

import caffe_ocl
from caffe_ocl import detection
from caffe_ocl.commands import detect as detect_cmd

cv2 = pytest.importorskip("cv2")

K = 3   # background + 2 classes

PROPOSAL = {
    "builtin": 'type: "Proposal" proposal_param { feat_stride: 16 scale: 2 scale: 4 scale: 8 '
               'ratio: 0.5 ratio: 1 ratio: 2 pre_nms_topn: 200 post_nms_topn: 40 '
               'nms_thresh: 0.7 min_size: 4 }',
    "python": 'type: "Python" python_param { module: "rpn.proposal_layer" '
              'layer: "ProposalLayer" param_str: "\'feat_stride\': 16" }',
}


def frcnn_proto(proposal):
    g = 'weight_filler { type: "gaussian" std: STD } bias_filler { type: "gaussian" std: 0.1 }'
    f = lambda std: g.replace("STD", str(std))   # noqa: E731
    return f'''name: "tiny_frcnn"
input: "data" input_shape {{ dim: 1 dim: 3 dim: 64 dim: 64 }}
input: "im_info" input_shape {{ dim: 1 dim: 3 }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 stride: 4 {f(0.02)} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 stride: 4 {f(0.3)} }} }}
layer {{ name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }}
layer {{ name: "rpn_cls_score" type: "Convolution" bottom: "conv2" top: "rpn_cls_score"
  convolution_param {{ num_output: 18 kernel_size: 1 {f(0.5)} }} }}
layer {{ name: "rpn_bbox_pred" type: "Convolution" bottom: "conv2" top: "rpn_bbox_pred"
  convolution_param {{ num_output: 36 kernel_size: 1 {f(0.05)} }} }}
layer {{ name: "rpn_cls_score_reshape" type: "Reshape" bottom: "rpn_cls_score"
  top: "rpn_cls_score_reshape" reshape_param {{ shape {{ dim: 0 dim: 2 dim: -1 dim: 0 }} }} }}
layer {{ name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_score_reshape"
  top: "rpn_cls_prob" }}
layer {{ name: "rpn_cls_prob_reshape" type: "Reshape" bottom: "rpn_cls_prob"
  top: "rpn_cls_prob_reshape" reshape_param {{ shape {{ dim: 0 dim: 18 dim: -1 dim: 0 }} }} }}
layer {{ name: "proposal" {PROPOSAL[proposal]} bottom: "rpn_cls_prob_reshape"
  bottom: "rpn_bbox_pred" bottom: "im_info" top: "rois" }}
layer {{ name: "roi_pool" type: "ROIPooling" bottom: "conv2" bottom: "rois" top: "pool"
  roi_pooling_param {{ pooled_w: 2 pooled_h: 2 spatial_scale: 0.0625 }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
  inner_product_param {{ num_output: 16 {f(0.3)} }} }}
layer {{ name: "cls_score" type: "InnerProduct" bottom: "fc" top: "cls_score"
  inner_product_param {{ num_output: {K} {f(0.2)} }} }}
layer {{ name: "bbox_pred" type: "InnerProduct" bottom: "fc" top: "bbox_pred"
  inner_product_param {{ num_output: {4 * K} {f(0.05)} }} }}
layer {{ name: "cls_prob" type: "Softmax" bottom: "cls_score" top: "cls_prob" }}
'''


def py_cpu_nms(dets, thresh):
    """py-faster-rcnn's nms/py_cpu_nms.py; equal scores (this tiny net's
    rois often pool the same features) in a defined order: a stable sort
    reversed, the later roi first (numpy's default quicksort leaves them in
    an unspecified order)."""
    x1, y1, x2, y2, scores = (dets[:, i] for i in range(5))
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort(kind="stable")[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(i)
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        inter = np.maximum(0.0, xx2 - xx1 + 1) * np.maximum(0.0, yy2 - yy1 + 1)
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(ovr <= thresh)[0] + 1]
    return keep


def im_detect_post_ref(rois, scores, deltas, im_scale, hw, thresh, nms):
    """im_detect's box decoding (bbox_transform_inv + clip_boxes) and the
    per-class threshold + NMS of test_net, float64: {class: (n, 5) dets}."""
    boxes = rois[:, 1:5].astype(np.float64) / im_scale
    w, h = boxes[:, 2] - boxes[:, 0] + 1.0, boxes[:, 3] - boxes[:, 1] + 1.0
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    d = deltas.astype(np.float64)
    pcx = d[:, 0::4] * w[:, None] + cx[:, None]
    pcy = d[:, 1::4] * h[:, None] + cy[:, None]
    pw, ph = np.exp(d[:, 2::4]) * w[:, None], np.exp(d[:, 3::4]) * h[:, None]
    pred = np.zeros(d.shape)
    pred[:, 0::4], pred[:, 1::4] = pcx - 0.5 * pw, pcy - 0.5 * ph
    pred[:, 2::4], pred[:, 3::4] = pcx + 0.5 * pw, pcy + 0.5 * ph
    pred[:, 0::4] = np.clip(pred[:, 0::4], 0, hw[1] - 1)
    pred[:, 1::4] = np.clip(pred[:, 1::4], 0, hw[0] - 1)
    pred[:, 2::4] = np.clip(pred[:, 2::4], 0, hw[1] - 1)
    pred[:, 3::4] = np.clip(pred[:, 3::4], 0, hw[0] - 1)
    out = {}
    for j in range(1, scores.shape[1]):
        inds = np.where(scores[:, j] > thresh)[0]
        dets = np.hstack((pred[inds, 4 * j:4 * j + 4], scores[inds, j:j + 1].astype(np.float64)))
        out[j] = dets[py_cpu_nms(dets, nms)] if len(dets) else dets
    return out


@pytest.fixture
def image():
    rng = np.random.default_rng(3)
    return rng.integers(0, 256, (50, 70, 3)).astype(np.uint8)


@pytest.mark.parametrize("proposal", ["builtin", "python"])
def test_frcnn_detect_matches_im_detect_reference(tmp_path, image, proposal):
    path = tmp_path / "frcnn.prototxt"
    path.write_text(frcnn_proto(proposal))
    caffe_ocl.set_random_seed(5)
    net = caffe_ocl.Net(str(path), caffe_ocl.TEST)
    assert detection.net_kind(net) == detection.FASTER_RCNN
    thresh, nms = 0.2, 0.3
    dets = detection.detect(net, image, threshold=thresh, nms=nms, target_size=64,
                            max_size=80)
    # py-faster-rcnn's _get_image_blob: shorter side 64, longer at most 80
    im_scale = min(64 / 50, 80 / 70)
    assert net.blobs["data"].shape == (1, 3, round(50 * im_scale), round(70 * im_scale))
    np.testing.assert_allclose(net.blobs["im_info"].data[0],
                               [round(50 * im_scale), round(70 * im_scale), im_scale], rtol=1e-6)
    rois = net.blobs["rois"].data.reshape(-1, 5)
    scores = net.blobs["cls_prob"].data.reshape(len(rois), K)
    deltas = net.blobs["bbox_pred"].data.reshape(len(rois), 4 * K)
    assert len(rois) > 5
    ref = im_detect_post_ref(rois, scores, deltas, im_scale, image.shape[:2], thresh, nms)
    assert sum(len(v) for v in ref.values()) > 2, "the net should find something"
    for j, want in ref.items():
        got = [d for d in dets if d["label"] == j]
        assert len(got) == len(want), j
        if len(got):
            np.testing.assert_allclose([d["score"] for d in got], want[:, 4], rtol=1e-6)
            np.testing.assert_allclose([d["box"] for d in got], want[:, :4], atol=2e-3)
    assert all(d["label"] != 0 for d in dets)


def test_frcnn_detect_command(tmp_path, image, capsys):
    path = tmp_path / "frcnn.prototxt"
    path.write_text(frcnn_proto("builtin"))
    caffe_ocl.set_random_seed(5)
    net = caffe_ocl.Net(str(path), caffe_ocl.TEST)
    weights = tmp_path / "frcnn.caffemodel"
    net.save(str(weights))
    img = tmp_path / "img.png"
    cv2.imwrite(str(img), image)
    out = tmp_path / "out"
    rc = detect_cmd.main(["--model", str(path), "--weights", str(weights), "--threshold", "0.2",
                          "--nms", "0.3", "--output_dir", str(out), str(img)])
    assert rc == 0
    data = json.loads((out / "img.json").read_text())
    assert data["size"] == [70, 50]
    net2 = caffe_ocl.Net(str(path), str(weights), caffe_ocl.TEST)
    want = detection.detect(net2, image, threshold=0.2, nms=0.3)
    assert [d["label"] for d in data["detections"]] == [d["label"] for d in want]
    assert len(want) > 0
    np.testing.assert_allclose([d["score"] for d in data["detections"]],
                               [d["score"] for d in want], rtol=1e-6)
    assert cv2.imread(str(out / "img.png")).shape == image.shape
    assert "detection(s)" in capsys.readouterr().out
