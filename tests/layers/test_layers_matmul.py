"""MatMul (caffe_ocl's two-bottom matrix product): forward against float64
NumPy, backward by finite differences, shape errors."""
import numpy as np
import pytest

from caffe_ocl import testing
from caffe_ocl.errors import ShapeError

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("a, b", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 6)),
                                  ((2, 3, 5, 4), (2, 3, 4, 7)), ((1, 1, 9, 33), (1, 1, 33, 17))])
def test_matmul_forward_and_gradient(a, b):
    x = RNG.standard_normal(a).astype(np.float32)
    y = RNG.standard_normal(b).astype(np.float32)
    layer, bot, top = testing.make_layer('type: "MatMul"', [x, y])
    out, = testing.forward(layer, bot, top)
    ref = np.matmul(x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    testing.check_gradient(layer, bot, top, threshold=1e-2, max_checks=30)


@pytest.mark.parametrize("a, b", [((3, 4), (5, 6)), ((2, 3, 4), (3, 4, 6)), ((4,), (4, 2))])
def test_matmul_shape_errors(a, b):
    x, y = np.zeros(a, np.float32), np.zeros(b, np.float32)
    with pytest.raises(ShapeError, match="do not multiply"):
        testing.make_layer('type: "MatMul"', [x, y])
