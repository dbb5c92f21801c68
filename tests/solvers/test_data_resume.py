"""Exact resume of data-fed nets (issue #25 item 6): N iterations +
snapshot + restore + N iterations give bit-identical weights to 2N straight
iterations for Data (LMDB), ImageData (with and without shuffle) and
HDF5Data, because the .solverstate records each data layer's read position
(the next batch the net consumes, not the prefetch thread's)."""
import logging

import cv2
import h5py
import lmdb
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.proto import caffe_pb2, parse_net_text, parse_solver_text
from caffe_ocl.solvers import state as sstate

N = 4          # iterations before and after the snapshot
RECORDS = 7    # batch 2: the readers wrap (and reshuffle) within 2N


def lmdb_source(tmp_path, rng):
    path = tmp_path / "db"
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i in range(RECORDS):
            img = rng.integers(0, 256, (1, 4, 5), dtype=np.uint8)
            d = caffe_pb2.Datum(channels=1, height=4, width=5, data=img.tobytes(),
                                label=i % 3)
            txn.put(b"%08d" % i, d.SerializeToString())
    env.close()
    return (f'layer {{ name: "data" type: "Data" top: "x" top: "y" '
            f'transform_param {{ mirror: true scale: 0.01 }} '
            f'data_param {{ source: "{path}" backend: LMDB batch_size: 2 prefetch: 3 }} }}')


def list_source(tmp_path, rng, shuffle):
    lines = []
    for i in range(RECORDS):
        img = rng.integers(0, 256, (4, 5), dtype=np.uint8)
        cv2.imwrite(str(tmp_path / f"im{i}.png"), img)
        lines.append(f"im{i}.png {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return (f'layer {{ name: "data" type: "ImageData" top: "x" top: "y" '
            f'transform_param {{ mirror: true scale: 0.01 }} '
            f'image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/" '
            f'is_color: false batch_size: 2 shuffle: {str(shuffle).lower()} }} }}')


def hdf5_source(tmp_path, rng):
    names = []
    for f, rows in enumerate((4, 3)):
        fn = tmp_path / f"d{f}.h5"
        with h5py.File(fn, "w") as h:
            h["x"] = rng.standard_normal((rows, 1, 4, 5)).astype(np.float32)
            h["y"] = rng.integers(0, 3, rows).astype(np.float32)
        names.append(str(fn))
    (tmp_path / "h5.txt").write_text("\n".join(names) + "\n")
    return (f'layer {{ name: "data" type: "HDF5Data" top: "x" top: "y" '
            f'hdf5_data_param {{ source: "{tmp_path}/h5.txt" batch_size: 2 shuffle: true }} }}')


def solver_param(tmp_path, data_layer, fmt="BINARYPROTO"):
    net = data_layer + """
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
      inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" }
    """
    p = parse_solver_text(f'type: "SGD" base_lr: 0.5 momentum: 0.9 lr_policy: "fixed" '
                          f'random_seed: 5 max_iter: {2 * N} snapshot_format: {fmt} '
                          f'snapshot_prefix: "{tmp_path}/snap"')
    p.net_param.CopyFrom(parse_net_text(net))
    return p


def weights(solver):
    return [b.data.copy() for b in solver.net.learnable_params]


def run_resume(p, strip=False):
    first = caffe.get_solver(p)
    first.step(N)
    path = first.snapshot()
    if strip:      # an older solverstate: no read positions
        raw = open(path, "rb").read()
        st, rng, data = sstate.parse_solver_state(raw, path)
        assert data is not None
        st.DiscardUnknownFields()      # the parsed message keeps fields 1000/1001
        open(path, "wb").write(sstate.solver_state_bytes(st, rng))
    resumed = caffe.get_solver(p)
    resumed.step(1)      # the fresh reader moves on (and prefetches) before the restore
    resumed.restore(path)
    assert resumed.iter == N
    resumed.step(N)
    return weights(resumed)


SOURCES = {
    "lmdb": lmdb_source,
    "list": lambda t, r: list_source(t, r, False),
    "list_shuffled": lambda t, r: list_source(t, r, True),
    "hdf5": hdf5_source,
}


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_resume_continues_the_data(tmp_path, kind, fmt):
    p = solver_param(tmp_path, SOURCES[kind](tmp_path, np.random.default_rng(3)), fmt)
    straight = caffe.get_solver(p)
    straight.step(2 * N)
    want = weights(straight)
    got = run_resume(p)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_old_solverstate_restarts_the_data_with_a_log_line(tmp_path, kind, caplog):
    p = solver_param(tmp_path, SOURCES[kind](tmp_path, np.random.default_rng(3)))
    straight = caffe.get_solver(p)
    straight.step(2 * N)
    want = weights(straight)
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        got = run_resume(p, strip=True)
    assert "holds no data read positions" in caplog.text
    # the comparison above is sensitive: starting the data over differs
    assert any(not np.array_equal(a, b) for a, b in zip(want, got))


def test_malformed_read_position_is_one_error(tmp_path):
    p = solver_param(tmp_path, SOURCES["lmdb"](tmp_path, np.random.default_rng(3)))
    s = caffe.get_solver(p)
    s.step(1)
    path = s.snapshot()
    raw = open(path, "rb").read()
    st, rng, _ = sstate.parse_solver_state(raw, path)
    st.DiscardUnknownFields()
    open(path, "wb").write(sstate.solver_state_bytes(st, rng, {"data": {"kind": "db"}}))
    r = caffe.get_solver(p)
    with pytest.raises(caffe.errors.CaffeOclError, match=r"snap_iter_1.solverstate: .*layer .data."):
        r.restore(path)


def test_window_data_snapshot_and_restore_still_work(tmp_path, caplog):
    """WindowData records no read position (its draws are random, not a
    sequence): snapshot and restore work and say so."""
    img = np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), img)
    (tmp_path / "windows.txt").write_text(
        "# 0\na.png\n3\n20\n20\n2\n1 0.9 0 0 9 9\n2 0.1 5 5 14 14\n")
    layer = (f'layer {{ name: "data" type: "WindowData" top: "x" top: "y" '
             f'window_data_param {{ source: "{tmp_path}/windows.txt" root_folder: "{tmp_path}/" '
             f'batch_size: 2 fg_threshold: 0.5 bg_threshold: 0.5 }} '
             f'transform_param {{ crop_size: 4 }} }}')
    p = solver_param(tmp_path, layer)
    s = caffe.get_solver(p)
    s.step(2)
    path = s.snapshot()
    raw = open(path, "rb").read()
    assert sstate.parse_solver_state(raw, path)[2] == {}
    r = caffe.get_solver(p)
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        r.restore(path)
    assert "no read position for data layer 'data'" in caplog.text
    r.step(1)
    assert r.iter == 3


@pytest.mark.parametrize("payload", [b"{not json", b"[" * 100000, b'{"data": 3}', b"\xff\xfe"])
def test_hostile_read_positions_are_one_error(tmp_path, payload):
    def varint(v):
        out = bytearray()
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))
    st = caffe.proto.caffe_pb2.SolverState(iter=1)
    raw = st.SerializeToString() + varint(sstate.DATA_FIELD << 3 | 2) + \
        varint(len(payload)) + payload
    with pytest.raises(caffe.errors.SolverError, match="read positions"):
        sstate.parse_solver_state(raw, "x.solverstate")
