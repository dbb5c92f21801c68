"""Data layers: Data (LMDB), ImageData (image list), MemoryData, HDF5Data,
HDF5Output, with Caffe's semantics (src/caffe/layers/*data_layer.cpp).

Reading, decoding and the DataTransformer run on the host in one prefetch
thread per layer (as Caffe's InternalThread); forward only enqueues
non-blocking uploads of the next ready batch into the tops and never reads
the device. Data layers have no backward.

Differences a Caffe user may notice:
* backend LEVELDB is not supported (a DataError explains how to convert);
  Caffe's default backend is LEVELDB, so a layer without ``backend:`` reads
  the source as LMDB when it is one.
* every record must have the first record's shape (Caffe reshapes per
  batch); a different one is a DataError naming the database and key.
* ``rand_skip`` skips a random number in [0, rand_skip) of records at
  start-up (Caffe's DataReader behaviour) for Data as well as ImageData.
* HDF5Output appends each forward's rows to the ``data``/``label``
  datasets (Caffe writes them once and fails on a second forward).
WindowData lives in window_data.py.
"""
import logging
import os
import weakref

import numpy as np

from .. import ranks as pstate
from ..data.datum import decode_datum, parse_datum, read_image
from ..data.db import LMDBReader, check_backend
from ..data.hdf5 import h5_errors, open_h5, read_dataset
from ..data.image_list import read_image_list
from ..data.prefetch import Batch, Prefetcher, upload
from ..data.transformer import DataTransformer, seeded_rng
from ..errors import ArrayShapeError, DataError, LayerError, ShapeError, naming
from ..proto import caffe_pb2, read_file_bytes
from .base import Layer, register

log = logging.getLogger("caffe_ocl")


class BasePrefetchingDataLayer(Layer):
    exact_num_bottom = 0
    has_backward = False
    allow_force_backward = False

    def reshape(self, bottom, top):
        pass   # shapes are fixed at setup

    def _start_prefetch(self, source, depth):
        self._current = None
        self.source = source
        self._depth = depth
        # read state before the first batch (sources that record one)
        self._start_state = source.state() if source.resumable else None
        self.prefetcher = Prefetcher(source.alloc, source.fill, depth,
                                     name=f"layer {self.name!r} ({self.type})",
                                     setup=source.setup,
                                     teardown=source.teardown).start()
        weakref.finalize(self, self.prefetcher.stop)

    def forward_impl(self, bottom, top):
        batch = self.prefetcher.next()
        batch.events = upload(self.device, top, batch.arrays[:len(top)])
        prev, self._current = self._current, batch
        if prev is not None:
            self.prefetcher.recycle(prev)

    def served_record(self, item):
        """Where item ``item`` of the batch forward served last came from (a
        database key, an image list line), or None (a LabelError names it)."""
        recs = getattr(self._current, "records", None)
        return recs[item] if recs is not None and 0 <= item < len(recs) else None

    def data_state(self):
        """The read state at the next batch forward will consume (batches
        already prefetched are ahead of it): a JSON-able dict that
        ``restore_data_state`` takes (the solverstate records it); None for
        a source that records none (WindowData)."""
        if not self.source.resumable:
            return None
        cur = self._current
        return self._start_state if cur is None else cur.state

    def restore_data_state(self, state):
        """Seek the reader to ``state`` (from ``data_state``): the prefetched
        batches are dropped and the thread refilled from there."""
        where = f"layer {self.name!r} ({self.type})"
        if not self.source.resumable:
            log.info("%s: its read position is not restored", where)
            return
        self.prefetcher.stop(timeout=None)
        self.source.set_state(state, where)
        self._start_prefetch(self.source, self._depth)

    def close(self):
        """Stop the prefetch thread (also done when the layer is collected)."""
        if getattr(self, "prefetcher", None) is not None:
            self.prefetcher.stop()


class RecordSource:
    """State owned by the prefetch thread (kept apart from the layer so the
    layer can be garbage-collected while the thread runs)."""

    # True where ``state``/``set_state`` capture the whole read position
    # (exact resume); the fills then store ``batch.state``
    resumable = False

    def __init__(self, batch_size, out_shape, with_label, transformer):
        self.batch_size = batch_size
        self.out_shape = tuple(out_shape)
        self.with_label = with_label
        self.transformer = transformer

    def setup(self):
        pass

    def teardown(self):
        pass

    def state(self):
        return {"trng": self.transformer.rng.bit_generator.state}

    def set_state(self, state, where):
        try:
            self.transformer.rng.bit_generator.state = state["trng"]
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{where}: saved read state is invalid ({e})") from None

    def alloc(self):
        arrays = [np.empty((self.batch_size,) + self.out_shape, np.float32)]
        if self.with_label:
            arrays.append(np.empty((self.batch_size,), np.float32))
        return Batch(arrays)


