"""Upgrading old Caffe nets and solvers (V0, V1, input fields, BatchNorm)."""

import logging
from pathlib import Path

import numpy as np
import pytest

from caffe_ocl.errors import ParseError
from caffe_ocl.proto import (blobproto_to_array, caffe_pb2, parse_net_text,
                             parse_solver_text, read_net, read_net_binary,
                             read_net_prototxt, upgrade_net)

# BVLC Caffe's own V1 files: the CIFAR-10 quick weights ship in
# models/cifar10_quick, the V1 prototxt that came with them beside this test.
ROOT = Path(__file__).resolve().parents[2]
PROTOTXT = Path(__file__).resolve().parent / "cifar10_quick_v1_prediction_example.prototxt"
CAFFEMODEL = ROOT / "models" / "cifar10_quick" / "cifar10_quick_iter_5000.caffemodel"

CIFAR_TYPES = [
    ("conv1", "Convolution"), ("pool1", "Pooling"), ("relu1", "ReLU"),
    ("conv2", "Convolution"), ("relu2", "ReLU"), ("pool2", "Pooling"),
    ("conv3", "Convolution"), ("relu3", "ReLU"), ("pool3", "Pooling"),
    ("ip1", "InnerProduct"), ("ip2", "InnerProduct"),
]


def _by_name(net):
    return {l.name: l for l in net.layer}


# ---------------------------------------------------------------- real V1 model

def test_v1_prototxt_upgrades_like_caffe(caplog):
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        net = read_net_prototxt(PROTOTXT)
    assert ("Attempting to upgrade input file specified using deprecated "
            f"V1LayerParameter: {PROTOTXT}") in caplog.text
    assert net.name == "CIFAR10_quick"
    assert len(net.layers) == 0
    layers = _by_name(net)
    for name, type_ in CIFAR_TYPES:
        assert layers[name].type == type_
    assert [l.type for l in net.layer][:1] == ["ImageData"]
    assert layers["loss"].type == "SoftmaxWithLoss"
    assert layers["prob"].type == "Softmax"
    assert layers["argmax"].type == "ArgMax"
    assert layers["argmax"].argmax_param.top_k == 5
    assert layers["accuracy"].type == "Accuracy"
    assert layers["accuracy"].include[0].phase == caffe_pb2.TEST
    conv1 = layers["conv1"]
    assert list(conv1.bottom) == ["data"] and list(conv1.top) == ["conv1"]
    assert [p.lr_mult for p in conv1.param] == [1, 2]
    assert [p.HasField("decay_mult") for p in conv1.param] == [False, False]
    cp = conv1.convolution_param
    assert (cp.num_output, list(cp.pad), list(cp.kernel_size), list(cp.stride)) == \
        (32, [2], [5], [1])
    assert cp.weight_filler.type == "gaussian"
    assert cp.weight_filler.std == pytest.approx(1e-4)
    assert layers["pool2"].pooling_param.pool == caffe_pb2.PoolingParameter.AVE
    assert layers["relu1"].top[0] == "pool1"  # in-place kept
    data = layers["data"]
    assert data.image_data_param.batch_size == 3
    assert data.transform_param.mean_file.endswith("mean.binaryproto")


def test_v1_caffemodel_upgrades_with_4d_blob_shapes():
    net = read_net_binary(CAFFEMODEL)
    assert len(net.layers) == 0 and len(net.input) == 0
    layers = _by_name(net)
    for name, type_ in CIFAR_TYPES:
        assert layers[name].type == type_, name
    expected = {
        "conv1": ([32, 3, 5, 5], [1, 1, 1, 32]),
        "conv2": ([32, 32, 5, 5], [1, 1, 1, 32]),
        "conv3": ([64, 32, 5, 5], [1, 1, 1, 64]),
        # legacy 1x1xMxN inner-product weights stay 4-D, as Caffe gives them
        "ip1": ([1, 1, 64, 1024], [1, 1, 1, 64]),
        "ip2": ([1, 1, 10, 64], [1, 1, 1, 10]),
    }
    for name, shapes in expected.items():
        blobs = layers[name].blobs
        assert [list(b.shape.dim) for b in blobs] == list(shapes), name
        for b in blobs:
            assert not any(b.HasField(f) for f in ("num", "channels", "height", "width"))
            arr = blobproto_to_array(b)
            assert arr.dtype == np.float32 and arr.shape == tuple(b.shape.dim)
            assert np.isfinite(arr).all()
        assert [p.lr_mult for p in layers[name].param] == [1, 2]
    w = blobproto_to_array(layers["ip2"].blobs[0])
    assert np.abs(w).max() > 0  # real trained weights
    # the data layer's legacy mean_file moved into transform_param
    data = net.layer[0]
    assert data.type == "Data"
    assert data.transform_param.mean_file.endswith("mean.binaryproto")
    assert not data.data_param.HasField("mean_file")


