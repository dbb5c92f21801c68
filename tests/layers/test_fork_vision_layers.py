"""Fork layers of segmentation / mobile / Faster R-CNN nets (layers/fork_vision.py)
against float64 NumPy references written from each fork's source, with
gradient checks: Pooling's ceil_mode, ShuffleChannel, Axpy, Interp,
Upsample (SegNet max-unpooling and the YOLO ports' nearest), ROIPooling and
the depthwise convolution type names."""
import math

import numpy as np
import pytest

import refs
from caffe_ocl import LayerError, ShapeError
from caffe_ocl.testing import check_gradient, forward, make_layer


# ---- Pooling ceil_mode ------------------------------------------------------
def _pool(extra):
    return ('type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 '
            f'{extra} }}')


@pytest.mark.parametrize("extra,ceil", [("ceil_mode: true", True), ("ceil_mode: false", False),
                                        ("ceil_mode: false round_mode: FLOOR", False),
                                        ("round_mode: FLOOR", False), ("", True)])
def test_pooling_ceil_mode(rng, extra, ceil):
    x = rng.standard_normal((1, 2, 14, 14))
    layer, b, t = make_layer(_pool(extra), [x])
    (y,) = forward(layer, b, t)
    ref = refs.pool2d(x, (3, 3), (2, 2), (0, 0), "max", ceil=ceil)
    assert y.shape == ref.shape == ((1, 2, 7, 7) if ceil else (1, 2, 6, 6))
    np.testing.assert_allclose(y, ref, rtol=1e-6)


def test_pooling_ceil_mode_contradicting_round_mode(rng):
    with pytest.raises(LayerError, match="ceil_mode: false contradicts round_mode: CEIL"):
        make_layer(_pool("ceil_mode: false round_mode: CEIL"), [rng.standard_normal((1, 1, 5, 5))])


# ---- depthwise type names ---------------------------------------------------
@pytest.mark.parametrize("type_", ["DepthwiseConvolution", "ConvolutionDepthwise"])
def test_depthwise_convolution_types(rng, type_):
    x = rng.standard_normal((2, 3, 6, 5))
    text = (f'type: "{type_}" convolution_param {{ num_output: 3 group: 3 kernel_size: 3 pad: 1 '
            'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" } }')
    layer, b, t = make_layer(text, [x])
    (y,) = forward(layer, b, t)
    w, bias = layer.blobs[0].data.astype(np.float64), layer.blobs[1].data.astype(np.float64)
    assert w.shape == (3, 1, 3, 3)
    np.testing.assert_allclose(y, refs.conv2d(x, w, bias, pad=(1, 1), group=3), rtol=1e-5,
                               atol=1e-5)


# ---- ShuffleChannel ---------------------------------------------------------
@pytest.mark.parametrize("shape,group", [((2, 6, 3, 2), 2), ((1, 12, 2, 3), 3), ((2, 4, 1, 1), 4)])
def test_shuffle_channel(rng, shape, group):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "ShuffleChannel" shuffle_channel_param {{ group: {group} }}',
                             [x])
    (y,) = forward(layer, b, t)
    n, c = shape[:2]
    ref = x.reshape(n, group, c // group, -1).transpose(0, 2, 1, 3).reshape(shape)
    np.testing.assert_array_equal(y, ref.astype(np.float32))
    check_gradient(layer, b, t)


def test_shuffle_channel_group_must_divide(rng):
    with pytest.raises(ShapeError, match="not divisible by group 4"):
        make_layer('type: "ShuffleChannel" shuffle_channel_param { group: 4 }',
                   [rng.standard_normal((1, 6, 2, 2))])


# ---- Axpy -------------------------------------------------------------------
def test_axpy(rng):
    a = rng.standard_normal((2, 3, 1, 1))
    x = rng.standard_normal((2, 3, 4, 5))
    yb = rng.standard_normal((2, 3, 4, 5))
    layer, b, t = make_layer('type: "Axpy"', [a, x, yb])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, a * x + yb, rtol=1e-5, atol=1e-6)
    check_gradient(layer, b, t)
    with pytest.raises(ShapeError, match="must be \\(N, C, 1, 1\\)"):
        make_layer('type: "Axpy"', [rng.standard_normal((2, 2, 1, 1)), x, yb])


