"""More element-wise neuron layers: PReLU, ELU, AbsVal, Power, Exp, Log, BNLL,
Threshold, Clip, Swish, with BVLC Caffe's semantics.

Extension (not in BVLC Caffe): ``ReLU6`` = Clip with min 0, max 6 (as in
MobileNet ports); it takes no parameters.

In-place use (bottom and top the same blob) is allowed for all of them. Where
the gradient needs the input x and not only the output y, the layer saves a
copy of x before an in-place forward, as Caffe's PReLU does with
``bottom_memory_``; BVLC's AbsVal/Power/Log/BNLL/Clip/Swish... would read the
overwritten x and give wrong gradients in place, here they stay correct.
"""
import math

from ..blob import Blob
from ..ops import pointwise
from ..ops import prelu as prelu_ops
from . import fillers
from .base import Layer, register
from .neuron import DropoutLayer, UnaryNeuron


class _Neuron(UnaryNeuron):
    """UnaryNeuron whose backward reads x; keeps a copy of x when in place
    (only where the net will run its backward)."""

    forward_reads_propagate_down = True     # the copy depends on need_backward

    def backward_needs_x(self):
        return True

    def _keep_x(self, bottom, top):
        """Bind ``self._x`` to the buffer holding x at backward time and
        return the forward launches that save it (a copy when in place)."""
        self.bottom_memory = None
        self._x = bottom[0].data_buffer()
        # no copy where the net runs no backward through this layer (a
        # deploy net): Caffe copies anyway, but nothing reads it
        if bottom[0] is top[0] and self.backward_needs_x() and self.need_backward:
            self.bottom_memory = Blob(bottom[0].shape, name=f"{self.name}.bottom_memory",
                                      device=self.device)
            self._x = self.bottom_memory.data_buffer()
            return [pointwise.copy(self.device, bottom[0].count, bottom[0].data_buffer(),
                                   self._x)]
        return []

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)
        self.fwd = self._keep_x(bottom, top)
        self.fwd.append(pointwise.unary(self.device, self.op, bottom[0].count,
                                        bottom[0].data_buffer(), top[0].data_buffer(),
                                        *self.op_params()))

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            self.bwd = [pointwise.unary_backward(
                self.device, self.op, bottom[0].count, self._x, top[0].data_buffer(),
                top[0].diff_buffer(), bottom[0].diff_buffer(), *self.op_params())]


def plain_elementwise(layer):
    """Whether ``layer``'s forward is exactly one launch of kernels/
    unary_op.h's ``fwd_op`` for its ``op`` and ``op_params()`` (what
    plan/pointwise.py may compute in a fused chain instead): a neuron with
    the shared reshape, not Dropout (random at TRAIN), not a subclass with
    its own forward."""
    cls = type(layer)
    return (isinstance(layer, UnaryNeuron) and not isinstance(layer, DropoutLayer)
            and cls.reshape in (UnaryNeuron.reshape, _Neuron.reshape)
            and cls.forward is Layer.forward and cls.forward_impl is Layer.forward_impl
            and layer.op in pointwise.UNARY_OPS)


@register("ELU")
class ELULayer(_Neuron):
    op = "elu"

    def op_params(self):
        return (self.param.elu_param.alpha, 0.0, 0.0)

    def backward_needs_x(self):
        # dy/dx = x > 0 ? 1 : y + alpha; with alpha >= 0, y > 0 iff x > 0
        return self.param.elu_param.alpha < 0


@register("AbsVal")
class AbsValLayer(_Neuron):
    op = "absval"


@register("BNLL")
class BNLLLayer(_Neuron):
    op = "bnll"


@register("Swish")
class SwishLayer(_Neuron):
    op = "swish"

    def op_params(self):
        return (self.param.swish_param.beta, 0.0, 0.0)


@register("Clip")
class ClipLayer(_Neuron):
    op = "clip"

    def layer_setup(self, bottom, top):
        p = self.param.clip_param
        if not (p.HasField("min") and p.HasField("max")):
            raise self.error("clip_param { min max } are required")

    def op_params(self):
        p = self.param.clip_param
        return (p.min, p.max, 0.0)


@register("ReLU6")
class ReLU6Layer(_Neuron):
    """Extension: Clip(0, 6)."""
    op = "clip"

    def op_params(self):
        return (0.0, 6.0, 0.0)


