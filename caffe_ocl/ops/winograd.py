"""Winograd F(2x2, 3x3) / F(4x4, 3x3) / F(2x2, 5x5) convolution
(kernels/winograd.cl + ops.gemm).

For r x r kernels, r = 3 or 5, stride 1, dilation 1 (any padding), one group
or groups of at least MIN_GROUP_CHANNELS input and output channels
(AlexNet's two-group conv4/conv5): the transforms are per channel and ignore
groups; only the GEMMs become per group (ops.gemm ``groups``). With output
tiles of m x m and (m + r - 1)^2 = A input points per tile (3x3: m = 2: 4x4
input patches, A = 16 GEMMs; m = 4: 6x6, A = 36; 5x5: m = 2 only, 6x6, A =
36) each tile costs A multiply-adds per (input, output) channel pair instead
of r*r*m*m: the GEMM work is 2.25x (3x3, m = 2), 4x (3x3, m = 4) or 2.78x
(5x5) smaller than direct convolution; the price is moving the transformed
operands through memory:

    filter transform   w[Co][C][r][r]  -> U[A][Co][C]            (every call:
                                          weights change each training step)
    input transform    x[N][C][H][W]   -> V[A][C][T]             T = tiles
    A batched GEMMs    M[k] = U[k] x V[k]  (ops.gemm, batch=A)   M[A][Co][T]
    output transform   M -> y[N][Co][HO][WO], + bias, + beta*y, + activation

3x3: m = 4 (the default; env CAFFE_OCL_WINOGRAD_TILE=2 or ``tile=2`` for m
= 2) does 4x less GEMM work; its transforms (1/6, 1/24, 8) cost some accuracy:
relative L2 errors of 1.4e-6..4.5e-6 against float64 on VGG-16/ResNet-50
layer shapes, against 2e-7..7e-7 for m = 2 and for direct convolution
(benchmarks/bench_winograd.py on an H200, 2026-11-29). There m = 4 ran
1.5-3.1x faster than implicit GEMM on every VGG-16/ResNet-50 3x3 layer with
at least 64 channels, m = 2 only 0.93-2.1x, so m = 4 is the default.
5x5 always runs F(2x2, 5x5): it has the same 6 x 6 input points (0, +-1,
+-2, inf) and input transform as F(4x4, 3x3); F(4x4, 5x5) would need 8 x 8
points, whose transforms lose too many bits in float32.

Backward-data is the same pipeline on dy: the full correlation of dy with
the filter rotated 180 degrees, channels swapped (U[k][C][Co]), padding
r - 1 - pad (negative = a crop), output transform with beta = 1 to accumulate.
Backward-weight (``backward_weight``) is the adjoint of the forward
pipeline: with dM = A dy_tile A^T per m x m tile of dy (zero outside the
output) and V the forward input transform of x,

    dW[co][c] += G^T [ sum over tiles t of dM[k][co][t] V[k][c][t] ] G

i.e. A batched GEMMs dM[k] (Co x T) x V[k]^T (T x C) with the long T split
in ``nsplit`` chunks (ops.gemm batch = A, groups = nsplit) so that the small
Co x C products still fill the device, writing partial sums
dUp[A][nsplit][Co][C] (accumulated over chunks of images by the GEMM's
beta); one filter back-transform kernel sums the partials and adds
G^T . G to dW. Env CAFFE_OCL_WINOGRAD_BWD_WEIGHT=0 keeps the dense
backward-weight for Winograd layers (ops.conv).

U, V and M live in the device's shared scratch buffer (Device.shared_scratch):
images are processed in chunks so that U + V + M stays under
``MAX_WS_FLOATS`` (one image per chunk at the least).

Dispatch lives in ops.conv (``algo="winograd"``); ``use_auto`` is the rule
for the automatic choice (where its cost model says it pays, on any device;
env ``CAFFE_OCL_WINOGRAD=0/1`` forces it off / on for every eligible geometry).
"""
import contextvars
import math
from contextlib import contextmanager

from .. import config
from . import cpu_chunks, work_size
from .gemm import act_defines, gemm, gpu_tiles, use_tf32

