"""TEST rewrite of Convolution -> Eltwise SUM with a shortcut (->
activation) into the convolution adding the shortcut in its epilogue
(caffe_ocl/plan/residual.py): every blob equals the unrewritten net's bit
for bit, across passes (forward traces), reshapes and forward ranges; the
convolution's top (and the sum before a new-top activation) is computed
when read."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.device import record_events
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import residual
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_bits, forward_reshaped, same_random_weights

HEAD = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 6 dim: 5 dim: 4 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "h"
        convolution_param { num_output: 8 kernel_size: 1 } }
layer { name: "r1" type: "ReLU" bottom: "h" top: "h" }
layer { name: "proj" type: "Convolution" bottom: "h" top: "c"
        convolution_param { num_output: 6 kernel_size: 1 } }
"""
TAIL = """
layer { name: "post" type: "Convolution" bottom: "%s" top: "out"
        convolution_param { num_output: 3 kernel_size: 1 } }
"""
ENDS = {
    "sum": ('layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "z" }', "z"),
    "shortcut-first": ('layer { name: "sum" type: "Eltwise" bottom: "data" bottom: "c" '
                       'top: "z" }', "z"),
    "relu-in-place": ('layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "z" }'
                      '\nlayer { name: "act" type: "ReLU" bottom: "z" top: "z" }', "z"),
    "relu-new-top": ('layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "z" }'
                     '\nlayer { name: "act" type: "ReLU" bottom: "z" top: "a" '
                     'relu_param { negative_slope: 0.1 } }', "a"),
    "clip-new-top": ('layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "z" }'
                     '\nlayer { name: "act" type: "Clip" bottom: "z" top: "a" '
                     'clip_param { min: -0.5 max: 0.7 } }', "a"),
}


def _text(end):
    body, out = ENDS[end]
    return HEAD + body + TAIL % out


def _nets(text, **kw):
    fused = Net(parse_net_text(text), TEST, **kw)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), 4)
    return fused, plain


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, residual.ConvResidual)]


_assert_same = assert_same_bits


def _x(rng, n=2):
    return rng.normal(0, 1, (n, 6, 5, 4)).astype(np.float32)


@pytest.mark.parametrize("end", sorted(ENDS))
def test_shortcut_added_in_the_epilogue(monkeypatch, rng, end):
    # counts the commands of a pass: without shared activations (their
    # first pass reruns on the own buffers; each copies its inputs)
    monkeypatch.setenv("CAFFE_OCL_SHARE_ACTIVATIONS", "0")
    fused, plain = _nets(_text(end))
    groups = _groups(fused)
    names = fused.graph.layer_names
    want = ["proj", "sum"] + (["act"] if "act" in names else [])
    assert len(groups) == 1 and [names[li] for li in groups[0].layers] == want
    new_top = end.endswith("new-top")
    for k in range(5):          # passes 3-5 replay the recorded trace
        x = _x(rng)
        fused.forward(data=x)
        plain.forward(data=x)
        # neither the convolution's top nor a sum before a new-top
        # activation was written: computed when read
        assert fused.blobs["c"].compute_on_read is not None, k
        assert (fused.blobs["z"].compute_on_read is not None) == new_top, k
        _assert_same(fused, plain)
    assert fused._tracer.replays >= 2
    # one launch fewer than the plan without the rewrite (its summing pass)
    with config.override(FUSE_RESIDUAL=False):
        base = Net(parse_net_text(_text(end)), TEST)
    count = []
    for net in (fused, base):
        for _ in range(3):
            net.forward(data=x)
        events = []
        with record_events(events):        # every command of a pass, replayed or not
            net.forward(data=x)
        count.append(len(events))
    assert count[0] == count[1] - 1


def test_reshape_and_forward_ranges(rng):
    fused, plain = _nets(_text("relu-new-top"))
    for n in (3, 1):
        forward_reshaped((fused, plain), _x(rng, n))
        _assert_same(fused, plain)
    # ranges cutting the group run its layers one by one, computing the
    # blobs a full pass left pending first
    x = _x(rng, 1)
    for net in (fused, plain):
        net.forward(data=x)
        net.forward(end="sum")
    _assert_same(fused, plain)
    for net in (fused, plain):
        net.forward(data=x)
        net.forward(start="act")
    _assert_same(fused, plain)


def test_host_write_to_the_shortcut_between_passes(rng):
    """The shortcut written from Python is read by the next fused pass."""
    fused, plain = _nets(_text("relu-in-place"))
    x = _x(rng)
    for net in (fused, plain):
        net.forward(data=x)
        net.blobs["data"].data[...] = 2.0 * x
        net.forward()
    _assert_same(fused, plain)


