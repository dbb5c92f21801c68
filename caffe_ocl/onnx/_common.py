"""Helpers shared by both conversion directions: errors, attribute reading,
the pooling geometry of Caffe and ONNX (output sizes and the averaging
divisor of each window), which decide how a pooling maps across, the ONNX
``pads`` layout, and Caffe's per-axis (h, w) spelling of kernel/pad/stride."""
import numpy as np

from ..errors import CaffeOclError


class OnnxConversionError(CaffeOclError):
    """A model that cannot be converted (bad file, missing shapes, ...)."""


class UnsupportedModelError(OnnxConversionError):
    """One or more nodes/layers have no equivalent; ``.items`` lists them as
    (op type, node name, reason)."""

    def __init__(self, items, what="ONNX node", where=""):
        # one line (as every caffe_ocl error): the items joined by "; "
        self.items = list(items)
        self.what = what
        head = f"{where}: " if where else ""
        body = "; ".join(f"{op} {name!r}: {' '.join(str(reason).split())}"
                         for op, name, reason in self.items)
        super().__init__(f"{head}{len(self.items)} unsupported {what}(s); nothing was "
                         f"written: {body}")


class Unsupported(Exception):
    """Raised inside a handler; collected into UnsupportedModelError."""

    def __init__(self, reason, node=None):
        super().__init__(reason)
        self.reason = reason
        self.node = node


def node_name(node):
    """A node's name for messages: its own, else its first output's."""
    return node.name or (node.output[0] if node.output else "?")


def error_line(e):
    """``e`` as "Type: message" on one line of at most 200 characters of
    message: onnx's and numpy's errors from a malformed model, inside the
    converter's one-line errors naming the node or tensor."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


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


# 2-D forms (spatial axes H, W; each argument a per-axis pair): the output
# sizes and the per-window divisors (an array of shape ``outs``).

def caffe_pool_outs(H, K, S, P, ceil):
    return [caffe_pool_out(H[i], K[i], S[i], P[i], ceil) for i in range(2)]


def onnx_pool_outs(H, K, S, pads, ceil):
    """pads: per axis (begin, end)."""
    return [onnx_pool_out(H[i], K[i], S[i], *pads[i], ceil) for i in range(2)]


def caffe_divisor_2d(H, K, S, P, outs):
    return np.outer(*[caffe_divisor(H[i], K[i], S[i], P[i], outs[i]) for i in range(2)])


def onnx_divisor_2d(H, K, S, pads, outs, count_include_pad):
    """pads: per axis (begin, end)."""
    return np.outer(*[onnx_divisor(H[i], K[i], S[i], *pads[i], outs[i], count_include_pad)
                      for i in range(2)])


# ---------------------------------------------------------------------------
# Padding layouts. ONNX ``pads`` lists all begins, then all ends:
# [h_begin, w_begin, h_end, w_end]; the converters work with per-axis
# (begin, end) pairs.
# ---------------------------------------------------------------------------

def pad_pairs(pads):
    """ONNX 2-D ``pads`` -> [(h_begin, h_end), (w_begin, w_end)]."""
    return [(pads[0], pads[2]), (pads[1], pads[3])]


def onnx_pads(begin, end):
    """Per-axis begin and end pads -> ONNX ``pads``."""
    return list(begin) + list(end)


# ---------------------------------------------------------------------------
# Caffe's per-axis (h, w) spelling of kernel_size / pad / stride: one shared
# value (a repeated field in ConvolutionParameter, a scalar in
# PoolingParameter) or <stem>_h and <stem>_w (kernel_h, pad_h, stride_h, ...).
# ---------------------------------------------------------------------------

def _hw_names(field):
    stem = field.split("_")[0]          # kernel_size -> kernel
    return stem + "_h", stem + "_w"


def per_axis(repeated, h, w, has_hw, default):
    """(h, w) from a repeated field (0, 1 or 2+ values) or explicit h, w."""
    if has_hw:
        return [h, w]
    if len(repeated) == 0:
        return [default, default]
    if len(repeated) == 1:
        return [repeated[0]] * 2
    return list(repeated[:2])


def caffe_hw(p, field, default=None):
    """Read ``field`` of ``p`` as an [h, w] pair; ``default`` fills an empty
    repeated field (an unset scalar reads as its proto default)."""
    fh, fw = _hw_names(field)
    has_hw = p.HasField(fh) or p.HasField(fw)
    v = getattr(p, field)
    if isinstance(v, int):
        return [getattr(p, fh), getattr(p, fw)] if has_hw else [v] * 2
    return per_axis(v, getattr(p, fh), getattr(p, fw), has_hw, default)


def set_caffe_hw(p, field, vals, default=None):
    """Write the [h, w] pair ``vals`` into ``p`` as Caffe prototxts spell it:
    the shared ``field`` when both agree (left out when equal to
    ``default``), else <stem>_h and <stem>_w."""
    if vals[0] == vals[1]:
        if vals[0] != default:
            v = getattr(p, field)
            if isinstance(v, int):
                setattr(p, field, vals[0])
            else:
                v.append(vals[0])
    else:
        fh, fw = _hw_names(field)
        h, w = vals
        setattr(p, fh, h)
        setattr(p, fw, w)
