"""Small-batch kernel choices for GPUs (issue #27 item 2): the matrix-vector
kernel of fully-connected layers at batch 1-8 (kernels/gemv.cl), the
implicit-GEMM convolution forward split along K when its output tiles
cannot fill the device, and the Winograd rule that counts empty GEMM
columns. The kernels run on PoCL too (the GPU ones built unoptimised
there); the rules are checked on a described H200 whatever device runs."""
import types

import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import gemm_splitk
from refs import rel_err

pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")

H200 = types.SimpleNamespace(is_gpu=True, is_cpu=False, compute_units=132,
                             local_mem=48 << 10)


@pytest.mark.parametrize("M,N,K,off", [(1, 37, 130, 0),     # float4 rows, a tail of 2
                                       (3, 70, 97, 0),      # odd K: scalar path
                                       (8, 5, 1024, 4),     # offsets on 16 bytes
                                       (2, 19, 64, 3)])     # offsets off 16 bytes
def test_gemv_matches_reference(d, rng, M, N, K, off):
    a = rng.standard_normal(off + M * K)
    b = rng.standard_normal(off + N * K)
    c0 = rng.standard_normal(off + M * N)
    A, B = a[off:].reshape(M, K), b[off:].reshape(N, K)
    bias_n, bias_m = rng.standard_normal(N), rng.standard_normal(M)
    for axis, bias, act in [(1, bias_n, ("relu", 0.1)), (0, bias_m, ("clip", -2.0, 3.0)),
                            (None, None, None)]:
        cb = d.buf(c0)
        d.run([gemm_splitk.gemv(d.dev, M, N, K, d.buf(a), d.buf(b), cb, alpha=0.5,
                                beta=2.0 if bias is not None else 0.0,
                                bias=None if bias is None else d.buf(bias),
                                bias_axis=axis or 0, act=act,
                                off_a=off, off_b=off, off_c=off)])
        v = 0.5 * A @ B.T
        if bias is not None:
            v += (bias[None, :] if axis == 1 else bias[:, None]) + 2.0 * c0[off:].reshape(M, N)
        if act and act[0] == "relu":
            v = np.where(v > 0, v, 0.1 * v)
        elif act:
            v = np.clip(v, -2.0, 3.0)
        got = d.get(cb, c0.shape)
        assert rel_err(got[off:].reshape(M, N), v) < 1e-5
        np.testing.assert_array_equal(got[:off], c0[:off].astype(np.float32))


def test_gemv_rule():
    """GPUs take gemv.cl for C = A B^T with 1-8 rows (not in deterministic
    mode: gemm_launches passes nsplit 1 there); its threads per column fill
    the device for few columns and stay within K."""
    assert gemm_splitk.use_gemv(H200, 1, 4096, 9216, False, True)
    assert gemm_splitk.use_gemv(H200, 8, 1000, 4096, False, True)
    assert not gemm_splitk.use_gemv(H200, 9, 1000, 4096, False, True)
    assert not gemm_splitk.use_gemv(H200, 1, 1000, 4096, False, False)   # B not rows
    cpu = types.SimpleNamespace(is_gpu=False, is_cpu=True, compute_units=2)
    assert not gemm_splitk.use_gemv(cpu, 1, 1000, 4096, False, True)
    assert gemm_splitk.gemv_threads(H200, 1000, 4096) == 256
    assert gemm_splitk.gemv_threads(H200, 4096, 9216) == 128
    assert gemm_splitk.gemv_threads(H200, 100000, 9216) == 32
    assert gemm_splitk.gemv_threads(H200, 10, 600) == 128     # 2 * 128 * 4 > 600
    assert gemm_splitk.gemv_threads(H200, 10, 100) == 32


def test_gemm_launches_gpu_dispatch(d, monkeypatch):
    """On a GPU a batch-1 InnerProduct is one gemv launch; deterministic
    mode keeps the tiled GEMM (batch-invariant rounding)."""
    monkeypatch.setattr(d.dev, "is_gpu", True)
    monkeypatch.setattr(d.dev, "is_cpu", False)
    buf = d.buf(np.zeros(64 * 64))
    names = [ln.name for ln in gemm_splitk.gemm_launches(d.dev, 1, 64, 64, buf, buf, buf,
                                                         trans_b=True)]
    assert names == ["gemv_t"]
    with config.override(DETERMINISTIC=True):
        names = [ln.name for ln in gemm_splitk.gemm_launches(d.dev, 1, 64, 64, buf, buf, buf,
                                                             trans_b=True)]
    assert names == ["gemm"]


