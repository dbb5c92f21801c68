"""Convolutions over other than 2 spatial axes (1-D, 3-D, ...), as Caffe's
N-D path: per image, im2col_nd (kernels/im2col_nd.cl) then one GEMM per
group; backward-data by GEMM then col2im_nd; weight gradients by GEMM over
each image's columns. 2-D convolutions never come here (ops/conv.py has
their faster algorithms); this path is plain and exact, not tuned.

``NdGeometry`` mirrors ops.conv.ConvGeometry: the image side (``channels``
x ``shape``) and the column side (``out_channels`` x ``out_shape``), so a
Deconvolution uses the same functions with its sides swapped."""
import math
from dataclasses import dataclass

import numpy as np

from . import work_size
from .gemm import gemm

SRC = "im2col_nd.cl"


@dataclass(frozen=True)
class NdGeometry:
    num: int
    channels: int
    shape: tuple            # image side, per spatial axis
    out_channels: int
    kernel: tuple
    pad: tuple
    stride: tuple
    dilation: tuple
    groups: int = 1

    @property
    def out_shape(self):
        return tuple((i + 2 * p - ((k - 1) * d + 1)) // s + 1 for i, k, p, s, d in
                     zip(self.shape, self.kernel, self.pad, self.stride, self.dilation))

    @property
    def col_rows(self):
        return self.channels * math.prod(self.kernel)

    @property
    def out_spatial(self):
        return math.prod(self.out_shape)

    @property
    def in_spatial(self):
        return math.prod(self.shape)

    def col_floats(self):
        return self.col_rows * self.out_spatial


def geometry_buffer(dev, g):
    """The ints the kernels read (channels, then per axis: in, out, kernel,
    pad, stride, dilation)."""
    vals = [g.channels, *g.shape, *g.out_shape, *g.kernel, *g.pad, *g.stride, *g.dilation]
    host = np.asarray(vals, np.int32)
    buf = dev.alloc(4 * len(vals))
    dev.upload(buf, host)
    dev.finish()                 # the host array goes away with this call
    return buf


def _im2col(dev, g, geo, x, off, col):
    n = g.col_floats()
    gs, ls = work_size(dev, n)
    return dev.launch(SRC, "im2col_nd", gs, ls, [n, x, off, col, geo],
                      {"NAXES": len(g.shape)})


def _col2im(dev, g, geo, col, x, off, accumulate):
    n = g.channels * g.in_spatial
    gs, ls = work_size(dev, n)
    return dev.launch(SRC, "col2im_nd", gs, ls, [n, col, x, off, geo, int(accumulate)],
                      {"NAXES": len(g.shape)})


def _group_strides(g):
    M, K, P = g.out_channels // g.groups, g.col_rows // g.groups, g.out_spatial
    return M, K, P


def forward(dev, g, geo, x, weight, y, col, bias=None):
    """y[n] = W * im2col(x[n]) (+ bias), per group."""
    M, K, P = _group_strides(g)
    out = []
    for n in range(g.num):
        out.append(_im2col(dev, g, geo, x, n * g.channels * g.in_spatial, col))
        out.append(gemm(dev, M, P, K, weight, col, y, off_c=n * g.out_channels * P,
                        groups=g.groups, stride_a=(0, M * K), stride_b=(0, K * P),
                        stride_c=(0, M * P), bias=bias, bias_axis=0))
    return out


def backward_data(dev, g, geo, dy, weight, dx, col, accumulate=False):
    """dx[n] (+)= col2im(W^T * dy[n]), per group."""
    M, K, P = _group_strides(g)
    out = []
    for n in range(g.num):
        out.append(gemm(dev, K, P, M, weight, dy, col, trans_a=True,
                        off_b=n * g.out_channels * P, groups=g.groups,
                        stride_a=(0, M * K), stride_b=(0, M * P), stride_c=(0, K * P)))
        out.append(_col2im(dev, g, geo, col, dx, n * g.channels * g.in_spatial, accumulate))
    return out


def backward_weight(dev, g, geo, x, dy, dweight, col):
    """dW += sum over images of dy[n] * im2col(x[n])^T, per group."""
    M, K, P = _group_strides(g)
    out = []
    for n in range(g.num):
        out.append(_im2col(dev, g, geo, x, n * g.channels * g.in_spatial, col))
        out.append(gemm(dev, M, K, P, dy, col, dweight, trans_b=True, beta=1.0,
                        off_a=n * g.out_channels * P, groups=g.groups,
                        stride_a=(0, M * P), stride_b=(0, K * P), stride_c=(0, M * K)))
    return out
