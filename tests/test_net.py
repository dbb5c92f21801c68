"""Net construction and the pycaffe Net API: filtering by NetState, split
insertion, in-place layers, shared parameters, forward/backward ranges,
saving and loading weights, and the errors for bad nets."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import NetError, ParseError, ShapeError, FileNotFound
from caffe_ocl.proto import caffe_pb2, parse_net_text, read_net_binary

SIMPLE = """
name: "simple"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 }
                              bias_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip" top: "out"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
"""


def _net(tmp_path, text, phase=caffe.TEST, name="net.prototxt", **kw):
    p = tmp_path / name
    p.write_text(text)
    return caffe.Net(str(p), phase, **kw)


def _ref_simple(net, x):
    w1, b1 = (a.data.astype(np.float64) for a in net.params["ip"])
    w2, b2 = (a.data.astype(np.float64) for a in net.params["ip2"])
    return np.maximum(x @ w1.T + b1, 0) @ w2.T + b2


def test_forward_and_pycaffe_properties(tmp_path, rng):
    net = _net(tmp_path, SIMPLE)
    assert list(net.blobs) == ["data", "ip", "out"]
    assert list(net.params) == ["ip", "ip2"]
    assert net.inputs == ["data"] and net.outputs == ["out"]
    assert net.top_names["relu"] == ["ip"] and net.bottom_names["ip2"] == ["ip"]
    assert isinstance(net.layer_dict["ip"], caffe.Layer)
    assert [l.type for l in net.layers] == ["Input", "InnerProduct", "ReLU", "InnerProduct"]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = net.forward(data=x)
    np.testing.assert_allclose(out["out"], _ref_simple(net, x), rtol=1e-4, atol=1e-5)
    # pycaffe style: write the input blob, forward with no arguments
    x2 = rng.standard_normal((2, 3)).astype(np.float32)
    net.blobs["data"].data[...] = x2
    net.forward()
    np.testing.assert_allclose(net.blobs["out"].data, _ref_simple(net, x2), rtol=1e-4, atol=1e-5)
    # writing weights on the host is seen by the next forward
    net.params["ip2"][1].data[...] = 10.0
    net.forward()
    np.testing.assert_allclose(net.blobs["out"].data, _ref_simple(net, x2), rtol=1e-4, atol=1e-5)


def test_forward_start_end_and_blobs(tmp_path, rng):
    net = _net(tmp_path, SIMPLE)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = net.forward(end="relu", data=x)
    assert set(out) == {"ip"}
    net.blobs["ip"].data[...] = 1.0
    out = net.forward(start="ip2", blobs=["ip"])
    w2, b2 = net.params["ip2"][0].data, net.params["ip2"][1].data
    np.testing.assert_allclose(out["out"], np.ones((2, 4)) @ w2.T + b2, rtol=1e-5)
    with pytest.raises(NetError, match="no layer named"):
        net.forward(start="nope")
    with pytest.raises(NetError, match="do not match"):
        net.forward(wrong=x)
    with pytest.raises(ShapeError, match="batch sized"):
        net.forward(data=np.zeros((3, 3)))


def test_reshape_input_propagates(tmp_path, rng):
    net = _net(tmp_path, SIMPLE)
    net.blobs["data"].reshape(5, 3)
    net.reshape()
    assert net.blobs["out"].shape == (5, 2)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    out = net.forward(data=x)
    np.testing.assert_allclose(out["out"], _ref_simple(net, x), rtol=1e-4, atol=1e-5)


def test_forward_all_batches(tmp_path, rng):
    net = _net(tmp_path, SIMPLE)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    out = net.forward_all(data=x)
    np.testing.assert_allclose(out["out"], _ref_simple(net, x), rtol=1e-4, atol=1e-5)


PHASED = """
name: "phased"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "train_only" type: "ReLU" bottom: "data" top: "a" include { phase: TRAIN } }
layer { name: "test_only" type: "Sigmoid" bottom: "data" top: "a" include { phase: TEST } }
layer { name: "staged" type: "TanH" bottom: "a" top: "b" include { stage: "deploy" } }
layer { name: "not_deploy" type: "TanH" bottom: "a" top: "c" exclude { stage: "deploy" } }
layer { name: "leveled" type: "TanH" bottom: "a" top: "d" include { min_level: 2 } }
"""


def test_net_state_filtering(tmp_path):
    names = lambda net: [l.name for l in net.layers if l.type != "Split"]
    assert names(_net(tmp_path, PHASED, caffe.TRAIN)) == ["data", "train_only", "not_deploy"]
    assert names(_net(tmp_path, PHASED, caffe.TEST)) == ["data", "test_only", "not_deploy"]
    assert names(_net(tmp_path, PHASED, caffe.TEST, stages=["deploy"])) == ["data", "test_only", "staged"]
    assert names(_net(tmp_path, PHASED, caffe.TEST, level=3)) == ["data", "test_only", "not_deploy", "leveled"]


BRANCHED = """
name: "branched"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "a" type: "TanH" bottom: "ip" top: "a" }
layer { name: "b" type: "Sigmoid" bottom: "ip" top: "b" }
layer { name: "c" type: "ReLU" bottom: "ip" top: "c" }
"""


def test_split_layers_named_as_caffe_and_gradients_summed(tmp_path, rng):
    net = _net(tmp_path, BRANCHED, caffe.TRAIN)
    assert "ip_ip_0_split" in [l.name for l in net.layers]
    assert net.bottom_names["b"] == ["ip_ip_0_split_1"]
    assert sorted(net.outputs) == ["a", "b", "c"]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = net.forward(data=x)
    h = x.astype(np.float64) @ net.params["ip"][0].data.T.astype(np.float64) + net.params["ip"][1].data
    np.testing.assert_allclose(out["a"], np.tanh(h), rtol=1e-5, atol=1e-6)
    # gradient of sum(a + b + c) w.r.t. ip's output is the sum of three branch gradients
    ones = np.ones((2, 3), np.float32)
    grads = net.backward(diffs=["ip"], a=ones, b=ones, c=ones)
    s = 1 / (1 + np.exp(-h))
    ref = (1 - np.tanh(h) ** 2) + s * (1 - s) + (h > 0)
    np.testing.assert_allclose(grads["ip"], ref, rtol=1e-4, atol=1e-5)


SHARED = """
name: "shared"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "o1"
        param { name: "w" lr_mult: 1 } param { name: "bias" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "data" top: "o2"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
"""


def test_shared_parameters(tmp_path, rng):
    net = _net(tmp_path, SHARED, caffe.TRAIN)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = net.forward(data=x)
    np.testing.assert_allclose(out["o1"], out["o2"], rtol=1e-6)
    assert len(net.learnable_params) == 2
    net.params["ip1"][0].data[...] = 0.5
    out = net.forward(data=x)
    np.testing.assert_allclose(out["o2"], x @ np.full((3, 3), 0.5) + net.params["ip2"][1].data,
                               rtol=1e-5, atol=1e-6)
    # the shared weight's gradient collects both uses
    net.clear_param_diffs()
    ones = np.ones((2, 3), np.float32)
    net.backward(o1=ones, o2=ones)
    np.testing.assert_allclose(net.params["ip1"][0].diff, 2 * np.outer(np.ones(3), x.sum(0)),
                               rtol=1e-5)


def test_shared_parameter_shape_mismatch(tmp_path):
    bad = SHARED.replace("num_output: 3 weight_filler { type: \"gaussian\" std: 1 } } }\n\"\"\"", "")
    bad = SHARED.rsplit("num_output: 3", 1)[0] + 'num_output: 4 weight_filler { type: "gaussian" } } }'
    with pytest.raises(ShapeError, match="cannot share param 'w'"):
        _net(tmp_path, bad)


def test_save_and_copy_from_roundtrip(tmp_path, rng):
    net = _net(tmp_path, SIMPLE)
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    loaded = read_net_binary(str(path))
    assert [l.name for l in loaded.layer if len(l.blobs)] == ["ip", "ip2"]
    net2 = _net(tmp_path, SIMPLE, weights=str(path))
    for name in net.params:
        for a, b in zip(net.params[name], net2.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    net3 = caffe.Net(str(tmp_path / "net.prototxt"), str(path), caffe.TEST)   # pycaffe's other order
    np.testing.assert_array_equal(net3.params["ip"][0].data, net.params["ip"][0].data)


def test_copy_from_shape_mismatch_names_layer(tmp_path):
    net = _net(tmp_path, SIMPLE)
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    other = _net(tmp_path, SIMPLE.replace("num_output: 4", "num_output: 5"), name="other.prototxt")
    with pytest.raises(ShapeError, match=r"layer 'ip'; shape mismatch.*4 3 .*5 3"):
        other.copy_from(str(path))


def test_legacy_4d_inner_product_weights_load(tmp_path):
    net = _net(tmp_path, SIMPLE)
    param = caffe_pb2.NetParameter()
    lp = param.layer.add()
    lp.name, lp.type = "ip", "InnerProduct"
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    for arr in (w, np.zeros(4, np.float32)):
        bp = lp.blobs.add()
        bp.num, bp.channels = 1, 1
        bp.height, bp.width = (4, 3) if arr.ndim == 2 else (1, 4)
        bp.data.extend(arr.ravel())
    net.copy_from(param)
    np.testing.assert_array_equal(net.params["ip"][0].data, w)


def test_unknown_layer_type_suggests_close_names(tmp_path):
    with pytest.raises(NetError, match=r"unknown layer type 'Convolutoin'.*Convolution"):
        _net(tmp_path, SIMPLE + 'layer { name: "x" type: "Convolutoin" bottom: "out" top: "y" }')


def test_missing_bottom_names_layer_and_blob(tmp_path):
    with pytest.raises(NetError, match=r"layer 'x'.*unknown bottom blob 'nothere'"):
        _net(tmp_path, SIMPLE + 'layer { name: "x" type: "ReLU" bottom: "nothere" top: "y" }')


def test_duplicate_top_is_an_error(tmp_path):
    with pytest.raises(NetError, match="multiple sources"):
        _net(tmp_path, SIMPLE + 'layer { name: "x" type: "ReLU" bottom: "data" top: "out" }')


def test_malformed_prototxt_names_file_line_column(tmp_path):
    with pytest.raises(ParseError, match=r"net.prototxt:3:\d+"):
        _net(tmp_path, 'name: "x"\nlayer { name: "a" type: "ReLU"\n  bottom: data }\n')


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFound, match="nowhere.prototxt"):
        caffe.Net(str(tmp_path / "nowhere.prototxt"), caffe.TEST)
    with pytest.raises(FileNotFound, match="nowhere.caffemodel"):
        _net(tmp_path, SIMPLE, weights=str(tmp_path / "nowhere.caffemodel"))


def test_net_from_netparameter_and_input_dim_upgrade(rng):
    param = parse_net_text('name: "old" input: "data" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3\n'
                           'layer { name: "relu" type: "ReLU" bottom: "data" top: "r" }')
    net = caffe.Net(param, caffe.TEST)
    assert net.inputs == ["data"] and net.blobs["data"].shape == (1, 2, 3, 3)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(net.forward(data=x)["r"], np.maximum(x, 0))


def test_backward_needs_and_force_backward(tmp_path, rng):
    net = _net(tmp_path, SIMPLE, caffe.TRAIN)
    # no loss: nothing needs backward (Caffe's pruning)
    assert not any(net.graph.layer_need_backward)
    net = _net(tmp_path, "force_backward: true\n" + SIMPLE, caffe.TRAIN)
    assert all(net.graph.layer_need_backward[1:])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    net.forward(data=x)
    g = net.backward(out=np.ones((2, 2), np.float32))
    w1, b1 = (a.data.astype(np.float64) for a in net.params["ip"])
    w2 = net.params["ip2"][0].data.astype(np.float64)
    h = x @ w1.T + b1
    ref = ((np.ones((2, 2)) @ w2) * (h > 0)) @ w1
    np.testing.assert_allclose(g["data"], ref, rtol=1e-4, atol=1e-5)


def test_loss_weight_on_any_top_drives_backward(tmp_path, rng):
    text = SIMPLE.replace('layer { name: "ip2" type: "InnerProduct" bottom: "ip" top: "out"',
                          'layer { name: "ip2" type: "InnerProduct" bottom: "ip" top: "out" loss_weight: 2')
    net = _net(tmp_path, text, caffe.TRAIN)
    assert net.graph.layer_need_backward[-1]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    net.forward(data=x)
    assert net.loss() == pytest.approx(2 * float(net.blobs["out"].data.sum()), rel=1e-5)
    net.clear_param_diffs()
    net.backward()
    h = np.maximum(x @ net.params["ip"][0].data.T + net.params["ip"][1].data, 0)
    np.testing.assert_allclose(net.params["ip2"][0].diff, 2 * np.outer(np.ones(2), h.sum(0)),
                               rtol=1e-4)


POOL_NET = """
{force}layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 2 dim: 3 dim: 8 dim: 8 }} }} }}
layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool"
        pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
