"""gemm_cpu.cl at both micro-kernel widths (CPU_GEMM_VW 8: 6 x 16 tiles of
float8; 16: 6 x 32 tiles of float16) on whatever CPU runs the tests:
OpenCL emulates float16 on AVX2 and float8 runs on AVX-512, so both
variants are checked on any machine (the device picks one of them by
default, ops.gemm.cpu_vw). Every path whose shape follows the width
against float64 references: whole panels packed by rows and across an
image end (nsplit), the element path at N's edge and for images narrower
than a panel, the left-half tail, transposed operands, two K panels,
images folded into K, packed op(A), column panels packed from the images
(CONV_B 1 and 2), the thin-panel variant, and the epilogue (alpha, beta,
bias per row and per column, residual, activations)."""
import types

import numpy as np
import pytest

from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import gemm as gemm_ops
from refs import conv2d, rel_err


@pytest.fixture(params=["8", "16"], ids=["vw8", "vw16"])
def vw(request, d, settings, monkeypatch):
    """Forces the width; checks every gemm_cpu.cl launch is built with it
    and keeps their defines (``built``)."""
    if not d.dev.is_cpu:
        pytest.skip("gemm_cpu.cl is the CPU drivers' GEMM")
    settings(CPU_GEMM_VW=request.param)
    width = int(request.param)
    launch = d.dev.launch
    built = []

    def checked_launch(filename, name, gsize, lsize, args, defines=None):
        if filename == "gemm_cpu.cl":
            assert defines["VW"] == width
            if name == "gemm":
                bn = args[-18]      # bn, nsplit, 6 fold ints, 9 conv ints, R, offR: the last
                assert bn % (2 * width) == 0
            built.append(defines)
        return launch(filename, name, gsize, lsize, args, defines)
    monkeypatch.setattr(d.dev, "launch", checked_launch)
    return types.SimpleNamespace(width=width, built=built)


ACTS = {"relu": lambda v: np.where(v > 0, v, 0.1 * v),
        "clip": lambda v: np.clip(v, -1.0, 2.0),
        "hardswish": lambda v: v * np.clip(v / 6 + 0.5, 0.0, 1.0)}
ACT_ARGS = {"relu": ("relu", 0.1), "clip": ("clip", -1.0, 2.0),
            "hardswish": ("hardswish", 1 / 6, 0.5)}

# M, N, K, trans_a, trans_b, bias_axis, act: N past whole 32- and 16-column
# panels by tails of <= 8, <= 16 and > 16 columns; K over one K panel (256)
# and above 96 (column strips outer); M not a multiple of 6
PLAIN = [
    (13, 75, 300, 0, 0, 0, "relu"),
    (7, 41, 20, 0, 0, 1, "clip"),
    (20, 70, 33, 1, 0, 0, "hardswish"),
    (11, 100, 40, 0, 1, 1, "relu"),
    (25, 37, 130, 1, 1, 0, None),
    (6, 32, 5, 0, 0, 1, None),
]


@pytest.mark.parametrize("case", PLAIN, ids=[str(i) for i in range(len(PLAIN))])
def test_plain_gemm(d, rng, vw, case):
    M, N, K, ta, tb, axis, act = case
    A = rng.standard_normal((K, M) if ta else (M, K))
    B = rng.standard_normal((N, K) if tb else (K, N))
    C = rng.standard_normal((M, N))
    bias = rng.standard_normal(M if axis == 0 else N)
    v = 0.5 * (A.T if ta else A) @ (B.T if tb else B) + 0.25 * C
    v += bias[:, None] if axis == 0 else bias[None, :]
    ref = ACTS[act](v) if act else v
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_a=bool(ta),
                         trans_b=bool(tb), alpha=0.5, beta=0.25, bias=d.buf(bias),
                         bias_axis=axis, act=ACT_ARGS.get(act), impl="cpu")])
    assert rel_err(d.get(cb, C.shape), ref) < 1e-5


# HW: images of 37 and 45 pixels (panels across an image end at both
# widths, with either half in the first image), 20 (narrower than a
# 32-column panel: the element path at VW 16), 49 (7 x 7 planes)
@pytest.mark.parametrize("M,HW,K,nimg", [(13, 37, 300, 3), (8, 45, 9, 4), (7, 20, 40, 5),
                                         (19, 49, 17, 2)])
def test_images_folded_into_n_with_residual(d, rng, vw, M, HW, K, nimg):
    A = rng.standard_normal((M, K))
    B = rng.standard_normal((nimg, K + 1, HW))      # one spare row per image
    C = rng.standard_normal((nimg, M + 2, HW))
    R = rng.standard_normal((nimg, M + 2, HW))
    bias = rng.standard_normal(M)
    v = np.einsum("mk,ikp->imp", A, B[:, :K]) + bias[None, :, None] + 0.5 * C[:, :M] + R[:, :M]
    ref = C.copy()
    ref[:, :M] = np.where(v > 0, v, 0.2 * v)
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, nimg * HW, K, d.buf(A), d.buf(B), cb, beta=0.5,
                         ldb=HW, ldc=HW, nsplit=HW, nstride=((K + 1) * HW, (M + 2) * HW),
                         bias=d.buf(bias), act=("relu", 0.2), residual=d.buf(R),
                         impl="cpu")])
    assert rel_err(d.get(cb, C.shape), ref) < 1e-5


