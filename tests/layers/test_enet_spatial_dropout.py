"""ENet's ``spatial_dropout.SpatialDropoutLayer`` Python layer (TimoSaemann/ENet
prototxts/enet_deploy.prototxt names it 27 times) runs built in when that
module is not importable: references worked from the module's source
(TEST: ``x / (1 - p)``; TRAIN: whole planes dropped, survivors scaled)."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import CaffeOclError

NET = """name: "sd"
force_backward: true
input: "x"
input_shape { dim: 3 dim: 40 dim: 3 dim: 4 }
layer { name: "drop" type: "Python" bottom: "x" top: "y"
  python_param { module: "spatial_dropout" layer: "SpatialDropoutLayer"
    param_str: "PARAMS" } }
"""


def _net(tmp_path, params, phase=caffe_ocl.TEST):
    p = tmp_path / "sd.prototxt"
    p.write_text(NET.replace("PARAMS", params))
    return caffe_ocl.Net(str(p), phase)


def test_test_phase_scales_by_one_over_keep(tmp_path):
    net = _net(tmp_path, "{\\'phase\\': \\'TEST\\', \\'p\\': \\'0.01\\'}")
    x = np.random.default_rng(0).normal(size=(3, 40, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(net.forward(x=x)["y"], x / 0.99, rtol=1e-6)
    dy = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    net.blobs["y"].diff[...] = dy
    net.backward()
    np.testing.assert_allclose(net.blobs["x"].diff, dy / 0.99, rtol=1e-6)


def test_train_phase_drops_whole_planes(tmp_path):
    # the param_str's phase decides, as in the module (the net is TEST here)
    net = _net(tmp_path, "{\\'phase\\': \\'TRAIN\\', \\'p\\': 0.5}")
    x = np.random.default_rng(2).uniform(1, 2, (3, 40, 3, 4)).astype(np.float32)
    y = net.forward(x=x)["y"].copy()
    kept = (y != 0).reshape(3, 40, -1)
    assert (kept.all(2) | ~kept.any(2)).all()           # a plane is kept or dropped whole
    frac = kept.all(2).mean()
    assert 0.3 < frac < 0.7, frac
    planes = kept.all(2)
    np.testing.assert_allclose(y[planes], 2 * x[planes], rtol=1e-6)
    dy = np.random.default_rng(3).normal(size=x.shape).astype(np.float32)
    net.blobs["y"].diff[...] = dy
    net.backward()
    want = np.where(y != 0, 2 * dy, 0)
    np.testing.assert_allclose(net.blobs["x"].diff, want, rtol=1e-6)
    y2 = net.forward(x=x)["y"]
    assert (y2 != y).any()                              # a new draw each forward


def test_bad_param_str_is_one_error(tmp_path):
    with pytest.raises(CaffeOclError, match="'p'"):
        _net(tmp_path, "{\\'phase\\': \\'TEST\\', \\'p\\': 1.5}")
    with pytest.raises(CaffeOclError, match="literal"):
        _net(tmp_path, "__import__(\\'os\\')")
