"""caffe_ocl.net_spec: pycaffe's NetSpec (cases of pycaffe's
test_net_spec.py and the 01-learning-lenet notebook)."""

import pytest

from caffe_ocl import net_spec
from caffe_ocl.net_spec import NetSpec, layers as L, params as P
from caffe_ocl.proto import caffe_pb2, parse_net_text


def _float_text(x):
    """How this protobuf runtime prints a float field (pycaffe prints it the
    same way, through the same runtime)."""
    return str(caffe_pb2.TransformationParameter(scale=x)).strip()


def notebook_lenet(lmdb, batch_size):
    n = NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB,
                             source=lmdb, transform_param=dict(scale=1. / 255),
                             ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50,
                            weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500,
                           weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10,
                             weight_filler=dict(type='xavier'))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


LENET_TEXT = '''layer {
  name: "data"
  type: "Data"
  top: "data"
  top: "label"
  transform_param {
    %(scale)s
  }
  data_param {
    source: "mnist/mnist_train_lmdb"
    batch_size: 64
    backend: LMDB
  }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  convolution_param {
    num_output: 20
    kernel_size: 5
    weight_filler {
      type: "xavier"
    }
  }
}
layer {
  name: "pool1"
  type: "Pooling"
  bottom: "conv1"
  top: "pool1"
  pooling_param {
    pool: MAX
    kernel_size: 2
    stride: 2
  }
}
layer {
  name: "conv2"
  type: "Convolution"
  bottom: "pool1"
  top: "conv2"
  convolution_param {
    num_output: 50
    kernel_size: 5
    weight_filler {
      type: "xavier"
    }
  }
}
layer {
  name: "pool2"
  type: "Pooling"
  bottom: "conv2"
  top: "pool2"
  pooling_param {
    pool: MAX
    kernel_size: 2
    stride: 2
  }
}
layer {
  name: "fc1"
  type: "InnerProduct"
  bottom: "pool2"
  top: "fc1"
  inner_product_param {
    num_output: 500
    weight_filler {
      type: "xavier"
    }
  }
}
layer {
  name: "relu1"
  type: "ReLU"
  bottom: "fc1"
  top: "fc1"
}
layer {
  name: "score"
  type: "InnerProduct"
  bottom: "fc1"
  top: "score"
  inner_product_param {
    num_output: 10
    weight_filler {
      type: "xavier"
    }
  }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "score"
  bottom: "label"
  top: "loss"
}
'''


def test_notebook_lenet_text():
    proto = notebook_lenet('mnist/mnist_train_lmdb', 64)
    assert str(proto) == LENET_TEXT % {'scale': _float_text(1. / 255)}
    # and it parses back as a net
    again = parse_net_text(str(proto))
    assert [l.name for l in again.layer] == [
        'data', 'conv1', 'pool1', 'conv2', 'pool2', 'fc1', 'relu1', 'score',
        'loss']


def lenet(batch_size):
    n = NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]),
                                         dict(dim=[batch_size, 1, 1, 1])],
                                  transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50,
                            weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500,
                           weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10,
                           weight_filler=dict(type='xavier'))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]),
                                     dict(dim=[batch_size, 1, 1, 1])],
                              transform_param=dict(scale=1. / 255), ntop=2)
    conv1 = L.Convolution(data, kernel_size=5, num_output=20,
                          weight_filler=dict(type='xavier'))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    conv2 = L.Convolution(pool1, kernel_size=5, num_output=50,
                          weight_filler=dict(type='xavier'))
    pool2 = L.Pooling(conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool2, num_output=500,
                         weight_filler=dict(type='xavier'))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10,
                         weight_filler=dict(type='xavier'))
    loss = L.SoftmaxWithLoss(ip2, label)
    return loss.to_proto()


def test_lenet_in_place_relu():
    proto = lenet(50)
    assert len(proto.layer) == 9
    assert proto.layer[6].bottom == proto.layer[6].top == ['ip1']
    assert proto.layer[6].name == 'relu1'
    assert list(proto.layer[0].top) == ['data', 'label']
    assert proto.layer[0].dummy_data_param.shape[1].dim == [50, 1, 1, 1]
    assert proto.layer[2].pooling_param.pool == caffe_pb2.PoolingParameter.MAX


def test_anon_lenet_auto_names():
    proto = anon_lenet(50)
    assert len(proto.layer) == 9
    assert proto.layer[6].bottom == proto.layer[6].top
    assert [l.name for l in proto.layer] == [
        'DummyData1', 'Convolution1', 'Pooling1', 'Convolution2', 'Pooling2',
        'InnerProduct1', 'ReLU1', 'InnerProduct2', 'SoftmaxWithLoss1']
    assert list(proto.layer[0].top) == ['DummyData1', 'DummyData2']
    assert list(proto.layer[-1].bottom) == ['InnerProduct2', 'DummyData2']
    assert list(proto.layer[6].top) == ['InnerProduct1']


