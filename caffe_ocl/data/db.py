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
import shutil
import stat
import struct
import threading

import numpy as np

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


# --------------------------------------------------------------------------
# Checking a data.mdb before LMDB maps it. liblmdb trusts the file: a file
# shorter than its meta page says is a SIGBUS when a page past the end is
# touched, a zeroed or overwritten page an assertion abort (mdb.c IS_LEAF)
# -- neither can be caught. The check reads the two meta pages, picks the
# newer as LMDB does, checks the file holds every page up to the last one,
# then walks the main B-tree from its root: every branch/leaf page must
# carry its own number, the right flags and sane offsets; every overflow
# record (large Datum) must start with an overflow page inside the file.
# Layout (mdb.c, 64-bit builds): page header {pgno u64, pad u16, flags u16,
# lower u16, upper u16} (16 bytes), meta after it {magic u32, version u32,
# address u64, mapsize u64, 2 x MDB_db (48 bytes), last_pg u64, txnid u64};
# MDB_db {pad u32 (page size in the free DB), flags u16, depth u16,
# branch, leaf, overflow pages, entries, root (u64 each)}.

_MDB_MAGIC = 0xBEEFC0DE
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
_F_BIGDATA = 0x01
_P_INVALID = 0xFFFFFFFFFFFFFFFF
_HDR = 16
_verdicts = {}


def _meta(buf, off):
    if len(buf) < off + 152:
        return None
    pgno, _, flags = struct.unpack_from("<QHH", buf, off)
    magic, version = struct.unpack_from("<II", buf, off + 16)
    if magic != _MDB_MAGIC or not flags & _P_META:
        return None
    psize = struct.unpack_from("<I", buf, off + 40)[0]
    main = struct.unpack_from("<IHHQQQQQ", buf, off + 88)
    last_pg, txnid = struct.unpack_from("<QQ", buf, off + 136)
    return {"version": version, "psize": psize, "depth": main[2], "entries": main[6],
            "root": main[7], "last_pg": last_pg, "txnid": txnid}