# ---- Interp -----------------------------------------------------------------
def interp2_ref(x, crop, eff, out):
    """caffe_cpu_interp2<Dtype, false> of DeepLab v2 / PSPNet, float64 (the
    fork computes the ratios and positions in float32, as here)."""
    (x1, y1), (h1, w1), (h2, w2) = crop, eff, out
    n, c, H1, W1 = x.shape
    y = np.zeros((n, c, h2, w2))
    if (h1, w1) == (h2, w2):
        return x[:, :, y1:y1 + h1, x1:x1 + w1].astype(np.float64)
    rh = np.float32(h1 - 1) / np.float32(h2 - 1) if h2 > 1 else np.float32(0)
    rw = np.float32(w1 - 1) / np.float32(w2 - 1) if w2 > 1 else np.float32(0)
    for oh in range(h2):
        hr = np.float32(rh * np.float32(oh))
        ih = int(hr)
        hp = 1 if ih < h1 - 1 else 0
        l1 = float(hr - ih)
        for ow in range(w2):
            wr = np.float32(rw * np.float32(ow))
            iw = int(wr)
            wp = 1 if iw < w1 - 1 else 0
            m1 = float(wr - iw)
            a, b = y1 + ih, x1 + iw
            y[:, :, oh, ow] = ((1 - l1) * ((1 - m1) * x[:, :, a, b] + m1 * x[:, :, a, b + wp])
                               + l1 * ((1 - m1) * x[:, :, a + hp, b]
                                       + m1 * x[:, :, a + hp, b + wp]))
    return y


INTERP_CASES = [
    # (input shape, interp_param text, expected output h, w, pad_beg)
    ((1, 2, 5, 4), "zoom_factor: 2", (9, 7), 0),
    ((2, 1, 9, 7), "shrink_factor: 2", (5, 4), 0),
    ((1, 2, 9, 8), "shrink_factor: 2 zoom_factor: 3", (13, 10), 0),
    ((1, 3, 4, 6), "height: 7 width: 3", (7, 3), 0),
    ((1, 2, 7, 7), "zoom_factor: 2 pad_beg: -1 pad_end: -1", (9, 9), -1),
    ((1, 1, 4, 5), "height: 4 width: 5", (4, 5), 0),          # same size: copy
    ((1, 1, 3, 3), "height: 1 width: 5", (1, 5), 0),          # one output row
]


@pytest.mark.parametrize("shape,text,out,pad", INTERP_CASES)
def test_interp(rng, shape, text, out, pad):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "Interp" interp_param {{ {text} }}', [x])
    (y,) = forward(layer, b, t)
    h, w = shape[2:]
    eff = (h + 2 * pad, w + 2 * pad)
    assert y.shape == shape[:2] + out
    np.testing.assert_allclose(y, interp2_ref(x, (-pad, -pad), eff, out), rtol=1e-5, atol=1e-6)
    check_gradient(layer, b, t)


def test_interp_size_from_second_bottom(rng):
    x = rng.standard_normal((1, 2, 4, 3))
    like = rng.standard_normal((1, 5, 6, 8))
    layer, b, t = make_layer('type: "Interp"', [x, like])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, interp2_ref(x, (0, 0), (4, 3), (6, 8)), rtol=1e-5, atol=1e-6)
    with pytest.raises(LayerError, match="ambiguous"):
        make_layer('type: "Interp" interp_param { zoom_factor: 2 }', [x, like])
    with pytest.raises(LayerError, match="unspecified"):
        make_layer('type: "Interp"', [x])


# ---- Upsample ---------------------------------------------------------------
def test_upsample_segnet_unpools_with_the_pooling_mask(rng):
    x = rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) * 0.1
    pool, pb, pt = make_layer('type: "Pooling" pooling_param { pool: MAX kernel_size: 2 '
                              'stride: 2 }', [x], ntop=2)
    pooled, mask = forward(pool, pb, pt)
    assert pooled.shape == (2, 3, 4, 3)
    # 7 x 6 input: 4 x 3 pooled, scale 2 with pad_out_h gives 7 x 6 back
    layer, b, t = make_layer('type: "Upsample" upsample_param { scale: 2 pad_out_h: true }',
                             [pooled, mask])
    (y,) = forward(layer, b, t)
    ref = np.zeros((2, 3, 7 * 6))
    for n in range(2):
        for c in range(3):
            ref[n, c, mask[n, c].astype(int).ravel()] = pooled[n, c].ravel()
    assert y.shape == (2, 3, 7, 6)
    np.testing.assert_array_equal(y, ref.reshape(y.shape).astype(np.float32))
    # every maximum goes back to where it was taken from
    np.testing.assert_array_equal(y[y != 0], x.astype(np.float32)[y != 0])
    check_gradient(layer, b, t, check_bottom=[0])
    # explicit output size
    layer, b, t = make_layer('type: "Upsample" upsample_param { upsample_h: 8 upsample_w: 7 }',
                             [pooled, mask])
    assert forward(layer, b, t)[0].shape == (2, 3, 8, 7)


