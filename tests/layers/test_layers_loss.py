"""Loss and metric layers (caffe_ocl/layers/loss.py) against float64 NumPy
references written from BVLC Caffe's semantics, finite-difference gradient
checks, loss-weight scaling through the top diff, and bad inputs."""
import numpy as np
import pytest

from caffe_ocl import testing as T
from caffe_ocl.errors import CaffeOclError, LayerError, ShapeError
from caffe_ocl.proto import array_to_blobproto, write_binary

FLT_MIN = np.float32(np.finfo(np.float32).tiny)
RNG = np.random.default_rng(20240601)


# ---------------------------------------------------------------------------
# helpers and float64 references
# ---------------------------------------------------------------------------

def run_backward(layer, bottoms, tops, prop, top_diff=1.0):
    """Forward, set top[0].diff = top_diff (other tops 0), backward; bottom diffs."""
    T.forward(layer, bottoms, tops)
    tops[0].diff[...] = top_diff
    for t in tops[1:]:
        t.diff[...] = 0.0
    layer.backward(tops, prop, bottoms)
    return [b.host_diff().astype(np.float64).copy() for b in bottoms]


def split3(x, axis):
    axis = axis % x.ndim
    outer = int(np.prod(x.shape[:axis]))
    inner = int(np.prod(x.shape[axis + 1:]))
    return x.reshape(outer, x.shape[axis], inner)


