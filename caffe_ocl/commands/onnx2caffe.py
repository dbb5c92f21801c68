"""`caffe_ocl onnx2caffe`: convert an ONNX model to Caffe (prototxt + caffemodel)."""
from ..errors import FlagError
from ..onnx.to_caffe import onnx2caffe   # imports onnx only when converting
from .deps import require
from .flags import Arg, Flag, Spec

SUMMARY = "convert an ONNX model to Caffe (needs caffe_ocl[onnx])"

SPEC = Spec(
    "caffe_ocl onnx2caffe", SUMMARY,
    flags=[Flag("check", bool, False, "run caffe_ocl and onnxruntime on a random input and "
                "print the largest difference per output"),
           Flag("input_shape", str, None, "NAME=D1,D2,... for an input with dynamic "
                "dimensions (repeat for several)", metavar="NAME=DIMS", repeat=True),
           Flag("batch", int, 1, "batch size for a dynamic first dimension"),
           Flag("extension_layers", bool, False, "where no BVLC layer expresses a node, "
                "write caffe_ocl's MatMul (two computed inputs: attention) and the SSD "
                "fork's Permute (any transpose); the files then load in caffe_ocl (and "
                "Permute in SSD Caffe and OpenCV), not in BVLC Caffe")],
    args=[Arg("model", "the .onnx model", check="file"),
          Arg("prototxt", "the net prototxt to write"),
          Arg("caffemodel", "the weights to write")],
    example="caffe_ocl onnx2caffe resnet18.onnx resnet18.prototxt resnet18.caffemodel --check",
    details="Opsets 9-17 as PyTorch exports them; see caffe_ocl/onnx/README.md.")


def parse_shapes(values):
    """["name=1,3,224,224", ...] -> {name: (1, 3, 224, 224)}."""
    shapes = {}
    for v in values:
        if "=" not in v:
            raise FlagError(f"--input_shape expects NAME=D1,D2,..., got {v!r}")
        name, dims = v.split("=", 1)
        try:
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
        except ValueError:
            raise FlagError(f"--input_shape expects NAME=D1,D2,..., got {v!r}") from None
        if not shapes[name] or any(d < 1 or d >= 2**31 for d in shapes[name]):
            raise FlagError(f"--input_shape {v!r}: dimensions must be positive int32 numbers")
    return shapes


def main(argv):
    opts = SPEC.parse(argv)
    shapes = parse_shapes(opts.input_shape)
    if opts.batch < 1:
        raise FlagError(f"--batch must be at least 1, got {opts.batch}")
    require("onnx", "onnx", "caffe_ocl onnx2caffe")
    if opts.check:
        require("onnxruntime", "onnx", "caffe_ocl onnx2caffe --check", pip="onnxruntime")
    model, prototxt, caffemodel = opts.args
    onnx2caffe(model, prototxt, caffemodel, check=opts.check, input_shapes=shapes,
               batch=opts.batch, extension_layers=opts.extension_layers)
    return 0