SRC = "winograd.cl"
# Most floats of U + V + M (256 MiB); more images are processed in chunks.
MAX_WS_FLOATS = 1 << 26
ENV = "CAFFE_OCL_WINOGRAD"
TILE_ENV = "CAFFE_OCL_WINOGRAD_TILE"
# Automatic choice: estimated speedup over direct (implicit GEMM) needed.
MIN_SPEEDUP = 1.2
# FLOP/s of the GEMM over bytes/s of device memory (H200: ~35 TFLOP/s FP32
# SGEMM, ~3.5-4 TB/s effective HBM bandwidth).
FLOP_PER_BYTE = 10.0
# FP32 only: implicit-GEMM time of a 5x5 layer over the model's (its
# 25-tap gathers run below the 3x3 layers' rate): measured / model speedup
# of F(2x2, 5x5) in FP32 on the H200, batch 64: 1.10, 1.25, 1.38, 1.25
# (AlexNet's conv2, GoogLeNet's 3b and 4e, Inception-v3's 5x5); batch 16
# 1.08-2.0. With TF32 tensor cores the model alone fits (model / measured
# 1.37 / 1.20, 1.01 / 0.72, 1.04 / 0.84, 1.03 / 0.90: Winograd only for
# AlexNet's), so the factor is not applied there (bench_winograd.py,
# nineteenth session). A TF32 FLOP_PER_BYTE of 15 was tried: it fitted
# these but took the implicit GEMM for DenseNet's 128 -> 32 3x3 layers,
# which Winograd ran 1.7-2.0x faster (the model does not count the
# implicit GEMM's half-empty 64-row tiles for 32 output channels).
DIRECT_5X5_FACTOR = 1.25
_INT_MAX = (1 << 31) - 1
# Grouped convolutions: fewest channels per group (in and out) taken.
MIN_GROUP_CHANNELS = 4
# CPU drivers: fewest output tiles (whole batch, GEMM N) for Winograd. Its A
# GEMMs are Co x C x T: with fewer tiles than the CPU GEMM's column blocks
# they run slower than im2col + one GEMM. PoCL, 2 cores, F(4x4), Winograd's
# time over im2col's, forward (backward-data), with gemm_cpu.cl at VW 16 (2-core
# EPYC Zen 5, AVX-512): T = 16 (512 at 7x7 batch 4, 256 at 14x14 batch 1)
# 1.34-1.72, T = 24 1.30, T = 32 (512 at 7x7 batch 8, 256 at 14x14 batch 2)
# 0.91-0.94 (0.36-0.43), T = 49 (128 at 28x28 batch 1) 0.75 (0.43), T = 64
# 0.63-0.80 (0.51); at VW 8, T = 16 0.97-1.02, T = 24 0.84, T = 32 0.65-0.69.
# (64 before: Winograd at T = 32 had measured 0.71-0.85x the speed of im2col.)
CPU_MIN_TILES = 32
BWD_WEIGHT_ENV = "CAFFE_OCL_WINOGRAD_BWD_WEIGHT"
# Backward-weight split-K: work-groups aimed at per compute unit, and the
# fewest tiles (GEMM K) per split.
SPLIT_WAVES = 3
SPLIT_MIN_T = 256


# kernel sides r, and the output tile sides m there are transforms for
KERNELS = {3: (2, 4), 5: (2,)}


