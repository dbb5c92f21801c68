"""`caffe_ocl tune` and the per-device store of its choices (caffe_ocl/tuning.py,
caffe_ocl/ops/tuned.py): stored choices are used per geometry and pass,
ignored when switched off, forced away by CAFFE_OCL_WINOGRAD, or when they
cannot apply; the tuner picks the fastest of what it timed; a net built
after tuning runs the stored algorithms and gives the same results."""
import collections
import json
import logging
import os

import numpy as np
import pyopencl as cl
import pytest

import caffe_ocl
from caffe_ocl import commands as cli
from caffe_ocl import tuning
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.device import get_device
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import tuned
from caffe_ocl.ops import winograd as wino_ops
from caffe_ocl.proto import parse_net_text

# the CPU rules run Winograd here (64 output tiles, 64 channels)
WIDE = conv_ops.ConvGeometry(4, 64, 16, 16, 64, 3, 3, 1, 1)
DEPTHWISE = conv_ops.ConvGeometry(2, 8, 9, 9, 8, 3, 3, 1, 1, groups=8)


@pytest.fixture
def store(monkeypatch, tmp_path):
    """The device's tuned store in a fresh directory, switched on."""
    dev = get_device()
    monkeypatch.setattr(dev, "cache_dir", str(tmp_path))
    monkeypatch.setenv(tuned.ENV, "1")
    monkeypatch.delenv(wino_ops.ENV, raising=False)
    tuned.forget_loaded()
    yield dev
    tuned.forget_loaded()


def _key(dev, g, p):
    return tuned.conv_key(g, p, conv_ops.use_tf32(dev))


def test_stored_choice_per_pass(store, monkeypatch):
    dev = store
    if not dev.is_cpu:
        pytest.skip("the geometry's rule is chosen for CPU drivers")
    assert conv_ops.algorithm(dev, WIDE, None, "forward") == "winograd"      # the rules
    path = tuned.save(dev, {_key(dev, WIDE, "forward"): {"choice": "im2col"}})
    assert path.startswith(dev.cache_dir) and path.endswith(".json")
    assert conv_ops.algorithm(dev, WIDE, None, "forward") == "im2col"
    assert conv_ops.algorithm(dev, WIDE, None, "backward_data") == "winograd"  # not stored
    assert conv_ops.algorithm(dev, WIDE) == "winograd"                 # no pass: rules
    assert conv_ops.algorithm(dev, WIDE, "winograd", "forward") == "winograd"  # asked for
    other = conv_ops.ConvGeometry(8, 64, 16, 16, 64, 3, 3, 1, 1)       # another batch size
    assert conv_ops.algorithm(dev, other, None, "forward") == "winograd"
    monkeypatch.setenv(tuned.ENV, "0")
    assert conv_ops.algorithm(dev, WIDE, None, "forward") == "winograd"
    monkeypatch.setenv(tuned.ENV, "1")
    monkeypatch.setenv(wino_ops.ENV, "1")           # forcing Winograd beats the store
    assert conv_ops.algorithm(dev, WIDE, None, "forward") == "winograd"
    monkeypatch.setenv(wino_ops.ENV, "0")
    assert conv_ops.algorithm(dev, WIDE, None, "forward") == "im2col"


def test_choice_that_cannot_apply_is_ignored(store, caplog):
    dev = store
    rule = conv_ops.algorithm(dev, WIDE, None, "forward")
    tuned.save(dev, {_key(dev, WIDE, "forward"): {"choice": "depthwise"}})
    with caplog.at_level(logging.WARNING, logger="caffe_ocl"):
        assert conv_ops.algorithm(dev, WIDE, None, "forward") == rule
    assert "does not apply" in caplog.text and tuned.store_path(dev) in caplog.text


@pytest.mark.parametrize("content", ["{not json", '{"format": 99, "entries": {}}', "[1, 2]"])
def test_unreadable_store_is_ignored(store, caplog, content):
    dev = store
    path = tuned.store_path(dev)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(content)
    with caplog.at_level(logging.WARNING, logger="caffe_ocl"):
        assert tuned.entries(dev) == {}
        conv_ops.algorithm(dev, WIDE, None, "forward")
    assert path in caplog.text
    # tuning writes it anew, whole
    tuned.save(dev, {_key(dev, WIDE, "forward"): {"choice": "im2col"}})
    data = json.load(open(path))
    assert data["format"] == tuned.FORMAT and len(data["entries"]) == 1


