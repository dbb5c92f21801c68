"""TEST rewrite of a 1x1 Convolution / InnerProduct whose weight is a
permutation matrix into a channel gather (caffe_ocl/plan/permute.py; the
form converters give a channel shuffle). It fires only on an exact
permutation (decided from the loaded weights, again whenever they change),
and every blob equals the unrewritten net's bit for bit."""
import numpy as np
import pytest

from caffe_ocl.device import get_device
from caffe_ocl.net import Net, TEST, TRAIN
from caffe_ocl.ops import work_size
from caffe_ocl.plan import permute
from caffe_ocl.proto import parse_net_text

C = 6
# conv -> perm (1x1, no bias) -> permb (1x1, bias) -> a 1x1 conv that is no
# candidate (num_output != channels) and a 3x3 one; global pooling ->
# InnerProduct (K = num_output = 6) and a transposed one.
NET = """
name: "permute"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 4 } } }
layer { name: "pre" type: "Convolution" bottom: "data" top: "c1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "perm" type: "Convolution" bottom: "c1" top: "p1"
        convolution_param { num_output: 6 kernel_size: 1 bias_term: false } }
layer { name: "permb" type: "Convolution" bottom: "p1" top: "p2"
        convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "narrow" type: "Convolution" bottom: "p2" top: "n1"
        convolution_param { num_output: 3 kernel_size: 1 bias_term: false } }
layer { name: "wide" type: "Convolution" bottom: "p2" top: "w1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "gap" type: "Pooling" bottom: "p2" top: "g"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "g" top: "f1"
        inner_product_param { num_output: 6 bias_term: false } }
layer { name: "ipt" type: "InnerProduct" bottom: "f1" top: "f2"
        inner_product_param { num_output: 6 transpose: true } }
"""
CANDIDATES = ["perm", "permb", "ip", "ipt"]


def _net(phase=TEST, **kw):
    return Net(parse_net_text(NET), phase, **kw)


def _perm_matrix(perm):
    w = np.zeros((len(perm), len(perm)), np.float32)
    w[np.arange(len(perm)), perm] = 1.0
    return w


def _set_weights(net, rng, perms):
    """Random weights, then permutation matrices (zero biases) for ``perms``."""
    for name, blobs in net.params.items():
        for b in blobs:
            b.data[...] = rng.normal(0, 0.5, b.shape)
    for name, perm in perms.items():
        w = _perm_matrix(perm)
        if name == "ipt":
            w = w.T          # stored (K, N): column c makes output c
        p = net.params[name]
        p[0].data[...] = w.reshape(p[0].shape)
        if len(p) > 1:
            p[1].data[...] = 0.0


def _pair(rng, perms):
    fused, plain = _net(), _net(fold=False)
    _set_weights(fused, np.random.default_rng(5), perms)
    _set_weights(plain, np.random.default_rng(5), perms)
    return fused, plain


def _groups(net):
    return {net.graph.layer_names[c.li]: c for c in net.plan.fold_groups
            if isinstance(c, permute.PermutationGather)}


def _perms(rng):
    return {name: rng.permutation(C) for name in CANDIDATES}


def _assert_bit_equal(a, b):
    for name in b.blobs:
        x, y = a.blobs[name].data, b.blobs[name].data
        assert x.shape == y.shape, name
        np.testing.assert_array_equal(x.view(np.int32), y.view(np.int32), err_msg=name)


def _x(rng, n=2):
    return rng.normal(0, 1, (n, 3, 5, 4)).astype(np.float32)


def test_candidates_found():
    net = _net()
    assert sorted(_groups(net)) == sorted(CANDIDATES)
    assert sorted(d for d in net.plan.describe() if "channel gather" in d) == \
        [f"{n} (a channel gather while its weight is a permutation)" for n in sorted(CANDIDATES)]
    assert _groups(_net(fold=False)) == {}
    assert _groups(_net(TRAIN)) == {}


def test_off_by_setting(settings):
    settings(PERMUTE_GATHER=False)
    assert _groups(_net()) == {}


