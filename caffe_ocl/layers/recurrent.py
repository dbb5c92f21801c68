"""Caffe's recurrent layers: LSTM, RNN and the LSTMUnit cell.

Caffe builds these as an unrolled net of InnerProduct, Scale, Eltwise,
Slice, Concat and LSTMUnit (or TanH) layers, one set per time step, with the
weights shared across steps. Here the same computation runs directly: the
input transform of all steps is one GEMM, each step is one GEMM for the
recurrent term plus one element-wise kernel (kernels/recurrent.cl), and
backward-through-time keeps every step's gates so the weight gradients are
one GEMM each over all steps. Results, parameter blobs (their order and
shapes, so .caffemodel files load) and the carried hidden state are Caffe's:

- bottoms: x (T x N x ...), cont (T x N; 0 where a sequence starts, which
  clears the state carried into that step), optionally x_static (N x ...),
  and with ``expose_hidden`` the initial state h_0 (and c_0 for LSTM), each
  1 x N x num_output;
- tops: h (LSTM) or o (RNN), T x N x num_output; with ``expose_hidden``
  also the last step's state h_T (and c_T);
- without ``expose_hidden`` the state of the last step of one forward is the
  initial state of the next (zeros at first), as Caffe's layers do;
- no gradient flows across forwards, to ``cont``, to the exposed initial
  state or from the exposed final state (Caffe's unrolled net does the same).

Blobs: LSTM [W_xc (4H x I), b_c (4H), W_xc_static (4H x S) if x_static,
W_hc (4H x H)], gate order i, f, o, g; RNN [W_xh (H x I), b_h, W_xh_static
if x_static, W_hh (H x H), W_ho (H x H), b_o].
"""
from ..errors import ShapeError
from ..ops import gemm as gemm_ops
from ..ops.gemm_splitk import gemm_launches
from ..ops import pointwise
from ..ops import recurrent as rec_ops
from . import fillers
from .base import Layer, register


