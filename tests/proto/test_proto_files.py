"""Reading and writing Caffe protobuf files: errors, blobs, atomic writes."""

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from caffe_ocl.errors import CaffeOclError, FileNotFound, ParseError, ShapeError
from caffe_ocl.proto import (array_to_blobproto, blobproto_to_array, caffe_pb2,
                             parse_net_text, read_blobproto, read_net,
                             read_net_binary, read_net_prototxt,
                             read_solver_prototxt, write_binary, write_text)
from caffe_ocl.proto import files as proto_files


def test_generated_module_imports_without_warnings():
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    code = ("import google.protobuf, caffe_ocl.proto.caffe_pb2 as m; "
            "print(m.MIN_PROTOBUF, google.protobuf.__version__)")
    res = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=root,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    need, have = res.stdout.split()
    as_tuple = lambda v: tuple(int(x) for x in v.split(".")[:3])
    assert as_tuple(have) >= as_tuple(need)


def test_schema_field_numbers_match_caffe():
    L = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
    assert L["convolution_param"].number == 106
    assert L["batch_norm_param"].number == 139
    assert L["clip_param"].number == 148
    assert L["swish_param"].number == 147
    assert L["transform_param"].number == 100
    N = caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name
    assert (N["layer"].number, N["layers"].number) == (100, 2)
    S = caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_name
    assert (S["type"].number, S["solver_type"].number, S["weights"].number) == (40, 30, 42)
    V1 = caffe_pb2.V1LayerParameter
    assert V1.DESCRIPTOR.fields_by_name["blobs_lr"].number == 7
    assert V1.DESCRIPTOR.fields_by_name["layer"].number == 1
    assert V1.SOFTMAX_LOSS == 21 and V1.DECONVOLUTION == 39
    assert caffe_pb2.BlobProto.DESCRIPTOR.fields_by_name["shape"].number == 7
    assert caffe_pb2.Datum.DESCRIPTOR.fields_by_name["encoded"].number == 7
    p = caffe_pb2.PoolingParameter()
    assert p.round_mode == caffe_pb2.PoolingParameter.CEIL and p.stride == 1


# ---------------------------------------------------------------- errors

