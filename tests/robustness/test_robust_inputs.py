"""One test per robustness fix of issue #25 (each fails without its fix):
LMDB checks, special files, memory budget, bounded queues, repeated
fields, overflow-safe sizes, solver state checks, untrusted models,
symlink-safe snapshot writes, stale temp files, untouched-weights warning."""
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import config, safe_io
from caffe_ocl.data.datum import array_to_datum
from caffe_ocl.data.db import LMDBReader, LMDBWriter, check_lmdb_file
from caffe_ocl.errors import (CaffeOclError, DataError, DeviceError, NetError, ParseError,
                              ShapeError, SolverError)
from caffe_ocl.proto import (blobproto_to_array, caffe_pb2, parse_net_text,
                             parse_solver_text, read_net, write_binary)
from conftest import child_env



def make_db(path, n=40, side=5):
    rs = np.random.RandomState(0)
    with LMDBWriter(str(path)) as w:
        for i in range(n):
            w.put(f"{i:08d}", array_to_datum(rs.randint(0, 255, (3, side, side))
                                             .astype(np.uint8), i % 3).SerializeToString())
    return path


def read_all(path):
    with LMDBReader(str(path)) as r:
        return [k for k, _ in r]


# ---- LMDB ---------------------------------------------------------------------

def test_truncated_lmdb_is_one_line_not_a_bus_error(tmp_path):
    db = make_db(tmp_path / "db")
    data = (db / "data.mdb").read_bytes()
    (db / "data.mdb").write_bytes(data[:len(data) - 5000])
    with pytest.raises(DataError, match=r"data.mdb: truncated: .* the file has"):
        read_all(db)


def test_zeroed_lmdb_page_is_one_line_not_an_assertion(tmp_path):
    db = make_db(tmp_path / "db", n=200)
    data = bytearray((db / "data.mdb").read_bytes())
    psize = 4096
    last = len(data) // psize - 1
    data[last * psize:(last + 1) * psize] = bytes(psize)    # a leaf or branch page
    (db / "data.mdb").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"page \d+ is damaged"):
        read_all(db)


