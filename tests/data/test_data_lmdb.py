"""Data/ImageData/MemoryData/HDF5 layers against LMDBs and files written in
the test with lmdb + caffe_pb2.Datum directly (not with our converter)."""
import os
import sys

import cv2
import lmdb
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import DataError, NetError, ShapeError
from caffe_ocl.proto import caffe_pb2, parse_net_text, write_binary
from caffe_ocl.testing import forward, make_layer


def write_lmdb(path, records):
    """records: list of (key bytes, value bytes)."""
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for k, v in records:
            txn.put(k, v)
    env.close()
    return str(path)


def raw_datum(img, label):
    c, h, w = img.shape
    return caffe_pb2.Datum(channels=c, height=h, width=w, data=img.tobytes(),
                           label=int(label)).SerializeToString()


@pytest.fixture
def images(rng):
    return rng.integers(0, 256, (11, 3, 5, 7), dtype=np.uint8)


@pytest.fixture
def raw_db(tmp_path, images):
    return write_lmdb(tmp_path / "raw_lmdb",
                      [(b"%08d_x" % i, raw_datum(im, 100 + i)) for i, im in enumerate(images)])


def data_layer(db, batch, extra="", transform="", ntop=2, phase=caffe_pb2.TEST):
    tops = 'top: "data" top: "label"' if ntop == 2 else 'top: "data"'
    return make_layer(f'''name: "d" type: "Data" {tops}
        data_param {{ source: "{db}" backend: LMDB batch_size: {batch} {extra} }}
        transform_param {{ {transform} }}''', [], phase=phase, ntop=ntop)


def test_raw_records_read_back_identically(raw_db, images):
    layer, b, t = data_layer(raw_db, 4)
    assert t[0].shape == (4, 3, 5, 7) and t[1].shape == (4,)
    assert not layer.has_backward
    seen = []
    for _ in range(3):
        data, label = forward(layer, b, t)
        idx = label.astype(int) - 100
        np.testing.assert_array_equal(data, images[idx].astype(np.float32))
        seen += list(idx)
    assert seen == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0]      # wraps around in key order


def test_one_top_and_scale(raw_db, images):
    layer, b, t = data_layer(raw_db, 3, transform="scale: 0.25", ntop=1)
    (data,) = forward(layer, b, t)
    np.testing.assert_array_equal(data, images[:3].astype(np.float32) * np.float32(0.25))


def test_default_backend_reads_lmdb(raw_db, images):
    layer, b, t = make_layer(f'''type: "Data" top: "data" top: "label"
        data_param {{ source: "{raw_db}" batch_size: 2 }}''', [], ntop=2)
    data, _ = forward(layer, b, t)
    np.testing.assert_array_equal(data, images[:2])


def test_float_data_records(tmp_path, rng):
    arr = rng.standard_normal((5, 2, 3, 4)).astype(np.float32)
    recs = []
    for i, a in enumerate(arr):
        d = caffe_pb2.Datum(channels=2, height=3, width=4, label=i)
        d.float_data.extend(a.ravel().tolist())
        recs.append((b"%03d" % i, d.SerializeToString()))
    db = write_lmdb(tmp_path / "f", recs)
    layer, b, t = data_layer(db, 5)
    data, label = forward(layer, b, t)
    np.testing.assert_array_equal(data, arr)
    np.testing.assert_array_equal(label, np.arange(5))


def test_encoded_png_records(tmp_path, rng):
    imgs = rng.integers(0, 256, (4, 6, 5, 3), dtype=np.uint8)     # HWC BGR
    recs = []
    for i, im in enumerate(imgs):
        ok, buf = cv2.imencode(".png", im)
        recs.append((b"%08d" % i, caffe_pb2.Datum(data=buf.tobytes(), encoded=True,
                                                   label=i).SerializeToString()))
    db = write_lmdb(tmp_path / "enc", recs)
    layer, b, t = data_layer(db, 4)
    data, label = forward(layer, b, t)
    np.testing.assert_array_equal(data, imgs.transpose(0, 3, 1, 2))
    layer, b, t = data_layer(db, 2, transform="force_gray: true")
    data, _ = forward(layer, b, t)
    assert data.shape == (2, 1, 6, 5)
    grey = np.stack([cv2.cvtColor(im, cv2.COLOR_BGR2GRAY) for im in imgs[:2]])
    assert np.abs(data[:, 0] - grey).max() <= 1


