"""Seeded fuzzing of the formats tests/robustness/fuzzing.py does not
cover (issue #25): ONNX models for onnx2caffe, HDF5 weights, HDF5 solver
states, HDF5Data lists and files, images for classify, mean files
(fuzzing_more.py). Cases run in a child process under RLIMIT_AS and a
timeout, so a signal, a hang (a FIFO in an image's place) or runaway
memory (an HDF5 dataset claiming terabytes) shows; each case must work or
end in one CaffeOclError line naming the file. The default run is a few
dozen cases per format; ``-m slow`` runs hundreds.

Also one test per fix those probes led to, each failing without it."""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import caffe_ocl as caffe
import fuzzing
import fuzzing_more
from caffe_ocl.errors import CaffeOclError, DataError, NetError, ShapeError, SolverError
from caffe_ocl import config
from caffe_ocl.proto import parse_net_text, parse_solver_text

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT = {"onnx": 80, "h5weights": 80, "h5state": 80, "h5data": 60, "image": 80,
           "meanfile": 60}
SLOW = 400


def _run_child_cases(fmt, first, count, root, timeout):
    verdicts = fuzzing.run_child_cases(os.path.join(HERE, "fuzzing_more.py"), fmt, first,
                                       count, root, timeout)
    assert "error" in verdicts, verdicts      # the mutations reach the checks


