"""Memory plans (caffe_ocl/plan/memory.py): activation diffs shared by
liveness must leave losses, top data and every parameter gradient bitwise
unchanged, and must actually need fewer bytes; the in-place BatchNorm ->
Scale pair keeps one copy of x_norm; conv column workspaces are shared."""
import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.plan import memory as memory_plan
from caffe_ocl.proto import caffe_pb2, parse_net_text

# Split (c1 used three times), in-place BatchNorm/Scale/ReLU/Dropout,
# Eltwise residual, Concat, Flatten (a view sharing its bottom's diff),
# shared InnerProduct weights, three losses with loss weights, and a
# layer with propagate_down: false (conv4 reads c1 without a gradient).
NET = """
name: "plan"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "c1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "sc1" type: "Scale" bottom: "c1" top: "c1"
  scale_param { bias_term: true filler { type: "uniform" min: 0.5 max: 1.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2a" type: "Convolution" bottom: "c1" top: "c2a"
  convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "conv2b" type: "Convolution" bottom: "c1" top: "c2b"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn2" type: "BatchNorm" bottom: "c2b" top: "c2b" }
layer { name: "sc2" type: "Scale" bottom: "c2b" top: "c2b" scale_param { bias_term: true } }
layer { name: "res" type: "Eltwise" bottom: "c2a" bottom: "c2b" top: "res" }
layer { name: "relu2" type: "ReLU" bottom: "res" top: "res" }
layer { name: "drop" type: "Dropout" bottom: "res" top: "res" dropout_param { dropout_ratio: 0.3 } }
layer { name: "pool" type: "Pooling" bottom: "res" top: "p"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "res" top: "c3"
  convolution_param { num_output: 2 kernel_size: 3 stride: 2 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "cat" type: "Concat" bottom: "p" bottom: "c3" top: "cat" }
layer { name: "flat" type: "Flatten" bottom: "cat" top: "flat" }
layer { name: "ip1" type: "InnerProduct" bottom: "flat" top: "f1"
  param { name: "w_shared" } param { name: "b1" }
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "flat" top: "f2"
  param { name: "w_shared" } param { name: "b2" }
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "conv4" type: "Convolution" bottom: "c1" top: "c4" propagate_down: false
  convolution_param { num_output: 2 kernel_size: 3 stride: 2
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "c4" top: "f3"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "loss1" type: "SoftmaxWithLoss" bottom: "f1" bottom: "label" top: "loss1" }
layer { name: "loss2" type: "SoftmaxWithLoss" bottom: "f2" bottom: "label" top: "loss2"
  loss_weight: 0.5 }
layer { name: "loss3" type: "SoftmaxWithLoss" bottom: "f3" bottom: "label" top: "loss3"
  loss_weight: 0.25 }
"""

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
Y = np.array([1, 3], np.float32)


def _param(text=NET):
    return parse_net_text(text)


def _net(share, text=NET):
    caffe.set_random_seed(11)
    net = caffe.Net(_param(text), caffe.TRAIN, share_diffs=share)
    net.blobs["data"].data[...] = X
    net.blobs["label"].data[...] = Y
    return net


def _poison(net):
    """NaN into every shared diff buffer: a layer that reads a planned diff
    before it is written would spread NaN into the results."""
    from caffe_ocl.ops import pointwise
    for mem in net.memory_plan.slots:
        pointwise.fill(mem.device, mem.buffer(), mem.capacity, float("nan"))
        mem.device_written()


def _run(net, poison=False):
    caffe.set_random_seed(5)          # same Dropout mask in both nets
    net.forward()
    if poison:
        _poison(net)
    net.clear_param_diffs()
    net.backward()
    losses = {k: net.blobs[k].data.copy() for k in ("loss1", "loss2", "loss3")}
    tops = {k: b.data.copy() for k, b in net.blobs.items()}
    grads = [b.diff.copy() for b in net.learnable_params]
    return losses, tops, grads


def _same(a, b):
    la, ta, ga = a
    lb, tb, gb = b
    for k in la:
        assert la[k].tobytes() == lb[k].tobytes(), k
    for k in ta:
        assert ta[k].tobytes() == tb[k].tobytes(), k
    assert len(ga) == len(gb)
    for i, (x, y) in enumerate(zip(ga, gb)):
        assert np.isfinite(x).all()
        assert x.tobytes() == y.tobytes(), f"param {i}"


def test_plan_is_bitwise_identical_and_smaller():
    plain, planned = _net(False), _net(True)
    assert plain.memory_plan is None and planned.memory_plan is not None
    planned.copy_from(plain.to_proto())
    _same(_run(plain), _run(planned, poison=True))
    _same(_run(plain), _run(planned, poison=True))      # again: buffers reused
    mp = planned.memory_plan
    assert 0 < mp.planned_bytes < mp.unplanned_bytes
    # what the device holds for activation diffs, one count per storage
    def diff_bytes(net):
        seen = {id(b.diff_mem): b.diff_mem for b in net.blobs.values()
                if b.diff_mem._buf is not None}
        return sum(m.capacity * 4 for m in seen.values())
    assert diff_bytes(planned) < diff_bytes(plain)


def test_what_stays_private():
    net = _net(True)
    slots = {id(m) for m in net.memory_plan.slots}
    shared = lambda name: id(net.blobs[name].diff_mem) in slots   # noqa: E731
    # loss tops hold their loss weight; inputs and outputs belong to the user
    for name in ("loss1", "loss2", "loss3", "data", "label"):
        assert not shared(name), name
    # the Split top read by conv4 (propagate_down false) is never written:
    # Split's backward reads its zeros, so it keeps its own diff
    c1_tops = [net.blobs[n] for n in net.top_names["c1_relu1_0_split"]]
    private = [t for t in c1_tops if id(t.diff_mem) not in slots]
    assert len(private) == 1
    assert "conv4" in [ln for ln, bn in net.bottom_names.items() if private[0].name in bn]
    # a view shares its bottom's diff, planned or not
    assert net.blobs["flat"].diff_mem is net.blobs["cat"].diff_mem
    assert shared("res") and shared("c2a")
    # parameter diffs are never shared
    pmems = [b.diff_mem for b in net.learnable_params]
    assert not any(id(m) in slots for m in pmems)


