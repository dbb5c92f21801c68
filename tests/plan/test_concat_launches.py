"""Concat and Slice copy several inputs per launch (ops.shape.multi_copy),
and a Concat whose first inputs are an earlier Concat's (torchvision's
DenseNet form: each layer concatenates every feature so far) copies that
Concat's top as one block (caffe_ocl/plan/concat.py, CAFFE_OCL_CONCAT_PREFIX).
References: NumPy (float64 where it sums), gradient checks, and the net
without the rewrite."""
import math

import numpy as np
import pyopencl as cl
import pytest

from caffe_ocl import config, device, testing
from caffe_ocl.net import Net, TEST, TRAIN
from caffe_ocl.ops import shape as shape_ops
from caffe_ocl.plan import concat
from caffe_ocl.proto import parse_net_text

RNG = np.random.default_rng(5)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _launches(fn):
    """Kernel launches enqueued by ``fn()`` (uploads not counted)."""
    sink = []
    with device.record_events(sink):
        fn()
    return sum(1 for ev in sink if ev.command_type == cl.command_type.NDRANGE_KERNEL)


def _concat_inputs(axis, sizes, base=(2, 3, 4, 5)):
    xs = []
    for n in sizes:
        s = list(base)
        s[axis] = n
        xs.append(rnd(*s))
    return xs


@pytest.mark.parametrize("axis, sizes", [
    (0, [1, 2, 1]), (1, [2, 1, 3, 1, 2, 2, 1, 1, 2, 3, 1]), (2, [1, 3, 2, 1, 2, 1, 1, 2, 1]),
    (3, [2, 2, 1]), (-1, [1] * 17)])
def test_concat_forward_backward(axis, sizes):
    xs = _concat_inputs(axis, sizes)
    layer, b, t = testing.make_layer(f'type: "Concat" concat_param {{ axis: {axis} }}', xs)
    layer.reshape_if_needed(b, t)
    n = _launches(lambda: layer.forward(b, t))
    assert n == math.ceil(len(xs) / shape_ops.MULTI_COPY_MAX)
    np.testing.assert_array_equal(t[0].host_data(), np.concatenate(xs, axis=axis))
    dy = rnd(*t[0].shape)
    t[0].diff[...] = dy
    prop = [k % 3 != 1 for k in range(len(xs))]      # some bottoms want no diff
    for bb in b:
        bb.diff[...] = 7.0
    layer.backward(t, prop, b)
    parts = np.split(dy, np.cumsum(sizes)[:-1], axis=axis)
    for k, (bb, part) in enumerate(zip(b, parts)):
        np.testing.assert_array_equal(bb.host_diff(), part if prop[k] else 7.0)


def test_concat_gradient_many_inputs():
    xs = _concat_inputs(1, [1, 2, 1, 1, 2, 1, 1, 1, 2, 1], base=(2, 3, 2, 3))
    layer, b, t = testing.make_layer('type: "Concat"', xs)
    testing.check_gradient(layer, b, t, threshold=1e-2)


def test_concat_zero_size_inputs():
    xs = [rnd(2, 0, 3), rnd(2, 4, 3), rnd(2, 0, 3), rnd(2, 1, 3), rnd(2, 0, 3)]
    layer, b, t = testing.make_layer('type: "Concat"', xs)
    y, = testing.forward(layer, b, t)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=1))
    t[0].diff[...] = dy = rnd(2, 5, 3)
    layer.backward(t, [True] * 5, b)
    np.testing.assert_array_equal(b[1].host_diff(), dy[:, :4])
    np.testing.assert_array_equal(b[3].host_diff(), dy[:, 4:])
    # every input empty: no launch at all
    layer, b, t = testing.make_layer('type: "Concat"', [rnd(0, 2), rnd(0, 2)])
    layer.reshape_if_needed(b, t)
    assert t[0].shape == (0, 4) and _launches(lambda: layer.forward(b, t)) == 0


@pytest.mark.parametrize("axis, points, ntop", [(0, [], 4), (1, [1, 2, 4, 5, 6, 7, 8, 9, 11], 10),
                                                 (2, [1, 3], 3), (3, [2], 2), (3, [4], 2)])
