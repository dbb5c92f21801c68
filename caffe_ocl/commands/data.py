"""`caffe_ocl data mnist|cifar10`: the databases the shipped solvers read.

    caffe_ocl data mnist   [--out DIR]
    caffe_ocl data cifar10 [--source DIR|FILE.tar.gz] [--out DIR]

Run from the folder you train from (the clone's root): the shipped nets
name their databases relative to it, as BVLC Caffe's examples do
(``examples/mnist/...``, ``examples/cifar10/...``). The work is done by
caffe_ocl.data.examples. ``caffe_ocl data -h`` describes both datasets;
``caffe_ocl data mnist -h`` / ``caffe_ocl data cifar10 -h`` each one's flags.
"""
import difflib
import sys

from ..data import examples as ex
from ..errors import FlagError
from ._common import start_log
from .flags import Arg, Flag, Spec

COMMAND = "data"
SUMMARY = "build the LMDBs the shipped LeNet and CIFAR-10 solvers read"

OUT = Flag("out", str, "", f"output folder (default: {ex.MNIST_DIR} for mnist, "
           f"{ex.CIFAR10_DIR} for cifar10)", metavar="DIR")
SOURCE = Flag("source", str, ex.CIFAR10_SOURCE,
              "cifar10 only: folder with data_batch_1.bin ... test_batch.bin (or the "
              f"folder above the unpacked one), or the downloaded .tar.gz ({ex.CIFAR10_URL})",
              metavar="PATH")

MNIST_TEXT = (f"mnist: the embedded MNIST digits (8,000 train / 2,000 test, as the demo) -> "
              f"{ex.MNIST_DIR}/mnist_train_lmdb, mnist_test_lmdb.")
CIFAR10_TEXT = (f"cifar10: CIFAR-10's binary batches -> {ex.CIFAR10_DIR}/cifar10_train_lmdb, "
                "cifar10_test_lmdb, mean.binaryproto (as Caffe's create_cifar10.sh). "
                + ex.CIFAR10_HELP + ".")

# one Spec per dataset (`caffe_ocl data mnist -h`), and the command's own
# (`caffe_ocl data -h`) naming both
DATASETS = {
    "mnist": Spec("caffe_ocl data mnist", "the LMDBs models/lenet trains from",
                  flags=[OUT], example="caffe_ocl data mnist && caffe_ocl train "
                                       "--solver models/lenet/lenet_solver.prototxt",
                  details=MNIST_TEXT),
    "cifar10": Spec("caffe_ocl data cifar10", "the LMDBs and mean models/cifar10_quick "
                    "trains from", flags=[SOURCE, OUT],
                    example="caffe_ocl data cifar10 --source cifar-10-binary.tar.gz",
                    details=CIFAR10_TEXT),
}

SPEC = Spec(
    "caffe_ocl data", SUMMARY, flags=[OUT, SOURCE],
    args=[Arg("DATASET", "mnist or cifar10 (caffe_ocl data DATASET -h: its flags)")],
    example="caffe_ocl data mnist && caffe_ocl train --solver "
            "models/lenet/lenet_solver.prototxt\n"
            "caffe_ocl data cifar10 --source cifar-10-binary.tar.gz",
    details="Builds the databases models/lenet and models/cifar10_quick train from, at the "
            "paths their prototxts name relative to the current folder (run it from the "
            "clone's root, as `caffe_ocl train` afterwards). " + MNIST_TEXT + " "
            + CIFAR10_TEXT)


def parse(argv):
    """(dataset, options) of ``caffe_ocl data`` ARGV: the dataset's own
    Spec when it comes first, else the command's (help, unknown flags,
    a missing or unknown dataset)."""
    argv = list(argv)
    if argv and argv[0] in DATASETS:
        return argv[0], DATASETS[argv[0]].parse(argv[1:])
    opts = SPEC.parse(argv, check=False)
    what = opts.args[0]
    if what not in DATASETS:
        close = difflib.get_close_matches(what, list(DATASETS), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise FlagError(f"unknown dataset {what!r}{hint} (mnist or cifar10; "
                        "see caffe_ocl data --help)")
    # the dataset after some flags: its own flags only
    spec = DATASETS[what]
    for name in opts.given:
        if name not in spec.flags:
            raise FlagError(f"--{name} is not a flag of {spec.command} "
                            f"(see {spec.command} --help)")
    spec.check_files(opts)
    return what, opts


def main(argv):
    what, opts = parse(argv)
    start_log()
    if what == "mnist":
        train, test = ex.build_mnist(opts.out or ex.MNIST_DIR, progress=sys.stderr.isatty())
        print(f"MNIST: {train}, {test}")
    else:
        train, test, mean = ex.build_cifar10(opts.source, opts.out or ex.CIFAR10_DIR)
        print(f"CIFAR-10: {train}, {test}, {mean}")
    return 0
