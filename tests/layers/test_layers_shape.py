"""Eltwise, Concat, Slice, Flatten, Reshape, Crop, Tile, Reduction, ArgMax,
Silence, Filter, BatchReindex, Parameter, Embed: forward vs float64 NumPy,
backward by finite differences, bad parameters."""
import numpy as np
import pytest

from caffe_ocl import testing
from caffe_ocl.errors import CaffeOclError, DataError, LayerError, ShapeError

RNG = np.random.default_rng(11)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def grad(layer, b, t, **kw):
    kw.setdefault("threshold", 1e-2)
    return testing.check_gradient(layer, b, t, **kw)


def expect_error(text, bottoms, pattern, cls=CaffeOclError, ntop=None):
    with pytest.raises(cls, match=pattern) as info:
        layer, b, t = testing.make_layer('name: "bad" ' + text, bottoms, ntop=ntop)
        testing.forward(layer, b, t)
    assert "'bad'" in str(info.value)


# ---- Eltwise --------------------------------------------------------------------

@pytest.mark.parametrize("nb", [2, 3])
def test_eltwise_sum_prod_max_forward(nb):
    xs = [rnd(2, 3, 5) for _ in range(nb)]
    x64 = [x.astype(np.float64) for x in xs]
    coeffs = [0.5, -1.5, 2.0][:nb]
    ctext = " ".join(f"coeff: {c}" for c in coeffs)
    layer, b, t = testing.make_layer(f'type: "Eltwise" eltwise_param {{ operation: SUM {ctext} }}', xs)
    y, = testing.forward(layer, b, t)
    np.testing.assert_allclose(y, sum(c * x for c, x in zip(coeffs, x64)), rtol=1e-5, atol=1e-6)
    layer, b, t = testing.make_layer('type: "Eltwise"', xs)       # default SUM, coeff 1
    np.testing.assert_allclose(testing.forward(layer, b, t)[0], sum(x64), rtol=1e-5, atol=1e-6)
    layer, b, t = testing.make_layer('type: "Eltwise" eltwise_param { operation: PROD }', xs)
    np.testing.assert_allclose(testing.forward(layer, b, t)[0], np.prod(x64, axis=0), rtol=1e-5,
                               atol=1e-6)
    layer, b, t = testing.make_layer('type: "Eltwise" eltwise_param { operation: MAX }', xs)
    np.testing.assert_allclose(testing.forward(layer, b, t)[0], np.max(x64, axis=0))


def test_eltwise_max_ties_go_to_later_bottom():
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    c = np.array([[1.0, 5.0, 0.0]], np.float32)
    layer, b, t = testing.make_layer('type: "Eltwise" eltwise_param { operation: MAX }', [a, c])
    testing.forward(layer, b, t)
    t[0].diff[...] = [[10.0, 20.0, 30.0]]
    layer.backward(t, [True, True], b)
    # Caffe: a > b picks a, else b (ties -> bottom 1)
    np.testing.assert_array_equal(b[0].host_diff(), [[0, 0, 30]])
    np.testing.assert_array_equal(b[1].host_diff(), [[10, 20, 0]])


@pytest.mark.parametrize("text", [
    'eltwise_param { operation: SUM coeff: 0.5 coeff: -2 coeff: 1.5 }',
    'eltwise_param { operation: PROD }',
    'eltwise_param { operation: PROD stable_prod_grad: false }',
    'eltwise_param { operation: MAX }',
])
def test_eltwise_gradient(text):
    xs = [rnd(2, 3) + 0.5 * np.sign(rnd(2, 3)) for _ in range(3)]   # away from 0
    if "MAX" in text:   # keep values well separated (max kink)
        xs = [np.float32(k) * 0.7 + rnd(2, 3) * 0.05 for k in RNG.permutation(3)]
        xs = [x + np.float32(0.1) * RNG.permutation(6).reshape(2, 3).astype(np.float32)
              for x in xs]
    layer, b, t = testing.make_layer('type: "Eltwise" ' + text, xs)
    grad(layer, b, t)


