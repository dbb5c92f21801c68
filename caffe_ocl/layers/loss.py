"""Loss and metric layers: SoftmaxWithLoss, EuclideanLoss,
SigmoidCrossEntropyLoss, HingeLoss, InfogainLoss, MultinomialLogisticLoss,
ContrastiveLoss, Accuracy (BVLC Caffe semantics).

As Caffe's LossLayer: top[0] is a 0-axis (scalar) blob with loss weight 1 by
default; the first dimensions of bottom[0] and bottom[1] must match; the
backward pass scales by the loss weight that Caffe stores in top[0]'s diff.
Here that scalar, the normalizer (also the VALID count) and every sum stay on
the device (ops/loss.py): forward is a per-item kernel plus a one-work-group
reduction, backward one element-wise kernel per bottom.

The layers that index by a label (SoftmaxWithLoss, InfogainLoss, HingeLoss,
MultinomialLogisticLoss, Accuracy) each own a ``LabelCheck``: their forward
kernel notes the first label outside [0, C) (not the ignore_label) on the
device, and the net reads it where the host synchronises anyway
(``Net.check_labels``: pycaffe's forward, the solver's display, tests and
snapshots, ``caffe_ocl test``'s batches), raising one LabelError.
"""
import numpy as np

from ..blob import Blob
from ..errors import CaffeOclError, LayerError, ShapeError
from ..ops import loss as loss_ops
from ..ops import pointwise
from ..ops import softmax as softmax_ops
from ..proto import blobproto_to_array, caffe_pb2, read_blobproto
from .base import Layer, register

_LP = caffe_pb2.LossParameter
FULL, VALID, BATCH_SIZE, NONE = _LP.FULL, _LP.VALID, _LP.BATCH_SIZE, _LP.NONE


def normalization_mode(loss_param, default):
    """Caffe's rule: ``normalization`` when given; else the legacy
    ``normalize`` bool (true -> VALID, false -> BATCH_SIZE); else ``default``."""
    if loss_param.HasField("normalization"):
        return loss_param.normalization
    if loss_param.HasField("normalize"):
        return VALID if loss_param.normalize else BATCH_SIZE
    return default


class LabelCheck:
    """One layer's device-side record of its first out-of-range label
    (kernels/loss.cl ``note_bad_label``) and the host's view of it.

    ``passes`` counts the layer's forward passes on the host (the device
    counts them too, in the buffer); ``mark(describe)`` says what the
    passes from now on are (``describe(k)`` names the k-th, e.g. "iteration
    12"), so that a report names the iteration or batch the label came in
    (the last few marks are kept: a report may come a display interval
    later)."""

    def __init__(self, layer):
        self.layer = layer
        self.device = layer.device
        self.buf = self.device.alloc(4 * loss_ops.CHECK_INTS)
        pointwise.fill(self.device, self.buf, loss_ops.CHECK_INTS, 0.0)
        self.passes = 0
        self.classes, self.inner, self.ignore, self.what = 0, 1, None, ""
        self.per_example = True     # the label blob's items are the batch's examples
        self.last_item = None       # set by report(): the example, when the bad label
        #                             came in the last pass (its record is then known)
        self._marks = []       # (first pass, describe), the latest last

    def mark(self, describe):
        self._marks = self._marks[-7:] + [(self.passes, describe)]

    def _when(self, p):
        for base, describe in reversed(self._marks):
            if p >= base:
                return describe(p - base)
        return f"forward pass {p + 1} of this net" + (" (the last)" if p == self.passes - 1
                                                       else "")

    def report(self, label_blob="", pred_blob=""):
        """None, or the message for the first bad label since the last
        report (read from the device, which syncs it; the record is then
        cleared)."""
        host = np.zeros(loss_ops.CHECK_INTS, np.int32)
        self.device.download(host, self.buf)
        if not host[0]:
            return None
        pointwise.fill(self.device, self.buf, 1, 0.0)       # clear the record
        value = float(host[1:2].view(np.float32)[0])
        item = int(host[2])
        o, s = divmod(item, max(self.inner, 1))
        where = f"item {o}" + (f", position {s}" if self.inner > 1 else "")
        last = int(host[4]) == self.passes - 1
        self.last_item = o if last and self.per_example else None
        layer = self.layer
        ignore = "" if self.ignore is None else f" and is not the ignore_label {self.ignore}"
        blob = f" of bottom {label_blob!r}" if label_blob else ""
        what = self.what.format(pred=repr(pred_blob or layer.name))
        return (f"layer {layer.name!r} ({layer.type}): label {value:g}{blob} is out of "
                f"range [0, {self.classes}){ignore} ({what}); "
                f"found at {self._when(int(host[4]))}, {where} of the batch")


