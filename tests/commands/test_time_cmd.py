"""`caffe_ocl time` (caffe_ocl/timing.py): per plan step from OpenCL
profiling events, fused groups reported as groups, Caffe's output lines, and
figures that add up: the per-step device times cover every command of the
user's net.forward()/backward() (counted exactly; their device seconds agree
with an unhooked pass's within noise), and the printed split of the average
pass adds up to it. No wall-clock speed is asserted."""
import re

import numpy as np
import pytest

from caffe_ocl import commands
from caffe_ocl.device import get_device, record_events
from caffe_ocl.net import TEST, TRAIN, Net
from caffe_ocl.ops import pointwise
from caffe_ocl.proto import caffe_pb2, parse_net_text
from caffe_ocl.timing import plan_units, time_net

TRAIN_NET = """
name: "t" force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "s1" type: "Scale" bottom: "c1" top: "c1" scale_param { bias_term: true } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "c1" bottom: "c2" top: "sum" }
layer { name: "fc" type: "InnerProduct" bottom: "sum" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""

DEPLOY_NET = """
name: "d"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 10 dim: 10 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool" type: "Pooling" bottom: "conv1" top: "pool" pooling_param { pool: AVE global_pooling: true } }
layer { name: "prob" type: "Softmax" bottom: "pool" top: "prob" }
"""

RELU_NET = """
name: "relu"
input: "data"
input_shape { dim: 1 dim: 32 dim: 112 dim: 112 }
layer { name: "relu" type: "ReLU" bottom: "data" top: "out" }
"""

NUM = r"(-?[0-9.]+)"


def _time(net, iterations=5, **kw):
    lines = []
    res = time_net(net, iterations, out=lines.append, **kw)
    return res, lines


def _ms(lines, pattern):
    hits = [float(m.group(1)) for m in (re.fullmatch(pattern, ln) for ln in lines) if m]
    assert len(hits) == 1, (pattern, lines)
    return hits[0]


def _check_adds_up(res, lines, direction):
    n = res.iterations
    # every command of the user's pass is in a step or counted outside (exact)
    steps = sum(getattr(u, direction + "_launches") for u in res.units)
    assert steps + res.outside_launches[direction] == res.launches[direction]
    assert steps > 0
    # the hooked pass enqueued the same commands, so the user's pass's
    # device time splits over the steps exactly
    assert res.mismatched[direction] == 0
    series = res.series[direction]
    assert len(series) == n
    for wall, dev, steps_s, out_s, hooked_s in series:
        assert steps_s + out_s == pytest.approx(dev, rel=1e-9)
        assert dev <= wall
    assert sum(s[1] for s in series) == pytest.approx(res.device[direction])
    assert sum(s[0] for s in series) == pytest.approx(res.wall[direction])
    # (the hooked pass's own device seconds are not compared: on a shared
    # CPU a kernel of tens of microseconds now and then takes several times
    # as long; its command count equals the user's pass's, checked above)
    assert all(hooked_s > 0 for *_, hooked_s in series)
    # the printed split adds up to the printed average pass
    name = direction.capitalize()
    wall = _ms(lines, rf"Average {name} pass: {NUM} ms\.")
    m = [re.fullmatch(rf"{name} pass split: per-step device {NUM} ms \+ device work outside "
                      rf"the steps {NUM} ms \+ unattributed {NUM} ms = {NUM} ms\.", ln)
         for ln in lines]
    (m,) = [x for x in m if x]
    parts = [float(m.group(i)) for i in (1, 2, 3)]
    assert float(m.group(4)) == pytest.approx(wall, abs=1e-4)
    assert sum(parts) == pytest.approx(wall, abs=5e-4)
    assert parts[0] == pytest.approx(res.average("steps", direction) * 1000, abs=1e-4)
    step_lines = [float(x) for x in re.findall(rf"\t{direction}: {NUM} ms\.", "\n".join(lines))]
    assert sum(step_lines) == pytest.approx(parts[0], abs=1e-4 * (len(step_lines) + 1))
    assert _ms(lines, rf"Sum of per-step {direction} times: {NUM} ms \(device.*") == parts[0]
    assert _ms(lines, rf"Unattributed {direction} time: {NUM} ms .*") == parts[2]


def _caffe_lines(lines, units, backward=True):
    """Caffe's `caffe time` lines, in its order."""
    i = lines.index("*** Benchmark begins ***")
    assert lines[i + 1] == "Testing for 5 iterations."
    for it in range(1, 6):
        assert any(re.fullmatch(rf"Iteration: {it} forward-backward time: {NUM} ms\.", ln)
                   for ln in lines)
    lines = [ln for ln in lines if " enqueue: " not in ln]      # --host's lines
    j = lines.index("Average time per layer: ")
    body = lines[j + 1:j + 1 + 2 * len(units)]
    for u, fwd, bwd in zip(units, body[::2], body[1::2]):
        assert re.fullmatch(rf" *{re.escape(u.label)}\tforward: {NUM} ms\.", fwd), fwd
        assert re.fullmatch(rf" *{re.escape(u.label)}\tbackward: {NUM} ms\.", bwd), bwd
    tail = lines[j + 1 + 2 * len(units):]
    for k, pat in enumerate(("Average Forward pass", "Average Backward pass",
                             "Average Forward-Backward", "Total Time")):
        assert re.fullmatch(rf"{pat}: {NUM} ms\.", tail[k]), tail[k]
    assert lines[-1] == "*** Benchmark ends ***"
    assert lines.index("Performing Forward") < i
    assert ("Performing Backward" in lines[:i]) == backward


