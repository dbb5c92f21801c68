"""Solver snapshots: ``{prefix}_iter_{N}.caffemodel`` + ``.solverstate``.

The ``.solverstate`` is Caffe's binary ``SolverState`` (iter, learned_net,
current_step, history) with one extra field that Caffe ignores: field
number 1000 (length-delimited), a tiny message holding caffe_ocl's device
random-number state (field 1: seed, field 2: stream counter, both varints),
so that N iterations + snapshot + restore + N iterations reproduce 2N
straight iterations even when the net draws random numbers (Dropout,
random DummyData fillers). Caffe's own .solverstate files (no field 1000)
restore everything but the random state.

Field 1001 (length-delimited, also ignored by Caffe) holds the read
positions of the train net's data layers, as UTF-8 JSON
``{layer name: state}`` (each data layer's ``data_state()``), so that the
data continues where the snapshot left it instead of at record 0.

Writes go through ``caffe_ocl.proto.write_binary`` (temporary file +
rename): a failed write never replaces or truncates an existing file.
"""
import json

from .. import safe_io
from ..errors import SolverError
from ..proto import caffe_pb2, non_utf8_field

RNG_FIELD = 1000
DATA_FIELD = 1001


def _varint(v):
    out = bytearray()
    v = int(v)
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf, pos):
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf):
    """Yield (field number, wire type, value) of a protobuf message's top level."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            val, pos = _read_varint(buf, pos)
        elif wt == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wt == 2:
            ln, pos = _read_varint(buf, pos)
            val, pos = buf[pos:pos + ln], pos + ln
        elif wt == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, val


def encode_rng(state):
    payload = b"\x08" + _varint(state["seed"]) + b"\x10" + _varint(state["stream"])
    return _varint(RNG_FIELD << 3 | 2) + _varint(len(payload)) + payload


def decode_rng(raw):
    """The RNG state stored in a .solverstate's bytes, or None."""
    try:
        for num, wt, val in _fields(raw):
            if num == RNG_FIELD and wt == 2:
                st = {}
                for n2, w2, v2 in _fields(bytes(val)):
                    if n2 == 1 and w2 == 0:
                        st["seed"] = v2
                    elif n2 == 2 and w2 == 0:
                        st["stream"] = v2
                if "seed" in st and "stream" in st:
                    return st
    except ValueError:
        return None
    return None


def encode_data_state(states):
    payload = json.dumps(states, sort_keys=True).encode()
    return _varint(DATA_FIELD << 3 | 2) + _varint(len(payload)) + payload


def decode_data_state(raw, path):
    """The data layers' read states stored in a .solverstate's bytes, or None."""
    try:
        for num, wt, val in _fields(raw):
            if num == DATA_FIELD and wt == 2:
                return parse_data_state(bytes(val), path)
    except ValueError:
        return None
    return None


def parse_data_state(text, path):
    try:
        states = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise SolverError(f"{path}: the data layers' read positions are not valid "
                          f"JSON ({e})") from None
    if not isinstance(states, dict) or not all(isinstance(v, dict) for v in states.values()):
        raise SolverError(f"{path}: the data layers' read positions are not a "
                          "{layer name: state} object")
    return states


class RawMessage:
    """Serialized bytes with the ``SerializeToString`` that write_binary calls."""

    def __init__(self, data):
        self.data = data

    def SerializeToString(self):
        return self.data


def solver_state_bytes(state, rng_state=None, data_state=None):
    data = state.SerializeToString()
    if rng_state is not None:
        data += encode_rng(rng_state)
    if data_state is not None:
        data += encode_data_state(data_state)
    return data


def parse_solver_state(raw, path):
    st = caffe_pb2.SolverState()
    try:
        st.ParseFromString(raw)
    except Exception as e:  # google.protobuf.message.DecodeError
        raise SolverError(f"{path}: not a binary SolverState ({e})") from None
    bad = non_utf8_field(st)
    if bad:     # a caffemodel given as a state parses so (its layer names land there)
        raise SolverError(f"{path}: not a solver state: string field {bad} is not UTF-8 "
                          f"text{safe_io.caffemodel_hint(raw)}")
    return st, decode_rng(raw), decode_data_state(raw, path)
