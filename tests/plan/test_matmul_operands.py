"""Scalings and last-axes transposes of a MatMul's operands read by its
GEMM (caffe_ocl/plan/matmul_operands.py): attention's q * scale, k * scale
and K^T as onnx2caffe writes them, a transposed left operand, against a
float64 product and the same nets with the rewrite off (every
intermediate, computed on read, equal); what a chain may not take (a
shift, another reader, a Permute of other axes), reshapes and replays."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import matmul_operands
from caffe_ocl.proto import parse_net_text
from plan_pairs import layer_text, nets_with_and_without


_layer = layer_text


def _inputs(a, b):
    def one(name, dims):
        d = " ".join(f"dim: {v}" for v in dims)
        return (f'layer {{ name: "{name}" type: "Input" top: "{name}" '
                f'input_param {{ shape {{ {d} }} }} }}\n')
    return one("q", a) + one("k", b)


def _scale(name, b, t, s, shift=0.0):
    return _layer(name, "Power", [b], t, f"power_param {{ scale: {s} shift: {shift} }}")


def _swap(name, b, t, n=4):
    order = " ".join(f"order: {o}" for o in list(range(n - 2)) + [n - 1, n - 2])
    return _layer(name, "Permute", [b], t, f"permute_param {{ {order} }}")


# scores = (q * 0.5) (k * 0.25)^T: q (2, 3, 5, 4), k (2, 3, 6, 4)
ATTENTION = _inputs((2, 3, 5, 4), (2, 3, 6, 4)) + (
    _scale("qs", "q", "q2", 0.5) + _scale("ks", "k", "k2", 0.25) + _swap("kt", "k2", "k3")
    + _layer("mm", "MatMul", ["q2", "k3"], "s") + _layer("act", "TanH", ["s"], "y"))

# a transposed left operand, a transposed-twice right one: q (2, 4, 5), k (2, 6, 4)
BOTH = _inputs((2, 4, 5), (2, 6, 4)) + (
    _swap("qt", "q", "q2", 3) + _swap("kt", "k", "k2", 3) + _scale("ks", "k2", "k3", -2.0)
    + _swap("kt2", "k3", "k4", 3) + _swap("kt3", "k4", "k5", 3)
    + _layer("mm", "MatMul", ["q2", "k5"], "y"))


def _nets(text):
    return nets_with_and_without(text, "FUSE_MATMUL_OPERANDS")


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, matmul_operands.MatMulOperands)]


def _run(nets, rng, out="y"):
    feed = {name: rng.normal(0, 1, nets[0].blobs[name].shape).astype(np.float32)
            for name in ("q", "k")}
    outs = [net.forward(**feed)[out].copy() for net in nets]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    for name in nets[1].blobs:          # intermediates: the layers' own forwards
        np.testing.assert_allclose(nets[0].blobs[name].data, nets[1].blobs[name].data,
                                   rtol=1e-6, atol=1e-7, err_msg=name)
    return feed, outs[0]


def test_scaled_queries_and_transposed_keys_are_one_gemm(rng):
    fused, plain = _nets(ATTENTION)
    (group,) = _groups(fused)
    names = [fused.graph.layer_names[i] for i in group.layers]
    assert names == ["qs", "ks", "kt", "mm"] and not _groups(plain)
    assert group.alpha == 0.125 and group.trans == (False, True)
    feed, y = _run((fused, plain), rng)
    q, k = (feed[n].astype(np.float64) for n in ("q", "k"))
    want = np.tanh(0.125 * q @ np.swapaxes(k, -1, -2))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_transposes_counted_per_operand(rng):
    fused, plain = _nets(BOTH)
    (group,) = _groups(fused)
    assert group.trans == (True, True) and group.alpha == -2.0    # three swaps of k: one
    feed, y = _run((fused, plain), rng)
    q, k = (feed[n].astype(np.float64) for n in ("q", "k"))
    np.testing.assert_allclose(y, -2.0 * np.swapaxes(q, 1, 2) @ np.swapaxes(k, 1, 2),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change,left", [
    # a Power with a shift is not a factor: the chain stops before it
    (lambda t: t.replace("scale: 0.25 shift: 0.0", "scale: 0.25 shift: 1.0"), "ks"),
    # k^T also read after the MatMul: the Permute stays, and with it its chain
    (lambda t: t + _layer("also", "AbsVal", ["k3"], "k3abs"), "kt"),
    # a Permute that leaves neither the rows nor the columns contiguous
    # (keys given (4, 3, 6, 2), moved to (2, 3, 4, 6)) is no GEMM operand
    (lambda t: t.replace("order: 0 order: 1 order: 3 order: 2",
                         "order: 3 order: 1 order: 0 order: 2")
     .replace("dim: 2 dim: 3 dim: 6 dim: 4", "dim: 4 dim: 3 dim: 6 dim: 2"), "kt"),
])
def test_what_a_chain_does_not_take(change, left, rng):
    fused, plain = _nets(change(ATTENTION))
    names = [fused.graph.layer_names[i] for g in _groups(fused) for i in g.layers]
    assert left not in names        # (the group must also lie right before the MatMul)
    _run((fused, plain), rng)


def test_reshapes_and_replays(rng):
    fused, plain = _nets(ATTENTION)
    for shapes in [((2, 3, 5, 4), (2, 3, 6, 4)), ((1, 2, 7, 4), (1, 2, 3, 4)),
                   ((2, 3, 5, 4), (2, 3, 6, 4))]:
        for net in (fused, plain):
            for name, shape in zip(("q", "k"), shapes):
                net.blobs[name].reshape(*shape)
            net.reshape()
        for _ in range(4):
            _run((fused, plain), rng)
    assert fused._tracer is None or fused._tracer.replays > 0


def test_off_by_setting():
    with config.override(FUSE_MATMUL_OPERANDS=False):
        net = Net(parse_net_text(ATTENTION), TEST)
    assert not _groups(net)


def _merge(name, b, t, n):
    """Permute (..., H, M, N) -> (..., M, H, N)."""
    order = " ".join(f"order: {o}" for o in list(range(n - 3)) + [n - 2, n - 3, n - 1])
    return _layer(name, "Permute", [b], t, f"permute_param {{ {order} }}")


# attention's output: weights (2, 3, 5, 6) x values (2, 3, 6, 4), heads
# merged back ((2, 5, 3, 4) -> (2, 5, 12)), then the next layer
HEADS = _inputs((2, 3, 5, 6), (2, 3, 6, 4)) + (
    _layer("mm", "MatMul", ["q", "k"], "o") + _merge("merge", "o", "om", 4)
    + _layer("flat", "Reshape", ["om"], "of",
             "reshape_param { shape { dim: 0 dim: 0 dim: -1 } }")
    + _layer("act", "TanH", ["of"], "y"))
# batch-1 exports squeeze the batch: (3, 5, 6) x (3, 6, 4) -> (5, 3, 4), and
# the keys scaled and transposed as well
HEADS_3D = _inputs((3, 5, 6), (3, 4, 6)) + (
    _scale("ks", "k", "k2", 0.5) + _swap("kt", "k2", "k3", 3)
    + _layer("mm", "MatMul", ["q", "k3"], "o") + _merge("merge", "o", "y", 3))


@pytest.mark.parametrize("text,names", [(HEADS, ["mm", "merge"]),
                                        (HEADS_3D, ["ks", "kt", "mm", "merge"])])
def test_heads_merged_by_the_gemm(rng, text, names):
    """The Permute merging attention's heads after the MatMul is the GEMM's
    output layout: the product is computed on read, every blob as the
    unfused net's, over replayed passes."""
    fused, plain = _nets(text)
    (group,) = _groups(fused)
    assert [fused.graph.layer_names[i] for i in group.layers] == names
    assert "heads merged" in group.describe() and not _groups(plain)
    for _ in range(3):
        feed, _ = _run((fused, plain), rng)
    q = feed["q"].astype(np.float64)
    k = feed["k"].astype(np.float64)
    if text is HEADS_3D:
        want = np.swapaxes(q @ np.swapaxes(0.5 * k, -1, -2), 0, 1)
        np.testing.assert_allclose(fused.blobs["y"].data, want, rtol=1e-5, atol=1e-6)
    else:
        want = np.swapaxes(q @ k, 1, 2)
        np.testing.assert_allclose(fused.blobs["om"].data, want, rtol=1e-5, atol=1e-6)


