"""TEST rewrite: Concat in place (caffe_ocl/plan/concat.py). The
convolutions computing a Concat's inputs write them straight into their
slice of its top; the inputs are computed when read. Several prototxt
forms (Caffe's in-place ReLU, ONNX's ReLU into a new top, a lone conv,
DenseNet's growing concats, axis 0); every blob read equals the net
without the rewrite, across reshapes, cut ranges, host writes and
backward."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.plan import concat
from caffe_ocl.proto import parse_net_text

_W = 'weight_filler { type: "gaussian" std: 0.3 }'
_B = 'bias_filler { type: "gaussian" std: 0.3 }'


def _conv(name, bottom, top, n, k=1, pad=0, bias=True, stride=1):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} stride: {stride} '
            f'bias_term: {"true" if bias else "false"} {_W} {_B if bias else ""} }} }}\n')


def _relu(name, bottom, top):
    return f'layer {{ name: "{name}" type: "ReLU" bottom: "{bottom}" top: "{top}" }}\n'


def _input(shape):
    dims = " ".join(f"dim: {d}" for d in shape)
    return (f'name: "cat" layer {{ name: "data" type: "Input" top: "data" '
            f'input_param {{ shape {{ {dims} }} }} }}\n')


# GoogLeNet's inception module: a conv with its ReLU in place (Caffe's
# form, a folded chain), conv -> ReLU into a new top (ONNX's form, an
# elide pair), a lone conv, a pooling branch (copied), strided 3x3 convs.
INCEPTION = (_input((2, 3, 7, 6))
             + _conv("b1", "data", "b1", 4) + _relu("b1r", "b1", "b1")
             + _conv("b2", "data", "b2", 5, k=3, pad=1) + _relu("b2r", "b2", "b2r")
             + _conv("b3", "data", "b3", 3, k=3, pad=1, bias=False)
             + 'layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" '
               'pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }\n'
             + 'layer { name: "cat" type: "Concat" bottom: "b1" bottom: "b2r" bottom: "pool" '
               'bottom: "b3" top: "cat" }\n'
             + _conv("out", "cat", "out", 2))

# DenseNet as Caffe's DenseNet prototxts write it: concat_k = Concat(
# concat_{k-1}, conv_k), concat_{k-1} also read by the next BN-ReLU-conv.
DENSE = (_input((2, 4, 6, 6))
         + _conv("c0", "data", "x0", 4, k=3, pad=1)
         + _relu("r1", "x0", "a1") + _conv("c1", "a1", "y1", 3, k=3, pad=1, bias=False)
         + 'layer { name: "cat1" type: "Concat" bottom: "x0" bottom: "y1" top: "cat1" }\n'
         + _relu("r2", "cat1", "a2") + _conv("c2", "a2", "y2", 3, k=3, pad=1, bias=False)
         + 'layer { name: "cat2" type: "Concat" bottom: "cat1" bottom: "y2" top: "cat2" }\n'
         + _relu("r3", "cat2", "a3") + _conv("c3", "a3", "y3", 3, k=1, bias=False)
         + 'layer { name: "cat3" type: "Concat" bottom: "cat2" bottom: "y3" top: "cat3" }\n')

# Concat along images (axis 0) of two convs, one strided.
AXIS0 = (_input((2, 3, 6, 6))
         + _conv("p", "data", "p", 4, k=3, pad=1) + _relu("pr", "p", "pr")
         + _conv("q", "data", "q", 4, k=1)
         + 'layer { name: "cat" type: "Concat" bottom: "pr" bottom: "q" top: "cat" '
           'concat_param { axis: 0 } }\n')

LOSS = ('layer { name: "loss" type: "EuclideanLoss" bottom: "cat" bottom: "target" '
        'top: "loss" }\n')


def _nets(text, rng, phase=TEST):
    fused = Net(parse_net_text(text), phase, fold=True)
    plain = Net(parse_net_text(text), phase, fold=False)
    with config.override(CONCAT_IN_PLACE=False):
        no_cat = Net(parse_net_text(text), phase, fold=True)
    for name, blobs in plain.params.items():
        for d, s, n in zip(fused.params[name], blobs, no_cat.params[name]):
            d.data[...] = rng.normal(0, 0.6, s.shape)
            s.data[...] = d.host_data()
            n.data[...] = d.host_data()
    return fused, plain, no_cat


def _assert_blobs_equal(a, b, names=None):
    for name in names or b.blobs:
        x, y = a.blobs[name].data, b.blobs[name].data
        assert x.shape == y.shape, name
        scale = max(float(np.abs(y).max()), 1.0)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def _cat_groups(net):
    return [c for c in net.plan.groups if isinstance(c, concat.ConcatInPlace)]


def _forward_all(nets, x):
    for net in nets:
        net.forward(data=x)


def _on_this_device(net, want, convs):
    """``want`` less the inputs whose convolution cannot write a slice on
    this device (ops.conv.writes_slices: depthwise, the matrix-vector and
    grouped kernels), and less a
    Concat left with none: the rewrite copies those inputs instead."""
    out = []
    for d in want:
        head, names = d.split(" <- ")
        names = [n for n in names.split(", ")
                 if conv_ops.writes_slices(net.layer_dict[convs[n]].device,
                                           net.layer_dict[convs[n]].geom)]
        if names:
            out.append(f"{head} <- {', '.join(names)}")
    return out


@pytest.mark.parametrize("text, want, convs", [
    (INCEPTION, ["cat in place <- b1, b2r, b3"], dict(b1="b1", b2r="b2", b3="b3")),
    (DENSE, ["cat1 in place <- y1", "cat2 in place <- y2", "cat3 in place <- y3"],
     dict(y1="c1", y2="c2", y3="c3")),
    (AXIS0, ["cat in place <- pr, q"], dict(pr="p", q="q")),
])
def test_rewrite_fires_and_every_blob_equals(text, want, convs, rng):
    fused, plain, no_cat = _nets(text, rng)
    here = _on_this_device(fused, want, convs)
    if fused.layer_dict[convs[next(iter(convs))]].device.is_cpu:
        assert here == want, "on CPU drivers every convolution here writes its slice"
    want = here
    assert [c.describe() for c in _cat_groups(fused)] == want
    assert _cat_groups(no_cat) == [] and plain.plan.describe() == []
    # the rewrite off leaves the other folding as it was
    assert [d for d in fused.plan.describe() if "Concat slice" not in d
            and " in place <- " not in d] == no_cat.plan.describe()
    shape = fused.blobs["data"].shape
    for it in range(2):
        x = rng.normal(0, 1, shape).astype(np.float32)
        _forward_all((fused, plain, no_cat), x)
        pending = [t.blob.name for c in _cat_groups(fused) for t in c.targets.values()
                   if t.blob.compute_on_read is not None]
        assert sorted(pending) == sorted(n for d in want for n in d.split("<- ")[1].split(", "))
        # the tops first: the inputs' slices are read before the inputs
        tops = [c.top.name for c in _cat_groups(fused)]
        _assert_blobs_equal(fused, plain, tops)
        _assert_blobs_equal(fused, plain)
        _assert_blobs_equal(no_cat, plain)


def _needs_slices(net, *convs):
    """Skip where this device's algorithm for one of ``convs`` writes no
    slice (depthwise, the matrix-vector and grouped kernels):
    there the rewrite copies that input, which
    test_rewrite_fires_and_every_blob_equals checks on every device."""
    for name in convs:
        layer = net.layer_dict[name]
        if not conv_ops.writes_slices(layer.device, layer.geom):
            pytest.skip(f"{name}: no slice write on {layer.device.name}")


def test_not_applied():
    # an input also read by another layer (a Split), a Concat along H, a
    # net output among the inputs, a depthwise producer
    text = INCEPTION + 'layer { name: "side" type: "Pooling" bottom: "b3" top: "side" ' \
                       'pooling_param { pool: AVE kernel_size: 2 } }\n'
    net = Net(parse_net_text(text), TEST)
    _needs_slices(net, "b1", "b2")
    assert [c.describe() for c in _cat_groups(net)] == ["cat in place <- b1, b2r"]
    net = Net(parse_net_text(AXIS0.replace("axis: 0", "axis: 2")), TEST)
    assert _cat_groups(net) == []
    dw = (_input((1, 4, 5, 5)) + _conv("a", "data", "a", 4)
          + 'layer { name: "d" type: "Convolution" bottom: "data" top: "d" '
            'convolution_param { num_output: 4 group: 4 kernel_size: 3 pad: 1 '
          + _W + ' } }\n'
          + 'layer { name: "cat" type: "Concat" bottom: "a" bottom: "d" top: "cat" }\n')
    net = Net(parse_net_text(dw), TEST)
    d = net.layers[net.graph.layer_index("d")]
    assert not conv_ops.writes_slices(d.device, d.geom)
    assert [c.describe() for c in _cat_groups(net)] == ["cat in place <- a"]
    with config.override(CONCAT_IN_PLACE=False):
        assert _cat_groups(Net(parse_net_text(INCEPTION), TEST)) == []


def test_reshape_ranges_and_host_writes(rng):
    fused, plain, _ = _nets(INCEPTION, rng)
    nets = (fused, plain)
    _forward_all(nets, rng.normal(0, 1, (2, 3, 7, 6)).astype(np.float32))
    # an input read before its Concat's top, then the top
    _assert_blobs_equal(fused, plain, ["b3", "b2r", "cat"])
    # a new batch size and plane: the first forward writes the inputs
    # themselves (the Concat's top is not reshaped yet), later ones in place
    x = rng.normal(0, 1, (3, 3, 5, 8)).astype(np.float32)
    for net in nets:
        net.blobs["data"].reshape(*x.shape)
        net.reshape()
    for it in range(2):
        _forward_all(nets, x)
        _assert_blobs_equal(fused, plain)
    # ranges cutting the units: every layer on its own, the Concat copies;
    # a blob a cut unit does not reach keeps its value of the last forward
    _forward_all(nets, x * 3)
    for net in nets:
        net.blobs["data"].data[...] = x
        net.forward(end="b2")
    _assert_blobs_equal(fused, plain, ["b2r", "b2", "cat"])
    for net in nets:
        net.forward(start="b2r", end="b3")
        net.forward(start="pool")
    _assert_blobs_equal(fused, plain)
    # the Concat alone, after the units ran in place
    _forward_all(nets, x * 2)
    for net in nets:
        net.forward(start="cat", end="cat")
    _assert_blobs_equal(fused, plain, ["cat", "b1", "b2r", "b3"])
    # the Concat's top written from the host: a pending input is then
    # computed by its convolution again, not read from the changed slice
    # (uploaded to the device by the next layer's forward)
    _forward_all(nets, x)
    for net in nets:
        net.blobs["cat"].data[...] = 7.0
        net.forward(start="out")
    _assert_blobs_equal(fused, plain, ["b1", "b2r", "b3", "cat", "out"])
    # a forward from the Concat on re-copies the changed slice
    _forward_all(nets, x)
    for net in nets:
        net.blobs["cat"].data[...] = 7.0
        net.forward(start="cat")
    _assert_blobs_equal(fused, plain)


@pytest.mark.parametrize("text", [DENSE, AXIS0])
def test_backward(text, rng):
    """Backward at TEST (a loss on the Concat's top): the pending inputs
    are computed first, the gradients equal the unrewritten net's."""
    shape = (2, 4, 6, 6) if text is DENSE else (2, 3, 6, 6)
    tshape = {DENSE: (2, 13, 6, 6), AXIS0: (4, 4, 6, 6)}[text]
    last = "cat3" if text is DENSE else "cat"
    dims = " ".join(f"dim: {d}" for d in tshape)
    full = (text.replace("top: \"data\" input_param { shape {",
                         "top: \"data\" top: \"target\" input_param { shape {", 1)
            .replace("} } }\n", f"}} shape {{ {dims} }} }} }}\n", 1)
            + LOSS.replace('"cat"', f'"{last}"'))
    fused, plain, _ = _nets(full, rng)
    _needs_slices(fused, *(("c1", "c2", "c3") if text is DENSE else ("p", "q")))
    assert _cat_groups(fused)
    x = rng.normal(0, 1, shape).astype(np.float32)
    t = rng.normal(0, 1, tshape).astype(np.float32)
    for net in (fused, plain):
        net.forward(data=x, target=t)
    assert any(t_.blob.compute_on_read is not None
               for c in _cat_groups(fused) for t_ in c.targets.values())
    gf, gp = fused.backward(diffs=["data"]), plain.backward(diffs=["data"])
    np.testing.assert_allclose(gf["data"], gp["data"], rtol=1e-4, atol=1e-5)
    for name, blobs in plain.params.items():
        for d, s in zip(fused.params[name], blobs):
            np.testing.assert_allclose(d.diff, s.diff, rtol=1e-4, atol=1e-5, err_msg=name)
    _assert_blobs_equal(fused, plain)


def test_unfold_computes_pending_inputs(rng):
    fused, plain, _ = _nets(INCEPTION, rng)
    _needs_slices(fused, "b3")
    x = rng.normal(0, 1, (2, 3, 7, 6)).astype(np.float32)
    _forward_all((fused, plain), x)
    assert fused.blobs["b3"].compute_on_read is not None
    fused.unfold()
    assert fused.blobs["b3"].compute_on_read is None
    _forward_all((fused, plain), x)
    _assert_blobs_equal(fused, plain)


# (input shape, output channels, kernel): im2col / packed columns on CPU
# drivers; on GPUs the 1x1 GEMMs on images (K >= 128, planes of 4n pixels)
# and on rows gathered by channel (K >= 512, 7 x 7)
@pytest.mark.parametrize("shape, cout, k", [((2, 3, 5, 4), 3, 3), ((2, 128, 4, 4), 72, 1),
                                             ((2, 512, 7, 7), 80, 1)])
def test_conv_forward_into_a_slice(rng, shape, cout, k):
    """ops.conv.forward with y_off / y_channels against the layer's own
    forward: the images land C_total * H * W floats apart, the rest of the
    buffer untouched."""
    net = Net(parse_net_text(_input(shape) + _conv("c", "data", "c", cout, k=k, pad=k // 2)),
              TEST, fold=False)
    layer = net.layers[1]
    if not conv_ops.writes_slices(layer.device, layer.geom):
        pytest.skip("this device's algorithm for it writes no slices")
    x = rng.normal(0, 1, shape).astype(np.float32)
    net.forward(data=x)
    want = net.blobs["c"].data.copy()
    n, _, h, w = shape
    big = net.blobs["data"].__class__((n, cout + 4, h, w), name="big", device=layer.device)
    big.data[...] = -1.0
    big.data_mem.to_device()
    launches = conv_ops.forward(layer.device, layer.geom, net.blobs["data"].data_buffer(),
                                layer.blobs[0].data_buffer(), big.data_buffer(), layer.col,
                                layer.blobs[1].data_buffer(), y_off=3 * h * w,
                                y_channels=cout + 4)
    for launch in launches:
        launch.run(layer.device.queue)
    big.data_mem.device_written()
    got = big.data
    # two algorithms may compute it (the layer's whole-blob one and the
    # slice writer): float32 sums of C * K * K products apart by their
    # order, on outputs up to ~25 at K = 512 (the fillers are unseeded:
    # a fixed 1e-5 failed one run in Oclgrind by 1.65e-5 on 0.106)
    np.testing.assert_allclose(got[:, 3:3 + cout], want, rtol=1e-5,
                               atol=1e-5 * max(1.0, float(np.abs(want).max())))
    assert (got[:, :3] == -1).all() and (got[:, 3 + cout:] == -1).all()


def test_reshape_that_changes_the_algorithm(rng, monkeypatch):
    """A reshape that moves a convolution to an algorithm writing only
    whole blobs (Winograd takes bigger batches; it writes slices now, so
    here it is made to write whole blobs, as depthwise and the grouped
    kernels do): that convolution then writes its own top and the Concat
    copies it, instead of raising "cannot write into a slice"; back at the
    first batch it writes into its slice again. The batch rule of
    ops.winograd.use_auto is replaced by one that switches at three
    images."""
    from caffe_ocl.ops import winograd as wino_ops
    monkeypatch.setattr(wino_ops, "use_auto",
                        lambda dev, g, tile=None: g.num >= 3 and wino_ops.eligible(g))
    real_writes_slices = conv_ops.writes_slices
    monkeypatch.setattr(conv_ops, "writes_slices", lambda dev, g, algo=None: (
        real_writes_slices(dev, g, algo)
        and conv_ops.algorithm(dev, g, algo, "forward") != "winograd"))
    with config.override(WINOGRAD_MIN_MFLOP=0, WINOGRAD_OCCUPANCY=False):
        fused, plain, _ = _nets(INCEPTION, rng)
        b3 = fused.layer_dict["b3"]
        assert conv_ops.algorithm(b3.device, b3.geom) != "winograd"      # batch 2
        # (where its algorithm writes no slices at all, there is no slice
        # to come back to below)
        slices_at_2 = conv_ops.writes_slices(b3.device, b3.geom)
        x2 = rng.normal(0, 1, (2, 3, 7, 6)).astype(np.float32)
        _forward_all((fused, plain), x2)
        _assert_blobs_equal(fused, plain)
        x3 = rng.normal(0, 1, (3, 3, 7, 6)).astype(np.float32)
        for net in (fused, plain):
            net.blobs["data"].reshape(*x3.shape)
            net.reshape()
        assert conv_ops.algorithm(b3.device, b3.geom) == "winograd"
        for _ in range(2):
            _forward_all((fused, plain), x3)
            _assert_blobs_equal(fused, plain)
        assert any(ln.name.startswith("wino_output") for ln in b3.fwd)
        for net in (fused, plain):
            net.blobs["data"].reshape(*x2.shape)
            net.reshape()
        for _ in range(2):
            _forward_all((fused, plain), x2)
            _assert_blobs_equal(fused, plain)
        if slices_at_2:
            fused.forward(data=x2)            # b3's value now only in its slice
            target = next(u for u in fused.plan.groups
                          if getattr(u, "slice_target", None) is not None
                          and u.layers[0] == list(fused.layer_dict).index("b3")).slice_target
            assert target.layout() is not None and target.fresh()