def normalizer(mode, outer, inner, valid):
    n = {"FULL": outer * inner, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return max(1.0, float(n))


def softmax3(x3):
    e = np.exp(x3 - x3.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def softmax_loss_ref(x, lab, axis=1, ignore=None, mode="VALID", H=None):
    """(loss, prob, grad for loss weight 1); H given -> InfogainLoss."""
    x3 = split3(x.astype(np.float64), axis)
    outer, C, inner = x3.shape
    p = softmax3(x3)
    lab = lab.reshape(outer, inner).astype(np.int64)
    valid = np.ones_like(lab, bool) if ignore is None else lab != ignore
    ls = np.where(valid, lab, 0)
    if H is None:
        pt = np.take_along_axis(p, ls[:, None, :], 1)[:, 0, :]
        per = -np.log(np.maximum(pt, FLT_MIN))
        grad = p.copy()
        np.put_along_axis(grad, ls[:, None, :],
                          np.take_along_axis(grad, ls[:, None, :], 1) - 1.0, 1)
    else:
        H = H.astype(np.float64).reshape(C, C)
        Hl = np.transpose(H[ls], (0, 2, 1))            # [outer][C][inner] = H[label, c]
        per = -(Hl * np.log(np.maximum(p, 1e-20))).sum(1)
        grad = p * H.sum(1)[ls][:, None, :] - Hl
    n = normalizer(mode, outer, inner, valid.sum())
    grad = grad * valid[:, None, :] / n
    return (per * valid).sum() / n, p.reshape(x.shape), grad.reshape(x.shape)


def sigmoid_ce_ref(x, t, ignore=None, mode="BATCH_SIZE"):
    x = x.astype(np.float64)
    t = t.astype(np.float64)
    valid = np.ones(x.shape, bool) if ignore is None else t.astype(np.int64) != ignore
    pos = (x >= 0).astype(np.float64)
    per = -(x * (t - pos) - np.log1p(np.exp(x - 2 * x * pos)))
    outer = x.shape[0]
    n = normalizer(mode, outer, x.size // outer, valid.sum())
    grad = (1.0 / (1.0 + np.exp(-x)) - t) * valid / n
    return (per * valid).sum() / n, grad


def euclidean_ref(a, b):
    d = a.astype(np.float64) - b.reshape(a.shape).astype(np.float64)
    num = a.shape[0]
    return (d ** 2).sum() / num / 2, d / num, (-d / num).reshape(b.shape)


def hinge_ref(x, lab, p):
    num = x.shape[0]
    x2 = x.reshape(num, -1).astype(np.float64)
    s = np.ones_like(x2)
    s[np.arange(num), lab.astype(np.int64).ravel()] = -1.0
    t = np.maximum(0.0, 1.0 + s * x2)
    if p == 1:
        return t.sum() / num, (s * (t > 0) / num).reshape(x.shape)
    return (t ** 2).sum() / num, (2 * s * t / num).reshape(x.shape)


def mlogistic_ref(x, lab):
    num = x.shape[0]
    x2 = x.reshape(num, -1).astype(np.float64)
    li = lab.astype(np.int64).ravel()
    pt = np.maximum(x2[np.arange(num), li], 1e-20)
    g = np.zeros_like(x2)
    g[np.arange(num), li] = -1.0 / pt / num
    return -np.log(pt).sum() / num, g.reshape(x.shape)


def contrastive_ref(a, b, y, margin=1.0, legacy=False):
    num = a.shape[0]
    d = (a.astype(np.float64) - b.astype(np.float64)).reshape(num, -1)
    d2 = (d ** 2).sum(1)
    sim = y.ravel().astype(np.int64) != 0
    dist = np.sqrt(d2)
    if legacy:
        dis = np.maximum(margin - d2, 0.0)
        mdist, beta = margin - d2, -np.ones(num)
    else:
        dis = np.maximum(margin - dist, 0.0) ** 2
        mdist = margin - dist
        beta = -mdist / (dist + 1e-4)
    loss = np.where(sim, d2, dis).sum() / num / 2
    coef = np.where(sim, 1.0, np.where(mdist > 0, beta, 0.0)) / num
    ga = coef[:, None] * d
    return loss, ga.reshape(a.shape), -ga.reshape(b.shape)


def accuracy_ref(x, lab, top_k=1, axis=1, ignore=None):
    x3 = split3(x.astype(np.float64), axis)
    outer, C, inner = x3.shape
    lab = lab.reshape(outer, inner).astype(np.int64)
    hits, nums = np.zeros(C), np.zeros(C)
    acc = count = 0
    for o in range(outer):
        for s in range(inner):
            l = lab[o, s]
            if ignore is not None and l == ignore:
                continue
            nums[l] += 1
            # Caffe: correct when fewer than top_k *other* classes score >= the true one
            ok = (x3[o, :, s] >= x3[o, l, s]).sum() <= top_k
            acc += ok
            hits[l] += ok
            count += 1
    per = np.where(nums == 0, 0.0, hits / np.maximum(nums, 1))
    return (acc / count if count else 0.0), per


def labels(shape, C, ignore=None, frac=0.3):
    lab = RNG.integers(0, C, shape).astype(np.float32)
    if ignore is not None:
        lab[RNG.random(shape) < frac] = ignore
    return lab


def loss_text(type_, extra="", tops=('"loss"',), bottoms=('"x"', '"label"')):
    b = " ".join(f"bottom: {n}" for n in bottoms)
    t = " ".join(f"top: {n}" for n in tops)
    return f'name: "l" type: "{type_}" {b} {t} {extra}'


def close(got, want, rtol=2e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# SoftmaxWithLoss
# ---------------------------------------------------------------------------

SOFTMAX_CASES = [
    # shape, axis, ignore, loss_param text, expected mode
    ((4, 5), 1, None, "", "VALID"),
    ((1, 7), 1, None, "", "VALID"),                                   # batch 1
    ((2, 4, 3, 5), 1, 2, "", "VALID"),                                # spatial inner
    ((2, 4, 3, 5), 1, 2, "normalization: FULL", "FULL"),
    ((2, 4, 3, 5), 1, 2, "normalization: BATCH_SIZE", "BATCH_SIZE"),
    ((2, 4, 3, 5), 1, 2, "normalization: NONE", "NONE"),
    ((2, 4, 3, 5), 1, 2, "normalize: false", "BATCH_SIZE"),           # legacy bool
    ((2, 4, 3, 5), 1, 2, "normalize: true", "VALID"),
    ((2, 4, 3, 5), 1, 2, "normalize: false normalization: FULL", "FULL"),  # explicit wins
    ((3, 2, 6, 2), 2, None, "", "VALID"),                             # axis 2, inner 2
    ((3, 2, 6, 2), -2, 0, "normalization: BATCH_SIZE", "BATCH_SIZE"),  # negative axis
]


@pytest.mark.parametrize("shape,axis,ignore,lp,mode", SOFTMAX_CASES)
def test_softmax_loss_forward_backward(shape, axis, ignore, lp, mode):
    x = RNG.standard_normal(shape).astype(np.float32) * 2
    ax = axis % len(shape)
    lab_shape = shape[:ax] + shape[ax + 1:]
    lab = labels(lab_shape, shape[ax], ignore)
    ig = f"ignore_label: {ignore}" if ignore is not None else ""
    text = loss_text("SoftmaxWithLoss", f"softmax_param {{ axis: {axis} }} "
                     f"loss_param {{ {ig} {lp} }}", tops=('"loss"', '"prob"'))
    layer, b, t = T.make_layer(text, [x, lab])
    assert t[0].shape == () and layer.loss_weights == [1.0, 0.0]
    loss, prob, grad = softmax_loss_ref(x, lab, axis, ignore, mode)
    out = T.forward(layer, b, t)
    close(out[0], loss)
    close(out[1], prob, atol=1e-6)
    g = run_backward(layer, b, t, [True, False], top_diff=2.0)
    close(g[0], 2.0 * grad, atol=1e-6)


def test_softmax_loss_all_ignored_and_large_logits():
    x = np.array([[100.0, -100.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    lab = np.array([1, 2], np.float32)
    layer, b, t = T.make_layer(loss_text("SoftmaxWithLoss"), [x, lab])
    loss, _, _ = softmax_loss_ref(x, lab)        # prob underflows -> FLT_MIN floor
    close(T.forward(layer, b, t)[0], loss, rtol=1e-5)
    assert np.isfinite(T.forward(layer, b, t)[0])
    # every label ignored: VALID normalizer is max(1, 0) = 1, loss 0, gradient 0
    lab2 = np.array([5, 5], np.float32)
    layer, b, t = T.make_layer(loss_text("SoftmaxWithLoss", "loss_param { ignore_label: 5 }"),
                               [x, lab2])
    assert T.forward(layer, b, t)[0] == 0.0
    assert not run_backward(layer, b, t, [True, False])[0].any()


@pytest.mark.parametrize("lp", ["", "ignore_label: 1 normalization: FULL",
                                "ignore_label: 0 normalize: false"])
def test_softmax_loss_gradient(lp):
    x = RNG.standard_normal((2, 3, 2, 2)).astype(np.float32)
    lab = labels((2, 2, 2), 3)
    lab[0, 0, 0], lab[1, 1, 1] = 1, 0
    layer, b, t = T.make_layer(loss_text("SoftmaxWithLoss", f"loss_param {{ {lp} }}"),
                               [x, lab])
    assert T.check_gradient(layer, b, t, check_bottom=[0]) == x.size


def test_softmax_loss_gradient_with_prob_top():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    lab = labels((3,), 4)
    layer, b, t = T.make_layer(loss_text("SoftmaxWithLoss", tops=('"loss"', '"prob"')),
                               [x, lab])
    # the prob top carries no gradient (loss weight 0), as Caffe
    assert T.check_gradient(layer, b, t, check_bottom=[0], top_id=0, top_data_id=0) == x.size


def test_softmax_loss_bad_inputs():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ShapeError, match=r"'l' \(SoftmaxWithLoss\).*number of labels"):
        T.make_layer(loss_text("SoftmaxWithLoss"), [x, np.zeros((2, 3), np.float32)])
    with pytest.raises(ShapeError, match=r"'l' \(SoftmaxWithLoss\).*first dimension"):
        T.make_layer(loss_text("SoftmaxWithLoss"), [x, np.zeros((4, 2), np.float32)])
    with pytest.raises(ShapeError, match=r"'l' \(SoftmaxWithLoss\).*axis 5"):
        T.make_layer(loss_text("SoftmaxWithLoss", "softmax_param { axis: 5 }"),
                     [x, np.zeros((2, 4), np.float32)])
    layer, b, t = T.make_layer(loss_text("SoftmaxWithLoss"), [x, np.zeros((2, 4), np.float32)])
    T.forward(layer, b, t)
    with pytest.raises(LayerError, match="cannot backpropagate to label"):
        layer.backward(t, [True, True], b)


def test_softmax_loss_label_out_of_range_is_nan():
    x = np.zeros((2, 3), np.float32)
    layer, b, t = T.make_layer(loss_text("SoftmaxWithLoss"),
                               [x, np.array([0, 3], np.float32)])
    assert np.isnan(T.forward(layer, b, t)[0])


# ---------------------------------------------------------------------------
# loss weight: the backward scale is read from top[0].diff on the device
# ---------------------------------------------------------------------------

def _weight_cases():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    lab = labels((3,), 4)
    p = RNG.uniform(0.1, 1.0, (3, 4)).astype(np.float32)
    H = RNG.uniform(0, 1, (4, 4)).astype(np.float32)
    t01 = (RNG.random((3, 4)) > 0.5).astype(np.float32)
    y = np.array([1, 0, 0], np.float32)
    a, c = RNG.standard_normal((3, 2)).astype(np.float32) * .3, \
        RNG.standard_normal((3, 2)).astype(np.float32) * .3
    return [
        ("SoftmaxWithLoss", "", [x, lab], 1),
        ("EuclideanLoss", "", [x, p], 2),
        ("SigmoidCrossEntropyLoss", "", [x, t01], 1),
        ("HingeLoss", "hinge_loss_param { norm: L2 }", [x, lab], 1),
        ("InfogainLoss", "", [x, lab, H], 1),
        ("MultinomialLogisticLoss", "", [p, lab], 1),
        ("ContrastiveLoss", "", [a, c, y], 2),
    ]


@pytest.mark.parametrize("case", range(7))
def test_loss_weight_scales_gradient(case):
    type_, extra, bottoms, ngrad = _weight_cases()[case]
    names = tuple(f'"b{i}"' for i in range(len(bottoms)))
    layer, b, t = T.make_layer(loss_text(type_, extra, bottoms=names), bottoms)
    prop = [i < ngrad for i in range(len(bottoms))]
    g1 = run_backward(layer, b, t, prop, 1.0)
    g2 = run_backward(layer, b, t, prop, 2.0)
    for i in range(ngrad):
        assert np.abs(g1[i]).max() > 0
        close(g2[i], 2.0 * g1[i], rtol=1e-6, atol=0)
    # loss_weight in the prototxt seeds top[0].diff (Caffe's SetLossWeights)
    layer, b, t = T.make_layer(loss_text(type_, extra + " loss_weight: 2", bottoms=names),
                               bottoms)
    assert layer.loss_weights == [2.0]
    T.forward(layer, b, t)
    layer.backward(t, prop, b)
    for i in range(ngrad):
        close(b[i].host_diff(), 2.0 * g1[i], rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------
# EuclideanLoss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((4, 3), (4, 3)), ((1, 5), (1, 5)),
                                   ((2, 3, 2), (2, 6))])   # Caffe compares count(1) only
def test_euclidean_forward_backward(sa, sb):
    a = RNG.standard_normal(sa).astype(np.float32)
    bb = RNG.standard_normal(sb).astype(np.float32)
    layer, b, t = T.make_layer(loss_text("EuclideanLoss"), [a, bb])
    loss, ga, gb = euclidean_ref(a, bb)
    close(T.forward(layer, b, t)[0], loss)
    g = run_backward(layer, b, t, [True, True], 2.0)
    close(g[0], 2 * ga)
    close(g[1], 2 * gb)
    assert T.check_gradient(layer, b, t, check_bottom=[0, 1]) == a.size + bb.size


def test_euclidean_bad_shapes():
    with pytest.raises(ShapeError, match=r"'l' \(EuclideanLoss\).*same dimension"):
        T.make_layer(loss_text("EuclideanLoss"),
                     [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)])
    with pytest.raises(ShapeError, match=r"'l' \(EuclideanLoss\).*first dimension"):
        T.make_layer(loss_text("EuclideanLoss"),
                     [np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)])


# ---------------------------------------------------------------------------
# SigmoidCrossEntropyLoss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("ignore,lp,mode", [
    (None, "", "BATCH_SIZE"),                 # Caffe's default for this layer
    (-1, "", "BATCH_SIZE"),
    (-1, "normalization: VALID", "VALID"),
    (-1, "normalize: true", "VALID"),
    (-1, "normalize: false", "BATCH_SIZE"),
    (-1, "normalization: FULL", "FULL"),
    (None, "normalization: NONE", "NONE"),
])
def test_sigmoid_ce_forward_backward(ignore, lp, mode):
    x = (RNG.standard_normal((3, 2, 5)) * 4).astype(np.float32)
    x[0, 0, :3] = [60.0, -60.0, 0.0]          # stable form, no overflow
    tg = RNG.random((3, 2, 5)).astype(np.float32)
    tg[RNG.random(tg.shape) < 0.3] = 1.0
    if ignore is not None:
        tg[RNG.random(tg.shape) < 0.3] = ignore
    ig = f"ignore_label: {ignore}" if ignore is not None else ""
    layer, b, t = T.make_layer(loss_text("SigmoidCrossEntropyLoss",
                                         f"loss_param {{ {ig} {lp} }}"), [x, tg])
    loss, grad = sigmoid_ce_ref(x, tg, ignore, mode)
    close(T.forward(layer, b, t)[0], loss)
    close(run_backward(layer, b, t, [True, False], 2.0)[0], 2 * grad, atol=1e-6)


def test_sigmoid_ce_gradient_and_errors():
    x = RNG.standard_normal((2, 7)).astype(np.float32)
    tg = RNG.random((2, 7)).astype(np.float32)
    tg[0, 1] = -1
    layer, b, t = T.make_layer(loss_text("SigmoidCrossEntropyLoss",
                                         "loss_param { ignore_label: -1 normalization: VALID }"),
                               [x, tg])
    assert T.check_gradient(layer, b, t, check_bottom=[0], threshold=1e-2) == x.size
    with pytest.raises(ShapeError, match=r"'l' \(SigmoidCrossEntropyLoss\).*same count"):
        T.make_layer(loss_text("SigmoidCrossEntropyLoss"),
                     [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)])


