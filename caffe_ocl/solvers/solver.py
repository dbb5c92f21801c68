"""Solver: Caffe's training loop (src/caffe/solver.cpp, sgd_solver.cpp).

``Solver`` is the loop: set-up of the train and test nets, ``step`` /
``solve``, the test loop, the display lines, the loss ring and the finite
check. The update rules are in solvers/updates.py (``SGDSolver`` and its
subclasses), the learning-rate policies in solvers/lr_policy.py,
snapshot/restore in solvers/snapshot.py. Every numeric step of an
iteration runs on the device:

- gradients are zeroed, accumulated over ``iter_size`` forward/backward
  passes, clipped by their global L2 norm (a two-stage device reduction),
  normalized by 1/iter_size, regularized (L1/L2, ``decay_mult``) and
  turned into an update by one fused kernel per learnable blob
  (``kernels/solvers.cl``), bound once; the learning rate is rebound with
  ``Launch.set_arg`` each iteration;
- each iteration's loss is summed into a small device ring buffer, read
  only when a ``display`` line is printed; the ``average_loss`` smoothing is
  then replayed on the host from those values with Caffe's float32 formula,
  so the printed numbers are Caffe's and training does not sync the device
  every iteration.

Only ``display`` iterations, tests, snapshots and (opt-in) the non-finite
check read the device; each of them also reads the label-range check of the
net's loss and Accuracy layers (``Net.check_labels``), so a label outside
[0, C) stops training with one LabelError naming the iteration.
"""
import logging
import os
import time

import numpy as np

from .. import config
from ..blob import refresh_kept
from ..errors import (ArgumentError, ArgumentOverflowError, FileNotFound, SolverError,
                      naming)
from .. import safe_io
from ..net import Net
from ..ops import pointwise
from ..ops import solver as sops
from ..ops.random import set_random_seed
from .. import ranks as pstate
from ..plan import memory as memory_plan
from ..proto import caffe_pb2, read_net_prototxt, read_solver_prototxt
from . import lr_policy
from .snapshot import Snapshotting
from .param_arena import ParamArena, enabled as arena_enabled, supported

log = logging.getLogger("caffe_ocl")

NONE, STOP, SNAPSHOT = "none", "stop", "snapshot"
LOSS_RING_MAX = 1024    # losses kept on the device between two read-backs
# test nets one solver builds: each test_iter value is a whole net on the device
# (a 1 MB solver file of 100000 test_iter values built nets for hours)
MAX_TEST_NETS = 1000


def g_format(x):
    """A number as C++'s ostream prints a float (precision 6, %g)."""
    return "%g" % float(x)


def upgrade_snapshot_prefix(param, path):
    """Caffe's UpgradeSnapshotPrefixProperty: no snapshot_prefix -> the solver
    file's path without extension; a directory -> dir/<solver file stem>."""
    stem = os.path.splitext(os.fspath(path))[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = stem
        log.info("snapshot_prefix was not specified and is set to %s", param.snapshot_prefix)
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, os.path.basename(stem))
        log.info("snapshot_prefix is a directory and is set to %s", param.snapshot_prefix)


def read_solver(path):
    param = read_solver_prototxt(path)
    upgrade_snapshot_prefix(param, path)
    return param


def _read_net_file(path, what):
    try:
        return read_net_prototxt(path)
    except FileNotFound:
        raise FileNotFound(f"{what} not found: {path} (relative paths are resolved from "
                           f"the current directory {os.getcwd()}, as Caffe does)") from None


def output_loss_weights(net):
    w = {}
    for layer, tops in zip(net.layers, net.graph.tops):
        for t, lw in zip(tops, layer.loss_weights):
            w[t.name] = lw
    return w


class Callback:
    def __init__(self, on_start, on_gradients):
        self.on_start, self.on_gradients = on_start, on_gradients


def _check_iters(iters):
    """``iters`` of step() as an int of C++'s int range, as pycaffe's
    binding takes it: int(1.5) ran 1 iteration and 2**62 ran without end."""
    if not isinstance(iters, (int, np.integer)):
        raise ArgumentError(f"step takes an int number of iterations, got "
                            f"{type(iters).__name__} {iters!r}")
    if not -2**31 <= iters <= 2**31 - 1:
        raise ArgumentOverflowError(f"step: {int(iters)} iterations do not fit a 32-bit "
                                    "int (Caffe's Step(int iters))")
    return int(iters)


