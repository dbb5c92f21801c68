"""1x1 convolutions with few outputs on GPUs (kernels/conv1x1_few.cl): the
batch-1 pointwise layers of mobile nets on 7 x 7 to 14 x 14 planes, which
the tile kernels cut into a handful of work-groups each waiting on memory
at every step of K. ops.conv.forward takes it instead of the implicit GEMM
for the automatic algorithm where ``applies``; backward passes are
unchanged.
"""
from collections import namedtuple

from .. import config
from .gemm import act_defines, deterministic

SRC = "conv1x1_few.cl"
MB = 8          # output channels per work-group
THREADS = 256   # work-items per work-group: PB pixels x SL slices of K
# Most steps of K per work-item (K / SL): each step waits on a load from
# L2, and a layer of this size has about one work-group per compute unit,
# so a long walk is latency the device cannot hide (ResNet-50's 1024 ->
# 256 at 14 x 14 with 4 slices: 256 steps).
MAX_STEPS = 64
# Most 64 x 64 output tiles (the implicit GEMM's small tiles) for which this
# kernel is used, per compute unit: where the tile kernels leave most of the
# device idle (H200: 18 batch-1 layers 0.90-1.98x, every net's kernel time
# level or lower; BENCHMARKS.md, twenty-first session).
MAX_TILES_PER_CU = 0.5
# Most multiply-adds (whole batch): every block of MB output channels reads
# the whole input again from L2, M / MB * K * HW floats in all, which the
# tiles (64 output channels a block) read an eighth as often. H200, batch
# 1 (bench_conv1x1_few.py, twenty-first session): ResNet-50's 51-million
# layers 0.63-1.01x of the tiles' speed (2048 -> 512 and 512 -> 2048 at
# 7 x 7: 0.63, 0.87), every layer up to 26 million 0.94-2.10x (GoogLeNet's
# 832 -> 384 at 7 x 7: 16 million, 1.29x; DenseNet's 1024 -> 128 at
# 14 x 14: 26 million, 1.51x).
MAX_MACS = 32_000_000
# Loads of the input each work-item issues before using them (kernel XB):
# same run, 18 layers, tiles / this kernel geomean 1.30 with 8, 1.16 with 1.
LOADS_IN_FLIGHT = 8


# The depthwise convolution whose output the kernel computes where it loads
# its input (DWP): geometry ``g`` (a ConvGeometry with groups == channels ==
# out_channels), its input buffer ``x``, ``weight`` (C x KH x KW), ``bias``
# (C floats or None) and activation ``act`` (ops.gemm.act_defines' spec).
DwInput = namedtuple("DwInput", "g x weight bias act")

# Most depthwise multiply-adds the fused launch may compute, summed over its
# blocks of output channels (each block computes every depthwise output it
# reads: ceil(M / MB) times the layer's own, each work-item its values one
# after another). H100, batch 1, whole nets with the rewrite against
# without, interleaved (BENCHMARKS.md, thirty-fourth session): with a bound
# of 32 million ShuffleNet v2 (every layer 3.0-3.3 million) ran 1.16x as
# fast, MobileNet v2 (5-12 million) 0.72x and MNASNet (5 x 5 taps) 0.55x.
DW_MAX_MACS = 4_000_000
# Most taps of a depthwise kernel the fused launch unrolls (7 x 7)
DW_MAX_TAPS = 49


