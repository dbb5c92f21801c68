"""Gradient averaging primitives for data-parallel training
(kernels/allreduce.cl; used by caffe_ocl.parallel)."""
from . import work_size

SRC = "allreduce.cl"


def sum_ranks(dev, n, diff, doff, peers, poff, pstride, nranks, me, scale):
    """diff[doff:doff+n] = scale * sum over ranks 0..nranks-1, in rank order,
    of rank r's n values: this rank's (``me``) from ``diff`` itself, rank r's
    from ``peers[slot * pstride + poff:...]`` with slot = r if r < me else r - 1.
    Bitwise identical on every rank."""
    g, l = work_size(dev, n)
    return dev.launch(SRC, "sum_ranks", g, l,
                      [int(n), diff, int(doff), peers, int(poff), int(pstride),
                       int(nranks), int(me), float(scale)])


def scale(dev, n, x, a, off=0):
    """x[off:off+n] *= a."""
    g, l = work_size(dev, n)
    return dev.launch(SRC, "scale_inplace", g, l, [int(n), x, int(off), float(a)])