# ---------------------------------------------------------------------------
# HingeLoss
# ---------------------------------------------------------------------------

def away_from_kinks(x, lab):
    """Keep 1 -/+ x away from 0 so finite differences do not straddle the hinge."""
    x = x.copy()
    near = np.abs(np.abs(x) - 1.0) < 0.05
    x[near] += 0.2
    return x


@pytest.mark.parametrize("norm,p", [("L1", 1), ("L2", 2)])
@pytest.mark.parametrize("shape", [(4, 5), (1, 3, 2, 1)])
def test_hinge_loss(norm, p, shape):
    x = away_from_kinks(RNG.standard_normal(shape).astype(np.float32) * 1.5, None)
    dim = int(np.prod(shape[1:]))
    lab = labels((shape[0],), dim)
    layer, b, t = T.make_layer(loss_text("HingeLoss", f"hinge_loss_param {{ norm: {norm} }}"),
                               [x, lab])
    loss, grad = hinge_ref(x, lab, p)
    close(T.forward(layer, b, t)[0], loss)
    close(run_backward(layer, b, t, [True, False], 2.0)[0], 2 * grad)
    assert T.check_gradient(layer, b, t, check_bottom=[0], threshold=2e-3) == x.size


def test_hinge_bad_label_count():
    with pytest.raises(ShapeError, match=r"'l' \(HingeLoss\).*one label per example"):
        T.make_layer(loss_text("HingeLoss"),
                     [np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32)])