def test_eltwise_errors():
    expect_error('type: "Eltwise"', [rnd(2, 3), rnd(3, 2)], "same shape", ShapeError)
    expect_error('type: "Eltwise" eltwise_param { coeff: 1 }', [rnd(2), rnd(2)],
                 "one coefficient per bottom", LayerError)
    expect_error('type: "Eltwise" eltwise_param { operation: PROD coeff: 1 coeff: 2 }',
                 [rnd(2), rnd(2)], "only takes coefficients for summation", LayerError)


# ---- Concat / Slice ------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_forward_gradient(axis):
    base = [2, 3, 3]
    xs = []
    for n in (1, 2, 3):
        s = list(base)
        s[axis] = n
        xs.append(rnd(*s))
    layer, b, t = testing.make_layer(f'type: "Concat" concat_param {{ axis: {axis} }}', xs)
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=axis))
    grad(layer, b, t)


def test_concat_legacy_dim_and_single_bottom():
    xs = [rnd(1, 2, 3), rnd(2, 2, 3)]
    layer, b, t = testing.make_layer('type: "Concat" concat_param { concat_dim: 0 }', xs)
    np.testing.assert_array_equal(testing.forward(layer, b, t)[0], np.concatenate(xs, 0))
    layer, b, t = testing.make_layer('type: "Concat"', xs[:1])
    np.testing.assert_array_equal(testing.forward(layer, b, t)[0], xs[0])
    assert t[0].data_mem is b[0].data_mem and t[0].diff_mem is b[0].diff_mem


def test_concat_errors():
    expect_error('type: "Concat" concat_param { axis: 1 }', [rnd(2, 3), rnd(3, 3)],
                 "same shape except", ShapeError)
    expect_error('type: "Concat"', [rnd(2, 3), rnd(2, 3, 1)], "number of axes", ShapeError)
    expect_error('type: "Concat" concat_param { axis: 3 }', [rnd(2, 3), rnd(2, 3)],
                 "out of range", ShapeError)
    expect_error('type: "Concat" concat_param { axis: 1 concat_dim: 1 }', [rnd(2, 3)],
                 "not both")


@pytest.mark.parametrize("axis, points, ntop", [(1, [1, 3], 3), (-1, [2], 2), (0, [], 3),
                                                 (2, [], 1)])
def test_slice_forward_gradient(axis, points, ntop):
    x = rnd(3, 5, 4)
    pts = " ".join(f"slice_point: {p}" for p in points)
    layer, b, t = testing.make_layer(
        f'type: "Slice" slice_param {{ axis: {axis} {pts} }}', [x], ntop=ntop)
    ys = testing.forward(layer, b, t)
    expect = np.split(x, points if points else ntop, axis=axis)
    assert len(ys) == len(expect)
    for y, e in zip(ys, expect):
        np.testing.assert_array_equal(y, e)
    grad(layer, b, t)


def test_slice_legacy_dim():
    x = rnd(4, 3)
    layer, b, t = testing.make_layer('type: "Slice" slice_param { slice_dim: 0 slice_point: 1 }',
                                     [x], ntop=2)
    ys = testing.forward(layer, b, t)
    np.testing.assert_array_equal(ys[0], x[:1])
    np.testing.assert_array_equal(ys[1], x[1:])


def test_slice_errors():
    x = [rnd(2, 5)]
    expect_error('type: "Slice" slice_param { slice_point: 3 slice_point: 2 }', x,
                 "strictly increasing", ntop=3)
    expect_error('type: "Slice" slice_param { slice_point: 2 slice_point: 7 }', x,
                 "out of range", ntop=3)
    expect_error('type: "Slice" slice_param { slice_point: 2 }', x, "need 2", ntop=3)
    expect_error('type: "Slice"', x, "evenly divide", ntop=2)
    expect_error('type: "Slice" slice_param { slice_point: 1 slice_point: 2 slice_point: 3 '
                 'slice_point: 4 slice_point: 5 }', x, "only 5", ntop=6)
    expect_error('type: "Slice" slice_param { axis: 2 }', x, "out of range", ntop=2)


