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
    # a Permute moving other axes too is no transpose of the last two
    # (keys given (3, 2, 6, 4): the product's shapes still agree)
    (lambda t: t.replace("order: 0 order: 1 order: 3 order: 2",
                         "order: 1 order: 0 order: 3 order: 2")
     .replace("dim: 2 dim: 3 dim: 6 dim: 4", "dim: 3 dim: 2 dim: 6 dim: 4"), "kt"),
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
    """A Permute of other axes, or a product read elsewhere too, stays."""
    other = _inputs((2, 3, 5, 6), (2, 3, 6, 4)) + (
        _layer("mm", "MatMul", ["q", "k"], "o")
        + _layer("merge", "Permute", ["o"], "y",
                 "permute_param { order: 1 order: 0 order: 2 order: 3 }"))
    shared = _inputs((2, 3, 5, 6), (2, 3, 6, 4)) + (
        _layer("mm", "MatMul", ["q", "k"], "o") + _merge("merge", "o", "y", 4)
        + _layer("act", "TanH", ["o"], "z"))
    for text in (other, shared):
        fused, _ = _nets(text)
        assert not _groups(fused)
