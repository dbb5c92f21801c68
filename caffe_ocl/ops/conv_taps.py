"""Convolution taps that never meet the input (ops.conv.forward).

A tap (kh, kw) of a convolution reads input row oh * SH - PH + kh * DH for
output row oh. Where that row lies in the zero padding for *every* output
row, the tap only ever multiplies zeros: DeepLab v3's ASPP branches (3 x 3,
dilation 12 / 24 / 36, padding equal to the dilation) on a 14 x 14 or
28 x 28 feature map reach past the plane on both sides whenever the
dilation is at least the plane's size, so two of the three rows and
columns of taps are dead and the layer is a 1 x 1 convolution with the
centre taps. Computing the padding cost 9x the multiply-adds, and the CPU
kernels first copied the input into a plane padded by 36 on each side (a
960-channel 14 x 14 input became 28 MB): DeepLab v3 with MobileNet v3 ran
at 0.27 of ONNX Runtime's speed, whose direct convolution skips taps
outside the input (BENCHMARKS.md, forty-second session).

Dead taps lie at the two ends of each axis (the input row moves
monotonically with the tap), so the live ones are a window of the kernel:
the forward runs as the convolution with that window of the weights (and
the padding reduced by the taps dropped before it), which reads every
input pixel the same taps did and gives the same sums. Only forwards are
rewritten (a backward pass of the dead taps adds zeros to padding, or to a
weight gradient that stays zero, as before); a window that would need
unequal padding on the two sides of an axis (some strided layers) is left
as it is. ``CAFFE_OCL_CONV_PRUNE_TAPS=0`` turns it off.
"""
from dataclasses import replace

import numpy as np

from .. import config
from .shape import crop_copy


def _tap_outputs(out, stride, pad, dil, tap, size):
    """How many of ``out`` output indices read an input index inside
    [0, size) through ``tap`` (one axis)."""
    off = tap * dil - pad                        # input index of output 0
    lo = max(0, -(off // stride))                # first output with index >= 0
    hi = min(out - 1, (size - 1 - off) // stride)
    return max(0, hi - lo + 1)


def _live(out, stride, pad, dil, taps, size):
    """(first, last) tap along one axis that reads an input index in
    [0, size) for some output index in [0, out), or None if none does."""
    live = [t for t in range(taps) if _tap_outputs(out, stride, pad, dil, t, size)]
    return (live[0], live[-1]) if live else None


def live_fraction(g):
    """The share of ``g``'s (output pixel, tap) pairs whose tap reads the
    image rather than its padding (1.0: no padding is ever read)."""
    rows = sum(_tap_outputs(g.out_h, g.sh, g.ph, g.dh, t, g.height) for t in range(g.kh))
    cols = sum(_tap_outputs(g.out_w, g.sw, g.pw, g.dw, t, g.width) for t in range(g.kw))
    return rows * cols / max(g.out_h * g.kh * g.out_w * g.kw, 1)


def pruned(g):
    """(g2, kh0, kw0): the geometry of ``g``'s forward with only its live
    taps -- rows kh0 .. kh0 + g2.kh - 1 and columns kw0 .. of the kernel --
    or None where every tap is live, none is, the setting is off, or the
    window would need unequal padding."""
    if not config.get("CONV_PRUNE_TAPS"):
        return None
    rows = _live(g.out_h, g.sh, g.ph, g.dh, g.kh, g.height)
    cols = _live(g.out_w, g.sw, g.pw, g.dw, g.kw, g.width)
    if rows is None or cols is None or (rows, cols) == ((0, g.kh - 1), (0, g.kw - 1)):
        return None
    (kh0, kh1), (kw0, kw1) = rows, cols
    kh, kw = kh1 - kh0 + 1, kw1 - kw0 + 1
    g2 = replace(g, kh=kh, kw=kw, ph=g.ph - kh0 * g.dh, pw=g.pw - kw0 * g.dw,
                 dh=g.dh if kh > 1 else 1, dw=g.dw if kw > 1 else 1)
    if g2.ph < 0 or g2.pw < 0 or (g2.out_h, g2.out_w) != (g.out_h, g.out_w):
        return None
    return g2, kh0, kw0


def weight_window(dev, g, g2, kh0, kw0, weight, dst):
    """The launch copying ``g``'s weights' live window (``pruned``) into
    ``dst`` (g2's weight layout): the Crop layer's copy, from each KH x KW
    plane of the weights the g2.kh x g2.kw one at (kh0, kw0)."""
    rows = g.out_channels * (g.channels // g.groups)
    # crop_copy's geometry: the window's shape, the weights' strides, the offsets
    geom = np.array([rows, g2.kh, g2.kw, g.kh * g.kw, g.kw, 1, 0, kh0, kw0], np.int32)
    geom_buf = dev.alloc(geom.nbytes)
    dev.upload(geom_buf, geom)
    return crop_copy(dev, rows * g2.kh * g2.kw, 3, geom_buf, weight, dst, True, row=g2.kw)
