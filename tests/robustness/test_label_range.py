"""Out-of-range labels (issue #25): a label outside [0, C) that is not the
ignore_label stops with one LabelError naming the layer, the label, the
valid range and the iteration or batch -- through pycaffe's forward, the
solver (pycaffe and `caffe_ocl train`) and `caffe_ocl test`. Before, the
loss and then the weights became NaN and training exited 0."""
import os
import subprocess
import sys

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.errors import LabelError
from caffe_ocl.proto import parse_net_text, parse_solver_text
from conftest import child_env

N, D, C = 4, 5, 3

INPUTS = f"""
layer {{ name: "data" type: "Input" top: "data" top: "label"
        input_param {{ shape {{ dim: {N} dim: {D} }} shape {{ dim: {N} }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: {C} weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
"""

LAYERS = {
    "SoftmaxWithLoss": 'layer { name: "l" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" '
                       'top: "out" }',
    "Accuracy": 'layer { name: "l" type: "Accuracy" bottom: "ip" bottom: "label" top: "out" }',
    "HingeLoss": 'layer { name: "l" type: "HingeLoss" bottom: "ip" bottom: "label" top: "out" }',
    "MultinomialLogisticLoss": 'layer { name: "p" type: "Softmax" bottom: "ip" top: "p" } '
                               'layer { name: "l" type: "MultinomialLogisticLoss" bottom: "p" '
                               'bottom: "label" top: "out" }',
    "InfogainLoss": f'layer {{ name: "h" type: "Input" top: "H" input_param {{ shape {{ '
                    f'dim: {C} dim: {C} }} }} }} '
                    'layer { name: "l" type: "InfogainLoss" bottom: "ip" bottom: "label" '
                    'bottom: "H" top: "out" }',
}


def make_net(tmp_path, body, phase=caffe.TRAIN):
    path = tmp_path / "net.prototxt"
    path.write_text(INPUTS + body)
    return caffe.Net(str(path), phase)


def fwd(net, lab):
    extra = {"H": np.eye(C, dtype=np.float32)} if "H" in net.inputs else {}
    return net.forward(data=X, label=lab, **extra)["out"]


def labels(bad):
    return np.array([0, bad, 2, 1], np.float32)


X = np.random.RandomState(0).rand(N, D).astype(np.float32)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_forward_raises_for_label_c_and_minus_one(tmp_path, kind):
    net = make_net(tmp_path, LAYERS[kind])
    good = fwd(net, labels(1))
    assert np.isfinite(good).all()
    for bad in (C, -1, 1e9):
        with pytest.raises(LabelError) as e:
            fwd(net, labels(bad))
        msg = str(e.value)
        assert f"layer 'l' ({kind}): label {bad:g} of bottom 'label' is out of range [0, 3)" \
            in msg, msg
        assert "item 1 of the batch" in msg and "(the last)" in msg, msg
        assert "the labels come from layer 'data' (Input)" in msg, msg
        assert "\n" not in msg
        # the record is cleared once reported: a good batch runs again
        again = fwd(net, labels(1))
        np.testing.assert_allclose(again, good, rtol=1e-6)


def test_ignore_label_is_not_out_of_range(tmp_path):
    body = LAYERS["SoftmaxWithLoss"].replace('top: "out"', 'top: "out" '
                                             'loss_param { ignore_label: -1 }')
    net = make_net(tmp_path, body)
    assert np.isfinite(net.forward(data=X, label=labels(-1))["out"])
    assert np.isfinite(net.forward(data=X, label=labels(2.7))["out"])    # truncates to 2
    with pytest.raises(LabelError, match=r"label 3 .* out of range \[0, 3\) and is not the "
                                         r"ignore_label -1"):
        net.forward(data=X, label=labels(3))


def test_spatial_labels_name_item_and_position(tmp_path):
    body = f"""
    layer {{ name: "x" type: "Input" top: "x" top: "lab"
            input_param {{ shape {{ dim: 2 dim: {C} dim: 2 dim: 3 }} shape {{ dim: 2 dim: 2 dim: 3 }} }} }}
    layer {{ name: "l" type: "SoftmaxWithLoss" bottom: "x" bottom: "lab" top: "out" }}"""
    path = tmp_path / "n.prototxt"
    path.write_text(body)
    net = caffe.Net(str(path), caffe.TRAIN)
    lab = np.zeros((2, 2, 3), np.float32)
    lab[1, 1, 2] = 7
    with pytest.raises(LabelError, match=r"label 7 .*item 1, position 5 of the batch"):
        net.forward(x=np.zeros((2, C, 2, 3), np.float32), lab=lab)


def _solver(tmp_path, display):
    net = parse_net_text(INPUTS + LAYERS["SoftmaxWithLoss"])
    p = parse_solver_text(f'type: "SGD" base_lr: 0.1 lr_policy: "fixed" max_iter: 20 '
                          f'display: {display}')
    p.snapshot_prefix = str(tmp_path / "snap")
    p.net_param.CopyFrom(net)
    s = caffe.get_solver(p)
    s.net.blobs["data"].data[...] = X
    return s


