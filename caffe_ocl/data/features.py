"""Features of named blobs into LMDBs, as BVLC's tools/extract_features.cpp
writes them (the library side of `caffe_ocl extract_features`).

For every mini-batch the whole net runs forward once (its data layer reads
the next batch); for each requested blob and each of its ``num`` items one
Datum is written to that blob's database: ``float_data`` holds the item's
values, ``channels``/``height``/``width`` the blob's legacy dimensions
(channels, height and width of an N x C x H x W blob; 1 where the blob has
fewer axes), ``label`` is not set, the key is the item's index as ``%010d``
(Caffe's ``format_int(i, 10)``), counting from 0 per database.
"""
import logging

import numpy as np

from ..errors import DataError, ShapeError
from ..proto import caffe_pb2
from .db import LMDBWriter

log = logging.getLogger("caffe_ocl")


def legacy_dims(shape, blob_name):
    """(channels, height, width) as Caffe's Blob::channels()/height()/width()
    give them (LegacyShape: missing axes count 1; more than 4 axes fail)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) > 4:
        raise ShapeError(f"blob {blob_name} has {len(shape)} axes {list(shape)}; Caffe's "
                         "Datum holds at most 4 (num, channels, height, width)")
    padded = shape + (1,) * (4 - len(shape))
    return padded[1], padded[2], padded[3]


def extract_features(net, blob_names, db_paths, num_batches, source="the net"):
    """Run ``net`` forward ``num_batches`` times and write the items of each
    blob of ``blob_names`` into the new LMDB at the same position of
    ``db_paths``. Returns {blob name: records written}."""
    if len(blob_names) != len(db_paths):
        raise DataError(f"{len(blob_names)} blob name(s) but {len(db_paths)} database "
                        "name(s): the number of blob names and dataset names must be equal")
    for name in blob_names:
        if name not in net.blobs:
            raise DataError(f"Unknown feature blob name {name} in the network {source}")
    if num_batches < 0:
        raise DataError(f"num_mini_batches must not be negative, got {num_batches}")
    writers = []
    try:
        for path in db_paths:
            log.info("Opening dataset %s", path)
            writers.append(LMDBWriter(path))
        log.info("Extracting Features")
        counts = [0] * len(blob_names)
        datum = caffe_pb2.Datum()
        for _ in range(num_batches):
            net.forward(blobs=list(blob_names))
            for i, name in enumerate(blob_names):
                data = np.asarray(net.blobs[name].host_data(), np.float32)
                c, h, w = legacy_dims(data.shape, name)
                items = data.reshape(data.shape[0] if data.ndim else 1, -1)
                for row in items:
                    datum.Clear()
                    datum.channels, datum.height, datum.width = c, h, w
                    datum.float_data.extend(row.tolist())
                    writers[i].put(f"{counts[i]:010d}", datum.SerializeToString())
                    counts[i] += 1
                    if counts[i] % 1000 == 0:
                        writers[i].commit()
                        log.info("Extracted features of %d query images for feature blob %s",
                                 counts[i], name)
        for i, name in enumerate(blob_names):
            writers[i].commit()
            log.info("Extracted features of %d query images for feature blob %s",
                     counts[i], name)
        for wr in writers:
            wr.close()
    except BaseException:
        # an error or Ctrl-C midway (or a later database that already
        # exists): no database, empty or half-written, is left under its name
        for wr in writers:
            wr.abort()
        raise
    log.info("Successfully extracted the features!")
    return dict(zip(blob_names, counts))
