"""TEST-phase layer folding: BatchNorm/Scale into the producer's weights,
activations into the producer's GEMM epilogue.

What is folded
--------------
A chain is a producer -- ``Convolution`` (not Deconvolution, one bottom and
one top) or ``InnerProduct`` -- followed *immediately* in ``net.layers`` by
layers that are all in place on the producer's top blob, in this order,
each optional:

  ``BatchNorm`` with global statistics (``use_global_stats``, the TEST
  default) -> ``Scale`` (a learned per-channel scale on axis 1, with or
  without bias) -> ``ReLU`` (any ``negative_slope``) / ``Clip`` / ``ReLU6`` /
  ``Swish`` / ``Sigmoid`` / ``PReLU`` (the last three not on Winograd
  convolutions; a PReLU's slopes ride in the bias buffer after the biases,
  act.h ACT 7, ``CAFFE_OCL_FUSE_PRELU``).

That is Caffe's ResNet pattern ``conv -> bn -> scale -> relu`` on one blob.
BatchNorm/Scale fold only when the producer's channel axis is axis 1 (an
InnerProduct top must be 2-D). A layer of the chain may also write a new
top (BatchNorm ``conv1 -> conv1/bn`` with Scale and ReLU in place on it,
or Scale / the activation into a new blob) where the blob before it has
no other reader and is no net output: the producer then writes the
chain's last blob and the blobs before it are computed when read
(chain.NewTopChain; ``CAFFE_OCL_FOLD_NEW_TOPS=0`` turns that off).
Anything else is left alone: a producer top that another layer also reads
(Net inserts a Split), a Scale with two bottoms, BatchNorm computing batch
statistics, ... With every absorbed layer in place, the only user-visible
blob of the chain is the producer's top, and after ``forward`` it holds the
same value as without folding (up to float rounding: the folded weights are
``W * gamma / std`` instead of applying the three steps one after another).

How it runs
-----------
The absorbed layers stay in ``net.layers`` with their parameters
(``net.params`` is unchanged); their forward is skipped. The producer runs
one GEMM per (chunk of) images with folded weights/bias and the activation
in the epilogue. The folded weight/bias buffers are computed ON THE DEVICE
by ``kernels/fold.cl`` from the current parameter blobs, and recomputed
before a forward whenever any of them changed (``SyncedMemory.version``:
``copy_from``, writes to ``net.params[...].data``, solver updates of shared
weights, a BatchNorm of a TRAIN net sharing its statistics) or was
replaced by another storage (``share_data``). A reshape of the producer
rebuilds the fused launches.

``Net.forward(start=, end=)`` over only part of a chain runs those layers
unfolded, exactly as Caffe would. Code that calls ``layer.forward`` itself
(``caffe_ocl time``'s per-layer loop) also gets the unfolded layers.

Backward
--------
Not supported through a folded net: the absorbed layers' intermediate
values are never computed. ``Net.backward`` raises ``NetError``; build the
net with ``fold=False`` (or set ``CAFFE_OCL_FOLD=0``), or call
``net.unfold()`` and run ``forward`` again first.
``Net(..., fold=None)`` (the default) folds at TEST only, and not when the
net says ``force_backward: true``.
"""
import logging

from .. import config
from ..errors import NetError
from ..proto import caffe_pb2
from . import (affine, axpy, concat, dw_pointwise, eltwise, elide, matmul_operands, permute,
               pointwise, residual, row_reduce, se, se_squeeze, siblings, slice_concat, swish)
from .chain import find_chains

log = logging.getLogger("caffe_ocl")

ENV = "CAFFE_OCL_FOLD"


def fold_enabled(fold, phase, net_param=None):
    """Net's ``fold`` option: None = on at TEST (unless force_backward),
    off at TRAIN; False = off; True = on. ``CAFFE_OCL_FOLD=0`` turns it off
    whatever the option says."""
    if not config.get("FOLD"):
        return False
    if fold is None:
        return phase == caffe_pb2.TEST and not (net_param is not None
                                                and net_param.force_backward)
    return bool(fold)


