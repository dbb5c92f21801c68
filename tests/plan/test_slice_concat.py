"""A Concat of Slices of one blob along the same axis as one gather
(caffe_ocl/plan/slice_concat.py): torch.roll as onnx2caffe writes it (a
Slice per piece, the other top to a Silence, the blob read through a
Split), a three-way reorder, against np.roll / NumPy and the same nets
with the rewrite off (the Slices' tops, computed on read, equal); where a
group must not form, reshapes, and the GPUs' kernel on the test device."""
import numpy as np
import pytest

from caffe_ocl.ops import shape as shape_ops
from caffe_ocl.plan import slice_concat
from plan_pairs import layer_text, nets_with_and_without


_layer = layer_text


def _roll(shift, axis, size):
    """x rolled by ``shift`` along ``axis`` (of ``size``): the last
    ``shift`` first, as torch.roll; two Slices with a Silence each."""
    p = size - shift
    sl = f"slice_param {{ axis: {axis} slice_point: {p} }}"
    return (_layer("head", "Slice", ["x"], ["unused0", "tail"], sl)
            + _layer("mute0", "Silence", ["unused0"], [])
            + _layer("front", "Slice", ["x"], ["body", "unused1"], sl)
            + _layer("mute1", "Silence", ["unused1"], [])
            + _layer("cat", "Concat", ["tail", "body"], ["y"], f"concat_param {{ axis: {axis} }}"))


HEAD = ('input: "data" input_shape { dim: 2 dim: 5 dim: 3 dim: 4 }\n'
        + _layer("act", "TanH", ["data"], ["x"]))
ROLL = HEAD + _roll(2, 1, 5) + _layer("also", "AbsVal", ["x"], ["xa"])

# one Slice in three, joined as (c, a, b) along the last axis
REORDER = HEAD + (
    _layer("cut", "Slice", ["x"], ["a", "b", "c"],
           "slice_param { axis: 3 slice_point: 1 slice_point: 3 }")
    + _layer("cat", "Concat", ["c", "a", "b"], ["y"], "concat_param { axis: 3 }"))


def _nets(text):
    return nets_with_and_without(text, "FUSE_SLICE_CONCAT")


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, slice_concat.SliceConcat)]


def _run(nets, rng, shape=(2, 5, 3, 4)):
    x = rng.normal(0, 1, shape).astype(np.float32)
    outs = [net.forward(data=x)["y"].copy() for net in nets]
    np.testing.assert_array_equal(outs[0], outs[1])
    for name in nets[1].blobs:          # the Slices' tops: their own forwards
        np.testing.assert_array_equal(nets[0].blobs[name].data, nets[1].blobs[name].data,
                                      err_msg=name)
    return np.tanh(x.astype(np.float64)), outs[0]


def test_roll_is_one_gather(rng):
    fused, plain = _nets(ROLL)
    (group,) = _groups(fused)
    assert [fused.graph.layer_types[i] for i in group.layers] == [
        "Slice", "Silence", "Slice", "Silence", "Concat"] and not _groups(plain)
    x, y = _run((fused, plain), rng)
    np.testing.assert_allclose(y, np.roll(x, 2, axis=1), rtol=1e-6)
    assert group.fwd is not None


def test_reorder_of_one_slice_and_reshapes(rng):
    fused, plain = _nets(REORDER)
    (group,) = _groups(fused)
    for shape in [(2, 5, 3, 4), (1, 2, 7, 6), (2, 5, 3, 4)]:
        for net in (fused, plain):
            net.blobs["data"].reshape(*shape)
            net.reshape()
        for _ in range(3):
            x, y = _run((fused, plain), rng, shape)
            np.testing.assert_allclose(y, np.concatenate([x[..., 3:], x[..., :1], x[..., 1:3]],
                                                         axis=3), rtol=1e-6)
    assert group.fwd is not None


@pytest.mark.parametrize("text", [
    # a piece also read elsewhere
    ROLL + _layer("peek", "AbsVal", ["tail"], ["t2"]),
    # pieces of two different blobs
    HEAD + _layer("act2", "Sigmoid", ["x"], ["x2"])
    + _layer("s1", "Slice", ["x"], ["p", "q"], "slice_param { axis: 1 slice_point: 2 }")
    + _layer("s2", "Slice", ["x2"], ["r", "s"], "slice_param { axis: 1 slice_point: 2 }")
    + _layer("m", "Silence", ["q", "s"], [])
    + _layer("cat", "Concat", ["p", "r"], ["y"], "concat_param { axis: 1 }"),
    # Slices along another axis than the Concat's
    HEAD + _layer("cut", "Slice", ["x"], ["a", "b"], "slice_param { axis: 3 slice_point: 2 }")
    + _layer("cat", "Concat", ["b", "a"], ["y"], "concat_param { axis: 1 }"),
])
def test_where_no_group_forms(text, rng):
    fused, plain = _nets(text)
    assert not _groups(fused)
    _run((fused, plain), rng)


def test_per_float_kernel_on_the_test_device(d, rng):
    """The GPUs' variant (a float per work-item over (k, row)) against NumPy."""
    x = rng.normal(0, 1, (3, 7, 11)).astype(np.float32)
    idx = np.array([5, 6, 0, 1, 2, 3, 4, 2], np.int32)
    from caffe_ocl.layers.ssd import int_buffer
    xb, yb = d.buf(x), d.buf(np.full(3 * 8 * 11, np.nan))
    for per_float in (True, False):
        d.run([shape_ops.gather_axis_rows(d.dev, 3, 8, 7, 11, int_buffer(d.dev, idx), xb, yb,
                                          per_float=per_float)])
        np.testing.assert_array_equal(d.get(yb, (3, 8, 11)), x[:, idx, :])