def test_workspace_covers_every_pass(store):
    """A depthwise layer needs no column workspace, unless a pass was tuned
    to the dense path."""
    dev = store
    assert conv_ops.workspace_floats(dev, DEPTHWISE) == 0
    tuned.save(dev, {_key(dev, DEPTHWISE, "backward_weight"): {"choice": "im2col"}})
    need = conv_ops.workspace_floats(dev, DEPTHWISE, "im2col")
    assert need > 0 and conv_ops.workspace_floats(dev, DEPTHWISE) == need
    assert conv_ops.algorithm(dev, DEPTHWISE, None, "backward_weight") == "im2col"
    assert conv_ops.algorithm(dev, DEPTHWISE, None, "forward") == "depthwise"


def _fake_clock(ms):
    """A clock that says each algorithm's pass takes ms[algo] ms."""
    calls = []

    def clock(dev, algo, launches, repeats):
        calls.append((algo, repeats))
        return ms[algo] * repeats / 1000.0
    return clock, calls


def test_measure_interleaves_and_takes_medians(store):
    dev = store
    clock, calls = _fake_clock({"depthwise": 0.5, "im2col": 0.2, "igemm": 3.0})
    t = tuning.measure(dev, DEPTHWISE, "forward", rounds=3, clock=clock)
    assert set(t) == set(conv_ops.candidates(dev, DEPTHWISE))
    assert t["depthwise"] == pytest.approx(0.5) and t["im2col"] == pytest.approx(0.2)
    timed = [a for a, r in calls[len(t):]]              # after one calibration call each
    assert timed == list(t) * 3                          # A, B, A, B, ...
    target = tuning.ROUND_SECONDS["cpu" if dev.is_cpu else "gpu"]
    assert dict(calls[len(t):len(t) * 2])["im2col"] == int(target / 0.0002 + 0.5)


def test_measure_real_device():
    dev = get_device()
    t = tuning.measure(dev, DEPTHWISE, "backward_weight", rounds=2)
    assert all(isinstance(v, float) and v > 0 for v in t.values()), t


def test_failing_candidate_is_reported(store, monkeypatch):
    dev = store
    real = tuning._launches

    def launches(dev, g, p, algo, bufs):
        if algo == "im2col":
            raise RuntimeError("out of resources\nmore")
        return real(dev, g, p, algo, bufs)
    monkeypatch.setattr(tuning, "_launches", launches)
    t = tuning.measure(dev, DEPTHWISE, "forward", rounds=1)
    assert t["im2col"] == "failed: out of resources"
    assert isinstance(t["depthwise"], float)


NET = """
name: "t"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 4 dim: 64 dim: 16 dim: 16 } shape { dim: 4 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 64 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "dw" type: "Convolution" bottom: "c1" top: "dw"
        convolution_param { num_output: 64 group: 64 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "c2" type: "Convolution" bottom: "dw" top: "c2"
        convolution_param { num_output: 64 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "fc" type: "InnerProduct" bottom: "c2" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def _run(seed=5):
    caffe_ocl.set_random_seed(seed)
    net = caffe_ocl.Net(parse_net_text(NET), caffe_ocl.TRAIN)
    rng = np.random.default_rng(1)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape)
    net.blobs["label"].data[...] = [0, 2, 1, 1]
    net.forward()
    net.backward()
    return net


def _kernel_names(layer):
    return {ln.name for ln in list(layer.fwd) + list(layer.bwd)}


def test_tuned_net_runs_the_choices(store):
    """The tuner's passes of a training net (c1 shares c2's geometry: timed
    once), its choices (made the slowest-by-rule by a fake clock) stored,
    and a net built afterwards runs them with the same results."""
    dev = store
    base = _run()
    items = tuning.net_conv_passes(base)
    assert [(n, p) for n, _, p in items] == [
        ("c1", "forward"), ("c1", "backward_weight"),          # x needs no gradient
        ("dw", "forward"), ("dw", "backward_data"), ("dw", "backward_weight"),
        ("c2", "forward"), ("c2", "backward_data"), ("c2", "backward_weight")]
    # every algorithm but the rules' choice "fastest": the stored choices differ
    # from the rules' everywhere there was a choice
    lines = []
    clock, _ = _fake_clock({"winograd": 5.0, "depthwise": 5.0, "im2col": 1.0, "igemm": 2.0}
                           if dev.is_cpu else
                           {"winograd": 5.0, "depthwise": 5.0, "im2col": 1.0, "igemm": 9.0})
    rows, path = tuning.tune_net(base, rounds=1, out=lines.append, clock=clock)
    assert len(rows) == 6 and sorted(rows[0]["layers"]) == ["c1", "c2"]
    assert all(r["choice"] == "im2col" for r in rows)
    assert any("-> im2col (rules: depthwise)" in s for s in lines)
    assert lines[-1] == f"stored 6 choices in {path}"
    tuned_net = _run()
    assert not any("dw_" in k for k in _kernel_names(tuned_net.layers[3]))
    assert any("dw_" in k for k in _kernel_names(base.layers[3]))
    for name in ("loss", "fc"):
        np.testing.assert_allclose(tuned_net.blobs[name].data, base.blobs[name].data,
                                   rtol=2e-4, atol=1e-5)
    for i in (1, 3, 4):
        for a, b in zip(tuned_net.layers[i].blobs, base.layers[i].blobs):
            np.testing.assert_allclose(a.diff, b.diff, rtol=2e-3, atol=1e-5)


def test_rules_kept_within_noise(store):
    """An algorithm at most 3% faster than the rules' does not replace it."""
    dev = store
    rule = conv_ops.algorithm(dev, DEPTHWISE)
    assert rule == "depthwise"
    clock, _ = _fake_clock({"depthwise": 1.0, "im2col": 0.98, "igemm": 0.985})
    rows, _ = tuning.tune_passes(dev, [("dw", DEPTHWISE, "forward")], rounds=1,
                                 store=False, out=lambda s: None, clock=clock)
    assert rows[0]["choice"] == "depthwise"
    clock, _ = _fake_clock({"depthwise": 1.0, "im2col": 0.9, "igemm": 0.95})
    rows, _ = tuning.tune_passes(dev, [("dw", DEPTHWISE, "forward")], rounds=1,
                                 store=False, out=lambda s: None, clock=clock)
    assert rows[0]["choice"] == "im2col" and tuned.entries(dev) == {}


