"""Growing Concats in one buffer at batch 1 (caffe_ocl/plan/concat_chain.py,
CAFFE_OCL_CONCAT_SHARE): torchvision's dense block (each Concat takes
every feature so far) and Caffe's (each takes the last Concat's top and
the new feature). References: the same net with the rewrite off (same
bits) and the net without any plan (float tolerance); every blob compared,
after host writes, forward ranges, reshapes, replayed forwards, unfold."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.plan import concat
from caffe_ocl.proto import parse_net_text
from plan_pairs import assert_same_bits, same_random_weights
from test_concat_launches import _count_forward, _torchvision_dense

RNG = np.random.default_rng(32)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _caffe_dense(layers, shape=(1, 3, 5, 4), end_relu=True):
    """Caffe's DenseNet prototxts: conv -> ReLU (in place) gives x_k,
    cat_k = Concat(cat_k-1, x_k) (Net inserts the Splits of cat_k-1)."""
    dims = " ".join(f"dim: {d}" for d in shape)
    t = f'name: "dense" layer {{ name: "data" type: "Input" top: "data" ' \
        f'input_param {{ shape {{ {dims} }} }} }}\n'
    prev = "data"
    for k in range(1, layers + 1):
        t += f'layer {{ name: "bn{k}" type: "BatchNorm" bottom: "{prev}" top: "b{k}" }}\n'
        t += f'layer {{ name: "r{k}" type: "ReLU" bottom: "b{k}" top: "b{k}" }}\n'
        t += (f'layer {{ name: "c{k}" type: "Convolution" bottom: "b{k}" top: "x{k}" '
              'convolution_param { num_output: 2 kernel_size: 3 pad: 1 '
              'weight_filler { type: "gaussian" std: 0.3 } } }\n')
        if end_relu:
            t += f'layer {{ name: "q{k}" type: "ReLU" bottom: "x{k}" top: "x{k}" }}\n'
        t += (f'layer {{ name: "cat{k}" type: "Concat" bottom: "{prev}" bottom: "x{k}" '
              f'top: "cat{k}" }}\n')
        prev = f"cat{k}"
    return t + f'layer {{ name: "pool" type: "Pooling" bottom: "{prev}" top: "out" ' \
        'pooling_param { pool: AVE global_pooling: true } }\n'


def _nets(text, batchnorm=()):
    """(shared, not shared, no plan): one prototxt, the same weights."""
    shared = Net(parse_net_text(text), TEST, fold=True)
    with config.override(CONCAT_SHARE=False):
        plain = Net(parse_net_text(text), TEST, fold=True)
    off = Net(parse_net_text(text), TEST, fold=False)
    same_random_weights([shared, plain, off], 3, batchnorm)
    return shared, plain, off


def _chains(net):
    return {id(c.chain): c.chain for c in net.plan.groups
            if isinstance(c, concat.ConcatInPlace) and c.chain is not None}


def _check(shared, plain, off, skip=()):
    """Every blob: the same bits as without the rewrite, float32-close to
    the net without a plan. (Reading ``.data`` marks every blob written
    from the host, as a pycaffe script's reads do.)"""
    assert_same_bits(shared, plain, skip)
    for name in off.blobs:
        np.testing.assert_allclose(shared.blobs[name].data, off.blobs[name].data,
                                   rtol=1e-4, atol=1e-5, err_msg=name)


def _forward(nets, **kw):
    for net in nets:
        net.forward(**kw)


def test_torchvision_form_one_buffer_fewer_launches():
    shape = (1, 3, 5, 4)
    text = _torchvision_dense(8, 1, shape) + \
        'layer { name: "tail" type: "ReLU" bottom: "out" top: "tail" }\n'
    nets = shared, plain, off = _nets(text)
    chains = list(_chains(shared).values())
    assert len(chains) == 1 and chains[0].alive
    members = chains[0].members
    names = [shared.graph.layer_names[c.ci] for c in members]
    assert names == [f"cat{k}" for k in range(2, 9)] + ["out"]
    assert len({id(c.top.data_buffer()) for c in members}) == 1
    assert not _chains(plain)
    x = rnd(*shape)
    _forward(nets, x0=x)
    # each Concat after the first copies nothing: its start is the last
    # top, its new input written there by its convolution (through the
    # Split that hands it to every later Concat); the first copies x0
    assert all(len(c.fwd) == 0 for c in members[1:]) and len(members[0].fwd) == 1
    assert _count_forward(plain) - _count_forward(shared) == len(members) - 1
    _check(*nets)
    # replayed forwards (plan/trace.py) on new inputs, every blob read after each
    for _ in range(3):
        _forward(nets, x0=rnd(*shape))
        _check(*nets)
    assert chains[0].alive      # reads alone do not dissolve it


def test_caffe_form_nothing_copied():
    text = _caffe_dense(6)
    nets = shared, plain, off = _nets(text, batchnorm=[f"bn{k}" for k in range(1, 7)])
    chains = list(_chains(shared).values())
    assert len(chains) == 1 and chains[0].alive
    members = chains[0].members
    assert [c.chain_whole for c in members[1:]] == [True] * 5
    x = rnd(1, 3, 5, 4)
    _forward(nets, data=x)
    # every new feature written in place, every start the last top: only
    # the first Concat copies (the net's input)
    assert all(len(c.fwd) == 0 for c in members[1:]) and len(members[0].fwd) == 1
    _check(*nets)
    _forward(nets, data=rnd(1, 3, 5, 4))
    _check(*nets)


@pytest.mark.parametrize("form", ["torchvision", "caffe"])
def test_host_writes_ranges_reshapes(form):
    text, inp, bn = _dense(form)
    nets = shared, plain, off = _nets(text, bn)
    w, late, mid = "x2", "cat4", "cat3"
    chain = next(iter(_chains(shared).values()))
    x = rnd(1, 3, 5, 4)
    _forward(nets, **{inp: x})
    _check(*nets)
    # a host write to an input of an earlier Concat, a forward from a later one
    for net in nets:
        net.blobs[w].data[...] += 2.0
        net.forward(start=late)
    _check(*nets)
    # a host write to a Concat's top itself, then a forward from after it
    for net in nets:
        net.forward(**{inp: x})
        net.blobs[mid].data[...] = -1.0
        net.forward(start=shared.graph.layer_names[shared.graph.layer_names.index(mid) + 1])
    _check(*nets)
    assert not chain.alive          # the upload dissolved it; values as before
    _forward(nets, **{inp: rnd(1, 3, 5, 4)})
    _check(*nets)


def _dense(form, layers=5):
    """(prototxt, input name, BatchNorm layers) of a dense block in ``form``."""
    if form == "torchvision":
        return _torchvision_dense(layers, 1, (1, 3, 5, 4)) + \
            'layer { name: "tail" type: "ReLU" bottom: "out" top: "tail" }\n', "x0", ()
    return _caffe_dense(layers), "data", [f"bn{k}" for k in range(1, layers + 1)]


def _after_a_forward(form):
    """(nets, the shared net's chain, input name): a dense block in ``form``
    after one forward on a random input, nothing read on the host."""
    text, inp, bn = _dense(form)
    nets = _nets(text, bn)
    chain = next(iter(_chains(nets[0]).values()))
    _forward(nets, **{inp: rnd(1, 3, 5, 4)})
    return nets, chain, inp


@pytest.mark.parametrize("form", ["torchvision", "caffe"])
def test_input_written_then_forward_from_a_later_concat(form):
    # no host read before: the earlier Concat's top is current on the
    # device; its input changed since it ran, so the later Concat cannot
    # take that top as its start (torchvision's form: it reads the same
    # inputs) -- Caffe's form reads the earlier top itself, which is unchanged
    nets, chain, _ = _after_a_forward(form)
    for net in nets:
        net.blobs["x2"].data[...] += 2.0
        net.forward(start="cat4")
    assert chain.alive == (form == "caffe")
    _check(*nets)


@pytest.mark.parametrize("form", ["torchvision", "caffe"])
def test_top_written_then_forward_after_it(form):
    # a host write to a Concat's top, uploaded by the layer after it: the
    # upload must not reach the other tops' floats
    nets, chain, _ = _after_a_forward(form)
    shared = nets[0]
    after = shared.graph.layer_names[shared.graph.layer_names.index("cat3") + 1]
    for net in nets:
        net.blobs["cat3"].data[...] = -1.0
        net.forward(start=after)
    assert not chain.alive
    np.testing.assert_array_equal(shared.blobs["cat3"].data, -1.0)
    _check(*nets)


@pytest.mark.parametrize("form", ["torchvision", "caffe"])
def test_forward_after_a_top_never_written(form):
    # a fresh net run from after a Concat: its top reads zeros (Caffe's
    # fresh blob), the fill must not reach the other tops' floats
    text, inp, bn = _dense(form)
    nets = shared, plain, off = _nets(text, bn)
    chain = next(iter(_chains(shared).values()))
    after = shared.graph.layer_names[shared.graph.layer_names.index("cat3") + 1]
    for net in nets:
        net.forward(start=after)
    assert not chain.alive
    _check(*nets)


def test_a_new_feature_read_elsewhere_is_not_written_in_place():
    text = _dense("torchvision")[0] + \
        'layer { name: "extra" type: "ReLU" bottom: "x2" top: "extra" }\n'
    nets = shared, plain, off = _nets(text)
    units = {c.describe() for c in shared.plan.groups}
    assert "c1 (into its Concat slice)" in units and "c2 (into its Concat slice)" not in units
    _forward(nets, x0=rnd(1, 3, 5, 4))
    _check(*nets)


@pytest.mark.parametrize("form", ["torchvision", "caffe"])
def test_range_stopping_inside_the_chain_keeps_later_tops(form):
    nets, chain, inp = _after_a_forward(form)
    # no host read in between: the chain is whole when the range stops
    # inside it; the later tops keep the last full forward's values
    x2 = rnd(1, 3, 5, 4)
    for net in nets:
        net.blobs[inp].data[...] = x2
        net.forward(end="cat3")
    _check(*nets)
    for net in nets:
        net.forward(start="cat3")
    _check(*nets)
    assert not chain.alive


def test_reshapes_dissolve_or_keep():
    text = _torchvision_dense(4, 1, (1, 3, 5, 4)) + \
        'layer { name: "tail" type: "ReLU" bottom: "out" top: "tail" }\n'
    nets = shared, plain, off = _nets(text)
    chain = next(iter(_chains(shared).values()))
    _forward(nets, x0=rnd(1, 3, 5, 4))
    # smaller, one image: the memories stay, each top still the next's start
    for shape in ((1, 3, 4, 3), (1, 3, 2, 2)):
        x = rnd(*shape)
        for net in nets:
            net.blobs["x0"].reshape(shape)
            net.forward(x0=x)
        assert chain.alive
        assert_same_bits(shared, plain)
    # two images in no more floats: the layout breaks, the chain dissolves
    x = rnd(2, 3, 2, 2)
    for net in nets:
        net.blobs["x0"].reshape(x.shape)
        net.forward(x0=x)
    assert not chain.alive
    _check(*nets)
    x = rnd(1, 3, 6, 7)         # bigger: own memories
    for net in nets:
        net.blobs["x0"].reshape(x.shape)
        net.forward(x0=x)
    _check(*nets)


def test_axis0_any_batch():
    shape = (2, 3, 5, 4)
    text = _torchvision_dense(4, 0, shape) + \
        'layer { name: "tail" type: "ReLU" bottom: "out" top: "tail" }\n'
    nets = shared, plain, off = _nets(text)
    chain = next(iter(_chains(shared).values()))
    assert chain.alive
    _forward(nets, x0=rnd(*shape))
    _check(*nets)
    _forward(nets, x0=rnd(*shape))
    _check(*nets)


def test_not_shared():
    # batch 2 along channels (found, waiting for a pass at one image); an
    # output among the tops; a top written in place
    text = _torchvision_dense(4, 1, (2, 3, 5, 4))
    net = Net(parse_net_text(text), TEST, fold=True)
    chain = next(iter(_chains(net).values()))
    net.forward(x0=rnd(2, 3, 5, 4))
    assert chain.pending and not chain.alive
    text = _caffe_dense(3)
    net = Net(parse_net_text(text.replace('top: "cat2" }', 'top: "cat2" }\n'
                                          'layer { name: "rr" type: "ReLU" bottom: "cat2" '
                                          'top: "cat2" }')), TEST, fold=True)
    assert [net.graph.layer_names[c.ci] for ch in _chains(net).values() for c in ch.members] \
        == []
    with config.override(CONCAT_SHARE=False):
        assert not _chains(Net(parse_net_text(_caffe_dense(3)), TEST, fold=True))


def test_unfold_then_backward():
    text = _caffe_dense(4)
    nets = shared, plain, off = _nets(text, batchnorm=[f"bn{k}" for k in range(1, 5)])
    chain = next(iter(_chains(shared).values()))
    x = rnd(1, 3, 5, 4)
    _forward(nets, data=x)
    shared.unfold()
    assert not chain.alive
    for net in (shared, off):
        net.forward(data=x)
        net.blobs["out"].diff[...] = 1.0
        net.backward()
    for name in off.blobs:
        np.testing.assert_allclose(shared.blobs[name].data, off.blobs[name].data, rtol=1e-4,
                                   atol=1e-5, err_msg=name)
        np.testing.assert_allclose(shared.blobs[name].diff, off.blobs[name].diff, rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_dissolved_with_a_slice_written_in_place():
    # a top read on the host (its host copy newest) and an input of the
    # Concat before it written, then a forward from inside the block: the
    # later Concat's new input is written into the shared buffer first,
    # then the earlier Concat (not rerun, its input changed) dissolves the
    # chain -- the slice written in place must move with the top
    nets, chain, _ = _after_a_forward("torchvision")
    for net in nets:
        net.blobs["cat4"].data
        net.blobs["x1"].data[...] += 1.0
        net.forward(start="r3")       # c3 writes x3 into cat4's slice, then cat4 runs
    assert not chain.alive
    _check(*nets)


@pytest.mark.parametrize("form", ["torchvision", "caffe"])
def test_built_at_more_images_shares_after_a_pass_at_one(form):
    # a deploy prototxt of several images (Caffe's usual input_dim 10)
    # reshaped to one: the chain shares its buffer after the first whole
    # pass at one image, the later Concats then copy only their new inputs
    if form == "torchvision":
        text, inp, bn = _torchvision_dense(5, 1, (3, 3, 5, 4)) + \
            'layer { name: "tail" type: "ReLU" bottom: "out" top: "tail" }\n', "x0", ()
    else:
        text, inp, bn = _caffe_dense(5, (3, 3, 5, 4)), "data", [f"bn{k}" for k in range(1, 6)]
    nets = shared, plain, off = _nets(text, bn)
    chain = next(iter(_chains(shared).values()))
    _forward(nets, **{inp: rnd(3, 3, 5, 4)})
    assert chain.pending and not chain.alive
    _check(*nets)
    x = rnd(1, 3, 5, 4)
    for net in nets:
        net.blobs[inp].reshape(x.shape)
        net.forward(**{inp: x})
    assert chain.alive and not chain.pending
    assert len({id(c.top.data_buffer()) for c in chain.members}) == 1
    _check(*nets)
    _forward(nets, **{inp: x})
    # Caffe's form: nothing copied after the first (each new input written
    # in place, as before); torchvision's: only the new input, no block (the
    # last one's, read by that Concat alone, written in place)
    n = len(chain.members) - 1
    assert [len(c.fwd) for c in chain.members[1:]] == \
        ([0] * n if form == "caffe" else [1] * (n - 1) + [0])
    assert all(c.chain.prefix_in_place(c) for c in chain.members[1:])
    assert _count_forward(shared) <= _count_forward(plain) - \
        (len(chain.members) - 1 if form == "caffe" else 0)
    _check(*nets)
    x = rnd(2, 3, 5, 4)                 # more images again: dissolved, values kept right
    for net in nets:
        net.blobs[inp].reshape(x.shape)
        net.forward(**{inp: x})
    assert not chain.alive
    _check(*nets)


def test_no_sharing_after_a_pass_that_skipped_the_first_concats():
    # reshaped to one image, then a forward from inside the block: the
    # earlier tops still hold the last pass's floats (Caffe keeps them), so
    # the later top's contents are not theirs: the chain must not share yet
    text = _caffe_dense(5, (3, 3, 5, 4))
    nets = shared, plain, off = _nets(text, [f"bn{k}" for k in range(1, 6)])
    chain = next(iter(_chains(shared).values()))
    _forward(nets, data=rnd(3, 3, 5, 4))
    x = rnd(1, 3, 5, 4)
    for net in nets:
        net.blobs["data"].reshape(x.shape)
        net.reshape()
        net.blobs["data"].data[...] = x
        net.forward(start="bn4")
    assert chain.pending and not chain.alive
    _check(*nets)
