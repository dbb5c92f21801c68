"""Timing of a net, as Caffe's `caffe time` reports it (the command is
caffe_ocl/commands/time_cmd.py), per step of the net's execution plan.

``time_net`` runs the net as a user calls it and reports figures that add
up to what that costs:

- warm-up passes first (Caffe's "Performing Forward" / "Performing
  Backward", ``warmup`` times): programs built lazily, backward launch
  lists, tuned picks and pooled buffers are all in place before timing;
- each timed iteration runs ``net.forward()`` (and ``net.backward()``)
  untouched, timed with the host clock: "Average Forward pass" and
  "Average Backward pass" are what a user's call takes. The device times
  of every command it enqueued are recorded meanwhile (OpenCL profiling
  events: the device's queue is made a profiling one, see
  ``Device.enable_profiling``);
- then the same pass again with per-layer hooks (pycaffe's
  ``before_forward`` ...) that only note the host clock and how many
  commands were enqueued so far: which step enqueued the k-th command, and
  each step's host enqueue time. The user's pass enqueued the same
  commands in the same order, so its k-th command's device time goes to
  that step: the per-step figures and the average pass come from the same
  run (where the counts differ, the hooked pass's own device times stand
  in and the report says so). Nothing drains the queue between steps (a
  ``finish()`` around each layer made every step pay the launch latency
  and the host's enqueue time, so the figures of small layers and the
  total misled).

A step is one layer or one fused group of the plan (caffe_ocl/plan/
execution.py); a group is reported under its layers' names joined by
``+`` with " (fused)" after it, and the layers it covers have no line of
their own. Where the forward and the backward fuse different layers, the
reported unit is the union (" (fused forward)" / " (fused backward)" when
only one direction runs it as one step).

The parts add up to the whole: for each direction, the sum of the per-step
device times, the device work outside the steps (reading the outputs back,
blobs computed on read) and the unattributed rest (host enqueue and Python
between launches while the device waits, launch gaps) make the average
pass. The host enqueue time of each step (hooks' clock around the step's
layers) is reported too (``host=True``: per step).
"""
import logging
import time

from .device import record_events
from .errors import NetError
from .plan import fold

log = logging.getLogger("caffe_ocl")


def event_seconds(events):
    """Device seconds of ``events`` (completed, from a profiling queue):
    the sum of each command's end - start."""
    ns = 0
    for ev in events:
        p = ev.profile
        ns += p.end - p.start
    return ns * 1e-9


def event_span(events):
    """Device seconds from the first command's start to the last's end."""
    if not events:
        return 0.0
    return (max(ev.profile.end for ev in events)
            - min(ev.profile.start for ev in events)) * 1e-9


class Unit:
    """One reported line pair: the layers (indices, in order) of one or more
    plan steps, its name, and the figures summed over the timed iterations
    (seconds; ``launches``: commands enqueued)."""

    def __init__(self, layers, name, fused):
        self.layers = tuple(layers)
        self.name = name
        self.fused = fused               # "", "fused", "fused forward", "fused backward"
        self.forward = self.backward = 0.0                # device seconds
        self.forward_host = self.backward_host = 0.0      # host enqueue seconds
        self.forward_launches = self.backward_launches = 0

    @property
    def label(self):
        return f"{self.name} ({self.fused})" if self.fused else self.name

    def __repr__(self):
        return f"Unit({self.label!r})"


