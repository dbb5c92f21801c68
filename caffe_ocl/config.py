"""Every setting of caffe_ocl, declared once.

Each setting has a name, a type, a default and one line saying what it
does. Its value comes from, in order: an override set from Python
(``config.override``/``config.set``, what benchmarks and pycaffe calls such
as ``caffe.set_allow_tf32`` use), the environment variable ``CAFFE_OCL_<NAME>``,
the default. Values are read when asked for (not cached at import), so a
variable set before a net is built takes effect for that net.

One parser for every variable: booleans take 1/0, true/false, yes/no, on/off
(any case); a value it cannot read is a ``ConfigError`` naming the variable
and what it accepts, never a silent default.

``caffe_ocl config`` (and ``device_query``) print the effective values:
``describe()``.

This module imports nothing of caffe_ocl but ``errors``: every other module
may read settings from it.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from .errors import CaffeOclError

PREFIX = "CAFFE_OCL_"


class ConfigError(CaffeOclError):
    """An environment variable or override holds a value its setting cannot take."""


@dataclass(frozen=True)
class Setting:
    name: str            # e.g. "FOLD"; the variable is CAFFE_OCL_FOLD
    kind: str            # bool | tristate | int | float | str | choice | path
    default: object
    doc: str
    choices: tuple = ()
    internal: bool = False   # set by caffe_ocl itself (e.g. for child processes)

    @property
    def env(self):
        return PREFIX + self.name


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

_DECLARED = (
    # device and programs
    Setting("DEVICE", "str", None,
            "OpenCL device: index from device_query, P:D (platform:device), a name "
            "fragment, or a comma list (one entry per local MPI rank)"),
    Setting("CACHE", "path", os.path.join(os.path.expanduser("~"), ".cache", "caffe_ocl"),
            "folder of compiled kernel binaries and tuned choices; empty switches both off"),
    Setting("VERBOSE", "bool", False,
            "show OpenCL compiler warnings while kernels build"),
    Setting("PROFILE", "bool", False,
            "create the command queue with profiling on (per-kernel times)"),
    Setting("POCL_AFFINITY", "bool", True,
            "let caffe_ocl set POCL_AFFINITY=1 on PoCL when the process may run on "
            "every CPU (off: leave PoCL as it is)"),
    Setting("MODELS", "path", None,
            "extra folder searched first for the shipped model prototxts"),
    # algorithms
    Setting("TF32", "bool", False,
            "let convolutions and matrix products use TF32 tensor cores on NVIDIA "
            "(like PyTorch's allow_tf32)"),
    Setting("TF32_ASYNC", "bool", True,
            "TF32 GEMM tiles load the next K block asynchronously (off: plain loads)"),
    Setting("WINOGRAD", "tristate", None,
            "force Winograd convolution on (1) or off (0) where it applies; "
            "unset: the rules / tuned choice decide"),
    Setting("WINOGRAD_TILE", "choice", "4",
            "Winograd output tile: 4 = F(4x4,3x3), 2 = the more accurate F(2x2,3x3)",
            choices=("2", "4")),
    Setting("WINOGRAD_TILE_TF32_TRAIN", "choice", "2",
            "Winograd 3x3 output tile of a TRAIN net's forwards where the GEMMs "
            "run in TF32: 2 = F(2x2,3x3), whose TF32 error is ~1.5x a direct TF32 "
            "convolution's (F(4x4,3x3): ~10x, which put ResNet-18's gradients 3x "
            "further from float64 than cuDNN's); 4 = WINOGRAD_TILE's speed",
            choices=("2", "4")),
    Setting("WINOGRAD_BWD_WEIGHT", "bool", True,
            "Winograd layers also compute the weight gradient by Winograd "
            "(off: the dense weight gradient)"),
    # pycaffe (issue #24)
    Setting("DETERMINISTIC", "bool", False,
            "batch-invariant results: convolution/matrix-product algorithms and tiles "
            "chosen from per-image geometry only, no split-K (caffe.set_deterministic)"),
    Setting("TUNED", "bool", True,
            "use the convolution algorithms stored by `caffe_ocl tune` for this device"),
    # graph planning
    Setting("FOLD", "bool", True,
            "fold BatchNorm/Scale/activation into the convolution at TEST (inference plan)"),
    # graph rewrites (issue #27, plan/concat.py ...)
    Setting("CONCAT_IN_PLACE", "bool", True,
            "at TEST, convolutions write a Concat's inputs straight into its top "
            "(with CAFFE_OCL_FOLD)"),
    # Concat copies (issue #27 item 3: fewer launches, plan/concat.py)
    Setting("CONCAT_PREFIX", "bool", True,
            "a Concat whose first inputs are an earlier Concat's inputs copies that Concat's "
            "top as one block, consecutive Slices of one blob copy in one launch (at TEST "
            "with CAFFE_OCL_FOLD, at TRAIN with CAFFE_OCL_FUSE_TRAIN)"),
    Setting("CONCAT_SHARE", "bool", True,
            "at TEST, growing Concats (DenseNet's; one image, or along images) keep their tops "
            "in one buffer, each top the start of the next, and copy only their new inputs "
            "(with CAFFE_OCL_CONCAT_IN_PLACE)"),
    Setting("AFFINE_NEW_TOPS", "bool", True,
            "at TEST, BatchNorm -> Scale -> ReLU chains writing new tops (ONNX's form) run "
            "as one pass (with CAFFE_OCL_FOLD)"),
    Setting("FUSE_SE_SCALE", "bool", False,
            "at TEST, an SE block's channel Scale folds into the 1x1 convolution after it "
            "where one gate serves the batch (with CAFFE_OCL_FOLD; off: measured slower "
            "end to end on the CPU, see BENCHMARKS.md)"),
    Setting("SE_GATED_1X1", "bool", True,
            "at TEST on GPUs, an SE block's channel Scale before a 1x1 convolution that the "
            "few-outputs kernel runs is applied by that kernel to its weights as it reads "
            "them: one launch for the two layers (with CAFFE_OCL_FOLD); on CPU drivers the "
            "same where a channel-vector kernel runs the convolution (1x1 layers on planes "
            "of up to 196 pixels) or the 1x1 kernel reading the images (larger planes, at "
            "most 10 K weights)"),
    Setting("FOLD_NEW_TOPS", "bool", True,
            "at TEST, a BatchNorm (global statistics) -> Scale -> activation chain after a "
            "Convolution / InnerProduct in which some layers write new tops (BatchNorm's "
            "output a new blob, e.g. shicai's MobileNet v2; Scale or the ReLU into a new top) "
            "is folded into the producer as an in-place chain is (the blobs before the last "
            "computed when read) instead of running as passes of their own (with "
            "CAFFE_OCL_FOLD)"),
    Setting("FUSE_DW_POINTWISE", "bool", False,
            "at TEST on GPUs, a depthwise convolution (its BatchNorm / Scale / activation "
            "folded) whose output only a 1x1 convolution run by the few-outputs kernel reads "
            "(batch 1 on small planes: the mobile nets' blocks) is computed by that kernel "
            "where it loads its input: one launch for the two layers (with CAFFE_OCL_FOLD). "
            "Off by default: measured level or slower on the H100 (the kernel computes each "
            "depthwise output again for every 8 output channels)"),
    Setting("FUSE_SE_SQUEEZE", "bool", True,
            "at TEST (at most 4 images), an SE block's global pooling and its two "
            "products with their activations run as one launch (plan/se_squeeze.py; with "
            "CAFFE_OCL_FOLD; CPU drivers: inputs of at most 2^17 floats an image)"),
    # channel permutations (issue #27, plan/permute.py)
    Setting("PERMUTE_GATHER", "bool", True,
            "at TEST, a 1x1 convolution / InnerProduct whose weight is a permutation "
            "matrix (converted channel shuffles) runs as a channel gather (with CAFFE_OCL_FOLD)"),
    Setting("FUSE_RESIDUAL", "bool", True,
            "at TEST, a convolution or fully-connected layer whose output an Eltwise SUM "
            "adds to a shortcut (a residual block's end, -> activation) adds it in its own "
            "epilogue, writing the sum (plan/residual.py; with CAFFE_OCL_FOLD)"),
    Setting("CONCAT_GATHER", "bool", True,
            "a Concat along channels whose top only a channel permutation reads (ShuffleNet's "
            "concat -> shuffle) runs with it as one gather from the Concat's inputs, the "
            "Concat's top computed when read (plan/permute.py); off: the Concat writes its "
            "top and the gather reads it"),
    Setting("SIBLING_CONVS", "bool", True,
            "at TEST on GPUs, convolutions reading the same blob whose outputs (each with "
            "the same activation) make up a Concat (SqueezeNet's fire module: 1x1 and 3x3) "
            "run as one convolution of the larger window writing the Concat's top, where "
            "the outputs are batch-1 size (plan/siblings.py; with CAFFE_OCL_FOLD)"),
    Setting("GATHER_SLICES", "bool", True,
            "a channel gather (CAFFE_OCL_PERMUTE_GATHER) whose top only the Slice layers "
            "right after it read (ShuffleNet v2's shuffle -> channel split) writes the "
            "Slices' tops itself in its one launch, its own top computed when read "
            "(plan/permute.py GatherSlices); off: the gather writes its top and the Slices "
            "copy from it"),
    Setting("FUSE_SWISH", "bool", True,
            "at TEST, Swish / ONNX's Sigmoid * x / Sigmoid after a convolution or "
            "InnerProduct run in its epilogue (with CAFFE_OCL_FOLD)"),
    Setting("FUSE_POINTWISE", "bool", True,
            "at TEST, a run of three or more element-wise layers (neurons, Eltwise, "
            "Split; a converted GELU) runs as one generated kernel (plan/pointwise.py; "
            "with CAFFE_OCL_FOLD)"),
    Setting("FUSE_PRODUCT_CHAIN", "bool", True,
            "at TEST, a run of element-wise layers that FUSE_POINTWISE makes one kernel "
            "and whose one input is the top of the InnerProduct right before it (a "
            "transformer MLP's GELU) is computed in that product's GEMM epilogue instead "
            "(plan/pointwise.py; with CAFFE_OCL_FOLD and CAFFE_OCL_FUSE_POINTWISE)"),
    Setting("FUSE_MATMUL_OPERANDS", "bool", True,
            "at TEST, a MatMul's GEMM reads its operands past the Reshape, Permute, Slice "
            "and scaling Power layers that only move them (attention's qkv split, q * "
            "scale, K^T) as strided views, and a Permute merging attention's heads right "
            "after it is its output layout (plan/matmul_operands.py; with CAFFE_OCL_FOLD)"),
    Setting("FUSE_SLICE_CONCAT", "bool", True,
            "at TEST, a Concat of Slices of one blob along the same axis (a roll: Swin's "
            "shifted windows) runs as one gather (plan/slice_concat.py; with "
            "CAFFE_OCL_FOLD)"),
    Setting("FUSE_ROW_REDUCE", "bool", True,
            "at TEST, per-row reductions (Reduction, a 1x1 mean Convolution) and the "
            "element-wise, Scale/Bias, Tile and view layers around them (a LayerNorm in "
            "Caffe layers) run as one generated kernel (plan/row_reduce.py; with "
            "CAFFE_OCL_FOLD)"),
    Setting("FUSE_PRELU", "bool", True,
            "at TEST, a PReLU after a convolution or InnerProduct (and its BatchNorm / "
            "Scale) runs in its epilogue, the slopes beside the bias (with CAFFE_OCL_FOLD)"),
    Setting("FUSE_TRAIN", "bool", True,
            "fused kernels for TRAIN nets (BatchNorm->Scale->ReLU, Eltwise->ReLU, ...)"),
    Setting("NEW_TOP_TAILS", "bool", True,
            "at TRAIN, ResNet block ends in ONNX's form: an Eltwise SUM -> ReLU writing a "
            "new top runs as one kernel each way, the sum computed when read "
            "(plan/eltwise.py), and after a BatchNorm -> Scale writing new tops the "
            "block's backward is one split reduction and one pass (plan/train.py "
            "NewTopResidualTail); with CAFFE_OCL_FUSE_TRAIN"),
    Setting("SHARE_DIFFS", "bool", True,
            "a Solver's net shares activation-gradient buffers between blobs "
            "(off: one diff per blob, as Caffe)"),
    Setting("PARAM_ARENA", "bool", True,
            "a Solver keeps all parameters in one device buffer (one update launch)"),
    # training
    Setting("CHECK_FINITE", "bool", False,
            "stop training at the first non-finite output, naming layer and blob "
            "(as debug_info: true)"),
    # multi-device training
    Setting("MPI", "bool", False,
            "treat this process as an MPI rank even when no launcher variable says so"),
    Setting("MPIEXEC", "path", None,
            "mpiexec program used to launch ranks for --gpu a,b (default: found on PATH)"),
    Setting("REDUCE", "choice", None,
            "gradient reduction path: shm (one machine, default there) or mpi",
            choices=("shm", "mpi")),
    Setting("STAGING", "choice", None,
            "shared-memory staging of gradients: hostptr (default on GPUs) or plain",
            choices=("hostptr", "plain")),
    Setting("BUCKET_MB", "float", None,
            "gradient bucket size in MiB reduced while backward runs (0: one per "
            "layer; default 1 on GPUs, one bucket after backward on CPUs)"),
    Setting("PARALLEL_DUMP", "path", None,
            "folder where every rank writes its final weights (multi-rank tests)"),
    # robustness: memory budget, bounded queues, untrusted models (issue #25)
    Setting("MEMORY_LIMIT_MB", "float", None,
            "most device memory (MiB) caffe_ocl allocates at once; default: the "
            "device's global memory (an allocation past it is an error naming both)"),
    Setting("HOST_MEMORY_LIMIT_MB", "float", None,
            "most host memory (MiB) for one host copy of a blob; default: the "
            "machine's physical memory"),
    Setting("UNTRUSTED", "bool", False,
            "treat models as untrusted: refuse Python layers and layers that write "
            "files (HDF5Output)"),
    Setting("SPAWNED", "bool", False,
            "set by `train --gpu a,b` in the ranks it launches", internal=True),
    # lib: kernel-variant switches that benchmarks and tests flip (A/B of one
    # implementation choice; the defaults are the measured best)
    Setting("GEMM_READ_AHEAD", "bool", True,
            "GEMM tiles read the old C values (beta != 0) ahead of their stores "
            "(off: each right before its store)", internal=True),
    Setting("GEMM_VSTORE4", "bool", True,
            "GPU GEMM tiles with the staged store write 4 adjacent results per "
            "16-byte store where C's rows are 16-byte aligned (off: one float "
            "per store)", internal=True),
    Setting("TF32_EMULATE", "bool", False,
            "tests: build the TF32 tensor-core tiling with an emulated mma on any "
            "device (slow, exact TF32 rounding)", internal=True),
    Setting("CPU_PACKED_COLUMNS", "bool", True,
            "CPU drivers: convolution forward reads packed column panels straight "
            "from the images (off: im2col into a column buffer, then a GEMM)",
            internal=True),
    Setting("FOLDED_WEIGHT_GEMM", "bool", True,
            "GPUs, TF32: 1x1 stride-1 weight gradients as one GEMM with the images "
            "folded into K (off: the implicit-GEMM kernel)", internal=True),
    Setting("GEMM_1X1", "bool", True,
            "GPU 1x1 convolutions with enough input channels run as plain GEMMs "
            "(off: the implicit-GEMM kernel)", internal=True),
    Setting("GEMM_GATHERED_CONV", "bool", True,
            "GPUs, TF32: k x k convolution forwards with at least 512 output channels "
            "gather their columns into rows over the batch and run the async GEMM, and "
            "strided k x k backward-data with at least 64 output channels runs the "
            "columns' gradient as that GEMM then col2im (off: the implicit-GEMM "
            "kernel)", internal=True),
    Setting("POOL_BWD_TILES", "bool", True,
            "GPU max-pooling backward in its scatter form where the windows tile "
            "the input (kernel = stride, no padding)", internal=True),
    Setting("POOL_BWD_BLOCKS", "bool", True,
            "GPU max-pooling backward by 2 x 2 blocks of inputs per work-item for "
            "strides >= 2 (off: one input per work-item)", internal=True),
    Setting("SKIP_UNREAD_MASK", "bool", True,
            "max pooling does not write its argmax mask when no backward reads it",
            internal=True),
    # lib: progress lines
    Setting("PROGRESS", "choice", "auto",
            "progress of long work (kernel compilation on a cold cache): auto (a bar "
            "on a terminal, plain lines otherwise), bar, lines, or off",
            choices=("auto", "bar", "lines", "off")),
    # gpu: small-batch kernel choices (issue #27)
    Setting("CONV_SPLITK", "bool", True,
            "GPU implicit-GEMM convolution forwards whose output tiles cannot fill the "
            "device split K over work-groups (off: one pass)", internal=True),
    Setting("CONV_PRUNE_TAPS", "bool", True,
            "convolution forwards whose outer kernel taps read only zero padding for every "
            "output (dilated layers on small planes: DeepLab's ASPP) run with the live "
            "window of the kernel alone (off: every tap)"),
    Setting("CPU_DIRECT_CONV", "bool", True,
            "CPU drivers: convolution forwards of at most 4 input channels (a net's first "
            "layer; 17-32 output channels only up to 4 images, at stride 2 up to 64 at any "
            "batch) run a direct kernel instead of the GEMM (off: the GEMM)", internal=True),
    Setting("GROUPED_DIRECT", "bool", True,
            "GPUs: forwards of grouped convolutions with at most 16 channels per group "
            "(ResNeXt, RegNet) run a direct kernel instead of the implicit GEMM (off: the "
            "implicit GEMM)", internal=True),
    Setting("CONV_SMALL_TILES", "bool", True,
            "GPU implicit-GEMM convolution forwards in FP32 whose tiles leave most compute "
            "units idle run 64 x 64 tiles of 4 x 4 results per work-item (off: always "
            "128-column tiles of 8 x 8)", internal=True),
    Setting("CONV_NARROW_TILES", "bool", True,
            "GPU implicit-GEMM convolution forwards in FP32 with at most 32 output channels "
            "(per group; more than 16 only for products of depth 64 or more) run 32 x 256 "
            "tiles, where 64-row tiles would compute at least twice the rows needed (off: "
            "64-row tiles)", internal=True),
    Setting("CONV_SPLITK_MIN_KTILES", "int", 8,
            "fewest 16-deep steps of the main loop per K slice of a split-K convolution "
            "forward (CONV_SPLITK)", internal=True),
    Setting("FORWARD_TRACE", "bool", True,
            "a TEST net's forward from its first layer, once two passes ran alike, is "
            "replayed from the recorded launches while no shape, memory or weight changed "
            "(plan/trace.py); off: every pass walks the layers"),
    Setting("SHARE_ACTIVATIONS", "tristate", None,
            "a replayed TEST forward runs on activation buffers shared by blobs whose "
            "lifetimes do not overlap, recomputing an intermediate blob when it is read "
            "(plan/activations.py); unset: on CPU devices, 1: every device, 0: off"),
    Setting("DIRECT_ENQUEUE", "bool", True,
            "kernel launches call clEnqueueNDRangeKernel through ctypes without an event "
            "(pyopencl's call asks the driver for one each time; see cl_enqueue.py); "
            "off: every launch through pyopencl"),
    Setting("GEMV", "bool", True,
            "GPU fully-connected products with at most 8 rows (batch) run as a "
            "matrix-vector kernel (off: the tiled GEMM)", internal=True),
    Setting("WINOGRAD_OCCUPANCY", "bool", True,
            "GPUs: the automatic Winograd choice weighs how much of the GEMM tiles "
            "Winograd and the implicit GEMM fill (off: the arithmetic model alone)",
            internal=True),
    Setting("CONV_1X1_FEW", "bool", True,
            "GPUs: 1x1 convolutions whose output is a few tiles (batch 1 on small "
            "planes) and of at most 32 million multiply-adds run kernels/conv1x1_few.cl, "
            "K split over each work-group's work-items, instead of the implicit GEMM's "
            "tiles", internal=True),
    Setting("GEMM_TILES", "choice", "rule",
            "GPUs, FP32 fully-connected and MatMul products: the tile gemm.cl runs -- "
            "rule (ops.gemm.fill_tiles: 64 x 64 for at most 64 columns or under half a "
            "wave of usual tiles, 64 x 128 between one and two waves, else the usual), "
            "usual (128 x 128, or 64 x 128 for at most 64 rows), rows64 or small",
            internal=True, choices=("rule", "usual", "rows64", "small")),
    Setting("GPU_TILE_RASTER", "int", 8,
            "GPUs: the tile kernels (gemm.cl, conv_igemm.cl) start their work-groups "
            "in bands of this many rows of tiles, row fastest, so that a block of B "
            "read from memory serves every row of a band from L2 (1: plain order)",
            internal=True),
    Setting("WINOGRAD_MIN_MFLOP", "int", 500,
            "GPUs: fewest MFLOP of a convolution (direct count, whole batch) for the "
            "automatic Winograd choice: below it the three extra launches cost more "
            "than the arithmetic saves (0: no floor)", internal=True),
    # cold start: caffe_ocl's own binary cache (issue #23 item 6)
    Setting("BINARY_CACHE", "tristate", None,
            "store compiled kernel binaries in CAFFE_OCL_CACHE (1) or not (0); unset: "
            "not on PoCL while its own kernel cache is on (fetching a PoCL binary "
            "generates code for every kernel of the program), yes elsewhere"),
    # cpu: CPU kernel choices (issue #27 item 4)
    Setting("CPU_PACKED_WEIGHTS", "bool", True,
            "CPU drivers, inference (TEST) nets: convolution weights are packed once "
            "into the CPU GEMM's panel layout (Winograd layers: their filter transform "
            "kept; fully-connected layers over at least 9 rows with weights of at "
            "most 64 MB: likewise packed), again only after they change (one more "
            "copy of each such layer's weights in memory); off: every GEMM packs them "
            "in each block, Winograd transforms them in every pass"),
    Setting("GPU_KEEP_WINOGRAD_FILTERS", "bool", True,
            "GPUs, inference (TEST) nets: Winograd layers keep their filter transform "
            "(16/9 of the layer's weights at F(2x2), 36/9 at F(4x4) more device memory), "
            "redone only after the weights change; off: transformed in every pass (one "
            "launch more per Winograd layer and forward)"),
    Setting("CPU_COLUMNS_ONCE", "bool", True,
            "CPU drivers: a convolution whose GEMM has several blocks of output rows "
            "packs its columns (from the images) once before the product, into shared "
            "scratch, instead of in every block (off: in every block)"),
    Setting("CPU_CHANVEC", "bool", True,
            "CPU drivers, inference: convolutions of small output planes (1x1 "
            "kernels: 7 x 7, or 14 x 14 from 128 input channels, not strided on AVX2; "
            "larger kernels: up to 28 x 28, on AVX2 at batch 1-2 any plane that Winograd "
            "does not take) run vectorized over output channels, their "
            "weights packed once (off: the CPU GEMM, vectorized over pixels)"),
    Setting("CPU_CHANVEC_TILE8", "bool", True,
            "CPU drivers with 16-float vectors (AVX-512): those channel-vectorized "
            "convolutions with 1x1 kernels on planes of at least 100 pixels or with "
            "at least 1024 input channels run tiles of 8 pixels x 32 channels (off: "
            "6 x 32)", internal=True),
    Setting("CPU_CHANVEC_GROUPS", "bool", True,
            "CPU drivers, inference: grouped convolutions with kernels larger than 1x1 "
            "(ResNeXt, RegNet) run vectorized over each group's output channels, on any "
            "plane (off: the GEMM, one product per group)",
            internal=True),
    Setting("CPU_CHANVEC_GROUP_PAIRS", "bool", True,
            "CPU drivers: those grouped convolutions whose groups have at most one "
            "vector's worth of output channels (RegNet's 8, ResNeXt-50's 4 and 8 at "
            "AVX2) put two groups in each 2-vector panel of channels (off: one group a "
            "panel, the rest of its lanes idle)", internal=True),
    Setting("CPU_WINO_RUNS", "bool", True,
            "CPU drivers: Winograd F(4x4) forwards whose output rows hold fewer than 8 "
            "tiles (outputs under 32 wide) transform their outputs 8 tiles at a time "
            "across rows and images (off: one tile at a time)", internal=True),
    Setting("CPU_CHANVEC_KBLOCK", "int", 0,
            "CPU drivers: channel-vectorized 1x1 convolutions walk their input "
            "channels in blocks of this many, each block's weights staying in cache "
            "while every pixel tile of the chunk reads them (0: automatic -- blocks of "
            "128 with 8-float vectors (AVX2), one block with 16-float ones (AVX-512), "
            "where blocks were no win; BENCHMARKS.md twenty-first and twenty-ninth "
            "sessions)",
            internal=True),
    Setting("CPU_POOL_BANDS", "bool", True,
            "CPU drivers: max pooling without an argmax mask (inference) and average "
            "pooling (not global) run on bands of input rows padded with -FLT_MAX / "
            "zeros, 8 outputs at a time everywhere (off: the edge windows one output "
            "at a time; average pooling every output one at a time)"),
    Setting("CPU_GEMM_VW", "choice", "auto",
            "CPU drivers: vector width of the CPU GEMM's micro-kernel, 16 (6 x 32 tiles, for "
            "512-bit vector units) or 8 (6 x 16); auto: 16 where the device prefers "
            "16-float vectors (AVX-512), else 8",
            choices=("auto", "8", "16")),
    # fork layers and real-model checks (issue #23)
    Setting("TEST_MODELS", "path", None,
            "folder of real published models (NAME.prototxt + NAME.caffemodel) that "
            "tests compare with OpenCV; tests needing them skip when it is unset"),
)

SETTINGS = {s.name: s for s in _DECLARED}

_overrides: dict[str, object] = {}


def _setting(name):
    key = name[len(PREFIX):] if name.startswith(PREFIX) else name
    try:
        return SETTINGS[key]
    except KeyError:
        raise ConfigError(f"unknown setting {name!r}; known: "
                          f"{', '.join(sorted(SETTINGS))}") from None


def parse(setting, raw):
    """The typed value of the string ``raw`` for ``setting`` (ConfigError if
    it cannot be read). An empty string means the default."""
    s = setting
    v = raw.strip()
    if v == "":
        # an empty path is a choice (CAFFE_OCL_CACHE= switches the cache off)
        return "" if s.kind == "path" else s.default
    low = v.lower()
    if s.kind in ("bool", "tristate"):
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"{s.env}={raw!r}: expected 1/0 (true/false, yes/no, on/off)")
    if s.kind == "int":
        try:
            return int(v)
        except ValueError:
            raise ConfigError(f"{s.env}={raw!r}: expected an integer") from None
    if s.kind == "float":
        try:
            return float(v)
        except ValueError:
            raise ConfigError(f"{s.env}={raw!r}: expected a number") from None
    if s.kind == "choice":
        if low not in s.choices:
            raise ConfigError(f"{s.env}={raw!r}: expected one of {', '.join(s.choices)}")
        return low
    return v                                   # str / path


def get(name, environ=None):
    """The effective value of a setting (``name`` with or without the
    CAFFE_OCL_ prefix). ``environ`` replaces os.environ (for tests)."""
    s = _setting(name)
    if environ is None and s.name in _overrides:
        return _overrides[s.name]
    env = os.environ if environ is None else environ
    raw = env.get(s.env)
    if raw is None:
        return s.default
    return parse(s, raw)


def is_set(name, environ=None):
    """Whether the user chose a value (an override, or the variable is set
    and not empty), as opposed to the default applying."""
    s = _setting(name)
    if environ is None and s.name in _overrides:
        return True
    env = os.environ if environ is None else environ
    return bool(env.get(s.env, "").strip())


def set(name, value):  # noqa: A001  (the module's own namespace)
    """Override a setting for this process (None removes the override)."""
    s = _setting(name)
    if value is None:
        _overrides.pop(s.name, None)
        return
    raw = ("1" if value else "0") if isinstance(value, bool) else str(value)
    _overrides[s.name] = parse(s, raw)


@contextlib.contextmanager
def override(**values):
    """``with config.override(FOLD=False, WINOGRAD=True): ...``: settings
    for the block, restored afterwards (benchmarks switch variants this way)."""
    saved = {}
    for k, v in values.items():
        s = _setting(k)
        saved[s.name] = _overrides.get(s.name, _MISSING)
        set(s.name, v)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is _MISSING:
                _overrides.pop(k, None)
            else:
                _overrides[k] = old


_MISSING = object()


def describe(include_internal=False):
    """Rows (variable, effective value, where it came from, what it does)."""
    rows = []
    for s in _DECLARED:
        if s.internal and not include_internal:
            continue
        if s.name in _overrides:
            src = "set from Python"
        elif os.environ.get(s.env, "").strip():
            src = "environment"
        else:
            src = "default"
        try:
            val = get(s.name)
        except ConfigError as e:
            val, src = f"<invalid: {e}>", "environment"
        rows.append((s.env, val, src, s.doc))
    return rows


def format_table(rows=None):
    rows = describe() if rows is None else rows
    width = max(len(r[0]) for r in rows)
    out = []
    for env, val, src, doc in rows:
        shown = "(unset)" if val is None else str(val)
        out.append(f"{env:<{width}}  {shown:<12} [{src}]  {doc}")
    return "\n".join(out)


def markdown_table():
    """README.md's table of every setting (internal ones marked), generated
    from the declarations; tests/test_config.py checks README against it and
    ``python3 tools/settings_table.py`` rewrites it there."""
    out = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    for s in _DECLARED:
        kind = "1/0" if s.kind == "bool" else (
            "unset/1/0" if s.kind == "tristate" else (
                " / ".join(s.choices) if s.kind == "choice" else s.kind))
        if s.name == "CACHE":
            default = "`~/.cache/caffe_ocl`"
        elif s.default is None:
            default = "unset"
        elif isinstance(s.default, bool):
            default = "1" if s.default else "0"
        else:
            default = f"`{s.default}`"
        doc = s.doc.replace("|", "\\|") + (" *(internal)*" if s.internal else "")
        out.append(f"| `{s.env}` | {kind} | {default} | {doc} |")
    return "\n".join(out)

