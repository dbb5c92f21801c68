"""`caffe_ocl data` and the shipped example solvers: the databases land
where the shipped nets read them, snapshots go under the folder it makes."""
import logging
import os

import pytest

from caffe_ocl import commands
from caffe_ocl.commands import data as data_cmd
from caffe_ocl.data import examples as ex
from caffe_ocl.proto import caffe_pb2, read_net_prototxt, read_solver_prototxt
from conftest import ROOT

SOLVERS = {"mnist": ROOT / "models" / "lenet" / "lenet_solver.prototxt",
           "cifar10": ROOT / "models" / "cifar10_quick" / "cifar10_quick_solver.prototxt"}


@pytest.mark.parametrize("what", sorted(SOLVERS))
def test_shipped_solvers_read_what_data_writes(what):
    sp = read_solver_prototxt(str(SOLVERS[what]))
    out = ex.MNIST_DIR if what == "mnist" else ex.CIFAR10_DIR
    # snapshots under the folder `caffe_ocl data` creates, not the clone root
    assert os.path.dirname(sp.snapshot_prefix) == out
    # the device is caffe_ocl's choice (no `Using GPUs 0` on a CPU-only machine)
    assert not sp.HasField("solver_mode")
    assert (ROOT / sp.net).is_file()
    net = read_net_prototxt(str(ROOT / sp.net))
    sources = {lp.include[0].phase: lp.data_param.source for lp in net.layer
               if lp.type == "Data"}
    means = {lp.transform_param.mean_file for lp in net.layer if lp.type == "Data"}
    if what == "mnist":
        want = [os.path.join(out, "mnist_train_lmdb"), os.path.join(out, "mnist_test_lmdb")]
        assert means == {""}
    else:
        want = [os.path.join(out, "cifar10_train_lmdb"), os.path.join(out, "cifar10_test_lmdb")]
        assert means == {os.path.join(out, "mean.binaryproto")}
    assert [sources[caffe_pb2.TRAIN], sources[caffe_pb2.TEST]] == want


def test_help_and_bad_arguments(capsys):
    assert commands.main(["data", "-h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: caffe_ocl data [flags] DATASET")
    assert "caffe_ocl data mnist" in out and ex.CIFAR10_URL in out
    for what, flags in (("mnist", ["--out"]), ("cifar10", ["--source", "--out"])):
        assert commands.main(["data", what, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: caffe_ocl data {what} [flags]\n"), out[:80]
        assert all(f in out for f in flags) and "example:" in out
        assert ("--source" in out) == (what == "cifar10")
    for argv, msg in [([], "expects DATASET; got 0 argument(s)"),
                      (["imagenet"], "unknown dataset 'imagenet' (mnist or cifar10"),
                      (["mnsit"], "unknown dataset 'mnsit'; did you mean mnist?"),
                      (["mnist", "extra"], "got 1 argument(s): 'extra'"),
                      (["mnist", "--source", "x"], "unknown flag '--source'"),
                      (["--source", "x", "mnist"], "--source is not a flag of caffe_ocl data "
                                                   "mnist"),
                      (["cifar10", "--ouy", "d"], "did you mean --out?")]:
        assert commands.main(["data", *argv]) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("caffe_ocl data: error: ") and msg in err, (argv, err)
        assert err.count("\n") == 1, err


def test_flags_before_the_dataset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert commands.main(["data", "--out", "digits", "mnist"]) == 0
    assert "digits/mnist_train_lmdb" in capsys.readouterr().out
    assert (tmp_path / "digits" / "mnist_test_lmdb" / "data.mdb").is_file()


def test_mnist_into_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert data_cmd.main(["mnist"]) == 0
    assert "examples/mnist/mnist_train_lmdb" in capsys.readouterr().out
    assert (tmp_path / "examples" / "mnist" / "mnist_test_lmdb" / "data.mdb").is_file()


def test_cifar10_without_source_says_where_to_get_it(tmp_path, monkeypatch):
    from caffe_ocl.errors import DataError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="cifar-10-binary.tar.gz"):
        data_cmd.main(["cifar10"])
    with pytest.raises(DataError, match="CIFAR-10 source nowhere.tar.gz: not found"):
        data_cmd.main(["cifar10", "--source", "nowhere.tar.gz"])
    assert not (tmp_path / "examples").exists()


def test_gpu_request_without_a_gpu_says_cpu(caplog, monkeypatch):
    from caffe_ocl import device as D
    from caffe_ocl.training import select_device
    # the process's device choice stays as it is for the tests after this one
    monkeypatch.setattr(D, "set_mode_gpu", lambda: None)
    monkeypatch.setattr(D, "set_device", lambda index: None)
    devices = D.list_devices()
    if any(d["is_gpu"] for d in devices):
        pytest.skip(f"this machine has an OpenCL GPU: {[(d['name'], d['type']) for d in devices]}")
    sp = caffe_pb2.SolverParameter()
    sp.solver_mode = caffe_pb2.SolverParameter.GPU
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        select_device("", sp)
    assert "Using GPUs" not in caplog.text
    assert "No OpenCL GPU: solver_mode: GPU asks for GPU 0; using the CPU device" in caplog.text
