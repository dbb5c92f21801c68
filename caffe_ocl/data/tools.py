"""Caffe's data tools: convert_imageset, compute_image_mean, convert_mnist_data
(the library side; the commands are in caffe_ocl/commands/).

Same flags and positional arguments as Caffe's binaries (every gflags
spelling), same output: LMDBs of Datum records that Caffe reads, keys
``%08d_<path>`` (convert_imageset) or ``%08d`` (convert_mnist_data), a mean
``.binaryproto`` with legacy 1 x C x H x W shape. An existing output
database is an error, as in Caffe; LevelDB output is not supported.
"""
import gzip
import logging
import os
import struct
import sys

import numpy as np

from ..errors import DataError
from ..proto import caffe_pb2
from .datum import decode_datum, image_file_to_datum, parse_datum
from .db import LEVELDB_HINT, LMDBReader, LMDBWriter
from .image_list import read_image_list
from .transformer import seeded_rng

log = logging.getLogger("caffe_ocl")


def check_backend_name(name, tool):
    b = name.lower()
    if b == "leveldb":
        raise DataError(f"{tool}: --backend leveldb: {LEVELDB_HINT}")
    if b != "lmdb":
        raise DataError(f"{tool}: unknown --backend {name!r} (use lmdb)")


class _Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, total, stream=None):
        self.total = max(int(total), 1)
        self.stream = stream or sys.stderr
        self.on = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last = -1

    def update(self, n):
        if not self.on:
            return
        pct = int(100 * n / self.total)
        if pct == self.last and n != self.total:
            return
        self.last = pct
        w = 30
        fill = int(w * n / self.total)
        self.stream.write(f"\r[{'#' * fill}{'.' * (w - fill)}] {n}/{self.total} ({pct}%)")
        self.stream.flush()

    def done(self):
        if self.on:
            self.stream.write("\n")
            self.stream.flush()


# --------------------------------------------------------------------------
# convert_imageset

