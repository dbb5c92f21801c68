"""A PReLU in the epilogue of the convolution and matrix-product kernels
(act.h ACT 7, ops.gemm.act_defines ("prelu", channels)): the bias buffer
holds the channels' biases, then their slopes (plan/chain.py builds it).
Every forward path a folded chain may take -- the CPU drivers' kernels
(channel-vector tiles, GEMM, 1x1 rows, first-layer direct, depthwise,
grouped) and the GPU's (implicit GEMM with and without its K split, the
tiled GEMM with per-row and per-column bias, few-outputs 1x1, matrix-
vector, few-rows and split-K products) built on the test device -- against
a float64 reference with negative, zero and positive slopes."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import conv1x1_few
from caffe_ocl.ops.gemm import gemm
from caffe_ocl.ops.gemm_splitk import gemm_launches, gemv, small_m
import refs
from refs import rel_err

# gemm.cl and conv_igemm.cl (the GPU kernels) built unoptimised on CPU drivers
pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")


def _prelu(v, slopes, axis):
    shape = [1] * v.ndim
    shape[axis] = -1
    s = slopes.reshape(shape)
    return np.where(v > 0, v, s * v)


def _conv_ref(x, w, b, g):
    return refs.conv2d(x, w, b, (g.ph, g.pw), (g.sh, g.sw), (g.dh, g.dw), g.groups)


def _slopes(rng, c):
    s = rng.uniform(-0.6, 0.9, c)
    s[0] = 0.0
    return s


G = conv_ops.ConvGeometry
# (geometry, algo, forced variant, residual)
CASES = [
    (G(1, 20, 7, 7, 40, 1, 1), None, "chanvec", False),
    (G(2, 12, 4, 4, 33, 1, 1), None, "chanvec", True),        # residual: per-element path
    (G(1, 8, 9, 9, 24, 3, 3, 1, 1), None, "chanvec", False),
    (G(1, 20, 7, 7, 40, 1, 1), None, "gemm", False),
    (G(1, 9, 10, 10, 30, 3, 3, 1, 1), None, "gemm", True),
    (G(1, 16, 24, 24, 24, 1, 1), None, "pointwise", False),
    (G(1, 3, 20, 20, 16, 3, 3, 1, 1), None, "direct", False),
    (G(1, 3, 48, 160, 16, 3, 3, 1, 1, 2, 2), None, "direct", False),   # conv_direct_rows
    (G(1, 16, 9, 11, 16, 3, 3, 1, 1, groups=16), None, None, False),   # depthwise
    (G(2, 16, 8, 8, 16, 3, 3, 1, 1, 2, 2, groups=4), None, None, False),   # grouped
    (G(1, 24, 6, 6, 20, 3, 3, 1, 1), "igemm", None, False),
    (G(1, 24, 6, 6, 20, 3, 3, 1, 1), "igemm", None, True),
]
IDS = ["chanvec-1x1", "chanvec-residual", "chanvec-3x3", "gemm-1x1", "gemm-3x3-residual",
       "pointwise-rows", "direct", "direct-rows", "depthwise", "grouped", "igemm", "igemm-residual"]


@pytest.mark.parametrize("g,algo,variant,residual", CASES, ids=IDS)
def test_convolution_paths(d, rng, g, algo, variant, residual):
    if variant is not None and d.dev.is_cpu and variant not in conv_ops.cpu_forward_variants(d.dev, g):
        pytest.skip(f"{variant} cannot run {g} here")
    x = rng.standard_normal((g.num, g.channels, g.height, g.width))
    w = rng.standard_normal((g.out_channels, g.channels // g.groups, g.kh, g.kw)) * 0.3
    b, s = rng.standard_normal(g.out_channels), _slopes(rng, g.out_channels)
    yshape = (g.num, g.out_channels, g.out_h, g.out_w)
    r = rng.standard_normal(yshape) if residual else None
    yb = d.buf(np.full(yshape, np.nan))
    col = d.dev.alloc(4 * max(conv_ops.workspace_floats(d.dev, g, algo), 1))
    with conv_ops.forced_forward_variant(variant):
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, col,
                                    bias=d.buf(np.concatenate([b, s])),
                                    act=("prelu", g.out_channels), algo=algo,
                                    residual=d.buf(r) if residual else None,
                                    weight_version=lambda: 1)
    d.run(launches)
    v = _conv_ref(x, w, b, g) + (r if residual else 0.0)
    assert rel_err(d.get(yb, yshape), _prelu(v, s, 1)) < 1e-5


@pytest.mark.parametrize("impl,hw", [("gpu", (9, 11)), ("cpu", (40, 48)), ("cpu", (9, 11))],
                         ids=["gpu", "cpu-band", "cpu-flat"])
def test_depthwise_kernels(d, rng, impl, hw):
    from caffe_ocl.ops import depthwise
    g = G(1, 16, hw[0], hw[1], 16, 3, 3, 1, 1, groups=16)
    x = rng.standard_normal((1, 16) + hw)
    w = rng.standard_normal((16, 1, 3, 3))
    b, s = rng.standard_normal(16), _slopes(rng, 16)
    yshape = (1, 16, g.out_h, g.out_w)
    yb = d.buf(np.full(yshape, np.nan))
    d.run(depthwise.forward(d.dev, g, d.buf(x), d.buf(w), yb, bias=d.buf(np.concatenate([b, s])),
                            act=("prelu", 16), impl=impl))
    assert rel_err(d.get(yb, yshape), _prelu(_conv_ref(x, w, b, g), s, 1)) < 1e-5


def test_grouped_kernel(d, rng):
    """The GPU's grouped-convolution kernel (conv_grouped.cl)."""
    from caffe_ocl.ops import grouped
    g = G(2, 16, 8, 8, 24, 3, 3, 1, 1, groups=4)
    x = rng.standard_normal((2, 16, 8, 8))
    w = rng.standard_normal((24, 4, 3, 3)) * 0.3
    b, s = rng.standard_normal(24), _slopes(rng, 24)
    yb = d.buf(np.full((2, 24, 8, 8), np.nan))
    out = grouped.forward(d.dev, g, d.buf(x), d.buf(w), yb, bias=d.buf(np.concatenate([b, s])),
                          act=("prelu", 24))
    d.run(out if isinstance(out, list) else [out])
    assert rel_err(d.get(yb, (2, 24, 8, 8)), _prelu(_conv_ref(x, w, b, g), s, 1)) < 1e-5