@pytest.mark.parametrize("change", [
    # coefficients other than 1
    ('bottom: "c" bottom: "data" top: "z" }',
     'bottom: "c" bottom: "data" top: "z" eltwise_param { coeff: 1 coeff: 2 } }'),
    # a product, not a sum
    ('bottom: "c" bottom: "data" top: "z" }',
     'bottom: "c" bottom: "data" top: "z" eltwise_param { operation: PROD } }'),
    # a depthwise convolution (its kernel adds no residual)
    ('convolution_param { num_output: 6 kernel_size: 1 }',
     'convolution_param { num_output: 6 kernel_size: 3 pad: 1 group: 6 }'),
])
def test_not_matched(rng, change):
    text = _text("relu-in-place")
    if "group: 6" in change[1]:      # the depthwise one reads 6 channels
        text = text.replace('num_output: 8 kernel_size: 1 }', 'num_output: 6 kernel_size: 1 }')
    assert change[0] in text
    fused, plain = _nets(text.replace(change[0], change[1]))
    assert _groups(fused) == []
    x = _x(rng)
    fused.forward(data=x)
    plain.forward(data=x)
    _assert_same(fused, plain)


def test_conv_top_read_elsewhere_not_matched(rng):
    text = _text("sum") + ('layer { name: "gap" type: "Pooling" bottom: "c" top: "g" '
                           'pooling_param { pool: AVE global_pooling: true } }')
    fused, plain = _nets(text)
    assert _groups(fused) == []


def test_off_by_setting(settings):
    settings(FUSE_RESIDUAL=False)
    assert _groups(Net(parse_net_text(_text("sum")), TEST)) == []


CAFFE_BLOCK = HEAD.replace(
    'layer { name: "proj" type: "Convolution" bottom: "h" top: "c"\n'
    '        convolution_param { num_output: 6 kernel_size: 1 } }',
    'layer { name: "proj" type: "Convolution" bottom: "h" top: "c"\n'
    '        convolution_param { num_output: 6 kernel_size: 3 pad: 1 bias_term: false } }\n'
    'layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }\n'
    'layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }'
) + ENDS["relu-in-place"][0] + TAIL % "z"


def _caffe_block_nets(seed, **variants):
    """{name: Net of CAFFE_BLOCK} with the same random weights; each
    variant's Net keyword arguments, None for the plan without the
    rewrite."""
    nets = {}
    for key, kw in variants.items():
        with config.override(FUSE_RESIDUAL=kw is not None):
            nets[key] = Net(parse_net_text(CAFFE_BLOCK), TEST, **(kw or {}))
    same_random_weights(nets.values(), seed, batchnorm=("bn",))
    return nets


def test_caffe_style_chain(rng):
    """Caffe's ResNet form: convolution -> BatchNorm -> Scale in place (a
    folded chain) -> Eltwise -> ReLU in place: the chain's folded
    convolution adds the shortcut; the same bits as the plan without the
    rewrite, Caffe's values within float32 of the unfolded layers. The
    chain's own top, computed when read by the layers' own forwards, has
    the unfolded layers' bits."""
    assert "BatchNorm" in CAFFE_BLOCK
    nets = _caffe_block_nets(6, fused={}, base=None, plain=dict(fold=False))
    groups = _groups(nets["fused"])
    names = nets["fused"].graph.layer_names
    assert len(groups) == 1 and groups[0].chain is not None
    assert [names[li] for li in groups[0].layers] == ["proj", "bn", "sc", "sum", "act"]
    for k in range(4):
        x = _x(rng)
        for net in nets.values():
            net.forward(data=x)
        assert nets["fused"].blobs["c"].compute_on_read is not None
        _assert_same(nets["fused"], nets["base"], skip=("c",))
        np.testing.assert_array_equal(nets["fused"].blobs["c"].data, nets["plain"].blobs["c"].data)
        for name in nets["plain"].blobs:
            np.testing.assert_allclose(nets["fused"].blobs[name].data,
                                       nets["plain"].blobs[name].data, rtol=1e-5, atol=1e-5,
                                       err_msg=name)
    # a reshape rebuilds the chain's launches for the new buffers
    forward_reshaped(nets.values(), _x(rng, 3))
    _assert_same(nets["fused"], nets["base"], skip=("c",))


