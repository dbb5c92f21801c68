"""`caffe_ocl upgrade_net_proto_binary`: upgrade a legacy (V0/V1) net binary file."""
from ..proto.upgrade_files import upgrade_net_file
from ._common import start_log
from .flags import Arg, Spec

SUMMARY = "upgrade a legacy (V0/V1) net .caffemodel to the current format (Caffe's tool)"

SPEC = Spec(
    "caffe_ocl upgrade_net_proto_binary", SUMMARY,
    args=[Arg("v0_net_proto_file_in", "the net to upgrade (binary format)", check="file"),
          Arg("net_proto_file_out", "where the upgraded net is written (binary format)")],
    example="caffe_ocl upgrade_net_proto_binary old.caffemodel new.caffemodel",
    details="A file already current is written unchanged. The upgrade is the one every "
            "caffe_ocl command applies on reading; this writes it out.")


def main(argv):
    opts = SPEC.parse(argv)
    start_log()
    upgrade_net_file(opts.args[0], opts.args[1], binary=True)
    return 0