class _Shard:
    """Caffe's DataLayer/HDF5DataLayer::Skip: in a data-parallel TRAIN run
    each of the ``count`` (solver_count) solvers reads every count-th record
    (database entry, list line, HDF5 row) from its ``rank`` (solver_rank) on;
    TEST nets (root solver only) and single runs read everything (1, 0)."""

    def __init__(self, count=1, rank=0):
        self.count, self.rank = count, rank
        self.offset = 0         # records passed so far, this rank's and the others'

    @classmethod
    def for_phase(cls, phase):
        if phase == caffe_pb2.TRAIN and pstate.solver_count > 1:
            return cls(pstate.solver_count, pstate.solver_rank)
        return cls()

    def take(self):
        """Count the next record; True when it is this rank's to read
        (otherwise the caller skips it and asks again)."""
        off, self.offset = self.offset, self.offset + 1
        return off % self.count == self.rank


class _DBSource(RecordSource):
    resumable = True

    def __init__(self, reader, skip, record_shape, force, shard=None, **kw):
        super().__init__(**kw)
        self.reader = reader
        self.skip = skip
        self.record_shape = record_shape
        self.force = force
        self.records = None
        self.shard = shard or _Shard()

    def _next(self):
        while True:
            kv = next(self.records)
            if self.shard.take():
                return kv

    def setup(self):
        self.records = self.reader.records(self.skip + self.shard.offset)

    def state(self):
        return dict(super().state(), kind="db", skip=self.skip, offset=self.shard.offset)

    def set_state(self, state, where):
        if state.get("kind") != "db":
            raise DataError(f"{where}: the saved read state is not a database position")
        super().set_state(state, where)
        self.skip, self.shard.offset = int(state["skip"]), int(state["offset"])
        self.records = None
        self.reader = LMDBReader(self.reader.path)   # the stopped thread closed it

    def teardown(self):
        if self.records is not None:
            self.records.close()      # ends the read transaction
        self.reader.close()

    def fill(self, batch):
        imgs = []
        labels = batch.arrays[1] if self.with_label else None
        batch.records = records = []
        for i in range(self.batch_size):
            key, value = self._next()
            where = f"database {self.reader.path} key {key.decode('utf-8', 'replace')!r}"
            records.append(where)
            d = parse_datum(value, where)
            img = decode_datum(d, where, *self.force)
            if img.shape != self.record_shape:
                raise DataError(
                    f"{where}: record has shape {'x'.join(map(str, img.shape))} but the "
                    f"first record has {'x'.join(map(str, self.record_shape))}; every "
                    "record must have the same shape")
            imgs.append(img)
            if labels is not None:
                labels[i] = d.label
        self.transformer.transform_batch(imgs, batch.arrays[0])
        batch.state = self.state()


def shape_str(s):
    return ",".join(str(x) for x in s)


@register("Data")
class DataLayer(BasePrefetchingDataLayer):
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.data_param
        where = f"layer {self.name!r} (Data)"
        if not p.source:
            raise self.error("data_param.source (the database path) is not set", DataError)
        if p.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive", DataError)
        check_backend(p.source, caffe_pb2.DataParameter.DB.Name(p.backend),
                      p.HasField("backend"), where)
        tp = self.param.transform_param
        force = (tp.force_color or p.force_encoded_color, tp.force_gray)
        self.transformer = DataTransformer(tp, self.phase, seeded_rng(), where)
        self.reader = LMDBReader(p.source)
        try:
            key, value = self.reader.first()
            kwhere = f"database {p.source} key {key.decode('utf-8', 'replace')!r}"
            img = decode_datum(parse_datum(value, kwhere), kwhere, *force)
            out = self.transformer.infer_shape(img.shape, f"database {p.source}")
        except BaseException:
            self.reader.close()
            raise
        bs = int(p.batch_size)
        top[0].reshape((bs,) + out)
        log.info("output data size: %s", shape_str((bs,) + out))
        if len(top) > 1:
            top[1].reshape((bs,))
        skip = 0
        if p.rand_skip:
            skip = int(seeded_rng().integers(p.rand_skip))
            log.info("Skipping first %d data points.", skip)
        src = _DBSource(self.reader, skip, img.shape, force, shard=_Shard.for_phase(self.phase),
                        batch_size=bs,
                        out_shape=out, with_label=len(top) > 1, transformer=self.transformer)
        self._start_prefetch(src, p.prefetch)


# --------------------------------------------------------------------------
# ImageData

class _ListSource(RecordSource):
    resumable = True

    def __init__(self, lines, lines_id, source, root, new_hw, is_color, shuffle, rng,
                 record_shape, shard=None, **kw):
        super().__init__(**kw)
        self.shard = shard or _Shard()
        self.lines = lines
        self.lines_id = lines_id
        self.source = source
        self.root = root
        self.new_hw = new_hw
        self.is_color = is_color
        self.shuffle = shuffle
        self.rng = rng
        self.record_shape = record_shape

    def _advance(self):
        self.lines_id += 1
        if self.lines_id >= len(self.lines):
            self.lines_id = 0
            if self.shuffle:
                self.rng.shuffle(self.lines)

    def fill(self, batch):
        imgs = []
        labels = batch.arrays[1]
        batch.records = records = []
        for i in range(self.batch_size):
            while not self.shard.take():    # another rank's line
                self._advance()
            path, label, n = self.lines[self.lines_id]
            where = f"list file {self.source} line {n}"
            records.append(f"{where} ({path})")
            img = read_image(self.root + path, *self.new_hw, self.is_color, where)
            if img.shape != self.record_shape:
                raise DataError(
                    f"{where}: image {self.root + path} is {'x'.join(map(str, img.shape))} "
                    f"but the first image is {'x'.join(map(str, self.record_shape))}; set "
                    "new_height/new_width to resize all images to one size")
            imgs.append(img)
            labels[i] = label
            self._advance()
        self.transformer.transform_batch(imgs, batch.arrays[0])
        batch.state = self.state()

    def state(self):
        st = dict(super().state(), kind="list", lines_id=self.lines_id, offset=self.shard.offset)
        if self.shuffle:   # the current order, as the lines' numbers in the list file
            st["order"] = [n for _, _, n in self.lines]
            st["srng"] = self.rng.bit_generator.state
        return st

    def set_state(self, state, where):
        if state.get("kind") != "list":
            raise DataError(f"{where}: the saved read state is not an image list position")
        super().set_state(state, where)
        lines_id = int(state["lines_id"])
        if not 0 <= lines_id < len(self.lines):
            raise DataError(f"{where}: saved list position {lines_id} is past the "
                            f"{len(self.lines)} lines of {self.source}")
        if self.shuffle:
            by_n = {ln[2]: ln for ln in self.lines}
            order = state.get("order")
            if order is None or sorted(order) != sorted(by_n):
                raise DataError(f"{where}: the saved image order does not match the lines "
                                f"of {self.source} (the list changed since the snapshot)")
            self.lines[:] = [by_n[n] for n in order]
            self.rng.bit_generator.state = state["srng"]
        self.lines_id, self.shard.offset = lines_id, int(state["offset"])


@register("ImageData")
class ImageDataLayer(BasePrefetchingDataLayer):
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.image_data_param
        where = f"layer {self.name!r} (ImageData)"
        nh, nw = int(p.new_height), int(p.new_width)
        if (nh == 0) != (nw == 0):
            raise self.error("new_height and new_width must be set together", DataError)
        if p.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive", DataError)
        if not p.source:
            raise self.error("image_data_param.source (the list file) is not set", DataError)
        lines = read_image_list(p.source, where)
        rng = seeded_rng()
        if p.shuffle:
            log.info("Shuffling data")
            rng.shuffle(lines)
        log.info("A total of %d images.", len(lines))
        lines_id = 0
        if p.rand_skip:
            skip = int(rng.integers(p.rand_skip))
            log.info("Skipping first %d data points.", skip)
            if skip >= len(lines):
                raise self.error(f"rand_skip: not enough images ({len(lines)}) to skip "
                                 f"{skip}", DataError)
            lines_id = skip
        self.transformer = DataTransformer(self.param.transform_param, self.phase,
                                           seeded_rng(), where)
        path, _, n = lines[lines_id]
        img = read_image(p.root_folder + path, nh, nw, p.is_color,
                         f"list file {p.source} line {n}")
        out = self.transformer.infer_shape(img.shape, f"list file {p.source}")
        bs = int(p.batch_size)
        top[0].reshape((bs,) + out)
        top[1].reshape((bs,))
        log.info("output data size: %s", shape_str((bs,) + out))
        src = _ListSource(lines, lines_id, p.source, p.root_folder, (nh, nw), p.is_color,
                          p.shuffle, rng, img.shape, shard=_Shard.for_phase(self.phase),
                          batch_size=bs, out_shape=out, with_label=True,
                          transformer=self.transformer)
        self._start_prefetch(src, self.param.data_param.prefetch)   # as Caffe's base layer


# --------------------------------------------------------------------------
# MemoryData + pycaffe's Net.set_input_arrays

@register("MemoryData")
class MemoryDataLayer(Layer):
    exact_num_bottom = 0
    exact_num_top = 2
    has_backward = False
    allow_force_backward = False

    def layer_setup(self, bottom, top):
        p = self.param.memory_data_param
        self.batch_size = int(p.batch_size)
        self.channels, self.height, self.width = int(p.channels), int(p.height), int(p.width)
        if min(self.batch_size, self.channels, self.height, self.width) <= 0:
            raise self.error("batch_size, channels, height and width must be specified "
                             "and positive", LayerError)
        self._data = self._labels = None
        self._n = 0
        self._pos = 0
        self._inflight = None
        self._shape_tops(top)

    def _shape_tops(self, top):
        top[0].reshape(self.batch_size, self.channels, self.height, self.width)
        top[1].reshape((self.batch_size,))

    def reshape(self, bottom, top):
        pass

    def reset(self, data, labels, n=None):
        """Caffe's MemoryDataLayer::Reset: use ``data`` (N, C, H, W) and
        ``labels`` (N,) float32 arrays (kept by reference, not copied)."""
        n = len(data) if n is None else int(n)
        if n % self.batch_size:
            raise self.error(f"the number of inputs ({n}) must be a multiple of "
                             f"batch_size ({self.batch_size})", ShapeError)
        self._data = data
        self._labels = np.ascontiguousarray(labels, np.float32).reshape(-1)
        self._n = n
        self._pos = 0

    def set_input_arrays(self, data, labels):
        """pycaffe's ``Net.set_input_arrays(data, labels)`` for this layer:
        float32 C-contiguous ``data`` (N, C, H, W) and ``labels`` (N,) or
        (N, 1, 1, 1); N must be a multiple of the batch size. The arrays are
        kept by reference (as pycaffe does), not copied. Returns (data, labels)."""
        if isinstance(labels, np.ndarray) and labels.ndim == 1:
            labels = np.ascontiguousarray(labels[:, None, None, None])
        _check_array(data, "data array", self.channels, self.height, self.width)
        _check_array(labels, "labels array", 1, 1, 1)
        if data.shape[0] != labels.shape[0]:
            raise ShapeError("set_input_arrays: data and labels must have the same first "
                             f"dimension ({data.shape[0]} vs {labels.shape[0]})")
        if data.shape[0] == 0:
            # 0 % batch_size passed, and forward then divided by 0 rows
            raise ArrayShapeError("set_input_arrays: the arrays hold no items (first "
                                  "dimension 0); give at least one batch")
        if data.shape[0] % self.batch_size:
            raise ShapeError(f"set_input_arrays: first dimensions of input arrays "
                             f"({data.shape[0]}) must be a multiple of batch size "
                             f"({self.batch_size})")
        self.reset(data, labels, data.shape[0])
        return data, labels

    def set_batch_size(self, new_size):
        if self._data is not None and self._n % int(new_size):
            raise self.error(f"batch_size {new_size} does not divide the {self._n} inputs",
                             ShapeError)
        self.batch_size = int(new_size)
        self._pos = 0

    def forward_impl(self, bottom, top):
        if self._data is None:
            raise self.error("no input arrays: call net.set_input_arrays(data, labels) "
                             "before forward", DataError)
        if top[0].shape[0] != self.batch_size:
            self._shape_tops(top)
        bs = self.batch_size
        d = self._data[self._pos:self._pos + bs]
        lab = self._labels[self._pos:self._pos + bs]
        evs = upload(self.device, top, [d, lab])
        self._inflight = (d, lab, evs)   # alive until the copies are done
        self._pos = (self._pos + bs) % self._n



