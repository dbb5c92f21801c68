"""Eltwise layer with BVLC Caffe's semantics: PROD, SUM (with coefficients)
and MAX of same-shaped bottoms.

Semantics decision (where this differs from BVLC, it is on purpose): the
bottoms are processed in reverse order in backward so that an in-place
bottom 0 is written last.
"""
from ..errors import ShapeError
from ..ops import pointwise
from ..ops import shape as shape_ops
from ..proto import caffe_pb2
from .base import Layer, register


@register("Eltwise")
class EltwiseLayer(Layer):
    min_bottom = 2
    exact_num_top = 1
    PROD, SUM, MAX = (caffe_pb2.EltwiseParameter.PROD, caffe_pb2.EltwiseParameter.SUM,
                      caffe_pb2.EltwiseParameter.MAX)

    def layer_setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        if len(p.coeff) and len(p.coeff) != len(bottom):
            raise self.error(f"takes one coefficient per bottom blob ({len(bottom)}), "
                             f"got {len(p.coeff)}")
        if self.op == self.PROD and len(p.coeff):
            raise self.error("only takes coefficients for summation (operation SUM)")
        self.coeffs = list(p.coeff) if len(p.coeff) else [1.0] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self.mask = None

    def reshape(self, bottom, top):
        for b in bottom[1:]:
            if b.shape != bottom[0].shape:
                raise self.error(f"all bottoms must have the same shape: {bottom[0].name!r} "
                                 f"{bottom[0].shape} vs {b.name!r} {b.shape}", ShapeError)
        top[0].reshape(bottom[0].shape)
        dev, n, y = self.device, bottom[0].count, top[0].data_buffer()
        if self.op == self.SUM:
            if len(bottom) == 1:
                self.fwd = [pointwise.axpby(dev, n, self.coeffs[0], bottom[0].data_buffer(),
                                            0.0, y)]
            else:   # the first two in one pass, more accumulate
                self.fwd = [pointwise.sum2(dev, n, self.coeffs[0], bottom[0].data_buffer(),
                                           self.coeffs[1], bottom[1].data_buffer(), y)]
            self.fwd += [pointwise.axpby(dev, n, c, b.data_buffer(), 1.0, y)
                         for c, b in zip(self.coeffs[2:], bottom[2:])]
        elif self.op == self.PROD:
            self.fwd = [shape_ops.mul(dev, n, bottom[0].data_buffer(), bottom[1].data_buffer(), y)]
            self.fwd += [shape_ops.mul(dev, n, y, b.data_buffer(), y) for b in bottom[2:]]
        elif self.op == self.MAX:
            self.mask = dev.alloc(4 * max(n, 1))
            self.fwd = [shape_ops.eltwise_max(dev, n, bottom[0].data_buffer(),
                                              bottom[1].data_buffer(), y, self.mask, 1)]
            self.fwd += [shape_ops.eltwise_max(dev, n, y, b.data_buffer(), y, self.mask, i)
                         for i, b in enumerate(bottom) if i >= 2]
        else:
            raise self.error(f"unknown eltwise operation {self.op}")

    def build_backward(self, bottom, top):
        dev, n = self.device, top[0].count
        dy, y = top[0].diff_buffer(), top[0].data_buffer()
        for i in reversed(range(len(bottom))):
            if not self.propagate_down[i]:
                continue
            dx = bottom[i].diff_buffer()
            if self.op == self.PROD:
                if self.stable_prod_grad:
                    others = [bottom[j].data_buffer() for j in range(len(bottom)) if j != i]
                    if len(others) == 1:
                        self.bwd.append(shape_ops.mul(dev, n, others[0], dy, dx))
                        continue
                    self.bwd.append(shape_ops.mul(dev, n, others[0], others[1], dx))
                    self.bwd += [shape_ops.mul(dev, n, dx, o, dx) for o in others[2:]]
                    self.bwd.append(shape_ops.mul(dev, n, dx, dy, dx))
                else:
                    self.bwd.append(shape_ops.div_mul(dev, n, y, bottom[i].data_buffer(), dy, dx))
            elif self.op == self.SUM:
                c = self.coeffs[i]
                self.bwd.append(pointwise.copy(dev, n, dy, dx) if c == 1.0
                                else pointwise.axpby(dev, n, c, dy, 0.0, dx))
            else:
                self.bwd.append(shape_ops.eltwise_max_backward(dev, n, dy, self.mask, dx, i))
