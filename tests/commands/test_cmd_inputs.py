"""Commands check their inputs and optional dependencies before any work:
one line naming the file (or the pip extra), exit status 1, no net built.
Also `caffe_ocl config` and device_query's settings table."""
import pytest

from caffe_ocl import commands, config
from caffe_ocl.commands import deps
from caffe_ocl.net import Net

NET = """
name: "tiny"
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
        'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n'
        'snapshot_prefix: "out"\n')
    (tmp_path / "w.caffemodel").write_bytes(b"")
    (tmp_path / "img.png").write_bytes(b"")
    return tmp_path


@pytest.fixture
def no_work(monkeypatch):
    """Building a net or starting the solver fails the test: the check must
    come first."""
    def boom(*a, **k):
        raise AssertionError("work started before the inputs were checked")
    monkeypatch.setattr(Net, "__init__", boom)
    from caffe_ocl.commands import train
    monkeypatch.setattr(train, "train", boom)


def _one_line_error(capsys, cmd):
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert lines[0].startswith(f"caffe_ocl {cmd}: error: ")
    assert "Finetuning from" not in cap.err and "Traceback" not in cap.err
    return lines[0]


@pytest.mark.parametrize("argv,names", [
    (["test", "--model", "net.prototxt", "--weights", "missing.caffemodel"],
     "--weights: file not found: missing.caffemodel"),
    (["test", "--model", "nomodel.prototxt", "--weights", "w.caffemodel"],
     "--model: file not found: nomodel.prototxt"),
    (["test", "--model", "net.prototxt", "--weights", "w.caffemodel,gone.caffemodel"],
     "--weights: file not found: gone.caffemodel"),
    (["train", "--solver", "nosolver.prototxt"], "--solver: file not found: nosolver.prototxt"),
    (["train", "--solver", "solver.prototxt", "--weights", "w.caffemodel, x.caffemodel"],
     "--weights: file not found: x.caffemodel"),
    (["train", "--solver", "solver.prototxt", "--snapshot", "out_iter_9.solverstate"],
     "--snapshot: file not found: out_iter_9.solverstate"),
    (["time", "--model", "net.prototxt", "--weights", "nope.caffemodel"],
     "--weights: file not found: nope.caffemodel"),
    (["tune", "--model", "nonet.prototxt"], "--model: file not found: nonet.prototxt"),
    (["classify", "--model", "net.prototxt", "--weights", "w.caffemodel", "img.png",
      "other.png"], "IMAGE: file not found: other.png"),
    (["classify", "--labels", "labels.txt", "img.png"], "--labels: file not found: labels.txt"),
    (["extract_features", "w.caffemodel", "net.prototxt", "t,z", "db", "1", "lmdb", "GPU",
      "0"], "2 blob name(s) but 1 database name(s)"),
    (["extract_features", "no.caffemodel", "net.prototxt", "t", "db", "1"],
     "pretrained_net_param: file not found: no.caffemodel"),
    (["draw_net", "none.prototxt", "x.png"], "input_net_proto_file: file not found"),
    (["onnx2caffe", "m.onnx", "a.prototxt", "b.caffemodel"], "model: file not found: m.onnx"),
    (["caffe2onnx", "net.prototxt", "none.caffemodel", "o.onnx"],
     "caffemodel: file not found: none.caffemodel"),
    (["upgrade_net_proto_text", "old.prototxt", "new.prototxt"],
     "v0_net_proto_file_in: file not found: old.prototxt"),
    (["upgrade_solver_proto_text", "old.prototxt", "new.prototxt"],
     "solver_proto_file_in: file not found: old.prototxt"),
    (["convert_cifar_data", "nodir", "."], "input_folder: folder not found: nodir"),
    (["convert_mnist_siamese_data", "i.idx", "l.idx", "db"], "input_image_file: file not found"),
    (["parse_log", "train.log", "."], "logfile_path: file not found: train.log"),
    (["compute_image_mean", "nodb", "m.binaryproto"], "INPUT_DB: folder not found: nodb"),
    (["convert_imageset", "./", "list.txt", "db"], "LISTFILE: file not found: list.txt"),
])
def test_missing_inputs_are_one_line_before_any_work(files, no_work, capsys, argv, names):
    assert commands.main(argv) == 1
    assert names in _one_line_error(capsys, argv[0])
    assert not (files / "db").exists() and not (files / "new.prototxt").exists()


def test_test_weights_missing_before_the_net_is_built(files, capsys):
    """Issue #26 item 8: no net, no "Finetuning from", one line."""
    assert commands.main(["test", "--model", "net.prototxt", "--weights",
                          "missing.caffemodel"]) == 1
    line = _one_line_error(capsys, "test")
    assert line == "caffe_ocl test: error: --weights: file not found: missing.caffemodel"


