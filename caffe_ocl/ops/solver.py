"""Optimizer primitives (kernels/solvers.cl): fused SGD-family updates,
the global gradient L2 norm with its clip scale, a device-side loss
accumulator and a non-finite check.

Every function returns ``Launch`` objects bound once; per-iteration scalars
(the learning rate, a ring-buffer slot) are rebound with ``Launch.set_arg``
using the ``ARG_*`` indices below.
"""
from . import work_size

SRC = "solvers.cl"

SOLVER_KINDS = {"SGD": 0, "Nesterov": 1, "AdaGrad": 2, "RMSProp": 3, "AdaDelta": 4,
                "Adam": 5}
REG_KINDS = {None: 0, "L2": 1, "L1": 2}

ARG_LOCAL_RATE = 8      # solver_update
ARG_BLOCKS_RATE = 12    # solver_update_blocks: rate, then factor
ARG_BLOCKS_FACTOR = 13
ARG_LOSS_SLOT = 4       # loss_accum
ARG_LOSS_ACCUMULATE = 5
ARG_LOSS_DIVISOR = 6
MAX_PARTIAL_GROUPS = 64


def red_lsize(dev):
    return 256 if dev.is_gpu else 64


def update(dev, kind, n, data, diff, h, h2, clip_buf, *, accum_norm=1.0, local_decay=0.0,
           reg=None, clip=False, local_rate=0.0, momentum=0.0, momentum2=0.0, delta=0.0):
    """One fused update of a parameter of n floats: clip (by clip_buf[0]),
    normalize (accum_norm), regularize (reg "L1"/"L2" with local_decay), the
    rule of ``kind`` (a key of SOLVER_KINDS) on histories h, h2, then
    diff = update and data -= update. For RMSProp pass rms_decay as
    momentum2; for Adam beta1/beta2/eps_hat as momentum/momentum2/delta."""
    g, l = work_size(dev, n)
    defines = {"SOLVER": SOLVER_KINDS[kind], "REG": REG_KINDS[reg],
               "CLIP": int(bool(clip)), "NORM": int(accum_norm != 1.0)}
    return dev.launch(SRC, "solver_update", g, l,
                      [n, data, diff, h, h2, clip_buf, accum_norm, local_decay, local_rate,
                       momentum, momentum2, delta], defines)


def block_lsize(dev):
    """Work-group size of the per-block kernels (one group per block). On
    CPU drivers one work-item walks its block front to back: PoCL (2
    cores, a 25M-float arena) ran the SGD update at 12-16 GB/s that way
    against 5 GB/s with 16 work-items striding the block, the gradient
    clear at 5.5-6.5 against 3.4 GB/s (the converted ResNet-50's CPU step
    spent a third of its time in the two)."""
    return 256 if dev.is_gpu else 1


def update_blocks(dev, kind, nblocks, blocks, lr_mults, decays, data, diff, h, h2, clip_buf, *,
                  accum_norm=1.0, reg=None, clip=False, momentum=0.0, momentum2=0.0,
                  delta=0.0):
    """The update of ``update`` for every parameter of an arena in one launch
    (caffe_ocl/solvers/param_arena.py): ``blocks`` holds (start, length, parameter)
    per block, ``lr_mults``/``decays`` the per-parameter lr multiplier and
    local decay; the rate and its factor are rebound per iteration
    (ARG_BLOCKS_RATE, ARG_BLOCKS_FACTOR)."""
    ls = block_lsize(dev)
    defines = {"SOLVER": SOLVER_KINDS[kind], "REG": REG_KINDS[reg],
               "CLIP": int(bool(clip)), "NORM": int(accum_norm != 1.0)}
    return dev.launch(SRC, "solver_update_blocks", (nblocks * ls,), (ls,),
                      [blocks, lr_mults, decays, data, diff, h, h2, clip_buf, accum_norm,
                       momentum, momentum2, delta, 0.0, 1.0], defines)


def fill_blocks(dev, nblocks, blocks, x, value):
    """x = value over every block of an arena's table."""
    ls = block_lsize(dev)
    return dev.launch(SRC, "fill_blocks", (nblocks * ls,), (ls,), [blocks, x, float(value)])


def sumsq_groups(dev, n):
    ls = red_lsize(dev)
    return max(1, min(MAX_PARTIAL_GROUPS, -(-n // (ls * 4))))


def sumsq_partial(dev, n, x, partials, offset):
    """partials[offset:offset+sumsq_groups(dev, n)] = per-group sums of x^2."""
    ls = red_lsize(dev)
    groups = sumsq_groups(dev, n)
    return dev.launch(SRC, "sumsq_partial", (groups * ls,), (ls,), [n, x, partials, offset],
                      {"RED_LSIZE": ls})


def clip_scale(dev, m, partials, out, clip):
    """out[1] = sqrt(sum(partials[:m])); out[0] = clip/norm if norm > clip else 1."""
    ls = red_lsize(dev)
    return dev.launch(SRC, "clip_scale", (ls,), (ls,), [m, partials, out, float(clip)],
                      {"RED_LSIZE": ls})


def loss_accum(dev, n, x, w, out, slot=0, accumulate=False, divisor=1.0):
    """out[slot] = ((out[slot] if accumulate else 0) + w * sum(x[:n])) / divisor."""
    ls = red_lsize(dev)
    return dev.launch(SRC, "loss_accum", (ls,), (ls,),
                      [n, x, float(w), out, int(slot), int(bool(accumulate)), float(divisor)],
                      {"RED_LSIZE": ls})


def check_finite(dev, n, x, flags, idx):
    """flags[idx] = 1.0 when x[:n] holds a NaN or an Inf (flags is float)."""
    g, l = work_size(dev, n)
    return dev.launch(SRC, "check_finite", g, l, [n, x, flags, int(idx)])