def test_slice_forward_backward(axis, points, ntop):
    x = rnd(4, 12, 3, 4)
    pts = " ".join(f"slice_point: {p}" for p in points)
    layer, b, t = testing.make_layer(f'type: "Slice" slice_param {{ axis: {axis} {pts} }}',
                                     [x], ntop=ntop)
    layer.reshape_if_needed(b, t)
    n = _launches(lambda: layer.forward(b, t))
    expect = np.split(x, points if points else ntop, axis=axis)
    assert n == math.ceil(sum(e.size > 0 for e in expect) / shape_ops.MULTI_COPY_MAX)
    for y, e in zip(t, expect):
        np.testing.assert_array_equal(y.host_data(), e)
    dys = [rnd(*e.shape) for e in expect]
    for y, d in zip(t, dys):
        y.diff[...] = d
    layer.backward(t, [True], b)
    np.testing.assert_array_equal(b[0].host_diff(), np.concatenate(dys, axis=axis))


def test_slice_gradient_many_tops():
    x = rnd(2, 10, 2, 2)
    layer, b, t = testing.make_layer('type: "Slice" slice_param { axis: 1 }', [x], ntop=10)
    testing.check_gradient(layer, b, t, threshold=1e-2)


# ---- growing concats -------------------------------------------------------------

def _conv(name, bottom, top, n, k=3):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {k // 2} '
            'weight_filler { type: "gaussian" std: 0.3 } '
            'bias_filler { type: "gaussian" std: 0.3 } } }\n')


def _cat(name, bottoms, axis=1):
    bots = " ".join(f'bottom: "{b}"' for b in bottoms)
    return f'layer {{ name: "{name}" type: "Concat" {bots} top: "{name}" ' \
           f'concat_param {{ axis: {axis} }} }}\n'


def _torchvision_dense(layers, axis=1, shape=(2, 3, 5, 4)):
    """torchvision's dense block as ONNX exports it: layer k reads
    Concat(x0 .. x_k-1) through ReLU -> conv; the block ends with
    Concat(x0 .. x_L). Net inserts Split layers for the shared x_i."""
    dims = " ".join(f"dim: {d}" for d in shape)
    t = f'name: "dense" layer {{ name: "data" type: "Input" top: "x0" ' \
        f'input_param {{ shape {{ {dims} }} }} }}\n'
    feats = ["x0"]
    for k in range(1, layers + 1):
        src = feats[0]
        if len(feats) > 1:
            t += _cat(f"cat{k}", feats, axis)
            src = f"cat{k}"
        t += f'layer {{ name: "r{k}" type: "ReLU" bottom: "{src}" top: "a{k}" }}\n'
        if axis == 1:
            t += _conv(f"c{k}", f"a{k}", f"x{k}", 2)
        else:       # along another axis the new feature keeps the shape
            t += _conv(f"c{k}", f"a{k}", f"y{k}", shape[1])
            t += f'layer {{ name: "s{k}" type: "Slice" bottom: "y{k}" top: "x{k}" ' \
                 f'top: "drop{k}" slice_param {{ axis: {axis} slice_point: {shape[axis]} }} }}\n'
            t += f'layer {{ name: "sil{k}" type: "Silence" bottom: "drop{k}" }}\n'
        feats.append(f"x{k}")
    return t + _cat("out", feats, axis)


def _pair(text, phase=TEST):
    fold = True if phase == TEST else None     # TRAIN: the training fusions' plan
    fused = Net(parse_net_text(text), phase, fold=fold)
    with config.override(CONCAT_PREFIX=False):
        plain = Net(parse_net_text(text), phase, fold=fold)
    off = Net(parse_net_text(text), phase, fold=False)
    for name, blobs in fused.params.items():
        for f, p, o in zip(blobs, plain.params[name], off.params[name]):
            p.data[...] = f.host_data()
            o.data[...] = f.host_data()
    return fused, plain, off


def _equal(a, b):
    for name in b.blobs:
        np.testing.assert_allclose(a.blobs[name].data, b.blobs[name].data, rtol=1e-5,
                                   atol=1e-5, err_msg=name)


def _prefix_groups(net):
    return [c for c in net.plan.groups
            if isinstance(c, concat.ConcatInPlace) and c.source is not None]


def _count_forward(net):
    return _launches(lambda: net.forward_from_to(0, len(net.layers) - 1))