def test_reshape_replans_and_stays_identical():
    plain, planned = _net(False), _net(True)
    planned.copy_from(plain.to_proto())
    x3 = RNG.standard_normal((3, 3, 6, 6)).astype(np.float32)
    for net in (plain, planned):
        net.blobs["data"].reshape(3, 3, 6, 6)
        net.blobs["label"].reshape(3)
        net.reshape()
        net.blobs["data"].data[...] = x3
        net.blobs["label"].data[...] = [0, 4, 2]
    _same(_run(plain), _run(planned, poison=True))
    assert planned.memory_plan.planned_bytes < planned.memory_plan.unplanned_bytes


def test_switch_off_restores_private_diffs():
    net = _net(True)
    net.set_share_diffs(False)
    assert net.memory_plan is None
    mems = [id(b.diff_mem) for b in net.blobs.values()]
    views = 1                                   # flat shares cat's diff
    assert len(set(mems)) == len(mems) - views
    ref = _net(False)
    net.copy_from(ref.to_proto())
    _same(_run(ref), _run(net))


def _solver(share, monkeypatch, debug=False):
    monkeypatch.setenv(memory_plan.ENV, "1" if share else "0")
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(_param())
    sp.base_lr, sp.momentum, sp.weight_decay = 0.05, 0.9, 1e-3
    sp.lr_policy, sp.max_iter, sp.display = "fixed", 100, 0
    sp.snapshot_after_train = False
    sp.random_seed = 3
    sp.debug_info = debug
    s = caffe.SGDSolver(sp)
    s.net.blobs["data"].data[...] = X
    s.net.blobs["label"].data[...] = Y
    return s


def test_solver_steps_identical(monkeypatch):
    a = _solver(False, monkeypatch)        # each seeds the device RNG (Dropout)
    a.step(3)
    b = _solver(True, monkeypatch)
    b.step(3)
    assert a.net.memory_plan is None and b.net.memory_plan is not None
    assert np.float32(a.smoothed_loss).tobytes() == np.float32(b.smoothed_loss).tobytes()
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        assert pa.data.tobytes() == pb.data.tobytes()
        assert pa.diff.tobytes() == pb.diff.tobytes()
    for name in ("loss1", "loss2", "loss3"):
        assert a.net.blobs[name].data.tobytes() == b.net.blobs[name].data.tobytes()


def test_off_by_default_for_pycaffe_and_with_debug_info(monkeypatch):
    assert caffe.Net(_param(), caffe.TRAIN).memory_plan is None
    assert _solver(True, monkeypatch, debug=True).net.memory_plan is None
    p = _param()
    p.debug_info = True
    assert caffe.Net(p, caffe.TRAIN, share_diffs=True).memory_plan is None


def test_batchnorm_scale_keep_one_copy(monkeypatch):
    # layer by layer (the TRAIN fusion of fusion_train.py would round differently)
    monkeypatch.setenv("CAFFE_OCL_FUSE_TRAIN", "0")
    net = _net(False)
    bn, sc = net.layer_dict["bn1"], net.layer_dict["sc1"]
    assert sc.temp is bn.x_norm              # no second copy, no copy launch
    # the same net with Scale out of place (it reads its bottom, no copy at
    # all) gives the same gradients bit for bit
    head, tail = NET.split('layer { name: "sc1"')
    alt = head + 'layer { name: "sc1"' + tail.replace('"c1"', '"s1"').replace(
        'bottom: "s1" top: "s1"\n  scale_param', 'bottom: "c1" top: "s1"\n  scale_param', 1)
    other = _net(False, alt)
    assert other.layer_dict["sc1"].temp is None
    other.copy_from(net.to_proto())
    ga, gb = _run(net)[2], _run(other)[2]
    for x, y in zip(ga, gb):
        assert x.tobytes() == y.tobytes()


def test_test_phase_batchnorm_has_no_alias():
    net = caffe.Net(_param(), caffe.TEST, fold=False)
    assert net.layer_dict["bn1"].x_norm is None       # global stats: nothing saved
    assert net.layer_dict["sc1"].temp is not None     # so Scale keeps its own copy


def test_shared_scratch_reuses_buffers():
    class Dev(type(caffe.get_device())):              # a fresh device-level pool
        def __init__(self):
            self.real, self.asked, self._scratch = caffe.get_device(), [], []

        def alloc(self, n):
            self.asked.append(n)
            return self.real.alloc(n)
    dev = Dev()
    a = memory_plan.shared_scratch(dev, 1000)
    assert memory_plan.shared_scratch(dev, 900) is a
    assert memory_plan.shared_scratch(dev, 1024) is a
    big = memory_plan.shared_scratch(dev, 5000)
    assert big is not a and big.size >= 5000 * 4
    assert memory_plan.shared_scratch(dev, 10) is a
    assert memory_plan.shared_scratch(dev, 3000) is big
    assert dev.asked == [4096, 8192 * 4]


@pytest.mark.parametrize("off", ["0", "false"])
def test_env_turns_it_off(monkeypatch, off):
    monkeypatch.setenv(memory_plan.ENV, off)
    assert not memory_plan.share_diffs_default()
    monkeypatch.delenv(memory_plan.ENV)
    assert memory_plan.share_diffs_default()