@pytest.mark.parametrize("special", ["fifo", "device"])
def test_lmdb_data_file_that_is_not_a_regular_file_is_refused(tmp_path, special):
    """A FIFO (or a device) as data.mdb: one line, never a hang or a read of
    /dev/zero (a mutation dropping the check passed the suite before)."""
    db = tmp_path / "db"
    db.mkdir()
    if special == "fifo":
        os.mkfifo(db / "data.mdb")
    else:
        os.symlink("/dev/zero", db / "data.mdb")
    result = {}

    def go():
        try:
            read_all(db)
        except CaffeOclError as e:
            result["error"] = str(e)
        except BaseException as e:      # noqa: BLE001 - anything else fails below
            result["other"] = repr(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "opening a special data.mdb blocked"
    assert "data.mdb: not a regular file" in result.get("error", ""), result


def test_lmdb_check_accepts_good_databases_and_caches_the_verdict(tmp_path):
    db = make_db(tmp_path / "db", n=300, side=40)      # overflow pages too
    check_lmdb_file(str(db / "data.mdb"))
    assert len(read_all(db)) == 300


def test_lmdb_changed_while_reading_is_reported(tmp_path):
    db = make_db(tmp_path / "db", n=5)
    r = LMDBReader(str(db))
    try:
        gen = r.records()
        next(gen)
        with open(db / "data.mdb", "ab") as f:       # as a writer growing the file
            f.write(bytes(4096))
        with pytest.raises(DataError, match="changed while being read"):
            for _ in range(10):
                next(gen)
    finally:
        r.close()


# ---- special files, sizes, repeated fields -------------------------------------

def test_fifo_and_devices_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = {}

    def go():
        for path in (fifo, "/dev/zero"):
            try:
                read_net(str(path))
            except CaffeOclError as e:
                result[str(path)] = str(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert "is a FIFO, not a regular file" in result[str(fifo)]
    assert "is a device, not a regular file" in result["/dev/zero"]


def test_repeated_singular_field_is_rejected_with_its_line(tmp_path):
    p = tmp_path / "n.prototxt"
    p.write_text('name: "a"\nlayer { name: "x" type: "Input" top: "x"\n'
                 '  input_param { shape { dim: 1 } } }\nname: "b"\n')
    with pytest.raises(ParseError, match=r"n.prototxt:4:.*name"):
        caffe.Net(str(p), caffe.TEST)
    with pytest.raises(ParseError, match=r"NUL"):
        parse_solver_text('base_lr: 0.1\0')


def test_blobproto_sizes_do_not_wrap_and_name_file_and_layer(tmp_path):
    b = caffe_pb2.BlobProto()
    b.shape.dim.extend([2**62 + 1, 4])           # 2^64 + 4 wraps to 4 in int64
    b.data.extend([1, 2, 3, 4])
    with pytest.raises(ShapeError, match=r"x.caffemodel: .* but its data holds 4"):
        blobproto_to_array(b, where="x.caffemodel")
    net = caffe.Net(parse_net_text(
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        'inner_product_param { num_output: 2 } }'), caffe.TEST)
    m = net.to_proto()
    del m.layer[1].blobs[0].data[1:]
    write_binary(m, tmp_path / "w.caffemodel")
    with pytest.raises(ShapeError, match=r"w.caffemodel: layer 'ip' param 0: BlobProto"):
        net.copy_from(str(tmp_path / "w.caffemodel"))


def test_blob_count_is_exact(tmp_path):
    with pytest.raises(ShapeError, match="exceeds 2"):
        caffe.Blob((2**62 + 1, 4))


@pytest.mark.parametrize("channels, layer, what", [
    (0, 'type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 2 '
        'kernel_size: 1 weight_filler { type: "xavier" } }', "xavier filler"),
    (2, 'type: "Pooling" bottom: "x" top: "y" pooling_param { kernel_size: 2 '
        'stride: 4294967295 }', "'l'"),
])
def test_absurd_layer_parameters_are_one_line(tmp_path, channels, layer, what):
    p = tmp_path / "bad.prototxt"
    p.write_text('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 '
                 f'dim: {channels} dim: 4 dim: 4 }} }} }}\nlayer {{ name: "l" {layer} }}\n')
    with pytest.raises(CaffeOclError) as e:
        caffe.Net(str(p), caffe.TEST).forward()
    msg = str(e.value)
    assert "bad.prototxt" in msg and "\n" not in msg and what in msg, msg


# ---- memory ------------------------------------------------------------------------

def test_device_budget_says_what_is_needed_and_what_there_is():
    net = parse_net_text(
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 4 } } }'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        'inner_product_param { num_output: 2000000 } }')
    with config.override(MEMORY_LIMIT_MB=8):
        with pytest.raises(DeviceError) as e:
            caffe.Net(net, caffe.TEST).forward()
    msg = str(e.value)
    assert "needs 30.5 MiB" in msg and "there is 8.0 MiB" in msg and "'ip'" in msg, msg


def test_host_budget():
    b = caffe.Blob((1000, 1000))
    with config.override(HOST_MEMORY_LIMIT_MB=1):
        with pytest.raises(DeviceError, match=r"out of host memory: .* needs 3.8 MiB"):
            b.data


def test_huge_prefetch_and_display_are_bounded(tmp_path, caplog):
    from caffe_ocl.data.prefetch import MAX_DEPTH, Prefetcher
    with caplog.at_level(logging.WARNING, logger="caffe_ocl"):
        pf = Prefetcher(lambda: None, lambda b: None, depth=1000000)
    assert pf.depth == MAX_DEPTH and "clamped" in caplog.text
    from caffe_ocl.solvers.solver import LOSS_RING_MAX
    p = parse_solver_text('type: "SGD" base_lr: 0.01 lr_policy: "fixed" display: 400000000 '
                          'average_loss: 3 max_iter: 3 snapshot_after_train: false')
    p.net_param.CopyFrom(parse_net_text(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 2 '
        'dim: 3 } data_filler { type: "gaussian" } } }'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        'inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }'
        'layer { name: "l" type: "Reduction" bottom: "y" top: "l" loss_weight: 1 }'))
    s = caffe.get_solver(p)
    assert s._ring_cap == LOSS_RING_MAX
    s.step(LOSS_RING_MAX + 2)       # past a full ring: read back early, not overrun
    assert np.isfinite(s.smoothed_loss)


