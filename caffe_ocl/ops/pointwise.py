"""Element-wise primitives (kernels/pointwise.cl)."""
from . import work_size
from .gemm import act_defines

SRC = "pointwise.cl"

# op name -> number of the OP macro in pointwise.cl
UNARY_OPS = {
    "identity": 0, "relu": 1, "sigmoid": 2, "tanh": 3, "scale": 4, "absval": 5,
    "elu": 6, "power": 7, "exp": 8, "log": 9, "bnll": 10, "threshold": 11,
    "clip": 12, "swish": 13, "square": 14, "sqrt": 15,
}


def unary(dev, op, n, x, y, a=0.0, b=0.0, c=0.0, offx=0, offy=0):
    """y[offy:offy+n] = f(x[offx:offx+n]); parameters a, b, c as in pointwise.cl."""
    g, l = work_size(dev, n)
    return dev.launch(SRC, "unary_fwd", g, l, [n, x, offx, y, offy, a, b, c],
                      {"OP": UNARY_OPS[op]})


def unary_backward(dev, op, n, x, y, dy, dx, a=0.0, b=0.0, c=0.0, accumulate=False):
    """dx = dy * f'(x, y) (or dx += ... when accumulate)."""
    g, l = work_size(dev, n)
    return dev.launch(SRC, "unary_bwd", g, l, [n, x, y, dy, dx, a, b, c],
                      {"OP": UNARY_OPS[op], "BETA": int(bool(accumulate))})


def fill_launch(dev, buf, n, value, off=0):
    g, l = work_size(dev, n)
    return dev.launch(SRC, "fill", g, l, [n, float(value), buf, off])


def fill(dev, buf, n, value, off=0):
    """Fill now (one-off, e.g. initialisation)."""
    fill_launch(dev, buf, n, value, off).run(dev.queue)


def axpby(dev, n, alpha, x, beta, y, offx=0, offy=0):
    """y = alpha*x + beta*y."""
    g, l = work_size(dev, n)
    return dev.launch(SRC, "axpby", g, l, [n, alpha, x, offx, beta, y, offy])


def sum2(dev, n, c0, x0, c1, x1, y, act=None):
    """y = act(c0*x0 + c1*x1) in one pass (act: None, ('relu', slope) or
    ('clip', lo, hi), as ops.gemm.act_defines)."""
    kind, a, b = act_defines(act)
    g, l = work_size(dev, n)
    return dev.launch(SRC, "sum2_act", g, l, [n, float(c0), x0, float(c1), x1, y, a, b],
                      {"ACT": kind})


def sum2_backward(dev, n, dy, y, c0, dx0, c1, dx1, act=None, keep_g=True, g_out=None):
    """Backward of ``sum2`` followed by a ReLU (or no activation) with
    output y: g = dy * relu'(y) (from the output: Caffe's in-place ReLU
    rule, and for a ReLU writing a new top the same gate, y > 0 exactly
    where its input is), dx0 = c0*g, dx1 = c1*g (a None dx is skipped), g
    written into ``g_out`` (default dy: the in-place ReLU's diff) when
    ``keep_g``. Not for Clip: its in-place backward gates by the saved
    input (layers/neuron_ext.py), which is not kept here."""
    kind, a, b = act_defines(act)
    if kind not in (0, 1):
        raise ValueError(f"sum2_backward: only ReLU or no activation, got {act!r}")
    g, l = work_size(dev, n)
    return dev.launch(SRC, "sum2_act_bwd", g, l,       # an absent dx's slot gets dy, unused
                      [n, dy, y, float(c0), dy if dx0 is None else dx0,
                       float(c1), dy if dx1 is None else dx1, a, b,
                       dy if g_out is None else g_out],
                      {"ACT": kind, "PD0": int(dx0 is not None), "PD1": int(dx1 is not None),
                       "KEEP_G": int(bool(keep_g))})


def copy(dev, n, x, y, offx=0, offy=0):
    return axpby(dev, n, 1.0, x, 0.0, y, offx, offy)


def copy2d(dev, rows, cols, x, offx, ldx, y, offy, ldy, accumulate=False):
    """Copy a rows x cols block between strided layouts."""
    g, l = work_size(dev, rows * cols)
    return dev.launch(SRC, "copy2d", g, l,
                      [rows, cols, x, offx, ldx, y, offy, ldy, int(bool(accumulate))])


def add_bias(dev, outer, channels, inner, x, y, bias):
    g, l = work_size(dev, outer * channels * inner)
    return dev.launch(SRC, "add_bias", g, l, [outer, channels, inner, x, y, bias])


def bias_grad(dev, outer, channels, inner, dy, dbias, accumulate=True):
    # CPU drivers run the items of a group one after another: groups of one
    # so that the channels spread over the cores
    l = 1 if dev.is_cpu else 64
    return dev.launch(SRC, "bias_grad", (channels,), (l,),
                      [outer, channels, inner, dy, dbias, int(bool(accumulate))])


def normalize_rows_l1(dev, rows, dim, y):
    return dev.launch(SRC, "normalize_rows_l1", (rows,), (64,), [rows, dim, y])

