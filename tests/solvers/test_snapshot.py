"""Snapshots: exact resume (weights, history, iter, lr step, device RNG),
atomic writes, and clear errors for snapshots of another net."""
import errno
import glob
import os

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.errors import SolverError
from caffe_ocl.ops import random as crandom
from caffe_ocl.proto import caffe_pb2, parse_net_text, parse_solver_text, read_binary

# random DummyData: every forward draws new numbers, so resuming is only
# exact when the device RNG state is restored too
NET = """
name: "rnd"
layer { name: "data" type: "DummyData" top: "x"
  dummy_data_param { shape { dim: 3 dim: 4 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
  inner_product_param { num_output: %d weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "t" type: "TanH" bottom: "z" top: "t" loss_weight: 1 }
"""


def solver_param(tmp_path, kind="Adam", outputs=2, extra=""):
    p = parse_solver_text(f'type: "{kind}" base_lr: 0.05 lr_policy: "step" gamma: 0.5 '
                          f'stepsize: 3 momentum: 0.9 random_seed: 7 max_iter: 8 '
                          f'snapshot_prefix: "{tmp_path}/snap" {extra}')
    p.net_param.CopyFrom(parse_net_text(NET % outputs))
    return p


def params_of(solver):
    return [b.data.copy() for b in solver.net.learnable_params]


