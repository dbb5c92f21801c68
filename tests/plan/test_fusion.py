"""TEST-phase folding (caffe_ocl/plan/fold.py): BatchNorm/Scale into the
producer's weights, activations into the GEMM epilogue; and the GEMM
activation epilogue itself (ops.gemm act=)."""
import numpy as np
import pytest

from caffe_ocl.plan import fold as fusion
from caffe_ocl.device import get_device
from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST, TRAIN
from caffe_ocl.ops import gemm as gemm_ops
from caffe_ocl.proto import parse_net_text

# conv(no bias) -> BN -> Scale -> ReLU (in place), 1x1 grouped conv(bias) ->
# ReLU(slope), grouped conv -> BN, transposed IP -> BN -> Scale -> Clip,
# IP -> BN -> ReLU.
RESNET = """
name: "tiny_resnet"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 9 dim: 7 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 stride: 2 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 1 group: 2
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2"
        relu_param { negative_slope: 0.1 } }
layer { name: "conv3" type: "Convolution" bottom: "conv2" top: "conv3"
        convolution_param { num_output: 6 kernel_size: 3 group: 2 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn3" type: "BatchNorm" bottom: "conv3" top: "conv3"
        batch_norm_param { eps: 0.001 } }
layer { name: "fc1" type: "InnerProduct" bottom: "conv3" top: "fc1"
        inner_product_param { num_output: 7 transpose: true
                              weight_filler { type: "gaussian" std: 0.2 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bnf" type: "BatchNorm" bottom: "fc1" top: "fc1" }
layer { name: "scalef" type: "Scale" bottom: "fc1" top: "fc1" }
layer { name: "clipf" type: "Clip" bottom: "fc1" top: "fc1"
        clip_param { min: -0.5 max: 0.7 } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.4 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bnf2" type: "BatchNorm" bottom: "fc2" top: "fc2" }
layer { name: "relu_f2" type: "ReLU" bottom: "fc2" top: "fc2" }
"""

def _net(text=RESNET, **kw):
    return Net(parse_net_text(text), TEST, **kw)


def _randomize(net, rng):
    """Random weights everywhere; BN statistics with scale factor != 1."""
    for name, blobs in net.params.items():
        if name.startswith("bn"):
            c = blobs[0].shape[0]
            sf = rng.uniform(0.5, 3.0)
            blobs[0].data[...] = rng.normal(0, 0.5, c) * sf
            blobs[1].data[...] = rng.uniform(0.3, 2.0, c) * sf
            blobs[2].data[...] = sf
        else:
            for b in blobs:
                b.data[...] = rng.normal(0, 0.5, b.shape)


def _copy_params(dst, src):
    for name, blobs in src.params.items():
        for d, s in zip(dst.params[name], blobs):
            d.data[...] = s.host_data()     # (host_data: no version bump on src)


def _assert_blobs_equal(a, b, names=None):
    for name in names or b.blobs:
        x, y = a.blobs[name].data, b.blobs[name].data
        scale = max(float(np.abs(y).max()), 1.0)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def _reference(ref_text, src_net, x):
    ref = _net(ref_text, fold=False)
    assert ref.plan.fold_groups == []
    _copy_params(ref, src_net)
    ref.forward(data=x)
    return ref


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(3)
    folded, plain = _net(), _net(fold=False)
    _randomize(folded, rng)
    _copy_params(plain, folded)
    return folded, plain


def _x(rng, shape=(2, 3, 9, 7)):
    return rng.normal(0, 1, shape).astype(np.float32)


def test_chains_found(pair):
    folded, plain = pair
    assert plain.plan.fold_groups == []
    desc = [c.describe() for c in folded.plan.fold_groups]
    assert desc == ["conv1 <- bn1, scale1, relu1", "conv2 <- relu2", "conv3 <- bn3",
                    "fc1 <- bnf, scalef, clipf", "fc2 <- bnf2, relu_f2"]
    # layers and params stay visible to pycaffe users
    assert list(folded.params) == list(plain.params)
    assert list(folded.blobs) == list(plain.blobs)
    assert folded.graph.layer_names == plain.graph.layer_names


