"""`caffe_ocl draw_net`: render a net prototxt as an image (Graphviz)."""
from ..draw import draw_net_to_file
from ..errors import FlagError
from ..proto import caffe_pb2, read_net_prototxt
from .deps import require, require_program
from .flags import Arg, Flag, Spec

SUMMARY = "render a net prototxt as an image (needs caffe_ocl[draw] and Graphviz)"

PHASES = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST, "ALL": None}
SOURCE_ONLY = ("raw", "dot", "gv")       # Graphviz source: no rendering

SPEC = Spec(
    "caffe_ocl draw_net", SUMMARY,
    flags=[Flag("rankdir", str, "LR", "TB (top-bottom), BT, LR (left-right) or RL"),
           Flag("phase", str, "ALL", "which layers: TRAIN, TEST or ALL"),
           Flag("display_lrm", bool, False, "show the learning rate multipliers of the "
                "learning layers when non-zero")],
    args=[Arg("input_net_proto_file", "the net prototxt", check="file"),
          Arg("output_image_file", "the image to write; its extension names the format "
              "(png, svg, pdf...; .raw: the Graphviz source; .dot: Graphviz's laid-out "
              "source, the plain source without Graphviz)")],
    example="caffe_ocl draw_net models/lenet/lenet_train_test.prototxt lenet.png",
    details="Needs pydot (pip install 'caffe_ocl[draw]') and Graphviz's dot program "
            "(apt-get install graphviz) for pictures.")


def main(argv):
    opts = SPEC.parse(argv)
    src, out = opts.args
    phase = opts.phase.upper()
    if phase not in PHASES:
        raise FlagError(f"Unknown phase: {opts.phase} (expected TRAIN, TEST or ALL)")
    net = read_net_prototxt(src)      # a bad net is named before a missing package
    require("pydot", "draw", "caffe_ocl draw_net", alternatives=("pydotplus",))
    ext = out.rsplit(".", 1)[-1].lower() if "." in out else ""
    if ext not in SOURCE_ONLY:
        require_program("dot", "install Graphviz (apt-get install graphviz, brew install "
                        "graphviz), or write the Graphviz source to a .dot file",
                        "caffe_ocl draw_net")
    print(f"Drawing net to {out}")
    draw_net_to_file(net, out, opts.rankdir, PHASES[phase], opts.display_lrm)
    return 0