# ---- Flatten / Reshape ----------------------------------------------------------

@pytest.mark.parametrize("text, shape, expect", [
    ('', (2, 3, 4, 5), (2, 60)),
    ('flatten_param { axis: 2 }', (2, 3, 4, 5), (2, 3, 20)),
    ('flatten_param { axis: 1 end_axis: 2 }', (2, 3, 4, 5), (2, 12, 5)),
    ('flatten_param { axis: -2 end_axis: -1 }', (2, 3, 4, 5), (2, 3, 20)),
    ('flatten_param { axis: 0 }', (1, 3), (3,)),
])
def test_flatten(text, shape, expect):
    x = rnd(*shape)
    layer, b, t = testing.make_layer('type: "Flatten" ' + text, [x])
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, x.reshape(expect))
    assert t[0].data_mem is b[0].data_mem and t[0].diff_mem is b[0].diff_mem
    grad(layer, b, t, max_checks=6)


@pytest.mark.parametrize("text, shape, expect", [
    ('shape { dim: 0 dim: -1 }', (2, 3, 4), (2, 12)),
    ('shape { dim: -1 dim: 4 }', (2, 3, 4), (6, 4)),
    ('shape { dim: 3 dim: 2 dim: 0 }', (2, 3, 4), (3, 2, 4)),
    ('shape { dim: 2 dim: 2 } axis: 1 num_axes: 1', (3, 4, 5), (3, 2, 2, 5)),
    ('shape { dim: 1 } axis: 0 num_axes: 0', (3, 4), (1, 3, 4)),
    ('shape { dim: 1 } axis: -1 num_axes: 0', (3, 4), (3, 4, 1)),
    ('shape { dim: -1 } axis: -2', (3, 4, 5), (3, 4, 5)),
    ('shape { dim: 0 dim: 0 dim: -1 }', (1, 3, 2, 2), (1, 3, 4)),
])
def test_reshape(text, shape, expect):
    x = rnd(*shape)
    layer, b, t = testing.make_layer(f'type: "Reshape" reshape_param {{ {text} }}', [x])
    y, = testing.forward(layer, b, t)
    assert y.shape == expect
    np.testing.assert_array_equal(y, x.reshape(expect))
    assert t[0].data_mem is b[0].data_mem and t[0].diff_mem is b[0].diff_mem


def test_reshape_errors():
    x = [rnd(2, 3, 4)]
    expect_error('type: "Reshape" reshape_param { shape { dim: -1 dim: -1 } }', x,
                 "multiple -1")
    expect_error('type: "Reshape" reshape_param { shape { dim: 5 dim: 5 } }', x,
                 "must match input count", ShapeError)
    expect_error('type: "Reshape" reshape_param { shape { dim: 5 dim: -1 } }', x,
                 "divisible", ShapeError)
    expect_error('type: "Reshape" reshape_param { shape { dim: 0 dim: 0 dim: 0 dim: 0 } }',
                 x, "no corresponding bottom axis", ShapeError)
    expect_error('type: "Reshape" reshape_param { shape { dim: 1 } axis: 5 }', x,
                 "out of range", ShapeError)
    expect_error('type: "Reshape" reshape_param { shape { dim: 1 } axis: 2 num_axes: 3 }', x,
                 "out of range", ShapeError)


# ---- Crop / Tile ----------------------------------------------------------------

