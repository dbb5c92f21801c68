"""Run a Caffe net in caffe_ocl and an ONNX model in ONNX Runtime on the
same inputs and report the largest absolute difference per output."""
import os

import numpy as np

from ..net import Net
from ..proto import caffe_pb2
from ._common import OnnxConversionError


def _ort_session(model):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    import onnx
    if isinstance(model, onnx.ModelProto):
        data = model.SerializeToString()
    elif isinstance(model, (bytes, bytearray)):
        data = bytes(model)
    else:
        # the path itself: ONNX Runtime finds external data next to the
        # model file (from the file's bytes it looked in the working folder,
        # and --check failed for every model with external data)
        data = os.fspath(model)
    so = ort.SessionOptions()
    so.log_severity_level = 4       # its errors are raised below as one line
    try:
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:      # noqa: BLE001 - onnxruntime's own classes, one line
        raise OnnxConversionError(f"onnxruntime cannot load the model: {_one_line(e)}") \
            from None


def _one_line(e):
    return " ".join(str(e).split())[:400]


def caffe_net(net_param):
    """A TEST-phase caffe_ocl Net with the weights the NetParameter carries."""
    deploy = caffe_pb2.NetParameter()
    deploy.CopyFrom(net_param)
    for lp in deploy.layer:
        del lp.blobs[:]
    net = Net(deploy, caffe_pb2.TEST)
    net.copy_from(net_param)
    return net


def run_caffe(net_param, inputs, outputs=None):
    net = net_param if hasattr(net_param, "blobs") and hasattr(net_param, "forward") \
        else caffe_net(net_param)
    for k, v in inputs.items():
        net.blobs[k].data[...] = v
    net.forward()
    names = outputs or net.outputs
    return {n: np.array(net.blobs[n].data, copy=True) for n in names}


def random_inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def compare(onnx_model, net_param, inputs=None, seed=0):
    """{output: (max abs diff, max abs value of the ONNX Runtime output)};
    ``None`` values when onnxruntime is not installed."""
    sess = _ort_session(onnx_model)
    input_shapes = {lp.top[0]: tuple(lp.input_param.shape[0].dim)
                    for lp in net_param.layer if lp.type == "Input"}
    if inputs is None:
        inputs = random_inputs(input_shapes, seed)
    if sess is None:
        return {"onnxruntime": None}
    names = [o.name for o in sess.get_outputs()]
    try:
        ref = dict(zip(names, sess.run(None, inputs)))
    except Exception as e:      # noqa: BLE001 - onnxruntime's own classes, one line
        raise OnnxConversionError(f"onnxruntime cannot run the model: {_one_line(e)}") \
            from None
    got = run_caffe(net_param, inputs, names)
    report = {}
    for n in names:
        a, b = np.asarray(got[n], np.float64), np.asarray(ref[n], np.float64)
        if a.shape != b.shape:
            if a.size != b.size:
                raise OnnxConversionError(f"output {n!r}: caffe_ocl shape {a.shape} vs "
                                          f"onnxruntime {b.shape}")
            a = a.reshape(b.shape)
        report[n] = _difference(a, b)
    return report


def _difference(a, b):
    """(max |a - b|, max |b|) over the positions where both are finite; a
    NaN or infinity in the same place on both sides (the same sign) agrees
    and is left out, one on one side only is a difference of inf. (np.max
    of the plain difference was nan for NaN against NaN, and --check
    printed "nan" for outputs that agree, as for ones that do not.)"""
    if not a.size:
        return 0.0, 0.0
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    same = (np.isnan(a) & np.isnan(b)) | (~fa & ~fb & (a == b))
    diff = float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0
    if not np.all(both | same):
        diff = float("inf")
    return diff, float(np.max(np.abs(b[fb]))) if fb.any() else 0.0


def format_report(report):
    lines = []
    for name, v in report.items():
        if v is None:
            lines.append("check skipped: onnxruntime is not installed")
        else:
            diff, scale = v
            rel = diff / scale if scale else diff
            lines.append(f"{name}: max |caffe_ocl - onnxruntime| = {diff:.3g} "
                         f"(output scale {scale:.3g}, relative {rel:.3g})"
                         + (" -- a NaN or infinity on one side only" if diff == float("inf")
                            else ""))
    return "\n".join(lines)