def test_zero_tops_and_ntop():
    n = NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    proto = n.to_proto()
    assert str(proto) == '''layer {
  name: "data"
  type: "DummyData"
  top: "data"
  top: "data2"
  dummy_data_param {
    shape {
      dim: 3
    }
  }
}
layer {
  name: "silence_data"
  type: "Silence"
  bottom: "data"
}
layer {
  name: "silence_data2"
  type: "Silence"
  bottom: "data2"
}
'''
    assert isinstance(n.silence_data, net_spec.Function)


def test_type_error():
    data = L.DummyData(ntop=2)
    r = r"^Silence input 0 is not a Top \(type is <(type|class) 'tuple'>\)$"
    with pytest.raises(TypeError, match=r):
        L.Silence(data, ntop=0)
    L.Silence(*data, ntop=0)


def test_layer_level_fields_loss_weight_param_include():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 8, 8]))
    n.conv = L.Convolution(n.data, num_output=4, kernel_size=3, pad=[1],
                           param=[dict(lr_mult=1, decay_mult=1),
                                  dict(lr_mult=2, decay_mult=0)],
                           bias_filler=dict(type='constant', value=0.1),
                           loss_weight=0.5, include=dict(phase=caffe_pb2.TRAIN))
    n.drop = L.Dropout(n.conv, dropout_ratio=0.3, in_place=True)
    n.out = L.Eltwise(n.data, n.drop, operation=P.Eltwise.SUM, coeff=[1, -1])
    proto = n.to_proto()
    conv = proto.layer[1]
    assert list(conv.loss_weight) == [0.5]
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1, 1), (2, 0)]
    assert conv.include[0].phase == caffe_pb2.TRAIN
    assert list(conv.convolution_param.kernel_size) == [3]   # scalar -> repeated
    assert list(conv.convolution_param.pad) == [1]
    assert conv.convolution_param.bias_filler.value == pytest.approx(0.1)
    drop = proto.layer[2]
    assert drop.name == 'drop' and list(drop.top) == ['conv'] == list(drop.bottom)
    assert drop.dropout_param.dropout_ratio == pytest.approx(0.3)
    elt = proto.layer[3]
    assert list(elt.bottom) == ['data', 'conv']
    assert elt.eltwise_param.operation == caffe_pb2.EltwiseParameter.SUM
    assert list(elt.eltwise_param.coeff) == [1, -1]
    assert proto.layer[0].input_param.shape[0].dim == [1, 3, 8, 8]


def test_explicit_param_messages_and_unknown_field():
    n = NetSpec()
    n.data = L.Input(input_param=dict(shape=[dict(dim=[1, 1, 4, 4])]))
    n.up = L.Deconvolution(n.data, convolution_param=dict(
        num_output=1, kernel_size=4, stride=2, bias_term=False,
        weight_filler=dict(type='bilinear')), param=[dict(lr_mult=0)])
    proto = n.to_proto()
    cp = proto.layer[1].convolution_param
    assert (cp.num_output, list(cp.kernel_size), list(cp.stride), cp.bias_term) \
        == (1, [4], [2], False)
    assert cp.weight_filler.type == 'bilinear'
    # a keyword that is neither a layer-param nor a layer field
    bad = L.ReLU(n.data, not_a_field=3)
    with pytest.raises(AttributeError):
        bad.to_proto()


def test_params_enums_and_param_name_dict():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    assert P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Data.LMDB == caffe_pb2.DataParameter.LMDB
    assert P.Eltwise.PROD == caffe_pb2.EltwiseParameter.PROD
    d = net_spec.param_name_dict()
    assert d['Convolution'] == 'convolution'
    assert d['InnerProduct'] == 'inner_product'
    assert d['Pooling'] == 'pooling'
    assert d['Transformation'] == 'transform'
    assert d['Python'] == 'python'
    assert d['LRN'] == 'lrn'


def test_netspec_item_access_and_top_to_proto():
    n = NetSpec()
    n['data'] = L.Input(shape=dict(dim=[1, 2]))
    n.ip = L.InnerProduct(n['data'], num_output=3)
    assert n.keys() == ['data', 'ip']
    assert n.vals() == [n.data, n.ip]
    n.update('ip', dict(bias_term=False))
    proto = n.to_proto()
    assert proto.layer[1].inner_product_param.bias_term is False
    del n['ip']
    assert n.keys() == ['data']
    # Top.to_proto / to_proto(*tops) auto-name everything
    t = L.InnerProduct(L.Input(shape=dict(dim=[1, 2])), num_output=1)
    assert [l.name for l in t.to_proto().layer] == ['Input1', 'InnerProduct1']
    assert [l.name for l in net_spec.to_proto(t).layer] == ['Input1', 'InnerProduct1']
