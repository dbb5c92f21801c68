"""CTPN's fork layers (tianzhi0549/CTPN: Lstm, Reverse, Transpose;
caffe_ocl/layers/fork_sequence.py) against float64 NumPy transcriptions of
the fork's lstm_layer.cpp, reverse_layer.cpp and transpose_layer.cpp, and
a CTPN-shaped net (Im2col -> Transpose -> Lstm both ways -> Concat ->
Transpose) against the same references."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import caffe_pb2
from caffe_ocl.testing import check_gradient, forward, make_layer


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def fork_lstm(x, w_i, w_h, b):
    """lstm_layer.cpp Forward_cpu without the clip bottom: zero initial
    state, step 0 without forget gate and recurrent term. Returns h and the
    gates / cells the backward needs."""
    T, N = x.shape[:2]
    H = w_h.shape[1]
    pre = x.reshape(T * N, -1) @ w_i.T + b
    pre = pre.reshape(T, N, 4 * H)
    h = np.zeros((T, N, H))
    c = np.zeros((T, N, H))
    gate = np.zeros((T, N, 4 * H))
    for t in range(T):
        h_prev = h[t - 1] if t else np.zeros((N, H))
        c_prev = c[t - 1] if t else np.zeros((N, H))
        p = pre[t] + (h_prev @ w_h.T if t else 0.0)
        g = np.concatenate([sigmoid(p[:, :H]), sigmoid(p[:, H:2 * H]) if t else
                            np.zeros((N, H)), sigmoid(p[:, 2 * H:3 * H]),
                            np.tanh(p[:, 3 * H:])], 1)
        gate[t] = g
        c[t] = g[:, H:2 * H] * c_prev + g[:, :H] * g[:, 3 * H:]
        h[t] = g[:, 2 * H:3 * H] * np.tanh(c[t])
    return h, gate, c


def fork_lstm_backward(x, w_i, w_h, b, dh, clip):
    """lstm_layer.cpp Backward_cpu (clipping_threshold ``clip``): dx, dW_i,
    dW_h, db."""
    T, N = x.shape[:2]
    H = w_h.shape[1]
    h, gate, c = fork_lstm(x, w_i, w_h, b)
    dh = dh.copy()
    dc = np.zeros((T, N, H))
    dpre = np.zeros((T, N, 4 * H))
    for t in range(T - 1, -1, -1):
        cont = t > 0
        g = gate[t]
        i, f, o, gg = g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H], g[:, 3 * H:]
        c_prev = c[t - 1] if t else np.zeros((N, H))
        tanh_c = np.tanh(c[t])
        do = dh[t] * tanh_c
        dc[t] += dh[t] * o * (1 - tanh_c ** 2)
        if cont:
            dc[t - 1] = dc[t] * f
        df = dc[t] * c_prev if cont else np.zeros((N, H))
        di, dg = dc[t] * gg, dc[t] * i
        d = np.concatenate([di * i * (1 - i), df * f * (1 - f), do * o * (1 - o),
                            dg * (1 - gg ** 2)], 1)
        if clip > 0:
            d = np.clip(d, -clip, clip)
        dpre[t] = d
        if cont:
            dh[t - 1] += d @ w_h
    flat = dpre.reshape(T * N, 4 * H)
    dw_i = flat.T @ x.reshape(T * N, -1)
    dw_h = dpre[1:].reshape(-1, 4 * H).T @ h[:-1].reshape(-1, H)
    return (flat @ w_i).reshape(x.shape), dw_i, dw_h, flat.sum(0)


def _lstm(T=4, N=2, I=(2, 3), H=4, clip=0.0, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (T, N) + I)
    text = (f'type: "Lstm" lstm_param {{ num_output: {H} clipping_threshold: {clip} '
            f'weight_filler {{ type: "uniform" min: -0.5 max: 0.5 }} '
            f'bias_filler {{ type: "uniform" min: -0.3 max: 0.3 }} }}')
    layer, bl, tops = make_layer(text, [x])
    return layer, bl, tops, x


def _w(layer):
    return [b.host_data().astype(np.float64) for b in layer.blobs]


def test_lstm_forward_matches_the_fork():
    layer, bl, tops, x = _lstm()
    assert [b.shape for b in layer.blobs] == [(16, 6), (16, 4), (16,)]   # W_i, W_h, bias
    want = fork_lstm(x, *_w(layer))[0]
    out = forward(layer, bl, tops)[0]
    assert out.shape == (4, 2, 4)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # no state carried over: the next forward gives the same
    np.testing.assert_allclose(forward(layer, bl, tops)[0], out, rtol=1e-6, atol=1e-7)
    # the sequence length may change (the fork reshapes to any T)
    x2 = np.random.default_rng(3).uniform(-1, 1, (7, 2, 2, 3))
    bl[0].reshape(*x2.shape)
    bl[0].data[...] = x2
    np.testing.assert_allclose(forward(layer, bl, tops)[0], fork_lstm(x2, *_w(layer))[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip", [0.0, 0.02])
def test_lstm_backward_matches_the_fork(clip):
    """Exact gradients without clipping (central differences too); with
    clipping_threshold the fork's bounded gate gradients."""
    layer, bl, tops, x = _lstm(T=3, N=2, I=(3,), H=3, clip=clip)
    w = _w(layer)
    for b in layer.blobs:
        b.diff[...] = 0
    out = forward(layer, bl, tops)[0]
    dh = np.random.default_rng(7).uniform(-1, 1, out.shape)
    tops[0].diff[...] = dh
    layer.backward(tops, [True], bl)
    want = fork_lstm_backward(x, *w, dh, clip)
    got = [bl[0].host_diff()] + [b.host_diff() for b in layer.blobs]
    for k, (g, ref) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, ref, rtol=0, atol=1e-5 * max(np.abs(ref).max(), 1),
                                   err_msg=f"gradient {k}")
    if clip == 0:
        layer, bl, tops, _ = _lstm(T=3, N=2, I=(3,), H=3)
        check_gradient(layer, bl, tops, stepsize=1e-2, threshold=1e-2)