def test_single_candidate_not_timed(store):
    dev = store
    # four groups of one output channel: neither the direct nor the chanvec
    # kernel takes it (CHANVEC_MIN_GROUP_OUT), so no CPU kernel variants
    # either
    one = conv_ops.ConvGeometry(2, 8, 5, 5, 4, 1, 1, groups=4)
    if len(conv_ops.candidates(dev, one)) > 1:
        pytest.skip("GPUs have two algorithms for 1x1 convolutions")
    assert conv_ops.cpu_forward_variants(dev, one) == []
    lines = []
    clock, calls = _fake_clock({"im2col": 1.0})
    rows, path = tuning.tune_passes(dev, [("c", one, "forward")], out=lines.append, clock=clock)
    assert lines == ["c forward: only im2col applies"]
    assert rows == [] and path is None and calls == []


def test_cli(store, tmp_path, capsys, caplog):
    model = tmp_path / "m.prototxt"
    model.write_text(NET)
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        assert cli.main(["tune", "--model", str(model), "--phase", "TEST",
                         "--iterations", "1"]) == 0
    text = caplog.text
    entries = json.load(open(tuned.store_path(store)))["entries"]
    # GPUs also store the implicit GEMM's variants of a forward it won
    # ("conv:forward-igemm:" entries); CPU drivers have none
    algos = {k: e for k, e in entries.items()
             if not k.startswith(("conv:forward-igemm:", "gemm:split:"))}
    assert store.is_gpu or len(algos) == len(entries)
    assert "c1,c2 forward:" in text and "dw forward:" in text
    assert f"stored {len(entries)} choices" in text
    assert sorted(e["layers"][0] for e in algos.values()) == ["c1", "dw"]
    assert all(e["choice"] in e["ms"] for e in entries.values())
    assert cli.main(["tune", "--model", str(model), "--phase", "TEST", "--iterations", "1",
                     "--store=false"]) == 0
    assert cli.main(["tune"]) == 1
    assert "needs --model" in capsys.readouterr().err
    assert cli.main(["tune", "--model", str(model), "--phase", "VAL"]) == 1
    assert "TRAIN or TEST" in capsys.readouterr().err


def test_deconvolution_passes_are_the_convolutions_reversed(store):
    """A Deconvolution's forward is its convolution's backward_data and its
    data gradient that convolution's forward (the geometry's image side is
    the layer's top)."""
    text = """
    name: "d"
    layer { name: "in" type: "Input" top: "x" top: "label"
            input_param { shape { dim: 2 dim: 4 dim: 5 dim: 5 } shape { dim: 2 } } }
    layer { name: "c" type: "Convolution" bottom: "x" top: "c"
            convolution_param { num_output: 6 kernel_size: 1 } }
    layer { name: "up" type: "Deconvolution" bottom: "c" top: "up"
            convolution_param { num_output: 4 kernel_size: 3 stride: 1 pad: 1
                                weight_filler { type: "gaussian" std: 0.1 } } }
    layer { name: "fc" type: "InnerProduct" bottom: "up" top: "fc"
            inner_product_param { num_output: 2 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
    """
    net = caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)
    items = tuning.net_conv_passes(net)
    assert [(n, p) for n, _, p in items] == [
        ("c", "forward"), ("c", "backward_weight"),
        ("up", "backward_data"), ("up", "forward"), ("up", "backward_weight")]
    g = items[2][1]
    assert (g.channels, g.out_channels) == (4, 6)       # image side: the top


