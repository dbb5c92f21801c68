"""1x1 convolutions of small planes vectorized over output channels on CPU
drivers (kernels/conv_chanvec.cl, ops.conv.chanvec_forward): against a
float64 reference at both vector widths and with conv_chanvec_kb's
channel blocks (CPU_CHANVEC_KBLOCK: 6-pixel tiles at VW 8, 8-pixel ones at
VW 16, CPU_CHANVEC_TILE8) -- channels past whole panels, planes not a multiple
of the tile and split into pixel chunks, channel counts not a multiple of
the block, two images, a Concat slice, a residual, bias and activations
-- the weights packed again only when their version changes, and the
rule's choice."""
from dataclasses import replace

import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from refs import rel_err


@pytest.fixture(autouse=True)
def _cpu_only(d):
    if not d.dev.is_cpu:
        pytest.skip("a CPU-driver path")


# (CPU_GEMM_VW, CPU_CHANVEC_TILE8, CPU_CHANVEC_KBLOCK): the 6-pixel kernel
# at both widths (VW 8: blocks past any layer's channels, one block), and
# conv_chanvec_kb on 1x1 layers with channel blocks of 4 (most cases:
# several blocks, the last one partial) -- 6-pixel tiles at VW 8, 8-pixel
# ones at VW 16
@pytest.fixture(params=[("8", False, 1 << 20), ("8", False, 4), ("16", False, 4),
                        ("16", True, 4)],
                ids=["vw8", "vw8-blocks", "vw16", "vw16-tile8"])
def vw(request, settings, monkeypatch):
    width, tile8, kblock = request.param
    settings(CPU_GEMM_VW=width, CPU_CHANVEC=True, CPU_CHANVEC_TILE8=tile8,
             CPU_CHANVEC_KBLOCK=kblock)
    monkeypatch.setattr(conv_ops, "CHANVEC8_MIN_PIXELS", 0)    # small planes too
    monkeypatch.setattr(conv_ops, "CHANVEC_KBLOCK_MAX_PIXELS", 1 << 20)    # and larger ones
    return int(width), tile8, kblock


