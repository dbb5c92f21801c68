"""onnx2caffe builds what it converted before writing it: an ONNX model the
converter takes as given (a Conv bias of the wrong length, group 0) is one
error naming the model and the layer, and no file is written (it wrote a
prototxt and caffemodel that did not load: fuzz finding)."""
import io

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


# ---------------------------------------------------------------------------
# Fuzz findings (mutated files, opsets, Transpose perm, Reshape/Slice
# constants, huge initializers): each is one error naming the file and the
# node or initializer at fault, or a correct net. Tiny models, built here.
# ---------------------------------------------------------------------------

from caffe_ocl.onnx import to_caffe  # noqa: E402
from caffe_ocl.onnx.to_caffe import convert  # noqa: E402
from caffe_ocl.proto import array_to_blobproto  # noqa: E402


def _chain(opset=13, perm=(0, 2, 1, 3, 4), shape5=(1, 2, 3, 2, 2), slice_args=None,
           reshape_attrs=None, slice_opset9=False):
    """x [1,6,2,2] -> Reshape shape5 -> Transpose perm -> Reshape [1,6,2,2]
    -> Slice channels [0:3] -> Relu -> y (ShuffleNet's channel shuffle, then
    a channel split)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    sl = dict(starts=np.array([0], np.int64), ends=np.array([3], np.int64),
              axes=np.array([1], np.int64))
    sl.update(slice_args or {})
    inits = [numpy_helper.from_array(np.asarray(shape5), "s5"),
             numpy_helper.from_array(np.array([1, 6, 2, 2], np.int64), "s4")]
    if slice_opset9:
        slice_node = helper.make_node("Slice", ["r4"], ["s"], name="slice",
                                      **{k: [int(v) for v in a] for k, a in sl.items()})
    else:
        inits += [numpy_helper.from_array(v, k) for k, v in sl.items()]
        slice_node = helper.make_node("Slice", ["r4", "starts", "ends", "axes"], ["s"],
                                      name="slice")
    transpose = helper.make_node("Transpose", ["r5"], ["t"], name="transpose")
    if perm is not None:
        transpose.attribute.append(helper.make_attribute("perm", list(perm)))
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"], name="reshape5",
                              **(reshape_attrs or {})),
             transpose,
             helper.make_node("Reshape", ["t", "s4"], ["r4"], name="reshape4"),
             slice_node,
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    m = helper.make_model(helper.make_graph(nodes, "chain", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_the_fuzz_chain_converts():
    """The unmutated model of the tests below converts (shuffle + split)."""
    assert [lp.type for lp in convert(_chain()).layer] == ["Input", "Convolution", "Slice",
                                                           "Silence", "ReLU"]


@pytest.mark.parametrize("data,msg", [
    (b"", "holds no ONNX graph"),            # an empty file
    (b"\x08\x08", "holds no ONNX graph"),    # cut after ir_version
])
def test_a_file_without_a_graph_is_an_error(tmp_path, data, msg):
    """An empty or truncated file that parses as a ModelProto without a
    graph was converted into an empty net, with exit status 0."""
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(OnnxConversionError, match=rf"{path}: .*{msg}"):
        onnx2caffe(str(path), str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_graph_without_outputs_is_an_error():
    m = _chain()
    del m.graph.output[:]
    with pytest.raises(OnnxConversionError, match="the graph declares no outputs"):
        convert(m)


@pytest.mark.parametrize("opsets,msg", [
    ([("", 99)], r"ONNX opset 99 is not one onnx knows"),
    ([("", 0)], r"ONNX opset 0 is not one onnx knows"),
    ([("", 13), ("", 7)], r"names the default ONNX domain 2 times \(opsets \[13, 7\]\)"),
    ([("com.foo", 1)], r"opset_import has no entry for the default ONNX domain"),
])
def test_an_opset_onnx_does_not_know_is_an_error(opsets, msg):
    """Opset 99 was converted under guessed semantics (exit status 0); opset
    0, two default opsets or none ended in shape-inference errors that did
    not say the opset was at fault."""
    m = _chain()
    del m.opset_import[:]
    m.opset_import.extend(helper.make_opsetid(d, v) for d, v in opsets)
    with pytest.raises(OnnxConversionError, match=msg):
        convert(m)


@pytest.mark.parametrize("perm", [(0, 2, 1, 3, 3), (0, 1, 1, 3, 4), (0, 2, 1, 3, 5),
                                  (0, 2, 1, 3, -1), (0, 2, 1, 3), (0, 2, 1, 3, 4, 5)])
def test_a_transpose_perm_that_is_no_permutation_is_an_error_naming_the_node(perm):
    """A repeated or out-of-range axis left the shape unknown (the error gave
    no reason); a perm of the wrong length was numpy's "axes don't match
    array", naming no node."""
    with pytest.raises(OnnxConversionError, match=r"Transpose 'transpose': perm .* is not a "
                                                  r"permutation of the 5 axes of its input"):
        convert(_chain(perm=perm))


