"""TEST-phase memory rewrite: growing Concats in one buffer.

A dense block concatenates every feature so far in each layer, in one of
two forms:

- torchvision's, as ONNX exports it: ``cat_j = Concat(x0, x1, .., x_j)``,
  the first ``j`` inputs being the inputs of ``cat_j-1`` (concat.py's
  ``_prefix_sources``);
- Caffe's own DenseNet prototxts: ``cat_j = Concat(cat_j-1, x_j)``.

Either way ``cat_j``'s first floats are ``cat_j-1`` when the Concat runs
along images (axis 0), or along channels (axis 1) of one image: each
top is the start of the next. So the tops of such a chain share one
device buffer (``SyncedMemory.share_buffer``), the last top's size, and
each Concat writes only its new inputs after its predecessor's floats
(concat.ConcatInPlace with ``chain``); a convolution that writes its
output into its slice of the top (concat.py's slice targets, now also
through the Split that hands ``x_j`` to every later Concat) leaves the
Concat nothing to copy. torchvision's DenseNet-121 at batch 1 on the CPU:
58 copy launches a forward to 9 (each block's first Concat copies the
block's input; Winograd layers wrote whole blobs then), Concat tops 40.7 MB
to 5.8.

Every blob still reads Caffe's value. The chain holds while its tops are
written only by its own Concats and the convolutions writing into them,
at a layout where each top is the start of the next; anything else
*dissolves* it first (``dissolve``: each top gets its own buffer with its
current contents, the layers binding them rebuild their launches, the
Concats copy as before): an upload of a top's host copy (a write, or a
read through pycaffe's ``.data``, which may write) or a zero fill, a
Concat whose predecessor no longer holds what it would put in place (a
write to an input from the host, a forward range after a change), a
reshape to more than one image along channels or beyond the buffer
(``check``), a forward range that stops inside the chain (its Concats
then run as layers: ``forward_through`` is the chain's last Concat),
``net.unfold()``. A dissolved chain stays so.

A chain found in a net built at shapes it cannot share at (more than one
image along channels: a deploy prototxt's ``input_dim: 10``) shares
after a whole pass at one image (``ran``: every member ran in the pass
that the first one started, so the last top's floats hold every
member's value); its new inputs are copied, not written in place (a
blob left to be computed from a slice would read another layout's floats
after a reshape without a forward). Off with ``CAFFE_OCL_CONCAT_SHARE=0``.
"""
from ..blob import AT_DEVICE, LAYOUT, SYNCED, UNINITIALIZED
from .patterns import concat_axis