@pytest.mark.parametrize("M,N,HW,nimg", [(13, 40, 37, 3), (5, 70, 300, 2)])
def test_images_folded_into_k(d, rng, vw, M, N, HW, nimg):
    """ksplit: C += sum over images of A_i * B_i^T with A as [image][M][HW]
    and B as [image][N][HW] (a weight gradient); HW above the K panel
    splits panels inside an image."""
    A = rng.standard_normal((nimg, M, HW))
    B = rng.standard_normal((nimg, N, HW))
    C = rng.standard_normal((M, N))
    ref = C + np.einsum("imp,inp->mn", A, B)
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, nimg * HW, d.buf(A), d.buf(B), cb, trans_b=True,
                         beta=1.0, lda=HW, ldb=HW, ksplit=HW, kstride=(M * HW, N * HW),
                         impl="cpu")])
    assert rel_err(d.get(cb, C.shape), ref) < 1e-5


@pytest.mark.parametrize("M,HW,K,nimg,groups", [(13, 49, 20, 2, 1), (40, 70, 300, 1, 1),
                                                (7, 33, 9, 3, 2)])
def test_packed_a(d, rng, vw, M, HW, K, nimg, groups):
    """Packed op(A) (the net's weights) over images folded into N, groups."""
    a = rng.standard_normal((groups, M, K))
    b = rng.standard_normal((nimg, groups, K, HW))
    bias = rng.standard_normal(groups * M)
    per = gemm_ops.packed_a_floats(M, K)
    ap = d.dev.alloc(4 * groups * per)
    cb = d.buf(np.zeros((nimg, groups, M, HW)))
    d.run([gemm_ops.pack_a(d.dev, M, K, d.buf(a), ap, groups=groups)])
    d.run([gemm_ops.gemm(d.dev, M, nimg * HW, K, ap, d.buf(b), cb, groups=groups,
                         stride_a=(0, per), stride_b=(0, K * HW), stride_c=(0, M * HW),
                         ldb=HW, ldc=HW, nsplit=HW,
                         nstride=(groups * K * HW, groups * M * HW), bias=d.buf(bias),
                         act=("clip", -1.0, 2.5), packed_a=True)])
    v = np.einsum("gmk,igkp->igmp", a, b) + bias.reshape(1, groups, M, 1)
    assert rel_err(d.get(cb, (nimg, groups, M, HW)), np.clip(v, -1.0, 2.5)) < 1e-5


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 1)])
def test_thin_panels(d, rng, vw, ta, tb):
    """M <= 36, K <= 32: the variant with 2048-column blocks (where local
    memory holds it: not on Oclgrind's 32 KiB)."""
    M, N, K = 16, 2100, 27
    kc, bm, bn = gemm_ops.CPU_THIN_PANELS
    fits = 4 * kc * (bm + bn) <= d.dev.local_mem
    assert (gemm_ops.cpu_panels(d.dev, M, K) == gemm_ops.CPU_THIN_PANELS) == fits
    A = rng.standard_normal((K, M) if ta else (M, K))
    B = rng.standard_normal((N, K) if tb else (K, N))
    C = rng.standard_normal((M, N))
    ref = (A.T if ta else A) @ (B.T if tb else B) + C
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_a=bool(ta),
                         trans_b=bool(tb), beta=1.0, impl="cpu")])
    assert rel_err(d.get(cb, C.shape), ref) < 1e-5


# convolutions whose columns gemm_cpu.cl packs from the images (CONV_B 1
# forward, CONV_B 2 weight gradient): output rows of 40 (runs of 8 across
# a 32-column panel), 14 (groups of 8 in one row or two), 7 (groups over
# two rows and two images), 17 at stride 2 (two runs at stride 2), 3 (over
# three rows: gathered), rows of 8 (the transposed weight-gradient pack),
# groups
# (n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw, groups)
CONVS = [
    (2, 4, 9, 40, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1),
    (1, 5, 14, 14, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1),
    (3, 6, 7, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1),
    (2, 3, 11, 33, 6, 3, 3, 1, 1, 2, 2, 1, 1, 1),
    (4, 5, 3, 3, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1),
    (3, 8, 8, 8, 10, 3, 3, 1, 1, 1, 1, 1, 1, 2),
]


@pytest.mark.parametrize("p", CONVS, ids=["rows40", "rows14", "rows7", "stride2", "rows3",
                                          "rows8-groups"])
