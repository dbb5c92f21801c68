"""Sibling convolutions whose outputs make up a Concat as one convolution
writing the Concat's top (caffe_ocl/plan/siblings.py: SqueezeNet's fire
module). The rule is the GPU's (siblings.applies); here it is made to hold
on whatever device runs the tests. Every blob equals the net run layer by
layer within float32 rounding, across passes (forward traces), reshapes
past the rule's limit, forward ranges and weight changes."""
import numpy as np
import pytest

from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import siblings
from caffe_ocl.proto import parse_net_text
from plan_pairs import forward_reshaped, same_random_weights


@pytest.fixture(autouse=True)
def rule_anywhere(monkeypatch):
    """siblings.applies as on a GPU, whatever the device."""
    real = siblings.applies

    class _Gpu:
        is_cpu = False
    monkeypatch.setattr(siblings, "applies", lambda dev, *a, **k: real(_Gpu, *a, **k))


def _conv(name, bottom, top, n, kernel, pad, stride=1, bias=True):
    kh, kw = kernel
    ph, pw = pad
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_h: {kh} kernel_w: {kw} '
            f'pad_h: {ph} pad_w: {pw} stride: {stride} bias_term: {str(bias).lower()} }} }}\n')


def fire(branches, in_place=True, stride=1, act="ReLU", n=1, extra=""):
    """data -> squeeze 1x1 + ReLU -> each branch (outputs, kernel, pad,
    bias) + ``act`` (in place, or into a new top) -> Concat."""
    text = ('layer { name: "data" type: "Input" top: "data" '
            f'input_param {{ shape {{ dim: {n} dim: 3 dim: 9 dim: 8 }} }} }}\n')
    text += _conv("squeeze", "data", "sq", 4, (1, 1), (0, 0))
    text += 'layer { name: "sq_relu" type: "ReLU" bottom: "sq" top: "sq" }\n'
    tops = []
    for k, (c, kernel, pad, bias) in enumerate(branches):
        conv_top = f"e{k}" if in_place else f"e{k}_conv"
        text += _conv(f"e{k}", "sq", conv_top, c, kernel, pad, stride, bias)
        if act is not None:
            text += (f'layer {{ name: "e{k}_act" type: "{act}" bottom: "{conv_top}" '
                     f'top: "e{k}" }}\n')
        tops.append(f"e{k}" if act is not None or in_place else conv_top)
    text += ('layer { name: "cat" type: "Concat" '
             + " ".join(f'bottom: "{t}"' for t in tops) + ' top: "cat" }\n')
    return text + extra


SQUEEZENET = [(3, (1, 1), (0, 0), True), (5, (3, 3), (1, 1), True)]


def _nets(text, seed=3):
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), seed)
    return fused, plain


def _groups(net):
    return [c for c in net.plan.fold_groups if isinstance(c, siblings.SiblingConvs)]


def _x(rng, n=1):
    return rng.normal(0, 1, (n, 3, 9, 8)).astype(np.float32)