def test_solver_stops_naming_the_iteration(tmp_path):
    s = _solver(tmp_path, display=2)
    s.net.blobs["label"].data[...] = labels(1)
    s.step(3)                               # iterations 0-2, displays at 0 and 2
    s.net.blobs["label"].data[...] = labels(C)
    s.step(1)                               # iteration 3: no display, nothing read yet
    s.net.blobs["label"].data[...] = labels(1)
    with pytest.raises(LabelError, match=r"layer 'l' \(SoftmaxWithLoss\): label 3 .*found at "
                                         r"iteration 3, item 1 of the batch"):
        s.step(1)                           # the display at iteration 4 reads the record


def test_solver_without_display_stops_at_the_snapshot(tmp_path):
    s = _solver(tmp_path, display=0)
    s.net.blobs["label"].data[...] = labels(-1)
    s.step(2)
    with pytest.raises(LabelError, match=r"label -1 .*found at iteration 0"):
        s.snapshot()
    assert not list(tmp_path.glob("snap_iter_*"))


def test_solve_without_display_or_final_snapshot_stops_at_its_end(tmp_path):
    s = _solver(tmp_path, display=0)
    s.param.max_iter = 3
    s.param.snapshot_after_train = False
    s.net.blobs["label"].data[...] = labels(C)
    with pytest.raises(LabelError, match=r"label 3 .*found at iteration 0"):
        s.solve()


# ---- the commands ---------------------------------------------------------------

DUMMY = f"""
name: "dummy"
layer {{ name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param {{ shape {{ dim: {N} dim: {D} }} shape {{ dim: {N} }}
                           data_filler {{ type: "gaussian" }}
                           data_filler {{ type: "constant" value: LABEL }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: {C} weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
layer {{ name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
        include {{ phase: TEST }} }}
"""


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "caffe_ocl", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=child_env())


def one_error_line(p):
    assert p.returncode == 1, p.stderr[-1500:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return p.stderr.strip().splitlines()[-1]


def test_cli_train_and_test_exit_1_with_one_line(tmp_path):
    (tmp_path / "net.prototxt").write_text(DUMMY.replace("LABEL", str(C)))
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" type: "SGD" base_lr: 0.1 lr_policy: "fixed" max_iter: 5 '
        'display: 0 snapshot_prefix: "snap"')
    last = one_error_line(run_cli("train", "--solver", "solver.prototxt", cwd=tmp_path))
    assert last.startswith("caffe_ocl train: error: layer 'loss' (SoftmaxWithLoss): label 3 "
                           "of bottom 'label' is out of range [0, 3)"), last
    assert "found at iteration 0" in last and "layer 'data' (DummyData)" in last, last
    assert not list(tmp_path.glob("snap_iter_*"))      # no NaN snapshot after training

    (tmp_path / "good.prototxt").write_text(DUMMY.replace("LABEL", "1"))
    net = caffe.Net(str(tmp_path / "good.prototxt"), caffe.TEST)
    net.save(str(tmp_path / "w.caffemodel"))
    (tmp_path / "bad.prototxt").write_text(DUMMY.replace("LABEL", "-1"))
    last = one_error_line(run_cli("test", "--model", "bad.prototxt", "--weights",
                                  "w.caffemodel", "--iterations", "3", cwd=tmp_path))
    assert "caffe_ocl test: error: layer 'loss' (SoftmaxWithLoss): label -1 " in last, last
    assert "found at batch 0" in last, last


def test_cli_test_names_the_database_record(tmp_path):
    from caffe_ocl.data.datum import array_to_datum
    from caffe_ocl.data.db import LMDBWriter
    rs = np.random.RandomState(0)
    labels_ = [0, 1, 2, 1, 0, 1, 7, 2]              # record 6: batch 1, item 2
    with LMDBWriter(str(tmp_path / "db")) as w:
        for i, lab in enumerate(labels_):
            img = rs.randint(0, 255, (1, 2, 3)).astype(np.uint8)
            w.put(f"{i:08d}_rec", array_to_datum(img, lab).SerializeToString())
    (tmp_path / "net.prototxt").write_text(f"""
layer {{ name: "d" type: "Data" top: "data" top: "label"
        data_param {{ source: "db" batch_size: 4 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: {C} weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        caffe.Net("net.prototxt", caffe.TEST).save("w.caffemodel")
    finally:
        os.chdir(cwd)
    last = one_error_line(run_cli("test", "--model", "net.prototxt", "--weights",
                                  "w.caffemodel", "--iterations", "2", cwd=tmp_path))
    assert "label 7 of bottom 'label' is out of range [0, 3)" in last, last
    assert "found at batch 1, item 2 of the batch" in last, last
    assert ("the labels come from layer 'd' (Data), source 'db'; that example is database "
            "db key '00000006_rec'") in last, last
