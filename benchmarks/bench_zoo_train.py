"""Training steps of converted torchvision nets (issue #27): the model of
bench_zoo.py (torchvision architecture, seeded weights, random BatchNorm
statistics) exported to ONNX (opset 13) with its BatchNorm layers kept
(``keep_bn``: no Conv+BN folding), converted with
``caffe_ocl.onnx.to_caffe.convert``, and made a TRAIN net:

- the converted ``data`` Input plus a ``label`` Input (the benchmark sets
  both blobs once), a ``SoftmaxWithLoss`` on the logits (normalization
  VALID: the mean over the batch, as PyTorch's CrossEntropyLoss);
- BatchNorm with ``use_global_stats`` cleared (the converter writes true
  for inference): batch statistics in TRAIN, as PyTorch's model.train();
- Dropout: none on either side. An eval-mode export has no Dropout node;
  a converted Dropout layer is removed from the TRAIN net, and PyTorch's
  Dropout and StochasticDepth modules (EfficientNet has both) are kept in
  eval mode (identity) while the rest of the model trains. Their cost (a
  pass over the classifier input; a per-sample scale of residual
  branches) is left out of PyTorch's time, so it is timed without them.
- the converted weights loaded with ``net.copy_from``.

Correctness check, before timing, per net/batch/precision: one step on both
sides from the same weights, input and labels: the loss, the gradient of
every parameter (each trained blob must equal a torch parameter bit for
bit before the step: that is how they are matched, and a trained blob
without one fails), the weight change made by one ``solver.step(1)``
(against PyTorch's first SGD step, -lr * (grad + weight_decay * w)), and
every BatchNorm's running mean and variance after the step. Gradient
error = ||ours - torch|| / ||torch|| per parameter (2-norms), printed for
the first convolution, a middle one and the last InnerProduct, and the
worst over all parameters; ``check_step`` says how a parameter above the
tolerance is judged against the same step in float64 (float32 ReLU
"kinks"). A failed check is marked in the table (and the ratio put in
parentheses).

Timing: ours ``solver.step(1)`` (SGD, lr 1e-3, momentum 0.9,
weight_decay 1e-4 as PyTorch's) then the device drained; PyTorch eager: zero_grad(set_to_none),
forward, CrossEntropyLoss, backward, ``torch.optim.SGD(momentum=0.9)``
step, synchronised. Interleaved rounds (bench_zoo.interleave), median of
the rounds; ratio = PyTorch ms / ours ms (>= 1: caffe_ocl ahead).

    python benchmarks/bench_zoo_train.py [--device gpu|cpu]
        [--nets resnet50,densenet121,efficientnet_b0] [--batches 16,64]
        [--precisions fp32,tf32] [--size 224] [--rounds 5] [--runs 5]
        [--warmup 3] [--json OUT.json] [--check-only] [--tol 1e-3]
    python benchmarks/bench_zoo_train.py --smoke   # bench_zoo's tiny net, CPU
    python benchmarks/bench_zoo_train.py --report A.json B.json   # one table
    python benchmarks/bench_zoo_train.py --device cpu --check-only --size 64 \\
        --batches 2 --nets resnet50,densenet121,efficientnet_b0

On the CPU the reference is PyTorch on the CPU (fp32 only).
"""
import argparse
import copy
import gc
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import bench_zoo  # noqa: E402
from bench_zoo import geomean, interleave, log, set_torch_tf32  # noqa: E402
from common import solver_for  # noqa: E402

NETS = ["resnet50", "densenet121", "efficientnet_b0"]
MORE_NETS = ["resnet18", "mobilenet_v2", "googlenet", "shufflenet_v2_x1_0"]
BASE_LR, MOMENTUM, WEIGHT_DECAY = 1e-3, 0.9, 1e-4


# --------------------------------------------------------------------------
# the TRAIN net
# --------------------------------------------------------------------------

