"""Forward traces (caffe_ocl/plan/trace.py): a TEST net's forward replayed
from the recorded launches. Every blob must read as with an ordinary
forward (the same net with CAFFE_OCL_FORWARD_TRACE off, so the same kernels:
bit-identical), across new inputs, weights written from Python, reshapes,
forward ranges, pending blobs of the plan's groups (Concat in place, SiLU
and BatchNorm chains, SE blocks), a Python layer in the middle, and kept
host views."""
import numpy as np
import pyopencl as cl
import pytest

import caffe_ocl
from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import trace
from caffe_ocl.proto import parse_net_text
from test_concat_in_place import DENSE, INCEPTION
from test_axpy import FORMS as AXPY_FORMS, _net as axpy_net
from test_fold_new_top import NETS as NEW_TOP_NETS
from test_swish_fusion import CAFFE, CONVERTED, MOBILENET_V3

NETS = {"inception": INCEPTION, "dense": DENSE, "silu_se": CONVERTED,
        "mobilenet_v3": MOBILENET_V3, "caffe_swish_bn": CAFFE,
        # folded chains writing new tops (the residual one inside a shortcut
        # group), SENet's Axpy with a ReLU into a new top: their pending blobs
        "bn_new_top": NEW_TOP_NETS["bn-new-top"], "new_top_residual": NEW_TOP_NETS["residual"],
        "axpy_relu": axpy_net(AXPY_FORMS["relu-new-top"])}

# a learned constant joined to the input, as ViT's class token converts
# (BVLC's Parameter layer: its top is the parameter's own memory, so
# reading that top from Python hands out the parameter, which may then be
# written: only the other blobs are read between replays)
PARAMETER_CONCAT = """
input: "data" input_shape { dim: 2 dim: 3 dim: 5 }
layer { name: "token" type: "Parameter" top: "token"
        parameter_param { shape { dim: 2 dim: 3 dim: 1 } } }
layer { name: "cat" type: "Concat" bottom: "token" bottom: "data" top: "cat"
        concat_param { axis: 2 } }
layer { name: "act" type: "TanH" bottom: "cat" top: "act" }
"""


def _pair(text, rng):
    """(traced, ordinary) nets with the same weights; the SE fold on, as
    in test_swish_fusion, so its group is among the traced ones."""
    with config.override(FUSE_SE_SCALE=True):
        traced = Net(parse_net_text(text), TEST, fold=True)
        with config.override(FORWARD_TRACE=False):
            plain = Net(parse_net_text(text), TEST, fold=True)
    assert traced._tracer is not None and plain._tracer is None
    same_weights(traced, plain, rng)
    return traced, plain


def same_weights(a, b, rng):
    """The same random weights in nets ``a`` and ``b`` (BatchNorm variances
    and factors positive)."""
    for name, blobs in a.params.items():
        for t, p in zip(blobs, b.params[name]):
            v = rng.normal(0, 0.5, t.shape)
            if (name.startswith("bn") or name.endswith("_bn")) and len(t.shape) == 1:
                v = np.abs(v) + 0.5
            t.data[...] = v
            p.data[...] = v


def _input_shape(net):
    return net.blobs[net.inputs[0]].shape


def _same(a, b, names=None):
    for name in names or b.blobs:
        np.testing.assert_array_equal(a.blobs[name].data, b.blobs[name].data, err_msg=name)


def _forward(nets, x, **kw):
    return [net.forward(**{net.inputs[0]: x}, **kw) for net in nets]


@pytest.mark.parametrize("name", sorted(NETS))
def test_replayed_passes_equal_ordinary_ones(name, rng):
    traced, plain = _pair(NETS[name], rng)
    shape = _input_shape(traced)
    for k in range(6):
        x = rng.normal(0, 1, shape).astype(np.float32)
        _forward((traced, plain), x)
        if k % 2:
            _same(traced, plain)            # pending blobs computed on read too
    assert traced._tracer.replays >= 2
    # every launch of the steady pass is in the trace (nothing live but
    # the input layer's empty step here)
    active = traced._tracer.active[(0, len(traced.layers) - 1)]
    assert active.launches > 0


