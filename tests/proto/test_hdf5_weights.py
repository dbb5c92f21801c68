"""HDF5 weights (Caffe's /data/<layer>/<i> layout) wherever a caffemodel is
accepted: Net(proto, weights), copy_from, save_hdf5/load_hdf5, the command
line's --weights; recognised by content, not name."""
import os
import sys

import numpy as np
import pytest

import caffe_ocl
from caffe_ocl import hdf5_weights
from caffe_ocl.errors import NetError, ShapeError

h5py = pytest.importorskip("h5py")

PROTO = """name: "tiny"
input: "data" input_shape { dim: 2 dim: 3 dim: 5 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 }
                      bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
"""


@pytest.fixture
def proto(tmp_path):
    p = tmp_path / "net.prototxt"
    p.write_text(PROTO)
    return str(p)


def _params(net):
    return {k: [b.data.copy() for b in v] for k, v in net.params.items()}


def test_save_load_roundtrip_by_content(proto, tmp_path):
    src = caffe_ocl.Net(proto, caffe_ocl.TEST)
    path = tmp_path / "weights.bin"           # no .h5 in the name: found by content
    src.save_hdf5(str(path))
    with h5py.File(path, "r") as f:
        assert sorted(f["data"]) == ["conv", "input", "ip"]   # every layer, as Caffe
        assert f["data/conv/0"].shape == (4, 3, 3, 3)
        assert f["data/ip"].keys() == {"0", "1"}
    want = _params(src)
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32)
    ref = src.forward(data=x)["ip"].copy()
    for load in (lambda n: n.copy_from(str(path)), lambda n: n.load_hdf5(str(path))):
        dst = caffe_ocl.Net(proto, caffe_ocl.TEST)
        load(dst)
        for k, arrs in want.items():
            for a, b in zip(arrs, _params(dst)[k]):
                np.testing.assert_array_equal(a, b)
    dst = caffe_ocl.Net(proto, str(path), caffe_ocl.TEST)
    np.testing.assert_array_equal(dst.forward(data=x)["ip"], ref)


def test_caffe_layout_written_by_h5py_and_extra_layers(proto, tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "caffe.caffemodel.h5"
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("data/conv/0", data=w)
        f.create_dataset("data/conv/1", data=np.arange(4, dtype=np.float32))
        f.create_dataset("data/other/0", data=np.zeros(3, np.float32))    # ignored
        f.create_dataset("diff/conv/0", data=np.ones_like(w))
    net = caffe_ocl.Net(proto, caffe_ocl.TEST, weights=str(path))
    np.testing.assert_array_equal(net.params["conv"][0].data, w)
    np.testing.assert_array_equal(net.params["conv"][1].data, np.arange(4))


def test_shape_mismatch_names_both_shapes(proto, tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/conv/0", data=np.zeros((4, 3, 2, 2), np.float32))
        f.create_dataset("data/conv/1", data=np.zeros(4, np.float32))
    net = caffe_ocl.Net(proto, caffe_ocl.TEST)
    with pytest.raises(ShapeError, match=r"conv.*4 3 2 2.*4 3 3 3"):
        net.copy_from(str(path))


def test_hdf5_that_is_not_caffe_weights(proto, tmp_path):
    path = tmp_path / "x.caffemodel"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.zeros(3))
    assert hdf5_weights.is_hdf5(str(path))
    with pytest.raises(NetError, match="not Caffe weights.*images"):
        caffe_ocl.Net(proto, str(path), caffe_ocl.TEST)


def test_binary_caffemodel_still_works(proto, tmp_path):
    src = caffe_ocl.Net(proto, caffe_ocl.TEST)
    path = tmp_path / "w.h5"      # an .h5 name on a binary proto: content decides
    src.save(str(path))
    assert not hdf5_weights.is_hdf5(str(path))
    dst = caffe_ocl.Net(proto, str(path), caffe_ocl.TEST)
    np.testing.assert_array_equal(dst.params["ip"][0].data, src.params["ip"][0].data)


def test_missing_h5py_message(proto, tmp_path, monkeypatch):
    src = caffe_ocl.Net(proto, caffe_ocl.TEST)
    path = tmp_path / "w.h5"
    src.save_hdf5(str(path))
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(NetError, match=r"pip install 'caffe_ocl\[hdf5\]'"):
        caffe_ocl.Net(proto, str(path), caffe_ocl.TEST)


def test_cli_test_accepts_hdf5_weights(proto, tmp_path):
    from caffe_ocl.solvers.solver import load_net_weights
    src = caffe_ocl.Net(proto, caffe_ocl.TEST)
    path = tmp_path / "w.caffemodel.h5"
    src.save_hdf5(str(path))
    dst = caffe_ocl.Net(proto, caffe_ocl.TEST)
    load_net_weights(dst, str(path))          # what train/test/time --weights call
    np.testing.assert_array_equal(dst.params["conv"][0].data, src.params["conv"][0].data)
    assert os.path.getsize(path) > 0


SHARED = """name: "shared"
input: "data" input_shape { dim: 2 dim: 3 }
layer { name: "a" type: "InnerProduct" bottom: "data" top: "a" param { name: "w" }
  inner_product_param { num_output: 3 bias_term: false weight_filler { type: "gaussian" } } }
layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "w" }
  inner_product_param { num_output: 3 bias_term: false } }
"""


def test_shared_params_written_once_and_loaded(tmp_path):
    proto = tmp_path / "shared.prototxt"
    proto.write_text(SHARED)
    src = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    path = tmp_path / "shared.h5"
    src.save_hdf5(str(path))
    with h5py.File(path, "r") as f:
        assert list(f["data/a"]) == ["0"] and list(f["data/b"]) == []
    dst = caffe_ocl.Net(str(proto), caffe_ocl.TEST)
    dst.load_hdf5(str(path))
    np.testing.assert_array_equal(dst.params["b"][0].data, src.params["a"][0].data)
