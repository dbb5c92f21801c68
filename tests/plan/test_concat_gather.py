"""TEST rewrite of a Concat whose top only a permutation layer reads
(ShuffleNet's concat -> channel shuffle) into one gather from the Concat's
inputs (caffe_ocl/plan/permute.py ConcatGather): the Concat's top is not
written but computed when read, and every blob equals the unrewritten
net's bit for bit, across passes (forward traces), reshapes, forward
ranges and weights that stop being a permutation."""
import numpy as np
import pytest

from caffe_ocl.device import get_device
from caffe_ocl.net import Net, TEST
from caffe_ocl.ops import shape as shape_ops
from caffe_ocl.ops import work_size
from caffe_ocl.plan import permute
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_bits, forward_reshaped, same_random_weights

# data -> Slice (a, b) -> conv + ReLU on b (r) -> Concat(a, r[, data]) ->
# 1x1 permutation conv (shuf) -> a 3x3 conv reading the shuffled channels
UNIT = """
layer {{ name: "data" type: "Input" top: "data"
        input_param {{ shape {{ dim: {n} dim: 4 dim: 5 dim: 3 }} }} }}
layer {{ name: "split" type: "Slice" bottom: "data" top: "a" top: "b"
        slice_param {{ axis: 1 slice_point: 2 }} }}
layer {{ name: "br" type: "Convolution" bottom: "b" top: "rc"
        convolution_param {{ num_output: 2 kernel_size: 3 pad: 1 }} }}
layer {{ name: "relu" type: "ReLU" bottom: "rc" top: "r" }}
layer {{ name: "cat" type: "Concat" {bottoms} top: "cat" }}
layer {{ name: "perm" type: "Convolution" bottom: "cat" top: "shuf"
        convolution_param {{ num_output: {c} kernel_size: 1 bias_term: false }} }}
layer {{ name: "post" type: "Convolution" bottom: "shuf" top: "out"
        convolution_param {{ num_output: 3 kernel_size: 3 pad: 1 }} }}
"""
SOURCES = {2: ["a", "r"], 3: ["a", "r", "data"]}


def _text(sources, n=2, extra=""):
    bottoms = " ".join(f'bottom: "{b}"' for b in SOURCES[sources])
    return UNIT.format(n=n, bottoms=bottoms, c=4 if sources == 2 else 8) + extra


def _perm_matrix(perm):
    w = np.zeros((len(perm), len(perm)), np.float32)
    w[np.arange(len(perm)), perm] = 1.0
    return w.reshape(len(perm), len(perm), 1, 1)


def _shuffle(c, groups=2):
    """ShuffleNet's channel shuffle as a permutation: output c takes input perm[c]."""
    return np.arange(c).reshape(groups, c // groups).T.ravel()


def _nets(text, perm, **fused_kw):
    fused = Net(parse_net_text(text), TEST, **fused_kw)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), 3)
    for net in (fused, plain):
        net.params["perm"][0].data[...] = _perm_matrix(perm)
    return fused, plain


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, permute.ConcatGather)]


def _assert_same(a, b):
    # the GEMM of the unrewritten permutation turns a ReLU's -0.0 into +0.0
    assert_same_bits(a, b, zero_sign=False)


def _x(rng, n=2):
    return rng.normal(0, 1, (n, 4, 5, 3)).astype(np.float32)


@pytest.mark.parametrize("sources", [2, 3])
def test_gathers_from_the_inputs_bit_exact(rng, sources):
    c = 4 if sources == 2 else 8
    perm = rng.permutation(c) if sources == 3 else _shuffle(c)
    fused, plain = _nets(_text(sources), perm)
    groups = _groups(fused)
    names = fused.graph.layer_names
    assert len(groups) == 1 and [names[li] for li in groups[0].layers] == ["cat", "perm"]
    assert "cat -> perm (one channel gather from the Concat's inputs" in \
        " ".join(fused.plan.describe())
    for k in range(5):          # passes 3-5 replay the recorded trace
        x = _x(rng)
        fused.forward(data=x)
        plain.forward(data=x)
        assert groups[0].gathers
        # the Concat did not write its top: computed when read
        assert fused.blobs["cat"].compute_on_read is not None, k
        _assert_same(fused, plain)
    assert fused._tracer.replays >= 2
    # the gather's definition, independently of the GEMM
    f = {n: fused.blobs[n].data for n in ["cat", "shuf"] + SOURCES[sources]}
    np.testing.assert_array_equal(
        f["cat"], np.concatenate([f[n] for n in SOURCES[sources]], axis=1))
    np.testing.assert_array_equal(f["shuf"], f["cat"][:, perm])


