"""A channel gather whose top only the Slices right after it read writes
the Slices' tops itself (caffe_ocl/plan/permute.py GatherSlices:
ShuffleNet v2's shuffle -> channel split in one launch). Every blob equals
the unrewritten net's bit for bit (the gather's top, the Split tops sharing
it and the Concat's top computed when read), across passes (forward
traces), reshapes, forward ranges, weights that stop being a permutation
and Slices the gather cannot write."""
import numpy as np
import pytest

from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import permute
from caffe_ocl.proto import parse_net_text
from plan_pairs import forward_reshaped, same_random_weights
from test_concat_gather import _assert_same, _nets, _perm_matrix, _shuffle, _text, _x

# onnx2caffe's channel split: two Slices of the shuffled blob, each with a
# Silence for its unused half (Caffe inserts a Split: two layers read it)
ONNX_SPLIT = """
layer { name: "s1" type: "Slice" bottom: "shuf" top: "h0" top: "u1"
        slice_param { axis: 1 slice_point: 2 } }
layer { name: "s1_silence" type: "Silence" bottom: "u1" }
layer { name: "s2" type: "Slice" bottom: "shuf" top: "u0" top: "h1"
        slice_param { axis: 1 slice_point: 2 } }
layer { name: "s2_silence" type: "Silence" bottom: "u0" }
layer { name: "next" type: "Convolution" bottom: "h1" top: "nc"
        convolution_param { num_output: 2 kernel_size: 3 pad: 1 } }
layer { name: "cat2" type: "Concat" bottom: "h0" bottom: "nc" top: "out2" }
"""
# the Caffe forks' form: one Slice with two tops
ONE_SLICE = """
layer { name: "s1" type: "Slice" bottom: "shuf" top: "h0" top: "h1"
        slice_param { axis: 1 } }
layer { name: "next" type: "Convolution" bottom: "h1" top: "nc"
        convolution_param { num_output: 2 kernel_size: 3 pad: 1 } }
"""
# a permutation layer on the input (no Concat before it), three tops
NO_CONCAT = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 6 dim: 3 dim: 4 } } }
layer { name: "perm" type: "Convolution" bottom: "data" top: "shuf"
        convolution_param { num_output: 6 kernel_size: 1 bias_term: false } }
layer { name: "s1" type: "Slice" bottom: "shuf" top: "h0" top: "h1" top: "h2"
        slice_param { axis: 1 slice_point: 1 slice_point: 4 } }
