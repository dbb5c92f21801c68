"""`caffe_ocl demo`: train LeNet on the embedded MNIST digits and plot the run."""
import logging
import os
import sys

from ..data.demo import N_TEST, N_TRAIN, build_lmdbs, default_workdir, write_demo_files
from ..data.plot_log import accuracy_name, parse_log, plot
from ..errors import DataError
from ..logs import GlogFormatter
from ..training import train
from ._common import GPU, start_log
from .flags import Flag, Spec

SUMMARY = "train LeNet on the embedded MNIST digits and plot the run"

log = logging.getLogger("caffe_ocl")

SPEC = Spec(
    "caffe_ocl demo", SUMMARY,
    flags=[Flag("workdir", str, "", "where the LMDBs, net, solver, log, plot and snapshots go "
                "(default ~/.cache/caffe_ocl/demo, or ./caffe_ocl_demo)", metavar="DIR"),
           Flag("max_iter", int, 0, "iterations to train (0: the solver's 10000)"),
           GPU],
    example="caffe_ocl demo\ncaffe_ocl demo --max_iter 500 --workdir /tmp/demo",
    details=f"The embedded MNIST test set is split into {N_TRAIN} training and {N_TEST} test "
            "digits (LMDBs built once, reused later); models/lenet is trained on them with "
            "the code path of `caffe_ocl train`; train.log and lenet_train.png are written.")


def main(argv):
    opts = SPEC.parse(argv)
    workdir = os.path.abspath(os.path.expanduser(opts.workdir)) if opts.workdir \
        else default_workdir()
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise DataError(f"demo: cannot create work dir {workdir} ({e})") from None
    start_log()
    log_path = os.path.join(workdir, "train.log")
    fh = logging.FileHandler(log_path, mode="w")
    fh.setFormatter(GlogFormatter())
    log.addHandler(fh)
    try:
        log.info("caffe_ocl demo: work dir %s", workdir)
        train_db, test_db = build_lmdbs(workdir, progress=sys.stderr.isatty())
        _, solver_path, sp = write_demo_files(workdir, train_db, test_db, opts.max_iter)
        solver = train(solver_path, gpu=opts.gpu)
        if sp.test_interval and solver.iter % sp.test_interval:
            solver.test_all()     # a final test when max_iter is off the test interval
    finally:
        log.removeHandler(fh)
        fh.close()
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
