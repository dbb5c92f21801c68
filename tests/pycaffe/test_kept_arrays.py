"""Arrays kept from ``blob.data``/``blob.diff`` show the blob's current
values after every caffe_ocl call, as pycaffe's views of the blob memory
do; writes through them reach the device."""
import numpy as np
import pytest

import caffe
from caffe_ocl import blob as blob_mod

NET = """
force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 }
    bias_filler { type: "constant" value: 0.2 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture
def files(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.5\nlr_policy: "fixed"\nmax_iter: 10\n'
                      'momentum: 0.9\nweight_decay: 0.01\nrandom_seed: 1\n')
    return str(net), str(solver)


def _feed(net):
    r = np.random.RandomState(0)
    net.blobs["data"].data[...] = r.randn(4, 5)
    net.blobs["label"].data[...] = [0, 1, 2, 1]


def _device_values(mem):
    """What the device holds (read without touching the host copy)."""
    out = np.empty(mem.capacity, np.float32)
    mem.device.download(out, mem.to_device())
    return out


def test_kept_arrays_follow_solver_and_net_calls(files):
    s = caffe.SGDSolver(files[1])
    net = s.net
    _feed(net)
    w = net.params["ip"][0].data           # kept views, as pycaffe users do
    dw = net.params["ip"][0].diff
    out = net.blobs["ip"].data
    w0 = w.copy()
    s.step(1)
    b = net.params["ip"][0]
    np.testing.assert_array_equal(w, b.host_data())
    assert not np.array_equal(w, w0)           # the update changed them
    np.testing.assert_array_equal(dw, b.host_diff())
    assert dw.any()
    np.testing.assert_array_equal(out, net.blobs["ip"].host_data())
    net.clear_param_diffs()
    assert not dw.any()                        # cleared on the device, seen here
    net.forward()
    net.backward()
    np.testing.assert_array_equal(dw, b.host_diff())
    assert dw.any()
    before = w.copy()
    s.apply_update()
    np.testing.assert_array_equal(w, b.host_data())
    assert not np.array_equal(w, before)


def test_kept_sub_views_follow_too(files):
    net = caffe.Net(files[0], caffe.TEST)
    _feed(net)
    row = net.blobs["ip"].data[1]              # a view of a view
    net.forward()
    first = row.copy()
    net.blobs["data"].data[...] *= -1
    net.forward()
    np.testing.assert_array_equal(row, net.blobs["ip"].host_data()[1])
    assert not np.array_equal(row, first)


def test_writes_through_kept_arrays_reach_the_device(files):
    net = caffe.Net(files[0], caffe.TEST)
    _feed(net)
    w = net.params["ip"][0].data
    bias = net.params["ip"][1].data
    x = net.blobs["data"].data
    net.forward()
    # written after a call (the device copy was current): must still be used
    w[...] = 0
    bias[...] = [1, 2, 3]
    x[...] = 7
    out = net.forward(blobs=["ip"])["ip"]
    np.testing.assert_array_equal(out, np.tile([1, 2, 3], (4, 1)))
    np.testing.assert_array_equal(_device_values(net.params["ip"][0].data_mem)[:15], 0)


def test_copy_from_updates_kept_arrays(files, tmp_path):
    a = caffe.Net(files[0], caffe.TEST)
    b = caffe.Net(files[0], caffe.TEST)
    a.params["ip"][0].data[...] = 3.0
    path = str(tmp_path / "w.caffemodel")
    a.save(path)
    kept = b.params["ip"][0].data
    b.copy_from(path)
    np.testing.assert_array_equal(kept, 3.0)


def test_no_copies_when_nothing_is_kept(files):
    net = caffe.Net(files[0], caffe.TEST)
    _feed(net)
    net.forward()
    blob_mod.refresh_kept()
    # the temporary views above are gone: nothing is tracked any more
    mems = {id(b.data_mem) for b in net.blobs.values()} | \
        {id(p.data_mem) for ps in net.params.values() for p in ps}
    assert not mems & {id(m) for m in blob_mod._kept}
    # and a forward leaves the output on the device only
    net.forward()
    assert net.blobs["ip"].data_mem.head == blob_mod.AT_DEVICE
