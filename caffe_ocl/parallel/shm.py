"""Node-local shared memory for the gradient reduction (MPI-3 shared
windows through mpi4py).

``SharedSlots`` allocates, with ``MPI.Win.Allocate_shared`` on the
communicator of the ranks of this machine, one slot per rank that holds two
copies (iteration parity 0 and 1) of the whole gradient vector, and gives
every rank a NumPy view of every rank's slot. ``fence()`` is the per-bucket
synchronisation: ``Win.Sync`` (memory barrier for this rank's stores, whether
made by the CPU or by the OpenCL driver's DMA into the slot), a barrier of
the node communicator, ``Win.Sync`` again (the peers' stores are visible).
The window stays in one ``Lock_all(MODE_NOCHECK)`` passive-target epoch for
its whole life, as MPI-3 asks for ``Win.Sync``.

Each rank's segment is rounded up to whole pages and allocated
non-contiguously (``alloc_shared_noncontig``) so that the views are page
aligned, as drivers want for ``CL_MEM_USE_HOST_PTR``.
"""
import numpy as np

PAGE = 4096


class SharedSlots:
    def __init__(self, group, nelem):
        MPI = group.MPI
        self.MPI = MPI
        self.comm = group.comm.Split_type(MPI.COMM_TYPE_SHARED, key=group.rank)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.nelem = int(nelem)                      # per parity
        nbytes = -(-(2 * self.nelem * 4) // PAGE) * PAGE
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        try:
            self.win = MPI.Win.Allocate_shared(nbytes, 4, info=info, comm=self.comm)
        finally:
            info.Free()
        self.views = []
        for r in range(self.size):
            buf, _ = self.win.Shared_query(r)
            self.views.append(np.frombuffer(buf, np.float32, count=2 * self.nelem))
        # touch this rank's pages now: a too small /dev/shm (containers) fails
        # here, at start-up, rather than in the middle of training
        self.views[self.rank][:] = 0
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self._locked = True

    def slot(self, rank, parity):
        """Rank ``rank``'s copy of the gradient vector for ``parity``."""
        a = (parity & 1) * self.nelem
        return self.views[rank][a:a + self.nelem]

    def fence(self):
        """Every local rank's stores so far are visible to every local rank."""
        self.win.Sync()
        self.comm.Barrier()
        self.win.Sync()

    def free(self):
        """Collective over the node's ranks (call from every rank, at the end)."""
        self.views = []
        if self._locked:
            self.win.Unlock_all()
            self._locked = False
        self.win.Free()
        self.comm.Free()
