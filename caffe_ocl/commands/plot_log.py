"""`caffe_ocl plot_log`: plot loss/accuracy from a Caffe or caffe_ocl training log."""
import os

from ..data.plot_log import drawn_points, parse_log, plot
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
    train, acc, _ = drawn_points(parsed)      # the points drawn (finite ones)
    print(f"{out}: {len(train)} loss points, {len(acc)} test points")
    return 0
