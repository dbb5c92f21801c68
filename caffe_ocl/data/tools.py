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
import zlib

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

# The most bytes of image (or label) data read from one IDX file
# (convert_mnist_data, convert_mnist_siamese_data). The data is held in
# memory (read_idx returns whole arrays), so a file past this (a gzip bomb:
# a 30 MB .gz inflating to 7 GB) is refused with an error naming it, not
# read until the process runs out of memory. MNIST's training images are
# 47 MB, EMNIST's largest split 0.55 GB.
MAX_IDX_BYTES = 2 << 30
_CHUNK = 1 << 24


def _size_text(nbytes):
    return f"{nbytes >> 30} GiB" if nbytes % (1 << 30) == 0 else f"{nbytes} bytes"


def _open_maybe_gz(path):
    if not os.path.isfile(path):
        raise DataError(f"convert_mnist_data: unable to open file {path}")
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _read_up_to(f, nbytes, chunk=_CHUNK):
    """At most ``nbytes`` of ``f``, read in chunks: a header claiming 2^32-1
    images costs only the bytes the file really has (one read of that size
    was a MemoryError); a short result is reported as truncated. Grown in
    place (a bytearray), so the bytes are held once, not twice."""
    out = bytearray()
    while len(out) < nbytes:
        b = f.read(min(nbytes - len(out), chunk))
        if not b:
            break
        out += b
    return out


def _skip_up_to(f, nbytes, chunk=_CHUNK):
    """Read and drop at most ``nbytes`` of ``f``; the number dropped (gzip
    data is inflated, and its CRC checked at the end of the stream, on the
    way)."""
    n = 0
    while n < nbytes:
        b = f.read(min(nbytes - n, chunk))
        if not b:
            break
        n += len(b)
    return n


def _left(f):
    """Bytes left in plain file ``f``; None for a .gz file (unknown until
    inflated)."""
    if isinstance(f, gzip.GzipFile):
        return None
    return os.fstat(f.fileno()).st_size - f.tell()


def _idx_payload(f, nbytes, path, what):
    """The ``nbytes`` of ``what`` after the header of IDX file ``path``: an
    error naming the file when it holds fewer (truncated) or when they are
    more than MAX_IDX_BYTES (they are held in memory)."""
    left = _left(f)
    if left is not None and left < nbytes:
        have = left
    elif nbytes > MAX_IDX_BYTES:
        have = left if left is not None else _skip_up_to(f, MAX_IDX_BYTES + 1)
        if have > MAX_IDX_BYTES:
            raise DataError(f"{path}: the header gives {what} ({nbytes} bytes); at "
                            f"most {_size_text(MAX_IDX_BYTES)} of data is read from an "
                            "IDX file (it is held in memory)")
    else:
        data = _read_up_to(f, nbytes)
        if len(data) == nbytes:
            return data
        have = len(data)
    raise DataError(f"{path}: truncated IDX file (the header gives {what}, {nbytes} "
                    f"bytes of data; the file holds {have})")


def _idx_end(f, path, count, what):
    """Read ``path`` to its end after the ``count`` ``what`` its header
    declares: a .gz file's CRC (checked at the end of its stream) then
    covers what was read. Data after them is ignored, as Caffe does, but
    logged."""
    extra = _left(f)
    if extra is None:
        try:
            extra = _skip_up_to(f, MAX_IDX_BYTES + 1)
        except gzip.BadGzipFile as e:
            if not str(e).startswith("Not a gzipped file"):
                raise
            # bytes after the last gzip member (its CRC checked): gunzip's
            # "trailing garbage ignored"
            log.warning("%s: data after the end of the gzip stream ignored", path)
            return
        if extra > MAX_IDX_BYTES:
            raise DataError(f"{path}: more than {_size_text(MAX_IDX_BYTES)} of data after "
                            f"the {count} {what} its header declares")
    if extra:
        log.warning("%s: %d bytes after the %d %s its header declares ignored", path,
                    extra, count, what)


def _read_idx_file(path, magic_want, kind):
    """(dims, data) of the IDX file ``path`` (gzip or plain): ``kind``
    'image' (dims: count, rows, cols) or 'label' (dims: count,)."""
    ndims = 3 if kind == "image" else 1
    try:
        with _open_maybe_gz(path) as f:
            head = f.read(4)
            magic = struct.unpack(">I", head)[0] if len(head) == 4 else None
            if magic != magic_want:
                raise DataError(f"{path}: incorrect {kind} file magic {magic} "
                                f"(expected {magic_want})")
            head = f.read(4 * ndims)
            if len(head) < 4 * ndims:
                raise DataError(f"{path}: too short for an IDX {kind} file")
            dims = struct.unpack(">" + "I" * ndims, head)
            nbytes = dims[0] * (dims[1] * dims[2] if kind == "image" else 1)
            what = (f"{dims[0]} images of {dims[1]}x{dims[2]}" if kind == "image"
                    else f"{dims[0]} labels")
            data = _idx_payload(f, nbytes, path, what)
            _idx_end(f, path, dims[0], kind + "s")
    except EOFError as e:
        raise DataError(f"{path}: truncated gzip file ({e})") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path}: damaged gzip file ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    except MemoryError:
        raise DataError(f"{path}: out of host memory reading it") from None
    return dims, data


def read_idx(images_path, labels_path):
    """(images uint8 [N, rows, cols], labels uint8 [N]) from MNIST IDX files
    (gzip or plain). Each file is read to its end, so a .gz file's CRC is
    checked; at most MAX_IDX_BYTES of data per file."""
    (n, rows, cols), pixels = _read_idx_file(images_path, 2051, "image")
    (nl,), labels = _read_idx_file(labels_path, 2049, "label")
    if n != nl:
        raise DataError(f"{images_path} has {n} images but {labels_path} has {nl} labels")
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
