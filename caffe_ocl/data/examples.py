"""Data for the shipped example solvers (`caffe_ocl data mnist|cifar10`).

The shipped solvers and nets name their files as BVLC Caffe's examples do,
relative to the folder training runs from (the clone's root):

- ``models/lenet``: ``examples/mnist/mnist_train_lmdb``,
  ``examples/mnist/mnist_test_lmdb``, snapshots ``examples/mnist/lenet_iter_N.*``;
- ``models/cifar10_quick``: ``examples/cifar10/cifar10_train_lmdb``,
  ``examples/cifar10/cifar10_test_lmdb``, ``examples/cifar10/mean.binaryproto``,
  snapshots ``examples/cifar10/cifar10_quick_iter_N.*``.

MNIST comes from the digits embedded in the package (the demo's 8,000 /
2,000 split of the MNIST test set, built by the demo's own code). CIFAR-10
cannot ship (162 MB, no PyPI package carries it): :func:`build_cifar10`
reads the binary version's batches (``data_batch_1.bin`` ...
``data_batch_5.bin``, ``test_batch.bin``, from a folder or straight from
``cifar-10-binary.tar.gz``) and writes what BVLC's
``examples/cifar10/create_cifar10.sh`` writes: the LMDBs of
``convert_cifar_data`` (Datum 3 x 32 x 32 holding the file's bytes as they
are, i.e. R, G, B planes; keys ``%05d``; the records are read and written by
caffe_ocl/data/cifar.py, the library side of `caffe_ocl convert_cifar_data`)
and the train set's mean.
"""
import logging
import os
import shutil
import tarfile
import zlib

from ..errors import DataError
from ..proto import write_binary
from . import cifar
from .cifar import TEST_FILE, TRAIN_FILES, check_batch_bytes, parse_cifar_batch, write_cifar_lmdb
from .demo import build_lmdbs
from .tools import compute_image_mean

log = logging.getLogger("caffe_ocl")

MNIST_DIR = os.path.join("examples", "mnist")
CIFAR10_DIR = os.path.join("examples", "cifar10")
CIFAR10_SOURCE = os.path.join("data", "cifar10")     # where BVLC's get_cifar10.sh puts it
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_HELP = (f"CIFAR-10 is not shipped (162 MB). Download the binary version, {CIFAR10_URL} "
                "(Krizhevsky, 2009), and run `caffe_ocl data cifar10 --source "
                "cifar-10-binary.tar.gz` (or --source the unpacked cifar-10-batches-bin/ "
                "folder)")


def build_mnist(out_dir=MNIST_DIR, progress=True):
    """``out_dir``/mnist_train_lmdb (8,000 digits) and mnist_test_lmdb (2,000)
    from the embedded MNIST files, as `caffe_ocl demo` builds them; complete
    databases already there are kept. Returns (train_db, test_db)."""
    os.makedirs(out_dir, exist_ok=True)
    return build_lmdbs(out_dir, progress=progress)


def _batch_bytes(source, names):
    """{name: bytes} of the CIFAR batch files in a folder (searched one level
    down too, for the unpacked ``cifar-10-batches-bin/``) or a .tar(.gz)."""
    if not os.path.exists(source):
        raise DataError(f"CIFAR-10 source {source}: not found. {CIFAR10_HELP}")
    out = {}
    if os.path.isfile(source):
        try:
            with tarfile.open(source) as tar:
                for m in tar.getmembers():
                    base = os.path.basename(m.name)
                    if m.isfile() and base in names and base not in out:
                        where = f"CIFAR-10 source {source}: member {m.name}"
                        check_batch_bytes(m.size, where)
                        buf = tar.extractfile(m).read(cifar.MAX_BATCH_BYTES + 1)
                        if len(buf) != m.size:
                            raise DataError(f"{where}: {len(buf)} bytes read, its header "
                                            f"says {m.size}")
                        out[base] = buf
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise DataError(f"CIFAR-10 source {source}: not a readable .tar.gz ({e}). "
                            f"{CIFAR10_HELP}") from None
    else:
        dirs = [source] + sorted(os.path.join(source, d) for d in os.listdir(source)
                                 if os.path.isdir(os.path.join(source, d)))
        for name in names:
            for d in dirs:
                p = os.path.join(d, name)
                if os.path.isfile(p):
                    check_batch_bytes(os.path.getsize(p), p)
                    with open(p, "rb") as f:
                        out[name] = f.read(cifar.MAX_BATCH_BYTES + 1)
                    check_batch_bytes(len(out[name]), p)
                    break
    missing = [n for n in names if n not in out]
    if missing:
        raise DataError(f"CIFAR-10 source {source}: no {', '.join(missing)}. {CIFAR10_HELP}")
    return out


def _parse_batch(buf, where):
    """(labels, images) of one batch (data/cifar.py's reader), its labels
    checked: a CIFAR-100 file is no CIFAR-10 one."""
    labels, images = parse_cifar_batch(buf, where)
    if labels.max() > 9:
        raise DataError(f"{where}: label {int(labels.max())} out of range 0..9 "
                        "(the CIFAR-100 binary format is not CIFAR-10's)")
    return labels, images


def build_cifar10(source=CIFAR10_SOURCE, out_dir=CIFAR10_DIR):
    """``out_dir``/cifar10_train_lmdb (data_batch_1..5), cifar10_test_lmdb
    (test_batch) and mean.binaryproto (mean of the train LMDB) from the
    binary batches in ``source`` (folder or .tar.gz). As Caffe's
    create_cifar10.sh, outputs already there are replaced; every batch is
    read and checked before anything is written. Returns (train_db,
    test_db, mean_file)."""
    raw = _batch_bytes(source, [*TRAIN_FILES, TEST_FILE])
    parsed = {n: _parse_batch(raw[n], os.path.join(source, n)) for n in raw}
    train_db = os.path.join(out_dir, "cifar10_train_lmdb")
    test_db = os.path.join(out_dir, "cifar10_test_lmdb")
    mean_file = os.path.join(out_dir, "mean.binaryproto")
    os.makedirs(out_dir, exist_ok=True)
    for path, names in ((train_db, TRAIN_FILES), (test_db, [TEST_FILE])):
        batches = [parsed[n] for n in names]
        tmp = f"{path}.tmp-{os.getpid()}"
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        log.info("Writing %s (%d images)", path, sum(len(b[0]) for b in batches))
        write_cifar_lmdb(batches, tmp)
        if os.path.exists(path):
            shutil.rmtree(path)
        os.rename(tmp, path)
    log.info("Computing the image mean of %s", train_db)
    write_binary(compute_image_mean(train_db), mean_file)
    return train_db, test_db, mean_file