# ---------------------------------------------------------------------------
# InfogainLoss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,ignore,lp,mode", [
    ((4, 3), 1, None, "", "VALID"),
    ((2, 3, 2, 2), 1, 1, "", "VALID"),
    ((2, 3, 2, 2), 1, 1, "normalization: FULL", "FULL"),
    ((2, 2, 4), 2, 0, "normalization: BATCH_SIZE", "BATCH_SIZE"),
    ((1, 3), -1, None, "normalization: NONE", "NONE"),
])
@pytest.mark.parametrize("from_file", [True, False])
def test_infogain_loss(tmp_path, shape, axis, ignore, lp, mode, from_file):
    x = RNG.standard_normal(shape).astype(np.float32)
    ax = axis % len(shape)
    C = shape[ax]
    lab = labels(shape[:ax] + shape[ax + 1:], C, ignore)
    H = RNG.uniform(0, 2, (C, C)).astype(np.float32)
    ig = f"ignore_label: {ignore}" if ignore is not None else ""
    extra = f"loss_param {{ {ig} {lp} }} "
    bottoms = [x, lab]
    names = ('"x"', '"label"')
    if from_file:
        path = tmp_path / "H.binaryproto"
        write_binary(array_to_blobproto(H.reshape(1, 1, C, C)), str(path))
        extra += f'infogain_loss_param {{ source: "{path}" axis: {axis} }}'
    else:
        extra += f"infogain_loss_param {{ axis: {axis} }}"
        bottoms.append(H)
        names += ('"H"',)
    layer, b, t = T.make_layer(loss_text("InfogainLoss", extra, tops=('"loss"', '"prob"'),
                                         bottoms=names), bottoms)
    loss, prob, grad = softmax_loss_ref(x, lab, axis, ignore, mode, H=H)
    out = T.forward(layer, b, t)
    close(out[0], loss)
    close(out[1], prob, atol=1e-6)
    prop = [True] + [False] * (len(b) - 1)
    close(run_backward(layer, b, t, prop, 2.0)[0], 2 * grad, atol=1e-6)
    if shape == (2, 3, 2, 2) and not from_file:
        assert T.check_gradient(layer, b, t, check_bottom=[0], top_id=0,
                                top_data_id=0) == x.size


