"""ONNX <-> Caffe conversion.

``to_caffe.convert(model)`` turns an ONNX model (opsets 9-17, as PyTorch
exports them) into a Caffe NetParameter with weights; ``from_caffe.export``
goes the other way. ``check.compare`` runs both sides (caffe_ocl and
ONNX Runtime, when installed) on the same random input.

Command line: ``caffe_ocl onnx2caffe MODEL.onnx OUT.prototxt OUT.caffemodel
[--check]`` and ``caffe_ocl caffe2onnx NET.prototxt WEIGHTS.caffemodel
OUT.onnx [--check]``. See README.md next to this file for the mapping table
and the decisions a user notices.
"""
from ._common import OnnxConversionError, UnsupportedModelError

__all__ = ["OnnxConversionError", "UnsupportedModelError"]