def test_train_net_steps_add_up():
    net = Net(parse_net_text(TRAIN_NET), TRAIN)
    res, lines = _time(net)
    assert res.builds == 0          # the warm-up built everything
    labels = [u.label for u in res.units]
    # BatchNorm/Scale/ReLU run as one step in both directions: one line pair
    assert "bn1+s1+r1 (fused)" in labels
    for name in ("bn1", "s1", "r1"):
        assert name not in labels
        assert not any(ln.lstrip().startswith(name + "\t") for ln in lines)
    assert "c1" in labels and "loss" in labels
    # every layer in exactly one unit
    covered = sorted(li for u in res.units for li in u.layers)
    assert covered == list(range(len(net.layers)))
    _caffe_lines(lines, res.units)
    _check_adds_up(res, lines, "forward")
    _check_adds_up(res, lines, "backward")
    bn = res.units[labels.index("bn1+s1+r1 (fused)")]
    assert bn.forward_launches > 0 and bn.backward_launches > 0


def test_folded_deploy_net_shows_groups():
    net = Net(parse_net_text(DEPLOY_NET), TEST)
    assert net.plan.fold_groups         # conv1 <- bn1, scale1, relu1
    res, lines = _time(net, host=True)
    labels = [u.label for u in res.units]
    assert labels == ["data", "conv1+bn1+scale1+relu1 (fused)", "pool", "prob"]
    _caffe_lines(lines, res.units, backward=False)   # no layer needs backward
    _check_adds_up(res, lines, "forward")
    conv = res.units[1]
    assert conv.forward_launches >= 3          # the group's commands, all in its step
    assert conv.forward > 0
    assert any(re.fullmatch(rf" *conv1\+bn1\+scale1\+relu1 \(fused\)\tforward enqueue: "
                            rf"{NUM} ms \({NUM} commands\)\.", ln) for ln in lines)


def test_units_union_of_directions():
    """A group fusing only one direction is one unit, named as such."""
    net = Net(parse_net_text(TRAIN_NET), TRAIN)
    units, of_layer = plan_units(net)
    fwd_groups = [set(s.layers) for s in net.plan.forward_steps if s.group is not None]
    bwd_groups = [set(s.layers) for s in net.plan.backward_steps if s.group is not None]
    for g in fwd_groups + bwd_groups:
        assert len({id(of_layer[li]) for li in g}) == 1
    for u in units:
        s = set(u.layers)
        if u.fused == "fused forward":
            assert s in fwd_groups and s not in bwd_groups
        elif u.fused == "fused backward":
            assert s in bwd_groups and s not in fwd_groups
    forward_only, _ = plan_units(net, backward=False)
    assert len(forward_only) >= len(units)


def test_lone_relu_not_dominated_by_compilation():
    """The issue's case: a lone ReLU reported 47 ms against a 0.3 ms forward
    (compilation inside the figures). The warm-up builds everything: no
    program is built or loaded during the timed passes, the ReLU's step is its
    one kernel, and its figure is a share of the pass, not a multiple."""
    net = Net(parse_net_text(RELU_NET), TRAIN)
    res, lines = _time(net)
    assert res.builds == 0
    (relu,) = [u for u in res.units if u.name == "relu"]
    assert relu.forward_launches == res.iterations
    series = res.series["forward"]      # relu is the one step with commands
    assert all(steps <= wall for wall, _, steps, _, _ in series)
    _check_adds_up(res, lines, "forward")


