"""A PReLU after a Convolution / InnerProduct (and its BatchNorm / Scale)
folded into the producer's epilogue (plan/chain.py, act.h ACT 7): the
forms of published nets -- MTCNN and SphereFace (conv -> PReLU in place),
OpenPose BODY_25 (conv -> PReLU into a new top), MTCNN's fully-connected
layers, BatchNorm / Scale before the PReLU, a shared slope -- each checked
blob by blob against the same net layer by layer, with slopes changed from
Python after a forward, a range cutting the chain, and the setting off."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.errors import NetError
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import chain, execution
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_backward, forward_reshaped, same_random_weights
from test_fold_new_top import _POOL, _W, HEAD
from test_fold_new_top import _conv as conv_layer
from test_swish_fusion import _assert_blobs_equal


def _conv(name, bottom, top, n, k=3, pad=1, bias=True):
    return conv_layer(name, bottom, top, n, k=k, pad=pad, bias=bias)


def _prelu(name, bottom, top, shared=False):
    param = ' prelu_param { channel_shared: true }' if shared else ''
    return f'layer {{ name: "{name}" type: "PReLU" bottom: "{bottom}" top: "{top}"{param} }}\n'


NETS = {
    "in-place": (HEAD + _conv("c1", "data", "c1", 4) + _prelu("p1", "c1", "c1")
                 + _conv("c2", "c1", "c2", 5, k=1, pad=0, bias=False) + _prelu("p2", "c2", "c2")
                 + _POOL % "c2"),
    "new-top": (HEAD + _conv("c1", "data", "c1", 4) + _prelu("p1", "c1", "r1") + _POOL % "r1"),
    "shared-slope": (HEAD + _conv("c1", "data", "c1", 4) + _prelu("p1", "c1", "c1", shared=True)
                     + _POOL % "c1"),
    "batchnorm-scale": (HEAD + _conv("c1", "data", "c1", 4, bias=False)
                        + 'layer { name: "c1_bn" type: "BatchNorm" bottom: "c1" top: "c1" }\n'
                        + 'layer { name: "c1_sc" type: "Scale" bottom: "c1" top: "c1" '
                          'scale_param { bias_term: true } }\n'
                        + _prelu("p1", "c1", "c1") + _POOL % "c1"),
    "depthwise": (HEAD + _conv("c0", "data", "c0", 8, k=1, pad=0)
                  + 'layer { name: "dw" type: "Convolution" bottom: "c0" top: "dw" '
                    f'convolution_param {{ num_output: 8 group: 8 kernel_size: 3 pad: 1 {_W} }} }}\n'
                  + _prelu("p1", "dw", "dw") + _POOL % "dw"),
    # MTCNN's R-Net / O-Net: an InnerProduct, then a PReLU per output
    "inner-product": (HEAD + 'layer { name: "ip" type: "InnerProduct" bottom: "data" '
                      f'top: "ip" inner_product_param {{ num_output: 6 {_W} }} }}\n'
                      + _prelu("p1", "ip", "out")),
}


def _nets(text, rng):
    fused = Net(parse_net_text(text), TEST)
    plain = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights((fused, plain), int(rng.integers(1 << 30)),
                        [n for n in plain.params if n.endswith("_bn")], scale_factor=2.0)
    for name in plain.params:           # slopes of both signs (and a zero one)
        if plain.layer_dict[name].type == "PReLU":
            s = rng.uniform(-0.7, 0.9, plain.params[name][0].shape)
            s.flat[0] = 0.0
            for net in (fused, plain):
                net.params[name][0].data[...] = s
    return fused, plain


def _forward(nets, rng, n=2):
    forward_reshaped(nets, rng.normal(0, 1, (n,) + (3, 6, 5)).astype(np.float32))


def _prelu_chains(net):
    return [c for c in net.plan.groups if isinstance(c, chain.Chain) and c.prelu is not None]


@pytest.mark.parametrize("name", list(NETS))
def test_folded_into_the_producer(rng, name):
    fused, plain = _nets(NETS[name], rng)
    groups = _prelu_chains(fused)
    assert len(groups) == (2 if name == "in-place" else 1)
    for grp in groups:
        assert grp.act == ("prelu", grp.producer.num_output)
    for n in (2, 1):
        _forward((fused, plain), rng, n)
        for grp in groups:      # the producer's launches alone, no PReLU pass
            names = [getattr(ln, "name", "") for ln in grp.fwd]
            assert not [nm for nm in names if nm.startswith("prelu")], names
        _assert_blobs_equal(fused, plain)
        # slopes and weights written from Python fold again
        for net in (fused, plain):
            net.params["p1"][0].data[...] *= -1.5
            net.params[net.layers[groups[0].p].name][0].data[...] *= 0.5
    # a replayed forward (plan/trace.py: same shape three times) folds
    # slopes written since again too
    x = rng.normal(0, 1, (1, 3, 6, 5)).astype(np.float32)
    for _ in range(3):
        for net in (fused, plain):
            net.forward(data=x)
    for net in (fused, plain):
        net.params["p1"][0].data[...] += 0.25
        net.forward(data=x)
    _assert_blobs_equal(fused, plain)


def test_prelu_layers_skipped_only_when_folded(rng):
    """The folded PReLU layers run no forward of their own; with the
    setting off they do."""
    with config.override(FUSE_PRELU=False):
        off = Net(parse_net_text(NETS["in-place"]), TEST)
    on, _ = _nets(NETS["in-place"], rng)
    assert not _prelu_chains(off) and len(_prelu_chains(on)) == 2
    prelus = [i for i, t in enumerate(on.graph.layer_types) if t == "PReLU"]
    for net, skipped in ((on, True), (off, False)):
        schedule = dict(net.plan.forward_schedule(0, len(net.layers) - 1))
        assert all((schedule[i] is execution.SKIP) == skipped for i in prelus)


def test_range_cutting_the_chain_and_backward(rng):
    fused, plain = _nets(NETS["new-top"], rng)
    _forward((fused, plain), rng)
    for net in (fused, plain):
        net.forward(start="p1")         # the PReLU on its own, from the pending conv top
    _assert_blobs_equal(fused, plain)
    _forward((fused, plain), rng)
    assert_same_backward(fused, plain)  # the conv top is computed when the backward reads it
    in_place, _ = _nets(NETS["in-place"], rng)
    _forward((in_place,), rng)
    with pytest.raises(NetError, match="folded"):
        in_place.backward()


def test_reshape_onto_a_winograd_geometry(rng):
    """Folded at a shape whose convolution runs the GEMM path, then
    reshaped to one where the rules pick Winograd (whose output transform
    has no PReLU): Winograd runs, then the PReLU's own pass (OpenPose
    BODY_25, folded at its prototxt's 16 x 16 and run at 184 x 184, ran
    0.73x as fast with the GEMM path kept for the PReLU); every blob
    matches the net run layer by layer. 96 x 96 is past both the CPU rules'
    tile minimum and the GPU rules' launch minimum (WINOGRAD_MIN_MFLOP: 24 x
    24 stayed on the GEMM path of an H100)."""
    head = ('name: "w" layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 1 dim: 64 dim: 8 dim: 8 } } }\n')
    text = (head + _conv("c1", "data", "c1", 64) + _prelu("p1", "c1", "c1") + _POOL % "c1")
    fused, plain = _nets(text, rng)
    assert len(_prelu_chains(fused)) == 1
    (grp,) = _prelu_chains(fused)
    for hw in (8, 96, 8):
        forward_reshaped((fused, plain), rng.normal(0, 1, (1, 64, hw, hw)).astype(np.float32))
        _assert_blobs_equal(fused, plain)
        names = [getattr(ln, "name", "") for ln in grp.fwd]
        assert any(nm.startswith("prelu") for nm in names) == (hw == 96), names
        assert any(nm.startswith("wino") for nm in names) == (hw == 96), names