def test_read_net_dispatches_by_content():
    assert read_net(CAFFEMODEL).layer[1].name == "conv1"
    assert read_net(PROTOTXT).layer[1].name == "conv1"


def test_upgraded_prototxt_matches_upgraded_caffemodel_layers():
    text = _by_name(read_net_prototxt(PROTOTXT))
    binary = _by_name(read_net_binary(CAFFEMODEL))
    for name, _ in CIFAR_TYPES:
        assert text[name].type == binary[name].type
        assert list(text[name].bottom) == list(binary[name].bottom)


# ---------------------------------------------------------------- V0 nets

V0_NET = """
name: "v0net"
input: "data"
input_dim: 10 input_dim: 3 input_dim: 32 input_dim: 32
layers {
  layer { name: "pad1" type: "padding" pad: 2 }
  bottom: "data" top: "pad1"
}
layers {
  layer {
    name: "conv1" type: "conv" num_output: 16 kernelsize: 5 stride: 1
    group: 1 biasterm: false
    weight_filler { type: "gaussian" std: 0.01 }
    blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  }
  bottom: "pad1" top: "conv1"
}
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers {
  layer { name: "pool1" type: "pool" pool: AVE kernelsize: 3 stride: 2 }
  bottom: "conv1" top: "pool1"
}
layers {
  layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.0001 beta: 0.75 }
  bottom: "pool1" top: "norm1"
}
layers {
  layer { name: "drop1" type: "dropout" dropout_ratio: 0.3 }
  bottom: "norm1" top: "norm1"
}
layers {
  layer { name: "fc" type: "innerproduct" num_output: 10 }
  bottom: "norm1" top: "fc"
}
layers { layer { name: "prob" type: "softmax" } bottom: "fc" top: "prob" }
"""


def test_v0_net_upgrades_to_current_layers(caplog):
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        net = parse_net_text(V0_NET, "v0.prototxt")
    assert "deprecated V0LayerParameter: v0.prototxt" in caplog.text
    assert net.name == "v0net"
    assert len(net.layers) == 0 and len(net.input) == 0 and len(net.input_dim) == 0
    names = [l.name for l in net.layer]
    # padding layer folded away; input layer put first
    assert names == ["input", "conv1", "relu1", "pool1", "norm1", "drop1", "fc", "prob"]
    types = [l.type for l in net.layer]
    assert types == ["Input", "Convolution", "ReLU", "Pooling", "LRN", "Dropout",
                     "InnerProduct", "Softmax"]
    inp, conv = net.layer[0], net.layer[1]
    assert list(inp.top) == ["data"]
    assert [list(s.dim) for s in inp.input_param.shape] == [[10, 3, 32, 32]]
    assert list(conv.bottom) == ["data"]  # was "pad1"
    cp = conv.convolution_param
    assert (cp.num_output, list(cp.kernel_size), list(cp.stride), list(cp.pad),
            cp.group, cp.bias_term) == (16, [5], [1], [2], 1, False)
    assert cp.weight_filler.std == pytest.approx(0.01)
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1, 1), (2, 0)]
    pool = net.layer[3].pooling_param
    assert (pool.pool, pool.kernel_size, pool.stride) == \
        (caffe_pb2.PoolingParameter.AVE, 3, 2)
    lrn = net.layer[4].lrn_param
    assert lrn.local_size == 3 and lrn.alpha == pytest.approx(1e-4)
    assert net.layer[5].dropout_param.dropout_ratio == pytest.approx(0.3)
    assert net.layer[6].inner_product_param.num_output == 10


def test_v0_data_layer_fields():
    net = parse_net_text("""
    layers {
      layer { name: "data" type: "data" source: "train_lmdb" batchsize: 64
              scale: 0.5 meanfile: "mean.binaryproto" cropsize: 227 mirror: true
              rand_skip: 7 }
      top: "data" top: "label"
    }""")
    (data,) = net.layer
    assert data.type == "Data"
    assert data.data_param.source == "train_lmdb"
    assert data.data_param.batch_size == 64
    assert data.data_param.rand_skip == 7
    tp = data.transform_param
    assert (tp.scale, tp.mean_file, tp.crop_size, tp.mirror) == \
        (0.5, "mean.binaryproto", 227, True)


