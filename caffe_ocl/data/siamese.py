"""MNIST pairs for a siamese net, as BVLC's
examples/siamese/convert_mnist_siamese_data.cpp writes them (the library
side of `caffe_ocl convert_mnist_siamese_data`).

For each of the N items of the IDX files one pair (i, j) is drawn, i then j,
each ``caffe_rng_rand() % N``; the Datum holds image i as channel 0 and
image j as channel 1 (2 x rows x cols, uint8 ``data``), ``label`` 1 when
the two digits are the same and 0 otherwise; keys ``%08d`` of the item.

The random pairs: Caffe's ``caffe_rng_rand()`` is the raw 32-bit output of
boost's ``mt19937``; BVLC's tool never seeds it, so it starts from an
entropy seed and its pairs differ from run to run. Here the same generator
(MT19937, 32-bit outputs, seeded as ``mt19937(seed)``) is seeded with
``seed``: with the same seed, the pairs are those Caffe's tool would draw
after ``Caffe::set_random_seed(seed)``; ``seed=None`` takes an entropy
seed, as Caffe.
"""
import logging

import numpy as np

from ..proto import caffe_pb2
from .db import LMDBWriter

log = logging.getLogger("caffe_ocl")


def caffe_rng_rand(seed, n):
    """The first ``n`` outputs of mt19937(seed) (uint32), i.e. Caffe's
    ``caffe_rng_rand()`` after ``Caffe::set_random_seed(seed)``."""
    rs = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF)
    # a full-range uint32 draw is one raw generator output (no rejection);
    # RandomState(seed) seeds MT19937 as init_genrand(seed), as boost does
    return rs.randint(0, 2 ** 32, size=n, dtype=np.uint32)


def siamese_pairs(labels, seed):
    """(i, j, same) arrays of the pairs, one per item."""
    n = len(labels)
    r = caffe_rng_rand(seed, 2 * n).astype(np.int64)
    i, j = r[0::2] % n, r[1::2] % n
    return i, j, (labels[i] == labels[j]).astype(np.int64)


def write_siamese_lmdb(images, labels, db_path, seed=None):
    """Caffe's convert_mnist_siamese_data output for ``images`` [N, rows,
    cols] uint8 and ``labels`` [N]; returns the number of pairs."""
    n, rows, cols = images.shape
    log.info("A total of %d items.", n)
    log.info("Rows: %d Cols: %d", rows, cols)
    i, j, same = siamese_pairs(np.asarray(labels), seed)
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = 2, rows, cols
    with LMDBWriter(db_path) as w:
        for item in range(n):
            datum.data = images[i[item]].tobytes() + images[j[item]].tobytes()
            datum.label = int(same[item])
            w.put(f"{item:08d}", datum.SerializeToString())
    return n