@pytest.mark.parametrize("text, ref_shape, sl", [
    ('', (1, 1, 3, 2), (slice(None), slice(None), slice(0, 3), slice(0, 2))),
    ('crop_param { axis: 2 offset: 1 }', (1, 1, 3, 2),
     (slice(None), slice(None), slice(1, 4), slice(1, 3))),
    ('crop_param { axis: 1 offset: 1 offset: 0 offset: 2 }', (1, 2, 4, 3),
     (slice(None), slice(1, 3), slice(0, 4), slice(2, 5))),
    ('crop_param { axis: -1 offset: 2 }', (1, 1, 1, 3),
     (slice(None), slice(None), slice(None), slice(2, 5))),
    ('crop_param { axis: 0 offset: 1 }', (1, 1, 2, 2),
     (slice(1, 2), slice(1, 2), slice(1, 3), slice(1, 3))),
])
def test_crop(text, ref_shape, sl):
    x = rnd(2, 3, 5, 5)
    ref = np.zeros(ref_shape, np.float32)
    layer, b, t = testing.make_layer('type: "Crop" ' + text, [x, ref])
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, x[sl])
    grad(layer, b, t, check_bottom=[0], max_checks=20)
    # backward: zero outside the crop
    t[0].diff[...] = 1.0
    layer.backward(t, [True, False], b)
    expect = np.zeros_like(x)
    expect[sl] = 1.0
    np.testing.assert_array_equal(b[0].host_diff(), expect)


def test_crop_errors():
    expect_error('type: "Crop" crop_param { axis: 2 offset: 3 }',
                 [rnd(1, 1, 4, 4), rnd(1, 1, 2, 2)], "out of bounds", ShapeError)
    expect_error('type: "Crop"', [rnd(1, 1, 4, 4), rnd(1, 1, 5, 2)], "out of bounds",
                 ShapeError)
    expect_error('type: "Crop" crop_param { axis: 1 offset: 0 offset: 0 }',
                 [rnd(1, 1, 4, 4), rnd(1, 1, 2, 2)], "number of offsets")
    expect_error('type: "Crop"', [rnd(1, 1, 4, 4), rnd(1, 2, 2)], "same number of axes",
                 ShapeError)


@pytest.mark.parametrize("axis, tiles", [(1, 3), (0, 2), (-1, 2), (2, 1)])
def test_tile(axis, tiles):
    layer, b, t = check_tile(rnd(2, 3, 2), axis, tiles)
    grad(layer, b, t)


def check_tile(x, axis, tiles):
    """Tile's forward against np.tile; the layer and its blobs."""
    layer, b, t = testing.make_layer(
        f'type: "Tile" tile_param {{ axis: {axis} tiles: {tiles} }}', [x])
    y, = testing.forward(layer, b, t)
    reps = [1] * x.ndim
    reps[axis] = tiles
    np.testing.assert_array_equal(y, np.tile(x, reps))
    return layer, b, t


@pytest.mark.parametrize("axis, tiles", [(1, 7), (2, 3), (0, 5)])
def test_tile_large_in_chunks(axis, tiles):
    """Enough elements for a CPU driver to split the output into chunks
    that start inside a tile and cross tiles and outer rows (the CPU
    kernel walks each chunk run by run)."""
    check_tile(rnd(3, 5, 1037), axis, tiles)


def test_tile_errors():
    expect_error('type: "Tile" tile_param { tiles: 0 }', [rnd(2, 2)], "positive")
    expect_error('type: "Tile"', [rnd(2, 2)], "must be specified")
    expect_error('type: "Tile" tile_param { axis: 2 tiles: 2 }', [rnd(2, 2)], "out of range",
                 ShapeError)


# ---- Reduction -----------------------------------------------------------------

OPS = {"SUM": lambda v, ax: v.sum(ax), "ASUM": lambda v, ax: np.abs(v).sum(ax),
       "SUMSQ": lambda v, ax: (v ** 2).sum(ax), "MEAN": lambda v, ax: v.mean(ax)}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("axis, coeff", [(0, 1.0), (1, -0.5), (-1, 2.0), (2, 1.0)])
def test_reduction(op, axis, coeff):
    x = rnd(2, 3, 5)
    x[np.abs(x) < 0.05] = 0.3          # ASUM kink
    layer, b, t = testing.make_layer(
        f'type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}',
        [x])
    y, = testing.forward(layer, b, t)
    ax = axis % 3
    ref = coeff * OPS[op](x.astype(np.float64).reshape(x.shape[:ax] + (-1,)), -1)
    assert y.shape == x.shape[:ax]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    if axis in (1, -1):
        grad(layer, b, t, max_checks=12)


