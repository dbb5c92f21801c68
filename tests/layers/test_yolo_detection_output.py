"""eric612/MobileNet-YOLO's YoloDetectionOutput (YOLO v2) and
Yolov3DetectionOutput against float64 NumPy references worked from the
fork's yolo_detection_output_layer.cpp / yolov3_detection_output_layer.cpp
(OpenCV has neither layer)."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import caffe_pb2


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _nms_rows(preds, thresh, images):
    """The fork's sort (score desc; ties: push order) + ApplyNms + rows."""
    order = sorted(range(len(preds)), key=lambda i: (-preds[i][0], i))
    kept = []
    for i in order:
        s, c, (x, y, w, h) = preds[i]
        ok = True
        for j in kept:
            _, _, (x2, y2, w2, h2) = preds[j]
            iw = min(x + w / 2, x2 + w2 / 2) - max(x - w / 2, x2 - w2 / 2)
            ih = min(y + h / 2, y2 + h2 / 2) - max(y - h / 2, y2 - h2 / 2)
            inter = 0.0 if iw < 0 or ih < 0 else iw * ih
            if inter / (w * h + w2 * h2 - inter) >= thresh:
                ok = False
                break
        if ok:
            kept.append(i)
    if not kept:
        rows = np.full((images, 7), -1.0)
        rows[:, 0] = np.arange(images)
        return rows
    return np.array([[0, preds[i][1] + 1, preds[i][0], preds[i][2][0] - preds[i][2][2] / 2,
                      preds[i][2][1] - preds[i][2][3] / 2, preds[i][2][0] + preds[i][2][2] / 2,
                      preds[i][2][1] + preds[i][2][3] / 2] for i in kept])


