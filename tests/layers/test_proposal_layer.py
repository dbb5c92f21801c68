"""The built-in Proposal layer (layers/proposal.py) against a float64 NumPy
port of py-faster-rcnn's rpn/proposal_layer.py (generate_anchors,
bbox_transform_inv, clip_boxes, _filter_boxes, py_cpu_nms), and the
``rpn.proposal_layer`` Python layer run by it when that module is absent."""
import importlib.util

import numpy as np
import pytest

from caffe_ocl import ShapeError, LayerError
from caffe_ocl.layers.proposal import generate_anchors, parse_param_str
from caffe_ocl.proto import caffe_pb2
from caffe_ocl.testing import forward, make_layer


def _anchors_ref(base_size=16, ratios=(0.5, 1, 2), scales=(8, 16, 32)):
    """rpn/generate_anchors.py, written out for the test."""
    base = np.array([1, 1, base_size, base_size], float) - 1
    w, h = base[2] - base[0] + 1, base[3] - base[1] + 1
    xc, yc = base[0] + 0.5 * (w - 1), base[1] + 0.5 * (h - 1)
    out = []
    for r in ratios:
        ws = np.round(np.sqrt(w * h / r))
        hs = np.round(ws * r)
        for s in scales:
            W, H = ws * s, hs * s
            out.append([xc - 0.5 * (W - 1), yc - 0.5 * (H - 1), xc + 0.5 * (W - 1),
                        yc + 0.5 * (H - 1)])
    return np.array(out)


def proposal_ref(cls, deltas, im_info, stride, anchors, pre_n, post_n, thresh, min_size):
    A = len(anchors)
    scores = cls[:, A:]
    h, w = scores.shape[-2:]
    sx, sy = np.meshgrid(np.arange(w) * stride, np.arange(h) * stride)
    shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
    all_anchors = (anchors.reshape(1, A, 4) + shifts.reshape(-1, 1, 4)).reshape(-1, 4)
    d = deltas.transpose(0, 2, 3, 1).reshape(-1, 4).astype(np.float64)
    s = scores.transpose(0, 2, 3, 1).reshape(-1).astype(np.float64)
    widths = all_anchors[:, 2] - all_anchors[:, 0] + 1.0
    heights = all_anchors[:, 3] - all_anchors[:, 1] + 1.0
    cx, cy = all_anchors[:, 0] + 0.5 * widths, all_anchors[:, 1] + 0.5 * heights
    pcx, pcy = d[:, 0] * widths + cx, d[:, 1] * heights + cy
    pw, ph = np.exp(d[:, 2]) * widths, np.exp(d[:, 3]) * heights
    boxes = np.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], 1)
    boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, im_info[1] - 1)
    boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, im_info[0] - 1)
    ms = min_size * im_info[2]
    keep = np.where((boxes[:, 2] - boxes[:, 0] + 1 >= ms) & (boxes[:, 3] - boxes[:, 1] + 1 >= ms))[0]
    boxes, s = boxes[keep], s[keep]
    order = s.argsort(kind="stable")[::-1]
    if pre_n > 0:
        order = order[:pre_n]
    boxes, s = boxes[order], s[order]
    # py_cpu_nms
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    idx, kept = np.arange(len(boxes)), []
    while idx.size:
        i = idx[0]
        kept.append(i)
        xx1, yy1 = np.maximum(x1[i], x1[idx[1:]]), np.maximum(y1[i], y1[idx[1:]])
        xx2, yy2 = np.minimum(x2[i], x2[idx[1:]]), np.minimum(y2[i], y2[idx[1:]])
        inter = np.maximum(0.0, xx2 - xx1 + 1) * np.maximum(0.0, yy2 - yy1 + 1)
        ovr = inter / (areas[i] + areas[idx[1:]] - inter)
        idx = idx[1:][ovr <= thresh]
    if post_n > 0:
        kept = kept[:post_n]
    return np.hstack([np.zeros((len(kept), 1)), boxes[kept]]), s[kept]


def _inputs(rng, A, h, w, im_info):
    cls = rng.permutation(2 * A * h * w).reshape(1, 2 * A, h, w) / (2.0 * A * h * w)
    deltas = rng.normal(0, 0.3, (1, 4 * A, h, w))
    return cls, deltas, np.array([im_info], float)


def test_generate_anchors_matches_py_faster_rcnn():
    np.testing.assert_array_equal(generate_anchors(), _anchors_ref())
    # the published table's first row (ratio 0.5, scale 8)
    np.testing.assert_array_equal(generate_anchors()[0], [-84, -40, 99, 55])
    np.testing.assert_array_equal(generate_anchors(8, (1,), (2, 4)),
                                  _anchors_ref(8, (1,), (2, 4)))