def _kernel_name(vw, g):
    width, tile8, kblock = vw
    if g.kh == g.kw == 1 and (tile8 if width == 16 else kblock < g.channels // g.groups):
        return "conv_chanvec_kb"
    return "conv_chanvec"


def _geo(num, c, hw, co, k=1, pad=0, stride=1, dil=1, groups=1):
    return conv_ops.ConvGeometry(num, c, hw[0], hw[1], co, k, k, pad, pad, stride, stride,
                                 dil, dil, groups)


ACTS = {None: lambda v: v, ("relu", 0.1): lambda v: np.where(v > 0, v, 0.1 * v),
        ("relu", 0.0): lambda v: np.maximum(v, 0.0),
        ("swish", 1.0): lambda v: v / (1.0 + np.exp(-v)),
        ("clip", -1.0, 2.0): lambda v: np.clip(v, -1.0, 2.0)}


# (num, channels, (h, w), out channels, bias, act, residual, slice, (k, pad, stride, dil))
ONE = (1, 0, 1, 1)
CASES = [
    (1, 20, (7, 7), 40, True, ("relu", 0.1), False, False, ONE),     # 40: a partial panel
    (2, 9, (5, 3), 33, False, None, False, False, ONE),              # 15 pixels: a 3-pixel tile
    (1, 130, (11, 13), 16, True, ("clip", -1.0, 2.0), False, False, ONE),   # 143 pixels
    (2, 12, (4, 4), 70, True, ("relu", 0.0), True, False, ONE),      # residual
    (1, 8, (6, 7), 24, True, None, False, True, ONE),                # into a Concat slice
    (2, 5, (7, 6), 40, True, ("relu", 0.1), False, False, (3, 1, 1, 1)),    # padded 3 x 3
    (1, 4, (9, 11), 20, True, None, True, False, (3, 1, 2, 1)),      # stride 2 + residual
    (1, 3, (8, 8), 36, False, ("clip", -1.0, 2.0), False, True, (5, 2, 1, 1)),   # 5 x 5 slice
    (1, 6, (9, 9), 17, True, None, False, False, (3, 0, 1, 2)),      # dilated, unpadded
    (2, 7, (10, 10), 12, True, None, False, False, (1, 0, 2, 1)),    # strided 1x1
    (1, 10, (7, 7), 50, True, ("swish", 1.0), False, False, ONE),    # swish on the vectors
    # planes past CHANVEC_KXK_MAX_PIXELS (the batch-1 rule): 30 x 31 3 x 3,
    # a first layer's 7 x 7 stride 2 onto 32 x 32
    (1, 8, (30, 31), 12, True, ("relu", 0.0), False, False, (3, 1, 1, 1)),
    (2, 3, (64, 64), 20, True, None, False, False, (7, 3, 2, 1)),
]


def _reference(x, w, b, k, pad, stride, dil, groups=1):
    if groups > 1:      # each group's slice of x and w alone, outputs stacked
        cg, mg = x.shape[1] // groups, w.shape[0] // groups
        out = np.concatenate([_reference(x[:, i * cg:(i + 1) * cg], w[i * mg:(i + 1) * mg],
                                         None, k, pad, stride, dil) for i in range(groups)],
                             axis=1)
        return out + (b.reshape(1, -1, 1, 1) if b is not None else 0.0)
    n, c, h, wd = x.shape
    co = w.shape[0]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    wo = (wd + 2 * pad - dil * (k - 1) - 1) // stride + 1
    out = np.zeros((n, co, ho, wo))
    for kh in range(k):
        for kw in range(k):
            win = xp[:, :, kh * dil:kh * dil + stride * (ho - 1) + 1:stride,
                     kw * dil:kw * dil + stride * (wo - 1) + 1:stride]
            out += np.einsum("oc,nchw->nohw", w[:, :, kh, kw], win)
    if b is not None:
        out += b.reshape(1, co, 1, 1)
    return out


def _pairs(d, g):
    return conv_ops._chanvec_group_pairs(d.dev, g, conv_ops._chanvec_kblocks(d.dev, g))


def _check(d, rng, case, kernel):
    num, c, hw, co, has_bias, act, has_res, sliced, (k, pad, stride, dil), *grp = case
    groups = grp[0] if grp else 1
    g = _geo(num, c, hw, co, k, pad, stride, dil, groups)
    assert conv_ops.chanvec_forward(d.dev, g)
    x = rng.standard_normal((num, c) + hw)
    w = rng.standard_normal((co, c // groups, k, k))
    b = rng.standard_normal(co) if has_bias else None
    ref = _reference(x, w, b, k, pad, stride, dil, groups)
    res = rng.standard_normal(ref.shape) if has_res else None
    if has_res:
        ref = ref + res
    ref = ACTS[act](ref)
    ohw = (g.out_h, g.out_w)
    pre, ych = (3, co + 5) if sliced else (0, co)
    yshape = (num, ych) + ohw
    yb = d.buf(np.full(yshape, np.nan))
    col = d.buf(np.zeros(max(conv_ops.workspace_floats(d.dev, g, "im2col"), 1)))
    launches = conv_ops.forward(
        d.dev, g, d.buf(x), d.buf(w), yb, col, bias=d.buf(b) if has_bias else None, act=act,
        y_off=pre * ohw[0] * ohw[1], y_channels=ych, weight_version=lambda: 1,
        residual=d.buf(res) if has_res else None)
    names = [ln.name for ln in launches]
    assert names[0] == "pack_w_chanvec" and names[-1] == kernel(g)
    # groups of at most VW channels two a panel (GPAIR), else each group
    # its own panels
    pairs = _pairs(d, g)
    nr, mg = 2 * conv_ops.cpu_vw(d.dev), co // groups
    assert launches[-1].gsize[0] == (-(-groups // 2) if pairs else groups * -(-mg // nr))
    # grouped padded layers pad their rows inside the kernel (LPAD_FLOATS)
    local_pad = conv_ops._chanvec_local_pad(d.dev, g, 6, 1, 2 if pairs else 1) is not None
    assert not local_pad or (groups > 1 and pad and conv_ops.CHANVEC_LOCAL_PAD)
    assert ("pad_planes" in names) == bool(pad and not local_pad)
    d.run(launches)
    got = d.get(yb, yshape)
    assert rel_err(got[:, pre:pre + co], ref) < 1e-5
    if sliced:      # the channels around the slice untouched
        assert np.isnan(got[:, :pre]).all() and np.isnan(got[:, pre + co:]).all()
    return launches


@pytest.mark.parametrize("case", CASES, ids=["partial-panel", "two-images", "chunks",
                                             "residual", "slice", "3x3", "3x3-stride2",
                                             "5x5-slice", "dilated", "1x1-stride2", "swish",
                                             "large-plane", "large-7x7-stride2"])
def test_chanvec_equals_reference(d, rng, vw, monkeypatch, case):
    monkeypatch.setattr(d.dev, "compute_units", 2)
    monkeypatch.setattr(conv_ops, "CHANVEC_KXK_MAX_PIXELS", 1 << 20)    # large planes at VW 16
    _check(d, rng, case, lambda g: _kernel_name(vw, g))


# grouped convolutions (case as CASES, then the groups): each group's
# output channels fill panels of their own -- 16 per group (RegNet's
# width: one whole panel at VW 8, half of one at VW 16), 12 (a partial
# panel in every group), 40 (two panels a group at VW 8, the second
# partial), 8, 4, 2 (the narrowest the rule takes; tiles across output
# rows of 6 and 17 pixels); 3 x 3 padded and strided, dilated, a
# residual, a Concat slice, two images
GROUPED = [
    (1, 64, (7, 7), 64, True, ("relu", 0.0), False, False, (3, 1, 1, 1), 4),
    (2, 30, (6, 5), 36, True, ("relu", 0.1), True, False, (3, 1, 2, 1), 3),
    (1, 40, (9, 9), 80, False, ("clip", -1.0, 2.0), False, True, (3, 1, 1, 1), 2),
    (1, 24, (8, 8), 24, True, None, False, False, (3, 0, 1, 2), 3),
    (1, 32, (7, 7), 16, True, ("relu", 0.0), False, False, (3, 1, 1, 1), 8),
    (2, 48, (5, 5), 32, True, ("swish", 1.0), True, False, ONE, 4),
    (2, 32, (9, 11), 16, True, ("swish", 1.0), False, True, (3, 1, 2, 1), 4),
    (1, 12, (13, 17), 12, False, ("relu", 0.0), True, False, (3, 1, 1, 1), 3),
]


@pytest.mark.parametrize("case", GROUPED, ids=["groups16-3x3", "groups12-stride2-residual",
                                               "groups40-slice", "groups8-dilated",
                                               "groups2",
                                               "groups8-1x1-residual",
                                               "groups4-stride2-slice",
                                               "groups4-rows17-residual"])
@pytest.mark.parametrize("local_pad", [True, False], ids=["local-pad", "pad-planes"])
@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "group-a-panel"])
def test_grouped_chanvec_equals_reference(d, rng, vw, settings, monkeypatch, case, local_pad,
                                          pairs):
    """Groups of at most VW channels run two a panel (GPAIR) unless the
    setting is off: odd group counts leave the last panel one group."""
    settings(CPU_CHANVEC_GROUPS=True, CPU_CHANVEC_GROUP_PAIRS=pairs)
    monkeypatch.setattr(conv_ops, "CHANVEC_LOCAL_PAD", local_pad)
    monkeypatch.setattr(conv_ops, "CHANVEC_GROUPED_1X1", True)   # the 1x1 case: the rule's off
    monkeypatch.setattr(d.dev, "compute_units", 2)
    _check(d, rng, case, lambda g: _kernel_name(vw, g))


@pytest.mark.parametrize("groups", [1, 2])
def test_padded_copies_in_chunks(d, rng, vw, settings, monkeypatch, groups):
    """Images padded in several chunks (a copy of the whole batch would
    pass MAX_COL_FLOATS): each chunk's convolution reads its own images,
    though every chunk's copy lands at the start of the same workspace."""
    settings(CPU_CHANVEC_GROUPS=True)
    monkeypatch.setattr(conv_ops, "CHANVEC_LOCAL_PAD", False)
    monkeypatch.setattr(d.dev, "compute_units", 2)
    monkeypatch.setattr(conv_ops, "MAX_COL_FLOATS", 2 * 16 * 9 * 9)   # 2 images a chunk
    case = (5, 16, (7, 7), 32, True, ("relu", 0.0), True, False, (3, 1, 1, 1), groups)
    names = [ln.name for ln in _check(d, rng, case, lambda g: _kernel_name(vw, g))]
    assert names.count("pad_planes") == 3
    assert names[1:] == ["pad_planes", _kernel_name(vw, _geo(5, 16, (7, 7), 32, 3, 1, 1, 1,
                                                             groups))] * 3


# conv_chanvec_kb's 8-pixel tiles at VW 16 only: (case as CASES,
# CPU_CHANVEC_KBLOCK, local memory or None); larger kernels with
# CHANVEC8_KXK_MIN_ROW at 16 (the rule leaves them to conv_chanvec on the
# machine measured, the kernel takes them)
CASES8 = [
    # 63 pixels (7 full tiles and one of 7), 40 channels in blocks of 16 + 16 + 8
    ((1, 40, (7, 9), 40, True, ("relu", 0.1), False, False, ONE), 16, None),
    # blocks of 3 over 7 channels, two images, a residual; into a Concat slice
    ((2, 7, (5, 5), 33, True, ("clip", -1.0, 2.0), True, False, ONE), 3, None),
    ((2, 7, (5, 5), 33, True, ("clip", -1.0, 2.0), False, True, ONE), 3, None),
    # 143 pixels in 9 chunks of 16 (the last of 15), 10 blocks of 13 channels
    ((1, 130, (11, 13), 16, True, None, False, False, ONE), 13, None),
    # one block (0)
    ((1, 24, (6, 6), 64, False, ("relu", 0.0), False, False, ONE), 0, None),
    # chunks capped by local memory: 2 KiB -> 8 pixels, 64 pixels in 8 chunks
    ((1, 9, (8, 8), 70, True, None, True, False, ONE), 4, 2048),
    # 3 x 3 on rows of 18 pixels (90, 11 tiles and a 2-pixel one), padded: one block
    ((1, 6, (5, 18), 36, True, ("relu", 0.1), False, False, (3, 1, 1, 1)), 4, None),
    # 3 x 3 stride 2 onto 4 x 16 with a residual, unpadded 5 x 5 dilated 2
    # onto 4 x 16 into a slice
    ((2, 5, (9, 33), 20, True, ("swish", 1.0), True, False, (3, 0, 2, 1)), 4, None),
    ((1, 3, (12, 24), 40, False, None, False, True, (5, 0, 1, 2)), 4, None),
]


@pytest.mark.parametrize("case,kblock,local", CASES8,
                         ids=["tails", "blocks-residual", "blocks-slice", "chunks", "one-block",
                              "pixmax", "3x3-rows18", "3x3-stride2", "5x5-dilated"])
def test_chanvec_kb8_equals_reference(d, rng, settings, monkeypatch, case, kblock, local):
    settings(CPU_GEMM_VW="16", CPU_CHANVEC=True, CPU_CHANVEC_TILE8=True,
             CPU_CHANVEC_KBLOCK=kblock)
    monkeypatch.setattr(d.dev, "compute_units", 2)
    monkeypatch.setattr(conv_ops, "CHANVEC8_KXK_MIN_ROW", 16)
    monkeypatch.setattr(conv_ops, "CHANVEC8_MIN_PIXELS", 0)
    if local is not None:
        monkeypatch.setattr(d.dev, "local_mem", local)
    launches = _check(d, rng, case, lambda g: "conv_chanvec_kb")
    if local is not None:       # 8 chunks of 8 pixels, not 4 of 16 (4 work-items a core)
        assert launches[-1].gsize[1] == 8


def test_weights_packed_again_only_after_a_change(d, rng, vw):
    g = _geo(1, 6, (7, 7), 20)
    x = rng.standard_normal((1, 6, 7, 7))
    w1, w2 = rng.standard_normal((2, 20, 6, 1, 1))
    wb, yb = d.buf(w1), d.buf(np.zeros((1, 20, 7, 7)))
    version = [0]
    launches = conv_ops.forward(d.dev, g, d.buf(x), wb, yb, None,
                                weight_version=lambda: version[0])
    d.run(launches)
    assert rel_err(d.get(yb, (1, 20, 7, 7)), np.einsum("oc,nchw->nohw", w1[:, :, 0, 0], x)) < 1e-5
    d.dev.upload(wb, w2.astype(np.float32))
    d.run(launches)        # same version: the old packed weights
    assert rel_err(d.get(yb, (1, 20, 7, 7)), np.einsum("oc,nchw->nohw", w1[:, :, 0, 0], x)) < 1e-5
    version[0] = 1
    d.run(launches)
    assert rel_err(d.get(yb, (1, 20, 7, 7)), np.einsum("oc,nchw->nohw", w2[:, :, 0, 0], x)) < 1e-5


def test_rule(d, settings):
    """1x1 kernels: 7 x 7 planes always, 14 x 14 from 128 input channels;
    larger kernels up to 28 x 28 planes, on larger ones at batch 1-2 (VW
    8); grouped convolutions of at least 2
    output channels a group with kernels larger than 1x1 (CHANVEC_MIN_GROUP_OUT,
    CPU_CHANVEC_GROUPS), on any plane; not larger planes, 1 x 1 planes,
    grouped 1x1 layers, narrower groups, explicit algorithms, or with the
    settings off."""
    settings(CPU_CHANVEC=True, CPU_CHANVEC_GROUPS=True)
    G = conv_ops.ConvGeometry
    ok = conv_ops.chanvec_forward
    assert ok(d.dev, _geo(1, 16, (7, 7), 64))
    assert ok(d.dev, _geo(4, 16, (7, 7), 64))
    assert ok(d.dev, _geo(1, 128, (14, 14), 64))
    assert ok(d.dev, G(1, 256, 14, 14, 512, 1, 1, 0, 0, 2, 2, 1, 1, 1))      # 7 x 7 output
    # strided onto 14 x 14: the GEMM at VW 8 (CHANVEC_STRIDED_VW8), chanvec at VW 16
    strided = G(1, 512, 28, 28, 1024, 1, 1, 0, 0, 2, 2, 1, 1, 1)
    with config.override(CPU_GEMM_VW="8"):
        assert not ok(d.dev, strided)
        assert ok(d.dev, _geo(1, 512, (14, 14), 1024))
    with config.override(CPU_GEMM_VW="16"):
        assert ok(d.dev, strided)
    assert ok(d.dev, _geo(1, 128, (28, 28), 32, 3, 1))
    assert ok(d.dev, _geo(1, 512, (7, 7), 512, 3, 1))
    assert not ok(d.dev, _geo(1, 96, (14, 14), 576))
    assert not ok(d.dev, _geo(1, 512, (28, 28), 64))
    assert not ok(d.dev, _geo(1, 512, (1, 1), 64))
    # k x k layers on larger planes: at VW 8 at up to
    # CHANVEC_KXK_ANY_PLANE_MAX_IMAGES (2) images; deterministic mode
    # chooses as for one image at every batch; VW 16 keeps the GEMM
    large, first = _geo(1, 128, (56, 56), 32, 3, 1), _geo(1, 3, (224, 224), 64, 7, 3, 2)
    with config.override(CPU_GEMM_VW="8"):
        assert ok(d.dev, large) and ok(d.dev, first)
        assert ok(d.dev, replace(large, num=2))
        assert not ok(d.dev, replace(large, num=3)) and not ok(d.dev, replace(first, num=16))
        with config.override(DETERMINISTIC=True):
            assert ok(d.dev, replace(first, num=16))
    with config.override(CPU_GEMM_VW="16"):
        assert not ok(d.dev, large) and not ok(d.dev, first)
    assert not ok(d.dev, G(1, 64, 7, 7, 64, 1, 1, 0, 0, 1, 1, 1, 1, 2))     # grouped 1x1
    assert ok(d.dev, G(1, 400, 7, 7, 400, 3, 3, 1, 1, 1, 1, 1, 1, 25))     # RegNet
    assert ok(d.dev, G(1, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1, 1, 1, 32))   # 8 a group
    assert ok(d.dev, G(1, 128, 14, 14, 128, 3, 3, 1, 1, 1, 1, 1, 1, 32))   # 4 a group
    assert not ok(d.dev, G(1, 64, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1, 1, 32))  # 1 a group
    assert ok(d.dev, G(1, 128, 56, 56, 128, 3, 3, 1, 1, 1, 1, 1, 1, 8))   # any plane
    settings(CPU_CHANVEC_GROUPS=False)
    assert not ok(d.dev, G(1, 400, 7, 7, 400, 3, 3, 1, 1, 1, 1, 1, 1, 25))
    assert ok(d.dev, _geo(1, 16, (7, 7), 64))
    assert not ok(d.dev, _geo(1, 16, (7, 7), 64), algo="im2col")
    settings(CPU_CHANVEC=False)
    assert not ok(d.dev, _geo(1, 16, (7, 7), 64))


def test_kblocks_rule(d, settings, monkeypatch):
    """conv_chanvec_kb: at VW 16 with CPU_CHANVEC_TILE8, 8-pixel tiles for 1x1
    kernels on planes of at least 100 pixels or with at least 1024 input
    channels (blocks of CPU_CHANVEC_KBLOCK channels, 0: one block); larger
    ones only on output rows of at least CHANVEC8_KXK_MIN_ROW pixels (None:
    never). At VW 8, 6-pixel tiles for 1x1 kernels onto planes of at most
    CHANVEC_KBLOCK_MAX_PIXELS whose (group's) input channels fill more than
    one block of CHANVEC_KBLOCK_VW8 (or the setting's number); larger
    kernels and planes never."""
    kb = conv_ops._chanvec_kblocks
    settings(CPU_GEMM_VW="16", CPU_CHANVEC_TILE8=True, CPU_CHANVEC_KBLOCK=0)
    assert kb(d.dev, _geo(1, 1024, (14, 14), 256)) == (8, 1024)
    assert kb(d.dev, _geo(1, 2048, (7, 7), 512)) == (8, 2048)
    assert kb(d.dev, _geo(1, 1024, (14, 14), 2048, 1, 0, 2)) == (8, 1024)    # to 7 x 7
    assert kb(d.dev, _geo(1, 960, (7, 7), 160)) is None
    assert kb(d.dev, _geo(1, 256, (14, 14), 512, 1, 0, 2)) is None
    assert kb(d.dev, _geo(1, 128, (28, 28), 32, 3, 1)) is None
    settings(CPU_CHANVEC_KBLOCK=128)
    assert kb(d.dev, _geo(1, 1024, (14, 14), 256)) == (8, 128)
    monkeypatch.setattr(conv_ops, "CHANVEC8_KXK_MIN_ROW", 16)
    assert kb(d.dev, _geo(1, 128, (28, 28), 32, 3, 1)) == (8, 128)
    assert kb(d.dev, _geo(1, 128, (14, 14), 32, 3, 1)) is None
    settings(CPU_GEMM_VW="16", CPU_CHANVEC_TILE8=False)
    assert kb(d.dev, _geo(1, 1024, (14, 14), 256)) is None
    settings(CPU_GEMM_VW="8", CPU_CHANVEC_KBLOCK=0)
    block = conv_ops.CHANVEC_KBLOCK_VW8
    assert kb(d.dev, _geo(1, block + 1, (7, 7), 256)) == (6, block)
    assert kb(d.dev, _geo(1, 2048, (7, 7), 512)) == (6, block)
    assert kb(d.dev, _geo(1, 2048, (8, 8), 384)) == (6, block)
    assert kb(d.dev, _geo(1, 1024, (14, 14), 2048, 1, 0, 2)) == (6, block)   # to 7 x 7
    assert kb(d.dev, _geo(1, 1024, (14, 14), 256)) is None         # a larger plane
    assert kb(d.dev, _geo(1, block, (7, 7), 512)) is None          # one block
    assert kb(d.dev, _geo(1, 1024, (7, 7), 512, 3, 1)) is None
    assert kb(d.dev, conv_ops.ConvGeometry(1, 4 * block, 7, 7, 64, 1, 1, 0, 0, 1, 1, 1, 1, 4)
              ) is None                                             # a group's channels
    settings(CPU_CHANVEC_KBLOCK=64)
    assert kb(d.dev, _geo(1, 96, (7, 7), 512)) == (6, 64)



class _Cores:
    def __init__(self, n):
        self.compute_units = n


def test_chunk_pixels_rule():
    """chanvec_chunk_pixels: chunks of the plane (multiples of the tile)
    halved until 4 work-items per core; below 8 per core, more chunks until
    the cores share the work-items evenly (at most twice as many chunks);
    never past pixmax."""
    f = conv_ops.chanvec_chunk_pixels
    two = _Cores(2)
    assert f(two, 196, 6, 1 << 30, 13) == 102             # 13 -> 26 items
    assert f(two, 196, 6, 1 << 30, 26) == 198             # even already
    assert f(two, 3136, 6, 1 << 30, 6) == 1572            # 6 -> 12 by halving
    assert f(two, 49, 6, 64, 55) == 54                    # 55 items: 8 per core already
    assert f(two, 49, 6, 54, 5) == 30                     # 5 -> 10: halved (4 per core)
    assert f(_Cores(3), 196, 6, 1 << 30, 7) == 66         # 7 x 2 -> 7 x 3 chunks
    assert f(_Cores(3), 196, 6, 1 << 30, 13) == 198       # 13 x 2 not even either
    assert f(two, 6, 6, 1 << 30, 3) == 6                  # one tile: cannot split
    for cores, n, mr, items in ((2, 196, 6, 7), (4, 784, 8, 5), (2, 49, 6, 1)):
        p = f(_Cores(cores), n, mr, 1 << 30, items)
        assert p % mr == 0 and p >= mr


@pytest.mark.parametrize("budget", [None, 6 * 1024, 200], ids=["whole-planes", "row-chunks",
                                                              "too-small"])
def test_grouped_local_pad_chunks(d, rng, vw, settings, monkeypatch, budget):
    """_chanvec_local_pad: chunks of pixels halved until one chunk's padded
    rows (of a group's channels) fit the budget -- work-items whose rows
    start mid-plane and overlap their neighbours' -- or, where not even
    CHANVEC_LPAD_MIN_PIXELS do, pad_planes as before."""
    settings(CPU_CHANVEC_GROUPS=True)
    monkeypatch.setattr(d.dev, "compute_units", 2)
    monkeypatch.setattr(conv_ops, "CHANVEC_LPAD_MIN_PIXELS", 6)
    if budget is not None:
        monkeypatch.setattr(conv_ops, "CHANVEC_LPAD_MAX_BYTES", budget)
    case = (2, 16, (12, 13), 16, True, ("relu", 0.0), True, False, (3, 1, 1, 1), 2)
    g = _geo(2, 16, (12, 13), 16, 3, 1, 1, 1, 2)
    panels, pair = (1, 2) if _pairs(d, g) else (2, 1)     # groups of 8: two a panel at VW 8
    lp = conv_ops._chanvec_local_pad(d.dev, g, 6, panels, pair)
    if budget == 200:
        assert lp is None
    else:
        assert lp is not None and lp[1] * 4 <= (budget or conv_ops.CHANVEC_LPAD_MAX_BYTES)
        unbound = conv_ops.chanvec_chunk_pixels(d.dev, g.out_spatial, 6, 1 << 30,
                                                panels * g.num)
        assert (lp[0] < unbound) == (budget is not None)
    names = [ln.name for ln in _check(d, rng, case, lambda g: _kernel_name(vw, g))]
    assert ("pad_planes" in names) == (budget == 200)


@pytest.mark.parametrize("case", [(1, 20, (7, 7), 40, True, ("relu", 0.0), False, 0),
                                  (2, 12, (4, 4), 70, True, ("swish", 1.0), True, 12),
                                  (2, 9, (5, 3), 33, False, None, False, 0)],
                         ids=["one-gate", "gate-per-image-residual", "two-images-one-gate"])
def test_gated_chanvec_equals_reference(d, rng, vw, monkeypatch, case):
    """GATE: x's channels scaled by an SE gate (one for the batch, or one
    per image: gate_stride) as the kernels load each channel's weights --
    the plain kernel and conv_chanvec_kb's channel blocks."""
    num, c, hw, co, has_bias, act, has_res, stride = case
    monkeypatch.setattr(d.dev, "compute_units", 2)
    g = _geo(num, c, hw, co)
    assert conv_ops.takes_gate(d.dev, g) and conv_ops.chanvec_takes_gate(d.dev, g)
    x = rng.standard_normal((num, c) + hw)
    w = rng.standard_normal((co, c, 1, 1))
    b = rng.standard_normal(co) if has_bias else None
    gate = rng.uniform(0.0, 1.0, (num if stride else 1, c))
    ref = _reference(x * gate.reshape(-1, c, 1, 1), w, b, 1, 0, 1, 1)
    res = rng.standard_normal(ref.shape) if has_res else None
    ref = ACTS[act](ref + (res if has_res else 0.0))
    yshape = (num, co) + hw
    yb = d.buf(np.full(yshape, np.nan))
    launches = conv_ops.forward(
        d.dev, g, d.buf(x), d.buf(w), yb, d.buf(np.zeros(1)), bias=d.buf(b) if has_bias else None,
        act=act, weight_version=lambda: 1, residual=d.buf(res) if has_res else None,
        gate=d.buf(gate), gate_stride=stride)
    assert [ln.name for ln in launches] == ["pack_w_chanvec", _kernel_name(vw, g)]
    d.run(launches)
    assert rel_err(d.get(yb, yshape), ref) < 1e-5
    with pytest.raises(ValueError, match="weight_version"):
        conv_ops.forward(d.dev, g, d.buf(x), d.buf(w), yb, d.buf(np.zeros(1)),
                         gate=d.buf(gate), gate_stride=stride)
