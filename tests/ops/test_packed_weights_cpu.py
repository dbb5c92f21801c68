"""Convolution weights packed once for the CPU GEMM (ops.gemm.pack_a,
gemm_cpu.cl PACKED_A, ops.conv.forward's ``weight_version``): the packed
product equals a float64 reference, the packed copy is rewritten only when
the weight's version changes, and a TEST net reads new weights written
through ``net.params`` at its next forward (folded, elided-pair and plain
convolutions). CPU drivers only (the GPU path never packs)."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops.gemm import gemm, pack_a, packed_a_floats
from caffe_ocl.proto import parse_net_text
from refs import rel_err


@pytest.fixture(autouse=True)
def _cpu_only(d):
    if not d.dev.is_cpu:
        pytest.skip("the packed weights are a CPU-driver path")


# M not a multiple of 6 (zero rows in the last panel), N not a multiple of
# 16, K over one K panel (256), two groups, bias + clip in the epilogue
@pytest.mark.parametrize("M,N,K,groups", [(13, 49, 20, 1), (40, 70, 300, 1), (7, 33, 9, 2)])
def test_packed_gemm_equals_reference(d, rng, M, N, K, groups):
    a = rng.standard_normal((groups, M, K))
    b = rng.standard_normal((groups, K, N))
    bias = rng.standard_normal(groups * M)
    per = packed_a_floats(M, K)
    ap = d.dev.alloc(4 * groups * per)
    cb = d.buf(np.zeros((groups, M, N)))
    d.run([pack_a(d.dev, M, K, d.buf(a), ap, groups=groups)])
    d.run([gemm(d.dev, M, N, K, ap, d.buf(b), cb, groups=groups, stride_a=(0, per),
                stride_b=(0, K * N), stride_c=(0, M * N), bias=d.buf(bias),
                act=("clip", -1.0, 2.5), packed_a=True)])
    ref = np.clip(a @ b + bias.reshape(groups, M, 1), -1.0, 2.5)
    assert rel_err(d.get(cb, (groups, M, N)), ref) < 1e-5


def test_packed_layout(d, rng):
    """Panel p holds rows 6p..6p+5 as [k][6]; rows past M are zeros."""
    M, K = 8, 5
    a = rng.standard_normal((M, K))
    ap = d.dev.alloc(4 * packed_a_floats(M, K))
    d.run([pack_a(d.dev, M, K, d.buf(a), ap)])
    got = d.get(ap, (2, K, 6))
    full = np.zeros((12, K))
    full[:M] = a
    np.testing.assert_array_equal(got, full.reshape(2, 6, K).transpose(0, 2, 1).astype(np.float32))


@pytest.mark.parametrize("num,packed", [(1, False), (4, True)])
def test_streamed_weights_of_one_column_block_stay_unpacked(d, num, packed):
    """ResNet's 3x3 512-channel layer on 7 x 7 planes: 9 MB of weights; at
    batch 1 its 49 columns are one block (each block packs its rows once
    anyway), at batch 4 several."""
    g = conv_ops.ConvGeometry(num=num, channels=512, height=7, width=7, out_channels=512,
                              kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, groups=1)
    assert 4 * 512 * 512 * 9 > conv_ops.CPU_STREAMED_WEIGHT_BYTES
    assert conv_ops.packs_weights(d.dev, g, "im2col") == packed
    small = conv_ops.ConvGeometry(num=1, channels=64, height=7, width=7, out_channels=64,
                                  kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, groups=1)
    assert conv_ops.packs_weights(d.dev, small, "im2col")


@pytest.mark.parametrize("kernel,stride,pad,groups", [(1, 1, 0, 1), (3, 1, 1, 2), (3, 2, 1, 1)])
def test_conv_forward_repacks_on_version_change(d, rng, kernel, stride, pad, groups):
    g = conv_ops.ConvGeometry(num=2, channels=4, height=7, width=7, out_channels=6,
                              kh=kernel, kw=kernel, sh=stride, sw=stride, ph=pad, pw=pad,
                              dh=1, dw=1, groups=groups)
    assert conv_ops.packs_weights(d.dev, g)
    x = rng.standard_normal((2, 4, 7, 7))
    w1 = rng.standard_normal((6, 4 // groups, kernel, kernel))
    w2 = rng.standard_normal(w1.shape)
    bias = rng.standard_normal(6)
    wb, yb = d.buf(w1), d.dev.alloc(4 * 2 * 6 * g.out_h * g.out_w)
    cf = conv_ops.workspace_floats(d.dev, g)
    col = d.dev.alloc(4 * max(cf, 1))
    version = [0]
    launches = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, d.buf(bias),
                                weight_version=lambda: version[0])
    assert isinstance(launches[0], conv_ops.OnChange)
    shape = (2, 6, g.out_h, g.out_w)

    def reference(w):
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out = np.zeros(shape)
        cg, og = 4 // groups, 6 // groups
        for o in range(6):
            gi = o // og
            for i in range(g.out_h):
                for j in range(g.out_w):
                    patch = xp[:, gi * cg:(gi + 1) * cg, i * stride:i * stride + kernel,
                               j * stride:j * stride + kernel]
                    out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3)) + bias[o]
        return out

    d.run(launches)
    assert rel_err(d.get(yb, shape), reference(w1)) < 1e-5
    d.dev.upload(wb, w2.astype(np.float32))
    d.run(launches)             # same version: the packed copy is still w1's
    assert rel_err(d.get(yb, shape), reference(w1)) < 1e-5
    version[0] += 1
    d.run(launches)
    assert rel_err(d.get(yb, shape), reference(w2)) < 1e-5


def test_winograd_filter_transform_kept_until_version_change(d, rng):
    """A TEST-phase Winograd forward (given a weight_version) keeps its
    filter transform U in a buffer of its own and redoes it only after the
    weights changed."""
    from refs import conv2d
    g = conv_ops.ConvGeometry(num=2, channels=5, height=9, width=10, out_channels=7,
                              kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, groups=1)
    x = rng.standard_normal((2, 5, 9, 10))
    w1, w2 = rng.standard_normal((2, 7, 5, 3, 3))
    bias = rng.standard_normal(7)
    wb, yb = d.buf(w1), d.dev.alloc(4 * 2 * 7 * 9 * 10)
    col = d.dev.alloc(4 * max(conv_ops.workspace_floats(d.dev, g, "winograd"), 1))
    version = [0]
    launches = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, d.buf(bias), act=("relu", 0.0),
                                algo="winograd", weight_version=lambda: version[0])
    assert isinstance(launches[0], conv_ops.OnChange)
    assert launches[0].name.startswith("wino_filter")
    shape = (2, 7, 9, 10)

    def reference(w):
        return np.maximum(conv2d(x, w, bias, pad=(1, 1)), 0.0)

    d.run(launches)
    assert rel_err(d.get(yb, shape), reference(w1)) < 1e-4
    d.dev.upload(wb, w2.astype(np.float32))
    d.run(launches)             # same version: U is still w1's
    assert rel_err(d.get(yb, shape), reference(w1)) < 1e-4
    version[0] += 1
    d.run(launches)
    assert rel_err(d.get(yb, shape), reference(w2)) < 1e-4
    # without a weight_version (TRAIN): the transform runs in every pass
    plain = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, d.buf(bias), algo="winograd")
    assert not any(isinstance(ln, conv_ops.OnChange) for ln in plain)


# conv1 -> ReLU in place (a folded chain), conv2 -> ReLU6 into a new top (an
# elided pair), conv3 alone (the layer's own launches), conv4 -> BatchNorm
# -> Scale (folded weights)
NET = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 7 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 8 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu2" type: "ReLU6" bottom: "conv2" top: "relu2" }
layer { name: "conv3" type: "Convolution" bottom: "relu2" top: "conv3"
        convolution_param { num_output: 5 kernel_size: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "conv4" type: "Convolution" bottom: "conv3" top: "conv4"
        convolution_param { num_output: 3 kernel_size: 3 stride: 2
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn4" type: "BatchNorm" bottom: "conv4" top: "conv4"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale4" type: "Scale" bottom: "conv4" top: "conv4"
        scale_param { bias_term: true } }
"""