def _conv_ref(x, w, g):
    n = x.shape[0]
    xp = np.zeros((n, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw))
    xp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width] = x
    G, cg, mg = g.groups, g.channels // g.groups, g.out_channels // g.groups
    y = np.zeros((n, g.out_channels, g.out_h, g.out_w))
    for i in range(g.kh):
        for j in range(g.kw):
            patch = xp[:, :, i * g.dh: i * g.dh + g.sh * (g.out_h - 1) + 1: g.sh,
                       j * g.dw: j * g.dw + g.sw * (g.out_w - 1) + 1: g.sw]
            for k in range(G):
                y[:, k * mg:(k + 1) * mg] += np.einsum(
                    "mc,nchw->nmhw", w[k * mg:(k + 1) * mg, :, i, j],
                    patch[:, k * cg:(k + 1) * cg])
    return y


def residual_case(rng, p):
    """Inputs of a convolution forward with bias, a residual and a 0.1-slope
    ReLU (geometry tuple ``p``), and its float64 result: (g, x, w, b, r,
    y shape, want)."""
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    r = rng.standard_normal(yshape)
    want = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1) + r
    return g, x, w, b, r, yshape, np.where(want > 0, want, 0.1 * want)


def _needs_narrow_room(dev):
    """Skip where the device's local memory cannot hold a 32 x 256 tile's
    buffers (Oclgrind's 32 KiB): the rule then never takes them there."""
    if conv_ops.NARROW_LOCAL_BYTES > dev.local_mem:
        pytest.skip(f"32 x 256 tiles need {conv_ops.NARROW_LOCAL_BYTES} bytes of local "
                    f"memory; {dev.name} has {dev.local_mem}")


@pytest.mark.parametrize("p", [(1, 40, 5, 5, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1),   # 3x3, K 360
                               (2, 48, 4, 3, 20, 1, 1, 0, 0, 1, 1, 1, 1, 2),   # 1x1, 2 groups
                               (1, 30, 7, 6, 9, 3, 3, 1, 1, 2, 2, 1, 1, 1)],   # strided, K 270
                         ids=["3x3", "1x1-groups", "stride2"])
def test_conv_forward_split_k(d, rng, p, monkeypatch):
    """Few output tiles on many compute units: K split over work-groups
    (chunks not dividing K evenly), partial outputs summed with bias and
    the activation; beta 0 must overwrite a poisoned output."""
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    yb = d.buf(np.full(yshape, np.nan))
    with config.override(CONV_SPLITK_MIN_KTILES=1):
        nsplit, kchunk = conv_ops.forward_splitk(d.dev, g)
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                                    act=("relu", 0.1), algo="igemm")
    K = g.col_rows // g.groups
    assert nsplit > 1 and (nsplit - 1) * kchunk < K <= nsplit * kchunk
    assert [ln.name for ln in launches] == ["conv_fwd", "conv_splitk_reduce"]
    d.run(launches)
    v = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    assert rel_err(d.get(yb, yshape), np.where(v > 0, v, 0.1 * v)) < 1e-5


@pytest.mark.parametrize("split", [False, True], ids=["whole-K", "split-K"])
@pytest.mark.parametrize("p", [(2, 40, 5, 5, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1),   # 3x3, 2 images
                               (2, 48, 4, 3, 20, 3, 3, 1, 1, 1, 1, 1, 1, 2)],  # 2 groups
                         ids=["3x3", "groups"])
