"""benchmarks/bench_zoo_train.py --smoke: bench_zoo's tiny torch net
(conv-BN-ReLU, depthwise conv, residual add, SE-like sigmoid gate, Linear)
exported with its BatchNorm, converted, made a TRAIN net (label Input,
SoftmaxWithLoss, batch statistics), one training step checked against
PyTorch (loss, every parameter's gradient, the solver's update), then one
interleaved timing round of solver.step against PyTorch on the CPU.
Skipped where torch or onnx is not installed (CI)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, child_env

pytest.importorskip("torch")
pytest.importorskip("onnx")

sys.path.insert(0, os.path.join(str(ROOT), "benchmarks"))


def test_bench_zoo_train_smoke(tmp_path):
    out = tmp_path / "train.json"
    env = child_env()
    p = subprocess.run([sys.executable, os.path.join(str(ROOT), "benchmarks", "bench_zoo_train.py"),
                        "--smoke", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["net"] == "tiny" and rec["status"] == "ok", rec
    # every learned blob of the converted net has its torch parameter:
    # 4 conv/linear weights, 2 biases, 2 x BN gamma/beta
    assert rec["params_matched"] == 10 and rec["n_unmatched"] == 0
    # the comparison is computed, not a constant: small but not all zero
    assert 0 <= rec["loss_rel"] <= 1e-5 and rec["loss_ours"] > 1.0
    assert 0 < rec["worst_grad_rel"] <= 1e-3
    assert rec["worst_update_rel"] <= 1e-4
    # both BatchNorms' running averages after one step equal PyTorch's
    assert rec["bn_layers"] == 2 and 0 <= rec["worst_running_stat_rel"] <= 1e-4
    assert rec["ours_ms"] > 0 and rec["torch_ms"] > 0
    assert "| tiny | 2 | fp32 |" in p.stdout and "**geomean fp32**" in p.stdout


def test_train_net_from_deploy():
    """The TRAIN net: a label Input after the data Input, BatchNorm on batch
    statistics, Dropout removed (its consumer reads its bottom), a
    SoftmaxWithLoss on the one output."""
    from caffe_ocl.proto import caffe_pb2
    import bench_zoo_train
    d = caffe_pb2.NetParameter()
    for name, type_, bottom, top in [("data", "Input", [], ["data"]),
                                     ("bn", "BatchNorm", ["data"], ["bn"]),
                                     ("drop", "Dropout", ["bn"], ["d"]),
                                     ("fc", "InnerProduct", ["d"], ["logits"])]:
        lp = d.layer.add()
        lp.name, lp.type = name, type_
        lp.bottom.extend(bottom)
        lp.top.extend(top)
        lp.blobs.add()
    d.layer[0].input_param.shape.add().dim.extend([4, 3])
    d.layer[1].batch_norm_param.use_global_stats = True
    t = bench_zoo_train.train_net_param(d)
    assert [lp.type for lp in t.layer] == ["Input", "Input", "BatchNorm", "InnerProduct",
                                           "SoftmaxWithLoss"]
    assert list(t.layer[1].top) == ["label"] and list(t.layer[1].input_param.shape[0].dim) == [4]
    assert not t.layer[2].batch_norm_param.HasField("use_global_stats")
    assert list(t.layer[3].bottom) == ["bn"]
    assert list(t.layer[4].bottom) == ["logits", "label"]
    assert all(len(lp.blobs) == 0 for lp in t.layer)


def test_norm_err_floor_and_update_ulps():
    import bench_zoo_train as b
    ref = np.array([3.0, 4.0])
    assert b.norm_err(ref + [0.0, 0.5], ref) == pytest.approx(0.1)
    # an exactly-zero gradient is compared against the floor, not against 0
    assert b.norm_err([1e-9, 0.0], [0.0, 0.0], floor=1e-3) == pytest.approx(1e-6)
    assert b.max_err([1.0, 2.5], [1.0, 2.0]) == pytest.approx(0.25)
