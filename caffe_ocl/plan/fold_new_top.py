"""TEST-phase rewrite: BatchNorm / Scale / activation folded into the
producer when BatchNorm writes a new top.

Many published Caffe prototxts write BatchNorm's output to a new blob and
run Scale and the activation in place on that one (shicai/MobileNet-Caffe's
MobileNet v2: ``conv2_1/expand -> conv2_1/expand/bn``, Scale and ReLU in
place on ``conv2_1/expand/bn``), or each layer into a new top. fold.py
folds only chains in place on the producer's top, so these ran as the
convolution and then one BatchNorm -> Scale -> activation pass
(affine.py): two launches and a write and a read of the producer's output
more than a folded chain. Here the producer computes with the folded
weights (chain.Chain's fold, ``kernels/fold.cl``) and writes the chain's
last blob from its epilogue, activation included; the producer's own top
and the chain's blobs before its last are computed when read
(``Blob.compute_on_read``: the producer's and those layers' own forwards
run then), so every blob holds Caffe's value when read.

What matches (``find``): an affine.AffineActChain (its BatchNorm with
global statistics, its Scale per channel on axis 1) right after a
producer that fold.py could fold into (a 2-D Convolution or an
InnerProduct, one bottom and one top, channels on axis 1), whose top only
the BatchNorm reads and is no net output, BatchNorm's channels the
producer's outputs, and an activation the producer's epilogue applies;
neither in another group. A forward range cutting the group computes the
pending blobs first, then runs the layer alone; so does a backward, which
is refused where the AffineActChain's would be (a Scale in place).
``CAFFE_OCL_FOLD_NEW_TOPS=0`` leaves these chains to affine.py.
"""
from .. import config
from .chain import Chain, bn_ok, channel_axis_ok, foldable_producer
from .patterns import PendingTops, consumers, producer_fuses


class NewTopChain(PendingTops, Chain):
    """A producer and the BatchNorm -> Scale -> activation chain after it
    (writing new tops) folded as chain.Chain folds one in place, writing
    the chain's last blob."""

    def __init__(self, net, p, affine_chain):
        a = affine_chain
        scale = a.scale
        Chain.__init__(self, net, p, list(a.layers), a.bn, scale, a.act)
        self.affine_chain = a
        self.y = a.y
        self.c = net.graph.tops[p][0]
        # a Scale in place: its saved input is not made (affine.py)
        self.loses_values = a.loses_values
        self._init_pending([self.c] + a.pending, [p] + a.pending_layers)

    @property
    def out_blob(self):
        return self.y

    def describe(self):
        return Chain.describe(self) + " (BatchNorm's new top)"

    def run(self, plain=False):
        net, g = self.net, self.net.graph
        for li in self.members:         # the net's loop reshaped the producer only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        self._unmark_pending()
        Chain.run(self, plain)
        self._mark_pending()

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        if self.slice_target is not None:     # its value from the last forward first
            self.slice_target.blob.compute_pending()
        PendingTops.run_member(self, li)


def find(net, affine_chains, taken=()):
    """[NewTopChain] of the ``affine_chains`` (affine.AffineActChain) that
    a producer right before them can take, none in ``taken``; the caller
    drops the affine chains the groups took (``group.affine_chain``)."""
    if not config.get("FOLD_NEW_TOPS"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    out = []
    for a in affine_chains:
        p = a.first - 1
        if p < 0 or p in taken or not foldable_producer(net, p) \
                or not channel_axis_ok(net, p):
            continue
        prod, c = net.layers[p], g.tops[p][0]
        if c is not a.x or c is g.bottoms[p][0] or c.name in outputs \
                or consumers(g, c) != [(a.first, 0)]:
            continue
        if not bn_ok(a.bn, prod.num_output):
            continue
        if a.act is not None and not producer_fuses(prod, a.act):
            continue
        out.append(NewTopChain(net, p, a))
    return out
