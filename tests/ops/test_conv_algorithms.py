"""Every convolution algorithm of ops/conv.py (im2col + GEMM, implicit GEMM)
and both GEMM kernels (gemm_cpu.cl, the GPU tiles of gemm.cl) against
float64 NumPy references, over edge shapes: odd sizes, groups, dilation,
stride > kernel, batch 1, sizes that are not multiples of the tiles.
The GPU kernels run on PoCL too, built unoptimised there
(gpu_kernels_unoptimized_on_cpu), with the TF32 tilings on an emulated
mma; the real tensor-core path needs an NVIDIA GPU (marked gpu)."""
import types
from dataclasses import replace

import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import gemm as gemm_ops
from refs import rel_err as _rel

# GPU kernels built unoptimised on CPU drivers (conftest)
pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")

# (n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw, groups)
GEOMS = [
    (2, 3, 7, 6, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1),      # odd sizes, pad
    (1, 4, 9, 8, 6, 3, 2, 1, 0, 2, 1, 1, 1, 2),      # batch 1, groups, stride 2
    (2, 3, 9, 9, 4, 3, 3, 2, 2, 1, 1, 2, 2, 1),      # dilation
    (3, 2, 7, 7, 3, 2, 2, 0, 0, 3, 3, 1, 1, 1),      # stride > kernel
    (2, 5, 5, 7, 70, 1, 1, 0, 0, 1, 1, 1, 1, 1),     # 1x1, M > 64 (128-row tiles)
    (2, 6, 4, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6),      # depthwise
    (4, 16, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1),     # K > 2 tiles, N > 128
    (2, 5, 7, 8, 6, 1, 1, 0, 0, 2, 2, 1, 1, 1),      # strided 1x1 (dense + scatter)
]


def _geom(p):
    n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw, gr = p
    return conv_ops.ConvGeometry(n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw, gr)


def _im2col(x, g):
    """float64 columns [n][C*KH*KW][HO*WO]."""
    n = x.shape[0]
    xp = np.zeros((n, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw))
    xp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width] = x
    col = np.zeros((n, g.channels, g.kh, g.kw, g.out_h, g.out_w))
    for i in range(g.kh):
        for j in range(g.kw):
            col[:, :, i, j] = xp[:, :, i * g.dh: i * g.dh + g.sh * (g.out_h - 1) + 1: g.sh,
                                 j * g.dw: j * g.dw + g.sw * (g.out_w - 1) + 1: g.sw]
    return col.reshape(n, g.col_rows, g.out_spatial)


def _col2im(col, g):
    n = col.shape[0]
    col = col.reshape(n, g.channels, g.kh, g.kw, g.out_h, g.out_w)
    xp = np.zeros((n, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw))
    for i in range(g.kh):
        for j in range(g.kw):
            xp[:, :, i * g.dh: i * g.dh + g.sh * (g.out_h - 1) + 1: g.sh,
               j * g.dw: j * g.dw + g.sw * (g.out_w - 1) + 1: g.sw] += col[:, :, i, j]
    return xp[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width]


def _refs(g, x, w, dy):
    G = g.groups
    M, K = g.out_channels // G, g.col_rows // G
    col = _im2col(x, g).reshape(g.num, G, K, g.out_spatial)
    wg = w.reshape(G, M, K)
    dyg = dy.reshape(g.num, G, M, g.out_spatial)
    y = np.einsum("gmk,ngkp->ngmp", wg, col).reshape(dy.shape)
    dw = np.einsum("ngmp,ngkp->gmk", dyg, col).reshape(w.shape)
    dcol = np.einsum("gmk,ngmp->ngkp", wg, dyg).reshape(g.num, g.col_rows, g.out_spatial)
    return y, dw, _col2im(dcol, g)




# Each kernel geometry is its own program (macros); the GPU ones build
# unoptimised on CPU drivers (gpu_kernels_unoptimized_on_cpu), so every
# geometry runs by every algorithm in the default suite.
CASES = [pytest.param(p, algo, id=f"{i}-{algo}")
         for algo in conv_ops.ALGOS if algo != "winograd"   # 3x3 only: test_winograd.py
         for i, p in enumerate(GEOMS)]