def test_folded_forward_matches_plain(pair, rng):
    folded, plain = pair
    for _ in range(2):
        x = _x(rng)
        out_f = folded.forward(data=x)
        out_p = plain.forward(data=x)
        assert set(out_f) == set(out_p) == {"fc2"}
        _assert_blobs_equal(folded, plain)
    # the activations really were applied (some clipped, some negative-slope)
    fc1 = folded.blobs["fc1"].data
    assert fc1.max() <= 0.7 + 1e-6 and fc1.min() >= -0.5 - 1e-6
    assert (folded.blobs["conv1"].data == 0).any()
    assert (folded.blobs["conv2"].data < 0).any()


def test_param_writes_refold(pair, rng):
    folded, plain = pair
    x = _x(rng)
    folded.forward(data=x)
    for net in (folded, plain):   # same edits to both after a forward
        net.params["bn1"][0].data[...] *= -1.5
        net.params["bn1"][2].data[...] = 0.25
        net.params["scale1"][1].data[...] += 0.3
        net.params["bnf"][1].data[...] *= 2.0
        net.params["conv2"][1].data[...] -= 0.2
        net.params["fc1"][0].data[...] *= 0.5
    folded.forward(data=x)
    plain.forward(data=x)
    _assert_blobs_equal(folded, plain)
    # scale factor 0 (Caffe: statistics read as 0)
    for net in (folded, plain):
        net.params["bn3"][2].data[...] = 0.0
    folded.forward(data=x)
    plain.forward(data=x)
    _assert_blobs_equal(folded, plain)


def test_copy_from_refolds(tmp_path, rng):
    folded = _net()
    _randomize(folded, rng)
    x = _x(rng)
    before = folded.forward(data=x)["fc2"].copy()
    src = _net(fold=False)
    _randomize(src, rng)
    path = tmp_path / "w.caffemodel"
    src.save(str(path))
    folded.copy_from(str(path))
    folded.forward(data=x)
    src.forward(data=x)
    _assert_blobs_equal(folded, src)
    assert not np.allclose(folded.blobs["fc2"].data, before)
    # weights given at construction are folded too
    built = _net(weights=str(path))
    assert built.plan.fold_groups != []
    built.forward(data=x)
    _assert_blobs_equal(built, src)


def test_reshape_rebuilds(rng):
    folded, plain = _net(), _net(fold=False)
    _randomize(folded, rng)
    _copy_params(plain, folded)
    # batch and conv1 input size change; conv1 output (and fc1 input) keep their size
    for shape in ((1, 3, 9, 7), (3, 3, 10, 8), (2, 3, 9, 7)):
        for net in (folded, plain):
            net.blobs["data"].reshape(*shape)
            net.reshape()
        x = _x(rng, shape)
        folded.forward(data=x)
        plain.forward(data=x)
        assert folded.blobs["conv1"].shape == plain.blobs["conv1"].shape
        _assert_blobs_equal(folded, plain)


def test_partial_forward_is_unfolded(rng):
    folded = _net()
    _randomize(folded, rng)
    plain = _net(fold=False)
    _copy_params(plain, folded)
    x = _x(rng)
    for net in (folded, plain):
        net.blobs["data"].data[...] = x
        net.forward(end="conv1")          # Caffe: conv1 holds the raw convolution
    _assert_blobs_equal(folded, plain, ["conv1"])
    for net in (folded, plain):
        net.forward(start="bn1", end="scale1")
    _assert_blobs_equal(folded, plain, ["conv1"])
    for net in (folded, plain):
        net.forward(start="relu1")
    _assert_blobs_equal(folded, plain)


NOT_IN_PLACE = """
name: "bn_out_of_place"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 bias_term: false } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "bn1" }
layer { name: "scale1" type: "Scale" bottom: "bn1" top: "bn1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "bn1" top: "bn1" }
layer { name: "conv2" type: "Convolution" bottom: "data" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "side" type: "Pooling" bottom: "conv2" top: "side"
        pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "relu2" }
layer { name: "conv3" type: "Convolution" bottom: "data" top: "conv3"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn3" type: "BatchNorm" bottom: "conv3" top: "conv3"
        batch_norm_param { use_global_stats: false } }
layer { name: "scale3" type: "Scale" bottom: "conv3" top: "conv3" }
"""