def train_net_param(deploy, label="label", loss="loss"):
    """The TRAIN NetParameter (without weight blobs) of a converted deploy
    net: a ``label`` Input beside the data Input, BatchNorm on batch
    statistics, Dropout removed, ``SoftmaxWithLoss`` on the net's output."""
    from caffe_ocl.proto import caffe_pb2
    net = caffe_pb2.NetParameter()
    net.name = deploy.name or "converted"
    rename = {}
    produced, consumed = [], set()
    batch = None
    for lp in deploy.layer:
        if lp.type == "Dropout":
            top, bottom = lp.top[0], rename.get(lp.bottom[0], lp.bottom[0])
            if top != bottom:
                rename[top] = bottom
            continue
        nl = net.layer.add()
        nl.CopyFrom(lp)
        del nl.blobs[:]
        for i, b in enumerate(nl.bottom):
            nl.bottom[i] = rename.get(b, b)
            consumed.add(nl.bottom[i])
        if nl.type == "BatchNorm":
            nl.batch_norm_param.ClearField("use_global_stats")
        if nl.type == "Input" and batch is None:
            batch = nl.input_param.shape[0].dim[0]
            inp = net.layer.add()       # the label Input: inputs are data, label
            inp.name, inp.type = label, "Input"
            inp.top.append(label)
            inp.input_param.shape.add().dim.append(batch)
        produced.extend(t for t in nl.top if t not in produced)
    outs = [t for t in produced if t not in consumed]
    if len(outs) != 1 or batch is None:
        raise ValueError(f"net {net.name!r}: expected one Input and one output, found "
                         f"outputs {outs}")
    lp = net.layer.add()
    lp.name, lp.type = loss, "SoftmaxWithLoss"
    lp.bottom.extend([outs[0], label])
    lp.top.append(loss)
    return net


def make_solver(deploy, weights):
    """An SGDSolver on the TRAIN net of ``deploy`` with ``weights`` (the
    converter's NetParameter with blobs) loaded."""
    import caffe_ocl
    sp = solver_for(train_net_param(deploy), base_lr=BASE_LR, momentum=MOMENTUM,
                    weight_decay=WEIGHT_DECAY)
    solver = caffe_ocl.solvers.SGDSolver(sp)
    solver.net.copy_from(weights)
    return solver


def torch_train_mode(model):
    """model.train() with its random layers in eval mode (identity): Dropout
    and torchvision's StochasticDepth (EfficientNet, ConvNeXt drop whole
    residual branches in train mode); BatchNorm trains."""
    model.train()
    for m in model.modules():
        if type(m).__name__.startswith(("Dropout", "StochasticDepth")):
            m.eval()
    return model


# --------------------------------------------------------------------------
# the check
# --------------------------------------------------------------------------

def _key(a):
    a = np.ascontiguousarray(a, np.float32).ravel()
    return a.size, a[:16].tobytes()


def trained_blobs(net):
    """ids of the blobs a solver changes (learnable, lr_mult != 0: not
    BatchNorm's statistics)."""
    g = net.graph
    return {id(b) for b, lr in zip(g.learnable_params, g.params_lr) if lr != 0}


def match_params(net, model):
    """[(caffe layer name, layer type, blob index, torch parameter name)]
    for every learnable blob of ``net`` equal (bit for bit) to a torch
    parameter; the unmatched blobs' names in a second list."""
    torch_by_key = {}
    for name, p in model.named_parameters():
        torch_by_key.setdefault(_key(p.detach().cpu().numpy()), []).append((name, p))
    matched, unmatched = [], []
    learn = trained_blobs(net)
    for lname, layer in zip(net.layer_dict.keys(), net.layers):
        for i, b in enumerate(layer.blobs):
            if id(b) not in learn:
                continue
            cands = torch_by_key.get(_key(b.data), [])
            hit = [n for n, p in cands
                   if np.array_equal(p.detach().cpu().numpy().ravel(),
                                     np.asarray(b.data).ravel())]
            if hit:
                matched.append((lname, layer.type, i, hit[0]))
            else:
                unmatched.append(f"{lname}[{i}]")
    return matched, unmatched


