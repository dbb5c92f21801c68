"""Net weights in Caffe's HDF5 layout (``*.caffemodel.h5``), as BVLC's
Net::CopyTrainedLayersFromHDF5 / ToHDF5: dataset ``/data/<layer>/<i>`` holds
param blob i of a layer (``/diff/<layer>/<i>`` its gradient when written).

Files are recognised by content (the HDF5 signature, at offset 0 or after a
user block of 512, 1024, 2048, ... bytes), not by name. h5py is an optional
dependency (``pip install 'caffe_ocl[hdf5]'``).
"""
import logging
import math
import os
import stat

import numpy as np

from .data.hdf5 import h5_errors, open_h5, read_dataset
from .errors import FileNotFound, NetError, ShapeError, check_replaceable

log = logging.getLogger("caffe_ocl")

SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path):
    """True when the file at ``path`` starts with (or has after a user
    block) the HDF5 signature. Only a regular file is opened (a FIFO or a
    device would block or never end); the caller's reader reports those."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            if f.read(8) == SIGNATURE:
                return True
            size = os.fstat(f.fileno()).st_size
            off = 512
            while off + 8 <= size:
                f.seek(off)
                if f.read(8) == SIGNATURE:
                    return True
                off *= 2
    except OSError:
        return False
    return False


def require_h5py(what):
    try:
        import h5py
    except ImportError:
        raise NetError(f"{what}: HDF5 weights need h5py: pip install 'caffe_ocl[hdf5]'") \
            from None
    return h5py


def _fits(src, dst):
    """Same shape, or the same after dropping leading 1s (a legacy 4-D
    1x1xMxN blob for an MxN one)."""
    src, dst = tuple(src), tuple(dst)
    if src == dst:
        return True
    strip = lambda s: s[next((i for i, d in enumerate(s) if d != 1), len(s)):]  # noqa: E731
    return len(src) == 4 and strip(src) == strip(dst) and np.prod(src) == np.prod(dst)


def _shared_elsewhere(layer, j, owners):
    """Param j of ``layer`` is shared by name with an earlier layer's param
    (Caffe skips it in the file)."""
    specs = layer.param.param
    return j < len(specs) and specs[j].name and owners.get(specs[j].name, layer.name) != layer.name


def copy_from_hdf5(layers, path):
    """Load ``/data/<layer>/<i>`` into the params of ``layers`` (a Net's
    layer list), by layer name; source layers the net lacks are skipped."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFound(f"weights file not found: {path}")
    h5py = require_h5py(path)
    by_name = {layer.name: layer for layer in layers}
    owners = {}
    for layer in layers:
        for spec in layer.param.param:
            if spec.name:
                owners.setdefault(spec.name, layer.name)
    with open_h5(h5py, path) as f, h5_errors(path):
        data = f.get("data")
        if not isinstance(data, h5py.Group):
            top = ", ".join(sorted(f.keys())[:8]) or "nothing"
            raise NetError(f"{path} is an HDF5 file but not Caffe weights: it has no /data "
                           f"group of layers (it holds {top})")
        for lname in data:
            layer = by_name.get(lname)
            if layer is None:
                log.info("Ignoring source layer %s", lname)
                continue
            group = data[lname]
            if not isinstance(group, h5py.Group):
                raise NetError(f"{path}: /data/{lname} is not a group of param blobs: not "
                               "Caffe weights")
            target = layer.blobs
            if len(group) > len(target):
                raise ShapeError(f"{path}: incompatible number of blobs for layer {lname!r}: "
                                 f"the file has {len(group)}, the net expects {len(target)}")
            log.info("Copying source layer %s", lname)
            for j, tb in enumerate(target):
                key = str(j)
                if key not in group:
                    if _shared_elsewhere(layer, j, owners):
                        continue
                    raise ShapeError(f"{path}: incompatible number of blobs for layer "
                                     f"{lname!r}: the file has no param {j} (/data/{lname}/{j})"
                                     f", the net expects {len(target)}")
                def shape_ok(shape, j=j, tb=tb):
                    if not _fits(shape, tb.shape):
                        raise ShapeError(
                            f"{path}: cannot copy param {j} weights from layer {lname!r}; "
                            f"shape mismatch. Source param shape is "
                            f"{' '.join(map(str, shape))} ({math.prod(shape)}); target "
                            f"param shape is {' '.join(map(str, tb.shape))} ({tb.count})")
                arr = read_dataset(h5py, group[key], f"{path}: /data/{lname}/{key}",
                                   shape_ok=shape_ok)
                tb.data[...] = arr.reshape(tb.shape)


def save_hdf5(layers, path, write_diff=False):
    """Write the params of ``layers`` as Caffe's ToHDF5 does (a group per
    layer; a param shared by name only under its owner), atomically."""
    path = check_replaceable(path)      # never rename over a device or folder
    h5py = require_h5py(path)
    owners = {}
    for layer in layers:
        for spec in layer.param.param:
            if spec.name:
                owners.setdefault(spec.name, layer.name)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            diff = f.create_group("diff") if write_diff else None
            for layer in layers:
                if layer.name in data:
                    continue
                g = data.create_group(layer.name)
                gd = diff.create_group(layer.name) if write_diff else None
                for j, b in enumerate(layer.blobs):
                    if _shared_elsewhere(layer, j, owners):
                        continue      # only the owner of a shared param writes it, as Caffe
                    g.create_dataset(str(j), data=np.asarray(b.host_data(), np.float32))
                    if write_diff:
                        gd.create_dataset(str(j), data=np.asarray(b.host_diff(), np.float32))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise NetError(f"cannot write {path}: {e}") from None
