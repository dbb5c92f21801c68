"""GEMM split along K (ops/gemm_splitk.py): the batched partial products
plus the reducing epilogue equal one GEMM (float64 reference), and the
split is only chosen where the tiles cannot fill a GPU."""
import types

import numpy as np
import pytest

from caffe_ocl.ops.gemm_splitk import gemm_launches, splitk_factor
from refs import rel_err

# gemm.cl (the GPU kernel) built unoptimised on CPU drivers (conftest)
pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")


@pytest.mark.parametrize("trans_a,trans_b,bias_axis,act", [
    (False, True, 1, None),            # InnerProduct forward: x * W^T + b
    (True, False, 0, ("relu", 0.1)),   # transposed A, per-row bias, leaky ReLU
])
def test_split_k_equals_one_gemm(d, rng, trans_a, trans_b, bias_axis, act):
    M, N, K, nsplit, alpha, beta = 5, 7, 96, 3, 0.5, 2.0
    a = rng.standard_normal((K, M) if trans_a else (M, K))
    b = rng.standard_normal((N, K) if trans_b else (K, N))
    bias = rng.standard_normal(M if bias_axis == 0 else N)
    c0 = rng.standard_normal((M, N))
    cb = d.buf(c0)
    launches = gemm_launches(d.dev, M, N, K, d.buf(a), d.buf(b), cb, trans_a=trans_a,
                             trans_b=trans_b, alpha=alpha, beta=beta, bias=d.buf(bias),
                             bias_axis=bias_axis, act=act, nsplit=nsplit)
    assert len(launches) == 2
    d.run(launches)
    v = alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b))
    v += (bias[:, None] if bias_axis == 0 else bias[None, :]) + beta * c0
    if act:
        v = np.where(v > 0, v, act[1] * v)
    assert rel_err(d.get(cb, (M, N)), v) < 1e-5


@pytest.mark.parametrize("nsplit", [1, 3])
def test_residual_through_the_split(d, rng, nsplit):
    """A residual (laid out as C: same row stride, from C's offset) is added
    after beta*C and before the activation by the reducing launch of a split
    product as by one GEMM's epilogue (plan/residual.py fuses a ViT's fc2 +
    shortcut so)."""
    M, N, K, ldc, off_c, beta = 5, 7, 96, 9, 4, 0.5
    a, b = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    bias = rng.standard_normal(N)
    c0, r = rng.standard_normal(off_c + M * ldc), rng.standard_normal(off_c + M * ldc)
    cb = d.buf(c0)
    launches = gemm_launches(d.dev, M, N, K, d.buf(a), d.buf(b), cb, trans_b=True, beta=beta,
                             ldc=ldc, off_c=off_c, bias=d.buf(bias), bias_axis=1,
                             act=("relu", 0.0), nsplit=nsplit, residual=d.buf(r))
    assert len(launches) == (2 if nsplit > 1 else 1)
    d.run(launches)
    view = lambda x: x[off_c:].reshape(M, ldc)[:, :N]
    want = c0.copy()
    view(want)[:] = np.maximum(a @ b.T + bias + beta * view(c0) + view(r), 0.0)
    assert rel_err(d.get(cb, c0.shape), want) < 1e-5


def test_residual_takes_the_rule_split(d, rng, monkeypatch):
    """A residual no longer keeps a product whole: gemm_launches with a
    residual and no nsplit splits as splitk_factor says (this device taken
    for a 132-unit GPU: one tile, so the per-unit rule splits) with the
    shortcut in the result; only the kernels that cannot add one (the
    matrix-vector kernel, a few rows) refuse it."""
    from caffe_ocl import config
    from caffe_ocl.ops import gemm_splitk
    for name, value in (("is_gpu", True), ("is_cpu", False), ("compute_units", 132)):
        monkeypatch.setattr(d.dev, name, value, raising=False)
    M, N, K = 40, 24, 512
    a, b, r = (rng.standard_normal(s) for s in ((M, K), (N, K), (M, N)))
    cb = d.buf(np.zeros((M, N)))
    with config.override(TF32=False, TF32_EMULATE=False, DETERMINISTIC=False):
        nsplit = splitk_factor(d.dev, M, N, K)
        assert nsplit > 1 and gemm_splitk.adds_residual(d.dev, M, N, K, trans_b=True)
        launches = gemm_launches(d.dev, M, N, K, d.buf(a), d.buf(b), cb, trans_b=True,
                                 residual=d.buf(r))
        assert [ln.name for ln in launches] == ["gemm", "gemm_splitk_reduce"]
        assert launches[0].gsize[2] == nsplit
        d.run(launches)
        assert rel_err(d.get(cb, (M, N)), a @ b.T + r) < 1e-5
        assert not gemm_splitk.adds_residual(d.dev, 1, N, K, trans_b=True)    # gemv
        with pytest.raises(ValueError, match="residual"):
            gemm_launches(d.dev, 1, N, K, d.buf(a), d.buf(b), cb, trans_b=True,
                          residual=d.buf(r))


