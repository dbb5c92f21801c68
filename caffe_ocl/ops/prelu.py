"""PReLU primitives (kernels/prelu.cl); the slope gradient is ops.reduce.channel_sum."""
from . import work_size
from . import reduce as reduce_ops

SRC = "prelu.cl"


def forward(dev, n, channels, dim, div_factor, x, y, slope):
    g, l = work_size(dev, n)
    return dev.launch(SRC, "prelu_fwd", g, l, [n, channels, dim, div_factor, x, y, slope])


def backward(dev, n, channels, dim, div_factor, x, dy, dx, slope):
    g, l = work_size(dev, n)
    return dev.launch(SRC, "prelu_bwd", g, l, [n, channels, dim, div_factor, x, dy, dx, slope])


def slope_grad(dev, outer, channels, inner, x, dy, dslope):
    """dslope[c] += sum of dy * x * (x <= 0) over channel c of [outer][channels][inner]."""
    return reduce_ops.channel_sum(dev, outer, channels, inner, x, dslope, term="prelu",
                                  w=dy, accumulate=True)
