"""A depthwise convolution and the 1x1 convolution reading it as one launch
(plan/dw_pointwise.py; GPUs: ops.conv.takes_dw_input, kernels/conv1x1_few.cl
DWP). The rule is the GPU's; here it is made to hold on whatever device
runs the tests (the kernel runs on PoCL too), so the plan, the launches and
every blob's value are checked against the same net layer by layer, in
each form the two sides come in: ONNX's (biased convolutions, an
activation writing a new top, the shortcut added by an Eltwise), Caffe's
(BatchNorm / Scale / ReLU in place, folded), and lone layers; then a
reshape to shapes the kernel does not take, ranges cutting the group, a
read of the depthwise output, and a backward."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import conv1x1_few
from caffe_ocl.plan import dw_pointwise
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_backward, forward_reshaped, same_random_weights
from test_swish_fusion import _assert_blobs_equal

pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")

_W = 'weight_filler { type: "gaussian" std: 0.4 }'


def _conv(name, bottom, top, n, k=1, pad=0, group=1, stride=1, bias=True):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} group: {group} '
            f'stride: {stride} bias_term: {str(bias).lower()} {_W} }} }}\n')


def _bn_scale_relu(name, blob, relu=True):
    """Caffe's in-place BatchNorm -> Scale (-> ReLU) on ``blob``."""
    return (f'layer {{ name: "{name}_bn" type: "BatchNorm" bottom: "{blob}" top: "{blob}" }}\n'
            f'layer {{ name: "{name}_sc" type: "Scale" bottom: "{blob}" top: "{blob}" '
            f'scale_param {{ bias_term: true }} }}\n'
            + (f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{blob}" top: "{blob}" }}\n'
               if relu else ''))


HEAD = ('name: "dwpw" layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 2 dim: 8 dim: 7 dim: 6 } } }\n')
_CLIP = 'clip_param { min: 0 max: 6 }'
_LOSS = ('layer { name: "fc" type: "InnerProduct" bottom: "%s" top: "out" '
         'inner_product_param { num_output: 3 %s } }\n')

FORMS = {
    # ONNX's MobileNet v2 block: Conv -> Clip (new top) -> Conv -> Add
    "onnx-residual": (HEAD + _conv("dw", "data", "d", 8, k=3, pad=1, group=8)
                      + f'layer {{ name: "clip" type: "Clip" bottom: "d" top: "dc" {_CLIP} }}\n'
                      + _conv("pw", "dc", "p", 8)
                      + 'layer { name: "add" type: "Eltwise" bottom: "p" bottom: "data" '
                        'top: "sum" }\n' + _LOSS % ("sum", _W)),
    # Caffe's MobileNet: both sides folded chains, the 1x1 one with its ReLU
    "caffe-chains": (HEAD + _conv("dw", "data", "dc", 8, k=3, pad=1, group=8, bias=False)
                     + _bn_scale_relu("dw", "dc")
                     + _conv("pw", "dc", "p", 5, bias=False) + _bn_scale_relu("pw", "p")
                     + _LOSS % ("p", _W)),
    # Caffe's residual block end: the 1x1 chain's sum with the shortcut
    "caffe-residual": (HEAD + _conv("dw", "data", "dc", 8, k=5, pad=2, group=8, bias=False)
                       + _bn_scale_relu("dw", "dc")
                       + _conv("pw", "dc", "p", 8, bias=False)
                       + _bn_scale_relu("pw", "p", relu=False)
                       + 'layer { name: "add" type: "Eltwise" bottom: "p" bottom: "data" '
                         'top: "sum" }\n'
                       + 'layer { name: "relu" type: "ReLU" bottom: "sum" top: "sum" }\n'
                       + _LOSS % ("sum", _W)),
    # shicai's MobileNet v2: BatchNorm writes a new top, Scale / ReLU in place
    # (chain.NewTopChain on both sides)
    "caffe-new-tops": (HEAD + _conv("dw", "data", "d", 8, k=3, pad=1, group=8, bias=False)
                       + 'layer { name: "dw_bn" type: "BatchNorm" bottom: "d" top: "dc" }\n'
                       + 'layer { name: "dw_sc" type: "Scale" bottom: "dc" top: "dc" '
                         'scale_param { bias_term: true } }\n'
                       + 'layer { name: "dw_relu" type: "ReLU" bottom: "dc" top: "dc" }\n'
                       + _conv("pw", "dc", "p", 6, bias=False)
                       + 'layer { name: "pw_bn" type: "BatchNorm" bottom: "p" top: "pb" }\n'
                       + 'layer { name: "pw_sc" type: "Scale" bottom: "pb" top: "pb" '
                         'scale_param { bias_term: true } }\n'
                       + _LOSS % ("pb", _W)),
    # a lone depthwise layer (stride 2), the 1x1 layer with a ReLU writing a new top
    "lone-pair": (HEAD + _conv("dw", "data", "dc", 8, k=3, pad=1, group=8, stride=2)
                  + _conv("pw", "dc", "p", 6)
                  + 'layer { name: "relu" type: "ReLU" bottom: "p" top: "pr" }\n'
                  + _LOSS % ("pr", _W)),
    # both layers alone
    "lone-lone": (HEAD + _conv("dw", "data", "dc", 8, k=3, pad=1, group=8)
                  + _conv("pw", "dc", "p", 4) + _LOSS % ("p", _W)),
}


