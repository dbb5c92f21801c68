"""Checks on snapshot inputs and outputs (issue #25), kept apart from the
solver loop so that the solver modules only call them.

- ``check_snapshot_prefix``: a prefix the file system cannot take (a NUL
  byte) is a SolverError naming the solver file, not a ValueError deep in
  a write.
- ``check_solver_state``: a .solverstate whose fields cannot be Caffe's
  (negative iter or step, a learned_net that is not a file name, e.g. a
  caffemodel given as --snapshot) is one SolverError line.
- ``remove_stale_temp_files``: ``{name}.tmp-{pid}`` files that a killed
  run left in a snapshot folder are removed when their process is gone.
"""
import logging
import os
import re

from .errors import SolverError
from .proto import caffe_pb2

log = logging.getLogger("caffe_ocl")

_TMP = re.compile(r"\.tmp-(\d+)$")


def check_snapshot_prefix(prefix, source):
    if "\0" in prefix:
        raise SolverError(f"{source}: snapshot_prefix {prefix!r} holds a NUL byte, which "
                          "no file name can")
    return prefix


def check_solver_state(state, raw, path):
    """SolverError (one line naming ``path``) when ``state`` (parsed from
    ``raw``) cannot be a solver state."""
    learned = state.learned_net
    if not isinstance(learned, str) or "\0" in learned:
        raise SolverError(f"{path}: not a solver state: its learned_net is not a file name"
                          f"{caffemodel_hint(raw)}")
    if state.iter < 0:
        raise SolverError(f"{path}: solver state has iter {state.iter}; it must be >= 0")
    if state.current_step < 0:
        raise SolverError(f"{path}: solver state has current_step {state.current_step}; "
                          "it must be >= 0")
    if not learned and not len(state.history) and raw and caffemodel_hint(raw):
        raise SolverError(f"{path}: not a solver state{caffemodel_hint(raw)}")
    return state


def caffemodel_hint(raw):
    """" (it reads as a caffemodel: ...)" where ``raw`` parses as a
    NetParameter with layers, else ""."""
    net = caffe_pb2.NetParameter()
    try:
        net.ParseFromString(raw)
    except Exception:  # noqa: BLE001 - any parse failure: not a caffemodel
        return ""
    if len(net.layer) or len(net.layers):
        return " (it reads as a caffemodel: give weights with --weights, a .solverstate " \
               "with --snapshot)"
    return ""


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp_files(prefix):
    """Remove ``*.tmp-<pid>`` files beside ``prefix`` whose process is gone
    (snapshot temp files of killed runs); returns the removed paths."""
    folder = os.path.dirname(os.path.abspath(prefix)) or "."
    base = os.path.basename(prefix)
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TMP.search(name)
        if not m or not name.startswith(base):
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(folder, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                removed.append(path)
                log.info("Removed %s, left by process %d which no longer runs", path, pid)
        except OSError:
            pass
    return removed


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def probe_writable(path):
    """Create and remove ``path`` to see that the folder takes files
    (Caffe's snapshot write check), never following a symlink there (a
    link planted at the probe's name would otherwise have its target
    created or truncated). OSError when it cannot."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o666)
    os.close(fd)
    os.remove(path)


def create_exclusive(path):
    """Create the new empty file ``path`` for writing (a snapshot's temp
    file): fails (FileExistsError / OSError) if anything, a symlink
    included, is already there, so a write never lands in a link's target."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
    return os.fdopen(fd, "wb")