def test_infogain_identity_matches_softmax_loss():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    lab = labels((3,), 4)
    H = np.eye(4, dtype=np.float32)
    li, bi, ti = T.make_layer(loss_text("InfogainLoss", bottoms=('"x"', '"l"', '"H"')),
                              [x, lab, H])
    ls, bs, ts = T.make_layer(loss_text("SoftmaxWithLoss"), [x, lab])
    close(T.forward(li, bi, ti)[0], T.forward(ls, bs, ts)[0], rtol=1e-6)


def test_infogain_errors(tmp_path):
    x, lab = np.zeros((2, 3), np.float32), np.zeros((2,), np.float32)
    with pytest.raises(LayerError, match=r"'l' \(InfogainLoss\).*source must be specified"):
        T.make_layer(loss_text("InfogainLoss"), [x, lab])
    with pytest.raises(CaffeOclError, match=r"'l' \(InfogainLoss\).*infogain matrix"):
        T.make_layer(loss_text("InfogainLoss", f'infogain_loss_param {{ source: '
                               f'"{tmp_path}/missing.binaryproto" }}'), [x, lab])
    with pytest.raises(ShapeError, match=r"'l' \(InfogainLoss\).*3x3"):
        T.make_layer(loss_text("InfogainLoss", bottoms=('"x"', '"l"', '"H"')),
                     [x, lab, np.eye(2, dtype=np.float32)])
    with pytest.raises(LayerError, match=r"'l' \(InfogainLoss\).*normalize is deprecated"):
        T.make_layer(loss_text("InfogainLoss", "loss_param { normalize: true }",
                               bottoms=('"x"', '"l"', '"H"')),
                     [x, lab, np.eye(3, dtype=np.float32)])


