"""Upgrade a net or solver file to the current format, as BVLC's
tools/upgrade_net_proto_text.cpp, upgrade_net_proto_binary.cpp and
upgrade_solver_proto_text.cpp do (the library side of those commands).

The input is read as it is (no upgrade on reading), upgraded when it needs
it (V0 and V1 layers, old data transformation fields, input fields, old
BatchNorm parameters; the solver's ``solver_type`` enum), and written in the
same encoding: protobuf text format as ``TextFormat::Print`` writes it, or
the binary wire format. A file already current is written unchanged
(Caffe logs "File already in latest proto format").
"""
import logging
import os

from . import caffe_pb2 as pb
from .files import read_binary, read_text, write_binary, write_text
from .upgrade import net_needs_upgrade, upgrade_net, upgrade_solver

log = logging.getLogger("caffe_ocl")


def upgrade_net_file(src, dst, binary=False):
    """Upgrade the NetParameter in ``src`` into ``dst``; returns whether it
    needed an upgrade."""
    src, dst = os.fspath(src), os.fspath(dst)
    net = read_binary(src, pb.NetParameter(), "caffemodel") if binary \
        else read_text(src, pb.NetParameter(), "net prototxt")
    need = net_needs_upgrade(net)
    if need:
        upgrade_net(net, src)
    else:
        log.error("File already in latest proto format: %s", src)
    if binary:
        write_binary(net, dst)
        log.info("Wrote upgraded NetParameter binary proto to %s", dst)
    else:
        write_text(net, dst)
        log.info("Wrote upgraded NetParameter text proto to %s", dst)
    return need


def upgrade_solver_file(src, dst):
    """Upgrade the SolverParameter in ``src`` into ``dst`` (text); returns
    whether it needed an upgrade."""
    src, dst = os.fspath(src), os.fspath(dst)
    solver = read_text(src, pb.SolverParameter(), "solver prototxt")
    need = solver.HasField("solver_type")
    if need:
        upgrade_solver(solver, src)
    else:
        log.error("File already in latest proto format: %s", src)
    write_text(solver, dst)
    log.info("Wrote upgraded SolverParameter text proto to %s", dst)
    return need