@pytest.mark.parametrize("p,algo", CASES)
def test_conv_algorithms_match_reference(d, rng, p, algo):
    g = _geom(p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    dy = rng.standard_normal(yshape)
    y_ref, dw_ref, dx_ref = _refs(g, x, w, dy)
    ws = conv_ops.workspace_floats(d.dev, g, algo)
    col = d.buf(np.zeros(max(ws, 1))) if ws else None
    xb, wb, bb, dyb = d.buf(x), d.buf(w), d.buf(b), d.buf(dy)

    # forward with bias and the fused leaky-ReLU epilogue; poisoned output
    yb = d.buf(np.full(yshape, np.nan))
    d.run(conv_ops.forward(d.dev, g, xb, wb, yb, col, bias=bb, act=("relu", 0.1), algo=algo))
    v = y_ref + b.reshape(1, -1, 1, 1)
    ref = np.where(v > 0, v, 0.1 * v)
    assert _rel(d.get(yb, yshape), ref) < 1e-5

    # backward-weight accumulates (Caffe's param gradients): dW = dW0 + sum
    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    d.run(conv_ops.backward_weight(d.dev, g, xb, dyb, dwb, col, algo=algo))
    assert _rel(d.get(dwb, w.shape), dw0 + dw_ref) < 1e-5

    # backward-data overwrites, or accumulates when asked
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(conv_ops.backward_data(d.dev, g, dyb, wb, dxb, col, algo=algo))
    assert _rel(d.get(dxb, x.shape), dx_ref) < 1e-5
    dx0 = rng.standard_normal(x.shape)
    dxb = d.buf(dx0)
    d.run(conv_ops.backward_data(d.dev, g, dyb, wb, dxb, col, accumulate=True, algo=algo))
    assert _rel(d.get(dxb, x.shape), dx0 + dx_ref) < 1e-5


def test_backward_weight_split_k(d, rng, monkeypatch):
    """A K = n*HO*WO long enough to be split over work-groups, reduced into dW."""
    g = _geom((3, 2, 13, 12, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1))
    monkeypatch.setattr(d.dev, "compute_units", 64)
    nsplit, kchunk = conv_ops.splitk_plan(d.dev, g)
    assert nsplit > 1 and (nsplit - 1) * kchunk < g.num * g.out_spatial
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    _, dw_ref, _ = _refs(g, x, w, dy)
    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    launches = conv_ops.backward_weight(d.dev, g, d.buf(x), d.buf(dy), dwb, None, algo="igemm")
    assert len(launches) == 2
    d.run(launches)
    assert _rel(d.get(dwb, w.shape), dw0 + dw_ref) < 1e-5


@pytest.mark.parametrize("p", [(4, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2),   # 2 groups
                               (5, 3, 6, 6, 4, 1, 1, 0, 0, 1, 1, 1, 1, 1)],  # 1x1: no columns
                         ids=["3x3-groups", "1x1"])
def test_cpu_weight_gradient_split_over_images(d, rng, p, monkeypatch):
    """CPU drivers: a weight gradient split into groups of images (partial
    weights summed by splitk_reduce), with leftover images accumulated
    directly: 3 splits of 1 image and 1 (or 2) left over."""
    if not d.dev.is_cpu:
        pytest.skip("the image split is the CPU path (GPUs split K in the implicit GEMM)")
    monkeypatch.setattr(conv_ops, "cpu_weight_split", lambda *a: 3)
    g = _geom(p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    _, dw_ref, _ = _refs(g, x, w, dy)
    ws = conv_ops.workspace_floats(d.dev, g, "im2col")
    col = d.buf(np.zeros(max(ws, 1))) if ws else None
    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    launches = conv_ops.backward_weight(d.dev, g, d.buf(x), d.buf(dy), dwb, col, algo="im2col")
    assert "splitk_reduce" in [ln.name for ln in launches]
    d.run(launches)
    assert _rel(d.get(dwb, w.shape), dw0 + dw_ref) < 1e-5


def test_cpu_weight_split_rule():
    """Small weights over many images are split; big ones are not. The rule
    serves CPU drivers only, so it is checked for CPUs of 2 and 8 cores
    whatever device runs the tests (a GPU's 132 compute units would split
    everything)."""
    for cu in (2, 8):
        cpu = types.SimpleNamespace(compute_units=cu)
        assert conv_ops.cpu_weight_split(cpu, 32, 75, 1, 100) == min(100, 4 * cu)  # CIFAR conv1
        assert conv_ops.cpu_weight_split(cpu, 32, 75, 1, 3) == 3                   # few images
        assert conv_ops.cpu_weight_split(cpu, 512, 4608, 1, 16) == 1               # ResNet conv


@pytest.mark.parametrize("impl", ["cpu", "gpu"])
def test_conv_bias_grad_accumulates(d, rng, impl):
    for outer, ch, inner in [(3, 5, 7), (1, 2, 300), (3, 2, 700)]:   # last: split
        dy = rng.standard_normal((outer, ch, inner))
        db0 = rng.standard_normal(ch)
        dbb = d.buf(db0)
        d.run(conv_ops.bias_grad(d.dev, outer, ch, inner, d.buf(dy), dbb, impl=impl))
        np.testing.assert_allclose(d.get(dbb, (ch,)), db0 + dy.sum(axis=(0, 2)),
                                   rtol=1e-5, atol=1e-5)


GEMMS = [  # M, N, K, trans_a, trans_b, batch, groups
    (5, 7, 3, 0, 0, 1, 1),
    (70, 130, 33, 1, 0, 1, 1),
    (130, 65, 17, 0, 1, 2, 1),
    (64, 129, 40, 1, 1, 1, 2),
    (3, 4, 0, 0, 0, 1, 1),       # K = 0: C = beta*C + bias
    (37, 50, 300, 0, 0, 1, 1),   # K > 96 (CPU: column strips outer) over two K panels
]


@pytest.mark.parametrize("impl", ["cpu", "tiled", "tiled-direct", "tiled-rows64",
                                  "tiled-small", "tiled-small-direct"])
@pytest.mark.parametrize("case", GEMMS, ids=[str(i) for i in range(len(GEMMS))])
def test_gemm_kernels(d, rng, case, impl, monkeypatch):
    """tiled: the GPU kernel with the staged store (short K, tile_store.h);
    -direct: with direct stores (as for K > STAGED_MAX_K); -rows64 / -small:
    its 64 x 128 and 64 x 64 (4 x 4 a work-item) tiles (ops.gemm.gemm_tiles)."""
    tiles = None
    if impl.endswith("-direct"):
        monkeypatch.setattr(gemm_ops, "STAGED_MAX_K", -1)
        impl = impl[:-len("-direct")]
    if impl != "tiled" and impl.startswith("tiled-"):
        impl, tiles = "tiled", impl[len("tiled-"):]
    M, N, K, ta, tb, batch, groups = case
    nb = batch * groups
    A = rng.standard_normal((nb,) + ((K, M) if ta else (M, K)))
    B = rng.standard_normal((nb,) + ((N, K) if tb else (K, N)))
    C = rng.standard_normal((nb, M, N))
    bias = rng.standard_normal(groups * M)
    opA = A.transpose(0, 2, 1) if ta else A
    opB = B.transpose(0, 2, 1) if tb else B
    bias_rows = np.tile(bias.reshape(groups, M), (batch, 1))[:, :, None]
    v = 0.5 * opA @ opB + bias_rows + 0.25 * C
    ref = np.clip(v, -1.0, 2.0)
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_a=bool(ta),
                         trans_b=bool(tb), alpha=0.5, beta=0.25, batch=batch, groups=groups,
                         stride_a=(groups * M * K, M * K), stride_b=(groups * K * N, K * N),
                         stride_c=(groups * M * N, M * N), bias=d.buf(bias),
                         act=("clip", -1.0, 2.0), impl=impl, tiles=tiles)])
    np.testing.assert_allclose(d.get(cb, C.shape), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("raster", [2, 3])
def test_tile_raster_covers_every_tile(d, rng, raster, settings):
    """kernels/tile_raster.h: with the work-groups walked in bands of
    ``raster`` rows of tiles (3 rows: a full band and a short one, or one
    band of 3), every tile of the GPU GEMM and of the implicit-GEMM
    convolution's three passes is still computed once (poisoned outputs)."""
    settings(GPU_TILE_RASTER=raster)
    M, N, K = 300, 290, 20          # 3 x 3 tiles of 128 x 128
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    cb = d.buf(np.full((M, N), np.nan))
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, impl="tiled")])
    np.testing.assert_allclose(d.get(cb, (M, N)), A @ B, rtol=1e-5, atol=1e-5)

    g = _geom((2, 5, 12, 12, 300, 3, 3, 1, 1, 1, 1, 1, 1, 1))   # N = 288 pixels, M = 300
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    dy = rng.standard_normal(yshape)
    y_ref, dw_ref, dx_ref = _refs(g, x, w, dy)
    xb, wb, dyb = d.buf(x), d.buf(w), d.buf(dy)
    yb = d.buf(np.full(yshape, np.nan))
    d.run(conv_ops.forward(d.dev, g, xb, wb, yb, None, algo="igemm"))
    assert _rel(d.get(yb, yshape), y_ref) < 1e-5
    dwb = d.buf(np.zeros(w.shape))
    ws = conv_ops.workspace_floats(d.dev, g, "igemm")
    col = d.buf(np.zeros(max(ws, 1)))
    d.run(conv_ops.backward_weight(d.dev, g, xb, dyb, dwb, col, algo="igemm"))
    assert _rel(d.get(dwb, w.shape), dw_ref) < 1e-5
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(conv_ops.backward_data(d.dev, g, dyb, wb, dxb, col, algo="igemm"))
    assert _rel(d.get(dxb, x.shape), dx_ref) < 1e-5