def test_reduction_large_rows():
    x = rnd(3, 1000)       # more elements per row than the work-group
    layer, b, t = testing.make_layer('type: "Reduction" reduction_param { axis: 1 }', [x])
    np.testing.assert_allclose(testing.forward(layer, b, t)[0], x.astype(np.float64).sum(1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", list(OPS))
def test_reduction_many_rows(op):
    """Enough rows for several work-items on a CPU driver (rows_sum_cpu),
    rows of 8-float vectors and a tail (a LayerNorm's mean over 197
    tokens x 77 channels)."""
    x = rnd(2, 197, 77)
    layer, b, t = testing.make_layer(
        f'type: "Reduction" reduction_param {{ operation: {op} axis: 2 coeff: 0.5 }}', [x])
    ref = 0.5 * OPS[op](x.astype(np.float64), -1)
    np.testing.assert_allclose(testing.forward(layer, b, t)[0], ref, rtol=1e-5, atol=1e-5)


def test_reduction_bad_axis():
    expect_error('type: "Reduction" reduction_param { axis: 3 }', [rnd(2, 3)], "out of range",
                 ShapeError)


# ---- ArgMax --------------------------------------------------------------------

def _argmax_ref(x, k, axis=None, out_max_val=False):
    """Caffe's order: value descending, ties -> larger index first."""
    if axis is None:
        flat = x.reshape(x.shape[0], -1)
        out = np.zeros((x.shape[0], 2 if out_max_val else 1, k) + (1,) * max(0, x.ndim - 3))
        for i, row in enumerate(flat):
            order = sorted(range(row.size), key=lambda j: (row[j], j), reverse=True)[:k]
            out[i, 0, :].flat[:] = order if True else 0
            if out_max_val:
                out[i, 1, :].flat[:] = row[order]
        return out
    xm = np.moveaxis(x, axis, -1)
    res = np.zeros(xm.shape[:-1] + (k,))
    for idx in np.ndindex(xm.shape[:-1]):
        row = xm[idx]
        order = sorted(range(row.size), key=lambda j: (row[j], j), reverse=True)[:k]
        res[idx] = row[order] if out_max_val else order
    return np.moveaxis(res, -1, axis)


@pytest.mark.parametrize("text, k, axis, omv", [
    ('', 1, None, False),
    ('argmax_param { top_k: 3 }', 3, None, False),
    ('argmax_param { top_k: 2 out_max_val: true }', 2, None, True),
    ('argmax_param { axis: 1 top_k: 2 }', 2, 1, False),
    ('argmax_param { axis: -1 out_max_val: true top_k: 3 }', 3, 2, True),
    ('argmax_param { axis: 0 }', 1, 0, False),
])
def test_argmax(text, k, axis, omv):
    x = np.round(rnd(2, 3, 4) * 2) / 2       # many ties
    layer, b, t = testing.make_layer('type: "ArgMax" ' + text, [x])
    y, = testing.forward(layer, b, t)
    ref = _argmax_ref(x, k, axis, omv)
    assert y.shape == ref.shape
    np.testing.assert_array_equal(y, ref)
    with pytest.raises(LayerError, match="no backward"):
        layer.backward(t, [True], b)


def test_argmax_errors():
    expect_error('type: "ArgMax" argmax_param { top_k: 5 }', [rnd(2, 4)], "top_k", ShapeError)
    expect_error('type: "ArgMax" argmax_param { axis: 1 top_k: 4 }', [rnd(2, 3, 6)], "top_k",
                 ShapeError)
    expect_error('type: "ArgMax" argmax_param { top_k: 0 }', [rnd(2, 4)], "top_k")


# ---- Silence / Filter / BatchReindex --------------------------------------------

def test_silence():
    xs = [rnd(2, 3), rnd(4)]
    layer, b, t = testing.make_layer('type: "Silence"', xs, ntop=0)
    assert testing.forward(layer, b, t) == []
    for x in b:
        x.diff[...] = 5.0
    layer.backward([], [True, False], b)
    np.testing.assert_array_equal(b[0].host_diff(), 0.0)
    np.testing.assert_array_equal(b[1].host_diff(), 5.0)


@pytest.mark.parametrize("sel", [[1, 0, 1, 1, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]])
def test_filter(sel):
    x1, x2 = rnd(5, 3, 2), rnd(5, 4)
    s = np.array(sel, np.float32).reshape(5, 1, 1)
    layer, b, t = testing.make_layer('type: "Filter"', [x1, x2, s], ntop=2)
    assert t[0].shape == x1.shape          # full size before the first forward (Caffe)
    y1, y2 = testing.forward(layer, b, t)
    keep = np.flatnonzero(np.array(sel))
    np.testing.assert_array_equal(y1, x1[keep])
    np.testing.assert_array_equal(y2, x2[keep])
    grad(layer, b, t, check_bottom=[0, 1], max_checks=10)
    # selector changes between forwards: shape follows the data
    b[2].data[...] = 0
    b[2].data[1] = 1
    y1, y2 = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y1, x1[1:2])
    t[0].diff[...] = 7.0
    t[1].diff[...] = 3.0
    layer.backward(t, [True, True, False], b)
    e1 = np.zeros_like(x1)
    e1[1] = 7.0
    np.testing.assert_array_equal(b[0].host_diff(), e1)


def test_filter_errors():
    expect_error('type: "Filter"', [rnd(4, 2), np.ones((3, 1), np.float32)], "0th dimension",
                 ShapeError)
    expect_error('type: "Filter"', [rnd(4, 2), np.ones((4, 2), np.float32)], "singletons",
                 ShapeError)
    expect_error('type: "Filter"', [rnd(4, 2), np.ones((4,), np.float32)], "one top", ntop=2)
    layer, b, t = testing.make_layer('name: "f" type: "Filter"',
                                     [rnd(4, 2), np.ones(4, np.float32)])
    testing.forward(layer, b, t)
    with pytest.raises(LayerError, match="selector"):
        layer.backward(t, [True, True], b)


@pytest.mark.parametrize("perm", [[2, 0, 1], [1, 1, 3, 0, 1], [3]])
def test_batch_reindex(perm):
    x = rnd(4, 2, 3)
    p = np.array(perm, np.float32)
    layer, b, t = testing.make_layer('type: "BatchReindex"', [x, p])
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, x[perm])
    grad(layer, b, t, check_bottom=[0], max_checks=12)
    dy = rnd(*y.shape)
    t[0].diff[...] = dy
    layer.backward(t, [True, False], b)
    expect = np.zeros(x.shape, np.float64)
    for i, j in enumerate(perm):
        expect[j] += dy[i]
    np.testing.assert_allclose(b[0].host_diff(), expect, rtol=1e-6, atol=1e-6)


