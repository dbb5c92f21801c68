"""Python layers (type "Python"), pycaffe's interface: a user class that
subclasses caffe.Layer, driven by a Net, with host NumPy blobs in between
device layers."""
import sys
import textwrap

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import LayerError, caffe_pb2
from google.protobuf import text_format

LAYER_MODULE = '''
import numpy as np
import caffe_ocl as caffe

CALLS = []


class Mult(caffe.Layer):
    """top = factor * bottom, factor from param_str."""
    def setup(self, bottom, top):
        CALLS.append(("setup", self.phase))
        if len(bottom) != 1:
            raise Exception("Mult needs one bottom")
        self.factor = float(self.param_str)

    def reshape(self, bottom, top):
        CALLS.append(("reshape",))
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.factor * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = self.factor * top[0].diff


class ScaleParam(caffe.Layer):
    """top = w * bottom with one learnable scalar w (a layer blob)."""
    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[...] = float(self.param_str or 1.0)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data[0] * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += np.sum(top[0].diff * bottom[0].data)
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data[0] * top[0].diff


class SumRows(caffe.Layer):
    """Changes shape: (N, ...) -> (N, 1); used as a loss (loss_weight)."""
    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape[0], 1)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.reshape(bottom[0].shape[0], -1).sum(1, keepdims=True)

    def backward(self, top, propagate_down, bottom):
        n = bottom[0].shape[0]
        g = top[0].diff.reshape(n, *([1] * (bottom[0].data.ndim - 1)))
        bottom[0].diff[...] = np.broadcast_to(g, bottom[0].shape)


class NotALayer(object):
    pass
'''


