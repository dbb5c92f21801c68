"""extract_features and LMDBWriter on the way out of an error: no database,
empty or half-written, is left under the name a user gave (a rerun would be
refused as "already exists" or read a partial feature set), and an LMDB that
cannot grow or be written ends in a DataError naming it."""
import os

import numpy as np
import pytest

from caffe_ocl.data import db as dbmod
from caffe_ocl.data.db import LMDBWriter
from caffe_ocl.data.features import extract_features
from caffe_ocl.errors import DataError


class _Blob:
    def __init__(self, shape):
        self.shape = shape

    def host_data(self):
        return np.ones(self.shape, np.float32)


class _Net:
    """forward() succeeds ``ok`` times, then raises (a failing layer, Ctrl-C)."""
    def __init__(self, ok, exc=RuntimeError("layer 'ip' failed")):
        self.blobs = {"a": _Blob((2, 3)), "b": _Blob((2, 1))}
        self.ok, self.exc = ok, exc

    def forward(self, blobs=None):
        if self.ok == 0:
            raise self.exc
        self.ok -= 1


@pytest.mark.parametrize("exc", [RuntimeError("layer 'ip' failed"), KeyboardInterrupt()])
def test_failure_midway_leaves_no_database(tmp_path, exc):
    paths = [str(tmp_path / "fa"), str(tmp_path / "fb")]
    with pytest.raises(type(exc)):
        extract_features(_Net(ok=2, exc=exc), ["a", "b"], paths, 5)
    assert os.listdir(tmp_path) == []


def test_existing_later_database_leaves_no_empty_earlier_one(tmp_path):
    (tmp_path / "fb").mkdir()
    paths = [str(tmp_path / "fa"), str(tmp_path / "fb")]
    with pytest.raises(DataError, match="fb already exists"):
        extract_features(_Net(ok=5), ["a", "b"], paths, 1)
    assert sorted(os.listdir(tmp_path)) == ["fb"]


def test_success_names_every_database(tmp_path):
    paths = [str(tmp_path / "fa"), str(tmp_path / "fb")]
    assert extract_features(_Net(ok=5), ["a", "b"], paths, 2) == {"a": 4, "b": 4}
    assert sorted(os.listdir(tmp_path)) == ["fa", "fb"]


def test_map_that_cannot_grow_is_a_data_error(tmp_path, monkeypatch):
    lmdb = dbmod._lmdb()
    w = LMDBWriter(str(tmp_path / "db"), map_size=1 << 16)

    class _Env:
        """The writer's environment whose map never has room and cannot grow."""
        def __init__(self, env):
            self.env = env

        def begin(self, write=False):
            raise lmdb.MapFullError("MDB_MAP_FULL")

        def info(self):
            return self.env.info()

        def set_mapsize(self, size):
            raise lmdb.MemoryError("Cannot allocate memory")

        def close(self):
            self.env.close()

    w.env = _Env(w.env)
    w.put("k", b"v")
    with pytest.raises(DataError, match=r"database .*db: cannot grow its map"):
        w.commit()
    w.abort()
    assert os.listdir(tmp_path) == []
