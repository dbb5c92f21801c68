"""LSTM, RNN and LSTMUnit (caffe_ocl/layers/recurrent.py) against a float64
NumPy transcription of Caffe's unrolled nets (lstm_layer.cpp, rnn_layer.cpp,
lstm_unit_layer.cpp), gradients checked numerically as Caffe's layer tests
do (first step's cont = 0, so repeated forwards see the same state)."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import parse_net_text
from caffe_ocl.testing import check_gradient, forward, make_layer


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_unit_ref(c_prev, x, cont):
    D = c_prev.shape[-1]
    i, f, o, g = (x[..., k * D:(k + 1) * D] for k in range(4))
    i, o, g = sigmoid(i), sigmoid(o), np.tanh(g)
    f = np.where(cont[..., None] == 0, 0.0, cont[..., None] * sigmoid(f))
    c = f * c_prev + i * g
    return c, o * np.tanh(c)


def lstm_ref(x, cont, w, xs=None, h0=None, c0=None):
    """Caffe's unrolled LSTM. w = [W_xc, b_c, (W_xc_static), W_hc]."""
    T, N = cont.shape
    x = x.reshape(T, N, -1).astype(np.float64)
    W_xc, b_c = w[0], w[1]
    W_hc = w[-1]
    H = W_hc.shape[1]
    h = np.zeros((N, H)) if h0 is None else h0.reshape(N, H).astype(np.float64)
    c = np.zeros((N, H)) if c0 is None else c0.reshape(N, H).astype(np.float64)
    static = 0.0 if xs is None else xs.reshape(N, -1) @ w[2].T
    out = []
    for t in range(T):
        gate = (cont[t][:, None] * h) @ W_hc.T + x[t] @ W_xc.T + b_c + static
        c, h = lstm_unit_ref(c, gate, cont[t])
        out.append(h)
    return np.stack(out), h, c


def rnn_ref(x, cont, w, xs=None, h0=None):
    """Caffe's unrolled RNN. w = [W_xh, b_h, (W_xh_static), W_hh, W_ho, b_o]."""
    T, N = cont.shape
    x = x.reshape(T, N, -1).astype(np.float64)
    W_xh, b_h, W_hh, W_ho, b_o = w[0], w[1], w[-3], w[-2], w[-1]
    H = W_hh.shape[0]
    h = np.zeros((N, H)) if h0 is None else h0.reshape(N, H).astype(np.float64)
    static = 0.0 if xs is None else xs.reshape(N, -1) @ w[2].T
    out = []
    for t in range(T):
        h = np.tanh((cont[t][:, None] * h) @ W_hh.T + x[t] @ W_xh.T + b_h + static)
        out.append(np.tanh(h @ W_ho.T + b_o))
    return np.stack(out), h


def _layer(kind, T=3, N=2, I=(3,), H=4, static=False, expose=False, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (T, N) + I)
    cont = np.ones((T, N))
    cont[0] = 0                      # sequences start at the first step
    cont[2 % T, 1] = 0               # ... and stream 1 restarts
    bottoms = [x, cont]
    if static:
        bottoms.append(rng.uniform(-1, 1, (N, 5)))
    if expose:
        bottoms.append(rng.uniform(-1, 1, (1, N, H)))
        if kind == "LSTM":
            bottoms.append(rng.uniform(-1, 1, (1, N, H)))
    ntop = 1 + (0 if not expose else (2 if kind == "LSTM" else 1))
    text = (f'type: "{kind}" recurrent_param {{ num_output: {H} expose_hidden: '
            f'{str(expose).lower()} weight_filler {{ type: "uniform" min: -0.5 max: 0.5 }} '
            f'bias_filler {{ type: "uniform" min: -0.3 max: 0.3 }} }}')
    layer, bl, tops = make_layer(text, bottoms, ntop=ntop)
    return layer, bl, tops, bottoms


