"""Structure-aware fuzzing (fuzzing_struct.py): layer params filled from the
protobuf schema with boundary values, net wiring and text tricks, protobuf
wire-level edits of caffemodels/binaryprotos/solverstates, V1/V2-mixed
caffemodels, hostile Datum records, ONNX graphs built op by op, solvers with
hostile values (earlier snapshots must survive) and random DAGs of the
layers the plan passes fuse. Cases run in a memory-limited child
under a timeout, as the other fuzz suites; each must work or end in one
CaffeOclError line naming the file or layer. The default run is 5
cases per format in one child; ``-m slow`` runs hundreds.

Also one focused test per fix these cases led to, each failing without it."""
import os

import numpy as np
import pytest

import caffe_ocl as caffe
import fuzzing
import fuzzing_struct
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import caffe_pb2, write_binary

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT = 5        # cases per format in the default run, all in one child
SLOW = 600


def _run(fmt, first, count, root, timeout):
    verdicts = fuzzing.run_child_cases(os.path.join(HERE, "fuzzing_struct.py"), fmt, first,
                                       count, root, timeout)
    assert "error" in verdicts, verdicts      # the mutations reach the checks


def test_fuzz_struct(tmp_path):
    _run("mix", 0, DEFAULT * len(fuzzing_struct.FORMATS), tmp_path, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", fuzzing_struct.FORMATS)
def test_fuzz_struct_many(fmt, tmp_path):
    _run(fmt, 10_000, SLOW, tmp_path, timeout=3000)


# ---- one test per fix ------------------------------------------------------

def _one_line(exc_info, *names):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for n in names:
        assert n in msg, (n, msg)
    return msg


def test_binary_string_not_utf8(tmp_path):
    """A layer name (V1 and V2), a solver state's learned_net of bytes that
    are not UTF-8: the binary parser keeps them, and reading the field was a
    UnicodeDecodeError traceback (in the V1 upgrader, the weights copy, the
    restore). Wire seeds 80, 715."""
    v1 = caffe_pb2.NetParameter()
    v1.layers.add(name="AB", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    v2 = caffe_pb2.NetParameter()
    v2.layer.add(name="AB", type="InnerProduct")
    for i, m in enumerate((v1, v2)):
        path = tmp_path / f"m{i}.caffemodel"
        path.write_bytes(m.SerializeToString().replace(b"AB", b"\xff\xfe"))
        with pytest.raises(CaffeOclError) as e:
            caffe.proto.read_net_binary(str(path))
        _one_line(e, str(path), "not UTF-8")
    st = caffe_pb2.SolverState(iter=1, learned_net="AB")
    path = tmp_path / "s.solverstate"
    path.write_bytes(st.SerializeToString().replace(b"AB", b"\xc3("))
    from caffe_ocl.solvers.state import parse_solver_state
    with pytest.raises(CaffeOclError) as e:
        parse_solver_state(path.read_bytes(), str(path))
    _one_line(e, str(path), "learned_net")


def test_blobproto_more_axes_than_numpy(tmp_path):
    """A BlobProto of 65+ axes (each 1: the data count matches) was
    numpy's ValueError traceback; now Caffe's 32-axis limit. Wire seeds
    145, 182, 1015."""
    b = caffe_pb2.BlobProto()
    b.shape.dim.extend([1] * 65)
    b.data.append(1.0)
    path = tmp_path / "mean.binaryproto"
    write_binary(b, str(path))
    with pytest.raises(CaffeOclError) as e:
        caffe.proto.read_blob_array(str(path))
    _one_line(e, str(path), "65 axes")
    b.shape.ClearField("dim")
    b.shape.dim.extend([1] * 32)
    write_binary(b, str(path))
    assert caffe.proto.read_blob_array(str(path)).shape == (1,) * 32


def test_onnx_shape_inference_abort_is_one_line(tmp_path):
    """A ConvTranspose whose pads exceed its output gives a negative dim;
    onnx's C++ shape inference of the Slice reading it hits std::clamp with
    hi < lo and aborts the process (SIGABRT; onnxsem seed 1547). Inference
    now runs in a forked child: one OnnxConversionError naming the file."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    from caffe_ocl.onnx.to_caffe import onnx2caffe
    inits = [numpy_helper.from_array(np.ones((2, 2, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "st"),
             numpy_helper.from_array(np.array([1], np.int64), "en"),
             numpy_helper.from_array(np.array([2], np.int64), "ax")]
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], pads=[5, 5, 5, 5]),
             helper.make_node("Slice", ["y", "st", "en", "ax"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 2, 1, 1])],
                          [helper.make_tensor_value_info("z", 1, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(CaffeOclError) as e:
        onnx2caffe(str(path), str(tmp_path / "o.prototxt"), str(tmp_path / "o.caffemodel"))
    _one_line(e, str(path), "shape inference")
    assert not (tmp_path / "o.prototxt").exists()


def test_solver_test_iter_count_is_bounded(tmp_path):
    """100000 test_iter values with a generic ``net`` asked for 100000 test
    nets, the net file read and built once each: hours, then the device's
    memory (solverval seed 237). Past MAX_TEST_NETS it is one line."""
    from caffe_ocl.solvers.solver import MAX_TEST_NETS
    net = tmp_path / "net.prototxt"
    net.write_text('layer { name: "d" type: "DummyData" top: "d" '
                   'dummy_data_param { shape { dim: 1 dim: 2 } } }')
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}" base_lr: 0.1 lr_policy: "fixed" test_interval: 1 '
                      + "test_iter: 1 " * (MAX_TEST_NETS + 1))
    with pytest.raises(CaffeOclError) as e:
        caffe.get_solver(str(solver))
    _one_line(e, str(solver), "test nets")
    solver.write_text(f'net: "{net}" base_lr: 0.1 lr_policy: "fixed" test_interval: 1 '
                      "test_iter: 1 test_iter: 2")
    assert len(caffe.get_solver(str(solver)).test_nets) == 2
