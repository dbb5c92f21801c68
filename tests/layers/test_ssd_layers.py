"""SSD fork layers (Normalize, Permute, PriorBox, DetectionOutput) against
float64 NumPy references written from weiliu89/caffe (branch ssd):
normalize_layer.cpp, permute_layer.cpp, prior_box_layer.cpp,
detection_output_layer.cu and util/bbox_util.cpp."""
import math

import numpy as np
import pytest

from caffe_ocl.errors import CaffeOclError, LayerError
from caffe_ocl.testing import check_gradient, forward, make_layer

RNG = np.random.default_rng(7)


# ---------------------------------------------------------------- references
def ref_normalize(x, scale, across, shared, eps):
    x = x.astype(np.float64)
    n, c = x.shape[:2]
    xs = x.reshape(n, c, -1)
    if across:
        norm = np.sqrt((xs ** 2).sum(axis=(1, 2)) + eps)[:, None, None]
    else:
        norm = np.sqrt((xs ** 2).sum(axis=1) + eps)[:, None, :]
    y = xs / norm
    y = y * (scale.reshape(()) if shared else scale.reshape(1, c, 1))
    return y.reshape(x.shape)


def ref_prior_box(fh, fw, ih, iw, min_sizes, max_sizes=(), ars=(), flip=True, clip=False,
                  variance=(), img=None, step=None, offset=0.5, widths=(), heights=(),
                  offsets=None):
    if widths:
        boxes = list(zip(widths, heights))
    else:
        a = [1.0]
        for r in ars:
            if any(abs(r - q) < 1e-6 for q in a):
                continue
            a.append(r)
            if flip:
                a.append(1.0 / r)
        boxes = []
        for s, m in enumerate(min_sizes):
            m = int(m)
            boxes.append((m, m))
            if max_sizes:
                side = math.sqrt(m * int(max_sizes[s]))
                boxes.append((side, side))
            for r in a:
                if abs(r - 1.0) < 1e-6:
                    continue
                boxes.append((m * math.sqrt(r), m / math.sqrt(r)))
    offs = offsets or [(offset, offset)]
    img_h, img_w = img if img else (ih, iw)
    step_h, step_w = step if step else (np.float32(img_h) / fh, np.float32(img_w) / fw)
    out = []
    for h in range(fh):
        for w in range(fw):
            for bw, bh in boxes:
                for ox, oy in offs:
                    cx, cy = (w + ox) * step_w, (h + oy) * step_h
                    out += [(cx - bw / 2.) / img_w, (cy - bh / 2.) / img_h,
                            (cx + bw / 2.) / img_w, (cy + bh / 2.) / img_h]
    out = np.array(out)
    if clip:
        out = np.clip(out, 0, 1)
    var = list(variance) or [0.1]
    v = np.tile(var if len(var) == 4 else var * 4, out.size // 4)
    return np.stack([out, v])[None]


def _size(b, normalized):
    if b[2] < b[0] or b[3] < b[1]:
        return 0.0
    w, h = b[2] - b[0], b[3] - b[1]
    return w * h if normalized else (w + 1) * (h + 1)


def _jaccard(a, b, normalized=True):
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = iw * ih if normalized else (iw + 1) * (ih + 1)
    return inter / (_size(a, normalized) + _size(b, normalized) - inter)


def ref_decode(loc, prior, code, var_in_target, clip=False):
    """loc [P, 4], prior [2, P*4] -> boxes [P, 4] (float64)."""
    pr = prior[0].reshape(-1, 4).astype(np.float64)
    var = np.ones_like(pr) if var_in_target else prior[1].reshape(-1, 4).astype(np.float64)
    loc = loc.astype(np.float64)
    if code == 1:
        out = pr + loc * var
    elif code == 2:
        pw, ph = pr[:, 2] - pr[:, 0], pr[:, 3] - pr[:, 1]
        cx = var[:, 0] * loc[:, 0] * pw + (pr[:, 0] + pr[:, 2]) / 2
        cy = var[:, 1] * loc[:, 1] * ph + (pr[:, 1] + pr[:, 3]) / 2
        w = np.exp(var[:, 2] * loc[:, 2]) * pw
        h = np.exp(var[:, 3] * loc[:, 3]) * ph
        out = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    else:
        size = np.stack([pr[:, 2] - pr[:, 0], pr[:, 3] - pr[:, 1],
                         pr[:, 2] - pr[:, 0], pr[:, 3] - pr[:, 1]], 1)
        out = pr + loc * var * size
    return np.clip(out, 0, 1) if clip else out


def ref_nms(boxes, scores, thresh, nms_thresh, eta, top_k, normalized=True):
    cand = [(s, i) for i, s in enumerate(scores) if s > thresh]
    cand.sort(key=lambda t: (-t[0], t[1]))
    if top_k > -1:
        cand = cand[:top_k]
    keep, adaptive = [], nms_thresh
    for _, idx in cand:
        ok = all(_jaccard(boxes[idx], boxes[k], normalized) <= adaptive for k in keep)
        if ok:
            keep.append(idx)
            if eta < 1 and adaptive > 0.5:
                adaptive *= eta
    return keep


def ref_detection_output(loc, conf, prior, ncls, share=True, background=0, code=1,
                         var_in_target=False, thresh=-np.inf, nms_thresh=0.3, eta=1.0,
                         top_k=-1, keep_top_k=-1, normalized=True, clip=False):
    num = loc.shape[0]
    P = prior.shape[-1] // 4
    nlc = 1 if share else ncls
    loc = loc.reshape(num, P, nlc, 4)
    conf = conf.reshape(num, P, ncls).astype(np.float64)
    rows = []
    for n in range(num):
        boxes = {c: ref_decode(loc[n, :, 0 if share else c], prior[0], code, var_in_target,
                               clip) for c in range(nlc)}
        kept = {}
        for c in range(ncls):
            if c == background:
                continue
            kept[c] = ref_nms(boxes[0 if share else c], conf[n, :, c], thresh, nms_thresh,
                              eta, top_k, normalized)
        total = sum(len(v) for v in kept.values())
        if keep_top_k > -1 and total > keep_top_k:
            allk = [(conf[n, i, c], c, j, i) for c in sorted(kept) for j, i in enumerate(kept[c])]
            allk.sort(key=lambda t: (-t[0], t[1], t[2]))
            new = {}
            for _, c, _, i in allk[:keep_top_k]:
                new.setdefault(c, []).append(i)
            kept = new
        for c in sorted(kept):
            for i in kept[c]:
                rows.append([n, c, conf[n, i, c], *boxes[0 if share else c][i]])
    if not rows:
        rows = [[n] + [-1] * 6 for n in range(num)]
    return np.array(rows, np.float64).reshape(1, 1, -1, 7)


# ---------------------------------------------------------------- Normalize
@pytest.mark.parametrize("across,shared", [(True, True), (False, False), (True, False),
                                           (False, True)])
def test_normalize_forward_backward(across, shared):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    text = (f'type: "Normalize" norm_param {{ across_spatial: {str(across).lower()} '
            f'channel_shared: {str(shared).lower()} eps: 1e-6 '
            f'scale_filler {{ type: "gaussian" mean: 2 std: 0.5 }} }}')
    layer, b, t = make_layer(text, [x])
    scale = layer.blobs[0].host_data().copy()
    assert scale.shape == (() if shared else (3,))
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, ref_normalize(x, scale, across, shared, 1e-6),
                               rtol=1e-5, atol=1e-6)
    check_gradient(layer, b, t, stepsize=1e-3, threshold=2e-3)


