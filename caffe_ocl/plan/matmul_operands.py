"""TEST-phase rewrite: scalings and transposes of a MatMul's operands read
by its GEMM.

Attention exported by PyTorch scales the queries (and the keys) by a
constant and transposes the keys before ``Q K^T``; onnx2caffe writes a
``Power`` (scale only) per scaled operand and a ``Permute`` swapping the
last two axes, each a pass over its tensor and a launch (36 of
DeiT-Tiny's 237 launches a forward). The GEMM takes a factor and either
operand transposed at no cost.

A *group* here is a run of consecutive layers (``net.layers`` order)
ending at a ``MatMul`` layer, each of the others one of:

- ``Power`` with power 1 and shift 0 (``y = scale * x``),
- ``Permute`` whose order swaps the last two axes and keeps the others,

each on a chain from a blob made before the group to one of the MatMul's
two bottoms, its top read only by the next layer of its chain (nothing in
place, no net output). The MatMul then multiplies the chains' first
blobs, the scales' product as its factor, an operand transposed for each
odd number of Permutes on its chain. The group may also take, right after
the MatMul, a ``Permute`` moving the product's rows in front of its last
batch axis -- (..., H, M, N) -> (..., M, H, N), attention's heads merged
back before the output projection -- that alone reads the product: the
GEMM then writes each head's M x N block into its columns of the
Permute's top (a row stride of H x N). The blobs in between are computed
when read, by the layers' own forwards (plan/patterns.PendingTops).
Values: the same products, the factor applied to the sums instead of the
operands (float32 rounding). ``CAFFE_OCL_FOLD=0`` or
``CAFFE_OCL_FUSE_MATMUL_OPERANDS=0`` turn it off.
"""
from .. import config
from ..ops import gemm as gemm_ops
from .patterns import PendingTops, readers_of


def _scale(layer):
    """The factor of a Power layer that only scales, else None."""
    p = layer.param.power_param
    return float(p.scale) if p.power == 1.0 and p.shift == 0.0 else None


def _swaps_last_two(layer, bottom):
    """Whether a Permute layer swaps its bottom's last two axes only."""
    n = bottom.num_axes
    return n >= 2 and list(layer.orders) == list(range(n - 2)) + [n - 1, n - 2]