class Solver(Snapshotting):
    """Caffe's Solver: the loop. The update rules are its subclasses in
    solvers/updates.py (SGDSolver, NesterovSolver, ...); ``SGDSolver(path_or_SolverParameter)``."""
    kind = None          # key of ops.solver.SOLVER_KINDS; None -> from param.type
    n_history = 1        # history blobs per learnable param

    def __init__(self, param, *, source=None):
        if self.kind is None:
            raise SolverError("Solver is the base class: use get_solver(path) or one of "
                              "SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, "
                              "AdaDeltaSolver, AdamSolver")
        if isinstance(param, caffe_pb2.SolverParameter):
            p = caffe_pb2.SolverParameter()
            p.CopyFrom(param)
            self.source = source or "<SolverParameter>"
        else:
            self.source = os.fspath(param)
            p = read_solver(self.source)
        self.param = p
        log.info("Initializing solver from parameters: \n%s", p)
        if p.average_loss < 1:
            raise SolverError(f"{self.source}: average_loss should be >= 1, got {p.average_loss}")
        if p.iter_size < 1:
            raise SolverError(f"{self.source}: iter_size should be >= 1, got {p.iter_size}")
        self.check_param(p)
        safe_io.check_snapshot_prefix(p.snapshot_prefix, self.source)
        self.solver_count, self.solver_rank = pstate.solver_count, pstate.solver_rank
        if self.solver_rank == 0 and p.snapshot_prefix:
            safe_io.remove_stale_temp_files(p.snapshot_prefix)
        self.on_backward_layer = []   # fn(layer index) after each layer's backward
        if self.solver_rank == 0:
            self._check_snapshot_write_permissions()
        if p.random_seed >= 0:
            set_random_seed(p.random_seed + self.solver_rank)   # as Caffe's Solver::Init
        with naming(self.source):
            self.net = self._init_train_net()
        # the parameters in one arena (before the test nets share them)
        self._arena = ParamArena(self.net) if arena_enabled() and supported(self.net) \
            else None
        with naming(self.source):
            self.test_nets = self._init_test_nets() if self.solver_rank == 0 else []
        log.info("Solver scaffolding done.")
        if p.lr_policy not in lr_policy.LR_POLICIES:      # reported before the rest
            lr_policy.check(p, self.source)
        if p.regularization_type not in ("L1", "L2"):
            raise SolverError(f"{self.source}: unknown regularization type "
                              f"{p.regularization_type!r} (L1 or L2)")
        lr_policy.check(p, self.source)
        self.iter = 0
        self.current_step = 0
        self._callbacks = []
        self._action_fn = None
        self._requested_early_exit = False
        self._losses, self._smoothed_loss = [], np.float32(0)
        self._check_finite = bool(p.debug_info) or config.get("CHECK_FINITE")
        self._pre_solve()

    # ---- construction ------------------------------------------------------
    @property
    def param_arena(self):
        """The ParamArena (solvers/param_arena.py) holding the learnable
        parameters, or None (per-blob storage and launches)."""
        return self._arena

    def check_param(self, p):
        """Per-rule parameter checks (as the C++ constructors)."""

    @property
    def type(self):
        return self.kind

    def _check_snapshot_write_permissions(self):
        p = self.param
        if p.snapshot and p.snapshot_format == caffe_pb2.SolverParameter.BINARYPROTO or \
                p.snapshot and p.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            if not p.HasField("snapshot_prefix"):
                raise SolverError(f"{self.source}: snapshot is specified but "
                                  "snapshot_prefix is not")
            probe = f"{p.snapshot_prefix}_iter_0.tempfile"
            try:
                safe_io.probe_writable(probe)
            except OSError:
                # the shipped examples' folders are made by `caffe_ocl data`
                hint = ""
                if p.snapshot_prefix.startswith(("examples/mnist/", "examples/cifar10/")):
                    which = "mnist" if "/mnist/" in p.snapshot_prefix else "cifar10"
                    hint = (f" (for the shipped example, run `caffe_ocl data {which}` first, "
                            "from the folder you train in: it makes that folder and its data)")
                raise SolverError(f"Cannot write to snapshot prefix '{p.snapshot_prefix}'. "
                                  f"Make sure that the directory exists and is writeable.{hint}") \
                    from None

    def _init_train_net(self):
        p = self.param
        fields = [f for f in ("net", "net_param", "train_net", "train_net_param")
                  if p.HasField(f)]
        names = "net, net_param, train_net, train_net_param"
        if not fields:
            raise SolverError(f"{self.source}: SolverParameter must specify a train net "
                              f"using one of these fields: {names}")
        if len(fields) > 1:
            raise SolverError(f"{self.source}: SolverParameter must not contain more than "
                              f"one of these fields specifying a train_net: {names} "
                              f"(found {', '.join(fields)})")
        f = fields[0]
        if f == "train_net_param":
            log.info("Creating training net specified in train_net_param.")
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(p.train_net_param)
        elif f == "train_net":
            log.info("Creating training net from train_net file: %s", p.train_net)
            net_param = _read_net_file(p.train_net, "train_net file")
        elif f == "net_param":
            log.info("Creating training net specified in net_param.")
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(p.net_param)
        else:
            log.info("Creating training net from net file: %s", p.net)
            net_param = _read_net_file(p.net, "net file")
        state = caffe_pb2.NetState()
        state.phase = caffe_pb2.TRAIN
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        # activation diffs share buffers unless CAFFE_OCL_SHARE_DIFFS=0 / debug_info
        net = Net(net_param, phase=state.phase, level=state.level,
                  share_diffs=memory_plan.share_diffs_default(p, net_param))
        for w in p.weights:
            load_net_weights(net, w)
        return net

    def _init_test_nets(self):
        p = self.param
        generic = int(p.HasField("net_param")) + int(p.HasField("net"))
        n_params, n_files = len(p.test_net_param), len(p.test_net)
        n_test = n_params + n_files
        if generic:
            if len(p.test_iter) < n_test:
                raise SolverError(f"{self.source}: test_iter must be specified for each test "
                                  f"network: {n_test} test nets, {len(p.test_iter)} test_iter")
        elif len(p.test_iter) != n_test:
            raise SolverError(f"{self.source}: test_iter must be specified for each test "
                              f"network: {n_test} test nets (test_net/test_net_param), "
                              f"{len(p.test_iter)} test_iter")
        instances = len(p.test_iter) if generic else n_test
        if instances > MAX_TEST_NETS:
            raise SolverError(f"{self.source}: {instances} test nets (one per test_iter value); "
                              f"at most {MAX_TEST_NETS} are supported (each is a whole net on "
                              "the device)")
        if len(p.test_state) and len(p.test_state) != instances:
            raise SolverError(f"{self.source}: test_state must be unspecified or specified "
                              f"once per test net ({instances}), got {len(p.test_state)}")
        if instances and p.test_interval <= 0:
            raise SolverError(f"{self.source}: test nets are defined, so test_interval must "
                              f"be > 0 (got {p.test_interval})")
        sources, params = [], []
        for tp in p.test_net_param:
            np_ = caffe_pb2.NetParameter()
            np_.CopyFrom(tp)
            sources.append("test_net_param")
            params.append(np_)
        for f in p.test_net:
            sources.append(f"test_net file: {f}")
            params.append(_read_net_file(f, "test_net file"))
        remaining = len(p.test_iter) - len(params)
        generic_net = None
        for _ in range(max(remaining, 0) if generic else 0):
            if generic_net is None:     # the file is read once, whatever test_iter says
                generic_net = p.net_param if p.HasField("net_param") else \
                    _read_net_file(p.net, "net file")
            np_ = caffe_pb2.NetParameter()
            np_.CopyFrom(generic_net)
            sources.append("net_param" if p.HasField("net_param") else f"net file: {p.net}")
            params.append(np_)
        nets = []
        for i, (src, np_) in enumerate(zip(sources, params)):
            state = caffe_pb2.NetState()
            state.phase = caffe_pb2.TEST
            state.MergeFrom(np_.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            np_.state.CopyFrom(state)
            log.info("Creating test net (#%d) specified by %s", i, src)
            net = Net(np_, phase=state.phase, level=state.level)
            for w in p.weights:
                load_net_weights(net, w)
            net.share_trained_layers_with(self.net)
            nets.append(net)
        return nets

    def _pre_solve(self):
        """The update rule's state (``setup_update``) and the bound loss launches."""
        p, net = self.param, self.net
        dev = net.device
        self.dev = dev
        self.setup_update()
        # bounded whatever display says (display: 4e8 allocated 1.6 GB): a full
        # ring is read back early (Solver.step)
        self._ring_cap = max(min(int(p.display), LOSS_RING_MAX), 1)
        self._ring = dev.alloc(4 * self._ring_cap)
        self._ring_iters = []
        self._loss_plan = None
        self._dummy = dev.alloc(4)
        self._train_out_w = output_loss_weights(net)
        self._test_plans = {}
        self._finite_plan = None
        self._label_mark = None     # (iteration, forward passes) of the last mark

    # ---- the update rule (solvers/updates.py) ---------------------------------------
    def setup_update(self):
        """History and the launches of the update rule (SGDSolver)."""
        raise NotImplementedError

    def apply_update(self):
        raise NotImplementedError

    def clear_param_diffs(self):
        raise NotImplementedError

    # ---- learning rate (solvers/lr_policy.py) ----------------------------------------
    def get_learning_rate(self):
        """SGDSolver::GetLearningRate (may advance current_step)."""
        rate, self.current_step = lr_policy.learning_rate(self.param, self.iter,
                                                          self.current_step)
        return rate

    # ---- forward/backward with device-side loss -----------------------------------
    def _loss_tops(self, net):
        return [(t, w) for layer, tops in zip(net.layers, net.graph.tops)
                for t, w in zip(tops, layer.loss_weights) if w]

    def _build_loss_plan(self, net, out, key_only=False):
        tops = self._loss_tops(net)
        key = tuple((id(t.data_mem), t.count) for t, _ in tops)
        if key_only:
            return key
        launches = [sops.loss_accum(self.dev, t.count, t.data_buffer(), w, out)
                    for t, w in tops]
        if not launches:
            launches = [sops.loss_accum(self.dev, 0, self._dummy, 0.0, out)]
        return key, launches

    def _run_loss(self, plan, slot, first, divisor):
        q = self.dev.queue
        n = len(plan)
        for k, launch in enumerate(plan):
            launch.set_arg(sops.ARG_LOSS_SLOT, slot)
            launch.set_arg(sops.ARG_LOSS_ACCUMULATE, 0 if (first and k == 0) else 1)
            launch.set_arg(sops.ARG_LOSS_DIVISOR, divisor if k == n - 1 else 1.0)
            launch.run(q)

    def _forward(self, net, check=False):
        if not check:
            net.forward_from_to(0, len(net.layers) - 1)
            self._sync_solver_reads(net)
            return
        plan = self._finite_launches(net)
        q = self.dev.queue
        for li, layer in enumerate(net.layers):
            bottoms, tops = net.graph.bottoms[li], net.graph.tops[li]
            layer.reshape_if_needed(bottoms, tops)
            layer.forward(bottoms, tops)
            for t in tops:
                # a top set from Python (Input) is uploaded by its first reader;
                # the check reads it now, so it must not see stale device memory
                t.data_mem.to_device()
            for launch in plan["fwd"][li]:
                launch.run(q)

    def _sync_solver_reads(self, net):
        """The loss tops and the net's outputs current on the device: the
        loss and test-output launches read them there, and a top written
        from Python (a Python layer's loss or accuracy, written on the host)
        is otherwise uploaded only by a reader layer it does not have.
        Without this the solver logged 0, nan or a stale value for a Python
        loss layer's loss (BVLC's examples/pycaffe linreg + pyloss.py)."""
        for t, _ in self._loss_tops(net):
            t.data_mem.to_device()
        for name in net.outputs:
            net.blobs[name].data_mem.to_device()

    def _finite_launches(self, net):
        key = tuple((id(t.data_mem), t.count) for tops in net.graph.tops for t in tops)
        if self._finite_plan is not None and self._finite_plan["key"] == key:
            return self._finite_plan
        dev = self.dev
        nl = len(net.layers)
        flags_n = sum(len(t) for t in net.graph.tops) + len(net.graph.learnable_params)
        flags = dev.alloc(4 * max(flags_n, 1))
        what, fwd, idx = [], [], 0
        for li, tops in enumerate(net.graph.tops):
            row = []
            for t in tops:
                row.append(sops.check_finite(dev, t.count, t.data_buffer(), flags, idx))
                what.append(("output", li, t.name))
                idx += 1
            fwd.append(row)
        grads = []
        for pi, b in enumerate(net.graph.learnable_params):
            grads.append(sops.check_finite(dev, b.count, b.diff_buffer(), flags, idx))
            what.append(("gradient", pi, b.name))
            idx += 1
        self._finite_plan = dict(key=key, flags=flags, n=flags_n, what=what, fwd=fwd,
                                 grads=grads, zero=pointwise.fill_launch(dev, flags,
                                                                         max(flags_n, 1), 0.0),
                                 nl=nl)
        return self._finite_plan

    def _raise_if_non_finite(self, net):
        net.check_labels()          # a bad label is the better explanation of a NaN
        plan = self._finite_plan
        vals = np.empty(max(plan["n"], 1), np.float32)
        self.dev.download(vals, plan["flags"])
        bad = np.nonzero(vals[:plan["n"]])[0]
        if not len(bad):
            return
        kind, i, name = plan["what"][bad[0]]
        why = ("debug_info" if self.param.debug_info else "CAFFE_OCL_CHECK_FINITE=1")
        if kind == "output":
            layer = net.layers[i]
            raise SolverError(f"Iteration {self.iter}: layer {layer.name!r} ({layer.type}) "
                              f"produced a non-finite value (NaN or Inf) in its top "
                              f"{name!r}; stopping (check enabled by {why})")
        raise SolverError(f"Iteration {self.iter}: non-finite gradient (NaN or Inf) in "
                          f"param blob {name!r}; stopping (check enabled by {why})")

    def _forward_backward_iter(self, record_slot):
        """iter_size forward/backward passes; the mean loss goes to the ring
        buffer slot ``record_slot`` (None: not recorded)."""
        p, net = self.param, self.net
        check = self._check_finite
        if record_slot is not None:
            key = self._build_loss_plan(net, self._ring, key_only=True)
            if self._loss_plan is None or self._loss_plan[0] != key:
                self._loss_plan = self._build_loss_plan(net, self._ring)
        last = len(net.layers) - 1
        for k in range(p.iter_size):
            if check:
                plan = self._finite_launches(net)
                plan["zero"].run(self.dev.queue)
            self._forward(net, check)
            if record_slot is not None:
                self._run_loss(self._loss_plan[1], record_slot, k == 0,
                               float(p.iter_size) if k == p.iter_size - 1 else 1.0)
            if self.on_backward_layer and k == p.iter_size - 1:
                hooks = self.on_backward_layer

                def after_layer(li):               # hooks see each layer finish
                    for hook in hooks:
                        hook(li)
                net.backward_from_to(last, 0, after_layer)
            else:
                net.backward_from_to(last, 0)
            if check:
                for launch in plan["grads"]:
                    launch.run(self.dev.queue)
                self._raise_if_non_finite(net)

    # ---- smoothed loss (Solver::UpdateSmoothedLoss, replayed at display) ---------
    def _update_smoothed(self, loss, it, start_iter, average_loss):
        loss = np.float32(loss)
        if len(self._losses) < average_loss:
            self._losses.append(loss)
            size = len(self._losses)
            self._smoothed_loss = np.float32(
                (self._smoothed_loss * np.float32(size - 1) + loss) / np.float32(size))
        else:
            idx = (it - start_iter) % average_loss
            self._smoothed_loss = np.float32(
                self._smoothed_loss + (loss - self._losses[idx]) / np.float32(average_loss))
            self._losses[idx] = loss

    def _flush_losses(self):
        if not self._ring_iters:
            return
        vals = np.empty(self._ring_cap, np.float32)
        self.dev.download(vals, self._ring)
        self.net.check_labels()
        for k, it in enumerate(self._ring_iters):
            self._update_smoothed(vals[k], it, self._start_iter, self.param.average_loss)
        self._ring_iters = []

    @property
    def smoothed_loss(self):
        self._flush_losses()
        return float(self._smoothed_loss)

    # ---- main loop -----------------------------------------------------------------
    def add_callback(self, on_start, on_gradients=None):
        """pycaffe: on_start() before each iteration's forward passes,
        on_gradients() after them, before the update; or one object with
        on_start() and on_gradients_ready() (a Solver::Callback such as
        caffe.NCCL: ``solver.add_callback(nccl)``)."""
        if on_gradients is None:
            obj = on_start
            on_start = getattr(obj, "on_start", None)
            on_gradients = getattr(obj, "on_gradients_ready", None)
            if not (callable(on_start) and callable(on_gradients)):
                raise ArgumentError(f"add_callback takes two callables (on_start, "
                                    f"on_gradients) or an object with on_start() and "
                                    f"on_gradients_ready(), got {type(obj).__name__}")
        # checked here: a non-callable failed only at the next step()
        for what, fn in (("on_start", on_start), ("on_gradients", on_gradients)):
            if not callable(fn):
                raise ArgumentError(f"add_callback: {what} must be callable, got "
                                    f"{type(fn).__name__}")
        self._callbacks.append(Callback(on_start, on_gradients))

    def set_action_function(self, fn):
        """fn() -> "none" | "stop" | "snapshot", polled between iterations
        (Caffe's SetActionFunction; the CLI's signal handler)."""
        self._action_fn = fn

    def _requested_action(self):
        return self._action_fn() if self._action_fn else NONE

    def step(self, iters):
        """Solver::Step: run ``iters`` iterations."""
        p = self.param
        start_iter = self.iter
        stop_iter = self.iter + _check_iters(iters)
        self._losses, self._smoothed_loss = [], np.float32(0)
        self._start_iter = start_iter
        self._ring_iters = []
        self._mark_label_passes()
        timer = time.time()
        iterations_last = self.iter
        while self.iter < stop_iter:
            self.clear_param_diffs()
            if p.test_interval and self.iter % p.test_interval == 0 and \
                    (self.iter > 0 or p.test_initialization):
                self.test_all()
                if self._requested_early_exit:
                    break
            for cb in self._callbacks:
                cb.on_start()
            display = p.display and self.iter % p.display == 0
            slot = None
            if p.display:
                if len(self._ring_iters) >= self._ring_cap:
                    self._flush_losses()
                slot = len(self._ring_iters)
                self._ring_iters.append(self.iter)
            self._forward_backward_iter(slot)
            if display:
                self._flush_losses()
                lapse = time.time() - timer
                per_s = (self.iter - iterations_last) / (lapse if lapse else 1)
                log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter,
                         g_format(per_s), g_format(lapse), p.display, g_format(self._smoothed_loss))
                timer = time.time()
                iterations_last = self.iter
                self._log_outputs(self.net, self._train_out_w)
            for cb in self._callbacks:
                cb.on_gradients()
            self.apply_update()
            self.iter += 1
            request = self._requested_action()
            if (p.snapshot and self.iter % p.snapshot == 0) or request == SNAPSHOT:
                self.snapshot()
            if request == STOP:
                self._requested_early_exit = True
                break
        refresh_kept()          # arrays Python keeps show the new values

    def _mark_label_passes(self):
        """Tell the train net's label checks which iteration each forward
        pass is; a new mark only when the passes no longer follow the
        iterations (pycaffe's step(1) loops keep one)."""
        now = self.net.label_passes()
        if now is None:
            return
        m = self._label_mark
        if m is not None and m[1] + (self.iter - m[0]) * self.param.iter_size == now:
            return
        self._label_mark = (self.iter, now)
        self.net.mark_label_passes(self._describe_pass(self.iter))

    def _describe_pass(self, start_iter):
        """The solver's k-th train forward pass from ``start_iter`` on, for a
        LabelError (iter_size passes make one iteration)."""
        n = self.param.iter_size

        def describe(k):
            if n == 1:
                return f"iteration {start_iter + k}"
            return f"iteration {start_iter + k // n} (forward pass {k % n + 1} of iter_size {n})"
        return describe

    def _log_outputs(self, net, weights):
        idx = 0
        for name in net.outputs:
            vals = net.blobs[name].host_data().ravel()
            w = weights.get(name, 0.0)
            for v in vals:
                extra = f" (* {g_format(w)} = {g_format(np.float32(w) * v)} loss)" if w else ""
                log.info("    Train net output #%d: %s = %s%s", idx, name, g_format(v), extra)
                idx += 1

    def solve(self, resume_file=None):
        """Solver::Solve: train to max_iter (optionally resuming a .solverstate)."""
        p = self.param
        log.info("Solving %s", self.net.name)
        log.info("Learning Rate Policy: %s", p.lr_policy)
        self._requested_early_exit = False
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        self.step(p.max_iter - self.iter)
        self.net.check_labels()
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self._requested_early_exit:
            log.info("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            self._flush_losses()
            self._forward(self.net)
            loss = self.net.loss()
            self._update_smoothed(loss, self.iter, start_iter, p.average_loss)
            log.info("Iteration %d, loss = %s", self.iter, g_format(self._smoothed_loss))
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    # ---- testing ---------------------------------------------------------------------
    def test_all(self):
        for i in range(len(self.test_nets)):
            if self._requested_early_exit:
                break
            self.test(i)

    def _test_plan(self, i):
        net = self.test_nets[i]
        outs = [net.blobs[n] for n in net.outputs]
        key = (tuple((id(b.data_mem), b.count) for b in outs),
               self._build_loss_plan(net, None, key_only=True))
        plan = self._test_plans.get(i)
        if plan is not None and plan["key"] == key:
            return plan
        dev = self.dev
        total = sum(b.count for b in outs)
        acc = dev.alloc(4 * max(total, 1))
        launches, off = [], 0
        for b in outs:
            launches.append((pointwise.copy2d(dev, 1, b.count, b.data_buffer(), 0, b.count,
                                              acc, off, b.count, accumulate=False),
                             pointwise.copy2d(dev, 1, b.count, b.data_buffer(), 0, b.count,
                                              acc, off, b.count, accumulate=True)))
            off += b.count
        loss_buf = dev.alloc(4)
        _, loss_launches = self._build_loss_plan(net, loss_buf)
        plan = dict(key=key, acc=acc, total=total, copies=launches, loss_buf=loss_buf,
                    loss=loss_launches, names=[(b.name, b.count) for b in outs])
        self._test_plans[i] = plan
        return plan

    def test(self, test_net_id=0):
        """Solver::Test: run test_iter batches of a test net, log mean outputs."""
        p = self.param
        log.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        net = self.test_nets[test_net_id]
        net.share_trained_layers_with(self.net)
        n_iter = p.test_iter[test_net_id]
        plan = self._test_plan(test_net_id)
        net.mark_label_passes(lambda k: f"test net #{test_net_id}, test batch {k} of "
                                        f"the test at iteration {self.iter}")
        q = self.dev.queue
        for i in range(n_iter):
            request = self._requested_action()
            while request != NONE:
                if request == SNAPSHOT:
                    self.snapshot()
                elif request == STOP:
                    self._requested_early_exit = True
                request = self._requested_action()
            if self._requested_early_exit:
                break
            self._forward(net)
            plan = self._test_plan(test_net_id)
            for first, rest in plan["copies"]:
                (first if i == 0 else rest).run(q)
            if p.test_compute_loss:
                self._run_loss(plan["loss"], 0, i == 0, 1.0)
        if self._requested_early_exit:
            log.info("Test interrupted.")
            return
        scores = np.zeros(max(plan["total"], 1), np.float32)
        if n_iter:
            self.dev.download(scores, plan["acc"])
            net.check_labels()
        if p.test_compute_loss:
            loss = np.zeros(1, np.float32)
            if n_iter:
                self.dev.download(loss, plan["loss_buf"])
            log.info("Test loss: %s", g_format(loss[0] / np.float32(n_iter)))
        weights = output_loss_weights(net)
        means, idx, off = [], 0, 0
        if n_iter:
            for name, count in plan["names"]:
                w = weights.get(name, 0.0)
                for k in range(count):
                    mean = np.float32(scores[off + k] / np.float32(n_iter))
                    means.append(float(mean))
                    extra = f" (* {g_format(w)} = {g_format(np.float32(w) * mean)} loss)" if w else ""
                    log.info("    Test net output #%d: %s = %s%s", idx, name, g_format(mean), extra)
                    idx += 1
                off += count
        self.mean_scores = getattr(self, "mean_scores", {})
        self.mean_scores[test_net_id] = means
        return means

    def share_weights(self, net):
        """pycaffe: make ``net`` use this solver's trained weights."""
        net.share_trained_layers_with(self.net)


def load_net_weights(net, model_list):
    """Net's LoadNetWeights: comma-separated list of .caffemodel files."""
    for name in str(model_list).split(","):
        name = name.strip()
        if not name:
            continue
        log.info("Finetuning from %s", name)
        net.copy_from(name)
