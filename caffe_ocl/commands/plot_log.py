"""`caffe_ocl plot_log`: plot loss/accuracy from a Caffe or caffe_ocl training log."""
import os

from ..data.plot_log import accuracy_name, parse_log, plot
from .flags import Arg, Spec

SUMMARY = "plot loss/accuracy from a Caffe or caffe_ocl training log"

SPEC = Spec(
    "caffe_ocl plot_log", SUMMARY,
    args=[Arg("LOG", "a training log (Caffe's glog format)", check="file"),
          Arg("OUT.png", "the picture to write")],
    example="caffe_ocl plot_log train.log train.png",
    details="Training loss (left axis) and test accuracy (right axis) against iterations.")


def main(argv):
    opts = SPEC.parse(argv)
    log_path, out = opts.args
    parsed = parse_log(log_path)
    plot(parsed, out, title=os.path.basename(log_path))
    acc_name = accuracy_name(parsed["test"])
    print(f"{out}: {len(parsed['train'])} loss points, "
          f"{sum(1 for _, o in parsed['test'] if acc_name in o) if acc_name else 0} "
          "test points")
    return 0
