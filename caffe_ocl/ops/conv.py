"""2-D convolution primitives, and their adjoints, by two algorithms:

- "igemm" (GPUs): implicit GEMM (kernels/conv_igemm.cl), the im2col folded
  into the tile loads, images folded into the GEMM dimensions: one launch
  per forward / backward-data, one or two (split-K + reduce) per
  backward-weight, whatever the batch; no column workspace.
- "im2col" (CPU drivers, where it measured faster): one GEMM (gemm_cpu.cl)
  per chunk of images, the images folded into the GEMM's N (forward,
  backward-data) or K (backward-weight) dimension so that small feature
  maps still make big GEMMs. Forward and backward-weight on CPU drivers
  pack their columns straight from a zero-padded copy of the images (no
  column buffer, see ``CPU_PACKED_COLUMNS``); backward-data (and GPUs
  asked for im2col) goes through a ``col`` workspace; 1x1 stride-1 is a
  plain GEMM on the image.
- "depthwise" (every device, chosen automatically when groups == channels
  == out_channels and the kernel is not 1x1): direct kernels of
  ops/depthwise.py (kernels/depthwise.cl); asking for it on another
  geometry gives the device's default.
- "winograd" (3x3 or 5x5, stride 1, dilation 1, one group or groups of
  >= 4 channels): F(4x4, 3x3) (or F(2x2, 3x3)) and F(2x2, 5x5) of
  ops/winograd.py for forward, backward-data and
  backward-weight (CAFFE_OCL_WINOGRAD_BWD_WEIGHT=0: the device's dense path
  for the weight gradient); chosen automatically, on GPUs and CPUs, where
  its cost model says it pays (env CAFFE_OCL_WINOGRAD=0/1 forces off/on);
  asking for it on another geometry raises ValueError.

A convolution is described by ``ConvGeometry`` (one image side, one column
side). Forward of Convolution and backward-data of Deconvolution are the
same computation, and so are the reverse pair; layers pick which side is
their bottom. ``col`` workspaces (``workspace_floats``) hold ``chunk``
images at a time so memory stays bounded whatever the batch size.
Every function takes ``algo=None`` (by device, see ``algorithm``).
"""
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, replace

from .. import config
from ..device import Launch
from . import cpu_chunks, cpu_work_items, tuned, work_size
from . import conv1x1_few
from . import conv_taps
from . import depthwise as dw_ops
from . import grouped as grouped_ops
from . import winograd as wino_ops
from . import pointwise
from .channel import channel_sum
from .gemm import (STAGED_MAX_K, act_defines, async_tiles, cpu_blocks, cpu_full_blocks, cpu_nr,
                   cpu_panels, cpu_vw, deterministic, gemm, gpu_tiles, pack_a, pack_b_conv,
                   packed_a_floats, packed_b_floats, use_tf32)
from .gemm_splitk import gemv, small_m, use_gemv, use_small_m

log = logging.getLogger("caffe_ocl")

ALGOS = ("im2col", "igemm", "depthwise", "winograd")
IGEMM_SRC = "conv_igemm.cl"
# Most floats of split-K partial sums (backward-weight) kept per device.
MAX_SPLITK_FLOATS = 1 << 25

SRC = "im2col.cl"
# Largest column workspace (floats) a layer keeps; bigger batches are
# processed in chunks of images.
MAX_COL_FLOATS = 1 << 23

# CPU drivers: forward and backward-weight GEMMs pack their columns from
# the (zero-padded) images themselves (gemm_cpu.cl CONV_B) instead of
# reading an im2col buffer: CIFAR-10 quick batch 100 wrote and re-read
# ~270 MB of columns per training step (im2col 34 of 190 ms). Setting
# CPU_PACKED_COLUMNS off: im2col as on GPUs (tests and A/B timing; read when
# launches are built).
# ... except for strided 1x1 kernels (False; True: packed too, for A/B)
CPU_PACK_STRIDED_1X1 = False


