"""`caffe_ocl data mnist|cifar10` (caffe_ocl/data/examples.py): the
databases the shipped solvers read, where their prototxts name them."""
import io
import os
import tarfile

import numpy as np
import pytest

from caffe_ocl.data import cifar
from caffe_ocl.data import examples as ex
from caffe_ocl.data.db import LMDBReader
from caffe_ocl.errors import DataError
from caffe_ocl.proto import blobproto_to_array, caffe_pb2, read_blobproto


def _records(path):
    out = []
    with LMDBReader(path) as r:
        for k, v in r:
            d = caffe_pb2.Datum()
            d.ParseFromString(v)
            out.append((k.decode(), d))
    return out


def test_mnist_from_the_embedded_digits(tmp_path, caplog):
    out = str(tmp_path / "examples" / "mnist")
    train, test = ex.build_mnist(out, progress=False)
    assert (train, test) == (os.path.join(out, "mnist_train_lmdb"),
                             os.path.join(out, "mnist_test_lmdb"))
    tr, te = _records(train), _records(test)
    assert (len(tr), len(te)) == (8000, 2000)
    k, d = tr[0]
    assert k == "00000000" and (d.channels, d.height, d.width) == (1, 28, 28)
    assert len(d.data) == 784 and 0 <= d.label <= 9
    assert len({d.label for _, d in te}) == 10
    # complete databases are kept
    before = os.path.getmtime(os.path.join(train, "data.mdb"))
    caplog.clear()
    ex.build_mnist(out, progress=False)
    assert os.path.getmtime(os.path.join(train, "data.mdb")) == before
    assert "Creating" not in caplog.text


def _cifar_batch(rng, n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 256, (n, 3, 32, 32)).astype(np.uint8)
    buf = b"".join(bytes([l]) + im.tobytes() for l, im in zip(labels, images))
    return buf, images, labels


def _cifar_files(rng, sizes=(3, 4, 2, 5, 3), n_test=4):
    files = {}
    for i, n in enumerate(sizes, 1):
        files[f"data_batch_{i}.bin"] = _cifar_batch(rng, n)
    files["test_batch.bin"] = _cifar_batch(rng, n_test)
    return files


def _check_cifar(files, train, test, mean):
    tr = _records(train)
    want = [(im, l) for i in range(1, 6)
            for im, l in zip(files[f"data_batch_{i}.bin"][1], files[f"data_batch_{i}.bin"][2])]
    assert [k for k, _ in tr] == [f"{i:05d}" for i in range(len(want))]
    for (_, d), (im, l) in zip(tr, want):
        assert (d.channels, d.height, d.width) == (3, 32, 32)
        assert d.data == im.tobytes() and d.label == l   # bytes as stored: R, G, B planes
    te = _records(test)
    assert [d.label for _, d in te] == list(files["test_batch.bin"][2])
    assert te[0][1].data == files["test_batch.bin"][1][0].tobytes()
    m = blobproto_to_array(read_blobproto(mean))
    ref = np.stack([im for im, _ in want]).astype(np.float64).mean(0)
    assert m.shape in ((1, 3, 32, 32), (3, 32, 32))
    np.testing.assert_allclose(m.reshape(3, 32, 32), ref, rtol=1e-6, atol=1e-4)


def test_cifar10_from_a_folder(tmp_path, rng):
    files = _cifar_files(rng)
    src = tmp_path / "cifar-10-batches-bin"
    src.mkdir()
    for name, (buf, _, _) in files.items():
        (src / name).write_bytes(buf)
    out = str(tmp_path / "examples" / "cifar10")
    # the folder above the unpacked one is found too
    train, test, mean = ex.build_cifar10(str(tmp_path), out)
    assert (train, test, mean) == (os.path.join(out, "cifar10_train_lmdb"),
                                   os.path.join(out, "cifar10_test_lmdb"),
                                   os.path.join(out, "mean.binaryproto"))
    _check_cifar(files, train, test, mean)


def test_cifar10_from_the_tar_gz_and_replaced_when_run_again(tmp_path, rng):
    def tgz(files):
        path = tmp_path / "cifar-10-binary.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for name, (buf, _, _) in files.items():
                info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
                info.size = len(buf)
                tar.addfile(info, io.BytesIO(buf))
        return str(path)
    out = str(tmp_path / "out")
    files = _cifar_files(rng)
    _check_cifar(files, *ex.build_cifar10(tgz(files), out))
    files = _cifar_files(rng, sizes=(2, 2, 2, 2, 3))       # other data: other counts
    _check_cifar(files, *ex.build_cifar10(tgz(files), out))