def takes_dw(g, gd):
    """Whether ``forward`` can compute ``g``'s input as the depthwise
    convolution ``gd`` (DwInput.g) where it loads it: ``gd`` one channel
    a group, its output ``g``'s input, its kernel at most DW_MAX_TAPS taps,
    and its multiply-adds repeated for every MB output channels at most
    DW_MAX_MACS. Only the kernel's reach: ``applies``/``eligible`` say
    whether this kernel runs ``g`` at all."""
    if not (gd.groups == gd.channels == gd.out_channels == g.channels and gd.num == g.num):
        return False
    if (gd.out_h, gd.out_w) != (g.height, g.width) or gd.kh * gd.kw > DW_MAX_TAPS:
        return False
    blocks = -(-g.out_channels // MB)
    return blocks * gd.num * gd.channels * gd.out_spatial * gd.kh * gd.kw <= DW_MAX_MACS


def eligible(dev, g):
    """Whether this kernel can run ``g`` here: GPUs, a 1x1 kernel with
    stride 1 and no padding, one group, not in deterministic mode (the
    implicit GEMM's choice there is made for one image, the same at every
    batch); setting CONV_1X1_FEW off: never. `caffe_ocl tune` times it
    among the implicit GEMM's forward variants (ops/conv.py
    FORWARD_VARIANTS "few") wherever it is eligible."""
    if dev.is_cpu or g.groups != 1 or (g.kh, g.kw, g.sh, g.sw, g.ph, g.pw) != (1, 1, 1, 1, 0, 0):
        return False
    return g.channels > 0 and not deterministic() and bool(config.get("CONV_1X1_FEW"))


def applies(dev, g):
    """Whether the rules (no stored variant) run ``g`` here: ``eligible``,
    at most MAX_TILES_PER_CU 64 x 64 output tiles per compute unit and at
    most MAX_MACS multiply-adds."""
    tiles = -(-g.out_channels // 64) * -(-g.num * g.out_spatial // 64)
    macs = g.num * g.out_channels * g.channels * g.out_spatial
    return (eligible(dev, g) and macs <= MAX_MACS
            and tiles <= MAX_TILES_PER_CU * max(int(dev.compute_units), 1))


def split(k):
    """(PB, SL): pixels per work-group and slices of K: 64 x 4, or 32 x 8,
    or 16 x 16, the widest pixel run whose slices walk at most MAX_STEPS
    steps of ``k`` (16 x 16 past that)."""
    for pb in (64, 32, 16):
        sl = THREADS // pb
        if -(-k // sl) <= MAX_STEPS:
            break
    return pb, sl


def forward(dev, g, x, weight, y, bias=None, act=None, y_off=0, y_channels=None,
            residual=None, gate=None, gate_stride=0, dw=None):
    """y = act(conv(x, weight) (+ bias) (+ residual)): one launch.
    ``gate``: x's channels scaled by it first (x[n, k] * gate[n *
    gate_stride + k]; ``gate_stride`` 0: one gate for all images).
    ``dw``: a DwInput whose output is the convolution's input (``x`` is
    then not read; where ``takes_dw``; not with a gate)."""
    act_kind, act_a, act_b = act_defines(act)
    hw, M = g.out_spatial, g.out_channels
    pb, sl = split(g.channels)
    gsize = (-(-hw // pb) * THREADS, -(-M // MB), g.num)
    defines = dict(MB=MB, PB=pb, SL=sl, XB=LOADS_IN_FLIGHT, BIAS=int(bias is not None),
                   ACT=act_kind, RESIDUAL=int(residual is not None),
                   GATE=int(gate is not None))
    dw_args = [weight, weight, weight, 0.0, 0.0]
    if dw is not None:
        if gate is not None or not takes_dw(g, dw.g):
            raise ValueError(f"conv1x1_few: {g} cannot read the depthwise output {dw.g}")
        gd = dw.g
        dact, dact_a, dact_b = act_defines(dw.act)
        defines.update(DWP=1, DBIAS=int(dw.bias is not None), DACT=dact,
                       DKH=gd.kh, DKW=gd.kw, DSH=gd.sh, DSW=gd.sw, DPH=gd.ph, DPW=gd.pw,
                       DDH=gd.dh, DDW=gd.dw, DIH=gd.height, DIW=gd.width, DOW=gd.out_w)
        dw_args = [dw.x, dw.weight, dw.bias if dw.bias is not None else dw.weight,
                   dact_a, dact_b]
        x = dw.x            # not read: the argument must be a buffer
    return dev.launch(SRC, "conv1x1_few", gsize, (THREADS, 1, 1),
                      [M, g.channels, hw, x, weight, y, int(y_off),
                       int(y_channels or M), bias if bias is not None else weight,
                       act_a, act_b, residual if residual is not None else weight,
                       gate if gate is not None else weight, int(gate_stride)] + dw_args,
                      defines)
