"""TEST-phase rewrite: a MatMul's operands read by its GEMM as strided
views of the blobs they were cut, moved and scaled from.

Attention as PyTorch exports it reaches its two products through layers
that only move values: the qkv projection's output is reshaped, permuted
((N, T, 3, H, D) -> (3, N, H, T, D)), sliced into q, k and v, reshaped
again; q and k are scaled by a constant (``Power``) and K is transposed
(``Permute`` of the last two axes); a separate q / k / v projection is
reshaped and permuted ((N, T, H, D) -> (N, H, T, D)). onnx2caffe writes
each as a layer, and each that moves data is a pass over its tensor and a
launch (the Permute and the Slice: 24 of DeiT-Tiny's 153 launches a
forward). A GEMM reads any operand whose rows and columns lie at fixed
strides, and each product's heads at fixed strides from each other.

For each bottom of a ``MatMul`` layer the rewrite walks back over the
layers that produced it while they are *views*:

- ``Reshape`` / ``Flatten`` (the same flat order),
- ``Permute`` (any order: the strides move with the axes),
- ``Slice`` (an offset along its axis),
- ``Power`` with power 1 and shift 0 (a factor of the product),

each with one bottom, no top written in place, no net output among its
tops, and every reader of its tops either another such layer that is
skipped too or a MatMul reading through it (a fixed point over all the
net's MatMuls: q, k and v share the qkv Slice). The blob the walk stops
at is the operand's *source*; the operand is a strided view of it
(offset, a stride per axis: numpy's rules for a reshape without a copy).
The MatMul's GEMM reads the two sources where the views say, the scales'
product as its factor, an operand transposed where its columns are not
contiguous but its rows are, the leading axes as (batch, group) strides
(gemm.cl's two levels). It may also write, right after the MatMul, the
top of a ``Permute`` that keeps the last axis last and alone reads the
product (attention's heads merged back: (..., H, M, N) -> (..., M, H, N)):
the GEMM writes each product's rows where the Permute puts them.

The skipped layers' tops are computed when read, by the layers' own
forwards (plan/patterns.PendingTops): a MatMul's group takes the skipped
layers right before it; skipped layers elsewhere (the shared Permute and
Slice before the first product) make a ``PendingViews`` group that runs
nothing. A group whose views start in layers before its own
(``forward_from``) runs fused only in forward ranges that start there
too: in a range that starts later, a blob in between may hold a value
written from Python, and the MatMul reads it as Caffe does. Where the
views do not fit a GEMM at the current shapes, the group runs its layers'
own forwards. Values: the same products, the factor applied to the sums
instead of the operands (float32 rounding). ``CAFFE_OCL_FOLD=0`` or
``CAFFE_OCL_FUSE_MATMUL_OPERANDS=0`` turn it off.
"""
from .. import config
from ..ops import gemm as gemm_ops
from .patterns import PendingTops, readers_of

VIEWS = ("Reshape", "Flatten", "Permute", "Slice", "Power")


def _scale(layer):
    """The factor of a Power layer that only scales, else None."""
    p = layer.param.power_param
    return float(p.scale) if p.power == 1.0 and p.shift == 0.0 else None


# ---- strided views ---------------------------------------------------------

