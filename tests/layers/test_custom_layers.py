"""caffe_ocl.register_layer (custom types named directly in a prototxt, with
their *_param text), and the errors for fork types and fields caffe_ocl does
not implement."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import NetError, ParseError
from caffe_ocl.proto import parse_net_text


class ScaleBy(caffe_ocl.Layer):
    """top = factor * bottom; factor from its param text "factor: F"."""

    def setup(self, bottom, top):
        self.seen_param = self.param_str
        self.factor = float(self.param_str.split(":")[1]) if self.param_str else 1.0
        self.layer_type = self.layer_param.type

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.factor * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = self.factor * top[0].diff


NET = """name: "c"
force_backward: true
input: "data" input_shape { dim: 2 dim: 3 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "scale" type: "MyScaleBy" bottom: "ip" top: "out" PARAM }
"""


@pytest.fixture
def registered():
    caffe_ocl.register_layer("MyScaleBy", ScaleBy)
    yield
    caffe_ocl.unregister_layer("MyScaleBy")


@pytest.mark.parametrize("param,factor", [
    ("my_scale_param { factor: 2.5 }", 2.5),
    ('python_param { param_str: "factor: -3" }', -3.0),
    ("", 1.0),
])
def test_registered_type_runs_with_its_param_text(registered, tmp_path, param, factor):
    path = tmp_path / "net.prototxt"
    path.write_text(NET.replace("PARAM", param))
    net = caffe_ocl.Net(str(path), caffe_ocl.TEST)
    layer = net.layer_dict["scale"]
    assert layer.layer_type == "MyScaleBy"
    assert layer.seen_param == {2.5: "factor: 2.5", -3.0: "factor: -3", 1.0: ""}[factor]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    out = net.forward(data=x)["out"]
    np.testing.assert_allclose(out, factor * net.blobs["ip"].data, rtol=1e-6)
    net.blobs["out"].diff[...] = 1.0
    net.backward()
    w = net.params["ip"][0].data
    np.testing.assert_allclose(net.blobs["data"].diff, factor * np.ones((2, 4)) @ w, rtol=1e-5)


def test_unregistered_type_and_unknown_param_field():
    text = NET.replace("PARAM", "my_scale_param { factor: 2.5 }")
    with pytest.raises(ParseError, match=r"'scale'.*'MyScaleBy'.*my_scale_param.*register_layer"):
        parse_net_text(text)
    with pytest.raises(NetError, match=r"'scale'.*unknown layer type 'MyScaleBy'.*register_layer"):
        caffe_ocl.Net(parse_net_text(NET.replace("PARAM", "")), caffe_ocl.TEST)


def test_fork_type_names_its_fork():
    text = NET.replace('"MyScaleBy"', '"MultiBoxLoss"').replace("PARAM", "")
    with pytest.raises(NetError, match=r"layer 'scale': unknown layer type 'MultiBoxLoss', from "
                                       r"the SSD fork \(weiliu89/caffe"):
        caffe_ocl.Net(parse_net_text(text), caffe_ocl.TEST)


def test_fork_field_names_layer_field_and_fork():
    text = NET.replace('"MyScaleBy"', '"MultiBoxLoss"').replace(
        "PARAM", "multibox_loss_param { num_classes: 21 }")
    with pytest.raises(ParseError, match=r"<string>:6:\d+: .*no field named "
                                         r"\"multibox_loss_param\"; in layer 'scale' \(type "
                                         r"'MultiBoxLoss'\); field 'multibox_loss_param' "
                                         r"belongs to the SSD fork"):
        parse_net_text(text)


def test_register_checks():
    with pytest.raises(ValueError, match="built-in"):
        caffe_ocl.register_layer("Convolution", ScaleBy)
    with pytest.raises(TypeError, match="subclass caffe_ocl.Layer"):
        caffe_ocl.register_layer("Whatever", object)


def test_unknown_nested_field_names_its_layer():
    """A field no fork table knows, inside a layer's *_param, still gets the
    layer named (the parser's own message names only the message type)."""
    text = NET.replace('"MyScaleBy"', '"Interp"').replace(
        "PARAM", "interp_param { zoom_factor: 2 made_up_flag: true }")
    with pytest.raises(ParseError, match=r"no field named \"made_up_flag\"; in layer 'scale' "
                                         r"\(type 'Interp'\)$"):
        parse_net_text(text)


def test_soeaver_interp_field_says_what_to_do():
    text = NET.replace('"MyScaleBy"', '"Interp"').replace(
        "PARAM", "interp_param { use_blob_size: true }")
    with pytest.raises(ParseError, match=r"in layer 'scale' \(type 'Interp'\); field "
                                         r"'use_blob_size' belongs to soeaver's Interp.*"
                                         r"second bottom.*remove the line"):
        parse_net_text(text)