@pytest.mark.parametrize("tiles", ["usual", "small"])
@pytest.mark.parametrize("vstore4", [True, False])
@pytest.mark.parametrize("read_ahead", [True, False])
@pytest.mark.parametrize("M,N,K,ldc,nsplit,nstride", [
    (70, 130, 20, 132, 0, 0),      # last columns of each row one by one (N % 4 = 2)
    (130, 64, 33, 64, 0, 0),       # every column in 16-byte stores, 128-row tiles
    (40, 2 * 36, 16, 36, 36, 1448),  # images folded into N (NFOLD 36), 1448 floats apart
])
def test_gemm_16_byte_stores(d, rng, monkeypatch, settings, vstore4, read_ahead, M, N, K, ldc,
                             nsplit, nstride, tiles):
    """tile_store.h VSTORE4: the staged GPU tile stores 4 adjacent results
    at once where C's rows start on 16 bytes; bias along columns, beta, a
    residual and an activation give what the one-float stores give (the
    same operations per element), and nothing outside the product's
    columns is written."""
    settings(GEMM_READ_AHEAD=read_ahead, GEMM_VSTORE4=vstore4)
    defines = []
    orig = d.dev.launch

    def launch(filename, name, gsize, lsize, args, defs=None):
        defines.append(dict(defs or {}))
        return orig(filename, name, gsize, lsize, args, defs)
    monkeypatch.setattr(d.dev, "launch", launch)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    nimg, cols = (N // nsplit, nsplit) if nsplit else (1, N)
    size = (nimg - 1) * nstride + M * ldc + 8
    C, R = rng.standard_normal(size), rng.standard_normal(size)
    # where column n of the product lies: image n // cols, column n % cols
    idx = np.array([[(n // cols) * nstride + m * ldc + n % cols for n in range(N)]
                    for m in range(M)])
    bias = rng.standard_normal(N)
    ref = np.maximum(0.5 * A @ B + bias[None, :] + 0.25 * C[idx] + R[idx], 0.0)
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, alpha=0.5, beta=0.25,
                         ldc=ldc, bias=d.buf(bias), bias_axis=1, act=("relu", 0.0),
                         residual=d.buf(R), impl="tiled", tiles=tiles,
                         **(dict(nsplit=nsplit, nstride=(0, nstride), nsplit_b=False)
                            if nsplit else {}))])
    assert any(x.get("VSTORE4") for x in defines) == vstore4
    out = d.get(cb, C.shape)
    np.testing.assert_allclose(out[idx], ref, rtol=1e-5, atol=1e-5)
    untouched = np.ones(size, bool)
    untouched[idx.ravel()] = False
    np.testing.assert_array_equal(out[untouched], C[untouched].astype(np.float32))


@pytest.mark.parametrize("case", GEMMS, ids=[str(i) for i in range(len(GEMMS))])
def test_gemm_cpu_kernel_all_cases(d, rng, case):
    """gemm_cpu.cl on every GEMMS case (fast on PoCL, so none is slow)."""
    test_gemm_kernels(d, rng, case, "cpu", None)


@pytest.mark.parametrize("M,HW,K,nimg,impl", [(7, 21, 300, 3, "cpu"), (13, 300, 5, 2, "cpu"),
                                              (100, 17, 40, 4, "cpu"), (8, 9, 20, 5, "cpu"),
                                              (100, 17, 40, 4, "tiled")])
def test_gemm_images_folded_into_n(d, rng, M, HW, K, nimg, impl):
    """nsplit: op(B) and C as [image][rows][HW] (the image tensors of a
    convolution), N = images * HW; HW not a multiple of the 16-column
    strips (CPU: 16-column panels and tiles across one image end, with 5 or
    10 of their columns in the first image, or across several; GPU kernel,
    gemm.cl NFOLD: 128-column tiles across image ends), K over one panel,
    beta accumulation, bias and ReLU epilogue."""
    A = rng.standard_normal((M, K))
    B = rng.standard_normal((nimg, K + 1, HW))      # one spare row per image
    C = rng.standard_normal((nimg, M + 2, HW))
    bias = rng.standard_normal(M)
    v = np.einsum("mk,ikp->imp", A, B[:, :K]) + bias[None, :, None] + 0.5 * C[:, :M]
    ref = C.copy()
    ref[:, :M] = np.where(v > 0, v, 0.2 * v)
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, nimg * HW, K, d.buf(A), d.buf(B), cb, beta=0.5,
                         ldb=HW, ldc=HW, nsplit=HW, nstride=((K + 1) * HW, (M + 2) * HW),
                         bias=d.buf(bias), act=("relu", 0.2), impl=impl)])
    assert _rel(d.get(cb, C.shape), ref) < 1e-5


@pytest.mark.parametrize("nsplit", [1, 3])
def test_gemm_gpu_images_folded_into_k(d, rng, nsplit):
    """The GPU kernel's ksplit (gemm.cl KFOLD): k = image * HW + pixel,
    K split in kchunk slices (one per batch index) into partial products
    that add up to the weight gradient; groups move A, B and C."""
    M, N, HW, nimg, G = 13, 20, 36, 3, 2
    K = nimg * HW
    kchunk = -(-K // nsplit // 16) * 16
    A = rng.standard_normal((nimg, G, M, HW))
    B = rng.standard_normal((nimg, G, N, HW))
    C = rng.standard_normal((G, nsplit, M, N))
    ref = np.einsum("igmp,ignp->gmn", A, B)
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_b=True, beta=0.0,
                         lda=HW, ldb=HW, ksplit=HW, kstride=(G * M * HW, G * N * HW),
                         kchunk=kchunk, batch=nsplit, groups=G, stride_a=(0, M * HW),
                         stride_b=(0, N * HW), stride_c=(M * N, nsplit * M * N),
                         impl="tiled")])
    assert _rel(d.get(cb, C.shape).sum(axis=1), ref) < 1e-5


