"""Solvers against a float64 NumPy implementation of Caffe's formulas
(sgd_solver.cpp + the GPU update kernels), on a tiny net:
Input x (4x5) -> InnerProduct (3 outputs) -> TanH with loss_weight 1,
so the objective is sum(tanh(x W^T + b)) (Caffe: sum(w * top))."""
import logging
import re

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl.errors import SolverError
from caffe_ocl.proto import caffe_pb2, parse_solver_text

NET = """
name: "tiny"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0.5 }
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "t" type: "TanH" bottom: "z" top: "t" loss_weight: 1 }
"""
X = np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32)


def make_solver(text, cls=None):
    p = parse_solver_text(text)
    p.net_param.CopyFrom(caffe.proto.parse_net_text(NET))
    solver = (cls or caffe.solvers.solver_class(p.type))(p)
    solver.net.blobs["x"].data[...] = X
    return solver


def ref_lr(p, it, cur):
    pol = p["lr_policy"]
    base, gamma, power = p["base_lr"], p.get("gamma", 0.0), p.get("power", 0.0)
    if pol == "fixed":
        return base, cur
    if pol == "step":
        cur = it // p["stepsize"]
        return base * gamma ** cur, cur
    if pol == "exp":
        return base * gamma ** it, cur
    if pol == "inv":
        return base * (1 + gamma * it) ** (-power), cur
    if pol == "multistep":
        sv = p["stepvalue"]
        if cur < len(sv) and it >= sv[cur]:
            cur += 1
        return base * gamma ** cur, cur
    if pol == "poly":
        return base * (1 - it / p["max_iter"]) ** power, cur
    if pol == "sigmoid":
        return base / (1 + np.exp(-gamma * (it - p["stepsize"]))), cur
    raise AssertionError(pol)


class Ref:
    """Caffe's update in float64."""

    def __init__(self, kind, p, W, b):
        self.kind, self.p = kind, p
        self.params = [W.astype(np.float64), b.astype(np.float64)]
        self.lr_mult, self.decay_mult = [1.0, 2.0], [1.0, 0.5]
        self.h = [np.zeros_like(a) for a in self.params]
        self.h2 = [np.zeros_like(a) for a in self.params]
        self.it, self.cur = 0, 0

    def grads(self):
        W, b = self.params
        t = np.tanh(X.astype(np.float64) @ W.T + b)
        dz = 1 - t * t
        return [dz.T @ X, dz.sum(0)], float(t.sum())

    def step(self):
        p = self.p
        g, loss = self.grads()
        n = p.get("iter_size", 1)
        g = [gi * n for gi in g]        # n identical passes accumulated
        rate, self.cur = ref_lr(p, self.it, self.cur)
        clip = p.get("clip_gradients", -1)
        if clip >= 0:
            norm = np.sqrt(sum((gi ** 2).sum() for gi in g))
            if norm > clip:
                g = [gi * (clip / norm) for gi in g]
        g = [gi / n for gi in g]
        wd, reg = p.get("weight_decay", 0.0), p.get("regularization_type", "L2")
        mom, mom2, delta = p.get("momentum", 0.0), p.get("momentum2", 0.999), p.get("delta", 1e-8)
        for i, w in enumerate(self.params):
            gi = g[i]
            ld = wd * self.decay_mult[i]
            if ld:
                gi = gi + ld * (w if reg == "L2" else np.sign(w))
            lr = rate * self.lr_mult[i]
            h, h2 = self.h[i], self.h2[i]
            if self.kind == "SGD":
                h[...] = mom * h + lr * gi
                u = h.copy()
            elif self.kind == "Nesterov":
                old = h.copy()
                h[...] = mom * h + lr * gi
                u = (1 + mom) * h - mom * old
            elif self.kind == "AdaGrad":
                h += gi * gi
                u = lr * gi / (np.sqrt(h) + delta)
            elif self.kind == "RMSProp":
                d = p["rms_decay"]
                h[...] = d * h + (1 - d) * gi * gi
                u = lr * gi / (np.sqrt(h) + delta)
            elif self.kind == "AdaDelta":
                h[...] = mom * h + (1 - mom) * gi * gi
                gi = gi * np.sqrt((h2 + delta) / (h + delta))
                h2[...] = mom * h2 + (1 - mom) * gi * gi
                u = lr * gi
            elif self.kind == "Adam":
                t = self.it + 1
                corr = np.sqrt(1 - mom2 ** t) / (1 - mom ** t)
                h[...] = mom * h + (1 - mom) * gi
                h2[...] = mom2 * h2 + (1 - mom2) * gi * gi
                u = lr * corr * h / (np.sqrt(h2) + delta)
            w -= u
        self.it += 1
        return loss


