"""`caffe_ocl device_query`: list the OpenCL devices and the effective settings."""
from .. import config
from ..device import describe_devices
from .flags import Spec

SUMMARY = "list the OpenCL devices (and the effective CAFFE_OCL_* settings)"

SPEC = Spec("caffe_ocl device_query", SUMMARY, example="caffe_ocl device_query",
            details="The device marked * is the one caffe_ocl uses (CAFFE_OCL_DEVICE "
                    "chooses another).")


def main(argv):
    SPEC.parse(argv)
    print(describe_devices())
    print()
    print("settings (caffe_ocl config):")
    print(config.format_table())
    return 0