def test_permutations_gather_bit_exact(rng):
    perms = _perms(rng)
    fused, plain = _pair(rng, perms)
    x = _x(rng)
    fused.forward(data=x)
    plain.forward(data=x)
    groups = _groups(fused)
    assert all(groups[n].gathers for n in CANDIDATES)
    for n in CANDIDATES:
        np.testing.assert_array_equal(groups[n].perm, perms[n])
    _assert_bit_equal(fused, plain)
    # the gather's definition, independently of the GEMM
    c1, p1 = fused.blobs["c1"].data, fused.blobs["p1"].data
    np.testing.assert_array_equal(p1, c1[:, perms["perm"]])
    g, f1, f2 = (fused.blobs[n].data for n in ("g", "f1", "f2"))
    np.testing.assert_array_equal(f1, g.reshape(2, C)[:, perms["ip"]])
    np.testing.assert_array_equal(f2, f1[:, perms["ipt"]])
    # another batch size: the launches follow the reshape
    x3 = _x(rng, 3)
    for net in (fused, plain):
        net.blobs["data"].reshape(*x3.shape)
        net.reshape()
        net.forward(data=x3)
    _assert_bit_equal(fused, plain)


def _near(kind, perm):
    w = _perm_matrix(perm)
    if kind == "half":
        w[2, perm[2]] = 0.5
    elif kind == "duplicate_row":
        w[3] = w[1]               # column perm[3] empty, perm[1] twice
    elif kind == "extra_one":
        w[0, perm[1]] = 1.0
    elif kind == "negative":
        w[4, perm[4]] = -1.0
    elif kind == "tiny":
        w[5, perm[0]] = 1e-30
    return w


@pytest.mark.parametrize("kind", ["half", "duplicate_row", "extra_one", "negative", "tiny",
                                  "bias"])
def test_near_permutations_do_not_fire(rng, kind):
    perms = _perms(rng)
    fused, plain = _pair(rng, perms)
    for net in (fused, plain):
        if kind == "bias":
            net.params["permb"][1].data[...] = 0.0
            net.params["permb"][1].data[2] = 0.25
        else:
            for name in CANDIDATES:
                w = _near(kind, perms[name])
                net.params[name][0].data[...] = (w.T if name == "ipt" else w).reshape(
                    net.params[name][0].shape)
    x = _x(rng)
    fused.forward(data=x)
    plain.forward(data=x)
    groups = _groups(fused)
    if kind == "bias":
        assert not groups["permb"].gathers
        assert groups["perm"].gathers and groups["ip"].gathers
    else:
        assert not any(groups[n].gathers for n in CANDIDATES)
    assert permute.permutation_of(_near(kind, perms["perm"])) is None or kind == "bias"
    _assert_bit_equal(fused, plain)


def test_permutation_of():
    p = np.array([2, 0, 1])
    np.testing.assert_array_equal(permute.permutation_of(_perm_matrix(p)), p)
    assert permute.permutation_of(_perm_matrix(p), np.zeros(3, np.float32)) is not None
    assert permute.permutation_of(_perm_matrix(p), np.array([0, 1e-9, 0])) is None
    w = _perm_matrix(p)
    w[1, 1] = np.nan
    assert permute.permutation_of(w) is None
    assert permute.permutation_of(np.ones((1, 2), np.float32)) is None
    assert permute.permutation_of(np.ones((1, 1), np.float32)) is not None


def test_weight_changes_switch_back_and_forth(rng):
    perms = _perms(rng)
    fused, plain = _pair(rng, perms)
    x = _x(rng)
    groups = _groups(fused)

    def run():
        fused.forward(data=x)
        plain.forward(data=x)
        _assert_bit_equal(fused, plain)

    run()
    assert groups["perm"].gathers
    # a non-permutation written after the first forward: a convolution again
    dense = rng.normal(0, 0.5, (C, C, 1, 1)).astype(np.float32)
    for net in (fused, plain):
        net.params["perm"][0].data[...] = dense
    run()
    assert not groups["perm"].gathers
    assert groups["permb"].gathers
    # another permutation: a gather again, with the new order
    other = np.roll(perms["perm"], 1)
    for net in (fused, plain):
        net.params["perm"][0].data[...] = _perm_matrix(other).reshape(C, C, 1, 1)
        net.params["permb"][1].data[...] = 1.0        # the bias makes permb a conv
    run()
    assert groups["perm"].gathers and not groups["permb"].gathers
    np.testing.assert_array_equal(groups["perm"].perm, other)
    # new storage for the weights (a solver's test net sharing the train
    # net's) is noticed too
    donor = _net(fold=False)
    _set_weights(donor, np.random.default_rng(5), perms)
    donor.params["perm"][0].data[...] = dense
    for net in (fused, plain):
        net.share_trained_layers_with(donor)
    assert fused.params["perm"][0].data_mem is donor.params["perm"][0].data_mem
    run()
    assert not groups["perm"].gathers and groups["permb"].gathers


