"""convert_imageset / compute_image_mean / convert_mnist_data, read back by
an independent reader written here (lmdb + caffe_pb2.Datum, no caffe_ocl
reading code), and the demo's pieces."""
import gzip
import os
import struct

import cv2
import lmdb
import numpy as np
import pytest

from caffe_ocl import commands as cli
from caffe_ocl.errors import DataError
from caffe_ocl.proto import caffe_pb2


def read_lmdb(path):
    """Independent reader: [(key str, Datum)] in key order."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    out = []
    with env.begin() as txn:
        for k, v in txn.cursor():
            d = caffe_pb2.Datum()
            d.ParseFromString(v)
            out.append((k.decode(), d))
    env.close()
    return out


def datum_pixels(d):
    return np.frombuffer(d.data, np.uint8).reshape(d.channels, d.height, d.width)


@pytest.fixture
def imageset(tmp_path, rng):
    root = tmp_path / "root"
    root.mkdir()
    imgs = {}
    lines = []
    for i in range(5):
        name = f"a{i}.png" if i % 2 == 0 else f"b{i}.jpg"
        im = rng.integers(0, 256, (6 + i % 2, 8, 3), dtype=np.uint8)
        cv2.imwrite(str(root / name), im)
        imgs[name] = cv2.imread(str(root / name))   # jpg: what decodes
        lines.append(f"{name} {i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return root, tmp_path / "list.txt", imgs


def test_convert_imageset_raw(tmp_path, imageset):
    root, listfile, imgs = imageset
    db = tmp_path / "out_lmdb"
    assert cli.main(["convert_imageset", f"{root}/", str(listfile), str(db)]) == 0
    recs = read_lmdb(db)
    assert [k for k, _ in recs] == ["00000000_a0.png", "00000001_b1.jpg", "00000002_a2.png",
                                    "00000003_b3.jpg", "00000004_a4.png"]
    for i, (k, d) in enumerate(recs):
        name = k.split("_", 1)[1]
        assert d.label == i and not d.encoded
        np.testing.assert_array_equal(datum_pixels(d), imgs[name].transpose(2, 0, 1))


def test_convert_imageset_flags_resize_gray_shuffle(tmp_path, imageset):
    root, listfile, imgs = imageset
    db = tmp_path / "g_lmdb"
    rc = cli.main(["convert_imageset", "-gray", "--resize_height=4", "-resize_width", "5",
                   "--shuffle=true", "--check_size", f"{root}/", str(listfile), str(db)])
    assert rc == 0
    recs = read_lmdb(db)
    assert sorted(d.label for _, d in recs) == list(range(5))
    for k, d in recs:
        name = k.split("_", 1)[1]
        g = cv2.resize(cv2.imread(str(root / name), cv2.IMREAD_GRAYSCALE), (5, 4))
        assert (d.channels, d.height, d.width) == (1, 4, 5)
        np.testing.assert_array_equal(datum_pixels(d)[0], g)
        assert k.startswith(f"{int(k[:8]):08d}_")


def test_convert_imageset_encoded(tmp_path, imageset):
    root, listfile, imgs = imageset
    db = tmp_path / "e_lmdb"
    assert cli.main(["convert_imageset", "--encoded", "--encode_type", "png", f"{root}/",
                     str(listfile), str(db)]) == 0
    for k, d in read_lmdb(db):
        name = k.split("_", 1)[1]
        assert d.encoded
        if name.endswith(".png"):     # already png, no change: the file's own bytes
            assert d.data == (root / name).read_bytes()
        dec = cv2.imdecode(np.frombuffer(d.data, np.uint8), cv2.IMREAD_COLOR)
        np.testing.assert_array_equal(dec, imgs[name])


def test_convert_imageset_check_size_and_existing_db(tmp_path, imageset, capsys):
    root, listfile, _ = imageset
    rc = cli.main(["convert_imageset", "--check_size", f"{root}/", str(listfile),
                   str(tmp_path / "c")])
    assert rc == 1 and "line 2" in capsys.readouterr().err       # 7x8 after 6x8
    db = tmp_path / "exists"
    db.mkdir()
    rc = cli.main(["convert_imageset", f"{root}/", str(listfile), str(db)])
    assert rc == 1 and "already exists" in capsys.readouterr().err
    assert os.listdir(db) == []
    rc = cli.main(["convert_imageset", "--backend", "leveldb", f"{root}/", str(listfile),
                   str(tmp_path / "l")])
    assert rc == 1 and "not supported" in capsys.readouterr().err


def test_convert_imageset_skips_unreadable_images(tmp_path, imageset):
    root, listfile, _ = imageset
    (root / "broken.png").write_bytes(b"not an image")
    lst = tmp_path / "l2.txt"
    lst.write_text("a0.png 0\nbroken.png 1\na2.png 2\n")
    assert cli.main(["convert_imageset", f"{root}/", str(lst), str(tmp_path / "s")]) == 0
    assert [k for k, _ in read_lmdb(tmp_path / "s")] == ["00000000_a0.png", "00000002_a2.png"]


def test_compute_image_mean(tmp_path, imageset):
    root, listfile, imgs = imageset
    db = tmp_path / "m_lmdb"
    cli.main(["convert_imageset", "--resize_height=6", "--resize_width=8", f"{root}/",
              str(listfile), str(db)])
    out = tmp_path / "mean.binaryproto"
    assert cli.main(["compute_image_mean", str(db), str(out)]) == 0
    bp = caffe_pb2.BlobProto()
    bp.ParseFromString(out.read_bytes())
    assert (bp.num, bp.channels, bp.height, bp.width) == (1, 3, 6, 8)
    ref = np.mean([datum_pixels(d).astype(np.float64) for _, d in read_lmdb(db)], axis=0)
    np.testing.assert_allclose(np.asarray(bp.data).reshape(3, 6, 8), ref, rtol=1e-6)


def test_compute_image_mean_errors(tmp_path, capsys):
    assert cli.main(["compute_image_mean", str(tmp_path / "none"), "x"]) == 1
    assert "not found" in capsys.readouterr().err
    env = lmdb.open(str(tmp_path / "mix"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i, shape in enumerate([(1, 2, 2), (1, 2, 3)]):
            txn.put(b"%d" % i, caffe_pb2.Datum(channels=shape[0], height=shape[1],
                                               width=shape[2], data=bytes(np.prod(shape)))
                    .SerializeToString())
    env.close()
    assert cli.main(["compute_image_mean", str(tmp_path / "mix")]) == 1
    assert "key '1'" in capsys.readouterr().err


def _write_idx(tmp_path, imgs, labels, gz):
    op = gzip.open if gz else open
    ip, lp = tmp_path / ("i.gz" if gz else "i.idx"), tmp_path / ("l.gz" if gz else "l.idx")
    with op(ip, "wb") as f:
        f.write(struct.pack(">IIII", 2051, len(imgs), *imgs.shape[1:]) + imgs.tobytes())
    with op(lp, "wb") as f:
        f.write(struct.pack(">II", 2049, len(labels)) + labels.tobytes())
    return ip, lp


@pytest.mark.parametrize("gz", [False, True])
def test_convert_mnist_data(tmp_path, rng, gz):
    imgs = rng.integers(0, 256, (7, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 7, dtype=np.uint8)
    ip, lp = _write_idx(tmp_path, imgs, labels, gz)
    assert cli.main(["convert_mnist_data", str(ip), str(lp), str(tmp_path / "db")]) == 0
    recs = read_lmdb(tmp_path / "db")
    assert [k for k, _ in recs] == [f"{i:08d}" for i in range(7)]
    for (k, d), im, lab in zip(recs, imgs, labels):
        assert (d.channels, d.height, d.width, d.label) == (1, 4, 3, lab)
        np.testing.assert_array_equal(datum_pixels(d)[0], im)


def test_convert_mnist_data_bad_magic(tmp_path, rng):
    from caffe_ocl.data.tools import read_idx
    imgs = rng.integers(0, 256, (2, 2, 2), dtype=np.uint8)
    ip, lp = _write_idx(tmp_path, imgs, np.zeros(2, np.uint8), False)
    with pytest.raises(DataError, match=r"i\.idx: incorrect label file magic 2051"):
        read_idx(str(ip), str(ip))            # the image file given as labels
    with pytest.raises(DataError, match="incorrect image file magic"):
        read_idx(str(lp), str(lp))


def _one_line_mnist_error(tmp_path, capsys, ip, lp):
    assert cli.main(["convert_mnist_data", str(ip), str(lp), str(tmp_path / "db")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert not (tmp_path / "db").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("db")]
    return err[0]


def test_mnist_gz_crc_is_checked(tmp_path, capsys):
    """A stored-block .gz with one payload byte changed: the reader stopped
    at the last image, before the end of the stream, so the CRC was never
    checked and the changed pixel went into the database."""
    from caffe_ocl.data.tools import read_idx
    pixels = bytes([10, 20, 30, 40, 50, 60, 70, 80])
    g = bytearray(gzip.compress(struct.pack(">IIII", 2051, 2, 2, 2) + pixels,
                                compresslevel=0))
    g[g.rfind(bytes([80]))] = 81
    (tmp_path / "i.gz").write_bytes(bytes(g))
    (tmp_path / "l.idx").write_bytes(struct.pack(">II", 2049, 2) + bytes([1, 2]))
    with pytest.raises(DataError, match=r"i\.gz: damaged gzip file \(CRC check failed"):
        read_idx(str(tmp_path / "i.gz"), str(tmp_path / "l.idx"))
    assert "i.gz: damaged gzip file" in _one_line_mnist_error(
        tmp_path, capsys, tmp_path / "i.gz", tmp_path / "l.idx")
    # the labels file is checked the same way
    (tmp_path / "i.idx").write_bytes(struct.pack(">IIII", 2051, 2, 2, 2) + pixels)
    lg = bytearray(gzip.compress(struct.pack(">II", 2049, 2) + bytes([1, 2]),
                                 compresslevel=0))
    lg[lg.rfind(bytes([1, 2])) + 1] = 3
    (tmp_path / "l.gz").write_bytes(bytes(lg))
    with pytest.raises(DataError, match=r"l\.gz: damaged gzip file \(CRC check failed"):
        read_idx(str(tmp_path / "i.idx"), str(tmp_path / "l.gz"))


def test_mnist_truncated_or_damaged_gz_names_the_file(tmp_path, capsys, rng):
    from caffe_ocl.data.tools import read_idx
    imgs = rng.integers(0, 256, (6, 5, 5), dtype=np.uint8)
    ip, lp = _write_idx(tmp_path, imgs, np.zeros(6, np.uint8), True)
    good = ip.read_bytes()
    for cut in (len(good) - 4, len(good) // 2, 20):
        ip.write_bytes(good[:cut])
        with pytest.raises(DataError, match=r"i\.gz: truncated gzip file"):
            read_idx(str(ip), str(lp))
    assert "i.gz: truncated gzip file" in _one_line_mnist_error(tmp_path, capsys, ip, lp)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF                     # inside the deflate stream
    ip.write_bytes(bytes(bad))
    with pytest.raises(DataError, match=r"i\.gz: (damaged|truncated) gzip file"):
        read_idx(str(ip), str(lp))


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_data_past_the_limit_is_refused(tmp_path, capsys, rng, monkeypatch, gz):
    """A gzip bomb (30 MB inflating to 7 GB of genuine data) was read into
    memory until a MemoryError; data past MAX_IDX_BYTES is refused, read
    (and dropped) in chunks only as far as the limit."""
    from caffe_ocl.data import tools
    imgs = rng.integers(0, 256, (8, 4, 4), dtype=np.uint8)       # 128 bytes
    ip, lp = _write_idx(tmp_path, imgs, np.zeros(8, np.uint8), gz)
    monkeypatch.setattr(tools, "MAX_IDX_BYTES", 100)
    monkeypatch.setattr(tools, "_CHUNK", 16)
    reads = []
    real_read_up_to = tools._read_up_to
    monkeypatch.setattr(tools, "_read_up_to",
                        lambda f, n, **k: reads.append(n) or real_read_up_to(f, n, **k))
    with pytest.raises(DataError, match=rf"{ip.name}: the header gives 8 images of 4x4 "
                       r"\(128 bytes\); at most 100 bytes of data is read"):
        tools.read_idx(str(ip), str(lp))
    assert reads == []                        # nothing held
    assert f"{ip.name}: the header gives 8 images" in \
        _one_line_mnist_error(tmp_path, capsys, ip, lp)
    # within the limit: read
    monkeypatch.setattr(tools, "MAX_IDX_BYTES", 128)
    got, labels = tools.read_idx(str(ip), str(lp))
    np.testing.assert_array_equal(got, imgs)
    # a header claiming more than the file holds is still "truncated"
    head = struct.pack(">IIII", 2051, 2**32 - 1, 4, 4)
    data = head + imgs.tobytes()
    ip.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(DataError, match=rf"{ip.name}: truncated IDX file .* the file "
                       "holds 128"):
        tools.read_idx(str(ip), str(lp))


def test_mnist_data_after_the_declared_items_is_ignored_and_logged(tmp_path, rng, caplog):
    from caffe_ocl.data.tools import read_idx
    imgs = rng.integers(0, 256, (3, 2, 2), dtype=np.uint8)
    ip, lp = _write_idx(tmp_path, imgs, np.arange(3, dtype=np.uint8), True)
    with gzip.open(lp, "wb") as f:                     # 5 labels in the stream
        f.write(struct.pack(">II", 2049, 3) + bytes([0, 1, 2, 7, 7]))
    ip.write_bytes(ip.read_bytes() + b"junk after the gzip stream")
    got, labels = read_idx(str(ip), str(lp))
    np.testing.assert_array_equal(got, imgs)
    assert list(labels) == [0, 1, 2]
    assert "i.gz: data after the end of the gzip stream ignored" in caplog.text
    assert "l.gz: 2 bytes after the 3 labels its header declares ignored" in caplog.text


def test_embedded_mnist_and_models_are_found():
    from caffe_ocl.data.paths import mnist_dir, models_dir
    from caffe_ocl.data.tools import read_idx
    md = models_dir()
    assert os.path.isfile(os.path.join(md, "lenet", "lenet_train_test.prototxt"))
    assert os.path.isfile(os.path.join(md, "lenet", "lenet_solver.prototxt"))
    assert os.path.isfile(os.path.join(mnist_dir(), "README.md"))
    imgs, labels = read_idx(os.path.join(mnist_dir(), "t10k-images-idx3-ubyte.gz"),
                            os.path.join(mnist_dir(), "t10k-labels-idx1-ubyte.gz"))
    assert imgs.shape == (10000, 28, 28) and labels.max() == 9


def test_demo_files_have_absolute_paths(tmp_path):
    from caffe_ocl.data.demo import write_demo_files
    from caffe_ocl.proto import read_net_prototxt, read_solver_prototxt
    net_path, solver_path, _ = write_demo_files(str(tmp_path), "/abs/train", "/abs/test",
                                                max_iter=7)
    sp = read_solver_prototxt(solver_path)
    assert sp.net == net_path and sp.max_iter == 7 and sp.test_iter[0] == 20
    assert sp.snapshot_prefix == os.path.join(str(tmp_path), "lenet")
    net = read_net_prototxt(net_path)
    srcs = {lp.include[0].phase: lp.data_param.source for lp in net.layer if lp.type == "Data"}
    assert srcs == {caffe_pb2.TRAIN: "/abs/train", caffe_pb2.TEST: "/abs/test"}


@pytest.mark.slow
def test_demo_reaches_97_percent(tmp_path, capsys):
    assert cli.main(["demo", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    acc = float(out.split("final test accuracy:")[1].split()[0])
    assert acc >= 0.97
    assert (tmp_path / "lenet_train.png").is_file()
    assert "Test net output" in (tmp_path / "train.log").read_text()
