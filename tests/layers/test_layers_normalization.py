"""BatchNorm, MVN, Scale and Bias against float64 NumPy references of
Caffe's semantics, their gradients by finite differences, and bad
parameters."""
import numpy as np
import pytest
from google.protobuf import text_format

from caffe_ocl import LayerError, Net, ShapeError, caffe_pb2
from caffe_ocl.blob import Blob
from caffe_ocl.layers.base import create_layer
from caffe_ocl.testing import check_gradient, forward, layer_param, make_layer

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


# ---- references ---------------------------------------------------------------

def _bn_view(x):
    """x as (num, channels, spatial) float64, Caffe's BatchNorm view."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        return x.reshape(x.shape[0], 1, 1)
    return x.reshape(x.shape[0], x.shape[1], -1)


def bn_batch_ref(x, eps):
    v = _bn_view(x)
    mean = v.mean(axis=(0, 2))
    var = ((v - mean[None, :, None]) ** 2).mean(axis=(0, 2))
    y = (v - mean[None, :, None]) / np.sqrt(var + eps)[None, :, None]
    return y.reshape(x.shape), mean, var


def bn_global_ref(x, b0, b1, b2, eps):
    sf = 0.0 if b2[0] == 0 else 1.0 / np.float64(b2[0])
    mean, var = sf * b0.astype(np.float64), sf * b1.astype(np.float64)
    v = _bn_view(x)
    y = (v - mean[None, :, None]) / np.sqrt(var + eps)[None, :, None]
    return y.reshape(x.shape)


def mvn_ref(x, normalize_variance=True, across_channels=False, eps=1e-9):
    x = np.asarray(x, np.float64)
    rows = x.shape[0] if across_channels else x.shape[0] * x.shape[1]
    v = x.reshape(rows, -1)
    y = v - v.mean(axis=1, keepdims=True)
    if normalize_variance:
        y = y / (np.sqrt((y ** 2).mean(axis=1, keepdims=True)) + eps)
    return y.reshape(x.shape)


def bcast(b, xshape, axis):
    """Blob b broadcast over x's axes [axis, axis + b.ndim)."""
    axis = axis % len(xshape) if b.ndim else 0
    return np.asarray(b, np.float64).reshape(
        (1,) * axis + b.shape + (1,) * (len(xshape) - axis - b.ndim))


# ---- BatchNorm ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (5, 4), (7,), (1, 2, 3)])
def test_batchnorm_train_batch_stats_and_moving_average(rng, shape):
    maf, eps = 0.9, 1e-3
    x1 = rng.standard_normal(shape) * 2 + 0.5
    layer, b, t = make_layer(f'type: "BatchNorm" batch_norm_param {{ '
                             f'moving_average_fraction: {maf} eps: {eps} }}', [x1], TRAIN)
    assert not layer.use_global_stats
    c = 1 if len(shape) == 1 else shape[1]
    m = int(np.prod(shape)) // c
    run = [np.zeros(c), np.zeros(c), np.zeros(1)]
    for it, x in enumerate([x1, rng.standard_normal(shape) * 0.5 - 1.0]):
        b[0].data[...] = x
        (y,) = forward(layer, b, t)
        yref, mean, var = bn_batch_ref(x.astype(np.float32), eps)
        np.testing.assert_allclose(y, yref, rtol=1e-4, atol=1e-4, err_msg=f"iter {it}")
        corr = m / (m - 1) if m > 1 else 1.0
        run = [maf * run[0] + mean, maf * run[1] + corr * var, maf * run[2] + 1]
        for i in range(3):
            np.testing.assert_allclose(layer.blobs[i].data, run[i], rtol=1e-5, atol=1e-5,
                                       err_msg=f"blob {i} after iteration {it}")


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 6)])
@pytest.mark.parametrize("factor", [2.5, 0.0])
def test_batchnorm_test_uses_stored_stats(rng, shape, factor):
    eps = 1e-5
    x = rng.standard_normal(shape)
    layer, b, t = make_layer('type: "BatchNorm"', [x], TEST)
    assert layer.use_global_stats
    c = shape[1]
    b0, b1 = rng.standard_normal(c) * factor, rng.uniform(0.5, 2.0, c) * factor
    layer.blobs[0].data[...] = b0
    layer.blobs[1].data[...] = b1
    layer.blobs[2].data[...] = factor
    (y,) = forward(layer, b, t)
    ref = bn_global_ref(x.astype(np.float32), layer.blobs[0].data, layer.blobs[1].data,
                        layer.blobs[2].data, eps)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * max(1, np.abs(ref).max()))
    # statistics are untouched at TEST
    np.testing.assert_allclose(layer.blobs[2].data, [factor])