def _check_array(arr, what, c, h, w):
    if not isinstance(arr, np.ndarray) or arr.dtype != np.float32:
        raise DataError(f"set_input_arrays: {what} must be a float32 ndarray, got "
                        f"{getattr(arr, 'dtype', type(arr).__name__)}")
    if not arr.flags.c_contiguous:
        raise DataError(f"set_input_arrays: {what} must be C contiguous")
    if arr.ndim != 4:
        raise ShapeError(f"set_input_arrays: {what} must have 4 axes, got shape {arr.shape}")
    if arr.shape[1:] != (c, h, w):
        raise ShapeError(f"set_input_arrays: {what} has shape {arr.shape}; expected "
                         f"(N, {c}, {h}, {w})")




# --------------------------------------------------------------------------
# HDF5

def _h5py(where):
    try:
        import h5py
    except ImportError:
        raise DataError(f"{where}: HDF5 layers need the h5py package: pip install h5py "
                        "(or pip install caffe_ocl[hdf5])") from None
    return h5py


@register("HDF5Data")
class HDF5DataLayer(Layer):
    exact_num_bottom = 0
    min_top = 1
    has_backward = False
    allow_force_backward = False

    def layer_setup(self, bottom, top):
        p = self.param.hdf5_data_param
        self.where = f"layer {self.name!r} (HDF5Data)"
        self.h5py = _h5py(self.where)
        if p.batch_size <= 0:
            raise self.error("hdf5_data_param.batch_size must be positive", DataError)
        if not os.path.isfile(p.source):
            raise DataError(f"{self.where}: source list file {p.source} not found")
        with naming(self.where):
            raw = read_file_bytes(p.source, "HDF5Data source list")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{self.where}: source list {p.source} is not UTF-8 text (byte "
                            f"{e.start})") from None
        self.files = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if any("\0" in fn for fn in self.files):
            raise DataError(f"{self.where}: source list {p.source} holds a NUL byte")
        if not self.files:
            raise DataError(f"{self.where}: {p.source} lists no HDF5 files (must have "
                            "at least 1 HDF5 filename listed in source)")
        log.info("Number of HDF5 files: %d", len(self.files))
        self.batch_size = int(p.batch_size)
        self.shuffle = bool(p.shuffle)
        self.rng = seeded_rng()
        self.names = list(self.param.top)
        self.file_perm = np.arange(len(self.files))
        if self.shuffle:
            self.rng.shuffle(self.file_perm)
        self.current_file = 0
        self.row_shapes = None
        self._load(self.files[self.file_perm[0]])
        self.row_shapes = [a.shape[1:] for a in self.arrays]
        for t, s in zip(top, self.row_shapes):
            t.reshape((self.batch_size,) + s)
        self.shard = _Shard.for_phase(self.phase)
        # two sets of host batches, alternated: the upload of one may still
        # be in flight while the next is filled
        self._host = [[np.empty((self.batch_size,) + s, np.float32) for s in self.row_shapes]
                      for _ in range(2)]
        self._events = [None, None]
        self._turn = 0

    def _load(self, fn):
        h5py = self.h5py
        log.info("Loading HDF5 file: %s", fn)
        where = f"{self.where}: HDF5 file {fn}"
        with open_h5(h5py, fn, where, DataError) as f, h5_errors(where, DataError):
            arrays = []
            for name in self.names:
                if name not in f:
                    raise DataError(f"{self.where}: HDF5 file {fn} has no dataset "
                                    f"{name!r} (each top names a dataset)")

                def shape_ok(shape, name=name):
                    if len(shape) < 1 or shape[0] == 0:
                        raise DataError(f"{self.where}: HDF5 file {fn} dataset {name!r} "
                                        f"is empty (shape {shape})")
                arrays.append(read_dataset(h5py, f[name], f"{where}: dataset {name!r}",
                                           DataError, shape_ok=shape_ok))
        rows = arrays[0].shape[0]
        for name, a in zip(self.names, arrays):
            if a.shape[0] != rows:
                raise DataError(f"{self.where}: HDF5 file {fn}: dataset {name!r} has "
                                f"{a.shape[0]} rows, {self.names[0]!r} has {rows}")
        if self.row_shapes is not None:
            for name, a, s in zip(self.names, arrays, self.row_shapes):
                if a.shape[1:] != s:
                    raise DataError(f"{self.where}: HDF5 file {fn}: dataset {name!r} rows "
                                    f"have shape {a.shape[1:]}, the first file's {s}")
        self.arrays = arrays
        self.rows = rows
        self.perm = np.arange(rows)
        if self.shuffle:
            self.rng.shuffle(self.perm)
        self.row = 0

    def _next_file(self):
        if len(self.files) > 1:
            self.current_file += 1
            if self.current_file == len(self.files):
                self.current_file = 0
                if self.shuffle:
                    self.rng.shuffle(self.file_perm)
            self._load(self.files[self.file_perm[self.current_file]])
        else:
            self.row = 0
            if self.shuffle:
                self.rng.shuffle(self.perm)

    def reshape(self, bottom, top):
        pass

    def data_state(self):
        """The read position (file, row, shuffled orders, random state)."""
        return {"kind": "hdf5", "file": int(self.current_file),
                "file_perm": [int(i) for i in self.file_perm], "row": int(self.row),
                "perm": [int(i) for i in self.perm], "offset": self.shard.offset,
                "rng": self.rng.bit_generator.state}

    def restore_data_state(self, state):
        if state.get("kind") != "hdf5":
            raise DataError(f"{self.where}: the saved read state is not an HDF5 position")
        fp = [int(i) for i in state["file_perm"]]
        cf = int(state["file"])
        if sorted(fp) != list(range(len(self.files))) or not 0 <= cf < len(fp):
            raise DataError(f"{self.where}: the saved HDF5 position names files that "
                            f"{self.param.hdf5_data_param.source} does not list")
        self.file_perm, self.current_file = np.array(fp), cf
        self._load(self.files[fp[cf]])
        perm, row = np.array(state["perm"], dtype=np.int64), int(state["row"])
        if sorted(perm.tolist()) != list(range(self.rows)) or not 0 <= row < self.rows:
            raise DataError(f"{self.where}: the saved HDF5 row position does not fit "
                            f"{self.files[fp[cf]]} ({self.rows} rows)")
        self.perm, self.row = perm, row
        self.shard.offset = int(state["offset"])
        self.rng.bit_generator.state = state["rng"]

    def _step(self):
        self.row += 1
        if self.row == self.rows:
            self._next_file()

    def forward_impl(self, bottom, top):
        import pyopencl as cl
        bs = self.batch_size
        turn, self._turn = self._turn, 1 - self._turn
        if self._events[turn]:
            cl.wait_for_events(self._events[turn])    # its last upload is done
        outs = self._host[turn]
        filled = 0
        while filled < bs:
            if self.shard.count > 1:    # another rank's rows are skipped one by one
                while not self.shard.take():
                    self._step()
                take = 1
            else:
                take = min(bs - filled, self.rows - self.row)
            idx = self.perm[self.row:self.row + take]
            for o, a in zip(outs, self.arrays):
                o[filled:filled + take] = a[idx]
            filled += take
            self.row += take - 1
            self._step()
        self._events[turn] = upload(self.device, top, outs)