def torch_step(model, x, y, tdev, dtype=None):
    """(loss, {param name: grad}, {BatchNorm module: [running mean, var
    before, running mean, var after]}) of one forward/backward of ``model``
    (train mode) on x, y, in ``dtype`` (a copy of the model) if given; the
    model's state (weights, BatchNorm statistics) is put back afterwards."""
    import torch
    state = copy.deepcopy(model.state_dict())
    m = model if dtype is None else copy.deepcopy(model).to(dtype)
    torch_train_mode(m)
    xt = torch.from_numpy(x).to(tdev)
    if dtype is not None:
        xt = xt.to(dtype)
    yt = torch.from_numpy(y.astype(np.int64)).to(tdev)
    for p in m.parameters():
        p.grad = None
    bns = [(n, b) for n, b in m.named_modules() if getattr(b, "running_mean", None) is not None]
    stats = {n: [b.running_mean.double().cpu().numpy().copy(),
                 b.running_var.double().cpu().numpy().copy()] for n, b in bns}
    loss = torch.nn.functional.cross_entropy(m(xt), yt)
    for n, b in bns:
        stats[n] += [b.running_mean.double().cpu().numpy().copy(),
                     b.running_var.double().cpu().numpy().copy()]
    loss.backward()
    grads = {n: p.grad.detach().double().cpu().numpy().copy()
             for n, p in m.named_parameters() if p.grad is not None}
    loss = float(loss.detach().double().cpu())
    for p in m.parameters():
        p.grad = None
    if dtype is None:
        model.load_state_dict(state)
    model.eval()
    return loss, grads, stats


def ours_step(solver, x, y):
    """(loss, {(layer, blob index): grad}, {(layer, blob index): update
    error}, {BatchNorm layer: [running mean, var before, after]}):
    forward/backward of the solver's net, then one
    ``solver.step(1)`` from the same weights on the same blobs; the update
    error is the weight change's relative distance from PyTorch's first SGD
    step, -lr * (grad + weight_decay * w), computed from our gradient."""
    net = solver.net
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = y
    net.clear_param_diffs()
    bns = [(n, lay) for n, lay in zip(net.layer_dict.keys(), net.layers)
           if lay.type == "BatchNorm"]

    def running(lay):
        b = [np.array(blob.data, np.float64) for blob in lay.blobs]
        f = b[2].ravel()[0]
        return [b[0] / f, b[1] / f] if f else [b[0] * 0, b[1] * 0]
    stats = {n: running(lay) for n, lay in bns}
    loss = float(net.forward()["loss"])
    for n, lay in bns:
        stats[n] += running(lay)
    net.backward()
    grads, before = {}, {}
    learn = trained_blobs(net)
    for lname, layer in zip(net.layer_dict.keys(), net.layers):
        for i, b in enumerate(layer.blobs):
            if id(b) in learn:
                grads[(lname, i)] = np.array(b.diff, np.float64)
                before[(lname, i)] = np.array(b.data, np.float64)
    solver.step(1)
    upd = {}
    for lname, layer in zip(net.layer_dict.keys(), net.layers):
        for i, b in enumerate(layer.blobs):
            k = (lname, i)
            if k in before:
                want = -BASE_LR * (grads[k] + WEIGHT_DECAY * before[k])
                got = np.array(b.data, np.float64) - before[k]
                # less 4 float32 ulps of the weight: w + dw is rounded to w's ulp
                off = np.maximum(np.abs(got - want) - 4 * np.spacing(
                    np.abs(before[k]).astype(np.float32)).astype(np.float64), 0.0)
                upd[k] = _norm(off) / max(_norm(want), 1e-30)
    return loss, grads, upd, stats


def _norm(a):
    return float(np.linalg.norm(np.ravel(a)))


def norm_err(got, ref, floor=0.0):
    """||got - ref|| / max(||ref||, floor) (2-norms over the whole array)."""
    got = np.asarray(got, np.float64).reshape(np.shape(ref))
    den = max(_norm(ref), floor)
    return _norm(got - ref) / den if den else _norm(got - ref)


def max_err(got, ref):
    """max |got - ref| / max |ref|."""
    got = np.asarray(got, np.float64).reshape(np.shape(ref))
    scale = float(np.max(np.abs(ref))) if np.size(ref) else 0.0
    err = float(np.max(np.abs(got - ref))) if np.size(ref) else 0.0
    return err / scale if scale else err


