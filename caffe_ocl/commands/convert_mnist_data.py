"""`caffe_ocl convert_mnist_data`: MNIST IDX files to an LMDB."""
import logging

from ..data.tools import check_backend_name, read_idx, write_mnist_lmdb
from ._common import start_log
from .flags import Arg, Flag, Spec

SUMMARY = "MNIST IDX files to an LMDB (Caffe's convert_mnist_data)"

log = logging.getLogger("caffe_ocl")

SPEC = Spec(
    "caffe_ocl convert_mnist_data", SUMMARY,
    flags=[Flag("backend", str, "lmdb", "the backend for storing the result (lmdb only)")],
    args=[Arg("input_image_file", "IDX images (.gz accepted)", check="file"),
          Arg("input_label_file", "IDX labels (.gz accepted)", check="file"),
          Arg("output_db_file", "the LMDB to create")],
    example="caffe_ocl convert_mnist_data train-images-idx3-ubyte train-labels-idx1-ubyte "
            "mnist_train_lmdb",
    details="Datum 1 x rows x cols, keys %08d, as Caffe writes them.")


def main(argv):
    opts = SPEC.parse(argv)
    images_path, labels_path, db = opts.args
    start_log()
    check_backend_name(opts.backend, "convert_mnist_data")
    images, labels = read_idx(images_path, labels_path)
    log.info("Opening lmdb %s", db)
    write_mnist_lmdb(images, labels, db)
    return 0