def test_conv_columns_from_images(d, rng, vw, settings, p):
    settings(CPU_PACKED_COLUMNS=True, CPU_PACKED_WEIGHTS=False, CPU_DIRECT_CONV=False)
    g = conv_ops.ConvGeometry(*p)
    cg = g.channels // g.groups
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, cg, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    dy = rng.standard_normal(yshape)
    ws = conv_ops.workspace_floats(d.dev, g, "im2col")
    col = d.buf(np.zeros(max(ws, 1)))
    xb, wb = d.buf(x), d.buf(w)

    yb = d.buf(np.full(yshape, np.nan))
    d.run(conv_ops.forward(d.dev, g, xb, wb, yb, col, bias=d.buf(b), act=("relu", 0.1),
                           algo="im2col"))
    v = conv2d(x, w, b, pad=(g.ph, g.pw), stride=(g.sh, g.sw), dil=(g.dh, g.dw),
               group=g.groups)
    assert rel_err(d.get(yb, yshape), np.where(v > 0, v, 0.1 * v)) < 1e-5

    dwb = d.buf(np.zeros(w.shape))
    d.run(conv_ops.backward_weight(d.dev, g, xb, d.buf(dy), dwb, col, algo="im2col"))
    assert rel_err(d.get(dwb, w.shape), _weight_grad(g, x, dy)) < 1e-5
    assert {b.get("CONV_B", 0) for b in vw.built} == {1, 2}


def _weight_grad(g, x, dy):
    """float64 dL/dw of conv2d by its columns."""
    xp = np.zeros((g.num, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw))
    xp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width] = x
    cg, og = g.channels // g.groups, g.out_channels // g.groups
    dw = np.zeros((g.out_channels, cg, g.kh, g.kw))
    for gi in range(g.groups):
        for i in range(g.kh):
            for j in range(g.kw):
                patch = xp[:, gi * cg:(gi + 1) * cg,
                           i * g.dh: i * g.dh + g.sh * (g.out_h - 1) + 1: g.sh,
                           j * g.dw: j * g.dw + g.sw * (g.out_w - 1) + 1: g.sw]
                dw[gi * og:(gi + 1) * og, :, i, j] = np.einsum(
                    "nchw,nohw->oc", patch, dy[:, gi * og:(gi + 1) * og])
    return dw


# the columns packed once for every block of rows (ops.conv.packs_columns_once,
# gemm_cpu.cl pack_b_conv + PACKED_B): many output channels on a small
# plane; two images folded into N (a panel across their end); stride 2; K
# over two K panels and several pack chunks; 200 channels: 12 row blocks
# (n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw, groups)
ONCE = [
    (1, 5, 7, 7, 200, 3, 3, 1, 1, 1, 1, 1, 1, 1),
    (2, 3, 5, 6, 200, 3, 3, 1, 1, 1, 1, 1, 1, 1),
    (1, 4, 9, 11, 200, 3, 3, 1, 1, 2, 2, 1, 1, 1),
    (1, 32, 4, 4, 200, 3, 3, 1, 1, 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("p", ONCE, ids=["7x7", "two-images", "stride2", "two-kpanels"])
def test_conv_columns_packed_once(d, rng, vw, settings, monkeypatch, p):
    settings(CPU_COLUMNS_ONCE=True, CPU_DIRECT_CONV=False)
    monkeypatch.setattr(d.dev, "compute_units", 2)    # blocks as on the 2-core CPU
    g = conv_ops.ConvGeometry(*p)
    assert conv_ops.packs_columns_once(d.dev, g, g.num, False)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    ws = conv_ops.workspace_floats(d.dev, g, "im2col")
    col = d.buf(np.zeros(max(ws, 1)))
    yb = d.buf(np.full(yshape, np.nan))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, col, bias=d.buf(b),
                                act=("relu", 0.1), algo="im2col")
    assert [ln.name for ln in launches][-2:] == ["pack_b_conv", "gemm"]
    d.run(launches)
    v = conv2d(x, w, b, pad=(g.ph, g.pw), stride=(g.sh, g.sw))
    assert rel_err(d.get(yb, yshape), np.where(v > 0, v, 0.1 * v)) < 1e-5
    assert any(b.get("PACKED_B") == 1 for b in vw.built)


def test_columns_packed_once_rule(d, settings, monkeypatch):
    """Several blocks of output rows over a small plane: packed once; few
    output channels (one block of rows), groups, or the setting off: in
    every block (blocks as a 2-core CPU splits them)."""
    if not d.dev.is_cpu:
        pytest.skip("CPU drivers' rule")
    settings(CPU_COLUMNS_ONCE=True)
    monkeypatch.setattr(d.dev, "compute_units", 2)
    G = conv_ops.ConvGeometry
    assert conv_ops.packs_columns_once(d.dev, G(1, 512, 7, 7, 512, 3, 3, 1, 1), 1, False)
    assert not conv_ops.packs_columns_once(d.dev, G(1, 128, 28, 28, 32, 3, 3, 1, 1), 1, True)
    assert not conv_ops.packs_columns_once(
        d.dev, G(1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 2), 1, False)
    # too large to pack once: 64 images of a 14 x 14 plane
    assert not conv_ops.packs_columns_once(d.dev, G(64, 256, 14, 14, 256, 3, 3, 1, 1), 64, True)
    settings(CPU_COLUMNS_ONCE=False)
    assert not conv_ops.packs_columns_once(d.dev, G(1, 512, 7, 7, 512, 3, 3, 1, 1), 1, False)