def check_step(solver, model, x, y, tdev, tol, kink_tol, loss_tol):
    """The check record (see the module doc); ``status`` "ok" or "MISMATCH".

    Per parameter, e = ||ours - torch|| / max(||torch||, floor) with floor
    = 1e-3 x the median gradient norm over the parameters (a gradient that
    is exactly zero in exact arithmetic, e.g. a BatchNorm bias before a
    convolution and another BatchNorm, is rounding noise on both sides).
    e <= ``tol`` passes. Above it, the same step in float64 (PyTorch)
    decides: ours no further from it than 3x PyTorch's float32 passes
    ("as exact as PyTorch"); up to ``kink_tol`` passes as float32 kink
    noise (a ReLU input or max-pooling tie within rounding of zero takes
    the other branch in one framework: every gradient upstream of it moves
    by up to a few 1e-2; measured on ResNet-50 / DenseNet-121 at batch 2,
    64x64, also between PyTorch float32 and float64); above that fails.
    The loss must be within ``loss_tol``; the weight change of
    ``solver.step(1)`` within 1e-4 of -lr * (grad + weight_decay * w)."""
    import torch
    matched, unmatched = match_params(solver.net, model)
    t_loss, t_grads, t_stats = torch_step(model, x, y, tdev)
    o_loss, o_grads, o_upd, o_stats = ours_step(solver, x, y)
    rec = dict(loss_ours=o_loss, loss_torch=t_loss,
               loss_rel=abs(o_loss - t_loss) / max(abs(t_loss), 1e-30),
               params_matched=len(matched), params_unmatched=unmatched[:20],
               n_unmatched=len(unmatched))
    norms = [_norm(t_grads[t]) for _, _, _, t in matched]
    floor = 1e-3 * float(np.median(norms)) if norms else 0.0
    errs = {}
    for lname, ltype, i, tname in matched:
        k = (lname, i)
        errs[k] = dict(type=ltype, torch=tname,
                       e=norm_err(o_grads[k], t_grads[tname], floor),
                       emax=max_err(o_grads[k], t_grads[tname]), upd=o_upd[k])
    over = [k for k, v in errs.items() if v["e"] > tol]
    fails, kinks = [], []
    if over:
        _, g64, _ = torch_step(model, x, y, tdev, dtype=torch.float64)
        floor64 = 1e-3 * float(np.median([_norm(g64[t]) for _, _, _, t in matched]))
        for k in over:
            v = errs[k]
            v["e64"] = norm_err(o_grads[k], g64[v["torch"]], floor64)
            v["torch_e64"] = norm_err(t_grads[v["torch"]], g64[v["torch"]], floor64)
            what = (f"{k[0]}[{k[1]}] ({v['type']}, {v['torch']}) grad {v['e']:.1e} "
                    f"(vs float64: ours {v['e64']:.1e}, torch {v['torch_e64']:.1e})")
            if v["e64"] <= max(tol, 3 * v["torch_e64"]):
                continue
            (kinks if v["e64"] <= kink_tol else fails).append((v["e64"], what))
    if rec["loss_rel"] > loss_tol:
        fails.append((rec["loss_rel"], f"loss {o_loss:.7g} vs {t_loss:.7g}"))
    for k, v in errs.items():
        if v["upd"] > 1e-4:
            fails.append((v["upd"], f"{k[0]}[{k[1]}] solver.step(1) changed the weights by "
                                    f"{v['upd']:.1e} (relative) off -lr*(grad + decay*w)"))
    # running averages after the one forward, BatchNorm layers matched by
    # their statistics before it
    stat_errs, n_bn = [], 0
    for lname, (m0, v0, m1, v1) in o_stats.items():
        n_bn += 1
        hit = [t for t, (tm0, tv0, _, _) in t_stats.items()
               if tm0.shape == m0.shape and np.allclose(m0, tm0, rtol=1e-5, atol=1e-7)
               and np.allclose(v0, tv0, rtol=1e-5, atol=1e-7)]
        if not hit:
            fails.append((1.0, f"{lname}: running statistics equal no torch BatchNorm's"))
            continue
        _, _, tm1, tv1 = t_stats[hit[0]]
        e = max(norm_err(m1, tm1), norm_err(v1, tv1))
        stat_errs.append(e)
        if e > tol:
            fails.append((e, f"{lname}: running mean/var after one step {e:.1e} off "
                             f"PyTorch's ({hit[0]})"))
    rec["bn_layers"] = n_bn
    rec["worst_running_stat_rel"] = max(stat_errs) if stat_errs else None
    if not matched:
        fails.append((1.0, "no parameter matched a torch parameter"))
    elif unmatched:      # the solver would train weights that PyTorch's model has not
        fails.append((1.0, f"{len(unmatched)} trained blobs equal no torch parameter: "
                           f"{', '.join(unmatched[:4])}"))
    convs = [k for k, v in errs.items() if v["type"] == "Convolution"]
    ips = [k for k, v in errs.items() if v["type"] == "InnerProduct"]
    named = {}
    if convs:
        named["first_conv"] = convs[0]
        named["mid_conv"] = convs[len(convs) // 2]
    if ips:
        named["last_fc"] = ips[-1]
    for tag, k in named.items():
        rec[tag] = f"{k[0]}[{k[1]}]"
        rec[f"{tag}_grad_rel"] = errs[k]["e"]
        rec[f"{tag}_grad_maxrel"] = errs[k]["emax"]
    if errs:
        worst = max(errs, key=lambda k: errs[k]["e"])
        rec["worst_param"] = f"{worst[0]}[{worst[1]}] ({errs[worst]['torch']})"
        rec["worst_grad_rel"] = errs[worst]["e"]
        rec["worst_update_rel"] = max(v["upd"] for v in errs.values())
    rec["n_over_tol"] = len(over)
    rec["kinks"] = [w for _, w in sorted(kinks, reverse=True)]
    rec["fails"] = [w for _, w in sorted(fails, reverse=True)]
    rec["status"] = "ok" if not fails else "MISMATCH"
    return rec


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------

def ours_timer(solver):
    dev = solver.net.device

    def fn():
        solver.step(1)
        dev.finish()
    return fn


def torch_timer(model, x, y, tdev):
    import torch
    torch_train_mode(model)
    xt = torch.from_numpy(x).to(tdev)
    yt = torch.from_numpy(y.astype(np.int64)).to(tdev)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY)
    sync = torch.cuda.synchronize if tdev.type == "cuda" else (lambda: None)

    def fn():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
        sync()
    return fn


