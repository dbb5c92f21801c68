"""LMDB databases of Datum records, opened as Caffe's db_lmdb.cpp does.

Reading never writes: the environment is opened read-only, without the lock
file (``lock=False``, so read-only media and databases being written by
another process work) and with readahead off. A cursor wraps around to the
first record at the end, logging Caffe's "Restarting data prefetching from
start." Writing (``LMDBWriter``) refuses an existing path, as Caffe's
``db::NEW`` does, commits every 1000 records and grows the map as needed.

LevelDB is not supported: such a database gives a DataError that says how
to convert it.
"""
import logging
import os
import threading

from ..errors import DataError

log = logging.getLogger("caffe_ocl")

LEVELDB_HINT = ("LevelDB databases are not supported by caffe_ocl; re-create the "
                "data as LMDB with `caffe_ocl convert_imageset --backend lmdb` (or "
                "`caffe_ocl convert_mnist_data`), or copy the records into an LMDB "
                "with a LevelDB->LMDB script (plyvel + lmdb: put every key/value "
                "unchanged), then set `backend: LMDB`")


def _lmdb():
    try:
        import lmdb
    except ImportError:  # pragma: no cover - lmdb is a dependency
        raise DataError("reading LMDB needs the lmdb package: pip install lmdb")
    return lmdb


def is_lmdb(path):
    return (os.path.isdir(path) and os.path.exists(os.path.join(path, "data.mdb"))) or \
        os.path.isfile(path)


def looks_like_leveldb(path):
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "CURRENT")) and \
        not os.path.exists(os.path.join(path, "data.mdb"))


def check_backend(source, backend_name, explicit, where):
    """Caffe's DataParameter.backend defaults to LEVELDB. An explicit LEVELDB
    is refused with a conversion hint; the implicit default reads an LMDB
    when the path holds one."""
    if backend_name == "LMDB":
        return
    if explicit or looks_like_leveldb(source) or not is_lmdb(source):
        if not explicit and not os.path.exists(source):
            return  # the reader reports the missing database
        raise DataError(f"{where}: database {source} has backend LEVELDB. {LEVELDB_HINT}")


# one read-only environment per path per process (LMDB's rule), ref-counted
_envs = {}
_envs_lock = threading.Lock()


def _open_env(path):
    lmdb = _lmdb()
    key = os.path.realpath(path)
    with _envs_lock:
        ent = _envs.get(key)
        if ent is not None:
            ent[1] += 1
            return ent[0]
        try:
            env = lmdb.open(path, readonly=True, lock=False, readahead=False,
                            subdir=os.path.isdir(path), max_readers=1024, meminit=False,
                            create=False)
        except lmdb.Error as e:
            raise DataError(f"database {path}: cannot open as LMDB ({e})") from None
        _envs[key] = [env, 1]
        return env


def _close_env(path):
    key = os.path.realpath(path)
    with _envs_lock:
        ent = _envs.get(key)
        if ent is None:
            return
        ent[1] -= 1
        if ent[1] <= 0:
            del _envs[key]
            try:
                ent[0].close()
            except Exception:
                pass


class LMDBReader:
    """Read-only access to one LMDB of Datum records.

    ``first()`` -> (key, value) of the first record; ``records(skip)`` an
    endless generator over (key, value) that wraps around, meant to be
    created and consumed in one (prefetch) thread; iterating the reader
    makes one pass."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise DataError(f"database {self.path}: not found")
        if os.path.isdir(self.path) and not os.path.exists(os.path.join(self.path, "data.mdb")):
            if looks_like_leveldb(self.path):
                raise DataError(f"database {self.path} is a LevelDB. {LEVELDB_HINT}")
            raise DataError(f"database {self.path}: not an LMDB (no data.mdb in the folder)")
        self.env = _open_env(self.path)
        self._closed = False
        try:
            self.entries = self.env.stat()["entries"]
        except _lmdb().Error as e:
            raise DataError(f"database {self.path}: cannot read ({e})") from None
        if self.entries == 0:
            raise DataError(f"database {self.path} is empty (no records)")

    def __len__(self):
        return self.entries

    def first(self):
        with self.env.begin(buffers=False) as txn:
            cur = txn.cursor()
            if not cur.first():
                raise DataError(f"database {self.path} is empty (no records)")
            return cur.key(), cur.value()

    def __iter__(self):
        with self.env.begin(buffers=False) as txn:
            for k, v in txn.cursor():
                yield k, v

    def records(self, skip=0):
        """Endless (key, value) stream starting ``skip`` records in; wraps."""
        with self.env.begin(buffers=False) as txn:
            cur = txn.cursor()
            if not cur.first():
                raise DataError(f"database {self.path} is empty (no records)")
            for _ in range(int(skip)):
                if not cur.next():
                    cur.first()
            while True:
                yield cur.key(), cur.value()
                if not cur.next():
                    log.info("Restarting data prefetching from start.")
                    cur.first()

    def close(self):
        if not self._closed:
            self._closed = True
            _close_env(self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_db(path, backend="lmdb"):
    """A reader for ``path`` (Caffe's db::GetDB + Open(READ))."""
    b = str(backend).lower()
    if b == "leveldb":
        raise DataError(f"database {path}: {LEVELDB_HINT}")
    if b != "lmdb":
        raise DataError(f"unknown database backend {backend!r} (caffe_ocl reads lmdb)")
    return LMDBReader(path)


class LMDBWriter:
    """A new LMDB (Caffe's db::NEW: the path must not exist yet)."""
    COMMIT_EVERY = 1000

    def __init__(self, path, map_size=1 << 28):
        lmdb = _lmdb()
        self.path = os.fspath(path)
        if os.path.exists(self.path):
            raise DataError(f"database {self.path} already exists; remove it or choose "
                            "another name (caffe_ocl never writes into an existing database)")
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise DataError(f"database {self.path}: parent folder {parent} does not exist")
        try:
            os.mkdir(self.path, 0o755)
            self.env = lmdb.open(self.path, map_size=map_size, subdir=True, meminit=False,
                                 map_async=True, max_dbs=0)
        except (OSError, lmdb.Error) as e:
            raise DataError(f"database {self.path}: cannot create ({e})") from None
        self.pending = []
        self.count = 0

    def put(self, key, value):
        if isinstance(key, str):
            key = key.encode("utf-8")
        self.pending.append((key, value))
        self.count += 1
        if len(self.pending) >= self.COMMIT_EVERY:
            self.commit()

    def commit(self):
        lmdb = _lmdb()
        if not self.pending:
            return
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for k, v in self.pending:
                        txn.put(k, v)
                break
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
        self.pending = []

    def close(self):
        if self.env is not None:
            self.commit()
            self.env.sync(True)
            self.env.close()
            self.env = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close()