def eligible(g):
    """True for a geometry this module computes: 3x3 or 5x5, stride 1,
    dilation 1, one group or groups of >= MIN_GROUP_CHANNELS channels in and
    out (not depthwise), non-empty output."""
    grouped_ok = g.groups == 1 or (g.channels // g.groups >= MIN_GROUP_CHANNELS and
                                   g.out_channels // g.groups >= MIN_GROUP_CHANNELS)
    return (g.kh == g.kw and g.kh in KERNELS and (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1)
            and grouped_ok and g.out_h > 0 and g.out_w > 0)


def default_tile():
    """Output tile side m of 3x3 kernels: setting WINOGRAD_TILE (2 or 4),
    default 4."""
    return int(config.get("WINOGRAD_TILE"))


# Whether forwards are being built for a TRAIN net (Net and Layer enter
# ``train_forwards(their phase is TRAIN)`` where they build launches).
# There, where the GEMMs round to TF32, 3x3 forwards take
# WINOGRAD_TILE_TF32_TRAIN's tile (forward_tile): F(4x4, 3x3)'s transforms amplify the operands'
# TF32 rounding to ~10x a direct TF32 convolution's error (F(2x2): ~1.5x;
# a float64 model of one tile, 32 channels, both operands rounded), and
# those forward errors, through BatchNorm's batch statistics, put
# ResNet-18's TF32 gradients 0.37 from the float64 step against cuDNN's
# 0.11 (H200; F(2x2) forwards alone: 0.18, F(2x2) backward-data alone:
# 0.36). Backward passes and TEST nets keep WINOGRAD_TILE.
_TRAIN_FORWARDS = contextvars.ContextVar("winograd_train_forwards", default=False)


@contextmanager
def train_forwards(training=True):
    """Launches built inside are a TRAIN net's when ``training`` (see
    forward_tile); with False, nothing changes."""
    token = _TRAIN_FORWARDS.set(True) if training else None
    try:
        yield
    finally:
        if token is not None:
            _TRAIN_FORWARDS.reset(token)


def forward_tile(dev, g):
    """The output tile a forward of ``g`` built now on ``dev`` takes when
    none is asked for: 3x3, WINOGRAD_TILE_TF32_TRAIN inside train_forwards()
    where the GEMMs round to TF32 (ops.gemm.use_tf32, the tests' emulation
    included), else WINOGRAD_TILE; None for other kernels (5x5 has one)."""
    if g.kh != 3:
        return None
    if _TRAIN_FORWARDS.get() and use_tf32(dev):
        return int(config.get("WINOGRAD_TILE_TF32_TRAIN"))
    return default_tile()


def _tile(tile, r=3):
    """Output tile side for an r x r kernel: ``tile``, or the setting's
    (3x3) / 2 (5x5: the only one) when None."""
    if tile is None:
        tile = default_tile() if r == 3 else KERNELS[r][0]
    tile = int(tile)
    if tile not in KERNELS[r]:
        raise ValueError(f"winograd: tile {tile} for a {r}x{r} kernel: expected one of "
                         f"{KERNELS[r]}")
    return tile


def tile_for(g, tile=None):
    """Output tile side used for geometry ``g`` (``tile`` checked)."""
    return _tile(tile, g.kh)


def _points(m, r):
    """Input points per tile, (m + r - 1)^2: the number of batched GEMMs."""
    return (m + r - 1) ** 2


def batch_tiles(g, m):
    """Output tiles of side m over the whole batch (the GEMMs' N)."""
    return g.num * (-(-g.out_h // m)) * (-(-g.out_w // m))


def estimated_speedup(g, tile=None, tf32=False):
    """Model of direct time / Winograd time for ``g`` on a GPU (5x5
    kernels: times DIRECT_5X5_FACTOR unless ``tf32``, TF32 tensor-core
    GEMMs).

    Per m x m tile (A = (m+r-1)^2) and (C, Co) pair direct does r^2 m^2 MACs,
    Winograd A (2.25x less GEMM work for m = 2, 4x for m = 4), wasting the
    part of the last tile row/column outside the output (odd HO, WO). The
    transforms move ~(2A + m^2) (C + Co) floats per tile (V and M written
    once and read once, plus x and y); at FLOP_PER_BYTE their time relative
    to the 2*A*C*Co-FLOP GEMM is 4 (2A + m^2) FLOP_PER_BYTE / (2A) (1/C + 1/Co)
    (m = 2: 45 (1/C + 1/Co)). Grouped: C and Co per group (the GEMMs shrink
    by the group count, the transforms do not). The filter transform, done
    once per call, reads r^2 and writes A floats per (C, Co) pair against the
    GEMM's 2 A T FLOPs (T = tiles of the whole batch): 2 (r^2 + A)
    FLOP_PER_BYTE / (A T) more, which decides at batch 1 and small maps
    (ResNet-50's 512-channel 7x7 layers at batch 1: T = 4).
    m = 2: C = Co = 64: 0.93 (no gain; GEMMs with K = 64 are also below
    peak); C = Co = 128: 1.32; 256: 1.67; 512: 1.91; 512 at 7x7: 1.47."""
    r = g.kh
    m = _tile(tile, r)
    a = _points(m, r)
    waste = (m * (-(-g.out_h // m)) * m * (-(-g.out_w // m))) / float(g.out_h * g.out_w)
    k = 4.0 * (2 * a + m * m) * FLOP_PER_BYTE / (2.0 * a)
    mem = k * g.groups * (1.0 / g.channels + 1.0 / g.out_channels)
    mem += 2.0 * (r * r + a) * FLOP_PER_BYTE / (a * max(batch_tiles(g, m), 1))
    direct = DIRECT_5X5_FACTOR if r == 5 and not tf32 else 1.0
    return direct * float(r * r * m * m) / a / waste / (1.0 + mem)


def model_tf32(dev):
    """Whether ``dev``'s GEMMs run on TF32 tensor cores (ops.gemm.use_tf32
    == 1: NVIDIA with setting TF32; not the tests' emulation)."""
    return use_tf32(dev) == 1


def env_override():
    """True / False when CAFFE_OCL_WINOGRAD forces Winograd on / off, else None."""
    return config.get("WINOGRAD")


def use_auto(dev, g, tile=None):
    """Should ops.conv pick Winograd for ``g`` when no algorithm is asked
    for? Forced by the env variable; otherwise when ``estimated_speedup`` >=
    MIN_SPEEDUP, on GPUs and CPU drivers alike (PoCL, 2 cores, batch 16,
    ResNet 3x3 layers of 64/128/256 channels: 1.75-2.1x im2col + GEMM, the
    same rule as on the H200 where it gave 1.5-3.1x), and on CPU drivers
    only with at least CPU_MIN_TILES output tiles in the batch. ``tile``:
    the 3x3 output tile judged (None: the setting's)."""
    if not eligible(g) or not fits(g, tile):
        return False
    forced = env_override()
    if forced is not None:
        return forced
    if getattr(dev, "is_cpu", False) and batch_tiles(g, tile_for(g, tile)) < CPU_MIN_TILES:
        return False
    return estimated_speedup(g, tile, tf32=model_tf32(dev)) >= MIN_SPEEDUP


def fits(g, tile=None):
    """True when ``g`` stays within the kernels' 32-bit indexing (one image
    per chunk at the least)."""
    m = tile_for(g, tile)
    A = _points(m, g.kh)
    tiles = -(-g.out_h // m) * -(-g.out_w // m)
    ws = A * (g.channels * g.out_channels // g.groups + (g.channels + g.out_channels) * tiles)
    return max(ws, g.num * max(g.channels * g.height * g.width,
                               g.out_channels * g.out_spatial)) <= _INT_MAX


def chunk_images(num, cin, cout, tiles_per_image, cap=None, tile=2, r=3):
    """Images per chunk so that U + V + M <= cap floats (at least one)."""
    cap = MAX_WS_FLOATS if cap is None else cap
    a = _points(tile, r)
    per = a * (cin + cout) * tiles_per_image
    room = cap - a * cin * cout
    return balanced_chunk(num, room // max(per, 1), tiles_per_image)


def balanced_chunk(num, most, tiles_per_image):
    """Images per chunk, at most ``most`` (at least one): as few chunks as
    that allows, of even sizes, and a chunk's tiles (the GEMMs' row length)
    a multiple of 4 where possible, so its rows start on 16 bytes and GPU
    TF32 GEMMs take the cp.async loop. VGG-16's 512-channel layers at
    28 x 28 (49 tiles per image) went in chunks of 31, 31 and 2 images:
    rows of 1519 tiles, the register-staged loop, and a nearly empty
    last chunk; now 24, 24, 16."""
    most = max(1, min(num, most))
    if most == num:
        return num
    chunks = -(-num // most)
    even = -(-num // chunks)
    q = 4 // math.gcd(tiles_per_image, 4)       # images per whole 16 bytes of tiles
    up = -(-even // q) * q
    if up <= most:
        return up
    return most // q * q if most >= q else most


# kernels/winograd.cl wino_input_rows: the widest strip of tiles it holds
ROWMAX = 1030
# CPU drivers: fewest strips per work-item of wino_input_rows
STRIPS_MIN_CHUNK = 8


# GPU transforms: one work-item per tile, filter or output position, no
# grid-stride cap (ops.work_size's cap_per_cu): VGG-16 TF32 training on the
# H200 45.7 -> 45.2 ms with it (ResNet-50 unchanged), same session.
TRANSFORM_CAP_PER_CU = None


def _kstride(n):
    """Floats between the WA*WA matrices of V / M holding n floats each: n
    rounded up to an odd number of 16 floats (64-byte lines). The transforms
    write (or read) all WA*WA matrices at once; at a multiple of 4 KiB apart
    (64 channels x 3136 tiles) those streams all fall in one cache set and
    PoCL's input transform ran 1.8x slower than with 63 channels."""
    m = -(-n // 16) * 16
    return m if (m // 16) % 2 else m + 16


def _input_launch(dev, nimg, cin, h, w, th, tw, ph, pw, Tp, ks, x, off_x, ws, off_v, defs,
                  strips=None):
    """The input transform V of ``nimg`` images: on CPU drivers by strips of
    tiles (wino_input_rows: each input element read once per strip, the
    column transform shared by a strip's tiles; 64 channels of 56x56 at
    batch 16 on 2 cores: see BENCHMARKS.md), else one work-item per tile.
    strips: force (True) or forbid (False) the strip kernel (tests)."""
    if strips is None:
        strips = dev.is_cpu
    if strips and defs["WM"] * tw + defs["WR"] - 1 <= ROWMAX:
        n = cin * nimg * th
        if dev.is_cpu:
            # a strip is a whole row of tiles (hundreds of floats read and
            # 36 x as many written): the element-wise chunking (thousands of
            # items per work-item) gave DenseNet-121's batch-1 layers (1792
            # strips) one work-item, one core of two
            gs, ls = (cpu_chunks(dev, n, min_chunk=STRIPS_MIN_CHUNK),), (1,)
        else:
            gs, ls = work_size(dev, n, cap_per_cu=TRANSFORM_CAP_PER_CU)
        return dev.launch(SRC, "wino_input_rows", gs, ls,
                          [nimg, cin, h, w, th, tw, ph, pw, Tp, ks, x, off_x, ws, off_v], defs)
    gs, ls = work_size(dev, cin * Tp, cap_per_cu=TRANSFORM_CAP_PER_CU)
    return dev.launch(SRC, "wino_input", gs, ls,
                      [nimg, cin, h, w, th, tw, ph, pw, Tp, ks, x, off_x, ws, off_v], defs)


# kernels/winograd.cl wino_filter_lines: filters per step
FILTER_BLOCK = 64


def _filter_launch(dev, wco, wc, flip, weight, ws, defs):
    """The filter transform U (at ws[0]): on CPU drivers FILTER_BLOCK
    filters per step (wino_filter_lines, whole cache lines per U[k]), else
    one per work-item."""
    args = [wco, wc, int(bool(flip)), weight, 0, ws, 0]
    if dev.is_cpu:
        n = cpu_chunks(dev, -(-wco * wc // FILTER_BLOCK), min_chunk=16)
        return dev.launch(SRC, "wino_filter_lines", (n,), (1,), args, defs)
    gs, ls = work_size(dev, wco * wc, cap_per_cu=TRANSFORM_CAP_PER_CU)
    return dev.launch(SRC, "wino_filter", gs, ls, args, defs)


def filter_floats(g, tile=None):
    """Floats of the forward filter transform U of ``g`` (``forward``'s
    ``u_buf``)."""
    return _points(tile_for(g, tile), g.kh) * (g.channels // g.groups) * g.out_channels


def output_rows(dev, m, tw, beta, act_kind):
    """Whether the output transform runs by strips of tiles, 8 at a time
    (winograd.cl wino_output_rows): CPU drivers, F(4x4), rows of at least
    8 tiles, no beta (the last 8 of a strip overlap the ones before) and
    an activation of the forward's (none, ReLU, clip)."""
    return dev.is_cpu and m == 4 and tw >= 8 and beta == 0.0 and act_kind <= 2


def output_runs(dev, m, T, beta, act_kind):
    """Whether the output transform runs by runs of 8 consecutive tiles of
    a channel across rows and images (winograd.cl wino_output_runs), where
    the strips of output_rows do not apply: CPU drivers, F(4x4), at least 8
    tiles in the chunk, no beta, an activation of the forward's; setting
    CPU_WINO_RUNS."""
    return (dev.is_cpu and m == 4 and T >= 8 and beta == 0.0 and act_kind <= 2
            and bool(config.get("CPU_WINO_RUNS")))


# wino_output_runs: at least this many runs (of 8 tiles) per work-item
RUNS_MIN_CHUNK = 4


def _pipeline(dev, num, cin, h, w, cout, ho, wo, ph, pw, x, weight, flip, y,
              bias, act, beta, gemm_impl, tile, groups=1, gate=None, u_buf=None, r=3,
              y_off=0, y_channels=None):
    """gate: (G, slope): y = y if G > 0 else slope * y elementwise (the
    gradient gate of an in-place ReLU whose output G is; instead of act).
    u_buf: a buffer of its own for the filter transform U (the first
    launch; the caller may run it only when the weights change) instead
    of the shared scratch. y_off, y_channels: y's images lie y_channels *
    ho * wo floats apart from y_off on (a slice of a Concat's top; the
    gate, shaped as y's own images, is read from 0, cout channels apart)."""
    act_kind, act_a, act_b = act_defines(act)
    if act_kind > 2:        # its output transform knows ReLU and clip (3: the gate)
        raise ValueError(f"winograd: activation {act!r} is not in its output transform")
    gate_buf = y
    if gate is not None:
        gate_buf, act_kind, act_a, act_b = gate[0], 3, float(gate[1]), 0.0
    m = _tile(tile, r)
    A = _points(m, r)
    defs = dict(WM=m, WR=r)
    th, tw = -(-ho // m), -(-wo // m)
    tiles = th * tw
    G = groups
    cg, cog = cin // G, cout // G                  # channels per group, in and out
    chunk = chunk_images(num, cin, cout, tiles, tile=m, r=r)
    tmax = chunk * tiles
    u_fl, v_fl, m_fl = A * cg * cout, A * _kstride(cin * tmax), A * _kstride(cout * tmax)
    if max(u_fl + v_fl + m_fl, num * max(cin * h * w, cout * ho * wo)) > _INT_MAX:
        raise ValueError(f"winograd: tensors of {num}x{cin}x{h}x{w} -> {cout}x{ho}x{wo} "
                         "exceed 32-bit indexing")
    u_ws = u_fl if u_buf is None else 0           # U in the scratch, or in u_buf
    ws = dev.shared_scratch(u_ws + v_fl + m_fl)
    off_v, off_m = u_ws, u_ws + v_fl
    # weight is [Co][C/G][r][r] of the convolution; backward-data (flip) runs
    # from its Co channels (cin here) to its C channels (cout here).
    # U[k] is [cout][cin/G] (forward) or [cout/G][cin] (flip: transposed per
    # group): the A operand of group j starts at j*cog*cg or at column j*cg.
    wco, wc = (cin, cog) if flip else (cout, cg)
    a_ld, a_gstride = (cin, cg) if flip else (cg, cog * cg)
    ub = ws if u_buf is None else u_buf
    yc = cout if y_channels is None else y_channels
    out = [_filter_launch(dev, wco, wc, flip, weight, ub, defs)]
    for n0 in range(0, num, chunk):
        nc = min(chunk, num - n0)
        y_at = y_off + n0 * yc * ho * wo
        T = nc * tiles
        ksv, ksm = _kstride(cin * T), _kstride(cout * T)
        out.append(_input_launch(dev, nc, cin, h, w, th, tw, ph, pw, T, ksv, x,
                                 n0 * cin * h * w, ws, off_v, defs))
        out.append(gemm(dev, cog, T, cg, ub, ws, ws, off_a=0, off_b=off_v, off_c=off_m,
                        lda=a_ld, ldb=T, ldc=T, batch=A, groups=G,
                        stride_a=(cout * cg, a_gstride), stride_b=(ksv, cg * T),
                        stride_c=(ksm, cog * T), impl=gemm_impl))
        if output_rows(dev, m, tw, beta, act_kind):
            strips = cout * nc * th
            out.append(dev.launch(SRC, "wino_output_rows",
                                  (cpu_chunks(dev, strips, min_chunk=STRIPS_MIN_CHUNK),), (1,),
                                  [nc, cout, ho, wo, th, tw, ksm, ws, off_m,
                                   bias if bias is not None else ws, int(bias is not None),
                                   act_kind, act_a, act_b, y, y_at, yc], defs))
            continue
        if output_runs(dev, m, T, beta, act_kind):
            runs = cout * -(-T // 8)
            items = cpu_chunks(dev, runs, min_chunk=RUNS_MIN_CHUNK)
            out.append(dev.launch(SRC, "wino_output_runs", (items,), (1,),
                                  [nc, cout, ho, wo, th, tw, ksm, -(-runs // items), ws, off_m,
                                   bias if bias is not None else ws, int(bias is not None),
                                   act_kind, act_a, act_b, y, y_at, yc], defs))
            continue
        gs, ls = work_size(dev, cout * T, cap_per_cu=TRANSFORM_CAP_PER_CU)
        out.append(dev.launch(SRC, "wino_output", gs, ls,
                              [nc, cout, ho, wo, th, tw, ksm, ws, off_m,
                               bias if bias is not None else ws, int(bias is not None),
                               float(beta), act_kind, act_a, act_b,
                               y, y_at, yc, gate_buf, n0 * cout * ho * wo], defs))
    return out


def check_eligible(g):
    if not eligible(g):
        raise ValueError(f"convolution algorithm 'winograd' needs a 3x3 or 5x5 kernel, "
                         f"stride 1, dilation 1 and one group or groups of at least "
                         f"{MIN_GROUP_CHANNELS} channels; got kernel {g.kh}x{g.kw}, stride "
                         f"{g.sh}x{g.sw}, dilation {g.dh}x{g.dw}, {g.channels} -> "
                         f"{g.out_channels} channels in {g.groups} groups")


def forward(dev, g, x, weight, y, bias=None, act=None, beta=0.0, gemm_impl=None,
            tile=None, u_buf=None, y_off=0, y_channels=None):
    """[launches]: y = act(conv(x, weight) + bias + beta * y) (signature of
    ops.conv._igemm_forward; ``act`` as ops.gemm.gemm). ``gemm_impl`` picks
    the GEMM kernel (tests run the GPU tiles on PoCL); ``tile``: output
    tile side 2 or 4 for 3x3 (None: ``default_tile()``), 2 for 5x5.
    ``u_buf``: at least ``filter_floats(g, tile)`` floats of its own for
    the filter transform, the first launch (ops.conv.forward then runs it
    only after the weights changed); None: in the shared scratch, every
    pass. ``y_off``, ``y_channels``: as ops.conv.forward's (a slice of a
    Concat's top)."""
    check_eligible(g)
    if tile is None:
        tile = forward_tile(dev, g)
    return _pipeline(dev, g.num, g.channels, g.height, g.width, g.out_channels,
                     g.out_h, g.out_w, g.ph, g.pw, x, weight, False, y,
                     bias, act, beta, gemm_impl, tile, g.groups, u_buf=u_buf, r=g.kh,
                     y_off=y_off, y_channels=y_channels)


def backward_data(dev, g, dy, weight, dx, accumulate=False, gemm_impl=None, tile=None,
                  gate=None):
    """[launches]: dx = conv^T(dy) (+ dx if accumulate): the full
    correlation of dy with rot180(weight)^T, padding 2 - pad. gate = (G,
    slope): dx then passes an in-place ReLU's backward (G its output).
    Padding r - 1 - pad."""
    check_eligible(g)
    if gate is not None and accumulate:
        raise ValueError("winograd backward_data: a ReLU gate needs accumulate=False")
    return _pipeline(dev, g.num, g.out_channels, g.out_h, g.out_w, g.channels,
                     g.height, g.width, g.kh - 1 - g.ph, g.kw - 1 - g.pw, dy, weight, True,
                     dx, None, None, 1.0 if accumulate else 0.0, gemm_impl, tile, g.groups,
                     gate=gate, r=g.kh)


def bwd_weight_enabled():
    """False when env CAFFE_OCL_WINOGRAD_BWD_WEIGHT=0 keeps the dense
    backward-weight for Winograd layers (read when launches are built)."""
    return config.get("WINOGRAD_BWD_WEIGHT")


def weight_split(dev, cin, cout, T, tile=None, r=3):
    """Split-K count of the backward-weight GEMMs (Co x C, K = T tiles):
    enough splits that A * nsplit * (GEMM tiles of Co x C) work-groups make
    ~SPLIT_WAVES per compute unit, at least SPLIT_MIN_T tiles per split,
    partials under a quarter of MAX_WS_FLOATS."""
    m = _tile(tile, r)
    A = _points(m, r)
    t = gpu_tiles(dev, cout)
    wgs = A * -(-cout // t["TM"]) * -(-cin // t["TN"])
    want = -(-SPLIT_WAVES * max(int(dev.compute_units), 1) // wgs)
    room = (MAX_WS_FLOATS // 4) // max(A * cin * cout, 1)
    return max(1, min(want, T // SPLIT_MIN_T, room))


def _split_len(T, nsplit):
    """Tiles per split: ceil(T / nsplit), a multiple of 16 (the GPU GEMM's
    K step) once over 64."""
    kc = -(-T // nsplit)
    return -(-kc // 16) * 16 if kc > 64 else kc


def backward_weight(dev, g, x, dy, dweight, gemm_impl=None, tile=None):
    """[launches]: dweight += dW of conv(x, .) against dy (Caffe's
    accumulating parameter gradient), by Winograd F(m x m, r x r): forward
    input transform of x, adjoint output transform of dy, split-K batched
    GEMMs into partials, filter back-transform (sums the partials, adds
    to dweight). Images in chunks under MAX_WS_FLOATS."""
    check_eligible(g)
    r = g.kh
    m = _tile(tile, r)
    A = _points(m, r)
    defs = dict(WM=m, WR=r)
    num, cin, h, w = g.num, g.channels, g.height, g.width
    cout, ho, wo = g.out_channels, g.out_h, g.out_w
    G = g.groups
    cg, cog = cin // G, cout // G
    th, tw = -(-ho // m), -(-wo // m)
    tiles = th * tw
    nsplit = weight_split(dev, cg, cout, num * tiles, m, r)
    p_fl = A * nsplit * cg * cout
    per = A * (cin + cout) * tiles
    room = MAX_WS_FLOATS - p_fl - A * (cin + cout) * nsplit * 16     # padding tiles
    chunk = balanced_chunk(num, room // max(per, 1), tiles)
    nsplit = max(1, min(nsplit, weight_split(dev, cg, cout, chunk * tiles, m, r)))
    p_fl = A * nsplit * cg * cout
    tp_max = nsplit * _split_len(chunk * tiles, nsplit)
    v_fl, m_fl = A * _kstride(cin * tp_max), A * _kstride(cout * tp_max)
    if max(p_fl + v_fl + m_fl, num * max(cin * h * w, cout * ho * wo)) > _INT_MAX:
        raise ValueError(f"winograd: tensors of {num}x{cin}x{h}x{w} -> {cout}x{ho}x{wo} "
                         "exceed 32-bit indexing")
    ws = dev.shared_scratch(p_fl + v_fl + m_fl)
    off_v, off_m = p_fl, p_fl + v_fl
    out = []
    for n0 in range(0, num, chunk):
        nc = min(chunk, num - n0)
        T = nc * tiles
        kc = _split_len(T, nsplit)
        Tp = nsplit * kc
        ksv, ksm = _kstride(cin * Tp), _kstride(cout * Tp)
        out.append(_input_launch(dev, nc, cin, h, w, th, tw, g.ph, g.pw, Tp, ksv, x,
                                 n0 * cin * h * w, ws, off_v, defs))
        gs, ls = work_size(dev, cout * Tp, cap_per_cu=TRANSFORM_CAP_PER_CU)
        out.append(dev.launch(SRC, "wino_output_grad", gs, ls,
                              [nc, cout, ho, wo, th, tw, Tp, ksm, dy, n0 * cout * ho * wo,
                               ws, off_m], defs))
        # dUp[k][s] (+)= dM[k][:, s*kc : (s+1)*kc] x V[k][:, s*kc : (s+1)*kc]^T,
        # dUp[k][s] being [cout][cin/G]: group j's rows of dM against its rows of V
        for j in range(G):
            out.append(gemm(dev, cog, cg, kc, ws, ws, ws, trans_b=True,
                            beta=0.0 if n0 == 0 else 1.0,
                            off_a=off_m + j * cog * Tp, off_b=off_v + j * cg * Tp,
                            off_c=j * cog * cg, lda=Tp, ldb=Tp, ldc=cg,
                            batch=A, groups=nsplit,
                            stride_a=(ksm, kc), stride_b=(ksv, kc),
                            stride_c=(nsplit * cout * cg, cout * cg), impl=gemm_impl))
    gs, ls = work_size(dev, cout * cg, cap_per_cu=TRANSFORM_CAP_PER_CU)
    out.append(dev.launch(SRC, "wino_filter_grad", gs, ls,
                          [cout, cg, nsplit, ws, 0, dweight, 0], defs))
    return out