def test_weights_written_from_python_end_the_replay(rng):
    traced, plain = _pair(CONVERTED, rng)
    x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
    for _ in range(4):
        _forward((traced, plain), x)
    replays = traced._tracer.replays
    assert replays >= 1
    for net in (traced, plain):
        net.params["stem"][0].data[...] *= -1.5     # a fold and an epilogue to redo
    _forward((traced, plain), x)
    assert traced._tracer.replays == replays        # recorded again, not replayed
    _same(traced, plain)
    for _ in range(4):
        _forward((traced, plain), x)
    assert traced._tracer.replays > replays
    _same(traced, plain)


def test_a_parameter_written_from_python_ends_the_replay(rng):
    """The Parameter layer's forward leaves its version alone (so the pass
    replays), and a value written into it from Python is what the next
    pass reads."""
    traced, plain = _pair(PARAMETER_CONCAT, rng)
    for _ in range(4):
        x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
        _forward((traced, plain), x)
        _same(traced, plain, ["cat", "act"])
    replays = traced._tracer.replays
    assert replays >= 2
    for net in (traced, plain):
        net.params["token"][0].data[...] = 0.25
    _forward((traced, plain), x)
    _same(traced, plain)
    np.testing.assert_allclose(traced.blobs["cat"].data[:, :, 0], 0.25)
    for _ in range(3):
        _forward((traced, plain), x)
    assert traced._tracer.replays > replays
    _same(traced, plain)


# zero padding as onnx2caffe writes it (a constant DummyData joined to
# the data), and a gaussian DummyData Caffe refills every forward
PADDED = """
input: "data" input_shape { dim: 2 dim: 3 dim: 5 }
layer { name: "pad" type: "DummyData" top: "zeros"
        dummy_data_param { shape { dim: 2 dim: 3 dim: 2 } } }
layer { name: "noise" type: "DummyData" top: "noise"
        dummy_data_param { shape { dim: 2 dim: 3 dim: 7 }
                           data_filler { type: "gaussian" std: 1 } } }
layer { name: "cat" type: "Concat" bottom: "data" bottom: "zeros" top: "cat"
        concat_param { axis: 2 } }
layer { name: "act" type: "TanH" bottom: "cat" top: "act" }
layer { name: "sum" type: "Eltwise" bottom: "act" bottom: "noise" top: "y" }
"""


def test_constant_dummy_data_replays_and_random_dummy_data_refills(rng):
    traced, plain = _pair(PADDED, rng)
    seen = []
    for _ in range(5):
        x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
        _forward((traced, plain), x)
        _same(traced, plain, ["cat", "act"])
        np.testing.assert_array_equal(traced.blobs["cat"].data[:, :, 5:], 0.0)
        noise = traced.blobs["noise"].data.copy()
        np.testing.assert_allclose(traced.blobs["y"].data, traced.blobs["act"].data + noise,
                                   rtol=1e-6, atol=1e-6)
        seen.append(noise)
    assert traced._tracer.replays >= 2
    assert not np.array_equal(seen[-1], seen[-2])       # refilled every pass
    active = traced._tracer.active[(0, len(traced.layers) - 1)]
    live = [traced.graph.layer_names[e.li] for e in active.entries
            if isinstance(e, trace._Live)]
    assert live == ["noise"]