@pytest.fixture
def dw_rule(monkeypatch):
    """ops.conv.takes_dw_input as on a GPU wherever the kernel reaches
    the depthwise layer; ``rule["on"] = False`` turns it off (a reshape to
    shapes the kernel does not take)."""
    rule = {"on": True}

    def takes_dw_input(dev, g, gd, algo=None):
        return rule["on"] and config.get("FUSE_DW_POINTWISE") and conv1x1_few.takes_dw(g, gd)
    monkeypatch.setattr(conv_ops, "takes_dw_input", takes_dw_input)
    with config.override(FUSE_DW_POINTWISE=True):      # off by default (README)
        yield rule


def _nets(text, rng):
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), int(rng.integers(1 << 30)),
                        [n for n in plain.params if n.endswith("_bn")])
    return fused, plain


def _forward(nets, rng, n=2):
    forward_reshaped(nets, rng.normal(0, 1, (n,) + (8, 7, 6)).astype(np.float32))


def _group(net):
    return [c for c in net.plan.groups if isinstance(c, dw_pointwise.DwPointwise)]


@pytest.mark.parametrize("form", list(FORMS))
def test_one_launch_for_both_layers(rng, dw_rule, form):
    fused, plain = _nets(FORMS[form], rng)
    (group,) = _group(fused)
    assert group.describe().startswith("dw -> ")
    assert group.describe().endswith("(the depthwise output computed by the 1x1 kernel)")
    for n in (2, 1, 2):
        _forward((fused, plain), rng, n)
        pw_side = group.pw_group if group.pw_group is not None else group
        chain = getattr(pw_side, "chain", None)
        fwd = (chain if chain is not None else pw_side).fwd
        assert [ln.name for ln in fwd] == ["conv1x1_few"]
        # the depthwise output is left to be computed when read
        assert group.t.compute_on_read is not None
        _assert_blobs_equal(fused, plain, ["out"])
        _assert_blobs_equal(fused, plain)       # every blob, the pending ones computed now
        assert group.t.compute_on_read is None
    with config.override(FUSE_DW_POINTWISE=False):
        assert _group(Net(parse_net_text(FORMS[form]), TEST)) == []


def test_shapes_the_kernel_does_not_take(rng, dw_rule):
    """The rule off at the current shapes: the two sides run one after the
    other (the depthwise output written), and back to one launch after."""
    for form in ("onnx-residual", "caffe-chains", "lone-lone"):
        fused, plain = _nets(FORMS[form], rng)
        (group,) = _group(fused)
        dw_rule["on"] = False
        _forward((fused, plain), rng, 3)
        assert group.t.compute_on_read is None
        _assert_blobs_equal(fused, plain)
        dw_rule["on"] = True
        _forward((fused, plain), rng, 1)
        assert group.t.compute_on_read is not None
        _assert_blobs_equal(fused, plain)


def test_ranges_cutting_the_group(rng, dw_rule):
    fused, plain = _nets(FORMS["onnx-residual"], rng)
    _forward((fused, plain), rng)
    for net in (fused, plain):
        net.forward(start="pw")          # reads the pending depthwise output
    _assert_blobs_equal(fused, plain)
    _forward((fused, plain), rng)
    for net in (fused, plain):
        net.forward(start="dw", end="clip")
        net.forward(start="add")
    _assert_blobs_equal(fused, plain)


def test_backward_after_the_fused_forward(rng, dw_rule):
    fused, plain = _nets(FORMS["onnx-residual"], rng)
    _forward((fused, plain), rng)
    assert_same_backward(fused, plain)
    folded, _ = _nets(FORMS["caffe-chains"], rng)      # BatchNorm folded: refused
    _forward((folded,), rng)
    with pytest.raises(NetError, match="folded"):
        folded.backward()


def test_what_is_not_taken(rng, dw_rule):
    """A depthwise output read by a second layer, a net output, a grouped
    (not depthwise) convolution, a 3 x 3 convolution after it: no group."""
    second = (HEAD + _conv("dw", "data", "d", 8, k=3, pad=1, group=8)
              + _conv("pw", "d", "p", 4) + _conv("pw2", "d", "q", 4)
              + 'layer { name: "add" type: "Eltwise" bottom: "p" bottom: "q" top: "s" }\n'
              + _LOSS % ("s", _W))
    output = HEAD + _conv("dw", "data", "d", 8, k=3, pad=1, group=8) + _conv("pw", "d", "p", 4)
    output += 'layer { name: "keep" type: "Pooling" bottom: "d" top: "pool" ' \
              'pooling_param { pool: AVE global_pooling: true } }\n'
    grouped = (HEAD + _conv("g", "data", "d", 8, k=3, pad=1, group=4)
               + _conv("pw", "d", "p", 4) + _LOSS % ("p", _W))
    three = (HEAD + _conv("dw", "data", "d", 8, k=3, pad=1, group=8)
             + _conv("c3", "d", "p", 4, k=3, pad=1) + _LOSS % ("p", _W))
    for text in (second, output, grouped, three):
        assert _group(Net(parse_net_text(text), TEST)) == []
