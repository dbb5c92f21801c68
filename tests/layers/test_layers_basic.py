"""InnerProduct, Softmax, ReLU/Sigmoid/TanH, Dropout, Input, DummyData and
the fillers, against float64 NumPy references."""
import types

import numpy as np
import pytest

import refs
from caffe_ocl import TRAIN, TEST, LayerError, ShapeError
from caffe_ocl.ops.random import set_random_seed
from caffe_ocl.testing import check_gradient, forward, make_layer


@pytest.mark.parametrize("shape,axis,nout,transpose", [
    ((2, 3, 4), 1, 5, False), ((1, 7), 1, 3, False), ((3, 2, 5), 2, 4, True),
    ((4, 3, 2, 2), -3, 70, False)])
def test_inner_product(rng, shape, axis, nout, transpose):
    x = rng.standard_normal(shape)
    text = (f'type: "InnerProduct" inner_product_param {{ num_output: {nout} axis: {axis} '
            f'transpose: {"true" if transpose else "false"} '
            'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }')
    layer, b, t = make_layer(text, [x])
    w, bias = layer.blobs[0].data.astype(np.float64), layer.blobs[1].data
    ax = axis % len(shape)
    x2 = x.reshape(int(np.prod(shape[:ax])), -1)
    ref = x2 @ (w if transpose else w.T) + bias
    (y,) = forward(layer, b, t)
    assert y.shape == shape[:ax] + (nout,)
    np.testing.assert_allclose(y.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
    if np.prod(shape) <= 24:
        check_gradient(layer, b, t)


def test_inner_product_input_size_change_is_an_error(rng):
    layer, b, t = make_layer('type: "InnerProduct" inner_product_param { num_output: 2 }',
                             [rng.standard_normal((2, 3))])
    b[0].reshape((2, 4))
    with pytest.raises(ShapeError, match="does not match"):
        forward(layer, b, t)


# (2, 5, 3, 7) and (1, 21, 19): runs of 8 positions as vectors on CPU
# drivers (softmax_fwd_cpu) with a tail
@pytest.mark.parametrize("shape,axis", [((2, 5), 1), ((2, 3, 4), 1), ((2, 3, 4), 2), ((3, 4, 2), 0),
                                        ((1, 1000), -1), ((2, 5, 3, 7), 1), ((1, 21, 19), 1),
                                        # the last axis: rows as vectors, a tail of 5
                                        ((3, 40, 197), 2)])
def test_softmax_any_axis(rng, shape, axis):
    x = rng.standard_normal(shape) * 5
    layer, b, t = make_layer(f'type: "Softmax" softmax_param {{ axis: {axis} }}', [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, refs.softmax(x, axis), rtol=1e-5, atol=1e-7)
    if np.prod(shape) <= 24:
        check_gradient(layer, b, t)


def test_softmax_underflow_is_zero(rng):
    """Logits 200 apart: the smaller ones' probabilities are 0 (exp's result
    below the smallest normal float), in the vector runs and the tail alike,
    and the rest sum to 1."""
    x = rng.standard_normal((1, 3, 11)) * 2
    x[0, 0] += 200.0
    layer, b, t = make_layer('type: "Softmax"', [x])
    (y,) = forward(layer, b, t)
    assert np.all(y[0, 1:] == 0.0)
    np.testing.assert_allclose(y[0, 0], 1.0, rtol=1e-6)
    # over the last axis (rows as vectors): in the vector part and the tail
    x = rng.standard_normal((2, 19)) * 2
    x[0, 3] += 200.0
    x[1, 17] += 200.0
    layer, b, t = make_layer('type: "Softmax"', [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y[0, 3], 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[1, 17], 1.0, rtol=1e-6)
    assert np.count_nonzero(y) == 2


@pytest.mark.parametrize("outer,c,inner", [(3, 1000, 1), (2, 70, 3), (1, 5, 2)])
def test_softmax_work_group_kernels(d, rng, outer, c, inner):
    """The GPU's one-work-group-per-row softmax (ops/softmax.py), forced on
    the test device: forward against NumPy, backward y * (dy - sum dy y)."""
    from caffe_ocl.ops import softmax as softmax_ops
    x = rng.standard_normal((outer, c, inner)) * 5
    dy = rng.standard_normal((outer, c, inner))
    xb, yb, dyb = d.buf(x), d.buf(np.full(x.shape, np.nan)), d.buf(dy)
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(softmax_ops.forward(d.dev, outer, c, inner, xb, yb, groups=True, wide=False))
    y = refs.softmax(x, 1)
    np.testing.assert_allclose(d.get(yb, x.shape), y, rtol=1e-5, atol=1e-7)
    d.run([softmax_ops.backward(d.dev, outer, c, inner, yb, dyb, dxb, groups=True)])
    dx = y * (dy - (dy * y).sum(1, keepdims=True))
    np.testing.assert_allclose(d.get(dxb, x.shape), dx, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("outer,c", [(150, 49), (9, 197), (37, 8), (5, 1000), (1, 13)])
def test_softmax_rows_kernel(d, rng, outer, c):
    """The GPU's softmax of many short rows (attention's scores: lanes per
    row, several rows per work-group, a last group part empty), forced on
    the test device, against NumPy; chosen on GPUs for inner == 1 where the
    rows are too many for a work-group each."""
    from caffe_ocl.ops import softmax as softmax_ops
    x = rng.standard_normal((outer, c, 1)) * 5
    x[0, c // 2] += 60.0
    xb, yb = d.buf(x), d.buf(np.full(x.shape, np.nan))
    launches = softmax_ops.forward(d.dev, outer, c, 1, xb, yb, rows=True)
    assert [ln.name for ln in launches] == ["softmax_fwd_rows"]
    d.run(launches)
    np.testing.assert_allclose(d.get(yb, x.shape), refs.softmax(x, 1), rtol=1e-5, atol=1e-9)
    gpu = types.SimpleNamespace(is_gpu=True, compute_units=132)
    assert softmax_ops.use_rows(gpu, 150528, 49, 1) and softmax_ops.use_rows(gpu, 9456, 197, 1)
    assert not softmax_ops.use_rows(gpu, 64, 1000, 1)      # a classifier: a work-group a row
    assert softmax_ops.use_rows(gpu, 20000, 1000, 1)
    assert not softmax_ops.use_rows(gpu, 150528, 49, 3)
    assert not softmax_ops.use_rows(types.SimpleNamespace(is_gpu=False), 150528, 49, 1)


@pytest.mark.parametrize("outer,c,inner", [(1, 79077, 1), (2, 9000, 3), (1, 8192, 1)])
def test_softmax_wide_kernels(d, rng, outer, c, inner):
    """The GPU's softmax of few rows with very many channels, each row's C
    cut over work-groups (a last run shorter than the rest; strided
    channels), forced on the test device, against NumPy: one run of
    values far above the rest (its exp dominates every other run's sum)."""
    from caffe_ocl.ops import softmax as softmax_ops
    x = rng.standard_normal((outer, c, inner)) * 5
    x[:, 5000:5010] += 30.0
    xb, yb = d.buf(x), d.buf(np.full(x.shape, np.nan))
    launches = softmax_ops.forward(d.dev, outer, c, inner, xb, yb, wide=True)
    assert [ln.name for ln in launches] == ["softmax_fwd_parts", "softmax_fwd_wide"]
    d.run(launches)
    np.testing.assert_allclose(d.get(yb, x.shape), refs.softmax(x, 1), rtol=2e-5, atol=1e-9)
    gpu = types.SimpleNamespace(is_gpu=True, compute_units=132)
    assert softmax_ops.use_wide(gpu, outer, c, inner) == (c >= softmax_ops.WIDE_MIN_C)
    assert not softmax_ops.use_wide(gpu, 66, c, 1) and not softmax_ops.use_wide(gpu, 0, c, 1)
    assert not softmax_ops.use_wide(types.SimpleNamespace(is_gpu=False), outer, c, inner)


@pytest.mark.parametrize("text,fn,kink", [
    ('type: "ReLU"', lambda x: np.maximum(x, 0), True),
    ('type: "ReLU" relu_param { negative_slope: 0.1 }', lambda x: np.where(x > 0, x, 0.1 * x), True),
    ('type: "Sigmoid"', lambda x: 1 / (1 + np.exp(-x)), False),
    ('type: "TanH"', np.tanh, False),
])
def test_neurons(rng, text, fn, kink):
    x = rng.standard_normal((2, 3, 3, 2))
    layer, b, t = make_layer(text, [x])
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, fn(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    check_gradient(layer, b, t, kink=0.0, kink_range=0.01 if kink else -1)


def test_tanh_relative_accuracy_over_its_range():
    """TanH within a few float32 ulps of float64 tanh, relative, from 1e-30
    through the 0.625 boundary of the CPU's two formulas (pointwise.cl) to
    saturation, both signs; NaN stays NaN."""
    mag = np.concatenate([np.geomspace(1e-30, 1e-3, 40), np.linspace(1e-3, 2, 400),
                          np.array([0.625, np.nextafter(np.float32(0.625), 1),
                                    np.nextafter(np.float32(0.625), 0), 9.0, 20.0, 90.0, 1e30])])
    x = np.concatenate([mag, -mag, [0.0, np.nan]]).astype(np.float32).reshape(1, -1)
    layer, b, t = make_layer('type: "TanH"', [x])
    (y,) = forward(layer, b, t)
    want = np.tanh(x.astype(np.float64))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(y[finite], want[finite], rtol=5e-7, atol=0)
    assert np.isnan(y[~finite]).all()


@pytest.mark.parametrize("power", [2.0, 0.5, -1.0, 3.0])
def test_power_shortcut_exponents(rng, power):
    """Power's exponents computed without pow (2, 0.5, -1) and one with it,
    against float64, 0 and inf included."""
    x = np.concatenate([rng.uniform(0.1, 3.0, 50), [0.0, np.inf]])
    x = x.astype(np.float32).reshape(1, -1)
    layer, b, t = make_layer(f'type: "Power" power_param {{ power: {power} }}', [x])
    (y,) = forward(layer, b, t)
    with np.errstate(divide="ignore"):
        want = np.power(x.astype(np.float64), power)
    np.testing.assert_allclose(y, want, rtol=2e-7, atol=0)


def test_relu_in_place(rng):
    from caffe_ocl.testing import make_blobs
    from caffe_ocl.layers import create_layer
    from caffe_ocl.testing import layer_param
    x = rng.standard_normal((3, 4))
    (blob,) = make_blobs([x])
    layer = create_layer(layer_param('type: "ReLU"'), TEST)
    layer.setup([blob], [blob])
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.data, np.maximum(x, 0), rtol=1e-6)


def test_dropout_test_phase_is_identity(rng):
    x = rng.standard_normal((4, 5))
    layer, b, t = make_layer('type: "Dropout" dropout_param { dropout_ratio: 0.3 }', [x])
    np.testing.assert_allclose(forward(layer, b, t)[0], x, rtol=1e-6)


def test_dropout_train_mask_and_gradient():
    x = np.ones((100, 100), np.float32)
    layer, b, t = make_layer('type: "Dropout" dropout_param { dropout_ratio: 0.25 }', [x], phase=TRAIN)
    set_random_seed(5)
    (y1,) = forward(layer, b, t)
    kept = y1 != 0
    assert abs(kept.mean() - 0.75) < 0.02           # Bernoulli(0.75) over 10k draws
    np.testing.assert_allclose(y1[kept], 1 / 0.75, rtol=1e-6)
    (y2,) = forward(layer, b, t)
    assert (y2 != y1).any()                          # a new mask each forward
    set_random_seed(5)
    (y3,) = forward(layer, b, t)
    np.testing.assert_array_equal(y1, y3)            # reproducible from the seed
    # backward uses the mask of the last forward
    t[0].diff[...] = 2.0
    layer.backward(t, [True], b)
    np.testing.assert_allclose(b[0].diff, np.where(kept, 2.0 / 0.75, 0.0), rtol=1e-6)


def test_dropout_bad_ratio():
    with pytest.raises(LayerError, match="dropout_ratio"):
        make_layer('type: "Dropout" dropout_param { dropout_ratio: 1.0 }', [np.ones((1, 2))])


def test_input_layer_shapes():
    layer, b, t = make_layer('type: "Input" top: "a" top: "b" input_param { shape { dim: 2 dim: 3 } '
                             'shape { dim: 4 } }', [], ntop=2)
    assert t[0].shape == (2, 3) and t[1].shape == (4,)
    with pytest.raises(LayerError, match="shapes"):
        make_layer('type: "Input" input_param { shape { dim: 1 } shape { dim: 2 } }', [], ntop=3)


@pytest.mark.parametrize("filler,check", [
    ('type: "constant" value: 3.5', lambda a, s: np.all(a == 3.5)),
    ('type: "uniform" min: -2 max: 3', lambda a, s: a.min() >= -2 and a.max() <= 3
     and abs(a.mean() - 0.5) < 0.1 and abs(a.var() - 25 / 12) < 0.2),
    ('type: "gaussian" mean: 1 std: 2', lambda a, s: abs(a.mean() - 1) < 0.1 and abs(a.std() - 2) < 0.1),
    ('type: "gaussian" std: 1 sparse: 3', lambda a, s: abs((a != 0).mean() - 3 / s[0]) < 0.03),
    ('type: "positive_unitball"', lambda a, s: np.allclose(a.reshape(s[0], -1).sum(1), 1, atol=1e-5)
     and a.min() >= 0),
    ('type: "xavier"', lambda a, s: np.abs(a).max() <= np.sqrt(3 / (np.prod(s[1:]))) + 1e-6
     and abs(a.var() - 1 / np.prod(s[1:])) < 0.1 / np.prod(s[1:])),
    ('type: "xavier" variance_norm: AVERAGE', lambda a, s: np.abs(a).max() <= np.sqrt(
        3 / ((np.prod(s[1:]) + s[0] * np.prod(s[2:])) / 2)) + 1e-6),
    ('type: "msra"', lambda a, s: abs(a.std() - np.sqrt(2 / np.prod(s[1:]))) < 0.05 * np.sqrt(2 / np.prod(s[1:]))),
])
def test_dummy_data_fillers(filler, check):
    shape = (10, 8, 5, 5)
    layer, b, t = make_layer(f'type: "DummyData" dummy_data_param {{ shape {{ dim: 10 dim: 8 dim: 5 dim: 5 }} '
                             f'data_filler {{ {filler} }} }}', [])
    (a,) = forward(layer, b, t)
    assert a.shape == shape
    assert check(a.astype(np.float64), shape), filler


def test_dummy_data_legacy_dims_and_refill():
    layer, b, t = make_layer('type: "DummyData" top: "a" top: "b" dummy_data_param { num: 2 channels: 3 '
                             'height: 4 width: 5 data_filler { type: "uniform" } }', [], ntop=2)
    assert t[0].shape == (2, 3, 4, 5) and t[1].shape == (2, 3, 4, 5)
    a1 = forward(layer, b, t)[0]
    a2 = forward(layer, b, t)[0]
    assert (a1 != a2).any()          # non-constant fillers refill every forward, as Caffe


def test_unknown_filler_is_an_error():
    with pytest.raises(LayerError, match="unknown filler"):
        make_layer('type: "DummyData" dummy_data_param { shape { dim: 2 } data_filler { type: "nope" } }', [])


def test_dropout_test_phase_in_place_is_free(rng):
    from caffe_ocl.layers import create_layer
    from caffe_ocl.testing import layer_param, make_blobs
    x = rng.standard_normal((3, 4))
    (blob,) = make_blobs([x])
    layer = create_layer(layer_param('type: "Dropout" dropout_param { dropout_ratio: 0.5 }'), TEST)
    layer.setup([blob], [blob])
    assert layer.fwd == []
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.data, x, rtol=1e-6)
