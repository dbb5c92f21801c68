"""More vision layers: Im2col and SPP (spatial pyramid pooling)."""
import math

from ..blob import Blob
from ..errors import ShapeError
from ..ops import conv as conv_ops
from ..ops import pointwise
from ..ops import pool as pool_ops
from ..proto import caffe_pb2
from .base import Layer, register
from .vision import read_conv_geometry


@register("Im2col")
class Im2colLayer(Layer):
    """top[n] = im2col(bottom[n]): (N, C*KH*KW, HO, WO), Caffe's column layout."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        read_conv_geometry(self, self.param.convolution_param, bottom[0], "im2col")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != self.axis + 3:
            raise self.error(f"bottom {bottom[0].name!r} {shape} must keep 2 spatial axes "
                             f"after axis {self.axis}", ShapeError)
        n = int(math.prod(shape[:self.axis]))
        c, h, w = shape[self.axis:]
        self.geom = g = conv_ops.ConvGeometry(n, c, h, w, c, *self.kernel, *self.pad,
                                              *self.stride, *self.dilation)
        if g.out_h <= 0 or g.out_w <= 0:
            raise self.error(f"kernel {self.kernel} (dilation {self.dilation}) does not fit "
                             f"input {h}x{w} with pad {self.pad}", ShapeError)
        top[0].reshape(shape[:self.axis] + (g.col_rows, g.out_h, g.out_w))
        self.fwd = [conv_ops.im2col(self.device, g, n, bottom[0].data_buffer(), 0,
                                    top[0].data_buffer())] if top[0].count else []

    def build_backward(self, bottom, top):
        if self.propagate_down[0] and bottom[0].count:
            g = self.geom
            self.bwd = [conv_ops.col2im(self.device, g, g.num, top[0].diff_buffer(),
                                        bottom[0].diff_buffer(), 0)]


def _pool_out(size, k, s, p):
    """Caffe's pooled size: ceil rounding, last window starting inside the image."""
    o = int(math.ceil((size + 2 * p - k) / s)) + 1
    if p and (o - 1) * s >= size + p:
        o -= 1
    return o


@register("SPP")
class SPPLayer(Layer):
    """Spatial pyramid pooling: level i pools into 2^i x 2^i bins (Caffe's
    kernel/pad/stride choice), each flattened to (N, C*bins) and concatenated
    along axis 1; with pyramid_height 1 the top is the pooled (N, C, h, w)."""
    exact_num_bottom = 1
    exact_num_top = 1
    MAX, AVE, STOCHASTIC = 0, 1, 2

    def layer_setup(self, bottom, top):
        p = self.param.spp_param
        self.height = p.pyramid_height
        if self.height < 1:
            raise self.error(f"pyramid_height must be at least 1, got {self.height}")
        self.method = p.pool
        if self.method not in (self.MAX, self.AVE, self.STOCHASTIC):
            raise self.error(f"unknown pooling method {self.method}")
        if self.method == self.STOCHASTIC and self.phase == caffe_pb2.TRAIN:
            raise self.error("STOCHASTIC pooling is implemented for the TEST phase only")

    def _levels(self, h, w):
        out = []
        for i in range(self.height):
            bins = 2 ** i
            kh, kw = -(-h // bins), -(-w // bins)
            ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
            if ph >= kh or pw >= kw:
                raise self.error(
                    f"pyramid level {i} ({bins}x{bins} bins) of a {h}x{w} input needs pad "
                    f"({ph}, {pw}) not smaller than kernel ({kh}, {kw}), which Caffe's "
                    f"pooling rejects; use a larger input or a smaller pyramid_height",
                    ShapeError)
            if (ph or pw) and self.method == self.STOCHASTIC:
                raise self.error(f"pyramid level {i} of a {h}x{w} input needs padding, "
                                 "which STOCHASTIC pooling does not support", ShapeError)
            out.append(((kh, kw), (kh, kw), (ph, pw),
                        (_pool_out(h, kh, kh, ph), _pool_out(w, kw, kw, pw))))
        return out

    def _pool(self, shape, level, x, y, mask):
        k, s, p, out_hw = level
        if self.method == self.MAX:
            return pool_ops.max_forward(self.device, shape, out_hw, k, s, p, x, y, mask)
        if self.method == self.AVE:
            return pool_ops.ave_forward(self.device, shape, out_hw, k, s, p, x, y)
        return pool_ops.stochastic_test_forward(self.device, shape, out_hw, k, s, x, y)

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got "
                             f"{b.shape}", ShapeError)
        n, c, h, w = shape = b.shape
        if h <= 0 or w <= 0:
            raise self.error(f"input dimensions cannot be zero: {b.shape}", ShapeError)
        dev = self.device
        self.levels = self._levels(h, w)
        self.level_out, self.masks, self.offsets = [], [], []
        x = b.data_buffer()
        self.fwd = []
        if self.height == 1:
            ho, wo = self.levels[0][3]
            top[0].reshape((n, c, ho, wo))
            self.level_out = [top[0]]
        else:
            sizes = [c * lv[3][0] * lv[3][1] for lv in self.levels]
            self.total = sum(sizes)
            top[0].reshape((n, self.total))
            off = 0
            for i, lv in enumerate(self.levels):
                self.level_out.append(Blob((n, c) + lv[3], name=f"{self.name}.pool{i}",
                                           device=dev))
                self.offsets.append(off)
                off += sizes[i]
        for i, lv in enumerate(self.levels):
            mask = None
            if self.method == self.MAX:
                mask = Blob(self.level_out[i].shape, name=f"{self.name}.mask{i}", device=dev)
            self.masks.append(mask)
            if n * c == 0:
                continue
            out = self.level_out[i]
            self.fwd.append(self._pool(shape, lv, x, out.data_buffer(),
                                       mask.data_buffer() if mask else None))
            if self.height > 1:   # flatten + concat along axis 1
                cols = out.count // n
                self.fwd.append(pointwise.copy2d(dev, n, cols, out.data_buffer(), 0, cols,
                                                 top[0].data_buffer(), self.offsets[i],
                                                 self.total))

    def build_backward(self, bottom, top):
        b = bottom[0]
        if not self.propagate_down[0] or b.count == 0:
            return
        if self.method == self.STOCHASTIC:
            raise self.error("STOCHASTIC pooling has no backward at TEST")
        dev, shape, n = self.device, b.shape, b.shape[0]
        dx = b.diff_buffer()
        if self.height > 1:
            self.scratch = Blob(shape, name=f"{self.name}.dx", device=dev)
        for i, lv in enumerate(self.levels):
            k, s, p, out_hw = lv
            out = self.level_out[i]
            if self.height > 1:   # split the concatenated diff back per level
                cols = out.count // n
                self.bwd.append(pointwise.copy2d(dev, n, cols, top[0].diff_buffer(),
                                                 self.offsets[i], self.total,
                                                 out.diff_buffer(), 0, cols))
            target = dx if i == 0 else self.scratch.diff_buffer()
            if self.method == self.MAX:
                self.bwd.append(pool_ops.max_backward(dev, shape, out_hw, k, s, p,
                                                      out.diff_buffer(),
                                                      self.masks[i].data_buffer(), target))
            else:
                self.bwd.append(pool_ops.ave_backward(dev, shape, out_hw, k, s, p,
                                                      out.diff_buffer(), target))
            if i > 0:   # Caffe's Split backward sums the levels' gradients
                self.bwd.append(pointwise.axpby(dev, b.count, 1.0, target, 1.0, dx))