# ---------------------------------------------------------------------------
# MultinomialLogisticLoss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 5), (1, 3), (2, 3, 2, 1)])
def test_multinomial_logistic_loss(shape):
    x = RNG.uniform(0.2, 1.0, shape).astype(np.float32)
    dim = int(np.prod(shape[1:]))
    lab = labels((shape[0],), dim)
    layer, b, t = T.make_layer(loss_text("MultinomialLogisticLoss"), [x, lab])
    loss, grad = mlogistic_ref(x, lab)
    close(T.forward(layer, b, t)[0], loss)
    close(run_backward(layer, b, t, [True, False], 2.0)[0], 2 * grad)
    assert T.check_gradient(layer, b, t, check_bottom=[0], threshold=2e-2) == x.size


def test_multinomial_logistic_threshold_and_errors():
    x = np.array([[0.0, 1.0], [0.5, 0.5]], np.float32)       # log(0) floored at 1e-20
    lab = np.array([0, 1], np.float32)
    layer, b, t = T.make_layer(loss_text("MultinomialLogisticLoss"), [x, lab])
    close(T.forward(layer, b, t)[0], mlogistic_ref(x, lab)[0], rtol=1e-6)
    with pytest.raises(ShapeError, match=r"'l' \(MultinomialLogisticLoss\).*label"):
        T.make_layer(loss_text("MultinomialLogisticLoss"), [x, np.zeros((2, 2), np.float32)])