"""


def _unit(tail):
    """UNIT (test_concat_gather) with ``tail`` reading "shuf" in place of
    its "post" convolution."""
    text = _text(2)
    cut = text.index('layer { name: "post"')
    return text[:cut] + tail


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, permute.GatherSlices)]


def _check_passes(fused, plain, rng, x_of, passes=5):
    groups = _groups(fused)
    for k in range(passes):            # passes 3-5 replay the recorded trace
        x = x_of(rng)
        fused.forward(data=x)
        plain.forward(data=x)
        # the gather wrote the Slices' tops, not its own top
        assert fused.blobs["shuf"].compute_on_read is not None, k
        _assert_same(fused, plain)
    assert fused._tracer.replays >= 2
    return groups


@pytest.mark.parametrize("tail", ["onnx", "one-slice"])
def test_gather_writes_the_slice_tops_bit_exact(rng, tail):
    fused, plain = _nets(_unit(ONNX_SPLIT if tail == "onnx" else ONE_SLICE), _shuffle(4))
    groups = _groups(fused)
    names = fused.graph.layer_names
    assert len(groups) == 1
    assert isinstance(groups[0].gather, permute.ConcatGather)
    assert [names[li] for li in groups[0].slices] == (["s1", "s2"] if tail == "onnx" else ["s1"])
    assert "written into the tops of s1" in " ".join(fused.plan.describe())
    _check_passes(fused, plain, rng, _x)
    # the definition, independently of the unrewritten net
    b = {n: fused.blobs[n].data for n in fused.blobs}
    np.testing.assert_array_equal(b["shuf"], np.concatenate([b["a"], b["r"]], 1)[:, _shuffle(4)])
    np.testing.assert_array_equal(b["h0"], b["shuf"][:, :2])
    np.testing.assert_array_equal(b["h1"], b["shuf"][:, 2:])


def test_one_source_gather_into_three_tops(rng):
    perm = rng.permutation(6)
    fused = Net(parse_net_text(NO_CONCAT), TEST)
    plain = Net(parse_net_text(NO_CONCAT), TEST, fold=False)
    for net in (fused, plain):
        net.params["perm"][0].data[...] = _perm_matrix(perm)
    groups = _groups(fused)
    assert len(groups) == 1 and type(groups[0].gather) is permute.PermutationGather

    def x_of(r):
        return r.normal(0, 1, (2, 6, 3, 4)).astype(np.float32)
    _check_passes(fused, plain, rng, x_of)
    d = fused.blobs["data"].data
    np.testing.assert_array_equal(fused.blobs["h1"].data, d[:, perm][:, 1:4])


def test_reshape_and_forward_ranges(rng):
    fused, plain = _nets(_unit(ONNX_SPLIT), _shuffle(4))
    for n in (3, 1):
        forward_reshaped((fused, plain), _x(rng, n))
        _assert_same(fused, plain)
    # a range ending inside the group writes the gather's top; one
    # starting at a Slice reads the top a full pass left pending
    x = _x(rng, 1)
    for net in (fused, plain):
        net.forward(data=x)
        net.forward(end="perm")
    assert fused.blobs["shuf"].compute_on_read is None
    _assert_same(fused, plain)
    for start in ("s2", "s1"):
        x = _x(rng, 1)
        for net in (fused, plain):
            net.forward(data=x)
            net.blobs["h1"].data[...] = 7.0      # must be rewritten from "shuf"
            net.forward(start=start)
        _assert_same(fused, plain)


def test_weights_no_longer_a_permutation(rng):
    fused, plain = _nets(_unit(ONNX_SPLIT), _shuffle(4))
    w = rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32)
    x = _x(rng)
    for net in (fused, plain):
        net.forward(data=x)
        net.params["perm"][0].data[...] = w
        net.forward(data=x)
    assert fused.blobs["shuf"].compute_on_read is None      # the GEMM wrote it
    _assert_same(fused, plain)
    for net in (fused, plain):       # and back
        net.params["perm"][0].data[...] = _perm_matrix(_shuffle(4)[::-1].copy())
        net.forward(data=x)
    assert fused.blobs["shuf"].compute_on_read is not None
    _assert_same(fused, plain)


def test_slices_not_along_channels_run_apart(rng):
    """Slices of the height: the gather cannot write them; same values."""
    tail = ONE_SLICE.replace("slice_param { axis: 1 }", "slice_param { axis: 2 slice_point: 2 }")
    fused, plain = _nets(_unit(tail), _shuffle(4))
    assert len(_groups(fused)) == 1
    for _ in range(3):
        x = _x(rng)
        fused.forward(data=x)
        plain.forward(data=x)
        assert fused.blobs["shuf"].compute_on_read is None
        _assert_same(fused, plain)


def test_not_matched(settings):
    # the gather's top read by another layer too
    tail = ONE_SLICE + ('layer { name: "gap" type: "Pooling" bottom: "shuf" top: "g" '
                        'pooling_param { pool: AVE global_pooling: true } }')
    assert _groups(Net(parse_net_text(_unit(tail)), TEST)) == []
    settings(GATHER_SLICES=False)
    net = Net(parse_net_text(_unit(ONNX_SPLIT)), TEST)
    assert _groups(net) == []
    assert any(isinstance(c, permute.ConcatGather) for c in net.plan.fold_groups)


# a ShuffleNet v2 unit in the Caffe forks' form (farmingyard's
# ShuffleChannel): Slice -> branch -> Concat -> ShuffleChannel -> Slice
FORK_UNIT = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 6 dim: 5 dim: 3 } } }
layer { name: "split" type: "Slice" bottom: "data" top: "a" top: "b"
        slice_param { axis: 1 slice_point: 3 } }
layer { name: "br" type: "Convolution" bottom: "b" top: "r"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "r" top: "r" }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "r" top: "cat" }
layer { name: "shuffle" type: "ShuffleChannel" bottom: "cat" top: "shuf"
        shuffle_channel_param { group: 2 } }
layer { name: "s1" type: "Slice" bottom: "shuf" top: "h0" top: "h1"
        slice_param { axis: 1 slice_point: 3 } }
layer { name: "next" type: "Convolution" bottom: "h1" top: "nc"
        convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "cat2" type: "Concat" bottom: "h0" bottom: "nc" top: "out" }
"""


@pytest.mark.parametrize("group", [2, 3])
def test_fork_shuffle_channel_unit(rng, group):
    """ShuffleChannel is a gather of a fixed permutation: with the Concat
    before it and the Slice after it, one launch; bit for bit the layers'
    values, and the shuffle as the fork defines it."""
    text = FORK_UNIT.replace("group: 2", f"group: {group}")
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), 5)
    groups = _groups(fused)
    assert len(groups) == 1 and isinstance(groups[0].gather, permute.ConcatGather)
    assert "cat -> shuffle (one channel gather from the Concat's inputs), written into the " \
        "tops of s1" in \
        " ".join(fused.plan.describe())

    def x_of(r):
        return r.normal(0, 1, (2, 6, 5, 3)).astype(np.float32)
    _check_passes(fused, plain, rng, x_of)
    # the fork's definition: channels seen as (group, C / group), transposed
    cat = fused.blobs["cat"].data
    want = cat.reshape(2, group, 6 // group, 5, 3).transpose(0, 2, 1, 3, 4).reshape(2, 6, 5, 3)
    np.testing.assert_array_equal(fused.blobs["shuf"].data, want)
    for n in (3, 1):
        forward_reshaped((fused, plain), x_of(rng)[:1].repeat(n, 0))
        _assert_same(fused, plain)


def test_shuffle_permutation():
    assert permute.shuffle_permutation(6, 2).tolist() == [0, 3, 1, 4, 2, 5]
    assert permute.shuffle_permutation(6, 3).tolist() == [0, 2, 4, 1, 3, 5]


@pytest.mark.parametrize("shape", [(2, 6, 3, 4), (3, 6)])
def test_lone_shuffle_channel_as_a_gather(rng, shape):
    """A ShuffleChannel on its own (no Concat, no Slice) runs as a gather:
    bit for bit its own kernel's values, 4-D and 2-D."""
    dims = " ".join(f"dim: {d}" for d in shape)
    text = (f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'
            'layer { name: "shuffle" type: "ShuffleChannel" bottom: "data" top: "out" '
            'shuffle_channel_param { group: 3 } }\n')
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    assert [type(c) for c in fused.plan.fold_groups] == [permute.PermutationGather]
    for _ in range(3):
        x = rng.normal(0, 1, shape).astype(np.float32)
        fused.forward(data=x)
        plain.forward(data=x)
        _assert_same(fused, plain)
