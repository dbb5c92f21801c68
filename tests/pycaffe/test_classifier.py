"""caffe.Classifier (10-crop oversampling, center crop) and caffe.Detector
(windows, context padding) against NumPy on a tiny net with known weights."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import io as cio

C, H, W, NCLS = 3, 4, 5, 6

DEPLOY = f"""
name: "tiny"
layer {{ name: "data" type: "Input" top: "data"
        input_param {{ shape {{ dim: 10 dim: {C} dim: {H} dim: {W} }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: {NCLS} }} }}
layer {{ name: "prob" type: "Softmax" bottom: "ip" top: "prob" }}
"""


@pytest.fixture
def model(tmp_path, rng):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(DEPLOY)
    net = caffe.Net(str(proto), caffe.TEST)
    w = rng.standard_normal((NCLS, C * H * W)).astype(np.float32) * 0.1
    b = rng.standard_normal(NCLS).astype(np.float32)
    net.params["ip"][0].data[...] = w
    net.params["ip"][1].data[...] = b
    weights = tmp_path / "tiny.caffemodel"
    net.save(str(weights))
    return str(proto), str(weights), w.astype(np.float64), b.astype(np.float64)


def _ref_probs(crops_hwk, w, b, mean, raw_scale, input_scale, swap):
    """crops: n x H x W x K -> softmax(W x + b) per crop, float64."""
    x = np.asarray(crops_hwk, np.float64).transpose(0, 3, 1, 2)[:, list(swap)]
    x = (x * raw_scale - mean.reshape(1, -1, 1, 1)) * input_scale
    z = x.reshape(len(x), -1) @ w.T + b
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _ten_crops(im, h, w):
    ih, iw = im.shape[:2]
    boxes = [(0, 0), (0, iw - w), (ih - h, 0), (ih - h, iw - w),
             (int(ih / 2.0 - h / 2.0), int(iw / 2.0 - w / 2.0))]
    crops = [im[y:y + h, x:x + w] for y, x in boxes]
    return crops + [c[:, ::-1] for c in crops]


def test_predict_oversample_and_center(model, rng):
    proto, weights, w, b = model
    mean = np.array([0.3, 0.5, 0.1]) * 255
    image_dims = (7, 8)
    clf = caffe.Classifier(proto, weights, image_dims=image_dims, mean=mean.astype(np.float32),
                           raw_scale=255, input_scale=0.02, channel_swap=(2, 1, 0))
    images = [rng.random((9, 11, 3)).astype(np.float32) for _ in range(3)]
    resized = [cio.resize_image(im, image_dims) for im in images]

    got = clf.predict(images)                       # oversample=True (default)
    assert got.shape == (3, NCLS)
    want = np.stack([_ref_probs(_ten_crops(r, H, W), w, b, mean, 255, 0.02, (2, 1, 0)).mean(0)
                     for r in resized])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), 1, rtol=1e-5)

    got_c = clf.predict(images, oversample=False)   # center crop only
    y0, x0 = int(7 / 2.0 - H / 2.0), int(8 / 2.0 - W / 2.0)
    want_c = _ref_probs([r[y0:y0 + H, x0:x0 + W] for r in resized], w, b, mean, 255, 0.02,
                        (2, 1, 0))
    np.testing.assert_allclose(got_c, want_c, rtol=1e-4, atol=1e-6)
    assert not np.allclose(got, got_c)              # the crops really differ


def test_default_image_dims_and_errors(model, rng):
    proto, weights, w, b = model
    clf = caffe.Classifier(proto, weights)          # whole image resized to the crop
    assert tuple(clf.image_dims) == (H, W)
    im = rng.random((H, W, 3)).astype(np.float32)
    got = clf.predict([im], oversample=False)
    np.testing.assert_allclose(got, _ref_probs([im], w, b, np.zeros(3), 1, 1, (0, 1, 2)),
                               rtol=1e-4, atol=1e-6)
    # all 10 crops of an image the size of the crop are the image and its mirror
    got10 = clf.predict([im])
    want10 = _ref_probs([im] * 5 + [im[:, ::-1]] * 5, w, b, np.zeros(3), 1, 1, (0, 1, 2))
    np.testing.assert_allclose(got10[0], want10.mean(0), rtol=1e-4, atol=1e-6)
    small = caffe.Classifier(proto, weights, image_dims=(2, 2))
    with pytest.raises(caffe.ShapeError, match="smaller than"):
        small.predict([im])
    with pytest.raises(caffe.ShapeError):
        clf.predict([])


def _write_png(path, arr01):
    import cv2
    cv2.imwrite(str(path), np.round(arr01[:, :, ::-1] * 255).astype(np.uint8))
    return cio.load_image(str(path))               # what the detector will read


def test_detector_windows(model, tmp_path, rng):
    proto, weights, w, b = model
    mean = np.array([100.0, 120.0, 90.0])
    det = caffe.Detector(proto, weights, mean=mean.astype(np.float32), raw_scale=255,
                         channel_swap=(2, 1, 0))
    im1 = _write_png(tmp_path / "a.png", rng.random((12, 14, 3)))
    im2 = _write_png(tmp_path / "b.png", rng.random((10, 10, 3)))
    windows = [(str(tmp_path / "a.png"), [(0, 0, 6, 7), (2, 3, 12, 14)]),
               (str(tmp_path / "b.png"), [(1, 1, 9, 5)])]
    dets = det.detect_windows(windows)
    assert [d["filename"] for d in dets] == [windows[0][0]] * 2 + [windows[1][0]]
    assert [tuple(d["window"]) for d in dets] == [(0, 0, 6, 7), (2, 3, 12, 14), (1, 1, 9, 5)]
    crops = [im1[0:6, 0:7], im1[2:12, 3:14], im2[1:9, 1:5]]
    want = _ref_probs([cio.resize_image(c, (H, W)) for c in crops], w, b, mean, 255, 1,
                      (2, 1, 0))
    np.testing.assert_allclose(np.stack([d["prediction"] for d in dets]), want,
                               rtol=1e-4, atol=1e-6)
    with pytest.raises(caffe.CaffeOclError, match="selective search"):
        det.detect_selective_search([str(tmp_path / "a.png")])
    with pytest.raises(ImportError):             # what pycaffe scripts catch
        det.detect_selective_search([str(tmp_path / "a.png")])


def test_detector_context_pad(model, tmp_path, rng):
    proto, weights, w, b = model
    # square input so the context crop geometry applies (R-CNN assumes square)
    sq = tmp_path / "sq.prototxt"
    sq.write_text(DEPLOY.replace(f"dim: {H} dim: {W}", "dim: 8 dim: 8"))
    mean = np.array([100.0, 120.0, 90.0])
    det = caffe.Detector(str(sq), None, mean=mean.astype(np.float32), raw_scale=255,
                         channel_swap=(2, 1, 0), context_pad=2)
    assert tuple(det.crop_dims) == (8, 8, 3)
    # context mean is in raw input space: un-swapped channels, divided by raw_scale
    np.testing.assert_allclose(det.crop_mean.reshape(-1), mean[[2, 1, 0]] / 255, rtol=1e-6)
    im = rng.random((20, 20, 3)).astype(np.float32)
    inner = det.crop(im, (6, 6, 13, 13))            # context fits inside the image
    assert inner.shape == (8, 8, 3)
    # the window (8 px) maps to the central 4 px, context to a 2 px border
    box = np.round(np.tile((6 + 4, 6 + 4), 2) + 2.0 * np.array((-4, -4, 4, 4)))
    want = cio.resize_image(im[int(box[0]):int(box[2]), int(box[1]):int(box[3])], (8, 8))
    np.testing.assert_allclose(inner, want, rtol=1e-5, atol=1e-6)
    edge = det.crop(im, (0, 0, 7, 7))               # context leaves the image: mean pad
    np.testing.assert_allclose(edge[0, 0], mean[[2, 1, 0]] / 255, rtol=1e-6)
    assert not np.allclose(edge[-1, -1], mean[[2, 1, 0]] / 255)
    path = tmp_path / "c.png"
    _write_png(path, im)
    dets = det.detect_windows([(str(path), [(0, 0, 7, 7), (6, 6, 13, 13)])])
    p = np.stack([d["prediction"] for d in dets])
    assert p.shape == (2, NCLS) and np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(1), 1, rtol=1e-5)
