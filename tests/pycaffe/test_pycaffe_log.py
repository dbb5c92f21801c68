"""``import caffe`` prints Caffe's glog lines on stderr when building nets
and training from Python (as pycaffe does), from GLOG_minloglevel on."""
import subprocess
import sys

from conftest import child_env

SCRIPT = r'''
import sys
import numpy as np
import caffe
open("net.prototxt", "w").write("""
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
    data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
""")
open("solver.prototxt", "w").write(
    'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 2\ndisplay: 1\n'
    'snapshot_after_train: false\n')
solver = caffe.SGDSolver("solver.prototxt")
solver.solve()
sys.stderr.write("SCRIPT-DONE\n")
'''


def _run(tmp_path, **env_extra):
    env = child_env()
    env.pop("GLOG_minloglevel", None)
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "SCRIPT-DONE" in p.stderr
    return p.stderr


def test_training_from_python_logs_like_caffe(tmp_path):
    err = _run(tmp_path)
    lines = err.splitlines()
    assert any(" net.py:" in ln and "Creating Layer ip" in ln for ln in lines), err[-2000:]
    assert any(ln.startswith("I") and "Iteration 1" in ln and "loss = " in ln
               for ln in lines), err[-2000:]
    assert "Optimization Done." in err


def test_glog_minloglevel_is_honoured(tmp_path):
    err = _run(tmp_path, GLOG_minloglevel="1")
    assert "Creating Layer" not in err and "Iteration" not in err
    # GLOG_logtostderr changes nothing: the lines go to stderr anyway
    err = _run(tmp_path, GLOG_logtostderr="0")
    assert "Creating Layer" in err