def test_time_command(tmp_path, capsys):
    (tmp_path / "net.prototxt").write_text(DEPLOY_NET)
    rc = commands.run("time", ["--model", str(tmp_path / "net.prototxt"), "--phase", "TEST",
                               "--iterations", "2", "--forward_only", "--host",
                               "--warmup", "1"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert re.search(rf"conv1\+bn1\+scale1\+relu1 \(fused\)\tforward: {NUM} ms\.", err)
    assert re.search(rf"Average Forward pass: {NUM} ms\.", err)
    assert re.search(r"forward enqueue: ", err)
    assert "Forward pass split: per-step device" in err
    assert "*** Benchmark ends ***" in err


def test_data_layer_uploads_in_its_step(tmp_path):
    """A Data layer's batch uploads are its step's device work (recorded
    through note_event), not unattributed time."""
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    rng = np.random.default_rng(0)
    with env.begin(write=True) as txn:
        for i in range(6):
            img = rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)
            txn.put(b"%08d" % i, caffe_pb2.Datum(channels=3, height=4, width=4, label=i % 3,
                                                 data=img.tobytes()).SerializeToString())
    env.close()
    net_text = f"""
name: "withdata"
layer {{ name: "d" type: "Data" top: "x" top: "label"
        data_param {{ source: "{tmp_path / 'db'}" backend: LMDB batch_size: 2 }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "x" top: "fc"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }}
"""
    net = Net(parse_net_text(net_text), TRAIN)
    res, lines = _time(net)
    (d,) = [u for u in res.units if u.name == "d"]
    assert d.forward_launches == 2 * res.iterations       # data and label uploads
    assert d.forward > 0
    _check_adds_up(res, lines, "forward")
    _check_adds_up(res, lines, "backward")


def test_test_phase_backward_unfolds():
    """At TEST a folded net cannot run backward: the folding is turned off
    (said in the output) and the backward is timed per layer step."""
    net = Net(parse_net_text(TRAIN_NET.replace(" force_backward: true", "")), TEST)
    assert net.plan.fold_groups and any(net.graph.layer_need_backward)
    res, lines = _time(net)
    assert "Timing backward: the TEST folding is turned off (net.unfold())" in lines
    assert not net.plan.fold_groups
    assert "bn1" in [u.label for u in res.units]
    _caffe_lines(lines, res.units)
    _check_adds_up(res, lines, "backward")


def test_record_events_and_profiling_queue():
    """The device records the events of launches, uploads and downloads
    only inside ``record_events``; a profiling queue gives their times."""
    dev = get_device()
    dev.enable_profiling()
    assert dev.profiling
    buf = dev.alloc(4 * 64)
    host = np.arange(64, dtype=np.float32)
    back = np.empty(64, np.float32)
    sink = []
    with record_events(sink):
        dev.upload(buf, host)
        pointwise.fill(dev, buf, 32, 2.0)
        dev.download(back, buf)
    pointwise.fill(dev, buf, 64, 0.0)        # not recorded
    dev.finish()
    assert len(sink) == 3
    assert all(ev.profile.end >= ev.profile.start > 0 for ev in sink)
    np.testing.assert_array_equal(back, np.r_[np.full(32, 2.0), host[32:]])


def test_recording_does_not_mark_kept_arrays_for_upload_again():
    """While caffe_ocl time records a pass, an upload's kept event must not
    hold the blob's own host array: blob.refresh_kept would take it for a
    view the user keeps and upload the blob again at every later pass."""
    import pyopencl as cl
    from caffe_ocl import device
    from caffe_ocl.net import Net, TEST
    from caffe_ocl.proto import parse_net_text
    net = Net(parse_net_text(
        'layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        'inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }\n'),
        TEST)
    net.params["ip"][0].data[...] = 0.5          # a host write: one upload next pass
    net.blobs["data"].data[...] = 1.0

    def copies():
        sink = []
        with device.record_events(sink):
            net.forward()
        return sum(ev.command_type == cl.command_type.WRITE_BUFFER for ev in sink)

    assert copies() >= 2              # the weight and the input go up once
    assert copies() == 0 and copies() == 0
    want = np.broadcast_to(0.5 * 3 + net.params["ip"][1].data, (2, 4))
    np.testing.assert_allclose(net.blobs["ip"].data, want, rtol=1e-6)