def test_batchnorm_use_global_stats_overrides_phase(rng):
    x = rng.standard_normal((3, 2, 2, 2))
    layer, b, t = make_layer('type: "BatchNorm" batch_norm_param { use_global_stats: false }',
                             [x], TEST)
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, bn_batch_ref(x.astype(np.float32), 1e-5)[0], atol=1e-4)
    layer, b, t = make_layer('type: "BatchNorm" batch_norm_param { use_global_stats: true }',
                             [x], TRAIN)
    layer.blobs[0].data[...] = [1.0, -1.0]
    layer.blobs[1].data[...] = [4.0, 2.0]
    layer.blobs[2].data[...] = 2.0
    (y,) = forward(layer, b, t)
    ref = bn_global_ref(x.astype(np.float32), np.array([1.0, -1.0]), np.array([4.0, 2.0]),
                        np.array([2.0]), 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.blobs[2].data, [2.0])


def test_batchnorm_statistics_are_not_parameters(rng):
    layer, b, t = make_layer('type: "BatchNorm"', [rng.standard_normal((2, 3))], TRAIN)
    assert [s.lr_mult for s in layer.param.param] == [0, 0, 0]
    assert layer.param_propagate_down == [False, False, False]
    with pytest.raises(LayerError, match="'batchnorm' \\(BatchNorm\\).*lr_mult"):
        make_layer('type: "BatchNorm" param { lr_mult: 1 }', [np.zeros((2, 3))], TRAIN)


def _split_shape_check(layer, m):
    """The shape really takes the split (several work-groups per channel) path."""
    from caffe_ocl.ops.channel import partial_plan
    c = layer.dims[1]
    assert partial_plan(layer.device, c, m)[1] > 1