def test_reshape_and_forward_ranges(rng):
    perm = _shuffle(4)
    fused, plain = _nets(_text(2), perm)
    for n in (3, 1):
        forward_reshaped((fused, plain), _x(rng, n))
        _assert_same(fused, plain)
    # a range stopping at the Concat writes its top; one starting at the
    # permutation layer reads the Concat's top left pending by a full pass
    x = _x(rng, 1)
    fused.forward(data=x)
    plain.forward(data=x)
    for net in (fused, plain):
        net.forward(end="cat")
    assert fused.blobs["cat"].compute_on_read is None
    _assert_same(fused, plain)
    x = _x(rng, 1)
    for net in (fused, plain):
        net.forward(data=x)
        net.forward(start="perm")
    _assert_same(fused, plain)


def test_weights_no_longer_a_permutation(rng):
    fused, plain = _nets(_text(2), _shuffle(4))
    w = rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32)
    x = _x(rng)
    for net in (fused, plain):
        net.forward(data=x)
        net.params["perm"][0].data[...] = w
        net.forward(data=x)
    assert not _groups(fused)[0].gathers
    assert fused.blobs["cat"].compute_on_read is None     # the Concat wrote it
    _assert_same(fused, plain)
    for net in (fused, plain):       # and back
        net.params["perm"][0].data[...] = _perm_matrix(_shuffle(4))
        net.forward(data=x)
    assert _groups(fused)[0].gathers
    _assert_same(fused, plain)


def test_off_by_setting(settings):
    settings(CONCAT_GATHER=False)
    net = Net(parse_net_text(_text(2)), TEST)
    assert _groups(net) == []
    # the permutation layer is still a (one-source) gather candidate
    assert any(isinstance(c, permute.PermutationGather) for c in net.plan.fold_groups)


def test_concat_top_read_elsewhere_not_matched(rng):
    extra = ('layer { name: "gap" type: "Pooling" bottom: "cat" top: "g" '
             'pooling_param { pool: AVE global_pooling: true } }')
    fused, plain = _nets(_text(2, extra=extra), _shuffle(4))
    assert _groups(fused) == []
    x = _x(rng)
    fused.forward(data=x)
    plain.forward(data=x)
    _assert_same(fused, plain)


@pytest.mark.parametrize("kernel", ["gather_channels_multi", "gather_channels_multi_runs"])
@pytest.mark.parametrize("sizes", [(1, [3, 5], 7, [8]), (2, [1, 2, 3, 2], 5, [3, 5, 8]),
                                   (3, [4], 1, [1, 1, 1, 1])])
