"""Caffe's protobuf schema and the files written with it.

``caffe_pb2`` is generated from ``caffe.proto`` (BVLC Caffe's schema) by
``tools/regen_proto.sh``; it needs the protobuf runtime named by
``caffe_pb2.MIN_PROTOBUF``.  The helpers read nets, solvers and blobs
(upgrading old formats as Caffe does) and write them atomically.
"""

from . import caffe_pb2
from .files import (
    array_to_blobproto,
    blobproto_to_array,
    non_utf8_field,
    parse_net_text,
    parse_solver_text,
    parse_text,
    read_binary,
    read_blob_array,
    read_blobproto,
    read_file_bytes,
    read_net,
    read_net_binary,
    read_net_prototxt,
    read_solver_prototxt,
    read_text,
    require_regular_file,
    write_binary,
    write_text,
)
from .upgrade import upgrade_blob_shapes, upgrade_net, upgrade_solver

__all__ = [
    "caffe_pb2",
    "parse_net_text", "read_net_prototxt", "read_net_binary", "read_net",
    "parse_solver_text", "read_solver_prototxt",
    "read_blobproto", "blobproto_to_array", "array_to_blobproto",
    "write_binary", "write_text", "parse_text", "read_text", "read_binary",
    "upgrade_net", "upgrade_solver", "upgrade_blob_shapes",
    "read_file_bytes", "require_regular_file", "read_blob_array", "non_utf8_field",
]