def test_batch_reindex_errors():
    expect_error('type: "BatchReindex"', [rnd(3, 2), np.array([0, 3], np.float32)],
                 "outside", DataError)
    expect_error('type: "BatchReindex"', [rnd(3, 2), np.array([-1], np.float32)],
                 "outside", DataError)
    expect_error('type: "BatchReindex"', [rnd(3, 2), np.zeros((2, 1), np.float32)], "1-D",
                 ShapeError)
    layer, b, t = testing.make_layer('name: "r" type: "BatchReindex"',
                                     [rnd(3, 2), np.array([0, 2], np.float32)])
    testing.forward(layer, b, t)
    with pytest.raises(LayerError, match="index"):
        layer.backward(t, [True, True], b)


# ---- Parameter / Embed ------------------------------------------------------------

def test_parameter():
    layer, b, t = testing.make_layer(
        'type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }', [], ntop=1)
    assert layer.blobs[0].shape == (2, 3)
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, 0.0)           # Caffe leaves it zero
    w = rnd(2, 3)
    layer.blobs[0].data[...] = w
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, w)
    assert grad(layer, b, t) == 6
    # accumulates into the parameter diff
    layer.blobs[0].diff[...] = 1.0
    t[0].diff[...] = 2.0
    layer.backward(t, [], b)
    np.testing.assert_array_equal(layer.blobs[0].host_diff(), 3.0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3,), (2, 3)])