def test_heads_merge_not_taken():
    """A Permute that moves the product's last axis (the GEMM writes rows),
    or a product read elsewhere too, stays."""
    other = _inputs((2, 3, 5, 6), (2, 3, 6, 4)) + (
        _layer("mm", "MatMul", ["q", "k"], "o")
        + _layer("merge", "Permute", ["o"], "y",
                 "permute_param { order: 0 order: 1 order: 3 order: 2 }"))
    shared = _inputs((2, 3, 5, 6), (2, 3, 6, 4)) + (
        _layer("mm", "MatMul", ["q", "k"], "o") + _merge("merge", "o", "y", 4)
        + _layer("act", "TanH", ["o"], "z"))
    for text in (other, shared):
        fused, _ = _nets(text)
        assert not _groups(fused)


def _reshape(name, b, t, dims):
    d = " ".join(f"dim: {v}" for v in dims)
    return _layer(name, "Reshape", [b], t, f"reshape_param {{ shape {{ {d} }} }}")


def _permute(name, b, t, order):
    o = " ".join(f"order: {v}" for v in order)
    return _layer(name, "Permute", [b], t, f"permute_param {{ {o} }}")


def _qkv_attention(n, t, h, d, order=(0, 1, 2)):
    """timm's attention after its qkv projection, as onnx2caffe writes it:
    (n, t, 3 h d) -> (n, t, 3, h, d) -> (3, n, h, t, d) -> q, k, v;
    softmax(q s (k s)^T) v, heads merged back to (n, t, h d); q, k, v the
    Slice's tops ``order``."""
    iq, ik, iv = order
    return (f'layer {{ name: "x" type: "Input" top: "x" input_param {{ shape {{ dim: {n} '
            f'dim: {t} dim: {3 * h * d} }} }} }}\n'
            + _reshape("r5", "x", "x5", (0, 0, 3, h, d))
            + _permute("p", "x5", "xp", (2, 0, 3, 1, 4))
            + _layer("split", "Slice", ["xp"], ["s0", "s1", "s2"],
                     "slice_param { axis: 0 slice_point: 1 slice_point: 2 }")
            + _reshape("sq1", f"s{ik}", "k", (n, h, t, d))
            + _reshape("sq0", f"s{iq}", "q", (n, h, t, d))
            + _scale("qs", "q", "q2", 0.5) + _scale("ks", "k", "k2", 0.25)
            + _swap("kt", "k2", "k3")
            + _layer("mm", "MatMul", ["q2", "k3"], "sc")
            + _layer("sm", "Softmax", ["sc"], "w", "softmax_param { axis: 3 }")
            + _reshape("sq2", f"s{iv}", "v", (n, h, t, d))
            + _layer("mm2", "MatMul", ["w", "v"], "o")
            + _merge("merge", "o", "om", 4)
            + _reshape("flat", "om", "of", (0, 0, -1))
            + _layer("act", "TanH", ["of"], "y"))


