"""BatchNorm / MVN primitives (kernels/normalization.cl).

Blobs are viewed as ``O x C x I``; statistics of channel c run over (o, i)
by one work-group per channel (BatchNorm: O=num, I=spatial; MVN: O=1,
C=rows, I=row length)."""
from . import work_size
from .channel import reduce_groups, reduce_wg

SRC = "normalization.cl"


def _per_channel(dev, name, C, args):
    wg = reduce_wg(dev)
    return dev.launch(SRC, name, (reduce_groups(dev, C) * wg,), (wg,), args, {"WG": wg})


def bn_train_stats(dev, O, C, I, x, mean, stdv, eps, run_mean, run_var, run_scale, maf):
    """Batch mean/stdv per channel and Caffe's moving-average update."""
    m = O * I
    corr = m / (m - 1.0) if m > 1 else 1.0
    return _per_channel(dev, "bn_train_stats", C,
                        [O, C, I, x, mean, stdv, float(eps), run_mean, run_var, run_scale,
                         float(maf), float(corr)])


def bn_global_stats(dev, C, run_mean, run_var, run_scale, mean, stdv, eps):
    g, l = work_size(dev, C)
    return dev.launch(SRC, "bn_global_stats", g, l,
                      [C, run_mean, run_var, run_scale, mean, stdv, float(eps)])


def mvn_stats(dev, rows, dim, x, mean, stdv, eps):
    return _per_channel(dev, "mvn_stats", rows, [1, rows, dim, x, mean, stdv, float(eps)])


def normalize(dev, O, C, I, x, mean, stdv, y, xnorm=None, use_std=True):
    """y = (x - mean[c]) / stdv[c] (copy to xnorm too when given)."""
    n = O * C * I
    g, l = work_size(dev, n)
    return dev.launch(SRC, "chan_normalize", g, l,
                      [n, C, I, x, mean, stdv, y, xnorm if xnorm is not None else y,
                       int(bool(use_std)), int(xnorm is not None)])


def channel_div(dev, O, C, I, x, d, y):
    n = O * C * I
    g, l = work_size(dev, n)
    return dev.launch(SRC, "chan_div", g, l, [n, C, I, x, d, y])


def normalize_backward(dev, O, C, I, dy, y, stdv, dx, use_std=True):
    """dx = (dy - mean(dy) - mean(dy*y)*y) / stdv per channel (or dy - mean(dy))."""
    return _per_channel(dev, "chan_normalize_bwd", C,
                        [O, C, I, dy, y, stdv, dx, int(bool(use_std))])
