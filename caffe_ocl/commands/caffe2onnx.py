"""`caffe_ocl caffe2onnx`: export a Caffe model to ONNX (opset 13)."""
from ..onnx.from_caffe import caffe2onnx   # imports onnx only when converting
from .deps import require
from .flags import Arg, Flag, Spec
from ._common import UNTRUSTED, apply_untrusted

SUMMARY = "convert a Caffe model to ONNX (needs caffe_ocl[onnx])"

SPEC = Spec(
    "caffe_ocl caffe2onnx", SUMMARY,
    flags=[Flag("check", bool, False, "run caffe_ocl and onnxruntime on a random input and "
                "print the largest difference per output"),
           UNTRUSTED],
    args=[Arg("prototxt", "the deploy net prototxt", check="file"),
          Arg("caffemodel", "its weights", check="file"),
          Arg("onnx", "the .onnx file to write")],
    example="caffe_ocl caffe2onnx deploy.prototxt weights.caffemodel model.onnx --check")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    require("onnx", "onnx", "caffe_ocl caffe2onnx")
    if opts.check:
        require("onnxruntime", "onnx", "caffe_ocl caffe2onnx --check", pip="onnxruntime")
    prototxt, caffemodel, out = opts.args
    caffe2onnx(prototxt, caffemodel, out, check=opts.check)
    return 0