class _Recurrent(Layer):
    min_bottom = 2
    min_top = 1
    n_state = 1           # recurrent state blobs (h; LSTM adds c)
    gates = 1             # gate inputs per hidden unit (LSTM: 4)

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1          # never to the continuation flags

    # ---- setup -----------------------------------------------------------
    def recurrent_param(self):
        """num_output, weight_filler, bias_filler (a fork's own message can
        stand in)."""
        return self.param.recurrent_param

    # where the blobs sit in self.blobs (a fork's order can differ)
    bias_index = 1

    def layer_setup(self, bottom, top):
        p = self.recurrent_param()
        self.H = int(p.num_output)
        if self.H <= 0:
            raise self.error("recurrent_param.num_output must be positive")
        self.expose = bool(p.expose_hidden)
        exposed = self.n_state if self.expose else 0
        self.static = len(bottom) > 2 + exposed
        want_bottoms = 2 + int(self.static) + exposed
        if len(bottom) != want_bottoms or len(top) != 1 + exposed:
            raise self.error(
                f"takes bottoms x, cont{', x_static' if self.static else ''}"
                f"{' and the initial state' if self.expose else ''} and tops "
                f"{'the output and the final state' if self.expose else 'the output'}: "
                f"{want_bottoms} bottom(s) and {1 + exposed} top(s), got {len(bottom)} "
                f"and {len(top)}")
        self._check_shapes(bottom)
        self.T = bottom[0].shape[0]
        self.I = bottom[0].count_range(2)
        G = self.gates * self.H
        shapes = [("weight", (G, self.I)), ("bias", (G,))]
        if self.static:
            self.S = bottom[2].count_range(1)
            shapes.append(("weight", (G, self.S)))
        shapes.append(("weight", (G, self.H)))
        shapes += self.extra_params()
        shapes = self.order_params(shapes)
        self.blobs = []
        for i, (kind, shape) in enumerate(shapes):
            b = self.new_param_blob(shape, i)
            filler = p.bias_filler if kind == "bias" else p.weight_filler
            fillers.fill(b, filler, f"layer {self.name!r} recurrent_param.{kind}_filler")
            self.blobs.append(b)
        self._state_n = None

    def extra_params(self):
        return []

    def order_params(self, shapes):
        return shapes

    def step_gate_grad_hook(self, t):
        """Launches run on step t's gate-input gradients (dpre) once they are
        computed, before they reach h_{t-1} and the weights."""
        return []

    def _check_shapes(self, bottom):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes -- (#timesteps, "
                             f"#streams, ...), got {x.shape}", ShapeError)
        if cont.num_axes != 2 or cont.shape != x.shape[:2]:
            raise self.error(f"bottom[1] (cont) must be #timesteps x #streams = "
                             f"{x.shape[:2]}, got {cont.shape}", ShapeError)
        if hasattr(self, "T") and x.shape[0] != self.T:
            raise self.error(f"input number of timesteps changed ({self.T} -> "
                             f"{x.shape[0]})", ShapeError)
        if hasattr(self, "I") and x.count_range(2) != self.I:
            raise self.error(f"input size {x.count_range(2)} per step does not match the "
                             f"weights' {self.I}", ShapeError)
        N = x.shape[1]
        if self.static:
            xs = bottom[2]
            if xs.num_axes < 1 or xs.shape[0] != N:
                raise self.error(f"bottom[2] (x_static) must have {N} rows (one per "
                                 f"stream), got {xs.shape}", ShapeError)
            if hasattr(self, "S") and xs.count_range(1) != self.S:
                raise self.error(f"x_static size {xs.count_range(1)} does not match the "
                                 f"weights' {self.S}", ShapeError)
        if self.expose:
            for b in bottom[2 + int(self.static):]:
                if b.shape != (1, N, self.H):
                    raise self.error(f"initial state {b.name!r} must be 1 x {N} x {self.H}, "
                                     f"got {b.shape}", ShapeError)

    # ---- buffers -----------------------------------------------------------
    def _alloc(self, floats):
        return self.device.alloc(4 * max(int(floats), 1))

    def _state_buffers(self, N):
        """The carried state (zeros at first and when the stream count
        changes): h_last [N, H] and, for LSTM, the cell states [T+1, N, H]
        whose slot 0 is the initial state."""
        if self._state_n == N:
            return
        self._state_n = N
        self.h_last = self._alloc(N * self.H)
        pointwise.fill(self.device, self.h_last, N * self.H, 0.0)
        self.alloc_state(N)

    def alloc_state(self, N):
        pass

    # ---- forward -----------------------------------------------------------
    def reshape(self, bottom, top):
        self._check_shapes(bottom)
        dev, T, H = self.device, self.T, self.H
        N = bottom[0].shape[1]
        self.N = N
        G = self.gates * H
        self._state_buffers(N)
        top[0].reshape(T, N, H)
        if self.expose:
            for t in top[1:]:
                t.reshape(1, N, H)
        self.pre = self._alloc(T * N * G)       # gate inputs, then (LSTM) activations
        self.hc = self._alloc(T * N * H)        # cont_t * h_{t-1}, every step
        w = [b.data_buffer() for b in self.blobs]
        x, cont = bottom[0].data_buffer(), bottom[1].data_buffer()
        # h_0: the exposed bottom, or the state carried from the last forward
        # (step 0 reads it before this forward overwrites h_last)
        h0 = bottom[2 + int(self.static)].data_buffer() if self.expose else self.h_last
        fwd = self.carry_launches(bottom)
        fwd.append(gemm_ops.gemm(dev, T * N, G, self.I, x, w[0], self.pre, trans_b=True,
                                 bias=w[self.bias_index], bias_axis=1))
        if self.static:
            self.static_term = self._alloc(N * G)
            fwd.append(gemm_ops.gemm(dev, N, G, self.S, bottom[2].data_buffer(), w[2],
                                     self.static_term, trans_b=True))
            fwd.append(rec_ops.add_steps(dev, T, N * G, self.static_term, self.pre))
        w_rec = w[self.rec_index]
        for t in range(T):
            prev, off_prev = (h0, 0) if t == 0 else self.h_of(top, t - 1)
            fwd.append(rec_ops.cont_scale(dev, N, H, cont, t * N, prev, off_prev,
                                          self.hc, t * N * H))
            # (per step: streams x 4H is few tiles on a GPU, split along K;
            # CPU drivers stream the weight once, see ops/gemm_splitk.py)
            fwd += gemm_launches(dev, N, G, H, self.hc, w_rec, self.pre, trans_b=True,
                                 beta=1.0, off_a=t * N * H, off_c=t * N * G)
            fwd += self.step_forward(t, bottom, top)
        fwd += self.output_forward(top)
        last, off_last = self.h_of(top, T - 1)
        fwd.append(pointwise.copy(dev, N * H, last, self.h_last, offx=off_last))
        if self.expose:
            fwd += self.expose_launches(top)
        self.fwd = fwd

    @property
    def rec_index(self):
        return 3 if self.static else 2

    # ---- backward ----------------------------------------------------------
    def build_backward(self, bottom, top):
        dev, T, N, H = self.device, self.T, self.N, self.H
        G = self.gates * H
        w = [b.data_buffer() for b in self.blobs]
        dw = [b.diff_buffer() for b in self.blobs]
        pp = self.param_propagate_down
        self.dpre = self._alloc(T * N * G)
        self.dhc = self._alloc(N * H)
        cont = bottom[1].data_buffer()
        bwd = self.output_backward(top)
        for t in range(T - 1, -1, -1):
            rec = None if t == T - 1 else (self.dhc, 0, cont, (t + 1) * N)
            bwd += self.step_backward(t, top, rec)
            bwd += self.step_gate_grad_hook(t)
            if t > 0:      # through h_conted_{t-1} (to h_0: not across forwards)
                bwd += gemm_launches(dev, N, H, G, self.dpre, w[self.rec_index], self.dhc,
                                     off_a=t * N * G)
        if pp[self.rec_index]:
            bwd.append(gemm_ops.gemm(dev, G, H, T * N, self.dpre, self.hc,
                                     dw[self.rec_index], trans_a=True, beta=1.0))
        if pp[0]:
            bwd.append(gemm_ops.gemm(dev, G, self.I, T * N, self.dpre, bottom[0].data_buffer(),
                                     dw[0], trans_a=True, beta=1.0))
        if pp[self.bias_index]:
            bwd.append(pointwise.bias_grad(dev, T * N, G, 1, self.dpre, dw[self.bias_index]))
        if self.propagate_down[0]:
            bwd.append(gemm_ops.gemm(dev, T * N, self.I, G, self.dpre, w[0],
                                     bottom[0].diff_buffer()))
        if self.static and (pp[2] or self.propagate_down[2]):
            dsum = self._alloc(N * G)
            bwd.append(rec_ops.sum_steps(dev, T, N * G, self.dpre, dsum))
            if pp[2]:
                bwd.append(gemm_ops.gemm(dev, G, self.S, N, dsum, bottom[2].data_buffer(),
                                         dw[2], trans_a=True, beta=1.0))
            if self.propagate_down[2]:
                bwd.append(gemm_ops.gemm(dev, N, self.S, G, dsum, w[2],
                                         bottom[2].diff_buffer()))
        self.bwd = bwd