def test_growing_concat_fires_and_blobs_equal():
    text = _torchvision_dense(10)
    fused, plain, off = _pair(text)
    groups = _prefix_groups(fused)
    assert [(fused.graph.layer_names[c.ci], c.m) for c in groups] == \
        [(f"cat{k}", k - 1) for k in range(3, 11)] + [("out", 10)]
    assert not _prefix_groups(plain)
    x = rnd(2, 3, 5, 4)
    for net in (fused, plain, off):
        net.forward(x0=x)
    _equal(fused, off)
    _equal(plain, off)
    # one launch per Concat (the earlier top and the new input) where the
    # plain net needs two for 9, 10 and 11 inputs (cat9, cat10, out)
    assert all(len(c.fwd) == 1 for c in groups)
    assert _count_forward(plain) - _count_forward(fused) == 3
    for c in groups:
        assert c.source.holds_inputs(c.source.top.shape)


@pytest.mark.parametrize("axis", [0, 2, 3])
def test_growing_concat_other_axes(axis):
    shape = (2, 3, 5, 4)
    fused, plain, off = _pair(_torchvision_dense(4, axis, shape))
    assert len(_prefix_groups(fused)) == 3
    x = rnd(*shape)
    for net in (fused, off):
        net.forward(x0=x)
    _equal(fused, off)
    out = off.blobs["out"].data
    assert out.shape[axis] == 5 * shape[axis]


def test_growing_concat_host_writes_ranges_reshape():
    text = _torchvision_dense(4)
    fused, _, off = _pair(text)
    x = rnd(2, 3, 5, 4)
    for net in (fused, off):
        net.forward(x0=x)
    # a host write to an input of cat3 after cat3 ran: cat4/out must see it
    for net in (fused, off):
        net.blobs["x1"].data[0, 0] += 3.0
        net.forward(start="cat4")
    _equal(fused, off)
    # a host write to the earlier top itself: the later concat copies every input
    for net in (fused, off):
        net.forward(x0=x)           # (reading every blob above marked them written)
        net.blobs["cat3"].data[...] = -1.0
        net.forward(start="r3")
    _equal(fused, off)
    # a range that stops before the later concats, then one that starts at them
    x2 = rnd(2, 3, 5, 4)
    for net in (fused, off):
        net.blobs["x0"].data[...] = x2
        net.forward(end="c2")
        net.forward(start="cat3")
    _equal(fused, off)
    # other shapes
    x3 = rnd(1, 3, 6, 7)
    for net in (fused, off):
        net.blobs["x0"].reshape(x3.shape)
        net.forward(x0=x3)
    _equal(fused, off)
    # reshaped (smaller: the memories stay) without a forward of the earlier
    # concats; nothing read on the host before (a read marks every blob
    # written), once through net.reshape, once through the later forward only
    for shape in ((2, 3, 4, 4), (1, 3, 4, 3)):
        x = rnd(*off.blobs["x0"].shape)
        for net in (fused, off):
            net.forward(x0=x)
            net.blobs["x0"].reshape(shape)
            if shape[0] == 2:
                net.reshape()
            net.forward(start="cat4")
        _equal(fused, off)


def test_growing_concat_then_backward_after_unfold():
    text = _torchvision_dense(3)
    fused, _, off = _pair(text)
    x = rnd(2, 3, 5, 4)
    for net in (fused, off):
        net.forward(x0=x)
    fused.unfold()
    for net in (fused, off):
        net.forward(x0=x)
        net.blobs["out"].diff[...] = 1.0
        net.backward()
    _equal(fused, off)
    for name in off.blobs:
        np.testing.assert_allclose(fused.blobs[name].diff, off.blobs[name].diff, rtol=1e-5,
                                   atol=1e-5, err_msg=name)


def test_not_applied():
    # another order; an earlier top written in place; TRAIN
    base = _torchvision_dense(1)
    t = base + _conv("c2", "out", "x2", 2) + _cat("o2", ["x1", "x0", "x2"])
    fused = Net(parse_net_text(t), TEST, fold=True)
    assert not _prefix_groups(fused)
    t = base + 'layer { name: "rr" type: "ReLU" bottom: "out" top: "out" }\n' \
        + _conv("c2", "out", "x2", 2) + _cat("o2", ["x0", "x1", "x2"])
    fused = Net(parse_net_text(t), TEST, fold=True)
    assert not _prefix_groups(fused)


