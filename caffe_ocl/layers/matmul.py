"""MatMul: the product of two computed blobs (caffe_ocl's own layer type;
no BVLC Caffe layer multiplies two bottoms as matrices).

``top[..., m, n] = sum_k A[..., m, k] * B[..., k, n]`` for bottoms A of
shape (..., M, K) and B of shape (..., K, N) with the same leading axes
(attention's scores Q K^T and weighted values; onnx2caffe writes it with
``--extension_layers``). One batched GEMM a pass; backward
dA = dTop B^T, dB = A^T dTop, batched alike. No parameters."""
from ..errors import ShapeError
from ..ops import gemm as gemm_ops
from .base import Layer, register


@register("MatMul")
class MatMulLayer(Layer):
    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        a, b = bottom[0].shape, bottom[1].shape
        if len(a) < 2 or len(b) < 2 or a[:-2] != b[:-2] or a[-1] != b[-2]:
            raise self.error(f"bottoms of shapes {a} and {b} do not multiply as matrices "
                             "(..., M, K) x (..., K, N) with the same leading axes",
                             ShapeError)
        self.M, self.K, self.N = a[-2], a[-1], b[-1]
        self.batch = bottom[0].count_range(0, len(a) - 2)
        top[0].reshape(a[:-1] + (self.N,))
        self.fwd = [self._product(bottom[0].data_buffer(), bottom[1].data_buffer(),
                                  top[0].data_buffer(), self.M, self.N, self.K)] \
            if top[0].count and self.K else []
        if top[0].count and not self.K:
            raise self.error("bottoms with 0 columns to sum over", ShapeError)

    def _product(self, x, y, out, M, N, K, trans_a=False, trans_b=False):
        """out[i] = op(x[i]) op(y[i]) for each leading index i (x, y, out
        dense, M x K, K x N, M x N after the transposes)."""
        sx = M * K
        sy = K * N
        return gemm_ops.gemm(self.device, M, N, K, x, y, out, trans_a=trans_a,
                             trans_b=trans_b, batch=self.batch, stride_a=(sx, 0),
                             stride_b=(sy, 0), stride_c=(M * N, 0), tiles="auto")

    def build_backward(self, bottom, top):
        M, N, K = self.M, self.N, self.K
        dy = top[0].diff_buffer()
        if not top[0].count:
            return
        if self.propagate_down[0]:      # dA[M, K] = dTop[M, N] B^T
            self.bwd.append(self._product(dy, bottom[1].data_buffer(),
                                          bottom[0].diff_buffer(), M, K, N, trans_b=True))
        if self.propagate_down[1]:      # dB[K, N] = A^T dTop[M, N]
            self.bwd.append(self._product(bottom[0].data_buffer(), dy,
                                          bottom[1].diff_buffer(), K, N, M, trans_a=True))