def _forward(net, x):
    net.blobs["data"].data[...] = x
    net.forward()
    return {k: net.blobs[k].data.copy() for k in ("conv1", "relu2", "conv3", "conv4")}


def test_net_reads_new_weights(rng):
    nets = {}
    for on in (True, False):
        with config.override(CPU_PACKED_WEIGHTS=on):
            nets[on] = Net(parse_net_text(NET), TEST)
    for name, blobs in nets[True].params.items():
        for i, b in enumerate(blobs):
            v = rng.uniform(0.5, 1.5, b.shape) if name == "bn4" and i == 1 else \
                rng.standard_normal(b.shape)
            if name == "bn4" and i == 2:
                v = np.ones(b.shape)
            b.data[...] = v
            nets[False].params[name][i].data[...] = v
    x = rng.standard_normal((2, 3, 5, 5))
    with config.override(CPU_PACKED_WEIGHTS=False):
        plain = _forward(nets[False], x)
    packed = _forward(nets[True], x)
    for k in plain:
        np.testing.assert_allclose(packed[k], plain[k], rtol=1e-5, atol=1e-5)
    # new weights (and BatchNorm statistics) after the first forward
    for name in ("conv1", "conv2", "conv3", "conv4", "scale4"):
        for i, b in enumerate(nets[True].params[name]):
            v = b.data * -0.5 + 0.2
            b.data[...] = v
            nets[False].params[name][i].data[...] = v
    with config.override(CPU_PACKED_WEIGHTS=False):
        plain2 = _forward(nets[False], x)
    packed2 = _forward(nets[True], x)
    for k in plain2:
        assert np.abs(plain2[k] - plain[k]).max() > 1e-3      # the weights did change
        np.testing.assert_allclose(packed2[k], plain2[k], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", [None, ("relu", 0.0), ("hardsigmoid", 1 / 6, 0.5)])
def test_conv_on_1x1_planes_as_fully_connected(d, rng, act):
    """A 1x1 convolution of 1 x 1 planes (an SE block's) at a small batch
    runs as a fully-connected product, also into a slice of a bigger top."""
    n, c, co = 3, 70, 20
    g = conv_ops.ConvGeometry(num=n, channels=c, height=1, width=1, out_channels=co,
                              kh=1, kw=1)
    assert conv_ops.fully_connected(d.dev, g)
    x = rng.standard_normal((n, c))
    w = rng.standard_normal((co, c))
    bias = rng.standard_normal(co)
    v = x @ w.T + bias
    if act is not None and act[0] == "relu":
        v = np.maximum(v, 0)
    elif act is not None:
        v = np.clip(act[1] * v + act[2], 0, 1)
    ych, off = co + 5, 2
    yb = d.buf(np.zeros((n, ych)))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, d.buf(bias), act=act,
                                y_off=off, y_channels=ych, weight_version=lambda: 0)
    assert len(launches) == 1
    d.run(launches)
    got = d.get(yb, (n, ych))
    assert rel_err(got[:, off:off + co], v) < 1e-5
    assert not got[:, :off].any() and not got[:, off + co:].any()