# ---------------------------------------------------------------------------
# ContrastiveLoss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("margin", [1.0, 2.5])
def test_contrastive_loss(legacy, margin):
    num, ch = 6, 3
    a = (RNG.standard_normal((num, ch, 1, 1)) * 0.6).astype(np.float32)
    bb = (RNG.standard_normal((num, ch, 1, 1)) * 0.6).astype(np.float32)
    y = (np.arange(num) % 2).astype(np.float32)
    # keep every pair's distance away from the margin (the loss's kink)
    d = np.sqrt(((a - bb) ** 2).reshape(num, -1).sum(1))
    for i in range(num):
        kink = margin if not legacy else np.sqrt(margin)
        if abs(d[i] - kink) < 0.1:
            bb[i] = a[i] + (bb[i] - a[i]) * 0.5
    extra = f"contrastive_loss_param {{ margin: {margin} legacy_version: {str(legacy).lower()} }}"
    layer, b, t = T.make_layer(loss_text("ContrastiveLoss", extra,
                                         bottoms=('"a"', '"b"', '"y"')), [a, bb, y])
    loss, ga, gb = contrastive_ref(a, bb, y, margin, legacy)
    close(T.forward(layer, b, t)[0], loss)
    g = run_backward(layer, b, t, [True, True, False], 2.0)
    close(g[0], 2 * ga, atol=1e-6)
    close(g[1], 2 * gb, atol=1e-6)
    assert T.check_gradient(layer, b, t, check_bottom=[0, 1], threshold=1e-2) == 2 * a.size


