"""The data side of `caffe_ocl demo` (caffe_ocl/commands/demo.py): LeNet
on the embedded MNIST digits.

Work dir (default ``~/.cache/caffe_ocl/demo``, or ``./caffe_ocl_demo`` when
the home cache is not writable): on the first run the embedded MNIST test
set (caffe_ocl/data/mnist, 10,000 digits) is split into
``mnist_train_lmdb`` (first 8,000) and ``mnist_test_lmdb`` (last 2,000);
later runs reuse them. The shipped ``models/lenet`` net and solver are
copied there with absolute paths (``lenet_train_test.prototxt``,
``lenet_solver.prototxt``; snapshots go to ``lenet_iter_N.*``), training runs
through ``caffe_ocl.training.train`` (the code path of ``caffe_ocl
train``), the Caffe-style log is also written to ``train.log``, and
``lenet_train.png`` plots training loss and test accuracy.
"""
import logging
import os
import shutil

from google.protobuf import text_format

from ..errors import DataError
from ..proto import caffe_pb2, parse_net_text, parse_solver_text
from .db import LMDBReader
from .paths import mnist_dir, models_dir
from .tools import read_idx, write_mnist_lmdb

log = logging.getLogger("caffe_ocl")

N_TRAIN = 8000
N_TEST = 2000


def default_workdir():
    home = os.path.join(os.path.expanduser("~"), ".cache", "caffe_ocl", "demo")
    try:
        os.makedirs(home, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return os.path.abspath("caffe_ocl_demo")


def _db_ok(path, n):
    try:
        with LMDBReader(path) as r:
            return len(r) == n
    except DataError:
        return False


def build_lmdbs(workdir, progress=True):
    """The demo's train/test LMDBs (built once; reused when complete)."""
    md = mnist_dir()
    train_db = os.path.join(workdir, "mnist_train_lmdb")
    test_db = os.path.join(workdir, "mnist_test_lmdb")
    todo = [(p, sl, n) for p, sl, n in ((train_db, slice(0, N_TRAIN), N_TRAIN),
                                        (test_db, slice(N_TRAIN, N_TRAIN + N_TEST), N_TEST))
            if not _db_ok(p, n)]
    if todo:
        images, labels = read_idx(os.path.join(md, "t10k-images-idx3-ubyte.gz"),
                                  os.path.join(md, "t10k-labels-idx1-ubyte.gz"))
        if len(images) < N_TRAIN + N_TEST:
            raise DataError(f"{md}: the embedded MNIST files hold {len(images)} digits, "
                            f"the demo needs {N_TRAIN + N_TEST}")
        for path, sl, n in todo:
            if os.path.exists(path):
                log.info("Rebuilding incomplete %s", path)
                shutil.rmtree(path)
            tmp = f"{path}.tmp-{os.getpid()}"
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
            log.info("Creating %s (%d digits)", path, n)
            write_mnist_lmdb(images[sl], labels[sl], tmp, progress=progress)
            os.rename(tmp, path)
    return train_db, test_db


def write_demo_files(workdir, train_db, test_db, max_iter=0):
    """Copies of models/lenet's net and solver with absolute paths."""
    md = os.path.join(models_dir(), "lenet")
    with open(os.path.join(md, "lenet_train_test.prototxt")) as f:
        net = parse_net_text(f.read(), os.path.join(md, "lenet_train_test.prototxt"))
    for lp in net.layer:
        if lp.type == "Data":
            phase = lp.include[0].phase if len(lp.include) else caffe_pb2.TRAIN
            lp.data_param.source = train_db if phase == caffe_pb2.TRAIN else test_db
    net_path = os.path.join(workdir, "lenet_train_test.prototxt")
    with open(net_path, "w") as f:
        f.write("# written by `caffe_ocl demo` from models/lenet/lenet_train_test.prototxt\n")
        f.write(text_format.MessageToString(net))
    with open(os.path.join(md, "lenet_solver.prototxt")) as f:
        solver = parse_solver_text(f.read(), os.path.join(md, "lenet_solver.prototxt"))
    solver.net = net_path
    solver.snapshot_prefix = os.path.join(workdir, "lenet")
    if max_iter > 0:
        solver.max_iter = max_iter
    solver_path = os.path.join(workdir, "lenet_solver.prototxt")
    with open(solver_path, "w") as f:
        f.write("# written by `caffe_ocl demo` from models/lenet/lenet_solver.prototxt\n")
        f.write(text_format.MessageToString(solver))
    return net_path, solver_path, solver
