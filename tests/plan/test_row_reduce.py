"""Per-row reductions with the layers around them as one generated kernel
(caffe_ocl/plan/row_reduce.py): LayerNorms in the three forms onnx2caffe
writes (a Reduction over the last axis; a 1x1 mean Convolution over the
channel axis at batch 1; the same with Tile at batch 2), an RMSNorm
(SUMSQ) with a learned per-channel scale and bias, against a float64
LayerNorm and the same nets with the rewrite off: the last top within
float32 rounding, every intermediate blob (computed on read by the
layers' own forwards) equal; weights that stop being a mean, where a group
must stop, reshapes and replayed forward traces."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import row_reduce
from caffe_ocl.proto import parse_net_text
from plan_pairs import layer_text, nets_with_and_without

EPS = 1e-5


_layer = layer_text


def _input(*dims):
    d = " ".join(f"dim: {v}" for v in dims)
    return f'layer {{ name: "data" type: "Input" top: "x" input_param {{ shape {{ {d} }} }} }}\n'


def _power(name, b, t, power=1.0, scale=1.0, shift=0.0):
    return _layer(name, "Power", [b], t,
                  f"power_param {{ power: {power} scale: {scale} shift: {shift} }}")


def _rsqrt_tail(v, r):
    """1 / sqrt(v + eps) as onnx2caffe writes it (Add, Sqrt, Reciprocal)."""
    return (_power("add_eps", v, "ve", shift=EPS) + _power("sqrt", "ve", "sd", power=0.5)
            + _power("recip", "sd", r, power=-1.0))


# (N, T, C) tokens, the mean over C by a Reduction (ViT's LayerNorm)
ROWS = _input(2, 5, 12) + (
    _layer("mean", "Reduction", ["x"], "m", "reduction_param { operation: MEAN axis: 2 }")
    + _power("neg", "m", "nm", scale=-1.0)
    + _layer("sub", "Bias", ["x", "nm"], "d", "bias_param { axis: 0 }")
    + _power("sq", "d", "d2", power=2.0)
    + _layer("var", "Reduction", ["d2"], "v", "reduction_param { operation: MEAN axis: 2 }")
    + _rsqrt_tail("v", "r")
    + _layer("div", "Scale", ["d", "r"], "n", "scale_param { axis: 0 }")
    + _layer("affine", "Scale", ["n"], "y",
             "scale_param { axis: 2 bias_term: true filler { type: 'gaussian' } "
             "bias_filler { type: 'gaussian' } }"))


def _channels(n, h=3, w=5):
    """(N, C, H, W), the mean over C by a 1x1 Convolution (LayerNorm2d);
    at batch 1 the statistic reshaped onto (H, W), at batch > 1 tiled over C."""
    conv = ('convolution_param { num_output: 1 kernel_size: 1 bias_term: false '
            'weight_filler { type: "constant" value: 0.25 } }')
    text = _input(n, 4, h, w) + _layer("mean", "Convolution", ["x"], "m", conv)
    hw = f"reshape_param {{ shape {{ dim: {h} dim: {w} }} }}"
    if n == 1:
        text += (_layer("flat", "Reshape", ["m"], "mf", hw)
                 + _power("neg", "mf", "nm", scale=-1.0)
                 + _layer("sub", "Bias", ["x", "nm"], "d", "bias_param { axis: 2 }"))
    else:
        text += (_layer("tile", "Tile", ["m"], "mt", "tile_param { axis: 1 tiles: 4 }")
                 + _layer("sub", "Eltwise", ["x", "mt"], "d",
                          "eltwise_param { operation: SUM coeff: 1 coeff: -1 }"))
    text += (_power("sq", "d", "d2", power=2.0)
             + _layer("var", "Convolution", ["d2"], "v", conv.replace("mean", "var")))
    text += _rsqrt_tail("v", "r")
    if n == 1:
        text += (_layer("rflat", "Reshape", ["r"], "rf", hw)
                 + _layer("div", "Scale", ["d", "rf"], "y", "scale_param { axis: 2 }"))
    else:
        text += (_layer("rtile", "Tile", ["r"], "rt", "tile_param { axis: 1 tiles: 4 }")
                 + _layer("div", "Eltwise", ["d", "rt"], "y", "eltwise_param { operation: PROD }"))
    return text


# RMSNorm over the last axis (SUMSQ with coeff 1/C), a learned per-channel gain
RMS = _input(3, 8) + (
    _layer("ss", "Reduction", ["x"], "s",
           "reduction_param { operation: SUMSQ axis: 1 coeff: 0.125 }")
    + _power("rs", "s", "r", power=-0.5, shift=EPS)
    + _layer("norm", "Scale", ["x", "r"], "n", "scale_param { axis: 0 }")
    + _layer("gain", "Scale", ["n"], "g", "scale_param { axis: 1 filler { type: 'gaussian' } }")
    + _layer("act", "TanH", ["g"], "y"))


def _nets(text, rng, mean_weights=True):
    fused, plain = nets_with_and_without(text, "FUSE_ROW_REDUCE")
    for name, blobs in fused.params.items():
        for f, p in zip(blobs, plain.params[name]):
            v = rng.normal(0, 0.5, f.shape)
            if name in ("mean", "var") and mean_weights:
                v = np.full(f.shape, 1.0 / f.shape[1])
            f.data[...] = v
            p.data[...] = v
    return fused, plain


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, row_reduce.RowReduceGroup)]


def _compare(fused, plain, x, rtol=3e-6):
    outs = [net.forward(x=x)["y"].copy() for net in (fused, plain)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=rtol, atol=rtol)
    for name in plain.blobs:            # intermediates: the layers' own forwards
        if name != "y":
            np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data,
                                       rtol=1e-6, atol=1e-7, err_msg=name)
    return outs[0]


def _layer_norm64(x, axis):
    x = x.astype(np.float64)
    m = x.mean(axis=axis, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axis, keepdims=True)
    return (x - m) / np.sqrt(v + EPS)


@pytest.fixture(params=[None, True, False], ids=["by-device", "work-group-per-row", "cpu-kernel"])
def work_groups(request, monkeypatch):
    """The kernel the device gets, and on any device the GPUs' one (lanes
    along a row summing in local memory: a work-group per row where S = 1,
    32 rows of 8 lanes where S > 1) and the CPU drivers' one (a row, or RB
    rows, a work-item; so Oclgrind, a GPU-like device, checks it too)."""
    monkeypatch.setattr(row_reduce.RowReduceGroup, "work_groups", request.param)


# on CPU drivers C = 12 and 24: a row a work-item, 8 rows a work-group as
# vector lanes; C = 72 (a multiple of row_reduce.ROW_LANES and at least
# ROW_LANES_MIN_C): ROW_LANES neighbouring values of a row a step
@pytest.mark.parametrize("c", [12, 24, 72])
def test_token_layer_norm_with_affine_is_one_kernel(c, rng, work_groups):
    fused, plain = _nets(ROWS.replace("dim: 12", f"dim: {c}"), rng)
    (group,) = _groups(fused)
    names = {fused.graph.layer_names[i] for i in group.layers}
    assert {"mean", "neg", "sub", "sq", "var", "add_eps", "sqrt", "recip", "div",
            "affine"} <= names and not _groups(plain)
    x = rng.normal(1, 2, (2, 5, c)).astype(np.float32)
    y = _compare(fused, plain, x)
    gamma, beta = (p.data.astype(np.float64) for p in fused.params["affine"])
    want = _layer_norm64(x, 2) * gamma + beta
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert group.fwd is not None        # ran fused, not layer by layer


# positions S = 15, 16 and 12: one row a work-item on CPU drivers, or
# blocks of 8 / 4 rows side by side (RB)
@pytest.mark.parametrize("n,h,w", [(1, 3, 5), (2, 3, 5), (1, 4, 4), (2, 2, 6)])
def test_channel_layer_norm_by_mean_convolutions(n, h, w, rng, work_groups):
    fused, plain = _nets(_channels(n, h, w), rng)
    (group,) = _groups(fused)
    x = rng.normal(-1, 3, (n, 4, h, w)).astype(np.float32)
    y = _compare(fused, plain, x)
    np.testing.assert_allclose(y, _layer_norm64(x, 1), rtol=1e-5, atol=1e-5)
    assert group.fwd is not None


def test_rms_norm_with_a_learned_gain_and_a_neuron_after(rng, work_groups):
    fused, plain = _nets(RMS, rng)
    (group,) = _groups(fused)
    assert [fused.graph.layer_names[i] for i in group.layers
            if fused.graph.layer_types[i] != "Split"] == ["ss", "rs", "norm", "gain", "act"]
    x = rng.normal(0, 1, (3, 8)).astype(np.float32)
    y = _compare(fused, plain, x)
    x64 = x.astype(np.float64)
    g = fused.params["gain"][0].data.astype(np.float64)
    want = np.tanh(x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + EPS) * g)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_weights_that_are_no_mean_run_the_layers(rng):
    """The 1x1 Convolution is a mean only while its weights are equal: other
    weights run the layers one by one (their values), equal ones fuse again."""
    fused, plain = _nets(_channels(1), rng, mean_weights=False)
    (group,) = _groups(fused)
    x = rng.normal(0, 1, (1, 4, 3, 5)).astype(np.float32)
    _compare(fused, plain, x)
    assert group.fwd is None
    for net in (fused, plain):
        net.params["mean"][0].data[...] = 0.25
        net.params["var"][0].data[...] = 0.25
    y = _compare(fused, plain, x)
    assert group.fwd is not None
    np.testing.assert_allclose(y, _layer_norm64(x, 1), rtol=1e-5, atol=1e-5)


def test_a_blob_read_outside_ends_the_group(rng):
    # the centred value d also read after the group: the LayerNorm can't
    # leave it pending, so nothing before that read is grouped with d
    text = ROWS + _layer("also", "Power", ["d"], "dd", "power_param { scale: 2 }")
    fused, plain = _nets(text, rng)
    for gr in _groups(fused):
        assert "sub" not in [fused.graph.layer_names[i] for i in gr.layers[:-1]]
    x = rng.normal(0, 1, (2, 5, 12)).astype(np.float32)
    _compare(fused, plain, x)


def test_reshape_and_replayed_traces(rng):
    fused, plain = _nets(ROWS, rng)
    for shape in [(2, 5, 12), (3, 7, 12), (2, 5, 12)]:
        for net in (fused, plain):
            net.blobs["x"].reshape(*shape)
            net.reshape()
        for _ in range(4):
            x = rng.normal(0, 1, shape).astype(np.float32)
            _compare(fused, plain, x)
    assert fused._tracer is None or fused._tracer.replays > 0


def test_off_by_setting(rng):
    with config.override(FUSE_ROW_REDUCE=False):
        net = Net(parse_net_text(ROWS), TEST)
    assert not _groups(net)