def test_no_cache_directory(store, monkeypatch, tmp_path, capsys):
    """CAFFE_OCL_CACHE="" switches the program cache off: nothing is looked
    up, and tuning says where it cannot store instead of writing elsewhere."""
    dev = store
    monkeypatch.setattr(dev, "cache_dir", "")
    assert tuned.store_path(dev) is None and tuned.entries(dev) == {}
    assert conv_ops.algorithm(dev, DEPTHWISE, None, "forward") == "depthwise"
    with pytest.raises(CaffeOclError, match="CAFFE_OCL_CACHE is empty"):
        tuned.save(dev, {"k": {"choice": "im2col"}})
    model = tmp_path / "m.prototxt"
    model.write_text(NET)
    assert cli.main(["tune", "--model", str(model), "--phase", "TEST"]) == 1
    assert "--store=false" in capsys.readouterr().err


# a batch-1 layer whose implicit-GEMM forward the rules run on small tiles
# with a K split on a 132-unit GPU (ResNet's 3 x 3 512 on 7 x 7, shrunk)
SMALL = conv_ops.ConvGeometry(1, 96, 5, 5, 80, 3, 3, 1, 1)


@pytest.fixture
def as_gpu(store, monkeypatch, gpu_kernels_unoptimized_on_cpu):
    """The store's device described as a GPU of 132 compute units (the GPU
    kernels built unoptimised when a CPU driver runs them)."""
    dev = store
    monkeypatch.setattr(dev, "is_cpu", False)
    monkeypatch.setattr(dev, "compute_units", 132)
    with caffe_ocl.config.override(TF32=False, CONV_SPLITK_MIN_KTILES=1):
        yield dev


def test_stored_forward_variant_replaces_the_rules(as_gpu, monkeypatch, caplog):
    """A "forward-igemm" choice decides the tiles and the K split of that
    geometry's implicit-GEMM forward; switched off, or one that cannot apply
    (small tiles in TF32), the rules again."""
    dev = as_gpu
    K = SMALL.col_rows
    assert tuning.rule_variant(dev, SMALL) == "small/split"
    key = tuned.conv_key(SMALL, "forward-igemm", conv_ops.use_tf32(dev))
    tuned.save(dev, {key: {"choice": "usual/nosplit"}})
    assert conv_ops.forward_tiles(dev, SMALL).get("MICRO", 8) == 8
    assert conv_ops.forward_splitk(dev, SMALL) == (1, K)
    tuned.save(dev, {key: {"choice": "small/nosplit"}})
    assert conv_ops.forward_tiles(dev, SMALL)["MICRO"] == 4
    assert conv_ops.forward_splitk(dev, SMALL) == (1, K)
    other = conv_ops.ConvGeometry(2, 96, 5, 5, 80, 3, 3, 1, 1)     # not stored
    assert conv_ops.forward_splitk(dev, other)[0] > 1
    monkeypatch.setenv(tuned.ENV, "0")
    assert conv_ops.forward_splitk(dev, SMALL)[0] > 1
    monkeypatch.setenv(tuned.ENV, "1")
    with caffe_ocl.config.override(DETERMINISTIC=True):
        assert conv_ops.forward_variants(dev, SMALL) == []
    monkeypatch.setattr(dev, "is_nvidia", True, raising=False)
    monkeypatch.setattr(dev, "is_gpu", True, raising=False)
    with caffe_ocl.config.override(TF32=True), caplog.at_level(logging.WARNING, "caffe_ocl"):
        tuned.save(dev, {tuned.conv_key(SMALL, "forward-igemm", conv_ops.use_tf32(dev)):
                         {"choice": "small/split"}})
        assert conv_ops.forward_variants(dev, SMALL) == ["usual/split", "usual/nosplit"]
        assert conv_ops.forward_splitk(dev, SMALL)[0] > 1          # the rules
    assert "does not apply" in caplog.text


