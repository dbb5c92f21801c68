"""The `caffe_ocl` command: Caffe's `caffe` tool plus its companions.

    caffe_ocl train --solver S [--weights W | --snapshot S] [--gpu N]
    caffe_ocl test --model M --weights W [--iterations N]
    caffe_ocl time --model M [--iterations N]
    caffe_ocl tune --model M [--phase TRAIN|TEST]   (caffe_ocl's own)
    caffe_ocl device_query
    caffe_ocl <tool> ...      (convert_imageset, compute_image_mean, draw_net, ...)

Every error the library raises on purpose (CaffeOclError) is printed as one
line, and the command exits with status 1, without a traceback.
"""
import importlib
import sys

from .errors import CaffeOclError

# subcommand -> (module, function, one-line help). Each function takes argv
# (the arguments after the subcommand) and returns an exit status.
COMMANDS = {
    "train": ("caffe_ocl.train_cli", "train_main", "train a net from a solver prototxt"),
    "test": ("caffe_ocl.train_cli", "test_main", "score a model with given weights"),
    "time": ("caffe_ocl.timing", "time_main", "time forward/backward per layer"),
    "tune": ("caffe_ocl.tuning", "tune_main",
             "time each convolution's algorithms here and store the fastest"),
    "device_query": ("caffe_ocl.timing", "device_query_main", "list OpenCL devices"),
    "demo": ("caffe_ocl.data.demo", "demo_main",
             "train LeNet on the embedded MNIST digits and plot the run"),
    "data": ("caffe_ocl.commands.data", "main",
             "build the LMDBs the shipped LeNet and CIFAR-10 solvers read"),
    "classify": ("caffe_ocl.classify", "classify_main",
                 "classify images with a Caffe model (default: shipped CIFAR-10 quick)"),
    "convert_imageset": ("caffe_ocl.data.tools", "convert_imageset_main",
                         "write an image list into an LMDB of Datum records"),
    "compute_image_mean": ("caffe_ocl.data.tools", "compute_image_mean_main",
                           "mean image of an LMDB as .binaryproto"),
    "convert_mnist_data": ("caffe_ocl.data.tools", "convert_mnist_data_main",
                           "MNIST IDX files to LMDB"),
    "plot_log": ("caffe_ocl.data.plot_log", "plot_log_main",
                 "plot loss/accuracy from a Caffe or caffe_ocl training log"),
    "draw_net": ("caffe_ocl.draw", "main", "render a net prototxt as an image"),
    "onnx2caffe": ("caffe_ocl.onnx.to_caffe", "main", "convert an ONNX model to Caffe"),
    "caffe2onnx": ("caffe_ocl.onnx.from_caffe", "main", "convert a Caffe model to ONNX"),
}


def usage():
    lines = ["usage: caffe_ocl <command> [args]", "", "commands:"]
    for name, (_, _, help_) in COMMANDS.items():
        lines.append(f"  {name:20s} {help_}")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    cmd = argv[0].lstrip("-")
    if cmd not in COMMANDS:
        print(f"caffe_ocl: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    mod_name, fn_name, _ = COMMANDS[cmd]
    try:
        mod = importlib.import_module(mod_name)
        fn = getattr(mod, fn_name)
    except (ImportError, AttributeError) as e:
        print(f"caffe_ocl {cmd}: not available in this build ({e})", file=sys.stderr)
        return 2
    try:
        rc = fn(argv[1:])
    except CaffeOclError as e:
        print(f"caffe_ocl {cmd}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"caffe_ocl {cmd}: interrupted", file=sys.stderr)
        return 130
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
