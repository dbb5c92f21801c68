"""Measure each convolution's algorithms on this device and store the
fastest (ops/tuned.py), so that nets built afterwards use them: the library
side of `caffe_ocl tune` (caffe_ocl/commands/tune.py).

    caffe_ocl tune --model M.prototxt [--phase TRAIN|TEST] [--gpu N]
                   [--iterations R] [--store=false]

For every convolution of the net (Convolution and Deconvolution layers;
geometries shared by several layers are timed once) and every pass the
phase runs (TEST: the layers' forward; TRAIN: also the data gradient where
the net propagates one, and the weight gradient), each algorithm that can
compute it (ops/conv.py ``candidates``) runs on buffers of the layer's
shapes (a pass that only one algorithm can compute is listed, not timed),
interleaved -- A, B, C, A, B, C, ... -- for R rounds (default 5),
each round long enough to dwarf the queue's synchronisation; the median
decides (the rules' own choice unless another is more than 3% faster).
Where the implicit GEMM is chosen for a forward on a GPU, its variants
are timed the same way (ops/conv.py FORWARD_VARIANTS: the usual or the
small tiles, FP32 only; the K split of forward_splitk or none; for 1x1
layers the few-outputs kernel of ops/conv1x1_few.py) and the fastest
stored too (pass "forward-igemm"); on CPU drivers, where the GEMM path
(im2col) is chosen, the kernels that can run it (the direct kernel, the
small-plane chanvec kernel, the GEMM; pass "forward-cpu": their rules
were measured on other CPUs). Choices are stored per device,
geometry (batch size included), pass and TF32 setting. The table printed
shows every time, the choice and what the rules would run.

On a GPU it then times the K split of each fully-connected layer's
product (``net_products``: the forward, and in a TRAIN net the data
gradient, where ops/gemm_splitk.py ``gemm_launches`` runs the tiled GEMM,
not the matrix-vector kernel): whole, the rules' factor, and the factors
giving chunks near SPLIT_CHUNKS, stored per product shape and TF32 setting
(pass "gemm-split"; the rules were measured on an H100 and an H200 only).

What it does not see: a fusion's extra work (the activation or ReLU
backward that a layer fused with a convolution adds to it is not timed),
and the cache effects of a whole net (each pass runs alone, repeated).
"""
import logging
import statistics
import time

import numpy as np

from .net import TRAIN
from .ops import conv as conv_ops
from .ops import gemm_splitk
from .ops import tuned
from .ops import winograd as wino_ops
from .ops.gemm import use_tf32

log = logging.getLogger("caffe_ocl")

# seconds a timed round of one candidate should last at least (it repeats
# the pass that many times between two synchronisations)
ROUND_SECONDS = {"gpu": 0.004, "cpu": 0.05}
# the rules' choice stays unless another algorithm is faster by more than
# this fraction (H200, ResNet-50: equal 1x1 passes, 0.147 vs 0.147 ms,
# otherwise went to whichever the noise favoured)
KEEP_RULE_WITHIN = 0.03


def net_conv_passes(net):
    """[(layer name, geometry, pass)] of the convolution passes ``net``
    runs: a layer's forward, and in a TRAIN-phase net its data and weight
    gradients where they are needed (Deconvolution: the forward of the layer
    is the convolution's backward_data and vice versa). (Caffe works out
    which layers need backward in TEST nets too; they rarely run it.)"""
    training = net.phase == TRAIN
    out = []
    for li, layer in enumerate(net.layers):
        if (layer.type not in ("Convolution", "Deconvolution") or layer.spatial != 2
                or getattr(layer, "geom", None) is None):
            continue        # N-D convolutions have one algorithm (ops/conv_nd.py)
        reverse = layer.type == "Deconvolution"
        g = layer.geom
        passes = ["backward_data" if reverse else "forward"]
        if training and net.graph.layer_need_backward[li]:
            if any(net.graph.bottom_need_backward[li]):
                passes.append("forward" if reverse else "backward_data")
            if layer.param_propagate_down and layer.param_propagate_down[0]:
                passes.append("backward_weight")
        out += [(net.graph.layer_names[li], g, p) for p in passes]
    return out


# chunk lengths of K the product tuning tries (the nearest divisor of K
# giving chunks that are multiples of 16), beside whole and the rules'
SPLIT_CHUNKS = (128, 256, 512, 768, 1024, 1536)
MAX_SPLIT = 64