def test_tuner_times_forward_variants(as_gpu, rng):
    """`caffe_ocl tune` on a GPU: after the algorithms, the implicit GEMM's
    forward variants, interleaved; the fastest stored and then run by a
    forward built afterwards, with the same values as the rules' launches."""
    dev = as_gpu
    clock, calls = _fake_clock({"igemm": 1.0, "im2col": 2.0, "winograd": 3.0, "usual/split": 0.5,
                                "small/split": 0.4, "usual/nosplit": 0.2,
                                "small/nosplit": 0.3})
    lines = []
    x = rng.standard_normal((1, 96, 5, 5)).astype(np.float32)
    w = rng.standard_normal((80, 96, 3, 3)).astype(np.float32)
    bufs = [dev.alloc(4 * a.size) for a in (x, w)] + [dev.alloc(4 * 80 * 25) for _ in range(2)]
    dev.upload(bufs[0], x)
    dev.upload(bufs[1], w)
    rule_launches = conv_ops.forward(dev, SMALL, bufs[0], bufs[1], bufs[2], None)
    rows, path = tuning.tune_passes(dev, [("c", SMALL, "forward")], rounds=2,
                                    out=lines.append, clock=clock)
    assert [r["pass_"] for r in rows] == ["forward", "forward-igemm"]
    assert rows[1]["choice"] == "usual/nosplit" and rows[1]["rule"] == "small/split"
    variants = conv_ops.forward_variants(dev, SMALL)
    assert "few" not in variants                # a 3 x 3 layer: the tiles only
    assert [a for a, _ in calls[-8:]] == variants * 2
    assert any("forward-igemm: usual/split 0.500 ms" in s and "-> usual/nosplit" in s
               for s in lines)
    assert lines[-1] == f"stored 2 choices in {path}"
    tuned_launches = conv_ops.forward(dev, SMALL, bufs[0], bufs[1], bufs[3], None)
    assert [ln.name for ln in rule_launches] == ["conv_fwd", "conv_splitk_reduce"]
    assert [ln.name for ln in tuned_launches] == ["conv_fwd"]
    for ln in rule_launches + tuned_launches:
        ln.run(dev.queue)
    a, b = np.empty(80 * 25, np.float32), np.empty(80 * 25, np.float32)
    cl.enqueue_copy(dev.queue, a, bufs[2])
    cl.enqueue_copy(dev.queue, b, bufs[3])
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_stored_few_variant(as_gpu, rng):
    """1x1 layers: the few-outputs kernel (ops/conv1x1_few.py) is one of the
    forward variants the tuner times; a stored "few" runs it where the
    rules would not (too many tiles), a stored tile variant runs the tiles
    where the rules would take it, with the same values."""
    dev = as_gpu
    few = conv_ops.ConvGeometry(1, 24, 7, 7, 20, 1, 1)           # rules: the kernel
    wide = conv_ops.ConvGeometry(1, 16, 40, 40, 136, 1, 1)       # 3 x 25 tiles: the rules' tiles
    assert "few" in conv_ops.forward_variants(dev, few)
    assert tuning.rule_variant(dev, few) == "few"
    assert tuning.rule_variant(dev, wide) != "few"
    for g, choice, want in ((wide, "few", "conv1x1_few"), (few, "usual/nosplit", "conv_fwd")):
        x = rng.standard_normal((g.num, g.channels, g.height, g.width)).astype(np.float32)
        w = rng.standard_normal((g.out_channels, g.channels, 1, 1)).astype(np.float32)
        ysize = g.num * g.out_channels * g.out_spatial
        bufs = [dev.alloc(4 * a.size) for a in (x, w)] + [dev.alloc(4 * ysize) for _ in range(2)]
        dev.upload(bufs[0], x)
        dev.upload(bufs[1], w)
        rule_launches = conv_ops.forward(dev, g, bufs[0], bufs[1], bufs[2], None)
        assert want not in [ln.name for ln in rule_launches]
        tuned.save(dev, {tuned.conv_key(g, "forward-igemm", conv_ops.use_tf32(dev)):
                         {"choice": choice}})
        tuned_launches = conv_ops.forward(dev, g, bufs[0], bufs[1], bufs[3], None)
        assert [ln.name for ln in tuned_launches] == [want]
        for ln in rule_launches + tuned_launches:
            ln.run(dev.queue)
        a, b = np.empty(ysize, np.float32), np.empty(ysize, np.float32)
        cl.enqueue_copy(dev.queue, a, bufs[2])
        cl.enqueue_copy(dev.queue, b, bufs[3])
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


FC_NET = """
name: "fc"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 40 dim: 512 } } }
layer { name: "pre" type: "InnerProduct" bottom: "x" top: "pre"
        inner_product_param { num_output: 384 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "h" type: "InnerProduct" bottom: "pre" top: "h"
        inner_product_param { num_output: 256 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "one" type: "InnerProduct" bottom: "pre" top: "one"
        inner_product_param { num_output: 256 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "one" top: "loss" }
"""