@pytest.mark.parametrize("vw", ["8", "16"])
def test_cpu_blocks_cover_and_balance(d, vw):
    with config.override(CPU_GEMM_VW=vw):
        nr = gemm_ops.cpu_nr(d.dev)
        assert nr == 2 * int(vw)
        for M, N in [(1, 1), (64, 50176), (512, 784), (20, 25), (1000, 16), (64, 49)]:
            for packed_a in (False, True):
                bm, bn = gemm_ops.cpu_blocks(d.dev, M, N, packed_a=packed_a)
                assert bm % 6 == 0 and bn % nr == 0
                assert 0 < bm <= gemm_ops.CPU_BM_MAX and 0 < bn <= gemm_ops.CPU_BN_MAX
                assert bm < M + 6 and bn < N + nr      # no block wider than needed


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 1)])
def test_gemm_cpu_thin_panels(d, rng, ta, tb):
    """Thin, short products (M <= 36, K <= 32) take gemm_cpu.cl with blocks of
    up to 2048 columns where local memory holds them (not on a 32 KiB
    device); results as any GEMM's: N over one wide block, odd M and K,
    transposes, bias and clip; images folded into N with a 16-column
    panel across the image end."""
    kc, bm, bn = gemm_ops.CPU_THIN_PANELS
    fits = 4 * kc * (bm + bn) <= d.dev.local_mem       # PoCL: yes; GPUs: no
    assert (gemm_ops.cpu_panels(d.dev, 16, 32) == gemm_ops.CPU_THIN_PANELS) == fits
    assert gemm_ops.cpu_panels(d.dev, 37, 32)[2] == gemm_ops.CPU_BN_MAX
    assert gemm_ops.cpu_panels(d.dev, 16, 33)[2] == gemm_ops.CPU_BN_MAX
    small = types.SimpleNamespace(local_mem=32 << 10)
    assert gemm_ops.cpu_panels(small, 16, 32)[2] == gemm_ops.CPU_BN_MAX
    M, N, K = 17, 4500, 27
    A = rng.standard_normal((K, M) if ta else (M, K))
    B = rng.standard_normal((N, K) if tb else (K, N))
    C = rng.standard_normal((M, N))
    bias = rng.standard_normal(M)
    v = (A.T if ta else A) @ (B.T if tb else B) + bias[:, None] + 0.5 * C
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_a=bool(ta),
                         trans_b=bool(tb), beta=0.5, bias=d.buf(bias), act=("clip", -1.0, 2.0),
                         impl="cpu")])
    assert _rel(d.get(cb, C.shape), np.clip(v, -1.0, 2.0)) < 1e-5
    if tb:
        return
    HW, nimg = 1500, 3                             # panels across image ends
    B = rng.standard_normal((nimg, K, HW))
    C = rng.standard_normal((nimg, M, HW))
    v = np.einsum("mk,ikp->imp", A.T if ta else A, B) + bias[None, :, None]
    cb = d.buf(C)
    d.run([gemm_ops.gemm(d.dev, M, nimg * HW, K, d.buf(A), d.buf(B), cb, trans_a=bool(ta),
                         ldb=HW, ldc=HW, nsplit=HW, nstride=(K * HW, M * HW),
                         bias=d.buf(bias), impl="cpu")])
    assert _rel(d.get(cb, C.shape), v) < 1e-5


def test_gemm_split_arguments_rejected(d):
    with pytest.raises(ValueError, match="nsplit"):
        gemm_ops.gemm(d.dev, 2, 2, 2, None, None, None, nsplit=1, trans_b=True, impl="tiled")
    with pytest.raises(ValueError, match="ksplit"):
        gemm_ops.gemm(d.dev, 2, 2, 2, None, None, None, ksplit=1, impl="cpu")
    with pytest.raises(ValueError, match="ksplit"):    # 2 slices of K = 32, not 1
        gemm_ops.gemm(d.dev, 2, 2, 32, None, None, None, trans_b=True, ksplit=8,
                      kchunk=16, impl="tiled")


def test_bad_algorithm_rejected(d):
    with pytest.raises(ValueError, match="algorithm"):
        conv_ops.workspace_floats(d.dev, _geom(GEOMS[0]), "fft")


def test_tf32_flag_never_reaches_non_nvidia(d, monkeypatch, settings):
    settings(TF32=True)
    if not (d.dev.is_gpu and d.dev.is_nvidia):
        assert gemm_ops.use_tf32(d.dev) == 0
    else:
        assert gemm_ops.use_tf32(d.dev) == 1


def _check_igemm_passes(d, rng, g, tol, rounding=lambda a: a):
    """Forward, weight gradient and data gradient of ``g`` by implicit GEMM
    against float64 references of the ``rounding``-ed operands."""
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    y_ref, dw_ref, dx_ref = _refs(g, rounding(x), rounding(w), rounding(dy))
    xb, wb, dyb = d.buf(x), d.buf(w), d.buf(dy)
    yb = d.buf(np.full(dy.shape, np.nan))
    d.run(conv_ops.forward(d.dev, g, xb, wb, yb, None, algo="igemm"))
    assert _rel(d.get(yb, dy.shape), y_ref) < tol
    dwb = d.buf(np.zeros(w.shape))
    d.run(conv_ops.backward_weight(d.dev, g, xb, dyb, dwb, None, algo="igemm"))
    assert _rel(d.get(dwb, w.shape), dw_ref) < tol
    dxb = d.buf(np.full(x.shape, np.nan))
    d.run(conv_ops.backward_data(d.dev, g, dyb, wb, dxb, None, algo="igemm"))
    assert _rel(d.get(dxb, x.shape), dx_ref) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("p", [GEOMS[0], GEOMS[1], GEOMS[4], GEOMS[6]], ids=str)
