"""TEST rewrite of BatchNorm (global statistics) -> Scale -> activation that
cannot fold into a producer (caffe_ocl/plan/affine.py): BatchNorm writing
a new top (published MobileNet v2 / DenseNet prototxts), or after a Concat
or an Eltwise. Every blob equals the unfused net's."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST, TRAIN
from caffe_ocl.plan import affine
from caffe_ocl.proto import parse_net_text

# conv1 -> bn (new top) -> scale/relu6 in place (MobileNet v2's form), a
# depthwise conv -> bn (new top) -> relu (no Scale), concat -> bn (new top)
# -> scale without bias (DenseNet's form), eltwise -> bn in place -> scale
# -> clip, and a conv whose top is also read elsewhere.
NET = """
name: "affine"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "conv1/bn" type: "BatchNorm" bottom: "conv1" top: "conv1/bn"
        batch_norm_param { use_global_stats: true eps: 0.001 } }
layer { name: "conv1/scale" type: "Scale" bottom: "conv1/bn" top: "conv1/bn"
        scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU6" bottom: "conv1/bn" top: "conv1/bn" }
layer { name: "dw" type: "Convolution" bottom: "conv1/bn" top: "dw"
        convolution_param { num_output: 4 group: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "dw/bn" type: "BatchNorm" bottom: "dw" top: "dw/bn" }
layer { name: "dw/relu" type: "ReLU" bottom: "dw/bn" top: "dw/bn"
        relu_param { negative_slope: 0.1 } }
layer { name: "cat" type: "Concat" bottom: "conv1/bn" bottom: "dw/bn" top: "cat" }
layer { name: "cat/bn" type: "BatchNorm" bottom: "cat" top: "cat/bn" }
layer { name: "cat/scale" type: "Scale" bottom: "cat/bn" top: "cat/bn" }
layer { name: "pool" type: "Pooling" bottom: "cat/bn" top: "pool"
        pooling_param { pool: AVE kernel_size: 3 stride: 1 } }
layer { name: "sum" type: "Eltwise" bottom: "pool" bottom: "pool2" top: "sum" }
layer { name: "sum/bn" type: "BatchNorm" bottom: "sum" top: "sum" }
layer { name: "sum/scale" type: "Scale" bottom: "sum" top: "sum"
        scale_param { bias_term: true } }
layer { name: "sum/clip" type: "Clip" bottom: "sum" top: "sum"
        clip_param { min: -0.4 max: 0.6 } }
"""
@pytest.fixture(autouse=True)
def chains_not_folded_into_producers():
    """The BatchNorm chains after a convolution here would fold into it
    (plan/chain.py NewTopChain, tested in test_fold_new_top.py): these tests are
    of the pass that runs where no producer can take them."""
    with config.override(FOLD_NEW_TOPS=False):
        yield


# "pool2": a second pooling of cat/bn so that the Eltwise has two bottoms
NET = NET.replace('layer { name: "sum"', '''layer { name: "pool2" type: "Pooling" bottom: "cat/bn" top: "pool2"
        pooling_param { pool: MAX kernel_size: 3 stride: 1 } }
layer { name: "sum"''')


def _net(text=NET, phase=TEST, **kw):
    return Net(parse_net_text(text), phase, **kw)


def _randomize(net, rng):
    for name, blobs in net.params.items():
        if "/bn" in name:
            c = blobs[0].shape[0]
            sf = rng.uniform(0.5, 3.0)
            blobs[0].data[...] = rng.normal(0, 0.5, c) * sf
            blobs[1].data[...] = rng.uniform(0.3, 2.0, c) * sf
            blobs[2].data[...] = sf
        else:
            for b in blobs:
                b.data[...] = rng.normal(0, 0.7, b.shape)


def _pair(rng, text=NET):
    fused, plain = _net(text), _net(text, fold=False)
    _randomize(plain, rng)
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            d.data[...] = s.host_data()
    return fused, plain


def _assert_blobs_equal(a, b, names=None):
    for name in names or b.blobs:
        x, y = a.blobs[name].data, b.blobs[name].data
        scale = max(float(np.abs(y).max()), 1.0)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_chains_found():
    net = _net()
    assert net.plan.describe() == [
        "conv1/bn -> conv1/scale -> relu1", "dw/bn -> dw/relu", "cat/bn -> cat/scale",
        "sum/bn -> sum/scale -> sum/clip"]
    assert all(isinstance(c, affine.AffineActChain) for c in net.plan.fold_groups)
    # BatchNorm with batch statistics, TRAIN nets and fold=False: untouched
    assert _net(fold=False).plan.describe() == []
    assert _net(NET.replace("use_global_stats: true", "use_global_stats: false")) \
        .plan.describe()[0] == "dw/bn -> dw/relu"
    assert not any(isinstance(c, affine.AffineActChain)
                   for c in _net(phase=TRAIN).plan.groups)


@pytest.mark.parametrize("shape", [(2, 3, 6, 6), (1, 3, 5, 3)])   # float4 and scalar
def test_blobs_equal_the_layers(rng, shape):
    fused, plain = _pair(rng)
    x = rng.normal(0, 1, shape).astype(np.float32)
    for net in (fused, plain):
        net.blobs["data"].reshape(*shape)
        net.reshape()
        net.forward(data=x)
    _assert_blobs_equal(fused, plain)
    # the producer's top keeps the raw convolution, not BatchNorm's output
    assert not np.allclose(fused.blobs["conv1"].data, fused.blobs["conv1/bn"].data)
    # parameters written from Python take effect at the next forward
    for net in (fused, plain):
        net.params["cat/scale"][0].data[...] *= -1.5
        net.params["dw/bn"][0].data[...] += 0.25
        net.forward(data=x)
    _assert_blobs_equal(fused, plain)


def test_ranges_cutting_a_chain_run_the_layers(rng):
    fused, plain = _pair(rng)
    x = rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32)
    for net in (fused, plain):
        net.blobs["data"].data[...] = x
        net.forward(end="conv1/scale")          # Caffe: conv1/bn holds the Scale's output
    _assert_blobs_equal(fused, plain, ["conv1", "conv1/bn"])
    for net in (fused, plain):
        net.forward(start="relu1")
    _assert_blobs_equal(fused, plain)


def test_backward_through_a_scale_chain_is_refused(rng):
    text = "force_backward: true\n" + NET
    assert _net(text).plan.describe() == []             # not folded: backward runs
    net = _net()
    with pytest.raises(NetError, match="backward through a folded net"):
        net.backward()
    net.unfold()
    assert net.plan.describe() == []


# ONNX's form (converted DenseNet): every layer of the chain writes a new
# top; and the mixed forms (Scale in place on BatchNorm's new top, then a
# ReLU into a new top; Scale into a new top, ReLU in place on it); a chain
# whose middle blob is read elsewhere stops there.
NEW_TOPS = """
name: "affine_new_tops"
layer { name: "data" type: "Input" top: "data" top: "t"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "cat" type: "Concat" bottom: "data" bottom: "data" top: "cat" }
layer { name: "a/bn" type: "BatchNorm" bottom: "cat" top: "a_bn" }
layer { name: "a/scale" type: "Scale" bottom: "a_bn" top: "a_sc" scale_param { bias_term: true } }
layer { name: "a/relu" type: "ReLU" bottom: "a_sc" top: "a_r" }
layer { name: "conv" type: "Convolution" bottom: "a_r" top: "c"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "b/bn" type: "BatchNorm" bottom: "c" top: "b_bn" }
layer { name: "b/scale" type: "Scale" bottom: "b_bn" top: "b_bn" scale_param { bias_term: true } }
layer { name: "b/relu" type: "ReLU" bottom: "b_bn" top: "b_r" }
layer { name: "d/bn" type: "BatchNorm" bottom: "b_r" top: "d_bn" }
layer { name: "d/scale" type: "Scale" bottom: "d_bn" top: "d_sc" }
layer { name: "d/relu" type: "ReLU" bottom: "d_sc" top: "d_sc" relu_param { negative_slope: 0.2 } }
layer { name: "e/bn" type: "BatchNorm" bottom: "d_sc" top: "e_bn" }
layer { name: "e/scale" type: "Scale" bottom: "e_bn" top: "e_sc" scale_param { bias_term: true } }
layer { name: "e/relu" type: "ReLU" bottom: "e_sc" top: "e_r" }
layer { name: "peek" type: "Pooling" bottom: "e_sc" top: "peek" pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "e_r" bottom: "t" top: "loss" }
"""


def test_new_top_chains(rng):
    from caffe_ocl import config
    fused, plain = _pair(rng, NEW_TOPS)
    assert fused.plan.describe() == [
        "a/bn -> a/scale -> a/relu", "b/bn -> b/scale -> b/relu", "d/bn -> d/scale -> d/relu",
        "e/bn -> e/scale"]
    with config.override(AFFINE_NEW_TOPS=False):
        assert _net(NEW_TOPS).plan.describe() == ["b/bn -> b/scale"]
    x, t = (rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32) for _ in range(2))
    for net in (fused, plain):
        net.forward(data=x, t=t)
    # the blobs before each chain's last are left to be computed on read
    assert all(fused.blobs[n].compute_on_read is not None for n in ("a_bn", "a_sc", "b_bn"))
    assert fused.blobs["d_bn"].compute_on_read is not None
    _assert_blobs_equal(fused, plain, ["e_r", "a_r", "b_r", "d_sc"])
    _assert_blobs_equal(fused, plain)
    assert fused.blobs["a_sc"].compute_on_read is None
    # forward ranges cutting the chains
    for net in (fused, plain):
        net.forward(data=x * 2, t=t)
        net.forward(start="a/scale", end="b/scale")
        net.forward(start="b/relu")
    _assert_blobs_equal(fused, plain)
    # backward: chains without an in-place Scale lose nothing; b's does
    assert [c.loses_values for c in fused.plan.fold_groups] == [False, True, False, False]
    with pytest.raises(NetError, match="backward through a folded net"):
        fused.backward()
    fused2, plain2 = _pair(rng, NEW_TOPS.replace('top: "b_bn" scale_param', 'top: "b_sc" '
                                                 'scale_param').replace(
        'bottom: "b_bn" top: "b_r"', 'bottom: "b_sc" top: "b_r"'))
    assert not any(c.loses_values for c in fused2.plan.fold_groups)
    for net in (fused2, plain2):
        net.forward(data=x, t=t)
    gf, gp = fused2.backward(diffs=["data"]), plain2.backward(diffs=["data"])
    np.testing.assert_allclose(gf["data"], gp["data"], rtol=1e-4, atol=1e-5)
    for name, blobs in plain2.params.items():
        for d, s in zip(fused2.params[name], blobs):
            np.testing.assert_allclose(d.diff, s.diff, rtol=1e-4, atol=1e-5, err_msg=name)
    _assert_blobs_equal(fused2, plain2)


def test_statistics_recomputed_only_when_the_batchnorm_blobs_change(monkeypatch, rng):
    """The mean/std launch of a chain runs again only after a BatchNorm blob
    may have changed: one kernel launch less per chain on repeated
    forwards, and a host write of the running variance still takes effect."""
    # counts the commands of a pass: without shared activations (their
    # first pass reruns on the own buffers; each copies its inputs)
    monkeypatch.setenv("CAFFE_OCL_SHARE_ACTIVATIONS", "0")
    import pyopencl as cl
    from caffe_ocl import device
    fused, plain = _pair(rng)
    x = rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32)

    class Kinds(list):
        # keeps each command's type, not the event: an upload's event holds
        # its host array, which blob.refresh_kept would take for a view the
        # user kept (and upload that parameter again at every forward)
        def append(self, ev):
            super().append(ev.command_type)

    def kernels(net):
        sink = Kinds()
        with device.record_events(sink):
            net.forward(data=x)
        return sink.count(cl.command_type.NDRANGE_KERNEL)

    kernels(fused)                              # the first forward also fills buffers
    again = kernels(fused)
    assert kernels(fused) == again
    bns = [n for n in fused.params if n.endswith("/bn")]
    assert len(bns) == 4
    for net in (fused, plain):
        for n in bns:
            net.params[n][2].data[...] = net.params[n][2].data   # a write, same values
    assert kernels(fused) == again + len(bns)   # each chain's statistics again
    assert kernels(fused) == again
    for net in (fused, plain):
        net.params["cat/bn"][1].data[...] *= 2.5
    assert kernels(fused) == again + 1          # only cat/bn's statistics again
    plain.forward(data=x)
    _assert_blobs_equal(fused, plain)
    assert kernels(fused) == again