def test_chain_where_the_shortcut_does_not_pay(rng, monkeypatch):
    """A chain whose convolution should not add the shortcut (here: the
    rule says no after the plan was made, as a GPU's does for a batch
    grown past its threshold) runs its fold and one summing pass, built
    once: the same bits as the plan without the rewrite, and the launches
    are not rebuilt from pass to pass."""
    from caffe_ocl.ops import conv as conv_ops
    nets = _caffe_block_nets(7, fused={}, base=None)
    group = _groups(nets["fused"])[0]
    monkeypatch.setattr(conv_ops, "residual_pays", lambda dev, g: False)
    launches = []
    for _ in range(3):
        x = _x(rng)
        for net in nets.values():
            net.forward(data=x)
        launches.append(tuple(map(id, group.fwd)))
        _assert_same(nets["fused"], nets["base"])
    assert len(set(launches)) == 1 and [ln.name for ln in group.fwd] == ["sum2_act"]


FC_TEXT = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: %d dim: 16 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "h"
        inner_product_param { num_output: 80 } }
layer { name: "gelu" type: "TanH" bottom: "h" top: "h" }
layer { name: "proj" type: "InnerProduct" bottom: "h" top: "c"
        inner_product_param { num_output: 16 } }
layer { name: "sum" type: "Eltwise" bottom: "data" bottom: "c" top: "z" }
layer { name: "post" type: "InnerProduct" bottom: "z" top: "out"
        inner_product_param { num_output: 5 } }
"""


@pytest.mark.parametrize("packed", [True, False])
def test_fully_connected_shortcut_added_in_the_epilogue(rng, settings, packed):
    """A transformer block's MLP output + shortcut: the InnerProduct's GEMM
    adds the shortcut (CPU drivers: with the weights packed once or through
    gemm_launches); every blob equals the unrewritten net's bit for bit
    over replayed passes, a reshape to rows the small-M kernels take (the
    sum is then a pass of its own) and back."""
    settings(CPU_PACKED_WEIGHTS=packed)
    fused, plain = _nets(FC_TEXT % 40)
    groups = _groups(fused)
    names = fused.graph.layer_names
    assert len(groups) == 1 and [names[li] for li in groups[0].layers] == ["proj", "sum"]
    assert "product's epilogue" in groups[0].describe()
    for k in range(4):
        x = rng.normal(0, 1, (40, 16)).astype(np.float32)
        fused.forward(data=x)
        plain.forward(data=x)
        assert fused.blobs["c"].compute_on_read is not None, k
        _assert_same(fused, plain)
    for n in (3, 40):
        forward_reshaped((fused, plain), rng.normal(0, 1, (n, 16)).astype(np.float32))
        _assert_same(fused, plain)


def test_fully_connected_of_few_rows_not_matched():
    """Batches the small-M kernels take (one launch that adds no shortcut)."""
    fused, _ = _nets(FC_TEXT % 3)
    assert not _groups(fused)


# a transformer block's end with a layer scale: tokens (2, 40, 16) ->
# MLP -> the projection -> Scale over the features (gamma, a new top) ->
# + the shortcut
LAYER_SCALE = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 40 dim: 16 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "h"
        inner_product_param { num_output: 80 axis: 2 } }
layer { name: "act" type: "TanH" bottom: "h" top: "h" }
layer { name: "proj" type: "InnerProduct" bottom: "h" top: "c"
        inner_product_param { num_output: 16 axis: 2 } }
layer { name: "gamma" type: "Scale" bottom: "c" top: "cs" scale_param { axis: 2 } }
layer { name: "sum" type: "Eltwise" bottom: "data" bottom: "cs" top: "z" }
layer { name: "post" type: "InnerProduct" bottom: "z" top: "out"
        inner_product_param { num_output: 5 axis: 2 } }
"""


def test_layer_scale_folded_and_shortcut_added(rng):
    """The Scale over an InnerProduct's output features (a layer scale)
    folds into its weights, and the folded chain adds the shortcut in the
    GEMM's epilogue; every blob within float32 of the layers' own values,
    also after gamma changes."""
    fused, plain = _nets(LAYER_SCALE)
    groups = _groups(fused)
    names = fused.graph.layer_names
    assert len(groups) == 1 and groups[0].chain is not None
    assert [names[li] for li in groups[0].layers] == ["proj", "gamma", "sum"]
    g = rng.uniform(0.5, 1.5, 16)
    for net in (fused, plain):
        net.params["gamma"][0].data[...] = g
    for step in range(3):
        if step == 2:       # a new layer scale: folded again
            g = rng.uniform(-1, 1, 16)
            for net in (fused, plain):
                net.params["gamma"][0].data[...] = g
        x = rng.normal(0, 1, (2, 40, 16)).astype(np.float32)
        fused.forward(data=x)
        plain.forward(data=x)
        for name in plain.blobs:
            np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data,
                                       rtol=1e-5, atol=1e-5, err_msg=name)
