"""--untrusted on the commands that load models: the same as
caffe_ocl.set_untrusted(True) / CAFFE_OCL_UNTRUSTED=1 (issue #25): a
model's Python layer is refused before its module is imported."""
import importlib
import sys

import pytest

from caffe_ocl import commands as cli
from caffe_ocl import config

MODEL_COMMANDS = ["train", "score", "time_cmd", "classify", "detect", "extract_features",
                  "caffe2onnx", "tune"]

LAYER = """
import os
open(os.path.join(os.path.dirname(__file__), "IMPORTED"), "w").close()
import caffe_ocl as caffe

class Ident(caffe.Layer):
    def setup(self, bottom, top):
        pass
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data
    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = top[0].diff
"""

NET = """
layer { name: "x" type: "DummyData" top: "x" top: "t"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 }
                     data_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
  inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0.1 } } }
layer { name: "py" type: "Python" bottom: "z" top: "y"
  python_param { module: "untrusted_probe_layer" layer: "Ident" } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
"""


@pytest.fixture
def model(tmp_path, monkeypatch):
    (tmp_path / "untrusted_probe_layer.py").write_text(LAYER)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path}/net.prototxt" base_lr: 0.01 lr_policy: "fixed" max_iter: 1 '
        f'snapshot_prefix: "{tmp_path}/snap"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "untrusted_probe_layer", raising=False)
    before = config.get("UNTRUSTED")
    yield tmp_path
    config.set("UNTRUSTED", before)
    sys.modules.pop("untrusted_probe_layer", None)


@pytest.mark.parametrize("name", MODEL_COMMANDS)
def test_every_model_command_has_the_flag(name):
    spec = importlib.import_module(f"caffe_ocl.commands.{name}").SPEC
    assert "untrusted" in spec.flags
    assert "--untrusted" in spec.help_text()


@pytest.mark.parametrize("argv", [
    ["train", "--solver", "{d}/solver.prototxt"],
    ["time", "--model", "{d}/net.prototxt", "--iterations", "1"],
])
def test_untrusted_refuses_the_python_layer(model, argv, capsys):
    argv = [a.format(d=model) for a in argv]
    assert config.get("UNTRUSTED") is False
    assert cli.main(argv + ["--untrusted"]) == 1
    err = capsys.readouterr().err
    assert "refused for an untrusted model" in err and "'py'" in err, err
    assert not (model / "IMPORTED").exists()      # its module was never imported
    config.set("UNTRUSTED", False)
    assert cli.main(argv) == 0                     # trusted (the default): it runs
    assert (model / "IMPORTED").exists()
