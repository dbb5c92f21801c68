"""Element-wise neuron layers: top = f(bottom), in-place allowed."""
from ..blob import Blob
from ..ops import pointwise
from ..ops import work_size
from ..ops import random as rnd
from ..proto import caffe_pb2
from .base import Layer, register


class UnaryNeuron(Layer):
    """Shared plumbing: one forward launch, one backward launch.

    Subclasses set ``op`` (a name in ops.pointwise.UNARY_OPS) and return the
    kernel parameters (a, b, c) from ``op_params``."""
    exact_num_bottom = 1
    exact_num_top = 1
    op = "identity"

    def op_params(self):
        return (0.0, 0.0, 0.0)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)
        self.fwd = [pointwise.unary(self.device, self.op, bottom[0].count,
                                    bottom[0].data_buffer(), top[0].data_buffer(),
                                    *self.op_params())]

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            self.bwd = [pointwise.unary_backward(
                self.device, self.op, bottom[0].count, bottom[0].data_buffer(),
                top[0].data_buffer(), top[0].diff_buffer(), bottom[0].diff_buffer(),
                *self.op_params())]


@register("ReLU")
class ReLULayer(UnaryNeuron):
    op = "relu"

    def op_params(self):
        return (self.param.relu_param.negative_slope, 0.0, 0.0)


@register("Sigmoid")
class SigmoidLayer(UnaryNeuron):
    op = "sigmoid"


@register("TanH")
class TanHLayer(UnaryNeuron):
    op = "tanh"


@register("Dropout")
class DropoutLayer(UnaryNeuron):
    """TEST: identity; TRAIN: random mask drawn on the device each forward
    (kept for backward), survivors scaled by 1/(1-p), as Caffe."""

    def layer_setup(self, bottom, top):
        p = self.param.dropout_param
        self.ratio = p.dropout_ratio
        if not 0.0 <= self.ratio < 1.0:
            raise self.error(f"dropout_ratio must be in [0, 1), got {self.ratio}")
        # scale_train (Fast R-CNN's fork, OpenCV): false leaves the survivors
        # unscaled and multiplies by (1 - p) at TEST; sample_weights_test
        # (SegNet/ENet forks): TEST draws a mask as TRAIN does
        self.scale = 1.0 / (1.0 - self.ratio) if p.scale_train else 1.0
        self.test_scale = 1.0 if p.scale_train else 1.0 - self.ratio
        self.train = self.phase == caffe_pb2.TRAIN or p.sample_weights_test

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)
        n = bottom[0].count
        x, y = bottom[0].data_buffer(), top[0].data_buffer()
        if self.train:
            self.mask = Blob(bottom[0].shape, name=f"{self.name}.mask", device=self.device)
            g, l = work_size(self.device, n)
            s = self.scale
            self._drop = self.device.launch(
                "pointwise.cl", "dropout_fwd", g, l,
                [n, x, y, self.mask.data_buffer(), self.ratio, s, 0, 0])
            self.fwd = [self._drop]
        elif self.test_scale != 1.0:
            self.fwd = [pointwise.unary(self.device, "scale", n, x, y, self.test_scale, 0.0)]
        elif top[0] is bottom[0]:
            self.fwd = []          # TEST in place: the identity costs nothing
        else:
            self.fwd = [pointwise.copy(self.device, n, x, y)]

    def forward_impl(self, bottom, top):
        if self.train:
            seed, stream = rnd.next_stream()
            self._drop.set_arg(6, seed)
            self._drop.set_arg(7, stream)
        super().forward_impl(bottom, top)

    def build_backward(self, bottom, top):
        if not self.propagate_down[0]:
            return
        n = bottom[0].count
        if self.train:
            g, l = work_size(self.device, n)
            s = self.scale
            self.bwd = [self.device.launch(
                "pointwise.cl", "dropout_bwd", g, l,
                [n, top[0].diff_buffer(), self.mask.data_buffer(),
                 bottom[0].diff_buffer(), s])]
        elif self.test_scale != 1.0:
            self.bwd = [pointwise.unary(self.device, "scale", n, top[0].diff_buffer(),
                                        bottom[0].diff_buffer(), self.test_scale, 0.0)]
        elif top[0] is not bottom[0]:
            self.bwd = [pointwise.copy(self.device, n, top[0].diff_buffer(),
                                       bottom[0].diff_buffer())]

