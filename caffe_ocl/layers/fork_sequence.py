"""Sequence layers of the text forks: CTPN's (tianzhi0549/CTPN's caffe, whose
Lstm is junhyukoh/caffe-lstm's) Lstm, Reverse and Transpose, which
senlinuc/caffe_ocr's CRNN-style deploys use too, and caffe_ocr's
CTCGreedyDecoder."""
import numpy as np

from ..blob import Blob
from ..errors import ShapeError
from ..ops import fork_sequence as seq_ops
from ..ops import pointwise
from ..ops import shape as shape_ops
from ..proto import caffe_pb2
from .base import Layer, register
from .recurrent import LSTMLayer
from .ssd import PermuteLayer, int_buffer


@register("Lstm")
class ForkLstmLayer(LSTMLayer):
    """The fork's ``Lstm`` (``lstm_param``: num_output, weight_filler,
    bias_filler, clipping_threshold): bottom x (T x N x ...), top h
    (T x N x num_output); every forward starts from zero state, as the
    fork does without its optional second bottom. The same cell as Caffe's
    LSTM (gates i, f, o, g; c = f c_prev + i g, h = o tanh(c); step 0 has no
    forget and no recurrent term), so it runs as Caffe's LSTM with
    ``cont`` 0 at step 0 and 1 after. Blobs in the fork's order: W_i
    (4H x I), W_h (4H x H), bias (4H). Backward clips every step's
    gate-input gradients to [-clipping_threshold, clipping_threshold] when
    that is positive, as the fork. The fork's second bottom (``clip``, which
    carries the state across forwards) is not implemented: an error says
    so."""
    type = "Lstm"
    min_bottom = 1
    max_bottom = 2        # the second is refused with its own message
    exact_num_top = 1
    bias_index = 2

    @property
    def rec_index(self):
        return 1

    def recurrent_param(self):
        lp = self.param.lstm_param
        p = caffe_pb2.RecurrentParameter()
        p.num_output = lp.num_output
        p.weight_filler.CopyFrom(lp.weight_filler)
        p.bias_filler.CopyFrom(lp.bias_filler)
        return p

    def order_params(self, shapes):
        w_x, b, w_h = shapes          # Caffe's LSTM order: W_xc, b_c, W_hc
        return [w_x, w_h, b]

    def allow_force_backward(self, bottom_index):
        return True

    def _with_cont(self, bottom):
        x = bottom[0]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes -- (#timesteps, "
                             f"#streams, ...), got {x.shape}", ShapeError)
        T, N = x.shape[:2]
        if not hasattr(self, "cont") or self.cont.shape != (T, N):
            self.cont = Blob((T, N), name=f"{self.name}.cont", device=self.device)
            cont = np.ones((T, N), np.float32)
            cont[0] = 0.0
            self.cont.data[...] = cont
            self.cont.data_mem.to_device()   # constant: uploaded once, here
        return [x, self.cont]

    def layer_setup(self, bottom, top):
        if len(bottom) != 1:
            raise self.error("the CTPN fork's Lstm with a second (clip) bottom is not "
                             "implemented; Caffe's LSTM with a cont bottom does the same")
        super().layer_setup(self._with_cont(bottom), top)

    def reshape(self, bottom, top):
        bottom = self._with_cont(bottom)
        if bottom[0].shape[0] != self.T:     # the fork takes any sequence length
            self.T = bottom[0].shape[0]
            self._state_n = None             # the cell states are sized by T
        super().reshape(bottom, top)

    def build_backward(self, bottom, top):
        self.clip = float(self.param.lstm_param.clipping_threshold)
        super().build_backward(self._with_cont(bottom), top)

    def step_gate_grad_hook(self, t):
        if self.clip <= 0:
            return []
        n, off = self.N * 4 * self.H, t * self.N * 4 * self.H
        return [pointwise.unary(self.device, "clip", n, self.dpre, self.dpre, a=-self.clip,
                                b=self.clip, offx=off, offy=off)]


@register("Reverse")
class ReverseLayer(Layer):
    """The fork's ``Reverse`` (``reverse_param { axis }``, default 0): top =
    bottom with the order along ``axis`` reversed; backward the same on the
    diffs. Not in place, as the fork."""
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        b = bottom[0]
        if top[0] is b:
            raise self.error("does not support in-place computation (as the fork)")
        axis = int(self.param.reverse_param.axis)
        if not 0 <= axis < b.num_axes:
            raise self.error(f"reverse_param.axis {axis} must be in [0, {b.num_axes}) for "
                             f"bottom {b.name!r} {b.shape}", ShapeError)
        top[0].reshape(b.shape)
        outer = int(np.prod(b.shape[:axis], dtype=np.int64))
        n_ax = b.shape[axis]
        self.inner = int(np.prod(b.shape[axis + 1:], dtype=np.int64))
        rows = np.arange(outer * n_ax, dtype=np.int64).reshape(outer, n_ax)[:, ::-1]
        self.rows = outer * n_ax
        self.idx = int_buffer(self.device, rows.reshape(-1))
        self.fwd = [shape_ops.gather_rows(self.device, self.rows, self.inner, self.idx,
                                          b.data_buffer(), top[0].data_buffer())] \
            if b.count else []

    def build_backward(self, bottom, top):
        if self.propagate_down[0] and bottom[0].count:
            self.bwd = [shape_ops.gather_rows(self.device, self.rows, self.inner, self.idx,
                                              top[0].diff_buffer(), bottom[0].diff_buffer())]


@register("Transpose")
class TransposeLayer(PermuteLayer):
    """The fork's ``Transpose`` (``transpose_param { dim: ... }``, one entry
    per bottom axis): top axis i is bottom axis dim[i], SSD's Permute with
    every axis named. Not in place, as the fork."""

    def _orders(self, nax):
        dims = [int(d) for d in self.param.transpose_param.dim]
        if sorted(dims) != list(range(nax)):
            raise self.error(f"transpose_param.dim {dims} must name each of the "
                             f"bottom's {nax} axes once", ShapeError)
        return dims


@register("CTCGreedyDecoder")
class CTCGreedyDecoderLayer(Layer):
    """senlinuc/caffe_ocr's ``CTCGreedyDecoder`` (``ctc_decoder_param``:
    blank_index, default 0, negative for the last class; ctc_merge_repeated,
    default true) with one bottom, the per-step class scores (T x N x C):
    top N x T x 1 x 1 holds each stream's labels (the first most probable
    class of every step; blanks dropped; with ctc_merge_repeated a label
    equal to the previous step's dropped), then -1. Not differentiable (the
    fork's backward does nothing). The fork's two-bottom form (scores and
    labels to an edit-distance accuracy) is not implemented."""
    exact_num_top = 1
    min_bottom = 1
    max_bottom = 2        # the second is refused with its own message

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        if len(bottom) != 1:
            raise self.error("caffe_ocr's CTCGreedyDecoder with a label bottom (its "
                             "accuracy form) is not implemented; give it the scores only")

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes < 3:
            raise self.error(f"bottom {b.name!r} must be T x N x C, got {b.shape}",
                             ShapeError)
        T, N = b.shape[:2]
        C = b.count_range(2)
        p = self.param.ctc_decoder_param
        blank = int(p.blank_index)
        if blank < 0:
            blank = C - 1
        top[0].reshape(N, T, 1, 1)
        self.fwd = [seq_ops.ctc_greedy_decode(self.device, T, N, C, blank,
                                              p.ctc_merge_repeated, b.data_buffer(),
                                              top[0].data_buffer())] if N and T and C else []

    def build_backward(self, bottom, top):
        self.bwd = []