def test_resume_is_exact(tmp_path):
    p = solver_param(tmp_path)
    straight = caffe.get_solver(p)
    straight.step(8)
    want = params_of(straight)
    want_hist = [h.data.copy() for h in straight.history]

    first = caffe.get_solver(p)
    first.step(4)
    state_path = first.snapshot()
    assert state_path == f"{tmp_path}/snap_iter_4.solverstate"
    assert os.path.exists(f"{tmp_path}/snap_iter_4.caffemodel")
    st = read_binary(state_path, caffe_pb2.SolverState())
    assert st.iter == 4 and st.current_step == 1 and len(st.history) == 2 * 2   # Adam: 2 per param (weight, bias)
    assert st.learned_net == f"{tmp_path}/snap_iter_4.caffemodel"
    saved_rng = crandom.get_state()

    resumed = caffe.get_solver(p)           # same seed: a fresh start...
    assert crandom.get_state() != saved_rng
    resumed.restore(state_path)             # ...then the snapshot
    assert crandom.get_state() == saved_rng
    assert resumed.iter == 4 and resumed.current_step == 1
    resumed.step(4)
    for a, b in zip(want, params_of(resumed)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(want_hist, resumed.history):
        np.testing.assert_array_equal(a, b.data)


def test_solve_resume_file_and_snapshot_schedule(tmp_path):
    p = solver_param(tmp_path, kind="SGD", extra="snapshot: 3")
    s = caffe.get_solver(p)
    s.solve()
    names = sorted(os.path.basename(f) for f in glob.glob(f"{tmp_path}/snap_iter_*"))
    assert names == ["snap_iter_3.caffemodel", "snap_iter_3.solverstate",
                     "snap_iter_6.caffemodel", "snap_iter_6.solverstate",
                     "snap_iter_8.caffemodel", "snap_iter_8.solverstate"]
    want = params_of(s)
    r = caffe.get_solver(p)
    r.solve(f"{tmp_path}/snap_iter_6.solverstate")
    assert r.iter == 8
    for a, b in zip(want, params_of(r)):
        np.testing.assert_array_equal(a, b)


def test_learned_net_found_next_to_state(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "a")
    monkeypatch.chdir(tmp_path / "a")
    p = solver_param(tmp_path, kind="SGD")
    p.snapshot_prefix = "rel"          # relative to the current directory, as Caffe
    s = caffe.get_solver(p)
    s.step(2)
    s.snapshot()
    monkeypatch.chdir(tmp_path)         # learned_net "rel_iter_2.caffemodel" is not here
    r = caffe.get_solver(p)
    r.restore(tmp_path / "a" / "rel_iter_2.solverstate")
    for a, b in zip(params_of(s), params_of(r)):
        np.testing.assert_array_equal(a, b)


def test_failed_write_keeps_existing_snapshot(tmp_path, monkeypatch):
    s = caffe.get_solver(solver_param(tmp_path, kind="SGD"))
    s.step(2)
    s.snapshot()
    model = f"{tmp_path}/snap_iter_2.caffemodel"
    state = f"{tmp_path}/snap_iter_2.solverstate"
    before = {f: open(f, "rb").read() for f in (model, state)}
    s.net.learnable_params[0].data[...] += 1.0     # a different snapshot would be written

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(SolverError, match=r"cannot write snapshot .*snap_iter_2.caffemodel: "
                                          r"No space left on device \(disk full\)"):
        s.snapshot()
    monkeypatch.undo()
    after = {f: open(f, "rb").read() for f in (model, state)}
    assert after == before
    assert not glob.glob(f"{tmp_path}/*.tmp-*")


def test_snapshot_from_other_net_is_rejected(tmp_path):
    s = caffe.get_solver(solver_param(tmp_path, kind="SGD", outputs=2))
    s.step(1)
    path = s.snapshot()
    other = caffe.get_solver(solver_param(tmp_path, kind="SGD", outputs=3))
    with pytest.raises(SolverError, match="different net"):
        other.restore(path)
    renamed = solver_param(tmp_path, kind="SGD")
    renamed.net_param.layer[1].name = "fc"
    with pytest.raises(SolverError, match="snapshot has no layer 'fc'"):
        caffe.get_solver(renamed).restore(path)
    adam = caffe.get_solver(solver_param(tmp_path, kind="Adam"))
    with pytest.raises(SolverError, match="incorrect length of history blobs"):
        adam.restore(path)
    with pytest.raises(caffe.FileNotFound):
        adam.restore(tmp_path / "nope.solverstate")


def test_hdf5_needs_h5py(tmp_path):
    try:
        import h5py  # noqa: F401
        pytest.skip("h5py is installed")
    except ImportError:
        pass
    s = caffe.get_solver(solver_param(tmp_path, kind="SGD", extra="snapshot_format: HDF5"))
    with pytest.raises(SolverError, match="h5py"):
        s.snapshot()


def test_unwritable_prefix(tmp_path):
    with pytest.raises(SolverError, match="Cannot write to snapshot prefix"):
        caffe.get_solver(solver_param(tmp_path / "missing_dir", kind="SGD",
                                      extra="snapshot: 2"))


def test_unwritable_example_prefix_says_how_to_make_it(tmp_path, monkeypatch):
    """The shipped solvers snapshot under examples/<name>/, which
    `caffe_ocl data <name>` creates: the error says so (issue #26)."""
    monkeypatch.chdir(tmp_path)
    p = solver_param(tmp_path, kind="SGD", extra="snapshot: 2")
    p.snapshot_prefix = "examples/mnist/lenet"
    with pytest.raises(SolverError, match="run `caffe_ocl data mnist` first"):
        caffe.get_solver(p)
    p.snapshot_prefix = str(tmp_path / "elsewhere" / "snap")
    with pytest.raises(SolverError) as e:
        caffe.get_solver(p)
    assert "caffe_ocl data" not in str(e.value)


def test_hdf5_snapshot_resume_is_exact(tmp_path):
    """snapshot_format: HDF5 writes .caffemodel.h5 + .solverstate.h5 (Caffe's
    layout) and resumes exactly, like the binary format."""
    h5py = pytest.importorskip("h5py")
    p = solver_param(tmp_path, extra="snapshot_format: HDF5")
    straight = caffe.get_solver(p)
    straight.step(8)
    want = params_of(straight)
    first = caffe.get_solver(p)
    first.step(4)
    state_path = first.snapshot()
    assert state_path.endswith("snap_iter_4.solverstate.h5")
    model = f"{tmp_path}/snap_iter_4.caffemodel.h5"
    with h5py.File(model, "r") as f:          # Caffe's HDF5 net layout: data/<layer>/<i>
        assert f["data"]["ip"]["0"].shape == (2, 4)
    resumed = caffe.get_solver(p)
    resumed.restore(state_path)
    assert resumed.iter == 4
    resumed.step(4)
    for a, b in zip(want, params_of(resumed)):
        np.testing.assert_allclose(a, b, rtol=0, atol=0)
