"""Where the device memory of a training step goes.

Builds a net's train prototxt fed by Input layers (benchmarks/common.py),
makes an SGD Solver for it, runs one step on the current device and splits
what caffe_ocl's buffer pool holds into categories:

    params        learnable (and BatchNorm statistics) blob data
    param diffs   their gradients
    history       the solver's history (momentum) blobs
    act data      activation (net) blob data, one per storage (Split tops
                  and views share their bottom's)
    act diffs     activation blob diffs, one per storage (the diff plan of
                  caffe_ocl/memory_plan.py shares them)
    layer temps   buffers a layer keeps for itself (BatchNorm x_norm, Scale
                  copies, Dropout/pooling masks, conv column workspaces,
                  loss scratch), found by walking each layer's attributes
    other         what the pool hands out that none of the above own
                  (the solver's small buffers, shared conv split-K workspace)
    pool held     freed blocks the pool keeps for reuse (counted in the peak),
                  plus the rounding of every block up to its size bin

    python benchmarks/memory_breakdown.py [--net resnet50] [--batch 8]
        [--size 224] [--top 12] [--no-plan]

``--no-plan`` turns the solver's diff plan off (CAFFE_OCL_SHARE_DIFFS=0)
to compare. Prints MiB per category and the layers holding most.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyopencl as cl  # noqa: E402

import caffe_ocl  # noqa: E402
from caffe_ocl import config  # noqa: E402
from caffe_ocl.blob import Blob, SyncedMemory  # noqa: E402
from common import fill_inputs, fresh_pool, solver_for, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2.0 ** 20


class Ledger:
    """Each device buffer counted once, under the first owner that claims it."""

    def __init__(self, dev):
        self.dev = dev
        self.seen = {}                     # id(buffer) -> (category, owner)
        self.bytes = {}
        self.per_owner = {}

    @staticmethod
    def _buffers(obj):
        """(buffer, bytes asked of the pool) pairs; the pool's own counters
        are in asked bytes, a buffer's .size is rounded up to its bin."""
        if isinstance(obj, Blob):
            return [(m._buf, m.capacity * 4) for m in (obj.data_mem, obj.diff_mem)
                    if m._buf is not None]
        if isinstance(obj, SyncedMemory):
            return [(obj._buf, obj.capacity * 4)] if obj._buf is not None else []
        if isinstance(obj, cl.MemoryObjectHolder):
            return [(obj, obj.size)]
        return []

    def claim(self, category, owner, obj):
        for buf, n in self._buffers(obj):
            if id(buf) in self.seen:
                continue
            self.seen[id(buf)] = (category, owner)
            self.bytes[category] = self.bytes.get(category, 0) + n
            if owner is not None:
                self.per_owner[(category, owner)] = self.per_owner.get((category, owner), 0) + n

    def claim_mem(self, category, owner, mem):
        if mem._buf is not None:
            self.claim(category, owner, mem)


def _walk(obj, depth=0, seen=None):
    """Blobs, SyncedMemory and cl buffers reachable from a layer's attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    if isinstance(obj, (Blob, SyncedMemory, cl.MemoryObjectHolder)):
        yield obj
        return
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set)):
        items = obj
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("caffe_ocl") \
            and not isinstance(obj, caffe_ocl.device.Device):
        items = vars(obj).values()
    else:
        return
    for v in items:
        yield from _walk(v, depth + 1, seen)


def breakdown(solver):
    net = solver.net
    dev = net.device
    led = Ledger(dev)
    for li, layer in enumerate(net.layers):
        for b in layer.blobs:
            led.claim_mem("params", layer.name, b.data_mem)
    for li, layer in enumerate(net.layers):
        for b in layer.blobs:
            led.claim_mem("param diffs", layer.name, b.diff_mem)
    for h in solver.history:
        led.claim("history", None, h)
    producer = {}
    for li, tops in enumerate(net.graph.tops):
        for t in tops:
            producer.setdefault(t.name, net.layers[li].name)
    for name, b in net.blobs.items():
        led.claim_mem("act data", producer.get(name, name), b.data_mem)
    for name, b in net.blobs.items():
        led.claim_mem("act diffs", producer.get(name, name), b.diff_mem)
    for layer in net.layers:
        skip = {id(x) for x in layer.blobs}
        for obj in _walk({k: v for k, v in vars(layer).items()
                          if k not in ("blobs", "fwd", "bwd", "param", "device")}):
            if id(obj) not in skip:
                led.claim("layer temps", f"{layer.name} ({layer.type})", obj)
    pool = dev.allocator
    accounted = sum(led.bytes.values())
    active = pool.active_bytes
    led.bytes["other"] = active - accounted
    led.bytes["pool held"] = pool.managed_bytes - active    # + bin rounding
    return led


def run(net_name, batch, size, plan):
    config.set("SHARE_DIFFS", plan)
    dev = caffe_ocl.get_device()
    fresh_pool(dev)
    param = with_inputs(os.path.join(ROOT, "models", net_name, "train.prototxt"), batch,
                        (3, size, size))
    solver = caffe_ocl.solvers.SGDSolver(solver_for(param))
    fill_inputs(solver.net, 1000)
    solver.step(1)
    dev.finish()
    led = breakdown(solver)
    return solver, led, dev.peak_bytes


def report(net_name, batch, size, plan, top):
    solver, led, peak = run(net_name, batch, size, plan)
    mp = getattr(solver.net, "memory_plan", None)
    print(f"## {net_name} train step, batch {batch}, {size}x{size}, diff plan "
          f"{'on' if mp is not None else 'off'}; peak {peak / MiB:.1f} MiB")
    order = ["params", "param diffs", "history", "act data", "act diffs", "layer temps",
             "other", "pool held"]
    for k in order:
        print(f"  {k:12s} {led.bytes.get(k, 0) / MiB:10.1f} MiB")
    print(f"  {'total':12s} {sum(led.bytes.values()) / MiB:10.1f} MiB "
          f"(pool managed {solver.net.device.allocator.managed_bytes / MiB:.1f})")
    if mp is not None:
        print(f"  diff plan: {mp.planned_bytes / MiB:.1f} MiB in {len(mp.slots)} shared "
              f"buffers for {mp.unplanned_bytes / MiB:.1f} MiB of diffs")
    temps = {}
    for (cat, owner), n in led.per_owner.items():
        if cat == "layer temps":
            temps[owner] = temps.get(owner, 0) + n
    by_type = {}
    for owner, n in temps.items():
        t = owner.rsplit("(", 1)[-1].rstrip(")")
        by_type[t] = by_type.get(t, 0) + n
    print("  layer temps by type: " + ", ".join(
        f"{t} {n / MiB:.1f}" for t, n in sorted(by_type.items(), key=lambda x: -x[1])))
    print(f"  biggest owners (top {top}):")
    for (cat, owner), n in sorted(led.per_owner.items(), key=lambda x: -x[1])[:top]:
        print(f"    {n / MiB:8.1f} MiB  {cat:12s} {owner}")
    return peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-plan", action="store_true")
    a = ap.parse_args()
    for name in a.net.split(","):
        report(name, a.batch, a.size, not a.no_plan, a.top)


if __name__ == "__main__":
    main()