def test_growing_concat_train_forward_backward():
    text = _torchvision_dense(4) + \
        'layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "target" ' \
        'top: "loss" }\n'
    text = text.replace('top: "x0" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 4 } }',
                        'top: "x0" top: "target" input_param { shape { dim: 2 dim: 3 dim: 5 '
                        'dim: 4 } shape { dim: 2 dim: 11 dim: 5 dim: 4 } }')
    fused, plain, _ = _pair(text, TRAIN)
    assert len(_prefix_groups(fused)) == 3 and not _prefix_groups(plain)
    assert fused.plan.train_groups and not fused.plan.fold_groups
    x, target = rnd(2, 3, 5, 4), rnd(2, 11, 5, 4)
    for _ in range(2):
        for net in (fused, plain):
            net.forward(x0=x, target=target)
            net.backward()
        _equal(fused, plain)
        for name in plain.blobs:
            np.testing.assert_allclose(fused.blobs[name].diff, plain.blobs[name].diff,
                                       rtol=1e-5, atol=1e-5, err_msg=name)
        for name, blobs in plain.params.items():
            for f, p in zip(fused.params[name], blobs):
                np.testing.assert_allclose(f.diff, p.diff, rtol=1e-5, atol=1e-5, err_msg=name)
        x = x + 1.0


# ---- runs of Slices of one blob ----------------------------------------------------

# ShuffleNet v2's channel split as onnx2caffe writes ONNX's two Slices: each
# a Slice of (a Split top of) the same blob with its unused half silenced
SHUFFLE = ('name: "shuffle" layer { name: "data" type: "Input" top: "x" '
           'input_param { shape { dim: 2 dim: 6 dim: 3 dim: 4 } } }\n'
           + _conv("c0", "x", "r", 8, k=1)
           + 'layer { name: "s1" type: "Slice" bottom: "r" top: "a" top: "unused1" '
             'slice_param { axis: 1 slice_point: 4 } }\n'
             'layer { name: "q1" type: "Silence" bottom: "unused1" }\n'
             'layer { name: "s2" type: "Slice" bottom: "r" top: "unused0" top: "b" top: "c" '
             'slice_param { axis: 1 slice_point: 4 slice_point: 7 } }\n'
             'layer { name: "q2" type: "Silence" bottom: "unused0" }\n'
           + _conv("cb", "b", "bb", 3, k=1)
           + _cat("out", ["a", "bb", "c"]))


@pytest.mark.parametrize("phase", [TEST, TRAIN])
def test_slice_run_one_copy(phase):
    fused, plain, off = _pair(SHUFFLE, phase)
    runs = [c for c in fused.plan.groups if isinstance(c, concat.SliceRun)]
    assert [[fused.graph.layer_names[li] for li in c.layers] for c in runs] == \
        [["s1", "q1", "s2"]]
    assert not [c for c in plain.plan.groups if isinstance(c, concat.SliceRun)]
    x = rnd(2, 6, 3, 4)
    for net in (fused, plain, off):
        net.forward(x=x)
    _equal(fused, off)
    assert _count_forward(plain) - _count_forward(fused) == 1
    # ranges that cut the run, a host write between, other shapes
    for net in (fused, off):
        net.forward(end="s1")
        net.blobs["r"].data[0] += 1.0
        net.forward(start="s2")
    _equal(fused, off)
    x = rnd(1, 6, 2, 5)
    for net in (fused, off):
        net.blobs["x"].reshape(x.shape)
        net.forward(x=x)
    _equal(fused, off)


def test_slice_run_other_axes_one_by_one():
    text = SHUFFLE.replace('slice_param { axis: 1 slice_point: 4 slice_point: 7 }',
                           'slice_param { axis: 2 slice_point: 1 slice_point: 2 }')
    text = text.replace(_conv("cb", "b", "bb", 3, k=1) + _cat("out", ["a", "bb", "c"]),
                        _cat("out", ["b", "c"], axis=2))
    # (with the Concat of those Slices taken as one gather, plan/slice_concat.py,
    # off here: the run is what is checked)
    with config.override(FUSE_SLICE_CONCAT=False):
        fused, plain, off = _pair(text)
    assert [c for c in fused.plan.groups if isinstance(c, concat.SliceRun)]
    x = rnd(2, 6, 3, 4)
    for net in (fused, plain, off):
        net.forward(x=x)
    _equal(fused, off)
    assert _count_forward(plain) == _count_forward(fused)