def test_prefetch_every_record_once_per_epoch_in_order(tmp_path):
    n = 13
    db = write_lmdb(tmp_path / "e", [(b"%05d" % i, raw_datum(
        np.full((1, 2, 2), i, np.uint8), i)) for i in range(n)])
    layer, b, t = data_layer(db, 5, extra="prefetch: 2")
    labels = []
    for _ in range(13):       # 5 epochs of 13 records in 13 batches of 5
        data, label = forward(layer, b, t)
        np.testing.assert_array_equal(data[:, 0, 0, 0], label)
        labels += list(label.astype(int))
    assert labels == list(range(n)) * 5


def test_rand_skip_is_seeded(raw_db):
    firsts = []
    for _ in range(2):
        caffe_ocl.set_random_seed(123)
        layer, b, t = data_layer(raw_db, 2, extra="rand_skip: 9")
        firsts.append(int(forward(layer, b, t)[1][0]) - 100)
    assert firsts[0] == firsts[1] and 0 <= firsts[0] < 9


def test_reading_never_writes(raw_db):
    before = {f: os.path.getmtime(os.path.join(raw_db, f)) for f in os.listdir(raw_db)}
    size = os.path.getsize(os.path.join(raw_db, "data.mdb"))
    layer, b, t = data_layer(raw_db, 4)
    forward(layer, b, t)
    layer.close()
    after = {f: os.path.getmtime(os.path.join(raw_db, f)) for f in os.listdir(raw_db)}
    assert after == before and os.path.getsize(os.path.join(raw_db, "data.mdb")) == size


# ---- bad input ---------------------------------------------------------------------

def test_missing_database(tmp_path):
    with pytest.raises(DataError, match=r"nothere.*not found"):
        data_layer(tmp_path / "nothere", 2)


def test_empty_database(tmp_path):
    db = write_lmdb(tmp_path / "empty", [])
    with pytest.raises(DataError, match=r"empty.*empty"):
        data_layer(db, 2)


def test_record_that_is_not_a_datum(tmp_path, images):
    db = write_lmdb(tmp_path / "junk", [(b"a0", b"\xff\xff\xff\xff garbage")])
    with pytest.raises(DataError, match=r"junk key 'a0'.*not a Datum"):
        data_layer(db, 2)
    db2 = write_lmdb(tmp_path / "junk2", [(b"a0", raw_datum(images[0], 0)),
                                          (b"a1", b"hello world")])
    layer, b, t = data_layer(db2, 2)
    with pytest.raises(DataError, match=r"junk2 key 'a1'.*not a Datum"):
        forward(layer, b, t)


def test_image_that_does_not_decode(tmp_path):
    bad = caffe_pb2.Datum(data=b"\x89PNG not really", encoded=True).SerializeToString()
    db = write_lmdb(tmp_path / "badimg", [(b"k7", bad)])
    with pytest.raises(DataError, match=r"badimg key 'k7'.*do not decode"):
        data_layer(db, 1)


def test_record_size_differs_from_first(tmp_path, images):
    other = np.zeros((3, 5, 6), np.uint8)
    db = write_lmdb(tmp_path / "mixed", [(b"k0", raw_datum(images[0], 0)),
                                         (b"k1", raw_datum(images[1], 1)),
                                         (b"k2", raw_datum(other, 2))])
    layer, b, t = data_layer(db, 3)
    with pytest.raises(DataError, match=r"mixed key 'k2'.*3x5x6.*3x5x7"):
        forward(layer, b, t)
    # the error stays: the next forward raises it again
    with pytest.raises(DataError, match="k2"):
        forward(layer, b, t)


def test_datum_whose_data_does_not_fit_its_shape(tmp_path):
    d = caffe_pb2.Datum(channels=3, height=4, width=4, data=b"\0" * 10).SerializeToString()
    db = write_lmdb(tmp_path / "short", [(b"k0", d)])
    with pytest.raises(DataError, match=r"short key 'k0'.*10 values"):
        data_layer(db, 1)


