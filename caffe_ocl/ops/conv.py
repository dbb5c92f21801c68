"""2-D convolution primitives: im2col + GEMM, and their adjoints.

A convolution is described by ``ConvGeometry`` (one image side, one column
side). Forward of Convolution and backward-data of Deconvolution are the
same computation, and so are the reverse pair; layers pick which side is
their bottom. ``col`` workspaces hold ``chunk`` images at a time so memory
stays bounded whatever the batch size.
"""
from dataclasses import dataclass

from . import work_size
from .gemm import gemm

SRC = "im2col.cl"
# Largest column workspace (floats) a layer keeps; bigger batches are
# processed in chunks of images.
MAX_COL_FLOATS = 1 << 23


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


def _geom_args(g):
    return [g.channels, g.height, g.width, g.kh, g.kw, g.ph, g.pw, g.sh, g.sw,
            g.dh, g.dw, g.out_h, g.out_w]


def im2col(dev, g, nimg, im, off_im, col):
    gs, ls = work_size(dev, nimg * g.channels * g.out_spatial)
    return dev.launch(SRC, "im2col", gs, ls,
                      [nimg] + _geom_args(g) + [im, off_im, g.channels * g.height * g.width,
                                                col, g.col_rows * g.out_spatial])


def col2im(dev, g, nimg, col, im, off_im, accumulate=False):
    gs, ls = work_size(dev, nimg * g.channels * g.height * g.width)
    return dev.launch(SRC, "col2im", gs, ls,
                      [nimg] + _geom_args(g) + [col, g.col_rows * g.out_spatial,
                                                im, off_im, g.channels * g.height * g.width,
                                                int(bool(accumulate))])


def _cols_operand(g, im, col, n0):
    """(buffer, offset, per-image stride) of the K x HoWo column operand."""
    if g.is_1x1:
        return im, n0 * g.channels * g.height * g.width, g.channels * g.height * g.width
    return col, 0, g.col_rows * g.out_spatial


def forward(dev, g, x, weight, y, col, bias=None, act=None):
    """y[n, Co, Ho, Wo] = act(conv(x[n, C, H, W], weight[Co, C/G, KH, KW]) (+ bias)).

    ``act``: None, ("relu", negative_slope) or ("clip", lo, hi), applied in
    the GEMM epilogue (see ops.gemm.gemm)."""
    M = g.out_channels // g.groups
    K = g.col_rows // g.groups
    N = g.out_spatial
    out = []
    for n0, nc in g.chunks() if not g.is_1x1 else [(0, g.num)]:
        if not g.is_1x1:
            out.append(im2col(dev, g, nc, x, n0 * g.channels * g.height * g.width, col))
        b, boff, bstride = _cols_operand(g, x, col, n0)
        out.append(gemm(dev, M, N, K, weight, b, y,
                        off_b=boff, off_c=n0 * g.out_channels * N,
                        batch=nc, groups=g.groups,
                        stride_a=(0, M * K), stride_b=(bstride, K * N),
                        stride_c=(g.out_channels * N, M * N), bias=bias, bias_axis=0,
                        act=act))
    return out


def backward_data(dev, g, dy, weight, dx, col, accumulate=False):
    """dx = conv^T(dy): col = W_g^T * dy_g, then col2im (or straight GEMM for 1x1)."""
    M = g.out_channels // g.groups
    K = g.col_rows // g.groups
    N = g.out_spatial
    out = []
    if g.is_1x1:
        out.append(gemm(dev, K, N, M, weight, dy, dx, trans_a=True,
                        beta=1.0 if accumulate else 0.0, batch=g.num, groups=g.groups,
                        stride_a=(0, M * K), stride_b=(g.out_channels * N, M * N),
                        stride_c=(g.channels * N, K * N)))
        return out
    for n0, nc in g.chunks():
        out.append(gemm(dev, K, N, M, weight, dy, col, trans_a=True,
                        off_b=n0 * g.out_channels * N, batch=nc, groups=g.groups,
                        stride_a=(0, M * K), stride_b=(g.out_channels * N, M * N),
                        stride_c=(g.col_rows * N, K * N)))
        out.append(col2im(dev, g, nc, col, dx, n0 * g.channels * g.height * g.width,
                          accumulate))
    return out


def backward_weight(dev, g, x, dy, dweight, col):
    """dweight += dy_g * col_g^T, one image at a time (images share dweight)."""
    M = g.out_channels // g.groups
    K = g.col_rows // g.groups
    N = g.out_spatial
    out = []
    for n in range(g.num):
        if g.is_1x1:
            b, boff = x, n * g.channels * N
        else:
            out.append(im2col(dev, g, 1, x, n * g.channels * g.height * g.width, col))
            b, boff = col, 0
        out.append(gemm(dev, M, K, N, dy, b, dweight, trans_b=True, beta=1.0,
                        off_a=n * g.out_channels * N, off_b=boff, groups=g.groups,
                        stride_a=(0, M * N), stride_b=(0, K * N), stride_c=(0, M * K)))
    return out