def test_batchnorm_split_reduction_forward_backward(rng):
    """Few long channels (reductions split over work-groups), data far from
    zero mean (the one-pass shifted sums must stay accurate): forward and the
    analytic backward against float64."""
    shape, eps = (4, 2, 40, 33), 1e-5
    x = (rng.standard_normal(shape) * 0.5 + 30.0).astype(np.float32)
    layer, b, t = make_layer(f'type: "BatchNorm" batch_norm_param {{ eps: {eps} }}', [x],
                             TRAIN)
    _split_shape_check(layer, shape[0] * shape[2] * shape[3])
    (y,) = forward(layer, b, t)
    yref, mean, var = bn_batch_ref(x, eps)
    np.testing.assert_allclose(y, yref, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(layer.blobs[0].data, mean, rtol=1e-6)
    dy = rng.standard_normal(shape).astype(np.float32)
    t[0].diff[...] = dy
    layer.backward(t, [True], b)
    v, g = _bn_view(yref), _bn_view(dy)
    m = v.shape[0] * v.shape[2]
    s1 = g.sum(axis=(0, 2))[None, :, None] / m
    s2 = (g * v).sum(axis=(0, 2))[None, :, None] / m
    dx = (g - s1 - s2 * v) / np.sqrt(var + eps)[None, :, None]
    np.testing.assert_allclose(b[0].diff, dx.reshape(shape), rtol=2e-3, atol=2e-3)


def test_scale_split_reduction_gradients(rng):
    """Scale with bias over few long channels: the one-pass bias (sum dy) and
    scale (sum dy*x) gradients accumulate, against float64."""
    shape = (3, 2, 40, 40)      # m = 4800: split on GPUs (WG 256) and on PoCL
    x = rng.standard_normal(shape).astype(np.float32)
    layer, b, t = make_layer('type: "Scale" scale_param { bias_term: true '
                             'filler { type: "gaussian" } }', [x], TRAIN)
    _split_shape_check(layer, shape[0] * shape[2] * shape[3])
    forward(layer, b, t)
    dy = rng.standard_normal(shape).astype(np.float32)
    t[0].diff[...] = dy
    for p in layer.blobs:
        p.diff[...] = 1.0
    layer.backward(t, [True], b)
    g, xv = dy.astype(np.float64), x.astype(np.float64)
    np.testing.assert_allclose(layer.blobs[0].diff, 1.0 + (g * xv).sum(axis=(0, 2, 3)),
                               rtol=1e-4)
    np.testing.assert_allclose(layer.blobs[1].diff, 1.0 + g.sum(axis=(0, 2, 3)), rtol=1e-4)
    np.testing.assert_allclose(b[0].diff, g * bcast(layer.blobs[0].data, shape, 1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,ids", [((2, 3, 2, 2), [0, 7, 17]), ((4, 3), [1, 11])])
def test_batchnorm_train_gradient(rng, shape, ids):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer('type: "BatchNorm" batch_norm_param { eps: 1e-3 }', [x], TRAIN)
    for i in ids:   # sum(y^2) is ~constant under batch statistics: check single outputs
        check_gradient(layer, b, t, check_params=False, top_id=0, top_data_id=i,
                       stepsize=1e-2, threshold=2e-3)
    for p in layer.blobs:   # no gradient ever reaches the statistics
        assert not np.any(p.diff)


def test_batchnorm_global_gradient(rng):
    x = rng.standard_normal((2, 3, 2, 3))
    layer, b, t = make_layer('type: "BatchNorm"', [x], TEST)
    layer.blobs[0].data[...] = [0.5, -0.2, 1.0]
    layer.blobs[1].data[...] = [1.0, 3.0, 0.3]
    layer.blobs[2].data[...] = 1.5
    check_gradient(layer, b, t, check_params=False)


def test_batchnorm_in_place_matches(rng):
    x = rng.standard_normal((3, 2, 2, 3)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    ref_layer, b, t = make_layer('type: "BatchNorm"', [x], TRAIN)
    (y,) = forward(ref_layer, b, t)
    t[0].diff[...] = dy
    ref_layer.backward(t, [True], b)
    dx = b[0].diff.copy()
    blob = Blob(x.shape, name="inplace")
    blob.data[...] = x
    layer = create_layer(layer_param('name: "bn" type: "BatchNorm"'), TRAIN)
    layer.setup([blob], [blob])
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.data, y, rtol=1e-5, atol=1e-5)
    blob.diff[...] = dy
    layer.backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.diff, dx, rtol=1e-4, atol=1e-5)


def test_batchnorm_bad_inputs():
    with pytest.raises(ShapeError, match="'batchnorm' \\(BatchNorm\\).*at least 1 axis"):
        make_layer('type: "BatchNorm"', [np.float32(1.0)], TRAIN)
    layer, b, t = make_layer('type: "BatchNorm"', [np.zeros((2, 3, 2))], TRAIN)
    b[0].reshape((2, 4, 2))
    with pytest.raises(ShapeError, match="'batchnorm' \\(BatchNorm\\).*4 channels"):
        forward(layer, b, t)


def test_batchnorm_scale_in_place_net(rng):
    text = '''
    layer { name: "data" type: "Input" top: "data"
            input_param { shape { dim: 4 dim: 3 dim: 2 dim: 2 } } }
    layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" }
    layer { name: "bn2" type: "BatchNorm" bottom: "bn" top: "bn" }
    layer { name: "sc" type: "Scale" bottom: "bn" top: "bn"
            scale_param { bias_term: true filler { type: "constant" value: 2 }
                          bias_filler { type: "constant" value: 0.5 } } }
    '''
    param = caffe_pb2.NetParameter()
    text_format.Parse(text, param)
    param.force_backward = True
    net = Net(param, TRAIN)
    x = rng.standard_normal((4, 3, 2, 2))
    net.blobs["data"].data[...] = x
    out = net.forward()["bn"]
    y = bn_batch_ref(bn_batch_ref(x.astype(np.float32), 1e-5)[0], 1e-5)[0]
    np.testing.assert_allclose(out, 2 * y + 0.5, rtol=1e-3, atol=1e-3)
    for name in ("bn", "bn2"):
        layer = net.layer_dict[name]
        assert [s.lr_mult for s in layer.param.param] == [0, 0, 0]
        for p in layer.blobs:
            p.diff[...] = 0
    net.blobs["bn"].diff[...] = rng.standard_normal((4, 3, 2, 2))
    net.backward()
    for name in ("bn", "bn2"):
        for p in net.layer_dict[name].blobs:
            assert not np.any(p.diff)
    assert np.all(np.isfinite(net.blobs["data"].diff))


# ---- MVN --------------------------------------------------------------------------

MVN_CASES = [
    ((2, 3, 4, 5), ""),
    ((2, 3, 4, 5), "across_channels: true"),
    ((3, 2, 3, 1), "normalize_variance: false"),
    ((1, 4, 3, 3), "normalize_variance: false across_channels: true"),
    ((2, 3, 5), "eps: 0.1"),
    ((2, 5), "across_channels: true"),
]


def _mvn_kwargs(extra):
    return dict(normalize_variance="normalize_variance: false" not in extra,
                across_channels="across_channels: true" in extra,
                eps=0.1 if "eps: 0.1" in extra else 1e-9)


@pytest.mark.parametrize("shape,extra", MVN_CASES)
def test_mvn_forward(rng, shape, extra):
    x = rng.standard_normal(shape) * 3 + 1
    layer, b, t = make_layer(f'type: "MVN" mvn_param {{ {extra} }}', [x])
    (y,) = forward(layer, b, t)
    ref = mvn_ref(x.astype(np.float32), **_mvn_kwargs(extra))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,extra", [MVN_CASES[i] for i in (0, 1, 2)])
def test_mvn_gradient(rng, shape, extra):
    shape = (2, 2, 2, 3) if shape == (2, 3, 4, 5) else shape
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "MVN" mvn_param {{ {extra} }}', [x])
    if "normalize_variance: false" in extra:
        check_gradient(layer, b, t)
    else:
        for i in (0, 5, 13):
            check_gradient(layer, b, t, top_id=0, top_data_id=i, threshold=2e-3)


def test_mvn_bad_input():
    with pytest.raises(ShapeError, match="'mvn' \\(MVN\\).*at least 2 axes"):
        make_layer('type: "MVN"', [np.zeros(5)])


# ---- Scale / Bias ---------------------------------------------------------------

SCALE_CASES = [
    # (x shape, scale_param text, expected scale blob shape, axis)
    ((2, 3, 4, 5), "", (3,), 1),
    ((2, 3, 4, 5), "axis: 0 num_axes: -1", (2, 3, 4, 5), 0),
    ((2, 3, 4, 5), "axis: -2 num_axes: 2", (4, 5), 2),
    ((2, 3, 4, 5), "num_axes: 0", (), 0),
    ((3, 4), "axis: 0 num_axes: 2", (3, 4), 0),
    ((2, 3, 4), "axis: 2", (4,), 2),
]


@pytest.mark.parametrize("shape,extra,sshape,axis", SCALE_CASES)
def test_scale_learned_forward(rng, shape, extra, sshape, axis):
    x = rng.standard_normal(shape)
    text = (f'type: "Scale" scale_param {{ {extra} bias_term: true '
            'filler { type: "uniform" min: -2 max: 2 } '
            'bias_filler { type: "gaussian" std: 1 } }')
    layer, b, t = make_layer(text, [x])
    assert layer.blobs[0].shape == sshape and layer.blobs[1].shape == sshape
    s, bias = layer.blobs[0].data.copy(), layer.blobs[1].data.copy()
    (y,) = forward(layer, b, t)
    ref = x.astype(np.float32) * bcast(s, shape, axis) + bcast(bias, shape, axis)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_scale_default_fillers(rng):
    x = rng.standard_normal((2, 3, 2))
    layer, b, t = make_layer('type: "Scale" scale_param { bias_term: true }', [x])
    np.testing.assert_array_equal(layer.blobs[0].data, np.ones(3))
    np.testing.assert_array_equal(layer.blobs[1].data, np.zeros(3))
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, x.astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("shape,sshape,extra,axis", [
    ((2, 3, 4, 5), (2, 3), "axis: 0", 0),
    ((2, 3, 4, 5), (3, 4), "", 1),
    ((2, 3, 4), (), "", 0),
    ((2, 3), (2, 3), "axis: 0", 0),
    # inner size 1, long enough for a CPU driver's chunks to start inside
    # a row and cross rows (ops/channel.py chan_affine_rows)
    ((3, 7, 41, 43), (41, 43), "axis: 2", 2),
    ((3, 7, 41, 43), (3, 7, 41, 43), "axis: 0", 0),
])
def test_scale_second_bottom_forward(rng, shape, sshape, extra, axis):
    x, s = rng.standard_normal(shape), rng.standard_normal(sshape)
    text = (f'type: "Scale" scale_param {{ {extra} bias_term: true '
            'bias_filler { type: "uniform" min: -1 max: 1 } }')
    layer, b, t = make_layer(text, [x, s])
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == sshape
    bias = layer.blobs[0].data.copy()
    (y,) = forward(layer, b, t)
    ref = (x.astype(np.float32) * bcast(s.astype(np.float32), shape, axis)
           + bcast(bias, shape, axis))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra", ["", "axis: 0 num_axes: -1", "num_axes: 0", "axis: 2"])
def test_scale_param_gradient(rng, extra):
    x = rng.standard_normal((2, 3, 2, 2))
    text = (f'type: "Scale" scale_param {{ {extra} bias_term: true '
            'filler { type: "uniform" min: -2 max: 2 } '
            'bias_filler { type: "uniform" min: -1 max: 1 } }')
    layer, b, t = make_layer(text, [x])
    check_gradient(layer, b, t)


def test_scale_second_bottom_gradient(rng):
    x, s = rng.standard_normal((2, 3, 2, 2)), rng.standard_normal((2, 3))
    text = ('type: "Scale" scale_param { axis: 0 bias_term: true '
            'bias_filler { type: "uniform" min: -1 max: 1 } }')
    layer, b, t = make_layer(text, [x, s])
    check_gradient(layer, b, t)
    # eltwise (scale blob as large as the input) and scalar second bottoms
    layer, b, t = make_layer('type: "Scale" scale_param { axis: 0 }',
                             [rng.standard_normal((2, 3)), rng.standard_normal((2, 3))])
    check_gradient(layer, b, t)
    layer, b, t = make_layer('type: "Scale"',
                             [rng.standard_normal((2, 3, 2)), rng.standard_normal(())])
    check_gradient(layer, b, t)


def test_scale_param_gradient_accumulates(rng):
    x = rng.standard_normal((2, 3, 2))
    layer, b, t = make_layer('type: "Scale" scale_param { bias_term: true }', [x])
    forward(layer, b, t)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    t[0].diff[...] = dy
    layer.blobs[0].diff[...] = 1.0
    layer.blobs[1].diff[...] = -1.0
    layer.backward(t, [True], b)
    xf = x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(layer.blobs[0].diff, 1 + (dy * xf).sum(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(layer.blobs[1].diff, -1 + dy.sum(axis=(0, 2)), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(b[0].diff, dy * layer.blobs[0].data[None, :, None], rtol=1e-6)


def test_scale_in_place_matches(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    text = ('name: "sc" type: "Scale" scale_param { bias_term: true '
            'filler { type: "uniform" min: -2 max: 2 } }')
    ref_layer, b, t = make_layer(text, [x])
    s = ref_layer.blobs[0].data.copy()
    (y,) = forward(ref_layer, b, t)
    t[0].diff[...] = dy
    ref_layer.backward(t, [True], b)
    blob = Blob(x.shape, name="inplace")
    blob.data[...] = x
    layer = create_layer(layer_param(text), TEST)
    layer.setup([blob], [blob])
    layer.blobs[0].data[...] = s
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.data, y, rtol=1e-6)
    blob.diff[...] = dy
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.diff, b[0].diff, rtol=1e-6)
    for p, q in zip(layer.blobs, ref_layer.blobs):
        np.testing.assert_allclose(p.diff, q.diff, rtol=1e-5)


def test_scale_bad_inputs(rng):
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ShapeError, match="'scale' \\(Scale\\).*does not match"):
        make_layer('type: "Scale"', [x, np.zeros((4,))])          # axis 1 has 3, not 4
    with pytest.raises(ShapeError, match="'scale' \\(Scale\\).*does not match"):
        make_layer('type: "Scale" scale_param { axis: 1 }', [x, np.zeros((3, 4, 2))])
    with pytest.raises(LayerError, match="'scale' \\(Scale\\).*num_axes"):
        make_layer('type: "Scale" scale_param { num_axes: -2 }', [x])
    with pytest.raises(ShapeError, match="'scale' \\(Scale\\).*extends past"):
        make_layer('type: "Scale" scale_param { axis: 2 num_axes: 2 }', [x])
    with pytest.raises(ShapeError, match="'scale' \\(Scale\\)"):
        make_layer('type: "Scale" scale_param { axis: 5 }', [x])


@pytest.mark.parametrize("shape,extra,bshape,axis", [
    ((2, 3, 4, 5), "", (3,), 1),
    ((2, 3, 4, 5), "axis: 0 num_axes: 2", (2, 3), 0),
    ((2, 3, 4), "num_axes: -1", (3, 4), 1),
    ((2, 3), "num_axes: 0", (), 0),
])
def test_bias_learned_forward_and_gradient(rng, shape, extra, bshape, axis):
    x = rng.standard_normal(shape)
    layer, b, t = make_layer(f'type: "Bias" bias_param {{ {extra} '
                             'filler { type: "gaussian" std: 1 } }', [x])
    assert layer.blobs[0].shape == bshape
    bias = layer.blobs[0].data.copy()
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, x.astype(np.float32) + bcast(bias, shape, axis),
                               rtol=1e-6, atol=1e-6)
    if np.prod(shape) <= 24:
        check_gradient(layer, b, t)


def test_bias_second_bottom(rng):
    x, bb = rng.standard_normal((2, 3, 2, 2)), rng.standard_normal((3, 2))
    layer, b, t = make_layer('type: "Bias"', [x, bb])
    assert layer.blobs == []
    (y,) = forward(layer, b, t)
    np.testing.assert_allclose(y, x.astype(np.float32) + bb.astype(np.float32)[None, :, :, None],
                               rtol=1e-6, atol=1e-6)
    check_gradient(layer, b, t)
    with pytest.raises(ShapeError, match="'bias' \\(Bias\\).*does not match"):
        make_layer('type: "Bias"', [x, np.zeros((2, 3))])
