"""BVLC Caffe's tools as caffe_ocl commands, checked against the formats'
definitions (tools/extract_features.cpp, tools/upgrade_*.cpp,
examples/cifar10/convert_cifar_data.cpp,
examples/siamese/convert_mnist_siamese_data.cpp, tools/extra/parse_log.py)
on small inputs written here."""
import os
import struct

import numpy as np
import pytest

from caffe_ocl import commands
from caffe_ocl.data.db import LMDBReader, LMDBWriter
from caffe_ocl.data.siamese import caffe_rng_rand
from caffe_ocl.net import TEST, Net
from caffe_ocl.proto import caffe_pb2, parse_text, read_binary, read_net_binary
from caffe_ocl.proto.upgrade import net_needs_upgrade
from conftest import ROOT


def _records(path):
    with LMDBReader(str(path)) as r:
        out = []
        for k, v in r:
            d = caffe_pb2.Datum()
            d.ParseFromString(v)
            out.append((k.decode(), d))
        return out


# --------------------------------------------------------------------------
# extract_features

FEATURE_NET = """
name: "feat"
layer { name: "data" type: "Data" top: "data" top: "label"
  data_param { source: "in_lmdb" batch_size: 3 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 }
                        bias_filler { type: "constant" value: 0.5 } } }
"""


def test_extract_features(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (6, 1, 2, 2), dtype=np.uint8)
    d = caffe_pb2.Datum()
    d.channels, d.height, d.width = 1, 2, 2
    with LMDBWriter("in_lmdb") as w:
        for i, im in enumerate(images):
            d.data, d.label = im.tobytes(), i
            w.put(f"{i:08d}", d.SerializeToString())
    (tmp_path / "feat.prototxt").write_text(FEATURE_NET)
    net = Net("feat.prototxt", TEST)
    net.save("w.caffemodel")
    W = net.params["ip"][0].data.astype(np.float64)
    b = net.params["ip"][1].data.astype(np.float64)
    del net
    assert commands.main(["extract_features", "w.caffemodel", "feat.prototxt", "ip,data",
                          "f_ip,f_data", "2", "lmdb"]) == 0
    assert "Successfully extracted the features!" in capsys.readouterr().err
    x = images.reshape(6, 4).astype(np.float64)
    ip = _records(tmp_path / "f_ip")
    data = _records(tmp_path / "f_data")
    assert [k for k, _ in ip] == [f"{i:010d}" for i in range(6)] == [k for k, _ in data]
    for i, (_, dm) in enumerate(ip):
        assert (dm.channels, dm.height, dm.width) == (2, 1, 1)
        assert not dm.data and not dm.HasField("label")
        np.testing.assert_allclose(dm.float_data, W @ x[i] + b, rtol=1e-5, atol=1e-5)
    for i, (_, dm) in enumerate(data):
        assert (dm.channels, dm.height, dm.width) == (1, 2, 2)
        np.testing.assert_array_equal(dm.float_data, x[i])
    # an unknown blob is an error before any database is written
    assert commands.main(["extract_features", "w.caffemodel", "feat.prototxt", "fc7",
                          "f_fc7", "1"]) == 1
    assert "Unknown feature blob name fc7 in the network feat.prototxt" in \
        capsys.readouterr().err
    assert not (tmp_path / "f_fc7").exists()


