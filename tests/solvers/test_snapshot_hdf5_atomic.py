"""HDF5 snapshots go through a temporary file (issue #25): a write that
fails half way never leaves a file under the final name and never touches
an earlier snapshot of that name."""
import errno
import glob
import os

import h5py
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.errors import SolverError
from caffe_ocl.proto import parse_net_text, parse_solver_text

NET = """
layer { name: "data" type: "DummyData" top: "x" top: "t"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 }
                     data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "t" top: "loss" }
"""


@pytest.fixture
def solver(tmp_path):
    p = parse_solver_text(f'type: "SGD" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" '
                          f'random_seed: 3 snapshot_format: HDF5 '
                          f'snapshot_prefix: "{tmp_path}/snap"')
    p.net_param.CopyFrom(parse_net_text(NET))
    s = caffe.get_solver(p)
    s.step(1)
    return s


def contents(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda k, v: out.__setitem__(k, np.array(v)) if isinstance(v, h5py.Dataset)
                     else None)
    return out


def failing_create_dataset(monkeypatch, when):
    orig = h5py.Group.create_dataset

    def create(self, name, *a, **kw):
        ds = orig(self, name, *a, **kw)      # something is written, then the disk is full
        if when(str(name)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return ds
    monkeypatch.setattr(h5py.Group, "create_dataset", create)


@pytest.mark.parametrize("which,when", [
    ("model", lambda name: name.startswith("data/")),
    ("state", lambda name: name.startswith("history/")),
])
def test_failed_write_keeps_the_earlier_snapshot(solver, tmp_path, monkeypatch, which, when):
    state = solver.snapshot()
    model = f"{tmp_path}/snap_iter_1.caffemodel.h5"
    assert state == f"{tmp_path}/snap_iter_1.solverstate.h5"
    before = {p: contents(p) for p in (model, state)}
    with open(model, "rb") as f:
        model_bytes = f.read()
    with open(state, "rb") as f:
        state_bytes = f.read()
    solver.net.learnable_params[0].data[...] += 1.0     # the next snapshot would differ
    failing_create_dataset(monkeypatch, when)
    with pytest.raises(SolverError, match="No space left"):
        solver.snapshot()                               # the same names: iter 1 again
    monkeypatch.undo()
    if which == "model":       # failed before the model was renamed: untouched
        with open(model, "rb") as f:
            assert f.read() == model_bytes
    with open(state, "rb") as f:
        assert f.read() == state_bytes
    for p, c in before.items():
        got = contents(p)
        if p == model and which == "state":
            continue       # the model was complete and renamed before the state failed
        assert got.keys() == c.keys()
        for k in c:
            np.testing.assert_array_equal(got[k], c[k])
    assert not glob.glob(f"{tmp_path}/*.tmp-*")         # the temporary file is gone


def test_failed_first_write_leaves_no_final_file(solver, tmp_path, monkeypatch):
    failing_create_dataset(monkeypatch, lambda name: True)
    with pytest.raises(SolverError):
        solver.snapshot()
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == []
