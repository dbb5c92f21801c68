"""Helpers shared by both conversion directions: errors, attribute reading,
and the pooling geometry of Caffe and ONNX (output sizes and the averaging
divisor of each window), which decide how a pooling maps across."""
import numpy as np

from ..errors import CaffeOclError


class OnnxConversionError(CaffeOclError):
    """A model that cannot be converted (bad file, missing shapes, ...)."""


class UnsupportedModelError(OnnxConversionError):
    """One or more nodes/layers have no equivalent; ``.items`` lists them as
    (op type, node name, reason)."""

    def __init__(self, items, what="ONNX node"):
        self.items = list(items)
        lines = [f"{len(self.items)} unsupported {what}(s); nothing was written:"]
        for op, name, reason in self.items:
            lines.append(f"  {op} {name!r}: {reason}")
        super().__init__("\n".join(lines))


class Unsupported(Exception):
    """Raised inside a handler; collected into UnsupportedModelError."""

    def __init__(self, reason, node=None):
        super().__init__(reason)
        self.reason = reason
        self.node = node


def node_attrs(node):
    from onnx import helper
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        out[a.name] = v
    return out


# ---------------------------------------------------------------------------
# Pooling geometry, one spatial axis at a time (the 2-D quantities are
# products of the per-axis ones).
#
# Caffe:  out = round((H + 2P - K) / S) + 1 (round = ceil by default, or
#         floor with round_mode FLOOR); with P > 0 a last window starting at
#         or past H + P is dropped. AVE divides by the window clipped to
#         [-P, H + P).
# ONNX (as ONNX Runtime and PyTorch compute it): out = floor/ceil((H + pb +
#         pe - K) / S) + 1; in ceil mode a last window starting at or past
#         H + pb is dropped. AVE with count_include_pad divides by the window
#         clipped to [-pb, H + pe); without, by its part inside [0, H).
# ---------------------------------------------------------------------------

def _div_round(num, den, ceil):
    return -(-num // den) if ceil else num // den


def caffe_pool_out(H, K, S, P, ceil):
    out = _div_round(H + 2 * P - K, S, ceil) + 1
    if P and (out - 1) * S >= H + P:
        out -= 1
    return out


def onnx_pool_out(H, K, S, pb, pe, ceil):
    out = _div_round(H + pb + pe - K, S, ceil) + 1
    if ceil and (out - 1) * S >= H + pb:
        out -= 1
    return out


def caffe_divisor(H, K, S, P, out):
    hs = np.arange(out) * S - P
    return np.minimum(hs + K, H + P) - hs


def onnx_divisor(H, K, S, pb, pe, out, count_include_pad):
    hs = np.arange(out) * S - pb
    if count_include_pad:
        return np.minimum(hs + K, H + pe) - hs
    return np.minimum(hs + K, H) - np.maximum(hs, 0)