def text_of(p):
    lines = []
    for k, v in p.items():
        if isinstance(v, list):
            lines += [f"{k}: {x}" for x in v]
        elif isinstance(v, bool):
            lines.append(f"{k}: {str(v).lower()}")
        elif isinstance(v, str):
            lines.append(f'{k}: "{v}"')
        else:
            lines.append(f"{k}: {v}")
    return "\n".join(lines)


CASES = [
    ("SGD", dict(base_lr=0.1, lr_policy="step", gamma=0.5, stepsize=2, momentum=0.9,
                 weight_decay=0.01)),
    ("Nesterov", dict(base_lr=0.1, lr_policy="inv", gamma=0.1, power=0.75, momentum=0.9,
                      weight_decay=0.02, regularization_type="L1")),
    ("AdaGrad", dict(base_lr=0.2, lr_policy="exp", gamma=0.9, weight_decay=0.01,
                     delta=1e-6)),
    ("RMSProp", dict(base_lr=0.05, lr_policy="poly", power=2.0, max_iter=10, rms_decay=0.9,
                     weight_decay=0.01, regularization_type="L1", delta=1e-6)),
    ("AdaDelta", dict(base_lr=1.0, lr_policy="fixed", momentum=0.95, delta=1e-6,
                      weight_decay=0.01)),
    ("Adam", dict(base_lr=0.05, lr_policy="multistep", gamma=0.5, stepvalue=[1, 3],
                  momentum=0.9, momentum2=0.999, delta=1e-8, weight_decay=0.01)),
    ("SGD", dict(base_lr=0.1, lr_policy="sigmoid", gamma=0.5, stepsize=2, momentum=0.5,
                 iter_size=2, clip_gradients=0.5, weight_decay=0.01)),
]


@pytest.mark.parametrize("kind,p", CASES, ids=[f"{k}-{p['lr_policy']}" for k, p in CASES])
def test_update_matches_numpy(kind, p):
    p = dict(p, type=kind)
    solver = make_solver(text_of(p))
    assert solver.kind == kind and solver.param.type == kind
    W0, b0 = (solver.net.params["ip"][i].data.copy() for i in range(2))
    ref = Ref(kind, p, W0, b0)
    for it in range(4):
        solver.step(1)
        ref.step()
        W, b = (solver.net.params["ip"][i].data for i in range(2))
        np.testing.assert_allclose(W, ref.params[0], rtol=2e-4, atol=2e-6,
                                   err_msg=f"{kind} weights after iteration {it + 1}")
        np.testing.assert_allclose(b, ref.params[1], rtol=2e-4, atol=2e-6,
                                   err_msg=f"{kind} bias after iteration {it + 1}")
        np.testing.assert_allclose(solver.history[0].data, ref.h[0], rtol=2e-4, atol=2e-6)
    assert solver.iter == 4 and solver.current_step == ref.cur