# --------------------------------------------------------------------------
# optional dependencies (a missing package is simulated through deps.available)

@pytest.fixture
def missing(monkeypatch):
    gone = set()
    real = deps.available
    monkeypatch.setattr(deps, "available", lambda m: m not in gone and real(m))
    return gone


@pytest.mark.parametrize("argv,module,extra", [
    (["onnx2caffe", "w.caffemodel", "o.prototxt", "o.caffemodel"], "onnx", "onnx"),
    (["caffe2onnx", "net.prototxt", "w.caffemodel", "o.onnx"], "onnx", "onnx"),
    (["draw_net", "net.prototxt", "net.png"], "pydot", "draw"),
    (["train", "--solver", "solver.prototxt", "--weights", "w.caffemodel,x.h5"], "h5py",
     "hdf5"),
    (["test", "--model", "net.prototxt", "--weights", "x.h5"], "h5py", "hdf5"),
    (["train", "--solver", "solver.prototxt", "--gpu", "0,1"], "mpi4py", "mpi"),
])
def test_missing_optional_dependency_names_the_extra(files, no_work, missing, capsys, argv,
                                                     module, extra):
    (files / "x.h5").write_bytes(b"")
    missing.update({module, "pydotplus"})
    assert commands.main(argv) == 1
    line = _one_line_error(capsys, argv[0])
    assert f"needs the Python package {module!r}" in line
    assert line.endswith(f"pip install 'caffe_ocl[{extra}]'")
    assert not any(p.name.startswith("o.") or p.name == "net.png" for p in files.iterdir())


def test_onnx_check_without_onnxruntime(files, missing, capsys, monkeypatch):
    missing.add("onnxruntime")
    monkeypatch.setattr(deps, "available", lambda m: m != "onnxruntime")
    assert commands.main(["caffe2onnx", "net.prototxt", "w.caffemodel", "o.onnx",
                          "--check"]) == 1
    assert _one_line_error(capsys, "caffe2onnx").endswith("pip install onnxruntime")


def test_draw_net_without_graphviz(files, capsys, monkeypatch):
    pytest.importorskip("pydot")
    monkeypatch.setattr(deps, "which", lambda program: None)
    assert commands.main(["draw_net", "net.prototxt", "net.png"]) == 1
    line = _one_line_error(capsys, "draw_net")
    assert "needs the 'dot' program" in line and "apt-get install graphviz" in line
    assert not (files / "net.png").exists()
    # the Graphviz source needs no dot
    assert commands.main(["draw_net", "net.prototxt", "net.dot"]) == 0
    assert (files / "net.dot").read_text().startswith("digraph tiny {")


def test_require_helpers(monkeypatch):
    deps.require("os", "x")                         # present: nothing happens
    monkeypatch.setattr(deps, "available", lambda m: m == "pydotplus")
    deps.require("pydot", "draw", alternatives=("pydotplus",))
    with pytest.raises(Exception, match=r"^caffe_ocl foo needs the Python package 'onnx', "
                                        r"which is not installed: pip install "
                                        r"'caffe_ocl\[onnx\]'$"):
        deps.require("onnx", "onnx", "caffe_ocl foo")


# --------------------------------------------------------------------------
# settings

def test_config_command_prints_every_setting(capsys, monkeypatch):
    monkeypatch.setenv("CAFFE_OCL_DEVICE", "0")
    assert commands.main(["config"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == config.format_table()
    rows = config.describe()
    assert len(out.strip().splitlines()) == len(rows)
    dev = [line for line in out.splitlines() if line.startswith("CAFFE_OCL_DEVICE ")]
    assert len(dev) == 1 and "[environment]" in dev[0]
    assert commands.main(["config", "--all"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == \
        len(config.describe(include_internal=True))


def test_device_query_prints_the_settings_too(capsys):
    assert commands.main(["device_query"]) == 0
    out = capsys.readouterr().out
    assert "chosen:" in out
    assert config.format_table() in out
