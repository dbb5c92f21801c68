"""DataParallel: one solver per rank, gradients averaged across ranks with
Caffe's multi-GPU semantics (src/caffe/parallel.cpp, class NCCL):

* ``bcast()``: rank 0's weights (and, after a restore, its solver history,
  iteration and learning-rate step) go to every rank (NCCL::Broadcast);
* layer-wise reduction (NCCL::run, ``layer_wise_reduce``): as soon as the
  backward of the layer that completes a bucket of parameter gradients has
  been enqueued, the bucket is reduced while the device goes on with the
  earlier layers; the result is the sum over ranks times 1/solver_count,
  bitwise identical on every rank;
* ``on_gradients`` (NCCL::on_gradients_ready): make the device queue wait
  for the reduced gradients; the solver then applies its ordinary update
  (clipping, normalization by iter_size, regularization, lr) to them. The
  host waits here, so the device idles while Python enqueues the update and
  the next forward: the parameter arena (caffe_ocl/solvers/param_arena.py) makes
  that one launch for the update and one for clearing the gradients.
  (Gating the compute queue on an OpenCL user event instead, so the host
  need not wait, deadlocks: pyopencl holds the GIL in a non-blocking
  enqueue, and both NVIDIA's driver and PoCL block such an enqueue behind
  an unset user event, so the reduction thread can never set it.)

Three OpenCL queues on the rank's device: the compute queue (forward,
backward, update), a copy queue for the downloads and a reduction queue for
the uploads and the averaging kernels (kernels/allreduce.cl). A bucket's
download waits for a marker of the compute queue, so the backward never
stalls behind copies; before the update the compute queue waits for the
reduction queue. All arithmetic on gradients runs on the device.

Two reduction paths (``CAFFE_OCL_REDUCE``):

* ``shm`` (default when every rank is on one machine): an MPI-3 shared
  window (parallel/shm.py) with one slot per rank for the whole gradient
  vector, twice (iteration parity). Per bucket: the main thread enqueues
  the download of this rank's bucket into its slot; the reduction thread
  waits for it, synchronises the node's ranks (``Win.Sync`` + barrier +
  ``Win.Sync``; buckets come in the same order on every rank), uploads the
  peers' slices to a device staging buffer and runs ``sum_ranks``: own
  values read from the diff, the others from staging, summed in rank order
  0..N-1, times 1/N, into the diff. Safety of the two copies: a rank writes
  parity p of iteration k+2 only after every rank has passed the last
  bucket barrier of iteration k+1, which each rank's thread enters only
  after its uploads of iteration k (the reads of parity p) completed (the
  thread finishes the reduction queue at the end of every iteration).
  ``CAFFE_OCL_STAGING=hostptr`` (default on GPUs) wraps every slot in a
  ``CL_MEM_USE_HOST_PTR`` buffer (drivers may pin it and DMA directly;
  map/unmap keeps host and device views coherent), ``plain`` (default on
  CPU devices) copies to/from the NumPy views of the window.
* ``mpi`` (several machines, or asked for): the bucket is downloaded into a
  host array, summed by ``MPI_Allreduce`` on the reduction thread, uploaded
  back and scaled by 1/N on the device.

Buckets are runs of consecutive learnable blobs in backward order holding
``bucket_bytes`` (``CAFFE_OCL_BUCKET_MB``; a blob larger than what is left
is split across buckets; 0 = one bucket per layer, as Caffe's layer-wise
reduce). Default: 1 MiB on GPUs; on a CPU OpenCL device one bucket after
the backward pass, because there the device computes on the cores MPI needs
and overlapping measured slower (benchmarks/parallel_overlap.py). A shared
parameter is reduced after the earliest layer that uses it.

Timing (``stats()``) separates communication hidden behind the backward
pass from communication the update waits for.
"""
import json
import logging
import queue
import threading
import time

import numpy as np

from .. import config
from ..solvers.solver import NONE, SNAPSHOT, STOP, Callback
from ..ops import allreduce
from .comm import ParallelError
from .shm import SharedSlots

log = logging.getLogger("caffe_ocl")

ACTIONS = (NONE, STOP, SNAPSHOT)


def net_signature(solver):
    """What must agree across ranks: solver type and every layer's name,
    type and parameter shapes."""
    net = solver.net
    return json.dumps({"solver": solver.kind,
                       "layers": [[n, l.type, [list(b.shape) for b in l.blobs]]
                                  for n, l in zip(net.graph.layer_names, net.layers)]})


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


REDUCE_PATHS = ("shm", "mpi")
STAGINGS = ("hostptr", "plain")


