"""`caffe_ocl config`: every CAFFE_OCL_* setting, its effective value and where it came from."""
from .. import config
from .flags import Flag, Spec

COMMAND = "config"
SUMMARY = "print every CAFFE_OCL_* setting, its effective value and its source"

SPEC = Spec("caffe_ocl config", SUMMARY,
            flags=[Flag("all", bool, False, "also list the internal settings")],
            example="caffe_ocl config\nCAFFE_OCL_DEVICE=1 caffe_ocl config",
            details="Sources: default, environment, or set from Python "
                    "(caffe_ocl.config.set/override).")


def main(argv):
    opts = SPEC.parse(argv)
    print(config.format_table(config.describe(include_internal=opts.all)))
    return 0