@pytest.mark.parametrize("tf32", [False, True])
def test_split_factor_only_where_tiles_are_few(tf32):
    from caffe_ocl import config
    gpu = types.SimpleNamespace(is_gpu=True, is_nvidia=True, compute_units=132,
                                local_mem=48 << 10)
    with config.override(TF32=tf32, TF32_EMULATE=False):
        f = splitk_factor(gpu, 64, 4096, 9216)        # AlexNet fc6 at batch 64: 32 tiles
        assert f > 1 and 9216 % f == 0 and (9216 // f) % 16 == 0
        # about SPLIT_WGS_PER_CU(_FP32) work-groups per unit, chunks of at
        # least MIN_CHUNK(_FP32): TF32 4 and 512, FP32 8 and 128
        fc7, fc8 = splitk_factor(gpu, 64, 4096, 4096), splitk_factor(gpu, 64, 1000, 4096)
        assert (f, fc7, fc8) == ((16, 8, 8) if tf32 else (32, 32, 32))
        assert splitk_factor(gpu, 4096, 4096, 9216) == 1     # 1024 tiles fill the GPU
        assert splitk_factor(gpu, 64, 1000, 100) == 1         # K too short to split
        # an LSTM's recurrence (16 tiles): chunks of 128 in FP32, 256 in TF32
        # (H100: 0.051 -> 0.019 ms; bench_fc_splitk.py --shapes)
        assert splitk_factor(gpu, 16, 2048, 512) == (2 if tf32 else 4)
        # a ViT's MLP out (197 tokens x 192, K 768: 4 tiles) in 128s / 256s
        assert splitk_factor(gpu, 197, 192, 768) == (3 if tf32 else 6)
        assert splitk_factor(gpu, 16, 2048, 192) == 1         # under two chunks
        # Swin's last-stage qkv (126 tiles): whole in FP32 (0.114 against
        # 0.140 ms split, H200); TF32 still splits below one wave
        assert splitk_factor(gpu, 784, 2304, 768) == (3 if tf32 else 1)
    cpu = types.SimpleNamespace(is_gpu=False, compute_units=2)
    assert splitk_factor(cpu, 64, 4096, 9216) == 1


def test_long_k_chunks():
    """FP32, 128-row tiles, K >= LONG_K_MIN: chunks near LONG_K_CHUNK (768)
    from a wave of work-groups up to LONG_K_MAX_WAVES of tiles (H100,
    bench_gemm_tiles.py --splits; BENCHMARKS.md, forty-ninth session)."""
    from caffe_ocl import config
    gpu = types.SimpleNamespace(is_gpu=True, is_nvidia=True, compute_units=132,
                                local_mem=48 << 10)
    with config.override(TF32=False, TF32_EMULATE=False):
        assert splitk_factor(gpu, 3152, 384, 1536) == 2      # DeiT III-S b16 fc2, 75 tiles
        assert splitk_factor(gpu, 3152, 768, 3072) == 4      # ViT-B b16 fc2, 150 tiles
        assert splitk_factor(gpu, 12608, 384, 1536) == 2     # DeiT-S b64 fc2, 297 tiles
        assert splitk_factor(gpu, 784, 768, 3072) == 4       # 42 tiles: not 24 chunks of 128
        assert splitk_factor(gpu, 3152, 1536, 384) == 1      # fc1: K short, 300 tiles whole
        assert splitk_factor(gpu, 12608, 768, 3072) == 1     # 594 tiles: past 2.5 waves
        # 39 tiles: 2 chunks of 768 make under a wave; 4 of 384 make one
        # (H100: 0.083 ms against 0.099 in the per-unit rule's 12 chunks)
        assert splitk_factor(gpu, 1576, 384, 1536) == 4
        # a wave only in chunks under 384: the per-unit rule
        assert splitk_factor(gpu, 788, 384, 1536) == 12     # 21 tiles, chunks of 128
        assert splitk_factor(gpu, 256, 1024, 4096) == 32     # 16 tiles, chunks of 128
        assert splitk_factor(gpu, 64, 4096, 9216) == 32      # 64-row tiles: per-unit rule
        assert splitk_factor(gpu, 1024, 768, 2008) == 1      # 2008: no chunk a multiple of 16
    with config.override(TF32=True, TF32_EMULATE=False):
        assert splitk_factor(gpu, 3152, 384, 1536) == 3      # TF32: its own rule, chunks >= 512


def test_fill_tiles_rule():
    """ops.gemm.fill_tiles on a 132-unit GPU: 64 x 64 tiles for at most 64
    columns or under half a wave, 64 x 128 between one and two waves, else
    the usual; the setting's "usual" and TF32 keep the usual tile."""
    from caffe_ocl import config
    from caffe_ocl.ops import gemm as gemm_ops
    gpu = types.SimpleNamespace(is_gpu=True, is_cpu=False, is_nvidia=True, compute_units=132,
                                local_mem=48 << 10)
    with config.override(TF32=False, TF32_EMULATE=False, GEMM_TILES="rule"):
        def name(M, N, gz=1):
            t = gemm_ops.gemm_tiles(gpu, M, N, 64, gz, "auto")
            return {(128, 128, 8): "usual", (64, 128, 8): "rows64", (64, 64, 4): "small"}[
                (t["TM"], t["TN"], t.get("MICRO", 8))]
        assert name(197, 64, 48) == "small"          # attention's weights x values
        assert name(4096, 4096) == "usual"           # 1024 tiles
        assert name(3152, 768) == "rows64"           # DeiT b16's MLP in: 150 -> 300 tiles
        assert name(3152, 576) == "usual"            # its qkv: 125 tiles, one wave
        assert name(3152, 192) == "small"            # its projection: 50 tiles
        assert name(8192, 256) == "usual"            # Mixer's token MLP: 128 tiles
        assert name(197, 197, 48) == "rows64"        # scores: 192 -> 384
        assert name(64, 1024) == "small"             # 64-row tiles already: 8 tiles
        # 256 tiles of 64 rows already (fc8 at batch 64, split in 32): kept
        assert gemm_ops.fill_tiles(gpu, 64, 1000, 32, gemm_ops.gpu_tiles(gpu, 64)) == "usual"
        assert gemm_ops.gemm_tiles(gpu, 3152, 576, 64, 1)["TM"] == 128    # not asked
    with config.override(TF32=False, TF32_EMULATE=False, GEMM_TILES="usual"):
        assert gemm_ops.gemm_tiles(gpu, 3152, 192, 64, 1, "auto").get("MICRO", 8) == 8
    with config.override(TF32=True, TF32_EMULATE=False, GEMM_TILES="rule"):
        t = gemm_ops.gemm_tiles(gpu, 3152, 576, 64, 1, "auto")
        assert (t["TM"], t["TN"]) == (128, 128)


# (M, N, K, SMALL_M_ONE_ROW): batch 1 through its own loop (runs of 8 or 3
# columns) or the paired rows' (0)
@pytest.mark.parametrize("M,N,K,one_row", [
    (1, 17, 70, 8), (1, 203, 2061, 8), (1, 17, 70, 3), (1, 203, 2061, 3), (1, 17, 70, 0),
    (1, 203, 2061, 0), (5, 64, 1000, 8), (16, 130, 2061, 8), (32, 20, 4100, 8)])
def test_small_m_cpu_kernel(d, rng, monkeypatch, M, N, K, one_row):
    """The CPU kernel for few rows (kernels/gemm_small_m.cl): C = act(alpha
    A B^T + bias + beta C) for odd M, N, K (K over the 2048-float chunk and
    off the 8-wide vectors), per-column and per-row bias, beta, clip; batch
    1 through its own loop (SM_ONE_ROW: runs of columns not a multiple of
    it) or the paired rows'."""
    from caffe_ocl.ops import gemm_splitk
    monkeypatch.setattr(gemm_splitk, "SMALL_M_ONE_ROW", one_row)
    a, b = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    c0 = rng.standard_normal((M, N))
    bias_n, bias_m = rng.standard_normal(N), rng.standard_normal(M)
    ab = a @ b.T
    for axis, bias, want in [(1, bias_n, 0.5 * ab + bias_n + 2.0 * c0),
                             (0, bias_m, 0.5 * ab + bias_m[:, None] + 2.0 * c0)]:
        cb = d.buf(c0)
        d.run([gemm_splitk.small_m(d.dev, M, N, K, d.buf(a), d.buf(b), cb, alpha=0.5,
                                   beta=2.0, bias=d.buf(bias), bias_axis=axis,
                                   act=("clip", -3.0, 4.0))])
        np.testing.assert_allclose(d.get(cb, (M, N)), np.clip(want, -3.0, 4.0),
                                   rtol=1e-4, atol=1e-4 * np.sqrt(K))
    # the dispatch of fully-connected shapes picks it on CPU drivers
    if d.dev.is_cpu and K >= 64 and N >= 16:
        ls = gemm_splitk.gemm_launches(d.dev, M, N, K, d.buf(a), d.buf(b), d.buf(c0),
                                       trans_b=True)
        assert [ln.name for ln in ls] == ["gemm_small_m"]


@pytest.mark.parametrize("nsplit", [None, 1, 2])
def test_offsets(d, rng, nsplit):
    """Offsets into A, B and C (a recurrent layer's time step in its
    [T][N][...] buffers) through every path: the CPU small-M kernel or plain
    GEMM (None), one GEMM (1) and split K (2)."""
    M, N, K, off_a, off_b, off_c = 6, 20, 128, 7, 3, 11
    a, b = rng.standard_normal(off_a + M * K), rng.standard_normal(off_b + N * K)
    c0 = rng.standard_normal(off_c + M * N + 5)
    cb = d.buf(c0)
    d.run(gemm_launches(d.dev, M, N, K, d.buf(a), d.buf(b), cb, trans_b=True, beta=1.0,
                        nsplit=nsplit, off_a=off_a, off_b=off_b, off_c=off_c))
    want = c0.copy()
    want[off_c:off_c + M * N] += (a[off_a:].reshape(M, K) @ b[off_b:].reshape(N, K).T).ravel()
    np.testing.assert_allclose(d.get(cb, c0.shape), want, rtol=1e-4, atol=1e-4)
