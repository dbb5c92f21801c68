"""PReLU primitives (kernels/prelu.cl); the slope gradient is ops.reduce.channel_sum."""
from . import cpu_units_work_size, work_size
from . import reduce as reduce_ops

SRC = "prelu.cl"


# floats of a plane one CPU work-item step takes at most (prelu.cl's CHUNK)
CPU_CHUNK = 4096


def _launch(dev, name, n, channels, dim, div_factor, buffers):
    """GPUs: one float a work-item (prelu_fwd / prelu_bwd). CPU drivers: the
    planes kernels, work-items over pieces of the (image, channel) planes."""
    if dev.is_cpu and dim > 0 and n > 0:
        planes = n // dim
        pieces = planes * -(-dim // CPU_CHUNK)
        g, l = cpu_units_work_size(dev, pieces, n)
        return dev.launch(SRC, name + "_planes", g, l,
                          [planes, channels, dim, div_factor] + buffers,
                          defines={"CHUNK": CPU_CHUNK})
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, [n, channels, dim, div_factor] + buffers)


def forward(dev, n, channels, dim, div_factor, x, y, slope):
    return _launch(dev, "prelu_fwd", n, channels, dim, div_factor, [x, y, slope])


def backward(dev, n, channels, dim, div_factor, x, dy, dx, slope):
    return _launch(dev, "prelu_bwd", n, channels, dim, div_factor, [x, dy, dx, slope])


def slope_grad(dev, outer, channels, inner, x, dy, dslope):
    """dslope[c] += sum of dy * x * (x <= 0) over channel c of [outer][channels][inner]."""
    return reduce_ops.channel_sum(dev, outer, channels, inner, x, dslope, term="prelu",
                                  w=dy, accumulate=True)