def test_mean_file_shape_mismatch(tmp_path, raw_db):
    mean = caffe_pb2.BlobProto(num=1, channels=3, height=4, width=7)
    mean.data.extend([0.0] * 84)
    write_binary(mean, str(tmp_path / "m.binaryproto"))
    with pytest.raises(DataError, match=r"m\.binaryproto.*3x4x7.*raw_lmdb.*3x5x7"):
        data_layer(raw_db, 2, transform=f'mean_file: "{tmp_path / "m.binaryproto"}"')


def test_leveldb_is_refused_with_a_hint(tmp_path, raw_db):
    with pytest.raises(DataError, match="convert_imageset"):
        make_layer(f'''type: "Data" top: "data" data_param {{ source: "{raw_db}"
                   backend: LEVELDB batch_size: 1 }}''', [])
    ldb = tmp_path / "ldb"
    ldb.mkdir()
    (ldb / "CURRENT").write_text("MANIFEST-000001\n")
    with pytest.raises(DataError, match="LevelDB.*convert_imageset"):
        make_layer(f'type: "Data" top: "data" data_param {{ source: "{ldb}" batch_size: 1 }}',
                   [])


def test_bad_batch_size(raw_db):
    with pytest.raises(DataError, match="'d' \\(Data\\).*batch_size"):
        data_layer(raw_db, 0)


# ---- MemoryData ------------------------------------------------------------------------

MEMNET = '''name: "m"
layer { name: "mem" type: "MemoryData" top: "data" top: "label"
        memory_data_param { batch_size: 2 channels: 1 height: 2 width: 3 } }
layer { name: "sc" type: "Power" bottom: "data" top: "out" power_param { scale: 2 } }
'''


def test_memory_data_set_input_arrays(rng):
    net = caffe_ocl.Net(parse_net_text(MEMNET), caffe_ocl.TEST)
    data = rng.standard_normal((6, 1, 2, 3)).astype(np.float32)
    labels = np.arange(6, dtype=np.float32)
    net.set_input_arrays(data, labels)
    for k in range(4):
        i = (2 * k) % 6
        out = net.forward()
        np.testing.assert_array_equal(net.blobs["data"].data, data[i:i + 2])
        np.testing.assert_array_equal(net.blobs["label"].data, labels[i:i + 2])
        np.testing.assert_allclose(out["out"], 2 * data[i:i + 2], rtol=1e-6)


def test_memory_data_errors(rng):
    net = caffe_ocl.Net(parse_net_text(MEMNET), caffe_ocl.TEST)
    with pytest.raises(DataError, match="set_input_arrays"):
        net.forward()
    good = np.zeros((4, 1, 2, 3), np.float32)
    with pytest.raises(DataError, match="float32"):
        net.set_input_arrays(good.astype(np.float64), np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match="multiple of batch size"):
        net.set_input_arrays(np.zeros((3, 1, 2, 3), np.float32), np.zeros(3, np.float32))
    with pytest.raises(ShapeError, match="same first dimension"):
        net.set_input_arrays(good, np.zeros(2, np.float32))
    with pytest.raises(ShapeError, match=r"\(N, 1, 2, 3\)"):
        net.set_input_arrays(np.zeros((4, 1, 3, 2), np.float32), np.zeros(4, np.float32))
    other = caffe_ocl.Net(parse_net_text(
        'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }'),
        caffe_ocl.TEST)
    with pytest.raises(NetError, match="first layer is a MemoryData"):
        other.set_input_arrays(good, np.zeros(4, np.float32))


# ---- ImageData --------------------------------------------------------------------------

def _write_pngs(tmp_path, rng, n=5, shape=(6, 8, 3)):
    root = tmp_path / "imgs"
    root.mkdir()
    imgs, lines = [], []
    for i in range(n):
        im = rng.integers(0, 256, shape, dtype=np.uint8)
        cv2.imwrite(str(root / f"im{i}.png"), im)
        imgs.append(im)
        lines.append(f"sub dir/../im{i}.png {10 + i}" if i == 1 else f"im{i}.png {10 + i}")
    (root / "sub dir").mkdir()
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return root, imgs