def test_normalize_default_scale_is_one_and_2d_bottom():
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    layer, b, t = make_layer('type: "Normalize" norm_param { across_spatial: false }', [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, x / np.sqrt((x.astype(np.float64) ** 2).sum(1, keepdims=True)
                                              + 1e-10), rtol=1e-5)


# ------------------------------------------------------------------ Permute
@pytest.mark.parametrize("order", [(0, 2, 3, 1), (3, 1, 0, 2), (0, 1, 2, 3), (1, 0)])
def test_permute(order):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    text = 'type: "Permute" permute_param { ' + " ".join(f"order: {o}" for o in order) + " }"
    layer, b, t = make_layer(text, [x])
    full = list(order) + [i for i in range(4) if i not in order]
    (y,) = forward(layer, b, t)
    np.testing.assert_array_equal(y, np.transpose(x, full))
    check_gradient(layer, b, t, stepsize=1e-2, threshold=1e-3)


# orders that swap two runs of axes (a batched transpose on CPU drivers,
# ops/ssd.py transpose_shape), on shapes whose rows are not a multiple of
# 8 and whose columns span more than one 64-column block, or both a
# multiple of 8 (8 x 8 blocks transposed in registers only)
@pytest.mark.parametrize("shape,order", [((2, 19, 9, 11), (0, 2, 3, 1)),
                                         ((1, 16, 70), (0, 2, 1)),
                                         ((2, 24, 136), (0, 2, 1)),
                                         ((3, 5, 2, 13), (0, 3, 1, 2)),
                                         ((9, 4, 3), (1, 2, 0)),
                                         ((2, 3, 4, 5, 6), (0, 1, 4, 2, 3))])
def test_permute_as_transpose(shape, order):
    from caffe_ocl.ops import ssd as ssd_ops
    assert ssd_ops.transpose_shape(shape, order) is not None
    check_permute_both_ways(shape, order)


def check_permute_both_ways(shape, order):
    """Permute forward against np.transpose, backward against the inverse."""
    x = RNG.standard_normal(shape).astype(np.float32)
    text = 'type: "Permute" permute_param { ' + " ".join(f"order: {o}" for o in order) + " }"
    layer, b, t = make_layer(text, [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_array_equal(y, np.transpose(x, order))
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    t[0].diff[...] = dy
    layer.backward(t, [True], b)
    np.testing.assert_array_equal(b[0].host_diff(), np.transpose(dy, np.argsort(order)))


# other orders, a row of the output at a time on CPU drivers (ops/ssd.py
# row_plan): keeping the last axes in place (attention's head split: rows
# copied whole) or moving the last axis (MobileViT's unfold: rows gathered
# at a stride), with enough rows for several work-items
@pytest.mark.parametrize("shape,order", [((2, 37, 3, 2, 16), (2, 0, 3, 1, 4)),
                                         ((3, 41, 4, 6), (1, 0, 2, 3)),
                                         ((2, 3, 5, 7, 9), (0, 2, 1, 3, 4)),
                                         ((2, 6, 4, 2, 5, 2), (0, 3, 5, 2, 4, 1)),
                                         ((3, 5, 7, 11), (3, 1, 0, 2))])
def test_permute_by_rows(shape, order):
    from caffe_ocl.ops import ssd as ssd_ops
    assert ssd_ops.row_plan(shape, order) is not None
    check_permute_both_ways(shape, order)


@pytest.mark.parametrize("shape,order", [((2, 19, 9, 11), (0, 2, 3, 1)),
                                         ((1, 70, 33), (0, 2, 1)),
                                         ((2, 37, 3, 2, 16), (2, 0, 3, 1, 4)),
                                         ((2, 6, 4, 2, 5, 2), (0, 3, 5, 2, 4, 1)),
                                         ((3, 5, 7, 11), (3, 1, 0, 2))])
def test_permute_gpu_kernels(d, shape, order):
    """The GPUs' Permute kernels run on the test device: a batched transpose
    through 32 x 32 local tiles (edges of partial tiles, several batches)
    and the output's rows a float per work-item (kept last axes, or the
    last axis read at a stride), forward and backward."""
    from caffe_ocl.ops import ssd as ssd_ops
    from caffe_ocl.layers.ssd import int_buffer
    x = RNG.standard_normal(shape).astype(np.float32)
    y = np.transpose(x, order)
    xb, yb = d.buf(x), d.buf(np.full(x.size, np.nan))
    back = d.buf(np.full(x.size, np.nan))
    tr = ssd_ops.transpose_shape(shape, order)
    if tr is not None:
        outer, rows, cols = tr
        d.run([ssd_ops.transpose_gpu(d.dev, outer, rows, cols, xb, yb),
               ssd_ops.transpose_gpu(d.dev, outer, cols, rows, yb, back)])
    else:
        plan = ssd_ops.row_plan(shape, order)
        geom = int_buffer(d.dev, ssd_ops.permute_geom(shape, order, plan[2]))
        d.run([ssd_ops.permute_runs(d.dev, plan, x.size, geom, xb, yb),
               ssd_ops.permute_runs(d.dev, plan, x.size, geom, yb, back, forward=False)])
    np.testing.assert_array_equal(d.get(yb, y.shape), y)
    np.testing.assert_array_equal(d.get(back, x.shape), x)


@pytest.mark.parametrize("outer,rows,cols", [(2, 19, 99), (1, 24, 136), (3, 8, 8), (1, 9, 7)])
def test_transpose_cpu_kernel(d, outer, rows, cols):
    """The CPU drivers' batched transpose (ops/ssd.py transpose) runs on the
    test device (Oclgrind, a GPU-like device, too): 8 x 8 blocks transposed
    in registers, the block's column edge gathered 8 rows at a time, rows
    past a multiple of 8 one float at a time; there and back."""
    from caffe_ocl.ops import ssd as ssd_ops
    x = RNG.standard_normal((outer, rows, cols)).astype(np.float32)
    xb, yb = d.buf(x), d.buf(np.full(x.size, np.nan))
    back = d.buf(np.full(x.size, np.nan))
    d.run([ssd_ops.transpose(d.dev, outer, rows, cols, xb, yb),
           ssd_ops.transpose(d.dev, outer, cols, rows, yb, back)])
    np.testing.assert_array_equal(d.get(yb, (outer, cols, rows)), x.transpose(0, 2, 1))
    np.testing.assert_array_equal(d.get(back, x.shape), x)


def test_transpose_shape_only_for_two_runs():
    from caffe_ocl.ops import ssd as ssd_ops
    shape = (2, 3, 4, 5)
    assert ssd_ops.transpose_shape(shape, (0, 2, 3, 1)) == (2, 3, 20)
    assert ssd_ops.transpose_shape(shape, (2, 3, 0, 1)) == (1, 6, 20)
    assert ssd_ops.transpose_shape(shape, (0, 1, 2, 3)) is None
    assert ssd_ops.transpose_shape(shape, (3, 1, 0, 2)) is None
    assert ssd_ops.transpose_shape(shape, (0, 3, 2, 1)) is None


def test_permute_bad_order():
    x = np.zeros((1, 2, 3), np.float32)
    with pytest.raises(CaffeOclError, match="out of range"):
        make_layer('type: "Permute" permute_param { order: 0 order: 3 }', [x])
    with pytest.raises(LayerError, match="twice"):
        make_layer('type: "Permute" permute_param { order: 1 order: 1 }', [x])


# ----------------------------------------------------------------- PriorBox
PRIOR_CASES = [
    ("min_size: 30 max_size: 60 aspect_ratio: 2 flip: true clip: false "
     "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2",
     dict(min_sizes=[30], max_sizes=[60], ars=[2], variance=[.1, .1, .2, .2])),
    ("min_size: 20.7 min_size: 40 max_size: 50 max_size: 80.5 aspect_ratio: 2 "
     "aspect_ratio: 3 aspect_ratio: 2 flip: false clip: true variance: 0.1 step: 8 offset: 0.3",
     dict(min_sizes=[20.7, 40], max_sizes=[50, 80.5], ars=[2, 3], flip=False, clip=True,
          variance=[.1], step=(8, 8), offset=0.3)),
    ("min_size: 16 aspect_ratio: 0.5 img_h: 100 img_w: 80 step_h: 10 step_w: 12",
     dict(min_sizes=[16], ars=[0.5], img=(100, 80), step=(10, 12))),
    ("min_size: 16 img_size: 64",
     dict(min_sizes=[16], img=(64, 64))),
    ("width: 10 height: 20 width: 30 height: 5 offset_h: 0.25 offset_w: 0.5 offset_h: 0.75 "
     "offset_w: 0.5 clip: true",
     dict(min_sizes=[], widths=[10, 30], heights=[20, 5], offsets=[(.5, .25), (.5, .75)],
          clip=True)),
]


@pytest.mark.parametrize("text,kw", PRIOR_CASES)
def test_prior_box(text, kw):
    f = np.zeros((1, 2, 3, 4), np.float32)
    im = np.zeros((1, 3, 30, 44), np.float32)
    layer, b, t = make_layer(f'type: "PriorBox" prior_box_param {{ {text} }}', [f, im])
    (y,) = forward(layer, b, t)
    ref = ref_prior_box(3, 4, 30, 44, **kw)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("text,msg", [
    ("aspect_ratio: 2", "min_size"),
    ("min_size: 10 max_size: 5", "greater than"),
    ("min_size: 10 variance: 0.1 variance: 0.2", "1 or 4"),
    ("min_size: 10 img_size: 4 img_h: 3 img_w: 3", "not both"),
    ("min_size: 10 step: 4 step_h: 3 step_w: 3", "not both"),
    ("width: 10", "pairs"),
])
def test_prior_box_errors(text, msg):
    f, im = np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 8, 8), np.float32)
    with pytest.raises(LayerError, match=msg):
        make_layer(f'name: "pb" type: "PriorBox" prior_box_param {{ {text} }}', [f, im])


# ---------------------------------------------------------- DetectionOutput
def _det_inputs(num, P, ncls, share, rng, spread=0.3):
    centers = rng.uniform(0.1, 0.9, (P, 2))
    sizes = rng.uniform(0.05, 0.4, (P, 2))
    pr = np.concatenate([centers - sizes / 2, centers + sizes / 2], 1)
    var = np.tile([0.1, 0.1, 0.2, 0.2], (P, 1))
    prior = np.stack([pr.ravel(), var.ravel()])[None].astype(np.float32)
    nlc = 1 if share else ncls
    loc = (rng.standard_normal((num, P * nlc * 4)) * spread).astype(np.float32)
    logits = rng.standard_normal((num, P, ncls)) * 2
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return loc, conf.reshape(num, -1).astype(np.float32), prior


DET_CASES = [
    ("", {}),
    ("code_type: CENTER_SIZE nms_param { nms_threshold: 0.45 top_k: 20 } "
     "confidence_threshold: 0.2 keep_top_k: 7",
     dict(code=2, nms_thresh=0.45, top_k=20, thresh=0.2, keep_top_k=7)),
    ("code_type: CORNER_SIZE variance_encoded_in_target: true background_label_id: 2 "
     "nms_param { nms_threshold: 0.6 eta: 0.8 } confidence_threshold: 0.1",
     dict(code=3, var_in_target=True, background=2, nms_thresh=0.6, eta=0.8, thresh=0.1)),
    ("share_location: false code_type: CENTER_SIZE background_label_id: -1 "
     "nms_param { nms_threshold: 0.3 top_k: 10 } keep_top_k: 12 confidence_threshold: 0.05",
     dict(share=False, code=2, background=-1, top_k=10, keep_top_k=12, thresh=0.05)),
    ("code_type: CENTER_SIZE normalized_bbox: false clip: true confidence_threshold: 0.3",
     dict(code=2, normalized=False, clip=True, thresh=0.3)),
]


@pytest.mark.parametrize("text,kw", DET_CASES)
def test_detection_output(text, kw):
    rng = np.random.default_rng(3)
    num, P, ncls = 2, 40, 4
    share = kw.get("share", True)
    loc, conf, prior = _det_inputs(num, P, ncls, share, rng)
    layer, b, t = make_layer(
        f'type: "DetectionOutput" detection_output_param {{ num_classes: {ncls} {text} }}',
        [loc, conf, prior])
    (y,) = forward(layer, b, t)
    ref = ref_detection_output(loc, conf, prior, ncls, **kw)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert y.shape[2] > 1


def test_detection_output_nothing_found_and_refill():
    rng = np.random.default_rng(5)
    loc, conf, prior = _det_inputs(3, 10, 3, True, rng)
    layer, b, t = make_layer('type: "DetectionOutput" detection_output_param { num_classes: 3 '
                             'confidence_threshold: 0.999 }', [loc, conf, prior])
    (y,) = forward(layer, b, t)
    np.testing.assert_array_equal(y, [[[[0, -1, -1, -1, -1, -1, -1], [1, -1, -1, -1, -1, -1, -1],
                                        [2, -1, -1, -1, -1, -1, -1]]]])
    # now values that pass: the top grows in place, then shrinks again
    conf2 = np.zeros_like(conf).reshape(3, 10, 3)
    conf2[..., 1] = 1.0
    b[1].data[...] = conf2.reshape(3, -1)
    (y,) = forward(layer, b, t)
    ref = ref_detection_output(loc, conf2.reshape(3, -1), prior, 3, thresh=0.999)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_detection_output_bad_shapes():
    rng = np.random.default_rng(1)
    loc, conf, prior = _det_inputs(1, 10, 3, True, rng)
    with pytest.raises(CaffeOclError, match="num_priors"):
        make_layer('name: "d" type: "DetectionOutput" detection_output_param { num_classes: 4 }',
                   [loc, conf, prior])


def test_detection_output_equal_scores_order():
    """Equal scores: lower prior index first within a class, lower label
    first across classes when keep_top_k trims (the fork's std::sort leaves
    this open; caffe_ocl fixes it)."""
    P, ncls = 6, 3
    pr = np.array([[i * 0.15, 0.1, i * 0.15 + 0.1, 0.2] for i in range(P)])
    prior = np.stack([pr.ravel(), np.full(P * 4, 0.1)])[None].astype(np.float32)
    loc = np.zeros((1, P * 4), np.float32)
    conf = np.zeros((1, P, ncls), np.float32)
    conf[..., 1:] = 0.5
    layer, b, t = make_layer('type: "DetectionOutput" detection_output_param { num_classes: 3 '
                             'keep_top_k: 8 }', [loc, conf.reshape(1, -1), prior])
    (y,) = forward(layer, b, t)
    rows = y.reshape(-1, 7)
    assert rows[:, 1].tolist() == [1] * 6 + [2] * 2
    np.testing.assert_allclose(rows[:6, 3], pr[:, 0], atol=1e-6)
    np.testing.assert_allclose(rows[6:, 3], pr[:2, 0], atol=1e-6)
    np.testing.assert_allclose(y, ref_detection_output(loc, conf.reshape(1, -1), prior, 3,
                                                       keep_top_k=8), atol=1e-6)


def test_detection_output_save_output_param_warns(caplog, tmp_path):
    """The fork writes result files under save_output_param.output_directory;
    caffe_ocl does not: it says so (naming the layer) and writes nothing."""
    rng = np.random.default_rng(2)
    loc, conf, prior = _det_inputs(1, 10, 3, True, rng)
    out = tmp_path / "results"
    with caplog.at_level("WARNING", logger="caffe_ocl"):
        layer, b, t = make_layer(
            'name: "det" type: "DetectionOutput" detection_output_param { num_classes: 3 '
            f'save_output_param {{ output_directory: "{out}" output_format: "VOC" }} }}',
            [loc, conf, prior])
        (y,) = forward(layer, b, t)
    assert any("'det'" in r.getMessage() and "save_output_param" in r.getMessage()
               for r in caplog.records)
    assert not out.exists()
    np.testing.assert_allclose(y, ref_detection_output(loc, conf, prior, 3), rtol=1e-5, atol=1e-5)