@pytest.mark.parametrize("shape,axis", [((5, 2, 3), 0), ((2, 4, 3, 2), 1), ((3, 4), 1)])
def test_reverse(shape, axis):
    x = np.random.default_rng(1).uniform(-1, 1, shape)
    layer, bl, tops = make_layer(f'type: "Reverse" reverse_param {{ axis: {axis} }}', [x])
    np.testing.assert_array_equal(forward(layer, bl, tops)[0],
                                  np.flip(x, axis).astype(np.float32))
    dy = np.random.default_rng(2).uniform(-1, 1, shape).astype(np.float32)
    tops[0].diff[...] = dy
    layer.backward(tops, [True], bl)
    np.testing.assert_array_equal(bl[0].host_diff(), np.flip(dy, axis))


@pytest.mark.parametrize("dims", [(3, 2, 0, 1), (2, 3, 1, 0), (0, 1, 2, 3)])
def test_transpose(dims):
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 4, 5))
    text = 'type: "Transpose" transpose_param { ' + " ".join(f"dim: {d}" for d in dims) + " }"
    layer, bl, tops = make_layer(text, [x])
    np.testing.assert_array_equal(forward(layer, bl, tops)[0],
                                  np.transpose(x, dims).astype(np.float32))
    dy = np.random.default_rng(2).uniform(-1, 1, tops[0].shape).astype(np.float32)
    tops[0].diff[...] = dy
    layer.backward(tops, [True], bl)
    np.testing.assert_array_equal(bl[0].host_diff(), np.transpose(dy, np.argsort(dims)))


@pytest.mark.parametrize("text,bottoms,msg", [
    ('type: "Transpose" transpose_param { dim: 1 dim: 0 }', [np.zeros((2, 3, 4))],
     "must name each of the bottom"),
    ('type: "Reverse" reverse_param { axis: 3 }', [np.zeros((2, 3, 4))], "axis 3"),
    ('type: "Lstm" lstm_param { num_output: 2 }', [np.zeros((2, 1, 3)), np.ones((2, 1))],
     "clip"),
])
def test_errors_name_the_layer(text, bottoms, msg):
    with pytest.raises(CaffeOclError) as e:
        make_layer(text, bottoms)
    assert msg in str(e.value) and "layer '" in str(e.value)


def test_fork_binary_field_numbers_do_not_break_parsing():
    """The fork's caffemodels carry lstm_param / transpose_param /
    reverse_param at 140 / 142 / 143 (BVLC's elu_param, scale_param,
    input_param): such a layer still parses (weights load by name)."""
    def field(num, payload):
        key, out = (num << 3) | 2, b""
        while key > 127:
            out += bytes([(key & 127) | 128])
            key >>= 7
        return out + bytes([key, len(payload)]) + payload
    raw = (field(1, b"lstm") + field(140, b"\x08\x80\x01\x15\x00\x00\x80\x3f")
           + field(142, b"\x08\x03\x08\x02\x08\x00\x08\x01") + field(143, b"\x08\x00"))
    p = caffe_pb2.LayerParameter()
    p.ParseFromString(raw)
    assert p.name == "lstm"


