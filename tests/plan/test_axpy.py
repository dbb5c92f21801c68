"""SENet's Axpy -> ReLU as one pass (plan/axpy.py, kernels/fork_vision.cl
axpy_fwd ACT): hujie-frank/SENet's block end (the ReLU in place), a ReLU
writing a new top (the Axpy's top computed when read), a clip in place
(backward refused); each checked blob by blob against the same net layer
by layer, with ranges cutting the pair and a backward."""
import numpy as np
import pytest

from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import axpy
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_backward, forward_reshaped, same_random_weights
from test_swish_fusion import _assert_blobs_equal

_W = 'weight_filler { type: "gaussian" std: 0.4 }'


def _conv(name, bottom, top, n):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: 1 {_W} }} }}\n')


def _net(act):
    """SE-ResNet's block: x = conv(data); gate = sigmoid(fc(relu(fc(pool(x)))));
    Axpy(gate, x, data) -> ``act``; then a pooling to "out"."""
    return ('name: "se" layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 2 dim: 6 dim: 5 dim: 4 } } }\n'
            + _conv("inc", "data", "x", 6)
            + 'layer { name: "gap" type: "Pooling" bottom: "x" top: "gap" '
              'pooling_param { pool: AVE global_pooling: true } }\n'
            + _conv("down", "gap", "d", 3)
            + 'layer { name: "down/relu" type: "ReLU" bottom: "d" top: "d" }\n'
            + _conv("up", "d", "u", 6)
            + 'layer { name: "prob" type: "Sigmoid" bottom: "u" top: "u" }\n'
            + 'layer { name: "axpy" type: "Axpy" bottom: "u" bottom: "x" bottom: "data" '
              'top: "sum" }\n' + act
            + 'layer { name: "pool" type: "Pooling" bottom: "%s" top: "out" '
              'pooling_param { pool: MAX kernel_size: 2 } }\n'
              % ("r" if 'top: "r"' in act else "sum"))


FORMS = {
    "relu-in-place": 'layer { name: "relu" type: "ReLU" bottom: "sum" top: "sum" }\n',
    "relu-new-top": 'layer { name: "relu" type: "ReLU" bottom: "sum" top: "r" '
                    'relu_param { negative_slope: 0.1 } }\n',
    "clip-in-place": 'layer { name: "relu" type: "Clip" bottom: "sum" top: "sum" '
                     'clip_param { min: -0.5 max: 0.8 } }\n',
}


def _nets(text, rng):
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), int(rng.integers(1 << 30)))
    return fused, plain


def _forward(nets, rng, n=2):
    forward_reshaped(nets, rng.normal(0, 1, (n, 6, 5, 4)).astype(np.float32))


@pytest.mark.parametrize("form", list(FORMS))
def test_one_pass(rng, form):
    fused, plain = _nets(_net(FORMS[form]), rng)
    (group,) = [c for c in fused.plan.groups if isinstance(c, axpy.AxpyAct)]
    assert group.describe() == "axpy -> relu (the activation in the Axpy's pass)"
    for n in (2, 1):
        _forward((fused, plain), rng, n)
        assert [ln.name for ln in group.fwd] == ["axpy_fwd"]
        assert (fused.blobs["sum"].compute_on_read is not None) == (form == "relu-new-top")
        _assert_blobs_equal(fused, plain, ["out"])
        _assert_blobs_equal(fused, plain)
    assert not [c for c in Net(parse_net_text(_net(FORMS[form])), TEST, fold=False).plan.groups
                if isinstance(c, axpy.AxpyAct)]


def _gate_net(act):
    """The block end alone, the gate an input (nothing else folded, so a
    backward may run)."""
    return ('name: "axpy" layer { name: "data" type: "Input" top: "data" top: "g" '
            'input_param { shape { dim: 2 dim: 6 dim: 5 dim: 4 } '
            'shape { dim: 2 dim: 6 dim: 1 dim: 1 } } }\n'
            + _conv("inc", "data", "x", 6)
            + 'layer { name: "axpy" type: "Axpy" bottom: "g" bottom: "x" bottom: "data" '
              'top: "sum" }\n' + act
            + 'layer { name: "pool" type: "Pooling" bottom: "%s" top: "out" '
              'pooling_param { pool: MAX kernel_size: 2 } }\n'
              % ("r" if 'top: "r"' in act else "sum"))


def test_ranges_and_backward(rng):
    def forward(nets):
        x = rng.normal(0, 1, (2, 6, 5, 4)).astype(np.float32)
        gate = rng.normal(0, 1, (2, 6, 1, 1)).astype(np.float32)
        for net in nets:
            net.forward(data=x, g=gate)

    for form in ("relu-in-place", "relu-new-top"):
        fused, plain = _nets(_gate_net(FORMS[form]), rng)
        forward((fused, plain))
        for net in (fused, plain):
            net.forward(start="relu")
        _assert_blobs_equal(fused, plain)
        forward((fused, plain))
        for net in (fused, plain):
            net.forward(end="axpy")
            net.forward(start="relu")
        _assert_blobs_equal(fused, plain)
        forward((fused, plain))
        assert_same_backward(fused, plain)
    clip, _ = _nets(_gate_net(FORMS["clip-in-place"]), rng)
    forward((clip,))
    with pytest.raises(NetError, match="folded"):
        clip.backward()


def test_what_is_not_taken():
    """The Axpy's top read by another layer too (a ReLU writing a new top
    needs it alone), or a Sigmoid after it (not an epilogue activation
    here): layer by layer."""
    shared = _net('layer { name: "relu" type: "ReLU" bottom: "sum" top: "r" }\n'
                  'layer { name: "pool2" type: "Pooling" bottom: "sum" top: "p2" '
                  'pooling_param { pool: MAX kernel_size: 2 } }\n')
    sigmoid = _net('layer { name: "relu" type: "Sigmoid" bottom: "sum" top: "sum" }\n')
    for text in (shared, sigmoid):
        net = Net(parse_net_text(text), TEST)
        assert not [c for c in net.plan.groups if isinstance(c, axpy.AxpyAct)]