def ref_v3(bottoms, ncls, num, thresh, nms, biases, scales, mask, groups):
    preds = []
    per = len(mask) // groups
    for t, x in enumerate(bottoms):
        x = x.astype(np.float64)
        nb, _, h, w = x.shape
        nw, nh = w * scales[t], h * scales[t]
        for b in range(nb):
            for s in range(h * w):
                for n in range(num):
                    v = x[b, n * (5 + ncls):(n + 1) * (5 + ncls)].reshape(5 + ncls, -1)[:, s]
                    a = mask[n + t * per]
                    box = ((s % w + _sig(v[0])) / w, (s // w + _sig(v[1])) / h,
                           np.exp(v[2]) * biases[2 * a] / nw,
                           np.exp(v[3]) * biases[2 * a + 1] / nh)
                    obj = _sig(v[4])
                    for c in range(ncls):
                        sc = _sig(v[5 + c]) * obj
                        if sc > thresh:
                            preds.append((sc, c, box))
    return _nms_rows(preds, nms, bottoms[-1].shape[0])


def ref_v2(bottoms, ncls, num, thresh, nms, biases):
    preds = []
    for x in bottoms:
        x = x.astype(np.float64)
        nb, _, side, _ = x.shape
        for b in range(nb):
            for s in range(side * side):
                for n in range(num):
                    v = x[b, n * (5 + ncls):(n + 1) * (5 + ncls)].reshape(5 + ncls, -1)[:, s]
                    box = ((s % side + _sig(v[0])) / side, (s // side + _sig(v[1])) / side,
                           np.exp(v[2]) * biases[2 * n] / side,
                           np.exp(v[3]) * biases[2 * n + 1] / side)
                    e = np.exp(v[5:] - v[5:].max())
                    prob = e / e.sum()
                    c = int(np.argmax(prob))
                    sc = _sig(v[4]) * prob[c]
                    if sc >= thresh:
                        preds.append((sc, c, box))
    return _nms_rows(preds, nms, bottoms[0].shape[0])


def _net(tmp_path, shapes, layer):
    text = 'name: "y"\n' + "".join(
        f'input: "b{i}"\ninput_shape {{ dim: {s[0]} dim: {s[1]} dim: {s[2]} dim: {s[3]} }}\n'
        for i, s in enumerate(shapes)) + layer
    p = tmp_path / "y.prototxt"
    p.write_text(text)
    return caffe_ocl.Net(str(p), caffe_ocl.TEST)


V3 = """layer { name: "det" type: "Yolov3DetectionOutput" bottom: "b0" bottom: "b1" top: "det"
  yolov3_detection_output_param { num_classes: 3 num_box: 2 confidence_threshold: THRESH
    nms_threshold: NMS biases: 10 biases: 14 biases: 23 biases: 27 biases: 37 biases: 58
    biases: 81 biases: 82 biases: 135 biases: 169 biases: 344 biases: 319
    anchors_scale: 32 anchors_scale: 16 mask_group_num: 2
    mask: 3 mask: 4 mask: 5 mask: 0 mask: 1 mask: 2 } }
"""


@pytest.mark.parametrize("thresh,nms,batch", [(0.3, 0.45, 1), (0.05, 0.3, 2), (0.99, 0.45, 2)])
def test_yolov3_detection_output_matches_reference(tmp_path, thresh, nms, batch):
    shapes = [(batch, 16, 3, 4), (batch, 16, 6, 8)]
    net = _net(tmp_path, shapes, V3.replace("THRESH", str(thresh)).replace("NMS", str(nms)))
    rng = np.random.default_rng(int(thresh * 100) + batch)
    xs = [rng.normal(0, 1.5, s).astype(np.float32) for s in shapes]
    got = net.forward(b0=xs[0], b1=xs[1])["det"]
    p = net.layer_dict["det"].param.yolov3_detection_output_param
    want = ref_v3(xs, 3, 2, thresh, nms, list(p.biases), [32, 16], list(p.mask), 2)
    assert got.shape == (1, 1, len(want), 7)
    np.testing.assert_allclose(got[0, 0], want, rtol=2e-5, atol=2e-6)
    if thresh < 0.99:
        assert len(want) > 3 and (want[:, 1] > 0).all()
        assert (np.diff(want[:, 2]) <= 0).all()             # by score
        if nms < 0.45:                                       # NMS removed some
            total = sum(((_sig(x.reshape(batch, 2, 8, -1)[:, :, 5:]) *
                          _sig(x.reshape(batch, 2, 8, -1)[:, :, 4:5])) > thresh).sum()
                        for x in xs)
            assert len(want) < total
    else:
        assert (want[:, 1] == -1).all()                      # the fork's "nothing found" rows


V2 = """layer { name: "det" type: "YoloDetectionOutput" BOTTOMS top: "det"
  yolo_detection_output_param { num_classes: 4 num_box: 3 coords: 4
    confidence_threshold: THRESH nms_threshold: 0.45
    biases: 1.08 biases: 1.19 biases: 3.42 biases: 4.41 biases: 6.63 biases: 11.38 } }
"""


@pytest.mark.parametrize("two", [False, True])
def test_yolo_v2_detection_output_matches_reference(tmp_path, two):
    shapes = [(1, 27, 5, 5)] + ([(1, 27, 3, 3)] if two else [])
    bottoms = " ".join(f'bottom: "b{i}"' for i in range(len(shapes)))
    net = _net(tmp_path, shapes, V2.replace("BOTTOMS", bottoms).replace("THRESH", "0.2"))
    rng = np.random.default_rng(7)
    xs = [rng.normal(0, 1.5, s).astype(np.float32) for s in shapes]
    got = net.forward(**{f"b{i}": x for i, x in enumerate(xs)})["det"]
    biases = [1.08, 1.19, 3.42, 4.41, 6.63, 11.38]
    want = ref_v2(xs, 4, 3, 0.2, 0.45, biases)
    assert len(want) > 3
    assert got.shape == (1, 1, len(want), 7)
    np.testing.assert_allclose(got[0, 0], want, rtol=2e-5, atol=2e-6)


def test_field_numbers_are_the_forks():
    f = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
    assert f["yolo_detection_output_param"].number == 601
    assert f["yolov3_detection_output_param"].number == 602
    v3 = caffe_pb2.Yolov3DetectionOutputParameter.DESCRIPTOR.fields_by_name
    assert [v3[n].number for n in ("num_classes", "num_box", "confidence_threshold",
                                   "nms_threshold", "biases", "anchors_scale",
                                   "mask_group_num", "mask", "gaussian_box")] == list(range(1, 10))


def test_bad_parameters_are_one_error(tmp_path):
    with pytest.raises(CaffeOclError, match="gaussian_box"):
        _net(tmp_path, [(1, 16, 3, 4), (1, 16, 6, 8)],
             V3.replace("THRESH", "0.3").replace("NMS", "0.4")
             .replace("mask_group_num: 2", "mask_group_num: 2 gaussian_box: true"))
    with pytest.raises(CaffeOclError, match="channels"):
        _net(tmp_path, [(1, 15, 3, 4), (1, 16, 6, 8)],
             V3.replace("THRESH", "0.3").replace("NMS", "0.4"))
    with pytest.raises(CaffeOclError, match="square"):
        _net(tmp_path, [(1, 27, 5, 4)], V2.replace("BOTTOMS", 'bottom: "b0"')
             .replace("THRESH", "0.2"))
