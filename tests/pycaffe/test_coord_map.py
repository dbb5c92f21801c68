"""caffe_ocl.coord_map: pycaffe's coordinate mapping and crop() over
NetSpec tops (cases of pycaffe's test_coord_map.py plus an FCN-like net)."""

import numpy as np
import pytest

from caffe_ocl import coord_map as cm
from caffe_ocl.coord_map import coord_map_from_to, crop
from caffe_ocl.net_spec import NetSpec, layers as L, params as P


def coord_net_spec(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 100, 100]))
    n.aux = L.Input(shape=dict(dim=[2, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=ks,
                           stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool,
                       stride=pool, pad=0)
    try:
        deconv_ks = [s * 2 for s in dstride]
    except TypeError:
        deconv_ks = dstride * 2
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=deconv_ks,
                               stride=dstride, pad=dpad)
    return n


def test_conv_pool_deconv():
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert (ax, a, b) == (1, 1, 0)
    n = coord_net_spec(pool=4, dstride=4)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert (ax, a, b) == (1, 1, -1)


def test_pass():
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.relu = L.ReLU(n.deconv)
    n.conv1x1 = L.Convolution(n.relu, num_output=10, kernel_size=1, stride=1,
                              pad=0)
    for top in [n.relu, n.conv1x1]:
        assert coord_map_from_to(top, n.data) == (ax, a, b)


def _pair(n):
    return n.deconv, n.data


@pytest.mark.parametrize("pad", [0, 3, 10])
def test_padding(pad):
    """Conv padding adds offset, deconv padding subtracts it."""
    ax, a, b = coord_map_from_to(*_pair(coord_net_spec()))
    _, a_pad, b_pad = coord_map_from_to(*_pair(coord_net_spec(pad=pad)))
    assert (a_pad, b_pad) == (a, b - pad)
    _, a_pad, b_pad = coord_map_from_to(*_pair(coord_net_spec(dpad=pad)))
    assert (a_pad, b_pad) == (a, b + pad)
    _, a_pad, b_pad = coord_map_from_to(*_pair(coord_net_spec(pad=pad, dpad=pad)))
    assert (a_pad, b_pad) == (a, b)


def test_multi_conv():
    n = coord_net_spec()
    n.conv_data, n.conv_aux = L.Convolution(n.data, n.aux, ntop=2,
                                            num_output=10, kernel_size=5,
                                            stride=2, pad=0)
    assert coord_map_from_to(n.conv_data, n.data) == \
        coord_map_from_to(n.conv_aux, n.aux)


def test_rect():
    n3x3 = coord_net_spec(ks=3, stride=1, pad=0)
    n5x5 = coord_net_spec(ks=5, stride=2, pad=10)
    n3x5 = coord_net_spec(ks=[3, 5], stride=[1, 2], pad=[0, 10])
    ax_3x3, a_3x3, b_3x3 = coord_map_from_to(n3x3.deconv, n3x3.data)
    ax_5x5, a_5x5, b_5x5 = coord_map_from_to(n5x5.deconv, n5x5.data)
    ax_3x5, a_3x5, b_3x5 = coord_map_from_to(n3x5.deconv, n3x5.data)
    assert ax_3x3 == ax_5x5 == ax_3x5
    assert a_3x3 == a_3x5[0] and b_3x3 == b_3x5[0]
    assert a_5x5 == a_3x5[1] and b_5x5 == b_3x5[1]


def test_nd_conv():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 100, 100, 100]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=[3, 3, 3],
                           stride=[1, 1, 1], pad=[0, 1, 2])
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=2, stride=2,
                       pad=0)
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=4, stride=2,
                               pad=0)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert ax == 1
    assert len(a) == len(b)
    assert np.all(a == 1)
    assert b[0] - 1 == b[1] and b[1] - 1 == b[2]


@pytest.mark.parametrize("offset", [0, 4, 10])
def test_crop_of_crop(offset):
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.crop = L.Crop(n.deconv, n.data, axis=2, offset=offset)
    ax_crop, a_crop, b_crop = coord_map_from_to(n.crop, n.data)
    assert (ax_crop, a_crop) == (ax, a)
    assert b_crop == b + offset