def test_malformed_prototxt_gives_file_line_col(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('name: "x"\nlayer {\n  name: "a"\n  typo_field: 3\n}\n')
    with pytest.raises(ParseError) as info:
        read_net_prototxt(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:4:3: "), msg
    assert "typo_field" in msg
    assert isinstance(info.value, CaffeOclError)


def test_malformed_prototxt_unclosed_brace(tmp_path):
    path = tmp_path / "open.prototxt"
    path.write_text('layer {\n  name: "a"\n')
    with pytest.raises(ParseError, match=rf"^{path}:\d+:\d+: "):
        read_net(path)


def test_parse_net_text_source_in_message():
    with pytest.raises(ParseError, match=r"^mynet:1:\d+: .*Expected"):
        parse_net_text('name: ', "mynet")


def test_non_utf8_text_is_parse_error(tmp_path):
    path = tmp_path / "bin.prototxt"
    path.write_bytes(b'name: "a"\n\xff\xfe')
    with pytest.raises(ParseError, match=rf"^{path}:2:1: "):
        read_net_prototxt(path)


def test_missing_files_raise_file_not_found(tmp_path):
    missing = tmp_path / "nope.prototxt"
    for fn in (read_net_prototxt, read_net_binary, read_net,
               read_solver_prototxt, read_blobproto):
        with pytest.raises(FileNotFound) as info:
            fn(missing)
        assert str(missing) in str(info.value)
        assert isinstance(info.value, FileNotFoundError)


def test_garbage_caffemodel_is_parse_error_naming_path(tmp_path):
    path = tmp_path / "junk.caffemodel"
    path.write_bytes(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01garbage")
    with pytest.raises(ParseError) as info:
        read_net_binary(path)
    assert str(path) in str(info.value)
    with pytest.raises(ParseError, match=str(path)):
        read_net(path)


def test_truncated_caffemodel_is_parse_error(tmp_path):
    net = caffe_pb2.NetParameter(name="n")
    layer = net.layer.add(name="ip", type="InnerProduct")
    layer.blobs.add().CopyFrom(array_to_blobproto(np.ones((4, 4), np.float32)))
    data = net.SerializeToString()
    path = tmp_path / "cut.caffemodel"
    path.write_bytes(data[:-7])
    with pytest.raises(ParseError, match=str(path)):
        read_net_binary(path)


def test_hdf5_weights_are_refused_clearly(tmp_path):
    path = tmp_path / "w.caffemodel.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(ParseError, match="HDF5"):
        read_net(path)


def test_garbage_binaryproto_is_parse_error(tmp_path):
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(b"\x0f\x0f\x0f")
    with pytest.raises(ParseError, match=str(path)):
        read_blobproto(path)


def test_read_net_falls_back_to_binary_for_unknown_suffix(tmp_path):
    net = caffe_pb2.NetParameter(name="bin")
    net.layer.add(name="r", type="ReLU")
    path = tmp_path / "weights.bin"
    write_binary(net, path)
    if path.read_bytes().decode("utf-8", "replace") == path.read_bytes().decode("utf-8", "ignore"):
        pytest.skip("serialized bytes happen to be valid UTF-8")
    assert read_net(path).name == "bin"


# ---------------------------------------------------------------- solver files

def test_read_solver_prototxt(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text('net: "train.prototxt"\nbase_lr: 0.001\nlr_policy: "step"\n'
                    'solver_type: NESTEROV\nmomentum: 0.9\nmax_iter: 10\n')
    s = read_solver_prototxt(path)
    assert s.type == "Nesterov" and not s.HasField("solver_type")
    assert s.lr_policy == "step" and s.max_iter == 10


def test_malformed_solver(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text('base_lr: 0.1\nsolver_type: FAST\n')
    with pytest.raises(ParseError, match=rf"^{path}:2:\d+: .*FAST"):
        read_solver_prototxt(path)


# ---------------------------------------------------------------- blobs

def test_blobproto_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    diff = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    blob = array_to_blobproto(arr, diff)
    assert list(blob.shape.dim) == [2, 3, 4, 5]
    assert not blob.HasField("num")
    path = tmp_path / "mean.binaryproto"
    write_binary(blob, path)
    back = read_blobproto(path)
    out = blobproto_to_array(back)
    assert out.dtype == np.float32 and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    np.testing.assert_array_equal(blobproto_to_array(back, return_diff=True), diff)


def test_blobproto_round_trip_other_ranks():
    for shape in [(7,), (3, 2), (1, 2, 3, 4, 5)]:
        arr = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
        out = blobproto_to_array(array_to_blobproto(arr))
        assert out.shape == shape and out.dtype == np.float32
        np.testing.assert_array_equal(out, arr)
    scalar = array_to_blobproto(np.float32(2.5))
    assert scalar.HasField("shape") and len(scalar.shape.dim) == 0
    assert blobproto_to_array(scalar).shape == ()


def test_legacy_4d_blobproto_to_array(tmp_path):
    blob = caffe_pb2.BlobProto(num=1, channels=3, height=2, width=2)
    blob.data.extend(range(12))
    path = tmp_path / "legacy_mean.binaryproto"
    path.write_bytes(blob.SerializeToString())
    arr = blobproto_to_array(read_blobproto(path))
    assert arr.shape == (1, 3, 2, 2) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr.ravel(), np.arange(12))


def test_double_data_blob():
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 2])
    blob.double_data.extend([0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(blobproto_to_array(blob),
                                  np.array([[0.5, 1.5], [2.5, 3.5]], np.float32))


def test_blob_count_mismatch_is_shape_error():
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.data.extend([1, 2, 3])
    with pytest.raises(ShapeError, match=r"\[2, 3\].*3 values"):
        blobproto_to_array(blob)


# ---------------------------------------------------------------- writing

def test_write_text_round_trip(tmp_path):
    net = caffe_pb2.NetParameter(name="t")
    layer = net.layer.add(name="c", type="Convolution", bottom=["x"], top=["y"])
    layer.convolution_param.num_output = 4
    layer.convolution_param.kernel_size.append(3)
    path = tmp_path / "net.prototxt"
    write_text(net, path)
    assert 'type: "Convolution"' in path.read_text()
    assert read_net_prototxt(path) == net
    assert os.listdir(tmp_path) == ["net.prototxt"]


def test_write_binary_is_atomic_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "snap.caffemodel"
    net = caffe_pb2.NetParameter(name="first")
    write_binary(net, path)
    assert read_net_binary(path).name == "first"
    write_binary(caffe_pb2.NetParameter(name="second"), str(path))
    assert read_net_binary(path).name == "second"
    assert sorted(os.listdir(tmp_path)) == ["snap.caffemodel"]


def test_failed_serialization_keeps_existing_file(tmp_path, monkeypatch):
    path = tmp_path / "snap.caffemodel"
    write_binary(caffe_pb2.NetParameter(name="good"), path)
    before = path.read_bytes()

    bad = caffe_pb2.NetParameter(name="bad")

    class Exploding:
        def SerializeToString(self):
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_binary(Exploding(), path)
    assert path.read_bytes() == before

    # a failure while writing the bytes (after the .tmp file is open)
    real_fsync = os.fsync

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(proto_files.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        write_binary(bad, path)
    monkeypatch.setattr(proto_files.os, "fsync", real_fsync)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["snap.caffemodel"]
    assert read_net_binary(path).name == "good"


def test_failed_text_write_keeps_existing_file(tmp_path, monkeypatch):
    path = tmp_path / "net.prototxt"
    write_text(caffe_pb2.NetParameter(name="good"), path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise ValueError("cannot format")

    monkeypatch.setattr(proto_files.text_format, "MessageToString", boom)
    with pytest.raises(ValueError):
        write_text(caffe_pb2.NetParameter(name="bad"), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["net.prototxt"]


def test_small_files_are_read_without_allocating_the_cap(tmp_path, monkeypatch):
    """No read asks for more than the file's size plus one byte (then 1 MiB
    pieces): Python 3.12's read(n) allocates n bytes first, and read(2**31)
    of a 30-byte prototxt was a MemoryError under `ulimit -v` (the fuzz
    children's 6 GiB on NVIDIA's driver). Sizes at, under and over the cap."""
    asked = []
    real_fdopen = os.fdopen

    class Recording:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            asked.append(n)
            return self.f.read(n)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(proto_files.os, "fdopen", lambda *a, **k: Recording(real_fdopen(*a, **k)))
    path = tmp_path / "n.prototxt"
    path.write_bytes(b'name: "tiny"\n' * 3)
    assert proto_files.read_file_bytes(path) == b'name: "tiny"\n' * 3
    assert asked and max(asked) <= 40, asked
    assert proto_files.read_file_bytes(path, max_bytes=39) == b'name: "tiny"\n' * 3
    with pytest.raises(ParseError, match="larger than 38 bytes"):
        proto_files.read_file_bytes(path, max_bytes=38)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 9000)       # 2.2 MiB: several 1 MiB pieces past a cap
    assert proto_files.read_file_bytes(big) == bytes(range(256)) * 9000
    with pytest.raises(ParseError, match="larger than"):
        proto_files.read_file_bytes(big, max_bytes=1 << 20)
