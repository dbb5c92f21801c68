"""Comma-separated --weights A,B (Caffe's LoadNetWeights): both files are
loaded in order, B's layers overriding A's and adding the ones A lacks --
for the library call, `caffe_ocl test` and `caffe_ocl train` (issue #25: a
loader that read only the first file passed every test)."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import commands as cli
from caffe_ocl import training
from caffe_ocl.proto import write_binary
from caffe_ocl.solvers.solver import load_net_weights

NET = """
layer { name: "x" type: "DummyData" top: "x"
  dummy_data_param { shape { dim: 1 dim: 2 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "a"
  inner_product_param { num_output: 2 } }
layer { name: "ip2" type: "InnerProduct" bottom: "a" top: "b"
  inner_product_param { num_output: 2 } }
layer { name: "ip3" type: "InnerProduct" bottom: "b" top: "c"
  inner_product_param { num_output: 1 } }
layer { name: "loss" type: "Power" bottom: "c" top: "loss" loss_weight: 1 }
"""

# file A: ip1 and ip2; file B: ip2 (overrides A's) and ip3 (A has none)
VALUES = {"A": {"ip1": 1.0, "ip2": 2.0}, "B": {"ip2": 3.0, "ip3": 4.0}}
WANT = {"ip1": 1.0, "ip2": 3.0, "ip3": 4.0}


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    net = caffe.Net("net.prototxt", caffe.TEST)
    for fname, vals in VALUES.items():
        for name, v in vals.items():
            for b in net.params[name]:
                b.data[...] = v
        proto = net.to_proto()
        keep = [lp for lp in proto.layer if lp.name in vals]
        del proto.layer[:]
        proto.layer.extend(keep)
        write_binary(proto, f"{fname}.caffemodel")
    return tmp_path


def check(net):
    for name, v in WANT.items():
        for b in net.params[name]:
            np.testing.assert_array_equal(b.data, np.full(b.data.shape, v, np.float32),
                                          err_msg=name)


def test_load_net_weights_loads_both(files):
    net = caffe.Net("net.prototxt", caffe.TEST)
    load_net_weights(net, "A.caffemodel,B.caffemodel")
    check(net)


def test_test_command_loads_both(files, capsys):
    # c = w3 . (w2 . (w1 . x + b1) + b2) + b3 with every weight and bias v:
    # A,B -> a = 1*2+1 = 3, b = 3*(3+3)+3 = 21, c = 4*(21+21)+4 = 172
    assert cli.main(["test", "--model", "net.prototxt", "--weights",
                     "A.caffemodel,B.caffemodel", "--iterations", "1"]) == 0
    err = capsys.readouterr().err
    assert "Finetuning from A.caffemodel" in err and "Finetuning from B.caffemodel" in err
    assert "] loss = 172" in err, err[-1500:]


def test_train_loads_both(files):
    (files / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0 lr_policy: "fixed" max_iter: 1 '
        'snapshot_after_train: false snapshot_prefix: "snap"\n')
    s = training.train("solver.prototxt", weights="A.caffemodel,B.caffemodel",
                       progress=False)
    check(s.net)