def net_products(net):
    """[(layer name, M, N, K, trans_a, trans_b)] of the fully-connected
    products ``net`` runs through ``gemm_splitk.gemm_launches``' tiled GEMM
    on a GPU (the only place it splits K): each InnerProduct's forward and,
    in a TRAIN net where its bottom needs a gradient, its data gradient.
    Products the matrix-vector kernel runs (a few rows) are left out."""
    dev = net.device
    if not dev.is_gpu:
        return []
    training = net.phase == TRAIN
    out = []
    for li, layer in enumerate(net.layers):
        if layer.type != "InnerProduct" or getattr(layer, "M", None) is None:
            continue
        M, N, K, name = layer.M, layer.num_output, layer.K, net.graph.layer_names[li]
        prods = [(name, M, N, K, False, not layer.transpose)]
        if training and net.graph.layer_need_backward[li] \
                and any(net.graph.bottom_need_backward[li]):
            prods.append((f"{name} (data gradient)", M, K, N, False, layer.transpose))
        out += [p for p in prods if not gemm_splitk.use_gemv(dev, *p[1:])]
    return out


def split_candidates(dev, M, N, K):
    """The K split factors timed for an M x N x K product: 1 (whole), the
    rules' own, and for each of SPLIT_CHUNKS the divisor of K nearest to it
    whose chunks are multiples of 16 (at most MAX_SPLIT chunks)."""
    divisors = [d for d in gemm_splitk.chunk_divisors(K) if d <= MAX_SPLIT]
    found = {1, gemm_splitk.splitk_factor(dev, M, N, K, stored=False)}
    for chunk in SPLIT_CHUNKS:
        if divisors and chunk < K:
            found.add(min(divisors, key=lambda d: abs(K / d - chunk)))
    return sorted(found)


def tune_products(dev, items, rounds=5, store=True, out=print, clock=None):
    """Time the K split factors (``split_candidates``) of each distinct
    product of ``items`` (``net_products``), interleaved; store the
    fastest (the rules' kept within KEEP_RULE_WITHIN) unless ``store`` is
    False; ``(rows, path)`` as ``tune_passes``. A factor is named "x<n>"."""
    by_key = {}
    for name, M, N, K, ta, tb in items:
        key = tuned.gemm_split_key(M, N, K, use_tf32(dev))
        by_key.setdefault(key, [(M, N, K, ta, tb), []])[1].append(name)
    rows, new = [], {}
    for key, ((M, N, K, ta, tb), names) in by_key.items():
        factors = split_candidates(dev, M, N, K)
        rule = gemm_splitk.splitk_factor(dev, M, N, K, stored=False)
        if len(factors) < 2:
            out(f"{_names(names)} gemm-split: only x{factors[0]} applies")
            continue
        bufs = _product_buffers(dev, M, N, K)

        def builder(f, M=M, N=N, K=K, ta=ta, tb=tb, bufs=bufs):
            return lambda: gemm_splitk.gemm_launches(dev, M, N, K, *bufs, trans_a=ta,
                                                     trans_b=tb, nsplit=f)
        row = _timed_row(dev, {f"x{f}": builder(f) for f in factors}, f"x{rule}", names, key,
                         "gemm-split", rounds, out, clock)
        if row is not None:
            rows.append(row)
            new[key] = _entry(row)
    _print_summary(rows, out)
    return rows, _store(dev, new, store, out)


def _product_buffers(dev, M, N, K):
    """A, B and C of an M x N x K product, random."""
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (M * K, N * K, M * N)]
    bufs = [dev.alloc(4 * h.size) for h in host]
    for buf, h in zip(bufs, host):
        dev.upload(buf, h)
    dev.finish()                    # the host arrays alive until the copies end
    return bufs