def test_implicit_gemm_forward_into_a_slice(d, rng, p, split, monkeypatch):
    """The implicit-GEMM forward (tiles, and split-K with its sum) writes
    into channels 3.. of a bigger blob (y_off / y_channels: a Concat's top,
    plan/concat.py), so that a Concat input it computes needs no copy; the
    rest of the blob is untouched."""
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    total = g.out_channels + 7
    big = rng.standard_normal((g.num, total, g.out_h, g.out_w))
    yb = d.buf(big)
    with config.override(CONV_SPLITK=split, CONV_SPLITK_MIN_KTILES=1):
        assert conv_ops.writes_slices(d.dev, g, "igemm")
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                                    act=("relu", 0.1), algo="igemm",
                                    y_off=3 * g.out_spatial, y_channels=total)
    assert [ln.name for ln in launches] == (["conv_fwd", "conv_splitk_reduce"] if split
                                           else ["conv_fwd"])
    d.run(launches)
    got = d.get(yb, big.shape)
    v = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    co = g.out_channels
    assert rel_err(got[:, 3:3 + co], np.where(v > 0, v, 0.1 * v)) < 1e-5
    np.testing.assert_array_equal(got[:, :3], big[:, :3].astype(np.float32))
    np.testing.assert_array_equal(got[:, 3 + co:], big[:, 3 + co:].astype(np.float32))


def test_forward_split_rule():
    """Split only where the tiles leave half the compute units idle (not
    ResNet's 7 x 7 layers at batch 64: 100 tiles on 132 units); never in
    deterministic mode; chunks of at least CONV_SPLITK_MIN_KTILES steps."""
    G = conv_ops.ConvGeometry
    small = G(1, 512, 7, 7, 512, 3, 3, 1, 1)            # ResNet's last 3x3 at batch 1
    nsplit, kchunk = conv_ops.forward_splitk(H200, small)
    assert nsplit > 8 and kchunk >= 16 * config.get("CONV_SPLITK_MIN_KTILES")
    assert conv_ops.forward_splitk(H200, G(64, 512, 7, 7, 512, 3, 3, 1, 1)) == (1, 4608)
    assert conv_ops.forward_splitk(H200, G(1, 3, 224, 224, 64, 7, 7, 3, 3, 2, 2)) == (1, 147)
    with config.override(DETERMINISTIC=True):
        assert conv_ops.forward_splitk(H200, small) == (1, 4608)


def test_forward_split_rule_for_long_k_on_most_units():
    """Small tiles that give more than half the compute units work still
    split a long K so that every unit runs two or three work-groups in one
    wave (OpenPose's 7 x 7 stage layer: 68 tiles, 567 steps); a short K
    (or deterministic mode) does not split, nor do 128-column tiles on
    most units (test_forward_split_rule: ResNet at batch 64)."""
    G = conv_ops.ConvGeometry
    pose = G(1, 185, 46, 46, 128, 7, 7, 3, 3)
    assert conv_ops.forward_tiles(H200, pose)["MICRO"] == 4
    nsplit, kchunk = conv_ops.forward_splitk(H200, pose)
    tiles = 2 * -(-46 * 46 // 64)
    assert nsplit in (2, 3) and tiles * nsplit <= 2 * H200.compute_units
    assert (nsplit - 1) * kchunk < pose.col_rows <= nsplit * kchunk
    assert conv_ops.forward_splitk(H200, G(1, 64, 46, 46, 128, 3, 3, 1, 1)) == (1, 576)
    with config.override(DETERMINISTIC=True):
        assert conv_ops.forward_splitk(H200, pose) == (1, pose.col_rows)


def test_winograd_rule_counts_empty_columns():
    """On GPUs Winograd is left to the implicit GEMM where its GEMMs' few
    columns (output tiles of the batch) fill little of a tile: batch 1 on
    7 x 7 and 14 x 14 planes; kept for big batches and big planes; CPU
    drivers keep the arithmetic model alone."""
    G = conv_ops.ConvGeometry
    dev = types.SimpleNamespace(**vars(H200))
    for n, hw, c in [(1, 7, 512), (1, 14, 256)]:
        assert conv_ops.algorithm(dev, G(n, c, hw, hw, c, 3, 3, 1, 1)) == "igemm"
    for n, hw, c in [(64, 7, 512), (16, 7, 512), (1, 56, 256), (16, 28, 256)]:
        assert conv_ops.algorithm(dev, G(n, c, hw, hw, c, 3, 3, 1, 1)) == "winograd"
    for n, hw, c in [(1, 28, 128), (1, 28, 256)]:                  # ResNet / VGG at batch 1
        assert conv_ops.algorithm(dev, G(n, c, hw, hw, c, 3, 3, 1, 1)) == "igemm"
    with config.override(WINOGRAD_OCCUPANCY=False):     # 924 MFLOP: over the launch floor
        assert conv_ops.algorithm(dev, G(1, 256, 28, 28, 256, 3, 3, 1, 1)) == "winograd"
    with config.override(WINOGRAD_OCCUPANCY=False, WINOGRAD_MIN_MFLOP=0):
        assert conv_ops.algorithm(dev, G(1, 128, 28, 28, 128, 3, 3, 1, 1)) == "winograd"


def test_tf32_1x1_forward_with_few_tiles_splits(d, rng, monkeypatch):
    """A TF32 1x1 forward (which takes the plain GEMM where it has tiles
    enough) stays on the split implicit GEMM at batch 1 on small planes;
    the tensor-core tiling is emulated on CPU drivers."""
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g = conv_ops.ConvGeometry(1, 256, 4, 4, 128, 1, 1)
    x = rng.standard_normal((1, 256, 4, 4))
    w = rng.standard_normal((128, 256, 1, 1))
    yb = d.buf(np.full((1, 128, 4, 4), np.nan))
    with config.override(TF32_EMULATE=True):
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, algo="igemm")
    assert [ln.name for ln in launches] == ["conv_fwd", "conv_splitk_reduce"]
    d.run(launches)
    assert rel_err(d.get(yb, (1, 128, 4, 4)), _conv_ref(x, w, g)) < 2e-3