class _LabelChecked:
    """Mixin of the layers whose forward indexes by a label (bottom 1)."""

    def _setup_label_check(self):
        self.label_check = LabelCheck(self)

    def _label_range(self, classes, inner, ignore, what, per_example=True):
        c = self.label_check
        c.classes, c.inner, c.ignore, c.what = classes, inner, ignore, what
        c.per_example = per_example

    def forward_impl(self, bottom, top):
        self.label_check.passes += 1
        super().forward_impl(bottom, top)


class _ReduceHelpers:
    """Scratch buffers, normalizer and reduction plumbing shared by the loss
    layers and Accuracy."""

    def _ignore_label(self):
        lp = self.param.loss_param
        return lp.ignore_label if lp.HasField("ignore_label") else None

    def _scratch(self, n, with_count=False):
        """Per-item loss (and count) buffers, plus the normalizer scalar."""
        dev = self.device
        self.s_loss = dev.alloc(4 * max(n, 1))
        self.s_cnt = dev.alloc(4 * max(n, 1)) if with_count else None
        self.s_norm = dev.alloc(4)

    def _norm_args(self, mode, outer, inner, ignore):
        """(fixed normalizer, count buffer or None) for Caffe's get_normalizer."""
        if mode == FULL:
            return outer * inner, None
        if mode == VALID:
            return (outer * inner, None) if ignore is None else (1.0, self.s_cnt)
        if mode == BATCH_SIZE:
            return outer, None
        if mode == NONE:
            return 1.0, None
        raise self.error(f"unknown normalization mode {mode}")

    def _reduce(self, n, fixed, cnt, scale=1.0, top=None):
        chk = getattr(self, "label_check", None)
        return loss_ops.reduce(self.device, n, self.s_loss, top, self.s_norm, cnt=cnt,
                               fixed_norm=fixed, scale=scale,
                               chk=None if chk is None else chk.buf)


class LossLayer(_ReduceHelpers, Layer):
    """Base of the loss layers (Caffe's LossLayer)."""
    exact_num_bottom = 2
    exact_num_top = 1

    def default_loss_weight(self, top_index):
        return 1.0 if top_index == 0 else 0.0

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1       # never into the labels

    def reshape_loss(self, bottom, top):
        a, b = bottom[0], bottom[1]
        n0 = a.shape[0] if a.shape else 1
        n1 = b.shape[0] if b.shape else 1
        if n0 != n1:
            raise self.error(f"the data and label should have the same first dimension: "
                             f"{a.name!r} {a.shape} vs {b.name!r} {b.shape}", ShapeError)
        top[0].reshape(())
        self.num = n0

    def _no_label_backward(self, index=1, what="label"):
        if len(self.propagate_down) > index and self.propagate_down[index]:
            raise self.error(f"cannot backpropagate to {what} inputs (bottom {index})",
                             LayerError)