@pytest.fixture
def pymod(tmp_path, monkeypatch):
    name = "caffe_ocl_test_pylayers"
    (tmp_path / f"{name}.py").write_text(LAYER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    yield name
    sys.modules.pop(name, None)


def _net(text, phase=caffe.TEST):
    p = caffe_pb2.NetParameter()
    text_format.Parse(textwrap.dedent(text), p)
    return caffe.Net(p, phase)


def _py(name, bottom, top, module, cls, param_str="", extra=""):
    return (f'layer {{ name: "{name}" type: "Python" bottom: "{bottom}" top: "{top}" '
            f'python_param {{ module: "{module}" layer: "{cls}" param_str: "{param_str}" }} '
            f'{extra} }}\n')


def _sandwich(mod, factor="2.5"):
    # device layer -> Python layer -> device layer, so host/device syncs matter
    return ('force_backward: true\n'
            'layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 2 dim: 3 dim: 4 } } }\n'
            'layer { name: "pre" type: "Power" bottom: "data" top: "pre" '
            'power_param { scale: 3 shift: 1 } }\n'
            + _py("mult", "pre", "mid", mod, "Mult", factor) +
            'layer { name: "post" type: "Power" bottom: "mid" top: "out" '
            'power_param { scale: -0.5 } }\n')


def test_forward_backward_through_net(pymod, rng):
    net = _net(_sandwich(pymod))
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out = net.forward(data=x)["out"]
    np.testing.assert_allclose(out, -0.5 * 2.5 * (3 * x + 1), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal((2, 3, 4)).astype(np.float32)
    dx = net.backward(out=g)["data"]
    np.testing.assert_allclose(dx, g * -0.5 * 2.5 * 3, rtol=1e-5, atol=1e-6)
    # a second pass with new data sees the new values (no stale host/device copy)
    x2 = x * -2 + 1
    out2 = net.forward(data=x2)["out"]
    np.testing.assert_allclose(out2, -0.5 * 2.5 * (3 * x2 + 1), rtol=1e-5, atol=1e-6)
    dx2 = net.backward(out=2 * g)["data"]
    np.testing.assert_allclose(dx2, 2 * g * -0.5 * 2.5 * 3, rtol=1e-5, atol=1e-6)


def test_pycaffe_layer_behaviour(pymod):
    net = _net(_sandwich(pymod, "4"), phase=caffe.TRAIN)
    mod = sys.modules[pymod]
    layer = net.layer_dict["mult"]
    assert layer.type == "Python"
    assert isinstance(layer, caffe.Layer)
    assert isinstance(layer.py_layer, mod.Mult)
    assert layer.factor == 4.0 and layer.param_str == "4"      # user attributes
    assert layer.phase == caffe.TRAIN and mod.CALLS[0] == ("setup", caffe.TRAIN)
    layer.factor = -1.0                                        # written to the user object
    assert layer.py_layer.factor == -1.0
    assert len(layer.blobs) == 0 and "mult" not in net.params
    # Caffe reshapes before every forward
    n = len(mod.CALLS)
    net.forward()
    net.forward()
    assert mod.CALLS[n:].count(("reshape",)) >= 2
    # every layer of a net is a caffe.Layer, as in pycaffe
    assert all(isinstance(lay, caffe.Layer) for lay in net.layers)


def test_param_blobs_and_shape_change(pymod, rng):
    text = ('force_backward: true\n'
            'layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 3 dim: 2 dim: 5 } } }\n'
            + _py("sp", "data", "scaled", pymod, "ScaleParam", "1.5")
            + 'layer { name: "relu" type: "ReLU" bottom: "scaled" top: "r" }\n'
            + _py("sum", "r", "loss", pymod, "SumRows", "", "loss_weight: 0.5"))
    net = _net(text, phase=caffe.TRAIN)
    assert list(net.params) == ["sp"]
    assert net.params["sp"][0].shape == (1,)
    assert net.layers[list(net.layer_dict).index("sp")].blobs[0] is net.params["sp"][0]
    assert net.blobs["loss"].shape == (3, 1)
    x = rng.standard_normal((3, 2, 5)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.forward()
    y = np.maximum(1.5 * x, 0)
    np.testing.assert_allclose(net.blobs["loss"].data[:, 0], y.reshape(3, -1).sum(1), rtol=1e-5)
    np.testing.assert_allclose(net.loss(), 0.5 * y.sum(), rtol=1e-5)
    net.clear_param_diffs()
    net.backward()
    mask = (1.5 * x > 0)
    np.testing.assert_allclose(net.blobs["data"].diff, 0.5 * 1.5 * mask, rtol=1e-5)
    np.testing.assert_allclose(net.params["sp"][0].diff[0], 0.5 * np.sum(mask * x), rtol=1e-4)
    # batch size change: the Python layer reshapes its top, the loss diff is re-seeded
    net.blobs["data"].reshape(2, 2, 5)
    net.blobs["data"].data[...] = x[:2]
    net.forward()
    assert net.blobs["loss"].shape == (2, 1)
    net.backward()
    np.testing.assert_allclose(net.blobs["data"].diff, 0.5 * 1.5 * mask[:2], rtol=1e-5)


def _scale_sum_solver(mod):
    """Input (4, 3) -> ScaleParam (w = 2) -> SumRows as the loss; returns
    (its text, a SolverParameter training it)."""
    net_text = ('layer { name: "data" type: "Input" top: "data" '
                'input_param { shape { dim: 4 dim: 3 } } }\n'
                + _py("sp", "data", "scaled", mod, "ScaleParam", "2")
                + _py("sum", "scaled", "loss", mod, "SumRows", "", "loss_weight: 1"))
    sp = caffe_pb2.SolverParameter()
    text_format.Parse(net_text, sp.net_param)
    return net_text, sp


def test_solver_updates_python_layer_param(pymod, rng):
    _, sp = _scale_sum_solver(pymod)
    sp.base_lr = 0.1
    sp.lr_policy = "fixed"
    sp.max_iter = 1
    sp.display = 0
    sp.snapshot_after_train = False
    solver = caffe.SGDSolver(sp)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    solver.net.blobs["data"].data[...] = x
    solver.step(1)
    w = solver.net.params["sp"][0].data[0]
    np.testing.assert_allclose(w, 2 - 0.1 * x.sum(), rtol=1e-5)


def test_solver_reads_losses_and_outputs_a_python_layer_wrote(pymod, rng):
    """A Python layer's loss top or test-net output is written on the host
    and has no reader layer: the solver's smoothed loss and test scores must
    still see it (they were 0 / nan / stale: BVLC's examples/pycaffe linreg
    with pyloss.py logged "loss = 0")."""
    net_text, sp = _scale_sum_solver(pymod)
    text_format.Parse(net_text, sp.test_net_param.add())
    sp.test_iter.append(1)
    sp.test_interval = 1000
    sp.test_initialization = False
    sp.base_lr = 0.0
    sp.lr_policy = "fixed"
    sp.average_loss = 1
    sp.display = 1
    sp.snapshot_after_train = False
    solver = caffe.SGDSolver(sp)
    for step in range(2):
        x = rng.standard_normal((4, 3)).astype(np.float32) + step
        solver.net.blobs["data"].data[...] = x
        solver.step(1)
        assert solver.smoothed_loss == pytest.approx(2 * x.sum(), rel=1e-5)
    tx = rng.standard_normal((4, 3)).astype(np.float32)
    solver.test_nets[0].blobs["data"].data[...] = tx
    scores = solver.test(0)
    np.testing.assert_allclose(scores, 2 * tx.sum(1), rtol=1e-5)


def test_import_error_names_layer_and_module():
    text = ('layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 1 dim: 2 } } }\n'
            + _py("mypy", "data", "out", "no_such_module_xyz", "Foo"))
    with pytest.raises(LayerError) as e:
        _net(text)
    msg = str(e.value)
    assert "'mypy'" in msg and "Python" in msg and "no_such_module_xyz" in msg
    assert "PYTHONPATH" in msg


def test_missing_class_and_bad_class(pymod):
    base = ('layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 1 dim: 2 } } }\n')
    with pytest.raises(LayerError, match=r"'nope'.*has no class 'Missing'"):
        _net(base + _py("nope", "data", "out", pymod, "Missing"))
    with pytest.raises(LayerError, match=r"must be a class that subclasses caffe_ocl.Layer"):
        _net(base + _py("bad", "data", "out", pymod, "NotALayer"))
    with pytest.raises(LayerError, match=r"python_param"):
        _net(base + 'layer { name: "np" type: "Python" bottom: "data" top: "out" }')


def test_user_error_propagates_with_context(pymod):
    base = ('layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 1 dim: 2 } } }\n')
    with pytest.raises(ValueError) as e:     # float("abc") in the user's setup
        _net(base + _py("m", "data", "out", pymod, "Mult", "abc"))
    notes = "\n".join(getattr(e.value, "__notes__", []))
    if hasattr(e.value, "add_note"):
        assert "setup()" in notes and "'m'" in notes


def test_module_imported_only_when_a_python_layer_is_built(tmp_path, monkeypatch):
    # the module marks its import; a Python layer filtered out by phase must not
    # cause the import (loading a model never executes code it does not name)
    name = "caffe_ocl_test_marker_mod"
    (tmp_path / f"{name}.py").write_text(
        "import sys\nsys._caffe_ocl_marker = True\n" + LAYER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    monkeypatch.delattr(sys, "_caffe_ocl_marker", raising=False)
    text = ('layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 1 dim: 2 } } }\n'
            + _py("m", "data", "out", name, "Mult", "2", "include { phase: TRAIN }"))
    try:
        _net(text, phase=caffe.TEST)
        assert not hasattr(sys, "_caffe_ocl_marker") and name not in sys.modules
        net = _net(text, phase=caffe.TRAIN)
        assert getattr(sys, "_caffe_ocl_marker", False)
        np.testing.assert_allclose(net.forward(data=np.ones((1, 2)))["out"], [[2, 2]])
    finally:
        sys.modules.pop(name, None)
