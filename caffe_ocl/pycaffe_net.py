"""pycaffe-only members of ``Net`` (BVLC's python/caffe/_caffe.cpp and
pycaffe.py): the underscore views of the C++ Net (``_blobs``,
``_blob_names``, ``_inputs``, ``_outputs``, ``_bottom_ids``/``_top_ids``,
``_blob_loss_weights``, ``_forward``/``_backward``), ``share_with``, the
per-layer hooks ``before_forward``/``after_forward``/``before_backward``/
``after_backward`` (Net::Callback, called with the layer index), and the
pycaffe.py helpers ``blob_loss_weights``, ``_batch`` and
``forward_backward_all``.

``Net`` inherits ``NetPycaffeMixin``; the mixin only reads the net's own
structure (``layers``, ``blobs``, ``_bottom_vecs``/``_top_vecs``) and
runs it through ``forward_from_to``/``backward_from_to``, which call the hooks.
"""
from collections import OrderedDict
from collections.abc import Mapping, Set
from itertools import zip_longest

import numpy as np

from .blob import refresh_kept
from .errors import ArgumentError, NetError, ShapeError
from .plan import execution

BEFORE_FORWARD, AFTER_FORWARD, BEFORE_BACKWARD, AFTER_BACKWARD = range(4)


class NetHooks:
    """Per-layer callbacks of one net (C++ Net's before_forward_ ...
    vectors). A hook is a callable taking the layer index, or an object
    with ``run(layer)`` (a C++ Net::Callback such as caffe.NCCL)."""
    __slots__ = ("lists",)

    def __init__(self):
        self.lists = ([], [], [], [])

    def add(self, which, hook):
        fn = hook if callable(hook) else getattr(hook, "run", None)
        if not callable(fn):
            raise NetError(f"a net hook must be callable with the layer index or have "
                           f"a run(layer) method, got {type(hook).__name__}")
        self.lists[which].append(fn)

    def run(self, which, layer):
        for fn in self.lists[which]:
            fn(layer)


