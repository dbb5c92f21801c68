"""`caffe_ocl convert_cifar_data`: CIFAR-10 binary batches to LMDBs."""
from ..data.cifar import convert_cifar_data
from ._common import start_log
from .flags import Arg, Spec

SUMMARY = "CIFAR-10 binary batches to cifar10_{train,test}_lmdb (Caffe's convert_cifar_data)"

SPEC = Spec(
    "caffe_ocl convert_cifar_data", SUMMARY,
    args=[Arg("input_folder", "holds data_batch_1.bin .. data_batch_5.bin and test_batch.bin "
              "(CIFAR-10 binary version, unpacked)", check="dir"),
          Arg("output_folder", "where cifar10_train_lmdb and cifar10_test_lmdb are created",
              check="dir"),
          Arg("db_type", "lmdb (the only backend)", optional=True)],
    example="caffe_ocl convert_cifar_data data/cifar10/cifar-10-batches-bin examples/cifar10",
    details="Datum 3 x 32 x 32 with the file's bytes, keys %05d, as Caffe writes them. "
            "The data: https://www.cs.toronto.edu/~kriz/cifar.html (binary version).")


def main(argv):
    opts = SPEC.parse(argv)
    start_log()
    convert_cifar_data(opts.args[0], opts.args[1], opts.args[2] if len(opts.args) > 2
                       else "lmdb")
    return 0
