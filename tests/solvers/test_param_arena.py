"""The parameter arena (caffe_ocl/solvers/param_arena.py): one buffer for all
learnable parameters so that the update and the gradient clearing are one
launch each. It must give bitwise the same training as per-blob storage
(CAFFE_OCL_PARAM_ARENA=0), keep pycaffe views and shared weights working,
and step aside when a parameter leaves it."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.proto import parse_solver_text

# conv + BatchNorm (lr 0 params) + Scale + two InnerProducts sharing weights,
# with lr/decay multipliers that differ per parameter
NET = """
name: "arena"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 2 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 }
                      bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" param { lr_mult: 0.5 decay_mult: 3 }
  param { lr_mult: 1 decay_mult: 0 } scale_param { bias_term: true } }
layer { name: "ip1" type: "InnerProduct" bottom: "c" top: "h"
  param { name: "shared_w" lr_mult: 1 decay_mult: 2 } param { lr_mult: 0 }
  inner_product_param { num_output: 27 bias_term: true weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "r" type: "Reshape" bottom: "h" top: "h3" reshape_param { shape { dim: 0 dim: 3 dim: 3 dim: 3 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "h3" top: "z"
  param { name: "shared_w" } inner_product_param { num_output: 27 bias_term: false } }
layer { name: "t" type: "TanH" bottom: "z" top: "t" loss_weight: 1 }
"""
X = np.random.default_rng(5).normal(size=(2, 2, 5, 5)).astype(np.float32)

SOLVERS = {
    "SGD": 'type: "SGD" base_lr: 0.05 momentum: 0.9 weight_decay: 0.01 lr_policy: "inv" '
           'gamma: 0.1 power: 0.75 iter_size: 2',
    "AdaDelta": 'type: "AdaDelta" base_lr: 1.0 momentum: 0.95 delta: 1e-6 weight_decay: 0.002 '
                'regularization_type: "L1" lr_policy: "fixed"',
    "Adam": 'type: "Adam" base_lr: 0.01 momentum: 0.9 momentum2: 0.999 lr_policy: "fixed" '
            'clip_gradients: 0.5 weight_decay: 0.001',
}


def make_solver(kind, monkeypatch, arena):
    monkeypatch.setenv("CAFFE_OCL_PARAM_ARENA", "1" if arena else "0")
    caffe.set_random_seed(11)
    p = parse_solver_text(SOLVERS[kind] + " max_iter: 100 display: 0")
    p.net_param.CopyFrom(caffe.proto.parse_net_text(NET))
    s = caffe.solvers.solver_class(p.type)(p)
    s.net.blobs["x"].data[...] = X
    return s


def state(s):
    out = [b.data.copy() for b in s.net.graph.learnable_params] + [b.diff.copy() for b in s.net.graph.learnable_params]
    return out + [h.data.copy() for h in s.history]


@pytest.mark.parametrize("kind", sorted(SOLVERS))
def test_arena_trains_bitwise_like_per_blob_storage(kind, monkeypatch):
    ref = make_solver(kind, monkeypatch, arena=False)
    got = make_solver(kind, monkeypatch, arena=True)
    assert ref._arena is None
    assert got._arena is not None and got._arena.valid()
    # one update launch and one clearing launch cover every parameter
    assert got._arena.nblocks >= len([b for b in got.net.graph.learnable_params if b.count])
    ref.step(4)
    got.step(4)
    assert got._arena.valid()
    for a, b in zip(state(ref), state(got)):
        np.testing.assert_array_equal(a, b)
    # the parameters moved, and the shared weight is one blob for both layers
    assert not np.array_equal(got.net.params["conv"][0].data, ref.net.params["conv"][0].data * 0)
    assert got.net.params["ip1"][0].data_buffer() is got.net.params["ip2"][0].data_buffer()


def test_pycaffe_writes_reach_the_arena(monkeypatch):
    """A host write into a parameter (pycaffe) is uploaded into its arena slot
    and used by the next forward; the test net sees the same weights."""
    s = make_solver("SGD", monkeypatch, arena=True)
    s.net.params["sc"][0].data[...] = 2.0
    s.net.forward()
    buf = np.empty(s.net.params["sc"][0].count, np.float32)
    import pyopencl as cl
    cl.enqueue_copy(s.dev.queue, buf, s._arena.data, src_offset=4 * s._arena.offsets[
        [id(b) for b in s._arena.blobs].index(id(s.net.params["sc"][0]))])
    np.testing.assert_array_equal(buf, 2.0)


def test_a_parameter_leaving_the_arena_falls_back_to_per_blob_updates(monkeypatch):
    ref = make_solver("SGD", monkeypatch, arena=False)
    got = make_solver("SGD", monkeypatch, arena=True)
    ref.step(1)
    got.step(1)
    for s in (ref, got):           # new storage for the conv weights (pycaffe share_data)
        blob = s.net.params["conv"][0]
        fresh = caffe.Blob(blob.shape)
        fresh.data[...] = blob.data
        blob.share_data(fresh)
        for li, layer in enumerate(s.net.layers):
            if blob in layer.blobs:
                layer.rebind(s.net.graph.bottoms[li], s.net.graph.tops[li])
        s._build_param_launches()
    assert not got._arena.valid()
    ref.step(2)
    got.step(2)
    assert got._arena is None
    for a, b in zip(state(ref), state(got)):
        np.testing.assert_array_equal(a, b)


def test_learnable_blobs_sharing_storage_keep_per_blob_updates(monkeypatch):
    """Two learnable blobs on one storage (pycaffe share_data before the
    solver): no arena, so that storage is updated once per blob as in Caffe."""
    from caffe_ocl.solvers import param_arena
    s = make_solver("SGD", monkeypatch, arena=True)
    assert param_arena.supported(s.net)
    a, b = s.net.params["conv"][1], s.net.params["ip1"][1]    # two biases
    b.reshape(a.shape)
    b.share_data(a)
    assert not param_arena.supported(s.net)
