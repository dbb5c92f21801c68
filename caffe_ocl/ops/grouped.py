"""Direct forward of grouped convolutions with few channels per group
(kernels/conv_grouped.cl), GPUs only: ResNeXt's and RegNet's 3 x 3 groups
of 4-16 channels, which the implicit GEMM ran as M = 4..16 row products in
64-128 row tiles. ops.conv.forward takes it instead of the implicit GEMM
for the automatic algorithm (``applies``); backward passes stay on the
implicit GEMM.
"""
from dataclasses import replace

from .. import config
from . import work_size
from .gemm import act_defines, deterministic

SRC = "conv_grouped.cl"
# Most input and output channels per group: beyond, a group is a GEMM big
# enough for the implicit GEMM's tiles (measured in BENCHMARKS.md).
MAX_GROUP_CHANNELS = 16
# output pixels per work-item along a row
PIXELS = 4
# Fewest work-items that make the kernel pay: H200, batch 1, against the
# implicit GEMM (whose K loop then splits over work-groups):
# ResNeXt's 56 x 56 layer (25088 items) 2.5x, its 28 x 28 one (6272) 0.94x,
# RegNet's 7 x 7 x 440 (770) 0.56x; at batch 16 the 12320 items of the
# latter 1.34x (bench_conv_epilogues.py, BENCHMARKS.md).
MIN_ITEMS = 8192


def applies(dev, g):
    """Whether ``ops.conv.forward`` (automatic algorithm) runs ``g`` here:
    GPUs, grouped (not depthwise: ops/depthwise.py), at most
    MAX_GROUP_CHANNELS input and output channels per group, at least
    MIN_ITEMS work-items (for one image in deterministic mode); setting
    GROUPED_DIRECT off: never."""
    if dev.is_cpu or g.groups <= 1 or g.channels % g.groups or g.out_channels % g.groups:
        return False
    cig, cog = g.channels // g.groups, g.out_channels // g.groups
    if g.groups == g.channels == g.out_channels:
        return False
    # deterministic mode: the choice (and so the rounding) may not depend
    # on the batch, so it is made for one image
    items = _work_items(replace(g, num=1) if deterministic() else g)
    return (cig <= MAX_GROUP_CHANNELS and cog <= MAX_GROUP_CHANNELS
            and items >= MIN_ITEMS and config.get("GROUPED_DIRECT"))


def _pixels(g):
    """PB: output pixels per work-item."""
    return min(PIXELS, g.out_w)


def _work_items(g):
    """Work-items of the forward: one per output block and pixel run."""
    return (g.num * (g.out_channels // outputs_per_item(g)) * g.out_h
            * -(-g.out_w // _pixels(g)))


def outputs_per_item(g):
    """OB: the most output channels (8, 4, 2 or 1) dividing a group's."""
    cog = g.out_channels // g.groups
    return next(ob for ob in (8, 4, 2, 1) if cog % ob == 0)


def forward(dev, g, x, weight, y, bias=None, act=None):
    """y = act(conv(x, weight) (+ bias)) for grouped ``g``: one launch."""
    act_kind, act_a, act_b = act_defines(act)
    ob, pb, total = outputs_per_item(g), _pixels(g), _work_items(g)
    defs = dict(KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw, PH=g.ph, PW=g.pw, DH=g.dh, DW=g.dw,
                CIG=g.channels // g.groups, OB=ob, PB=pb, BIAS=int(bias is not None),
                ACT=act_kind)
    gs, ls = work_size(dev, total)
    return dev.launch(SRC, "grouped_fwd", gs, ls,
                      [total, g.channels, g.height, g.width, g.out_channels, g.out_h,
                       g.out_w, g.out_channels // g.groups, x, weight,
                       bias if bias is not None else weight, y, act_a, act_b], defs)
