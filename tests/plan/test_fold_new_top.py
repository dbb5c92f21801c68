"""BatchNorm -> Scale -> activation writing new tops folded into the
producer before it (plan/chain.py NewTopChain): shicai's MobileNet v2 form
(BatchNorm's output a new blob, Scale and ReLU in place on it), every
layer into a new top, an InnerProduct producer; each checked blob by
blob against the same net layer by layer, the producer's top computed when
read, ranges cutting the group, a backward where the chain allows one, and
what is left to affine.py."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import affine, chain, residual
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_backward, forward_reshaped, same_random_weights
from test_swish_fusion import _assert_blobs_equal

_W = 'weight_filler { type: "gaussian" std: 0.4 }'
HEAD = ('name: "nt" layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } } }\n')


def _conv(name, bottom, top, n, k=3, pad=1, bias=False):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} '
            f'bias_term: {str(bias).lower()} {_W} }} }}\n')


def _bn(name, bottom, top):
    return f'layer {{ name: "{name}" type: "BatchNorm" bottom: "{bottom}" top: "{top}" }}\n'


def _scale(name, bottom, top):
    return (f'layer {{ name: "{name}" type: "Scale" bottom: "{bottom}" top: "{top}" '
            f'scale_param {{ bias_term: true }} }}\n')


def _relu(name, bottom, top):
    return f'layer {{ name: "{name}" type: "ReLU" bottom: "{bottom}" top: "{top}" }}\n'


_POOL = ('layer { name: "pool" type: "Pooling" bottom: "%s" top: "out" '
         'pooling_param { pool: AVE global_pooling: true } }\n')

NETS = {
    # shicai/MobileNet-Caffe: conv -> conv/bn (new top), Scale and ReLU in place
    "bn-new-top": (HEAD + _conv("c1", "data", "c1", 4) + _bn("c1_bn", "c1", "c1/bn")
                   + _scale("c1_sc", "c1/bn", "c1/bn") + _relu("c1_relu", "c1/bn", "c1/bn")
                   + _conv("c2", "c1/bn", "c2", 5, k=1, pad=0, bias=True)
                   + _bn("c2_bn", "c2", "c2/bn") + _scale("c2_sc", "c2/bn", "c2/bn")
                   + _POOL % "c2/bn"),
    # every layer into a new top (no Scale in place: backward allowed)
    "all-new-tops": (HEAD + _conv("c1", "data", "c1", 4, bias=True) + _bn("c1_bn", "c1", "b")
                     + _scale("c1_sc", "b", "s") + _relu("c1_relu", "s", "r") + _POOL % "r"),
    # Inception-BN's branches: each chain's last blob a slice of a Concat's
    # top, written there by the folded convolution where it can (concat.py)
    "into-a-concat": (HEAD + _conv("c1", "data", "c1", 4, k=1, pad=0) + _bn("c1_bn", "c1", "c1/bn")
                      + _scale("c1_sc", "c1/bn", "c1/bn") + _relu("c1_relu", "c1/bn", "c1/bn")
                      + _conv("c2", "data", "c2", 3) + _bn("c2_bn", "c2", "c2/bn")
                      + _relu("c2_relu", "c2/bn", "c2/bn")
                      + 'layer { name: "cat" type: "Concat" bottom: "c1/bn" bottom: "c2/bn" '
                        'top: "cat" }\n' + _POOL % "cat"),
    # shicai's MobileNet v2 block end: the chain's new top summed with the
    # shortcut (residual.py adds it in the folded convolution's epilogue)
    "residual": (HEAD + _conv("c1", "data", "c1", 3) + _bn("c1_bn", "c1", "c1/bn")
                 + _scale("c1_sc", "c1/bn", "c1/bn")
                 + 'layer { name: "add" type: "Eltwise" bottom: "data" bottom: "c1/bn" '
                   'top: "sum" }\n' + _relu("relu", "sum", "sum") + _POOL % "sum"),
    # converters' forms: BatchNorm and Scale in place, the ReLU into a new
    # top; BatchNorm in place, Scale into a new top; a Scale alone (no
    # BatchNorm) into a new top
    "relu-new-top": (HEAD + _conv("c1", "data", "c1", 4) + _bn("c1_bn", "c1", "c1")
                     + _scale("c1_sc", "c1", "c1") + _relu("c1_relu", "c1", "r") + _POOL % "r"),
    "scale-new-top": (HEAD + _conv("c1", "data", "c1", 4) + _bn("c1_bn", "c1", "c1")
                      + _scale("c1_sc", "c1", "s") + _relu("c1_relu", "s", "s") + _POOL % "s"),
    "scale-alone": (HEAD + _conv("c1", "data", "c1", 4, bias=True) + _scale("c1_sc", "c1", "s")
                    + _relu("c1_relu", "s", "s") + _POOL % "s"),
    # an InnerProduct producer, BatchNorm and ReLU (no Scale)
    "inner-product": (HEAD + 'layer { name: "ip" type: "InnerProduct" bottom: "data" '
                      f'top: "ip" inner_product_param {{ num_output: 6 {_W} }} }}\n'
                      + _bn("ip_bn", "ip", "ip/bn") + _relu("ip_relu", "ip/bn", "out")),
}


def _nets(text, rng):
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), int(rng.integers(1 << 30)),
                        [n for n in plain.params if n.endswith("_bn")], scale_factor=2.0)
    return fused, plain


def _forward(nets, rng, n=2):
    forward_reshaped(nets, rng.normal(0, 1, (n,) + (3, 6, 5)).astype(np.float32))


def _groups(net, cls):
    return [c for c in net.plan.groups if isinstance(c, cls)]


@pytest.mark.parametrize("name", list(NETS))
def test_folded_into_the_producer(rng, name):
    fused, plain = _nets(NETS[name], rng)
    groups = _groups(fused, chain.NewTopChain)
    if name == "residual":      # the chain inside the residual group
        (res,) = _groups(fused, residual.ConvResidual)
        assert isinstance(res.chain, chain.NewTopChain)
        groups = [res.chain]
    assert groups and not _groups(fused, affine.AffineActChain)
    first = groups[0]
    assert first.describe().endswith("(new tops)")
    for n in (2, 1):
        _forward((fused, plain), rng, n)
        for grp in groups:      # the producer's launches alone write the chain's last blob
            names = [getattr(ln, "name", "") for ln in grp.fwd]
            assert not [nm for nm in names if nm.startswith(("eltwise", "sum2"))], names
            assert not [nm for nm in names if nm.startswith("bn_")], names
            assert grp.c.compute_on_read is not None
        _assert_blobs_equal(fused, plain, ["out"])
        _assert_blobs_equal(fused, plain)
        # weights written from Python fold again
        for net in (fused, plain):
            net.params[net.layers[first.p].name][0].data[...] *= 0.5
    with config.override(FOLD_NEW_TOPS=False):
        net = Net(parse_net_text(NETS[name]), TEST)
        assert not _groups(net, chain.NewTopChain)
        assert not [c for c in _groups(net, residual.ConvResidual)
                    if isinstance(c.chain, chain.NewTopChain)]
        if not name.startswith(("relu-", "scale-")):   # BatchNorm writing the new top
            assert _groups(net, affine.AffineActChain)


def test_ranges_cutting_the_group(rng):
    fused, plain = _nets(NETS["bn-new-top"], rng)
    _forward((fused, plain), rng)
    for net in (fused, plain):
        net.forward(start="c1_bn", end="c1_sc")     # reads the pending conv top
        net.forward(start="c1_relu")
    _assert_blobs_equal(fused, plain)


def test_backward(rng):
    fused, plain = _nets(NETS["all-new-tops"], rng)
    _forward((fused, plain), rng)
    assert_same_backward(fused, plain)
    in_place, _ = _nets(NETS["bn-new-top"], rng)     # a Scale in place: refused
    _forward((in_place,), rng)
    with pytest.raises(NetError, match="folded"):
        in_place.backward()


def test_what_is_not_taken(rng):
    """The producer's top read by a second layer, or a net output: the
    chain stays a pass of its own."""
    second = (HEAD + _conv("c1", "data", "c1", 4) + _bn("c1_bn", "c1", "c1/bn")
              + _scale("c1_sc", "c1/bn", "c1/bn")
              + 'layer { name: "add" type: "Eltwise" bottom: "c1" bottom: "c1/bn" top: "s" }\n'
              + _POOL % "s")
    output = HEAD + _conv("c1", "data", "c1", 4) + _bn("c1_bn", "c1", "out") \
        + _scale("c1_sc", "out", "out")
    output = output.replace('top: "data" ', 'top: "data" ', 1)
    for text in (second,):
        net = Net(parse_net_text(text), TEST)
        assert not _groups(net, chain.NewTopChain)
    net = Net(parse_net_text(output + _relu("r", "c1", "c1r")), TEST)   # c1 read twice
    assert not _groups(net, chain.NewTopChain)
