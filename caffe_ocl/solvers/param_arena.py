"""One contiguous device buffer for a solver's learnable parameters, one for
their gradients and one per solver history, all with the same layout, so
that the per-iteration parameter work is one kernel launch instead of one
per blob.

Why: ResNet-50 has 161 learnable blobs; clearing their gradients and
applying the update took 322 launches per iteration, about 40% of a
training step's launches. That is host time, which shows at small batches
and whenever the host has to wait for the device before the update (data-
parallel training waits for the gradient reduction: after the wait the
device stayed idle while Python enqueued the update, measured 6 ms per
ResNet-50 iteration on the H200). With the arena: ``fill_blocks`` clears
every gradient and ``solver_update_blocks`` updates every parameter, each
in one launch over a table of blocks (kernels/solvers.cl).

How: ``ParamArena(net)`` is made by the Solver right after its train net
(before the test nets, which share the parameters). Each learnable blob's
data and diff ``SyncedMemory`` adopts a sub-buffer of the arena (its device
contents copied over) and the layers that hold those blobs rebind their
launch plans, as for Caffe's shared weights. Blobs keep their pycaffe
behaviour (``blob.data``/``blob.diff`` host views) unchanged. The histories
adopt sub-buffers of ``companion()`` buffers with the same offsets.
``valid()`` tells whether every blob still uses its sub-buffer (a pycaffe
``reshape`` to a bigger parameter or ``share_data`` gives it new storage);
the solver then falls back to per-blob launches for good. Learnable blobs
that share storage with each other (``supported``) and
``CAFFE_OCL_PARAM_ARENA=0`` keep per-blob storage and launches.
"""
import weakref

import numpy as np

from .. import config
from ..ops import pointwise

BLOCK_FLOATS = 1 << 14        # elements per work-group of the block kernels


def enabled():
    return config.get("PARAM_ARENA")


def supported(net):
    """Every learnable blob has data and diff storage of its own (a blob that
    shares another one's storage, through pycaffe before the solver was
    made, keeps per-blob updates: Caffe updates such storage once per blob)."""
    mems = [id(m) for b in net.graph.learnable_params for m in (b.data_mem, b.diff_mem)]
    return bool(mems) and len(mems) == len(set(mems))


class ParamArena:
    def __init__(self, net):
        dev = net.device
        self.dev = dev
        # sub-buffer origins must be multiples of the device's base alignment
        align = max(int(dev.cl_device.mem_base_addr_align) // 8, 256) // 4   # floats
        self.blobs = [b for b in net.graph.learnable_params if b.count > 0]
        self.offsets, off = [], 0
        for b in self.blobs:
            self.offsets.append(off)
            cap = max(b.data_mem.capacity, b.diff_mem.capacity)
            off += -(-cap // align) * align
        self.total = max(off, 1)
        self.data = self._new_buffer()
        self.diff = self._new_buffer()
        self._subs = {}                  # id(SyncedMemory) -> its sub-buffer
        for b, o in zip(self.blobs, self.offsets):
            for mem, parent in ((b.data_mem, self.data), (b.diff_mem, self.diff)):
                sub = self.sub(parent, o, mem.capacity)
                mem.adopt_buffer(sub)
                self._subs[id(mem)] = sub
        self._rebind(net)
        self._build_blocks(net)
        # the per-blob buffers the parameters left went back to the pool: give
        # them back to the device rather than hold them beside the arena
        dev.allocator.free_held()

    # ---- buffers -------------------------------------------------------------------
    def _new_buffer(self):
        buf = self.dev.alloc_unpooled(4 * self.total)
        # (cl.Buffer takes no weak references: the arena accounts for its buffers)
        weakref.finalize(self, self.dev.unpooled_freed, 4 * self.total)
        pointwise.fill(self.dev, buf, self.total, 0.0)     # padding stays zero
        return buf

    def sub(self, parent, offset, count):
        """The ``count`` floats of ``parent`` from element ``offset``."""
        return parent.get_sub_region(4 * offset, 4 * count)

    def companion(self):
        """A zeroed buffer with the arena's layout and one sub-buffer per blob
        (the solver's history)."""
        buf = self._new_buffer()
        return buf, [self.sub(buf, o, b.data_mem.capacity)
                     for b, o in zip(self.blobs, self.offsets)]

    def valid(self):
        """Every blob still stores its data and diff in this arena."""
        subs = self._subs
        for b in self.blobs:
            d, g = b.data_mem, b.diff_mem
            if d.buffer() is not subs.get(id(d)) or g.buffer() is not subs.get(id(g)):
                return False
        return True

    # ---- launch plans ----------------------------------------------------------------
    def _rebind(self, net):
        """Layers bound the old buffers: rebuild their plans (the shared-weights
        path, Net._share_weights)."""
        mems = set(self._subs)
        for li, layer in enumerate(net.layers):
            if any(id(b.data_mem) in mems or id(b.diff_mem) in mems for b in layer.blobs):
                layer.rebind(net.graph.bottoms[li], net.graph.tops[li])

    def _build_blocks(self, net):
        """(start, length, index in net.graph.learnable_params) per block of at most
        BLOCK_FLOATS elements; parameters with no elements have none."""
        index = {id(b): i for i, b in enumerate(net.graph.learnable_params)}
        rows = []
        for b, o in zip(self.blobs, self.offsets):
            for s in range(0, b.count, BLOCK_FLOATS):
                rows.append((o + s, min(BLOCK_FLOATS, b.count - s), index[id(b)]))
        table = np.asarray(rows, np.int32).reshape(-1)
        self.nblocks = len(rows)
        self.blocks = self.dev.alloc(max(table.nbytes, 4))
        if table.size:
            self.dev.upload(self.blocks, table)
        self.nparams = len(net.graph.learnable_params)
