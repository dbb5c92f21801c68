"""`caffe_ocl upgrade_solver_proto_text`: upgrade a solver prototxt's solver_type."""
from ..proto.upgrade_files import upgrade_solver_file
from ._common import start_log
from .flags import Arg, Spec

SUMMARY = "upgrade a legacy solver prototxt (solver_type enum -> type) (Caffe's tool)"

SPEC = Spec(
    "caffe_ocl upgrade_solver_proto_text", SUMMARY,
    args=[Arg("solver_proto_file_in", "the solver prototxt to upgrade", check="file"),
          Arg("solver_proto_file_out", "where the upgraded solver is written")],
    example="caffe_ocl upgrade_solver_proto_text old_solver.prototxt solver.prototxt",
    details="The deprecated solver_type enum (SGD, NESTEROV, ...) becomes the type string; "
            "a file already current is written unchanged.")


def main(argv):
    opts = SPEC.parse(argv)
    start_log()
    upgrade_solver_file(opts.args[0], opts.args[1])
    return 0