# ---- solver state ----------------------------------------------------------------

SOLVER_NET = ('layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { '
              'dim: 2 dim: 3 } data_filler { type: "gaussian" } } }'
              'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
              'inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }'
              'layer { name: "l" type: "Reduction" bottom: "y" top: "l" loss_weight: 1 }')


def solver(tmp_path, extra=""):
    p = parse_solver_text(f'type: "SGD" base_lr: 0.01 lr_policy: "fixed" max_iter: 2 {extra}')
    p.snapshot_prefix = f"{tmp_path}/snap"
    p.net_param.CopyFrom(parse_net_text(SOLVER_NET))
    return caffe.get_solver(p)


def test_bad_solver_states_are_one_line(tmp_path):
    s = solver(tmp_path)
    s.step(1)
    state = s.snapshot()
    st = caffe_pb2.SolverState()
    st.ParseFromString(open(state, "rb").read())
    st.iter = -2**31
    write_binary(st, tmp_path / "neg.solverstate")
    with pytest.raises(SolverError, match="neg.solverstate: solver state has iter -2147483648"):
        s.restore(str(tmp_path / "neg.solverstate"))
    v1 = caffe_pb2.NetParameter()
    layer = v1.layers.add()
    layer.name = "ip"
    layer.type = caffe_pb2.V1LayerParameter.INNER_PRODUCT
    layer.blobs.add().data.extend([1.0])
    write_binary(v1, tmp_path / "v1.caffemodel")
    with pytest.raises(SolverError, match=r"v1.caffemodel: not a solver state.*--weights"):
        s.restore(str(tmp_path / "v1.caffemodel"))


def test_nul_in_snapshot_prefix_is_one_line(tmp_path):
    with pytest.raises(SolverError, match="snapshot_prefix .* NUL"):
        solver(tmp_path / "a\0b")


# ---- writes -------------------------------------------------------------------------

def test_snapshot_temp_file_never_follows_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "out.caffemodel"
    os.symlink(victim, f"{target}.tmp-{os.getpid()}")
    with pytest.raises(OSError):
        write_binary(caffe_pb2.NetParameter(name="n"), str(target))
    assert victim.read_text() == "precious" and not target.exists()
    probe = tmp_path / "probe"
    os.symlink(tmp_path / "created_by_probe", probe)
    with pytest.raises(OSError):
        safe_io.probe_writable(str(probe))
    assert not (tmp_path / "created_by_probe").exists()


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    old = tmp_path / f"snap_iter_4.caffemodel.tmp-{dead}"
    mine = tmp_path / f"snap_iter_4.solverstate.tmp-{os.getppid()}"     # alive
    other = tmp_path / f"unrelated.tmp-{dead}"
    for f in (old, mine, other):
        f.write_bytes(b"x")
    solver(tmp_path)
    assert not old.exists() and mine.exists() and other.exists()


# ---- untrusted models --------------------------------------------------------------

def test_untrusted_mode_refuses_python_and_writing_layers(tmp_path):
    out = tmp_path / "out.h5"
    out.write_text("keep")
    nets = {
        "Python": 'layer { name: "py" type: "Python" top: "x" python_param { '
                  'module: "no_such_module_xyz" layer: "L" } }',
        "HDF5Output": 'layer { name: "x" type: "Input" top: "x" top: "y" input_param { '
                      'shape { dim: 1 dim: 2 } shape { dim: 1 } } }'
                      'layer { name: "w" type: "HDF5Output" bottom: "x" bottom: "y" '
                      f'hdf5_output_param {{ file_name: "{out}" }} }}',
    }
    caffe.set_untrusted(True)
    try:
        for kind, text in nets.items():
            with pytest.raises(NetError, match="refused for an untrusted model"):
                caffe.Net(parse_net_text(text), caffe.TEST)
    finally:
        caffe.set_untrusted(False)
    assert out.read_text() == "keep"


