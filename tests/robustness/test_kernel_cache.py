"""The kernel cache is verified before the driver sees an entry (issue
#25): each entry holds the key it was built for and a checksum; a flipped
bit, a truncated file or a valid binary stored under another entry's name
is rebuilt and the file replaced (a flipped bit aborted PoCL; a swapped
entry ran the wrong kernels and gave all-NaN outputs)."""
import json
import os
import subprocess
import sys

import pytest

from caffe_ocl.device import read_cache_entry, write_cache_entry
from conftest import child_env


NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 4 weight_filler { type: "constant" value: 0.5 } } }
layer { name: "s" type: "Sigmoid" bottom: "y" top: "s" }
"""

CODE = """
import json, numpy as np, caffe_ocl as c
from caffe_ocl.proto import parse_net_text
n = c.Net(parse_net_text(open(%r).read()), c.TEST)
n.blobs["x"].data[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
out = n.forward()["s"]
print(json.dumps({"stats": n.device.build_stats, "out": out.ravel().tolist()}))
"""


def run(cache, net):
    # caffe_ocl's own binary store, also on PoCL (where it is off by default)
    env = child_env(CAFFE_OCL_CACHE=str(cache), CAFFE_OCL_BINARY_CACHE="1")
    p = subprocess.run([sys.executable, "-c", CODE % str(net)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def cached(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    cache = tmp_path / "cache"
    first = run(cache, net)
    assert first["stats"]["built"] > 0
    bins = sorted(cache / f for f in os.listdir(cache) if f.endswith(".bin"))
    assert len(bins) >= 2
    return net, cache, bins, first


def test_entries_round_trip_and_load(cached):
    net, cache, bins, first = cached
    for b in bins:
        read_cache_entry(str(b))
    again = run(cache, net)
    assert again["stats"]["built"] == 0 and again["out"] == first["out"]


def test_flipped_bit_is_rebuilt_and_replaced(cached):
    net, cache, bins, first = cached
    for b in bins:
        data = bytearray(b.read_bytes())
        data[len(data) // 2] ^= 0x10
        b.write_bytes(bytes(data))
        with pytest.raises(OSError, match="checksum"):
            read_cache_entry(str(b))
    again = run(cache, net)
    assert again["stats"]["built"] == first["stats"]["built"]
    assert again["out"] == first["out"]
    for b in bins:                       # the bad files were replaced
        read_cache_entry(str(b))


def test_entry_stored_under_another_name_is_not_used(cached):
    net, cache, bins, first = cached
    a, b = bins[0], bins[1]
    b_binary = read_cache_entry(str(b))
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())        # a valid entry, for the other key
    b.write_bytes(a_bytes)
    with pytest.raises(OSError, match="another key"):
        read_cache_entry(str(a))
    # a bare binary (the old format) is refused too
    a.write_bytes(b_binary)
    with pytest.raises(OSError, match="not a caffe_ocl cache entry"):
        read_cache_entry(str(a))
    again = run(cache, net)
    assert again["out"] == first["out"]
    assert again["stats"]["built"] >= 2


def test_truncated_entry_is_refused(tmp_path):
    path = tmp_path / ("0" * 64 + ".v2.bin")
    write_cache_entry(str(path), b"some binary bytes")
    assert read_cache_entry(str(path)) == b"some binary bytes"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(OSError, match="bytes of binary"):
        read_cache_entry(str(path))