@pytest.mark.parametrize("p", [(1, 116, 14, 14, 116, 1, 1),                    # 1x1, 2 x 4 tiles
                               (1, 20, 9, 7, 70, 3, 3, 1, 1, 1, 1, 1, 1, 2),   # 3x3, 2 groups
                               (2, 24, 5, 5, 50, 3, 3, 1, 1, 2, 2)],           # strided, 2 images
                         ids=["1x1", "3x3-groups", "stride2-batch2"])
def test_small_tiles_forward(d, rng, p, monkeypatch):
    """GPU forwards with few tiles take 64 x 64 tiles of 4 x 4 results per
    work-item (tile_mainloop.h MICRO 4): right against float64 with bias
    and activation (edges of M and N inside a tile), and the same bits as
    the usual tiles (each result is the same sum in the same order). Built
    as for a GPU of 132 compute units (is_cpu off while the launches are
    made), run by the CPU driver."""
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    xb, wb, bb = d.buf(x), d.buf(w), d.buf(b)
    got = {}
    for small in (True, False):
        yb = d.buf(np.full(yshape, np.nan))
        with config.override(CONV_SMALL_TILES=small, CONV_SPLITK=False):
            monkeypatch.setattr(d.dev, "is_cpu", False)
            assert conv_ops.forward_tiles(d.dev, g).get("MICRO", 8) == (4 if small else 8)
            launches = conv_ops.forward(d.dev, g, xb, wb, yb, None, bias=bb,
                                        act=("relu", 0.1), algo="igemm")
            monkeypatch.setattr(d.dev, "is_cpu", True)
        assert [ln.name for ln in launches] == ["conv_fwd"]
        d.run(launches)
        got[small] = d.get(yb, yshape)
    v = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    assert rel_err(got[True], np.where(v > 0, v, 0.1 * v)) < 1e-5
    np.testing.assert_array_equal(got[True], got[False])


