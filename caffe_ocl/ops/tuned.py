"""Per-device store of measured choices (``caffe_ocl tune``, tuning.py).

The convolution algorithm of each pass (forward, backward_data,
backward_weight), and the K split of a fully-connected product on a GPU
(``gemm_split_key``), come from fixed rules and a cost model (ops/conv.py
``algorithm``) that were tuned on the devices this project measured; on
another device they can be wrong. ``caffe_ocl tune`` times every algorithm
that applies to each convolution of a net on the device and stores the
fastest here; ``ops.conv.algorithm`` then takes the stored choice for that
exact geometry and pass (rules for everything not stored).

One JSON file per device, ``<cache dir>/tuned/<device>.json`` (cache dir:
``$CAFFE_OCL_CACHE``, default ``~/.cache/caffe_ocl``), named from the
device's name and a hash of its platform, driver and OpenCL versions, so a
driver update starts from the rules again. ``CAFFE_OCL_TUNED=0`` ignores
the stored choices (``caffe_ocl tune`` still writes them; ``--store=false``
only measures). The file is a cache: an unreadable one is reported and
ignored, never fatal.
"""
import hashlib
import json
import logging
import os
import re

from .. import config
from ..errors import CaffeOclError

log = logging.getLogger("caffe_ocl")

ENV = "CAFFE_OCL_TUNED"
FORMAT = 1
PASSES = ("forward", "backward_data", "backward_weight")

_stores = {}        # file path -> dict of entries (loaded once per process)


def enabled():
    """False when CAFFE_OCL_TUNED=0 turns stored choices off."""
    return config.get("TUNED")


def store_path(dev):
    """The device's file of tuned choices (None when the cache is switched
    off: CAFFE_OCL_CACHE set to an empty string)."""
    if not getattr(dev, "cache_dir", None):
        return None
    info = getattr(dev, "info", {}) or {}
    ident = "|".join(str(info.get(k, "")) for k in
                     ("platform_name", "platform_version", "name", "driver", "version"))
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(getattr(dev, "name", "device"))).strip("-")[:48]
    digest = hashlib.sha1(ident.encode()).hexdigest()[:12]
    return os.path.join(dev.cache_dir, "tuned", f"{slug or 'device'}-{digest}.json")


def conv_key(g, pass_, tf32, wino_tile=None):
    """Entry name of one convolution pass: every field of the geometry, and
    whether TF32 tensor cores were allowed (another set of kernels);
    ``wino_tile``: the Winograd tile of a forward that runs another tile
    than the setting's (a TRAIN net's under TF32, ops/winograd.py
    forward_tile), timed and stored apart."""
    return (f"conv:{pass_}:n{g.num}c{g.channels}h{g.height}w{g.width}o{g.out_channels}"
            f"k{g.kh}x{g.kw}p{g.ph},{g.pw}s{g.sh},{g.sw}d{g.dh},{g.dw}g{g.groups}:tf32={tf32}"
            + ("" if wino_tile is None else f":wino{wino_tile}"))


def gemm_split_key(M, N, K, tf32):
    """Entry name of a GEMM's K split (ops/gemm_splitk.py gemm_launches: a
    fully-connected layer's product on a GPU), stored as "x<factor>"."""
    return f"gemm:split:m{M}n{N}k{K}:tf32={int(tf32)}"


def entries(dev):
    """The stored entries of ``dev`` ({} when none or unreadable)."""
    path = store_path(dev)
    if path is None:
        return {}
    if path not in _stores:
        _stores[path] = _read(path)
    return _stores[path]


def _read(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring the tuned choices in %s (unreadable: %s); "
                    "`caffe_ocl tune` writes it anew", path, e)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT \
            or not isinstance(data.get("entries"), dict):
        log.warning("ignoring the tuned choices in %s (not a format-%d file of "
                    "caffe_ocl tune)", path, FORMAT)
        return {}
    log.info("using %d tuned choices from %s", len(data["entries"]), path)
    return data["entries"]


def lookup(dev, key):
    """The stored choice for ``key`` (its "choice" field) or None."""
    if not enabled():
        return None
    e = entries(dev).get(key)
    return e.get("choice") if isinstance(e, dict) else None


def save(dev, new_entries):
    """Merge ``new_entries`` (key -> {"choice": ..., ...}) into the device's
    file, written whole to a temporary file and renamed over the old one
    (a crash leaves the old file, never half of one)."""
    path = store_path(dev)
    if path is None:
        raise CaffeOclError("no cache directory to store tuned choices in (CAFFE_OCL_CACHE "
                            "is empty); set it, or tune with --store=false")
    merged = dict(_read(path))
    merged.update(new_entries)
    info = getattr(dev, "info", {}) or {}
    data = {"format": FORMAT,
            "device": {k: str(info.get(k, "")) for k in
                       ("name", "platform_name", "platform_version", "driver", "version")},
            "entries": dict(sorted(merged.items()))}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
    _stores[path] = data["entries"]
    return path


def forget_loaded():
    """Drop what this process has read (tests; a file changed by another)."""
    _stores.clear()