class _Bucket:
    __slots__ = ("index", "segments", "mems", "base", "count", "nbytes", "ready_layer",
                 "host", "launches", "events")

    def __init__(self, index, segments, mems, base, ready_layer):
        self.index = index
        # [(diff buffer, offset in it, offset in the bucket, count)]
        self.segments = segments
        self.mems = mems                    # the gradients' SyncedMemory objects
        self.base = base                    # offset in the whole gradient vector
        self.count = sum(c for _, _, _, c in segments)
        self.nbytes = 4 * self.count
        self.ready_layer = ready_layer
        self.host = None                    # mpi path: host array of the bucket
        self.launches = []                  # averaging kernels, one per segment
        self.events = ()                    # this iteration's download events


def _choose(name, allowed, default, what):
    """Setting ``name`` (a choice declared in config.py), or ``default``."""
    v = config.get(name)
    if v is None:
        return default
    if v not in allowed:
        raise ParallelError(f"CAFFE_OCL_{name}={v!r}: expected one of {', '.join(allowed)} "
                            f"({what})")
    return v


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
        self.dev = dev = solver.dev
        if bucket_bytes is None:
            mb = config.get("BUCKET_MB")
            if mb is not None:
                bucket_bytes = int(mb * 2 ** 20)
            elif getattr(dev, "is_cpu", False):
                # a CPU device computes on the cores MPI needs for progress: measured
                # slower with overlap (benchmarks/parallel_overlap.py), so one bucket
                bucket_bytes = 1 << 62
            else:
                bucket_bytes = 1 << 20
        self.bucket_bytes = bucket_bytes
        self.scale = float(np.float32(1.0) / np.float32(self.size))
        self.check_same_net()
        self.bcast()
        self._build_buckets()
        self._setup_path()
        self._queue = queue.Queue()
        self._done = threading.Condition()
        self._failure = None
        self._launched = set()
        self._round = 0              # main thread: the iteration being computed
        self._completed = 0          # reduction thread: last round fully reduced
        self._markers = {}           # round -> end-of-reduction marker
        self.totals = dict(iterations=0, comm_s=0.0, sync_s=0.0, exposed_s=0.0, wait_s=0.0,
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
                 "(%s, %.3g MB per iteration), reduction %s, effective batch = %d x "
                 "batch_size", self.size, group.thread_level, len(self.buckets),
                 "arena ranges" if self.arena_buckets else "blobs",
                 self.total * 4 / 1e6, self.describe_path(), self.size)

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
        for blob in list(s.net.graph.learnable_params) + list(s.history):
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
        for li, ids in enumerate(net.graph.layer_learnable_ids):
            for lid in ids:
                ready[lid] = min(ready.get(lid, li), li)
        arena = self.solver.param_arena
        self.arena_buckets = arena is not None and arena.valid() and self.bucket_bytes > 0
        if self.arena_buckets:
            self._build_arena_buckets(arena, ready)
        else:
            self._build_blob_buckets(ready)
        self._ready_at = {}
        for bk in self.buckets:
            self._ready_at.setdefault(bk.ready_layer, []).append(bk)

    def _build_arena_buckets(self, arena, ready):
        """Buckets as ranges of the parameter arena's gradient buffer
        (caffe_ocl/solvers/param_arena.py), from its end down (the backward pass
        finishes the last layers' gradients first): one copy and one sum
        kernel per bucket whatever the number of blobs in it. Padding between
        blobs is zero on every rank and sums to zero. A bucket is ready after
        the backward of the earliest layer using any blob it overlaps."""
        net = self.solver.net
        index = {id(b): i for i, b in enumerate(net.graph.learnable_params)}
        slots = [(o, b.data_mem.capacity, index[id(b)], b.diff_mem)
                 for b, o in zip(arena.blobs, arena.offsets)]
        cap = max(self.bucket_bytes // 4, 1)
        self.buckets, hi, base = [], arena.total, 0
        while hi > 0:
            lo = max(hi - cap, 0)
            inside = [sl for sl in slots if sl[0] < hi and sl[0] + sl[1] > lo]
            if inside:
                layer = min(ready.get(lid, 0) for _, _, lid, _ in inside)
                self.buckets.append(_Bucket(len(self.buckets), [(arena.diff, lo, 0, hi - lo)],
                                            [m for _, _, _, m in inside], base, layer))
                base += hi - lo
            hi = lo
        self.total = base

    def _build_blob_buckets(self, ready):
        """Buckets as runs of blobs in backward order (no arena, or one
        bucket per layer asked for)."""
        net = self.solver.net
        order = [i for i in sorted(range(len(net.graph.learnable_params)),
                                   key=lambda i: (-ready.get(i, 0), i))
                 if net.graph.learnable_params[i].count > 0]
        cap = self.bucket_bytes // 4 if self.bucket_bytes > 0 else None   # elements
        if cap is not None:
            cap = max(cap, 1)
        self.buckets, seg, mems, fill, base = [], [], [], 0, 0

        def close(layer):
            nonlocal seg, mems, fill, base
            self.buckets.append(_Bucket(len(self.buckets), seg, mems, base, layer))
            base += fill
            seg, mems, fill = [], [], 0

        for n, lid in enumerate(order):
            b, layer = net.graph.learnable_params[lid], ready.get(lid, 0)
            boff = 0
            while boff < b.count:
                take = b.count - boff if cap is None else min(b.count - boff, cap - fill)
                seg.append((b.diff_buffer(), boff, fill, take))
                mems.append(b.diff_mem)
                boff += take
                fill += take
                if cap is not None and fill >= cap:
                    close(layer)
            nxt = order[n + 1] if n + 1 < len(order) else None
            layer_ends = nxt is None or ready.get(nxt, 0) != layer
            if seg and (nxt is None or (cap is None and self.bucket_bytes <= 0
                                        and layer_ends)):
                close(layer)
        self.total = base

    def _setup_path(self):
        import pyopencl as cl
        g, dev = self.group, self.dev
        can_shm = g.local_size == g.size > 1
        want = _choose("REDUCE", REDUCE_PATHS, "shm" if can_shm else "mpi",
                       "gradient reduction path")
        if want == "shm" and not can_shm:
            log.warning("CAFFE_OCL_REDUCE=shm needs every rank on one machine (%d of %d "
                        "ranks here): using MPI Allreduce", g.local_size, g.size)
            want = "mpi"
        self.staging = _choose("STAGING", STAGINGS,
                               "hostptr" if getattr(dev, "is_gpu", False) else "plain",
                               "host staging of the gradients")
        self.copy_q = cl.CommandQueue(dev.context, dev.cl_device)
        self.red_q = cl.CommandQueue(dev.context, dev.cl_device)
        self.shm = None
        if want == "shm":
            err = None
            try:
                self.shm = SharedSlots(g, max(self.total, 1))
            except Exception as e:      # pragma: no cover - MPI without shared windows
                err = e
            oks = g.allgather(err is None)
            if not all(oks):
                log.warning("shared-memory reduction unavailable (%s): using MPI "
                            "Allreduce", err or f"failed on rank {oks.index(False)}")
                if self.shm is not None:
                    self.shm.free()
                    self.shm = None
                want = "mpi"
        self.path = want
        n, me, total = self.size, self.rank, self.total
        if self.path == "shm":
            mf = cl.mem_flags
            self.peers = [r for r in range(n) if r != me]
            self.staging_buf = dev.alloc(4 * max((n - 1) * total, 1))
            self.slot_bufs = None
            if self.staging == "hostptr":
                self.slot_bufs = [cl.Buffer(dev.context, mf.READ_WRITE | mf.USE_HOST_PTR,
                                            hostbuf=v) for v in self.shm.views]
            for bk in self.buckets:
                bk.launches = [allreduce.sum_ranks(dev, cnt, buf, boff,
                                                   self.staging_buf, bk.base + off, total,
                                                   n, me, self.scale)
                               for buf, boff, off, cnt in bk.segments]
        else:
            for bk in self.buckets:
                bk.host = np.zeros(max(bk.count, 1), np.float32)
                bk.launches = [allreduce.scale(dev, cnt, buf, self.scale,
                                               off=boff)
                               for buf, boff, off, cnt in bk.segments]
        import atexit
        atexit.register(self._at_exit)

    def describe_path(self):
        if self.path == "shm":
            return f"shm (node shared memory, {self.staging} staging)"
        return "mpi (MPI Allreduce)"

    def _at_exit(self):
        """At exit, on every rank, before MPI is finalized: stop the thread,
        finish and drop the extra queues and kernels, then (shm; collective on
        the node) release the OpenCL views of the window and the window."""
        try:
            self.close()
            self.copy_q.finish()
            self.red_q.finish()
            for bk in self.buckets:
                bk.launches, bk.events = [], ()
            self._markers.clear()
            if self.shm is not None:
                for b in self.slot_bufs or ():
                    b.release()
                self.slot_bufs = None
                self.shm.free()
        except Exception:   # pragma: no cover - MPI already finalized
            pass
        self.shm = None

    # ---- per iteration ---------------------------------------------------------------
    def _on_start(self):
        self._launched = set()
        self._round += 1
        self._t_backward = None

    def _launch(self, bk):
        """Main thread: enqueue the download of bucket ``bk`` on the copy
        queue, after everything enqueued so far on the compute queue."""
        import pyopencl as cl
        q, cq = self.solver.dev.queue, self.copy_q
        for mem in bk.mems:
            mem.to_device()
        marker = cl.enqueue_marker(q)
        q.flush()
        evs = []
        if self.path == "shm":
            par = (self._round & 1) * self.total
            if self.slot_bufs is not None:
                own = self.slot_bufs[self.rank]
                for buf, boff, off, cnt in bk.segments:
                    evs.append(cl.enqueue_copy(cq, own, buf, byte_count=4 * cnt,
                                               src_offset=4 * boff,
                                               dst_offset=4 * (par + bk.base + off),
                                               wait_for=[marker]))
                # map/unmap: the slot's host memory holds what the device wrote
                m, _ = cl.enqueue_map_buffer(cq, own, cl.map_flags.READ,
                                             4 * (par + bk.base), (bk.count,), np.float32,
                                             is_blocking=False)
                evs = [m.base.release(cq)]
            else:
                view = self.shm.views[self.rank]
                for buf, boff, off, cnt in bk.segments:
                    a = par + bk.base + off
                    evs.append(cl.enqueue_copy(cq, view[a:a + cnt], buf,
                                               src_offset=4 * boff, wait_for=[marker],
                                               is_blocking=False))
        else:
            for buf, boff, off, cnt in bk.segments:
                evs.append(cl.enqueue_copy(cq, bk.host[off:off + cnt], buf,
                                           src_offset=4 * boff, wait_for=[marker],
                                           is_blocking=False))
        cq.flush()
        # (no event callbacks: pyopencl runs them on threads of its own that
        # can still be waiting for the GIL when the interpreter exits, which
        # ended ranks with "terminate called"; the reduction thread notes when
        # the download completed)
        bk.events = evs
        self._launched.add(bk.index)
        self._queue.put((bk, self._round))

    def _on_layer(self, li):
        """Solver hook: layer ``li``'s backward has been enqueued."""
        if self._t_backward is None:
            self._t_backward = time.perf_counter()
        for bk in self._ready_at.get(li, ()):
            self._launch(bk)
        if li == 0:
            self.totals["backward_enqueue_s"] += time.perf_counter() - self._t_backward

    def _reduce_shm(self, bk, rnd):
        """Reduction thread: node barrier for this bucket, peers' slices to
        the staging buffer, rank-ordered sum x 1/N into the diffs."""
        import pyopencl as cl
        t0 = time.perf_counter()
        self.shm.fence()
        self._acc["sync_s"] += time.perf_counter() - t0
        rq, total = self.red_q, self.total
        par = (rnd & 1) * total
        a, cnt = par + bk.base, bk.count
        for j, r in enumerate(self.peers):
            dst = 4 * (j * total + bk.base)
            if self.slot_bufs is not None:
                # the peer wrote the host memory: unmapping a write-invalidate map
                # makes it the buffer's content for this context
                m, _ = cl.enqueue_map_buffer(rq, self.slot_bufs[r],
                                             cl.map_flags.WRITE_INVALIDATE_REGION, 4 * a,
                                             (cnt,), np.float32, is_blocking=False)
                m.base.release(rq)
                cl.enqueue_copy(rq, self.staging_buf, self.slot_bufs[r], byte_count=4 * cnt,
                                src_offset=4 * a, dst_offset=dst)
            else:
                cl.enqueue_copy(rq, self.staging_buf, self.shm.views[r][a:a + cnt],
                                dst_offset=dst, is_blocking=False)
        for launch in bk.launches:
            launch.run(rq)

    def _reduce_mpi(self, bk):
        """Reduction thread: MPI Allreduce of the host copy, upload, x 1/N."""
        import pyopencl as cl
        self.group.allreduce_sum(bk.host)
        rq = self.red_q
        for buf, boff, off, cnt in bk.segments:
            cl.enqueue_copy(rq, buf, bk.host[off:off + cnt],
                            dst_offset=4 * boff, is_blocking=False)
        for launch in bk.launches:
            launch.run(rq)

    def _run(self):
        """The reduction thread: buckets in the same order on every rank, one
        round (iteration) after the other."""
        import pyopencl as cl
        cur, count = None, 0
        while True:
            item = self._queue.get()
            if item is None:
                return
            bk, rnd = item
            if rnd != cur:
                cur, count = rnd, 0
                self._acc = dict(comm_s=0.0, sync_s=0.0, last_ready=None)
            count += 1
            last = count == len(self.buckets)
            try:
                if self._failure is None:
                    if bk.events:
                        cl.wait_for_events(bk.events)
                    t0 = time.perf_counter()
                    self._acc["last_ready"] = t0
                    if self.path == "shm":
                        self._reduce_shm(bk, rnd)
                    else:
                        self._reduce_mpi(bk)
                    marker = None
                    if last:
                        # the whole round's uploads and sums are complete before the
                        # next round's buckets are touched (what makes the slot parity
                        # safe) and before the update may run
                        marker = cl.enqueue_marker(self.red_q)
                        self.red_q.finish()
                    else:
                        self.red_q.flush()
                    self._acc["comm_s"] += time.perf_counter() - t0
            except BaseException as e:    # handed to the main thread
                self._failure = e
            if not last:
                continue
            done = time.perf_counter()
            with self._done:
                t, acc = self.totals, self._acc
                t["iterations"] += 1
                t["comm_s"] += acc["comm_s"]
                t["sync_s"] += acc["sync_s"]
                if acc["last_ready"] is not None:
                    t["exposed_s"] += max(done - acc["last_ready"], 0.0)
                t["bytes"] += 4 * self.total
                if self._failure is None:
                    self._markers[rnd] = marker
                self._completed = rnd
                self._done.notify_all()

    def _wait_round(self, rnd):
        """Main thread: until round ``rnd`` is reduced; raise if it failed."""
        with self._done:
            while self._completed < rnd and self._failure is None:
                self._done.wait(0.5)
        if self._failure is not None:
            raise ParallelError(f"gradient reduction failed on rank {self.rank}: "
                                f"{self._failure}")

    def _on_gradients(self):
        """Wait for every bucket, make the compute queue wait for the reduced
        gradients, agree on the signal-requested action (rank 0's)."""
        import pyopencl as cl
        for bk in self.buckets:          # backward run outside the solver's loop
            if bk.index not in self._launched:
                self._launch(bk)
        t0 = time.perf_counter()
        self._wait_round(self._round)
        t1 = time.perf_counter()
        q = self.solver.dev.queue
        with self._done:
            marker = self._markers.pop(self._round, None)
        if marker is not None:
            cl.enqueue_barrier(q, wait_for=[marker])
        for bk in self.buckets:
            for mem in bk.mems:
                mem.device_written()
        with self._done:
            self.totals["wait_s"] += t1 - t0
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
        """Per-iteration means: ``comm_ms`` (reduction thread busy on the
        buckets, from each bucket's download to its reduction being enqueued
        (shm: node barrier, uploads and sum kernels enqueued; mpi: Allreduce,
        upload and scaling enqueued), plus, for the last bucket, until the
        reduction queue finished), ``sync_ms`` (shm: of which in node
        barriers, including waiting for slower peers), ``exposed_ms`` (from
        the moment the reduction thread saw the last bucket's download complete
        to the end of its reduction: communication the update waited for), ``hidden_ms`` =
        comm - exposed (overlapped with the backward pass), ``overlap`` =
        hidden / comm; ``path`` and ``staging`` name the reduction used."""
        with self._done:
            t = dict(self.totals)
        n = max(t["iterations"], 1)
        comm, exposed = t["comm_s"] / n, min(t["exposed_s"] / n, t["comm_s"] / n)
        return dict(iterations=t["iterations"], path=self.path,
                    staging=self.staging if self.path == "shm" else "plain",
                    buckets=len(self.buckets),
                    mb_per_iter=t["bytes"] / n / 1e6, comm_ms=1e3 * comm,
                    sync_ms=1e3 * t["sync_s"] / n,
                    exposed_ms=1e3 * exposed, hidden_ms=1e3 * (comm - exposed),
                    wait_ms=1e3 * t["wait_s"] / n,
                    overlap=(comm - exposed) / comm if comm > 0 else 0.0)

    def reset_stats(self):
        """Forget the timings so far (e.g. after warm-up iterations)."""
        with self._done:
            for k in self.totals:
                self.totals[k] = 0 if k in ("iterations", "bytes") else 0.0

    def log_stats(self):
        s = self.stats()
        if s["iterations"]:
            log.info("Data-parallel: %d ranks, %d buckets, %.3g MB reduced per iteration "
                     "(%s); communication %.3g ms/iter, %.3g ms hidden behind backward, "
                     "%.3g ms exposed (overlap %.0f%%)", self.size, s["buckets"],
                     s["mb_per_iter"], self.describe_path(), s["comm_ms"], s["hidden_ms"],
                     s["exposed_ms"], 100 * s["overlap"])
        return s

    def close(self):
        """Stop the reduction thread (not collective: safe on a failing rank;
        the shared window is freed at exit)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5)

