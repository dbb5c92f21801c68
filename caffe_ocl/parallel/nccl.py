"""pycaffe's ``caffe.NCCL`` on caffe_ocl's own reduction, without MPI:
BVLC's python/train.py works unchanged (one process per device, started by
``multiprocessing``)::

    uid = caffe.NCCL.new_uid()              # in the parent, before the ranks
    # in each rank:
    caffe.set_solver_count(n); caffe.set_solver_rank(rank)
    solver = caffe.SGDSolver(path)
    nccl = caffe.NCCL(solver, uid)          # joins the group of n ranks
    nccl.bcast()                            # rank 0's weights to every rank
    solver.add_callback(nccl)               # gradients averaged before update
    solver.net.after_backward(nccl)         # ... layer by layer (layer_wise_reduce)

The uid (bytes, as pycaffe's) names a rendezvous: a Unix-domain socket path in a fresh folder
under /dev/shm (or the temp folder), so nothing leaves the machine. Rank 0
listens there; the other ranks connect. A reduction: every rank > 0 sends
its gradients of the bucket (a layer's parameters, or all of them) to rank
0, rank 0 uploads them to a device staging buffer and sums them with its own
in rank order in an OpenCL kernel (ops/allreduce.sum_ranks) times
1/solver_count -- Caffe's ncclAllReduce(SUM) then scal(1/solver_count) --
and sends the result back, so every rank gets the same bits.
"""
import logging
import os
import socket
import struct
import tempfile
import time
import uuid

import numpy as np

from ..errors import CaffeOclError
from ..ops import allreduce
from .. import ranks as state

log = logging.getLogger("caffe_ocl")

CONNECT_TIMEOUT_S = 120.0


class NCCLError(CaffeOclError):
    """caffe.NCCL could not form its group or a reduction failed."""