# --------------------------------------------------------------------------
# one net
# --------------------------------------------------------------------------

def run_one(name, args, export_dir, emit):
    import torch
    from caffe_ocl import config
    gpu = args.device == "gpu"
    tdev = torch.device("cuda" if gpu else "cpu")
    precisions = args.precisions if gpu else ["fp32"]
    t_net = time.time()
    model = bench_zoo.build_or_report(name, args, precisions, emit)
    if model is None:
        return
    state0 = copy.deepcopy(model.state_dict())
    for batch in args.batches:
        base = dict(net=name, batch=batch, device=args.device, size=args.size)
        rng = np.random.default_rng(args.seed + 2)
        x = rng.standard_normal((batch, 3, args.size, args.size)).astype(np.float32)
        y = rng.integers(0, 1000 if name != bench_zoo.SMOKE_NET else 10, batch).astype(np.float32)
        model.load_state_dict(state0)
        model.eval()
        path, weights = bench_zoo.export_and_convert(model, name, batch, args, export_dir,
                                                     base, precisions, emit, keep_bn=True)
        if weights is None:
            continue
        base["layers"] = len(weights.layer) + 2
        model.to(tdev)
        for prec in precisions:
            rec = dict(base, precision=prec)
            tf32 = prec == "tf32"
            solver, timers = None, {}
            try:
                with torch.no_grad():
                    model.load_state_dict(state0)
                if gpu:
                    set_torch_tf32(tf32)
                with config.override(TF32=tf32):
                    t0 = time.time()
                    solver = make_solver(weights, weights)
                    rec["setup_s"] = round(time.time() - t0, 2)
                    t0 = time.time()
                    rec.update(check_step(solver, model, x, y, tdev,
                                          args.tol_tf32 if tf32 else args.tol, args.kink_tol,
                                          args.loss_tol_tf32 if tf32 else args.loss_tol))
                    rec["check_s"] = round(time.time() - t0, 2)
                    if not args.check_only:
                        timers = {"ours": ours_timer(solver),
                                  "torch": torch_timer(model, x, y, tdev)}
                        if args.ab:     # the same net built with --ab's settings
                            with bench_zoo.config_override(args.ab):
                                base_solver = make_solver(weights, weights)
                                base_solver.net.blobs["data"].data[...] = x
                                base_solver.net.blobs["label"].data[...] = y
                                # a first step under the settings too: layers
                                # build their backward launches at their
                                # first backward
                                ours_timer(base_solver)()
                            timers["base"] = ours_timer(base_solver)
                        med, samples = interleave(timers, args.rounds, args.warmup, args.runs)
                        for k, v in med.items():
                            rec[f"{k}_ms"] = v
                            rec[f"{k}_samples"] = [round(s, 4) for s in samples[k]]
            except Exception as e:  # noqa: BLE001
                rec["status"] = "run failed"
                rec["error"] = f"{type(e).__name__}: {e}"
                if args.verbose:
                    traceback.print_exc()
            finally:
                timers.clear()
                del solver
                gc.collect()
                if gpu:
                    torch.cuda.empty_cache()
            emit(rec)
        model.to("cpu")
        del weights
        gc.collect()
        if args.export_dir is None and os.path.exists(path):
            os.remove(path)
    log(f"# {name}: done in {time.time() - t_net:.0f} s")


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def _e(v):
    return "" if v is None else f"{v:.1e}"


