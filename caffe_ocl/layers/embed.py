"""Layers whose output is read from a learnable parameter: Parameter and
Embed, with BVLC Caffe's semantics.

Semantics decisions (where this differs from BVLC, it is on purpose):
- Parameter: the top shares the parameter's data; its gradient is
  *accumulated* into the parameter diff in backward (BVLC shares the diff
  too, so the gradient is overwritten, which loses it with iter_size > 1).
- Embed: an index outside [0, input_dim) reads as a zero row (BVLC only
  DCHECKs and reads out of bounds); no gradient flows for it.
"""
from ..ops import pointwise
from ..ops import reduce as reduce_ops
from ..ops import shape as shape_ops
from . import fillers
from .base import Layer, register


@register("Parameter")
class ParameterLayer(Layer):
    """No bottom; one learnable blob of parameter_param.shape (zero-filled, as
    Caffe) exposed as the top. The gradient arriving at the top accumulates
    into the parameter diff."""
    exact_num_bottom = 0
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        shape = tuple(self.param.parameter_param.shape.dim)
        if any(d < 0 for d in shape):
            raise self.error(f"negative dimension in parameter_param.shape {shape}")
        self.blobs = [self.new_param_blob(shape, 0)]
        pointwise.fill(self.device, self.blobs[0].data_buffer(), self.blobs[0].count, 0.0)
        self.blobs[0].data_mem.device_written()

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)
        top[0].share_data(self.blobs[0])
        self.fwd = []

    # its forward only makes the parameter current on the device; replayed
    # from a forward trace (plan/trace.py) like any layer that just enqueues
    traceable = True

    def forward(self, bottom, top):
        # the top *is* the parameter's memory: marking it written, as
        # Layer.forward does for a top, moved the parameter's version every
        # pass, and a forward trace that sees a parameter change is never
        # replayed (ViT's class token kept DeiT's batch-1 GPU forward at
        # 38 ms of host walk for 4.6 ms of kernels)
        self.blobs[0].data_mem.to_device()

    def build_backward(self, bottom, top):
        if self.param_propagate_down[0]:
            self.bwd = [pointwise.axpby(self.device, top[0].count, 1.0, top[0].diff_buffer(),
                                        1.0, self.blobs[0].diff_buffer())]


@register("Embed")
class EmbedLayer(Layer):
    """top[..., :] = W[(int)x[...], :] (+ bias); W is input_dim x num_output.
    Gradients for W and bias; none for the (integer) input."""
    exact_num_bottom = 1
    exact_num_top = 1
    allow_force_backward = False

    def layer_setup(self, bottom, top):
        p = self.param.embed_param
        self.N, self.K = p.num_output, p.input_dim
        if self.N <= 0:
            raise self.error("num_output must be positive")
        if self.K <= 0:
            raise self.error("input_dim must be positive")
        self.bias_term = p.bias_term
        self.blobs = [self.new_param_blob((self.K, self.N), 0)]
        fillers.fill(self.blobs[0], p.weight_filler, f"layer {self.name!r} weight_filler")
        if self.bias_term:
            self.blobs.append(self.new_param_blob((self.N,), 1))
            fillers.fill(self.blobs[1], p.bias_filler, f"layer {self.name!r} bias_filler")

    def reshape(self, bottom, top):
        b = bottom[0]
        self.M = b.count
        top[0].reshape(b.shape + (self.N,))
        bias = self.blobs[1].data_buffer() if self.bias_term else None
        self.fwd = [shape_ops.embed(self.device, self.M, self.N, self.K, b.data_buffer(),
                                    self.blobs[0].data_buffer(), bias, top[0].data_buffer())]

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            raise self.error("cannot backpropagate to the Embed input (indices)")
        dy = top[0].diff_buffer()
        if self.param_propagate_down[0]:
            self.bwd.append(shape_ops.embed_weight_grad(self.device, self.M, self.N, self.K,
                                                        bottom[0].data_buffer(), dy,
                                                        self.blobs[0].diff_buffer()))
        if self.bias_term and self.param_propagate_down[1]:
            self.bwd.append(reduce_ops.channel_sum(self.device, self.M, self.N, 1, dy,
                                                   self.blobs[1].diff_buffer(),
                                                   accumulate=True))