def _qkv_want(x, h, d, order=(0, 1, 2)):
    n, t = x.shape[:2]
    parts = np.moveaxis(x.astype(np.float64).reshape(n, t, 3, h, d), (2, 3), (0, 2))
    q, k, v = (parts[i] for i in order)
    s = (0.5 * q) @ np.swapaxes(0.25 * k, -1, -2)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.tanh(np.swapaxes(w @ v, 1, 2).reshape(n, t, h * d))


def _run_x(nets, rng, name="x"):
    x = rng.normal(0, 1, nets[0].blobs[name].shape).astype(np.float32)
    outs = [net.forward(**{name: x})["y"].copy() for net in nets]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    return x, outs[0]


@pytest.mark.parametrize("n,t,h,d,order", [(1, 7, 3, 4, (0, 1, 2)), (2, 5, 2, 3, (2, 0, 1))])
def test_qkv_split_read_by_strides(n, t, h, d, order, rng):
    """q, k and v read from the qkv projection's output where the Reshape,
    Permute and Slice put them: no launch of theirs; every blob in between
    still Caffe's value when read (computed on read), over replays."""
    fused, plain = _nets(_qkv_attention(n, t, h, d, order))
    names = fused.graph.layer_names
    groups = [[names[i] for i in g.layers] for g in fused.plan.fold_groups
              if isinstance(g, (matmul_operands.MatMulOperands, matmul_operands.PendingViews))]
    assert groups == [["r5", "p", "split", "sq1", "sq0", "qs", "ks", "kt", "mm"],
                      ["sq2", "mm2", "merge"]], groups
    for _ in range(3):
        x, y = _run_x((fused, plain), rng)
    np.testing.assert_allclose(y, _qkv_want(x, h, d, order), rtol=1e-5, atol=1e-6)
    assert fused._tracer is None or fused._tracer.replays > 0
    for name in plain.blobs:        # each intermediate, read after the pass
        np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_qkv_range_after_the_views_reads_what_python_wrote(rng):
    """A forward range starting after the Slice runs the second product from
    the Slice's top as it is (written from Python), not from the source."""
    n, t, h, d = 1, 6, 2, 4
    fused, plain = _nets(_qkv_attention(n, t, h, d))
    _run_x((fused, plain), rng)
    v = rng.normal(0, 1, (1, n, h, t, d)).astype(np.float32)
    outs = []
    for net in (fused, plain):
        net.blobs["s2"].data[...] = v
        outs.append(net.forward(start="sm")["y"].copy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    w = fused.blobs["w"].data.astype(np.float64)
    want = np.tanh(np.swapaxes(w @ v[0].astype(np.float64), 1, 2).reshape(n, t, h * d))
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("v_first", [False, True])
def test_separate_projections_permuted_heads(v_first, rng):
    """BERT's form: q, k, v each (n, t, h d) -> (n, t, h, d) -> (n, h, t, d)
    (k to (n, h, d, t)): every Permute read by the GEMMs' strides. With
    v's views first and another layer after them, they are a group of
    their own that runs nothing."""
    n, t, h, d = 2, 5, 3, 4

    def heads(src, order, tag):
        return (_reshape("r" + tag, src, src + "4", (0, 0, h, d))
                + _permute("p" + tag, src + "4", src + "h", order))
    text = "".join(
        f'layer {{ name: "{v}" type: "Input" top: "{v}" input_param {{ shape {{ dim: {n} '
        f'dim: {t} dim: {h * d} }} }} }}\n' for v in ("qx", "kx", "vx")) + (
        (heads("vx", (0, 2, 1, 3), "v") + _layer("other", "AbsVal", ["qx"], "qabs")
         if v_first else "")
        + heads("qx", (0, 2, 1, 3), "q") + heads("kx", (0, 2, 3, 1), "k")
        + _layer("mm", "MatMul", ["qxh", "kxh"], "sc")
        + _layer("sm", "Softmax", ["sc"], "w", "softmax_param { axis: 3 }")
        + ("" if v_first else heads("vx", (0, 2, 1, 3), "v"))
        + _layer("mm2", "MatMul", ["w", "vxh"], "o")
        + _merge("merge", "o", "om", 4) + _reshape("flat", "om", "y", (0, 0, -1)))
    fused, plain = _nets(text)
    names = fused.graph.layer_names
    groups = sorted([names[i] for i in g.layers] for g in fused.plan.fold_groups
                    if isinstance(g, (matmul_operands.MatMulOperands,
                                      matmul_operands.PendingViews)))
    want = [["rq", "pq", "rk", "pk", "mm"], ["rv", "pv", "mm2", "merge"]]
    if v_first:
        want = [["mm2", "merge"], ["rq", "pq", "rk", "pk", "mm"], ["rv", "pv"]]
    assert groups == want, groups
    feed = {v: rng.normal(0, 1, (n, t, h * d)).astype(np.float32) for v in ("qx", "kx", "vx")}
    for _ in range(2):
        outs = [net.forward(**feed)["y"].copy() for net in (fused, plain)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    q, k, v = (feed[x].astype(np.float64).reshape(n, t, h, d).transpose(0, 2, 1, 3)
               for x in ("qx", "kx", "vx"))
    s = q @ np.swapaxes(k, -1, -2)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(outs[0], np.swapaxes(w @ v, 1, 2).reshape(n, t, h * d),
                               rtol=1e-5, atol=1e-6)
    for name in plain.blobs:
        np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_batch_axes_permuted_are_group_strides(rng):
    """Keys (3, 2, 6, 4) moved to (2, 3, 4, 6): the two leading axes swap
    places, which the GEMM's batch and group strides express."""
    text = ATTENTION.replace("order: 0 order: 1 order: 3 order: 2",
                             "order: 1 order: 0 order: 3 order: 2") \
        .replace("dim: 2 dim: 3 dim: 6 dim: 4", "dim: 3 dim: 2 dim: 6 dim: 4")
    fused, plain = _nets(text)
    (group,) = _groups(fused)
    assert [fused.graph.layer_names[i] for i in group.layers] == ["qs", "ks", "kt", "mm"]
    feed, y = _run((fused, plain), rng)
    q, k = (feed[n].astype(np.float64) for n in ("q", "k"))
    want = np.tanh(0.125 * q @ np.transpose(k, (1, 0, 3, 2)))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_view_reshape_rules():
    """numpy's no-copy reshape rule, and what is no view."""
    assert matmul_operands._reshaped([2, 3, 4], [12, 4, 1], [6, 4]) == [4, 1]
    assert matmul_operands._reshaped([3, 2, 4], [4, 12, 1], [6, 4]) is None
    assert matmul_operands._reshaped([3, 2, 4], [4, 12, 1], [3, 2, 2, 2]) == [4, 12, 2, 1]
    assert matmul_operands._reshaped([1, 5, 1], [99, 7, 3], [5]) == [7]
    x = np.arange(120.0).reshape(2, 3, 4, 5).transpose(1, 0, 3, 2)
    st = [s // 8 for s in x.strides]
    for new in ([3, 2, 20], [6, 5, 4], [3, 40], [3, 2, 5, 2, 2]):
        got = matmul_operands._reshaped(list(x.shape), st, new)
        try:
            y = x.view()
            y.shape = new           # numpy refuses where a copy would be needed
        except AttributeError:
            assert got is None, new
        else:
            assert got == [s // 8 for s in y.strides], new


def test_a_product_read_by_strides_by_the_next_product(rng):
    """The Permute after the first product is a view the second MatMul reads
    through: the first product is then written as it is (not merged into
    the Permute's top, which nothing would write)."""
    text = _inputs((2, 3, 5, 6), (2, 3, 6, 4)) + (
        _layer("mm", "MatMul", ["q", "k"], "o")
        + _permute("p", "o", "op", (0, 2, 1, 3))                # (2, 5, 3, 4)
        + 'layer { name: "w" type: "Input" top: "w" '
          'input_param { shape { dim: 2 dim: 5 dim: 4 dim: 7 } } }\n'
        + _layer("mm2", "MatMul", ["op", "w"], "y"))
    fused, plain = _nets(text)
    names = fused.graph.layer_names
    groups = sorted([names[i] for i in g.layers] for g in fused.plan.fold_groups
                    if isinstance(g, (matmul_operands.MatMulOperands,
                                      matmul_operands.PendingViews)))
    assert groups == [["mm2"], ["p"]], groups       # (the Input "w" lies between them)
    feed = {n: rng.normal(0, 1, fused.blobs[n].shape).astype(np.float32) for n in ("q", "k", "w")}
    for _ in range(3):
        outs = [net.forward(**feed)["y"].copy() for net in (fused, plain)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    q, k, w = (feed[n].astype(np.float64) for n in ("q", "k", "w"))
    np.testing.assert_allclose(outs[0], np.swapaxes(q @ k, 1, 2) @ w, rtol=1e-5, atol=1e-6)