@pytest.mark.parametrize("shape5,kw,msg", [
    ([1, 2, 3, 2, -4], {}, r"holds -4"),
    ([1, -1, -1, 2, 2], {}, r"holds more than one -1"),
    ([1, 2, 3, 2, 2 ** 40], {}, r"does not fit the input \[1, 6, 2, 2\] \(24 values\)"),
    ([1, 2, 3, 2, 5], {}, r"does not fit the input"),
    ([1, 2, 3, 2, 0], {}, r"the 0 at position 4 copies a dimension the 4-D input"),
    (np.array([1, 2, 3, 2, 2], np.float32), {}, r"1-D float32 tensor; Reshape takes a 1-D "
                                                r"int64 one"),
    # allowzero 1: the 0 is a size, not "copy" (it was converted as a copy)
    ([0, 2, 3, 2, 2], dict(opset=14, reshape_attrs=dict(allowzero=1)),
     r"does not fit the input \[1, 6, 2, 2\] \(24 values, allowzero 1\)"),
])
def test_a_reshape_shape_that_does_not_fit_is_an_error_naming_the_node(shape5, kw, msg):
    with pytest.raises(OnnxConversionError, match=rf"Reshape 'reshape5': .*{msg}"):
        convert(_chain(shape5=np.asarray(shape5, getattr(shape5, "dtype", np.int64)), **kw))


def test_reshape_zero_copies_and_minus_one_infers():
    """0 (allowzero 0) copies the input's size, -1 takes the rest."""
    assert len(convert(_chain(shape5=np.array([0, 2, -1, 2, 2], np.int64))).layer) == 5


@pytest.mark.parametrize("kw,msg", [
    (dict(slice_args=dict(starts=np.array([0.0], np.float32))),
     r"starts 'starts' is a 1-D float32 tensor; Slice takes a 1-D int32 or int64 one"),
    # zip() cut these to the shortest: an identity Slice, the next node blamed
    (dict(slice_args=dict(starts=np.zeros(0, np.int64))),
     r"starts \[\], ends \[3\], axes \[1\] and steps \[\] differ in length"),
    (dict(slice_args=dict(starts=np.array([0, 1], np.int64), ends=np.array([3, 3], np.int64),
                          axes=np.array([1, -3], np.int64))),
     r"axes \[1, -3\] name an axis twice"),
    # opset 9 reads starts/ends from attributes: a KeyError naming nothing
    (dict(opset=9), r"at opset 9 Slice takes starts as an attribute \(none given\)"),
])
def test_slice_constants_of_the_wrong_type_or_length_are_an_error_naming_the_node(kw, msg):
    with pytest.raises(OnnxConversionError, match=rf"Slice 'slice': {msg}"):
        convert(_chain(**kw))


def test_an_opset_9_slice_still_converts():
    assert "Slice" in [lp.type for lp in convert(_chain(opset=9, slice_opset9=True)).layer]


@pytest.mark.parametrize("attrs,msg", [
    # an unknown auto_pad was read as SAME_LOWER and converted (exit 0)
    (dict(auto_pad="BOGUS"), r"auto_pad 'BOGUS' is not one of"),
    (dict(auto_pad="SAME_UPPER", pads=[1, 1, 1, 1]), r"auto_pad SAME_UPPER and pads are both"),
    # kernel_shape contradicting the weight was ignored (exit 0)
    (dict(kernel_shape=[2 ** 40, 2 ** 40]), r"kernel_shape \[1099511627776, 1099511627776\] "
                                            r"does not match the weight's spatial shape \[3, 3\]"),
    (dict(pads=[1, 1]), r"pads \[1, 1\] must be 4 integers"),             # IndexError
    (dict(strides=[2 ** 40, 1]), r"strides \[1099511627776, 1\] must be 2 integers"),  # protobuf
    (dict(group=-1), r"group -1 must be a positive integer"),             # protobuf
])
def test_bad_conv_attributes_are_an_error_naming_the_node(attrs, msg):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]),
                          opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxConversionError, match=rf"Conv 'conv': {msg}"):
        convert(m)