def test_gather_multi_kernels(rng, kernel, sizes):
    """Both kernels (the GPU one and the CPU drivers' runs), 1-4 sources
    of different channel counts gathered into 1-4 destinations (every
    channel of the gathered blob into each destination's slices of it,
    as GatherSlices writes a Slice's tops), with as many and with fewer
    work-items than planes."""
    dev = get_device()
    outer, chans, s, dchans = sizes
    srcs = [rng.normal(0, 1, (outer, c, s)).astype(np.float32) for c in chans]
    cat = np.concatenate(srcs, axis=1)
    c = cat.shape[1]
    perm = rng.permutation(c)
    # destinations: consecutive channel ranges of the gathered blob, the
    # last one reading the blob again from channel 0 when they overrun it
    rows, starts = [], []
    at = 0
    for u, k in enumerate(dchans):
        at = at if at + k <= c else 0
        starts.append(at)
        rows += [(at + j, u, j) for j in range(k)]
        at += k
    table = permute.gather_table(perm, chans, np.array(rows))
    bufs = []
    for a in srcs:
        b = dev.alloc(4 * a.size)
        dev.upload(b, a)
        bufs.append(b)
    tb = dev.alloc(4 * table.size)
    dev.upload(tb, table)
    ybufs = [dev.alloc(4 * outer * k * s) for k in dchans]
    gathered = cat[:, perm]
    want = [gathered[:, a:a + k] for a, k in zip(starts, dchans)]
    n = outer * len(rows) * s
    sources = list(zip(bufs, chans)) + [(bufs[0], chans[0])] * (4 - len(bufs))
    dests = list(zip(ybufs, dchans)) + [(ybufs[0], dchans[0])] * (4 - len(ybufs))
    args = [n, len(rows), s, tb] + [v for pair in sources + dests for v in pair]

    def check(launch):
        for yb, k in zip(ybufs, dchans):
            dev.upload(yb, np.full(outer * k * s, np.nan, np.float32))
        launch.run(dev.queue)
        for yb, k, w in zip(ybufs, dchans, want):
            y = np.empty((outer, k, s), np.float32)
            dev.download(y, yb)
            np.testing.assert_array_equal(y, w)
    for g, l in (work_size(dev, n), ((3,), (1,)), ((2 * n,), (1,))):
        check(dev.launch("shape.cl", kernel, g, l, args))
    # the ops wrapper picks the device's kernel and checks the counts
    check(shape_ops.gather_channels_multi(dev, outer, len(rows), s, tb,
                                          list(zip(bufs, chans)), list(zip(ybufs, dchans))))
    with pytest.raises(ValueError):
        shape_ops.gather_channels_multi(dev, outer, c, s, tb, [(bufs[0], 1)] * 5, [(ybufs[0], 1)])
    with pytest.raises(ValueError):
        shape_ops.gather_channels_multi(dev, outer, c, s, tb, [(bufs[0], 1)], [(ybufs[0], 1)] * 5)


def test_converted_shufflenet_unit(rng):
    """A ShuffleNet v2 unit as torch.onnx.export writes it (Split, a branch,
    Concat, Reshape -> Transpose -> Reshape), converted by onnx2caffe: the
    Concat and the shuffle run as one gather, and the outputs equal ONNX
    Runtime's and the unrewritten net's."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from caffe_ocl.onnx import check, to_caffe

    n, c, h, w = 1, 8, 6, 5
    inits = {
        "split": np.array([c // 2, c // 2], np.int64),
        "w1": rng.normal(0, 0.5, (c // 2, c // 2, 1, 1)).astype(np.float32),
        "b1": rng.normal(0, 0.5, c // 2).astype(np.float32),
        "s1": np.array([n, 2, c // 2, h, w], np.int64),
        "s2": np.array([n, -1, h, w], np.int64),
    }
    nodes = [
        helper.make_node("Split", ["x", "split"], ["x1", "x2"], axis=1),
        helper.make_node("Conv", ["x2", "w1", "b1"], ["y2"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["y2"], ["r2"]),
        helper.make_node("Concat", ["x1", "r2"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "s1"], ["t0"]),
        helper.make_node("Transpose", ["t0"], ["t1"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t1", "s2"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "unit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (n, c, h, w))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, (n, c, h, w))],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    net_param = to_caffe.convert(model)
    net = check.caffe_net(net_param)
    assert len(_groups(net)) == 1
    x = rng.normal(0, 1, (n, c, h, w)).astype(np.float32)
    out = check.run_caffe(net, {"x": x}, ["out"])["out"]
    assert _groups(net)[0].gathers
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out, sess.run(["out"], {"x": x})[0], rtol=1e-5, atol=1e-5)
    plain = Net(net.graph.param, TEST, fold=False)
    plain.copy_from(net_param)
    check.run_caffe(plain, {"x": x})
    _assert_same(net, plain)