class MatMulOperands(PendingTops):
    """Layers ``layers`` (a group, see the module doc) run as the MatMul's
    one GEMM on the chains' first blobs."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False      # the pending blobs are computed before a backward

    def __init__(self, net, lis, sources, alpha, trans, mm):
        g = net.graph
        self.net = net
        self.layers = list(lis)
        self.first, self.last = self.layers[0], self.layers[-1]
        self.mm = mm                # the MatMul (the last layer, or the Permute after it)
        self.sources = sources      # [blob] the GEMM reads for bottom 0 and 1
        self.alpha = alpha
        self.trans = trans          # (trans_a, trans_b)
        self._init_pending([t for lj in self.layers[:-1] for t in g.tops[lj]],
                           self.layers[:-1])
        self._key = None
        self.fwd = None

    def describe(self):
        names = self.net.graph.layer_names
        merged = ", heads merged" if self.last != self.mm else ""
        return (" -> ".join(names[i] for i in self.layers)
                + f" (one GEMM, factor {self.alpha:g}, transposes {self.trans}{merged})")

    def _launch(self):
        g = self.net.graph
        mm = self.net.layers[self.mm]
        a, b = self.sources
        top = g.tops[self.last][0]
        M, N, K = mm.M, mm.N, mm.K
        if not top.count or not K:
            return None
        ta, tb = self.trans
        if self.last == self.mm:        # the product's own layout
            batch, heads, ldc, stride_c = mm.batch, 1, N, (M * N, 0)
        else:       # (..., H, M, N) written as (..., M, H, N): head h at column h * N
            heads = g.tops[self.mm][0].shape[-3]
            batch, ldc, stride_c = mm.batch // heads, heads * N, (M * heads * N, N)
        return gemm_ops.gemm(mm.device, M, N, K, a.data_buffer(), b.data_buffer(),
                             top.data_buffer(), trans_a=ta, trans_b=tb, alpha=self.alpha,
                             lda=M if ta else K, ldb=K if tb else N, ldc=ldc, batch=batch,
                             groups=heads, stride_a=(heads * M * K, M * K),
                             stride_b=(heads * K * N, K * N), stride_c=stride_c,
                             tiles="auto")

    def run(self):
        g, net = self.net.graph, self.net
        self._reshape_members()
        blobs = list(self.sources) + [g.tops[self.last][0]]
        key = tuple((tuple(b.shape), b.data_buffer()) for b in blobs)
        if key != self._key:
            self.fwd = self._launch()
            self._key = key
        for b in self.sources:
            b.data_mem.to_device()
        top = g.tops[self.last][0]
        if self.fwd is not None:
            self.fwd.run(net.layers[self.last].device.queue)
        top.data_mem.device_written()
        self._mark_pending()


def _operand(net, b, lo, hi, readers, outputs):
    """Walk back from blob ``b`` (a bottom of the MatMul at ``hi``) over
    scaling Powers and last-two-axes Permutes of index >= ``lo``:
    (source blob, factor, transposes, [layer indices])."""
    g = net.graph
    alpha, flips, lis = 1.0, 0, []
    while True:
        found = [lj for lj in range(lo, hi) if any(t is b for t in g.tops[lj])]
        if len(found) != 1:
            return b, alpha, flips, lis
        lj = found[0]
        layer, t = net.layers[lj], g.layer_types[lj]
        bots, tops = g.bottoms[lj], g.tops[lj]
        if len(bots) != 1 or len(tops) != 1 or bots[0] is tops[0] \
                or b.name in outputs or len(readers.get(id(b), ())) != 1:
            return b, alpha, flips, lis
        if t == "Power" and _scale(layer) is not None:
            alpha *= _scale(layer)
        elif t == "Permute" and _swaps_last_two(layer, bots[0]):
            flips += 1
        else:
            return b, alpha, flips, lis
        lis.append(lj)
        b = bots[0]


def _heads_merge(net, mm, readers, outputs, taken):
    """The index of a Permute right after MatMul ``mm`` that alone reads
    its product and swaps the product's rows with the batch axis before
    them ((..., H, M, N) -> (..., M, H, N)), or None."""
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
    if n < 3 or list(net.layers[pi].orders) != list(range(n - 3)) + [n - 2, n - 3, n - 1]:
        return None
    return pi


def find(net, taken=()):
    """[MatMulOperands] of ``net`` (TEST plan), none with a layer in ``taken``."""
    if not config.get("FUSE_MATMUL_OPERANDS"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    readers = readers_of(g)
    out = []
    for mm, t in enumerate(g.layer_types):
        if t != "MatMul" or mm in taken or len(g.bottoms[mm]) != 2:
            continue
        # the longest run of layers right before the MatMul that all lie
        # on its operands' chains
        lo = mm
        while lo > 0 and g.layer_types[lo - 1] in ("Power", "Permute") and lo - 1 not in taken:
            lo -= 1
        chains = [(b, 1.0, 0, []) for b in g.bottoms[mm]]      # the operands as they are
        while lo < mm:
            found = [_operand(net, b, lo, mm, readers, outputs) for b in g.bottoms[mm]]
            inside = sorted(lj for c in found for lj in c[3])
            if inside == list(range(lo, mm)):
                chains = found
                break
            lo += 1
        merge = _heads_merge(net, mm, readers, outputs, taken)
        if lo == mm and merge is None:
            continue
        (a, fa, pa, _), (b, fb, pb, _) = chains
        last = mm if merge is None else merge
        out.append(MatMulOperands(net, list(range(lo, last + 1)), [a, b], fa * fb,
                                  (pa % 2 == 1, pb % 2 == 1), mm))
    return out