def test_converted_channel_shuffle_fires(rng):
    """A channel shuffle as torch.onnx.export writes it (Reshape ->
    Transpose -> Reshape), 4-D and 2-D, converted by onnx2caffe: the
    permutation layers it writes run as gathers, the outputs equal ONNX
    Runtime's and the unrewritten net's."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from caffe_ocl.onnx import check, to_caffe

    n, c, h, w, groups = 1, 8, 5, 5, 2
    inits = {
        "w1": rng.normal(0, 0.5, (c, 3, 3, 3)).astype(np.float32),
        "b1": rng.normal(0, 0.5, c).astype(np.float32),
        "s1": np.array([n, groups, c // groups, h, w], np.int64),
        "s2": np.array([n, -1, h, w], np.int64),
        "s3": np.array([n, groups, c // groups], np.int64),
        "s4": np.array([n, -1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "s1"], ["r1"]),
        helper.make_node("Transpose", ["r1"], ["t1"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t1", "s2"], ["shuffled"]),
        helper.make_node("GlobalAveragePool", ["shuffled"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["f"], axis=1),
        helper.make_node("Reshape", ["f", "s3"], ["r2"]),
        helper.make_node("Transpose", ["r2"], ["t2"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t2", "s4"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (n, 3, h, w))],
        [helper.make_tensor_value_info("shuffled", TensorProto.FLOAT, (n, c, h, w)),
         helper.make_tensor_value_info("out", TensorProto.FLOAT, (n, c))],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    net_param = to_caffe.convert(model)
    perm_layers = [lp.name for lp in net_param.layer if lp.name.endswith("_permute")]
    assert [lp.type for lp in net_param.layer if lp.name in perm_layers] == \
        ["Convolution", "InnerProduct"]

    net = check.caffe_net(net_param)
    x = rng.normal(0, 1, (n, 3, h, w)).astype(np.float32)
    out = check.run_caffe(net, {"x": x}, ["shuffled", "out"])
    found = _groups(net)
    assert sorted(found) == sorted(perm_layers)
    assert all(g.gathers for g in found.values())

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref_shuffled, ref_out = sess.run(["shuffled", "out"], {"x": x})
    # the gather moves values: the shuffle of caffe_ocl's own conv output
    c_val = net.blobs["c"].data
    np.testing.assert_array_equal(
        out["shuffled"], c_val.reshape(n, groups, c // groups, h, w)
        .transpose(0, 2, 1, 3, 4).reshape(n, c, h, w))
    np.testing.assert_allclose(out["shuffled"], ref_shuffled, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["out"].reshape(n, c), ref_out, rtol=1e-5, atol=1e-5)

    plain = Net(net.graph.param, TEST, fold=False)
    plain.copy_from(net_param)
    check.run_caffe(plain, {"x": x})
    assert _groups(plain) == {}
    _assert_bit_equal(net, plain)


@pytest.mark.parametrize("kernel", ["gather_channels", "gather_channels_runs"])
@pytest.mark.parametrize("dims", [(3, 7, 5), (2, 5, 1), (1, 11, 13)])
def test_gather_kernels(rng, kernel, dims):
    """Both kernels (the GPU one and the CPU drivers' runs) on odd sizes,
    with as many and with fewer work-items than runs."""
    dev = get_device()
    outer, c, s = dims
    n = outer * c * s
    x = rng.normal(0, 1, n).astype(np.float32)
    perm = rng.permutation(c).astype(np.int32)
    xb, yb, pb = dev.alloc(4 * n), dev.alloc(4 * n), dev.alloc(4 * c)
    dev.upload(xb, x)
    dev.upload(pb, perm)
    want = x.reshape(outer, c, s)[:, perm].ravel()
    for g, l in (work_size(dev, n), ((3,), (1,)), ((2 * n,), (1,))):
        dev.upload(yb, np.full(n, np.nan, np.float32))
        dev.launch("shape.cl", kernel, g, l, [n, c, s, pb, xb, yb]).run(dev.queue)
        y = np.empty(n, np.float32)
        dev.download(y, yb)
        np.testing.assert_array_equal(y, want, err_msg=f"{g} {l}")


def test_concat_input_left_to_concat_in_place(rng):
    """A permutation convolution whose top is a Concat's input writes its
    slice of the Concat (concat.py runs first; it stays a GEMM there) and
    the values are still the convolution's."""
    from caffe_ocl.plan import concat
    text = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 4 dim: 3 dim: 3 } } }
