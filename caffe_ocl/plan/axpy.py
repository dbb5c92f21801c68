"""TEST-phase rewrite: SENet's Axpy -> ReLU as one pass.

hujie-frank/SENet's prototxts (SE-ResNet-50/101/152, SE-ResNeXt, SENet-154)
end every block with the fork's ``Axpy`` layer -- ``top = gate * x +
shortcut``, the SE gate broadcast over each plane -- and a ReLU in place on
its top: two passes over the block's output (the Axpy's write, the ReLU's
read and write) and two launches. Here the Axpy's kernel applies the
activation before its store (kernels/fork_vision.cl ``axpy_fwd`` ACT):
one pass, one launch, the same values (the activation of the same float).

What matches (``find``): an Axpy directly followed by a ReLU / ReLU6 /
Clip on its top, in place or writing a new top that alone reads the
Axpy's top (no net output: it is then computed when read, by the Axpy's
own forward). A forward range cutting the pair runs the layers one by
one; a backward after it computes the pending top first. A ReLU6 / Clip in
place gates its backward by a copy of its input that the fused pass does
not make: backward through that form is refused as through folded layers
(``loses_values``). Off with the folding (``CAFFE_OCL_FOLD=0``).
"""
from ..ops import fork_vision as fv
from .elide import PendingPair
from .patterns import consumers, inference_act_of, one_in_one_out

_ACTS = ("ReLU", "ReLU6", "Clip")


class AxpyAct(PendingPair):
    """Axpy -> activation run as the Axpy's kernel with the activation."""

    def __init__(self, net, ai, ri):
        super().__init__(net, ai, ri)
        self.act = inference_act_of(net.layers[ri])
        self.axpy = net.layers[ai]
        self.bottoms = net.graph.bottoms[ai]
        self.in_place = self.r is self.c
        self.loses_values = self.in_place and self.act[0] != "relu"

    def describe(self):
        return super().describe() + " (the activation in the Axpy's pass)"

    def run(self):
        self.reshape_second()
        axpy = self.axpy
        a, x, y = self.bottoms
        key = (axpy.reshape_count, self.r.data_buffer(),
               tuple(b.data_buffer() for b in self.bottoms))
        if key != self._key:
            self.fwd = fv.axpy_forward(axpy.device, axpy.planes, axpy.spatial, a.data_buffer(),
                                       x.data_buffer(), y.data_buffer(), self.r.data_buffer(),
                                       self.act) if x.count else []
            self._key = key
        for b in self.bottoms:
            b.data_mem.to_device()
        q = axpy.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.r.data_mem.device_written()
        if not self.in_place:
            self.c.compute_on_read = self._compute_c

    def run_member(self, li):
        if self.in_place:       # nothing pending: the layer alone, as Caffe runs it
            g = self.net.graph
            self.net.layers[li].forward(g.bottoms[li], g.tops[li])
            return
        super().run_member(li)

    def before_backward(self):
        if not self.in_place:
            super().before_backward()


def find(net, taken=()):
    """[AxpyAct] of ``net`` (TEST plan), none in ``taken``."""
    g = net.graph
    outputs = set(g.outputs)
    out = []
    for ai in range(len(g.layers) - 1):
        ri = ai + 1
        if ai in taken or ri in taken or g.layer_types[ai] != "Axpy" \
                or len(g.tops[ai]) != 1 or g.layer_types[ri] not in _ACTS \
                or not one_in_one_out(g, ri) or inference_act_of(g.layers[ri]) is None:
            continue
        c = g.tops[ai][0]
        if g.bottoms[ri][0] is not c or c in g.bottoms[ai]:
            continue
        if g.tops[ri][0] is not c and (c.name in outputs or consumers(g, c) != [(ri, 0)]):
            continue
        out.append(AxpyAct(net, ai, ri))
    return out
