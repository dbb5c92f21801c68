"""Per-channel broadcast and reduction primitives (kernels/channel.cl).

Blobs are viewed as ``outer x D x inner`` (Caffe's Scale/Bias pattern)."""
from . import work_size

SRC = "channel.cl"


def reduce_wg(dev):
    """Work-group size of the per-channel reduction kernels (power of two)."""
    return 256 if dev.is_gpu else 64


def reduce_groups(dev, channels, cap=4096):
    return max(1, min(int(channels), cap))


def affine(dev, outer, dim, inner, x, y, scale=None, bias=None):
    """y = x * scale[d] + bias[d] over outer x dim x inner (either term optional)."""
    n = outer * dim * inner
    g, l = work_size(dev, n)
    dummy = scale if scale is not None else (bias if bias is not None else x)
    return dev.launch(SRC, "chan_affine", g, l,
                      [n, dim, inner, x, scale if scale is not None else dummy,
                       bias if bias is not None else dummy, y],
                      {"HAS_SCALE": int(scale is not None), "HAS_BIAS": int(bias is not None)})


def channel_sum(dev, outer, dim, inner, a, out, b=None, accumulate=False):
    """out[d] (+)= sum over outer and inner of a (times b when given)."""
    wg = reduce_wg(dev)
    return dev.launch(SRC, "chan_sum", (reduce_groups(dev, dim) * wg,), (wg,),
                      [outer, dim, inner, a, b if b is not None else a, out,
                       int(bool(accumulate))],
                      {"WG": wg, "PRODUCT": int(b is not None)})