def test_cifar10_errors_say_where_to_get_it(tmp_path, rng):
    with pytest.raises(DataError, match="cifar-10-binary.tar.gz") as e:
        ex.build_cifar10(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    assert ex.CIFAR10_URL in str(e.value)
    files = _cifar_files(rng)
    for name, (buf, _, _) in files.items():
        if name != "test_batch.bin":
            (tmp_path / name).write_bytes(buf)
    with pytest.raises(DataError, match="no test_batch.bin"):
        ex.build_cifar10(str(tmp_path), str(tmp_path / "out"))
    (tmp_path / "test_batch.bin").write_bytes(files["test_batch.bin"][0][:-1])
    with pytest.raises(DataError, match="whole number of CIFAR-10 records"):
        ex.build_cifar10(str(tmp_path), str(tmp_path / "out"))
    bad = bytearray(files["test_batch.bin"][0])
    bad[0] = 12                                 # a CIFAR-100 fine label
    (tmp_path / "test_batch.bin").write_bytes(bytes(bad))
    with pytest.raises(DataError, match="label 12 out of range 0..9"):
        ex.build_cifar10(str(tmp_path), str(tmp_path / "out"))
    (tmp_path / "notatar.tar.gz").write_bytes(b"nonsense")
    with pytest.raises(DataError, match="not a readable .tar.gz"):
        ex.build_cifar10(str(tmp_path / "notatar.tar.gz"), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "cifar10_train_lmdb")


def test_cifar10_member_bigger_than_a_batch_is_not_read(tmp_path, rng, monkeypatch):
    """A 241-byte .tar.gz can hold an 8 GiB sparse member: its size is
    checked against a CIFAR-10 batch's before anything is read (reading it
    was a MemoryError)."""
    files = _cifar_files(rng)
    src = tmp_path / "cifar-10-binary.tar.gz"
    with tarfile.open(src, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, (buf, _, _) in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(buf)
            tar.addfile(info, io.BytesIO(buf))
    big = len(files["data_batch_2.bin"][0])
    monkeypatch.setattr(cifar, "MAX_BATCH_RECORDS", 3)
    monkeypatch.setattr(cifar, "MAX_BATCH_BYTES", 3 * 3073)
    read = []
    real_extract = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile",
                        lambda self, m: read.append(m.name) or real_extract(self, m))
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"{src}: member cifar-10-batches-bin/"
                       rf"data_batch_2.bin: {big} bytes, more than a CIFAR-10 batch holds "
                       r"\(at most 3 records of 3073 bytes, 9219 bytes\)"):
        ex.build_cifar10(str(src), str(out))
    assert "cifar-10-batches-bin/data_batch_2.bin" not in read
    assert not out.exists() or not os.listdir(out)
    # the same for an unpacked folder
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for name, (buf, _, _) in files.items():
        (folder / name).write_bytes(buf)
    with pytest.raises(DataError, match=rf"data_batch_2.bin: {big} bytes, more than"):
        ex.build_cifar10(str(folder), str(out))


def test_cifar10_sparse_8_gib_member(tmp_path):
    """The fuzz case itself: a GNU sparse member of 8 GiB in a tiny .tar.gz
    (written by hand: a sparse header claiming the size, no data)."""
    src = tmp_path / "sparse.tar.gz"
    with tarfile.open(src, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("data_batch_1.bin")
        info.type = tarfile.GNUTYPE_SPARSE
        info.size = 0
        info.sparse = []
        buf = bytearray(info.tobuf(tarfile.GNU_FORMAT))
        # realsize (offset 483, 12 octal digits) = 8 GiB, the map empty
        buf[483:495] = b"%011o\0" % (8 << 30)
        buf[148:156] = b" " * 8
        buf[148:156] = b"%06o\0 " % sum(buf[:512])
        tar.fileobj.write(bytes(buf))
        tar.offset += len(buf)
    with tarfile.open(src) as tar:
        assert tar.getmembers()[0].size == 8 << 30
    with pytest.raises(DataError, match=r"member data_batch_1.bin: 8589934592 bytes, more "
                       "than a CIFAR-10 batch holds"):
        ex.build_cifar10(str(src), str(tmp_path / "out"))


def test_convert_cifar_data_file_bigger_than_a_batch_is_not_read(tmp_path, rng, monkeypatch):
    """convert_cifar_data reads the batch files of a folder: one larger than
    a batch is an error naming it before it is read (a sparse file of
    gigabytes was read whole)."""
    files = _cifar_files(rng)
    for name, (buf, _, _) in files.items():
        (tmp_path / name).write_bytes(buf)
    big = len(files["data_batch_2.bin"][0])
    monkeypatch.setattr(cifar, "MAX_BATCH_RECORDS", 3)
    monkeypatch.setattr(cifar, "MAX_BATCH_BYTES", 3 * 3073)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataError, match=rf"data_batch_2.bin: {big} bytes, more than a "
                       "CIFAR-10 batch holds"):
        cifar.convert_cifar_data(str(tmp_path), str(out))