@pytest.mark.parametrize("pre,post,thresh", [(100, 20, 0.7), (0, 0, 0.5), (40, 300, 0.3)])
def test_proposal_matches_reference(rng, pre, post, thresh):
    A = 6
    cls, deltas, info = _inputs(rng, A, 5, 6, (80, 96, 1.5))
    text = (f'type: "Proposal" top: "rois" top: "scores" proposal_param {{ feat_stride: 16 '
            f'base_size: 16 min_size: 8 ratio: 0.5 ratio: 1 ratio: 2 scale: 2 scale: 4 '
            f'pre_nms_topn: {pre} post_nms_topn: {post} nms_thresh: {thresh} }}')
    layer, b, t = make_layer(text, [cls, deltas, info])
    rois, scores = forward(layer, b, t)
    ref_rois, ref_scores = proposal_ref(cls, deltas, info[0], 16, _anchors_ref(16, (0.5, 1, 2), (2, 4)),
                                        pre, post, thresh, 8)
    assert 3 < len(ref_rois) and rois.shape == ref_rois.shape and scores.shape == (len(ref_rois), 1)
    np.testing.assert_allclose(rois, ref_rois, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(scores[:, 0], ref_scores, rtol=1e-6)
    # a second forward on new values reuses the plans
    cls2, deltas2, _ = _inputs(rng, A, 5, 6, (80, 96, 1.5))
    b[0].data[...] = cls2
    b[1].data[...] = deltas2
    rois2, _ = forward(layer, b, t)
    ref2, _ = proposal_ref(cls2, deltas2, info[0], 16, _anchors_ref(16, (0.5, 1, 2), (2, 4)),
                           pre, post, thresh, 8)
    np.testing.assert_allclose(rois2, ref2, rtol=1e-5, atol=1e-3)


def test_python_rpn_proposal_layer_runs_the_builtin(rng):
    if importlib.util.find_spec("rpn") is not None:
        pytest.skip("an rpn package is importable here: the user's layer would run")
    A = 9
    cls, deltas, info = _inputs(rng, A, 4, 5, (64, 80, 1.0))
    text = ('type: "Python" top: "rois" python_param { module: "rpn.proposal_layer" '
            'layer: "ProposalLayer" param_str: "\'feat_stride\': 16" }')
    layer, b, t = make_layer(text, [cls, deltas, info])
    (rois,) = forward(layer, b, t)
    ref, _ = proposal_ref(cls, deltas, info[0], 16, _anchors_ref(), 6000, 300, 0.7, 16)
    assert rois.shape == ref.shape
    np.testing.assert_allclose(rois, ref, rtol=1e-5, atol=1e-3)
    # TRAIN phase: py-faster-rcnn's TRAIN counts (same result on this small map)
    layer, b, t = make_layer(text, [cls, deltas, info], phase=caffe_pb2.TRAIN)
    assert (layer.builtin.pre_n, layer.builtin.post_n) == (12000, 2000)
    # any other missing module is still an error
    with pytest.raises(LayerError, match="cannot import module"):
        make_layer(text.replace("ProposalLayer", "Other"), [cls, deltas, info])


def test_param_str_is_read_as_literals():
    assert parse_param_str("'feat_stride': 16") == {"feat_stride": 16}
    assert parse_param_str("{'feat_stride': 8, 'scales': [4, 8]}") == {"feat_stride": 8,
                                                                        "scales": [4, 8]}
    assert parse_param_str("feat_stride: 32") == {"feat_stride": 32}
    with pytest.raises(ValueError):
        parse_param_str("'a': __import__('os').getcwd()")


def test_proposal_bad_bottoms(rng):
    cls, deltas, info = _inputs(rng, 9, 3, 3, (48, 48, 1.0))
    with pytest.raises(ShapeError, match="must be \\(1, 36, 3, 3\\)"):
        make_layer('type: "Proposal" proposal_param { feat_stride: 16 }',
                   [cls, deltas[:, :20], info])


def test_faster_rcnn_head_in_a_net(rng, tmp_path):
    """Proposal -> ROIPooling in a Net: the rois' row count changes with the
    values and the net reshapes ROIPooling for it on every forward."""
    import caffe_ocl
    A, h, w = 9, 4, 5
    proto = tmp_path / "head.prototxt"
    proto.write_text(f'''
name: "head"
layer {{ name: "in" type: "Input" top: "cls" top: "bbox" top: "im_info" top: "feat"
  input_param {{ shape {{ dim: 1 dim: {2 * A} dim: {h} dim: {w} }}
                shape {{ dim: 1 dim: {4 * A} dim: {h} dim: {w} }}
                shape {{ dim: 1 dim: 3 }} shape {{ dim: 1 dim: 2 dim: {h} dim: {w} }} }} }}
layer {{ name: "proposal" type: "Proposal" bottom: "cls" bottom: "bbox" bottom: "im_info"
  top: "rois" proposal_param {{ feat_stride: 16 min_size: 4 scale: 1 scale: 2 scale: 4
  pre_nms_topn: 50 post_nms_topn: 10 }} }}
layer {{ name: "pool" type: "ROIPooling" bottom: "feat" bottom: "rois" top: "pooled"
  roi_pooling_param {{ pooled_h: 2 pooled_w: 2 spatial_scale: 0.0625 }} }}
''')
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    counts = set()
    for thresh_scale in (1.0, 3.0):
        cls, deltas, info = _inputs(rng, A, h, w, (64, 80, 1.0))
        deltas *= thresh_scale
        feat = rng.standard_normal((1, 2, h, w))
        for name, v in (("cls", cls), ("bbox", deltas), ("im_info", info), ("feat", feat)):
            net.blobs[name].data[...] = v
        net.forward()
        rois = net.blobs["rois"].data.copy()
        ref, _ = proposal_ref(cls, deltas, info[0], 16, _anchors_ref(16, (0.5, 1, 2), (1, 2, 4)),
                              50, 10, 0.7, 4)
        np.testing.assert_allclose(rois, ref, rtol=1e-5, atol=1e-3)
        assert net.blobs["pooled"].data.shape == (len(ref), 2, 2, 2)
        counts.add(len(ref))
    assert all(c > 0 for c in counts)