@register("LSTM")
class LSTMLayer(_Recurrent):
    """Caffe's LSTM (see the module text): i, f, o, g gates, h = o * tanh(c)."""
    n_state = 2
    gates = 4

    def alloc_state(self, N):
        self.cells = self._alloc((self.T + 1) * N * self.H)
        pointwise.fill(self.device, self.cells, (self.T + 1) * N * self.H, 0.0)

    def carry_launches(self, bottom):
        NH = self.N * self.H
        if self.expose:
            return [pointwise.copy(self.device, NH, bottom[-1].data_buffer(), self.cells)]
        return [pointwise.copy(self.device, NH, self.cells, self.cells, offx=self.T * NH)]

    def h_of(self, top, t):
        return top[0].data_buffer(), t * self.N * self.H

    def step_forward(self, t, bottom, top):
        N, H = self.N, self.H
        o4, o1 = t * N * 4 * H, t * N * H
        return [rec_ops.lstm_unit_forward(
            self.device, N, H, self.pre, o4, self.cells, o1, bottom[1].data_buffer(), t * N,
            self.pre, o4, self.cells, o1 + N * H, top[0].data_buffer(), o1)]

    def output_forward(self, top):
        return []

    def expose_launches(self, top):
        NH = self.N * self.H
        return [pointwise.copy(self.device, NH, self.h_last, top[1].data_buffer()),
                pointwise.copy(self.device, NH, self.cells, top[2].data_buffer(),
                               offx=self.T * NH)]

    def output_backward(self, top):
        self.dc = self._alloc(self.N * self.H)
        return [pointwise.fill_launch(self.device, self.dc, self.N * self.H, 0.0)]

    def step_backward(self, t, top, rec):
        N, H = self.N, self.H
        o4, o1 = t * N * 4 * H, t * N * H
        return [rec_ops.lstm_unit_backward(
            self.device, N, H, self.pre, o4, self.cells, o1, self.cells, o1 + N * H,
            top[0].diff_buffer(), o1, self.dc, 0, self.dc, 0, self.dpre, o4, rec=rec)]


