"""Snapshot and restore of a Solver (Caffe's Solver::Snapshot/Restore and
SGDSolver::SnapshotSolverState/RestoreSolverState), in both formats:

- BINARYPROTO: ``{prefix}_iter_{N}.caffemodel`` (the net's NetParameter)
  and ``.solverstate`` (Caffe's SolverState plus caffe_ocl's random state,
  solvers/state.py);
- HDF5: ``.caffemodel.h5`` and ``.solverstate.h5`` with Caffe's layout.

Every write is atomic (a temporary file, then a rename): a failed write
never replaces or truncates an existing snapshot. ``Snapshotting`` is
the Solver's base class holding these methods; they read the solver's
``param``, ``net``, ``iter``, ``current_step``, ``history`` and
``n_history``.
"""
import errno
import json
import logging
import os

import numpy as np

from .. import safe_io
from ..data.hdf5 import check_vlen_string, h5_errors, open_h5, read_dataset
from ..errors import FileNotFound, ShapeError, SolverError, naming
from ..ops.random import get_state, set_state
from ..proto import (array_to_blobproto, blobproto_to_array, caffe_pb2, read_file_bytes, read_net,
                     write_binary)
from . import state as st

log = logging.getLogger("caffe_ocl")


class Snapshotting:
    """Snapshot/restore methods of the Solver."""

    def snapshot_filename(self, ext):
        return f"{self.param.snapshot_prefix}_iter_{self.iter}{ext}"

    def snapshot(self):
        """Write {prefix}_iter_{N}.caffemodel and .solverstate (atomically)."""
        if self.solver_rank != 0:      # only the root solver snapshots (as Caffe)
            return None
        self.net.check_labels()         # no snapshot of weights a bad label made NaN
        p = self.param
        hdf5 = p.snapshot_format == caffe_pb2.SolverParameter.HDF5
        if hdf5:
            return self._snapshot_hdf5()
        model = self.snapshot_filename(".caffemodel")
        log.info("Snapshotting to binary proto file %s", model)
        _write(self.net.to_proto(write_diff=p.snapshot_diff), model)
        state = caffe_pb2.SolverState()
        state.iter = self.iter
        state.learned_net = model
        state.current_step = self.current_step
        for h in self.history:
            state.history.add().CopyFrom(array_to_blobproto(h.host_data()))
        path = self.snapshot_filename(".solverstate")
        log.info("Snapshotting solver state to binary proto file %s", path)
        _write(st.RawMessage(st.solver_state_bytes(state, get_state(), self._data_states())),
               path)
        return path

    def _snapshot_hdf5(self):
        h5py = _require_h5py("snapshot_format: HDF5")
        model = self.snapshot_filename(".caffemodel.h5")
        log.info("Snapshotting to HDF5 file %s", model)
        tmp = f"{model}.tmp-{os.getpid()}"
        try:
            safe_io.create_exclusive(tmp).close()
            with h5py.File(tmp, "w") as f:
                for name, layer in zip(self.net.graph.layer_names, self.net.layers):
                    for j, b in enumerate(layer.blobs):
                        f.create_dataset(f"data/{name}/{j}", data=b.host_data())
                        if self.param.snapshot_diff:
                            f.create_dataset(f"diff/{name}/{j}", data=b.host_diff())
            os.replace(tmp, model)
            path = self.snapshot_filename(".solverstate.h5")
            log.info("Snapshotting solver state to HDF5 file %s", path)
            tmp = f"{path}.tmp-{os.getpid()}"
            safe_io.create_exclusive(tmp).close()
            with h5py.File(tmp, "w") as f:
                f["iter"] = self.iter
                f["learned_net"] = model
                f["current_step"] = self.current_step
                rng = get_state()
                f["caffe_ocl_rng"] = np.array([rng["seed"], rng["stream"]], np.uint64)
                data_states = self._data_states()
                if data_states is not None:
                    f["caffe_ocl_data"] = json.dumps(data_states, sort_keys=True)
                for i, h in enumerate(self.history):
                    f.create_dataset(f"history/{i}", data=h.host_data())
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise SolverError(f"cannot write snapshot {tmp.rsplit('.tmp-', 1)[0]}: "
                              f"{e.strerror or e}") from None
        return path

    def restore(self, path):
        """Solver::Restore from a .solverstate (or .solverstate.h5)."""
        path = os.fspath(path)
        if path.endswith(".h5"):
            return self._restore_hdf5(path)
        raw = read_file_bytes(path, "solver state")
        state, rng, data = st.parse_solver_state(raw, path)
        safe_io.check_solver_state(state, raw, path)
        if state.learned_net:
            with naming(path):
                self._restore_net(state.learned_net, path)
        self._restore_history([blobproto_to_array(b, where=f"{path}: history blob {i}")
                               for i, b in enumerate(state.history)], path)
        self.iter = state.iter
        self.current_step = state.current_step
        if rng is not None:
            set_state(rng)
        else:
            log.info("%s holds no caffe_ocl random state (a Caffe snapshot?); random "
                     "numbers will not continue the original run's sequence", path)
        self._restore_data_states(data, path)
        log.info("%s: restoring history", type(self).__name__)

    def _data_states(self):
        """{layer name: read state} of the train net's data layers; None in
        data-parallel training, where each rank reads its own shard and only
        rank 0 snapshots (its readers' positions are not the other ranks'):
        there, as in Caffe, the readers start again from their first record."""
        if getattr(self, "solver_count", 1) > 1:
            return None
        states = {name: layer.data_state()
                  for name, layer in zip(self.net.graph.layer_names, self.net.layers)
                  if hasattr(layer, "data_state")}
        return {k: v for k, v in states.items() if v is not None}

    def _restore_data_states(self, states, path):
        readers = [(name, layer) for name, layer in zip(self.net.graph.layer_names,
                                                        self.net.layers)
                   if hasattr(layer, "restore_data_state")]
        if not readers:
            return
        if getattr(self, "solver_count", 1) > 1:
            log.info("Data-parallel training: the data layers start again from their "
                     "first record (read positions are restored in single-process runs)")
            return
        if states is None:
            log.info("%s holds no data read positions (an older, data-parallel or Caffe "
                     "snapshot); the data layers start again from their first record", path)
            return
        for name, layer in readers:
            if name in states:
                try:
                    with naming(path):
                        layer.restore_data_state(states[name])
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise SolverError(f"{path}: the read position saved for data layer "
                                      f"{name!r} is malformed ({type(e).__name__}: {e})"
                                      ) from None
            else:
                log.info("%s holds no read position for data layer %r; it starts from "
                         "its first record", path, name)

    def _restore_hdf5(self, path):
        h5py = _require_h5py(f"restoring {path}")
        with open_h5(h5py, path, error=SolverError) as f, h5_errors(path, SolverError):
            learned = _h5_text(h5py, f, "learned_net", path)
            hist = []
            if "history" in f:
                group = f["history"]
                if not isinstance(group, h5py.Group):
                    raise SolverError(f"{path}: /history is not a group of blobs")
                counts = [h.count for h in self.history]
                if len(group) != len(counts):
                    raise SolverError(f"{path}: incorrect length of history blobs: the "
                                      f"snapshot has {len(group)}, this {self.kind} solver "
                                      f"needs {len(counts)}: the snapshot was made for a "
                                      "different net or solver type")
                for i in range(len(group)):
                    if str(i) not in group:
                        raise SolverError(f"{path}: history blob {i} (/history/{i}) is "
                                          f"missing ({len(group)} entries)")
                    hist.append(read_dataset(
                        h5py, group[str(i)], f"{path}: /history/{i}", SolverError,
                        max_count=counts[i]))
            it = _h5_int(h5py, f, "iter", path, required=True)
            cs = _h5_int(h5py, f, "current_step", path, required=True)
            rng = None
            if "caffe_ocl_rng" in f:
                obj = f["caffe_ocl_rng"]
                if not isinstance(obj, h5py.Dataset) or obj.shape != (2,) or \
                        obj.dtype.kind not in "iu":
                    raise SolverError(f"{path}: /caffe_ocl_rng must hold two integers")
                rng = np.asarray(obj[()])
            data = _h5_text(h5py, f, "caffe_ocl_data", path) if "caffe_ocl_data" in f \
                else None
        if it < 0:
            raise SolverError(f"{path}: solver state has iter {it}: not a valid snapshot")
        if learned:
            lp = self._resolve_learned(learned, path)
            with open_h5(h5py, lp, error=SolverError) as f, h5_errors(lp, SolverError):
                for name, layer in zip(self.net.graph.layer_names, self.net.layers):
                    for j, b in enumerate(layer.blobs):
                        key = f"data/{name}/{j}"
                        if key not in f:
                            raise SolverError(f"{lp}: no weights for layer {name!r} param {j}:"
                                              " the snapshot was made for a different net")

                        def shape_ok(shape, name=name, j=j, b=b):
                            if shape != tuple(b.shape):
                                raise SolverError(f"{lp}: layer {name!r} param {j} has shape "
                                                  f"{shape}, the net expects {b.shape}")
                        b.data[...] = read_dataset(h5py, f[key], f"{lp}: /{key}", SolverError,
                                                   shape_ok=shape_ok)
        self._restore_history(hist, path)
        self.iter, self.current_step = it, cs
        if rng is not None:
            set_state({"seed": int(rng[0]), "stream": int(rng[1])})
        if data is not None:
            data = st.parse_data_state(data, path)
        self._restore_data_states(data, path)

    def _resolve_learned(self, learned, state_path):
        if os.path.exists(learned):
            return learned
        alt = os.path.join(os.path.dirname(os.path.abspath(state_path)),
                           os.path.basename(learned))
        if os.path.exists(alt):
            return alt
        raise FileNotFound(f"{state_path}: its learned_net {learned!r} does not exist "
                           f"(also looked for {alt})")

    def _restore_net(self, learned, state_path):
        lp = self._resolve_learned(learned, state_path)
        src = read_net(lp)
        have = {l.name: l for l in src.layer}
        for name, layer in zip(self.net.graph.layer_names, self.net.layers):
            if not layer.blobs:
                continue
            sl = have.get(name)
            if sl is None:
                raise SolverError(f"{lp}: snapshot has no layer {name!r} (it has "
                                  f"{', '.join(sorted(l.name for l in src.layer if l.blobs)) or 'no layers with weights'}): "
                                  "the snapshot was made for a different net")
            if len(sl.blobs) != len(layer.blobs):
                raise SolverError(f"{lp}: layer {name!r} has {len(sl.blobs)} param blobs in the "
                                  f"snapshot, the net has {len(layer.blobs)}: the snapshot was "
                                  "made for a different net")
        try:
            self.net.copy_from(src)
        except ShapeError as e:
            raise SolverError(f"{lp}: {e} (the snapshot was made for a different net)") from None

    def _restore_history(self, arrays, path):
        params = self.net.graph.learnable_params
        if len(arrays) != len(self.history):
            raise SolverError(f"{path}: incorrect length of history blobs: the snapshot has "
                              f"{len(arrays)}, this {self.kind} solver for net "
                              f"{self.net.name!r} needs {len(self.history)} "
                              f"({self.n_history} per learnable param): the snapshot was made "
                              "for a different net or solver type")
        for i, (h, arr) in enumerate(zip(self.history, arrays)):
            if arr.size != h.count:
                pb = params[i % len(params)]
                raise SolverError(f"{path}: history blob {i} has shape {arr.shape}, but "
                                  f"param {pb.name!r} has shape {pb.shape}: the snapshot "
                                  "was made for a different net")
            h.data[...] = arr.reshape(h.shape)