@pytest.mark.parametrize("argv, msg", [
    (["99999999999999999999"], "num_mini_batches expects an integer in [0, 2147483647], "
                               "got '99999999999999999999'"),
    (["2147483648"], "num_mini_batches expects an integer in [0, 2147483647]"),
    (["-1"], "num_mini_batches expects an integer in [0, 2147483647], got '-1'"),
    (["1", "lmdb", "GPU", "99999999999999999999"],
     "DEVICE_ID expects an integer in [-2147483648, 2147483647]"),
])
def test_extract_features_numbers_are_int32(tmp_path, monkeypatch, capsys, argv, msg):
    """As test/time's --iterations: 10^20 mini-batches was accepted and ran
    for ever; refused in one line before the net is built."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.caffemodel").write_bytes(b"")
    (tmp_path / "feat.prototxt").write_text(FEATURE_NET)
    from caffe_ocl.commands import extract_features as cmd
    monkeypatch.setattr(cmd, "Net", lambda *a, **k: pytest.fail("net built"))
    assert commands.main(["extract_features", "w.caffemodel", "feat.prototxt", "ip", "f_ip",
                          *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"caffe_ocl extract_features: error: {msg}" or \
        (msg in err and "\n" not in err), err
    assert not (tmp_path / "f_ip").exists()


# --------------------------------------------------------------------------
# upgrade_net_proto_text / binary, upgrade_solver_proto_text

V1_NET = """
name: "v1"
input: "data"
input_dim: 1 input_dim: 1 input_dim: 5 input_dim: 5
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         blobs_lr: 1 blobs_lr: 2 convolution_param { num_output: 2 kernel_size: 3 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
"""


def test_upgrade_net_proto_text(tmp_path, capsys):
    src, dst = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    src.write_text(V1_NET)
    assert commands.main(["upgrade_net_proto_text", str(src), str(dst)]) == 0
    assert f"Wrote upgraded NetParameter text proto to {dst}" in capsys.readouterr().err
    net = parse_text(dst.read_text(), caffe_pb2.NetParameter())    # read as written
    assert len(net.layers) == 0 and not net.input and not net.input_dim
    assert [(lp.name, lp.type) for lp in net.layer] == [
        ("input", "Input"), ("conv", "Convolution"), ("relu", "ReLU")]
    assert list(net.layer[0].input_param.shape[0].dim) == [1, 1, 5, 5]
    assert [p.lr_mult for p in net.layer[1].param] == [1, 2]
    assert not net_needs_upgrade(net)
    # a current file is written unchanged
    again = tmp_path / "again.prototxt"
    assert commands.main(["upgrade_net_proto_text", str(dst), str(again)]) == 0
    assert "File already in latest proto format" in capsys.readouterr().err
    assert again.read_text() == dst.read_text()


def test_upgrade_net_proto_binary_on_the_shipped_v1_caffemodel(tmp_path, capsys):
    src = ROOT / "models" / "cifar10_quick" / "cifar10_quick_iter_5000.caffemodel"
    raw = read_binary(str(src), caffe_pb2.NetParameter())
    assert len(raw.layers) > 0 and len(raw.layer) == 0           # V1 as shipped
    dst = tmp_path / "v2.caffemodel"
    assert commands.main(["upgrade_net_proto_binary", str(src), str(dst)]) == 0
    assert "Wrote upgraded NetParameter binary proto to" in capsys.readouterr().err
    out = read_binary(str(dst), caffe_pb2.NetParameter())
    assert len(out.layers) == 0 and len(out.layer) == len(raw.layers)
    assert [lp.name for lp in out.layer] == [lp.name for lp in raw.layers]
    assert "Convolution" in [lp.type for lp in out.layer]
    for new, old in zip(out.layer, raw.layers):
        assert len(new.blobs) == len(old.blobs)
        for bn, bo in zip(new.blobs, old.blobs):
            np.testing.assert_array_equal(bn.data, bo.data)
            assert int(np.prod(bn.shape.dim)) == len(bo.data)
    assert out == read_net_binary(str(src))        # what every command reads


def test_upgrade_solver_proto_text(tmp_path, capsys):
    src, dst = tmp_path / "old_solver.prototxt", tmp_path / "solver.prototxt"
    src.write_text('net: "x.prototxt"\nbase_lr: 0.1\nsolver_type: NESTEROV\nmomentum: 0.9\n')
    assert commands.main(["upgrade_solver_proto_text", str(src), str(dst)]) == 0
    assert "Wrote upgraded SolverParameter text proto to" in capsys.readouterr().err
    s = parse_text(dst.read_text(), caffe_pb2.SolverParameter())
    assert s.type == "Nesterov" and not s.HasField("solver_type")
    assert (s.net, s.base_lr, s.momentum) == ("x.prototxt", pytest.approx(0.1),
                                             pytest.approx(0.9))


# --------------------------------------------------------------------------
# convert_cifar_data

def test_convert_cifar_data(tmp_path, capsys):
    rng = np.random.default_rng(0)
    src = tmp_path / "cifar-10-batches-bin"
    src.mkdir()
    recs = {}
    for name, n in [(f"data_batch_{i}.bin", 2) for i in range(1, 6)] + [("test_batch.bin", 3)]:
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        (src / name).write_bytes(b"".join(bytes([lab]) + p.tobytes()
                                          for lab, p in zip(labels, pixels)))
        recs[name] = list(zip(labels, pixels))
    out = tmp_path / "out"
    out.mkdir()
    assert commands.main(["convert_cifar_data", str(src), str(out), "lmdb"]) == 0
    err = capsys.readouterr().err
    assert "Writing Training data" in err and "Training Batch 5" in err
    train = _records(out / "cifar10_train_lmdb")
    expect = [r for i in range(1, 6) for r in recs[f"data_batch_{i}.bin"]]
    assert [k for k, _ in train] == [f"{i:05d}" for i in range(10)]
    for (_, d), (label, pixels) in zip(train, expect):
        assert (d.channels, d.height, d.width, d.label) == (3, 32, 32, label)
        assert d.data == pixels.tobytes() and not d.encoded
    test = _records(out / "cifar10_test_lmdb")
    assert [k for k, _ in test] == ["00000", "00001", "00002"]
    assert [d.label for _, d in test] == [r[0] for r in recs["test_batch.bin"]]
    # a truncated file is an error naming it; nothing is written
    (src / "test_batch.bin").write_bytes(b"\0" * 3074)
    out2 = tmp_path / "out2"
    out2.mkdir()
    assert commands.main(["convert_cifar_data", str(src), str(out2)]) == 1
    assert "test_batch.bin: 3074 bytes is not a whole number" in capsys.readouterr().err
    os.remove(src / "data_batch_3.bin")
    assert commands.main(["convert_cifar_data", str(src), str(out2)]) == 1
    assert "data_batch_3.bin" in capsys.readouterr().err
    assert os.listdir(out2) == []


# --------------------------------------------------------------------------
# convert_mnist_siamese_data

def _mt19937(seed):
    """The MT19937 reference (Matsumoto & Nishimura), 32-bit outputs."""
    mt = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
    idx = 624
    while True:
        if idx >= 624:
            for i in range(624):
                y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
                mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            idx = 0
        y = mt[idx]
        idx += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        yield y


def test_caffe_rng_rand_is_mt19937():
    # the C++ standard's check: the 10000th output of mt19937(5489) is 4123659995
    assert int(caffe_rng_rand(5489, 10000)[-1]) == 4123659995
    ref = _mt19937(42)
    assert [int(v) for v in caffe_rng_rand(42, 5)] == [next(ref) for _ in range(5)]


def _write_idx(tmp_path, images, labels):
    ip, lp = tmp_path / "img.idx", tmp_path / "lab.idx"
    n, r, c = images.shape
    ip.write_bytes(struct.pack(">IIII", 2051, n, r, c) + images.tobytes())
    lp.write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
    return ip, lp


def test_convert_mnist_siamese_data(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (7, 3, 4), dtype=np.uint8)
    labels = np.array([1, 2, 1, 3, 2, 1, 1], np.uint8)
    ip, lp = _write_idx(tmp_path, images, labels)
    db = tmp_path / "pairs"
    assert commands.main(["convert_mnist_siamese_data", "--seed", "7", str(ip), str(lp),
                          str(db)]) == 0
    recs = _records(db)
    assert [k for k, _ in recs] == [f"{i:08d}" for i in range(7)]
    ref = _mt19937(7)
    for _, d in recs:
        i, j = next(ref) % 7, next(ref) % 7
        assert (d.channels, d.height, d.width) == (2, 3, 4)
        assert d.data == images[i].tobytes() + images[j].tobytes()
        assert d.label == int(labels[i] == labels[j])
    # the same seed, the same pairs; another seed, other pairs
    assert commands.main(["convert_mnist_siamese_data", "-seed=7", str(ip), str(lp),
                          str(tmp_path / "again")]) == 0
    assert [d.data for _, d in _records(tmp_path / "again")] == [d.data for _, d in recs]
    assert commands.main(["convert_mnist_siamese_data", "--seed=8", str(ip), str(lp),
                          str(tmp_path / "other")]) == 0
    assert [d.data for _, d in _records(tmp_path / "other")] != [d.data for _, d in recs]


# --------------------------------------------------------------------------
# parse_log

LOG = """\
I1201 09:59:59.000000  1234 caffe.cpp:217] Starting Optimization
I1201 10:00:00.000000  1234 solver.cpp:280] Solving LeNet
I1201 10:00:00.100000  1234 solver.cpp:281] Learning Rate Policy: inv
I1201 10:00:00.200000  1234 solver.cpp:338] Iteration 0, Testing net (#0)
I1201 10:00:01.500000  1234 solver.cpp:406]     Test net output #0: accuracy = 0.1
I1201 10:00:01.500000  1234 solver.cpp:406]     Test net output #1: loss = 2.3 (* 1 = 2.3 loss)
I1201 10:00:01.600000  1234 solver.cpp:229] Iteration 0, loss = 2.31
I1201 10:00:01.600000  1234 solver.cpp:245]     Train net output #0: loss = 2.31 (* 1 = 2.31 loss)
I1201 10:00:01.700000  1234 sgd_solver.cpp:106] Iteration 0, lr = 0.01
I1201 10:00:03.000000  1234 solver.cpp:229] Iteration 100, loss = 0.5
I1201 10:00:03.000000  1234 solver.cpp:245]     Train net output #0: loss = 0.5 (* 1 = 0.5 loss)
I1201 10:00:03.100000  1234 sgd_solver.cpp:106] Iteration 100, lr = 0.00992565