@pytest.fixture
def fc_gpu(as_gpu, monkeypatch):
    """as_gpu, and counted as a GPU (ops/gemm_splitk.py splits only there)."""
    monkeypatch.setattr(as_gpu, "is_gpu", True, raising=False)
    return as_gpu


def test_stored_split_replaces_the_rules(fc_gpu, monkeypatch, caplog):
    """A "gemm-split" choice ("x<n>") decides the K split of that product
    shape; switched off, not dividing K, or another shape: the rules."""
    from caffe_ocl.ops import gemm_splitk
    dev = fc_gpu
    M, N, K = 40, 24, 512
    rule = gemm_splitk.splitk_factor(dev, M, N, K)
    assert rule > 2                                  # one tile: the per-unit rule splits
    tuned.save(dev, {tuned.gemm_split_key(M, N, K, False): {"choice": "x2"}})
    assert gemm_splitk.splitk_factor(dev, M, N, K) == 2
    assert gemm_splitk.splitk_factor(dev, M, N, K, stored=False) == rule
    assert gemm_splitk.splitk_factor(dev, M, N, 1024) != 2 or rule == 2
    monkeypatch.setenv(tuned.ENV, "0")
    assert gemm_splitk.splitk_factor(dev, M, N, K) == rule
    monkeypatch.setenv(tuned.ENV, "1")
    with caplog.at_level(logging.WARNING, "caffe_ocl"):
        for bad in ("x3", "2", "x0"):                # 3 does not divide 512; not "x<n>"
            tuned.save(dev, {tuned.gemm_split_key(M, N, K, False): {"choice": bad}})
            assert gemm_splitk.splitk_factor(dev, M, N, K) == rule
    assert "ignoring tuned K split 'x3'" in caplog.text


@pytest.mark.parametrize("phase", ["TEST", "TRAIN"])
def test_tuner_times_product_splits(fc_gpu, tmp_path, phase):
    """`caffe_ocl tune` on a GPU times each fully-connected product's K
    splits (whole, the rules', chunks near SPLIT_CHUNKS), once per shape
    (two layers of one shape: one row), the data gradient too in TRAIN;
    the fastest is stored and a net built afterwards runs it, with the same
    outputs as the rules' net."""
    from caffe_ocl.ops import gemm_splitk
    dev = fc_gpu
    model = tmp_path / "fc.prototxt"
    model.write_text(FC_NET)
    net = caffe_ocl.Net(str(model), caffe_ocl.TRAIN if phase == "TRAIN" else caffe_ocl.TEST)
    items = tuning.net_products(net)
    fwd = [("pre", 40, 384, 512, False, True), ("h", 40, 256, 384, False, True),
           ("one", 40, 256, 384, False, True)]
    grads = [("h (data gradient)", 40, 384, 256, False, False),
             ("one (data gradient)", 40, 384, 256, False, False)]
    # pre's bottom is the net's input: no data gradient
    assert items == (fwd if phase == "TEST" else fwd[:2] + grads[:1] + fwd[2:] + grads[1:])
    rule = gemm_splitk.splitk_factor(dev, 40, 256, 384)
    assert rule == 3                                 # 2 tiles: chunks of 128
    # 128 -> 3 chunks, 256 -> the nearest divisor, 2 (192); longer chunks: not under K
    assert tuning.split_candidates(dev, 40, 256, 384) == [1, 2, 3]
    clock, calls = _fake_clock(collections.defaultdict(lambda: 1.0, x2=0.3))
    lines = []
    x = np.random.default_rng(1).standard_normal((40, 512)).astype(np.float32)
    net.blobs["x"].data[...] = x
    net.forward()
    want = net.blobs["h"].data.copy()
    rows, path = tuning.tune_products(dev, items, rounds=2, out=lines.append, clock=clock)
    assert [r["layers"] for r in rows] == [["pre"], ["h", "one"]] + (
        [[g[0] for g in grads]] if phase == "TRAIN" else [])
    assert rows[1]["choice"] == "x2" and rows[1]["rule"] == "x3"
    timed = [a for a, _ in calls]
    # pre: 3 factors calibrated, 2 rounds of 3; then h's: calibrated, interleaved rounds
    assert timed[:9] == ["x1", "x2", "x4"] * 3 and timed[12:18] == ["x1", "x2", "x3"] * 2
    assert any(s.startswith("h,one gemm-split: x1 1.000 ms, x2 0.300 ms") and "-> x2" in s
               for s in lines)
    assert lines[-1] == f"stored {len(rows)} choices in {path}"
    assert gemm_splitk.splitk_factor(dev, 40, 256, 384) == 2
    tuned_net = caffe_ocl.Net(str(model), caffe_ocl.TEST)
    h = tuned_net.layers[list(tuned_net._layer_names).index("h")]
    assert [ln.name for ln in h.fwd] == ["gemm", "gemm_splitk_reduce"]
    assert h.fwd[0].gsize[2] == 2                   # the stored x2, not the rules' x3
    for name in ("pre", "h", "one"):
        for a, b in zip(net.params[name], tuned_net.params[name]):
            b.data[...] = a.data
    tuned_net.blobs["x"].data[...] = x
    tuned_net.forward()
    np.testing.assert_allclose(tuned_net.blobs["h"].data, want, rtol=1e-4, atol=1e-4)


