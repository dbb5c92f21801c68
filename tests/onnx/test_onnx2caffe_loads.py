"""onnx2caffe builds what it converted before writing it: an ONNX model the
converter takes as given (a Conv bias of the wrong length, group 0) is one
error naming the model and the layer, and no file is written (it wrote a
prototxt and caffemodel that did not load: fuzz finding)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from caffe_ocl.onnx import OnnxConversionError  # noqa: E402
from caffe_ocl.onnx.to_caffe import onnx2caffe  # noqa: E402


def _conv_model(bias_len=4, group=1):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(bias_len, np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", kernel_shape=[3, 3],
                            group=group)
    g = helper.make_graph([node], "g", [x], [y], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("kw,msg", [
    (dict(bias_len=3), r"layer 'conv'.*shape mismatch"),
    (dict(group=0), r"layer 'conv' \(Convolution\)"),
])
def test_a_converted_net_that_does_not_load_is_not_written(tmp_path, kw, msg):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_model(**kw), str(path))
    with pytest.raises(OnnxConversionError, match=rf"{path}: the converted net does not load "
                                                  rf"in caffe_ocl, nothing written: .*{msg}"):
        onnx2caffe(str(path), str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_good_model_still_converts(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_model(), str(path))
    onnx2caffe(str(path), str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"))
    assert (tmp_path / "m.caffemodel").exists()


@pytest.mark.parametrize("op,axis", [("Flatten", 99), ("Flatten", -5), ("Concat", 2 ** 40),
                                     ("Softmax", 4)])
def test_an_axis_out_of_range_is_an_error_naming_the_node(op, axis):
    """ONNX axes outside [-rank, rank - 1] (Flatten: rank) were wrapped by a
    modulo into a valid one and converted into a wrong net."""
    from caffe_ocl.onnx.to_caffe import convert
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inputs = ["x", "x"] if op == "Concat" else ["x"]
    node = helper.make_node(op, inputs, ["y"], name="n", axis=axis)
    m = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxConversionError, match=rf"{op} 'n': axis {axis} out of range for "
                                                  r"a 4-D input"):
        convert(m)
