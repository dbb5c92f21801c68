"""Data input, as Caffe's: LMDB databases of ``Datum`` records, image lists,
the ``DataTransformer`` (crop, mirror, mean, scale) and prefetch threads.

Everything here is host-side (NumPy/OpenCV in background threads, as Caffe
does on the CPU); the data layers (``caffe_ocl/layers/data.py``) only
enqueue non-blocking uploads of ready batches into their tops.

    from caffe_ocl.data import LMDBReader, parse_datum, decode_datum, DataTransformer
"""
from .db import LMDBReader, LMDBWriter, open_db  # noqa: F401
from .datum import (parse_datum, decode_datum, array_to_datum,  # noqa: F401
                    read_image)
from .transformer import DataTransformer  # noqa: F401
from .paths import models_dir, mnist_dir  # noqa: F401