def test_tf32_conv_and_gemm_on_nvidia(d, rng, p, monkeypatch, settings):
    if not (d.dev.is_gpu and d.dev.is_nvidia):
        pytest.skip("TF32 tensor cores need an NVIDIA GPU")
    settings(TF32=True)
    _check_igemm_passes(d, rng, _geom(p), 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("M,N,K,ld", [(200, 300, 129, 0), (40, 136, 20, 0), (131, 260, 64, 4)])
def test_tf32_gemm_on_nvidia(d, rng, M, N, K, ld, ta, tb, monkeypatch, settings):
    """TF32 GEMMs on tensor cores (tile_mainloop_async.h) in every transpose
    case, 128- and 64-row tiles, 4-byte copies (odd rows) and 16-byte
    copies (rows padded to ld-aligned lengths), two batches."""
    if not (d.dev.is_gpu and d.dev.is_nvidia):
        pytest.skip("TF32 tensor cores need an NVIDIA GPU")
    settings(TF32=True)
    lda, ldb = (M if ta else K), (K if tb else N)
    if ld:
        lda, ldb = -(-lda // ld) * ld, -(-ldb // ld) * ld
    A = rng.standard_normal((2, K if ta else M, lda))
    B = rng.standard_normal((2, N if tb else K, ldb))
    cb = d.buf(np.full((2, M, N), np.nan))
    d.run([gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_a=ta, trans_b=tb,
                         lda=lda, ldb=ldb, batch=2, stride_a=(A[0].size, 0),
                         stride_b=(B[0].size, 0), stride_c=(M * N, 0))])
    a = np.transpose(A[:, :, :M], (0, 2, 1)) if ta else A[:, :, :K]
    b = np.transpose(B[:, :, :K], (0, 2, 1)) if tb else B[:, :, :N]
    assert _rel(d.get(cb, (2, M, N)), a @ b) < 3e-3


@pytest.mark.parametrize("p", [(2, 4, 7, 8, 6, 3, 3, 1, 1, 2, 2, 1, 1, 1),   # ResNet-18's 3x3 s2
                               (3, 2, 7, 7, 3, 2, 2, 0, 0, 3, 3, 1, 1, 1)],   # phases with no tap
                         ids=["3x3s2", "2x2s3"])
def test_strided_backward_data_by_phase(d, rng, p):
    """GPU strided backward-data runs one implicit GEMM per stride phase
    (only the taps that reach each phase's pixels); overwrite and accumulate
    against float64, every pixel written (the output starts as NaN)."""
    g = _geom(p)
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    _, _, dx_ref = _refs(g, x, w, dy)
    wb, dyb = d.buf(w), d.buf(dy)
    dxb = d.buf(np.full(x.shape, np.nan))
    ls = conv_ops.backward_data(d.dev, g, dyb, wb, dxb, None, algo="igemm")
    assert {ln.name for ln in ls} == {"conv_bwd_data_phase"}
    assert len(ls) == g.sh * g.sw
    d.run(ls)
    assert _rel(d.get(dxb, x.shape), dx_ref) < 1e-5
    dx0 = rng.standard_normal(x.shape)
    dxb = d.buf(dx0)
    d.run(conv_ops.backward_data(d.dev, g, dyb, wb, dxb, None, accumulate=True, algo="igemm"))
    assert _rel(d.get(dxb, x.shape), dx0 + dx_ref) < 1e-5


def _tf32(a):
    """float64 -> float32 rounded to TF32 (10 mantissa bits, ties away), as
    cvt.rna.tf32.f32 does."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x1000) & 0xffffe000).astype(np.uint32)).view(np.float32).astype(np.float64)


@pytest.fixture
def emulated_tf32(monkeypatch, settings):
    """Kernels built in the test use the tensor-core tiling with an
    emulated mma (kernels/mma_tf32.h, TF32 == 2)."""
    settings(TF32_EMULATE=True)


# (trans_a, trans_b, rows padded to 16 bytes):
# tile_mainloop.h's TF32 tiling (rows of 33 and 130 floats); the same rows
# padded to 16 bytes, so tile_mainloop_async.h runs (k-fast A by ldmatrix,
# x-fast B); and x-fast A / k-fast B over two batches (the other swizzle
# and fragment reads).
EMULATED_GEMMS = [(False, False, False), (False, False, True), (True, True, True)]


@pytest.mark.parametrize("ta,tb,aligned", EMULATED_GEMMS,
                         ids=["registers", "async", "async-trans"])
def test_tf32_tiling_emulated_gemm(d, rng, emulated_tf32, monkeypatch, ta, tb, aligned,
                                   settings):
    """The TF32 tile layouts (fragments, A's row permutation or the async
    loop's swizzles, the staged store) on any device: C must equal the
    product of the TF32-rounded operands (not the FP32 product), over
    128-row tiles with ragged edges."""
    settings(TF32_ASYNC=True)     # whatever CAFFE_OCL_TF32_ASYNC says
    M, N, K, batch = 70, 130, 33, 1 + int(ta)
    lda, ldb = (M if ta else K), (K if tb else N)
    if aligned:
        lda, ldb = -(-lda // 4) * 4, -(-ldb // 4) * 4
    A = rng.standard_normal((batch, K if ta else M, lda))
    B = rng.standard_normal((batch, N if tb else K, ldb))
    C = rng.standard_normal((batch, M, N))
    bias = rng.standard_normal(M)
    cb = d.buf(C)
    launch = gemm_ops.gemm(d.dev, M, N, K, d.buf(A), d.buf(B), cb, trans_a=ta, trans_b=tb,
                           lda=lda, ldb=ldb, alpha=0.5, beta=0.25, batch=batch,
                           stride_a=(A[0].size, 0), stride_b=(B[0].size, 0),
                           stride_c=(C[0].size, 0), bias=d.buf(bias), act=("relu", 0.1),
                           impl="tiled")
    # the async loop (16-byte copies) only where every row starts on 16 bytes
    assert launch.lsize[0] == (128 if aligned else 256)
    d.run([launch])
    a = np.transpose(A[:, :, :M], (0, 2, 1)) if ta else A[:, :, :K]
    b = np.transpose(B[:, :, :K], (0, 2, 1)) if tb else B[:, :, :N]
    f32 = lambda x: np.asarray(x, np.float32).astype(np.float64)  # noqa: E731
    v = 0.5 * _tf32(a) @ _tf32(b) + bias[:, None] + 0.25 * f32(C)
    ref = np.where(v > 0, v, 0.1 * v)
    got = d.get(cb, C.shape)
    assert _rel(got, ref) < 2e-6
    v32 = 0.5 * f32(a) @ f32(b) + bias[:, None] + 0.25 * f32(C)
    assert _rel(got, np.where(v32 > 0, v32, 0.1 * v32)) > 2e-5   # really rounded


@pytest.mark.parametrize("p", [GEOMS[0], GEOMS[4]], ids=["3x3", "1x1-70"])
def test_tf32_tiling_emulated_conv(d, rng, p, emulated_tf32):
    """Implicit-GEMM convolution passes with the emulated TF32 tiling: the
    products of the TF32-rounded operands, to float32 accuracy."""
    _check_igemm_passes(d, rng, _geom(p), 2e-6, rounding=_tf32)


# 1x1 stride-1, rows (20 pixels) on 16 bytes, 70 filters per group: the
# weight gradient as a TF32 GEMM with the images folded into K
FOLDED_1X1 = (3, 6, 4, 5, 140, 1, 1, 0, 0, 1, 1, 1, 1, 2)


@pytest.mark.parametrize("nsplit", [1, 4])
def test_tf32_folded_weight_gradient_1x1(d, rng, nsplit, monkeypatch, settings):
    """1x1 stride-1 weight gradients run gemm.cl's async TF32 loop with
    the images folded into K (both operands k-fast: ldmatrix for both),
    whole or split into slices summed by splitk_reduce, accumulating into
    dW as Caffe does; tensor cores on NVIDIA, the emulated mma elsewhere."""
    nvidia = d.dev.is_gpu and d.dev.is_nvidia
    settings(**{"TF32" if nvidia else "TF32_EMULATE": True})
    settings(TF32_ASYNC=True)
    g = _geom(FOLDED_1X1)
    kchunk = {1: 64, 4: 16}[nsplit]              # K = 3 images x 20 pixels
    monkeypatch.setattr(conv_ops, "splitk_plan", lambda dev, g, per_cu=0: (nsplit, kchunk))
    assert conv_ops._folded_weight_gemm_applies(d.dev, g)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, 1, 1))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    dw0 = rng.standard_normal(w.shape)
    _, dw_ref, _ = _refs(g, _tf32(x), w, _tf32(dy))
    dwb = d.buf(dw0)
    launches = conv_ops.backward_weight(d.dev, g, d.buf(x), d.buf(dy), dwb, None, algo="igemm")
    assert launches[0].name == "gemm" and launches[0].lsize[0] == 128    # the async loop
    assert len(launches) == (1 if nsplit == 1 else 2)
    d.run(launches)
    assert _rel(d.get(dwb, w.shape), np.asarray(dw0, np.float32) + dw_ref) < (3e-3 if nvidia else 2e-6)


@pytest.mark.parametrize("what", ["fwd", "bwd_data"])
def test_tf32_batched_1x1(d, rng, what, monkeypatch, settings):
    """1x1 stride-1 forward (bias and ReLU fused) and backward-data
    (accumulating) over many input channels run one TF32 GEMM on the async
    loop, the images folded into N (tiles across image ends); groups move
    weights, images and outputs. Tensor cores on NVIDIA, the emulated mma
    elsewhere."""
    nvidia = d.dev.is_gpu and d.dev.is_nvidia
    settings(**{"TF32" if nvidia else "TF32_EMULATE": True})
    settings(TF32_ASYNC=True)
    monkeypatch.setattr(conv_ops, "GEMM_1X1_MIN_K", 16)
    g = _geom((3, 40, 2, 6, 144, 1, 1, 0, 0, 1, 1, 1, 1, 2))    # K 20 / 72, 12 pixels
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, 1, 1))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    tol = 3e-3 if nvidia else 2e-6
    if what == "fwd":
        b = rng.standard_normal(g.out_channels)
        y_ref, _, _ = _refs(g, _tf32(x), _tf32(w), dy)
        y_ref = np.maximum(y_ref + b[None, :, None, None], 0)
        yb = d.buf(np.full(dy.shape, np.nan))
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                                    act=("relu", 0.0), algo="igemm")
        assert [(ln.name, ln.lsize[0]) for ln in launches] == [("gemm", 128)]
        d.run(launches)
        assert _rel(d.get(yb, dy.shape), y_ref) < tol
    else:
        _, _, dx_ref = _refs(g, x, _tf32(w), _tf32(dy))
        dx0 = rng.standard_normal(x.shape)
        dxb = d.buf(dx0)
        launches = conv_ops.backward_data(d.dev, g, d.buf(dy), d.buf(w), dxb, None,
                                          accumulate=True, algo="igemm")
        assert [(ln.name, ln.lsize[0]) for ln in launches] == [("gemm", 128)]
        d.run(launches)
        assert _rel(d.get(dxb, x.shape), np.asarray(dx0, np.float32) + dx_ref) < tol


def test_gemm_1x1_gathered_rows(d, rng, monkeypatch):
    """1x1 passes whose planes are not a multiple of 4 pixels, or strided:
    the operand gathered into rows by channel over the batch (conv_rows),
    then one GEMM whose stores fold C's columns back into the images
    (gemm.cl NFOLD_B 0). The async TF32 loop takes them on NVIDIA; here the
    plan is forced and the FP32 tiles run it. Stride 2 from 5 x 6 to 3 x 3
    planes (9 pixels), two groups; forward with bias and ReLU; backward-data
    accumulating and not (the dense 3 x 3 pass gathers dy's rows in the
    shared scratch after its own result, then the scatter)."""
    monkeypatch.setattr(conv_ops, "async_tiles", lambda *a: {"ASYNC": 1})
    monkeypatch.setattr(conv_ops, "GEMM_1X1_MIN_K", 1)
    monkeypatch.setattr(conv_ops, "ROWS_1X1_MIN_K", 1)
    monkeypatch.setattr(conv_ops, "GEMM_1X1_MIN_K_64_ROWS", 1)
    g = _geom((4, 16, 5, 6, 24, 1, 1, 0, 0, 2, 2, 1, 1, 2))
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, 1, 1))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    b = rng.standard_normal(g.out_channels)
    y_ref, _, dx_ref = _refs(g, x, w, dy)
    yb = d.buf(np.full(dy.shape, np.nan))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                                act=("relu", 0.0), algo="igemm")
    assert [ln.name for ln in launches] == ["conv_rows", "gemm"]
    d.run(launches)
    assert _rel(d.get(yb, dy.shape), np.maximum(y_ref + b[None, :, None, None], 0)) < 1e-5
    for accumulate in (False, True):
        dx0 = rng.standard_normal(x.shape)
        dxb = d.buf(dx0)
        launches = conv_ops.backward_data(d.dev, g, d.buf(dy), d.buf(w), dxb, None,
                                          accumulate=accumulate, algo="igemm")
        assert [ln.name for ln in launches][:2] == ["conv_rows", "gemm"]
        d.run(launches)
        assert _rel(d.get(dxb, x.shape), dx_ref + accumulate * dx0) < 1e-5


@pytest.fixture
def gathered_rules(d, monkeypatch):
    """The gathered-columns rules (forward and strided backward-data)
    opened to test shapes (their GEMMs then run the FP32 tiles here): any
    output channels, one compute unit (one tile fills it)."""
    monkeypatch.setattr(conv_ops, "async_tiles", lambda *a: {"ASYNC": 1})
    monkeypatch.setattr(d.dev, "compute_units", 1)
    monkeypatch.setattr(conv_ops, "GATHERED_MIN_M", 1)
    monkeypatch.setattr(conv_ops, "GATHERED_BWD_MIN_K", 1)


# (geometry, GATHERED_MAX_FLOATS, images per GEMM): stride 2 pad 1 (rows
# outside the image), 5 x 5, dilation 2, and a chunked batch: room for 9
# images of 3 x 3, rounded down to 8 so that every chunk's columns start
# on 16 bytes, the last chunk 4 images
GATHERED = [((4, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1), 0, 4),
            ((2, 4, 7, 6, 12, 5, 5, 2, 2, 1, 1, 1, 1, 1), 0, 2),
            ((4, 4, 9, 9, 8, 3, 3, 2, 2, 1, 1, 2, 2, 1), 0, 4),
            ((12, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1), 9 * 36 * 9, 8)]


@pytest.mark.parametrize("p,max_floats,chunk", GATHERED,
                         ids=["stride2-pad1", "5x5", "dilated", "chunks"])
def test_gathered_columns_forward(d, rng, gathered_rules, monkeypatch, p, max_floats,
                                  chunk):
    """TF32 forwards of k x k layers on GPUs: columns gathered into rows
    over the batch (im2col.cl conv_rows), then one GEMM per chunk of
    images whose stores fold C's columns back into the images, with bias
    and ReLU; and writing into a slice of a wider blob (a Concat's)."""
    if max_floats:
        monkeypatch.setattr(conv_ops, "GATHERED_MAX_FLOATS", max_floats)
    g = _geom(p)
    assert conv_ops.gathered_forward_chunk(d.dev, g) == chunk
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    dy = np.zeros((g.num, g.out_channels, g.out_h, g.out_w))
    y_ref = np.maximum(_refs(g, x, w, dy)[0] + b[None, :, None, None], 0)
    yb = d.buf(np.full(dy.shape, np.nan))
    launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                                act=("relu", 0.0), algo="igemm")
    assert [ln.name for ln in launches] == ["conv_rows", "gemm"] * -(-g.num // chunk)
    d.run(launches)
    assert _rel(d.get(yb, dy.shape), y_ref) < 1e-5
    # a slice: channels 3 .. 3 + M of a blob of M + 5 channels per image
    wide = (g.num, g.out_channels + 5, g.out_h, g.out_w)
    y0 = rng.standard_normal(wide).astype(np.float32)
    yb = d.buf(y0)
    d.run(conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None, bias=d.buf(b),
                           act=("relu", 0.0), algo="igemm", y_off=3 * g.out_spatial,
                           y_channels=wide[1]))
    got = d.get(yb, wide)
    assert _rel(got[:, 3:3 + g.out_channels], y_ref) < 1e-5
    np.testing.assert_array_equal(got[:, :3], y0[:, :3])
    np.testing.assert_array_equal(got[:, 3 + g.out_channels:], y0[:, 3 + g.out_channels:])


# (geometry, GATHERED_MAX_FLOATS, images per GEMM) of strided backward-data
# through the columns' gradient: stride 2 pad 1, 5 x 5 stride 2, dilation 2
# stride 2, and a chunked batch (room for 9 images of 3 x 3 pixels, 36 + 8
# rows each, rounded down to 8)
GATHERED_BWD = [((4, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1), 0, 4),
                ((2, 4, 7, 6, 12, 5, 5, 2, 2, 2, 2, 1, 1, 1), 0, 2),
                ((4, 4, 9, 9, 8, 3, 3, 2, 2, 2, 2, 2, 2, 1), 0, 4),
                ((12, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1), 9 * 9 * 44, 8)]


@pytest.mark.parametrize("p,max_floats,chunk", GATHERED_BWD,
                         ids=["stride2-pad1", "5x5-stride2", "dilated", "chunks"])
def test_gathered_columns_backward_data(d, rng, gathered_rules, monkeypatch, p, max_floats,
                                        chunk):
    """TF32 backward-data of strided k x k layers on GPUs: dy gathered into
    rows over a chunk of images, the columns' gradient W^T * rows as one
    GEMM stored image by image, then col2im into dx (accumulating and
    not)."""
    if max_floats:
        monkeypatch.setattr(conv_ops, "GATHERED_MAX_FLOATS", max_floats)
    g = _geom(p)
    assert conv_ops.gathered_backward_data_chunk(d.dev, g) == chunk
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels, g.kh, g.kw))
    dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
    dx_ref = _refs(g, x, w, dy)[2]
    for accumulate in (False, True):
        dx0 = rng.standard_normal(x.shape)
        dxb = d.buf(dx0)
        launches = conv_ops.backward_data(d.dev, g, d.buf(dy), d.buf(w), dxb, None,
                                          accumulate=accumulate, algo="igemm")
        col2im = "col2im_chan" if d.dev.is_cpu else "col2im"
        assert [ln.name for ln in launches] == ["conv_rows", "gemm", col2im] * -(-g.num // chunk)
        d.run(launches)
        assert _rel(d.get(dxb, x.shape), dx_ref + accumulate * dx0) < 1e-5


def test_gathered_columns_backward_data_rule(d, gathered_rules, monkeypatch, settings):
    """Where the implicit GEMM keeps a backward-data: stride 1, 1 x 1
    windows, groups, C*KH*KW not a multiple of 4, fewer output channels
    than GATHERED_BWD_MIN_K, too few tiles, the setting off, deterministic
    mode."""
    monkeypatch.setattr(conv_ops, "GATHERED_BWD_MIN_K", 8)
    ok = _geom((4, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1))
    assert conv_ops.gathered_backward_data_chunk(d.dev, ok) == 4
    for p in [(4, 4, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1),
              (4, 4, 6, 6, 8, 1, 1, 0, 0, 2, 2, 1, 1, 1),
              (4, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 2),
              (4, 3, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1),
              (4, 4, 6, 6, 7, 3, 3, 1, 1, 2, 2, 1, 1, 1)]:
        assert conv_ops.gathered_backward_data_chunk(d.dev, _geom(p)) == 0, p
    monkeypatch.setattr(d.dev, "compute_units", 2)
    assert conv_ops.gathered_backward_data_chunk(d.dev, ok) == 0
    monkeypatch.setattr(d.dev, "compute_units", 1)
    with config.override(GEMM_GATHERED_CONV=False):
        assert conv_ops.gathered_backward_data_chunk(d.dev, ok) == 0
    settings(DETERMINISTIC=True)
    assert conv_ops.gathered_backward_data_chunk(d.dev, ok) == 0


def test_gemm_1x1_wide_rule(d, monkeypatch):
    """1x1 forwards of 64 input channels take the folded GEMM from 256
    output channels on (GEMM_1X1_MIN_K_WIDE), not below."""
    monkeypatch.setattr(conv_ops, "async_tiles", lambda *a: {"ASYNC": 1})
    monkeypatch.setattr(d.dev, "compute_units", 1)
    wide = _geom((2, 64, 4, 4, 256, 1, 1, 0, 0, 1, 1, 1, 1, 1))
    assert conv_ops._igemm_forward_plan(d.dev, wide) == "images"
    for m in (128, 64):
        assert conv_ops._igemm_forward_plan(d.dev, replace(wide, out_channels=m)) is None
    assert conv_ops._igemm_forward_plan(d.dev, replace(wide, channels=32)) is None


def test_gathered_columns_rule(d, gathered_rules, monkeypatch, settings):
    """Where the implicit-GEMM kernel keeps a k x k forward: 1 x 1 windows,
    groups, weight rows not on 16 bytes (C*KH*KW = 27), columns not on 16
    bytes, too few tiles for the compute units, the setting off, and
    deterministic mode."""
    ok = _geom((4, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1))
    assert conv_ops.gathered_forward_chunk(d.dev, ok) == 4
    for p in [(4, 4, 6, 6, 8, 1, 1, 0, 0, 2, 2, 1, 1, 1),
              (4, 4, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 2),
              (4, 3, 6, 6, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1),
              (1, 4, 5, 5, 8, 3, 3, 1, 1, 2, 2, 1, 1, 1)]:
        assert conv_ops.gathered_forward_chunk(d.dev, _geom(p)) == 0, p
    monkeypatch.setattr(d.dev, "compute_units", 2)
    assert conv_ops.gathered_forward_chunk(d.dev, ok) == 0
    monkeypatch.setattr(conv_ops, "GATHERED_MIN_M", 9)     # 8 output channels
    assert conv_ops.gathered_forward_chunk(d.dev, ok) == 0
    monkeypatch.setattr(conv_ops, "GATHERED_MIN_M", 1)
    monkeypatch.setattr(d.dev, "compute_units", 1)
    with config.override(GEMM_GATHERED_CONV=False):
        assert conv_ops.gathered_forward_chunk(d.dev, ok) == 0
    settings(DETERMINISTIC=True)
    assert conv_ops.gathered_forward_chunk(d.dev, ok) == 0


# CPU drivers pack forward / weight-gradient columns from the (zero-padded)
# images (gemm_cpu.cl CONV_B), and backward-data of stride-1 "same" layers
# as a forward convolution of dy with the flipped weight. Geometries reaching its paths: output rows
# of 16+ and of 8 (vector runs), rows a multiple of 8 (transposed
# weight-gradient pack), C*KH*KW over one K panel (256), more pixels per
# image than a panel, no padding (the images themselves), rows that are
# not multiples of 8 with groups and stride (gathers), stride-2 runs (rows
# of 12: halves across rows gathered; 1x1 on odd rows: a run ending on the
# images' last float; packed only with CPU_PACK_STRIDED_1X1, by default
# im2col's columns); plus padded copies in
# chunks of one image, and the weight gradient split with a leftover image.
PACKED = [   # geometry, MAX_COL_FLOATS, weight split, im2col expected
    ((2, 3, 16, 16, 5, 5, 5, 2, 2, 1, 1, 1, 1, 1), 0, 0, False),
    ((3, 12, 8, 8, 7, 5, 5, 2, 2, 1, 1, 1, 1, 1), 0, 0, False),
    ((2, 4, 26, 26, 3, 3, 3, 0, 0, 1, 1, 1, 1, 1), 0, 0, False),
    ((2, 4, 10, 17, 6, 3, 3, 1, 1, 2, 1, 1, 1, 2), 0, 0, False),
    ((3, 3, 16, 16, 5, 5, 5, 2, 2, 1, 1, 1, 1, 1), 3 * 20 * 20, 2, False),
    ((2, 3, 13, 23, 5, 3, 3, 1, 1, 2, 2, 1, 1, 1), 0, 0, False),
    ((2, 4, 9, 33, 6, 1, 1, 0, 0, 2, 2, 1, 1, 1), 0, 0, False),
    ((2, 4, 9, 33, 6, 1, 1, 0, 0, 2, 2, 1, 1, 1), 0, 0, True),
]


@pytest.mark.parametrize("p,max_col,split,im2col", PACKED,
                         ids=["rows16", "rows8-K300", "nopad-576px", "groups-gather",
                              "chunks-split", "stride2-rows12", "stride2-1x1-odd",
                              "stride2-1x1-odd-im2col"])
def test_cpu_packed_columns(d, rng, p, max_col, split, im2col, monkeypatch, settings):
    """The last case: a strided 1x1 kernel as by default, its columns
    written once by im2col (the one before it: packed, as with
    CPU_PACK_STRIDED_1X1)."""
    if not d.dev.is_cpu:
        pytest.skip("columns are packed from the images by the CPU GEMM only")
    settings(CPU_PACKED_COLUMNS=True)
    monkeypatch.setattr(conv_ops, "CPU_PACK_STRIDED_1X1", not im2col)
    if max_col:
        monkeypatch.setattr(conv_ops, "MAX_COL_FLOATS", max_col)
    if split:
        monkeypatch.setattr(conv_ops, "cpu_weight_split", lambda *a: split)
    g = _geom(p)
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw))
    b = rng.standard_normal(g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    dy = rng.standard_normal(yshape)
    y_ref, dw_ref, dx_ref = _refs(g, x, w, dy)
    ws = conv_ops.workspace_floats(d.dev, g, "im2col")
    col = d.buf(np.zeros(max(ws, 1)))
    xb, wb, bb, dyb = d.buf(x), d.buf(w), d.buf(b), d.buf(dy)

    yb = d.buf(np.full(yshape, np.nan))
    fwd = conv_ops.forward(d.dev, g, xb, wb, yb, col, bias=bb, act=("relu", 0.1), algo="im2col")
    assert ("im2col_chan" in [ln.name for ln in fwd]) == im2col
    d.run(fwd)
    v = y_ref + b.reshape(1, -1, 1, 1)
    assert _rel(d.get(yb, yshape), np.where(v > 0, v, 0.1 * v)) < 1e-5

    dw0 = rng.standard_normal(w.shape)
    dwb = d.buf(dw0)
    bwd = conv_ops.backward_weight(d.dev, g, xb, dyb, dwb, col, algo="im2col")
    assert ("im2col_chan" in [ln.name for ln in bwd]) == im2col
    d.run(bwd)
    assert _rel(d.get(dwb, w.shape), dw0 + dw_ref) < 1e-5

    dx0 = rng.standard_normal(x.shape)
    for accumulate, base in ((False, np.full(x.shape, np.nan)), (True, dx0)):
        dxb = d.buf(base)
        ls = conv_ops.backward_data(d.dev, g, dyb, wb, dxb, col, accumulate=accumulate,
                                    algo="im2col")
        # columns + col2im where strided or unpadded (flipping would cost more)
        assert ("col2im_chan" in [ln.name for ln in ls]) == (g.sh > 1 or g.ph == 0)
        d.run(ls)
        assert _rel(d.get(dxb, x.shape), dx_ref + (dx0 if accumulate else 0)) < 1e-5


@pytest.mark.parametrize("staged", [0, 1])
def test_igemm_backward_data_accumulates_both_stores(d, rng, monkeypatch, staged):
    """The accumulating backward-data reads the old dx ahead of its stores
    (tile_store.h PRIOR_AT) in both store forms: staged (short K) and
    direct (K over ops/gemm.py STAGED_MAX_K). 3x3 stride 2: the phase
    kernel too."""
    monkeypatch.setattr(gemm_ops, "STAGED_MAX_K", 1 << 20 if staged else 0)
    for stride in (1, 2):
        g = _geom((2, 3, 7, 6, 5, 3, 3, 1, 1, stride, stride, 1, 1, 1))
        x = rng.standard_normal((g.num, g.channels, g.height, g.width))
        w = rng.standard_normal((g.out_channels, g.channels, 3, 3))
        dy = rng.standard_normal((g.num, g.out_channels, g.out_h, g.out_w))
        dx_ref = _refs(g, x, w, dy)[2]
        dx0 = rng.standard_normal(x.shape)
        dxb = d.buf(dx0)
        d.run(conv_ops.backward_data(d.dev, g, d.buf(dy), d.buf(w), dxb, None,
                                     accumulate=True, algo="igemm"))
        assert _rel(d.get(dxb, x.shape), dx0 + dx_ref) < 1e-5, stride


@pytest.mark.parametrize("items", [1, 5, 7])
def test_flip_weights_chunks(d, rng, items):
    """CPU drivers' flipped weight for stride-1 backward-data
    (im2col.cl flip_weights): wt[g][c][co][KK-1-k] = w[g][co][c][k], each
    work-item walking its chunk with counters; chunks that start and end
    inside a tap row, an output channel and a group."""
    G, M, C, KK = 3, 5, 4, 6
    w = rng.standard_normal((G, M, C, KK)).astype(np.float32)
    want = w[:, :, :, ::-1].transpose(0, 2, 1, 3)
    total = w.size
    wt = d.buf(np.full(total + 3, np.nan))
    d.run([d.dev.launch(conv_ops.SRC, "flip_weights", (items,), (1,),
                        [total, M, C, KK, d.buf(w), wt, 3])])
    np.testing.assert_array_equal(d.get(wt, (total + 3,))[3:].reshape(want.shape), want)