def test_clip_is_active_and_logged(caplog):
    p = dict(type="SGD", base_lr=0.1, lr_policy="fixed", clip_gradients=0.01, display=1)
    solver = make_solver(text_of(p))
    ref = Ref("SGD", p, *(solver.net.params["ip"][i].data.copy() for i in range(2)))
    g, _ = ref.grads()
    norm = np.sqrt(sum((gi ** 2).sum() for gi in g))
    assert norm > 0.01
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        solver.step(1)
    msgs = [r.getMessage() for r in caplog.records]
    m = [m for m in msgs if m.startswith("Gradient clipping: scaling down gradients (L2 norm ")]
    assert len(m) == 1, msgs
    got = re.fullmatch(r"Gradient clipping: scaling down gradients \(L2 norm (\S+) > 0.01\) "
                       r"by scale factor (\S+)", m[0])
    assert float(got.group(1)) == pytest.approx(norm, rel=1e-4)
    assert float(got.group(2)) == pytest.approx(0.01 / norm, rel=1e-4)
    ref.step()
    np.testing.assert_allclose(solver.net.params["ip"][0].data, ref.params[0], rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("policy", ["fixed", "step", "exp", "inv", "multistep", "poly",
                                    "sigmoid"])
def test_lr_policies(policy):
    p = dict(type="SGD", base_lr=0.3, lr_policy=policy, gamma=0.8, power=1.5, stepsize=3,
             stepvalue=[2, 5, 6], max_iter=20)
    solver = make_solver(text_of(p))
    cur = 0
    for it in range(0, 12):
        solver.iter = it
        want, cur = ref_lr(p, it, cur)
        assert solver.get_learning_rate() == pytest.approx(want, rel=1e-6), (policy, it)


def test_display_lines_and_smoothed_loss(caplog):
    p = dict(type="SGD", base_lr=0.05, lr_policy="fixed", momentum=0.9, display=3,
             average_loss=2)
    solver = make_solver(text_of(p))
    ref = Ref("SGD", p, *(solver.net.params["ip"][i].data.copy() for i in range(2)))
    losses = []
    for _ in range(7):
        losses.append(ref.step())
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        solver.step(7)
    msgs = [r.getMessage() for r in caplog.records]
    lines = [m for m in msgs if re.match(r"Iteration \d+ \(", m)]
    assert [int(re.match(r"Iteration (\d+)", m).group(1)) for m in lines] == [0, 3, 6]
    for m in lines:
        assert re.fullmatch(r"Iteration \d+ \([0-9.e+-]+ iter/s, [0-9.e+-]+s/3 iters\), "
                            r"loss = [-0-9.e+]+", m), m
    smoothed = [float(m.rsplit("= ", 1)[1]) for m in lines]
    # Caffe's UpdateSmoothedLoss with average_loss 2
    want = [losses[0], (losses[2] + losses[3]) / 2, (losses[5] + losses[6]) / 2]
    np.testing.assert_allclose(smoothed, want, rtol=1e-4)
    assert "Iteration 3, lr = 0.05" in msgs
    outs = [m for m in msgs if m.startswith("    Train net output #")]
    assert len(outs) == 3 * 12      # 12 elements of t at each display
    assert re.fullmatch(r"    Train net output #0: t = [-0-9.e+]+ \(\* 1 = [-0-9.e+]+ loss\)",
                        outs[0])


def test_test_nets_and_solve(caplog, tmp_path):
    p = dict(type="SGD", base_lr=0.05, lr_policy="fixed", display=2, max_iter=4,
             test_interval=2, test_iter=[3], test_compute_loss=True,
             snapshot_prefix=str(tmp_path / "s"))
    solver = make_solver(text_of(p))
    assert len(solver.test_nets) == 1
    tn = solver.test_nets[0]
    tn.blobs["x"].data[...] = X
    assert tn.params["ip"][0].data_mem is solver.net.params["ip"][0].data_mem
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        solver.solve()
    msgs = [r.getMessage() for r in caplog.records]
    assert [m for m in msgs if "Testing net" in m] == [
        "Iteration 0, Testing net (#0)", "Iteration 2, Testing net (#0)",
        "Iteration 4, Testing net (#0)"]
    W, b = (solver.net.params["ip"][i].data.astype(np.float64) for i in range(2))
    t = np.tanh(X @ W.T + b)
    last = [m for m in msgs if m.startswith("    Test net output #")][-12:]
    vals = [float(re.search(r"= ([-0-9.e+]+) \(", m).group(1)) for m in last]
    np.testing.assert_allclose(vals, t.ravel(), rtol=1e-4, atol=1e-6)
    tl = [m for m in msgs if m.startswith("Test loss: ")][-1]
    assert float(tl.split(": ")[1]) == pytest.approx(t.sum(), rel=1e-4, abs=1e-5)
    assert msgs[-1] == "Optimization Done."
    assert "Iteration 4, loss = " in " ".join(msgs)
    assert (tmp_path / "s_iter_4.caffemodel").exists()


def test_pycaffe_api_callbacks_and_apply_update(tmp_path):
    path = tmp_path / "solver.prototxt"
    (tmp_path / "net.prototxt").write_text(NET)
    path.write_text('net: "%s"\nbase_lr: 0.1\nlr_policy: "fixed"\ntype: "Adam"\n'
                    % (tmp_path / "net.prototxt"))
    solver = caffe.get_solver(str(path))
    assert isinstance(solver, caffe.AdamSolver)
    assert isinstance(solver.param, caffe_pb2.SolverParameter)
    assert solver.param.snapshot_prefix == str(tmp_path / "solver")
    assert caffe.SGDSolver(str(path)).kind == "SGD"
    calls = []
    solver.add_callback(lambda: calls.append(("s", solver.iter)),
                        lambda: calls.append(("g", solver.iter)))
    solver.net.blobs["x"].data[...] = X
    solver.step(2)
    assert calls == [("s", 0), ("g", 0), ("s", 1), ("g", 1)]
    # pycaffe-style manual loop: host-written diffs reach the update kernel
    sgd = caffe.SGDSolver(str(path))
    W, b = sgd.net.params["ip"]
    sgd.iter = 5
    before, bb = W.data.copy(), b.data.copy()
    W.diff[...] = 1.0
    b.diff[...] = -1.0
    sgd.apply_update()
    assert sgd.iter == 5                     # ApplyUpdate leaves iter alone
    np.testing.assert_allclose(W.data, before - 0.1, rtol=1e-6)
    np.testing.assert_allclose(b.data, bb + 0.2, rtol=1e-6)     # lr_mult 2
    np.testing.assert_allclose(W.diff, 0.1, rtol=1e-6)          # diff holds the update


def test_bad_inputs(tmp_path, monkeypatch):
    with pytest.raises(SolverError, match="must specify a train net"):
        caffe.SGDSolver(parse_solver_text('base_lr: 0.1 lr_policy: "fixed"'))
    sp = parse_solver_text('base_lr: 0.1 lr_policy: "fixed" test_interval: 1 '
                           'test_iter: 1 test_iter: 2')
    sp.train_net_param.CopyFrom(caffe.proto.parse_net_text(NET))
    sp.test_net_param.add().CopyFrom(caffe.proto.parse_net_text(NET))
    with pytest.raises(SolverError, match="test_iter must be specified for each test network"):
        caffe.SGDSolver(sp)
    with pytest.raises(SolverError, match="unknown learning rate policy 'bogus'"):
        make_solver('base_lr: 0.1 lr_policy: "bogus"')
    with pytest.raises(SolverError, match="Momentum cannot be used with AdaGrad"):
        make_solver('type: "AdaGrad" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9')
    with pytest.raises(SolverError, match="Unknown solver type: 'Foo'"):
        caffe.get_solver(parse_solver_text('type: "Foo"'))
    with pytest.raises(caffe.FileNotFound, match="current directory"):
        caffe.SGDSolver(parse_solver_text(f'net: "{tmp_path}/missing.prototxt"'))


def test_non_finite_check_names_layer(monkeypatch, caplog):
    monkeypatch.setenv("CAFFE_OCL_CHECK_FINITE", "1")
    solver = make_solver('base_lr: 0.1 lr_policy: "fixed"')
    solver.step(2)
    x = X.copy()
    x[1, 2] = np.nan
    solver.net.blobs["x"].data[...] = x
    # the NaN is in the data: the first top found non-finite is the Input's own
    # (the check once read the Input's device copy before it was uploaded and
    # then blamed the layer after it, or nothing, depending on stale memory)
    with pytest.raises(SolverError, match=r"Iteration 2: layer 'x' \(Input\) produced"
                                          r" a non-finite value .* top 'x'"):
        solver.step(1)
    # finite data, a non-finite weight: the layer that computed it is named
    solver.net.blobs["x"].data[...] = X
    solver.net.params["ip"][0].data[0, 0] = np.inf
    with pytest.raises(SolverError, match=r"Iteration 2: layer 'ip' \(InnerProduct\) produced"
                                          r" a non-finite value .* top 'z'"):
        solver.step(1)
    monkeypatch.delenv("CAFFE_OCL_CHECK_FINITE")
    solver = make_solver('base_lr: 0.1 lr_policy: "fixed" display: 1')
    solver.net.blobs["x"].data[...] = x
    with caplog.at_level(logging.INFO, logger="caffe_ocl"):
        solver.step(1)       # Caffe carries on and prints the NaN loss
    assert any(re.match(r"Iteration 0 \(.*\), loss = -?nan$", r.getMessage())
               for r in caplog.records)