def find_groups(net):
    """The groups the TEST folding runs fused: the folded chains, the
    convolutions adding an Eltwise's shortcut in their epilogue
    (residual.py), the Eltwise SUM -> activation pairs (eltwise.py) and the BatchNorm -> Scale
    -> activation chains that cannot fold into a producer (affine.py), the
    producer -> activation pairs writing a new top (elide.py), SENet's
    Axpy -> ReLU (axpy.py), ONNX's
    Sigmoid * x after a producer (swish.py), SE channel scales folded into
    the 1x1 convolution after them (se.py), a Concat whose top only a
    permutation layer reads, as one gather from its inputs (permute.py),
    the Concats whose inputs their convolutions write in place
    (concat.py), the other convolutions whose weight may be a permutation
    matrix (permute.py: a channel gather while it is), and an SE block's
    pooling and two products as one launch (se_squeeze.py, taking in
    the groups of its products), and a channel gather with the Slices
    right after it reading its top (permute.py: one launch writing their
    tops), and a depthwise convolution with the 1x1 convolution reading
    it (dw_pointwise.py: the 1x1 kernel computes the depthwise output),
    and the scalings and last-axes transposes of a MatMul's operands read
    by its GEMM (matmul_operands.py: attention's q * scale and K^T), a
    Concat of Slices of one blob along its axis as one gather
    (slice_concat.py: a roll), and
    per-row reductions with the element-wise layers around them
    (row_reduce.py: a LayerNorm in Caffe layers), and the runs of
    element-wise layers left, each as one generated kernel (pointwise.py:
    a converted GELU's fifteen layers)."""
    chains = find_chains(net)
    taken = {li for c in chains for li in c.layers}
    sums = residual.find(net, chains, taken)
    absorbed = {id(s.chain) for s in sums if s.chain is not None}
    chains = [c for c in chains if id(c) not in absorbed] + sums
    sibs = siblings.find(net, chains, {li for c in chains for li in c.layers})
    inner = {id(gr) for s in sibs for gr in s.groups}
    chains = [c for c in chains if id(c) not in inner] + sibs
    taken = {li for c in chains for li in c.layers}
    chains += [c for c in eltwise.chains_of(net, train=False) if not taken.intersection(c.layers)]
    taken = {li for c in chains for li in c.layers}
    chains += affine.chains_of(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += elide.pairs_of(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += axpy.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += swish.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += se.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += permute.concat_gathers(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += slice_concat.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += concat.find(net, chains, taken)
    taken = {li for c in chains for li in c.layers}
    chains += permute.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    squeezes = se_squeeze.find(net, chains, taken)
    inner = {id(gr) for sq in squeezes for gr in sq.groups}
    chains = [c for c in chains if id(c) not in inner] + squeezes
    taken = {li for c in chains for li in c.layers}
    chains += matmul_operands.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += row_reduce.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += pointwise.find(net, taken)
    chains = permute.gathers_into_slices(net, chains)
    chains = dw_pointwise.wrap(net, chains)
    for c in chains:
        log.info("Folding %s", c.describe())
    return chains


def check_backward(groups):
    """Raise NetError when a backward would run through folded ``groups``
    whose intermediate values were never computed."""
    lost = [c for c in groups if getattr(c, "loses_values", True)]
    if not lost:
        return      # only Eltwise -> activation chains: every blob holds its value
    raise NetError(
        "backward through a folded net is not supported (BatchNorm/Scale/activation "
        f"layers were folded into their producers: {lost[0].describe()}"
        f"{' ...' if len(lost) > 1 else ''}); build the net with fold=False "
        "(or set CAFFE_OCL_FOLD=0), or call net.unfold() (or "
        "caffe_ocl.plan.fold.unfold(net)) and run forward again before backward")


def unfold(net):
    """Turn folding off for ``net``: every layer runs again on its own."""
    net.unfold()