def test_a_pooling_stride_0_is_an_error_naming_the_node():
    """(was a ZeroDivisionError, naming nothing)"""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2],
                            strides=[0, 0])
    m = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxConversionError, match=r"MaxPool 'pool': strides \[0, 0\] must be"):
        convert(m)


def _gemm(b_shape=(5, 8), c=None, extra_nodes=(), inits=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ins = ["x", "b"] + (["c"] if c is not None else [])
    inits = [numpy_helper.from_array(np.ones(b_shape, np.float32), "b")] + list(inits)
    if c is not None:
        inits.append(numpy_helper.from_array(np.asarray(c, np.float32), "c"))
    nodes = list(extra_nodes) + [helper.make_node("Gemm", ins, ["y"], name="gemm", transB=1)]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("kw,msg", [
    (dict(b_shape=(5, 12)), r"B 'b' of shape \[5, 12\] \(transB 1\) takes 12 input columns; "
                            r"input 'x' \[1, 8\] has 8"),
    (dict(c=np.zeros(7)), r"C 'c' of shape \[7\] does not broadcast to the output \[1, 5\]"),
])
def test_gemm_operands_that_do_not_fit_are_an_error_naming_the_node(kw, msg):
    """(a numpy broadcast error naming nothing, or "the shape of output is
    not known statically")"""
    with pytest.raises(OnnxConversionError, match=rf"Gemm 'gemm': {msg}"):
        convert(_gemm(**kw))


def test_a_constant_without_a_value_is_an_error_naming_it():
    """(was "malformed ONNX model (IndexError: list index out of range)")"""
    m = _gemm(b_shape=(5, 8))
    m.graph.node.insert(0, helper.make_node("Constant", [], ["unused"], name="konst"))
    with pytest.raises(OnnxConversionError, match=r"Constant 'konst' has 0 attributes"):
        convert(m)


def _declared(name, dims, data_type=TensorProto.FLOAT, **fields):
    t = TensorProto(name=name, data_type=data_type, dims=dims, **fields)
    return t


def test_a_2_gib_initializer_is_refused_from_its_dims_without_reading_it(tmp_path):
    """A [5, 2^27] weight (2.5 GiB as float32) cannot be written into a
    .caffemodel (one protobuf message, under 2 GiB): refused by name from its
    declared dims, before its external data is read (it was read whole, then
    copied, then blown up into a Python list by the blob writer: MemoryError
    naming nothing). Its data file does not even exist here."""
    m = _gemm()
    t = _declared("b", [5, 2 ** 27])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="b.bin")
    m.graph.initializer[0].CopyFrom(t)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(OnnxConversionError, match=rf"{path}: initializer 'b': dims \[5, "
                                                  r"134217728\] declare 671088640 values "
                                                  r"\(2.5 GiB as float32\), more than a "
                                                  r"\.caffemodel"):
        onnx2caffe(str(path), str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"))


@pytest.mark.parametrize("tensor,msg", [
    # declared but absent: numpy's "cannot reshape array of size 0"
    (_declared("b", [5, 2 ** 27]), r"initializer 'b': dims \[5, 134217728\] declare"),
    (_declared("b", [-5, 8]), r"initializer 'b': negative dimension in dims \[-5, 8\]"),
    (_declared("b", [5, 8], data_type=99), r"initializer 'b': data type 99 is not numeric"),
    (_declared("b", [5, 8], raw_data=b"\0" * 8),
     r"initializer 'b' \(FLOAT, dims \[5, 8\]\): its data does not match its type and dims"),
])
def test_an_unreadable_initializer_is_an_error_naming_it(tensor, msg):
    m = _gemm()
    m.graph.initializer[0].CopyFrom(tensor)
    with pytest.raises(OnnxConversionError, match=msg):
        convert(m)


def test_a_folded_constant_too_large_for_a_caffemodel_is_refused_before_it_is_made():
    """ConstantOfShape [2^20, 2^20] was tried by the reference evaluator
    (MemoryError, swallowed) and then reported as an operator without a
    Caffe equivalent; a 2 GiB one was allocated and ended in MemoryError."""
    shp = numpy_helper.from_array(np.array([2 ** 20, 2 ** 20], np.int64), "shp")
    m = _gemm(extra_nodes=[helper.make_node("ConstantOfShape", ["shp"], ["b"], name="cos")],
              inits=[shp])
    del m.graph.initializer[0]      # b is the ConstantOfShape's output
    with pytest.raises(OnnxConversionError, match=r"ConstantOfShape 'cos': output 'b' of shape "
                                                  r"\[1048576, 1048576\] holds 1099511627776"):
        convert(m)


def test_weights_past_what_a_caffemodel_holds_are_an_error_naming_the_layer(monkeypatch):
    """The sum of the converted weights must fit one .caffemodel (the limit
    lowered here to 100 bytes: a real one needs 2 GiB of weights); protobuf
    refused the net only when the file was written."""
    monkeypatch.setattr(to_caffe, "WEIGHT_BYTES_MAX", 100)
    with pytest.raises(OnnxConversionError, match=r"layer 'gemm': the converted weights reach "
                                                  r"40 values"):
        convert(_gemm())


def test_blobs_are_the_same_as_array_to_blobproto_writes():
    """The blob writer goes through packed bytes, not a Python list of
    floats (~32 bytes a value: a 1 GiB weight needed ~8 GiB)."""
    for a in (np.zeros(0, np.float32), np.float32(3.5).reshape(()),
              np.arange(300, dtype=np.float64).reshape(3, 10, 10).transpose(2, 0, 1),
              np.array([np.nan, -np.inf, 1e-45], np.float32)):
        got = to_caffe.blob_proto(a).SerializeToString()
        assert got == array_to_blobproto(np.asarray(a, np.float32)).SerializeToString()


def test_a_check_that_cannot_run_names_the_model_and_what_was_written(tmp_path):
    """--check of a model the converter reads but ONNX Runtime refuses (Slice
    with int32 starts next to int64 ends): the error named no file."""
    pytest.importorskip("onnxruntime")
    m = _chain(slice_args=dict(starts=np.array([0], np.int32)))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    proto, model = tmp_path / "m.prototxt", tmp_path / "m.caffemodel"
    with pytest.raises(OnnxConversionError, match=rf"{path}: wrote {proto} and {model}, but "
                                                  r"--check could not compare: onnxruntime "
                                                  r"cannot load the model"):
        onnx2caffe(str(path), str(proto), str(model), check=True)


@pytest.mark.parametrize("op,attrs,msg", [
    ("LRN", {}, r"LRN 'n': malformed node \(KeyError: 'size'\)"),
    ("LeakyRelu", dict(alpha=b"x"), r"LeakyRelu 'n': malformed node \(ValueError: could not "
                                    r"convert string to float"),
])
def test_any_other_malformed_node_is_an_error_naming_it(op, attrs, msg):
    """An attribute no check foresaw (missing, of the wrong type) was
    "malformed ONNX model (KeyError: 'size')", naming no node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x"], ["y"], name="n", **attrs)
    m = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxConversionError, match=msg):
        convert(m)


def test_a_malformed_node_past_an_unsupported_one_is_listed_after_it():
    """An error of a node past an unsupported one (here a Gemm whose B does
    not fit) must not hide the unsupported node, whose absence may be its
    cause: both are listed, the unsupported first."""
    m = _gemm(b_shape=(5, 12), extra_nodes=[helper.make_node("Sin", ["x0"], ["x"], name="sin")])
    m.graph.input[0].name = "x0"
    with pytest.raises(OnnxConversionError, match=r"2 unsupported ONNX node\(s\); nothing was "
                                                  r"written: Sin 'sin': no Caffe equivalent "
                                                  r"for this operator; Gemm 'gemm': B 'b'"):
        convert(m)


def test_check_finds_external_data_next_to_the_model(tmp_path, monkeypatch):
    """--check gave ONNX Runtime the file's bytes, so it looked for external
    data in the working folder: "could not compare" for every model whose
    weights are stored beside it (as models over 2 GiB must be)."""
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "model"
    folder.mkdir()
    m = _gemm()
    path = folder / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.data",
                    size_threshold=0)
    assert (folder / "m.data").exists()
    report = onnx2caffe(str(path), str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"),
                        check=True, out=io.StringIO())
    diff, scale = report["y"]
    assert scale > 0 and diff <= 1e-5 * scale


def _one_node(op, x_shape, inits=(), x_type=None, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    if x_type is not None:
        x.type.CopyFrom(x_type)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ins = ["x"] + [t.name for t in inits]
    if op == "Concat":
        ins = ["x", "x"]
    node = helper.make_node(op, ins, ["y"], name="n", **attrs)
    return helper.make_model(helper.make_graph([node], "g", [x], [y], list(inits)),
                             opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("model,msg", [
    # the axis is checked before the output's shape, which it leaves unknown
    (lambda: _one_node("Concat", [1, 2, 3, 4], axis=99),
     r"Concat 'n': axis 99 out of range for a 4-D input"),
    (lambda: _one_node("Conv", [1, 2, 5], [numpy_helper.from_array(
        np.ones((4, 2, 3, 3), np.float32), "w")]),
     r"Conv 'n': input 'x' has shape \[1, 2, 5\]; a Conv with a 4-D weight takes a 4-D input"),
    (lambda: _one_node("Relu", None), r"input 'x' declares no shape; give it \(--input_shape\)"),
    (lambda: _one_node("Relu", None, x_type=helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 2]))),
     r"input 'x' is a sequence_type, not a tensor"),
])
def test_the_cause_is_named_where_the_error_was_an_unknown_shape(model, msg):
    """These ended in "N unsupported ONNX node(s): ... the shape of ... is not
    known statically", which did not say what was wrong."""
    with pytest.raises(OnnxConversionError, match=msg):
        convert(model())


def test_check_difference_leaves_out_nan_and_inf_that_agree():
    from caffe_ocl.onnx.check import _difference, format_report
    nan, inf = float("nan"), float("inf")
    ref = np.array([1.0, nan, inf, -inf, 2.0])
    # the same non-finite values in the same places agree
    assert _difference(ref + np.array([1e-3, 0, 0, 0, 0]), ref) == pytest.approx((1e-3, 2.0))
    # one side only, or NaN against inf, or inf of the other sign: a difference
    for bad in ([1.0, 0.0, inf, -inf, 2.0], [1.0, nan, nan, -inf, 2.0],
                [1.0, nan, inf, inf, 2.0], [nan, nan, inf, -inf, 2.0]):
        diff, scale = _difference(np.array(bad), ref)
        assert diff == inf and scale == 2.0
        assert "one side only" in format_report({"y": (diff, scale)})
    assert _difference(np.array([nan]), np.array([nan])) == (0.0, 0.0)


def test_check_of_an_output_with_nan_reports_the_finite_difference(tmp_path):
    # Log of a negative input is NaN on both sides: --check printed "nan"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "g",
                                            [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = tmp_path / "log.onnx"
    onnx.save(m, str(path))
    out = io.StringIO()
    report = onnx2caffe(str(path), str(tmp_path / "l.prototxt"), str(tmp_path / "l.caffemodel"),
                        check=True, out=out)
    diff, scale = report["y"]
    assert np.isfinite(diff) and diff <= 1e-5 * max(scale, 1.0), report
    assert "nan" not in out.getvalue()


def test_a_tensor_written_twice_is_one_error_naming_both_nodes():
    # two nodes writing "t": converted to two layers writing one top, where
    # ONNX Runtime refuses the model (fuzz finding)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["t"], name="a"),
             helper.make_node("Sigmoid", ["x"], ["t"], name="b"),
             helper.make_node("Neg", ["t"], ["y"], name="c")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    from caffe_ocl.onnx.to_caffe import convert
    with pytest.raises(OnnxConversionError) as e:
        convert(m)
    msg = str(e.value)
    assert "Sigmoid 'b'" in msg and "'t'" in msg and "Relu 'a'" in msg and "\n" not in msg