class _Buffers:
    """Device buffers of one geometry's shapes, filled with random values."""

    def __init__(self, dev, g, col_floats):
        rng = np.random.default_rng(0)
        x = g.num * g.channels * g.height * g.width
        y = g.num * g.out_channels * g.out_spatial
        w = g.out_channels * (g.channels // g.groups) * g.kh * g.kw
        host = []                               # alive until the copies finish
        for name, n in (("x", x), ("x_grad", x), ("y", y), ("y_grad", y), ("w", w),
                        ("w_grad", w), ("b", g.out_channels)):
            host.append(rng.standard_normal(n).astype(np.float32) * 0.1)
            setattr(self, name, dev.alloc(4 * n))
            dev.upload(getattr(self, name), host[-1])
        self.col = dev.alloc(4 * col_floats) if col_floats else None
        dev.finish()


def _launches(dev, g, pass_, algo, bufs):
    if pass_ == "forward":
        return conv_ops.forward(dev, g, bufs.x, bufs.w, bufs.y, bufs.col, bufs.b, algo=algo)
    if pass_ == "backward_data":
        return conv_ops.backward_data(dev, g, bufs.y_grad, bufs.w, bufs.x_grad, bufs.col,
                                      algo=algo)
    return conv_ops.backward_weight(dev, g, bufs.x, bufs.y_grad, bufs.w_grad, bufs.col, algo=algo)


def _run(dev, launches, times):
    q = dev.queue
    t0 = time.perf_counter()
    for _ in range(times):
        for launch in launches:
            launch.run(q)
    dev.finish()
    return time.perf_counter() - t0


def measure(dev, g, pass_, algos=None, rounds=5, clock=None):
    """{algorithm: median ms} of one convolution pass, the candidates
    interleaved round by round; a candidate that cannot be built or run on
    this device (too much local memory, out of memory) maps to the error's
    text instead. ``clock(dev, algo, launches, repeats)`` replaces the
    timing (tests)."""
    algos = list(algos or conv_ops.candidates(dev, g))
    col = max(conv_ops.workspace_floats(dev, g, a) for a in algos)
    bufs = _Buffers(dev, g, col)
    return _timed(dev, {a: (lambda a=a: _launches(dev, g, pass_, a, bufs)) for a in algos},
                  rounds, clock)


def _timed(dev, builders, rounds, clock):
    """{name: median ms} of the launch lists ``builders`` (name -> function
    making them), each built and run once first (programs built, warmed up),
    then timed interleaved; one that cannot be built or run maps to the
    error's first line instead."""
    built, failed = {}, {}
    for name, build in builders.items():
        try:
            built[name] = build()
            _run(dev, built[name], 1)
        except Exception as e:                       # noqa: BLE001 -- reported, not fatal
            first_line = (str(e).splitlines() or [type(e).__name__])[0]
            failed[name] = f"failed: {first_line[:120]}"
            built.pop(name, None)
    result = _interleaved(dev, built, rounds, clock)
    result.update(failed)
    return result


def _interleaved(dev, built, rounds, clock):
    """{name: median ms} of the launch lists ``built`` (name -> launches),
    each round long enough (ROUND_SECONDS), interleaved round by round."""
    clock = clock or (lambda dev, a, launches, n: _run(dev, launches, n))
    target = ROUND_SECONDS["cpu" if dev.is_cpu else "gpu"]
    repeats = {}
    for a, launches in built.items():
        once = max(clock(dev, a, launches, 1), 1e-6)
        repeats[a] = max(1, min(1000, int(target / once + 0.5)))
    samples = {a: [] for a in built}
    for _ in range(rounds):
        for a, launches in built.items():
            samples[a].append(clock(dev, a, launches, repeats[a]) / repeats[a])
    return {a: statistics.median(s) * 1000.0 for a, s in samples.items()}


def tune_passes(dev, items, rounds=5, store=True, out=print, clock=None, training=False):
    """Time every (name, geometry, pass) of ``items`` (each distinct
    geometry and pass once), store the fastest choices for ``dev`` (unless
    ``store`` is False) and return ``(rows, path)``: rows of dicts with the
    layer names, key, times, choice and the rules' choice. ``training``:
    the passes are a TRAIN net's, whose forwards may run another Winograd
    tile (timed as such, stored under their own key: ops.conv.tuned_key)."""
    with wino_ops.train_forwards(training):
        return _tune_passes(dev, items, rounds, store, out, clock, training)


def _tune_passes(dev, items, rounds, store, out, clock, training=False):
    by_key = {}
    for name, g, p in items:
        key = conv_ops.tuned_key(dev, g, p)
        by_key.setdefault(key, [g, p, []])[2].append(name)
    rows, new = [], {}
    for key, (g, p, names) in by_key.items():
        choice = _tune_algorithm(dev, g, p, key, names, rounds, out, clock, rows, new)
        vrow = None
        if p == "forward" and choice == "igemm":
            vrow = tune_forward_variants(dev, g, names, rounds=rounds, out=out, clock=clock)
        elif p == "forward" and choice == "im2col" and dev.is_cpu:
            vrow = tune_cpu_forward(dev, g, names, rounds=rounds, out=out, clock=clock,
                                    inference=not training)
        if vrow is not None:
            rows.append(vrow)
            new[vrow["key"]] = _entry(vrow)
    _print_summary(rows, out)
    return rows, _store(dev, new, store, out)


def _choose(times, rule):
    """The fastest of ``times`` (name -> ms, or an error's text for one that
    could not run), the rules' ``rule`` kept unless another is faster by
    more than KEEP_RULE_WITHIN; None when none ran."""
    ok = {a: t for a, t in times.items() if isinstance(t, float)}
    if not ok:
        return None
    choice = min(ok, key=ok.get)
    if rule in ok and ok[rule] <= ok[choice] * (1 + KEEP_RULE_WITHIN):
        choice = rule
    return choice


def _entry(row):
    """The stored entry of a row with a choice: the choice, the first layers
    and every time that was measured."""
    return {"choice": row["choice"], "layers": row["layers"][:4],
            "ms": {a: round(t, 4) for a, t in row["times"].items() if isinstance(t, float)}}


def _store(dev, new, store, out):
    """Save the ``new`` entries (where ``store`` and there are any), say
    where; the file's path or None."""
    path = tuned.save(dev, new) if store and new else None
    if path:
        out(f"stored {len(new)} choices in {path}")
    return path


def _tune_algorithm(dev, g, p, key, names, rounds, out, clock, rows, new):
    """Time the algorithms that can compute pass ``p`` of ``g``, add its row
    to ``rows`` and its choice to ``new``; the algorithm chosen (where only
    one applies: that one, neither timed nor stored)."""
    algos = conv_ops.candidates(dev, g)
    if len(algos) == 1:
        out(f"{_names(names)} {p}: only {algos[0]} applies")
        return algos[0]
    times = measure(dev, g, p, algos, rounds=rounds, clock=clock)
    rule = conv_ops.algorithm(dev, g)             # pass_=None: never the stored choice
    if p == "backward_weight":
        rule = conv_ops.weight_grad_algorithm(dev, rule)
    choice = _choose(times, rule)
    row = dict(layers=names, key=key, pass_=p, times=times, rule=rule, choice=choice)
    rows.append(row)
    _print_row(row, out)
    if choice is not None:
        new[key] = _entry(row)
    return choice


def rule_variant(dev, g):
    """The implicit-GEMM forward variant (ops/conv.py FORWARD_VARIANTS) the
    rules give ``g`` (no stored choice)."""
    with conv_ops.forced_forward_variant(None):
        if conv_ops.runs_1x1_few(dev, g):
            return "few"
        t = conv_ops.forward_tiles(dev, g)
        tiles = "small" if t.get("MICRO", 8) == 4 else "narrow" if t["TM"] == 32 else "usual"
        split = conv_ops.forward_splitk(dev, g)[0] > 1
    return f"{tiles}/{'split' if split else 'nosplit'}"


def tune_forward_variants(dev, g, names, rounds=5, out=print, clock=None):
    """Time the implicit-GEMM forward variants of ``g`` (tiles x K split,
    ops/conv.py forward_variants) as ``measure`` times algorithms; a row
    (pass_ "forward-igemm") with the fastest, the rules' kept within
    KEEP_RULE_WITHIN, or None where there is nothing to choose. A variant
    that builds the same launches as another (no split to drop, say) is
    timed anyway: the table shows it."""
    variants = conv_ops.forward_variants(dev, g)
    if len(variants) < 2:
        return None
    bufs = _Buffers(dev, g, 0)
    return _variant_row(dev, variants, rule_variant(dev, g),
                        lambda: _launches(dev, g, "forward", "igemm", bufs),
                        names, tuned.conv_key(g, "forward-igemm", use_tf32(dev)),
                        "forward-igemm", rounds, out, clock)


def _variant_row(dev, variants, rule, launches, names, key, pass_, rounds, out, clock):
    """Time ``launches()`` built under each forced variant: ``_timed_row``."""
    def builder(v):
        def build():
            with conv_ops.forced_forward_variant(v):
                return launches()
        return build
    return _timed_row(dev, {v: builder(v) for v in variants}, rule, names, key, pass_,
                      rounds, out, clock)


def _timed_row(dev, builders, rule, names, key, pass_, rounds, out, clock):
    """Time the launch lists ``builders`` make, interleaved (``_timed``); the
    row of the fastest (``_choose``), printed, or None when none could run."""
    times = _timed(dev, builders, rounds, clock)
    choice = _choose(times, rule)
    if choice is None:
        return None
    row = dict(layers=names, key=key, pass_=pass_, times=times, rule=rule, choice=choice)
    _print_row(row, out)
    return row


def tune_cpu_forward(dev, g, names, rounds=5, out=print, clock=None, inference=True):
    """CPU drivers: time the kernels that can run ``g``'s im2col forward
    (ops/conv.py cpu_forward_variants: direct, chanvec, pointwise, GEMM) as
    ``tune_forward_variants`` times the GPU's; a row (pass_ "forward-cpu")
    with the fastest, the rules' kept within KEEP_RULE_WITHIN, or None where
    there is nothing to choose. ``inference``: built as an inference net's
    forward (weights packed once: the chanvec kernel needs that); a TRAIN
    net's forwards read the weights as they are and cannot run chanvec, so
    it is not timed for them. The choice is stored per geometry, for both
    phases: a TEST net's stored chanvec leaves a TRAIN net's forward on the
    GEMM."""
    variants = [v for v in conv_ops.cpu_forward_variants(dev, g)
                if inference or v != "chanvec"]
    if len(variants) < 2:
        return None
    bufs = _Buffers(dev, g, conv_ops.workspace_floats(dev, g, "im2col"))
    version = (lambda: 1) if inference else None
    with conv_ops.forced_forward_variant(None):
        rule = ("direct" if conv_ops.direct_forward(dev, g) else
                "pointwise" if conv_ops.pointwise_rows(dev, g) else
                "chanvec" if inference and conv_ops.chanvec_forward(dev, g) else "gemm")
    return _variant_row(dev, variants, rule,
                        lambda: conv_ops.forward(dev, g, bufs.x, bufs.w, bufs.y, bufs.col,
                                                 bufs.b, weight_version=version),
                        names, tuned.conv_key(g, "forward-cpu", False), "forward-cpu",
                        rounds, out, clock)


def _print_row(row, out):
    times = ", ".join(f"{a} {t:.3f} ms" if isinstance(t, float) else f"{a} {t}"
                      for a, t in row["times"].items())
    out(f"{_names(row['layers'])} {row['pass_']}: {times} -> {row['choice']} "
        f"(rules: {row['rule']})")


def _names(layers):
    return ",".join(layers[:3]) + ("..." if len(layers) > 3 else "")


def _print_summary(rows, out):
    """Sums over the net's passes that had a choice (a geometry shared by k
    layers counts k times) of the rules' choices and of the chosen ones:
    the algorithms, the kernel variants that refine a forward, then the
    fully-connected products' K splits."""
    def kind(pass_):
        return ("variants" if pass_ in ("forward-igemm", "forward-cpu") else
                "products" if pass_ == "gemm-split" else "algorithms")
    for label, which in (("convolution passes with a choice", "algorithms"),
                         ("forward kernel variants", "variants"),
                         ("fully-connected products' K splits", "products")):
        rules = chosen = 0.0
        for r in rows:
            t = r["times"]
            if r["choice"] is None or not isinstance(t.get(r["rule"]), float) \
                    or kind(r["pass_"]) != which:
                continue
            k = len(r["layers"])
            rules += k * t[r["rule"]]
            chosen += k * t[r["choice"]]
        if chosen > 0:
            out(f"{label}, summed: rules {rules:.3f} ms, tuned {chosen:.3f} ms "
                f"({rules / chosen:.2f}x)")


def tune_net(net, rounds=5, store=True, out=print, clock=None):
    """Tune the convolutions and (on a GPU) the fully-connected products'
    K splits of a built ``net`` (see the module's text). Nets built
    afterwards use the stored choices; ``net`` keeps its own. ``(rows,
    path)``: the rows of both; path None when nothing was stored."""
    rows, path = tune_passes(net.device, net_conv_passes(net), rounds=rounds, store=store,
                             out=out, clock=clock, training=net.phase == TRAIN)
    prows, ppath = tune_products(net.device, net_products(net), rounds=rounds, store=store,
                                 out=out, clock=clock)
    return rows + prows, ppath or path
