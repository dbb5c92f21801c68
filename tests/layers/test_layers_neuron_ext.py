"""PReLU, ELU, AbsVal, Power, Exp, Log, BNLL, Threshold, Clip, Swish, ReLU6:
forward vs float64 NumPy, backward by finite differences and by the analytic
derivative, in-place use, bad parameters."""
import numpy as np
import pytest

from caffe_ocl import testing
from caffe_ocl.blob import Blob
from caffe_ocl.errors import CaffeOclError, LayerError
from caffe_ocl.layers.base import create_layer

RNG = np.random.default_rng(7)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _away(shape, lo, hi, kinks=(), margin=0.05):
    """Uniform values in [lo, hi] at least ``margin`` from every kink."""
    x = RNG.uniform(lo, hi, size=shape)
    for k in kinks:
        near = np.abs(x - k) < margin
        x[near] = k + np.where(x[near] >= k, margin, -margin) * 2
    return x.astype(np.float32)


# name, layer text, f(x), f'(x), input generator
CASES = [
    ("elu", 'type: "ELU" elu_param { alpha: 0.7 }',
     lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)),
     lambda x: np.where(x > 0, 1.0, 0.7 * np.exp(x)),
     lambda s: _away(s, -2, 2, [0])),
    ("elu_neg_alpha", 'type: "ELU" elu_param { alpha: -0.5 }',
     lambda x: np.where(x > 0, x, -0.5 * np.expm1(x)),
     lambda x: np.where(x > 0, 1.0, -0.5 * np.exp(x)),
     lambda s: _away(s, -2, 2, [0])),
    ("absval", 'type: "AbsVal"', np.abs, np.sign, lambda s: _away(s, -2, 2, [0])),
    ("power", 'type: "Power" power_param { power: 2.5 scale: 0.8 shift: 0.3 }',
     lambda x: (0.3 + 0.8 * x) ** 2.5, lambda x: 2.5 * 0.8 * (0.3 + 0.8 * x) ** 1.5,
     lambda s: _away(s, 0.2, 1.5)),
    ("power2", 'type: "Power" power_param { power: 2 scale: -1.5 shift: 0.5 }',
     lambda x: (0.5 - 1.5 * x) ** 2, lambda x: 2 * -1.5 * (0.5 - 1.5 * x),
     lambda s: _away(s, -1.5, 1.5)),
    ("power1", 'type: "Power" power_param { power: 1 scale: 3 shift: -1 }',
     lambda x: 3 * x - 1, lambda x: np.full_like(x, 3.0), lambda s: _away(s, -2, 2)),
    ("power_scale0", 'type: "Power" power_param { power: 0.5 scale: 0 shift: 0 }',
     lambda x: np.zeros_like(x), lambda x: np.zeros_like(x), lambda s: _away(s, -2, 2)),
    ("power_p0", 'type: "Power" power_param { power: 0 scale: 2 shift: 0 }',
     lambda x: np.ones_like(x), lambda x: np.zeros_like(x), lambda s: _away(s, -2, 2)),
    ("exp", 'type: "Exp"', np.exp, np.exp, lambda s: _away(s, -2, 2)),
    ("exp_base", 'type: "Exp" exp_param { base: 2 scale: 0.5 shift: -0.3 }',
     lambda x: 2.0 ** (-0.3 + 0.5 * x), lambda x: np.log(2) * 0.5 * 2.0 ** (-0.3 + 0.5 * x),
     lambda s: _away(s, -2, 2)),
    ("log", 'type: "Log"', np.log, lambda x: 1 / x, lambda s: _away(s, 0.3, 3)),
    ("log_base", 'type: "Log" log_param { base: 10 scale: 2 shift: 1 }',
     lambda x: np.log10(1 + 2 * x), lambda x: 2 / ((1 + 2 * x) * np.log(10)),
     lambda s: _away(s, -0.3, 2)),
    ("bnll", 'type: "BNLL"', lambda x: np.logaddexp(0, x), _sig, lambda s: _away(s, -3, 3)),
    ("clip", 'type: "Clip" clip_param { min: -0.5 max: 0.8 }',
     lambda x: np.clip(x, -0.5, 0.8),
     lambda x: ((x >= -0.5) & (x <= 0.8)).astype(np.float64),
     lambda s: _away(s, -1.5, 1.5, [-0.5, 0.8])),
    ("relu6", 'type: "ReLU6"', lambda x: np.clip(x, 0, 6),
     lambda x: ((x >= 0) & (x <= 6)).astype(np.float64),
     lambda s: _away(s, -2, 8, [0, 6])),
    ("swish", 'type: "Swish" swish_param { beta: 1.5 }',
     lambda x: x * _sig(1.5 * x),
     lambda x: _sig(1.5 * x) + 1.5 * x * _sig(1.5 * x) * (1 - _sig(1.5 * x)),
     lambda s: _away(s, -3, 3)),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 7)])