class NetPycaffeMixin:
    """pycaffe's members of Net that the C++ class does not have as such."""

    _net_hooks = None          # NetHooks once a hook is added

    # ---- hooks (Net_before_forward ... in _caffe.cpp) -------------------
    def _add_hook(self, which, hook):
        if self._net_hooks is None:
            self._net_hooks = NetHooks()
        self._net_hooks.add(which, hook)

    def before_forward(self, hook):
        """``hook(layer_index)`` before each layer's forward."""
        self._add_hook(BEFORE_FORWARD, hook)

    def after_forward(self, hook):
        """``hook(layer_index)`` after each layer's forward was enqueued."""
        self._add_hook(AFTER_FORWARD, hook)

    def before_backward(self, hook):
        self._add_hook(BEFORE_BACKWARD, hook)

    def after_backward(self, hook):
        """``hook(layer_index)`` after each layer's backward, or a caffe.NCCL
        (layer-wise gradient reduction, as ``net.after_backward(nccl)``)."""
        self._add_hook(AFTER_BACKWARD, hook)

    # ---- underscore views of the C++ Net --------------------------------
    @property
    def _blobs(self):
        return list(self.blobs.values())

    @property
    def _blob_names(self):
        return list(self.blobs.keys())

    def _blob_index(self):
        return {name: i for i, name in enumerate(self.blobs)}

    @property
    def _inputs(self):
        idx = self._blob_index()
        return [idx[n] for n in self.inputs]

    @property
    def _outputs(self):
        idx = self._blob_index()
        return [idx[n] for n in self.outputs]

    def _bottom_ids(self, i):
        idx = self._blob_index()
        return [idx[b.name] for b in self._bottom_vecs[self._check_layer(i)]]

    def _top_ids(self, i):
        idx = self._blob_index()
        return [idx[b.name] for b in self._top_vecs[self._check_layer(i)]]

    def _check_layer(self, i):
        i = int(i)
        if not 0 <= i < len(self.layers):
            raise NetError(f"layer index {i} out of range: net {self.name!r} has "
                           f"{len(self.layers)} layers")
        return i

    @property
    def _blob_loss_weights(self):
        """Per blob (in ``_blobs`` order), the loss weight of the layer top it
        is (Net::blob_loss_weights; 0 for blobs that are no loss)."""
        w = dict.fromkeys(self.blobs, 0.0)
        for layer, tops in zip(self.layers, self._top_vecs):
            for t, lw in zip(tops, layer.loss_weights):
                if lw:
                    w[t.name] = float(lw)
        return [w[n] for n in self.blobs]

    @property
    def blob_loss_weights(self):
        """OrderedDict blob name -> loss weight (pycaffe's Net.blob_loss_weights)."""
        return OrderedDict(zip(self._blob_names, self._blob_loss_weights))

    # ---- MemoryData input (Net_SetInputArrays) -------------------------------
    def _set_input_arrays(self, data, labels):
        """_caffe.cpp's name for Net.set_input_arrays."""
        return self.set_input_arrays(data, labels)

    # ---- running by index (ForwardFromTo / BackwardFromTo) ------------------
    def _forward(self, start, end):
        """Forward of layers start..end (indices); the loss of those layers."""
        start, end = self._check_layer(start), self._check_layer(end)
        self.forward_from_to(start, end)
        loss = 0.0
        for li in range(start, end + 1):
            for t, w in zip(self._top_vecs[li], self.layers[li].loss_weights):
                if w:
                    loss += float(w) * float(np.sum(t.host_data(), dtype=np.float64))
        refresh_kept()
        return loss

    def _backward(self, start, end):
        """Backward of layers start, start-1, ..., end (indices)."""
        start, end = self._check_layer(start), self._check_layer(end)
        self.plan.check_backward()
        self.backward_from_to(start, end)
        refresh_kept()

    # ---- weights ----------------------------------------------------------------
    def share_with(self, other):
        """Net::ShareTrainedLayersWith: every layer of ``other`` with
        parameters lends its parameter data to this net's layer of the same
        name (shapes must agree); the diffs stay this net's own."""
        if not isinstance(other, NetPycaffeMixin):
            # pycaffe's binding refuses it; here it failed deep inside as an AttributeError
            raise ArgumentError(f"share_with takes a caffe.Net to share weights with, "
                                f"got {type(other).__name__}")
        self.share_trained_layers_with(other)
        # plans bound to the old parameter buffers (folded weights, training
        # fusions) are built again
        self.plan = execution.build(self, self.fold)
        refresh_kept()

    # ---- pycaffe.py helpers --------------------------------------------------------
    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """Forward and backward in batches over all of ``kwargs``' arrays
        (inputs for forward, output diffs for backward); returns
        (all outputs, all diffs), each {name: concatenated array}."""
        blobs, diffs = names_arg(blobs, "blobs"), names_arg(diffs, "diffs")
        unknown = sorted(set(kwargs) - set(self.inputs) - set(self.outputs))
        if unknown:
            raise NetError(f"forward_backward_all: {unknown} are neither inputs "
                           f"{self.inputs} nor outputs {self.outputs} of net {self.name!r}")
        if not kwargs:
            raise NetError("forward_backward_all needs input arrays (net inputs "
                           f"{self.inputs}) or output diffs (net outputs {self.outputs}) "
                           "as keyword arguments")
        _check_lengths(kwargs)
        all_outs = {out: [] for out in set(self.outputs + blobs)}
        all_diffs = {d: [] for d in set(self.inputs + diffs)}
        forward_batches = self._batch({i: kwargs[i] for i in self.inputs if i in kwargs})
        backward_batches = self._batch({o: kwargs[o] for o in self.outputs if o in kwargs})
        # pycaffe's izip_longest: inputs without output diffs (or diffs
        # without inputs) still run both passes; zip ran none
        for fb, bb in zip_longest(forward_batches, backward_batches, fillvalue={}):
            batch_blobs = self.forward(blobs=blobs, **fb)
            batch_diffs = self.backward(diffs=diffs, **bb)
            for out, out_blobs in batch_blobs.items():
                if out_blobs.ndim == 0:     # list.extend failed on it with a TypeError
                    raise ShapeError(f"forward_backward_all: output {out!r} is a scalar "
                                     "(a loss), not one value per item; run forward() "
                                     "and backward() per batch to read it")
                all_outs[out].extend(out_blobs.copy())
            for d, d_blobs in batch_diffs.items():
                all_diffs[d].extend(d_blobs.copy())
        # each on its own: pycaffe zipped outputs with diffs, which left
        # lists where the net has more inputs than outputs
        all_outs = {k: np.asarray(v) for k, v in all_outs.items()}
        all_diffs = {k: np.asarray(v) for k, v in all_diffs.items()}
        # discard padding at the end
        pad = len(next(iter(all_outs.values()))) - len(next(iter(kwargs.values())))
        if pad:
            all_outs = {k: v[:-pad] for k, v in all_outs.items()}
            all_diffs = {k: v[:-pad] for k, v in all_diffs.items()}
        return all_outs, all_diffs

    def _batch(self, blobs):
        """Batches of ``blobs`` ({name: list/array}) of the net's batch size;
        the last one padded with zeros (pycaffe's _Net_batch)."""
        _check_lengths(blobs)
        num = len(next(iter(blobs.values()))) if blobs else 0
        batch_size = next(iter(self.blobs.values())).shape[0]
        remainder = num % batch_size
        num_batches = num // batch_size
        for b in range(num_batches):
            i = b * batch_size
            yield {name: blobs[name][i:i + batch_size] for name in blobs}
        if remainder > 0:
            padded_batch = {}
            for name in blobs:
                padding = np.zeros((batch_size - remainder,) + np.asarray(blobs[name]).shape[1:])
                padded_batch[name] = np.concatenate([blobs[name][-remainder:], padding])
            yield padded_batch


def names_arg(names, what):
    """``blobs=``/``diffs=`` as a list of blob names; a lone string was
    taken letter by letter (pycaffe fails on list + str). Net.forward,
    backward and forward_all (net.py) check theirs with it too."""
    if names is None:
        return []
    if isinstance(names, (str, bytes)):
        raise ArgumentError(f"{what} must be a list of blob names, got the string "
                            f"{names!r} (write {what}=[{names!r}])")
    return list(names)


def item_counts(arrays, what=""):
    """{name: number of items} of keyword arrays to be batched
    (forward_all, forward_backward_all); ArgumentError, prefixed by
    ``what``, for a value that holds no items: None or a number (len()
    failed on it), a string, a mapping or set, a 0-d array. Checked without
    converting a list to an array (np.ndim would copy every input)."""
    counts = {}
    for name, a in arrays.items():
        if not hasattr(a, "__len__") or isinstance(a, (str, bytes, Mapping, Set)) \
                or (isinstance(a, np.ndarray) and a.ndim == 0):
            raise ArgumentError(f"{what}{name!r} must be an array of items, got "
                                f"{type(a).__name__}")
        counts[name] = len(a)
    return counts


def _check_lengths(arrays):
    """Arrays batched together must hold as many items each: the others
    were cut or padded to the first one's length without a word."""
    lengths = item_counts(arrays)
    if len(set(lengths.values())) > 1:
        raise ShapeError(f"arrays batched together must have the same length (first "
                         f"dimension), got {lengths}")
