"""Primitives: stateless functions that build ``Launch`` objects.

Each takes the device, buffers (with element offsets) and sizes, and
returns a ``Launch`` (or a list of them) with every argument already bound,
so callers build them at reshape time and only ``run`` them afterwards.
No protobuf, no Blob: usable on their own with pyopencl buffers.
"""
from ..device import round_up

# CPU drivers: smallest contiguous chunk worth a work-item of its own, and
# how many chunks per compute unit at most (a few, so that the driver's
# dynamic scheduling evens out uneven cores).
CPU_MIN_CHUNK = 4096
CPU_CHUNKS_PER_CU = 4


def cpu_chunks(dev, n, min_chunk=CPU_MIN_CHUNK):
    """How many work-items (work-groups of one) to split ``n`` units of
    contiguous work into on a CPU driver."""
    cap = max(dev.compute_units, 1) * CPU_CHUNKS_PER_CU
    return int(max(1, min(cap, -(-max(int(n), 1) // max(int(min_chunk), 1)))))


def work_size(dev, n, cap_per_cu=2048):
    """(global, local) sizes for a 1-D GLOBAL_LOOP kernel over n items.

    GPUs: work-groups of 256, grid-stride (coalesced). CPU drivers:
    work-groups of ONE item, a few per core; GLOBAL_LOOP (common.h) then
    gives each work-item one contiguous chunk of the index range, which
    PoCL runs at memory bandwidth (the grid-stride walk of the GPU mapping
    ran 15-25x slower there)."""
    if dev.is_cpu:
        return (cpu_chunks(dev, n),), (1,)
    local = 256 if dev.is_gpu else 64
    cap = max(dev.compute_units, 1) * cap_per_cu
    g = max(min(round_up(max(n, 1), local), round_up(cap, local)), local)
    return (g,), (local,)
