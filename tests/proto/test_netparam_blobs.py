"""A NetParameter whose layers carry ``blobs`` (a caffemodel read as a
message, or a text prototxt with blobs) starts the net from those blobs, as
BVLC Caffe's Layer constructor does (``blobs_[i]->FromProto``)."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import ShapeError
from caffe_ocl.proto import caffe_pb2
from google.protobuf import text_format

PROTO = """name: "t"
input: "data"
input_shape { dim: 2 dim: 3 dim: 5 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
"""


def _trained(tmp_path):
    caffe_ocl.set_random_seed(3)
    proto = tmp_path / "t.prototxt"
    proto.write_text(PROTO)
    net = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    rng = np.random.default_rng(0)
    for blobs in net.params.values():
        for b in blobs:
            b.data[...] = rng.normal(0, 0.3, b.data.shape)
    return net


def test_net_from_message_with_blobs_uses_them(tmp_path):
    src = _trained(tmp_path)
    msg = src.to_proto()
    x = np.random.default_rng(1).normal(size=(2, 3, 5, 5)).astype(np.float32)
    want = src.forward(data=x)["ip"].copy()
    caffe_ocl.set_random_seed(99)                 # fillers would give other weights
    net = caffe_ocl.Net(msg, caffe_ocl.TEST)
    for name, blobs in src.params.items():
        for a, b in zip(blobs, net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_allclose(net.forward(data=x)["ip"], want, rtol=1e-6, atol=1e-6)


def test_text_prototxt_with_blobs_and_weights_argument(tmp_path):
    src = _trained(tmp_path)
    text = tmp_path / "with_blobs.prototxt"
    text.write_text(text_format.MessageToString(src.to_proto()))
    net = caffe_ocl.Net(str(text), caffe_ocl.TEST)
    np.testing.assert_array_equal(net.params["conv"][0].data, src.params["conv"][0].data)
    # weights given as well: they win (loaded after the carried blobs)
    other = caffe_ocl.Net(str(tmp_path / "t.prototxt"), caffe_ocl.TEST)
    other.params["ip"][1].data[...] = 7.0
    model = tmp_path / "other.caffemodel"
    other.save(str(model))
    net = caffe_ocl.Net(str(text), str(model), caffe_ocl.TEST)
    assert (net.params["ip"][1].data == 7.0).all()


def test_carried_blob_of_wrong_shape_names_both_shapes(tmp_path):
    msg = _trained(tmp_path).to_proto()
    lp = next(lp for lp in msg.layer if lp.name == "ip")
    del lp.blobs[1].shape.dim[:]
    lp.blobs[1].shape.dim.append(2)
    del lp.blobs[1].data[:]
    lp.blobs[1].data.extend([0.0, 0.0])
    with pytest.raises(ShapeError, match=r"'ip'.*\(2\).*\(3\)"):
        caffe_ocl.Net(msg, caffe_ocl.TEST)


def test_message_without_blobs_still_uses_fillers(tmp_path):
    msg = caffe_pb2.NetParameter()
    text_format.Parse(PROTO, msg)
    caffe_ocl.set_random_seed(3)
    net = caffe_ocl.Net(msg, caffe_ocl.TEST)
    assert np.abs(net.params["conv"][0].data).max() > 0
    assert (net.params["conv"][1].data == 0).all()
