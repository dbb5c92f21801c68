"""Shared activation buffers (caffe_ocl/plan/activations.py): a replayed
TEST forward on buffers shared by blobs whose lifetimes do not overlap.

Against the same net without forward traces (the same kernels: bit-equal):
outputs of shared passes, every intermediate blob read after them
(recomputed on read), an input written between the forward and the read,
forward ranges and backward after a shared pass, a Python layer between
replayed segments, and the safety check catching a slot plan that breaks
the outputs."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import activations
from caffe_ocl.proto import parse_net_text
from test_forward_trace import NETS, Doubler, _input_shape, _same, same_weights


def _conv(name, bottom, n, k=3, group=1, top=None):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" '
            f'top: "{top or name}" convolution_param {{ num_output: {n} kernel_size: {k} '
            f'pad: {k // 2} group: {group} }} }}\n')


# a deeper chain than the plan tests' nets (theirs fuse into too few
# buffers to share): convolutions, a folded BatchNorm, a shortcut, pooling,
# a depthwise stage, a Concat, an InnerProduct
DEEP = ('layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 1 dim: 4 dim: 10 dim: 10 } } }\n'
        + _conv("c1", "data", 8)
        + 'layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }\n'
        + _conv("c2", "c1", 8)
        + 'layer { name: "bn2" type: "BatchNorm" bottom: "c2" top: "c2" }\n'
          'layer { name: "sc2" type: "Scale" bottom: "c2" top: "c2" scale_param { bias_term: true } }\n'
          'layer { name: "r2" type: "ReLU" bottom: "c2" top: "c2" }\n'
        + _conv("c3", "c2", 8)
        + 'layer { name: "sum" type: "Eltwise" bottom: "c3" bottom: "c1" top: "sum" }\n'
          'layer { name: "pool" type: "Pooling" bottom: "sum" top: "pool" '
          'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
        + _conv("dw", "pool", 8, group=8)
        + 'layer { name: "r3" type: "ReLU" bottom: "dw" top: "dw" }\n'
        + _conv("pw", "dw", 12, k=1)
        + _conv("c4", "pool", 6, k=1)
        + 'layer { name: "cat" type: "Concat" bottom: "pw" bottom: "c4" top: "cat" }\n'
        + _conv("c5", "cat", 10)
        + 'layer { name: "fc" type: "InnerProduct" bottom: "c5" top: "fc" '
          'inner_product_param { num_output: 7 } }\n'
          'layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }\n')

# nets (of test_forward_trace's) whose passes have buffers to share, and DEEP
SHARING = {"deep": DEEP, "dense": NETS["dense"], "mobilenet_v3": NETS["mobilenet_v3"],
           "silu_se": NETS["silu_se"]}


def _pair(text, rng, fold=True):
    """(shared, plain): the same weights; ``shared`` replays on shared
    buffers, ``plain`` walks its layers (no trace)."""
    with config.override(FUSE_SE_SCALE=True, SHARE_ACTIVATIONS=True):
        shared = Net(parse_net_text(text), TEST, fold=fold)
        with config.override(FORWARD_TRACE=False):
            plain = Net(parse_net_text(text), TEST, fold=fold)
    same_weights(shared, plain, rng)
    return shared, plain


def _sharing(net):
    trace = net._tracer.active.get((0, len(net.layers) - 1))
    return None if trace is None else trace.sharing


def _run(nets, x):
    """One forward of each net; the outputs only are read (as a script
    classifying images does), and they must be equal."""
    outs = [net.forward(**{net.inputs[0]: x}) for net in nets]
    for name in outs[1]:
        np.testing.assert_array_equal(outs[0][name], outs[1][name], err_msg=name)


def _shared_passes(shared, plain, rng, n=6):
    with config.override(SHARE_ACTIVATIONS=True):
        for _ in range(n):
            _run((shared, plain), rng.normal(0, 1, _input_shape(shared)).astype(np.float32))
    sh = _sharing(shared)
    assert sh is not None and sh.active and sh.checked and sh.pending
    own, slots = sh.bytes
    assert slots < own
    return sh


@pytest.mark.parametrize("name", sorted(SHARING))
def test_intermediate_blobs_read_after_shared_passes_equal_ordinary_ones(name, rng):
    shared, plain = _pair(SHARING[name], rng)
    sh = _shared_passes(shared, plain, rng)
    _same(shared, plain)            # the first read recomputes them all
    assert not sh.active            # and the net keeps its own buffers from then on
    _shared_passes_again = rng.normal(0, 1, _input_shape(shared)).astype(np.float32)
    _run((shared, plain), _shared_passes_again)
    _same(shared, plain)


@pytest.mark.parametrize("kept", [False, True])
def test_an_input_written_after_the_forward_does_not_reach_the_intermediates(rng, kept):
    """Through ``.data``, or through a view kept from before the passes
    (refreshed after each call, written without asking the blob)."""
    shared, plain = _pair(DEEP, rng)
    views = [net.blobs["data"].data for net in (shared, plain)]
    _shared_passes(shared, plain, rng)
    y = rng.normal(0, 1, _input_shape(shared)).astype(np.float32)
    for net, view in zip((shared, plain), views):
        if kept:
            view[...] = y
        else:
            net.blobs["data"].data[...] = y      # a next image, no forward yet
    _same(shared, plain)
    # and the next forward reads it
    for net in (shared, plain):
        net.forward()
    _same(shared, plain)


def test_forward_ranges_and_backward_after_a_shared_pass(rng):
    shared, plain = _pair(DEEP, rng)
    _shared_passes(shared, plain, rng)
    for net in (shared, plain):
        net.forward(start="c4")         # reads pool from the last pass
    _same(shared, plain)

    # unfolded (a backward needs every layer's own forward): without the
    # BatchNorm, which reads its factor on the host (a live step in place)
    text = "force_backward: true\n" + "\n".join(
        line for line in DEEP.splitlines() if '"bn2"' not in line and '"sc2"' not in line)
    shared, plain = _pair(text, rng, fold=False)
    sh = _shared_passes(shared, plain, rng)
    assert sh.active
    out = shared.outputs[0]
    grads = []
    for net in (shared, plain):
        net.blobs[out].diff[...] = 1.0
        grads.append(net.backward()[net.inputs[0]].copy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_a_python_layer_between_shared_segments(rng):
    text = DEEP.replace(
        'layer { name: "cat" type: "Concat"',
        'layer { name: "dbl" type: "TestShareDoubler" bottom: "c4" top: "c4d" }\n'
        'layer { name: "cat" type: "Concat"').replace('bottom: "c4" top: "cat"',
                                                      'bottom: "c4d" top: "cat"')
    assert "c4d" in text
    caffe_ocl.register_layer("TestShareDoubler", Doubler)
    try:
        shared, plain = _pair(text, rng)
        _shared_passes(shared, plain, rng)
        _same(shared, plain)
    finally:
        caffe_ocl.unregister_layer("TestShareDoubler")


def test_a_slot_plan_that_breaks_the_outputs_is_caught(rng, monkeypatch):
    """A planted bug: lifetimes end at the launch that writes the buffer
    (its readers not counted), so a slot is written again before the
    buffer's readers read it. The first
    shared pass's outputs differ from its rerun on the own buffers: sharing
    is turned off, and the outputs are right in every pass."""
    slots = activations._slots

    def early(intervals):
        return slots([(a, a, n, k) for a, b, n, k in intervals])
    monkeypatch.setattr(activations, "_slots", early)
    shared, plain = _pair(DEEP, rng)
    with config.override(SHARE_ACTIVATIONS=True):
        for _ in range(6):
            _run((shared, plain), rng.normal(0, 1, _input_shape(shared)).astype(np.float32))
    sh = _sharing(shared)
    assert sh is not None and sh.checked and not sh.active and sh.reason == "values changed"
    assert shared._tracer.replays >= 3


def test_slots_are_reused_only_after_the_last_use():
    # (first launch, last launch, bytes, key)
    assign, sizes = activations._slots([(0, 2, 100, "a"), (1, 3, 50, "b"), (3, 5, 80, "c"),
                                        (4, 6, 200, "d"), (6, 7, 10, "e")])
    # c starts at 3 after a's last use 2: a's slot; b is still in use at 3
    assert assign["c"] == assign["a"] != assign["b"]
    # d (200) at 4: b's slot is free (last use 3) and is grown to 200
    assert assign["d"] == assign["b"] and sizes[assign["d"]] == 200
    # e at 6: d's last use is 6 (same launch), so not d's slot
    assert assign["e"] != assign["d"]
    assert len(sizes) == 2


def test_off_by_setting(rng):
    with config.override(SHARE_ACTIVATIONS=False):
        net = Net(parse_net_text(NETS["mobilenet_v3"]), TEST)
        x = rng.normal(0, 1, _input_shape(net)).astype(np.float32)
        for _ in range(5):
            net.forward(**{net.inputs[0]: x})
    assert _sharing(net) is None and net._tracer.replays >= 2


def test_a_data_layer_net_with_loss_and_accuracy(rng):
    """A solver's test net: a data layer, then Accuracy and SoftmaxWithLoss
    (live steps at either end; the label Split's tops marked written by no
    launch) around the replayed segment."""
    text = DEEP.replace(
        'layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 1 dim: 4 dim: 10 dim: 10 } } }',
        'layer { name: "data" type: "DummyData" top: "data" top: "label" dummy_data_param { '
        'data_filler { type: "constant" value: 0.7 } data_filler { type: "constant" value: 3 } '
        'shape { dim: 2 dim: 4 dim: 10 dim: 10 } shape { dim: 2 } } }').replace(
        'layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }',
        'layer { name: "acc" type: "Accuracy" bottom: "fc" bottom: "label" top: "acc" }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }')
    assert "DummyData" in text and "SoftmaxWithLoss" in text
    shared, plain = _pair(text, rng)
    for _ in range(6):
        outs = [net.forward() for net in (shared, plain)]
        assert outs[0] == outs[1]
    sh = _sharing(shared)
    assert sh is not None and sh.active and sh.pending
    _same(shared, plain)


def test_not_shared_where_a_live_step_writes_in_place_what_the_segments_write(rng):
    """Unfolded, DEEP's BatchNorm reads its factor on the host (a live
    step) in place on the convolution's top: rerunning the segments alone
    would leave c2 without its normalisation, so the pass is not shared."""
    shared, plain = _pair(DEEP, rng, fold=False)
    with config.override(SHARE_ACTIVATIONS=True):
        for _ in range(5):
            _run((shared, plain), rng.normal(0, 1, _input_shape(shared)).astype(np.float32))
    sh = _sharing(shared)
    assert sh is not None and not sh.active
    assert sh.reason == "a live step writes in place what the segments write"
    _same(shared, plain)


def test_not_shared_past_the_cache_sized_cap(rng, monkeypatch):
    monkeypatch.setattr(activations, "MAX_SLOT_BYTES", 1024)
    shared, plain = _pair(DEEP, rng)
    with config.override(SHARE_ACTIVATIONS=True):
        for _ in range(4):
            _run((shared, plain), rng.normal(0, 1, _input_shape(shared)).astype(np.float32))
    sh = _sharing(shared)
    assert sh is not None and not sh.active and "past the caches" in sh.reason


class Widener(caffe_ocl.Layer):
    """A Python layer whose top doubles its channels when ``wide`` is set:
    a live step that reshapes in the middle of a replayed pass."""
    wide = False

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        shape = list(bottom[0].shape)
        shape[1] *= 2 if Widener.wide else 1
        top[0].reshape(*shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data[...] = np.concatenate([x, 3 * x], 1) if Widener.wide else x


def test_a_live_step_reshaping_mid_pass_after_shared_segments(rng):
    """The segments before it ran on the slots; the ordinary rest of the
    pass (the Softmax) and later reads take their blobs from the own
    buffers, so those segments are rerun there."""
    text = DEEP.replace(
        'layer { name: "prob" type: "Softmax"',
        'layer { name: "wid" type: "TestShareWidener" bottom: "fc" top: "fcw" }\n'
        'layer { name: "prob" type: "Softmax"')
    assert "fcw" in text
    caffe_ocl.register_layer("TestShareWidener", Widener)
    Widener.wide = False
    try:
        shared, plain = _pair(text, rng)
        _shared_passes(shared, plain, rng)
        Widener.wide = True
        for _ in range(3):
            _run((shared, plain), rng.normal(0, 1, _input_shape(shared)).astype(np.float32))
            _same(shared, plain)
    finally:
        Widener.wide = False
        caffe_ocl.unregister_layer("TestShareWidener")
