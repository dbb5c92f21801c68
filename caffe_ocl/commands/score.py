"""`caffe_ocl test`: score a model with given weights (Caffe's `caffe test`)."""
from ..errors import FlagError
from ..training import score, stages_of
from ._common import GPU, LEVEL, STAGE, UNTRUSTED, apply_untrusted, require_hdf5_for, start_log
from .flags import Flag, Spec

COMMAND = "test"
SUMMARY = "score a model with given weights (Caffe's caffe test)"

SPEC = Spec(
    "caffe_ocl test", SUMMARY,
    flags=[Flag("model", str, "", "the net prototxt (TEST phase; required)", check="file"),
           Flag("weights", str, "", "trained .caffemodel(s), comma-separated (required)",
                metavar="W1,W2", check="files"),
           Flag("iterations", int, 50, "batches to run"),
           GPU, LEVEL, STAGE, UNTRUSTED],
    example="caffe_ocl test --model models/cifar10_quick/cifar10_quick_train_test.prototxt "
            "--weights W.caffemodel --iterations 100",
    details="Logs each batch's outputs and their means, as Caffe does.")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    if not opts.model:
        raise FlagError("Need a model definition to score (--model=...).")
    if not opts.weights:
        raise FlagError("Need model weights to score (--weights=...).")
    require_hdf5_for([opts.weights], "caffe_ocl test")
    start_log()
    score(opts.model, opts.weights, opts.iterations, gpu=opts.gpu, level=opts.level,
          stages=stages_of(opts.stage))
    return 0
