"""`caffe_ocl demo`: train LeNet on the embedded MNIST digits.

    caffe_ocl demo [--workdir DIR] [--max_iter N] [--gpu N]

Work dir (default ``~/.cache/caffe_ocl/demo``, or ``./caffe_ocl_demo`` when
the home cache is not writable): on the first run the embedded MNIST test
set (caffe_ocl/data/mnist, 10,000 digits) is split into
``mnist_train_lmdb`` (first 8,000) and ``mnist_test_lmdb`` (last 2,000);
later runs reuse them. The shipped ``models/lenet`` net and solver are
copied there with absolute paths (``lenet_train_test.prototxt``,
``lenet_solver.prototxt``; snapshots go to ``lenet_iter_N.*``), training runs
through ``caffe_ocl.train_cli.train`` (the code path of ``caffe_ocl
train``), the Caffe-style log is also written to ``train.log``, and
``lenet_train.png`` plots training loss and test accuracy.
"""
import logging
import os
import shutil
import sys

from ..errors import DataError
from ..flags import parse_flags
from .paths import mnist_dir, models_dir

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
    from .db import LMDBReader
    try:
        with LMDBReader(path) as r:
            return len(r) == n
    except DataError:
        return False


def build_lmdbs(workdir, progress=True):
    """The demo's train/test LMDBs (built once; reused when complete)."""
    from .tools import read_idx, write_mnist_lmdb
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
    from google.protobuf import text_format
    from ..proto import caffe_pb2, parse_net_text, parse_solver_text
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


def demo_main(argv):
    usage = ("usage: caffe_ocl demo [--workdir DIR] [--max_iter N] [--gpu N]\n"
             "Train LeNet on the embedded MNIST digits (8,000 train / 2,000 test) and\n"
             "plot the run. Default work dir: ~/.cache/caffe_ocl/demo.")
    if any(a in ("-h", "--help", "-help") for a in argv):
        print(usage)
        return 0
    flags, pos = parse_flags(argv, {"workdir": str, "max_iter": int, "gpu": str},
                             {"workdir": "", "max_iter": 0, "gpu": ""}, program="caffe_ocl demo")
    if pos:
        print(usage, file=sys.stderr)
        return 1
    workdir = os.path.abspath(os.path.expanduser(flags["workdir"])) if flags["workdir"] \
        else default_workdir()
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise DataError(f"demo: cannot create work dir {workdir} ({e})") from None
    from ..logs import GlogFormatter, init_log
    init_log()
    log_path = os.path.join(workdir, "train.log")
    fh = logging.FileHandler(log_path, mode="w")
    fh.setFormatter(GlogFormatter())
    log.addHandler(fh)
    try:
        log.info("caffe_ocl demo: work dir %s", workdir)
        train_db, test_db = build_lmdbs(workdir, progress=sys.stderr.isatty())
        _, solver_path, sp = write_demo_files(workdir, train_db, test_db, flags["max_iter"])
        from ..train_cli import train
        solver = train(solver_path, gpu=flags["gpu"])
        if sp.test_interval and solver.iter % sp.test_interval:
            solver.test_all()     # a final test when max_iter is off the test interval
    finally:
        log.removeHandler(fh)
        fh.close()
    from .plot_log import accuracy_name, parse_log, plot
    parsed = parse_log(log_path)
    png = os.path.join(workdir, "lenet_train.png")
    plot(parsed, png, title=f"LeNet on {N_TRAIN} MNIST digits (caffe_ocl demo)")
    name = accuracy_name(parsed["test"])
    acc = [o[name] for _, o in parsed["test"] if name in o] if name else []
    if acc:
        print(f"final test accuracy: {acc[-1]:.4f} ({N_TEST} test digits)")
    else:
        print("no test accuracy was logged")
    print(f"log: {log_path}\nplot: {png}\nweights: {solver.param.snapshot_prefix}_iter_"
          f"{solver.iter}.caffemodel")
    return 0