def test_non_foldable_left_alone(rng):
    net = _net(NOT_IN_PLACE)
    # conv1: BN not in place (folded all the same, BatchNorm's new top
    # written by the convolution and conv1 computed when read:
    # plan/chain.py NewTopChain); conv2: read by a Split (pooling + relu); conv3:
    # BN computes batch statistics.
    assert net.plan.describe() == ["conv1 <- bn1, scale1, relu1 (new tops)"]
    assert any(n.endswith("_split") for n in net.graph.layer_names)
    _randomize(net, rng)
    x = _x(rng, (2, 3, 5, 5))
    net.forward(data=x)
    ref = _reference(NOT_IN_PLACE, net, x)
    _assert_blobs_equal(net, ref)
    conv1 = net.blobs["conv1"].data
    assert not np.allclose(conv1, net.blobs["bn1"].data)


def test_mixed_chain_partly_foldable(rng):
    # the same net with conv1's chain made in place, plus Scale without BN
    # (-> ReLU6), and ReLU before BN (the BN stays a layer of its own)
    text = NOT_IN_PLACE.replace('bottom: "conv1" top: "bn1"', 'bottom: "conv1" top: "conv1"') \
        .replace('bottom: "bn1" top: "bn1"', 'bottom: "conv1" top: "conv1"') + """
layer { name: "conv4" type: "Convolution" bottom: "data" top: "conv4"
        convolution_param { num_output: 3 kernel_size: 2 } }
layer { name: "scale4" type: "Scale" bottom: "conv4" top: "conv4" }
layer { name: "relu6" type: "ReLU6" bottom: "conv4" top: "conv4" }
layer { name: "conv5" type: "Convolution" bottom: "data" top: "conv5"
        convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "relu5" type: "ReLU" bottom: "conv5" top: "conv5" }
layer { name: "bn5" type: "BatchNorm" bottom: "conv5" top: "conv5" }
"""
    net = _net(text)
    assert [c.describe() for c in net.plan.fold_groups] == [
        "conv1 <- bn1, scale1, relu1", "conv4 <- scale4, relu6", "conv5 <- relu5"]
    _randomize(net, rng)
    x = _x(rng, (2, 3, 5, 5))
    net.forward(data=x)
    _assert_blobs_equal(net, _reference(text, net, x))


def test_fold_switches(monkeypatch):
    assert _net(fold=False).plan.fold_groups == []
    monkeypatch.setenv("CAFFE_OCL_FOLD", "0")
    assert _net().plan.fold_groups == []
    assert _net(fold=True).plan.fold_groups == []
    monkeypatch.delenv("CAFFE_OCL_FOLD")
    assert _net().plan.fold_groups != []
    # TRAIN: off by default; force_backward: off by default
    assert Net(parse_net_text(RESNET), TRAIN).plan.fold_groups == []
    assert _net("force_backward: true\n" + RESNET).plan.fold_groups == []
    assert fusion.fold_enabled(None, TEST) and not fusion.fold_enabled(None, TRAIN)


def test_backward_on_folded_net_raises(rng):
    folded = _net()
    folded.forward(data=_x(rng))
    with pytest.raises(NetError, match="fold=False"):
        folded.backward()
    # plain net: backward still works
    text = "force_backward: true\n" + RESNET
    plain = _net(text)
    assert plain.plan.fold_groups == []
    plain.forward(data=_x(rng))
    plain.backward()


def test_unfold(rng):
    net = _net()
    _randomize(net, rng)
    x = _x(rng)
    net.forward(data=x)
    folded_out = {k: v.data.copy() for k, v in net.blobs.items()}
    fusion.unfold(net)
    net.forward(data=x)
    for k, v in folded_out.items():
        np.testing.assert_allclose(net.blobs[k].data, v, rtol=1e-5,
                                   atol=1e-5 * max(1.0, float(np.abs(v).max())))


def test_shared_weights_solver_style(rng):
    """A TEST net whose params are re-pointed at a TRAIN net's storage, then
    updated on the device (as the solver does): the fold follows both."""
    train = Net(parse_net_text(RESNET), TRAIN)
    test = _net()
    _randomize(train, rng)
    x = _x(rng)
    test.forward(data=x)
    test.share_trained_layers_with(train)
    test.forward(data=x)
    _assert_blobs_equal(test, _reference(RESNET, train, x))
    # a device-side write of a shared param (e.g. a solver update)
    from caffe_ocl.ops import pointwise
    w = train.params["conv1"][0]
    w.data_mem.to_device()
    pointwise.axpby(train.device, w.count, 0.0, w.data_buffer(), 2.0, w.data_buffer()).run(
        train.device.queue)
    w.data_mem.device_written()
    test.forward(data=x)
    _assert_blobs_equal(test, _reference(RESNET, train, x))