@pytest.mark.parametrize("p,variant,tile", [
    ((1, 96, 5, 5, 80, 3, 3, 1, 1), None, ("MICRO", 4)),        # the rule's small tiles
    ((1, 40, 6, 6, 16, 3, 3, 1, 1), "narrow/split", ("TM", 32)),  # the tuner's narrow/split
], ids=["small", "narrow"])
def test_tiles_with_split_k(d, rng, monkeypatch, p, variant, tile):
    """Small tiles and a K split together (ResNet's 3 x 3 512 -> 512 on 7 x 7
    at batch 1, shrunk), and 32 x 256 tiles split as the tuner's
    "narrow/split" variant builds them: the slices summed right."""
    if variant is not None and variant.startswith("narrow"):
        _needs_narrow_room(d.dev)
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g = conv_ops.ConvGeometry(*p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    yb = d.buf(np.full(yshape, np.nan))
    with config.override(CONV_SPLITK_MIN_KTILES=1), conv_ops.forced_forward_variant(variant):
        monkeypatch.setattr(d.dev, "is_cpu", False)
        assert conv_ops.forward_tiles(d.dev, g)[tile[0]] == tile[1]
        nsplit = conv_ops.forward_splitk(d.dev, g)[0]
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, algo="igemm")
        monkeypatch.setattr(d.dev, "is_cpu", True)
    assert nsplit > 1 and [ln.name for ln in launches] == ["conv_fwd", "conv_splitk_reduce"]
    d.run(launches)
    assert rel_err(d.get(yb, yshape), _conv_ref(x, w, g)) < 1e-5


def test_small_tiles_rule():
    """Small tiles where four times the usual tiles still fit the compute
    units, FP32 only, not on CPU drivers, not with the setting off."""
    G = conv_ops.ConvGeometry
    dev = types.SimpleNamespace(**vars(H200))
    assert conv_ops.forward_tiles(dev, G(1, 116, 14, 14, 116, 1, 1))["MICRO"] == 4
    assert conv_ops.forward_tiles(dev, G(1, 512, 7, 7, 512, 3, 3, 1, 1))["MICRO"] == 4
    big = conv_ops.forward_tiles(dev, G(16, 64, 56, 56, 64, 3, 3, 1, 1))   # 12544 x 64
    assert big.get("MICRO", 8) == 8 and big["TN"] == 128
    with config.override(CONV_SMALL_TILES=False):
        assert conv_ops.forward_tiles(dev, G(1, 116, 14, 14, 116, 1, 1)).get("MICRO", 8) == 8
    with config.override(TF32=True):
        nv = types.SimpleNamespace(**vars(H200), is_nvidia=True)
        assert conv_ops.forward_tiles(nv, G(1, 116, 14, 14, 116, 1, 1)).get("MICRO", 8) == 8


