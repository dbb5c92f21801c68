"""Prefetch threads and batch uploads (Caffe's BasePrefetchingDataLayer).

One background thread per data layer fills ``Batch`` objects (host NumPy
arrays) and puts them into a queue of ``depth`` ready batches
(``data_param.prefetch``, default 4). The layer's forward takes the next
batch and enqueues non-blocking copies into its tops; the batch (and the
copy events, whose deletion would block until the copy is done) stays
referenced until the next forward, then goes back to a free list, from which
the thread reuses only batches whose copies have completed.

An exception in the thread is handed over in the queue and raised by the
forward that would have received the batch.
"""
import atexit
import collections
import logging
import queue
import threading
import weakref

from ..device import note_event
from ..errors import DataError

log = logging.getLogger("caffe_ocl")

# most batches a queue holds, whatever data_param.prefetch says (issue #25)
MAX_DEPTH = 64


class Batch:
    __slots__ = ("arrays", "events", "state", "records", "__weakref__")

    def __init__(self, arrays):
        self.arrays = arrays
        self.events = ()
        self.state = None     # the source's read state after filling this batch
        self.records = None   # where each item came from (for error messages), or None

    def copies_done(self):
        if not self.events:
            return True
        import pyopencl as cl
        done = cl.command_execution_status.COMPLETE
        try:
            return all(e.command_execution_status == done for e in self.events)
        except cl.Error:
            return False


def upload(device, tops, arrays):
    """Non-blocking copies of host ``arrays`` into the tops' device buffers;
    returns the events (keep them, and the arrays, alive until done)."""
    import pyopencl as cl
    evs = []
    for t, a in zip(tops, arrays):
        evs.append(cl.enqueue_copy(device.queue, t.data_buffer(), a, is_blocking=False))
        note_event(evs[-1])             # caffe_ocl time's per-step device times
    return evs


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


_live = weakref.WeakSet()


class Prefetcher:
    """``alloc()`` -> new Batch; ``fill(batch)`` fills it (runs in the thread;
    ``setup()`` runs first in the thread, e.g. to open a cursor, and
    ``teardown()`` last, e.g. to close it)."""

    def __init__(self, alloc, fill, depth=4, name="prefetch", setup=None, teardown=None):
        self.alloc = alloc
        self.fill = fill
        self.setup = setup
        self.teardown = teardown
        self.depth = max(int(depth), 1)
        if self.depth > MAX_DEPTH:     # prefetch: 1000000 grew to 5.5 GB
            log.warning("%s: prefetch %d batches clamped to %d", name, self.depth, MAX_DEPTH)
            self.depth = MAX_DEPTH
        self.full = queue.Queue(maxsize=self.depth)
        self.free = collections.deque()
        self.stop_event = threading.Event()
        self.name = name
        self.failure = None
        self.thread = threading.Thread(target=self._run, name=f"caffe_ocl {name}",
                                       daemon=True)
        _live.add(self)

    def start(self):
        self.thread.start()
        return self

    def _take_free(self):
        for _ in range(len(self.free)):
            try:
                b = self.free.popleft()
            except IndexError:
                break
            if b.copies_done():
                b.events = ()
                return b
            self.free.append(b)
        return self.alloc()

    def _put(self, item):
        while not self.stop_event.is_set():
            try:
                self.full.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self):
        try:
            if self.setup is not None:
                self.setup()
            while not self.stop_event.is_set():
                b = self._take_free()
                self.fill(b)
                if not self._put(b):
                    break
        except BaseException as e:  # handed to the consumer
            self._put(_Failure(e))
        finally:
            if self.teardown is not None:
                try:
                    self.teardown()
                except Exception:
                    pass

    def next(self):
        """The next ready batch (blocks while the thread is still filling it)."""
        if self.failure is not None:
            raise self.failure
        while True:
            try:
                item = self.full.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.full.empty():
                    raise DataError(f"{self.name}: the prefetch thread has stopped")
        if isinstance(item, _Failure):
            self.stop_event.set()
            self.failure = item.exc
            raise item.exc
        return item

    def recycle(self, batch):
        if len(self.free) < self.depth + 2:
            self.free.append(batch)

    def stop(self, timeout=2.0):
        """Stop the thread; ``timeout=None`` waits until it has ended (and its
        ``teardown`` has run)."""
        self.stop_event.set()
        try:
            while True:
                self.full.get_nowait()
        except queue.Empty:
            pass
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)


@atexit.register
def _stop_all():
    for p in list(_live):
        p.stop_event.set()
    for p in list(_live):
        if p.thread.is_alive():
            p.thread.join(1.0)