def test_reshape_and_ranges_after_replays(rng):
    traced, plain = _pair(INCEPTION, rng)
    nets = (traced, plain)
    x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
    for _ in range(4):
        _forward(nets, x)
    assert traced._tracer.replays >= 1
    # ranges cutting the units after replayed passes: a blob a cut unit does
    # not reach keeps its value of the last full forward (state the groups
    # keep between passes must survive a replay)
    for net in nets:
        net.blobs["data"].data[...] = 2 * x
        net.forward(end="b2")
    _same(traced, plain, ["b2r", "b2", "cat"])
    for net in nets:
        net.forward(start="b2r", end="b3")
    _same(traced, plain)
    # a new batch and plane
    y = rng.normal(0, 1, (3, 3, 5, 8)).astype(np.float32)
    for net in nets:
        net.blobs["data"].reshape(*y.shape)
    for _ in range(5):
        _forward(nets, y)
    _same(traced, plain)
    assert traced.blobs["cat"].shape[0] == 3


def test_kept_views_and_host_writes_of_intermediate_blobs(rng):
    traced, plain = _pair(DENSE, rng)
    nets = (traced, plain)
    views = [net.blobs["cat2"].data for net in nets]      # kept: refreshed each forward
    for k in range(5):
        x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
        _forward(nets, x)
        np.testing.assert_array_equal(views[0], views[1])
        # a script writing an intermediate blob: the next forward overwrites it
        for net in nets:
            net.blobs["a2"].data[...] = 7.0
    _same(traced, plain)
    assert traced._tracer.replays >= 1


class Doubler(caffe_ocl.Layer):
    """A Python layer: a live step among the recorded ones."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data


def test_a_python_layer_runs_live_between_replayed_segments(rng):
    text = INCEPTION.replace(
        'layer { name: "cat" type: "Concat"',
        'layer { name: "dbl" type: "TestTraceDoubler" bottom: "b3" top: "b3d" }\n'
        'layer { name: "cat" type: "Concat"').replace('bottom: "b3" top: "cat"',
                                                      'bottom: "b3d" top: "cat"')
    caffe_ocl.register_layer("TestTraceDoubler", Doubler)
    try:
        traced, plain = _pair(text, rng)
        for _ in range(5):
            x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
            _forward((traced, plain), x)
        _same(traced, plain)
        active = traced._tracer.active[(0, len(traced.layers) - 1)]
        lives = [e for e in active.entries if isinstance(e, trace._Live)]
        assert [traced.graph.layer_names[e.li] for e in lives] == ["dbl"]
        assert traced._tracer.replays >= 1
    finally:
        caffe_ocl.unregister_layer("TestTraceDoubler")


def test_not_traced_with_the_setting_off_or_hooks_and_timed_when_replayed(rng):
    with config.override(FORWARD_TRACE=False):
        assert Net(parse_net_text(INCEPTION), TEST)._tracer is None
    traced, _ = _pair(INCEPTION, rng)
    x = rng.normal(0, 1, _input_shape(traced)).astype(np.float32)
    from caffe_ocl import device as devmod
    counts = []
    for _ in range(5):
        sink = []
        with devmod.record_events(sink):       # caffe_ocl time's recording
            traced.forward(data=x)
        counts.append(sum(e.command_type == cl.command_type.NDRANGE_KERNEL for e in sink))
    # replayed passes report the same kernel launches as the recorded ones
    assert traced._tracer.replays >= 1 and len(set(counts[1:])) == 1 and counts[-1] > 0
    replays = traced._tracer.replays
    traced.before_forward(lambda li: None)       # pycaffe hooks: the ordinary walk
    traced.forward(data=x)
    assert traced._tracer.replays == replays


def test_segment_sets_each_blobs_last_mark_once():
    """A blob in several steps of a segment is marked by each; a replay sets
    what the last step left (one assignment a blob)."""
    class Blob:
        def __init__(self):
            self.sets = []

        def __setattr__(self, key, value):
            if key == "compute_on_read":
                self.sets.append(value)
            object.__setattr__(self, key, value)

    a, b = Blob(), Blob()
    seg = trace._Segment()
    first, second = (lambda: 1), (lambda: 2)
    seg.add([], [(a, first), (b, None)])
    seg.add([], [(a, second), (b, first)])
    seg.add([], [(a, None)])
    seg.freeze()
    seg.replay(None)
    assert a.sets == [None] and b.sets == [first]