def _contiguous(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def _reshaped(shape, strides, new):
    """Strides of the view (shape, strides) seen as shape ``new`` without a
    copy (numpy's rule: each run of old axes that merges or splits into
    new ones must be contiguous in itself), or None."""
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    out = [1] * len(new)
    if not old:
        return out
    dims = [d for d, _ in old]
    sts = [s for _, s in old]
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new) and oi < len(dims):
        np_, op = new[ni], dims[oi]
        while np_ != op:
            if np_ < op:
                if nj >= len(new):
                    return None
                np_ *= new[nj]
                nj += 1
            else:
                if oj >= len(dims):
                    return None
                op *= dims[oj]
                oj += 1
        if any(sts[k] != dims[k + 1] * sts[k + 1] for k in range(oi, oj - 1)):
            return None
        out[nj - 1] = sts[oj - 1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    return out


def _view(net, source, steps):
    """(offset, shape, strides, factor) of the blob at the end of ``steps``
    [(layer index, top index)] from ``source``, at the blobs' current
    shapes, or None where a reshape cannot be a view."""
    g = net.graph
    shape = list(source.shape)
    strides = _contiguous(shape)
    off, alpha = 0, 1.0
    for lj, k in steps:
        layer, t = net.layers[lj], g.layer_types[lj]
        top = g.tops[lj][k]
        if t == "Power":
            alpha *= _scale(layer)
        elif t == "Permute":
            orders = list(layer.orders)
            shape = [shape[o] for o in orders]
            strides = [strides[o] for o in orders]
        elif t == "Slice":
            ax = layer.axis
            off += sum(layer.sizes[:k]) * strides[ax]
            shape[ax] = layer.sizes[k]
        new = list(top.shape)       # Reshape / Flatten (and a check of the others)
        if new != shape:
            strides = _reshaped(shape, strides, new)
            if strides is None:
                return None
            shape = new
    return off, shape, strides, alpha


def _matrix(shape, strides):
    """(transposed, leading dimension) of the last two axes of a view as a
    GEMM operand, or None where neither its rows nor its columns are
    contiguous."""
    rows, cols = shape[-2:]
    sr, sc = strides[-2:]
    if cols == 1 or sc == 1:
        return False, sr if rows > 1 else max(cols, 1)
    if rows == 1 or sr == 1:
        return True, sc
    return None


def _one_stride(sizes, strides):
    """The stride of axes that move as one index (0 for none), or None."""
    items = [(d, s) for d, s in zip(sizes, strides) if d != 1]
    if any(s0 != s1 * d1 for (_, s0), (d1, s1) in zip(items, items[1:])):
        return None
    return items[-1][1] if items else 0


def _batch_split(lead, views):
    """(batch, groups, [((batch stride, group stride)) per view]) for leading
    axes ``lead`` that every view's strides split into two runs alike, or
    None."""
    for q in range(len(lead) + 1):
        out = []
        for st in views:
            o, i = _one_stride(lead[:q], st[:q]), _one_stride(lead[q:], st[q:])
            if o is None or i is None:
                break
            out.append((o, i))
        else:
            nb = 1
            for d in lead[:q]:
                nb *= d
            ng = 1
            for d in lead[q:]:
                ng *= d
            return nb, ng, out
    return None


# ---- the groups ------------------------------------------------------------

class _ForeignPending(PendingTops):
    """PendingTops whose pending layers may read blobs another group left
    pending (a Reshape of a skipped Slice's top): those are computed
    first, by their own group."""

    def _compute(self):
        self._compute_bottoms()
        super()._compute()

    def _run_own_forwards(self):
        self._compute_bottoms()
        super()._run_own_forwards()

    def _compute_bottoms(self):
        g = self.net.graph
        mine = set(self.layers)
        for li in self.layers:
            for b in g.bottoms[li]:
                if b.compute_on_read is not None and b.compute_on_read is not self._reader \
                        and not any(b is t for lj in mine for t in g.tops[lj]):
                    b.compute_pending()


class PendingViews(_ForeignPending):
    """Skipped view layers that no MatMul's group holds: nothing runs; their
    tops are computed when read."""
    traceable = True
    fuses_backward = False
    loses_values = False

    def __init__(self, net, lis):
        self.net = net
        self.layers = list(lis)
        self.first, self.last = self.layers[0], self.layers[-1]
        self._init_pending([t for lj in self.layers for t in net.graph.tops[lj]], self.layers)

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[i] for i in self.layers) + " (views read by MatMul GEMMs)"

    def run(self):
        self._reshape_members()
        self._mark_pending()