I1201 10:00:05.000000  1234 solver.cpp:338] Iteration 200, Testing net (#0)
I1201 10:00:06.000000  1234 solver.cpp:406]     Test net output #0: accuracy = 0.9
I1201 10:00:06.000000  1234 solver.cpp:406]     Test net output #1: loss = 0.3 (* 1 = 0.3 loss)
I1201 10:00:06.100000  1234 solver.cpp:229] Iteration 200, loss = 0.25
I1201 10:00:06.100000  1234 solver.cpp:245]     Train net output #0: loss = 0.25 (* 1 = 0.25 loss)
I1201 10:00:06.200000  1234 sgd_solver.cpp:106] Iteration 200, lr = 0.00985258
I1201 10:00:06.300000  1234 solver.cpp:464] Snapshotting to binary proto file lenet_iter_200
"""


def test_parse_log_writes_bvlc_csv_files(tmp_path, capsys):
    log = tmp_path / "caffe.INFO"
    log.write_text(LOG)
    out = tmp_path / "csv"
    out.mkdir()
    assert commands.main(["parse_log", str(log), str(out), "--verbose"]) == 0
    assert capsys.readouterr().out.split() == ["Wrote", str(out / "caffe.INFO.train"),
                                               "Wrote", str(out / "caffe.INFO.test")]
    # rows as parse_log.py builds them: a row opens at an output line and is
    # complete when it has the first row's columns; LearningRate is the last
    # "lr =" seen (the first row takes the second's); Seconds from "Solving"
    assert (out / "caffe.INFO.train").read_bytes() == (
        b"NumIters,Seconds,LearningRate,loss\r\n"
        b"0.0,1.6,0.01,2.31\r\n"
        b"100.0,3.0,0.01,0.5\r\n"
        b"200.0,6.1,0.00992565,0.25\r\n")
    assert (out / "caffe.INFO.test").read_bytes() == (
        b"NumIters,Seconds,LearningRate,accuracy,loss\r\n"
        b"0.0,1.5,0.00992565,0.1,2.3\r\n"
        b"200.0,6.0,0.00992565,0.9,0.3\r\n")
    assert commands.main(["parse_log", "--delimiter", ";", str(log), str(out)]) == 0
    assert (out / "caffe.INFO.test").read_text().splitlines()[1] == \
        "0.0;1.5;0.00992565;0.1;2.3"


def test_parse_log_year_wrap_and_errors(tmp_path, capsys):
    log = tmp_path / "wrap.log"
    log.write_text("I1231 23:59:59.000000  1 solver.cpp:280] Solving X\n"
                   "I1231 23:59:59.500000  1 solver.cpp:229] Iteration 0, loss = 1\n"
                   "I1231 23:59:59.500000  1 solver.cpp:245]     Train net output #0: "
                   "loss = 1\n"
                   "I0101 00:00:01.000000  1 solver.cpp:229] Iteration 10, loss = 0.5\n"
                   "I0101 00:00:01.000000  1 solver.cpp:245]     Train net output #0: "
                   "loss = 0.5\n")
    assert commands.main(["parse_log", str(log), str(tmp_path)]) == 0
    lines = (tmp_path / "wrap.log.train").read_text().splitlines()
    assert lines == ["NumIters,Seconds,LearningRate,loss", "0.0,0.5,nan,1.0",
                     "10.0,2.0,nan,0.5"]
    assert (tmp_path / "wrap.log.test").read_text().splitlines() == \
        ["NumIters,Seconds,LearningRate"]
    bad = tmp_path / "bad.log"
    bad.write_text("I1201 10:00:00.000000  1 x.cpp:1] Iteration 0, loss = 1\n")
    assert commands.main(["parse_log", str(bad), str(tmp_path)]) == 1
    assert "no 'Solving' line" in capsys.readouterr().err


def _glog(*lines, stamp="I1201 10:00:01.000000"):
    """A log from "Solving" on: each line "TEXT" or ("STAMP", "TEXT")."""
    out = ["I1201 10:00:00.000000  1 solver.cpp:280] Solving X"]
    for line in lines:
        s, text = line if isinstance(line, tuple) else (stamp, line)
        out.append(f"{s}  1 solver.cpp:1] {text}")
    return "\n".join(out) + "\n"


def _one_error_line(capsys, *words):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def test_parse_log_skips_values_that_are_not_numbers(tmp_path, capsys):
    # BVLC's [\.\deE+-]+ matched "e", "..." and "-+-", and float() failed;
    # such a value is skipped as a line that is not an output; nan and inf
    # (as C++ and Python print them) are numbers
    log = tmp_path / "odd.log"
    log.write_text(_glog("Iteration 0, lr = 1-5",
                         "    Train net output #0: loss = e",
                         "    Train net output #0: loss = ...",
                         "    Train net output #0: loss = -+-",
                         "    Train net output #0: loss = 1.5x",
                         "    Train net output #0: loss = 1_0",
                         "Iteration 0, lr = 0.01",
                         "    Train net output #0: loss = 2.5 (* 1 = 2.5 loss)",
                         "Iteration 10, lr = e",
                         "    Train net output #0: loss = -nan (* 1 = -nan loss)",
                         "Iteration 20",
                         "    Train net output #0: loss = inf\x00\x00",   # NULs end it
                         "Iteration 30",
                         "    Test net output #0: accuracy = .",
                         "    Test net output #1: loss = 0.5"))
    assert commands.main(["parse_log", str(log), str(tmp_path)]) == 0
    assert (tmp_path / "odd.log.train").read_text().splitlines() == [
        "NumIters,Seconds,LearningRate,loss", "0.0,1.0,0.01,2.5", "10.0,1.0,0.01,nan",
        "20.0,1.0,0.01,inf"]
    assert (tmp_path / "odd.log.test").read_text().splitlines() == [
        "NumIters,Seconds,LearningRate,loss", "30.0,1.0,0.01,0.5"]


def test_parse_log_rows_with_other_columns(tmp_path):
    # the first test row lacks "accuracy" (its value was not a number): the
    # CSV has every row's columns (csv.DictWriter failed on the extra one)
    log = tmp_path / "cols.log"
    log.write_text(_glog("Iteration 0",
                         "    Test net output #0: accuracy = x",
                         "    Test net output #1: loss = 2.3",
                         "Iteration 100",
                         "    Test net output #0: accuracy = 0.9",
                         "    Test net output #1: loss = 0.3"))
    assert commands.main(["parse_log", str(log), str(tmp_path)]) == 0
    lines = (tmp_path / "cols.log.test").read_text().splitlines()
    assert lines[0] == "NumIters,Seconds,LearningRate,loss,accuracy"
    assert lines[1:] == ["0.0,1.0,nan,2.3,", "100.0,1.0,nan,,0.9", "100.0,1.0,nan,0.3,"]


def test_parse_log_time_stamps_out_of_range(tmp_path, capsys):
    # an hour of 20 digits: datetime's OverflowError; on the "Solving" line an
    # error naming the file and line, elsewhere the line is skipped
    bad = tmp_path / "hour.log"
    bad.write_text("I1206 99999999999999999999:00:00.0  1 solver.cpp:1] Solving X\n"
                   "I1206 09:00:01.000000  1 solver.cpp:2] Iteration 1, loss = 1\n")
    assert commands.main(["parse_log", str(bad), str(tmp_path)]) == 1
    _one_error_line(capsys, "hour.log:1:", "'Solving' line has no glog time stamp")
    bad.write_text("I1301 10:00:00.000000  1 solver.cpp:1] Solving X\n")
    assert commands.main(["parse_log", str(bad), str(tmp_path)]) == 1
    _one_error_line(capsys, "hour.log:1:", "impossible glog time stamp")
    log = tmp_path / "skip.log"
    log.write_text(_glog("Iteration 0",
                         ("I1201 99999999999999999999:00:00.0", "  Train net output #0: loss = 9"),
                         ("I1201 " + "1" * 5000 + ":00:00.0", "  Train net output #0: loss = 8"),
                         ("I1201 25:00:00.000000", "  Train net output #0: loss = 7"),
                         ("I1201 10:00:02.0000001", "  Train net output #0: loss = 6"),
                         ("I1201 10:00:03.000000", "  Train net output #0: loss = 1")))
    assert commands.main(["parse_log", str(log), str(tmp_path)]) == 0
    assert (tmp_path / "skip.log.train").read_text().splitlines() == [
        "NumIters,Seconds,LearningRate,loss", "0.0,3.0,nan,1.0"]


def test_parse_log_year_wrap_past_9999(tmp_path, capsys):
    # months 12, 01, 12, 01, ...: a year at each wrap; past 9999 datetime
    # failed (ValueError: year 10000 is out of range) outside any check
    from caffe_ocl.data.parse_log import parse_log
    from caffe_ocl.errors import DataError
    log = tmp_path / "wrap.log"
    log.write_text(_glog("Iteration 1", ("I1201 10:00:01.000000", "Train net output #0: loss = 1"),
                         ("I0101 10:00:01.000000", "Train net output #0: loss = 2")))
    with pytest.raises(DataError, match=r"wrap\.log:4: .*year 9999"):
        parse_log(str(log), year=9999)
    lines = [("I1201 10:00:01.000000" if k % 2 == 0 else "I0101 10:00:01.000000",
              f"Iteration {k}, loss = 1") for k in range(17000)]
    log.write_text(_glog(*lines))
    assert commands.main(["parse_log", str(log), str(tmp_path)]) == 1
    _one_error_line(capsys, "wrap.log:", "after the year 9999")


def test_parse_log_leap_day_after_the_year_wraps(tmp_path):
    # 29 February after a December of 2023 is in 2024 (the line was checked
    # against 2023 first, and skipped)
    from caffe_ocl.data.parse_log import parse_log
    log = tmp_path / "leap.log"
    log.write_text(_glog("Iteration 0", ("I1231 00:00:00.000000", "Train net output #0: loss = 1"),
                         "Iteration 1",
                         ("I0229 00:00:00.000000", "Train net output #0: loss = 2")))
    train, _ = parse_log(str(log), year=2023)
    assert [r["loss"] for r in train] == [1.0, 2.0]
    assert train[1]["Seconds"] == 90 * 86400 - 36000.0