@register("Power")
class PowerLayer(_Neuron):
    """y = (shift + scale * x) ^ power. Caffe's special cases: power * scale == 0
    gives a constant (1 if power == 0 else shift ^ power) and a zero gradient;
    power == 1 skips pow; power == 2 uses 2 * scale * (shift + scale * x)."""
    op = "power"

    def op_params(self):
        p = self.param.power_param
        return (p.power, p.scale, p.shift)

    def backward_needs_x(self):
        p = self.param.power_param
        return not (p.power * p.scale == 0 or p.power == 1)


def _log_base(layer, base, what):
    if base != -1 and not base > 0:
        raise layer.error(f"{what}_param.base must be strictly positive (or -1 for e), got {base}")
    lb = 1.0 if base == -1 else math.log(base)
    if lb == 0:
        if what == "log":
            raise layer.error(f"log_param.base {base} gives log(base) = 0: division by zero")
    return lb


@register("Exp")
class ExpLayer(_Neuron):
    """y = base ^ (shift + scale * x); base -1 means e. Backward uses y only."""
    op = "exp"

    def layer_setup(self, bottom, top):
        p = self.param.exp_param
        self._params = (_log_base(self, p.base, "exp"), p.scale, p.shift)

    def op_params(self):
        return self._params

    def backward_needs_x(self):
        return False


@register("Log")
class LogLayer(_Neuron):
    """y = log_base(shift + scale * x); base -1 means e."""
    op = "log"

    def layer_setup(self, bottom, top):
        p = self.param.log_param
        self._params = (1.0 / _log_base(self, p.base, "log"), p.scale, p.shift)

    def op_params(self):
        return self._params


@register("Threshold")
class ThresholdLayer(_Neuron):
    """y = x > threshold ? 1 : 0. No backward (as Caffe)."""
    op = "threshold"
    has_backward = False
    allow_force_backward = False

    def op_params(self):
        return (self.param.threshold_param.threshold, 0.0, 0.0)

    def backward_needs_x(self):
        return False

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            raise self.error("Threshold has no backward (as in Caffe)")
        self.bwd = []


@register("PReLU")
class PReLULayer(_Neuron):
    """y = max(x, 0) + a_c * min(x, 0), learnable slope a per channel (axis 1)
    or one shared slope (channel_shared); filler default constant 0.25."""

    def layer_setup(self, bottom, top):
        if bottom[0].num_axes < 2:
            raise self.error(f"bottom must have at least 2 axes, got shape {bottom[0].shape}")
        p = self.param.prelu_param
        self.channel_shared = p.channel_shared
        shape = () if self.channel_shared else (bottom[0].shape[1],)
        self.blobs = [self.new_param_blob(shape, 0)]
        if p.HasField("filler"):
            fillers.fill(self.blobs[0], p.filler, f"layer {self.name!r} prelu filler")
        else:
            pointwise.fill(self.device, self.blobs[0].data_buffer(), self.blobs[0].count, 0.25)
            self.blobs[0].data_mem.device_written()

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes < 2:
            raise self.error(f"bottom must have at least 2 axes, got shape {b.shape}")
        want = 1 if self.channel_shared else b.shape[1]
        if self.blobs[0].count != want:
            raise self.error(f"slope has {self.blobs[0].count} values but the bottom "
                             f"{b.shape} needs {want}")
        top[0].reshape(b.shape)
        n, channels, dim = b.count, b.shape[1], b.count_range(2)
        self.geom = (n, channels, dim, channels if self.channel_shared else 1)
        self.fwd = self._keep_x(bottom, top)
        self.fwd.append(prelu_ops.forward(self.device, *self.geom, b.data_buffer(),
                                          top[0].data_buffer(), self.blobs[0].data_buffer()))

    def build_backward(self, bottom, top):
        b, dev = bottom[0], self.device
        n, channels, dim, _ = self.geom
        dy = top[0].diff_buffer()
        # slope first: in place, writing the bottom diff overwrites the top diff
        if self.param_propagate_down[0]:
            if self.channel_shared:
                outer, c, inner = 1, 1, n
            else:
                outer, c, inner = b.shape[0], channels, dim
            self.bwd.append(prelu_ops.slope_grad(dev, outer, c, inner, self._x, dy,
                                                 self.blobs[0].diff_buffer()))
        if self.propagate_down[0]:
            self.bwd.append(prelu_ops.backward(dev, *self.geom, self._x, dy,
                                               b.diff_buffer(), self.blobs[0].data_buffer()))
