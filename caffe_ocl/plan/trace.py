"""Forward traces: a TEST net's forward replayed from flat lists of launches.

At batch 1 on a GPU the device waits on the host: each step of a forward
(a layer, or a fused group of the plan) checks its shapes, its key, its
parameters' sync state in Python before it enqueues its one to three
launches. Once a net's forward over a range of layers has settled, what
those steps do is the same every pass: the same launches, the same blob
memories read and written, the same blobs left to be computed on read.
``ForwardTracer`` records that, and replays it while nothing it depends on
has changed.

What a pass is recorded as (device.RECORDER): per traceable step, the
launches it ran, the blob memories it made current on the device before
reading them (``to_device``), the memories it wrote (``device_written``),
and afterwards the ``compute_on_read`` of every blob of its layers (the
plan's pending blobs). Consecutive traceable steps make one *segment*;
any other step stays *live*: it runs as in an ordinary forward.

A step is traceable when it is a layer whose class keeps ``Layer``'s own
``forward``/``forward_impl`` (it only runs its launches; a class may say
otherwise with ``traceable``), or a plan group whose class sets
``traceable = True`` (its run is a function of shapes and parameter
versions). A step that reads a blob back to the host or uploads anything
but a blob memory's own host copy while recorded is live from then on.

When a recording is used (``_RangeTrace.valid``):
- two consecutive passes over the range were recorded alike (a first pass
  after a change builds launch plans, folds weights, zero-fills memories:
  work the passes after it do not do);
- no blob's shape or memory changed since (blob.LAYOUT's epoch; a live
  step that changes it ends the replay there, the ordinary loop goes on);
- every layer parameter's memory has the version it had (a weight written
  from Python, a fold to redo);
- the same execution plan, no pycaffe hooks, and the net is a TEST net
  (CAFFE_OCL_FORWARD_TRACE). ``caffe_ocl time``'s event recording
  (device.record_events) still sees every command of a replayed pass:
  its launches and uploads go through Launch.run / Device.upload.

Replay of a segment: make the memories it reads first current on the
device (an input written from Python is uploaded here), enqueue its
launches, mark the memories it writes as written (versions move as in an
ordinary pass), set the recorded ``compute_on_read`` of its blobs. The
values in every blob are the ordinary forward's; a blob the plan left
pending is computed when read, as after an ordinary forward. State some
groups keep for the next pass (a Concat's record of which slices its
producers wrote, concat.py) is not updated by a replay: the next ordinary
pass finds it stale and copies or recomputes (the right values, once
slower)."""
from .. import config
from ..blob import LAYOUT
from ..device import RECORDER
from ..layers.base import Layer
from ..proto import caffe_pb2
from . import activations, execution

# a step whose recording shows one of these is live (see the module doc)
_UNTRACEABLE_OPS = ("H", "U")


def step_traceable(net, li, action):
    """Whether the step at layer ``li`` (``action`` of forward_schedule)
    may be recorded and replayed."""
    if action is execution.SKIP:
        return True
    if action is execution.LAYER:
        layer = net.layers[li]
        if getattr(layer, "label_check", None) is not None:
            return False        # counts its passes on the host (layers/loss.py)
        declared = getattr(layer, "traceable", None)
        if declared is not None:
            return bool(declared)
        cls = type(layer)
        return cls.forward is Layer.forward and cls.forward_impl is Layer.forward_impl
    return bool(getattr(action, "traceable", False))


def step_blobs(net, li, action):
    """The blobs of the step's layers (bottoms and tops): the ones whose
    ``compute_on_read`` a replay must set as the step leaves them."""
    g = net.graph
    lis = action.layers if action not in (execution.LAYER, execution.SKIP) \
        and hasattr(action, "layers") else [li]
    out, seen = [], set()
    for lj in lis:
        for b in list(g.bottoms[lj]) + list(g.tops[lj]):
            if id(b) not in seen:
                seen.add(id(b))
                out.append(b)
    return out