def test_forward(case, shape):
    _, text, f, _, gen = case
    x = gen(shape)
    layer, b, t = testing.make_layer(text, [x])
    y, = testing.forward(layer, b, t)
    assert y.shape == shape
    np.testing.assert_allclose(y, f(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradient(case):
    _, text, _, _, gen = case
    x = gen((2, 3, 2))
    layer, b, t = testing.make_layer(text, [x])
    testing.check_gradient(layer, b, t, stepsize=1e-2, threshold=1e-2)


def _inplace(text, x):
    p = testing.layer_param(text)
    blob = Blob(x.shape, name="x")
    blob.data[...] = x
    layer = create_layer(p, None)
    layer.propagate_down = [True]
    layer.setup([blob], [blob])
    return layer, blob


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_inplace_forward_backward(case):
    """Bottom == top: forward as reference, backward equals dy * f'(x) of the
    original x (the layer must have kept x where its gradient needs it)."""
    _, text, f, df, gen = case
    x = gen((2, 3, 3))
    x64 = x.astype(np.float64)
    layer, blob = _inplace(text, x)
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.host_data(), f(x64), rtol=2e-5, atol=2e-6)
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    blob.diff[...] = dy
    layer.backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.host_diff(), dy * df(x64), rtol=1e-4, atol=1e-5)
    # not in place, same analytic gradient
    layer, b, t = testing.make_layer(text, [x])
    testing.forward(layer, b, t)
    t[0].diff[...] = dy
    layer.backward(t, [True], b)
    np.testing.assert_allclose(b[0].host_diff(), dy * df(x64), rtol=1e-4, atol=1e-5)


def test_power_zero_scale_gradient_is_zero_not_nan():
    # power * scale == 0 -> Caffe sets the gradient to 0 even where pow(0, -0.5) is inf
    x = np.array([[0.0, 1.0, -2.0]], np.float32)
    layer, b, t = testing.make_layer('type: "Power" power_param { power: 0.5 scale: 0 }', [x])
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, 0.0)
    t[0].diff[...] = 1.0
    layer.backward(t, [True], b)
    np.testing.assert_array_equal(b[0].host_diff(), 0.0)
    layer, b, t = testing.make_layer('type: "Power" power_param { power: 0 shift: 0 }', [x])
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, 1.0)
    t[0].diff[...] = 1.0
    layer.backward(t, [True], b)
    np.testing.assert_array_equal(b[0].host_diff(), 0.0)


# ---- Threshold --------------------------------------------------------------

def test_threshold_forward_and_no_backward():
    x = np.array([[-1.0, 0.0, 0.3, 0.30001, 2.0]], np.float32)
    layer, b, t = testing.make_layer('type: "Threshold" threshold_param { threshold: 0.3 }', [x])
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, (x > np.float32(0.3)).astype(np.float32))
    assert not layer.has_backward
    with pytest.raises(LayerError, match="threshold"):
        layer.backward(t, [True], b)
    layer, blob = _inplace('type: "Threshold"', x)
    layer.forward([blob], [blob])
    np.testing.assert_array_equal(blob.host_data(), (x > 0).astype(np.float32))


# ---- PReLU ------------------------------------------------------------------

def _prelu_ref(x, a, shared):
    a = np.asarray(a, np.float64)
    if not shared:
        a = a.reshape((1, -1) + (1,) * (x.ndim - 2))
    return np.maximum(x, 0) + a * np.minimum(x, 0)


# (2, 3, 13): planes not a multiple of 8 floats; (2, 3, 9001): planes of
# several CPU pieces (ops/prelu.py CPU_CHUNK) with a tail; (1, 5): one float
# a plane
@pytest.mark.parametrize("shape", [(2, 3, 2, 3), (1, 5), (3, 1, 5), (2, 3, 13),
                                   (2, 3, 9001)])
@pytest.mark.parametrize("shared", [False, True])
def test_prelu_forward(shape, shared):
    x = _away(shape, -2, 2, [0])
    text = f'type: "PReLU" prelu_param {{ channel_shared: {str(shared).lower()} }}'
    layer, b, t = testing.make_layer(text, [x])
    slope = layer.blobs[0]
    assert slope.shape == (() if shared else (shape[1],))
    np.testing.assert_allclose(slope.host_data(), 0.25)       # default filler
    a = RNG.uniform(-0.5, 1.0, size=slope.shape).astype(np.float32)
    slope.data[...] = a
    y, = testing.forward(layer, b, t)
    np.testing.assert_allclose(y, _prelu_ref(x.astype(np.float64), a, shared), rtol=1e-6,
                               atol=1e-6)


def test_prelu_filler():
    x = _away((2, 4), -1, 1, [0])
    layer, b, t = testing.make_layer(
        'type: "PReLU" prelu_param { filler { type: "constant" value: -0.3 } }', [x])
    np.testing.assert_allclose(layer.blobs[0].host_data(), -0.3)


@pytest.mark.parametrize("shared", [False, True])
def test_prelu_gradient(shared):
    x = _away((2, 3, 3), -2, 2, [0], margin=0.05)
    text = f'type: "PReLU" prelu_param {{ channel_shared: {str(shared).lower()} }}'
    layer, b, t = testing.make_layer(text, [x])
    layer.blobs[0].data[...] = RNG.uniform(0.1, 0.6, size=layer.blobs[0].shape)
    n = testing.check_gradient(layer, b, t, stepsize=1e-2, threshold=1e-2)
    assert n == x.size + layer.blobs[0].count


