"""Caffe's weight fillers, computed on the device.

Same distributions and scale rules as Caffe's filler.hpp (constant,
uniform, gaussian with `sparse`, positive_unitball, xavier, msra,
bilinear); the random streams differ from Caffe's CPU Mersenne twister,
so filled values are not bit-identical to Caffe's."""
import math

from ..errors import LayerError
from ..ops import pointwise, random as rnd, work_size

# Caffe's FillerParameter.VarianceNorm
FAN_IN, FAN_OUT, AVERAGE = 0, 1, 2


def _fan(blob, variance_norm):
    shape = blob.shape
    if not shape:
        return 1.0
    fan_in = blob.count / shape[0]
    fan_out = blob.count / shape[1] if len(shape) > 1 else blob.count
    if variance_norm == AVERAGE:
        return (fan_in + fan_out) / 2.0
    if variance_norm == FAN_OUT:
        return fan_out
    return fan_in


def _checked_fan(blob, variance_norm, where, kind):
    """The fan, positive (a blob with a zero axis has none: Caffe divides
    by zero there)."""
    if blob.count == 0 or (blob.shape and blob.shape[0] == 0):
        raise LayerError(f"{where}: {kind} filler on a blob of shape {list(blob.shape)} "
                         "(no values: a zero num_output, channels or kernel size?)")
    fan = _fan(blob, variance_norm)
    if not fan > 0:
        raise LayerError(f"{where}: {kind} filler: fan of {fan} for a blob of shape "
                         f"{list(blob.shape)}")
    return fan


def fill(blob, filler, where="filler"):
    """Fill ``blob``'s data on its device according to FillerParameter ``filler``."""
    mem = blob.data_mem
    dev = mem.device
    buf = mem.buffer()
    n = blob.count
    t = filler.type
    if t == "constant":
        pointwise.fill(dev, buf, n, filler.value)
    elif t == "uniform":
        rnd.uniform(dev, buf, n, filler.min, filler.max)
    elif t == "gaussian":
        rnd.gaussian(dev, buf, n, filler.mean, filler.std)
        if filler.sparse >= 0:
            if len(blob.shape) < 1 or blob.shape[0] == 0:
                raise LayerError(f"{where}: sparse gaussian filler needs a blob with num > 0")
            rnd.sparsify(dev, buf, n, float(filler.sparse) / blob.shape[0])
    elif t == "positive_unitball":
        rnd.uniform(dev, buf, n, 0.0, 1.0)
        rows = blob.shape[0] if blob.shape else 1
        pointwise.normalize_rows_l1(dev, rows, n // max(rows, 1), buf).run(dev.queue)
    elif t == "xavier":
        scale = math.sqrt(3.0 / _checked_fan(blob, filler.variance_norm, where, t))
        rnd.uniform(dev, buf, n, -scale, scale)
    elif t == "msra":
        std = math.sqrt(2.0 / _checked_fan(blob, filler.variance_norm, where, t))
        rnd.gaussian(dev, buf, n, 0.0, std)
    elif t == "bilinear":
        if len(blob.shape) != 4 or blob.shape[2] != blob.shape[3]:
            raise LayerError(f"{where}: bilinear filler needs a 4-D blob with "
                             f"square kernels, got shape {blob.shape}")
        g, l = work_size(dev, n)
        dev.launch("pointwise.cl", "bilinear_fill", g, l,
                   [n, blob.shape[2], blob.shape[3], buf]).run(dev.queue)
    else:
        raise LayerError(f"{where}: unknown filler type {t!r} (constant, uniform, "
                         "gaussian, positive_unitball, xavier, msra, bilinear)")
    mem.device_written()