@pytest.mark.parametrize("fmt", fuzzing_more.FORMATS)
def test_fuzz_more_formats(fmt, tmp_path):
    _run_child_cases(fmt, 0, DEFAULT[fmt], tmp_path, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", fuzzing_more.FORMATS)
def test_fuzz_more_formats_many(fmt, tmp_path):
    _run_child_cases(fmt, 10_000, SLOW, tmp_path, timeout=3000)


# ---- one test per fix ------------------------------------------------------

IP_NET = ('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }'
          'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
          'inner_product_param { num_output: 2 } }')


def test_hdf5_weights_never_read_before_checking(tmp_path):
    """A dataset claiming 2^40 values (never written: a small file), one of
    strings, and a damaged file are one line; they were a MemoryError, an
    OSError and RuntimeError/KeyError tracebacks."""
    net = caffe.Net(parse_net_text(IP_NET), caffe.TEST)
    cases = {
        "huge": lambda g: g.create_dataset("0", shape=(2**20, 2**20), dtype="f4"),
        "strings": lambda g: g.__setitem__("0", np.array([b"ab"] * 6)),
        "compound": lambda g: g.__setitem__("0", np.zeros(6, [("a", "f4"), ("b", "i4")])),
        "group": lambda g: g.create_group("0"),
    }
    for name, make in cases.items():
        path = tmp_path / f"{name}.caffemodel.h5"
        with h5py.File(path, "w") as f:
            make(f.create_group("data/ip"))
        with pytest.raises(CaffeOclError) as e:
            net.copy_from(str(path))
        msg = str(e.value)
        assert str(path) in msg and "\n" not in msg, (name, msg)
    good = tmp_path / "good.caffemodel.h5"
    net.save_hdf5(str(good))
    data = good.read_bytes()
    damaged = 0
    bad = tmp_path / "bad.caffemodel.h5"
    for off in range(64, len(data), 64):    # zero each 64-byte window past the signature
        bad.write_bytes(data[:off] + bytes(64) + data[off + 64:])
        try:
            net.copy_from(str(bad))
        except CaffeOclError as e:
            assert str(bad) in str(e) and "\n" not in str(e), str(e)
            damaged += isinstance(e, NetError) and "damaged or unreadable HDF5" in str(e)
    assert damaged >= 3      # bad heaps, B-trees, object headers: tracebacks before


def _h5_solver(tmp_path):
    p = parse_solver_text(
        'type: "SGD" base_lr: 0.01 lr_policy: "fixed" max_iter: 1 momentum: 0.9 '
        f'snapshot_format: HDF5 snapshot_prefix: "{tmp_path}/s"')
    p.net_param.CopyFrom(parse_net_text(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 2 '
        'dim: 3 } data_filler { type: "gaussian" } } }'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        'inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }'
        'layer { name: "l" type: "Reduction" bottom: "y" top: "l" loss_weight: 1 }'))
    s = caffe.get_solver(p)
    s.step(1)
    return s, s.snapshot()


def test_hdf5_solver_state_is_checked(tmp_path):
    s, state = _h5_solver(tmp_path)
    edits = {
        "no_iter": lambda f: f.__delitem__("iter"),
        "iter_str": lambda f: (f.__delitem__("iter"), f.__setitem__("iter", "abc")),
        "iter_neg": lambda f: (f.__delitem__("iter"), f.__setitem__("iter", -5)),
        "hist_huge": lambda f: (f.__delitem__("history/0"),
                                f.create_dataset("history/0", shape=(2**40,), dtype="f4")),
        "hist_str": lambda f: (f.__delitem__("history/0"),
                               f.__setitem__("history/0", np.array([b"x"] * 6))),
        "learned_bytes": lambda f: (f.__delitem__("learned_net"),
                                    f.__setitem__("learned_net", np.array(b"\xff\x00",
                                                                          dtype="S2"))),
    }
    for name, edit in edits.items():
        path = tmp_path / f"{name}.solverstate.h5"
        shutil.copy(state, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        with pytest.raises(SolverError) as e:
            s.restore(str(path))
        msg = str(e.value)
        assert f"{name}.solverstate.h5" in msg and "\n" not in msg, (name, msg)
    s.restore(state)     # the good one still restores
    assert s.iter == 1


def test_hdf5data_special_and_huge_files(tmp_path):
    good = tmp_path / "good.h5"
    with h5py.File(good, "w") as f:
        f["data"] = np.zeros((4, 2), np.float32)
    huge = tmp_path / "huge.h5"
    with h5py.File(huge, "w") as f:
        f.create_dataset("data", shape=(2**31, 2**10), dtype="f4")
    os.mkfifo(tmp_path / "fifo.h5")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9.h5\n")
    for entry, what in [(huge, "out of host memory"), (tmp_path / "fifo.h5", "not a regular"),
                        (None, "not UTF-8")]:
        src = tmp_path / "latin1.txt" if entry is None else tmp_path / "list.txt"
        if entry is not None:
            src.write_text(f"{entry}\n")
        text = ('layer { name: "d" type: "HDF5Data" top: "data" hdf5_data_param { '
                f'source: "{src}" batch_size: 2 }} }}')
        with pytest.raises(CaffeOclError) as e:
            caffe.Net(parse_net_text(text), caffe.TRAIN)
        msg = str(e.value)
        assert what in msg and "'d'" in msg and "\n" not in msg, msg


def test_onnx_errors_are_one_line_naming_the_file(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from caffe_ocl.onnx.to_caffe import convert
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1, name="fc"),
         helper.make_node("Sin", ["y"], ["z"], name="sin"),
         helper.make_node("Relu", ["nope"], ["q"], name="r")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("never", TensorProto.FLOAT, None)], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    with pytest.raises(CaffeOclError) as e:
        convert(str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg      # was 3 lines
    assert "Sin 'sin': no Caffe equivalent" in msg and "'nope' is not produced" in msg
    g2 = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], "g2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("never", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g2, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(CaffeOclError, match="m.onnx: .*'never': no node produces this "
                                            "graph output"):      # was a KeyError
        convert(str(path))
    # an initializer whose dims claim more than its data holds (and more
    # than a .caffemodel holds): refused from its dims, naming it
    del m.graph.initializer[0].dims[:]
    m.graph.initializer[0].dims.extend([2**20, 2**20])
    onnx.save(m, str(path))
    with pytest.raises(CaffeOclError, match=r"m.onnx: initializer 'w': dims \[1048576, 1048576\]"):
        convert(str(path))