class ConcatChain:
    """The Concat groups ``members`` (concat.ConcatInPlace, in layer
    order), each top the start of the next's; ``links`` (concat.py
    ``_chain_links``): {layer: (earlier layer, prefix, whole)}."""

    def __init__(self, net, members, links):
        self.net, self.members = net, list(members)
        self.alive = False
        # not shared yet (built at shapes it cannot share at): ``ran``
        # shares the buffer after a pass at one image; False once shared
        self.pending = True
        self._mems = []             # the memories sharing the buffer
        self._pass = 0              # the head member's runs (``ran``)
        last = self.members[-1].ci
        for j, c in enumerate(self.members):
            c.chain = self
            c.chain_prev = self.members[j - 1] if j else None
            c.chain_prefix, c.chain_whole = (links[c.ci][1], links[c.ci][2]) if j else (0, False)
            c.forward_through = last
            for t in c.targets.values():
                t.member = c
                t.unit.forward_through = last

    def describe(self):
        g = self.net.graph
        return f"{', '.join(g.layer_names[c.ci] for c in self.members)} in one buffer"

    @staticmethod
    def can_share(net, chain, links):
        """Whether the Concats at layers ``chain`` (``links`` as in
        ``__init__``) can share a buffer now, before their groups exist:
        their tops distinct memories holding nothing yet, each top the start
        of the next at the current shapes."""
        g = net.graph
        tops = [g.tops[ci][0] for ci in chain]
        return _unshared([t.data_mem for t in tops], (UNINITIALIZED,)) and all(
            _starts_next(tops[j], concat_axis(net.layers[ci], g.bottoms[ci][0]),
                         tops[j - 1] if j else None, g.bottoms[ci][:links[ci][1] if j else 0])
            for j, ci in enumerate(chain))

    def attach(self):
        """Share one buffer among the members' top memories, if none holds
        anything on the device yet (a net's plan is built before its first
        forward) and the shapes have each top at the start of the next."""
        mems = [c.top.data_mem for c in self.members]
        if not (_unshared(mems, (UNINITIALIZED,)) and all(map(self._layout_ok, self.members))):
            return False
        buf = mems[-1].device.alloc(4 * max(m.capacity for m in mems))
        for m in mems:
            m.share_buffer(buf, self)
        self._shared(mems)
        return True

    def ran(self, c):
        """Member ``c`` ran its group while the chain is not shared yet:
        after the last member, where every member ran in this pass (the
        head's last run) at a layout where each top starts the next and
        holds its value on the device, the last top's contents hold every
        member's value: they go to one buffer and the members share it."""
        if c is self.members[0]:
            self._pass += 1
        c.chain_pass = self._pass
        if c is not self.members[-1]:
            return
        whole = all(m.chain_pass == self._pass for m in self.members)
        for m in self.members:          # a pass counts once: the next must run them all again
            m.chain_pass = None
        mems = [m.top.data_mem for m in self.members]
        if not (whole and _unshared(mems, (AT_DEVICE,)) and all(map(self._layout_ok, self.members))):
            return
        last = mems[-1]
        last.adopt_buffer(last.device.alloc(4 * max(m.capacity for m in mems)))
        for m in mems:
            m.share_buffer(last.buffer(), self, holding=True)
        self._shared(mems)

    def _shared(self, mems):
        self._mems, self.alive, self.pending = mems, True, False
        self._rebind_users(mems)

    @staticmethod
    def _layout_ok(c):
        """Whether member ``c``'s top starts with its predecessor's."""
        prev = c.chain_prev
        return _starts_next(c.top, c.axis, prev.top if prev is not None else None,
                            c.bottoms[:c.chain_prefix])

    def check(self, c):
        """Before a write into member ``c``'s top: whether the chain still
        holds, dissolved first when ``c``'s top left the buffer (a reshape
        to more floats) or its shapes no longer have it start with its
        predecessor's. Asked of the member being written only: in a forward
        after a reshape the later members are not reshaped yet (each is
        asked at its own turn; the floats an earlier member writes are only
        later members' starts, and those run in the same pass: a range
        that stops inside the chain runs its Concats as layers)."""
        if not self.alive:
            return False
        if c.chain_epoch != LAYOUT.epoch:
            if c.top.data_mem.shared is not self or not self._layout_ok(c):
                self.dissolve()
                return False
            c.chain_epoch = LAYOUT.epoch
        return True

    def prefix_in_place(self, c):
        """Whether member ``c``'s first ``chain_prefix`` inputs are in its
        top already: its predecessor's top, written on the device, still
        holding the concatenation of those inputs."""
        prev = c.chain_prev
        if prev is None or not self.check(c):
            return False
        mem = prev.top.data_mem
        if mem.head not in (AT_DEVICE, SYNCED) or not prev.holds_top(c):
            self.dissolve()
            return False
        return True

    def dissolve(self, keep=None):
        """Every top on a buffer of its own (its current contents), the
        layers binding one rebuild their launches; for good. ``keep``: the
        memory that stays on the buffer (alone now): the one being uploaded
        or written by the step that asks, whose launches, built already,
        bind it."""
        if not self.alive:
            return
        self.alive = False
        moved = [m for m in self._mems if m is not keep]
        for m in moved:
            m.unshare()
        if keep is not None:
            keep.shared = None
        self._rebind_users(moved)

    def _rebind_users(self, mems):
        """The layers binding one of ``mems`` (a member's top, or a Split
        top of it) build
        their launches again when the net's walk next reaches them: its
        buffer changed, its shape did not. (Not now: a dissolve in the
        middle of a reshaped forward finds later layers' bottoms not yet
        reshaped.) The groups' own launches are keyed on the buffers or
        on their layers' reshape counts."""
        g = self.net.graph
        ids = {id(m) for m in mems}
        for li, layer in enumerate(self.net.layers):
            if any(id(b.data_mem) in ids for b in list(g.bottoms[li]) + list(g.tops[li])):
                layer.rebuild_at_next_reshape()


def _unshared(mems, heads):
    """Distinct memories, none shared yet, each in one of ``heads``."""
    return len({id(m) for m in mems}) == len(mems) and \
        all(m.shared is None and m.head in heads for m in mems)


def _starts_next(top, axis, prev_top, prefix):
    """Whether the 4-D ``top`` of a Concat along ``axis`` starts with
    ``prev_top`` (None: the chain's first) float for float: along images,
    or along channels of one image, its first inputs ``prefix`` being as
    many floats as ``prev_top``."""
    if top.num_axes != 4 or (axis == 1 and top.shape[0] != 1):
        return False
    return prev_top is None or prev_top.count == sum(b.count for b in prefix)