CTPN_LIKE = """
name: "ctpn_like"
input: "data" input_shape { dim: 1 dim: 2 dim: 3 dim: 5 }
layer { name: "im2col" type: "Im2col" bottom: "data" top: "im2col"
        convolution_param { pad: 1 kernel_size: 3 } }
layer { name: "im2col_transpose" type: "Transpose" bottom: "im2col" top: "im2col_t"
        transpose_param { dim: 3 dim: 2 dim: 0 dim: 1 } }
layer { name: "lstm_input" type: "Reshape" bottom: "im2col_t" top: "lstm_input"
        reshape_param { shape { dim: -1 } axis: 1 num_axes: 2 } }
layer { name: "lstm" type: "Lstm" bottom: "lstm_input" top: "lstm"
        lstm_param { num_output: 4 clipping_threshold: 1 } }
layer { name: "lstm-reverse1" type: "Reverse" bottom: "lstm_input" top: "rlstm_input"
        reverse_param { axis: 0 } }
layer { name: "rlstm" type: "Lstm" bottom: "rlstm_input" top: "rlstm-output"
        lstm_param { num_output: 4 } }
layer { name: "lstm-reverse2" type: "Reverse" bottom: "rlstm-output" top: "rlstm"
        reverse_param { axis: 0 } }
layer { name: "merge_lstm_rlstm" type: "Concat" bottom: "lstm" bottom: "rlstm"
        top: "merge_lstm_rlstm" concat_param { axis: 2 } }
layer { name: "lstm_output_reshape" type: "Reshape" bottom: "merge_lstm_rlstm"
        top: "lstm_output_reshape" reshape_param { shape { dim: -1 dim: 1 } axis: 1 num_axes: 1 } }
layer { name: "lstm_output" type: "Transpose" bottom: "lstm_output_reshape" top: "lstm_output"
        transpose_param { dim: 2 dim: 3 dim: 1 dim: 0 } }
"""


def test_ctpn_shaped_net(tmp_path):
    """CTPN's deploy pattern (models/deploy.prototxt of tianzhi0549/CTPN,
    small): each row of the feature map is a sequence along the width, run
    forwards and backwards, then back to N x C x H x W."""
    proto = tmp_path / "ctpn_like.prototxt"
    proto.write_text(CTPN_LIKE)
    net = caffe.Net(str(proto), caffe.TEST)
    rng = np.random.default_rng(0)
    for name in ("lstm", "rlstm"):
        for b in net.params[name]:
            b.data[...] = rng.uniform(-0.5, 0.5, b.data.shape)
    x = rng.uniform(-1, 1, (1, 2, 3, 5)).astype(np.float32)
    out = net.forward(data=x)["lstm_output"]
    # reference: im2col (2*9 channels), sequences = width, streams = rows
    xp = np.pad(x.astype(np.float64)[0], ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, i:i + 3, j:j + 5] for i in range(3) for j in range(3)], 1)
    cols = cols.reshape(18, 3, 5)                       # C*k*k x H x W
    seq = cols.transpose(2, 1, 0)                       # W x H x 18: T=W, N=H
    w = [[b.data.astype(np.float64) for b in net.params[n]] for n in ("lstm", "rlstm")]
    fwd = fork_lstm(seq, *w[0])[0]
    bwd = fork_lstm(seq[::-1], *w[1])[0][::-1]
    merged = np.concatenate([fwd, bwd], 2)              # W x H x 8
    want = merged[:, :, None, :].transpose(2, 3, 1, 0)  # 1 x 8 x H x W
    assert out.shape == (1, 8, 3, 5)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def ctc_greedy(probs, blank, merge):
    """senlinuc/caffe_ocr's ctc_decoder_layer.cpp (one bottom): N x T, -1 padded."""
    T, N, C = probs.shape
    out = -np.ones((N, T))
    for n in range(N):
        prev, k = -1, 0
        for t in range(T):
            best = int(np.argmax(probs[t, n]))      # the first of equal maxima
            if best != blank and not (merge and best == prev):
                out[n, k] = best
                k += 1
            prev = best
    return out


@pytest.mark.parametrize("param,blank,merge", [
    ("", 0, True), ("ctc_decoder_param { blank_index: -1 }", 4, True),
    ("ctc_decoder_param { blank_index: 2 ctc_merge_repeated: false }", 2, False)])
def test_ctc_greedy_decoder(param, blank, merge):
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 5, (9, 3))
    labels[3:5, 0] = labels[2, 0]               # repeats to merge (or not)
    labels[:, 2] = blank                        # a stream of blanks only: all -1
    probs = rng.uniform(0, 0.5, (9, 3, 5))
    probs[np.arange(9)[:, None], np.arange(3)[None, :], labels] = 1.0
    layer, bl, tops = make_layer(f'type: "CTCGreedyDecoder" {param}', [probs])
    out = forward(layer, bl, tops)[0]
    assert out.shape == (3, 9, 1, 1)
    np.testing.assert_array_equal(out.reshape(3, 9), ctc_greedy(probs, blank, merge))
    assert (out[2] == -1).all()


def test_ctc_greedy_decoder_accuracy_form_is_refused():
    with pytest.raises(CaffeOclError, match="label bottom"):
        make_layer('type: "CTCGreedyDecoder"', [np.zeros((4, 1, 3)), np.zeros((1, 4))])