def new_uid():
    """A fresh rendezvous name for one group of ranks: bytes (picklable), as
    pycaffe's NCCL.new_uid() under Python 3: the path of a Unix socket in a
    folder, under /dev/shm (else the temp folder), that rank 0 creates when
    the group forms (nothing is created before)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()
    path = os.path.join(base, f"caffe_ocl_nccl_{uuid.uuid4().hex}", "hub")
    if len(path) >= 100:       # sockaddr_un's limit
        path = os.path.join("/tmp", f"cnccl_{uuid.uuid4().hex[:16]}", "hub")
    return os.fsencode(path)


def _recv_into(sock, view):
    view = memoryview(view).cast("B")
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise NCCLError("caffe.NCCL: a peer rank closed its connection (did it fail?)")
        got += n


class NCCL:
    """caffe.NCCL(solver, uid): the gradient averaging of ``solver_count``
    ranks (caffe.set_solver_count / set_solver_rank before the solver is
    made). Use it as a solver callback and, with layer_wise_reduce, as a
    net after_backward hook, as BVLC's train.py does."""

    new_uid = staticmethod(new_uid)

    def __init__(self, solver, uid):
        self.solver = solver
        self.net = solver.net
        self.dev = solver.net.device
        self.count = int(getattr(solver, "solver_count", state.solver_count))
        self.rank = int(getattr(solver, "solver_rank", state.solver_rank))
        self.uid = os.fsdecode(uid)
        self.scale = float(np.float32(1.0) / np.float32(self.count))
        self._peers = []        # rank 0: sockets of ranks 1..count-1, in rank order
        self._hub = None        # rank > 0: socket to rank 0
        self._reduced = set()   # ids of diff memories reduced this iteration
        self._staging = None
        self._staging_n = 0
        self._plan_layers()
        if self.count > 1:
            self._connect()
        log.info("NCCL: rank %d of %d joined %s", self.rank, self.count, self.uid)
        if self.rank != 0:
            # only the root solver logs (Caffe: LOG_IF(INFO, Caffe::root_solver()))
            logging.getLogger("caffe_ocl").setLevel(logging.WARNING)

    # ---- group --------------------------------------------------------------------
    def _connect(self):
        if self.rank == 0:
            folder = os.path.dirname(self.uid)
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                raise NCCLError(f"caffe.NCCL: the rendezvous {self.uid} is in use (a uid "
                                "serves one group once: call NCCL.new_uid() again)") from None
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(self.uid)
            srv.listen(self.count)
            srv.settimeout(CONNECT_TIMEOUT_S)
            got = {}
            try:
                while len(got) < self.count - 1:
                    try:
                        conn, _ = srv.accept()
                    except socket.timeout:
                        raise NCCLError(f"caffe.NCCL: rank 0 waited {CONNECT_TIMEOUT_S:g} s "
                                        f"for {self.count - 1} ranks at {self.uid}; "
                                        f"{len(got)} came") from None
                    conn.settimeout(None)
                    hdr = np.zeros(2, np.int64)
                    _recv_into(conn, hdr)
                    r, n = int(hdr[0]), int(hdr[1])
                    if n != self.count or not 0 < r < self.count or r in got:
                        raise NCCLError(f"caffe.NCCL: a rank said it is rank {r} of {n}; "
                                        f"this group has {self.count} ranks")
                    got[r] = conn
            finally:
                srv.close()
                try:                      # the name is no longer needed
                    os.unlink(self.uid)
                    os.rmdir(os.path.dirname(self.uid))
                except OSError:
                    pass
            self._peers = [got[r] for r in range(1, self.count)]
        else:
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while True:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(self.uid)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    s.close()
                    if time.monotonic() > deadline:
                        raise NCCLError(f"caffe.NCCL: rank {self.rank} found no rank 0 at "
                                        f"{self.uid} within {CONNECT_TIMEOUT_S:g} s") from None
                    time.sleep(0.05)
            s.sendall(np.array([self.rank, self.count], np.int64).tobytes())
            self._hub = s

    def close(self):
        for s in self._peers + ([self._hub] if self._hub else []):
            s.close()
        self._peers, self._hub = [], None

    # ---- which gradients when -----------------------------------------------------
    def _plan_layers(self):
        """Each distinct gradient memory is complete after the backward of the
        earliest layer that uses it (shared parameters accumulate from every
        user): reduce it there."""
        first = {}
        blobs = {}
        for li, layer in enumerate(self.net.layers):
            for b in layer.blobs:
                key = id(b.diff_mem)
                if key not in first:
                    first[key] = li
                    blobs[key] = b
                first[key] = min(first[key], li)
        self._ready = {}
        for key, li in first.items():
            self._ready.setdefault(li, []).append(blobs[key])
        self._all = [b for li in sorted(self._ready, reverse=True) for b in self._ready[li]]

    # ---- collectives --------------------------------------------------------------
    def bcast(self):
        """Rank 0's parameters to every rank (NCCL::Broadcast)."""
        if self.count == 1:
            return
        params = [b for b in self.net.learnable_params if b.count]
        n = sum(b.count for b in params)
        vec = np.empty(max(n, 1), np.float32)
        if self.rank == 0:
            off = 0
            for b in params:
                vec[off:off + b.count] = b.host_data().reshape(-1)
                off += b.count
            for s in self._peers:
                s.sendall(struct.pack("<q", n) + vec[:n].tobytes())
        else:
            hdr = np.zeros(1, np.int64)
            _recv_into(self._hub, hdr)
            if int(hdr[0]) != n:
                raise NCCLError(f"caffe.NCCL.bcast: rank 0 sent {int(hdr[0])} parameter "
                                f"values, this rank's net has {n}: the ranks' nets differ")
            _recv_into(self._hub, vec[:n])
            off = 0
            for b in params:
                b.data[...] = vec[off:off + b.count].reshape(b.shape)
                off += b.count

    def _allreduce(self, blobs):
        """Average the gradients of ``blobs`` over the ranks, in place."""
        blobs = [b for b in blobs if b.count and id(b.diff_mem) not in self._reduced]
        for b in blobs:
            self._reduced.add(id(b.diff_mem))
        if self.count == 1 or not blobs:
            return
        dev = self.dev
        n = sum(b.count for b in blobs)
        vec = np.empty(n, np.float32)
        off = 0
        for b in blobs:                          # this rank's gradients
            dev.download(vec[off:off + b.count], b.diff_mem.to_device())
            off += b.count
        hdr = struct.pack("<q", n)
        if self.rank == 0:
            peers = np.empty((self.count - 1, n), np.float32)
            for j, s in enumerate(self._peers):
                got = np.zeros(1, np.int64)
                _recv_into(s, got)
                if int(got[0]) != n:
                    raise NCCLError(f"caffe.NCCL: rank {j + 1} reduces {int(got[0])} "
                                    f"values where rank 0 reduces {n}: the ranks' nets or "
                                    "their hooks differ")
                _recv_into(s, peers[j])
            if self._staging_n < peers.size:
                self._staging = dev.alloc(4 * peers.size)
                self._staging_n = peers.size
            dev.upload(self._staging, peers)
            off = 0
            for b in blobs:                      # sum in rank order x 1/N, on the device
                allreduce.sum_ranks(dev, b.count, b.diff_buffer(), 0, self._staging, off, n,
                                    self.count, 0, self.scale).run(dev.queue)
                b.diff_mem.device_written()
                dev.download(vec[off:off + b.count], b.diff_buffer())
                off += b.count
            out = hdr + vec.tobytes()
            for s in self._peers:
                s.sendall(out)
        else:
            self._hub.sendall(hdr + vec.tobytes())
            got = np.zeros(1, np.int64)
            _recv_into(self._hub, got)
            _recv_into(self._hub, vec)
            off = 0
            for b in blobs:
                dev.upload(b.diff_buffer(), vec[off:off + b.count])
                b.diff_mem.device_written()
                off += b.count
            dev.finish()                         # vec is read by the uploads

    # ---- Net::Callback and Solver::Callback -----------------------------------------
    def run(self, layer):
        """after_backward hook: reduce the gradients layer ``layer`` completed
        (only with layer_wise_reduce, as Caffe's NCCL::run)."""
        if layer == len(self.net.layers) - 1:
            self._reduced = set()                # a new backward pass starts
        if not self.solver.param.layer_wise_reduce:
            return
        self._allreduce(self._ready.get(layer, ()))

    def on_start(self):
        self._reduced = set()

    def on_gradients_ready(self):
        """Reduce what the layer hooks did not (all of it without them)."""
        self._allreduce(self._all)
        self._reduced = set()