SOLVER_NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "z"
  convolution_param { num_output: 5 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 }
                      bias_filler { type: "constant" value: 0.1 } } }
layer { name: "t" type: "TanH" bottom: "z" top: "t" loss_weight: 1 }
"""


def test_test_net_follows_solver_updates(rng):
    """The TEST net shares the TRAIN net's weights; after solver steps its
    packed copy is rewritten (solver updates bump the weights' version)."""
    from caffe_ocl.proto import parse_solver_text
    from caffe_ocl.solvers import solver_class
    p = parse_solver_text('type: "SGD" base_lr: 0.5 lr_policy: "fixed" max_iter: 10 '
                          'test_iter: 1 test_interval: 100')
    p.net_param.CopyFrom(parse_net_text(SOLVER_NET))
    solver = solver_class(p.type)(p)
    x = rng.standard_normal((2, 3, 4, 4))
    solver.net.blobs["x"].data[...] = x
    tn = solver.test_nets[0]
    tn.blobs["x"].data[...] = x
    assert tn.params["conv"][0].data_mem is solver.net.params["conv"][0].data_mem

    def expected():
        w = solver.net.params["conv"][0].data.reshape(5, 3).astype(np.float64)
        b = solver.net.params["conv"][1].data.astype(np.float64)
        return np.tanh(np.einsum("oc,nchw->nohw", w, x) + b.reshape(1, 5, 1, 1))

    tn.forward()
    first = tn.blobs["t"].data.copy()
    np.testing.assert_allclose(first, expected(), rtol=1e-5, atol=1e-6)
    solver.step(2)
    tn.forward()
    now = tn.blobs["t"].data.copy()
    assert np.abs(now - first).max() > 1e-3
    np.testing.assert_allclose(now, expected(), rtol=1e-5, atol=1e-6)


# fully-connected layers over 40 rows (more than the small-M kernel's 32):
# fc1 alone (the layer's own launches), fc2 -> ReLU in place (a chain),
# fc3 -> ReLU6 into a new top (an elided pair), fc4 -> BatchNorm -> Scale
# (folded weights), fc5 with transposed weights (W stored K x N: read as is)
FC_NET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 40 dim: 12 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
        inner_product_param { num_output: 17 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
        inner_product_param { num_output: 33 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu2" type: "ReLU" bottom: "fc2" top: "fc2" }
layer { name: "fc3" type: "InnerProduct" bottom: "fc2" top: "fc3"
        inner_product_param { num_output: 9 bias_term: false
                              weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu3" type: "ReLU6" bottom: "fc3" top: "relu3" }
layer { name: "fc4" type: "InnerProduct" bottom: "relu3" top: "fc4"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn4" type: "BatchNorm" bottom: "fc4" top: "fc4"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale4" type: "Scale" bottom: "fc4" top: "fc4" scale_param { bias_term: true } }
layer { name: "fc5" type: "InnerProduct" bottom: "fc4" top: "fc5"
        inner_product_param { num_output: 5 transpose: true
                              weight_filler { type: "gaussian" std: 0.3 } } }
"""
FC_TOPS = ("fc1", "fc2", "relu3", "fc4", "fc5")


def _fc_reference(params, x):
    """float64 forward of FC_NET from its parameters."""
    p = {k: [b.data.astype(np.float64) for b in v] for k, v in params.items()}
    fc1 = x @ p["fc1"][0].T + p["fc1"][1]
    fc2 = np.maximum(fc1 @ p["fc2"][0].T + p["fc2"][1], 0)
    relu3 = np.clip(fc2 @ p["fc3"][0].T, 0, 6)
    mean, var, sf = p["bn4"]
    sf = 1.0 / sf[0] if sf[0] != 0 else 0.0
    fc4 = relu3 @ p["fc4"][0].T + p["fc4"][1]
    fc4 = (fc4 - mean * sf) / np.sqrt(var * sf + 1e-5) * p["scale4"][0] + p["scale4"][1]
    fc5 = fc4 @ p["fc5"][0] + p["fc5"][1]
    return dict(fc1=fc1, fc2=fc2, relu3=relu3, fc4=fc4, fc5=fc5)


def _randomize(params, rng):
    for name, blobs in params.items():
        for i, b in enumerate(blobs):
            if name == "bn4":
                b.data[...] = (rng.standard_normal(b.shape), rng.uniform(0.5, 1.5, b.shape),
                               np.ones(b.shape))[i]
            else:
                b.data[...] = rng.standard_normal(b.shape)


def test_fully_connected_weights_packed_once(rng, monkeypatch):
    """A TEST net's fully-connected layers read their weights from panels
    packed once (a pack run only when the weights' version moves): every
    form the plan gives them equals a float64 reference, before and after
    new weights are written through ``net.params``."""
    from caffe_ocl.ops import gemm as gemm_ops
    made = []
    orig = gemm_ops.pack_b_panels

    def pack(dev, N, K, src, dst, trans=True):
        made.append((N, K, trans))
        return orig(dev, N, K, src, dst, trans)
    monkeypatch.setattr(gemm_ops, "pack_b_panels", pack)
    net = Net(parse_net_text(FC_NET), TEST)
    assert sorted(made) == sorted([(17, 12, True), (33, 17, True), (9, 33, True),
                                   (6, 9, True), (5, 6, False)])
    _randomize(net.params, rng)
    x = rng.standard_normal((40, 12))
    net.blobs["data"].data[...] = x
    for _ in range(3):          # the passes after the first replay the same launches
        net.forward()
        ref = _fc_reference(net.params, x)
        for k in FC_TOPS:
            assert rel_err(net.blobs[k].data, ref[k]) < 1e-5, k
    _randomize(net.params, rng)
    net.forward()
    ref2 = _fc_reference(net.params, x)
    for k in FC_TOPS:
        assert np.abs(ref2[k] - ref[k]).max() > 1e-3      # the weights did change
        assert rel_err(net.blobs[k].data, ref2[k]) < 1e-5, k
    # one packed copy per weight buffer: fc2's chain packs the layer's own
    # weights into the layer's copy; fc4's folded weights get their own
    layers = dict(zip(net.graph.layer_names, net.layers))
    assert len(layers["fc2"]._packed_copies) == 1
    assert len(layers["fc4"]._packed_copies) == 2


# M not a multiple of 6, N not of the micro-tile's columns, K over one K panel
@pytest.mark.parametrize("M,N,K", [(13, 49, 20), (40, 70, 300), (9, 1, 5)])
@pytest.mark.parametrize("trans", [True, False])
def test_packed_b_gemm_equals_reference(d, rng, M, N, K, trans):
    """gemm(packed_b=True) over pack_b_panels' panels, from W stored N x K
    (trans) or K x N, with bias and an activation: the float64 product,
    and the same bits as the unpacked kernel."""
    from caffe_ocl.ops.gemm import pack_b_panels, packed_b_floats
    x = rng.standard_normal((M, K))
    w = rng.standard_normal((N, K) if trans else (K, N))
    bias = rng.standard_normal(N)
    pb = d.dev.alloc(4 * packed_b_floats(d.dev, N, K))
    d.run([pack_b_panels(d.dev, N, K, d.buf(w), pb, trans=trans)])
    cb, cu = d.buf(np.zeros((M, N))), d.buf(np.zeros((M, N)))
    xb, bb = d.buf(x), d.buf(bias)
    d.run([gemm(d.dev, M, N, K, xb, pb, cb, packed_b=True, bias=bb, bias_axis=1,
                act=("relu", 0.1)),
           gemm(d.dev, M, N, K, xb, d.buf(w), cu, trans_b=trans, bias=bb, bias_axis=1,
                act=("relu", 0.1))])
    v = x @ (w.T if trans else w) + bias
    ref = np.where(v > 0, v, 0.1 * v)
    got = d.get(cb, (M, N))
    assert rel_err(got, ref) < 1e-5
    np.testing.assert_array_equal(got, d.get(cu, (M, N)))


def test_packed_weights_rule(d):
    """The small-M kernel's few rows, weights over the size limit and the
    setting off keep W as it is; deterministic mode packs any batch."""
    from caffe_ocl.ops import gemm_splitk as sk
    assert sk.keeps_weights_packed(d.dev, 197, 768, 192)
    assert sk.keeps_weights_packed(d.dev, sk.CPU_PACKED_FC_MIN_M, 768, 192)
    assert not sk.keeps_weights_packed(d.dev, sk.CPU_PACKED_FC_MIN_M - 1, 768, 192)
    assert not sk.keeps_weights_packed(d.dev, 64, 4096, 25088)      # VGG-16's fc6, 411 MB
    with config.override(DETERMINISTIC=True):
        assert sk.keeps_weights_packed(d.dev, 1, 768, 192)
    with config.override(CPU_PACKED_WEIGHTS=False):
        assert not sk.keeps_weights_packed(d.dev, 197, 768, 192)
