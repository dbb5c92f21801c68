"""PSPNet's / DeepLab's BN (hszhao/PSPNet bn_layer.cpp, from yjxiong/caffe):
four blobs (slope, bias, moving mean, moving variance), chosen by its
bn_param fields; float64 references from the fork's source."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import caffe_pb2

NET = """name: "bn"
force_backward: true
input: "x"
input_shape { dim: 2 dim: 3 dim: 4 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "bn" type: "BN" bottom: "c" top: "c"
  bn_param { slope_filler { type: "constant" value: 1 } bias_filler { type: "constant" value: 0 }
    FROZEN momentum: 0.95 EPS } }
"""


def _net(tmp_path, frozen, eps="", phase=caffe_ocl.TEST):
    p = tmp_path / "bn.prototxt"
    p.write_text(NET.replace("FROZEN", "frozen: true" if frozen else "").replace("EPS", eps))
    return caffe_ocl.Net(str(p), phase)


def test_field_numbers():
    f = caffe_pb2.BNParameter.DESCRIPTOR.fields_by_name
    assert [f[n].number for n in ("eps", "frozen", "engine")] == [4, 5, 6]
    assert f["scale_filler"].number == 1 and f["bn_mode"].number == 3     # SegNet/ENet's
    assert f["momentum"].default_value == pytest.approx(0.9)


@pytest.mark.parametrize("frozen,eps", [(True, ""), (False, "eps: 0.001")])
def test_forward_backward_match_reference(tmp_path, frozen, eps):
    net = _net(tmp_path, frozen, eps)
    bn = net.params["bn"]
    assert len(bn) == 4 and bn[0].data.shape == (1, 3, 1, 1)
    assert (bn[3].data == (1.0 if frozen else 0.0)).all()
    rng = np.random.default_rng(0)
    slope, bias = rng.uniform(0.5, 2, 3), rng.normal(size=3)
    mean, var = rng.normal(size=3), rng.uniform(0.2, 2, 3)
    for b, v in zip(bn, (slope, bias, mean, var)):
        b.data[...] = v.reshape(1, 3, 1, 1)
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    out = net.forward(x=x)["c"].copy()
    w = net.params["conv"][0].data.reshape(3, 3).astype(np.float64)
    c = np.einsum("oc,nchw->nohw", w, x) + net.params["conv"][1].data.reshape(1, 3, 1, 1)
    e = 1e-3 if eps else 1e-5
    inv = (var + e) ** -0.5
    xn = (c - mean.reshape(1, 3, 1, 1)) * inv.reshape(1, 3, 1, 1)
    want = xn * slope.reshape(1, 3, 1, 1) + bias.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    dy = rng.normal(size=out.shape).astype(np.float32)
    net.clear_param_diffs()
    net.blobs["c"].diff[...] = dy
    net.backward()
    dc = dy * (slope * inv).reshape(1, 3, 1, 1)
    dw = np.einsum("nohw,nchw->oc", dc, x)
    np.testing.assert_allclose(net.params["conv"][0].diff.reshape(3, 3), dw, rtol=1e-4, atol=1e-4)
    if frozen:                       # the fork returns before any parameter gradient
        assert (bn[0].diff == 0).all() and (bn[1].diff == 0).all()
    else:
        np.testing.assert_allclose(bn[0].diff.ravel(), (dy * xn).sum((0, 2, 3)), rtol=1e-4,
                                   atol=1e-4)
        np.testing.assert_allclose(bn[1].diff.ravel(), dy.sum((0, 2, 3)), rtol=1e-4, atol=1e-4)


def test_training_with_batch_statistics_is_refused(tmp_path):
    with pytest.raises(CaffeOclError, match="frozen"):
        _net(tmp_path, False, phase=caffe_ocl.TRAIN)
    _net(tmp_path, True, phase=caffe_ocl.TRAIN)      # frozen trains (moving statistics)


def test_segnet_bn_unchanged_without_pspnet_fields(tmp_path):
    p = tmp_path / "s.prototxt"
    p.write_text(NET.split("layer { name: \"bn\"")[0] +
                 'layer { name: "bn" type: "BN" bottom: "c" top: "c" bn_param { bn_mode: INFERENCE } }\n')
    net = caffe_ocl.Net(str(p), caffe_ocl.TEST)
    assert len(net.params["bn"]) == 2


def test_four_blob_weights_into_segnet_bn_name_the_fix(tmp_path):
    psp = _net(tmp_path, True)
    model = tmp_path / "psp.caffemodel"
    psp.save(str(model))
    p = tmp_path / "s.prototxt"
    p.write_text(NET.split("layer { name: \"bn\"")[0] +
                 'layer { name: "bn" type: "BN" bottom: "c" top: "c" }\n')
    with pytest.raises(CaffeOclError, match="PSPNet"):
        caffe_ocl.Net(str(p), str(model), caffe_ocl.TEST)