def test_products_only_on_gpus(store, tmp_path):
    """CPU drivers never split K: no products to tune there."""
    model = tmp_path / "fc.prototxt"
    model.write_text(FC_NET)
    if store.is_gpu:
        pytest.skip("a GPU has products to tune")
    assert tuning.net_products(caffe_ocl.Net(str(model), caffe_ocl.TEST)) == []


def test_train_tf32_forwards_tuned_apart(store, settings):
    """A TRAIN net under TF32 runs its Winograd forwards as F(2x2)
    (WINOGRAD_TILE_TF32_TRAIN): the tuner times them inside that context
    and stores them under their own key, which TRAIN forwards then read
    and TEST forwards do not."""
    dev = store
    settings(TF32_EMULATE=True, WINOGRAD_TILE="4")
    timed = []

    def clock(dev_, algo, launches, repeats):
        timed.append((algo, wino_ops.forward_tile(dev_, WIDE)))
        return {"winograd": 1.0, "im2col": 2.0, "igemm": 3.0}[algo] * repeats
    rows, _ = tuning.tune_passes(dev, [("c", WIDE, "forward")], rounds=1, out=lambda s: None,
                                 clock=clock, training=True)
    assert rows[0]["key"] == tuned.conv_key(WIDE, "forward", conv_ops.use_tf32(dev), 2)
    assert {t for _, t in timed} == {2}
    tuned.save(dev, {rows[0]["key"]: {"choice": "im2col"}})
    assert conv_ops.algorithm(dev, WIDE, None, "forward") != "im2col"     # TEST: the rules
    with wino_ops.train_forwards():
        assert conv_ops.algorithm(dev, WIDE, None, "forward") == "im2col"
        assert conv_ops.tuned_key(dev, WIDE, "backward_data") == _key(dev, WIDE, "backward_data")