def test_embed(bias, shape):
    K, N = 5, 3
    idx = RNG.integers(0, K, size=shape).astype(np.float32)
    text = (f'type: "Embed" embed_param {{ input_dim: {K} num_output: {N} '
            f'bias_term: {str(bias).lower()} weight_filler {{ type: "uniform" min: -1 max: 1 }} '
            f'bias_filler {{ type: "uniform" min: -1 max: 1 }} }}')
    layer, b, t = testing.make_layer(text, [idx])
    assert layer.blobs[0].shape == (K, N)
    W = layer.blobs[0].host_data().astype(np.float64)
    y, = testing.forward(layer, b, t)
    ref = W[idx.astype(int)]
    if bias:
        ref = ref + layer.blobs[1].host_data()
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    grad(layer, b, t, check_bottom=[])
    dy = rnd(*y.shape)
    for p in layer.blobs:
        p.diff[...] = 0
    t[0].diff[...] = dy
    layer.backward(t, [False], b)
    dW = np.zeros((K, N))
    np.add.at(dW, idx.astype(int).ravel(), dy.reshape(-1, N))
    np.testing.assert_allclose(layer.blobs[0].host_diff(), dW, rtol=1e-5, atol=1e-6)
    if bias:
        np.testing.assert_allclose(layer.blobs[1].host_diff(), dy.reshape(-1, N).sum(0),
                                   rtol=1e-5, atol=1e-6)


def test_embed_errors():
    expect_error('type: "Embed" embed_param { input_dim: 3 }', [np.zeros(2, np.float32)],
                 "num_output")
    expect_error('type: "Embed" embed_param { num_output: 3 }', [np.zeros(2, np.float32)],
                 "input_dim")
    layer, b, t = testing.make_layer('name: "e" type: "Embed" embed_param { input_dim: 3 '
                                     'num_output: 2 }', [np.zeros(2, np.float32)])
    testing.forward(layer, b, t)
    with pytest.raises(LayerError, match="Embed input"):
        layer.backward(t, [True], b)


def test_views_in_a_net():
    """Flatten/Reshape/Slice/Concat/Eltwise wired by Net, forward and backward."""
    from caffe_ocl.net import Net
    from caffe_ocl.proto import caffe_pb2
    text = """
    name: "n" force_backward: true
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 2 } } }
    layer { name: "fl" type: "Flatten" bottom: "x" top: "f" }
    layer { name: "sl" type: "Slice" bottom: "f" top: "a" top: "b" slice_param { slice_point: 2 } }
    layer { name: "cat" type: "Concat" bottom: "b" bottom: "a" top: "c" }
    layer { name: "rs" type: "Reshape" bottom: "c" top: "r" reshape_param { shape { dim: 0 dim: 3 dim: -1 } } }
    layer { name: "el" type: "Eltwise" bottom: "r" bottom: "x" top: "s" eltwise_param { operation: PROD } }
    layer { name: "red" type: "Reduction" bottom: "s" top: "loss" loss_weight: 1 }
    """
    import os
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".prototxt", delete=False) as f:
        f.write(text)
    try:
        net = Net(f.name, caffe_pb2.TEST)
    finally:
        os.unlink(f.name)
    x = rnd(2, 3, 2)
    net.blobs["x"].data[...] = x
    net.forward()
    f_ = x.reshape(2, 6)
    r = np.concatenate([f_[:, 2:], f_[:, :2]], 1).reshape(2, 3, 2)
    np.testing.assert_allclose(net.blobs["loss"].data, (r * x).sum(), rtol=1e-5)
    net.backward()
    # d/dx sum(r(x) * x) = r + perm^T(x)
    xf = x.reshape(2, 6)
    back = np.concatenate([xf[:, 4:], xf[:, :4]], 1).reshape(2, 3, 2)
    np.testing.assert_allclose(net.blobs["x"].diff, r + back, rtol=1e-5, atol=1e-6)