def _h5_scalar(h5py, f, key, path):
    obj = f[key]
    if not isinstance(obj, h5py.Dataset) or obj.shape not in ((), (1,)):
        raise SolverError(f"{path}: /{key} is not a scalar dataset")
    check_vlen_string(h5py, obj, path, f"{path}: /{key}", SolverError)
    val = obj[()]
    return val[0] if getattr(val, "shape", ()) == (1,) else val


def _h5_text(h5py, f, key, path):
    """A string dataset of an HDF5 solver state ('' when absent)."""
    if key not in f:
        return ""
    val = _h5_scalar(h5py, f, key, path)
    if isinstance(val, (bytes, np.bytes_)):
        try:
            val = bytes(val).decode()
        except UnicodeDecodeError:
            raise SolverError(f"{path}: /{key} is not UTF-8 text") from None
    if not isinstance(val, str):
        raise SolverError(f"{path}: /{key} holds {type(val).__name__}, not text")
    if "\0" in val:
        raise SolverError(f"{path}: /{key} holds a NUL byte")
    return val


def _h5_int(h5py, f, key, path, required=False):
    if key not in f:
        if required:
            raise SolverError(f"{path}: solver state has no /{key}: not a caffe_ocl "
                              "HDF5 snapshot")
        return 0
    val = _h5_scalar(h5py, f, key, path)
    if not isinstance(val, (int, np.integer)) or not -2**31 <= int(val) < 2**31:
        raise SolverError(f"{path}: /{key} must be an int32, got {val!r}"[:300])
    return int(val)


def _require_h5py(what):
    try:
        import h5py
    except ImportError:
        raise SolverError(f"{what} needs the h5py package, which is not installed "
                          "(pip install h5py), or use snapshot_format: BINARYPROTO") from None
    return h5py


def _write(msg, path):
    try:
        write_binary(msg, path)
    except OSError as e:
        hint = " (disk full)" if e.errno == errno.ENOSPC else ""
        raise SolverError(f"cannot write snapshot {path}: {e.strerror or e}{hint}; "
                          "earlier snapshots are left intact") from None