def _assert_close(a, b):
    for name in b.blobs:
        np.testing.assert_allclose(a.blobs[name].data, b.blobs[name].data, rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def _passes(fused, plain, rng, n=1, passes=5):
    for _ in range(passes):               # passes 3-5 replay the recorded trace
        x = _x(rng, n)
        fused.forward(data=x)
        plain.forward(data=x)
        _assert_close(fused, plain)


@pytest.mark.parametrize("form", ["in-place", "new-top", "no-activation"])
def test_squeezenet_fire_in_one_convolution(rng, form):
    text = fire(SQUEEZENET, in_place=form != "new-top", act=None if form == "no-activation"
                else "ReLU")
    fused, plain = _nets(text)
    groups = _groups(fused)
    assert len(groups) == 1
    assert "e0 + e1 -> cat (one convolution writing the Concat)" in fused.plan.describe()
    x = _x(rng)
    fused.forward(data=x)
    plain.forward(data=x)
    # the siblings' outputs were not written: computed when read
    assert fused.blobs["e0"].compute_on_read is not None
    _assert_close(fused, plain)
    _passes(fused, plain, rng)
    assert fused._tracer.replays >= 2
    # the definition, independently of the unrewritten net (the siblings'
    # outputs come from their own kernels: the same sums, maybe rounded
    # apart on a GPU, where the merged window's tiles add them in another order)
    b = fused.blobs
    np.testing.assert_allclose(b["cat"].data, np.concatenate([b["e0"].data, b["e1"].data], 1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("branches", [
    [(2, (3, 3), (1, 1), True), (3, (5, 5), (2, 2), False)],                      # 3x3 + 5x5
    [(2, (1, 1), (0, 0), False), (2, (3, 3), (1, 1), True), (1, (1, 1), (0, 0), True)],
    [(3, (1, 3), (0, 1), True), (2, (3, 1), (1, 0), True)],                       # 1x3 + 3x1
])
@pytest.mark.parametrize("stride", [1, 2])
def test_windows_line_up(rng, monkeypatch, branches, stride):
    monkeypatch.setattr(siblings, "SIBLING_MAX_WORK", 4.0)    # 1x3 + 3x1: 3x the work
    fused, plain = _nets(fire(branches, stride=stride))
    assert len(_groups(fused)) == 1
    _passes(fused, plain, rng, passes=3)


def test_merged_window():
    from caffe_ocl.ops.conv import ConvGeometry

    def geom(k, p, s=1):
        return ConvGeometry(1, 4, 9, 8, 2, k[0], k[1], p[0], p[1], s, s)
    assert siblings.merged_window([geom((1, 1), (0, 0)), geom((3, 3), (1, 1))]) == \
        (3, 3, 1, 1, [(1, 1), (0, 0)])
    assert siblings.merged_window([geom((1, 3), (0, 1)), geom((3, 1), (1, 0))]) == \
        (3, 3, 1, 1, [(1, 0), (0, 1)])
    # same output size, windows not centred alike: 2x2 pad 0 vs 1x1 pad 0
    # (9x8 -> 8x7 vs 9x8: sizes differ) and 3x3 pad 1 vs 2x2 pad 1 (a
    # window that would need a one-sided pad)
    assert siblings.merged_window([geom((3, 3), (1, 1)), geom((2, 2), (1, 1))]) is None
    assert siblings.merged_window([geom((1, 1), (0, 0)), geom((3, 3), (1, 1), 2)]) is None


def test_rule_limits_and_reshape(rng, monkeypatch):
    """Past SIBLING_MAX_PIXELS each sibling writes its Concat slice (or,
    where its algorithm writes whole blobs only, its own output, which the
    Concat copies): same values; back under it the merged convolution runs
    again."""
    fused, plain = _nets(fire(SQUEEZENET))
    assert len(_groups(fused)) == 1
    group = _groups(fused)[0]
    big = siblings.SIBLING_MAX_PIXELS // (9 * 8) + 1
    for n in (big, 1, 2, big):
        forward_reshaped((fused, plain), _x(rng, n))
        assert group.mode == ("slices" if n == big else "merged")
        assert fused.blobs["e0"].compute_on_read is not None
        _assert_close(fused, plain)
    monkeypatch.setattr(siblings.conv_ops, "writes_slices", lambda *a: False)
    forward_reshaped((fused, plain), _x(rng, big + 1))
    assert group.mode == "tops" and fused.blobs["e0"].compute_on_read is None
    _assert_close(fused, plain)


def test_new_top_activations_past_the_limit(rng, monkeypatch):
    """ONNX's form (activations into new tops) at a batch past the limit,
    slices or own tops: the convolutions' pre-activation outputs are
    computed when read."""
    fused, plain = _nets(fire(SQUEEZENET, in_place=False))
    group = _groups(fused)[0]
    big = siblings.SIBLING_MAX_PIXELS // (9 * 8) + 1
    forward_reshaped((fused, plain), _x(rng, big))
    assert group.mode == "slices"
    _assert_close(fused, plain)
    monkeypatch.setattr(siblings.conv_ops, "writes_slices", lambda *a: False)
    for _ in range(3):
        forward_reshaped((fused, plain), _x(rng, big))
        assert group.mode == "tops"
        assert fused.blobs["e0_conv"].compute_on_read is not None
        _assert_close(fused, plain)


def test_planned_at_a_big_batch_runs_merged_at_batch_1(rng):
    """A deploy prototxt of batch 10 reshaped to 1 (as classify.py does):
    the plan took the siblings for what one image needs."""
    big = siblings.SIBLING_MAX_PIXELS // (9 * 8) + 1
    fused, plain = _nets(fire(SQUEEZENET, n=big))
    group = _groups(fused)[0]
    forward_reshaped((fused, plain), _x(rng, big))
    assert group.mode == "slices"
    forward_reshaped((fused, plain), _x(rng, 1))
    assert group.mode == "merged"
    _assert_close(fused, plain)


def test_weights_changed_and_forward_ranges(rng):
    fused, plain = _nets(fire(SQUEEZENET))
    _passes(fused, plain, rng, passes=3)
    w = rng.normal(0, 0.5, fused.params["e1"][0].shape).astype(np.float32)
    for net in (fused, plain):              # the merged weight is rebuilt
        net.params["e1"][0].data[...] = w
        net.params["e0"][1].data[...] = 0.25
    _passes(fused, plain, rng, passes=3)
    x = _x(rng)
    for net in (fused, plain):              # a range ending inside the group
        net.forward(data=x)
        net.forward(end="e0_act")
    assert fused.blobs["e0"].compute_on_read is None
    _assert_close(fused, plain)
    x = _x(rng)
    for net in (fused, plain):              # one starting at the Concat
        net.forward(data=x)
        net.blobs["cat"].data[...] = 3.0
        net.forward(start="cat")
    _assert_close(fused, plain)


def test_not_matched(settings):
    # different activations
    text = fire(SQUEEZENET).replace('name: "e1_act" type: "ReLU"', 'name: "e1_act" type: "TanH"')
    assert _groups(Net(parse_net_text(text), TEST)) == []
    # a sibling's output read by another layer too
    extra = 'layer { name: "gap" type: "Pooling" bottom: "e0" top: "g" pooling_param { pool: AVE global_pooling: true } }\n'
    assert _groups(Net(parse_net_text(fire(SQUEEZENET, extra=extra)), TEST)) == []
    # siblings reading different blobs
    text = fire(SQUEEZENET).replace('bottom: "sq" top: "e1"', 'bottom: "data" top: "e1"')
    assert _groups(Net(parse_net_text(text), TEST)) == []
    # 1x1 + 5x5 of 8 outputs each: 2 x 25 / 26 is under the work limit;
    # 1x1 of 16 + 5x5 of 1: 17 x 25 / 41 is not
    ok = [(8, (1, 1), (0, 0), True), (8, (5, 5), (2, 2), True)]
    assert len(_groups(Net(parse_net_text(fire(ok)), TEST))) == 1
    lopsided = [(16, (1, 1), (0, 0), True), (1, (5, 5), (2, 2), True)]
    assert _groups(Net(parse_net_text(fire(lopsided)), TEST)) == []
    settings(SIBLING_CONVS=False)
    assert _groups(Net(parse_net_text(fire(SQUEEZENET)), TEST)) == []