def test_upsample_nearest_yolo(rng):
    x = rng.standard_normal((2, 3, 3, 4))
    layer, b, t = make_layer('type: "Upsample" upsample_param { scale: 2 }', [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_array_equal(y, x.repeat(2, 2).repeat(2, 3).astype(np.float32))
    check_gradient(layer, b, t)


def test_upsample_bad_params(rng):
    x = rng.standard_normal((1, 1, 2, 2))
    with pytest.raises(LayerError, match="together"):
        make_layer('type: "Upsample" upsample_param { upsample_h: 4 }', [x, x])
    with pytest.raises(ShapeError, match="mask bottom"):
        make_layer('type: "Upsample" upsample_param { scale: 2 }',
                   [x, rng.standard_normal((1, 1, 3, 2))])


# ---- ROIPooling -------------------------------------------------------------
def _round(v):
    """C's round(): halves away from zero."""
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


def roi_pool_ref(x, rois, ph_n, pw_n, scale):
    """ROIPoolForward of caffe-fast-rcnn's roi_pooling_layer.cu (float64)."""
    n, c, h, w = x.shape
    y = np.zeros((len(rois), c, ph_n, pw_n))
    for r, roi in enumerate(rois):
        b = int(roi[0])
        sw, sh, ew, eh = (_round(float(np.float32(v) * np.float32(scale))) for v in roi[1:])
        rw, rh = max(ew - sw + 1, 1), max(eh - sh + 1, 1)
        bh, bw = np.float32(rh) / np.float32(ph_n), np.float32(rw) / np.float32(pw_n)
        for ph in range(ph_n):
            for pw in range(pw_n):
                hs = min(max(int(math.floor(np.float32(ph) * bh)) + sh, 0), h)
                he = min(max(int(math.ceil(np.float32(ph + 1) * bh)) + sh, 0), h)
                ws = min(max(int(math.floor(np.float32(pw) * bw)) + sw, 0), w)
                we = min(max(int(math.ceil(np.float32(pw + 1) * bw)) + sw, 0), w)
                if he <= hs or we <= ws:
                    continue
                y[r, :, ph, pw] = x[b, :, hs:he, ws:we].max(axis=(1, 2))
    return y


def test_roi_pooling(rng):
    x = rng.permutation(2 * 3 * 12 * 10).reshape(2, 3, 12, 10) * 0.01 - 3.0
    rois = np.array([[0, 0, 0, 39, 47],        # the whole image at scale 1/4
                     [1, 5, 6, 20, 30],
                     [0, 12, 3, 13, 4],        # smaller than the bins: bins repeat
                     [1, 30, 30, 25, 20],      # malformed: forced to 1 x 1
                     [0, 60, 60, 80, 80],      # outside the image: zeros
                     [1, -8, -8, 10, 6]])      # partly outside
    text = ('type: "ROIPooling" roi_pooling_param { pooled_h: 3 pooled_w: 2 '
            'spatial_scale: 0.25 }')
    layer, b, t = make_layer(text, [x, rois])
    (y,) = forward(layer, b, t)
    assert y.shape == (6, 3, 3, 2)
    np.testing.assert_allclose(y, roi_pool_ref(x, rois, 3, 2, 0.25), rtol=1e-6, atol=1e-6)
    assert not y[4].any()
    # the fork's backward skips inputs outside [start, end] of a roi, so a
    # malformed roi (end < start, forced to 1 x 1 forward) passes no gradient
    # (its quirk, kept); the gradient check runs without that one
    layer, b, t = make_layer(text, [x, np.delete(rois, 3, axis=0)])
    check_gradient(layer, b, t, check_bottom=[0], stepsize=1e-3)


def test_roi_pooling_rejects_bad_rois(rng):
    x = rng.standard_normal((1, 1, 4, 4))
    with pytest.raises(ShapeError, match="rows of 5"):
        make_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 2 pooled_w: 2 }',
                   [x, np.zeros((2, 4))])


# ---- BN (SegNet / ENet) -----------------------------------------------------
BN_FILLERS = ('scale_filler { type: "uniform" min: 0.5 max: 1.5 } '
              'shift_filler { type: "uniform" min: -1 max: 1 }')


def test_bn_learn_uses_batch_statistics(rng):
    x = rng.standard_normal((3, 4, 3, 5)) * 2 + 1
    layer, b, t = make_layer(f'type: "BN" bn_param {{ {BN_FILLERS} }}', [x])
    (y,) = forward(layer, b, t)
    scale = layer.blobs[0].data.astype(np.float64)
    shift = layer.blobs[1].data.astype(np.float64)
    assert scale.shape == shift.shape == (1, 4, 1, 1)
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = (x ** 2).mean(axis=(0, 2, 3), keepdims=True) - mean ** 2
    ref = scale * (x - mean) / np.sqrt(var + 1e-9) + shift
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    check_gradient(layer, b, t, stepsize=1e-2, threshold=1e-2)


def test_bn_inference_is_scale_and_shift(rng):
    x = rng.standard_normal((2, 3, 4, 2))
    layer, b, t = make_layer(f'type: "BN" bn_param {{ bn_mode: INFERENCE {BN_FILLERS} }}', [x])
    (y,) = forward(layer, b, t)
    scale = layer.blobs[0].data.astype(np.float64)
    shift = layer.blobs[1].data.astype(np.float64)
    np.testing.assert_allclose(y, scale * x + shift, rtol=1e-5, atol=1e-6)
    check_gradient(layer, b, t)
