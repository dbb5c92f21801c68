"""Shared activation buffers for a replayed TEST forward (plan/trace.py).

Caffe gives every blob its own memory, so a forward of MobileNet v3 at
batch 1 walks through 47 MB of activations that each live for a layer or
two: on a CPU most of them miss the cache at every read. Once a TEST
net's forward is replayed from a recorded launch list, the lifetime of
each activation buffer is known exactly: from the first launch that binds
it to the last. ``ActivationSharing`` gives buffers whose lifetimes do not
overlap one *slot* (greedy interval colouring, best fit by size) and
replays the forward with launches rebound to the slots (``Launch.rebound``:
their own kernel objects; the layers' launches keep their own buffers).
MobileNet v3's 47 MB become 6 MB; nothing else changes in what runs.

What stays private (never in a slot):
- net inputs and outputs, tops with a loss weight, the range's last tops;
- blobs of the pass's live steps (Python and data layers, label checks:
  they run the ordinary way and read their bottoms' own memory); a pass
  where a live step writes a blob that a replayed segment writes too (in
  place) is not shared at all: rerunning the segments alone would undo it;
- memories a segment reads before it writes them (inputs set from Python,
  a Concat slice kept from the previous pass);
- memories several blobs share from their start (plan/concat_chain.py),
  and buffers bound by a launch that cannot be rebound.

Caffe's "every blob holds its value after a forward" is kept by
recomputing, not by storage: after a shared pass each blob whose memory is
in a slot (or that the plan left pending: its reader may need such a blob)
gets ``compute_on_read`` = *unshare*, which replays the pass's segments
once more with the layers' own launches and then serves the read. The
inputs are read as the device holds them: what the pass read, since only
an upload replaces a device copy and uploads come from a forward, which
settles first (an input written from Python after the pass stays on the
host until then, so it does not leak into the intermediates). The first unshare ends sharing for that recording
for good (a script that reads intermediates every pass should not pay two
forwards a pass). Anything else that would read the private memories
first unshares too (``ForwardTracer.settle``): a forward over another
range, a live step that reshapes mid-pass, a backward.

Not exact in two cases. As for a blob the plan left pending
(plan/elide.py), weights changed between the forward and the read of an
intermediate (a solver's update, a write from Python) give the
intermediate computed with the new weights. And a reshape between the
forward and the read leaves nothing to recompute on: the intermediate
shows an earlier pass's values (Caffe's shows the last pass's where the
blob kept its size).

Safety check: the first shared pass is run again with the own launches
and compared bit for bit: each slot's final contents against the own
memory of the buffer it held last, and every memory written outside the
slots (outputs among them). Slots are filled with NaN before it, so a
launch that reads a slot before writing it shows. A difference turns
sharing off for that recording and is logged. (A net whose kernels are
not deterministic would lose sharing this way; none of ours are in a
forward.)

Only where the slots come to at most ``MAX_SLOT_BYTES`` (32 MiB): past
that they leave the caches too, and sharing only adds their memory.

``CAFFE_OCL_SHARE_ACTIVATIONS``: unset = CPU devices only (the measured
gain, 7-14% on mobile nets at batch 1, comes from the CPU's caches), 1 =
every device, 0 = off.
"""
import logging

import numpy as np
import pyopencl as cl

from .. import config
from ..blob import LAYOUT
from ..device import Launch
from ..ops import pointwise
from .memory import best_fit

log = logging.getLogger("caffe_ocl")

# Slots larger than this in all do not stay in a CPU's caches, which is
# where sharing pays (at batch 16 MobileNet v2, ResNet-18 and ShuffleNet v2
# ran 0.99-1.00 of their own-buffer time on the EPYC, with 135 MiB of
# slots for MobileNet v2): such a pass keeps its own buffers and its
# memory is not grown by the slots.
MAX_SLOT_BYTES = 32 << 20


def enabled(net):
    """Whether ``net``'s replayed forwards share activation buffers (asked
    when the net is built)."""
    on = config.get("SHARE_ACTIVATIONS")
    if on is None:
        return net.device is not None and net.device.is_cpu
    return bool(on)


def _private_blobs(net, end, live):
    """Blobs whose data memory must keep its own buffer (see the module doc);
    ``live``: the layer indices of the pass's live steps."""
    g = net.graph
    out = [net.blobs[n] for n in list(net.inputs) + list(net.outputs)]
    out += list(g.tops[end])
    for layer, tops in zip(net.layers, g.tops):
        out += [t for t, w in zip(tops, layer.loss_weights) if w]
    for li in live:
        out += list(g.bottoms[li]) + list(g.tops[li])
    return out


def _rebindable(launch):
    return type(launch) is Launch and launch.source is not None