class MatMulOperands(_ForeignPending):
    """Layers ``layers`` (skipped views, the MatMul, maybe the Permute after
    it) run as the MatMul's one GEMM on the operands' sources."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False      # the pending blobs are computed before a backward

    def __init__(self, net, lis, chains, mm):
        g = net.graph
        self.net = net
        self.layers = list(lis)
        self.first, self.last = self.layers[0], self.layers[-1]
        self.mm = mm                # the MatMul (the last layer, or the Permute after it)
        self.chains = chains        # per bottom: (source blob, [(layer, top index)] to it)
        self.sources = [src for src, _ in chains]
        lo = min([lj for _, steps in chains for lj, _ in steps] + [self.first])
        if lo < self.first:
            self.forward_from = lo
        self._init_pending([t for lj in self.layers[:-1] for t in g.tops[lj]],
                           self.layers[:-1])
        self._key = None
        self.fwd = None
        plan = self._plan()
        self.fits = plan is not None      # one GEMM at the shapes the plan was built at
        self.alpha = plan["alpha"] if plan else 1.0
        self.trans = (plan["ta"], plan["tb"]) if plan else (False, False)

    def describe(self):
        names = self.net.graph.layer_names
        merged = ", heads merged" if self.last != self.mm else ""
        return (" -> ".join(names[i] for i in self.layers)
                + f" (one GEMM, factor {self.alpha:g}, transposes {self.trans}{merged})")

    def _plan(self):
        """The GEMM's arguments at the current shapes, or None."""
        g, net = self.net.graph, self.net
        views = [_view(net, src, steps) for src, steps in self.chains]
        if None in views:
            return None
        (oa, sa, ta_st, fa), (ob, sb, tb_st, fb) = views
        mats = [_matrix(sa, ta_st), _matrix(sb, tb_st)]
        if None in mats:
            return None
        (ta, lda), (tb, ldb) = mats
        prod = g.tops[self.mm][0]
        shape_c = list(prod.shape)
        if self.last == self.mm:
            st_c = _contiguous(shape_c)
        else:       # the Permute's top, contiguous: each product axis where it goes
            orders = list(net.layers[self.last].orders)
            top_st = _contiguous(g.tops[self.last][0].shape)
            st_c = [top_st[orders.index(i)] for i in range(len(shape_c))]
        if st_c[-1] != 1 and shape_c[-1] != 1:
            return None
        lead = shape_c[:-2]
        if sa[:-2] != lead or sb[:-2] != lead:
            return None
        split = _batch_split(lead, [ta_st[:-2], tb_st[:-2], st_c[:-2]])
        if split is None:
            return None
        nb, ng, ((a0, a1), (b0, b1), (c0, c1)) = split
        if ng == 1:             # one level: the batch strides
            a0, b0, c0 = a1 or a0, b1 or b0, c1 or c0
            nb, ng = nb * ng, 1
        return dict(off_a=oa, off_b=ob, lda=lda, ldb=ldb, ta=ta, tb=tb, alpha=fa * fb,
                    ldc=st_c[-2] if shape_c[-2] > 1 else max(shape_c[-1], 1),
                    batch=nb, groups=ng, stride_a=(a0, a1), stride_b=(b0, b1),
                    stride_c=(c0, c1))

    def _launch(self):
        g = self.net.graph
        mm = self.net.layers[self.mm]
        top = g.tops[self.last][0]
        M, N, K = mm.M, mm.N, mm.K
        if not top.count or not K:
            return None
        p = self._plan()
        if p is None:
            return False
        a, b = self.sources
        return gemm_ops.gemm(mm.device, M, N, K, a.data_buffer(), b.data_buffer(),
                             top.data_buffer(), trans_a=p["ta"], trans_b=p["tb"],
                             alpha=p["alpha"], off_a=p["off_a"], off_b=p["off_b"],
                             lda=p["lda"], ldb=p["ldb"], ldc=p["ldc"], batch=p["batch"],
                             groups=p["groups"], stride_a=p["stride_a"],
                             stride_b=p["stride_b"], stride_c=p["stride_c"], tiles="auto")

    def run(self):
        g, net = self.net.graph, self.net
        self._reshape_members()
        blobs = list(self.sources) + [g.tops[lj][k] for _, steps in self.chains
                                      for lj, k in steps] + [g.tops[self.last][0]]
        key = tuple((tuple(b.shape), b.data_buffer()) for b in blobs)
        if key != self._key:
            self.fwd = self._launch()
            self._key = key
        if self.fwd is False:       # the views do not fit a GEMM at these shapes
            self._run_own_forwards()
            return
        for b in self.sources:
            b.data_mem.to_device()
        top = g.tops[self.last][0]
        if self.fwd is not None:
            self.fwd.run(net.layers[self.last].device.queue)
        top.data_mem.device_written()
        self._mark_pending()


