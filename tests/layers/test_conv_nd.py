"""Convolution and Deconvolution over 1 and 3 spatial axes (Caffe's N-D
path; caffe_ocl/ops/conv_nd.py, kernels/im2col_nd.cl) against a direct
float64 convolution, gradients checked numerically; Caffe's parameter
rules for N-D layers."""
import itertools

import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import parse_net_text
from caffe_ocl.testing import check_gradient, forward, make_layer


def conv_ref(x, w, b, stride, pad, dil, groups):
    """Direct N-D convolution (cross-correlation, as Caffe), float64."""
    N, C = x.shape[:2]
    Co, Cg = w.shape[:2]
    ks = w.shape[2:]
    sp = x.shape[2:]
    out = tuple((i + 2 * p - ((k - 1) * d + 1)) // s + 1
                for i, k, p, s, d in zip(sp, ks, pad, stride, dil))
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pad])
    y = np.zeros((N, Co) + out)
    M = Co // groups
    for o in itertools.product(*[range(v) for v in out]):
        for kk in itertools.product(*[range(v) for v in ks]):
            idx = tuple(oi * s + ki * d for oi, ki, s, d in zip(o, kk, stride, dil))
            patch = xp[(slice(None), slice(None)) + idx]          # N x C
            for g in range(groups):
                y[(slice(None), slice(g * M, (g + 1) * M)) + o] += \
                    patch[:, g * Cg:(g + 1) * Cg] @ w[(slice(g * M, (g + 1) * M),
                                                       slice(None)) + kk].T
    if b is not None:
        y += b.reshape((1, Co) + (1,) * len(out))
    return y


def _conv(shape, extra, ntype="Convolution", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, shape)
    text = (f'type: "{ntype}" convolution_param {{ {extra} '
            'weight_filler { type: "uniform" min: -0.5 max: 0.5 } '
            'bias_filler { type: "uniform" min: -0.2 max: 0.2 } }')
    return make_layer(text, [x]) + (x,)


CASES = [
    ((2, 3, 9), "num_output: 4 kernel_size: 3 pad: 1 stride: 2"),             # 1-D
    ((2, 2, 7), "num_output: 4 kernel_size: 2 dilation: 3 group: 2"),
    ((2, 3, 5, 4, 6), "num_output: 2 kernel_size: 3 pad: 1"),                 # 3-D
    ((1, 4, 6, 5, 4), "num_output: 4 kernel_size: 3 kernel_size: 2 kernel_size: 1 "
                      "stride: 2 stride: 1 stride: 2 pad: 1 pad: 0 pad: 0 group: 2"),
]


@pytest.mark.parametrize("shape,extra", CASES)
def test_forward_matches_direct_convolution(shape, extra):
    layer, bl, tops, x = _conv(shape, extra)
    n = len(shape) - 2
    assert layer.blobs[0].shape[2:] == layer.kernel and len(layer.kernel) == n
    y = forward(layer, bl, tops)[0]
    w, b = (blob.host_data().astype(np.float64) for blob in layer.blobs)
    want = conv_ref(bl[0].host_data(), w, b, layer.stride, layer.pad, layer.dilation,
                    layer.group)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,extra", CASES)
def test_gradients(shape, extra):
    layer, bl, tops, _ = _conv(shape, extra)
    check_gradient(layer, bl, tops, stepsize=1e-2, threshold=1e-2, max_checks=40)


@pytest.mark.parametrize("shape,extra", [
    ((2, 3, 4), "num_output: 2 kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 3, 2, 3), "num_output: 4 kernel_size: 2 stride: 2 group: 2"),
])
def test_deconvolution_is_the_adjoint(shape, extra):
    """<deconv(x), y> = <x, conv(y)> with the same weights (Caffe's
    Deconvolution is the convolution's backward-data), and its gradients."""
    layer, bl, tops, _ = _conv(shape, extra + " bias_term: false", "Deconvolution")
    out = forward(layer, bl, tops)[0]
    w = layer.blobs[0].host_data().astype(np.float64)
    rng = np.random.default_rng(5)
    y = rng.uniform(-1, 1, out.shape)
    conv_y = conv_ref(y, w, None, layer.stride, layer.pad, layer.dilation, layer.group)
    assert conv_y.shape == bl[0].shape
    np.testing.assert_allclose(np.sum(out * y), np.sum(bl[0].host_data() * conv_y),
                               rtol=1e-5)
    check_gradient(layer, bl, tops, stepsize=1e-2, threshold=1e-2, max_checks=40)


@pytest.mark.parametrize("extra,msg", [
    ("num_output: 2 kernel_h: 3 kernel_w: 3", "only be used for 2-D"),
    ("num_output: 2 kernel_size: 3 kernel_size: 3", "3-D convolution takes 1 or 3"),
    ("num_output: 2 kernel_size: 9", "does not fit"),
])
def test_nd_parameter_errors(extra, msg):
    with pytest.raises(CaffeOclError, match=msg):
        make_layer(f'type: "Convolution" convolution_param {{ {extra} }}',
                   [np.zeros((1, 2, 4, 4, 4))])


def test_3d_net_trains_and_folds():
    """A 3-D conv net: a TRAIN step runs (fusions leave N-D convolutions
    alone) and the TEST net (BatchNorm folding skips them) computes the
    same outputs as the layers one by one."""
    text = """
    name: "c3d"
    layer { name: "in" type: "Input" top: "x" top: "label"
            input_param { shape { dim: 2 dim: 3 dim: 4 dim: 6 dim: 6 } shape { dim: 2 } } }
    layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
            convolution_param { num_output: 4 kernel_size: 3 pad: 1
                                weight_filler { type: "xavier" } } }
    layer { name: "bn" type: "BatchNorm" bottom: "c1" top: "c1" }
    layer { name: "sc" type: "Scale" bottom: "c1" top: "c1" scale_param { bias_term: true } }
    layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
    layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
            convolution_param { num_output: 4 kernel_size: 3 stride: 2
                                weight_filler { type: "xavier" } } }
    layer { name: "fc" type: "InnerProduct" bottom: "c2" top: "fc"
            inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
    """
    caffe_ocl.set_random_seed(2)
    sp = caffe_ocl.proto.caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(parse_net_text(text))
    sp.base_lr, sp.lr_policy = 0.01, "fixed"
    solver = caffe_ocl.solvers.SGDSolver(sp)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 4, 6, 6))
    solver.net.blobs["x"].data[...] = x
    solver.net.blobs["label"].data[...] = [0, 1]
    solver.step(2)
    assert np.isfinite(float(solver.net.blobs["loss"].data))
    outputs = []
    for fold in (None, False):          # folding as by default, and none
        test = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TEST, fold=fold)
        test.copy_from(solver.net.to_proto())
        test.blobs["x"].data[...] = x
        test.blobs["label"].data[...] = [0, 1]
        test.forward()
        outputs.append(test.blobs["fc"].data.copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)