layer { name: "pc" type: "Convolution" bottom: "data" top: "p"
        convolution_param { num_output: 4 kernel_size: 1 bias_term: false } }
layer { name: "cat" type: "Concat" bottom: "p" bottom: "data" top: "cat" }
"""
    nets = [Net(parse_net_text(text), TEST), Net(parse_net_text(text), TEST, fold=False)]
    perm = rng.permutation(4)
    x = rng.normal(0, 1, (2, 4, 3, 3)).astype(np.float32)
    for net in nets:
        net.params["pc"][0].data[...] = _perm_matrix(perm).reshape(4, 4, 1, 1)
        net.forward(data=x)
    assert _groups(nets[0]) == {}
    if any(isinstance(c, concat.ConcatInPlace) for c in nets[0].plan.fold_groups):
        assert nets[0].blobs["p"].compute_on_read is not None
    _assert_bit_equal(nets[0], nets[1])
    np.testing.assert_array_equal(nets[0].blobs["cat"].data[:, :4], x[:, perm])


def test_test_net_follows_solver_updates(rng):
    """A TEST net sharing a training net's weights (as a solver's test net
    does): the solver's update (a device write) makes the weight no
    permutation; the TEST net notices and runs the convolution."""
    import caffe_ocl
    from caffe_ocl.proto import caffe_pb2
    text = """
layer { name: "data" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 4 dim: 3 dim: 3 } shape { dim: 2 } } }
layer { name: "pc" type: "Convolution" bottom: "x" top: "p"
        convolution_param { num_output: 4 kernel_size: 1 bias_term: false } }
layer { name: "fc" type: "InnerProduct" bottom: "p" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(parse_net_text(text))
    sp.base_lr, sp.lr_policy, sp.max_iter, sp.display = 0.5, "fixed", 10, 0
    sp.snapshot_after_train = False
    solver = caffe_ocl.SGDSolver(sp)
    perm = rng.permutation(4)
    solver.net.params["pc"][0].data[...] = _perm_matrix(perm).reshape(4, 4, 1, 1)
    test = Net(parse_net_text(text), TEST)
    test.share_trained_layers_with(solver.net)
    x = rng.normal(0, 1, (2, 4, 3, 3)).astype(np.float32)
    label = np.array([0, 2], np.float32)
    test.forward(x=x, label=label)
    gather = _groups(test)["pc"]
    assert gather.gathers
    np.testing.assert_array_equal(test.blobs["p"].data, x[:, perm])
    for k, v in (("x", x), ("label", label)):
        solver.net.blobs[k].data[...] = v
    solver.step(1)
    test.forward(x=x, label=label)        # before any host read of the weight
    assert not gather.gathers
    w = solver.net.params["pc"][0].data.reshape(4, 4).astype(np.float64)
    assert permute.permutation_of(w) is None
    np.testing.assert_allclose(test.blobs["p"].data, np.einsum("ok,nkhw->nohw", w, x),
                               rtol=1e-5, atol=1e-6)