class _Segment:
    __slots__ = ("reads", "launches", "writes", "marks")

    def __init__(self):
        self.reads, self.launches, self.marks = [], [], []
        self.writes = {}        # id -> [memory, writes]: versions move as in the pass

    def add(self, ops, marks):
        read = {id(m) for m in self.reads}
        for kind, obj in ops:
            if kind == "L":
                self.launches.append(obj)
            elif kind == "R":
                # only what the segment reads before writing it comes from
                # outside (an input written from Python): upload that first
                if id(obj) not in self.writes and id(obj) not in read:
                    read.add(id(obj))
                    self.reads.append(obj)
            elif kind == "W":
                w = self.writes.get(id(obj))
                if w is None:
                    self.writes[id(obj)] = [obj, 1]
                else:
                    w[1] += 1
        self.marks.extend(marks)

    def signature(self):
        return (tuple(map(id, self.reads)), tuple(map(id, self.launches)),
                tuple((k, n) for k, (_, n) in self.writes.items()),
                tuple((id(b), fn) for b, fn in self.marks))

    def freeze(self):
        self.writes = tuple((m, n) for m, n in self.writes.values())
        # a blob is in the marks of every step that reads or writes it (a
        # DenseNet's growing Concat top of dozens): only its last mark
        # stands after the segment, so only that one is set (2230 marks
        # a pass -> one per blob)
        last = {id(b): (b, fn) for b, fn in self.marks}
        self.marks = tuple(last.values())

    def replay(self, queue, launches=None, readers=None, upload=True):
        """The recorded pass again. plan/activations.py gives the launches
        rebound to its shared buffers and ``readers`` (blob id -> what its
        ``compute_on_read`` becomes instead of the recorded one), or reruns
        it on the own buffers without ``upload``ing the inputs again."""
        if upload:
            for m in self.reads:
                m.to_device()
        for ln in self.launches if launches is None else launches:
            ln.run(queue)
        for m, n in self.writes:
            m.device_written(n)
        if readers:
            for b, fn in self.marks:
                b.compute_on_read = readers.get(id(b), fn)
        else:
            for b, fn in self.marks:
                b.compute_on_read = fn


class _Live:
    __slots__ = ("pos", "li", "action")

    def __init__(self, pos, li, action):
        self.pos, self.li, self.action = pos, li, action

    def signature(self):
        return ("live", self.li)


class _RangeTrace:
    """One recorded pass over a range: its entries (segments and live
    steps) and what it was recorded against."""

    def __init__(self, net, entries, epoch, restorers):
        self.signature = tuple(e.signature() for e in entries)
        for e in entries:
            if isinstance(e, _Segment):
                e.freeze()
        self.entries = entries
        self.restorers = restorers  # set, after a replay, the state groups keep between passes
        self.epoch = epoch
        self.plan = net.plan
        self.params = [(m, m.version) for m in _param_memories(net)]
        self.launches = sum(len(e.launches) for e in entries if isinstance(e, _Segment))
        self.sharing = None     # activations.ActivationSharing, once replayed

    def share_activations(self, net, end, tracer):
        """Plan the replay on shared activation buffers (plan/activations.py)."""
        segments = [e for e in self.entries if isinstance(e, _Segment)]
        live = [e.li for e in self.entries if isinstance(e, _Live)]
        self.sharing = activations.ActivationSharing(net, self, end, tracer, segments, live)

    def valid(self, net):
        if LAYOUT.epoch != self.epoch or net.plan is not self.plan:
            return False
        for m, v in self.params:
            if m.version != v:
                return False
        return True


def _param_memories(net):
    seen, out = set(), []
    for layer in net.layers:
        for p in layer.blobs:
            m = p.data_mem
            if id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


