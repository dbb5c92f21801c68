"""DataParallel: one solver per rank, gradients averaged across ranks with
Caffe's multi-GPU semantics (src/caffe/parallel.cpp, class NCCL):

* ``bcast()``: rank 0's weights (and, after a restore, its solver history,
  iteration and learning-rate step) go to every rank (NCCL::Broadcast);
* layer-wise reduction (NCCL::run, ``layer_wise_reduce``): as soon as the
  backward of the layer that completes a bucket of parameter gradients has
  been enqueued, the bucket is downloaded (non-blocking) and a reduction
  thread sums it over ranks (MPI Allreduce, float32 SUM) and scales it by
  1/solver_count, while the device goes on with the earlier layers;
* ``on_gradients`` (NCCL::on_gradients_ready): wait for the buckets, upload
  the averaged gradients; the solver then applies its ordinary update
  (clipping, normalization by iter_size, regularization, lr) to them.

Buckets are consecutive learnable blobs in backward order, closed once they
hold ``bucket_bytes`` (``CAFFE_OCL_BUCKET_MB``; 0 = one bucket per layer, as
Caffe's layer-wise reduce). Default: 1 MiB on GPUs; on a CPU OpenCL device
one bucket after the backward pass, because there the device computes on the
cores MPI needs and overlapping measured slower (benchmarks/parallel_overlap.py). A shared parameter is
reduced after the earliest layer that uses it.

Timing (``stats()``) separates communication hidden behind the backward
pass from communication the update waits for.
"""
import json
import logging
import os
import queue
import threading
import time

import numpy as np

from ..solvers.solver import NONE, SNAPSHOT, STOP, Callback
from .comm import ParallelError

log = logging.getLogger("caffe_ocl")

ACTIONS = (NONE, STOP, SNAPSHOT)


def net_signature(solver):
    """What must agree across ranks: solver type and every layer's name,
    type and parameter shapes."""
    net = solver.net
    return json.dumps({"solver": solver.kind,
                       "layers": [[n, l.type, [list(b.shape) for b in l.blobs]]
                                  for n, l in zip(net._layer_names, net.layers)]})


def _describe_difference(a, b):
    a, b = json.loads(a), json.loads(b)
    if a["solver"] != b["solver"]:
        return f"solver type {a['solver']} vs {b['solver']}"
    la, lb = a["layers"], b["layers"]
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return (f"layer #{i}: {x[0]!r} ({x[1]}) params {x[2]} vs {y[0]!r} ({y[1]}) "
                    f"params {y[2]}")
    return f"{len(la)} layers vs {len(lb)} layers"


class _Bucket:
    __slots__ = ("index", "host", "segments", "ready_layer", "events", "nbytes")

    def __init__(self, index, segments, ready_layer):
        self.index = index
        self.segments = segments            # [(blob, offset, count)]
        total = sum(c for _, _, c in segments)
        self.host = np.zeros(max(total, 1), np.float32)
        self.nbytes = 4 * total
        self.ready_layer = ready_layer
        self.events = ()