def test_crop_helper_spec_and_prototxt():
    n = coord_net_spec(pad=5)
    n.crop = crop(n.deconv, n.data)
    assert n.crop.fn.type_name == 'Crop'
    assert n.crop.fn.inputs == (n.deconv, n.data)
    assert n.crop.fn.params['crop_param'] == dict(axis=2, offset=[5])
    layer = n.to_proto().layer[-1]
    assert (layer.name, layer.type) == ('crop', 'Crop')
    assert list(layer.bottom) == ['deconv', 'data']
    assert layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [5]
    # cropping the cropped output again needs no further offset
    assert list(crop(n.crop, n.data).fn.params['crop_param']['offset']) == [0]


def fcn_like():
    """data -> conv(pad 100) -> conv -> pool -> conv -> pool -> fc(7x7) ->
    score(1x1) -> 4x upsample, as the FCN nets are built."""
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 64, 64]))
    n.conv1_1 = L.Convolution(n.data, kernel_size=3, pad=100, num_output=8)
    n.relu1_1 = L.ReLU(n.conv1_1, in_place=True)
    n.conv1_2 = L.Convolution(n.relu1_1, kernel_size=3, pad=1, num_output=8)
    n.relu1_2 = L.ReLU(n.conv1_2, in_place=True)
    n.pool1 = L.Pooling(n.relu1_2, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.conv2 = L.Convolution(n.pool1, kernel_size=3, pad=1, num_output=8)
    n.pool2 = L.Pooling(n.conv2, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.fc = L.Convolution(n.pool2, kernel_size=7, num_output=16)
    n.drop = L.Dropout(n.fc, dropout_ratio=0.5, in_place=True)
    n.score = L.Convolution(n.drop, kernel_size=1, num_output=5)
    n.upscore = L.Deconvolution(n.score, convolution_param=dict(
        num_output=5, kernel_size=8, stride=4, bias_term=False),
        param=[dict(lr_mult=0)])
    n.score_crop = crop(n.upscore, n.data)
    n.loss = L.SoftmaxWithLoss(n.score_crop, L.Input(shape=dict(dim=[1, 1, 64, 64])))
    return n


def test_fcn_like_crop_offset():
    n = fcn_like()
    # data x lands at upscore 4*(((x+99)/2 - .25)/2 - .25 - 3) + 3.5 = x + 89
    ax, a, b = coord_map_from_to(n.upscore, n.data)
    assert ax == 1 and np.all(a == 1) and np.all(b == -89)
    proto = n.to_proto()
    layer = [l for l in proto.layer if l.type == 'Crop'][0]
    assert layer.name == 'score_crop'
    assert list(layer.bottom) == ['upscore', 'data']
    assert layer.crop_param.axis == 2
    assert list(layer.crop_param.offset) == [89]
    up = [l for l in proto.layer if l.name == 'upscore'][0]
    assert up.type == 'Deconvolution'
    assert list(up.convolution_param.kernel_size) == [8]


def test_coord_map_of_single_layers_and_compose_inverse():
    conv = L.Convolution(L.Input(), kernel_size=5, stride=2, pad=1, dilation=2).fn
    ax, a, b = cm.coord_map(conv)
    # effective kernel (5-1)*2+1 = 9: a = 1/2, b = (1 - 4)/2
    assert ax == 1 and a == 0.5 and b == -1.5
    assert cm.conv_params(conv)[2] == 9
    m = (1, np.array([2.0]), np.array([3.0]))
    ident = cm.compose(m, cm.inverse(m))
    assert ident[0] == 1 and ident[1] == 1 and ident[2] == 0
    assert cm.compose((None, 1, 0), m) == m
    with pytest.raises(cm.AxisMismatchException):
        cm.compose((1, 1, 0), (2, 1, 0))
    with pytest.raises(cm.UndefinedMapException):
        cm.coord_map(L.InnerProduct(L.Input(), num_output=2).fn)
    assert cm.crop_params(L.Crop(L.Input(), L.Input()).fn)[0] == 2
    with pytest.raises(AssertionError, match="legacy _h/_w"):
        cm.conv_params(L.Convolution(L.Input(), kernel_size=3, pad_h=1).fn)


def test_catch_unconnected():
    n = coord_net_spec()
    n.ip = L.InnerProduct(n.deconv, num_output=10)
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.ip, n.data)


def test_catch_scale_mismatch():
    n = coord_net_spec(pool=3, dstride=2)
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(n.deconv, n.data)


def test_catch_negative_crop():
    n = coord_net_spec(dpad=10)
    with pytest.raises(AssertionError, match="negative"):
        crop(n.deconv, n.data)
