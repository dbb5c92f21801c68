"""Per-channel broadcast and reduction primitives (kernels/channel.cl).

Blobs are viewed as ``outer x D x inner`` (Caffe's Scale/Bias pattern)."""
from . import work_size
from .gemm import act_defines

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
    # CPU drivers: contiguous chunks walked channel run by channel run
    # (no division per element); GPUs: the grid-strided kernel.
    # inner size 1 (the parameter covers the trailing axes): rows instead
    kernel = ("chan_affine" if not dev.is_cpu else
              "chan_affine_rows" if inner == 1 and dim > 1 else "chan_affine_runs")
    return dev.launch(SRC, kernel, g, l,
                      [n, dim, inner, x, scale if scale is not None else dummy,
                       bias if bias is not None else dummy, y],
                      {"HAS_SCALE": int(scale is not None), "HAS_BIAS": int(bias is not None)})


def vec_of(inner):
    """Elements per load of the per-channel kernels that take VEC: 4 (a
    float4) when channels are made of whole float4s, else 1."""
    return 4 if inner % 4 == 0 else 1


def split_chunks(dev, dim, m, wg):
    """How many work-groups share one channel of ``m`` elements in the split
    reductions: enough groups in flight to fill the device (about 8 per
    compute unit in all), but at least 8 elements per work-item per chunk."""
    want = max(dev.compute_units, 1) * 8
    per_channel = -(-want // max(int(dim), 1))
    most = max(1, int(m) // (wg * 8))
    return int(max(1, min(per_channel, most)))


# Work-items one GPU compute unit holds at once (NVIDIA: 2048), and the
# share of that a tail-mode (PART_MODE 3) group gets: it keeps five
# streams' values in registers, and on the H200 it ran best with half as
# many groups as the lighter modes.
GPU_ITEMS_PER_CU = 2048
TAIL_OCCUPANCY = 0.5


def partial_plan(dev, dim, m, tail=False):
    """(work-group size, chunks) of a ``chan_partial`` over ``dim`` channels
    of ``m`` loads each.

    GPUs: at most one wave of work-groups. Measured on the H200 (ResNet-50
    batch-64 shapes): split_chunks' "at least 8 groups per compute unit"
    gave e.g. 64 x 17 = 1088 groups for 1056 resident slots, and the 32
    groups of the second wave nearly doubled the pass (64 x 112 x 112
    statistics 0.071 ms, 2.9 TB/s; 1024 groups: 0.053, 3.9 TB/s); the tail
    mode (five streams) ran best at about half that many groups (256 x 56 x
    56: 0.317 -> 0.264 ms). Channels of fewer than 4096 loads take groups of
    128 (2048 channels of 7 x 7 x 64: 0.020 -> 0.015 ms). CPU drivers: as
    ``split_chunks``."""
    if not dev.is_gpu:
        wg = reduce_wg(dev)
        return wg, split_chunks(dev, dim, m, wg)
    wg = 256 if m >= 256 * 16 else 128
    slots = max(dev.compute_units, 1) * (GPU_ITEMS_PER_CU // wg)
    if tail:
        slots = int(slots * TAIL_OCCUPANCY)
    most = max(1, int(m) // (wg * 4))
    return wg, int(max(1, min(slots // max(int(dim), 1), most)))


def channel_partials(dev, outer, dim, inner, a, b=None, shifted=False, gated=None,
                     tail=None):
    """(launch, part, chunks): the first pass of a split per-channel
    reduction (kernels/channel.cl ``chan_partial``): part holds two sums per
    (channel, chunk): sum a and sum a*b; with ``shifted`` the shifted sums
    sum (a-K) and sum (a-K)^2 (K = the channel's first element); with
    ``gated = (gamma, beta, act)`` sum g and sum g*b, g = a * act'(gamma*b +
    beta) (the fused TRAIN BatchNorm/Scale/activation backward); with
    ``tail = (gate, c_t, out_s, c_s, out_g, slope)`` sum c_t*g and sum
    c_t*g*b, g = a * relu'(gate), writing out_s = c_s*g and out_g = g where
    those are not None (the fused residual-block tail's backward)."""
    vec = vec_of(inner)
    wg, chunks = partial_plan(dev, dim, outer * inner // vec, tail=tail is not None)
    part = dev.alloc(8 * max(int(dim), 1) * chunks)
    groups = min(int(dim) * chunks, 65536)
    mode = 2 if gated is not None else 3 if tail is not None else int(bool(shifted))
    gamma, beta, act = gated if gated is not None else (a, a, None)
    act_kind, act_a, act_b = act_defines(act)
    gate, c_t, out_s, c_s, out_g = a, 0.0, None, 0.0, None
    if tail is not None:
        gate, c_t, out_s, c_s, out_g, act_a = tail
    launch = dev.launch(SRC, "chan_partial", (max(groups, 1) * wg,), (wg,),
                        [outer, dim, inner, chunks, a, b if b is not None else a,
                         gamma, beta, float(act_a), act_b, part, gate,
                         a if out_s is None else out_s, a if out_g is None else out_g,
                         float(c_t), float(c_s)],
                        {"WG": wg, "PART_MODE": mode, "PART_B": int(b is not None),
                         "ACT": act_kind, "VEC": vec, "WRITE_S": int(out_s is not None),
                         "WRITE_G": int(out_g is not None)})
    return launch, part, chunks


def channel_sums(dev, outer, dim, inner, a, b=None, out1=None, out2=None,
                 acc1=False, acc2=False):
    """[launches]: out1[d] (+)= sum over outer and inner of a, out2[d] (+)=
    sum of a*b, in one pass over a (and b), split over many work-groups."""
    first, part, chunks = channel_partials(dev, outer, dim, inner, a, b)
    return [first, partial_finish(dev, dim, chunks, part, out1, out2, acc1, acc2)]


def partial_finish(dev, dim, chunks, part, out1=None, out2=None, acc1=False, acc2=False,
                   pairs=None):
    """The launch adding a split reduction's chunks (``part`` of
    ``channel_partials``): out1[d] (+)= the first sums, out2[d] (+)= the
    second, pairs[2d], pairs[2d+1] = both (each output optional)."""
    g, l = work_size(dev, dim)
    dummy = next(b for b in (out1, out2, pairs, part) if b is not None)
    return dev.launch(SRC, "chan_partial_sum", g, l,
                      [dim, chunks, part, out1 if out1 is not None else dummy,
                       out2 if out2 is not None else dummy, int(bool(acc1)), int(bool(acc2)),
                       pairs if pairs is not None else dummy],
                      {"WANT1": int(out1 is not None), "WANT2": int(out2 is not None),
                       "WANT_PAIRS": int(pairs is not None)})


def channel_sum(dev, outer, dim, inner, a, out, b=None, accumulate=False):
    """[launches]: out[d] (+)= sum over outer and inner of a (times b when given)."""
    if b is None:
        return channel_sums(dev, outer, dim, inner, a, out1=out, acc1=accumulate)
    return channel_sums(dev, outer, dim, inner, a, b, out2=out, acc2=accumulate)