def test_unknown_v0_type_names_the_layer():
    with pytest.raises(ParseError, match=r"old\.prototxt.*'weird1'.*'warp_layer'"):
        parse_net_text('layers { layer { name: "weird1" type: "warp_layer" } '
                       'top: "x" }', "old.prototxt")


def test_v0_padding_before_non_conv_is_an_error():
    text = """input: "data"
    layers { layer { name: "pad" type: "padding" pad: 1 } bottom: "data" top: "p" }
    layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }"""
    with pytest.raises(ParseError, match="padding"):
        parse_net_text(text, "pad.prototxt")


# ---------------------------------------------------------------- V1 details

def test_v1_data_layer_transform_fields_move_to_transform_param():
    net = parse_net_text("""
    layers {
      name: "data" type: DATA top: "data" top: "label"
      data_param { source: "db" batch_size: 8 scale: 0.00390625
                   mean_file: "m.binaryproto" crop_size: 28 mirror: true }
      include { phase: TRAIN }
    }
    layers {
      name: "img" type: IMAGE_DATA top: "img" top: "l2"
      image_data_param { source: "list.txt" scale: 2 mirror: false }
    }""")
    data, img = net.layer
    assert data.type == "Data"
    tp = data.transform_param
    assert tp.scale == pytest.approx(0.00390625)
    assert (tp.mean_file, tp.crop_size, tp.mirror) == ("m.binaryproto", 28, True)
    dp = data.data_param
    assert (dp.source, dp.batch_size) == ("db", 8)
    for f in ("scale", "mean_file", "crop_size", "mirror"):
        assert not dp.HasField(f)
    assert data.include[0].phase == caffe_pb2.TRAIN
    assert img.type == "ImageData"
    assert img.transform_param.scale == 2
    assert img.transform_param.HasField("mirror")
    assert not img.image_data_param.HasField("scale")


def test_v1_param_names_share_mode_loss_weight_and_excludes():
    net = parse_net_text("""
    layers {
      name: "ip" type: INNER_PRODUCT bottom: "x" top: "y"
      param: "w_shared" param: "b_shared"
      blob_share_mode: PERMISSIVE
      blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
      loss_weight: 0.5
      exclude { phase: TEST stage: "deploy" }
      inner_product_param { num_output: 4 }
    }
    layers { name: "loss" type: EUCLIDEAN_LOSS bottom: "y" bottom: "t" top: "l"
             loss_param { ignore_label: 3 } }
    layers { name: "th" type: THRESHOLD bottom: "y" top: "th"
             threshold_param { threshold: 0.2 } }
    """)
    ip, loss, th = net.layer
    assert [p.name for p in ip.param] == ["w_shared", "b_shared"]
    assert ip.param[0].share_mode == caffe_pb2.ParamSpec.PERMISSIVE
    assert not ip.param[1].HasField("share_mode")
    assert [(p.lr_mult, p.decay_mult) for p in ip.param] == [(1, 1), (2, 0)]
    assert list(ip.loss_weight) == [0.5]
    assert ip.exclude[0].phase == caffe_pb2.TEST
    assert list(ip.exclude[0].stage) == ["deploy"]
    assert ip.inner_product_param.num_output == 4
    assert loss.type == "EuclideanLoss" and loss.loss_param.ignore_label == 3
    assert th.type == "Threshold"
    assert th.threshold_param.threshold == pytest.approx(0.2)


def test_every_v1_enum_has_caffe_type_string():
    from caffe_ocl.proto.upgrade import V1_LAYER_TYPES
    enum = caffe_pb2.V1LayerParameter.LayerType
    assert set(V1_LAYER_TYPES) == set(enum.values())
    assert V1_LAYER_TYPES[enum.Value("SOFTMAX_LOSS")] == "SoftmaxWithLoss"
    assert V1_LAYER_TYPES[enum.Value("IM2COL")] == "Im2col"
    assert V1_LAYER_TYPES[enum.Value("HDF5_DATA")] == "HDF5Data"
    assert V1_LAYER_TYPES[enum.Value("NONE")] == ""


def test_unknown_v1_enum_value_in_binary_is_a_parse_error():
    net = caffe_pb2.NetParameter()
    v1 = net.layers.add(name="odd")
    v1.type = caffe_pb2.V1LayerParameter.RELU
    data = bytearray(net.SerializeToString())
    # field 5 (type) varint RELU=18 -> 99, a value Caffe never defined
    i = data.index(bytes([0x28, 18]))
    data[i + 1] = 99
    broken = caffe_pb2.NetParameter.FromString(bytes(data))
    with pytest.raises(ParseError, match=r"m\.caffemodel.*'odd'.*type 99"):
        upgrade_net(broken, "m.caffemodel")


