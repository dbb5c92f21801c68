"""`caffe_ocl train`: train a net from a solver prototxt (Caffe's `caffe train`)."""
from ..device import parse_device_ids
from ..errors import FlagError
from ..parallel import launch as par
from ..training import EFFECTS, stages_of, train
from ._common import LEVEL, STAGE, UNTRUSTED, apply_untrusted, require_hdf5_for, start_log
from .deps import require
from .flags import Flag, Spec

SUMMARY = "train a net from a solver prototxt (Caffe's caffe train)"

SPEC = Spec(
    "caffe_ocl train", SUMMARY,
    flags=[Flag("solver", str, "", "the solver prototxt (required)", check="file"),
           Flag("weights", str, "", "pretrained .caffemodel(s) to fine-tune from, "
                "comma-separated", metavar="W1,W2", check="files"),
           Flag("snapshot", str, "", "a .solverstate to resume training from", check="file"),
           Flag("gpu", str, "", "OpenCL device id(s): N, N,M,... (one MPI rank per device, "
                "data-parallel) or all", metavar="ID"),
           LEVEL, STAGE,
           Flag("sigint_effect", str, "stop", "what Ctrl-C does: stop, snapshot or none"),
           Flag("sighup_effect", str, "snapshot", "what SIGHUP does: stop, snapshot or none"),
           UNTRUSTED],
    example="caffe_ocl train --solver models/lenet/lenet_solver.prototxt\n"
            "caffe_ocl train --solver S.prototxt --snapshot lenet_iter_500.solverstate",
    details="Snapshots, test scores and the log are as Caffe writes them; on a terminal a "
            "progress bar shows the iterations.")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    if not opts.solver:
        raise FlagError("Need a solver definition to train (--solver=...).")
    if opts.snapshot and opts.weights:
        raise FlagError("Give a snapshot to resume training or weights to finetune "
                        "but not both.")
    for name in ("sigint_effect", "sighup_effect"):
        if opts[name] not in EFFECTS:
            raise FlagError(f'Invalid signal effect "{opts[name]}" was specified for '
                            f'--{name} (stop, snapshot or none)')
    require_hdf5_for([opts.weights, opts.snapshot], "caffe_ocl train")
    ids = parse_device_ids(opts.gpu) if opts.gpu != "all" else []
    if len(ids) > 1 and not par.launched_size():
        require("mpi4py", "mpi", f"caffe_ocl train --gpu {opts.gpu} (one MPI rank per device)")
    start_log()
    rc = par.maybe_spawn(argv, ids, opts.solver)
    if rc is not None:          # --gpu a,b: ran as one mpiexec rank per device
        return rc
    train(opts.solver, opts.weights or None, opts.snapshot or None,
          gpu=opts.gpu, level=opts.level, stages=stages_of(opts.stage),
          sigint_effect=opts.sigint_effect, sighup_effect=opts.sighup_effect)
    return 0