# ---- finding them ----------------------------------------------------------

def _walk(net, b, stop, readers, outputs, writers):
    """[(layer, top index)] from the operand blob ``b`` back over view
    layers (nearest first), crossing none in ``stop``."""
    g = net.graph
    steps = []
    while True:
        made = writers.get(id(b), ())
        if len(made) != 1 or b.name in outputs:
            return steps
        lj = made[0]
        t, bots, tops = g.layer_types[lj], g.bottoms[lj], g.tops[lj]
        if lj in stop or t not in VIEWS or len(bots) != 1 \
                or any(x is bots[0] for x in tops) \
                or (t == "Power" and _scale(net.layers[lj]) is None):
            return steps
        steps.append((lj, next(k for k, x in enumerate(tops) if x is b)))
        b = bots[0]


def _heads_merge(net, mm, readers, outputs, taken):
    """The index of a Permute right after MatMul ``mm`` that alone reads
    its product and keeps the last axis last, or None."""
    g = net.graph
    pi = mm + 1
    if pi >= len(g.layers) or pi in taken or g.layer_types[pi] != "Permute":
        return None
    top = g.tops[mm][0]
    bots, tops = g.bottoms[pi], g.tops[pi]
    if len(bots) != 1 or bots[0] is not top or len(tops) != 1 or tops[0] is top \
            or top.name in outputs or len(readers.get(id(top), ())) != 1:
        return None
    n = top.num_axes
    orders = list(net.layers[pi].orders)
    if n < 3 or orders[-1] != n - 1 or orders == list(range(n)):
        return None
    return pi


def find(net, taken=()):
    """[MatMulOperands and PendingViews] of ``net`` (TEST plan), none with a
    layer in ``taken``."""
    if not config.get("FUSE_MATMUL_OPERANDS"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    readers = readers_of(g)
    writers = {}
    for lj, tops in enumerate(g.tops):
        for t in tops:
            writers.setdefault(id(t), []).append(lj)
    mms = [mm for mm, t in enumerate(g.layer_types)
           if t == "MatMul" and mm not in taken and len(g.bottoms[mm]) == 2]
    stop = set(taken)
    while True:
        walks = {mm: [_walk(net, b, stop, readers, outputs, writers) for b in g.bottoms[mm]]
                 for mm in mms}
        skipped = {lj for w in walks.values() for steps in w for lj, _ in steps}
        crossing = {}           # MatMul -> ids of the bottoms it reads through skipped views
        for mm, w in walks.items():
            crossing[mm] = {id(b) for b, steps in zip(g.bottoms[mm], w) if steps}
        bad = set()
        for lj in skipped:
            for t in g.tops[lj]:
                if t.name in outputs or any(r not in skipped and id(t) not in crossing.get(r, ())
                                            for r in readers.get(id(t), ())):
                    bad.add(lj)
        if bad:
            stop |= bad
            continue
        out, owned = [], set()
        for mm, w in walks.items():
            merge = _heads_merge(net, mm, readers, outputs, taken)
            if merge in skipped:    # another MatMul reads the product through it
                merge = None
            if not any(w) and merge is None:
                continue
            chains = [(g.bottoms[mm][k] if not steps else g.bottoms[steps[-1][0]][0],
                       steps[::-1]) for k, steps in enumerate(w)]
            lo = mm
            while lo - 1 in skipped and lo - 1 not in owned:
                lo -= 1
            group = MatMulOperands(net, list(range(lo, (merge or mm) + 1)), chains, mm)
            if not group.fits:
                # not one GEMM at these shapes: its views run as layers
                bad |= {lj for _, steps in chains for lj, _ in steps} or {mm}
                break
            owned.update(group.layers)
            out.append(group)
        if not bad:
            break
        stop |= bad
        mms = [mm for mm in mms if mm not in bad]
    # skipped views no MatMul's group holds: each run of them a group
    rest = sorted(skipped - owned)
    run = []
    for lj in rest + [None]:
        if run and (lj is None or lj != run[-1] + 1):
            out.append(PendingViews(net, run))
            run = []
        if lj is not None:
            run.append(lj)
    return out
