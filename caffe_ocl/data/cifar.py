"""CIFAR-10 binary batches to LMDBs, as BVLC's
examples/cifar10/convert_cifar_data.cpp writes them (the library side of
`caffe_ocl convert_cifar_data`).

Input: ``data_batch_1.bin`` .. ``data_batch_5.bin`` and ``test_batch.bin``
(https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-10 binary version"):
records of 1 label byte and 3072 pixel bytes (1024 red, 1024 green, 1024
blue, rows of 32). Output: ``<out>/cifar10_train_lmdb`` (the five training
batches in order) and ``<out>/cifar10_test_lmdb``; one Datum per record,
channels 3, height 32, width 32, ``data`` the 3072 bytes as the file holds
them (so channel 0 is red, as Caffe's tool leaves it), ``label`` the label
byte, keys ``%05d`` of the record's index. Caffe reads 10,000 records a
file; here a file holds as many records as its length says (the official
files hold 10,000, so the keys agree), and a length that is not a whole
number of records is an error.

The record reader and the LMDB writer here are also those of `caffe_ocl
data cifar10` (caffe_ocl/data/examples.py), which reads the same batches
from a folder or the downloaded .tar.gz.
"""
import logging
import os

import numpy as np

from ..errors import DataError
from ..proto import caffe_pb2
from .db import LMDBWriter

log = logging.getLogger("caffe_ocl")

SIZE = 32
IMAGE_BYTES = 3 * SIZE * SIZE
RECORD_BYTES = 1 + IMAGE_BYTES
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
# The largest batch file read: the official batches hold 10,000 records
# (30,730,000 bytes), and Caffe's convert_cifar_data reads 10,000 a file. A
# bigger file (a sparse file, or a .tar.gz member: 241 bytes can hold an
# 8 GiB one) is an error naming it, not read into memory.
MAX_BATCH_RECORDS = 10000
MAX_BATCH_BYTES = MAX_BATCH_RECORDS * RECORD_BYTES


def check_batch_bytes(size, where):
    """DataError naming ``where`` if ``size`` bytes exceed a batch's."""
    if size > MAX_BATCH_BYTES:
        raise DataError(f"{where}: {size} bytes, more than a CIFAR-10 batch holds (at most "
                        f"{MAX_BATCH_RECORDS} records of {RECORD_BYTES} bytes, "
                        f"{MAX_BATCH_BYTES} bytes)")


def _check_size(size, where):
    if size == 0 or size % RECORD_BYTES:
        raise DataError(f"{where}: {size} bytes is not a whole number of CIFAR-10 "
                        f"records ({RECORD_BYTES} bytes each: a label byte and "
                        f"{IMAGE_BYTES} pixel bytes)")


def parse_cifar_batch(buf, where):
    """(labels uint8 [N], images uint8 [N, 3072]) of one binary batch held
    in ``buf`` (bytes); ``where`` names it in errors."""
    _check_size(len(buf), where)
    rec = np.frombuffer(buf, np.uint8).reshape(-1, RECORD_BYTES)
    return rec[:, 0].copy(), rec[:, 1:].copy()


def read_cifar_batch(path):
    """(labels uint8 [N], images uint8 [N, 3072]) of one binary batch file."""
    if not os.path.isfile(path):
        raise DataError(f"Unable to open CIFAR-10 batch file {path} (the binary version "
                        "from https://www.cs.toronto.edu/~kriz/cifar.html, unpacked)")
    check_batch_bytes(os.path.getsize(path), path)
    _check_size(os.path.getsize(path), path)
    with open(path, "rb") as f:
        buf = f.read(MAX_BATCH_BYTES + 1)
    check_batch_bytes(len(buf), path)      # a file that grew meanwhile
    return parse_cifar_batch(buf, path)


def write_cifar_lmdb(batches, db_path):
    """Caffe's convert_cifar_data records: a new LMDB at ``db_path`` with one
    Datum per record of ``batches`` (an iterable of (labels, images) as
    :func:`parse_cifar_batch` returns them), keys ``%05d`` numbered across
    the batches in order. Returns the number of records."""
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = 3, SIZE, SIZE
    index = 0
    with LMDBWriter(db_path) as w:
        for labels, images in batches:
            for label, image in zip(labels, images):
                datum.label = int(label)
                datum.data = image.tobytes()
                w.put(f"{index:05d}", datum.SerializeToString())
                index += 1
    return index


def _read_logged(files):
    """The batches of ``files`` ([(log line or "", path)]), read one at a
    time as the writer takes them (Caffe logs each training batch)."""
    for label_of, path in files:
        if label_of:
            log.info("%s", label_of)
        yield read_cifar_batch(path)


def convert_cifar_data(input_folder, output_folder, db_type="lmdb"):
    """Write ``cifar10_train_<db_type>`` and ``cifar10_test_<db_type>``
    under ``output_folder``; returns (train records, test records)."""
    if db_type != "lmdb":
        raise DataError(f"convert_cifar_data: db_type {db_type!r} is not supported "
                        "(lmdb only)")
    train_files = [os.path.join(input_folder, f) for f in TRAIN_FILES]
    test_file = os.path.join(input_folder, TEST_FILE)
    for p in train_files + [test_file]:       # all inputs before any output
        if not os.path.isfile(p):
            raise DataError(f"Unable to open CIFAR-10 batch file {p} (the binary version "
                            "from https://www.cs.toronto.edu/~kriz/cifar.html, unpacked)")
        _check_size(os.path.getsize(p), p)
    log.info("Writing Training data")
    n_train = write_cifar_lmdb(
        _read_logged([(f"Training Batch {i + 1}", p) for i, p in enumerate(train_files)]),
        os.path.join(output_folder, f"cifar10_train_{db_type}"))
    log.info("Writing Testing data")
    n_test = write_cifar_lmdb(_read_logged([("", test_file)]),
                              os.path.join(output_folder, f"cifar10_test_{db_type}"))
    return n_train, n_test
