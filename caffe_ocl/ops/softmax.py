"""Softmax over one axis of [outer][C][inner] (kernels/softmax.cl).

One work-item per (outer, inner) pair, or on GPUs: many short rows of
the last axis (attention) a few lanes per row (``use_rows``); when there
are few pairs with many channels (a classifier: 64 images x 1000 classes), one
work-group per pair sharing the pass over C (``use_groups``), or, for a
handful of pairs with tens of thousands of channels, several work-groups
per pair (``use_wide``: two launches)."""
from . import cpu_units_work_size, work_size

SRC = "softmax.cl"
GROUP_LSIZE = 256
# group kernels when pairs x GROUP_MAX_PAIRS_PER_CU stays small and C is wide
GROUP_MIN_C = 64
GROUP_MAX_PAIRS = 1 << 14
# A pair's channels split over work-groups of WIDE_CHUNK channels each
# (softmax_fwd_parts / softmax_fwd_wide) where C is at least WIDE_MIN_C and
# the pairs are fewer than half the compute units: one work-group per pair
# leaves the rest idle (LightCNN's 79077 classes at batch 1: 150 us on an
# H100, BENCHMARKS.md, thirty-sixth session).
WIDE_CHUNK = 2048
WIDE_MIN_C = 4 * WIDE_CHUNK


# Rows (inner == 1) too many for a work-group each: ROWS_LANES lanes per
# row (fewer for shorter rows), ROWS_MIN_C and up (use_rows)
ROWS_LANES = 32
ROWS_MIN_C = 8


def use_rows(dev, outer, c, inner):
    """GPUs, softmax over the last axis (attention's scores): rows too many
    for a work-group each, or too short to give a work-group's 256 lanes
    a value each (DeiT-Tiny at batch 16: 9456 rows of 197, 27 us a layer
    as work-groups)."""
    return bool(getattr(dev, "is_gpu", False)) and inner == 1 and c >= ROWS_MIN_C and (
        outer > GROUP_MAX_PAIRS or c <= GROUP_LSIZE)


def _rows_forward(dev, outer, c, x, y):
    lanes = ROWS_LANES
    while lanes > 4 and lanes >= 2 * c:
        lanes //= 2
    per_group = GROUP_LSIZE // lanes
    gs = (-(-outer // per_group) * GROUP_LSIZE,)
    return dev.launch(SRC, "softmax_fwd_rows", gs, (GROUP_LSIZE,), [outer, c, 1, x, y],
                      {"SM_LSIZE": GROUP_LSIZE, "SM_RL": lanes})


def use_groups(dev, outer, c, inner):
    return bool(getattr(dev, "is_gpu", False)) and c >= GROUP_MIN_C and \
        outer * inner <= GROUP_MAX_PAIRS


def use_wide(dev, outer, c, inner):
    return bool(getattr(dev, "is_gpu", False)) and c >= WIDE_MIN_C and \
        0 < 2 * outer * inner < max(int(getattr(dev, "compute_units", 1)), 1)


def _wide_forward(dev, outer, c, inner, x, y):
    pairs, parts = outer * inner, -(-c // WIDE_CHUNK)
    scratch = dev.shared_scratch(2 * pairs * parts)
    sizes = [outer, c, inner, parts, WIDE_CHUNK]
    gs, ls = (parts * GROUP_LSIZE, pairs), (GROUP_LSIZE, 1)
    defines = {"SM_LSIZE": GROUP_LSIZE}
    return [dev.launch(SRC, "softmax_fwd_parts", gs, ls, sizes + [x, scratch], defines),
            dev.launch(SRC, "softmax_fwd_wide", gs, ls, sizes + [x, scratch, y], defines)]


def _launch(dev, kernel, outer, c, inner, args, groups=None):
    if use_groups(dev, outer, c, inner) if groups is None else groups:
        n = outer * inner
        return dev.launch(SRC, kernel + "_group", (n * GROUP_LSIZE,), (GROUP_LSIZE,),
                          [outer, c, inner] + args, {"SM_LSIZE": GROUP_LSIZE})
    gs, ls = work_size(dev, outer * inner)
    return dev.launch(SRC, kernel, gs, ls, [outer, c, inner] + args)


def forward(dev, outer, c, inner, x, y, groups=None, wide=None, rows=None):
    """The launches (a list: two where ``use_wide``). ``groups``: force (True)
    or forbid (False) the work-group kernels; ``wide``: force or forbid the
    split of C over work-groups (before ``groups``); ``rows``: force or
    forbid softmax_fwd_rows (inner == 1; by default on GPUs where the rows
    are too many for ``groups`` or no longer than a work-group). CPU drivers:
    softmax_fwd_cpu (runs of 8 positions as vectors)."""
    if use_wide(dev, outer, c, inner) if wide is None else wide:
        return _wide_forward(dev, outer, c, inner, x, y)
    if rows if rows is not None else (groups is None and use_rows(dev, outer, c, inner)):
        if inner != 1:
            raise ValueError("softmax: the rows kernel needs inner == 1")
        return [_rows_forward(dev, outer, c, x, y)]
    if dev.is_cpu and not groups:
        g, l = cpu_units_work_size(dev, outer * -(-inner // 8), outer * c * inner)
        return [dev.launch(SRC, "softmax_fwd_cpu", g, l, [outer, c, inner, x, y])]
    return [_launch(dev, "softmax_fwd", outer, c, inner, [x, y], groups)]


def backward(dev, outer, c, inner, y, dy, dx, groups=None):
    return _launch(dev, "softmax_bwd", outer, c, inner, [y, dy, dx], groups)
