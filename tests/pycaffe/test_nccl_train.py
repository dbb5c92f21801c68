"""caffe.NCCL without mpiexec: a python/train.py-style script (BVLC's
multi-GPU training from Python: one process per device started with
multiprocessing, NCCL.new_uid() handed to each) trains a small net on two
ranks; both end with the same weights, equal to one process training on
the combined batch; --timing prints per-layer times through caffe.log."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import child_env

DATA_LAYER = '''
import numpy as np
import caffe


class RankData(caffe.Layer):
    """Records rank, rank + count, ... of each global batch of
    batch * solver_count records (so one process with batch * 2 sees the
    union of what two ranks see)."""

    def setup(self, bottom, top):
        self.batch = int(self.param_str)
        r = np.random.RandomState(0)
        self.x = r.randn(64, 1, 6, 6).astype(np.float32)
        self.y = (self.x.reshape(64, -1).sum(1) > 0).astype(np.float32) + \\
            (self.x[:, 0, 0, 0] > 0.5)
        self.k = 0

    def reshape(self, bottom, top):
        top[0].reshape(self.batch, 1, 6, 6)
        top[1].reshape(self.batch)

    def forward(self, bottom, top):
        n, r = caffe.solver_count(), caffe.solver_rank()
        idx = [(self.k * self.batch * n + j * n + r) % 64 for j in range(self.batch)]
        top[0].data[...] = self.x[idx]
        top[1].data[...] = self.y[idx]
        self.k += 1

    def backward(self, top, propagate_down, bottom):
        pass
'''

NET = '''
name: "ranknet"
layer { name: "data" type: "Python" top: "data" top: "label"
  python_param { module: "rank_data" layer: "RankData" param_str: "%d" } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''

SOLVER = '''
net: "%s"
base_lr: 0.2
momentum: 0.9
weight_decay: 0.001
lr_policy: "fixed"
max_iter: 4
display: 2
random_seed: 7
layer_wise_reduce: %s
snapshot_after_train: false
'''

# python/train.py's structure, with the weights written at the end
TRAIN_PY = '''
"""Trains a net on several devices, one process per device (BVLC python/train.py)."""
import argparse
import sys
from multiprocessing import Process

import numpy as np
import caffe


def time(solver, nccl):
    fprop = []
    bprop = []
    total = caffe.Timer()
    allrd = caffe.Timer()
    for _ in range(len(solver.net.layers)):
        fprop.append(caffe.Timer())
        bprop.append(caffe.Timer())
    display = solver.param.display

    def show_time():
        if solver.iter % display == 0:
            s = '\\n'
            for i in range(len(solver.net.layers)):
                s += 'forw %3d %8s ' % (i, solver.net._layer_names[i])
                s += ': %.2f\\n' % fprop[i].ms
            for i in range(len(solver.net.layers) - 1, -1, -1):
                s += 'back %3d %8s ' % (i, solver.net._layer_names[i])
                s += ': %.2f\\n' % bprop[i].ms
            s += 'solver total: %.2f\\n' % total.ms
            s += 'allreduce: %.2f\\n' % allrd.ms
            caffe.log(s)

    solver.net.before_forward(lambda layer: fprop[layer].start())
    solver.net.after_forward(lambda layer: fprop[layer].stop())
    solver.net.before_backward(lambda layer: bprop[layer].start())
    solver.net.after_backward(lambda layer: bprop[layer].stop())
    solver.add_callback(lambda: total.start(), lambda: (total.stop(), allrd.start()))
    solver.add_callback(nccl)
    solver.add_callback(lambda: '', lambda: (allrd.stop(), show_time()))


def solve(proto, snapshot, gpus, timing, uid, rank, out):
    caffe.set_mode_gpu()
    caffe.set_device(gpus[rank])
    caffe.set_solver_count(len(gpus))
    caffe.set_solver_rank(rank)
    caffe.set_multiprocess(True)

    solver = caffe.SGDSolver(proto)
    if snapshot and len(snapshot) != 0:
        solver.restore(snapshot)

    nccl = caffe.NCCL(solver, uid)
    nccl.bcast()

    if timing and rank == 0:
        time(solver, nccl)
    else:
        solver.add_callback(nccl)

    if solver.param.layer_wise_reduce:
        solver.net.after_backward(nccl)
    solver.step(solver.param.max_iter)
    np.savez(out % rank, **{'%s_%d' % (k, i): b.data for k, v in solver.net.params.items()
                            for i, b in enumerate(v)})


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument("--solver", required=True)
    parser.add_argument("--snapshot")
    parser.add_argument("--gpus", type=int, nargs='+', default=[0])
    parser.add_argument("--timing", action='store_true')
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    uid = caffe.NCCL.new_uid()
    caffe.init_log()
    caffe.log('Using devices %s' % str(args.gpus))

    procs = []
    for rank in range(len(args.gpus)):
        p = Process(target=solve,
                    args=(args.solver, args.snapshot, args.gpus, args.timing, uid, rank,
                          args.out))
        p.daemon = True
        p.start()
        procs.append(p)
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
'''


def _setup(tmp_path, batch, layer_wise):
    (tmp_path / "rank_data.py").write_text(DATA_LAYER)
    net = tmp_path / f"net_{batch}.prototxt"
    net.write_text(NET % batch)
    solver = tmp_path / f"solver_{batch}_{layer_wise}.prototxt"
    solver.write_text(SOLVER % (net, "true" if layer_wise else "false"))
    (tmp_path / "train.py").write_text(TRAIN_PY)
    return str(solver)


def _run(tmp_path, solver, gpus, out, timing=False):
    env = child_env(tmp_path)
    cmd = [sys.executable, str(tmp_path / "train.py"), "--solver", solver,
           "--out", str(tmp_path / out), "--gpus"] + [str(g) for g in gpus]
    if timing:
        cmd.append("--timing")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stderr


def _load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("layer_wise", [True, False])
def test_two_ranks_match_one_process_on_the_combined_batch(tmp_path, layer_wise):
    two = _setup(tmp_path, 4, layer_wise)
    one = _setup(tmp_path, 8, layer_wise)
    err = _run(tmp_path, two, [0, 0], "two_%d.npz", timing=layer_wise)
    _run(tmp_path, one, [0], "one_%d.npz")
    r0, r1 = _load(tmp_path / "two_0.npz"), _load(tmp_path / "two_1.npz")
    single = _load(tmp_path / "one_0.npz")
    init = None
    for k in r0:
        # the same bits on both ranks (rank 0 reduces and sends the result)
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
        np.testing.assert_allclose(r0[k], single[k], rtol=2e-4, atol=2e-5, err_msg=k)
        init = init or k
    if layer_wise:
        # train.py --timing: real per-layer times through caffe.log on rank 0
        assert "forw   1     conv" in err and "back   1     conv" in err, err[-3000:]
        assert "allreduce:" in err
        times = [float(line.rsplit(":", 1)[1]) for line in err.splitlines()
                 if line.startswith("forw ")]
        assert times and any(t > 0 for t in times)


def test_one_rank_works(tmp_path):
    one = _setup(tmp_path, 8, True)
    _run(tmp_path, one, [0], "solo_%d.npz")
    solo = _load(tmp_path / "solo_0.npz")
    # the same as training without NCCL at all
    import caffe
    sys.path.insert(0, str(tmp_path))
    try:
        s = caffe.SGDSolver(one)
        s.step(s.param.max_iter)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rank_data", None)
    for k, v in s.net.params.items():
        for i, b in enumerate(v):
            np.testing.assert_array_equal(solo[f"{k}_{i}"], b.data, err_msg=k)


def test_new_uid_is_a_local_picklable_name():
    import pickle
    import caffe
    uid = caffe.NCCL.new_uid()
    assert isinstance(uid, bytes)               # as pycaffe's under Python 3
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert not os.path.exists(os.path.dirname(uid))     # nothing made before use
    assert uid != caffe.NCCL.new_uid()


def test_reduction_is_the_mean_in_a_kernel(tmp_path):
    """Two ranks in threads of this process (each its own solver): after
    on_gradients_ready every rank holds (g0 + g1) * 1/2, the same bits."""
    import threading
    import caffe
    solver_path = _setup(tmp_path, 4, False)
    sys.path.insert(0, str(tmp_path))
    try:
        uid = caffe.NCCL.new_uid()
        solvers, grads, out = [], [], {}
        for rank in range(2):
            caffe.set_solver_count(2)
            caffe.set_solver_rank(rank)
            s = caffe.SGDSolver(solver_path)
            s.net.forward()
            s.net.backward()
            solvers.append(s)
            grads.append([b.diff.copy() for b in s.net.learnable_params])
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)
        sys.path.remove(str(tmp_path))

    def rank_main(rank):
        n = caffe.NCCL(solvers[rank], uid)
        n.on_start()
        n.on_gradients_ready()
        out[rank] = [b.diff.copy() for b in solvers[rank].net.learnable_params]
        n.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(out) == {0, 1}
    assert not os.path.exists(os.path.dirname(uid))     # rank 0 removed it
    for g0, g1, a, b in zip(grads[0], grads[1], out[0], out[1]):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, (g0 + g1) * np.float32(0.5))
