"""`caffe_ocl train` / `caffe_ocl test`: flag spellings, log lines, weights,
resume, signals."""
import os
import re
import signal

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import commands as cli
from caffe_ocl import training
from caffe_ocl.training import SignalHandler

NET = """
name: "cli"
layer { name: "data" type: "DummyData" top: "x"
  dummy_data_param { shape { dim: 2 dim: 3 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "t" type: "TanH" bottom: "z" top: "t" loss_weight: 1 }
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\n'
        'display: 1\nmax_iter: 2\nrandom_seed: 1\nsnapshot_prefix: "out"\n'
        'test_iter: 2\ntest_interval: 2\n')
    return tmp_path


@pytest.mark.parametrize("argv", [["-solver", "solver.prototxt"],
                                  ["--solver", "solver.prototxt"],
                                  ["--solver=solver.prototxt"],
                                  ["-solver=solver.prototxt", "--gpu=all"]])
def test_train_flag_spellings(files, argv, capsys):
    assert cli.main(["train"] + argv) == 0
    err = capsys.readouterr().err
    assert os.path.exists("out_iter_2.caffemodel") and os.path.exists("out_iter_2.solverstate")
    for pat in [r"\] Iteration 0 \([0-9.e+-]+ iter/s, [0-9.e+-]+s/1 iters\), loss = ",
                r"\] Iteration 0, lr = 0.01\n", r"\]     Train net output #0: t = \S+ \(\* 1 = ",
                r"\] Iteration 2, Testing net \(#0\)\n", r"\]     Test net output #0: t = ",
                r"\] Snapshotting to binary proto file out_iter_2.caffemodel\n",
                r"\] Optimization Done.\n"]:
        assert re.search(pat, err), pat
    if "--gpu=all" in argv:
        assert "multi-device training is not yet supported" in err
    os.remove("out_iter_2.caffemodel")


def test_weights_snapshot_and_errors(files, capsys):
    s = training.train("solver.prototxt", progress=False)
    w = s.net.params["ip"][0].data.copy()
    s.net.save("a.caffemodel")
    # comma-separated weights: the last file wins for a layer present in both
    s.net.params["ip"][0].data[...] = 3.0
    s.net.save("b.caffemodel")
    f = training.train("solver.prototxt", weights="a.caffemodel, b.caffemodel",
                        progress=False)
    assert not np.allclose(f.net.params["ip"][0].data, w)
    capsys.readouterr()
    assert cli.main(["train", "--solver=solver.prototxt", "--weights=a.caffemodel",
                     "--snapshot=out_iter_2.solverstate"]) == 1
    assert "but not both" in capsys.readouterr().err
    assert cli.main(["train"]) == 1
    assert "Need a solver definition" in capsys.readouterr().err
    assert cli.main(["train", "--solver=solver.prototxt", "--bogus=1"]) == 1
    assert cli.main(["train", "--solver=solver.prototxt", "--sigint_effect=explode"]) == 1
    assert 'Invalid signal effect "explode"' in capsys.readouterr().err
    # resume
    (files / "solver.prototxt").write_text(
        (files / "solver.prototxt").read_text().replace("max_iter: 2", "max_iter: 3"))
    assert cli.main(["train", "-solver", "solver.prototxt", "-snapshot",
                     "out_iter_2.solverstate"]) == 0
    err = capsys.readouterr().err
    assert "Resuming from out_iter_2.solverstate" in err
    assert "Iteration 2 (" in err and "Iteration 0 (" not in err


def test_test_command(files, capsys):
    s = training.train("solver.prototxt", progress=False)
    s.net.save("w.caffemodel")
    capsys.readouterr()
    assert cli.main(["test", "--model", "net.prototxt", "-weights=w.caffemodel",
                     "--iterations=3"]) == 0
    err = capsys.readouterr().err
    assert "Running for 3 iterations." in err
    assert len(re.findall(r"\] Batch \d, t = \S+\n", err)) == 3 * 4
    assert re.search(r"\] Loss: \S+\n", err)
    assert re.search(r"\] t = \S+ \(\* 1 = \S+ loss\)\n", err)
    assert cli.main(["test", "--model", "net.prototxt"]) == 1
    assert "Need model weights" in capsys.readouterr().err


@pytest.fixture
def sigint_default():
    """SIGINT's Python default for the test, whatever the suite was started
    with (nohup or a background `&` start it ignored), restored after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("effect,stopped", [("stop", True), ("snapshot", False),
                                            ("none", False)])
def test_sigint_effects(files, effect, stopped, caplog, sigint_default):
    (files / "solver.prototxt").write_text(
        (files / "solver.prototxt").read_text().replace("max_iter: 2", "max_iter: 4"))
    solver = caffe.get_solver("solver.prototxt")
    with SignalHandler(sigint_effect=effect) as h:
        solver.set_action_function(h.action)
        solver.add_callback(lambda: os.kill(os.getpid(), signal.SIGINT)
                            if solver.iter == 1 else None, lambda: None)
        with caplog.at_level("INFO", logger="caffe_ocl"):
            solver.solve()
    msgs = [r.getMessage() for r in caplog.records]
    assert solver.iter == (2 if stopped else 4)
    assert ("Optimization stopped early." in msgs) == stopped
    snaps = [m for m in msgs if m.startswith("Snapshotting to binary proto file")]
    if effect == "snapshot":
        assert "Snapshotting to binary proto file out_iter_2.caffemodel" in snaps
    assert snaps[-1] == f"Snapshotting to binary proto file out_iter_{solver.iter}.caffemodel"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_signal_handler_restores_an_ignored_sigint():
    """Started with SIGINT ignored (nohup, `&`), training still reacts to
    SIGINT while it runs and leaves it ignored afterwards."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with SignalHandler(sigint_effect="stop") as h:
            os.kill(os.getpid(), signal.SIGINT)
            assert h.action() == "stop"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)