def _slots(intervals):
    """Greedy interval colouring: ``intervals`` [(first, last, nbytes, key)]
    -> ({key: slot index}, [slot bytes]). A slot is free for an interval
    starting after its last user's last launch; among free slots the
    smallest that fits is taken, else the largest (grown)."""
    assign, sizes, free_after = {}, [], []
    for first, last, nbytes, key in sorted(intervals, key=lambda t: (t[0], -t[2])):
        free = [s for s in range(len(sizes)) if free_after[s] < first]
        s = best_fit(free, sizes, nbytes)
        if s == len(free_after):
            free_after.append(-1)
        free_after[s] = last
        assign[key] = s
    return assign, sizes


class ActivationSharing:
    """One recorded forward (a trace._RangeTrace from the first layer),
    replayed on shared activation buffers; see the module doc."""

    def __init__(self, net, trace, end, tracer, segments, live):
        """``trace``: the recording (its segments and the layer indices of
        its live steps given), ``end``: its last layer."""
        self.net, self.trace, self.tracer = net, trace, tracer
        self.active = False
        self.checked = False        # the first shared pass was compared
        self.done = []              # segments replayed shared in the current pass
        self.unmarked = []
        self.reason = None          # why a recording is not shared (tests, logs)
        if not segments or not net.layers:
            return
        self.dev = net.layers[0].device
        self.queue = self.dev.queue
        self._plan(net, end, segments, live)

    # -- planning ----------------------------------------------------------
    def _plan(self, net, end, segments, live):
        # a live step writing a blob the segments write too (in place on a
        # convolution's top: an unfolded BatchNorm reading its factor on the
        # host): rerunning the segments alone (unshare) would leave that
        # blob without the live step's work
        # (written: marked written by a step and bound by a launch; a Split's
        # tops are marked written, sharing their bottom's memory, by no launch)
        bound = {b.int_ptr for seg in segments for ln in seg.launches
                 for b in ln.buffers.values()}
        written = {id(m) for seg in segments for m, _ in seg.writes
                   if m._buf is not None and m._buf.int_ptr in bound}
        if any(id(t.data_mem) in written for li in live for t in net.graph.tops[li]):
            self.reason = "a live step writes in place what the segments write"
            return
        private = {id(b.data_mem) for b in _private_blobs(net, end, live)}
        for seg in segments:
            private.update(id(m) for m in seg.reads)
        # every blob's data memory by buffer: a buffer is shareable when all
        # its memories are (views share the memory object already)
        by_buf, blobs_of = {}, {}
        for b in {id(b): b for tops in net.graph.tops for b in tops}.values():
            m = b.data_mem
            if m._buf is None:
                continue
            key = m._buf.int_ptr
            by_buf.setdefault(key, {})[id(m)] = m
            blobs_of.setdefault(key, []).append(b)
        shareable = {k for k, mems in by_buf.items()
                     if all(id(m) not in private and m.shared is None for m in mems.values())}
        # lifetimes in the pass's launch order; a launch that cannot be
        # rebound keeps the buffers it binds private
        order, first, last = 0, {}, {}
        for seg in segments:
            for ln in seg.launches:
                keys = [b.int_ptr for b in ln.buffers.values()]
                if not _rebindable(ln):
                    shareable.difference_update(keys)
                for k in keys:
                    first.setdefault(k, order)
                    last[k] = order
                order += 1
        intervals = [(first[k], last[k], 4 * max(m.capacity for m in by_buf[k].values()), k)
                     for k in shareable if k in first]
        if len(intervals) < 2:
            self.reason = f"{len(intervals)} shareable buffer(s)"
            return
        assign, sizes = _slots(intervals)
        own = sum(n for _, _, n, _ in intervals)
        if sum(sizes) >= own:
            self.reason = "no lifetimes apart"
            return
        if sum(sizes) > MAX_SLOT_BYTES:
            self.reason = f"{sum(sizes) / 2**20:.0f} MiB of slots: past the caches"
            return
        self.slots = [self.dev.alloc(n) for n in sizes]
        for buf, n in zip(self.slots, sizes):
            pointwise.fill(self.dev, buf, n // 4, float("nan"))   # see the safety check
        remap = {k: self.slots[s] for k, s in assign.items()}
        # for the safety check: the buffer each slot holds last (the latest
        # first use), read back against its own memory
        starts = {k: f for f, _, _, k in intervals}
        last_user = {}
        for k, s in assign.items():
            if s not in last_user or starts[k] > starts[last_user[s]]:
                last_user[s] = k
        self.slot_ends = [(self.slots[s], max(by_buf[k].values(), key=lambda m: m.capacity))
                          for s, k in last_user.items()]
        self.shared_launches = self._rebind(segments, remap)
        self.shared_keys = set(remap)
        self.bytes = (own, sum(sizes))
        # what a blob's compute_on_read becomes after a shared pass
        self.readers, marked = {}, set()
        for seg in segments:
            for b, fn in seg.marks:
                marked.add(id(b))
                buf = b.data_mem._buf
                if fn is not None or buf is not None and buf.int_ptr in remap:
                    self.readers[id(b)] = self._reader(b)
        # a blob in a slot that no step of the pass lists (bound by a group
        # that does not name it): its reader is set at each pass's end
        self.unmarked = [(b, b.compute_on_read) for k in remap for b in blobs_of[k]
                         if id(b) not in marked]
        self.active = True
        log.debug("shared activations: %d buffers (%.1f MiB) in %d slots (%.1f MiB)",
                  len(intervals), own / 2**20, len(sizes), sum(sizes) / 2**20)

    @staticmethod
    def _rebind(segments, remap):
        out, made = {}, {}
        for seg in segments:
            lst = []
            for ln in seg.launches:
                if not any(b.int_ptr in remap for b in ln.buffers.values()):
                    lst.append(ln)
                    continue
                r = made.get(id(ln))
                if r is None:
                    r = made[id(ln)] = ln.rebound(remap)
                lst.append(r)
            out[id(seg)] = lst
        return out

    def _reader(self, blob):
        def read():
            self.unshare()
            if blob.compute_on_read is not None:
                blob.compute_pending()
        return read

    # -- running -----------------------------------------------------------
    @property
    def pending(self):
        """Whether the blobs' own memories are behind the last (shared) pass."""
        return self.tracer.pending is self

    def begin_pass(self):
        """A new pass from the first layer: what the last one left behind
        is overwritten, so nothing is pending any more."""
        self.done = []
        if self.pending:
            self.tracer.pending = None

    def replay(self, seg):
        """Replay ``seg`` on the slots."""
        seg.replay(self.queue, self.shared_launches[id(seg)], self.readers)
        self.done.append(seg)

    def end_pass(self):
        """After a pass's last segment: check the first shared pass, else
        leave the blobs' own memories pending (``unshare``)."""
        if not self.checked:
            self.checked = True
            self._check()       # own memories current after it, nothing pending
            return
        for b, _ in self.unmarked:
            b.compute_on_read = self._reader(b)
        self.tracer.pending = self

    def _check(self):
        """The first shared pass against its rerun on the own buffers, bit
        for bit: what each slot holds at the end against the own memory of
        the buffer it held last, and every memory written outside the
        slots (outputs, Concat tops, live steps' bottoms)."""
        outside = {id(m): m for seg in self.done for m, _ in seg.writes
                   if m._buf is not None and m._buf.int_ptr not in self.shared_keys}
        pairs = [(self._read(slot, m.capacity), m) for slot, m in self.slot_ends]
        pairs += [(self._read(m._buf, m.capacity), m) for m in outside.values()]
        self._replay_own(self.done)
        ok = all(np.array_equal(a, self._read(m._buf, m.capacity), equal_nan=True)
                 for a, m in pairs)
        if not ok:
            self.reason = "values changed"
            log.info("shared activation buffers gave other values than the blobs' own "
                     "buffers in this net's forward; it keeps one buffer per blob "
                     "(CAFFE_OCL_SHARE_ACTIVATIONS)")
            self._stop()
        self.done = []
        return ok

    def _read(self, buf, n):
        """``n`` floats of ``buf`` (a blocking read: after every command
        enqueued before it on the in-order queue)."""
        out = np.empty(n, np.float32)
        cl.enqueue_copy(self.queue, out, buf, is_blocking=True)
        return out

    def _replay_own(self, segments):
        """The segments again on the blobs' own memories, leaving what an
        ordinary pass leaves. Memories the pass read from outside (inputs)
        are read on the device as they are: the device copy is what the
        pass read, since only an upload replaces it and uploads come from
        a forward, which settles first (an input written from Python since
        is on the host until then)."""
        for seg in segments:
            seg.replay(self.queue, upload=False)
        for b, fn in self.unmarked:
            b.compute_on_read = fn

    def unshare(self, mid_pass=False):
        """Bring every blob's own memory to the last pass's values and stop
        sharing for this recording (see the module doc). ``mid_pass``: a
        live step of the pass being replayed reshaped; the segments before
        it are rerun all the same (they precede that step, so none of
        them reads what it reshaped), since the ordinary rest of the pass
        reads their blobs."""
        if not self.active:
            return
        done, self.done = self.done, []
        if mid_pass or LAYOUT.epoch == self.trace.epoch:
            self._replay_own(done)
        else:
            for seg in done:            # shapes changed since: nothing to recompute
                for b, fn in seg.marks:
                    b.compute_on_read = None if id(b) in self.readers else fn
            for b, _ in self.unmarked:
                b.compute_on_read = None
        self._stop()

    def _stop(self):
        self.active = False
        if self.pending:
            self.tracer.pending = None
        self.slots = self.shared_launches = self.readers = None
        self.unmarked = []

