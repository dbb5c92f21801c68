"""Primitives: stateless functions that build ``Launch`` objects.

Each takes the device, buffers (with element offsets) and sizes, and
returns a ``Launch`` (or a list of them) with every argument already bound,
so callers build them at reshape time and only ``run`` them afterwards.
No protobuf, no Blob: usable on their own with pyopencl buffers.
"""
from ..device import round_up


def work_size(dev, n, cap_per_cu=2048):
    """(global, local) sizes for a 1-D grid-stride kernel over n items."""
    local = 256 if dev.is_gpu else 64
    cap = max(dev.compute_units, 1) * cap_per_cu
    g = max(min(round_up(max(n, 1), local), round_up(cap, local)), local)
    return (g,), (local,)