def test_cpu_forward_kernels_tuned(store, rng, caplog):
    """CPU drivers: where only im2col applies (a 1x1 layer), the kernels
    that can run it -- the chanvec kernel (an inference forward's, packed
    weights), conv1x1_rows and the GEMM -- are timed as pass "forward-cpu"
    and the fastest stored; a forward built afterwards runs it, with the
    same values; a TRAIN forward (no packed weights) times no chanvec; a
    stored kernel that cannot run the layer is ignored with a warning."""
    dev = store
    if not dev.is_cpu:
        pytest.skip("CPU kernels")
    g = conv_ops.ConvGeometry(1, 24, 7, 7, 20, 1, 1)
    assert conv_ops.cpu_forward_variants(dev, g) == ["chanvec", "pointwise", "gemm"]
    assert conv_ops.chanvec_forward(dev, g)                     # the rules: 49 pixels
    assert not conv_ops.pointwise_rows(dev, g)
    clock, calls = _fake_clock({"chanvec": 1.0, "pointwise": 0.8, "gemm": 0.5})
    lines = []
    rows, path = tuning.tune_passes(dev, [("c", g, "forward")], rounds=2, out=lines.append,
                                    clock=clock)
    assert lines[0] == "c forward: only im2col applies"
    assert [(r["pass_"], r["rule"], r["choice"]) for r in rows] == [
        ("forward-cpu", "chanvec", "gemm")]
    assert [a for a, _ in calls[-6:]] == ["chanvec", "pointwise", "gemm"] * 2
    assert tuned.lookup(dev, tuned.conv_key(g, "forward-cpu", False)) == "gemm"
    assert not conv_ops.chanvec_forward(dev, g)

    x = rng.standard_normal((1, 24, 7, 7)).astype(np.float32)
    w = rng.standard_normal((20, 24, 1, 1)).astype(np.float32)
    bufs = [dev.alloc(4 * a.size) for a in (x, w)] + [dev.alloc(4 * 20 * 49) for _ in range(2)]
    dev.upload(bufs[0], x)
    dev.upload(bufs[1], w)
    col = dev.alloc(4 * max(conv_ops.workspace_floats(dev, g), 1))
    tuned_launches = conv_ops.forward(dev, g, bufs[0], bufs[1], bufs[2], col,
                                      weight_version=lambda: 1)
    with conv_ops.forced_forward_variant(None):                 # the rules
        rule_launches = conv_ops.forward(dev, g, bufs[0], bufs[1], bufs[3], col,
                                         weight_version=lambda: 1)
    assert "conv_chanvec" in [ln.name for ln in rule_launches]
    assert "conv_chanvec" not in [ln.name for ln in tuned_launches]
    assert "conv1x1_rows" not in [ln.name for ln in tuned_launches]
    for ln in rule_launches + tuned_launches:
        ln.run(dev.queue)
    a, b = np.empty(20 * 49, np.float32), np.empty(20 * 49, np.float32)
    cl.enqueue_copy(dev.queue, a, bufs[2])
    cl.enqueue_copy(dev.queue, b, bufs[3])
    ref = np.einsum("oc,cp->op", w.reshape(20, 24), x.reshape(24, 49)).reshape(-1)
    np.testing.assert_allclose(a, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b, ref, rtol=1e-4, atol=1e-4)

    calls.clear()
    rows, _ = tuning.tune_passes(dev, [("c", g, "forward")], rounds=1, store=False,
                                 out=lambda s: None, clock=clock, training=True)
    assert {a for a, _ in calls} == {"pointwise", "gemm"}      # TRAIN: no chanvec
    assert [(r["rule"], r["choice"]) for r in rows] == [("gemm", "gemm")]

    # a stored conv1x1_rows runs it
    tuned.save(dev, {tuned.conv_key(g, "forward-cpu", False): {"choice": "pointwise"}})
    assert conv_ops.pointwise_rows(dev, g) and not conv_ops.chanvec_forward(dev, g)
    launches = conv_ops.forward(dev, g, bufs[0], bufs[1], bufs[2], col, weight_version=lambda: 1)
    assert [ln.name for ln in launches] == ["conv1x1_rows"]
    for ln in launches:
        ln.run(dev.queue)
    cl.enqueue_copy(dev.queue, a, bufs[2])
    np.testing.assert_allclose(a, ref, rtol=1e-4, atol=1e-4)

    # 24 input channels: the direct kernel (at most 4) cannot run it
    tuned.save(dev, {tuned.conv_key(g, "forward-cpu", False): {"choice": "direct"}})
    with caplog.at_level(logging.WARNING, logger="caffe_ocl"):
        assert conv_ops.chanvec_forward(dev, g)                 # back to the rules
        assert not conv_ops.direct_forward(dev, g)
    assert "tuned CPU forward 'direct'" in caplog.text and "does not apply" in caplog.text


def test_first_layer_kernels_tuned(store):
    """A first layer (3 input channels, 3 x 3 stride 2) can run the direct
    kernel or the GEMM in both phases: a stored GEMM takes it off the
    direct kernel, in a TRAIN forward (weights as they are) too."""
    dev = store
    if not dev.is_cpu:
        pytest.skip("CPU kernels")
    g = conv_ops.ConvGeometry(1, 3, 32, 32, 16, 3, 3, 1, 1, 2, 2)
    assert "direct" in conv_ops.cpu_forward_variants(dev, g)
    assert conv_ops.direct_forward(dev, g)
    clock, calls = _fake_clock({"direct": 1.0, "chanvec": 2.0, "gemm": 0.5})
    rows, _ = tuning.tune_passes(dev, [("c", g, "forward")], rounds=1, out=lambda s: None,
                                 clock=clock, training=True)
    cpu_row = [r for r in rows if r["pass_"] == "forward-cpu"]
    assert [(r["rule"], r["choice"]) for r in cpu_row] == [("direct", "gemm")]
    assert "chanvec" not in cpu_row[0]["times"]
    assert not conv_ops.direct_forward(dev, g)
    x, w, y = (dev.alloc(4 * n) for n in (3 * 32 * 32, 16 * 27, 16 * 16 * 16))
    col = dev.alloc(4 * max(conv_ops.workspace_floats(dev, g), 1))
    assert "conv_direct_fwd" not in [ln.name for ln in conv_ops.forward(dev, g, x, w, y, col)]
    with conv_ops.forced_forward_variant(None):
        assert [ln.name for ln in conv_ops.forward(dev, g, x, w, y, col)] == ["conv_direct_fwd"]
