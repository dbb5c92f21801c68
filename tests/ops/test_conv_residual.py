"""Convolution forwards adding a residual tensor before the activation
(``ops.conv.forward(residual=...)``: y = act(conv + bias + r), the end of a
residual block, plan/residual.py) on every path that takes one: the CPU
GEMM (1x1 and packed-column), the implicit-GEMM kernel with and without
its K split, and the GPU 1x1 GEMM (gemm.cl). Each is checked against
float64 and against the convolution followed by the summing pass it
replaces (the same bits: the sum is made after the product, as the
Eltwise makes it). The GPU kernels run on the CPU driver too."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import pointwise
from refs import rel_err
from test_small_batch_gpu import residual_case

pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")

RELU = ("relu", 0.1)


def _run_both(d, g, x, w, b, r, yshape, **kw):
    """(fused output, launch names, unfused output: conv then sum2)."""
    xb, wb, bb, rb = d.buf(x), d.buf(w), d.buf(b), d.buf(r)
    cf = conv_ops.workspace_floats(d.dev, g)
    col = d.dev.alloc(4 * cf) if cf else None     # the column workspace, where one is used
    yb = d.buf(np.full(yshape, np.nan))
    fused = conv_ops.forward(d.dev, g, xb, wb, yb, col, bias=bb, act=RELU, residual=rb, **kw)
    cb, zb = d.buf(np.full(yshape, np.nan)), d.buf(np.full(yshape, np.nan))
    plain = conv_ops.forward(d.dev, g, xb, wb, cb, col, bias=bb, **kw)
    plain.append(pointwise.sum2(d.dev, int(np.prod(yshape)), 1.0, cb, 1.0, rb, zb, RELU))
    d.run(fused)
    d.run(plain)
    return d.get(yb, yshape), [ln.name for ln in fused], d.get(zb, yshape)


@pytest.mark.parametrize("p", [(2, 24, 5, 6, 40, 1, 1),                  # 1x1, images folded
                               (1, 20, 7, 9, 16, 3, 3, 1, 1),             # packed 3x3 columns
                               (3, 12, 6, 5, 18, 3, 3, 1, 1, 2, 2)],      # strided, 3 images
                         ids=["1x1", "3x3", "stride2"])
def test_cpu_gemm_paths(d, rng, p):
    if not d.dev.is_cpu:
        pytest.skip("the CPU GEMM kernel runs on CPU drivers")
    g, x, w, b, r, yshape, want = residual_case(rng, p)
    assert conv_ops.writes_residual(d.dev, g, "im2col")
    # a K longer than one panel for the 3x3 case: bias first, residual last
    got, names, plain = _run_both(d, g, x, w, b, r, yshape, algo="im2col")
    assert "gemm" in names and "sum2_act" not in names
    assert rel_err(got, want) < 1e-5
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("split", [False, True], ids=["whole-K", "split-K"])
def test_implicit_gemm(d, rng, split, monkeypatch):
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g, x, w, b, r, yshape, want = residual_case(rng, (1, 40, 5, 5, 24, 3, 3, 1, 1))
    with config.override(CONV_SPLITK=split, CONV_SPLITK_MIN_KTILES=1):
        got, names, plain = _run_both(d, g, x, w, b, r, yshape, algo="igemm")
    assert names == (["conv_fwd", "conv_splitk_reduce"] if split else ["conv_fwd"])
    assert rel_err(got, want) < 1e-5
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("p,names", [((3, 16, 4, 5, 24, 1, 1), ["gemm"]),
                                     ((4, 16, 5, 6, 24, 1, 1, 0, 0, 2, 2),
                                      ["conv_rows", "gemm"])],
                         ids=["images", "gathered-rows"])
def test_gpu_1x1_gemm(d, rng, p, names, monkeypatch):
    """A GPU's 1x1 forward through the folded GEMM (gemm.cl NFOLD, its
    plan forced as test_conv_algorithms does): on the images as they lie,
    and on rows gathered from a strided input (C's columns folded back
    into the images by the stores)."""
    monkeypatch.setattr(conv_ops, "async_tiles", lambda *a: {"ASYNC": 1})
    for name in ("GEMM_1X1_MIN_K", "ROWS_1X1_MIN_K", "GEMM_1X1_MIN_K_64_ROWS"):
        monkeypatch.setattr(conv_ops, name, 1)
    g, x, w, b, r, yshape, want = residual_case(rng, p)
    assert conv_ops.writes_residual(d.dev, g, "igemm")
    got, fused_names, plain = _run_both(d, g, x, w, b, r, yshape, algo="igemm")
    assert fused_names == names
    assert rel_err(got, want) < 1e-5
    np.testing.assert_array_equal(got, plain)


def test_gathered_columns_forward(d, rng, monkeypatch):
    """A GPU's TF32 k x k forward through its gathered columns (the rule
    opened as test_conv_algorithms does) adds the shortcut in the GEMM's
    epilogue, chunk by chunk (room for 5 images of 3 x 3, rounded to 4)."""
    monkeypatch.setattr(conv_ops, "async_tiles", lambda *a: {"ASYNC": 1})
    monkeypatch.setattr(conv_ops, "GATHERED_MIN_M", 1)
    monkeypatch.setattr(conv_ops, "GATHERED_MAX_FLOATS", 5 * 16 * 9 * 9)
    monkeypatch.setattr(d.dev, "compute_units", 1)
    g, x, w, b, r, yshape, want = residual_case(rng, (8, 16, 6, 6, 24, 3, 3, 1, 1, 2, 2))
    assert conv_ops.writes_residual(d.dev, g, "igemm")
    got, fused_names, plain = _run_both(d, g, x, w, b, r, yshape, algo="igemm")
    assert fused_names == ["conv_rows", "gemm"] * 2
    assert rel_err(got, want) < 1e-5
    np.testing.assert_array_equal(got, plain)


def test_paths_without_a_residual(d, rng):
    """Winograd, depthwise and the matrix-vector kernel take none: the rule
    says so and a forward asked for one refuses."""
    g3 = conv_ops.ConvGeometry(1, 8, 6, 6, 8, 3, 3, 1, 1)
    assert not conv_ops.writes_residual(d.dev, g3, "winograd")
    dw = conv_ops.ConvGeometry(1, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8)
    assert not conv_ops.writes_residual(d.dev, dw, "depthwise")
    buf = d.buf(np.zeros(8 * 36))
    with pytest.raises(ValueError, match="residual"):
        conv_ops.forward(d.dev, g3, buf, buf, buf, None, algo="winograd", residual=buf)


def test_residual_pays_wherever_a_path_adds_one(d, monkeypatch):
    """The plan adds shortcuts wherever the convolution's path can: on
    GPUs too, at any output size and through the folded 1x1 GEMM (with the
    shortcut read ahead of the stores these measured 1.0-1.6x against the
    summing pass at batch 1-64, bench_conv_epilogues.py)."""
    g = conv_ops.ConvGeometry(3, 16, 4, 5, 24, 1, 1)
    assert conv_ops.residual_pays(d.dev, g) == conv_ops.writes_residual(d.dev, g)
    monkeypatch.setattr(conv_ops, "async_tiles", lambda *a: {"ASYNC": 1})
    for name in ("GEMM_1X1_MIN_K", "GEMM_1X1_MIN_K_64_ROWS"):
        monkeypatch.setattr(conv_ops, name, 1)
    monkeypatch.setattr(d.dev, "is_cpu", False)
    try:
        assert conv_ops.algorithm(d.dev, g, None, "forward") == "igemm"
        assert conv_ops._igemm_forward_plan(d.dev, g) is not None
        assert conv_ops.residual_pays(d.dev, g)
        big = conv_ops.ConvGeometry(64, 64, 14, 14, 256, 3, 3, 1, 1, 2, 2)   # not Winograd
        assert conv_ops.residual_pays(d.dev, big)
        g3 = conv_ops.ConvGeometry(1, 8, 6, 6, 8, 3, 3, 1, 1)
        with config.override(WINOGRAD=True):
            assert not conv_ops.residual_pays(d.dev, g3)
    finally:
        monkeypatch.setattr(d.dev, "is_cpu", True)