def table(records):
    """Markdown: net, batch, precision, ours ms, torch ms, ratio, check;
    geometric mean and worst ratio per precision."""
    ab = any(r.get("base_ms") for r in records)
    lines = ["| net | batch | precision | caffe_ocl ms | torch ms | torch/ours | "
             + ("base ms | base/ours | " if ab else "") + "check: loss, "
             "grad rel err first conv / mid conv / last FC / worst (param) |",
             "|---|---|---|---|---|---|---|" + ("---|---|" if ab else "")]
    ratios = {}
    for r in records:
        o, t = r.get("ours_ms"), r.get("torch_ms")
        b = r.get("base_ms")
        abcols = (f"{bench_zoo.fmt(b)} | {b / o:.2f} | " if b and o else " | | ") if ab else ""
        ratio = ""
        if o and t:
            if r.get("status") == "ok":
                ratio = f"{t / o:.2f}"
                ratios.setdefault(r.get("precision"), []).append(
                    (t / o, f"{r['net']} b{r['batch']}"))
            else:
                ratio = f"({t / o:.2f})"
        if "loss_rel" in r:
            chk = (f"loss {_e(r['loss_rel'])}; grads {_e(r.get('first_conv_grad_rel'))} / "
                   f"{_e(r.get('mid_conv_grad_rel'))} / {_e(r.get('last_fc_grad_rel'))} / "
                   f"{_e(r.get('worst_grad_rel'))} ({r.get('worst_param', '')}); "
                   f"{r['params_matched']} params")
            if r.get("n_unmatched"):
                chk += f", {r['n_unmatched']} unmatched"
            if r.get("n_over_tol"):
                chk += (f"; {r['n_over_tol']} over tol, of which {len(r['kinks'])} "
                        "kink noise")
            chk += f" **{r['status']}**" if r["status"] != "ok" else " ok"
            if r.get("fails"):
                chk += ": " + "; ".join(r["fails"][:3])
        else:
            chk = f"**{r.get('status')}** {r.get('error', '')[:160]}"
        lines.append(f"| {r['net']} | {r['batch']} | {r.get('precision', '')} | "
                     f"{bench_zoo.fmt(o)} | {bench_zoo.fmt(t)} | {ratio} | {abcols}"
                     f"{chk.replace('|', '/')} |")
    for prec, v in ratios.items():
        a, n = min(v)
        lines.append(f"| **geomean {prec}** | | | | | **{geomean([a for a, _ in v]):.2f}** | "
                     f"worst {a:.2f} ({n}) |")
    lines.append("\nratio = PyTorch ms / caffe_ocl ms per training step (>= 1: caffe_ocl "
                 "ahead); in parentheses where the check failed (left out of the geomean).")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(NETS),
                    help=f"comma list (also tried: {','.join(MORE_NETS)})")
    ap.add_argument("--batches", default=None, help="default 16,64 (gpu), 2 (cpu)")
    ap.add_argument("--precisions", default="fp32,tf32", help="gpu only; the CPU runs fp32")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--runs", type=int, default=5, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before round 1")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--size", type=int, default=None, help="input height = width "
                    "(default 224 on the GPU, 64 on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-3,
                    help="FP32 gradient relative error (2-norm) against PyTorch")
    ap.add_argument("--tol-tf32", type=float, default=2e-2, help="the same for TF32")
    ap.add_argument("--kink-tol", type=float, default=0.2,
                    help="above --tol: largest relative distance from the float64 step "
                         "taken for float32 kink noise (see check_step)")
    ap.add_argument("--loss-tol", type=float, default=1e-4, help="FP32 loss relative error")
    ap.add_argument("--loss-tol-tf32", type=float, default=1e-2, help="TF32 loss relative error")
    ap.add_argument("--check-only", action="store_true", help="the correctness check, no timing")
    ap.add_argument("--ab", default="",
                    help="NAME=VALUE[,NAME=VALUE]: also time a solver built with these "
                         "settings (config.py names) as 'base', interleaved (ratio "
                         "base/ours in the table)")
    ap.add_argument("--json", help="write every record here (after each record)")
    ap.add_argument("--export-dir", help="keep/reuse the exported ONNX files here")
    ap.add_argument("--smoke", action="store_true",
                    help="bench_zoo's tiny net, CPU, batch 2, 16x16, one short round")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="measure nothing: print the table of these --json files together")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.nets, args.device, args.batches = bench_zoo.SMOKE_NET, "cpu", "2"
        args.size, args.runs, args.warmup, args.rounds = 16, 2, 1, 1
    gpu = args.device == "gpu"
    if args.batches is None:
        args.batches = "16,64" if gpu else "2"
    if args.size is None:
        args.size = 224 if gpu else 64
    args.nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    args.batches = [int(b) for b in str(args.batches).split(",") if b.strip()]
    args.precisions = [p.strip().lower() for p in args.precisions.split(",") if p.strip()]
    args.ab = [p.strip() for p in args.ab.split(",") if p.strip()]
    bad = set(args.precisions) - {"fp32", "tf32"}
    if bad:
        ap.error(f"--precisions: unknown {sorted(bad)} (fp32, tf32)")
    return args


