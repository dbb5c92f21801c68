"""Common layers: InnerProduct, Softmax."""
from ..errors import ShapeError
from ..ops import gemm as gemm_ops
from ..ops.conv import OnChange
from ..ops.gemm_splitk import adds_residual, gemm_launches, keeps_weights_packed
from ..ops import pointwise
from ..ops import softmax as softmax_ops
from . import fillers
from .base import Layer, register


@register("InnerProduct")
class InnerProductLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.inner_product_param
        self.num_output = p.num_output
        if self.num_output <= 0:
            raise self.error("num_output must be positive")
        self.bias_term = p.bias_term
        self.transpose = p.transpose
        self.axis = self.canonical_axis(bottom[0], p.axis)
        self.K = bottom[0].count_range(self.axis)
        wshape = (self.K, self.num_output) if self.transpose else (self.num_output, self.K)
        self.blobs = [self.new_param_blob(wshape, 0)]
        fillers.fill(self.blobs[0], p.weight_filler, f"layer {self.name!r} weight_filler")
        if self.bias_term:
            self.blobs.append(self.new_param_blob((self.num_output,), 1))
            fillers.fill(self.blobs[1], p.bias_filler, f"layer {self.name!r} bias_filler")

    def reshape(self, bottom, top):
        axis = self.canonical_axis(bottom[0], self.param.inner_product_param.axis)
        k = bottom[0].count_range(axis)
        if k != self.K:
            raise self.error(f"input size {k} (shape {bottom[0].shape} from axis {axis}) "
                             f"does not match the weights' {self.K}", ShapeError)
        self.M = bottom[0].count_range(0, axis)
        top[0].reshape(bottom[0].shape[:axis] + (self.num_output,))
        bias = self.blobs[1].data_buffer() if self.bias_term else None
        self.fwd = self.forward_launches(bottom[0], top[0], self.blobs[0].data_buffer(),
                                         bias, weight_version=self.weight_version())

    def forward_launches(self, bottom, top, weight, bias, act=None, weight_version=None,
                         residual=None):
        """top[M, N] = act(bottom[M, K] * W^T + bias [+ residual])  (W stored
        N x K unless transpose); also used by the plan's groups with folded
        weights, an activation and a shortcut (a buffer laid out as top;
        only where ``takes_residual``). Split along K on GPUs when M x N is
        too small to fill the device (ops/gemm_splitk.py). weight_version
        (a TEST net's, Layer.weight_version): on CPU drivers the weights may
        be read from panels packed once, packed again only when the token
        changes (gemm_splitk.keeps_weights_packed)."""
        dev, M, N, K = self.device, self.M, self.num_output, self.K
        if weight_version is not None and keeps_weights_packed(dev, M, N, K):
            packed = self._packed_copy(weight)
            pack = gemm_ops.pack_b_panels(dev, N, K, weight, packed, trans=not self.transpose)
            return [OnChange(pack, weight_version),
                    gemm_ops.gemm(dev, M, N, K, bottom.data_buffer(), packed,
                                  top.data_buffer(), packed_b=True, bias=bias, bias_axis=1,
                                  act=act, residual=residual)]
        return gemm_launches(dev, M, N, K, bottom.data_buffer(), weight, top.data_buffer(),
                             trans_b=not self.transpose, bias=bias, bias_axis=1, act=act,
                             residual=residual)

    def _packed_copy(self, weight):
        """The buffer holding ``weight`` packed (ops.gemm.pack_b_panels),
        one per weight buffer: the layer's own launches and a plan group's
        over the same weights share it (each of their packs writes the
        weights' present values, so either may repack it); folded weights
        are another buffer and get their own."""
        cache = self.__dict__.setdefault("_packed_copies", {})
        nbytes = 4 * gemm_ops.packed_b_floats(self.device, self.num_output, self.K)
        held = cache.get(id(weight))
        if held is None or held[0] is not weight or held[2] != nbytes:
            cache.pop(id(weight), None)
            while len(cache) >= 2:      # the own weights and one folded copy at most
                cache.pop(next(iter(cache)))
            held = cache[id(weight)] = (weight, self.device.alloc(nbytes), nbytes)
        return held[1]

    def takes_residual(self):
        """Whether ``forward_launches`` (given this layer's weight_version,
        as the plan's groups pass it) can add a shortcut in the product's
        epilogue: a GEMM launch or a split of K, not a small-M kernel."""
        dev, M, N, K = self.device, self.M, self.num_output, self.K
        return (self.weight_version() is not None and keeps_weights_packed(dev, M, N, K)) \
            or adds_residual(dev, M, N, K, trans_b=not self.transpose)

    def build_backward(self, bottom, top):
        dev, M, N, K = self.device, self.M, self.num_output, self.K
        dy = top[0].diff_buffer()
        if self.param_propagate_down[0]:
            if self.transpose:   # dW[K, N] += x^T[K, M] * dy[M, N]
                self.bwd.append(gemm_ops.gemm(dev, K, N, M, bottom[0].data_buffer(), dy,
                                              self.blobs[0].diff_buffer(), trans_a=True,
                                              beta=1.0))
            else:                # dW[N, K] += dy^T[N, M] * x[M, K]
                self.bwd.append(gemm_ops.gemm(dev, N, K, M, dy, bottom[0].data_buffer(),
                                              self.blobs[0].diff_buffer(), trans_a=True,
                                              beta=1.0))
        if self.bias_term and self.param_propagate_down[1]:
            self.bwd.append(pointwise.bias_grad(dev, M, N, 1, dy, self.blobs[1].diff_buffer()))
        if self.propagate_down[0]:   # dx[M, K] = dy[M, N] * W
            self.bwd += gemm_launches(dev, M, K, N, dy, self.blobs[0].data_buffer(),
                                      bottom[0].diff_buffer(), trans_b=self.transpose)


@register("Softmax")
class SoftmaxLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        axis = self.canonical_axis(bottom[0], self.param.softmax_param.axis)
        self.dims = (bottom[0].count_range(0, axis), bottom[0].shape[axis],
                     bottom[0].count_range(axis + 1))
        top[0].reshape(bottom[0].shape)
        self.fwd = softmax_ops.forward(self.device, *self.dims, bottom[0].data_buffer(),
                                       top[0].data_buffer())

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            self.bwd = [softmax_ops.backward(self.device, *self.dims, top[0].data_buffer(),
                                             top[0].diff_buffer(), bottom[0].diff_buffer())]


@register("Split")
class SplitLayer(Layer):
    """Tops share the bottom's data; backward sums the tops' diffs."""
    exact_num_bottom = 1
    min_top = 1

    def reshape(self, bottom, top):
        for t in top:
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])
        self.fwd = []

    def build_backward(self, bottom, top):
        if not self.propagate_down[0]:
            return
        n, dx = bottom[0].count, bottom[0].diff_buffer()
        if len(top) == 1:
            self.bwd = [pointwise.copy(self.device, n, top[0].diff_buffer(), dx)]
        else:       # the first two tops' diffs summed in one pass, more accumulate
            self.bwd = [pointwise.sum2(self.device, n, 1.0, top[0].diff_buffer(), 1.0,
                                       top[1].diff_buffer(), dx)]
        for t in top[2:]:
            self.bwd.append(pointwise.axpby(self.device, n, 1.0, t.diff_buffer(), 1.0, dx))