"""


@pytest.mark.parametrize("force", [False, True])
def test_max_pool_mask_only_where_backward_runs(tmp_path, rng, force):
    """A deploy net (no loss, no force_backward) runs no backward, so its MAX
    pooling keeps no argmax mask (Caffe's max_idx_ would be written and
    never read); with force_backward it keeps one and the gradient goes to
    each window's maximum. Same outputs either way."""
    net = _net(tmp_path, POOL_NET.format(force="force_backward: true\n" if force else ""))
    pool = net.layer_dict["pool"]
    assert (pool.mask is not None) == force
    x = rng.permutation(2 * 3 * 64).reshape(2, 3, 8, 8).astype(np.float32)
    net.blobs["data"].data[...] = x
    out = net.forward()["pool"]
    windows = x.reshape(2, 3, 4, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 4, 4, 4)
    np.testing.assert_array_equal(out, windows.max(-1))
    if force:
        dy = rng.standard_normal(out.shape).astype(np.float32)
        net.blobs["pool"].diff[...] = dy
        dx = net.backward()["data"]
        ref = np.zeros_like(windows)
        np.put_along_axis(ref, windows.argmax(-1)[..., None], dy[..., None], axis=-1)
        ref = ref.reshape(2, 3, 4, 4, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(x.shape)
        np.testing.assert_allclose(dx, ref, rtol=1e-6)