@dataclass(frozen=True)
class ConvGeometry:
    num: int          # images
    channels: int     # C of the image side (input of a Convolution)
    height: int
    width: int
    out_channels: int  # channels of the column side (output of a Convolution)
    kh: int
    kw: int
    ph: int = 0
    pw: int = 0
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    groups: int = 1

    @property
    def out_h(self):
        return (self.height + 2 * self.ph - ((self.kh - 1) * self.dh + 1)) // self.sh + 1

    @property
    def out_w(self):
        return (self.width + 2 * self.pw - ((self.kw - 1) * self.dw + 1)) // self.sw + 1

    @property
    def col_rows(self):            # C * KH * KW (all groups)
        return self.channels * self.kh * self.kw

    @property
    def out_spatial(self):
        return self.out_h * self.out_w

    @property
    def is_1x1(self):
        return (self.kh == 1 and self.kw == 1 and self.ph == 0 and self.pw == 0
                and self.sh == 1 and self.sw == 1)

    @property
    def chunk(self):
        per = max(self.col_rows * self.out_spatial, 1)
        return max(1, min(self.num, MAX_COL_FLOATS // per))

    def col_floats(self):
        return 0 if self.is_1x1 else self.chunk * self.col_rows * self.out_spatial

    def chunks(self):
        c = self.chunk
        for n0 in range(0, self.num, c):
            yield n0, min(c, self.num - n0)


def algorithm(dev, g, algo=None, pass_=None):
    """The convolution algorithm used for ``g`` on ``dev``: ``algo`` when
    asked for; else, for a ``pass_`` ("forward", "backward_data",
    "backward_weight") that ``caffe_ocl tune`` measured for this geometry on
    this device, its stored choice (ops/tuned.py; not while
    CAFFE_OCL_WINOGRAD forces Winograd on or off); else the rules below.
    In deterministic mode (gemm.deterministic) no tuned choice (they are
    stored per batch size) and the rules see one image's geometry, so the
    algorithm is the same at every batch size."""
    if algo is not None and algo not in ALGOS:
        raise ValueError(f"convolution algorithm {algo!r}: expected one of {ALGOS}")
    det = deterministic()
    if algo is None and pass_ is not None and wino_ops.env_override() is None and not det:
        algo = _tuned_choice(dev, g, pass_)
    # --- Winograd hook (ops/winograd.py): 3x3/5x5 stride 1; explicit on an
    # ineligible geometry raises; automatic on GPUs where it pays / by env.
    if algo == "winograd":
        wino_ops.check_eligible(g)
        return algo
    gw = per_image(g) if det else g
    # a forward is judged with the tile it would run (a TRAIN net's under
    # TF32 takes F(2x2): ops/winograd.py forward_tile)
    tile = wino_ops.forward_tile(dev, g) if pass_ == "forward" else None
    if algo is None and wino_ops.use_auto(dev, gw, tile) and wino_ops.fits(g, tile) and \
            (wino_ops.env_override() or det or
             (_winograd_fills_tiles(dev, g, tile) and _winograd_outweighs_launches(dev, g))):
        return "winograd"
    # --- end Winograd hook
    if algo in (None, "depthwise") and dw_ops.eligible(g):
        return "depthwise"
    if algo in (None, "depthwise"):
        algo = "im2col" if dev.is_cpu else "igemm"
    return algo


def _fill(n, tile):
    """Part of ceil(n / tile) tiles of ``tile`` columns that n columns fill."""
    return n / float(-(-max(n, 1) // tile) * tile)


def _winograd_fills_tiles(dev, g, tile=None):
    """GPUs: whether Winograd still wins once both algorithms' GEMM tiles
    are counted with the columns they leave empty. Winograd's GEMMs have
    one column per output tile of the batch (4 for a 7 x 7 plane at batch
    1, in a 128-column tile: 3% used), the implicit GEMM one per output
    pixel (49: 38%), and its few tiles are split along K to fill the device
    (forward_splitk), so at batch 1-4 on small planes the arithmetic saving
    of ``estimated_speedup`` is lost to empty columns (``tile``: the
    Winograd tile judged, None: the setting's; not in deterministic
    mode: the choice would depend on the batch): Winograd stays where
    the model's speedup times the ratio of filled columns is at least 1
    (batch 16 on 7 x 7 x 512: 1.94 x 0.5 / 0.875 = 1.11, kept; batch 1 on
    28 x 28 x 128: 1.76 x 0.38 / 0.875 = 0.77, implicit GEMM). CPU drivers (no
    fixed tiles) and setting WINOGRAD_OCCUPANCY off: always True."""
    if dev.is_cpu or not config.get("WINOGRAD_OCCUPANCY"):
        return True
    tn = gpu_tiles(dev, g.out_channels // g.groups)["TN"]
    wino = _fill(wino_ops.batch_tiles(g, wino_ops.tile_for(g, tile)), tn)
    direct = _fill(g.num * g.out_spatial, tn)
    return (wino_ops.estimated_speedup(g, tile, tf32=wino_ops.model_tf32(dev)) * wino / direct
            >= 1.0)


def _winograd_outweighs_launches(dev, g):
    """GPUs: whether the convolution is big enough (setting
    WINOGRAD_MIN_MFLOP, direct FLOPs of the whole batch) for Winograd's four
    launches (filter, input, GEMM, output transforms) instead of one. At
    batch 1 on the H200 the 231-MFLOP 3x3 layers (ResNet's 64 channels at
    56 x 56, DenseNet's first block) and AlexNet's 448-MFLOP 5x5 ran
    1.6-1.9x slower by Winograd alone, and converted DenseNet-121 took
    6.28 ms against 4.78 without it (host-bound: ~15 us per launch); VGG's
    1.85-GFLOP conv3_1 ran 1.76x faster (BENCHMARKS.md, nineteenth
    session). Not in deterministic mode (its choice is per image); CPU
    drivers: always True (CPU_MIN_TILES is theirs)."""
    if dev.is_cpu:
        return True
    flops = 2.0 * g.num * g.out_spatial * g.out_channels * g.kh * g.kw * (g.channels // g.groups)
    return flops >= 1e6 * config.get("WINOGRAD_MIN_MFLOP")


def per_image(g):
    """``g`` for a batch of one image (deterministic-mode choices)."""
    return replace(g, num=1)


def candidates(dev, g):
    """The algorithms ``caffe_ocl tune`` times for ``g``: the dense ones
    (on CPU drivers only im2col: the GPU-style implicit GEMM ran SGEMM at
    7-12 GFLOP/s on PoCL against ~100 for gemm_cpu.cl, and builds for
    minutes there), depthwise and Winograd where they apply."""
    out = ["im2col"] if dev.is_cpu else ["igemm", "im2col"]
    if dw_ops.eligible(g):
        out.insert(0, "depthwise")
    if wino_ops.eligible(g) and wino_ops.fits(g):
        out.insert(0, "winograd")
    return out


_warned_stale = set()


def tuned_key(dev, g, pass_):
    """The tuned store's entry for this pass of ``g`` built now on ``dev``:
    a forward whose Winograd tile is not the setting's (a TRAIN net's under
    TF32) has its own."""
    t = wino_ops.forward_tile(dev, g) if pass_ == "forward" else None
    return tuned.conv_key(g, pass_, use_tf32(dev),
                          None if t in (None, wino_ops.default_tile()) else t)


def _tuned_choice(dev, g, pass_):
    """The stored choice for this pass of ``g`` on ``dev``, or None (none
    stored, or one that cannot compute ``g``: reported once, then ignored)."""
    key = tuned_key(dev, g, pass_)
    choice = tuned.lookup(dev, key)
    if choice is None or choice in candidates(dev, g):
        return choice
    if key not in _warned_stale:
        _warned_stale.add(key)
        log.warning("ignoring tuned choice %r for %s in %s: it does not apply to that "
                    "convolution", choice, key, tuned.store_path(dev))
    return None


def workspace_floats(dev, g, algo=None):
    """Floats of the ``col`` workspace a layer must pass (0: none needed):
    for ``algo``, or, when None, the most any pass's algorithm needs."""
    if algo is None:
        return max(workspace_floats(dev, g, algorithm(dev, g, None, p)) for p in tuned.PASSES)
    a = algorithm(dev, g, algo)
    if a == "winograd":      # own scratch (dev.shared_scratch); dW by the dense path
        a = "im2col" if dev.is_cpu else "igemm"
    if a in ("igemm", "depthwise"):
        return 0
    if not _packs_columns(dev, g):
        return g.col_floats()
    padded = _pad_chunk(g) * g.channels * _plane(g)
    f = _flipped(g)
    if f is None:                    # backward-data by columns + col2im
        return max(g.col_floats(), padded)
    return max(padded, _flipped_weight_offset(f) + g.out_channels * g.col_rows // g.groups)


def _packs_columns(dev, g):
    """Whether the CPU GEMM packs this convolution's columns itself: not
    for 1x1 kernels (a stride-1 one's columns are the image; a strided one's
    are the image subsampled, which im2col writes once -- packed from the
    images, each block of output channels gathered them again, 16 floats
    apart lane by lane on 7 x 7 outputs)."""
    unpadded_1x1 = g.kh == g.kw == 1 and g.ph == g.pw == 0
    return (dev.is_cpu and config.get("CPU_PACKED_COLUMNS") and not g.is_1x1
            and not (unpadded_1x1 and not CPU_PACK_STRIDED_1X1))


def _flipped(g):
    """The forward convolution that computes a stride-1 ``g``'s
    backward-data (dy convolved with the transposed weight, taps reversed,
    padding (K-1)*D-P), or None where that padding would be negative, the
    stride is not 1, or the image is larger than the output: the flipped
    convolution spends H*W / (HO*WO) times the column path's multiply-adds
    (LeNet's unpadded conv2: 2.25x, slower; CIFAR-10 quick's "same"
    layers: 1x, step 1.12x faster)."""
    ph, pw = (g.kh - 1) * g.dh - g.ph, (g.kw - 1) * g.dw - g.pw
    if ((g.sh, g.sw) != (1, 1) or ph < 0 or pw < 0
            or g.height * g.width > g.out_spatial):
        return None
    return ConvGeometry(g.num, g.out_channels, g.out_h, g.out_w, g.channels, g.kh, g.kw,
                        ph, pw, 1, 1, g.dh, g.dw, g.groups)


def _flipped_weight_offset(f):
    """Where the flipped weight lies in the workspace: after f's padded dy."""
    return _pad_chunk(f) * f.channels * _plane(f)


def _plane(g):
    """Floats of one zero-padded image plane."""
    return (g.height + 2 * g.ph) * (g.width + 2 * g.pw)


def _pad_chunk(g):
    """Images per zero-padded copy (bounded as ``col`` is): 0 without padding."""
    if not (g.ph or g.pw):
        return 0
    return max(1, min(g.num, MAX_COL_FLOATS // max(g.channels * _plane(g), 1)))


def _geom_args(g):
    return [g.channels, g.height, g.width, g.kh, g.kw, g.ph, g.pw, g.sh, g.sw,
            g.dh, g.dw, g.out_h, g.out_w]


def im2col(dev, g, nimg, im, off_im, col):
    """CPU drivers: one work-item per (image, channel), writing in order
    (im2col_chan); GPUs: one per column element (coalesced)."""
    args = [nimg] + _geom_args(g) + [im, off_im, g.channels * g.height * g.width,
                                     col, g.col_rows * g.out_spatial]
    if dev.is_cpu:
        n = cpu_chunks(dev, nimg * g.channels, min_chunk=1)
        return dev.launch(SRC, "im2col_chan", (n,), (1,), args)
    gs, ls = work_size(dev, nimg * g.channels * g.out_spatial)
    return dev.launch(SRC, "im2col", gs, ls, args)


def col2im(dev, g, nimg, col, im, off_im, accumulate=False):
    """The adjoint of ``im2col``, kernels chosen the same way."""
    if dev.is_cpu:
        n = cpu_chunks(dev, nimg * g.channels, min_chunk=1)
        return dev.launch(SRC, "col2im_chan", (n,), (1,),
                          [nimg] + _geom_args(g) + [col, g.col_rows * g.out_spatial,
                                                    im, off_im,
                                                    g.channels * g.height * g.width,
                                                    int(bool(accumulate))])
    gs, ls = work_size(dev, nimg * g.channels * g.height * g.width)
    fixed = dict(zip(("C2I_C", "C2I_H", "C2I_W", "C2I_KH", "C2I_KW", "C2I_PH", "C2I_PW",
                      "C2I_SH", "C2I_SW", "C2I_DH", "C2I_DW", "C2I_HO", "C2I_WO"),
                     _geom_args(g)), C2I_FIXED=1)
    return dev.launch(SRC, "col2im", gs, ls,
                      [nimg] + _geom_args(g) + [col, g.col_rows * g.out_spatial,
                                                im, off_im, g.channels * g.height * g.width,
                                                int(bool(accumulate))], fixed)


@dataclass(frozen=True)
class _Cols:
    """The column operand of a forward / backward-weight GEMM: buffer,
    offset, per-image and per-group strides, and gemm's ``conv`` spec when
    the GEMM packs the columns from images itself."""
    buf: object
    off: int
    image_stride: int
    group_stride: int
    conv: tuple = None


def _column_chunks(dev, g):
    """(first image, images) of the chunks the column operand comes in."""
    if g.is_1x1 or (_packs_columns(dev, g) and not _pad_chunk(g)):
        return [(0, g.num)]
    if _packs_columns(dev, g):
        c = _pad_chunk(g)
        return [(n0, min(c, g.num - n0)) for n0 in range(0, g.num, c)]
    return list(g.chunks())


def _columns(dev, g, x, col, n0, nc):
    """([launches], _Cols) of the columns of images n0 .. n0+nc-1: the
    image itself (1x1), the images (zero-padded into ``col`` where the
    convolution pads) that the CPU GEMM packs columns from, or im2col's
    columns in ``col``."""
    chw = g.channels * g.height * g.width
    cg = g.channels // g.groups
    if g.is_1x1:
        return [], _Cols(x, n0 * chw, chw, cg * g.height * g.width)
    if not _packs_columns(dev, g):
        return ([im2col(dev, g, nc, x, n0 * chw, col)],
                _Cols(col, 0, g.col_rows * g.out_spatial, g.col_rows // g.groups * g.out_spatial))
    wp = g.width + 2 * g.pw
    conv = (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, wp, _plane(g), g.out_w)
    if not (g.ph or g.pw):
        return [], _Cols(x, n0 * chw, chw, cg * _plane(g), conv)
    units = nc * g.channels
    pad = dev.launch(SRC, "pad_planes", (cpu_chunks(dev, units, min_chunk=1),), (1,),
                     [units, g.height, g.width, g.ph, g.pw, x, n0 * chw, col])
    return [pad], _Cols(col, 0, g.channels * _plane(g), cg * _plane(g), conv)


# ---------------------------------------------------------------------------
# implicit GEMM (GPU)
# ---------------------------------------------------------------------------

def _igemm_launch(dev, g, kernel, mode, M, N, gz, args, K=None, tiles=None, **extra):
    """K: the product's depth, for the staged store (None: direct stores;
    weight gradients, whose outputs are small). tiles: the tile (gpu_tiles'
    form, MICRO included) when not gpu_tiles(dev, M, K)'s."""
    d = dict(tiles) if tiles else gpu_tiles(dev, M, K)
    d.update(MODE=mode, KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw, PH=g.ph, PW=g.pw,
             DH=g.dh, DW=g.dw, GROUPS=g.groups, **extra)
    nt = d["TM"] * d["TN"] // d.get("MICRO", 8) ** 2
    gsize = (-(-N // d["TN"]) * nt, -(-M // d["TM"]), gz)
    return dev.launch(IGEMM_SRC, kernel, gsize, (nt, 1, 1), args, d)


def _sizes(g):
    return [g.num, g.channels, g.height, g.width, g.out_channels, g.out_h, g.out_w]


# Work-groups per compute unit the split-K weight gradients aim for: the
# implicit-GEMM kernel's, and the folded 1x1 GEMM's on the TF32 async loop.
# H200, ResNet-50's layers, batch 64, ms by per-CU target 4 -> 2: folded
# 1x1, 64 -> 256 at 56 x 56 0.160 -> 0.143, 128 -> 512 at 28 x 28 0.123 ->
# 0.100, 256 -> 1024 at 14 x 14 0.125 -> 0.100 (1 per CU: 0.10-0.18);
# implicit GEMM (conv1, the strided and 7 x 7 1x1 layers), summed: TF32
# 1.83 -> 1.92, FP32 3.76 -> 3.74 (1: 2.57 / 4.59, 8: 1.99 / 3.92).
SPLITK_PER_CU = 4
SPLITK_PER_CU_ASYNC = 2


def splitk_plan(dev, g, per_cu=None):
    """(nsplit, kchunk) of backward-weight: split K = n*HO*WO so that the
    small M x N of a weight gradient still fills the device (about
    ``per_cu`` work-groups per compute unit; default SPLITK_PER_CU)."""
    if per_cu is None:
        per_cu = SPLITK_PER_CU
    M = g.out_channels // g.groups
    N = g.col_rows // g.groups
    K = g.num * g.out_spatial
    t = gpu_tiles(dev, M)
    tiles = -(-M // t["TM"]) * -(-N // t["TN"]) * g.groups
    ktiles = -(-K // t["TK"])
    want = -(-per_cu * max(dev.compute_units, 1) // tiles)
    nsplit = max(1, min(want, ktiles // 8,
                        MAX_SPLITK_FLOATS // max(g.groups * M * N, 1)))
    kchunk = -(-ktiles // nsplit) * t["TK"]
    return -(-K // kchunk), kchunk


# 1x1 forward and backward-data passes on GPUs as GEMMs on the TF32
# cp.async loop (kernels/tile_mainloop_async.h) rather than the
# implicit-GEMM kernel, with the images folded into N (one launch over the
# batch, gemm.cl NFOLD), for products of depth K >= GEMM_1X1_MIN_K:
# - stride 1, planes of a multiple of 4 pixels: operands as the images lie;
# - 7 x 7 planes and strided forwards, K >= ROWS_1X1_MIN_K: the operand
#   first gathered into rows by channel (im2col.cl conv_rows: the async
#   loop's 16-byte copies need rows on 16 bytes), C's columns folded back
#   into the images by the GEMM's stores.
# H200, ResNet-50 shapes, batch 64, TF32 (ms, implicit GEMM -> GEMM):
# K 1024 at 14 x 14 forward 0.121 -> 0.087, backward-data 0.113 -> 0.083;
# K 256 at 14 x 14 forward 0.096 -> 0.075, backward-data 0.092 -> 0.075;
# K 128 at 28 x 28 0.107 -> 0.102 and 0.107 -> 0.094; K 64 at 56 x 56
# 0.040 -> 0.050 (why GEMM_1X1_MIN_K). Gathered rows: 7 x 7, 512 -> 2048
# forward 0.119 -> 0.101, backward-data 0.155 -> 0.136; 1024 -> 2048
# stride 2 forward 0.276 -> 0.199; but 512 -> 256 stride 2 forward 0.067 ->
# 0.085 (the gather's cost shared by few outputs), and K 256 at 56 x 56
# stride 2 0.062 -> 0.123. One GEMM per image instead of the folded one:
# 14 x 14 planes 0.101 and 0.092 (two 128-column tiles for 196 columns).
# ResNet-50 TF32 training step 32.4-32.5 -> 31.7-31.8 ms.
GEMM_1X1_MIN_K = 128
# Forwards with at least GEMM_1X1_WIDE_M output channels take it from
# K = 64: 64 -> 256 at 56 x 56 (ResNet-50's and Wide-ResNet-50's
# layer1.0.downsample), batch 64, TF32: 0.131 ms by implicit GEMM, 0.114
# folded (bench_gathered_conv.py --one-by-one; 64 -> 64: 0.045 / 0.049).
GEMM_1X1_MIN_K_WIDE, GEMM_1X1_WIDE_M = 64, 256
ROWS_1X1_MIN_K = 512
# Forwards with at most 64 output channels take the GEMM only from this K:
# 256 -> 64 at 56 x 56 ran 0.103 ms by implicit GEMM, 0.112 folded (the
# same product transposed, in backward-data, 0.108 -> 0.098).
GEMM_1X1_MIN_K_64_ROWS = 512


def _gemm_1x1_plan(dev, g, m, k, lda, min_k=None):
    """How a 1x1 pass with an m x k weight whose rows are ``lda`` floats
    apart runs: "images" (a GEMM on the images as they lie), "rows" (a GEMM
    on its operand gathered into rows by channel) or None (implicit GEMM).
    min_k: the least k that takes a GEMM (default GEMM_1X1_MIN_K)."""
    if ((g.kh, g.kw, g.ph, g.pw, g.dh, g.dw) != (1, 1, 0, 0, 1, 1)
            or not config.get("GEMM_1X1") or k < (min_k or GEMM_1X1_MIN_K) or lda % 4):
        return None
    if not async_tiles(dev, gpu_tiles(dev, m), True, True):
        return None
    strided = (g.sh, g.sw) != (1, 1)
    if not strided and g.out_spatial % 4 == 0:
        return "images"
    # a strided gather reads whole input rows for a quarter of them
    # written: it pays only where many output channels share it
    if (k >= ROWS_1X1_MIN_K and (g.num * g.out_spatial) % 4 == 0
            and (not strided or m >= k)):
        return "rows"
    return None


def _gathered_rows(dev, g, src, channels, out, off, window=False, off_src=0):
    """Launch gathering ``src`` (from ``off_src``: [n][channels] planes of
    g's input size) into rows over the batch at ``out`` + ``off``
    (kernels/im2col.cl conv_rows): sampled at g's stride onto its output
    planes, one row per channel, or with ``window`` g's columns (im2col),
    one row per channel and tap."""
    hw = g.out_spatial
    lx = min(256, -(-hw // 32) * 32)
    ly = 256 // lx
    gsize = (-(-hw // lx) * lx, -(-g.num * channels // ly) * ly)
    geom = ([g.kh, g.kw, g.ph, g.pw, g.sh, g.sw, g.dh, g.dw] if window
            else [1, 1, 0, 0, g.sh, g.sw, 1, 1])
    return dev.launch(SRC, "conv_rows", gsize, (lx, ly),
                      [g.num, channels, g.height, g.width] + geom +
                      [g.out_h, g.out_w, src, int(off_src), out, int(off)])


def _gemm_1x1(dev, g, plan, M, K, A, src, src_rows, C, dst_rows, scratch_at=0, **kw):
    """[launches] of C = op(A) * B for a 1x1 pass (``plan`` of _gemm_1x1_plan)
    whose output planes are g's: B from ``src`` ([n][src_rows][..], g's input
    images sampled at g's stride, or dy), C ``dst`` ([n][dst_rows][HO*WO]),
    both per group; "rows" gathers B at ``scratch_at`` in the shared scratch."""
    hw = g.out_spatial
    N = g.num * hw
    fold = dict(ldc=hw, nsplit=hw, groups=g.groups, stride_c=(0, dst_rows // g.groups * hw),
                impl="tiled")
    if plan == "images":
        return [gemm(dev, M, N, K, A, src, C, ldb=hw, nstride=(src_rows * hw, dst_rows * hw),
                     stride_b=(0, src_rows // g.groups * hw), **fold, **kw)]
    # B's planes: the input's sampled at the stride (forward), or dy's
    # (backward-data: stride 1, so the input's size)
    rows = dev.shared_scratch(scratch_at + src_rows * N)
    return [_gathered_rows(dev, g, src, src_rows, rows, scratch_at),
            gemm(dev, M, N, K, A, rows, C, off_b=scratch_at, ldb=N, nsplit_b=False,
                 nstride=(0, dst_rows * hw), stride_b=(0, src_rows // g.groups * N),
                 **fold, **kw)]


def _igemm_forward_plan(dev, g):
    """_gemm_1x1_plan of an implicit-GEMM forward (None: the igemm kernel)."""
    M, K = g.out_channels // g.groups, g.channels // g.groups
    gp = per_image(g) if deterministic() else g      # a plan valid at every batch
    # a forward that needs a K split (few output tiles: batch 1-4) stays on
    # the implicit GEMM, which has one
    return (_gemm_1x1_plan(dev, gp, M, K, K,
                           GEMM_1X1_MIN_K_WIDE if M >= GEMM_1X1_WIDE_M else None)
            if (M > 64 or K >= GEMM_1X1_MIN_K_64_ROWS) and forward_splitk(dev, g)[0] == 1
            else None)


# TF32 forwards of k x k convolutions (not 1x1) with many output channels
# on GPUs as the async loop's GEMM (kernels/tile_mainloop_async.h) over
# their columns gathered into rows over the batch (im2col.cl conv_rows),
# rather than the implicit-GEMM kernel: its gathers cannot be 16-byte
# copies (a stride-2 window's pixels are not adjacent), so it runs the
# register-staged loop at ~55-75 TFLOP/s where the async loop runs ~100+.
# The gather writes K x N floats once; against a GEMM of 2 M N K flops it
# weighs about 67 / M of the GEMM's time on the H200, hence at least
# GATHERED_MIN_M output channels. Columns of at most GATHERED_MAX_FLOATS
# floats (256 MiB of shared scratch): bigger batches run a GEMM per chunk
# of images. H200, batch 64 (bench_gathered_conv.py), implicit GEMM /
# gathered: 512 and 1024 channels 1.23-1.45x (Wide-ResNet-50's stride-2
# layers 0.84 -> 0.64 and 1.07 -> 0.74 ms), 256 channels 0.93-1.16, 128
# channels 0.73-0.77. Weight gradients the same way (dW += dy * rows^T,
# images folded into K) ran 0.75-1.00x the implicit GEMM's: not used.
GATHERED_MIN_M = 512
GATHERED_MAX_FLOATS = 1 << 26


def gathered_forward_chunk(dev, g):
    """Images per GEMM of a forward of ``g`` through its gathered columns
    (see GATHERED_MIN_M), or 0 where the implicit-GEMM kernel runs it: FP32,
    setting GEMM_GATHERED_CONV off, deterministic mode (the choice would
    depend on the batch), grouped or 1 x 1 windows, weight rows not on 16
    bytes (C * KH * KW not a multiple of 4), a K split (few tiles), or
    chunks too small to fill the compute units."""
    if (not config.get("GEMM_GATHERED_CONV") or deterministic() or g.groups != 1
            or (g.kh, g.kw) == (1, 1)):
        return 0
    M, K, hw = g.out_channels, g.col_rows, g.out_spatial
    t = gpu_tiles(dev, M, K)
    if (M < GATHERED_MIN_M or K % 4 or (g.num * hw) % 4
            or not async_tiles(dev, t, True, True) or forward_splitk(dev, g)[0] != 1):
        return 0
    return _gathered_chunk(dev, g, t, M, K * hw)


def _gathered_chunk(dev, g, t, M, floats_per_image):
    """Images per GEMM of a gathered pass over ``g``'s output planes: as
    many as GATHERED_MAX_FLOATS of scratch hold at ``floats_per_image``,
    rounded so that every chunk's rows start on 16 bytes; 0 where an M x
    (chunk pixels) product in tiles ``t`` would not fill the compute
    units."""
    hw = g.out_spatial
    chunk = min(g.num, GATHERED_MAX_FLOATS // max(floats_per_image, 1))
    if chunk < g.num:
        q = 4 // math.gcd(hw, 4)
        chunk = chunk // q * q
    tiles = -(-M // t["TM"]) * -(-chunk * hw // t["TN"])
    return chunk if chunk and tiles >= max(int(dev.compute_units), 1) else 0


def _gathered_forward(dev, g, chunk, x, weight, y, bias, act, beta, y_off, ych, residual):
    """[launches] of the forward of ``g`` as GEMMs over its columns gathered
    into rows (gathered_forward_chunk images at a time): each writes its
    images' outputs at their place in ``y`` (C's columns folded back into
    the images by the GEMM's stores, gemm.cl NFOLD), epilogue included."""
    M, K, hw = g.out_channels, g.col_rows, g.out_spatial
    chw = g.channels * g.height * g.width
    rows = dev.shared_scratch(chunk * hw * K)
    out = []
    for n0 in range(0, g.num, chunk):
        gc = replace(g, num=min(chunk, g.num - n0))
        N = gc.num * hw
        out += [_gathered_rows(dev, gc, x, g.channels, rows, 0, window=True, off_src=n0 * chw),
                gemm(dev, M, N, K, weight, rows, y, ldb=N, nsplit_b=False, ldc=hw, nsplit=hw,
                     nstride=(0, ych * hw), off_c=y_off + n0 * ych * hw, beta=float(beta),
                     bias=bias, act=act, residual=residual, off_residual=n0 * ych * hw,
                     impl="tiled")]
    return out


# TF32 backward-data of strided k x k convolutions on GPUs the same way:
# the columns' gradient dcol = W^T dy as the async loop's GEMM over dy
# gathered into rows, then col2im adds the taps into dx. The implicit GEMM
# runs it as one product per stride phase (conv_bwd_data_phase) on the
# register-staged loop, and the phases of few taps are short products:
# Wide-ResNet-50's three stride-2 layers took 6.8 ms of a 61 ms TF32
# training step at batch 64 (~23-40 TFLOP/s). dcol is written and read
# back once (2 x C*KH*KW x N floats against 2 x C*KH*KW x N x Co flops),
# hence a floor of GATHERED_BWD_MIN_K output channels. H200, batch 64
# (bench_gathered_conv.py --backward-data), phases / gathered, with col2im's
# geometry compiled in (C2I_FIXED): Co 512-1024 2.98-6.66 (Wide-ResNet-50
# layer4.0.conv2 2.59 -> 0.71 ms, ResNet-18 layer4.0.conv1 0.84 -> 0.13),
# a 5 x 5 of 192 3.82, Co 256 1.90-2.40, Co 128 on 28 x 28 outputs
# 1.41-1.45 and Co 64 on 56 x 56 1.25. With col2im's geometry as
# arguments Co 128 and 64 lost (0.68-0.82) and the floor was 192.
GATHERED_BWD_MIN_K = 64


def gathered_backward_data_chunk(dev, g):
    """Images per GEMM of a backward-data of ``g`` through its columns'
    gradient (see GATHERED_BWD_MIN_K), or 0 where the implicit GEMM runs
    it: FP32, GEMM_GATHERED_CONV off, deterministic mode, grouped or 1 x 1
    windows, stride 1, C * KH * KW not a multiple of 4, fewer than
    GATHERED_BWD_MIN_K output channels, or chunks too small to fill the
    compute units."""
    if (not config.get("GEMM_GATHERED_CONV") or deterministic() or g.groups != 1
            or (g.kh, g.kw) == (1, 1) or (g.sh, g.sw) == (1, 1)):
        return 0
    M, K, hw = g.col_rows, g.out_channels, g.out_spatial
    t = gpu_tiles(dev, M, K)
    if (K < GATHERED_BWD_MIN_K or M % 4 or (g.num * hw) % 4
            or not async_tiles(dev, t, True, True)):
        return 0
    return _gathered_chunk(dev, g, t, M, (M + K) * hw)


def _gathered_backward_data(dev, g, chunk, dy, weight, dx, accumulate):
    """[launches] of dx (+)= conv^T(dy) for ``g``, gathered_backward_data_chunk
    images at a time: dy's planes gathered into rows over the chunk, the
    columns' gradient W^T * rows as a GEMM stored image by image (gemm.cl
    NFOLD) at the scratch's start, then col2im into dx."""
    M, K, hw = g.col_rows, g.out_channels, g.out_spatial
    chw = g.channels * g.height * g.width
    scratch = dev.shared_scratch(chunk * hw * (M + K))
    out = []
    for n0 in range(0, g.num, chunk):
        gc = replace(g, num=min(chunk, g.num - n0))
        N = gc.num * hw
        planes = ConvGeometry(gc.num, K, g.out_h, g.out_w, K, 1, 1)   # dy's, as they lie
        out += [_gathered_rows(dev, planes, dy, K, scratch, M * N, off_src=n0 * K * hw),
                gemm(dev, M, N, K, weight, scratch, scratch, trans_a=True, lda=M, off_b=M * N,
                     ldb=N, nsplit_b=False, ldc=hw, nsplit=hw, nstride=(0, M * hw),
                     impl="tiled"),
                col2im(dev, gc, gc.num, scratch, dx, n0 * chw, accumulate)]
    return out


def _igemm_forward(dev, g, x, weight, y, bias, act, beta=0.0, y_off=0, y_channels=None,
                   residual=None):
    M, K = g.out_channels // g.groups, g.channels // g.groups
    plan = _igemm_forward_plan(dev, g)
    if plan:
        return _gemm_1x1(dev, g, plan, M, K, weight, x, g.channels, y,
                         y_channels or g.out_channels, beta=float(beta),
                         stride_a=(0, M * K), bias=bias, act=act, off_c=y_off,
                         residual=residual)
    ych = y_channels or g.out_channels
    chunk = gathered_forward_chunk(dev, g)
    if chunk:
        return _gathered_forward(dev, g, chunk, x, weight, y, bias, act, beta, y_off, ych,
                                 residual)
    act_kind, act_a, act_b = act_defines(act)
    res = dict(RESIDUAL=1) if residual is not None else {}
    N = g.num * g.out_spatial
    nsplit, kchunk = forward_splitk(dev, g)
    tiles = forward_tiles(dev, g)
    if nsplit > 1:
        total = g.num * g.out_channels * g.out_spatial
        ws = dev.shared_scratch(nsplit * total)
        args = _sizes(g) + [1.0, x, 0, weight, 0.0, ws, 0, weight, 0, 0.0, 0.0, ws, 0]
        gs, ls = work_size(dev, total)
        return [_igemm_launch(dev, g, "conv_fwd", 0, M, N, g.groups * nsplit, args,
                              tiles=dict(tiles, STAGED=int(kchunk <= STAGED_MAX_K
                                                           and tiles["TN"] <= 128)),
                              FWD_NSPLIT=nsplit, FWD_KCHUNK=kchunk),
                dev.launch(SPLITK_SRC, "conv_splitk_reduce", gs, ls,
                           [total, g.out_spatial, g.out_channels, nsplit, ws, float(beta), y,
                            bias if bias is not None else ws, act_a, act_b,
                            ws if residual is None else residual, int(y_off), ych],
                           dict(BIAS=int(bias is not None), ACT=act_kind, **res))]
    # a slice of a bigger blob (writes_slices): images ych planes apart
    sliced = dict(Y_CHANNELS=ych) if ych != g.out_channels else {}
    args = _sizes(g) + [1.0, x, 0, weight, float(beta), y, int(y_off),
                        bias if bias is not None else weight, 0, act_a, act_b,
                        weight if residual is None else residual, 0]
    return [_igemm_launch(dev, g, "conv_fwd", 0, M, N, g.groups, args, tiles=tiles,
                          BIAS=int(bias is not None), ACT=act_kind, **res, **sliced)]


# Implicit-GEMM forward variants `caffe_ocl tune` times on GPUs (tuning.py
# tune_passes): "tiles/split", tiles "usual" (gpu_tiles) or "small"
# (64 x 64, 4 x 4 per work-item; FP32 only) or "narrow" (32 x 256; FP32, at
# most NARROW_MAX_M output channels), split "split" (forward_splitk's
# rule) or "nosplit" (one pass over K); and, for 1x1 layers the kernel of
# ops/conv1x1_few.py can run (conv1x1_few.eligible), "few": that kernel. A
# stored choice for a geometry replaces the rules' (forward_tiles,
# forward_splitk, conv1x1_few.applies) for it.
FORWARD_VARIANTS = ("usual/split", "small/split", "usual/nosplit", "small/nosplit", "few",
                    "narrow/split", "narrow/nosplit")
_forced_variant = [None]       # tuning.py's measurements (forced_forward_variant)


@contextmanager
def forced_forward_variant(variant):
    """Within the block, implicit-GEMM forwards use ``variant`` (one of
    FORWARD_VARIANTS; on CPU drivers, im2col forwards one of
    CPU_FORWARD_VARIANTS; None: the rules, no stored choice) -- how the
    tuner builds each variant's launches."""
    old = _forced_variant[0]
    _forced_variant[0] = variant or "rules"
    try:
        yield
    finally:
        _forced_variant[0] = old


def forward_variants(dev, g):
    """The FORWARD_VARIANTS that can differ for ``g`` on ``dev``: none on CPU
    drivers or in deterministic mode; the usual tiles only in TF32; "few"
    only where conv1x1_few.eligible."""
    if dev.is_cpu or deterministic():
        return []
    few = conv1x1_few.eligible(dev, g)
    narrow = narrow_eligible(dev, g)
    return [v for v in FORWARD_VARIANTS
            if (few if v == "few" else narrow if v.startswith("narrow")
                else not use_tf32(dev) or v.startswith("usual"))]


def _variant(dev, g):
    """The stored or forced FORWARD_VARIANTS name for ``g``'s implicit-GEMM
    forward, or None for the rules."""
    v = _forced_variant[0]
    if v is None and not deterministic():
        v = tuned.lookup(dev, tuned.conv_key(g, "forward-igemm", use_tf32(dev)))
        if v is not None and v not in forward_variants(dev, g):
            key = ("variant", v, g)
            if key not in _warned_stale:
                _warned_stale.add(key)
                log.warning("ignoring tuned forward variant %r for %s: it does not apply",
                            v, g)
            v = None
    # a forced CPU kernel (CPU_FORWARD_VARIANTS) leaves these tiles to the rules
    return None if v in (None, "rules") or v not in FORWARD_VARIANTS else v


def _forward_variant(dev, g):
    """(tiles, split) of the stored or forced variant for ``g``'s implicit-
    GEMM forward, or (None, None) for the rules (and for "few", which runs
    no tiles)."""
    v = _variant(dev, g)
    return (None, None) if v in (None, "few") else tuple(v.split("/"))


def runs_1x1_few(dev, g, algo=None):
    """Whether an implicit-GEMM forward of ``g`` runs ops/conv1x1_few.py's
    kernel: a stored or forced variant says so ("few"), or, with none and
    the automatic algorithm (``algo`` None), conv1x1_few.applies."""
    if not conv1x1_few.eligible(dev, g):
        return False
    v = _variant(dev, g)
    return v == "few" if v is not None else algo is None and conv1x1_few.applies(dev, g)


# FP32 implicit-GEMM forwards take 64-row tiles instead of 128 where those
# compute at most this part of the rows that 128-row tiles would (AlexNet's
# 192-channel 5 x 5 layer: 192 of 256 rows, 0.75; 320 of 384, 0.83),
# unless the 128-row tiles split K over work-groups and the 64-row ones
# would not. H200, 192 and 320 channels (bench_conv_epilogues.py): batch
# 16-64 1.08-1.46x; batch 1 where the wider tiles lost their split
# (GoogLeNet's 56 x 56 layer) 0.72x, so that case keeps 128 rows.
ROW_TILE_WASTE = 0.85


def _splits(dev, g, t):
    """Whether ``forward_splitk`` would split K for tiles ``t`` because
    they are too few to give half the compute units work (splitting
    allowed); ``_splits_wide`` is its other reason."""
    if deterministic() or not config.get("CONV_SPLITK") \
            or _forward_variant(dev, g)[1] == "nosplit":
        return False
    M, N = g.out_channels // g.groups, g.num * g.out_spatial
    tiles = -(-M // t["TM"]) * -(-N // t["TN"]) * g.groups
    return 2 * tiles <= max(int(dev.compute_units), 1)


def _splits_wide(dev, g, t, tiles, ktiles):
    """Whether ``forward_splitk`` splits K although ``tiles`` give half the
    compute units work (FWD_SPLITK_WIDE_MIN_KTILES): the small 64 x 64
    tiles (one of them keeps a unit far from busy; the 128-column tiles of
    ResNet's 7 x 7 layers at batch 64, 100 on 132 units, do not split),
    fewer of them than units, a main loop of at least that many steps,
    splitting allowed (as ``_splits``). Not TF32's 128 x 128 tiles: split
    the same way, Wide-ResNet-50 at batch 16 (whose stride-2 3 x 3 layers
    fill 100 tiles of 132 units) ran level (0.98-1.01; BENCHMARKS.md,
    forty-second session)."""
    if dev.is_cpu or t.get("MICRO") != 4 or deterministic() or not config.get("CONV_SPLITK") \
            or _forward_variant(dev, g)[1] == "nosplit":
        return False
    return tiles < max(int(dev.compute_units), 1) and ktiles >= FWD_SPLITK_WIDE_MIN_KTILES


# FP32 implicit-GEMM forwards with at most this many output channels per
# group take 32 x 256 tiles (tile_mainloop.h, 8 x 8 results per work-item,
# 128 work-items fetching two B columns each) where 64 x 128 ones would
# compute at least twice the rows needed: on the H100, Inception v3's
# 32 -> 32 3 x 3 layer on 147 x 147 at batch 64 ran at 28 TFLOP/s against 55
# for its 32 -> 64 neighbour, half the tile's multiply-adds on zero rows.
# H100, batch 64, narrow / 64 x 128 time (.gpu/s40_narrow.py, BENCHMARKS.md
# fortieth session): that layer 0.59, a CIFAR ResNet's 16 -> 16 3 x 3 on
# 32 x 32 (batch 128) 0.68, MobileNet v2's 144 -> 24 1x1 on 56 x 56 0.83.
# Each work-item gathers two columns of the implicit im2col, so where K is
# short the gather is the work: Inception's 3 -> 32 stem (K 27) ran 1.22x
# slower, a 3 -> 16 one (three quarters of the 64 rows idle) still 0.88.
# So more than 16 channels need K >= NARROW_MIN_K. The tiles are taken when
# they still give every compute unit NARROW_MIN_PER_CU tiles (fewer, larger
# tiles otherwise leave units idle; the K split and the small tiles see to
# those).
NARROW_MAX_M = 32
NARROW_MIN_K = 64
NARROW_MIN_PER_CU = 2
# __local bytes of a 32 x 256 tile's two A and B buffers (tile_mainloop.h:
# 2 x 16 x (32 + 8 + 256 + 8) floats): 38 KiB, more than devices with 32
# KiB of local memory have (Oclgrind's simulated one refused the launch)
NARROW_LOCAL_BYTES = 2 * 16 * (32 + 8 + 256 + 8) * 4


def narrow_eligible(dev, g):
    """Whether 32 x 256 tiles can run ``g``'s forward: a GPU with local
    memory for them, FP32, at most NARROW_MAX_M output channels per group."""
    return (not dev.is_cpu and not use_tf32(dev)
            and NARROW_LOCAL_BYTES <= getattr(dev, "local_mem", 1 << 16)
            and g.out_channels // g.groups <= NARROW_MAX_M)


def _narrow_pays(g):
    """Whether the rules take 32 x 256 tiles for an eligible ``g``: at most
    16 channels, or a product deep enough that the rows saved outweigh
    each work-item's second gathered column (NARROW_MIN_K)."""
    return g.out_channels // g.groups <= 16 or g.col_rows // g.groups >= NARROW_MIN_K


def forward_tiles(dev, g):
    """Tile of an implicit-GEMM forward of ``g`` (gpu_tiles' form): the
    usual 128-column tiles with 8 x 8 results per work-item, or, on GPUs in
    FP32 where even four times as many tiles would not fill the compute
    units (batch 1-4 on small planes: a 1 x 1 convolution of 116 channels
    on 14 x 14 is 2 tiles of 128 x 128 on 132 units), 64 x 64 tiles of 4 x 4
    results per work-item (tile_mainloop.h MICRO 4): a tile's main loop
    then takes a quarter of the time; or, in FP32 for at most NARROW_MAX_M
    output channels, 32 x 256 tiles (narrow_eligible). Each result is still
    one work-item's sum over K in order, so the values are the same bits
    whichever tile runs.
    Setting CONV_SMALL_TILES off: always the usual tiles. A variant stored
    by `caffe_ocl tune` for ``g`` decides instead of the rule."""
    M, K = g.out_channels // g.groups, g.col_rows // g.groups
    t = gpu_tiles(dev, M, K)
    if dev.is_cpu or t["TF32"]:
        return t
    if t["TM"] == 128 and -(-M // 64) * 64 <= ROW_TILE_WASTE * -(-M // 128) * 128 \
            and not (_splits(dev, g, t) and not _splits(dev, g, dict(t, TM=64))):
        t = dict(t, TM=64)
    small = dict(t, TM=64, TN=64, MICRO=4)
    # direct stores: tile_store.h's staged store wants a work-item a column
    narrow = dict(t, TM=32, TN=256, STAGED=0)
    tiles = _forward_variant(dev, g)[0]
    if tiles is not None:
        return {"small": small, "narrow": narrow}.get(tiles, t)
    N = g.num * g.out_spatial
    cus = max(int(dev.compute_units), 1)
    fills = -(-M // 64) * -(-N // 64) * g.groups > cus
    if not fills and config.get("CONV_SMALL_TILES"):
        return small
    if config.get("CONV_NARROW_TILES") and narrow_eligible(dev, g) and _narrow_pays(g) \
            and -(-N // 256) * g.groups >= NARROW_MIN_PER_CU * cus:
        return narrow
    return t


# Forward passes whose output tiles leave at least half the compute units
# idle (batch 1-4, small planes: ResNet's 7 x 7 x 512 layers at batch 1 are
# 4 tiles of 128 x 128 on 132 compute units) split K = C/G*KH*KW over work-groups: about
# FWD_SPLITK_PER_CU work-groups per compute unit, chunks of at least
# CAFFE_OCL_CONV_SPLITK_MIN_KTILES steps of the main loop, partial outputs summed by
# kernels/splitk.cl conv_splitk_reduce (which applies bias, beta, act).
FWD_SPLITK_PER_CU = 2
SPLITK_SRC = "splitk.cl"
# Forwards whose tiles give more than half the compute units work but fewer
# than FWD_SPLITK_PER_CU per unit also split K when its main loop is at
# least this many 16-deep steps: each unit then runs two or three
# work-groups where it ran one or none, and the extra launch (the reduce)
# costs less than the steps saved. OpenPose's 7 x 7 stage convolutions
# (185 -> 128 channels on 46 x 46 at batch 1: 68 tiles of 64 x 64 on 132
# units, 567 steps each) ran at 7 TFLOP/s unsplit (BENCHMARKS.md,
# thirty-sixth session).
FWD_SPLITK_WIDE_MIN_KTILES = 128


def forward_splitk(dev, g):
    """(nsplit, kchunk) of an implicit-GEMM forward of ``g``: (1, K) when
    its M x N tiles already give half the compute units work, when K is too
    short to split, or in deterministic mode (the split would depend on the
    batch: the rounding of each sum would too)."""
    M, K = g.out_channels // g.groups, g.col_rows // g.groups
    N = g.num * g.out_spatial
    t = forward_tiles(dev, g)
    tiles = -(-M // t["TM"]) * -(-N // t["TN"]) * g.groups
    cus = max(int(dev.compute_units), 1)
    ktiles = -(-K // t["TK"])
    if _splits(dev, g, t):
        want = -(-FWD_SPLITK_PER_CU * cus // tiles)
    elif _splits_wide(dev, g, t, tiles, ktiles):
        want = FWD_SPLITK_PER_CU * cus // tiles     # every work-group in one wave
    else:
        return 1, K
    total = g.num * g.out_channels * g.out_spatial
    nsplit = min(want, ktiles // max(int(config.get("CONV_SPLITK_MIN_KTILES")), 1),
                 MAX_SPLITK_FLOATS // max(total, 1))
    if nsplit <= 1:
        return 1, K
    kchunk = -(-ktiles // nsplit) * t["TK"]
    return -(-K // kchunk), kchunk


def _igemm_backward_data(dev, g, dy, weight, dx, accumulate, scratch_at=0):
    """scratch_at: where in the shared scratch this pass may start (the
    strided 1x1 backward-data holds its dense result before it)."""
    if (g.kh, g.kw, g.ph, g.pw, g.dh, g.dw) == (1, 1, 0, 0, 1, 1) and not g.is_1x1:
        return _strided_1x1_backward_data(dev, g, dy, weight, dx, accumulate)
    M = g.channels // g.groups
    K = g.out_channels // g.groups
    plan = _gemm_1x1_plan(dev, g, M, K, M)
    if plan:
        return _gemm_1x1(dev, g, plan, M, K, weight, dy, g.out_channels, dx, g.channels,
                         scratch_at=scratch_at, trans_a=True, lda=M,
                         beta=1.0 if accumulate else 0.0, stride_a=(0, K * M))
    chunk = gathered_backward_data_chunk(dev, g)
    if chunk:
        return _gathered_backward_data(dev, g, chunk, dy, weight, dx, accumulate)
    if (g.sh, g.sw) != (1, 1) and (g.dh, g.dw) == (1, 1):
        return _phase_backward_data(dev, g, dy, weight, dx, accumulate)
    N = g.num * g.height * g.width
    args = _sizes(g) + [dy, 0, weight, 1.0 if accumulate else 0.0, dx, 0]
    return [_igemm_launch(dev, g, "conv_bwd_data", 1, M, N, g.groups, args,
                          K=g.out_channels // g.groups * g.kh * g.kw)]


def _phase_backward_data(dev, g, dy, weight, dx, accumulate):
    """Strided backward-data as one implicit GEMM per stride phase
    (kernels/conv_igemm.cl conv_bwd_data_phase): each phase's input pixels
    see only every stride-th kernel tap, so no multiply-add is spent on the
    zeros between dy's samples (ResNet-18's 3x3 stride-2 layers: 4x fewer)."""
    M = g.channels // g.groups
    out = []
    for rh in range(g.sh):
        h0 = (rh - g.ph) % g.sh                    # first h with (h + PH) % SH == rh
        hp = max(0, -(-(g.height - h0) // g.sh))
        for rw in range(g.sw):
            w0 = (rw - g.pw) % g.sw
            wp = max(0, -(-(g.width - w0) // g.sw))
            if hp * wp == 0:
                continue
            args = _sizes(g) + [rh, rw, h0, w0, hp, wp, dy, 0, weight,
                                1.0 if accumulate else 0.0, dx, 0]
            ntaps = max(0, -(-(g.kh - rh) // g.sh)) * max(0, -(-(g.kw - rw) // g.sw))
            out.append(_igemm_launch(dev, g, "conv_bwd_data_phase", 3, M,
                                     g.num * hp * wp, g.groups, args,
                                     K=g.out_channels // g.groups * ntaps))
    return out


def _strided_1x1_backward_data(dev, g, dy, weight, dx, accumulate):
    """Strided 1x1 (ResNet's downsampling branches): a dense stride-1
    backward-data onto the output grid, then a scatter onto the stride grid
    (kernels/conv_igemm.cl stride_scatter)."""
    dense = ConvGeometry(g.num, g.channels, g.out_h, g.out_w, g.out_channels, 1, 1,
                         groups=g.groups)
    total_sub = g.num * g.channels * g.out_spatial
    sub = dev.shared_scratch(total_sub)
    if accumulate:
        name, total = "stride_scatter_add", total_sub
    else:
        name, total = "stride_scatter", g.num * g.channels * g.height * g.width
    gs, ls = work_size(dev, total)
    return (_igemm_backward_data(dev, dense, dy, weight, sub, False, scratch_at=total_sub) +
            [dev.launch(IGEMM_SRC, name, gs, ls, [total, sub, dx],
                        dict(MODE=-1, SS_H=g.height, SS_W=g.width, SS_HO=g.out_h,
                             SS_WO=g.out_w, SS_SH=g.sh, SS_SW=g.sw))])


# 1x1 stride-1 weight gradients on GPUs as a GEMM with the images folded
# into K (gemm.cl KFOLD) where that GEMM takes the TF32 cp.async main loop
# (kernels/tile_mainloop_async.h), instead of the implicit-GEMM kernel
# (setting FOLDED_WEIGHT_GEMM; off for A/B timing).


def _folded_weight_gemm_applies(dev, g):
    if not (config.get("FOLDED_WEIGHT_GEMM") and g.is_1x1):
        return False
    t = gpu_tiles(dev, g.out_channels // g.groups)
    # every row, image and group of both operands starts a multiple of HW
    # floats in: all on 16 bytes when HW is a multiple of 4
    aligned = g.out_spatial % 4 == 0
    return bool(async_tiles(dev, t, aligned, aligned))    # {} on CPU drivers (no TF32)


def _folded_backward_weight(dev, g, x, dy, dweight):
    """dW_g += dy_g (M x n*HW) * x_g^T (n*HW x N) for a 1x1 stride-1
    convolution: both operands are their images' rows as they lie (k =
    image * HW + pixel), K split into nsplit slices (splitk_plan) whose
    partial weights splitk_reduce sums, as for the implicit GEMM."""
    M, N, hw = g.out_channels // g.groups, g.channels // g.groups, g.out_spatial
    K = g.num * hw
    nsplit, kchunk = splitk_plan(dev, g, SPLITK_PER_CU_ASYNC)
    fold = dict(trans_b=True, lda=hw, ldb=hw, groups=g.groups, batch=nsplit,
                stride_a=(0, M * hw), stride_b=(0, N * hw), ksplit=hw,
                kstride=(g.out_channels * hw, g.channels * hw), kchunk=kchunk, impl="tiled")
    if nsplit == 1:
        return [gemm(dev, M, N, K, dy, x, dweight, beta=1.0, stride_c=(0, M * N), **fold)]
    ws = dev.shared_scratch(g.groups * nsplit * M * N)
    return [gemm(dev, M, N, K, dy, x, ws, beta=0.0, stride_c=(M * N, nsplit * M * N), **fold),
            _splitk_sum(dev, g, M * N, nsplit, ws, dweight)]


def _igemm_backward_weight(dev, g, x, dy, dweight):
    if _folded_weight_gemm_applies(dev, g):
        return _folded_backward_weight(dev, g, x, dy, dweight)
    M = g.out_channels // g.groups
    N = g.col_rows // g.groups
    nsplit, kchunk = splitk_plan(dev, g)
    # the output size as macros: the kernel decodes k = image * HO*WO + pixel
    # for every tile it loads, by division (by constants then)
    size = dict(HO_C=g.out_h, WO_C=g.out_w)
    if nsplit == 1:
        args = _sizes(g) + [1, kchunk, x, 0, dy, 0, 1.0, dweight]
        return [_igemm_launch(dev, g, "conv_bwd_weight", 2, M, N, g.groups, args, **size)]
    ws = dev.shared_scratch(g.groups * nsplit * M * N)
    args = _sizes(g) + [nsplit, kchunk, x, 0, dy, 0, 0.0, ws]
    return [_igemm_launch(dev, g, "conv_bwd_weight", 2, M, N, g.groups * nsplit, args,
                          **size),
            _splitk_sum(dev, g, M * N, nsplit, ws, dweight)]


def _splitk_sum(dev, g, per_group, nsplit, ws, dweight):
    """dweight += the nsplit partial weight gradients of each group in ws
    ([group][split][per_group floats]), kernels/conv_igemm.cl splitk_reduce."""
    total = g.groups * per_group
    gs, ls = work_size(dev, total)
    return dev.launch(IGEMM_SRC, "splitk_reduce", gs, ls,
                      [total, per_group, nsplit, ws, 1.0, dweight], dict(MODE=-1))


def bias_grad(dev, outer, channels, inner, dy, dbias, impl=None):
    """[launches]: dbias[c] += sum of dy[o][c][k] (Caffe's accumulating param gradient).
    GPUs: the split per-channel reduction of ops.channel (many work-groups
    per channel); CPU drivers: the serial per-channel kernel of ops.pointwise."""
    if impl is None:
        impl = "cpu" if dev.is_cpu else "gpu"
    if impl == "cpu":
        return [pointwise.bias_grad(dev, outer, channels, inner, dy, dbias)]
    return channel_sum(dev, outer, channels, inner, dy, dbias, accumulate=True)


# ---------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------

def _image_gemm(dev, M, N, K, A, B, C, *, nsplit=0, nstride=(0, 0), ksplit=0,
                kstride=(0, 0), stride_a=(0, 0), stride_b=(0, 0), stride_c=(0, 0), **kw):
    """[launches] of ops.gemm with the images folded into N (nsplit) or K
    (ksplit). The CPU kernel folds them itself; the GPU kernel (im2col asked
    for explicitly on a GPU) gets a batch over images for N, and one
    accumulating GEMM per image for K (beta must then be 1)."""
    if dev.is_cpu:
        return [gemm(dev, M, N, K, A, B, C, nsplit=nsplit, nstride=nstride, ksplit=ksplit,
                     kstride=kstride, stride_a=stride_a, stride_b=stride_b,
                     stride_c=stride_c, **kw)]
    if nsplit:
        return [gemm(dev, M, nsplit, K, A, B, C, batch=N // nsplit, stride_a=stride_a,
                     stride_b=(nstride[0], stride_b[1]), stride_c=(nstride[1], stride_c[1]),
                     **kw)]
    if ksplit:
        assert kw.get("beta") == 1.0, "per-image accumulation needs beta = 1"
        off_a, off_b = kw.pop("off_a", 0), kw.pop("off_b", 0)
        return [gemm(dev, M, N, ksplit, A, B, C, off_a=off_a + i * kstride[0],
                     off_b=off_b + i * kstride[1], stride_a=stride_a, stride_b=stride_b,
                     stride_c=stride_c, **kw) for i in range(K // ksplit)]
    return [gemm(dev, M, N, K, A, B, C, stride_a=stride_a, stride_b=stride_b,
                 stride_c=stride_c, **kw)]


def winograd_fuses(act):
    """Whether Winograd's output transform applies ``act``: none, ReLU or
    clip (ops/winograd.py)."""
    return act is None or act_defines(act)[0] <= 2


def fuses_act(dev, g, act, algo=None):
    """Whether ``forward`` of ``g`` applies ``act`` in its epilogue: every
    path for ReLU and clip; not Winograd for swish, sigmoid and PReLU (a
    PReLU, ``("prelu", channels)``, needs ``bias`` to hold the biases then
    the slopes: plan/chain.py). The automatic algorithm may become Winograd
    after a reshape: ``forward`` then runs the GEMM path for such an act."""
    return winograd_fuses(act) or algorithm(dev, g, algo, "forward") != "winograd"


def writes_residual(dev, g, algo=None):
    """Whether ``forward`` of ``g`` can add a residual tensor before its
    activation (``residual``): the GEMM paths (im2col, 1x1 GEMMs) and the
    implicit-GEMM kernel with its K split; not the Winograd, depthwise,
    direct and matrix-vector kernels."""
    a = algorithm(dev, g, algo, "forward")
    if a == "igemm":
        return not fully_connected(dev, g, algo) and not (
            algo is None and grouped_ops.applies(dev, g))
    return a == "im2col" and not fully_connected(dev, g, algo) and not (
        algo is None and direct_forward(dev, g))


def residual_pays(dev, g):
    """Whether the TEST plan should have ``forward`` of ``g`` (automatic
    algorithm) add an Eltwise's shortcut (plan/residual.py): wherever it
    can. H200, ResNet-50's block ends at batch 1-64 (bench_conv_epilogues.py):
    1.0-1.6x against the convolution and a summing pass, once the epilogue
    read the shortcut ahead of its stores (tile_store.h ADDEND_AT); read at
    each store it had made them 1.75x slower at batch 64. CPU drivers: whole
    nets measured level, one launch fewer."""
    return writes_residual(dev, g)


# Winograd's output transforms write into a Concat's slice (writes_slices);
# a rule constant so that a benchmark can time the copy it spares
# (bench_zoo.py --ab conv.WINOGRAD_SLICES=0).
WINOGRAD_SLICES = True


def writes_slices(dev, g, algo=None):
    """Whether ``forward`` of ``g`` can write its output into a slice of a
    bigger blob (``y_off``, ``y_channels``: a Concat's top along channels,
    caffe_ocl/plan/concat.py): the GEMM paths (im2col, 1x1 GEMMs), the
    implicit-GEMM kernels (tiles, their split-K sum, the few-outputs 1x1
    kernel) and Winograd's output transforms; not depthwise, nor the
    matrix-vector and grouped kernels (their outputs are written whole;
    such a layer keeps them and the Concat copies its top). At batch 1 on
    GPUs this spares a copy launch per Concat input: SqueezeNet's expand
    3x3 layers, GoogLeNet's 5x5 branches; at batch 16 and more, a copy
    launch and pass per dense layer of a DenseNet, whose 3x3 layers run
    Winograd there."""
    a = algorithm(dev, g, algo, "forward")
    if a == "im2col" or (a == "winograd" and WINOGRAD_SLICES):
        return True
    if a != "igemm":
        return False
    if _igemm_forward_plan(dev, g) is not None or runs_1x1_few(dev, g, algo):
        return True
    return not (fully_connected(dev, g, algo)
                or (algo is None and grouped_ops.applies(dev, g)))


class OnChange(Launch):
    """A launch that runs only when ``token()`` differs from its value at
    the last run (a derived copy of a weight, rewritten after the weight
    changed). Tools that enqueue a launch list's kernels themselves run it
    every time, which only repeats the same copy."""
    __slots__ = ("token", "seen")

    def __init__(self, launch, token):
        super().__init__(launch.kernel, launch.gsize, launch.lsize, launch.name,
                         launch.dtypes, launch.buffers, launch.pending)
        self.token, self.seen = token, None

    def run(self, queue):
        now = self.token()
        if now != self.seen:
            super().run(queue)
            self.seen = now


def keeps_winograd_filters(dev):
    """Whether an inference forward by Winograd (given a weight_version)
    keeps its filter transform, run again only when the weights change
    (OnChange): CPU drivers with CPU_PACKED_WEIGHTS, GPUs with
    GPU_KEEP_WINOGRAD_FILTERS. On GPUs the transform's device time is
    small, but its launch costs host time every pass, and the nets whose
    forward waits on the host are the ones with many Winograd layers
    (DenseNet: one per dense layer at batch 16 and more)."""
    return bool(config.get("CPU_PACKED_WEIGHTS" if dev.is_cpu else "GPU_KEEP_WINOGRAD_FILTERS"))


# CPU drivers: convolution weights of more than this many bytes (per
# group) whose GEMM spans one block of columns are read as they are, not
# packed once (packs_weights).
CPU_STREAMED_WEIGHT_BYTES = 2 << 20


def packs_weights(dev, g, algo=None):
    """Whether ``forward`` of ``g`` given a ``weight_version`` reads the
    weights packed once (CPU drivers, the GEMM path, CAFFE_OCL_CPU_PACKED_WEIGHTS).
    Not for weights over CPU_STREAMED_WEIGHT_BYTES whose GEMM spans a
    single block of columns: each block then packs its rows once, as the
    packed copy would, from weights streamed from memory (a pass evicts
    them from the caches), and that packing loop streamed them faster than
    the micro-kernel reading the packed copy: ResNet's batch-1 7 x 7 layers
    (49 columns, 4-9 MB of weights) ran 1.2-1.8x faster from the weights as
    they are (2-core EPYC Zen 5, PoCL 3.1, weights cycled through 8 copies,
    VW 16 and 8); ResNet-18 and -50 at batch 1 1.05x. Smaller weights stay
    cached, and packing them in every pass cost MobileNet v2 at batch 1
    6% (its 7 x 7 layers' weights are 0.6-1.6 MB)."""
    if not (dev.is_cpu and bool(config.get("CPU_PACKED_WEIGHTS"))
            and algorithm(dev, g, algo, "forward") == "im2col"):
        return False
    M, K = g.out_channels // g.groups, g.col_rows // g.groups
    if 4 * M * K <= CPU_STREAMED_WEIGHT_BYTES:
        return True
    N = max(nc for _, nc in _column_chunks(dev, g)) * g.out_spatial
    _, bm_max, bn_max = cpu_panels(dev, M, K)
    return cpu_blocks(dev, M, N, g.groups, bm_max, bn_max)[1] < N


def fully_connected(dev, g, algo=None):
    """Whether ``forward`` of ``g`` runs as a fully-connected product: a
    1x1 stride-1 convolution of 1 x 1 planes (an SE block's squeeze and
    excitation, a classifier written as a convolution) at a batch the
    kernel takes, as an InnerProduct of the same shape runs -- CPU drivers'
    small-M kernel (gemm_small_m.cl, which streams the weights once; the
    GEMM path made one panel of 16 columns for each image's single column
    and split the weights over a few work-items: MobileNet v3 large at
    batch 1, its 16 SE convolutions), GPUs' matrix-vector kernel at batch
    1-8 (gemv.cl; the implicit GEMM ran one tile column, 1 of its 64-128
    columns used, on 1-9 work-groups: 20-30 us per SE convolution of
    MobileNet v3 small on the H200). Not in deterministic mode (the kernel
    depends on the batch)."""
    if not (g.is_1x1 and g.height == 1 and g.width == 1 and g.groups == 1
            and not deterministic()):
        return False
    a = algorithm(dev, g, algo, "forward")
    if dev.is_cpu:
        return a == "im2col" and use_small_m(dev, g.num, g.out_channels, g.channels,
                                             False, True)
    return a == "igemm" and use_gemv(dev, g.num, g.out_channels, g.channels, False, True)


def takes_gate(dev, g, algo=None):
    """Whether ``forward`` of ``g`` can scale its input's channels by a gate
    as it reads them (``gate``): where the few-outputs 1x1 kernel runs it
    (ops/conv1x1_few.py: GPUs, small batches) or, on CPU drivers, a
    channel-vector kernel (chanvec_takes_gate), setting SE_GATED_1X1. An SE
    block's channel scale before its projection then costs no launch of
    its own (plan/se.py, plan/residual.py)."""
    if not config.get("SE_GATED_1X1"):
        return False
    if dev.is_cpu:
        return chanvec_takes_gate(dev, g, algo) or pointwise_takes_gate(dev, g, algo)
    return algorithm(dev, g, algo, "forward") == "igemm" and runs_1x1_few(dev, g, algo)


def takes_dw_input(dev, g, gd, algo=None):
    """Whether ``forward`` of the 1x1 convolution ``g`` can compute its
    input as the depthwise convolution ``gd`` where it loads it
    (``dw_input``): where the few-outputs 1x1 kernel runs ``g`` (GPUs,
    small batches) and reaches ``gd`` (conv1x1_few.takes_dw), setting
    FUSE_DW_POINTWISE. A depthwise layer and the 1x1 layer after it are
    then one launch (plan/dw_pointwise.py)."""
    if not config.get("FUSE_DW_POINTWISE") or dev.is_cpu:
        return False
    return (algorithm(dev, g, algo, "forward") == "igemm" and runs_1x1_few(dev, g, algo)
            and conv1x1_few.takes_dw(g, gd))


def pointwise_takes_gate(dev, g, algo=None):
    """Whether the CPU forward of ``g`` runs conv1x1_rows (the automatic
    algorithm, pointwise_rows) with the gate: its weights times the gate
    in at most a quarter of the local memory."""
    local = int(getattr(dev, "local_mem", 0) or 0)
    return (algo is None and POINTWISE_ROWS_GATE and pointwise_rows(dev, g)
            and 4 * g.out_channels * g.channels <= local // 4)


# CPU drivers: 1x1 projections on the channel-vector kernels take an SE
# gate (GATE in kernels/conv_chanvec.cl: each work-item's weight panel
# scaled once into local memory) instead of the Scale's pass and launch
# before them. 2-core EPYC Zen 3, PoCL 3.1, batch 1, interleaved, gated /
# Scale + convolution: 0.70-0.99 per layer (MobileNet v3's, EfficientNet's,
# RegNet-Y's 7 x 7 and 14 x 14 projections); scaling the two weight
# vectors in every tile instead made RegNet-Y-400MF 0.93x as fast.
CHANVEC_GATE = True
# ... where the gated panel (input channels x NR floats, rounded up to a
# power of two) is at most this large (and a quarter of the local memory)
CHANVEC_GATE_MAX_BYTES = 128 * 1024


def _gate_floats(dev, g):
    """GATE_FLOATS: a work-item's gated weight panel (input channels x NR
    floats), rounded up to a power of two (programs shared)."""
    return 1 << (g.channels * 2 * cpu_vw(dev) - 1).bit_length()


def chanvec_takes_gate(dev, g, algo=None):
    """Whether the CPU forward of ``g`` runs a channel-vector kernel that
    takes a gate: one group, 1x1, chanvec_forward's rule, CHANVEC_GATE, the
    gated panel within CHANVEC_GATE_MAX_BYTES and a quarter of the local
    memory."""
    if not (CHANVEC_GATE and dev.is_cpu and g.is_1x1 and g.groups == 1):
        return False
    local = int(getattr(dev, "local_mem", 0) or 0)
    return (4 * _gate_floats(dev, g) <= min(CHANVEC_GATE_MAX_BYTES, local // 4)
            and chanvec_forward(dev, g, algo))


def forward(dev, g, x, weight, y, col, bias=None, act=None, algo=None, y_off=0,
            y_channels=None, weight_version=None, residual=None, gate=None, gate_stride=0,
            dw_input=None):
    """y[n, Co, Ho, Wo] = act(conv(x[n, C, H, W], weight[Co, C/G, KH, KW]) (+ bias)).

    ``act``: None, ("relu", negative_slope) or ("clip", lo, hi), applied in
    the GEMM epilogue (see ops.gemm.gemm). ``y_off``, ``y_channels``: the
    output images lie ``y_channels * Ho * Wo`` floats apart from ``y_off``
    on (a slice of a Concat's top; only where ``writes_slices``).
    ``weight_version``: None, or a function returning a value that changes
    whenever ``weight``'s contents may have (an inference net's weight blob
    memory and its version): where ``packs_weights``, the launches then
    start with a copy of the weights packed into the CPU GEMM's panel
    layout (ops.gemm.pack_a), which runs only when that value changed, and
    the GEMMs read it instead of packing the weights in every block of
    their output (batch-1 1x1 products on 7 x 7 to 28 x 28 planes: 1.1-1.4x,
    BENCHMARKS.md).
    ``residual``: None, or a buffer shaped as y added before ``act``
    (y = act(conv + bias + residual): an Eltwise SUM with a shortcut after
    the convolution, plan/residual.py); only where ``writes_residual``.
    ``gate``: None, or x's channels are scaled by it first (x[n, c] *
    gate[n * gate_stride + c]; ``gate_stride`` 0: one gate for every
    image); only where ``takes_gate``.
    ``dw_input``: None, or a conv1x1_few.DwInput: ``x`` is not read, the
    convolution's input is that depthwise convolution's output, computed
    as it is loaded; only where ``takes_dw_input``."""
    if algo is None and dw_input is None and gate is None:
        pruned = _pruned_forward(dev, g, x, weight, y, col, bias, act, y_off, y_channels,
                                 weight_version, residual)
        if pruned is not None:
            return pruned
    a = algorithm(dev, g, algo, "forward")
    if a == "winograd" and algo is None and not winograd_fuses(act):
        # the TEST plan fused an activation Winograd's output transform lacks
        # (fuses_act) at the shape the net had then; a reshape since made
        # Winograd the rule's choice: the GEMM path applies it instead
        algo = a = "im2col" if dev.is_cpu else "igemm"
    if dw_input is not None:
        if not takes_dw_input(dev, g, dw_input.g, algo) or gate is not None:
            raise ValueError(f"convolution {g}: algorithm {a!r} cannot compute its input as "
                             f"the depthwise convolution {dw_input.g}")
        return [conv1x1_few.forward(dev, g, x, weight, y, bias, act, y_off=y_off,
                                    y_channels=y_channels, residual=residual, dw=dw_input)]
    sliced = bool(y_off) or y_channels not in (None, g.out_channels)
    if sliced and not writes_slices(dev, g, algo):
        raise ValueError(f"convolution {g}: algorithm {a!r} cannot write into a slice")
    if residual is not None and (sliced or not writes_residual(dev, g, algo)):
        raise ValueError(f"convolution {g}: algorithm {a!r} cannot add a residual here")
    if gate is not None:
        if not takes_gate(dev, g, algo):
            raise ValueError(f"convolution {g}: algorithm {a!r} cannot scale its input by a gate")
        if pointwise_takes_gate(dev, g, algo):
            if sliced:
                raise ValueError(f"convolution {g}: a gated 1x1 kernel cannot write a slice")
            return [_pointwise_rows_forward(dev, g, x, weight, y, bias, act, residual,
                                            gate, gate_stride)]
        if chanvec_takes_gate(dev, g, algo):
            if weight_version is None:
                raise ValueError(f"convolution {g}: a gated CPU forward needs a weight_version")
            return _chanvec_forward(dev, g, x, weight, y, col, bias, act, y_off,
                                    y_channels or g.out_channels, weight_version, residual,
                                    gate=gate, gate_stride=gate_stride)
        return [conv1x1_few.forward(dev, g, x, weight, y, bias, act, y_off=y_off,
                                    y_channels=y_channels, residual=residual, gate=gate,
                                    gate_stride=gate_stride)]
    if a == "winograd":
        if weight_version is not None and keeps_winograd_filters(dev):
            # inference: the filter transform kept, redone after a weight change
            u = dev.alloc(4 * wino_ops.filter_floats(g, wino_ops.forward_tile(dev, g)))
            out = wino_ops.forward(dev, g, x, weight, y, bias, act, u_buf=u, y_off=y_off,
                                   y_channels=y_channels)
            return [OnChange(out[0], weight_version)] + out[1:]
        return wino_ops.forward(dev, g, x, weight, y, bias, act, y_off=y_off,
                                y_channels=y_channels)
    if a == "depthwise":
        return dw_ops.forward(dev, g, x, weight, y, bias, act)
    if a == "igemm" and not sliced and fully_connected(dev, g, algo):
        return [gemv(dev, g.num, g.out_channels, g.channels, x, weight, y, bias=bias,
                     bias_axis=1, act=act)]
    if a == "igemm" and algo is None and not sliced and grouped_ops.applies(dev, g):
        return [grouped_ops.forward(dev, g, x, weight, y, bias, act)]
    if a == "igemm" and runs_1x1_few(dev, g, algo):
        return [conv1x1_few.forward(dev, g, x, weight, y, bias, act, y_off=y_off,
                                    y_channels=y_channels, residual=residual)]
    if a == "igemm":
        return _igemm_forward(dev, g, x, weight, y, bias, act, y_off=y_off,
                              y_channels=y_channels, residual=residual)
    ych = y_channels or g.out_channels
    if a == "im2col" and algo is None and direct_forward(dev, g):
        return [_direct_forward(dev, g, x, weight, y, bias, act, y_off, ych)]
    if a == "im2col" and algo is None and not sliced and pointwise_rows(dev, g):
        return [_pointwise_rows_forward(dev, g, x, weight, y, bias, act, residual)]
    if fully_connected(dev, g, algo):     # y[n, :] = W x[n, :] + bias
        return [small_m(dev, g.num, g.out_channels, g.channels, x, weight, y, ldc=ych,
                        off_c=y_off, bias=bias, bias_axis=1, act=act)]
    if a == "im2col" and weight_version is not None and chanvec_forward(dev, g, algo):
        return _chanvec_forward(dev, g, x, weight, y, col, bias, act, y_off, ych,
                                weight_version, residual)
    M = g.out_channels // g.groups
    K = g.col_rows // g.groups
    N = g.out_spatial
    out = []
    a_buf, a_group, packed = weight, M * K, {}
    if weight_version is not None and packs_weights(dev, g, algo) and M * K > 0:
        a_group = packed_a_floats(M, K)
        a_buf = dev.alloc(4 * g.groups * a_group)
        out.append(OnChange(pack_a(dev, M, K, weight, a_buf, groups=g.groups),
                            weight_version))
        packed = dict(packed_a=True)
    # images folded into N (nsplit): one GEMM per chunk of images
    for n0, nc in _column_chunks(dev, g):
        pre, src = _columns(dev, g, x, col, n0, nc)
        out += pre
        b_buf, b_off, b_stride, b_packed = src.buf, src.off, src.group_stride, {}
        if src.conv is not None and packs_columns_once(dev, g, nc, bool(packed)):
            # op(B) packed once for all the GEMM's blocks of rows, in shared
            # scratch past the padded images (which may share its buffer)
            b_off = g.num * g.channels * _plane(g)
            b_buf = dev.shared_scratch(b_off + packed_b_floats(dev, nc * N, K))
            out.append(pack_b_conv(dev, nc * N, K, src.buf, src.off, N, src.image_stride,
                                   src.conv, b_buf, b_off))
            b_stride, b_packed = 0, dict(packed_b=True)
        out += _image_gemm(dev, M, nc * N, K, a_buf, b_buf, y, off_b=b_off,
                           off_c=y_off + n0 * ych * N, ldb=N, ldc=N, groups=g.groups,
                           stride_a=(0, a_group), stride_b=(0, b_stride),
                           stride_c=(0, M * N), nsplit=N,
                           nstride=(src.image_stride, ych * N),
                           bias=bias, bias_axis=0, act=act, conv=src.conv,
                           residual=residual, off_residual=n0 * ych * N, **packed, **b_packed)
    return out


def _pruned_forward(dev, g, x, weight, y, col, bias, act, y_off, y_channels, weight_version,
                    residual):
    """The launches of ``g``'s forward as the convolution of its live taps
    (ops/conv_taps.py): a copy of the weights' live window (run again only
    after they changed, where a ``weight_version`` says so), then that
    convolution's forward; or None where every tap is live or the smaller
    convolution's kernels could not do what this call asks (write a slice,
    add a residual, fit the column workspace the layer sized for ``g``)."""
    p = conv_taps.pruned(g)
    if p is None:
        return None
    g2, kh0, kw0 = p
    sliced = bool(y_off) or y_channels not in (None, g.out_channels)
    if (sliced and not writes_slices(dev, g2)) \
            or (residual is not None and (sliced or not writes_residual(dev, g2))) \
            or workspace_floats(dev, g2) > workspace_floats(dev, g):
        return None
    w2 = dev.alloc(4 * g2.out_channels * (g2.channels // g2.groups) * g2.kh * g2.kw)
    copy = conv_taps.weight_window(dev, g, g2, kh0, kw0, weight, w2)
    if weight_version is not None:
        copy = OnChange(copy, weight_version)
    return [copy] + forward(dev, g2, x, w2, y, col, bias, act, y_off=y_off,
                            y_channels=y_channels, weight_version=weight_version,
                            residual=residual)


# CPU drivers: most floats of an op(B) packed once (packs_columns_once):
# 4 MiB, about what stays in a core's L2 / the L3 share while every block
# of rows reads it (ResNet-18's batch-1 14 x 14 layers: 2 MiB) ...
CPU_PACKED_B_MAX_FLOATS = 1 << 20
# ... and fewest blocks of output rows. 2-core EPYC Zen 5, PoCL 3.1, batch-1
# 3 x 3 layers, packed once / in every block (15 interleaved rounds, the
# lead's tests sharing the cores): 8 and 13 row blocks of one column block
# (ResNet's 512-channel 7 x 7 layers, GoogLeNet 5b) 1.18-1.53x, 6 of two
# column blocks 1.06x; 2-4 row blocks (14 x 14 planes: 7 column blocks)
# 0.95-1.26x from run to run, i.e. level: their blocks pack their columns
# into memory that stays in the core's cache, the packed-once panels come
# from the other core's.
CPU_COLUMNS_ONCE_MIN_ROW_BLOCKS = 6


def packs_columns_once(dev, g, nc, packed_a):
    """Whether the forward GEMM of ``nc`` images of ``g``, which packs its
    columns from the images (CONV_B), packs them once before the product
    (ops.gemm.pack_b_conv) instead of in each block of output rows: CPU
    drivers, one group, setting CPU_COLUMNS_ONCE, at least
    CPU_COLUMNS_ONCE_MIN_ROW_BLOCKS blocks of rows (cpu_blocks, as the GEMM
    will split it) and a packed operand of at most CPU_PACKED_B_MAX_FLOATS.
    Same sums in the same order either way (bit-identical outputs)."""
    if not (dev.is_cpu and g.groups == 1 and config.get("CPU_COLUMNS_ONCE")):
        return False
    M, K, N = g.out_channels, g.col_rows, nc * g.out_spatial
    if packed_b_floats(dev, N, K) > CPU_PACKED_B_MAX_FLOATS:
        return False
    _, bm_max, bn_max = cpu_panels(dev, M, K)
    bm, _ = cpu_blocks(dev, M, N, 1, bm_max, bn_max, packed_a)
    return -(-M // bm) >= CPU_COLUMNS_ONCE_MIN_ROW_BLOCKS


# CPU drivers: convolutions of small planes run vectorized over output
# channels (kernels/conv_chanvec.cl) where the forward may pack their
# weights once (``weight_version``): 1x1 kernels on planes of at most
# CHANVEC_SMALL_PIXELS pixels, or of at most CHANVEC_MAX_PIXELS with at
# least CHANVEC_MIN_K input channels; larger kernels on planes of at most
# CHANVEC_KXK_MAX_PIXELS. 2-core EPYC Zen 5, PoCL 3.1, VW 16, batch 1, GEMM
# time / this kernel's (min of 9 interleaved rounds): 1x1 on 7 x 7 K 160-1024
# 1.16-1.77 (stride 2 from 14 x 14: 1.29-1.45); 1x1 on 14 x 14 K 480-1024
# 1.18-1.43, 13 x 13 K 512 1.07; 1x1 on 14 x 14 K 64 / 96 0.92 / 0.94,
# 13 x 13 K 64 0.87 (the tile goes out element by element, which a short
# K does not pay for), 1x1 on 28 x 28 0.76-0.94; 3 x 3 on 7 x 7 1.52-1.81,
# on 14 x 14 1.27-2.30, on 28 x 28 1.15-1.59, 5 x 5 on 7 x 7 / 28 x 28
# 1.51 / 1.27; ResNet's 7 x 7 stride-2 first layer (112 x 112) 0.90.
CHANVEC_SRC = "conv_chanvec.cl"
CHANVEC_SMALL_PIXELS = 64
CHANVEC_MAX_PIXELS = 196
CHANVEC_MIN_K = 128
CHANVEC_KXK_MAX_PIXELS = 784
CHANVEC_MAX_KERNEL = 7
# AVX2 drivers (VW 8): strided 1x1 layers onto planes of more than
# CHANVEC_SMALL_PIXELS pixels (ResNet's 512 x 28 x 28 -> 1024 downsample)
# keep the GEMM, whose columns are the subsampled images (im2col_chan):
# the channel-vector kernel reads each tile's 6 pixels from 12 floats of
# every input row. 2-core EPYC Zen 3, PoCL 3.1, GEMM / chanvec time
# (`ab_cpu_layer.py --setting CPU_CHANVEC --values 1,0 --const
# CHANVEC_STRIDED_VW8=1`, medians of 11 interleaved rounds), stride 2 onto
# 14 x 14: 512 -> 1024 0.79, 256 -> 512 0.78, 1024 -> 2048 0.82, 128 -> 256
# 0.96, 160 -> 320 0.98; batch 16 0.74-0.85. Onto 7 x 7 (the small-plane
# rule: channel blocks) the two were level (0.97-1.01). AVX-512 drivers:
# not measured there, the chanvec rule as before.
CHANVEC_STRIDED_VW8 = False
# ... and k x k layers on larger planes too at up to this many images (in
# deterministic mode: as for one image, the same at every batch), where
# Winograd does not take them (the small-FLOP and strided layers; first
# layers with few channels the direct kernels do not take). 2-core EPYC
# Zen 3, PoCL 3.1, VW 8, chanvec / GEMM time (`ab_cpu_layer.py --setting
# conv.CHANVEC_KXK_ANY_PLANE_MAX_IMAGES --values 0,2`, medians of 7
# interleaved rounds, quiet machine), batch 1: ResNet's 7 x 7 stride-2
# first layer (3 -> 64 onto 112 x 112) 0.81, SqueezeNet's 16 -> 64 3 x 3
# on 55 x 55 0.81, 32 -> 64 stride 2 from 112 x 112 0.81, 16 -> 32 3 x 3
# on 112 x 112 0.69 (busy machine: 64 -> 128 stride 2 0.88, 16 -> 64 5 x 5
# on 56 x 56 0.71, DeepLab's dilated 3 x 3 of 256-512 channels on 65 x 65
# level); batch 2 0.50-0.82; batch 16 mixed (0.69-1.16: the GEMM's wider
# column blocks pay there), so larger batches keep the GEMM. Whole nets,
# batch 1 (`bench_zoo.py --device cpu --ab
# conv.CHANVEC_KXK_ANY_PLANE_MAX_IMAGES=0`, 9 rounds): SqueezeNet 1.1
# 1.06, ResNet-18 1.01, DenseNet-121 1.02, GoogLeNet 1.00.
# AVX-512 drivers (VW 16) keep the GEMM: there ResNet's first layer ran
# 0.90x as fast on this kernel (the measurement above this rule's).
CHANVEC_KXK_ANY_PLANE_MAX_IMAGES = 2


def chanvec_forward(dev, g, algo=None):
    """Whether ``forward`` of ``g``, given a ``weight_version``, runs
    kernels/conv_chanvec.cl: CPU drivers, the automatic algorithm, one
    group or groups of at least CHANVEC_MIN_GROUP_OUT output channels
    (_chanvec_groups_fit), kernels up to CHANVEC_MAX_KERNEL a side, read from the images
    themselves (no padding) or from the GEMM path's zero-padded copy
    (CPU_PACKED_COLUMNS), small output planes (more than one pixel; the
    limits above); setting CPU_CHANVEC. The CPU GEMM puts pixels along its
    16- or 32-wide vectors, which small planes fill badly (a 7 x 7 plane:
    49 of 64 lanes). The plane size alone decides, not the batch, except
    for k x k layers on larger planes at VW 8, which take it at up to
    CHANVEC_KXK_ANY_PLANE_MAX_IMAGES images (deterministic mode: as for
    one image, at every batch). A choice that `caffe_ocl tune` stored for
    this geometry (CPU_FORWARD_VARIANTS) replaces the plane-size rule.
    Grouped layers with kernels larger than 1x1 take it on any plane,
    grouped 1x1 layers not at all (see CHANVEC_MIN_GROUP_OUT).
    Which kernel (channel blocks, 6- or 8-pixel tiles): _chanvec_kblocks."""
    if algo is not None or not _chanvec_fits(dev, g):
        return False
    v = _cpu_variant(dev, g)
    if v is not None:
        return v == "chanvec"
    hw = g.out_spatial
    if g.kh == g.kw == 1:
        # strided 1x1 layers onto planes past CHANVEC_SMALL_PIXELS: the
        # GEMM on the subsampled columns at VW 8 (CHANVEC_STRIDED_VW8)
        strided = (g.sh > 1 or g.sw > 1) and cpu_vw(dev) == 8 and not CHANVEC_STRIDED_VW8
        return hw <= CHANVEC_SMALL_PIXELS or (hw <= CHANVEC_MAX_PIXELS and not strided
                                              and g.channels >= CHANVEC_MIN_K)
    if hw <= CHANVEC_KXK_MAX_PIXELS or g.groups > 1:
        return True
    images = 1 if deterministic() else g.num
    return cpu_vw(dev) == 8 and images <= CHANVEC_KXK_ANY_PLANE_MAX_IMAGES


def _chanvec_fits(dev, g):
    """Whether conv_chanvec.cl can compute ``g`` at all (whatever its plane
    size): CPU drivers, groups it takes, more than one output pixel, kernels up
    to CHANVEC_MAX_KERNEL a side read unpadded or from the padded copy,
    setting CPU_CHANVEC."""
    return (dev.is_cpu and 1 < g.out_spatial and _chanvec_groups_fit(dev, g)
            and g.kh <= CHANVEC_MAX_KERNEL and g.kw <= CHANVEC_MAX_KERNEL
            and (not (g.ph or g.pw) or _packs_columns(dev, g))
            and bool(config.get("CPU_CHANVEC")))


def _chanvec_groups_fit(dev, g):
    """Whether conv_chanvec.cl takes ``g``'s groups: one group, or (setting
    CPU_CHANVEC_GROUPS) groups of at least CHANVEC_MIN_GROUP_OUT output
    channels -- each group's channels fill panels of their own, so a group
    narrower than the panel's 2 * VW lanes leaves the rest idle -- with
    kernels larger than 1x1 (CHANVEC_GROUPED_1X1)."""
    if g.groups == 1:
        return True
    return (bool(config.get("CPU_CHANVEC_GROUPS"))
            and g.out_channels // g.groups >= CHANVEC_MIN_GROUP_OUT
            and (g.kh * g.kw > 1 or CHANVEC_GROUPED_1X1))


# Grouped layers (RegNet, ResNeXt) ran as one GEMM per group, a 16 x 49 x
# 144 product for RegNetX-400MF's last stage, whose 6 x 16 tiles and column
# packing left them at 0.3-0.45 of ONNX Runtime's time per layer. By
# channels: 2-core EPYC (AVX2, VW 8), PoCL 3.1, batch 1, 3 x 3 layers,
# chanvec / GEMM time (medians of 7 interleaved rounds,
# `ab_cpu_layer.py --setting CPU_CHANVEC_GROUPS`): 16 channels a group
# 0.46-0.61 (400 on 7 x 7 in 25 groups, 160 on 14 x 14 in 10, 64 on 28 x
# 28 in 4), 8 a group 0.58 / 0.72 (512 on 7 x 7 in 64, 128 on 28 x 28 in
# 16: half of each 16-channel panel idle and still ahead), 4 a group
# (ResNeXt-50's first stage: 128 on 56 x 56 in 32; 256 stride 2 in 64)
# 0.67 / 0.59, 2 a group 0.82 (64 on 28 x 28 in 32); on larger
# planes too, where one-group layers keep the GEMM (CHANVEC_KXK_MAX_PIXELS):
# 56 x 56 0.59-0.67 (32 -> 32 stride 2 from 112 x 112 in 2 groups, 48 in
# 6, 64 in 4, 128 in 16), at batch 16 0.69-0.76 -- so grouped k x k layers
# take it on any plane. Grouped 1x1 layers (ShuffleNet v1) keep the
# per-group GEMM (CHANVEC_GROUPED_1X1 off; the kernel computes them): on
# 28 x 28 and 56 x 56 planes chanvec took 1.27-1.92x its time, on 14 x 14
# and 7 x 7 (ShuffleNet v1's g = 3 and 8 stages) 0.88-1.51x, level or
# behind. Whole nets, batch 1 (BENCHMARKS.md, twenty-eighth session):
# 1.04-1.37x.
CHANVEC_MIN_GROUP_OUT = 2
CHANVEC_GROUPED_1X1 = False


# conv_chanvec stores a whole 6-pixel tile channel by channel (4- and
# 2-float stores of each channel's consecutive pixels) instead of 6 scalar
# stores per channel (CHANVEC_ROW_STORES in the kernel)
CHANVEC_ROW_STORES = True


def _chanvec_group_pairs(dev, g, blocks):
    """Whether conv_chanvec computes ``g`` with two groups a panel (GPAIR:
    each of the panel's two vectors one group's channels): groups of at
    most VW output channels, which alone fill at most half a panel, on the
    one-block kernel (not conv_chanvec_kb), setting CPU_CHANVEC_GROUP_PAIRS."""
    return (g.groups > 1 and g.out_channels // g.groups <= cpu_vw(dev) and not blocks
            and bool(config.get("CPU_CHANVEC_GROUP_PAIRS")))


# AVX-512 drivers (VW 16): conv_chanvec_kb's tiles of 8 pixels x 32 channels
# for 1x1 layers (setting CPU_CHANVEC_TILE8) whose output planes hold at
# least CHANVEC8_MIN_PIXELS pixels or that have at least CHANVEC8_MIN_K
# input channels; their walk over input channels in blocks of
# CPU_CHANVEC_KBLOCK (default 0: one block). 2-core Xeon Skylake-AVX512 VM,
# PoCL 3.1, batch 1, single layers, 8-pixel / 6-pixel time (medians of 15
# interleaved rounds, two runs; a very noisy host): 1x1 on 14 x 14 planes
# 0.70-0.98 (1024 -> 256 0.90 / 0.91, 576 -> 96 0.70 / 0.96, 256 -> 1024
# 0.93 / 0.95, 512 -> 128 0.86), stride 2 to 7 x 7 from K 256 / 1024 0.94
# / 0.89-0.94, 7 x 7 with K 2048 0.89-0.93; 7 x 7 with K 96-960 0.96-1.09
# (mostly 1.00-1.04: 49 pixels fill 7 tiles of 8, 56 rows, against 9 of
# 6, 54 rows -- 4% more fmas). Larger kernels stay on 6-pixel tiles there:
# 3 x 3 1.04-1.21 slower on 7 x 7 to 28 x 28 planes (DenseNet's 128 -> 32
# on 28 x 28 1.21, ResNet's 512 -> 512 on 7 x 7 1.08), 5 x 5 0.93-0.95; so
# CHANVEC8_KXK_MIN_ROW (larger kernels take the 8-pixel tiles on output
# rows of at least this many pixels) is None. Channel blocks of 64 / 128 /
# 256 on 1x1 layers: 0.88-1.24 per layer, zoo geomean 0.99 for blocks of
# 128 (the Zen 5 machine it came from has a 48 KiB L1, this one 32: a
# block's weights and its inputs did not stay there). Whole nets could not
# tell (BENCHMARKS.md, twenty-first session: 11 zoo nets at batch 1 read
# 0.98-1.04 geomean for the 8-pixel tiles on all 1x1 layers, an A/A run
# 1.03). Chunks hold at most _chanvec_pixmax pixels (their partial sums
# wait in local memory between channel blocks).
CHANVEC8_MIN_PIXELS = 100
CHANVEC8_MIN_K = 1024
CHANVEC8_KXK_MIN_ROW = None
CHANVEC8_PIXMAX = 1024


# AVX2 drivers (VW 8): 1x1 layers onto planes of at most
# CHANVEC_KBLOCK_MAX_PIXELS pixels with more input channels (a group's)
# than CHANVEC_KBLOCK_VW8 run conv_chanvec_kb's 6-pixel tiles in blocks of
# that many channels (setting CPU_CHANVEC_KBLOCK replaces the number). The
# one-block kernel streams a 1x1 layer's whole weight panel (K x 16
# floats: 128 KiB at K 2048) and a cache line of input per channel from L2
# for every 6-pixel tile; in blocks of 128 the block's 8 KiB of weights
# stay in L1. 2-core EPYC Zen 3 (32 KiB L1, 512 KiB L2), PoCL 3.1, batch 1,
# blocks of 128 / one block (medians of 11-15 interleaved rounds,
# `ab_cpu_layer.py --setting CPU_CHANVEC_KBLOCK --values 1048576,0`): on
# 7 x 7 and 8 x 8 outputs 0.83-0.89 (MobileNet's 960 -> 160 / 320, 160 ->
# 960, 320 -> 1280, EfficientNet's 1152 / 672 -> 192, DenseNet's 1024 ->
# 128, ResNet's 512 -> 2048, 1024 -> 1024), 2048 -> 512 / 384 0.78-0.87,
# Inception's 1280 -> 320 0.90-0.94, ResNet's 1024 -> 2048 stride 2 from
# 14 x 14 onto 7 x 7 0.97-1.01 (the output plane decides); on 14 x 14
# outputs level (1024 -> 256 / 512 0.99-1.00, 256 -> 1024 1.01, 672 -> 112
# 1.03, stride 2 from 28 x 28 1.06), so those keep one block. Blocks of
# 256: 0.78-1.02; of 32 / 64: more partial sums saved and reloaded, 0.6-1.3
# in a noisier run.
CHANVEC_KBLOCK_VW8 = 128
CHANVEC_KBLOCK_MAX_PIXELS = 64


def _chanvec_kblocks(dev, g):
    """(tile rows, input channels per block) of conv_chanvec_kb when the
    chanvec forward of ``g`` runs it, else None (conv_chanvec): 8-pixel
    tiles at VW 16 (above; blocks of CPU_CHANVEC_KBLOCK channels on 1x1
    layers, default one block), 6-pixel ones for 1x1 layers onto planes of
    at most CHANVEC_KBLOCK_MAX_PIXELS at VW 8 (blocks of CHANVEC_KBLOCK_VW8
    or the setting's number, where that leaves more than one block)."""
    c = g.channels // g.groups
    kb = int(config.get("CPU_CHANVEC_KBLOCK") or 0)
    one_by_one = g.kh == g.kw == 1
    if cpu_vw(dev) == 16:
        if not config.get("CPU_CHANVEC_TILE8"):
            return None
        if one_by_one:
            if g.out_spatial >= CHANVEC8_MIN_PIXELS or g.channels >= CHANVEC8_MIN_K:
                return 8, (kb if kb > 0 else c)
        elif CHANVEC8_KXK_MIN_ROW is not None and g.out_w >= CHANVEC8_KXK_MIN_ROW:
            return 8, c
        return None
    kb = kb if kb > 0 else CHANVEC_KBLOCK_VW8
    small = g.out_spatial <= CHANVEC_KBLOCK_MAX_PIXELS
    return (6, kb) if one_by_one and small and kb < c else None


def _chanvec_pixmax(dev, mrk):
    """Most pixels of a conv_chanvec_kb chunk: its partial sums (2 vectors of
    VW floats a pixel) in at most half the device's local memory (PoCL: 2
    MiB), at most CHANVEC8_PIXMAX; a multiple of the tile's ``mrk`` rows."""
    local = int(getattr(dev, "local_mem", 0) or 0)
    per_pixel = 4 * 2 * cpu_vw(dev)
    return max(mrk, min(CHANVEC8_PIXMAX, local // 2 // per_pixel) // mrk * mrk)


def chanvec_chunk_pixels(dev, N, mr, pixmax, items):
    """Pixels per work-item of the chanvec kernels (a multiple of the tile's
    ``mr``, at most ``pixmax``) for ``items`` (panels x images) work-items
    per chunk of the plane's N pixels: halved until there are 4 work-items
    per core; then, below 8 per core, split into more chunks until the
    cores get as many work-items each (at most twice as many chunks). As
    cpu_blocks does for the GEMM: 13 panels of a 14 x 14 layer (RegNet's
    208 channels) left one core a work-item longer (2-core EPYC Zen 3,
    PoCL 3.1, interleaved: 208 -> 208 1x1 0.97, 440 -> 440 on 7 x 7
    0.96 of the unbalanced time)."""
    cores = max(int(dev.compute_units), 1)
    pix = min(-(-N // mr) * mr, pixmax)
    while items * -(-N // pix) < 4 * cores and pix > mr:
        pix = -(-(pix // 2) // mr) * mr
    chunks = -(-N // pix)
    if (items * chunks) % cores and items * chunks < 8 * cores:
        for c in range(chunks + 1, 2 * chunks + 1):
            p = -(-(-(-N // c)) // mr) * mr
            if p >= mr and (items * -(-N // p)) % cores == 0:
                return p
    return pix


def _chanvec_forward(dev, g, x, weight, y, col, bias, act, y_off, ych, weight_version,
                     residual, gate=None, gate_stride=0):
    vw = cpu_vw(dev)
    nr = 2 * vw
    M, K, N = g.out_channels, g.col_rows // g.groups, g.out_spatial
    panels = g.groups * -(-(M // g.groups) // nr)     # a group's panels its own
    act_kind, act_a, act_b = act_defines(act)
    defs = dict(VW=vw, BIAS=int(bias is not None), ACT=act_kind,
                RESIDUAL=int(residual is not None), KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw,
                DH=g.dh, DW=g.dw, GROUPS=g.groups, GATE=int(gate is not None))
    if gate is not None:
        defs.update(GATE_FLOATS=_gate_floats(dev, g))
    blocks = _chanvec_kblocks(dev, g)
    defs.update(CHANVEC_ROW_STORES=int(CHANVEC_ROW_STORES))
    pairs = gate is None and _chanvec_group_pairs(dev, g, blocks)
    if pairs:
        panels = -(-g.groups // 2)
        defs.update(GPAIR=1)
    mr, pixmax, kname, kargs = 6, -(-N // 6) * 6, "conv_chanvec", []
    if blocks:
        mr, kbc = blocks
        kname, kargs = "conv_chanvec_kb", [kbc]
        pixmax = _chanvec_pixmax(dev, mr)
        defs.update(PIXMAX=pixmax, MRK=mr)
    if not blocks and chanvec_tap_mask(g):
        defs.update(TAP_MASK=1, PH=g.ph, PW=g.pw)
    wp = dev.alloc(4 * panels * nr * K)
    out = [OnChange(dev.launch(CHANVEC_SRC, "pack_w_chanvec", (panels,), (1,),
                               [M, K, weight, wp], defs), weight_version)]
    chw = g.channels * g.height * g.width
    hw = g.height * g.width
    lpad = None if blocks else _chanvec_local_pad(dev, g, mr, panels, 2 if pairs else 1)
    if lpad:        # each work-item pads the rows it reads (LPAD_FLOATS)
        defs.update(LPAD_FLOATS=lpad[1], PH=g.ph, PW=g.pw)
        chunks = [([], 0, g.num, x, 0, chw, (g.width + 2 * g.pw, hw, g.out_w))]
    elif g.ph or g.pw:      # the zero-padded images, as the GEMM path reads them
        chunks = []
        for n0, nc in _column_chunks(dev, g):
            pre, src = _columns(dev, g, x, col, n0, nc)
            chunks.append((pre, n0, nc, src.buf, src.off, src.image_stride, src.conv[6:9]))
    else:
        chunks = [([], 0, g.num, x, 0, chw, (g.width, hw, g.out_w))]
    for pre, n0, nc, xb, xoff, xstride, (wpad, hwp, wo) in chunks:
        # each chunk of images padded into ``col`` right before its
        # convolution reads it: every chunk's copy starts at col's offset
        # 0 (with all the copies first, every chunk read the last one's
        # images -- from a batch of 16 on ResNeXt-50's 28 x 28 layers)
        out += pre
        pix = lpad[0] if lpad else chanvec_chunk_pixels(dev, N, mr, pixmax, panels * nc)
        out.append(dev.launch(
            CHANVEC_SRC, kname, (panels, -(-N // pix), nc), (1, 1, 1),
            [M, N, K, pix] + kargs +
            [wp, xb, xoff, xstride, bias if bias is not None else wp,
             y, y_off + n0 * ych * N, ych * N, residual if residual is not None else y,
             n0 * ych * N, act_a, act_b, wpad, hwp, wo, g.height, g.width,
             gate if gate is not None else wp, gate_stride], defs))
    return out


# conv_chanvec skips, tile by tile, the taps that read only padding
# (TAP_MASK) in layers where at least this share of the (output, tap)
# pairs does: dilated layers on small planes. A 3 x 3 layer with padding 1
# on 14 x 14 has 10% such pairs (the plane's border) and keeps the plain
# loop.
CHANVEC_TAP_MASK_MIN_DEAD = 0.3


def chanvec_tap_mask(g):
    """Whether conv_chanvec runs ``g`` with TAP_MASK: at least
    CHANVEC_TAP_MASK_MIN_DEAD of its (output, tap) pairs read padding, and
    its kernel's rows and columns fit the masks' bits."""
    if not (g.ph or g.pw) or g.kh > 31 or g.kw > 31:
        return False
    live = conv_taps.live_fraction(g)
    return 1.0 - live >= CHANVEC_TAP_MASK_MIN_DEAD


# conv_chanvec's padded KH x KW layers: each work-item copies the padded
# rows it reads into __local memory (LPAD_FLOATS) instead of a pad_planes
# launch before the layer, where the copy fits CHANVEC_LPAD_MAX_BYTES (and
# a quarter of the device's local memory), its chunks of pixels cut smaller
# where needed down to CHANVEC_LPAD_MIN_PIXELS. 2-core EPYC Zen 3, PoCL 3.1,
# batch 1, interleaved (see BENCHMARKS.md, thirtieth session).
CHANVEC_LOCAL_PAD = True
CHANVEC_LPAD_MAX_BYTES = 256 * 1024
CHANVEC_LPAD_MIN_PIXELS = 24


def _chanvec_local_pad(dev, g, mr, panels, groups_a_panel=1):
    """(pixels per chunk, LPAD_FLOATS) of conv_chanvec padding its own rows
    of ``g``'s images, or None (pad_planes first): the chunks of
    chanvec_chunk_pixels, halved while one's padded rows (of a panel's
    groups' channels) do not fit; LPAD_FLOATS the largest chunk's floats
    rounded up to a power of two (layers of one shape family share a
    program)."""
    if not CHANVEC_LOCAL_PAD or g.groups == 1 or not (g.ph or g.pw):
        return None
    N, wo = g.out_spatial, g.out_w
    wp = g.width + 2 * g.pw
    cin = g.channels // g.groups * groups_a_panel
    local = int(getattr(dev, "local_mem", 0) or 0)
    budget = min(CHANVEC_LPAD_MAX_BYTES, local // 4) // 4
    pix = chanvec_chunk_pixels(dev, N, mr, -(-N // mr) * mr, panels * g.num)
    while True:
        rows = max((min(N, s + pix) - 1) // wo - s // wo + 1 for s in range(0, N, pix))
        floats = 1 << (cin * ((rows - 1) * g.sh + (g.kh - 1) * g.dh + 1) * wp - 1).bit_length()
        if floats <= budget:
            return pix, floats
        if pix // 2 < max(mr, CHANVEC_LPAD_MIN_PIXELS):
            return None
        pix = -(-(pix // 2) // mr) * mr


# CPU drivers: forwards of at most DIRECT_MAX_CHANNELS input channels and
# DIRECT_MAX_OUT_CHANNELS output channels (a mobile net's first layer) run
# kernels/conv_direct.cl instead of the GEMM. When it came (8-float GEMM,
# sixteenth session): MobileNet v2's first layer (3 -> 32, 3 x 3 stride 2,
# 224 x 224) GEMM 0.40-0.56 ms at batch 1, direct 0.36. Since the GEMM's
# column packing and 16-float micro-kernel (2-core EPYC Zen 5, PoCL 3.1,
# interleaved, GEMM time / direct time at VW 16 and VW 8): 3 -> 64 at batch 1
# 0.40 / 0.79, 3 -> 32 0.71 / 1.06, 3 -> 16 1.03 / 1.51, batch 16 3 -> 32
# 0.57 / 0.83, 3 -> 64 0.47 / 0.72. In whole nets (interleaved, the same
# build with the rule widened) batch 1 read level or for the direct kernel
# (SqueezeNet 1.03, MobileNet v2 1.00, MNASNet 0.92, RegNet-Y 0.96: the
# GEMM path's padded copy and column packing find the input out of cache
# there), batch 16 for the GEMM (MobileNet v2 1.17, EfficientNet-B0 1.23,
# SqueezeNet 1.02, RegNet-Y 1.01). So:
# up to 16 output channels (MobileNet v3's first layers) at any batch,
# more only up to DIRECT_MAX_IMAGES images (not measured between 1 and
# 16). Kernels of at most DIRECT_MAX_TAPS taps: ResNet's 7 x 7 (K = 147) is
# a good GEMM (1.8 ms against 4.0 direct).
DIRECT_SRC = "conv_direct.cl"
DIRECT_MAX_CHANNELS = 4
DIRECT_MAX_OUT_CHANNELS = 16
DIRECT_MAX_IMAGES = 4
# ... and for those few images at most this many output channels. With the
# nineteenth session's kernels, batch 1 (bench_zoo --ab CPU_DIRECT_CONV=0,
# 7-9 interleaved rounds, two runs, GEMM time / direct time): SqueezeNet
# (3 -> 64) 0.92 and 0.93; the 3 -> 32 nets 0.96-1.09 (level)
DIRECT_MAX_FEW_IMAGES_OUT_CHANNELS = 32
DIRECT_MAX_TAPS = 9


def direct_forward(dev, g):
    """Whether ``forward`` of ``g`` (automatic algorithm) runs the direct
    kernel: CPU drivers, one group, at most DIRECT_MAX_CHANNELS input
    channels and DIRECT_MAX_TAPS kernel taps, output rows of at least 8
    pixels, and at most DIRECT_MAX_OUT_CHANNELS output channels, or
    DIRECT_MAX_FEW_IMAGES_OUT_CHANNELS for at most DIRECT_MAX_IMAGES images,
    or DIRECT_ROWS_MAX_OUT_CHANNELS at any batch where conv_direct_rows runs
    it (in deterministic mode the rule sees one image: the same kernel at
    every batch); setting CPU_DIRECT_CONV off: never."""
    if not _direct_fits(dev, g):
        return False
    v = _cpu_variant(dev, g)
    if v is not None:
        return v == "direct"
    num = 1 if deterministic() else g.num
    return (g.out_channels <= DIRECT_MAX_OUT_CHANNELS
            or (num <= DIRECT_MAX_IMAGES and g.out_channels <= DIRECT_MAX_FEW_IMAGES_OUT_CHANNELS)
            or (direct_rows(dev, g) and g.out_channels <= DIRECT_ROWS_MAX_OUT_CHANNELS))


def _direct_fits(dev, g):
    """Whether the direct kernel can compute ``g`` (whatever its output
    channels): CPU drivers, one group, at most DIRECT_MAX_CHANNELS input
    channels and DIRECT_MAX_TAPS taps, output rows of at least 8 pixels,
    setting CPU_DIRECT_CONV."""
    return (dev.is_cpu and g.groups == 1 and 0 < g.channels <= DIRECT_MAX_CHANNELS
            and g.kh * g.kw <= DIRECT_MAX_TAPS and g.out_w >= 8 and g.out_channels > 0
            and bool(config.get("CPU_DIRECT_CONV")))


# CPU drivers: the kernels that can run an automatic im2col forward, for
# `caffe_ocl tune` to time (pass "forward-cpu") where more than one can:
# the direct kernel (first layers), conv_chanvec.cl (small planes; needs
# the packed weights of an inference net), conv1x1_rows.cl (1x1 layers
# read from the images) and the GEMM. Their rules above
# were measured on AVX-512 CPUs (VW 16); on an AVX2 EPYC (VW 8) the same
# MobileNet v2 layers ran 0.76-1.39x the other kernel's time
# (BENCHMARKS.md, twenty-seventh session), which only timing on the
# user's CPU can settle.
CPU_FORWARD_VARIANTS = ("direct", "chanvec", "pointwise", "gemm")


def cpu_forward_variants(dev, g):
    """The CPU_FORWARD_VARIANTS that can compute ``g``'s automatic im2col
    forward on ``dev`` ([] where fewer than two can, on GPUs, in
    deterministic mode and for 1x1 products of 1 x 1 planes, which run as
    fully-connected layers)."""
    if not dev.is_cpu or deterministic() or algorithm(dev, g, pass_="forward") != "im2col" \
            or fully_connected(dev, g):
        return []
    out = [v for v, fits in (("direct", _direct_fits), ("chanvec", _chanvec_fits),
                             ("pointwise", _pointwise_fits)) if fits(dev, g)] + ["gemm"]
    return out if len(out) > 1 else []


def _cpu_variant(dev, g):
    """The forced (tuning) or stored CPU_FORWARD_VARIANTS name for ``g``, or
    None for the rules (none stored, deterministic mode, or a stored one
    that no longer applies: reported once)."""
    v = _forced_variant[0]
    if v is None and not deterministic():
        v = tuned.lookup(dev, tuned.conv_key(g, "forward-cpu", False))
        if v is not None and v not in cpu_forward_variants(dev, g):
            key = ("cpu variant", v, g)
            if key not in _warned_stale:
                _warned_stale.add(key)
                log.warning("ignoring tuned CPU forward %r for %s: it does not apply", v, g)
            v = None
    return None if v in (None, "rules") or v not in CPU_FORWARD_VARIANTS else v


# conv_direct_rows (kernels/conv_direct.cl): direct layers of stride 2
# along rows (DIRECT_ROWS_STRIDES) whose output rows are at least a tile
# long compute from a padded, de-interleaved copy of their input rows in
# __local memory (at most DIRECT_ROWS_MAX_LOCAL bytes with the weights);
# the rest run conv_direct_fwd. 2-core EPYC Zen 3, PoCL 3.1, batch 1,
# rows / fwd time (`ab_cpu_layer.py --setting conv.DIRECT_ROWS --values
# 0,1`, medians of 9 interleaved rounds): 3 -> 32, 3 -> 24, 3 -> 16 3 x 3
# stride 2 from 224 x 224 0.67-0.68. At stride 1 (one load a tap in both)
# 1.04-1.19: not taken. Against the GEMM, 3 -> 32 and 3 -> 24 stride 2
# 0.49-0.51 at batch 16; 3 -> 64 and 3 -> 48 (SqueezeNet's first layer)
# 0.64-0.71 at batch 1, 0.89 at batch 16: up to
# DIRECT_ROWS_MAX_OUT_CHANNELS outputs at any batch (direct_forward).
DIRECT_ROWS = True
DIRECT_ROWS_STRIDES = (2,)
DIRECT_ROWS_MAX_OUT_CHANNELS = 64
DIRECT_ROWS_MAX_LOCAL = 128 * 1024
# tiles of DIRECT_ROWS_CB output channels x DIRECT_ROWS_PV vectors of 8
# pixels (the kernel's DR_CB, DR_PV); rows shorter than a tile run
# conv_direct_fwd
DIRECT_ROWS_CB = 4
DIRECT_ROWS_PV = 3


def _direct_rows_local(dev, g):
    """(floats a staged row, rows staged a channel, __local bytes) of
    conv_direct_rows for ``g``."""
    rs = g.width + 2 * g.pw
    if g.sw == 2:
        rs += rs & 1
    nr = (g.kh - 1) * g.dh + 1
    blocks = -(-g.out_channels // DIRECT_ROWS_CB)
    return rs, nr, 4 * (g.channels * nr * rs
                        + blocks * DIRECT_ROWS_CB * g.channels * g.kh * g.kw)


def direct_rows(dev, g):
    """Whether the direct forward of ``g`` runs conv_direct_rows (see
    DIRECT_ROWS)."""
    return (DIRECT_ROWS and g.sw in DIRECT_ROWS_STRIDES and g.sw in (1, 2)
            and g.out_w >= 8 * DIRECT_ROWS_PV
            and _direct_rows_local(dev, g)[2] <= min(DIRECT_ROWS_MAX_LOCAL, dev.local_mem // 2))


# CPU drivers: 1x1 convolutions (stride 1, no padding, one group) on planes
# past the channel-vector kernel's read the images directly
# (kernels/conv1x1_rows.cl) instead of a GEMM that packs every block of
# pixels first, where their weights (read by every run of pixels, from L1
# or L2) are at most POINTWISE_ROWS_MAX_WEIGHTS floats. 2-core EPYC Zen
# 3, PoCL 3.1, conv1x1_rows / GEMM time (`ab_cpu_layer.py --setting
# conv.POINTWISE_ROWS --values 0,1`, medians of 7 interleaved rounds),
# batch 1: 112 x 112 32 -> 16 0.64-0.66, 16 -> 96 0.74; 56 x 56 144 -> 24
# 0.73, 24 -> 72 0.65, 64 -> 256 0.76, 256 -> 64 0.95; 28 x 28 192 -> 32
# 0.76, 64 -> 64 0.65, 58 -> 58 0.83, 32 -> 192 0.66, 40 -> 240 and 240
# -> 40 0.77; batch 16 0.74-0.78 (56 x 56 64 <-> 256 0.95-1.01). Past
# 16 K floats level: 384 -> 64 0.96, 128 -> 512 0.98, 96 -> 576 on 14 x
# 14 1.03. (Chunks of 96 pixels had left 28 x 28 planes' 9 chunks to 8
# work-items: 1.1-1.8x the GEMM's time there; now a plane's chunks match
# the work-items.) In whole nets, though, ResNet-50 with its 64 <-> 256
# layers on this kernel (16 K floats; alone 0.83-0.91, with the residual
# 0.90) read 0.965 and 0.967 (paired, 13-15 rounds; in its kernel profile
# the 64 -> 256 block ends slower than the GEMM's), DenseNet-121 with
# its 96 and 128 -> 128 ones 0.94-1.02: so at most 10 K floats (the
# mobile nets' layers, EfficientNet's 240 <-> 40).
POINTWISE_ROWS = True
POINTWISE_ROWS_SRC = "conv1x1_rows.cl"
POINTWISE_ROWS_MAX_WEIGHTS = 10240
# ... and an SE block's gate before such a projection scales its weights
# (GATE in the kernel) instead of a Scale's pass over the block's input
POINTWISE_ROWS_GATE = True
POINTWISE_ROWS_CB = 4
POINTWISE_ROWS_PV = 3
POINTWISE_ROWS_SUB = 4          # tiles a block of output channels goes over at a time


def pointwise_rows(dev, g):
    """Whether ``forward`` of ``g`` (automatic algorithm, not into a slice)
    runs conv1x1_rows: where it can (_pointwise_fits), a choice `caffe_ocl
    tune` stored (CPU_FORWARD_VARIANTS "pointwise"), else the rule above
    (not where the channel-vector kernel runs)."""
    if not _pointwise_fits(dev, g):
        return False
    v = _cpu_variant(dev, g)
    if v is not None:
        return v == "pointwise"
    return (g.out_channels * g.channels <= POINTWISE_ROWS_MAX_WEIGHTS
            and not chanvec_forward(dev, g))


def _pointwise_fits(dev, g):
    """Whether conv1x1_rows can compute ``g``: CPU drivers, 1x1, stride 1,
    no padding, one group, planes of at least one run of pixels, an im2col
    forward that is not a fully-connected one; setting POINTWISE_ROWS."""
    return (dev.is_cpu and POINTWISE_ROWS and g.kh == g.kw == 1 and g.sh == g.sw == 1
            and g.ph == g.pw == 0 and g.dh == g.dw == 1 and g.groups == 1 and g.num > 0
            and g.out_spatial >= 8 * POINTWISE_ROWS_PV and not fully_connected(dev, g)
            and algorithm(dev, g, None, "forward") == "im2col")


def _pointwise_rows_forward(dev, g, x, weight, y, bias, act, residual, gate=None,
                            gate_stride=0):
    act_kind, act_a, act_b = act_defines(act)
    hw = g.out_spatial
    pix = 8 * POINTWISE_ROWS_PV
    # as many chunks as the cores' work-items, whole runs each
    per_image = max(1, cpu_work_items(dev) // g.num)
    chunk = max(pix, hw // per_image // pix * pix)
    chunks = max(1, hw // chunk)
    return dev.launch(POINTWISE_ROWS_SRC, "conv1x1_rows",
                      (cpu_chunks(dev, g.num * chunks, min_chunk=1),), (1,),
                      [g.num, hw, chunk, x, weight, bias if bias is not None else weight, y, 0,
                       g.out_channels, residual if residual is not None else weight,
                       act_a, act_b, gate if gate is not None else weight, gate_stride],
                      dict(K=g.channels, M=g.out_channels, CB=POINTWISE_ROWS_CB,
                           PV=POINTWISE_ROWS_PV, SUB=POINTWISE_ROWS_SUB, BIAS=int(bias is not None),
                           RESIDUAL=int(residual is not None), GATE=int(gate is not None),
                           ACT=act_kind))


def _direct_forward(dev, g, x, weight, y, bias, act, y_off, ych):
    act_kind, act_a, act_b = act_defines(act)
    defs = dict(C_IN=g.channels, KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw, PH=g.ph, PW=g.pw,
                DH=g.dh, DW=g.dw, BIAS=int(bias is not None), ACT=act_kind)
    if direct_rows(dev, g):
        rs, nr, _ = _direct_rows_local(dev, g)
        items = g.num * g.out_h
        return dev.launch(DIRECT_SRC, "conv_direct_rows", (cpu_chunks(dev, items, min_chunk=1),),
                          (1,), [g.num, g.height, g.width, g.out_h, g.out_w, x, weight,
                                 bias if bias is not None else weight, y, y_off, ych,
                                 act_a, act_b], dict(defs, DR_CO=g.out_channels, RS=rs, NR=nr,
                                                    DR_CB=DIRECT_ROWS_CB, DR_PV=DIRECT_ROWS_PV))
    items = g.num * -(-g.out_channels // 8) * g.out_h
    return dev.launch(DIRECT_SRC, "conv_direct_fwd", (cpu_chunks(dev, items, min_chunk=1),),
                      (1,), [g.num, g.height, g.width, g.out_channels, g.out_h, g.out_w,
                             x, weight, bias if bias is not None else weight, y, y_off, ych,
                             act_a, act_b], defs)


def gates_backward_data(dev, g, algo=None):
    """Whether backward_data of ``g`` takes a ReLU ``gate`` (Winograd's
    output transform applies it)."""
    return algorithm(dev, g, algo, "backward_data") == "winograd"


def backward_data(dev, g, dy, weight, dx, col, accumulate=False, algo=None, gate=None):
    """dx = conv^T(dy) (+ dx if accumulate): implicit GEMM, or col = W_g^T * dy_g
    then col2im (or straight GEMM for 1x1). gate = (G, slope): dx also
    passes the backward of an in-place ReLU whose output G is (where
    gates_backward_data says so)."""
    a = algorithm(dev, g, algo, "backward_data")
    if gate is not None and a != "winograd":
        raise ValueError(f"convolution backward_data: no ReLU gate with algorithm {a!r}")
    if a == "winograd":
        return wino_ops.backward_data(dev, g, dy, weight, dx, accumulate, gate=gate)
    if a == "depthwise":
        return dw_ops.backward_data(dev, g, dy, weight, dx, accumulate)
    if a == "igemm":
        return _igemm_backward_data(dev, g, dy, weight, dx, accumulate)
    f = _flipped(g) if _packs_columns(dev, g) else None
    if f is not None:
        return _flipped_backward_data(dev, g, f, dy, weight, dx, col, accumulate)
    M = g.out_channels // g.groups
    K = g.col_rows // g.groups
    N = g.out_spatial
    if g.is_1x1:
        return _image_gemm(dev, K, g.num * N, M, weight, dy, dx, trans_a=True,
                           beta=1.0 if accumulate else 0.0, ldb=N, ldc=N, groups=g.groups,
                           stride_a=(0, M * K), stride_b=(0, M * N), stride_c=(0, K * N),
                           nsplit=N, nstride=(g.out_channels * N, g.channels * N))
    out = []
    for n0, nc in g.chunks():
        out += _image_gemm(dev, K, nc * N, M, weight, dy, col, trans_a=True,
                           off_b=n0 * g.out_channels * N, ldb=N, ldc=N, groups=g.groups,
                           stride_a=(0, M * K), stride_b=(0, M * N), stride_c=(0, K * N),
                           nsplit=N, nstride=(g.out_channels * N, g.col_rows * N))
        out.append(col2im(dev, g, nc, col, dx, n0 * g.channels * g.height * g.width,
                          accumulate))
    return out


def _flipped_backward_data(dev, g, f, dy, weight, dx, col, accumulate):
    """CPU drivers, stride 1: dx = the forward convolution ``f`` of dy with
    the flipped weight (flip_weights, into the workspace after f's padded
    dy), its columns packed by the GEMM: no col buffer and no col2im
    (CIFAR-10 quick: these were ~30% of the training step)."""
    M, K, N = f.out_channels // f.groups, f.col_rows // f.groups, f.out_spatial
    woff = _flipped_weight_offset(f)
    total = g.out_channels * g.col_rows // g.groups
    out = [dev.launch(SRC, "flip_weights", (cpu_chunks(dev, total),), (1,),
                      [total, g.out_channels // g.groups, g.channels // g.groups,
                       g.kh * g.kw, weight, col, woff])]
    for n0, nc in _column_chunks(dev, f):
        pre, src = _columns(dev, f, dy, col, n0, nc)
        out += pre
        out.append(gemm(dev, M, nc * N, K, col, src.buf, dx, off_a=woff, off_b=src.off,
                        off_c=n0 * f.out_channels * N, ldc=N, groups=f.groups,
                        beta=1.0 if accumulate else 0.0,
                        stride_a=(0, M * K), stride_b=(0, src.group_stride),
                        stride_c=(0, M * N), nsplit=N,
                        nstride=(src.image_stride, f.out_channels * N), conv=src.conv))
    return out


def weight_grad_algorithm(dev, a):
    """What computes the weight gradient when ``a`` is chosen for it:
    ``a``, except Winograd under CAFFE_OCL_WINOGRAD_BWD_WEIGHT=0 (the
    device's dense path then)."""
    if a == "winograd" and not wino_ops.bwd_weight_enabled():
        return "im2col" if dev.is_cpu else "igemm"
    return a


def backward_weight(dev, g, x, dy, dweight, col, algo=None):
    """dweight += dy_g * col_g^T summed over the images: implicit GEMM with
    K = n*HO*WO (split-K + reduce when the weight is small), or im2col +
    one GEMM per chunk of images with the images folded into K (CPU)."""
    a = weight_grad_algorithm(dev, algorithm(dev, g, algo, "backward_weight"))
    if a == "winograd":
        return wino_ops.backward_weight(dev, g, x, dy, dweight)
    if a == "depthwise":
        return dw_ops.backward_weight(dev, g, x, dy, dweight)
    if a == "igemm":
        return _igemm_backward_weight(dev, g, x, dy, dweight)
    M = g.out_channels // g.groups
    K = g.col_rows // g.groups
    N = g.out_spatial
    out = []
    # images folded into the reduction (ksplit): one GEMM per chunk of images
    for n0, nc in _column_chunks(dev, g):
        pre, src = _columns(dev, g, x, col, n0, nc)
        out += pre
        nsplit = cpu_weight_split(dev, M, K, g.groups, nc) if dev.is_cpu else 1
        if nsplit > 1:
            out += _split_weight_gemm(dev, g, M, K, N, nc, n0, nsplit, dy, src, dweight)
            continue
        out += _weight_gemm(dev, g, M, K, N, nc, n0, dy, src, dweight)
    return out


def _weight_gemm(dev, g, M, K, N, nimg, n_first, dy, src, dweight):
    """[launches]: dweight += dy * col^T over ``nimg`` images from image
    ``n_first`` (dy) whose columns are ``src`` (a _Cols), the images folded
    into K."""
    return _image_gemm(dev, M, K, nimg * N, dy, src.buf, dweight, trans_b=True, beta=1.0,
                       off_a=n_first * g.out_channels * N, off_b=src.off, lda=N, ldb=N,
                       groups=g.groups, stride_a=(0, M * N), stride_b=(0, src.group_stride),
                       stride_c=(0, M * K), ksplit=N,
                       kstride=(g.out_channels * N, src.image_stride), conv=src.conv)


def cpu_weight_split(dev, M, K, groups, nimg):
    """Image groups a CPU weight gradient is split into. Its GEMM is M x K
    (the weight) over K = images * pixels: when the weight spans fewer
    blocks of the CPU kernel than it has work-items to fill, the kernel
    would shrink its blocks and every small block packs its own long panels
    (CIFAR-10 quick's conv1, 32 x 75: 10 blocks of 18 x 16, 22 ms); instead
    each group of images gets whole blocks and the partial weights are
    summed (kernels/conv_igemm.cl splitk_reduce)."""
    bm, bn = cpu_full_blocks(M, K, cpu_nr(dev))
    blocks = -(-M // bm) * -(-K // bn)
    want = 4 * max(int(dev.compute_units), 1)
    return max(1, min(nimg, want // max(blocks * groups, 1)))


def _split_weight_gemm(dev, g, M, K, N, nc, n0, nsplit, dy, src, dweight):
    """dweight += sum over nc images (from n0) of dy * col^T, as nsplit GEMMs
    over groups of q images into partial weights ([group][split][M*K], a
    buffer of their own) summed by splitk_reduce; leftover images (nc not a
    multiple of q) accumulate straight into dweight."""
    q = nc // nsplit
    G, MK, bstride = g.groups, M * K, src.image_stride
    ws = dev.alloc(4 * G * nsplit * MK)
    launches = [gemm(dev, M, K, q * N, dy, src.buf, ws, trans_b=True, beta=0.0,
                     off_a=n0 * g.out_channels * N, off_b=src.off, lda=N, ldb=N,
                     batch=nsplit, groups=G,
                     stride_a=(q * g.out_channels * N, M * N),
                     stride_b=(q * bstride, src.group_stride),
                     stride_c=(MK, nsplit * MK), ksplit=N,
                     kstride=(g.out_channels * N, bstride), conv=src.conv)]
    gs, ls = work_size(dev, G * MK)
    launches.append(dev.launch(IGEMM_SRC, "splitk_reduce", gs, ls,
                               [G * MK, MK, nsplit, ws, 1.0, dweight], dict(MODE=-1)))
    done = q * nsplit
    if nc > done:
        rest = _Cols(src.buf, src.off + done * bstride, bstride, src.group_stride, src.conv)
        launches += _weight_gemm(dev, g, M, K, N, nc - done, n0 + done, dy, rest, dweight)
    return launches