def report_files(paths):
    """The table of several --json files' records together."""
    print(table(bench_zoo.read_reports(paths)), flush=True)


def main(argv=None):
    args = parse(argv)
    if args.report:
        report_files(args.report)
        return 0
    dev, platform, torch = bench_zoo.start_device(args.device, "bench_zoo_train")
    log(f"# device: {dev.name} ({platform}); torch {torch.__version__}; "
        f"nets {','.join(args.nets)}; batches {args.batches}; size {args.size}; "
        f"{','.join(args.precisions) if args.device == 'gpu' else 'fp32'}; "
        + ("check only" if args.check_only else
           f"rounds {args.rounds} x runs {args.runs} (warmup {args.warmup})"))
    records = []

    def describe(rec):
        ms = " ".join(f"{k[:-3]} {rec[k]:.2f} ms" for k in rec if k.endswith("_ms"))
        chk = ""
        if "loss_rel" in rec:
            chk = (f" loss {rec['loss_ours']:.5f}/{rec['loss_torch']:.5f} "
                   f"rel {rec['loss_rel']:.1e} "
                   f"worst grad {rec.get('worst_grad_rel', math.nan):.1e} "
                   f"({rec.get('worst_param')}) {rec['params_matched']} params")
        why = f" {rec['error'][:300]}" if rec.get("error") else ""
        fails = (f" FAILS ({len(rec['fails'])}): {'; '.join(rec['fails'][:3])}"
                 if rec.get("fails") else "")
        if rec.get("kinks"):
            fails += (f" kink noise ({len(rec['kinks'])} params over --tol, within "
                      f"--kink-tol of float64; worst: {rec['kinks'][0]})")
        return (f"{rec['net']} b{rec['batch']} {rec.get('precision', '')}: "
                f"{rec.get('status')}{chk} {ms}{why}{fails}")

    emit = bench_zoo.record_emitter(records, dev, platform, torch, args.json, describe)
    bench_zoo.run_each_net(args, "bench_zoo_train_",
                           lambda name, export_dir: run_one(name, args, export_dir, emit), emit)
    print(table(records), flush=True)
    bad = [r for r in records if r.get("status") != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