def check_lmdb_file(path):
    """Raise DataError (one line naming the file and page) when the LMDB
    data file ``path`` is truncated or has a damaged page; the verdict is
    kept per (path, size, mtime)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"database {path}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"database {path}: not a regular file")
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if _verdicts.get(key):
        return
    with open(path, "rb") as f:
        _check_lmdb_bytes(f, st.st_size, path)
    _verdicts[key] = True


def _check_lmdb_bytes(f, size, path):
    head = f.read(2 * 65536 + 152)
    m0 = _meta(head, 0)
    if m0 is None:
        raise DataError(f"database {path}: not an LMDB data file (no valid meta page 0)")
    psize = m0["psize"]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise DataError(f"database {path}: meta page gives page size {psize}")
    m1 = _meta(head, psize)
    if m1 is None:
        raise DataError(f"database {path}: meta page 1 is damaged (at byte {psize})")
    meta = m1 if m1["txnid"] > m0["txnid"] else m0
    need = (meta["last_pg"] + 1) * psize
    if size < need:
        raise DataError(f"database {path}: truncated: its meta page says {meta['last_pg'] + 1}"
                        f" pages of {psize} bytes ({need} bytes), the file has {size} bytes")
    npages = meta["last_pg"] + 1
    root = meta["root"]
    if root == _P_INVALID:
        return
    if not 2 <= root < npages:
        raise DataError(f"database {path}: root page {root} outside the file's {npages} pages")

    def bad(pg, what):
        return DataError(f"database {path}: page {int(pg)} is damaged ({what}); the "
                         "database must be re-created")

    # level by level from the root, every page of a level checked at once
    # (numpy over a read-only map of the file: a 100 MB database takes a
    # fraction of a second, see README)
    mm = np.memmap(path, np.uint8, "r", shape=(npages, psize))
    level = np.array([root], np.int64)
    depth = meta["depth"]
    seen = 0
    while len(level):
        seen += len(level)
        if seen > npages or depth < 1:
            raise bad(level[0], "the page tree is deeper than its meta page says")
        rows = np.asarray(mm[level])
        hdr = rows[:, :16].copy()
        pgno = hdr[:, 0:8].view("<u8")[:, 0]
        flags = hdr[:, 10:12].view("<u2")[:, 0].astype(np.int64)
        lower = hdr[:, 12:14].view("<u2")[:, 0].astype(np.int64)
        upper = hdr[:, 14:16].view("<u2")[:, 0].astype(np.int64)
        wrong = np.flatnonzero(pgno != level.astype(np.uint64))
        if len(wrong):
            i = wrong[0]
            raise bad(level[i], f"it says it is page {int(pgno[i])}")
        want = _P_LEAF if depth == 1 else _P_BRANCH
        other = (_P_LEAF | _P_BRANCH | _P_OVERFLOW | _P_META) & ~want
        wrong = np.flatnonzero(((flags & want) == 0) | ((flags & other) != 0))
        if len(wrong):
            i = wrong[0]
            raise bad(level[i], f"flags 0x{int(flags[i]):x} where a "
                      f"{'leaf' if depth == 1 else 'branch'} page belongs")
        wrong = np.flatnonzero((lower < _HDR) | (lower > upper) | (upper > psize)
                               | ((lower - _HDR) % 2 != 0))
        if len(wrong):
            i = wrong[0]
            raise bad(level[i], f"free space bounds {int(lower[i])}..{int(upper[i])}")
        if depth == 1:
            rows = rows[(flags & _P_LEAF2) == 0]
            keep = (flags & _P_LEAF2) == 0
            level, lower, upper = level[keep], lower[keep], upper[keep]
        nkeys = (lower - _HDR) // 2
        maxk = int(nkeys.max()) if len(nkeys) else 0
        if maxk == 0:
            break
        ptrs = rows[:, _HDR:_HDR + 2 * maxk].copy().view("<u2").astype(np.int64)
        valid = np.arange(maxk)[None, :] < nkeys[:, None]
        ptrs = np.where(valid, ptrs, psize - 8)        # padding: a harmless offset
        wrong = np.flatnonzero(((ptrs < upper[:, None]) | (ptrs > psize - 8)).any(1))
        if len(wrong):
            raise bad(level[wrong[0]], "a node offset outside the page")
        r = np.arange(len(level))[:, None]

        def u16(k):
            return rows[r, ptrs + k].astype(np.int64) | rows[r, ptrs + k + 1].astype(
                np.int64) << 8
        lo, hi, nflags, ksize = u16(0), u16(2), u16(4), u16(6)
        end = ptrs + 8 + ksize
        if depth > 1:
            wrong = np.flatnonzero((valid & (end > psize)).any(1))
            if len(wrong):
                raise bad(level[wrong[0]], "a node's key runs past the page")
            child = lo | hi << 16 | nflags << 32
            wrong = np.flatnonzero((valid & ((child < 2) | (child >= npages))).any(1))
            if len(wrong):
                raise bad(level[wrong[0]], "a node points to a page outside the file")
            level = child[valid]
            depth -= 1
            continue
        dsize = lo | hi << 16
        big = valid & ((nflags & _F_BIGDATA) != 0)
        wrong = np.flatnonzero((valid & (np.where(big, end + 8, end + dsize) > psize)).any(1))
        if len(wrong):
            raise bad(level[wrong[0]], "a node's data runs past the page")
        if big.any():
            pi, ki = np.nonzero(big)
            off = end[pi, ki]
            ovf = np.zeros(len(pi), np.int64)
            for j in range(8):
                ovf |= rows[pi, off + j].astype(np.int64) << (8 * j)
            outside = np.flatnonzero((ovf < 2) | (ovf >= npages))
            if len(outside):
                raise bad(level[pi[outside[0]]], f"a record's data is on page "
                          f"{int(ovf[outside[0]])}, outside the file")
            ohdr = np.asarray(mm[ovf, :16]).copy()
            opgno = ohdr[:, 0:8].view("<u8")[:, 0]
            oflags = ohdr[:, 10:12].view("<u2")[:, 0].astype(np.int64)
            opages = ohdr[:, 12:16].view("<u4")[:, 0].astype(np.int64)
            wrong = np.flatnonzero((opgno != ovf.astype(np.uint64))
                                   | ((oflags & _P_OVERFLOW) == 0)
                                   | (ovf + opages > npages)
                                   | (opages * psize - _HDR < dsize[pi, ki]))
            if len(wrong):
                i = wrong[0]
                raise bad(ovf[i], f"not the overflow page of a {int(dsize[pi[i], ki[i]])}"
                          "-byte record")
        break
    del mm


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
        subdir = os.path.isdir(path)
        check_lmdb_file(os.path.join(path, "data.mdb") if subdir else path)
        # without the lock file (reading never writes, read-only media work);
        # a writer changing the database meanwhile is detected and reported
        # (LMDBReader._check_unchanged)
        try:
            env = lmdb.open(path, readonly=True, lock=False, readahead=False,
                            subdir=subdir, max_readers=1024, meminit=False,
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
        self._data_file = os.path.join(self.path, "data.mdb") \
            if os.path.isdir(self.path) else self.path
        self._stamp = self._file_stamp()
        try:
            self.entries = self.env.stat()["entries"]
        except _lmdb().Error as e:
            raise DataError(f"database {self.path}: cannot read ({e})") from None
        if self.entries == 0:
            raise DataError(f"database {self.path} is empty (no records)")

    def __len__(self):
        return self.entries

    def _file_stamp(self):
        try:
            st = os.stat(self._data_file)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def _check_unchanged(self, where):
        """DataError when the data file changed since it was opened (another
        process writes the database; without the lock file the read would
        otherwise see half-written pages)."""
        if self._file_stamp() != self._stamp:
            raise DataError(f"database {self.path} changed while being read ({where}): "
                            "another process writes it; read it when the writer is done")

    def _txn(self):
        lmdb = _lmdb()
        try:
            return self.env.begin(buffers=False)
        except lmdb.MapResizedError:
            # a writer grew the map: adopt the new size (LMDB's documented remedy)
            try:
                self.env.set_mapsize(0)
                return self.env.begin(buffers=False)
            except lmdb.Error as e:
                raise DataError(f"database {self.path} changed size while being read "
                                f"(another process writes it): {e}") from None
        except lmdb.Error as e:
            raise DataError(f"database {self.path}: cannot read ({e})") from None

    def _failed(self, e, index):
        if self._file_stamp() != self._stamp:
            return DataError(f"database {self.path} changed while being read (record "
                             f"{index}): another process writes it ({type(e).__name__})")
        return DataError(f"database {self.path}: record {index} cannot be read "
                         f"({type(e).__name__}: {e}); the database is damaged")

    def first(self):
        lmdb = _lmdb()
        with self._txn() as txn:
            try:
                cur = txn.cursor()
                if not cur.first():
                    raise DataError(f"database {self.path} is empty (no records)")
                return cur.key(), cur.value()
            except lmdb.Error as e:
                raise self._failed(e, 0) from None

    def __iter__(self):
        lmdb = _lmdb()
        with self._txn() as txn:
            i = 0
            try:
                for k, v in txn.cursor():
                    yield k, v
                    i += 1
            except lmdb.Error as e:
                raise self._failed(e, i) from None

    CHECK_EVERY = 1000

    def records(self, skip=0):
        """Endless (key, value) stream starting ``skip`` records in; wraps.
        Every CHECK_EVERY records (and at each wrap) the data file is checked
        to be the one that was opened."""
        lmdb = _lmdb()
        with self._txn() as txn:
            i = 0
            try:
                cur = txn.cursor()
                if not cur.first():
                    raise DataError(f"database {self.path} is empty (no records)")
                for _ in range(int(skip) % max(self.entries, 1)):
                    if not cur.next():
                        cur.first()
                i = int(skip) % max(self.entries, 1)
                while True:
                    yield cur.key(), cur.value()
                    i += 1
                    if i % self.CHECK_EVERY == 0:
                        self._check_unchanged(f"record {i}")
                    if not cur.next():
                        self._check_unchanged("at its end")
                        log.info("Restarting data prefetching from start.")
                        i = 0
                        cur.first()
            except lmdb.Error as e:
                raise self._failed(e, i) from None

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
    """A new LMDB (Caffe's db::NEW: the path must not exist yet).

    Records go to ``{path}.tmp-{pid}``, which ``close()`` renames to
    ``path``: an error or a kill midway (``abort()``, or leaving a ``with``
    block by an exception) never leaves a half-written database under the
    name, which a rerun would refuse as "already exists"."""
    COMMIT_EVERY = 1000

    def __init__(self, path, map_size=1 << 28):
        lmdb = _lmdb()
        self.path = os.fspath(path)
        if os.path.lexists(self.path):
            raise DataError(f"database {self.path} already exists; remove it or choose "
                            "another name (caffe_ocl never writes into an existing database)")
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise DataError(f"database {self.path}: parent folder {parent} does not exist")
        self.tmp = f"{self.path}.tmp-{os.getpid()}"
        self.env = None
        try:
            if os.path.lexists(self.tmp):       # this process's own leftover
                shutil.rmtree(self.tmp)
            os.mkdir(self.tmp, 0o755)
            self.env = lmdb.open(self.tmp, map_size=map_size, subdir=True, meminit=False,
                                 map_async=True, max_dbs=0)
        except (OSError, lmdb.Error) as e:
            self._remove_tmp()
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
                size = self.env.info()["map_size"] * 2
                try:
                    self.env.set_mapsize(size)
                except lmdb.Error as e:     # no address space left for the map
                    raise DataError(f"database {self.path}: cannot grow its map to {size} "
                                    f"bytes ({e})") from None
            except lmdb.Error as e:         # a full disk, a memory limit
                raise DataError(f"database {self.path}: cannot write records ({e})") from None
        self.pending = []

    def close(self):
        """Commit, and give the database its name."""
        if self.env is not None:
            try:
                self.commit()
                self.env.sync(True)
            except BaseException:
                self.abort()
                raise
            self.env.close()
            self.env = None
            try:
                os.rename(self.tmp, self.path)
            except OSError as e:
                self._remove_tmp()
                raise DataError(f"database {self.path}: cannot give it its name "
                                f"({e.strerror or e})") from None

    def abort(self):
        """Drop everything written: neither the name nor the temp folder stays."""
        if self.env is not None:
            try:
                self.env.close()
            except Exception:  # noqa: BLE001 - closing on the way out of an error
                pass
            self.env = None
        self.pending = []
        self._remove_tmp()

    def _remove_tmp(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.abort()
        else:
            self.close()