@register("RNN")
class RNNLayer(_Recurrent):
    """Caffe's RNN: h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h [+ W_xh_static
    x_static]), o_t = tanh(W_ho h_t + b_o); the top is o."""

    def extra_params(self):
        return [("weight", (self.H, self.H)), ("bias", (self.H,))]

    def carry_launches(self, bottom):
        return []

    def h_of(self, top, t):
        return self.pre, t * self.N * self.H      # pre holds h_t once its step ran

    def step_forward(self, t, bottom, top):
        NH = self.N * self.H
        return [pointwise.unary(self.device, "tanh", NH, self.pre, self.pre,
                                offx=t * NH, offy=t * NH)]

    def output_forward(self, top):
        dev, TNH = self.device, self.T * self.N * self.H
        w = self.blobs[self.rec_index + 1].data_buffer()
        b = self.blobs[self.rec_index + 2].data_buffer()
        self.out = self._alloc(TNH)       # o kept here: an in-place layer may change the top
        return [gemm_ops.gemm(dev, self.T * self.N, self.H, self.H, self.pre, w, self.out,
                              trans_b=True, bias=b, bias_axis=1),
                pointwise.unary(dev, "tanh", TNH, self.out, self.out),
                pointwise.copy(dev, TNH, self.out, top[0].data_buffer())]

    def expose_launches(self, top):
        return [pointwise.copy(self.device, self.N * self.H, self.h_last,
                               top[1].data_buffer())]

    def output_backward(self, top):
        dev, TN, H = self.device, self.T * self.N, self.H
        iw, ib = self.rec_index + 1, self.rec_index + 2
        # dO (o's pre-activation gradient), then the outputs' share of dh
        self.dout = self._alloc(TN * H)
        out = [pointwise.unary_backward(dev, "tanh", TN * H, self.out, self.out,
                                        top[0].diff_buffer(), self.dout)]
        if self.param_propagate_down[iw]:
            out.append(gemm_ops.gemm(dev, H, H, TN, self.dout, self.pre,
                                     self.blobs[iw].diff_buffer(), trans_a=True, beta=1.0))
        if self.param_propagate_down[ib]:
            out.append(pointwise.bias_grad(dev, TN, H, 1, self.dout,
                                           self.blobs[ib].diff_buffer()))
        out.append(gemm_ops.gemm(dev, TN, H, H, self.dout, self.blobs[iw].data_buffer(),
                                 self.dpre))
        return out

    def step_backward(self, t, top, rec):
        o = t * self.N * self.H
        return [rec_ops.rnn_tanh_backward(self.device, self.N, self.H, self.pre, o,
                                          self.dpre, o, self.dpre, o, rec=rec)]


@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """Caffe's LSTMUnit: bottoms c_{t-1} (1 x N x D), gate inputs (1 x N x 4D:
    i, f, o, g) and cont (1 x N); tops c_t and h_t (1 x N x D). No gradient
    to cont."""
    exact_num_bottom = 3
    exact_num_top = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        c_prev, x, cont = bottom
        if c_prev.num_axes != 3 or c_prev.shape[0] != 1:
            raise self.error(f"bottom[0] (c_prev) must be 1 x N x D, got {c_prev.shape}",
                             ShapeError)
        _, N, D = c_prev.shape
        if x.shape != (1, N, 4 * D):
            raise self.error(f"bottom[1] (gate input) must be 1 x {N} x {4 * D}, got "
                             f"{x.shape}", ShapeError)
        if cont.shape != (1, N):
            raise self.error(f"bottom[2] (cont) must be 1 x {N}, got {cont.shape}",
                             ShapeError)
        self.N, self.D = N, D
        for t in top:
            t.reshape(1, N, D)
        self.gates = self.device.alloc(4 * max(N * 4 * D, 1))
        self.fwd = [rec_ops.lstm_unit_forward(
            self.device, N, D, x.data_buffer(), 0, c_prev.data_buffer(), 0,
            cont.data_buffer(), 0, self.gates, 0, top[0].data_buffer(), 0,
            top[1].data_buffer(), 0)]

    def build_backward(self, bottom, top):
        if not (self.propagate_down[0] or self.propagate_down[1]):
            return
        dev, N, D = self.device, self.N, self.D
        # both gradients come out of one kernel: the one not asked for goes to scratch
        dcp = bottom[0].diff_buffer() if self.propagate_down[0] else dev.alloc(4 * N * D)
        dx = bottom[1].diff_buffer() if self.propagate_down[1] else dev.alloc(16 * N * D)
        self.bwd = [rec_ops.lstm_unit_backward(
            dev, N, D, self.gates, 0, bottom[0].data_buffer(), 0, top[0].data_buffer(), 0,
            top[1].diff_buffer(), 0, top[0].diff_buffer(), 0, dcp, 0, dx, 0)]