# ---- GEMM activation epilogue -------------------------------------------------

def _buf(dev, arr):
    import pyopencl as cl
    return cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                     hostbuf=np.ascontiguousarray(arr, np.float32))


def _read(dev, buf, shape):
    import pyopencl as cl
    out = np.empty(shape, np.float32)
    cl.enqueue_copy(dev.queue, out, buf)
    dev.queue.finish()
    return out


# gemm.cl's GPU tiles cost ~25 s of PoCL compile per ACT variant, so on the
# CPU they run with -m slow (and in the GPU runs, where "device" is them).
@pytest.mark.parametrize("kernel", ["device", pytest.param("gpu_tiles", marks=pytest.mark.slow)])
@pytest.mark.parametrize("act", [("relu", 0.0), ("relu", 0.25), ("clip", -0.3, 0.4)])
def test_gemm_act_epilogue(kernel, act, rng, monkeypatch):
    dev = get_device()
    if kernel == "gpu_tiles":       # run gemm.cl's tiled kernel on this device too
        monkeypatch.setattr(dev, "is_cpu", False)
    # K > 128 exercises gemm_cpu.cl's multi-panel accumulation before the act
    for (M, N, K, bias_axis, beta) in ((5, 19, 7, 0, 0.0), (33, 70, 150, 1, 0.5)):
        a = rng.normal(0, 1, (M, K)).astype(np.float32)
        b = rng.normal(0, 1, (K, N)).astype(np.float32)
        c0 = rng.normal(0, 1, (M, N)).astype(np.float32)
        bias = rng.normal(0, 1, M if bias_axis == 0 else N).astype(np.float32)
        A, B, BIAS, C, C2 = (_buf(dev, v) for v in (a, b, bias, c0, c0))  # kept alive
        gemm_ops.gemm(dev, M, N, K, A, B, C, alpha=0.7, beta=beta,
                      bias=BIAS, bias_axis=bias_axis, act=act).run(dev.queue)
        z = 0.7 * (a.astype(np.float64) @ b) + beta * c0 + \
            (bias[:, None] if bias_axis == 0 else bias[None, :])
        if act[0] == "relu":
            ref = np.where(z > 0, z, act[1] * z)
        else:
            ref = np.clip(z, act[1], act[2])
        got = _read(dev, C, (M, N))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        # without act the same launch gives the plain result
        gemm_ops.gemm(dev, M, N, K, A, B, C2, alpha=0.7, beta=beta,
                      bias=BIAS, bias_axis=bias_axis).run(dev.queue)
        np.testing.assert_allclose(_read(dev, C2, (M, N)), z, rtol=1e-5, atol=1e-5)


def test_gemm_act_rejects_unknown():
    dev = get_device()
    with pytest.raises(ValueError, match="activation"):
        gemm_ops.gemm(dev, 2, 2, 2, None, None, None, act=("tanh",))


SOLVER_NET = """
name: "bn_train"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 2 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 bias_term: false
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "z"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "t" type: "TanH" bottom: "z" top: "t" loss_weight: 1 }
"""


def test_solver_test_net_follows_training(rng):
    """The solver's TEST net shares the TRAIN net's weights and BatchNorm
    statistics (updated on the device every iteration): its folded forward
    stays equal to an unfolded net with the same parameters."""
    import caffe_ocl as caffe
    from caffe_ocl.proto import parse_solver_text
    p = parse_solver_text('type: "SGD" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9 '
                          'test_iter: 1 test_interval: 1000')
    p.net_param.CopyFrom(parse_net_text(SOLVER_NET))
    solver = caffe.solvers.solver_class(p.type)(p)
    tn = solver.test_nets[0]
    assert tn.plan.fold_groups != []
    x = _x(rng, (3, 2, 5, 5))
    solver.net.blobs["x"].data[...] = x
    tn.blobs["x"].data[...] = x
    for _ in range(2):
        solver.step(2)
        solver.test(0)
        assert solver.net.params["bn"][2].host_data()[0] > 0    # statistics were accumulated
        ref = Net(parse_net_text(SOLVER_NET), TEST, fold=False)
        _copy_params(ref, solver.net)
        ref.forward(x=x)
        _assert_blobs_equal(tn, ref)