class ForwardTracer:
    """A net's forward traces, by (start, end) range."""

    MAX_RANGES = 8

    def __init__(self, net):
        self.net = net
        self.recorded = {}      # range -> the last pass's _RangeTrace (not yet confirmed)
        self.active = {}        # range -> a _RangeTrace recorded alike twice
        self.replays = 0        # passes replayed (tests, benchmarks)
        # the ActivationSharing whose last pass left the blobs' own memories
        # behind (plan/activations.py): ``settle()`` before anything else runs
        self.pending = None
        # decided when the net is built (CAFFE_OCL_SHARE_ACTIVATIONS)
        self.share_activations = activations.enabled(net)

    def settle(self):
        """Bring every blob's own memory up to the last pass (a shared pass
        left them behind): before a forward that is not that pass's replay,
        or a backward."""
        sh = self.pending
        if sh is not None:
            sh.unshare()

    @staticmethod
    def enabled(net):
        return (config.get("FORWARD_TRACE") and net.graph.phase == caffe_pb2.TEST)

    def forward(self, start, end, run_step):
        """Run the forward over layers start..end, replaying or recording;
        ``run_step(li, action)`` runs one step as the ordinary loop does
        (returns whether the layer reshaped)."""
        net = self.net
        if net._net_hooks is not None or RECORDER.ops is not None or start != 0:
            # a range from a later layer may depend on state an earlier
            # pass left (a Concat copying an earlier Concat's top as one
            # block, concat.py): traced from the first layer only
            self.settle()
            return self._ordinary(start, end, run_step, 0)
        key = (start, end)
        trace = self.active.get(key)
        if trace is not None and not trace.valid(net):
            del self.active[key]
            trace = None
        if self.pending is not None and (trace is None or trace.sharing is not self.pending):
            self.settle()
        if trace is not None:
            return self._replay(trace, start, end, run_step)
        return self._record(key, start, end, run_step)

    def _ordinary(self, start, end, run_step, from_pos):
        reshaped = False
        sched = self.net.plan.forward_schedule(start, end)
        for li, action in sched[from_pos:]:
            reshaped |= run_step(li, action)
        return reshaped

    def _replay(self, trace, start, end, run_step):
        queue = self.net.layers[0].device.queue if self.net.layers else None
        sh = trace.sharing
        if sh is not None and sh.active:
            sh.begin_pass()
        else:
            sh = None
        for e in trace.entries:
            if isinstance(e, _Segment):
                if sh is not None and sh.active:
                    sh.replay(e)
                else:
                    e.replay(queue)
                continue
            reshaped = run_step(e.li, e.action)
            if reshaped or LAYOUT.epoch != trace.epoch:
                if sh is not None:
                    sh.unshare(mid_pass=True)   # the ordinary rest reads the own memories
                # a live step changed shapes: the rest the ordinary way, and
                # record again from the next pass; what the replayed groups
                # would have noted for the next pass is forgotten
                self.active.pop((start, end), None)
                for restore in trace.restorers:
                    restore(False)
                return reshaped | self._ordinary(start, end, run_step, e.pos + 1)
        for restore in trace.restorers:
            restore()
        if sh is not None and sh.active:
            sh.end_pass()
        self.replays += 1
        return False

    def _record(self, key, start, end, run_step):
        net = self.net
        epoch0 = LAYOUT.epoch
        entries, seg, traced_groups = [], None, []
        reshaped = False
        sched = net.plan.forward_schedule(start, end)
        for pos, (li, action) in enumerate(sched):
            if not step_traceable(net, li, action):
                reshaped |= run_step(li, action)
                entries.append(_Live(pos, li, action))
                seg = None
                continue
            RECORDER.start()
            try:
                reshaped |= run_step(li, action)
            finally:
                ops = RECORDER.stop()
            if any(kind in _UNTRACEABLE_OPS for kind, _ in ops):
                entries.append(_Live(pos, li, action))
                seg = None
                continue
            if hasattr(action, "trace_state"):
                traced_groups.append(action)
            marks = [(b, b.compute_on_read) for b in step_blobs(net, li, action)]
            if seg is None:
                seg = _Segment()
                entries.append(seg)
            seg.add(ops, marks)
        if reshaped or LAYOUT.epoch != epoch0:
            self.recorded.pop(key, None)
            return reshaped
        restorers = [f for f in (a.trace_state() for a in traced_groups) if f is not None]
        trace = _RangeTrace(net, entries, LAYOUT.epoch, restorers)
        last = self.recorded.get(key)
        if last is not None and last.signature == trace.signature and last.valid(net):
            if len(self.active) >= self.MAX_RANGES:
                self.active.clear()
            self.active[key] = trace
            if end == len(net.layers) - 1 and self.share_activations:
                trace.share_activations(net, end, self)
            self.recorded.pop(key, None)
        else:
            if len(self.recorded) >= self.MAX_RANGES:
                self.recorded.clear()
            self.recorded[key] = trace
        return reshaped