@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Writes its two bottoms to datasets ``data`` and ``label`` of
    ``hdf5_output_param.file_name`` (created/truncated at setup), appending
    the rows of every forward. Reads its bottoms from the device."""
    exact_num_bottom = 2
    exact_num_top = 0
    has_backward = False
    allow_force_backward = False
    untrusted_refusal = "creates or overwrites the file its file_name names"

    def layer_setup(self, bottom, top):
        where = f"layer {self.name!r} (HDF5Output)"
        h5py = _h5py(where)
        fn = self.param.hdf5_output_param.file_name
        if not fn:
            raise self.error("hdf5_output_param.file_name is not set", DataError)
        try:
            self.file = h5py.File(fn, "w")
        except OSError as e:
            raise DataError(f"{where}: cannot create HDF5 file {fn} ({e})") from None
        self.file_name = fn
        weakref.finalize(self, self.file.close)

    def reshape(self, bottom, top):
        pass

    def forward_impl(self, bottom, top):
        for name, b in (("data", bottom[0]), ("label", bottom[1])):
            arr = np.asarray(b.host_data(), np.float32)
            if name not in self.file:
                self.file.create_dataset(name, data=arr, maxshape=(None,) + arr.shape[1:],
                                         chunks=True)
            else:
                ds = self.file[name]
                if ds.shape[1:] != arr.shape[1:]:
                    raise self.error(f"bottom {b.name!r} changed shape to {arr.shape}; "
                                     f"{self.file_name}:{name} rows are {ds.shape[1:]}",
                                     ShapeError)
                n = ds.shape[0]
                ds.resize(n + arr.shape[0], axis=0)
                ds[n:] = arr
        self.file.flush()