def test_image_data_reads_list(tmp_path, rng):
    root, imgs = _write_pngs(tmp_path, rng)
    layer, b, t = make_layer(f'''type: "ImageData" top: "data" top: "label"
        image_data_param {{ source: "{tmp_path / 'list.txt'}" root_folder: "{root}/"
                            batch_size: 3 }}''', [], ntop=2)
    got, labels = [], []
    for _ in range(2):
        d, l_ = forward(layer, b, t)
        got.append(d)
        labels += list(l_.astype(int))
    assert labels == [10, 11, 12, 13, 14, 10]
    ref = np.stack([im.transpose(2, 0, 1) for im in imgs + imgs[:1]]).astype(np.float32)
    np.testing.assert_array_equal(np.concatenate(got), ref)


def test_image_data_resize_gray_and_shuffle(tmp_path, rng):
    root, imgs = _write_pngs(tmp_path, rng)
    layer, b, t = make_layer(f'''type: "ImageData" top: "data" top: "label"
        image_data_param {{ source: "{tmp_path / 'list.txt'}" root_folder: "{root}/"
            batch_size: 5 new_height: 4 new_width: 5 is_color: false shuffle: true }}''',
                             [], ntop=2)
    d, lab = forward(layer, b, t)
    assert d.shape == (5, 1, 4, 5)
    assert sorted(lab.astype(int)) == [10, 11, 12, 13, 14]
    for x, l_ in zip(d, lab.astype(int)):
        g = cv2.imread(str(root / f"im{l_ - 10}.png"), cv2.IMREAD_GRAYSCALE)
        np.testing.assert_array_equal(x[0], cv2.resize(g, (5, 4)))


def test_image_data_bad_line_and_missing_image(tmp_path, rng):
    root, _ = _write_pngs(tmp_path, rng, n=2)
    (tmp_path / "bad.txt").write_text("im0.png 1\nmissing.png 2\n")
    layer, b, t = make_layer(f'''type: "ImageData" top: "data" top: "label"
        image_data_param {{ source: "{tmp_path / 'bad.txt'}" root_folder: "{root}/"
                            batch_size: 2 }}''', [], ntop=2)
    with pytest.raises(DataError, match=r"bad\.txt line 2.*missing\.png"):
        forward(layer, b, t)
    (tmp_path / "nolabel.txt").write_text("im0.png 1\nim1.png x\n")
    with pytest.raises(DataError, match=r"nolabel\.txt line 2"):
        make_layer(f'''type: "ImageData" top: "data" top: "label"
            image_data_param {{ source: "{tmp_path / 'nolabel.txt'}" batch_size: 1 }}''',
                   [], ntop=2)


# ---- HDF5 ------------------------------------------------------------------------------

def test_hdf5_without_h5py_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    (tmp_path / "list.txt").write_text("x.h5\n")
    with pytest.raises(DataError, match="pip install h5py"):
        make_layer(f'''type: "HDF5Data" top: "data"
            hdf5_data_param {{ source: "{tmp_path / 'list.txt'}" batch_size: 2 }}''', [])


def test_hdf5_data_and_output(tmp_path, rng):
    h5py = pytest.importorskip("h5py")
    a = rng.standard_normal((5, 2, 3)).astype(np.float32)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["data"] = a
        f["label"] = np.arange(5, dtype=np.float64)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'a.h5'}\n")
    layer, b, t = make_layer(f'''type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param {{ source: "{tmp_path / 'list.txt'}" batch_size: 3 }}''', [], ntop=2)
    d1, l1 = forward(layer, b, t)
    d2, l2 = forward(layer, b, t)
    np.testing.assert_array_equal(np.concatenate([d1, d2]), a[[0, 1, 2, 3, 4, 0]])
    np.testing.assert_array_equal(np.concatenate([l1, l2]), [0, 1, 2, 3, 4, 0])
    out = tmp_path / "out.h5"
    ol, ob, ot = make_layer(f'''type: "HDF5Output" bottom: "a" bottom: "b"
        hdf5_output_param {{ file_name: "{out}" }}''', [d1, l1], ntop=0)
    forward(ol, ob, ot)
    ol.file.close()
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["data"][...], d1)
        np.testing.assert_array_equal(f["label"][...], l1)