def _weights(layer):
    return [b.host_data().astype(np.float64) for b in layer.blobs]


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
def test_forward_matches_caffe_unrolled(kind, static):
    layer, bl, tops, arrays = _layer(kind, T=4, N=3, I=(2, 3), static=static)
    G = 4 * 4 if kind == "LSTM" else 4
    shapes = [b.shape for b in layer.blobs]
    want = [(G, 6), (G,)] + ([(G, 5)] if static else []) + [(G, 4)]
    if kind == "RNN":
        want += [(4, 4), (4,)]
    assert shapes == want                        # Caffe's blob order and shapes
    out = forward(layer, bl, tops)[0]
    xs = arrays[2] if static else None
    ref = (lstm_ref if kind == "LSTM" else rnn_ref)(arrays[0], arrays[1], _weights(layer), xs)
    assert out.shape == (4, 3, 4)
    np.testing.assert_allclose(out, ref[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_state_carried_to_the_next_forward(kind):
    """Without expose_hidden the last step's state starts the next forward;
    cont = 0 clears it, cont = 1 keeps it (Caffe's semantics)."""
    layer, bl, tops, arrays = _layer(kind, T=3, N=2)
    w = _weights(layer)
    first = forward(layer, bl, tops)[0]
    ref = lstm_ref(arrays[0], arrays[1], w) if kind == "LSTM" else rnn_ref(
        arrays[0], arrays[1], w)
    np.testing.assert_allclose(first, ref[0], rtol=1e-5, atol=1e-6)
    cont = np.ones((3, 2))
    bl[1].data[...] = cont
    second = forward(layer, bl, tops)[0]
    if kind == "LSTM":
        want = lstm_ref(arrays[0], cont, w, h0=ref[1], c0=ref[2])[0]
    else:
        want = rnn_ref(arrays[0], cont, w, h0=ref[1])[0]
    np.testing.assert_allclose(second, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(second, first)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_expose_hidden(kind):
    layer, bl, tops, arrays = _layer(kind, T=3, N=2, expose=True)
    w = _weights(layer)
    bl[1].data[...] = 1.0                  # keep the given initial state
    cont = np.ones((3, 2))
    outs = forward(layer, bl, tops)
    if kind == "LSTM":
        ref = lstm_ref(arrays[0], cont, w, h0=arrays[2], c0=arrays[3])
    else:
        ref = rnn_ref(arrays[0], cont, w, h0=arrays[2])
    np.testing.assert_allclose(outs[0], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1].reshape(2, 4), ref[1], rtol=1e-5, atol=1e-6)
    if kind == "LSTM":
        np.testing.assert_allclose(outs[2].reshape(2, 4), ref[2], rtol=1e-5, atol=1e-6)
    again = forward(layer, bl, tops)        # the state comes from the bottoms, not carried
    np.testing.assert_allclose(again[0], outs[0], rtol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
def test_gradients(kind, static):
    layer, bl, tops, _ = _layer(kind, T=3, N=2, I=(3,), H=3, static=static)
    check_gradient(layer, bl, tops, stepsize=1e-2, threshold=1e-2,
                   check_bottom=[0, 2] if static else [0])


def _numeric_grad(f, a, eps=1e-6):
    g = np.zeros_like(a)
    for i in range(a.size):
        up, down = a.copy(), a.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        g.flat[i] = (f(up) - f(down)) / (2 * eps)
    return g


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
def test_gradients_match_the_reference(kind, static):
    """Every gradient against float64 finite differences of the unrolled
    reference, to 1e-4 of the largest (Caffe's checker above allows 1e-2
    absolute on these small values: dropping cont_{t+1} from the gradient
    through h_conted_t passed it)."""
    layer, bl, tops, arrays = _layer(kind, T=3, N=2, I=(3,), H=3, static=static)
    ref = lstm_ref if kind == "LSTM" else rnn_ref
    x = bl[0].host_data().astype(np.float64)
    cont = arrays[1]
    xs = bl[2].host_data().astype(np.float64) if static else None
    w = _weights(layer)
    for b in layer.blobs:
        b.diff[...] = 0
    forward(layer, bl, tops)
    tops[0].diff[...] = tops[0].host_data()
    layer.backward(tops, [True, False, True][:len(bl)], bl)

    def loss(x=x, xs=xs, w=w):
        return 0.5 * np.sum(ref(x, cont, w, xs)[0] ** 2)
    pairs = [(bl[0].host_diff(), _numeric_grad(lambda v: loss(x=v), x))]
    if static:
        pairs.append((bl[2].host_diff(), _numeric_grad(lambda v: loss(xs=v), xs)))
    for i, b in enumerate(layer.blobs):
        pairs.append((b.host_diff(), _numeric_grad(
            lambda v, i=i: loss(w=w[:i] + [v] + w[i + 1:]), w[i])))
    for k, (got, want) in enumerate(pairs):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max() + 1e-7,
                                   err_msg=f"gradient {k}")


def test_lstm_unit_matches_caffe_and_gradients():
    rng = np.random.default_rng(3)
    N, D = 3, 4
    c_prev = rng.uniform(-1, 1, (1, N, D))
    x = rng.uniform(-2, 2, (1, N, 4 * D))
    cont = np.array([[1.0, 0.0, 0.5]])
    layer, bl, tops = make_layer('type: "LSTMUnit"', [c_prev, x, cont], ntop=2)
    c, h = forward(layer, bl, tops)
    rc, rh = lstm_unit_ref(c_prev, x, cont)
    np.testing.assert_allclose(c, rc, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, rh, rtol=1e-5, atol=1e-6)
    bl[2].data[...] = [[1.0, 0.0, 1.0]]      # binary cont: Caffe's gradient is exact there
    check_gradient(layer, bl, tops, stepsize=1e-2, threshold=1e-2, check_bottom=[0, 1])


@pytest.mark.parametrize("text,bottoms,msg", [
    ('type: "LSTM" recurrent_param { num_output: 0 }', [(3, 2, 4), (3, 2)], "num_output"),
    ('type: "LSTM" recurrent_param { num_output: 4 }', [(3, 2, 4), (3, 3)], "cont"),
    ('type: "RNN" recurrent_param { num_output: 4 }', [(3, 2, 4), (3, 2), (3, 5)], "x_static"),
    ('type: "LSTM" recurrent_param { num_output: 4 expose_hidden: true }',
     [(3, 2, 4), (3, 2), (1, 2, 4)], "bottom"),
    ('type: "LSTMUnit"', [(1, 2, 4), (1, 2, 12), (1, 2)], "gate input"),
])
def test_bad_shapes_are_named(text, bottoms, msg):
    with pytest.raises(CaffeOclError) as e:
        make_layer(text, [np.zeros(s) for s in bottoms],
                   ntop=2 if "LSTMUnit" in text else 1)
    assert msg in str(e.value) and "layer" in str(e.value)


def test_timesteps_may_not_change():
    layer, bl, tops, _ = _layer("LSTM", T=3, N=2)
    bl[0].reshape(4, 2, 3)
    bl[1].reshape(4, 2)
    with pytest.raises(CaffeOclError, match="timesteps changed"):
        forward(layer, bl, tops)


NET = """
name: "seq"
layer { name: "in" type: "Input" top: "x" top: "cont" top: "label"
        input_param { shape { dim: 5 dim: 4 dim: 3 } shape { dim: 5 dim: 4 }
                      shape { dim: 5 dim: 4 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 8 weight_filler { type: "uniform" min: -0.3 max: 0.3 }
                          bias_filler { type: "constant" value: 0 } } }
layer { name: "drop" type: "Dropout" bottom: "h" top: "h" dropout_param { dropout_ratio: 0.2 } }
layer { name: "fc" type: "InnerProduct" bottom: "h" top: "fc"
        inner_product_param { num_output: 2 axis: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss"
        softmax_param { axis: 2 } }
"""


def test_lstm_learns_in_a_net(tmp_path):
    """A solver trains an LSTM to tell whether the running sum of a
    sequence's first input is positive; the model saves and loads as a
    .caffemodel with the layer's three blobs."""
    caffe_ocl.set_random_seed(1)
    sp = caffe_ocl.proto.caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(parse_net_text(NET))
    sp.base_lr, sp.momentum, sp.lr_policy, sp.max_iter = 0.1, 0.9, "fixed", 150
    solver = caffe_ocl.solvers.SGDSolver(sp)
    net = solver.net
    rng = np.random.default_rng(0)
    cont = np.ones((5, 4))
    cont[0] = 0
    losses = []
    for it in range(150):
        x = rng.uniform(-1, 1, (5, 4, 3))
        net.blobs["x"].data[...] = x
        net.blobs["cont"].data[...] = cont
        net.blobs["label"].data[...] = (np.cumsum(x[:, :, 0], axis=0) > 0)
        solver.step(1)
        losses.append(float(net.blobs["loss"].data))
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20]), (losses[:20], losses[-20:])
    assert [b.shape for b in net.params["lstm"]] == [(32, 3), (32,), (32, 8)]
    path = tmp_path / "m.caffemodel"
    net.save(str(path))
    other = caffe_ocl.Net(parse_net_text(NET), caffe_ocl.TEST, weights=str(path))
    for a, b in zip(other.params["lstm"], net.params["lstm"]):
        np.testing.assert_array_equal(a.data, b.data)
    # the TEST net (inference folding, reused activation memory) computes Caffe's h
    x = rng.uniform(-1, 1, (5, 4, 3))
    other.blobs["x"].data[...] = x
    other.blobs["cont"].data[...] = cont
    other.blobs["label"].data[...] = 0
    other.forward()
    want = lstm_ref(x, cont, [b.data.astype(np.float64) for b in other.params["lstm"]])[0]
    np.testing.assert_allclose(other.blobs["h"].data, want, rtol=1e-4, atol=1e-5)