def convert_imageset(root, listfile, db_path, gray=False, shuffle=False, backend="lmdb",
                     resize_width=0, resize_height=0, check_size=False, encoded=False,
                     encode_type="", seed=None, progress=True):
    """Write the images of ``listfile`` (``path label`` lines, paths under
    ``root``) into a new LMDB at ``db_path``. Returns the number written."""
    check_backend_name(backend, "convert_imageset")
    lines = read_image_list(listfile, "convert_imageset")
    if shuffle:
        log.info("Shuffling data")
        if seed is None:
            rng = seeded_rng()
        else:
            rng = np.random.default_rng(seed)
        rng.shuffle(lines)
    log.info("A total of %d images.", len(lines))
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
    is_color = not gray
    rh, rw = max(0, int(resize_height)), max(0, int(resize_width))
    writer = LMDBWriter(db_path)
    bar = _Progress(len(lines)) if progress else None
    count = 0
    failed = 0
    first_shape = None
    try:
        for line_id, (path, label, n) in enumerate(lines):
            enc = encode_type
            if encoded and not enc:
                if "." not in os.path.basename(path):
                    log.warning("Failed to guess the encoding of '%s'", path)
                enc = path.rsplit(".", 1)[-1].lower() if "." in path else "png"
            where = f"list file {listfile} line {n}"
            try:
                datum, shape = image_file_to_datum(root + path, label, rh, rw, is_color,
                                                   enc, where)
            except DataError as e:
                # Caffe logs the unreadable file and carries on
                log.error("%s", e)
                failed += 1
                continue
            except Exception as e:  # noqa: BLE001 - any image that cannot be decoded
                # (OpenCV on a PNG header claiming 60000x60000, a label past int32)
                log.error("%s: image %s skipped (%s: %s)", where, root + path,
                          type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                failed += 1
                continue
            if check_size:
                if first_shape is None:
                    first_shape = shape
                elif shape != first_shape:
                    raise DataError(f"{where}: image {root + path} is "
                                    f"{'x'.join(map(str, shape))}, the first one "
                                    f"{'x'.join(map(str, first_shape))} (--check_size)")
            writer.put(f"{line_id:08d}_{path}", datum.SerializeToString())
            count += 1
            if count % 1000 == 0:
                writer.commit()
                log.info("Processed %d files.", count)
            if bar:
                bar.update(line_id + 1)
        writer.close()
    except BaseException:
        writer.abort()     # no half-written database under the name
        raise
    finally:
        if bar:
            bar.done()
    if count % 1000 != 0:
        log.info("Processed %d files.", count)
    if failed:
        log.warning("%d of %d images could not be read and were skipped", failed, len(lines))
    if count == 0:
        raise DataError(f"convert_imageset: none of the {len(lines)} images of {listfile} "
                        f"could be read; {db_path} holds no records")
    return count


# --------------------------------------------------------------------------
# compute_image_mean

def compute_image_mean(db_path, backend="lmdb"):
    """Mean image of an LMDB of Datum records as a BlobProto (1 x C x H x W)."""
    check_backend_name(backend, "compute_image_mean")
    with LMDBReader(db_path) as reader:
        total = None
        count = 0
        first = None
        log.info("Starting iteration")
        for key, value in reader:
            where = f"database {db_path} key {key.decode('utf-8', 'replace')!r}"
            d = parse_datum(value, where)
            img = decode_datum(d, where)
            if first is None:
                first = img.shape
                if d.encoded:
                    log.info("Decoding Datum")
                total = np.zeros(first, np.float64)
            elif img.shape != first:
                raise DataError(f"{where}: record has shape {'x'.join(map(str, img.shape))}"
                                f", the first one {'x'.join(map(str, first))}")
            total += img
            count += 1
            if count % 10000 == 0:
                log.info("Processed %d files.", count)
    if count % 10000 != 0:
        log.info("Processed %d files.", count)
    mean = (total / count).astype(np.float32)
    blob = caffe_pb2.BlobProto()
    blob.num, (blob.channels, blob.height, blob.width) = 1, mean.shape
    blob.data.extend(mean.ravel().tolist())
    return blob


# --------------------------------------------------------------------------
# convert_mnist_data

def _open_maybe_gz(path):
    if not os.path.isfile(path):
        raise DataError(f"convert_mnist_data: unable to open file {path}")
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _read_up_to(f, nbytes, chunk=1 << 24):
    """At most ``nbytes`` of ``f``, read in chunks: a header claiming 2^32-1
    images costs only the bytes the file really has (one read of that size
    was a MemoryError); a short result is reported as truncated."""
    parts, left = [], nbytes
    while left > 0:
        b = f.read(min(left, chunk))
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def read_idx(images_path, labels_path):
    """(images uint8 [N, rows, cols], labels uint8 [N]) from MNIST IDX files
    (gzip or plain)."""
    try:
        with _open_maybe_gz(images_path) as f:
            head = f.read(4)
            magic = struct.unpack(">I", head)[0] if len(head) == 4 else None
            if magic != 2051:
                raise DataError(f"{images_path}: incorrect image file magic {magic} "
                                "(expected 2051)")
            head = f.read(12)
            if len(head) < 12:
                raise DataError(f"{images_path}: too short for an IDX image file")
            n, rows, cols = struct.unpack(">III", head)
            pixels = _read_up_to(f, n * rows * cols)
        with _open_maybe_gz(labels_path) as f:
            head = f.read(4)
            magic = struct.unpack(">I", head)[0] if len(head) == 4 else None
            if magic != 2049:
                raise DataError(f"{labels_path}: incorrect label file magic {magic} "
                                "(expected 2049)")
            head = f.read(4)
            if len(head) < 4:
                raise DataError(f"{labels_path}: too short for an IDX label file")
            nl = struct.unpack(">I", head)[0]
            labels = _read_up_to(f, nl)
    except (OSError, EOFError) as e:
        raise DataError(f"convert_mnist_data: cannot read ({e})") from None
    if n != nl:
        raise DataError(f"{images_path} has {n} images but {labels_path} has {nl} labels")
    if len(pixels) != n * rows * cols or len(labels) != nl:
        raise DataError(f"{images_path}/{labels_path}: truncated IDX file")
    return (np.frombuffer(pixels, np.uint8).reshape(n, rows, cols),
            np.frombuffer(labels, np.uint8))


def write_mnist_lmdb(images, labels, db_path, progress=True):
    """Caffe's convert_mnist_data output: Datum 1 x rows x cols, keys %08d."""
    n, rows, cols = images.shape
    log.info("A total of %d items.", n)
    log.info("Rows: %d Cols: %d", rows, cols)
    d = caffe_pb2.Datum()
    d.channels, d.height, d.width = 1, rows, cols
    bar = _Progress(n) if progress else None
    with LMDBWriter(db_path) as w:
        for i in range(n):
            d.data = images[i].tobytes()
            d.label = int(labels[i])
            w.put(f"{i:08d}", d.SerializeToString())
            if bar and (i % 200 == 0 or i == n - 1):
                bar.update(i + 1)
    if bar:
        bar.done()
    log.info("Processed %d files.", n)
    return n
