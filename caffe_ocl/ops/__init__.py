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


def cpu_work_items(dev):
    """The most work-items (work-groups of one) cpu_chunks makes on a CPU
    driver: CPU_CHUNKS_PER_CU a compute unit."""
    return max(int(dev.compute_units), 1) * CPU_CHUNKS_PER_CU


def cpu_chunks(dev, n, min_chunk=CPU_MIN_CHUNK):
    """How many work-items (work-groups of one) to split ``n`` units of
    contiguous work into on a CPU driver."""
    return int(max(1, min(cpu_work_items(dev), -(-max(int(n), 1) // max(int(min_chunk), 1)))))


def cpu_units_work_size(dev, units, floats):
    """(global, local) sizes on a CPU driver for a GLOBAL_LOOP kernel over
    ``units`` whole pieces of work (rows, planes, runs of a plane) that
    together touch ``floats`` floats: as many work-items (work-groups of
    one) as cpu_chunks gives the floats, at most one a unit, at least one."""
    return (max(1, min(int(units), cpu_chunks(dev, floats))),), (1,)


# GPU element-wise passes over float4s run one float4 per work-item (no
# grid-stride loop): on the H200 a 1-read-2-write pass over 196 MiB ran at
# 4.0 TB/s that way and 3.7-3.8 grid-strided over 2048 items per compute
# unit (BatchNorm -> Scale -> ReLU forward 0.192 -> 0.158 ms at 64 x 256 x
# 56 x 56); the scalar passes are left grid-strided (a 7 x 7 plane's pass,
# one float per item, ran slower: 0.030 -> 0.040 ms).
VEC_CAP_PER_CU = None


def vec_work_size(dev, n_vec, vec):
    """work_size for a pass over ``n_vec`` vectors of ``vec`` floats."""
    return work_size(dev, n_vec, cap_per_cu=VEC_CAP_PER_CU if vec == 4 else 2048)


def rows_2d(run, nrows, threads=256):
    """(global, local) of a 2-D launch over (a position in a row of
    ``run`` floats, the row) on GPUs: as many threads along the row as a
    power of two covers (up to ``threads``), the rest of the work-group
    across rows (ops/ssd.permute_runs, ops/shape.gather_axis_rows)."""
    lx = 1
    while lx < run and lx < threads:
        lx *= 2
    ly = threads // lx
    return (-(-run // lx) * lx, -(-nrows // ly) * ly), (lx, ly)


def work_size(dev, n, cap_per_cu=2048):
    """(global, local) sizes for a 1-D GLOBAL_LOOP kernel over n items.

    GPUs: work-groups of 256, grid-stride (coalesced) over at most
    ``cap_per_cu`` work-items per compute unit; ``cap_per_cu=None``: one
    item per work-item (the float4 passes: see VEC_CAP_PER_CU). CPU drivers:
    work-groups of ONE item, a few per core; GLOBAL_LOOP (common.h) then
    gives each work-item one contiguous chunk of the index range, which
    PoCL runs at memory bandwidth (the grid-stride walk of the GPU mapping
    ran 15-25x slower there)."""
    if dev.is_cpu:
        return (cpu_chunks(dev, n),), (1,)
    local = 256 if dev.is_gpu else 64
    g = round_up(max(n, 1), local)
    if cap_per_cu is not None:
        g = max(min(g, round_up(max(dev.compute_units, 1) * cap_per_cu, local)), local)
    return (g,), (local,)