def test_prelu_param_gradient_accumulates_and_inplace():
    x = _away((2, 3, 4), -2, 2, [0])
    x64 = x.astype(np.float64)
    a = np.array([0.1, -0.2, 0.4], np.float32)
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    expect_da = (dy * x64 * (x64 <= 0)).sum(axis=(0, 2))
    expect_dx = dy * np.where(x64 > 0, 1.0, a[None, :, None])
    layer, blob = _inplace('type: "PReLU"', x)
    layer.blobs[0].data[...] = a
    layer.blobs[0].diff[...] = 1.0
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.host_data(), _prelu_ref(x64, a, False), rtol=1e-6,
                               atol=1e-6)
    blob.diff[...] = dy
    layer.backward([blob], [True], [blob])
    np.testing.assert_allclose(layer.blobs[0].host_diff(), 1.0 + expect_da, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(blob.host_diff(), expect_dx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 9001), (3, 4, 7)])
def test_prelu_backward_long_planes(shape):
    """dx = dy * (x > 0 ? 1 : a_c) on planes of several CPU pieces and on
    planes shorter than one 8-float step."""
    x = _away(shape, -2, 2, [0])
    x64 = x.astype(np.float64)
    layer, b, t = testing.make_layer('type: "PReLU"', [x])
    a = RNG.uniform(-0.5, 1.0, size=shape[1]).astype(np.float32)
    layer.blobs[0].data[...] = a
    dy = RNG.standard_normal(shape).astype(np.float32)
    testing.forward(layer, b, t)
    t[0].diff[...] = dy
    layer.backward(t, [True], b)
    expect = dy * np.where(x64 > 0, 1.0, a[None, :, None])
    np.testing.assert_allclose(b[0].host_diff(), expect, rtol=1e-6, atol=1e-6)


_PRELU_NET = """
name: "p" input: "data" input_shape { dim: 2 dim: 3 dim: 4 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "prelu" type: "PReLU" bottom: "conv" top: "conv"
  prelu_param { filler { type: "constant" value: -0.3 } } }
"""


@pytest.mark.parametrize("force_backward", [False, True])
def test_inplace_prelu_copies_input_only_for_a_backward(tmp_path, force_backward):
    """A deploy net (no loss, no force_backward) runs no backward, so an
    in-place PReLU keeps no copy of its input (a pass over the blob per
    forward); with force_backward it keeps one and the input gradient is
    right although the forward overwrote the input (a negative slope: read
    from the output, every negative input would take the positive branch)."""
    from caffe_ocl.net import Net, TEST
    proto = tmp_path / "p.prototxt"
    proto.write_text(_PRELU_NET + ("force_backward: true\n" if force_backward else ""))
    net = Net(str(proto), TEST)
    layer = net.layer_dict["prelu"]
    assert layer.need_backward is force_backward
    assert (layer.bottom_memory is not None) is force_backward
    assert len(layer.fwd) == (2 if force_backward else 1)
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    net.forward(data=x)
    # the conv's output as the PReLU saw it: the same net without the PReLU
    plain = tmp_path / "plain.prototxt"
    plain.write_text(_PRELU_NET.split('layer { name: "prelu"')[0])
    ref = Net(str(plain), TEST)
    ref.params["conv"][0].data[...] = net.params["conv"][0].data
    ref.params["conv"][1].data[...] = net.params["conv"][1].data
    z = ref.forward(data=x)["conv"].astype(np.float64)
    np.testing.assert_allclose(net.blobs["conv"].data, np.where(z > 0, z, -0.3 * z),
                               rtol=1e-5, atol=1e-5)
    if force_backward:
        dy = RNG.standard_normal(z.shape).astype(np.float32)
        net.blobs["conv"].diff[...] = dy
        net.backward(start="prelu", end="prelu")
        np.testing.assert_allclose(net.blobs["conv"].diff, dy * np.where(z > 0, 1.0, -0.3),
                                   rtol=1e-5, atol=1e-5)


# ---- bad parameters ------------------------------------------------------------

@pytest.mark.parametrize("text, x_shape, pattern", [
    ('type: "PReLU"', (5,), "at least 2 axes"),
    ('type: "Exp" exp_param { base: -2 }', (2, 3), "strictly positive"),
    ('type: "Log" log_param { base: 0 }', (2, 3), "strictly positive"),
    ('type: "Log" log_param { base: 1 }', (2, 3), "log\\(base\\) = 0"),
])
def test_bad_params(text, x_shape, pattern):
    name = "badlayer"
    with pytest.raises(CaffeOclError, match=pattern) as info:
        testing.make_layer(f'name: "{name}" ' + text, [np.zeros(x_shape, np.float32)])
    assert name in str(info.value)


def test_clip_requires_min_max():
    with pytest.raises(LayerError, match="clip") as info:
        testing.make_layer('name: "c" type: "Clip" clip_param { min: 0 }',
                           [np.zeros((2, 2), np.float32)])
    assert "'c'" in str(info.value)