class _SoftmaxLossBase(_LabelChecked, LossLayer):
    """Shared by SoftmaxWithLoss and InfogainLoss: softmax over an axis,
    optional second top with the probabilities."""
    exact_num_top = None
    min_top = 1
    max_top = 2

    def _setup_softmax(self, bottom, top, axis):
        x = bottom[0]
        self.axis_ = self.canonical_axis(x, axis)
        self.outer = x.count_range(0, self.axis_)
        self.C = x.shape[self.axis_]
        self.inner = x.count_range(self.axis_ + 1)
        if self.outer * self.inner != bottom[1].count:
            raise self.error(
                f"number of labels must match number of predictions: prediction "
                f"{x.name!r} {x.shape} with axis {self.axis_} needs "
                f"{self.outer * self.inner} labels, label blob {bottom[1].name!r} "
                f"{bottom[1].shape} has {bottom[1].count}", ShapeError)
        self._label_range(self.C, self.inner, self.ignore,
                          f"{self.C} classes along axis {self.axis_} of {{pred}}",
                          self.axis_ == 1)
        if len(top) >= 2:
            top[1].reshape(x.shape)
            self.prob_buf = top[1].data_buffer()
        else:
            if getattr(self, "prob", None) is None:
                self.prob = Blob((), name=f"{self.name}.prob", device=self.device)
            self.prob.reshape(x.shape)
            self.prob_buf = self.prob.data_buffer()
        return softmax_ops.forward(self.device, self.outer, self.C, self.inner,
                                   x.data_buffer(), self.prob_buf)


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(_SoftmaxLossBase):
    def layer_setup(self, bottom, top):
        self.ignore = self._ignore_label()
        self.normalization = normalization_mode(self.param.loss_param, VALID)
        self._setup_label_check()

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        sm = self._setup_softmax(bottom, top, self.param.softmax_param.axis)
        n = self.outer * self.inner
        self._scratch(n, with_count=True)
        fixed, cnt = self._norm_args(self.normalization, self.outer, self.inner, self.ignore)
        self.fwd = sm + [
                    loss_ops.softmax_loss_forward(self.device, self.outer, self.C, self.inner,
                                                  self.prob_buf, bottom[1].data_buffer(),
                                                  self.ignore, self.s_loss, self.s_cnt,
                                                  self.label_check.buf),
                    self._reduce(n, fixed, cnt, top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        self._no_label_backward()
        if self.propagate_down[0]:
            self.bwd = [loss_ops.softmax_loss_backward(
                self.device, self.outer, self.C, self.inner, self.prob_buf,
                bottom[1].data_buffer(), self.ignore, top[0].diff_buffer(), self.s_norm,
                bottom[0].diff_buffer())]


@register("InfogainLoss")
class InfogainLossLayer(_SoftmaxLossBase):
    """Final BVLC form: softmax inside (over infogain_loss_param.axis), then
    loss = -sum_k H[label, k] log(max(prob_k, 1e-20)) / normalizer. H comes
    from ``infogain_loss_param.source`` (.binaryproto) or a third bottom."""
    exact_num_bottom = None
    min_bottom = 2
    max_bottom = 3

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore = self._ignore_label()
        self._setup_label_check()
        if lp.HasField("normalize"):
            raise self.error("loss_param.normalize is deprecated for InfogainLoss; "
                             "use loss_param.normalization")
        self.normalization = lp.normalization
        self.H_file = None
        if len(bottom) < 3:
            src = self.param.infogain_loss_param.source
            if not self.param.infogain_loss_param.HasField("source") or not src:
                raise self.error("infogain matrix source must be specified "
                                 "(infogain_loss_param.source or a third bottom)")
            try:
                arr = blobproto_to_array(read_blobproto(src))
            except CaffeOclError as e:
                raise self.error(f"cannot read the infogain matrix: {e}")
            self.H_file = Blob(arr.shape, name=f"{self.name}.infogain", device=self.device)
            self.H_file.data[...] = arr

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        sm = self._setup_softmax(bottom, top, self.param.infogain_loss_param.axis)
        H = bottom[2] if len(bottom) >= 3 else self.H_file
        if H.count != self.C * self.C:
            raise self.error(f"infogain matrix {H.name!r} has shape {H.shape} "
                             f"({H.count} values); {self.C} labels need "
                             f"{self.C}x{self.C}", ShapeError)
        if H is self.H_file:
            H.data_mem.to_device()
        self.H_buf = H.data_buffer()
        self.rowsum = self.device.alloc(4 * self.C)
        n = self.outer * self.inner
        self._scratch(n, with_count=True)
        fixed, cnt = self._norm_args(self.normalization, self.outer, self.inner, self.ignore)
        self.fwd = sm + [
                    loss_ops.infogain_forward(self.device, self.outer, self.C, self.inner,
                                              self.prob_buf, bottom[1].data_buffer(),
                                              self.H_buf, self.ignore, self.s_loss,
                                              self.s_cnt, self.label_check.buf),
                    self._reduce(n, fixed, cnt, top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        self._no_label_backward()
        self._no_label_backward(2, "infogain")
        if self.propagate_down[0]:
            dev = self.device
            self.bwd = [loss_ops.infogain_rowsum(dev, self.C, self.H_buf, self.rowsum),
                        loss_ops.infogain_backward(
                            dev, self.outer, self.C, self.inner, self.prob_buf,
                            bottom[1].data_buffer(), self.H_buf, self.rowsum, self.ignore,
                            top[0].diff_buffer(), self.s_norm, bottom[0].diff_buffer())]


@register("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """loss = sum((a - b)^2) / num / 2; gradients to both bottoms."""

    def allow_force_backward(self, bottom_index):
        return True

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        a, b = bottom
        if a.count_range(1) != b.count_range(1):
            raise self.error(f"inputs must have the same dimension: {a.name!r} {a.shape} "
                             f"vs {b.name!r} {b.shape}", ShapeError)
        self.n = a.count
        self._scratch(self.n)
        self.fwd = [loss_ops.sq_diff(self.device, self.n, a.data_buffer(), b.data_buffer(),
                                     self.s_loss),
                    self._reduce(self.n, self.num, None, scale=0.5, top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        for i, sign in ((0, 1.0), (1, -1.0)):
            if self.propagate_down[i]:
                self.bwd.append(loss_ops.euclidean_backward(
                    self.device, self.n, bottom[0].data_buffer(), bottom[1].data_buffer(),
                    sign, top[0].diff_buffer(), self.s_norm, bottom[i].diff_buffer()))


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    """Final BVLC: ignore_label, normalization defaulting to BATCH_SIZE
    (legacy ``normalize: true`` means VALID)."""

    def layer_setup(self, bottom, top):
        self.ignore = self._ignore_label()
        self.normalization = normalization_mode(self.param.loss_param, BATCH_SIZE)

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        x, t = bottom
        if x.count != t.count:
            raise self.error(f"inputs must have the same count: {x.name!r} {x.shape} vs "
                             f"{t.name!r} {t.shape}", ShapeError)
        self.n = x.count
        outer, inner = self.num, x.count_range(1) if x.shape else 1
        self._scratch(self.n, with_count=True)
        fixed, cnt = self._norm_args(self.normalization, outer, inner, self.ignore)
        self.fwd = [loss_ops.sigmoid_ce_forward(self.device, self.n, x.data_buffer(),
                                                t.data_buffer(), self.ignore, self.s_loss,
                                                self.s_cnt),
                    self._reduce(self.n, fixed, cnt, top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        self._no_label_backward()
        if self.propagate_down[0]:
            self.bwd = [loss_ops.sigmoid_ce_backward(
                self.device, self.n, bottom[0].data_buffer(), bottom[1].data_buffer(),
                self.ignore, top[0].diff_buffer(), self.s_norm, bottom[0].diff_buffer())]


class _PerRowLoss(_LabelChecked, LossLayer):
    """[num][dim] predictions with one integer label per row."""

    def layer_setup(self, bottom, top):
        self._setup_label_check()

    def _rows(self, bottom):
        self.dim = bottom[0].count // max(self.num, 1)
        self._label_range(self.dim, 1, None,
                          f"{self.dim} values per example in {{pred}}")
        if bottom[1].count != self.num:
            raise self.error(f"needs one label per example: prediction {bottom[0].name!r} "
                             f"{bottom[0].shape} has {self.num}, label "
                             f"{bottom[1].name!r} {bottom[1].shape} has {bottom[1].count}",
                             ShapeError)
        self._scratch(self.num)


@register("HingeLoss")
class HingeLossLayer(_PerRowLoss):
    """loss = sum_{i,j} max(0, 1 - d_ij x_ij)^p / num, d = +1 at the label, -1 elsewhere."""

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        self._rows(bottom)
        self.p = 2 if self.param.hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2 else 1
        self.fwd = [loss_ops.hinge_forward(self.device, self.num, self.dim,
                                           bottom[0].data_buffer(), bottom[1].data_buffer(),
                                           self.p, self.s_loss, self.label_check.buf),
                    self._reduce(self.num, self.num, None, top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        self._no_label_backward()
        if self.propagate_down[0]:
            self.bwd = [loss_ops.hinge_backward(
                self.device, self.num, self.dim, bottom[0].data_buffer(),
                bottom[1].data_buffer(), self.p, top[0].diff_buffer(), self.s_norm,
                bottom[0].diff_buffer())]


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(_PerRowLoss):
    """loss = -sum_i log(max(x[i, label_i], 1e-20)) / num (x already probabilities)."""

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        if bottom[1].count_range(1) != 1:
            raise self.error(f"label {bottom[1].name!r} must have shape (num,) or "
                             f"(num, 1, 1, 1), got {bottom[1].shape}", ShapeError)
        self._rows(bottom)
        self.fwd = [loss_ops.mlogistic_forward(self.device, self.num, self.dim,
                                               bottom[0].data_buffer(),
                                               bottom[1].data_buffer(), self.s_loss,
                                               self.label_check.buf),
                    self._reduce(self.num, self.num, None, top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        self._no_label_backward()
        if self.propagate_down[0]:
            self.bwd = [loss_ops.mlogistic_backward(
                self.device, self.num, self.dim, bottom[0].data_buffer(),
                bottom[1].data_buffer(), top[0].diff_buffer(), self.s_norm,
                bottom[0].diff_buffer())]


@register("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Bottoms a, b (num x channels) and similarity y (num): loss =
    sum(y d^2 + (1-y) max(margin - d, 0)^2) / num / 2 (legacy_version:
    max(margin - d^2, 0))."""
    exact_num_bottom = 3

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        a, b, y = bottom
        def channels(blob):   # Caffe's legacy channels()
            return blob.shape[1] if len(blob.shape) > 1 else 1
        if a.count_range(2) != 1 or b.count_range(2) != 1 or channels(a) != channels(b):
            raise self.error(f"bottoms a {a.name!r} {a.shape} and b {b.name!r} {b.shape} must "
                             f"both be (num, channels[, 1, 1]) with equal channels",
                             ShapeError)
        if y.count != self.num or y.count_range(1) != 1:
            raise self.error(f"similarity bottom {y.name!r} {y.shape} must hold one value per "
                             f"pair ({self.num})", ShapeError)
        self.dim = channels(a)
        p = self.param.contrastive_loss_param
        self.margin, self.legacy = p.margin, p.legacy_version
        self._scratch(self.num)
        self.dist_sq = self.device.alloc(4 * max(self.num, 1))
        self.fwd = [loss_ops.contrastive_forward(self.device, self.num, self.dim,
                                                 a.data_buffer(), b.data_buffer(),
                                                 y.data_buffer(), self.margin, self.legacy,
                                                 self.dist_sq, self.s_loss),
                    self._reduce(self.num, self.num, None, scale=0.5,
                                 top=top[0].data_buffer())]

    def build_backward(self, bottom, top):
        for i, sign in ((0, 1.0), (1, -1.0)):
            if self.propagate_down[i]:
                self.bwd.append(loss_ops.contrastive_backward(
                    self.device, self.num, self.dim, bottom[0].data_buffer(),
                    bottom[1].data_buffer(), bottom[2].data_buffer(), self.dist_sq,
                    self.margin, self.legacy, sign, top[0].diff_buffer(), self.s_norm,
                    bottom[i].diff_buffer()))


@register("Accuracy")
class AccuracyLayer(_LabelChecked, _ReduceHelpers, Layer):
    """Top-k accuracy over ``accuracy_param.axis``; optional second top with
    the per-class accuracy. No backward, loss weight 0 by default."""
    exact_num_top = None
    min_top = 1
    max_top = 2
    exact_num_bottom = 2
    has_backward = False

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.param.accuracy_param
        self.top_k = p.top_k
        self.ignore = p.ignore_label if p.HasField("ignore_label") else None
        self._setup_label_check()

    def reshape(self, bottom, top):
        x, lab = bottom
        if lab.count == 0 or self.top_k > x.count // lab.count:
            raise self.error(f"top_k ({self.top_k}) must be less than or equal to the number "
                             f"of classes ({x.count // max(lab.count, 1)})", ShapeError)
        axis = self.canonical_axis(x, self.param.accuracy_param.axis)
        outer, C, inner = x.count_range(0, axis), x.shape[axis], x.count_range(axis + 1)
        if outer * inner != lab.count:
            raise self.error(
                f"number of labels must match number of predictions: prediction "
                f"{x.name!r} {x.shape} with axis {axis} needs {outer * inner} labels, "
                f"label blob {lab.name!r} {lab.shape} has {lab.count}", ShapeError)
        top[0].reshape(())
        n = outer * inner
        self._label_range(C, inner, self.ignore, f"{C} classes along axis {axis} of {{pred}}",
                          axis == 1)
        self._scratch(n, with_count=True)
        dev = self.device
        self.fwd = [loss_ops.accuracy_forward(dev, outer, C, inner, x.data_buffer(),
                                              lab.data_buffer(), self.top_k, self.ignore,
                                              self.s_loss, self.s_cnt, self.label_check.buf),
                    self._reduce(n, 1.0, self.s_cnt, top=top[0].data_buffer())]
        if len(top) > 1:
            top[1].reshape((C,))
            self.fwd.append(loss_ops.accuracy_per_class(dev, n, C, lab.data_buffer(),
                                                        self.s_loss, self.s_cnt,
                                                        top[1].data_buffer()))