def test_python_layer_does_not_import_from_the_current_folder(tmp_path):
    (tmp_path / "evil_layer_mod.py").write_text(
        "open('IMPORTED', 'w').write('x')\n")
    (tmp_path / "n.prototxt").write_text(
        'layer { name: "py" type: "Python" top: "x" python_param { module: "evil_layer_mod" '
        'layer: "L" } }')
    # child_env drops PYTHONPATH's empty entries, which would put the
    # current folder on the path
    p = subprocess.run([sys.executable, "-m", "caffe_ocl", "time", "--model", "n.prototxt",
                        "--iterations", "1"], cwd=tmp_path, env=child_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-1000:]
    assert "cannot import module 'evil_layer_mod'" in p.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "IMPORTED").exists()


# ---- weights ---------------------------------------------------------------------------

def test_untouched_layers_are_warned_about(tmp_path, caplog):
    net = caffe.Net(parse_net_text(
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        'inner_product_param { num_output: 2 } }'), caffe.TEST)
    (tmp_path / "empty.caffemodel").write_bytes(b"")
    other = caffe_pb2.NetParameter()
    other.layer.add(name="fc9", type="InnerProduct")
    write_binary(other, tmp_path / "other.caffemodel")
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        net.copy_from(str(tmp_path / "empty.caffemodel"))
        net.copy_from(str(tmp_path / "other.caffemodel"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("no weights for layer ip" in w for w in warnings)
    assert "Ignoring source layer fc9" in caplog.text


def test_lmdb_writer_leaves_no_half_written_database(tmp_path):
    path = tmp_path / "db"
    with pytest.raises(RuntimeError):
        with LMDBWriter(str(path)) as w:
            w.put("a", b"x")
            w.commit()
            raise RuntimeError("an error midway")
    assert not path.exists() and os.listdir(tmp_path) == []
    make_db(path, n=3)                   # a rerun is not refused
    assert len(read_all(path)) == 3


def test_convert_imageset_skips_what_it_cannot_decode(tmp_path):
    import cv2
    from caffe_ocl.data.tools import convert_imageset
    cv2.imwrite(str(tmp_path / "ok.png"), np.zeros((4, 4, 3), np.uint8))
    # a PNG header claiming 60000 x 60000 pixels, then nothing
    good = (tmp_path / "ok.png").read_bytes()
    ihdr = bytearray(good[:33])
    ihdr[16:24] = (60000).to_bytes(4, "big") * 2
    (tmp_path / "huge.png").write_bytes(bytes(ihdr) + good[33:])
    (tmp_path / "list.txt").write_text(f"ok.png 1\nhuge.png 2\nok.png {2**40}\nok.png 3\n")
    convert_imageset(str(tmp_path) + "/", str(tmp_path / "list.txt"), str(tmp_path / "db"))
    assert len(read_all(tmp_path / "db")) == 2      # ok.png twice; the others skipped


def test_convert_imageset_error_leaves_no_database(tmp_path):
    """A conversion that stops with an error (--check_size on a second image
    of another size) leaves nothing under the name, so a rerun works (a
    partial database made the rerun refuse: "already exists")."""
    import cv2
    from caffe_ocl.data.tools import convert_imageset
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.full((4, 4 + (i == 2), 3), i, np.uint8))
    (tmp_path / "list.txt").write_text("0.png 0\n1.png 1\n2.png 2\n")
    args = (str(tmp_path) + "/", str(tmp_path / "list.txt"), str(tmp_path / "db"))
    with pytest.raises(DataError, match="line 3: .* the first one 3x4x4 .*--check_size"):
        convert_imageset(*args, check_size=True)
    assert not (tmp_path / "db").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("db")]
    assert convert_imageset(*args) == 3
    assert len(read_all(tmp_path / "db")) == 3


def test_mnist_header_claiming_billions_of_images_is_one_line(tmp_path):
    import struct
    from caffe_ocl.data.tools import read_idx
    (tmp_path / "img").write_bytes(struct.pack(">IIII", 2051, 2**32 - 1, 28, 28) + bytes(784))
    (tmp_path / "lab").write_bytes(struct.pack(">II", 2049, 2**32 - 1) + bytes(1))
    with pytest.raises(DataError, match="truncated IDX file"):
        read_idx(str(tmp_path / "img"), str(tmp_path / "lab"))
