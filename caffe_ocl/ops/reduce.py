"""Reductions (kernels/reduce.cl): per-channel sums and Reduction's backward."""
from . import cpu_units_work_size, work_size

SRC = "reduce.cl"

TERMS = {"sum": 0, "asum": 1, "sumsq": 2, "prelu": 3}


def channel_sum(dev, outer, channels, inner, x, out, term="sum", w=None, alpha=1.0,
                accumulate=False, max_groups=4096):
    """out[c] = alpha * sum over (o, s) of term(x[o, c, s]) (+= when accumulate).

    ``w`` is the second input of the "prelu" term (top diff); other terms ignore it."""
    if dev.is_cpu and outer == 1 and term != "prelu":
        # rows of ``inner`` contiguous values: one work-item a chunk of rows
        g, l = cpu_units_work_size(dev, channels, channels * inner)
        return dev.launch(SRC, "rows_sum_cpu", g, l,
                          [channels, inner, x, out, float(alpha), int(bool(accumulate))],
                          {"TERM": TERMS[term]})
    lsize = 256 if dev.is_gpu else 64
    groups = max(1, min(channels, max_groups))
    return dev.launch(SRC, "channel_sum", (groups * lsize,), (lsize,),
                      [outer, channels, inner, x, x if w is None else w, out,
                       float(alpha), int(bool(accumulate))],
                      {"TERM": TERMS[term], "LSIZE": lsize})


def reduction_backward(dev, num, dim, x, dy, dx, coeff, term="sum"):
    """dx[r, k] = coeff * dy[r] * term'(x[r, k]) (sum/mean: 1, asum: sign, sumsq: 2x)."""
    g, l = work_size(dev, num * dim)
    return dev.launch(SRC, "reduction_bwd", g, l, [num, dim, x, dy, dx, float(coeff)],
                      {"TERM": TERMS[term]})