def test_row_tiles_rule():
    """64-row tiles where 128-row ones would compute a quarter more rows
    than there are (192 channels, 320), not where 128 rows fit (256) or
    waste as much (96); kept at 128 where those split K and 64-row tiles
    would not (GoogLeNet's 192-channel 56 x 56 layer at batch 1)."""
    G = conv_ops.ConvGeometry
    dev = types.SimpleNamespace(**vars(H200))

    def rows(n, c, h, co, k):
        return conv_ops.forward_tiles(dev, G(n, c, h, h, co, k, k, k // 2, k // 2))["TM"]
    assert rows(64, 64, 27, 192, 5) == 64
    assert rows(16, 160, 14, 320, 3) == 64
    assert rows(64, 64, 27, 256, 5) == 128
    assert rows(64, 64, 27, 96, 5) == 128
    assert rows(1, 64, 56, 192, 3) == 128
    assert conv_ops.forward_splitk(dev, G(1, 64, 56, 56, 192, 3, 3, 1, 1))[0] > 1


@pytest.mark.parametrize("n", [1, 3])
def test_conv_on_1x1_planes_as_gemv(d, rng, n, monkeypatch):
    """GPUs run a 1x1 convolution of 1 x 1 planes at batch 1-8 (an SE
    block's excitation) as the InnerProduct of the same shape does, by the
    matrix-vector kernel; right with bias and activation. Built as for a
    GPU, run by whatever driver runs the tests."""
    g = conv_ops.ConvGeometry(n, 72, 1, 1, 40, 1, 1)
    x = rng.standard_normal((n, 72, 1, 1))
    w = rng.standard_normal((40, 72, 1, 1))
    b = rng.standard_normal(40)
    yb = d.buf(np.full((n, 40, 1, 1), np.nan))
    monkeypatch.setattr(d.dev, "is_cpu", False)
    monkeypatch.setattr(d.dev, "is_gpu", True)
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                                act=("relu", 0.1))
    monkeypatch.undo()
    assert [ln.name for ln in launches] == ["gemv_t"]
    d.run(launches)
    v = _conv_ref(x, w, g) + b.reshape(1, -1, 1, 1)
    assert rel_err(d.get(yb, (n, 40, 1, 1)), np.where(v > 0, v, 0.1 * v)) < 1e-5


def test_conv_on_1x1_planes_rule():
    """The matrix-vector kernel for 1x1 convolutions of 1 x 1 planes at batch
    1-8 and K >= 32 on GPUs; not bigger planes, batches or kernels, not in
    deterministic mode; CPU drivers their own small-M kernel."""
    G = conv_ops.ConvGeometry
    dev = types.SimpleNamespace(**vars(H200))
    assert conv_ops.fully_connected(dev, G(1, 576, 1, 1, 144, 1, 1))
    assert conv_ops.fully_connected(dev, G(8, 576, 1, 1, 144, 1, 1))
    assert not conv_ops.fully_connected(dev, G(9, 576, 1, 1, 144, 1, 1))
    assert not conv_ops.fully_connected(dev, G(1, 16, 1, 1, 8, 1, 1))        # K < 32
    assert not conv_ops.fully_connected(dev, G(1, 576, 2, 2, 144, 1, 1))
    assert not conv_ops.fully_connected(dev, G(1, 576, 3, 3, 144, 3, 3, 1, 1))
    with config.override(DETERMINISTIC=True):
        assert not conv_ops.fully_connected(dev, G(1, 576, 1, 1, 144, 1, 1))
    with config.override(GEMV=False):
        assert not conv_ops.fully_connected(dev, G(1, 576, 1, 1, 144, 1, 1))


@pytest.mark.parametrize("p", [(2, 8, 11, 13, 32, 3, 3, 1, 1),                 # 286 columns: 2 tiles, the last partial
                               (3, 8, 9, 9, 24, 3, 3, 0, 0, 2, 2, 1, 1, 2),    # strided, 2 groups of 12
                               (1, 70, 17, 17, 20, 1, 1)],                     # 1x1, 289 columns
                         ids=["3x3", "stride2-groups", "1x1"])
def test_narrow_tiles_forward(d, rng, p, monkeypatch):
    """FP32 forwards with at most 32 output channels take 32 x 256 tiles
    (128 work-items fetching two B columns each): right against float64
    with bias, activation and a residual (rows and columns past the edges
    inside a tile), and the same bits as the 64 x 128 tiles. Built as for a
    GPU with 1 compute unit (so the rule picks them), run by the CPU driver."""
    _needs_narrow_room(d.dev)
    monkeypatch.setattr(d.dev, "compute_units", 1)
    g, x, w, b, r, yshape, want = residual_case(rng, p)
    xb, wb, bb, rb = d.buf(x), d.buf(w), d.buf(b), d.buf(r)
    got = {}
    for narrow in (True, False):
        yb = d.buf(np.full(yshape, np.nan))
        with config.override(CONV_NARROW_TILES=narrow, CONV_SPLITK=False):
            monkeypatch.setattr(d.dev, "is_cpu", False)
            assert conv_ops.forward_tiles(d.dev, g)["TM"] == (32 if narrow else 64)
            launches = conv_ops.forward(d.dev, g, xb, wb, yb, None, bias=bb,
                                        act=("relu", 0.1), algo="igemm", residual=rb)
            monkeypatch.setattr(d.dev, "is_cpu", True)
        assert [ln.name for ln in launches] == ["conv_fwd"]
        d.run(launches)
        got[narrow] = d.get(yb, yshape)
    assert rel_err(got[True], want) < 1e-5
    np.testing.assert_array_equal(got[True], got[False])


def test_narrow_tiles_rule():
    """32 x 256 tiles for at most 32 output channels per group in FP32 where
    they still give each compute unit two tiles (Inception v3's 32 -> 32
    layer at batch 64; a CIFAR net's 16-channel layers at batch 128); not
    for 48 channels, for more than 16 on a product shorter than 64, in
    TF32, with too few columns, on CPU drivers, with 32 KiB of local memory,
    or with the setting off."""
    G = conv_ops.ConvGeometry
    dev = types.SimpleNamespace(**vars(H200))
    assert conv_ops.forward_tiles(dev, G(64, 32, 149, 149, 32, 3, 3))["TM"] == 32
    assert conv_ops.forward_tiles(dev, G(128, 16, 32, 32, 16, 3, 3, 1, 1))["TM"] == 32
    assert conv_ops.forward_tiles(dev, G(64, 32, 149, 149, 48, 3, 3))["TM"] == 64
    assert conv_ops.forward_tiles(dev, G(1, 16, 32, 32, 16, 3, 3, 1, 1))["TM"] == 64
    # short products: the gather outweighs the rows saved above 16 channels
    assert conv_ops.forward_tiles(dev, G(64, 3, 224, 224, 32, 3, 3, 0, 0, 2, 2))["TM"] == 64
    assert conv_ops.forward_tiles(dev, G(16, 3, 224, 224, 16, 3, 3, 1, 1, 2, 2))["TM"] == 32
    with config.override(CONV_NARROW_TILES=False):
        assert conv_ops.forward_tiles(dev, G(64, 32, 149, 149, 32, 3, 3))["TM"] == 64
    with config.override(TF32=True):
        nv = types.SimpleNamespace(**vars(H200), is_nvidia=True)
        assert conv_ops.forward_tiles(nv, G(64, 32, 149, 149, 32, 3, 3))["TM"] != 32
        assert "narrow/split" not in conv_ops.forward_variants(nv, G(64, 32, 149, 149, 32, 3, 3))
    cpu = types.SimpleNamespace(**dict(vars(H200), is_cpu=True, is_gpu=False))
    assert not conv_ops.narrow_eligible(cpu, G(64, 32, 149, 149, 32, 3, 3))
    small_local = types.SimpleNamespace(**dict(vars(H200), local_mem=32 << 10))
    assert not conv_ops.narrow_eligible(small_local, G(64, 32, 149, 149, 32, 3, 3))
    assert "narrow/nosplit" in conv_ops.forward_variants(dev, G(64, 32, 149, 149, 32, 3, 3))
    assert "narrow/nosplit" not in conv_ops.forward_variants(dev, G(64, 32, 149, 149, 48, 3, 3))


def test_gpu_winograd_filter_transform_kept(d, rng, monkeypatch):
    """On GPUs too, a TEST-phase Winograd forward (given a weight_version)
    keeps its filter transform and redoes it only after the weights changed
    (one launch less per layer and pass: DenseNet's host-bound forwards);
    with GPU_KEEP_WINOGRAD_FILTERS off, every pass transforms. Built as for
    a GPU, run by whatever driver runs the tests."""
    g = conv_ops.ConvGeometry(2, 5, 9, 10, 7, 3, 3, 1, 1)
    x = rng.standard_normal((2, 5, 9, 10))
    w1, w2 = rng.standard_normal((2, 7, 5, 3, 3))
    wb, yb = d.buf(w1), d.dev.alloc(4 * 2 * 7 * 9 * 10)
    col = d.dev.alloc(4 * max(conv_ops.workspace_floats(d.dev, g, "winograd"), 1))
    version = [0]
    monkeypatch.setattr(d.dev, "is_cpu", False)
    monkeypatch.setattr(d.dev, "is_gpu", True)
    launches = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, algo="winograd",
                                weight_version=lambda: version[0])
    with config.override(GPU_KEEP_WINOGRAD_FILTERS=False):
        plain = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, col, algo="winograd",
                                 weight_version=lambda: version[0])
    monkeypatch.undo()
    assert isinstance(launches[0], conv_ops.OnChange)
    assert launches[0].name.startswith("wino_filter")
    assert not any(isinstance(ln, conv_ops.OnChange) for ln in plain)
    shape = (2, 7, 9, 10)
    d.run(launches)
    assert rel_err(d.get(yb, shape), _conv_ref(x, w1, g)) < 1e-4
    d.dev.upload(wb, w2.astype(np.float32))
    d.run(launches)             # same version: U is still w1's
    assert rel_err(d.get(yb, shape), _conv_ref(x, w1, g)) < 1e-4
    version[0] += 1
    d.run(launches)
    assert rel_err(d.get(yb, shape), _conv_ref(x, w2, g)) < 1e-4
