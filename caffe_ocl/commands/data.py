"""`caffe_ocl data mnist|cifar10`: the databases the shipped solvers read.

    caffe_ocl data mnist   [--out DIR]
    caffe_ocl data cifar10 [--source DIR|FILE.tar.gz] [--out DIR]

Run from the folder you train from (the clone's root): the shipped nets
name their databases relative to it, as BVLC Caffe's examples do
(``examples/mnist/...``, ``examples/cifar10/...``). The work is done by
caffe_ocl.data.examples.
"""
import sys

from ..data import examples as ex
from ..flags import parse_flags

COMMAND = "data"
SUMMARY = "build the LMDBs the shipped LeNet and CIFAR-10 solvers read"

USAGE = f"""usage: caffe_ocl data mnist [--out DIR]
       caffe_ocl data cifar10 [--source DIR|cifar-10-binary.tar.gz] [--out DIR]
Build the databases models/lenet and models/cifar10_quick train from, at the
paths their prototxts name relative to the current folder (run it from the
clone's root, as `caffe_ocl train` afterwards).
  mnist     the embedded MNIST digits (8,000 train / 2,000 test, as the demo)
            -> {ex.MNIST_DIR}/mnist_train_lmdb, mnist_test_lmdb
  cifar10   CIFAR-10's binary batches -> {ex.CIFAR10_DIR}/cifar10_train_lmdb,
            cifar10_test_lmdb, mean.binaryproto (as Caffe's create_cifar10.sh)
Flags:
  --out DIR      output folder (default: {ex.MNIST_DIR} or {ex.CIFAR10_DIR})
  --source PATH  cifar10 only: folder with data_batch_1.bin ... test_batch.bin
                 or the downloaded .tar.gz (default: {ex.CIFAR10_SOURCE})
                 {ex.CIFAR10_URL}
Example:
  caffe_ocl data mnist && caffe_ocl train --solver models/lenet/lenet_solver.prototxt"""


def main(argv):
    argv = list(argv)
    if not argv or any(a in ("-h", "--help", "-help") for a in argv):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 1
    what, rest = argv[0], argv[1:]
    if what not in ("mnist", "cifar10"):
        print(f"caffe_ocl data: unknown dataset {what!r} (mnist or cifar10)\n\n{USAGE}",
              file=sys.stderr)
        return 1
    spec = {"out": str} if what == "mnist" else {"out": str, "source": str}
    flags, pos = parse_flags(rest, spec, {"out": "", "source": ex.CIFAR10_SOURCE},
                             program=f"caffe_ocl data {what}")
    if pos:
        print(f"caffe_ocl data {what}: unexpected argument {pos[0]!r}\n\n{USAGE}",
              file=sys.stderr)
        return 1
    from ..logs import init_log
    init_log()
    if what == "mnist":
        train, test = ex.build_mnist(flags["out"] or ex.MNIST_DIR,
                                     progress=sys.stderr.isatty())
        print(f"MNIST: {train}, {test}")
    else:
        train, test, mean = ex.build_cifar10(flags["source"], flags["out"] or ex.CIFAR10_DIR)
        print(f"CIFAR-10: {train}, {test}, {mean}")
    return 0