def test_contrastive_errors():
    a = np.zeros((3, 2), np.float32)
    with pytest.raises(ShapeError, match=r"'l' \(ContrastiveLoss\).*equal channels"):
        T.make_layer(loss_text("ContrastiveLoss", bottoms=('"a"', '"b"', '"y"')),
                     [a, np.zeros((3, 3), np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ShapeError, match=r"'l' \(ContrastiveLoss\).*one value per pair"):
        T.make_layer(loss_text("ContrastiveLoss", bottoms=('"a"', '"b"', '"y"')),
                     [a, a, np.zeros(2, np.float32)])


# ---------------------------------------------------------------------------
# Accuracy
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,top_k,ignore", [
    ((10, 6), 1, 1, None),
    ((10, 6), 1, 3, None),
    ((1, 4), 1, 2, None),                      # batch 1
    ((2, 5, 3, 2), 1, 2, 4),                   # spatial, ignore_label
    ((3, 2, 5), 2, 1, 0),                      # axis 2 (inner 1)
    ((3, 4, 2), -2, 4, None),                  # top_k == C: always right
])
def test_accuracy(shape, axis, top_k, ignore):
    x = RNG.standard_normal(shape).astype(np.float32)
    ax = axis % len(shape)
    lab = labels(shape[:ax] + shape[ax + 1:], shape[ax], ignore)
    ig = f"ignore_label: {ignore}" if ignore is not None else ""
    layer, b, t = T.make_layer(
        f'name: "acc" type: "Accuracy" bottom: "x" bottom: "l" top: "a" top: "per_class" '
        f"accuracy_param {{ top_k: {top_k} axis: {axis} {ig} }}", [x, lab])
    assert layer.loss_weights == [0.0, 0.0] and not layer.has_backward
    acc, per = accuracy_ref(x, lab, top_k, axis, ignore)
    out = T.forward(layer, b, t)
    assert out[0].shape == () and out[1].shape == (shape[ax],)
    close(out[0], acc, rtol=1e-6)
    close(out[1], per, rtol=1e-6)


def test_accuracy_ties_and_all_ignored():
    # ties count against the true class (Caffe compares with >=)
    x = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 1.0, 3.0]], np.float32)
    lab = np.array([1, 1, 0], np.float32)
    layer, b, t = T.make_layer('type: "Accuracy" bottom: "x" bottom: "l" top: "a"', [x, lab])
    close(T.forward(layer, b, t)[0], accuracy_ref(x, lab)[0])
    assert T.forward(layer, b, t)[0] == pytest.approx(1 / 3)
    layer, b, t = T.make_layer('type: "Accuracy" bottom: "x" bottom: "l" top: "a" top: "p" '
                               'accuracy_param { ignore_label: 1 top_k: 2 }',
                               [x, np.ones(3, np.float32)])
    out = T.forward(layer, b, t)
    assert out[0] == 0.0 and not out[1].any()


def test_accuracy_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"'acc' \(Accuracy\).*top_k"):
        T.make_layer('name: "acc" type: "Accuracy" bottom: "x" bottom: "l" top: "a" '
                     'accuracy_param { top_k: 4 }', [x, np.zeros(2, np.float32)])
    with pytest.raises(ShapeError, match=r"'acc' \(Accuracy\).*number of labels"):
        T.make_layer('name: "acc" type: "Accuracy" bottom: "x" bottom: "l" top: "a"',
                     [np.zeros((2, 3, 2), np.float32), np.zeros(3, np.float32)])


# ---------------------------------------------------------------------------
# in a Net: default loss weight, loss_weight seeding, force_backward skips labels
# ---------------------------------------------------------------------------

def test_loss_layers_in_net(tmp_path):
    from caffe_ocl.net import Net
    from caffe_ocl.proto import caffe_pb2
    proto = tmp_path / "net.prototxt"
    proto.write_text("""
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 4 } } }
layer { name: "y" type: "Input" top: "y" input_param { shape { dim: 3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "y" top: "loss"
        loss_weight: 2 }
layer { name: "acc" type: "Accuracy" bottom: "x" bottom: "y" top: "acc" }
""")
    net = Net(str(proto), caffe_pb2.TRAIN)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    y = labels((3,), 4)
    out = net.forward(x=x, y=y)
    loss, _, grad = softmax_loss_ref(x, y)
    close(out["loss"], loss)
    close(out["acc"], accuracy_ref(x, y)[0])
    net.backward()
    close(net.blobs["x"].diff, 2.0 * grad, atol=1e-6)