def test_unknown_v1_type_name_in_text_is_a_parse_error():
    with pytest.raises(ParseError, match=r"v1\.prototxt:1:\d+:.*FANCY"):
        parse_net_text('layers { name: "f" type: FANCY }', "v1.prototxt")


def test_v1_type_none_gives_empty_type_like_caffe():
    net = parse_net_text('layers { name: "n" type: NONE }')
    assert net.layer[0].type == ""


def test_layer_and_layers_together_is_refused():
    with pytest.raises(ParseError, match="both 'layer' and 'layers'"):
        parse_net_text('layer { name: "a" type: "ReLU" } '
                       'layers { name: "b" type: RELU }', "mixed.prototxt")


# ---------------------------------------------------------------- inputs, BatchNorm

def test_input_shape_becomes_input_layer_first():
    net = parse_net_text("""
    input: "a" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
    input: "b" input_shape { dim: 1 dim: 5 }
    layer { name: "r" type: "ReLU" bottom: "a" top: "r" }""")
    assert [l.name for l in net.layer] == ["input", "r"]
    inp = net.layer[0]
    assert inp.type == "Input" and list(inp.top) == ["a", "b"]
    assert [list(s.dim) for s in inp.input_param.shape] == [[1, 3, 8, 8], [1, 5]]
    assert len(net.input) == len(net.input_shape) == 0


def test_bare_input_without_shape_is_dropped():
    net = parse_net_text('input: "data" layer { name: "r" type: "ReLU" '
                         'bottom: "data" top: "r" }')
    assert [l.name for l in net.layer] == ["r"] and len(net.input) == 0


def test_bad_input_dim_count():
    with pytest.raises(ParseError, match="input_dim"):
        parse_net_text('input: "d" input_dim: 1 input_dim: 3', "in.prototxt")


def test_batchnorm_param_specs_dropped():
    net = parse_net_text("""
    layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
            param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 } }
    layer { name: "bn2" type: "BatchNorm" bottom: "x" top: "x" param { lr_mult: 0 } }
    """)
    assert len(net.layer[0].param) == 0
    assert len(net.layer[1].param) == 1  # only the 3-param form is upgraded


def test_current_net_is_left_alone():
    text = """name: "n"
    layer { name: "in" type: "Input" top: "x"
            input_param { shape { dim: 1 dim: 2 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
            param { lr_mult: 1 } inner_product_param { num_output: 3 }
            blobs { shape { dim: 3 dim: 2 } data: 1 data: 2 data: 3 data: 4 data: 5 data: 6 } }
    """
    raw = caffe_pb2.NetParameter()
    from google.protobuf import text_format
    text_format.Merge(text, raw)
    assert parse_net_text(text) == raw


def test_layer_blob_legacy_dims_become_shape():
    net = parse_net_text("""
    layer { name: "c" type: "Convolution" bottom: "x" top: "y"
            blobs { num: 2 channels: 1 height: 1 width: 3
                    data: 1 data: 2 data: 3 data: 4 data: 5 data: 6 } }""")
    b = net.layer[0].blobs[0]
    assert list(b.shape.dim) == [2, 1, 1, 3]
    assert not b.HasField("num")
    np.testing.assert_array_equal(blobproto_to_array(b).ravel(), np.arange(1, 7))


# ---------------------------------------------------------------- solvers

@pytest.mark.parametrize("enum,name", [
    ("SGD", "SGD"), ("NESTEROV", "Nesterov"), ("ADAGRAD", "AdaGrad"),
    ("RMSPROP", "RMSProp"), ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_solver_type_enum_upgrade(enum, name):
    s = parse_solver_text(f'net: "n.prototxt" base_lr: 0.01 solver_type: {enum}')
    assert s.type == name
    assert not s.HasField("solver_type")
    assert s.net == "n.prototxt" and s.base_lr == pytest.approx(0.01)


def test_solver_with_both_type_fields_is_refused():
    with pytest.raises(ParseError, match="solver_type"):
        parse_solver_text('type: "Adam" solver_type: ADAM', "s.prototxt")


def test_solver_type_string_untouched_and_inline_net_upgraded():
    s = parse_solver_text('type: "RMSProp" net_param { layers { name: "r" '
                          'type: RELU bottom: "x" top: "x" } }')
    assert s.type == "RMSProp"
    assert [l.type for l in s.net_param.layer] == ["ReLU"]