def test_classify_mean_and_image_checks(tmp_path):
    import cv2
    from caffe_ocl.classify import classify, load_mean
    from caffe_ocl.proto import array_to_blobproto, write_binary
    net = tmp_path / "n.prototxt"
    net.write_text('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 '
                   'dim: 3 dim: 4 dim: 4 } } } layer { name: "p" type: "Softmax" '
                   'bottom: "x" top: "p" }')
    img = tmp_path / "i.png"
    cv2.imwrite(str(img), np.zeros((4, 4, 3), np.uint8))
    write_binary(array_to_blobproto(np.ones((1, 4, 4, 4), np.float32)), tmp_path / "m4.bp")
    write_binary(array_to_blobproto(np.full((1, 3, 4, 4), np.nan, np.float32)),
                 tmp_path / "nan.bp")
    write_binary(array_to_blobproto(np.ones((7,), np.float32)), tmp_path / "flat.bp")
    with pytest.raises(ShapeError, match=r"m4.bp: the mean has shape \[4, 4, 4\]"):
        classify(str(net), None, [str(img)], load_mean(str(tmp_path / "m4.bp")),
                 mean_source=str(tmp_path / "m4.bp"))
    with pytest.raises(DataError, match="nan.bp: mean blob holds NaN"):
        load_mean(str(tmp_path / "nan.bp"))
    with pytest.raises(ShapeError, match=r"flat.bp: mean blob has shape \[7\]"):
        load_mean(str(tmp_path / "flat.bp"))
    fifo = tmp_path / "f.png"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="f.png: image is a FIFO"):     # blocked before
        classify(str(net), None, [str(fifo)])
    assert classify(str(net), None, [str(img)])[0][0] == str(img)


def test_labelmap_with_a_huge_label_is_refused(tmp_path):
    from caffe_ocl.detection import read_labels
    p = tmp_path / "labelmap.prototxt"
    p.write_text('item { name: "a" label: 999999999999 display_name: "a" }\n')
    with pytest.raises(DataError, match="labelmap.prototxt: label 999999999999 is out"):
        read_labels(str(p))
    p.write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match="not UTF-8"):
        read_labels(str(p))


def test_blob_axes_and_image_resize_limits(tmp_path):
    import cv2
    with pytest.raises(ShapeError, match="40 axes; a blob has at most 32"):
        caffe.Blob((1,) * 40)
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((4, 4, 3), np.uint8))
    (tmp_path / "l.txt").write_text(f"{tmp_path / 'a.png'} 0\n")
    text = ('layer { name: "d" type: "ImageData" top: "a" top: "b" image_data_param { '
            f'source: "{tmp_path / "l.txt"}" batch_size: 1 new_height: 100000 '
            'new_width: 100000 } }')
    with config.override(HOST_MEMORY_LIMIT_MB=64):
        with pytest.raises(CaffeOclError, match="resized to 100000x100000 needs"):
            caffe.Net(parse_net_text(text), caffe.TRAIN)


def test_pycaffe_load_image_refuses_special_files(tmp_path):
    """caffe.io.load_image read a FIFO forever (blocked) and /dev/zero
    without end (np.fromfile); now one line each."""
    import threading
    fifo = tmp_path / "f.jpg"
    os.mkfifo(fifo)
    result = {}

    def go():
        for p in (str(fifo), "/dev/zero"):
            try:
                caffe.io.load_image(p)
            except CaffeOclError as e:
                result[p] = str(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "load_image blocked on a FIFO"
    assert "f.jpg: image file is a FIFO" in result[str(fifo)]
    assert "/dev/zero: image file is a device" in result["/dev/zero"]


def test_damaged_string_heap_of_hdf5_state_does_not_hang(tmp_path):
    """A zeroed global-heap object under /learned_net (a variable-length
    string) made libhdf5 loop forever inside the read (fuzz seed 20642):
    the reference is now checked against the file first. Run in a child,
    so that a regression fails by timeout instead of hanging the suite."""
    s, state = _h5_solver(tmp_path)
    data = bytearray(open(state, "rb").read())
    heap = data.find(b"GCOL")
    assert heap > 0
    data[heap + 24:heap + 24 + 90] = bytes(90)     # object 1's size and string -> 0
    bad = tmp_path / "bad.solverstate.h5"
    bad.write_bytes(bytes(data))
    code = ("import sys, h5py; sys.path.insert(0, sys.argv[1]); import test_fuzz_more_inputs as t;"
            "import pathlib; from caffe_ocl.errors import SolverError\n"
            "s, _ = t._h5_solver(pathlib.Path(sys.argv[2]))\n"
            "try:\n    s.restore(sys.argv[3])\nexcept SolverError as e:\n    print(e)\n")
    from conftest import child_env     # here: the child imports this file
    (tmp_path / "child").mkdir()
    p = subprocess.run([sys.executable, "-c", code, HERE, str(tmp_path / "child"), str(bad)],
                       capture_output=True, text=True, timeout=60, env=child_env(),
                       preexec_fn=fuzzing.limit_child)
    assert "bad.solverstate.h5: /learned_net: its string reference is damaged" in p.stdout, \
        p.stdout + p.stderr[-1000:]