def test_implicit_gemm_split_k(d, rng, monkeypatch):
    """The K split's reduce kernel applies the slopes (conv_splitk_reduce)."""
    monkeypatch.setattr(d.dev, "compute_units", 132)
    g = G(1, 40, 5, 5, 24, 3, 3, 1, 1)
    x = rng.standard_normal((1, 40, 5, 5))
    w = rng.standard_normal((24, 40, 3, 3)) * 0.2
    b, s = rng.standard_normal(24), _slopes(rng, 24)
    yb = d.buf(np.full((1, 24, 5, 5), np.nan))
    with config.override(CONV_SPLITK_MIN_KTILES=1):
        launches = conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, None,
                                    bias=d.buf(np.concatenate([b, s])), act=("prelu", 24),
                                    algo="igemm")
    assert [ln.name for ln in launches] == ["conv_fwd", "conv_splitk_reduce"]
    d.run(launches)
    assert rel_err(d.get(yb, (1, 24, 5, 5)), _prelu(_conv_ref(x, w, b, g), s, 1)) < 1e-5


def test_few_outputs_1x1_kernel(d, rng):
    g = G(1, 48, 7, 7, 20, 1, 1)
    x = rng.standard_normal((1, 48, 7, 7))
    w = rng.standard_normal((20, 48, 1, 1)) * 0.2
    b, s = rng.standard_normal(20), _slopes(rng, 20)
    yb = d.buf(np.full((1, 20, 7, 7), np.nan))
    d.run([conv1x1_few.forward(d.dev, g, d.buf(x), d.buf(w), yb,
                               bias=d.buf(np.concatenate([b, s])), act=("prelu", 20))])
    assert rel_err(d.get(yb, (1, 20, 7, 7)), _prelu(_conv_ref(x, w, b, g), s, 1)) < 1e-5


@pytest.mark.parametrize("impl,bias_axis", [("tiled", 0), ("tiled", 1), ("cpu", 0), ("cpu", 1)])
def test_gemm_epilogue_by_bias_axis(d, rng, impl, bias_axis):
    """The slope follows the bias: per row of C (a convolution's channels)
    or per column (an InnerProduct's outputs), the GPU's tiled GEMM and the
    CPU's."""
    if impl == "cpu" and not d.dev.is_cpu:
        pytest.skip("the CPU GEMM kernel runs on CPU drivers")
    M, N, K = 19, 37, 23
    a, bm = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    nb = M if bias_axis == 0 else N
    b, s = rng.standard_normal(nb), _slopes(rng, nb)
    cb = d.buf(np.full((M, N), np.nan))
    d.run([gemm(d.dev, M, N, K, d.buf(a), d.buf(bm), cb, trans_b=True,
                bias=d.buf(np.concatenate([b, s])), bias_axis=bias_axis,
                act=("prelu", nb), impl=impl)])
    v = a @ bm.T + (b[:, None] if bias_axis == 0 else b[None, :])
    assert rel_err(d.get(cb, (M, N)), _prelu(v, s, bias_axis)) < 1e-5


@pytest.mark.parametrize("kind", ["gemv", "small_m", "splitk"])
def test_inner_product_kernels(d, rng, kind):
    """An InnerProduct's output y[M, N] = x W^T + b, PReLU per output n."""
    M, N, K = 2, 40, 256
    x, wt = rng.standard_normal((M, K)), rng.standard_normal((N, K)) * 0.1
    b, s = rng.standard_normal(N), _slopes(rng, N)
    cb = d.buf(np.full((M, N), np.nan))
    args = (d.dev, M, N, K, d.buf(x), d.buf(wt), cb)
    kw = dict(bias=d.buf(np.concatenate([b, s])), bias_axis=1, act=("prelu", N))
    if kind == "gemv":
        launches = [gemv(*args, **kw)]
    elif kind == "small_m":
        launches = [small_m(*args, **kw)]
    else:
        launches = gemm_launches(*args, trans_b=True, nsplit=4, **kw)
        assert len(launches) == 2
    d.run(launches)
    assert rel_err(d.get(cb, (M, N)), _prelu(x @ wt.T + b, s, 1)) < 1e-5


def test_unknown_prelu_spec_is_refused():
    from caffe_ocl.ops.gemm import act_defines
    assert act_defines(("prelu", 64)) == (7, 64.0, 0.0)
    for bad in [("prelu",), ("prelu", 0), ("prelu", 1 << 24)]:
        with pytest.raises(ValueError):
            act_defines(bad)