def test_hdf5_data_crosses_files(tmp_path, rng):
    h5py = pytest.importorskip("h5py")
    parts = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 3)]
    for i, a in enumerate(parts):
        with h5py.File(tmp_path / f"{i}.h5", "w") as f:
            f["x"] = a
    (tmp_path / "list.txt").write_text(f"{tmp_path / '0.h5'}\n\n{tmp_path / '1.h5'}\n")
    layer, b, t = make_layer(f'''type: "HDF5Data" top: "x"
        hdf5_data_param {{ source: "{tmp_path / 'list.txt'}" batch_size: 4 }}''', [])
    got = np.concatenate([forward(layer, b, t)[0] for _ in range(3)])
    np.testing.assert_array_equal(got, np.concatenate(parts * 3)[:12])
    (tmp_path / "bad.txt").write_text(f"{tmp_path / '0.h5'}\n")
    with pytest.raises(DataError, match=r"0\.h5 has no dataset 'y'"):
        make_layer(f'''type: "HDF5Data" top: "y"
            hdf5_data_param {{ source: "{tmp_path / 'bad.txt'}" batch_size: 1 }}''', [])


# ---- sharding across data-parallel ranks ------------------------------------------------

@pytest.fixture
def two_ranks():
    """Yields a function setting this process's (solver_count, solver_rank)."""
    from caffe_ocl import ranks as pstate

    def set_rank(r, n=2):
        pstate.solver_count, pstate.solver_rank = n, r
    yield set_rank
    pstate.solver_count, pstate.solver_rank = 1, 0


def test_image_data_shards_lines_across_ranks(tmp_path, rng, two_ranks):
    """TRAIN: rank r of 2 reads list lines r, r+2, ... (wrapping, the offset
    still counting); TEST nets read every line."""
    root, _ = _write_pngs(tmp_path, rng)
    proto = f'''type: "ImageData" top: "data" top: "label"
        image_data_param {{ source: "{tmp_path / 'list.txt'}" root_folder: "{root}/"
                            batch_size: 3 }}'''
    got = {}
    for r in (0, 1):
        two_ranks(r)
        layer, b, t = make_layer(proto, [], caffe_pb2.TRAIN, ntop=2)
        got[r] = [int(v) for _ in range(2) for v in forward(layer, b, t)[1]]
        layer.close()
    assert got[0] == [10, 12, 14, 11, 13, 10]     # offsets 0 2 4 6 8 10 of the cycle
    assert got[1] == [11, 13, 10, 12, 14, 11]
    layer, b, t = make_layer(proto, [], caffe_pb2.TEST, ntop=2)
    assert [int(v) for v in forward(layer, b, t)[1]] == [10, 11, 12]
    layer.close()


def test_hdf5_data_shards_rows_across_ranks(tmp_path, rng, two_ranks):
    """Caffe's HDF5DataLayer::Skip: rank r of 2 keeps rows whose running
    offset is r mod 2, across files and wrap-around; the host batches are
    reused (two sets) without corrupting uploads still in flight."""
    h5py = pytest.importorskip("h5py")
    for i, rows in enumerate((np.arange(3), np.arange(3, 7))):
        with h5py.File(tmp_path / f"{i}.h5", "w") as f:
            f["x"] = rows.astype(np.float32)[:, None]
    (tmp_path / "list.txt").write_text(f"{tmp_path / '0.h5'}\n{tmp_path / '1.h5'}\n")
    proto = f'''type: "HDF5Data" top: "x"
        hdf5_data_param {{ source: "{tmp_path / 'list.txt'}" batch_size: 3 }}'''
    seq = np.arange(7).tolist() * 4
    for r in (0, 1):
        two_ranks(r)
        layer, b, t = make_layer(proto, [], caffe_pb2.TRAIN)
        got = [int(v) for _ in range(4) for v in forward(layer, b, t)[0].ravel()]
        assert got == seq[r::2][:12], r
