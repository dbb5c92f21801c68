"""Reduction and ArgMax layers with BVLC Caffe's semantics."""
import numpy as np

from ..errors import ShapeError
from ..ops import reduce as reduce_ops
from ..ops import shape as shape_ops
from ..proto import caffe_pb2
from .base import Layer, register


@register("Reduction")
class ReductionLayer(Layer):
    """Reduce all axes from ``axis`` on: SUM, ASUM, SUMSQ or MEAN, times coeff."""
    exact_num_bottom = 1
    exact_num_top = 1
    _TERMS = {caffe_pb2.ReductionParameter.SUM: "sum", caffe_pb2.ReductionParameter.MEAN: "sum",
              caffe_pb2.ReductionParameter.ASUM: "asum",
              caffe_pb2.ReductionParameter.SUMSQ: "sumsq"}

    def layer_setup(self, bottom, top):
        self.op = self.param.reduction_param.operation
        if self.op not in self._TERMS:
            raise self.error(f"unknown reduction operation {self.op}")
        self.term = self._TERMS[self.op]

    def reshape(self, bottom, top):
        p, b = self.param.reduction_param, bottom[0]
        ax = self.canonical_axis(b, p.axis)
        top[0].reshape(b.shape[:ax])
        self.num, self.dim = b.count_range(0, ax), b.count_range(ax)
        coeff = np.float32(p.coeff)
        if self.op == caffe_pb2.ReductionParameter.MEAN:
            coeff = coeff / np.float32(self.dim)
        self.coeff = float(coeff)
        self.fwd = [reduce_ops.channel_sum(self.device, 1, self.num, self.dim, b.data_buffer(),
                                           top[0].data_buffer(), self.term, alpha=self.coeff)]

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            self.bwd = [reduce_ops.reduction_backward(
                self.device, self.num, self.dim, bottom[0].data_buffer(), top[0].diff_buffer(),
                bottom[0].diff_buffer(), self.coeff, self.term)]


@register("ArgMax")
class ArgMaxLayer(Layer):
    """Indices (and/or values) of the top_k largest values, ties to the larger
    index as Caffe's partial_sort with std::greater. No backward."""
    exact_num_bottom = 1
    exact_num_top = 1
    has_backward = False
    allow_force_backward = False

    def reshape(self, bottom, top):
        p, b = self.param.argmax_param, bottom[0]
        k = p.top_k
        if k < 1:
            raise self.error("top_k must not be less than 1")
        if p.HasField("axis"):
            ax = self.canonical_axis(b, p.axis)
            if k > b.shape[ax]:
                raise self.error(f"top_k {k} must be <= the dimension of axis {ax} "
                                 f"({b.shape[ax]})", ShapeError)
            shape = list(b.shape)
            shape[ax] = k
            dim, axis_dist = b.shape[ax], b.count_range(ax + 1)
            mode = 1 if p.out_max_val else 0
        else:
            if k > b.count_range(1):
                raise self.error(f"top_k {k} must be <= the size of one item of the "
                                 f"flattened bottom ({b.count_range(1)})", ShapeError)
            shape = [1] * max(b.num_axes, 3)
            shape[0] = b.shape[0]
            shape[2] = k
            if p.out_max_val:
                shape[1] = 2
            dim, axis_dist = b.count_range(1), 1
            mode = 2 if p.out_max_val else 0
        top[0].reshape(shape)
        num = b.count // dim if dim else 0
        self.fwd = [shape_ops.argmax(self.device, num, dim, axis_dist, k, mode,
                                     b.data_buffer(), top[0].data_buffer())]

    def build_backward(self, bottom, top):
        if any(self.propagate_down):
            raise self.error("ArgMax has no backward (as in Caffe)")