class DataParallel:
    """Attach to a solver (on every rank, with the same net): checks the
    nets agree, broadcasts rank 0's state and installs the reduction."""

    def __init__(self, solver, group, bucket_bytes=None):
        self.solver, self.group = solver, group
        self.size, self.rank = group.size, group.rank
        if getattr(solver, "solver_count", 1) != self.size or \
                getattr(solver, "solver_rank", 0) != self.rank:
            raise ParallelError(
                f"the solver was created with solver_count="
                f"{getattr(solver, 'solver_count', 1)}, solver_rank="
                f"{getattr(solver, 'solver_rank', 0)} but the MPI group has {self.size} "
                f"ranks (this is rank {self.rank}): create the group "
                "(caffe_ocl.parallel.init()) before the solver, so that its Data layers "
                "read this rank's records")
        if bucket_bytes is None:
            env = os.environ.get("CAFFE_OCL_BUCKET_MB")
            if env is not None:
                bucket_bytes = int(float(env) * 2 ** 20)
            elif getattr(solver.dev, "is_cpu", False):
                # a CPU device computes on the cores MPI needs for progress: measured
                # slower with overlap (benchmarks/parallel_overlap.py), so one bucket
                bucket_bytes = 1 << 62
            else:
                bucket_bytes = 1 << 20
        self.bucket_bytes = bucket_bytes
        self.scale = np.float32(1.0 / self.size)
        self.check_same_net()
        self.bcast()
        self._build_buckets()
        self._queue = queue.Queue()
        self._done = threading.Condition()
        self._n_done = 0
        self._failure = None
        self._launched = set()
        self._have_cb = False
        self._iter_comm = 0.0
        self._iter_last_ready = None
        self._iter_all_done = None
        self.totals = dict(iterations=0, comm_s=0.0, exposed_s=0.0, wait_s=0.0,
                           backward_enqueue_s=0.0, bytes=0)
        self._t_backward = None
        self._thread = threading.Thread(target=self._run, name="caffe_ocl allreduce",
                                        daemon=True)
        self._thread.start()
        self._local_action = solver._action_fn
        self._agreed = NONE
        self._act = np.zeros(1, np.int32)
        solver.set_action_function(self._action)
        solver.on_backward_layer.append(self._on_layer)
        solver._callbacks.insert(0, Callback(self._on_start, self._on_gradients))
        solver.data_parallel = self
        log.info("Data-parallel training: %d ranks (thread level %d), %d gradient buckets "
                 "(%.3g MB per iteration), effective batch = %d x batch_size",
                 self.size, group.thread_level, len(self.buckets),
                 sum(b.nbytes for b in self.buckets) / 1e6, self.size)

    # ---- set-up --------------------------------------------------------------------
    def check_same_net(self):
        mine = net_signature(self.solver)
        sigs = self.group.allgather(mine)
        for r, s in enumerate(sigs):
            if s != sigs[0]:
                e = ParallelError(f"ranks disagree on the net: rank {r} differs from rank 0 "
                                  f"({_describe_difference(sigs[0], s)}); every rank must "
                                  "train the same net and solver")
                e.collective = True       # every rank raises it; no abort needed
                raise e

    def bcast(self):
        """Rank 0's weights, history, iteration and lr step to every rank
        (NCCL::Broadcast). Called again after a pycaffe restore on rank 0."""
        s, g = self.solver, self.group
        for blob in list(s.net._learnable) + list(s.history):
            arr = np.ascontiguousarray(blob.host_data().reshape(-1)[:blob.count],
                                       np.float32).copy()
            g.bcast(arr)
            if self.rank != 0:
                blob.data[...] = arr.reshape(blob.shape)
        meta = np.array([s.iter, s.current_step], np.int64)
        g.bcast(meta)
        s.iter, s.current_step = int(meta[0]), int(meta[1])

    def _build_buckets(self):
        net = self.solver.net
        ready = {}
        for li, layer in enumerate(net.layers):
            for lid in getattr(layer, "_learnable_ids", []):
                ready[lid] = min(ready.get(lid, li), li)
        order = sorted(range(len(net._learnable)), key=lambda i: (-ready.get(i, 0), i))
        self.buckets, seg, off = [], [], 0
        for n, lid in enumerate(order):
            b = net._learnable[lid]
            seg.append((b, off, b.count))
            off += b.count
            nxt = order[n + 1] if n + 1 < len(order) else None
            layer_ends = nxt is None or ready.get(nxt, 0) != ready.get(lid, 0)
            if nxt is None or (layer_ends if self.bucket_bytes <= 0
                               else 4 * off >= self.bucket_bytes):
                self.buckets.append(_Bucket(len(self.buckets), seg, ready.get(lid, 0)))
                seg, off = [], 0
        self._ready_at = {}
        for bk in self.buckets:
            self._ready_at.setdefault(bk.ready_layer, []).append(bk)

    # ---- per iteration ---------------------------------------------------------------
    def _on_start(self):
        self._launched = set()
        with self._done:
            self._n_done = 0
        self._iter_comm = 0.0
        self._iter_last_ready = None
        self._t_backward = None

    def _launch(self, bk):
        import pyopencl as cl
        q = self.solver.dev.queue
        evs = []
        for blob, off, cnt in bk.segments:
            blob.diff_mem.to_device()
            evs.append(cl.enqueue_copy(q, bk.host[off:off + cnt], blob.diff_buffer(),
                                       is_blocking=False))
        q.flush()
        bk.events = evs
        try:      # when the gradients reached the host (driver thread: no MPI here)
            evs[-1].set_callback(cl.command_execution_status.COMPLETE, self._mark_ready)
            self._have_cb = True
        except Exception:   # pragma: no cover - OpenCL 1.0 drivers
            pass
        self._launched.add(bk.index)
        self._queue.put(bk)

    def _mark_ready(self, status):
        t = time.perf_counter()
        if self._iter_last_ready is None or t > self._iter_last_ready:
            self._iter_last_ready = t

    def _on_layer(self, li):
        """Solver hook: layer ``li``'s backward has been enqueued."""
        if self._t_backward is None:
            self._t_backward = time.perf_counter()
        for bk in self._ready_at.get(li, ()):
            self._launch(bk)
        if li == 0:
            self.totals["backward_enqueue_s"] += time.perf_counter() - self._t_backward

    def _run(self):
        """The reduction thread: buckets in the same order on every rank."""
        import pyopencl as cl
        while True:
            bk = self._queue.get()
            if bk is None:
                return
            try:
                if bk.events:
                    cl.wait_for_events(bk.events)
                t0 = time.perf_counter()
                if not self._have_cb:
                    self._iter_last_ready = t0
                self.group.allreduce_sum(bk.host)
                bk.host *= self.scale
                t1 = time.perf_counter()
                self._iter_comm += t1 - t0
            except BaseException as e:    # handed to the main thread
                self._failure = e
            with self._done:
                self._n_done += 1
                self._iter_all_done = time.perf_counter()
                self._done.notify_all()

    def _on_gradients(self):
        """Wait for every bucket, upload the averaged gradients, agree on the
        signal-requested action (rank 0's)."""
        import pyopencl as cl
        for bk in self.buckets:          # backward run outside the solver's loop
            if bk.index not in self._launched:
                self._launch(bk)
        t0 = time.perf_counter()
        with self._done:
            while self._n_done < len(self.buckets) and self._failure is None:
                self._done.wait(0.5)
        t1 = time.perf_counter()
        if self._failure is not None:
            raise ParallelError(f"gradient reduction failed on rank {self.rank}: "
                                f"{self._failure}")
        q = self.solver.dev.queue
        for bk in self.buckets:
            for blob, off, cnt in bk.segments:
                cl.enqueue_copy(q, blob.diff_buffer(), bk.host[off:off + cnt],
                                is_blocking=False)
                blob.diff_mem.device_written()
        tot = self.totals
        tot["iterations"] += 1
        tot["comm_s"] += self._iter_comm
        tot["wait_s"] += t1 - t0
        if self._iter_last_ready is not None and self._iter_all_done is not None:
            tot["exposed_s"] += max(self._iter_all_done - self._iter_last_ready, 0.0)
        tot["bytes"] += sum(b.nbytes for b in self.buckets)
        # the requested action (signals reach rank 0's handler) is agreed by all
        if self.rank == 0:
            a = self._local_action() if self._local_action else NONE
            self._act[0] = ACTIONS.index(a) if a in ACTIONS else 0
        self.group.bcast(self._act)
        self._agreed = ACTIONS[int(self._act[0])]

    def _action(self):
        a, self._agreed = self._agreed, NONE
        return a

    # ---- reporting ---------------------------------------------------------------------
    def stats(self):
        """Per-iteration means: ``comm_ms`` (time in Allreduce + scaling),
        ``exposed_ms`` (from the moment the last bucket's gradients were ready
        on the host to the end of its reduction: communication the update
        waited for), ``hidden_ms`` = comm - exposed (overlapped with the
        backward pass), ``overlap`` = hidden / comm."""
        t = self.totals
        n = max(t["iterations"], 1)
        comm, exposed = t["comm_s"] / n, min(t["exposed_s"] / n, t["comm_s"] / n)
        return dict(iterations=t["iterations"], buckets=len(self.buckets),
                    mb_per_iter=t["bytes"] / n / 1e6, comm_ms=1e3 * comm,
                    exposed_ms=1e3 * exposed, hidden_ms=1e3 * (comm - exposed),
                    wait_ms=1e3 * t["wait_s"] / n,
                    overlap=(comm - exposed) / comm if comm > 0 else 0.0)

    def log_stats(self):
        s = self.stats()
        if s["iterations"]:
            log.info("Data-parallel: %d ranks, %d buckets, %.3g MB reduced per iteration; "
                     "communication %.3g ms/iter, %.3g ms hidden behind backward, %.3g ms "
                     "exposed (overlap %.0f%%)", self.size, s["buckets"], s["mb_per_iter"],
                     s["comm_ms"], s["hidden_ms"], s["exposed_ms"], 100 * s["overlap"])
        return s

    def close(self):
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5)