def plan_units(net, backward=True):
    """The units of ``net.plan`` in forward order: the forward steps' layer
    sets merged with the backward steps' (when ``backward``) wherever they
    share a layer."""
    plan, names = net.plan, net.graph.layer_names
    n = len(names)
    parent = list(range(n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    directions = [plan.forward_steps] + ([plan.backward_steps] if backward else [])
    for steps in directions:
        for st in steps:
            r = root(st.layers[0])
            for li in st.layers[1:]:
                parent[root(li)] = r
    members = {}
    for li in range(n):
        members.setdefault(root(li), []).append(li)

    def one_step(steps, lis):
        return any(st.group is not None and set(st.layers) == lis for st in steps)

    units, of_layer = [], [None] * n
    for li in range(n):
        r = root(li)
        if r not in members:
            continue
        lis = members.pop(r)
        if len(lis) == 1:
            fused = ""
        else:
            s = set(lis)
            f = one_step(plan.forward_steps, s)
            b = backward and one_step(plan.backward_steps, s)
            if f and (b or not backward):
                fused = "fused"
            elif f or b:
                fused = "fused forward" if f else "fused backward"
            else:
                fused = "fused"
        u = Unit(lis, "+".join(names[i] for i in lis), fused)
        units.append(u)
        for i in lis:
            of_layer[i] = u
    return units, of_layer


class _StepClock:
    """The hooks of the attributed pass: per layer index, the host clock and
    the count of recorded commands before and after its (plan) step ran."""

    def __init__(self):
        self.active = False
        self.sink = []
        self.spans = []          # (layer index, first event, end event, host seconds)
        self._t = 0.0
        self._n = 0

    def before(self, li):
        if self.active:
            self._n = len(self.sink)
            self._t = time.perf_counter()

    def after(self, li):
        if self.active:
            t = time.perf_counter()
            self.spans.append((li, self._n, len(self.sink), t - self._t))


class Timing:
    """What ``time_net`` measured: ``units`` (per-step figures, averages
    in seconds through ``per_iteration``), and per direction the average
    wall time of the user's call, device seconds of its commands (the
    unhooked pass), the per-step sums and the device work outside steps."""

    def __init__(self, units, iterations):
        self.units = units
        self.iterations = iterations
        self.wall = {"forward": 0.0, "backward": 0.0}
        self.device = {"forward": 0.0, "backward": 0.0}        # whole pass, unhooked
        self.span = {"forward": 0.0, "backward": 0.0}          # first start to last end
        self.launches = {"forward": 0, "backward": 0}          # whole pass, unhooked
        self.outside = {"forward": 0.0, "backward": 0.0}       # hooked pass, no step's
        self.outside_launches = {"forward": 0, "backward": 0}
        # per timed iteration and direction, seconds: (wall, device, steps,
        # outside, device of the hooked pass)
        self.series = {"forward": [], "backward": []}
        # iterations whose hooked pass did not enqueue as many commands as
        # the user's (its own device times were used then)
        self.mismatched = {"forward": 0, "backward": 0}
        self.total = 0.0
        self.builds = 0            # programs built or loaded during the timed passes

    def average(self, kind, direction):
        """Average seconds per pass: ``kind`` wall, device, span, outside,
        steps (sum of the units' device times) or host (sum of their
        enqueue)."""
        if kind == "steps":
            s = sum(getattr(u, direction) for u in self.units)
        elif kind == "host":
            s = sum(getattr(u, direction + "_host") for u in self.units)
        else:
            s = getattr(self, kind)[direction]
        return s / self.iterations

    def unattributed(self, direction):
        return (self.average("wall", direction) - self.average("steps", direction)
                - self.average("outside", direction))


def _ms(seconds):
    return f"{seconds * 1000:.4f}"


def time_net(net, iterations, backward=True, out=print, warmup=2, host=False):
    """Time ``net`` per plan step (see the module doc); prints Caffe's lines
    through ``out`` and returns a ``Timing``. ``warmup``: untimed passes
    after Caffe's first forward/backward. The device's queue stays a
    profiling one, and the net keeps four per-layer hooks that do nothing
    once timing is over."""
    if iterations < 1:
        raise NetError(f"time_net: iterations must be at least 1, got {iterations}")
    dev = net.device
    dev.enable_profiling()
    backward = backward and any(net.graph.layer_need_backward)
    if backward and net.plan.fold_groups:
        try:
            fold.check_backward(net.plan.fold_groups)
        except NetError:
            out("Timing backward: the TEST folding is turned off (net.unfold())")
            net.unfold()

    # warm-up, as the user calls the net (Caffe: one clean forward and backward)
    out("Performing Forward")
    net.forward()
    out(f"Initial loss: {net.loss():g}")
    if backward:
        out("Performing Backward")
        net.backward()
    clock = _StepClock()
    net.before_forward(clock.before)
    net.after_forward(clock.after)
    net.before_backward(clock.before)
    net.after_backward(clock.after)
    for _ in range(warmup):
        net.forward()
        if backward:
            net.backward()
    dev.finish()

    units, of_layer = plan_units(net, backward)
    res = Timing(units, iterations)
    builds0 = dev.build_stats["built"] + dev.build_stats["cached"]
    out("*** Benchmark begins ***")
    out(f"Testing for {iterations} iterations.")
    total_start = time.perf_counter()
    for it in range(iterations):
        # the user's call, untouched (its commands' events recorded)
        sink = []
        with record_events(sink):
            t0 = time.perf_counter()
            net.forward()
            dev.finish()
            t1 = time.perf_counter()
            nf = len(sink)
            if backward:
                net.backward()
                dev.finish()
            t2 = time.perf_counter()
        user = {"forward": (t1 - t0, sink[:nf]), "backward": (t2 - t1, sink[nf:])}
        out(f"Iteration: {it + 1} forward-backward time: {(t2 - t0) * 1000:.3f} ms.")
        for direction in ("forward", "backward") if backward else ("forward",):
            wall, events = user[direction]
            seconds = [event_seconds((ev,)) for ev in events]
            res.wall[direction] += wall
            res.device[direction] += sum(seconds)
            res.span[direction] += event_span(events)
            res.launches[direction] += len(events)
            # the same pass again with the step hooks: which step enqueued
            # which command, and each step's host enqueue time
            hooked = []
            clock.sink, clock.spans, clock.active = hooked, [], True
            with record_events(hooked):
                if direction == "forward":
                    net.forward()
                else:
                    net.backward()
                dev.finish()
            clock.active = False
            owner = [None] * len(hooked)
            for li, a, b, host_s in clock.spans:
                u = of_layer[li]
                for i in range(a, b):
                    owner[i] = u
                setattr(u, direction + "_host", getattr(u, direction + "_host") + host_s)
            hooked_s = event_seconds(hooked)
            if len(hooked) != len(events):
                # not the same commands (e.g. a blob computed on read once):
                # the hooked pass's own device times stand in
                res.mismatched[direction] += 1
                events, seconds = hooked, [event_seconds((ev,)) for ev in hooked]
            steps = outside = 0.0
            for u, sec in zip(owner, seconds):
                if u is None:
                    outside += sec
                    res.outside_launches[direction] += 1
                else:
                    steps += sec
                    setattr(u, direction, getattr(u, direction) + sec)
                    setattr(u, direction + "_launches", getattr(u, direction + "_launches") + 1)
            res.outside[direction] += outside
            res.series[direction].append((wall, sum(seconds), steps, outside, hooked_s))
    res.total = time.perf_counter() - total_start
    res.builds = dev.build_stats["built"] + dev.build_stats["cached"] - builds0
    clock.sink, clock.spans = [], []
    _report(res, backward, out, host)
    return res


def _report(res, backward, out, host):
    n = res.iterations
    out("Average time per layer: ")
    width = max((len(u.label) for u in res.units), default=4)
    for u in res.units:
        out(f"{u.label:>{width}}\tforward: {_ms(u.forward / n)} ms.")
        out(f"{u.label:>{width}}\tbackward: {_ms(u.backward / n)} ms.")
        if host:
            out(f"{u.label:>{width}}\tforward enqueue: {_ms(u.forward_host / n)} ms "
                f"({u.forward_launches / n:g} commands).")
            if backward:
                out(f"{u.label:>{width}}\tbackward enqueue: {_ms(u.backward_host / n)} ms "
                    f"({u.backward_launches / n:g} commands).")
    fwd, bwd = res.average("wall", "forward"), res.average("wall", "backward")
    out(f"Average Forward pass: {_ms(fwd)} ms.")
    out(f"Average Backward pass: {_ms(bwd)} ms.")
    out(f"Average Forward-Backward: {_ms(fwd + bwd)} ms.")
    out(f"Total Time: {_ms(res.total)} ms.")
    for direction, name in (("forward", "Forward"), ("backward", "Backward")):
        if direction == "backward" and not backward:
            break
        steps, outside = res.average("steps", direction), res.average("outside", direction)
        rest, wall = res.unattributed(direction), res.average("wall", direction)
        out(f"{name} pass split: per-step device {_ms(steps)} ms + device work outside "
            f"the steps {_ms(outside)} ms + unattributed {_ms(rest)} ms = {_ms(wall)} ms.")
        out(f"Sum of per-step {direction} times: {_ms(steps)} ms (device, OpenCL profiling "
            f"events; host enqueue of the steps {_ms(res.average('host', direction))} ms).")
        out(f"{name} device work outside the steps: {_ms(outside)} ms (reading results "
            "back, blobs computed on read).")
        out(f"Unattributed {direction} time: {_ms(rest)} ms (host enqueue and Python "
            "while the device waits, launch gaps).")
        out(f"Device time of one {direction} pass: "
            f"{_ms(res.average('device', direction))} ms busy over "
            f"{_ms(res.average('span', direction))} ms from its first command's start to "
            f"its last's end ({res.launches[direction] / n:g} commands).")
        if res.mismatched[direction]:
            out(f"Note: in {res.mismatched[direction]} of {n} iterations the {direction} "
                "pass with the step hooks enqueued a different number of commands; "
                "those iterations' step times come from the hooked pass")
    if res.builds:
        out(f"Warning: {res.builds} OpenCL programs were built during the timed "
            "iterations; raise --warmup")
    out("*** Benchmark ends ***")
