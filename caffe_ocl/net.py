"""Net: builds the layer graph from a NetParameter, as Caffe's Net::Init.

Order of work (the same as Caffe, so logs can be compared line by line):
filter layers by NetState (phase, level, stages) -> insert Split layers
where a blob feeds several layers -> create each layer, wire its bottoms
and tops (same name = in place), set it up, register its parameters
(shared by ``param { name }``) -> decide which layers need backward ->
the blobs nobody consumes are the outputs.

pycaffe's Python face (``blobs``, ``params``, ``forward(**inputs)``, ...)
is on this class directly.
"""
import logging
import os
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from . import hdf5_weights
from .device import host_memory_budget
from .blob import Blob, refresh_kept
from .errors import (ArgumentError, ArgumentValueError, ArrayShapeError, LabelError,
                     NetError, OutOfHostMemory, ShapeError, UnknownLayerError, naming)
from .layers.base import create_layer
from .plan import execution
from .plan import memory as memory_plan
from .plan import trace
from .proto import caffe_pb2, read_net, read_net_prototxt, upgrade_net
from .proto import blobproto_to_array, write_binary
from .ops import pointwise
from .ops import winograd as wino_ops
from .pycaffe_net import (NetPycaffeMixin, BEFORE_FORWARD, AFTER_FORWARD,
                          BEFORE_BACKWARD, AFTER_BACKWARD, item_counts, names_arg)

log = logging.getLogger("caffe_ocl")

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


# --------------------------------------------------------------------------
# NetState filtering (Caffe's Net::FilterNet / StateMeetsRule)
# --------------------------------------------------------------------------

def state_meets_rule(state, rule):
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def filter_net(param):
    """Copy of ``param`` without the layers its state excludes."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for lp in param.layer:
        if len(lp.include) and len(lp.exclude):
            raise NetError(f"layer {lp.name!r} specifies both include and exclude; "
                           "give only one")
        if len(lp.include):
            keep = any(state_meets_rule(param.state, r) for r in lp.include)
        else:
            keep = not any(state_meets_rule(param.state, r) for r in lp.exclude)
        if keep:
            out.layer.add().CopyFrom(lp)
    return out


# --------------------------------------------------------------------------
# Split insertion (Caffe's insert_splits.cpp), same names as Caffe
# --------------------------------------------------------------------------

def split_layer_name(layer, blob, idx):
    return f"{blob}_{layer}_{idx}_split"


def split_blob_name(layer, blob, idx, k):
    return f"{blob}_{layer}_{idx}_split_{k}"


def insert_splits(param):
    last_top = {}                    # blob name -> (layer index, top index)
    source_of = {}                   # (layer, bottom index) -> (layer, top index)
    consumers = {}                   # (layer, top index) -> count
    loss_w = {}
    for i, lp in enumerate(param.layer):
        for j, name in enumerate(lp.bottom):
            if name not in last_top:
                raise NetError(f"layer {lp.name!r}: unknown bottom blob {name!r} "
                               f"(bottom index {j}); no earlier layer produces it")
            src = last_top[name]
            source_of[(i, j)] = src
            consumers[src] = consumers.get(src, 0) + 1
        for j, name in enumerate(lp.top):
            last_top[name] = (i, j)
        for j, w in enumerate(lp.loss_weight):
            loss_w[(i, j)] = w
            if w:
                consumers[(i, j)] = consumers.get((i, j), 0) + 1
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split = {}
    for i, lp in enumerate(param.layer):
        nl = out.layer.add()
        nl.CopyFrom(lp)
        for j in range(len(nl.bottom)):
            src = source_of[(i, j)]
            if consumers.get(src, 0) > 1:
                k = next_split.get(src, 0)
                next_split[src] = k + 1
                nl.bottom[j] = split_blob_name(param.layer[src[0]].name, nl.bottom[j], src[1], k)
        for j, name in enumerate(nl.top):
            count = consumers.get((i, j), 0)
            if count > 1:
                sp = out.layer.add()
                sp.name = split_layer_name(lp.name, name, j)
                sp.type = "Split"
                sp.bottom.append(name)
                w = loss_w.get((i, j), 0.0)
                for k in range(count):
                    sp.top.append(split_blob_name(lp.name, name, j, k))
                    if w:
                        sp.loss_weight.append(w if k == 0 else 0.0)
                if w:
                    del nl.loss_weight[:]
                    next_split[(i, j)] = next_split.get((i, j), 0) + 1
    return out


# --------------------------------------------------------------------------
# The public, read-only graph (what Caffe's net.hpp exposes)
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class NetGraph:
    """A Net's layer graph, read-only, as Caffe's ``net.hpp`` exposes it.

    Every per-layer field is a tuple indexed by layer index (the order of
    ``net.layers``, Split layers included); blobs are the Net's ``Blob``
    objects (in place: the same object as a bottom and a top). Setting an
    attribute raises ``FrozenInstanceError`` (an ``AttributeError``); the
    sequences are tuples and the mappings read-only views. The planning
    passes (caffe_ocl/plan/) read the net only through this object.
    """
    name: str
    phase: int                    # caffe_pb2.TRAIN or caffe_pb2.TEST
    param: object                 # the filtered NetParameter, Splits inserted
    layers: tuple                 # layer objects
    layer_names: tuple
    layer_types: tuple
    bottoms: tuple                # per layer: tuple of bottom Blobs (bottom_vecs)
    tops: tuple                   # per layer: tuple of top Blobs (top_vecs)
    layer_need_backward: tuple    # per layer: bool
    bottom_need_backward: tuple   # per layer: tuple of bool, one per bottom
    blob_need_backward: object    # blob name -> bool (read-only mapping)
    loss_weights: tuple           # per layer: tuple of float, one per top
    blobs: object                 # blob name -> Blob, in creation order (read-only)
    inputs: tuple                 # names of the Input layers' tops
    outputs: tuple                # names of the blobs no layer consumes (sorted)
    params: tuple                 # every layer's param blobs (shared ones repeated)
    param_layer: tuple            # per entry of params: (layer index, param index)
    param_owners: tuple           # per entry of params: index of its owner, -1 = own
    learnable_params: tuple       # the owners' blobs: what a solver updates
    params_lr: tuple              # per learnable param: lr_mult
    params_weight_decay: tuple    # per learnable param: decay_mult
    layer_learnable_ids: tuple    # per layer: tuple of learnable_params indices

    @property
    def bottom_names(self):
        return tuple(tuple(b.name for b in bots) for bots in self.bottoms)

    @property
    def top_names(self):
        return tuple(tuple(t.name for t in tops) for tops in self.tops)

    @property
    def blob_loss_weights(self):
        """blob name -> its loss weight (0 for blobs that are no loss)."""
        w = {n: 0.0 for n in self.blobs}
        for tops, lws in zip(self.tops, self.loss_weights):
            for t, lw in zip(tops, lws):
                if lw:
                    w[t.name] = lw
        return MappingProxyType(w)

    def __len__(self):
        return len(self.layers)

    def layer_index(self, name):
        """Index of the layer called ``name`` (NetError if there is none)."""
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise NetError(f"no layer named {name!r} in net {self.name!r}") from None


# --------------------------------------------------------------------------
# Net
# --------------------------------------------------------------------------

_PATH_TYPES = (str, bytes, os.PathLike)
_INT32 = (-2**31, 2**31 - 1)


def _phase_word(arg):
    """True for the strings "TEST"/"TRAIN" (any case) naming no file: a
    phase written as a word, which was taken as a weights path."""
    if isinstance(arg, bytes):
        arg = os.fsdecode(arg)
    return (isinstance(arg, str) and arg.upper() in ("TEST", "TRAIN")
            and not os.path.exists(arg))


def _check_phase(phase):
    """``phase`` as caffe.TRAIN or caffe.TEST; ArgumentError for another type
    (pycaffe's binding refuses it), ArgumentValueError for another number
    (protobuf's "invalid enumerator" ValueError before)."""
    if isinstance(phase, (str, bytes)):
        raise ArgumentError(f"phase must be caffe.TEST or caffe.TRAIN, got the string "
                            f"{phase!r} (write caffe.{str(phase).upper()} without quotes)"
                            if _phase_word(phase) else
                            f"phase must be caffe.TEST or caffe.TRAIN, got the string {phase!r}")
    if isinstance(phase, (bool, np.bool_)) or not isinstance(phase, (int, np.integer)):
        raise ArgumentError(f"phase must be caffe.TEST or caffe.TRAIN, got "
                            f"{type(phase).__name__}")
    if phase not in (TRAIN, TEST):
        raise ArgumentValueError(f"phase must be caffe.TEST ({TEST}) or caffe.TRAIN "
                                 f"({TRAIN}), got {int(phase)}")
    return int(phase)


def _check_int32(value, what):
    """``value`` as an int of C++'s int range (a NetState field)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{what} must be an int, got {type(value).__name__}")
    if not _INT32[0] <= value <= _INT32[1]:
        raise ArgumentValueError(f"{what} must fit a 32-bit int, got {int(value)}")
    return int(value)


def _check_stages(stages):
    """``stages`` as a list of stage names (a lone string was taken letter
    by letter, an int failed in protobuf)."""
    if stages is None:
        return []
    if isinstance(stages, (str, bytes)):
        raise ArgumentError(f"stages must be a list of stage names, got the string "
                            f"{stages!r} (write stages=[{stages!r}])")
    try:
        stages = list(stages)
    except TypeError:
        raise ArgumentError(f"stages must be a list of stage names, got "
                            f"{type(stages).__name__}") from None
    for st in stages:
        if not isinstance(st, str):
            raise ArgumentError(f"stages must be a list of stage names (strings), got "
                                f"{type(st).__name__} {st!r} in it")
    return stages


def _path_arg(path, what):
    """``path`` (str, bytes or os.PathLike) as a str; ArgumentError naming
    ``what`` for anything else (os.fspath's TypeError named nothing)."""
    if not isinstance(path, _PATH_TYPES):
        raise ArgumentError(f"{what} must be a file path (str or os.PathLike), got "
                            f"{type(path).__name__}")
    return os.fsdecode(path)


def _shape_str(shape):
    return " ".join(str(s) for s in shape) + f" ({int(np.prod(shape)) if shape else 1})"


class Net(NetPycaffeMixin):
    """A Caffe network. pycaffe's spellings all work:

    ``Net(prototxt, phase)``, ``Net(prototxt, phase, weights=w)``,
    ``Net(prototxt, weights, phase)``, ``Net(net_parameter, phase)``.
    Keyword options: ``level``, ``stages``, ``fold`` (folding of BatchNorm/
    Scale/activations into the preceding Convolution/InnerProduct: None =
    at TEST unless force_backward, False = never, True = always;
    ``CAFFE_OCL_FOLD=0`` turns it off; see caffe_ocl/plan/fold.py), ``share_diffs``
    (activation diffs share buffers by liveness in backward, as a Solver's
    net does: intermediate blob diffs are then not meaningful after backward;
    default False = Caffe's one diff per blob; see caffe_ocl/plan/memory.py).

    ``net.graph`` is the read-only layer graph (``NetGraph``); ``net.plan``
    the execution plan built from it (caffe_ocl/plan/execution.py)."""

    def __init__(self, network=None, *args, phase=None, weights=None, level=0, stages=(),
                 fold=None, share_diffs=False, network_file=None):
        if network is None:             # pycaffe's Net(network_file=..., phase=...)
            network = network_file
        args = list(args)
        if len(args) == 2 or (args and isinstance(args[0], _PATH_TYPES)
                              and not _phase_word(args[0])):
            weights = args.pop(0)
        if args:
            phase = args.pop(0)
        if args:
            raise TypeError("Net(network, [weights,] phase)")
        # the arguments are checked before the net is built: a wrong one
        # failed deep inside (os.fspath, protobuf) naming none of them
        phase = TEST if phase is None else _check_phase(phase)
        level = _check_int32(level, "level")
        stages = _check_stages(stages)
        if weights is not None and not isinstance(weights, caffe_pb2.NetParameter):
            weights = _path_arg(weights, "weights")
        if isinstance(network, caffe_pb2.NetParameter):
            param = caffe_pb2.NetParameter()
            param.CopyFrom(network)
            param = upgrade_net(param, "<NetParameter>")
            self.source = "<NetParameter>"
        else:
            self.source = _path_arg(network, "network")
            param = read_net_prototxt(self.source)
        param.state.phase = phase
        param.state.level = level
        for s in stages:
            param.state.stage.append(s)
        self.phase = phase
        self.fold = fold
        self.memory_plan = None         # diff sharing (plan/memory.py), set_share_diffs
        self._input_arrays = None       # set_input_arrays keeps them alive
        with naming(self.source) if self.source != "<NetParameter>" else nullcontext():
            self._init(param)
        # a layer that carries blobs (a caffemodel-style NetParameter or text
        # file) starts from them, as Caffe's Layer constructor (FromProto)
        carried = [lp for lp in self.param.layer if len(lp.blobs)]
        if carried:
            self._copy_layers(carried, self.source, warn=False)
        if weights is not None:
            self.copy_from(weights)
        # the planning stage: passes over self.graph -> the steps forward and
        # backward run (caffe_ocl/plan/execution.py)
        with self._forward_builds():
            self.plan = execution.build(self, fold)
        self._tracer = trace.ForwardTracer(self) if trace.ForwardTracer.enabled(self) else None
        if share_diffs:
            self.set_share_diffs(True)

    # ---- construction ---------------------------------------------------
    def _init(self, in_param):
        param = filter_net(in_param)
        log.info("Initializing net from parameters: %s (phase %s)", param.name or self.source,
                 "TRAIN" if param.state.phase == TRAIN else "TEST")
        param = insert_splits(param)
        self.param = param
        self.name = param.name
        self.layers = []
        self._layer_names = []
        self.blobs = OrderedDict()
        self._bottom_vecs, self._top_vecs = [], []
        self._bottom_need_backward = []
        self._layer_need_backward = []
        self._blob_need_backward = {}
        self._input_names = []
        self._learnable = []          # owner param blobs, in order
        self._param_specs = []        # (lr_mult, decay_mult) per learnable
        self._param_owner = []        # per net param: owner index or -1
        self._net_params = []
        self._param_names = {}
        self._param_layer = []
        self._layer_learnable = []    # per layer: indices into _learnable
        available = OrderedDict()
        memory = 0
        for li, lp in enumerate(param.layer):
            if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
                raise NetError(f"layer {lp.name!r}: propagate_down must be given once per "
                               f"bottom ({len(lp.bottom)}), got {len(lp.propagate_down)}")
            log.info("Creating Layer %s", lp.name)
            with naming(f"layer {lp.name!r} ({lp.type})", f"{lp.name!r}"):
                layer = create_layer(lp, param.state.phase)
            self.layers.append(layer)
            self._layer_names.append(lp.name)
            bottoms, need_bwd = [], False
            bneed = []
            for bi, bname in enumerate(lp.bottom):
                if bname not in available:
                    raise NetError(f"layer {lp.name!r}: unknown bottom blob {bname!r} "
                                   f"(bottom index {bi})")
                blob = self.blobs[bname]
                log.info("%s <- %s", lp.name, bname)
                nb = self._blob_need_backward[bname]
                if len(lp.propagate_down):
                    nb = nb and lp.propagate_down[bi]
                bneed.append(nb)
                need_bwd |= nb
                bottoms.append(blob)
                del available[bname]
            tops = []
            for ti, tname in enumerate(lp.top):
                if ti < len(lp.bottom) and lp.bottom[ti] == tname:
                    log.info("%s -> %s (in-place)", lp.name, tname)
                    blob = self.blobs[tname]
                elif tname in self.blobs:
                    raise NetError(f"layer {lp.name!r}: top blob {tname!r} is produced "
                                   "by multiple sources")
                else:
                    log.info("%s -> %s", lp.name, tname)
                    blob = Blob((), name=tname, device=layer.device)
                    self.blobs[tname] = blob
                    self._blob_need_backward[tname] = False
                if lp.type == "Input":
                    self._input_names.append(tname)
                available[tname] = True
                tops.append(blob)
            layer.propagate_down = list(bneed)
            bn = memory_plan.bn_for_scale(self.layers, self._top_vecs, li, bottoms, tops)
            if bn is not None:
                layer.use_input_copy(bn)
            with naming(f"layer {lp.name!r} ({lp.type})", f"{lp.name!r}"):
                layer.setup(bottoms, tops)
            log.info("Setting up %s", lp.name)
            for ti, t in enumerate(tops):
                log.info("Top shape: %s", _shape_str(t.shape))
                if layer.loss_weights[ti]:
                    log.info("    with loss weight %g", layer.loss_weights[ti])
                memory += t.count
            specs = list(lp.param)
            for pi in range(len(layer.blobs)):
                spec = specs[pi] if pi < len(specs) else caffe_pb2.ParamSpec()
                pneed = spec.lr_mult != 0
                layer.param_propagate_down[pi] = pneed
                need_bwd |= pneed
            self._layer_learnable.append([])
            for pi in range(len(layer.blobs)):
                self._append_param(li, layer, lp, pi)
            self._bottom_vecs.append(bottoms)
            self._top_vecs.append(tops)
            self._bottom_need_backward.append(bneed)
            self._layer_need_backward.append(need_bwd)
            if need_bwd:
                for t in lp.top:
                    self._blob_need_backward[t] = True
        log.info("Memory required for data: %d", memory * 4)
        self._backward_pass(param)
        self._output_names = sorted(available)   # Caffe keeps them in a std::set
        for o in self._output_names:
            log.info("This network produces output %s", o)
        self._share_weights()
        for li, (layer, bn) in enumerate(zip(self.layers, self._bottom_need_backward)):
            seen = (layer.propagate_down, layer.need_backward)
            layer.propagate_down = list(bn)
            layer.need_backward = bool(self._layer_need_backward[li])
            if (layer.forward_reads_propagate_down
                    and seen != (layer.propagate_down, layer.need_backward)):
                # its forward plan was built for the needs before the backward
                # pass pruned them (or force_backward added them)
                layer.rebind(self._bottom_vecs[li], self._top_vecs[li])
        self.graph = self._make_graph()
        log.info("Network initialization done.")

    def _make_graph(self):
        return NetGraph(
            name=self.name, phase=self.phase, param=self.param,
            layers=tuple(self.layers), layer_names=tuple(self._layer_names),
            layer_types=tuple(layer.type for layer in self.layers),
            bottoms=tuple(tuple(b) for b in self._bottom_vecs),
            tops=tuple(tuple(t) for t in self._top_vecs),
            layer_need_backward=tuple(bool(x) for x in self._layer_need_backward),
            bottom_need_backward=tuple(tuple(bool(x) for x in b)
                                       for b in self._bottom_need_backward),
            blob_need_backward=MappingProxyType(dict(self._blob_need_backward)),
            loss_weights=tuple(tuple(float(w) for w in layer.loss_weights)
                               for layer in self.layers),
            blobs=MappingProxyType(self.blobs),
            inputs=tuple(self._input_names), outputs=tuple(self._output_names),
            params=tuple(self._net_params), param_layer=tuple(self._param_layer),
            param_owners=tuple(self._param_owner),
            learnable_params=tuple(self._learnable),
            params_lr=tuple(s["lr"] for s in self._param_specs),
            params_weight_decay=tuple(s["decay"] for s in self._param_specs),
            layer_learnable_ids=tuple(tuple(ids) for ids in self._layer_learnable))

    def _append_param(self, li, layer, lp, pi):
        specs = list(lp.param)
        spec = specs[pi] if pi < len(specs) else caffe_pb2.ParamSpec()
        name = spec.name if pi < len(specs) else ""
        net_id = len(self._net_params)
        self._net_params.append(layer.blobs[pi])
        self._param_layer.append((li, pi))
        if not name or name not in self._param_names:
            self._param_owner.append(-1)
            if name:
                self._param_names[name] = net_id
            self._learnable.append(layer.blobs[pi])
            self._param_specs.append(dict(lr=spec.lr_mult, decay=spec.decay_mult,
                                          has_lr=spec.HasField("lr_mult"),
                                          has_decay=spec.HasField("decay_mult")))
            self._layer_learnable[li].append(len(self._learnable) - 1)
            return
        owner_id = self._param_names[name]
        self._param_owner.append(owner_id)
        oli, opi = self._param_layer[owner_id]
        owner_blob = self.layers[oli].blobs[opi]
        this_blob = layer.blobs[pi]
        permissive = spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE
        if permissive and owner_blob.count != this_blob.count:
            raise ShapeError(f"cannot share param {name!r} owned by layer "
                             f"{self._layer_names[oli]!r} with layer {lp.name!r}; count "
                             f"mismatch: owner {owner_blob.count}, sharer {this_blob.count}")
        if not permissive and owner_blob.shape != this_blob.shape:
            raise ShapeError(f"cannot share param {name!r} owned by layer "
                             f"{self._layer_names[oli]!r} with layer {lp.name!r}; shape "
                             f"mismatch: owner {owner_blob.shape}, sharer {this_blob.shape}")
        lid = self._learnable.index(self._net_params[self._owner_root(owner_id)])
        s = self._param_specs[lid]
        for key, has in (("lr", "has_lr"), ("decay", "has_decay")):
            field = "lr_mult" if key == "lr" else "decay_mult"
            if spec.HasField(field):
                if s[has] and s[key] != getattr(spec, field):
                    raise NetError(f"shared param {name!r} has mismatched {field} "
                                   f"(layer {lp.name!r})")
                s[key], s[has] = getattr(spec, field), True
        self._layer_learnable[li].append(lid)

    def _owner_root(self, net_id):
        while self._param_owner[net_id] != -1:
            net_id = self._param_owner[net_id]
        return net_id

    def _share_weights(self):
        rebind = set()
        for net_id, owner in enumerate(self._param_owner):
            if owner == -1:
                continue
            li, pi = self._param_layer[net_id]
            blob = self._net_params[net_id]
            src = self._net_params[self._owner_root(net_id)]
            blob.share_data(src)
            blob.share_diff(src)
            rebind.add(li)
        for li in sorted(rebind):   # launch plans were bound to the old buffers
            self.layers[li].rebind(self._bottom_vecs[li], self._top_vecs[li])

    def _backward_pass(self, param):
        under_loss, skip = set(), set()
        for li in reversed(range(len(self.layers))):
            layer, lp = self.layers[li], param.layer[li]
            contributes, skip_prop = False, True
            for ti, tname in enumerate(lp.top):
                if layer.loss_weights[ti] or tname in under_loss:
                    contributes = True
                if tname not in skip:
                    skip_prop = False
            if self._layer_need_backward[li] and skip_prop:
                self._layer_need_backward[li] = False
                self._bottom_need_backward[li] = [False] * len(lp.bottom)
            if not contributes:
                self._layer_need_backward[li] = False
            log.info("%s %s backward computation.", lp.name,
                     "needs" if self._layer_need_backward[li] else "does not need")
            for bi, bname in enumerate(lp.bottom):
                if contributes:
                    under_loss.add(bname)
                else:
                    self._bottom_need_backward[li][bi] = False
                if not self._bottom_need_backward[li][bi]:
                    skip.add(bname)
        if param.force_backward:
            for li, layer in enumerate(self.layers):
                self._layer_need_backward[li] = True
                for bi in range(len(self._bottom_need_backward[li])):
                    allow = layer.allow_force_backward
                    if callable(allow):
                        allow = allow(bi)
                    self._bottom_need_backward[li][bi] |= bool(allow) and layer.has_backward
                for pi in range(len(layer.blobs)):
                    layer.param_propagate_down[pi] = True

    # ---- pycaffe properties ----------------------------------------------
    @property
    def params(self):
        return OrderedDict((n, l.blobs) for n, l in zip(self._layer_names, self.layers)
                           if len(l.blobs) > 0)

    @property
    def layer_dict(self):
        return OrderedDict(zip(self._layer_names, self.layers))

    @property
    def inputs(self):
        return list(self._input_names)

    @property
    def outputs(self):
        return list(self._output_names)

    @property
    def top_names(self):
        return OrderedDict((n, [b.name for b in t])
                           for n, t in zip(self._layer_names, self._top_vecs))

    @property
    def bottom_names(self):
        return OrderedDict((n, [b.name for b in b_])
                           for n, b_ in zip(self._layer_names, self._bottom_vecs))

    @property
    def learnable_params(self):
        return list(self._learnable)

    @property
    def device(self):
        return self.layers[0].device if self.layers else None

    def _layer_index(self, name, what):
        try:
            return self._layer_names.index(name)
        except ValueError:
            # a ValueError too: pycaffe's list.index raised one
            raise UnknownLayerError(f"{what}: no layer named {name!r} in net "
                                    f"{self.name!r}") from None

    # ---- memory plan -----------------------------------------------------
    def set_share_diffs(self, on=True):
        """Share activation diff buffers by liveness in backward (on) or give
        every blob its own diff again (off). With sharing, the diffs of
        intermediate blobs are not meaningful after backward; parameter
        diffs, net inputs/outputs and loss tops keep their own. Ignored (off)
        when the net's debug_info is set."""
        if on and self.param.debug_info:
            log.info("debug_info is set: activation diffs are not shared")
            on = False
        if on and self.memory_plan is None:
            self.memory_plan = memory_plan.DiffPlan(self)
        elif not on and self.memory_plan is not None:
            memory_plan.remove_diff_plan(self)
            self.memory_plan = None

    # ---- running ---------------------------------------------------------
    def _forward_builds(self):
        """The context the plan's groups build their launches in (at the
        plan's build, or lazily at their first run): a TRAIN net's, for the
        Winograd tile of its forwards (ops/winograd.py train_forwards;
        layers enter it themselves, Layer.builds)."""
        return wino_ops.train_forwards(self.phase == TRAIN)

    def reshape(self):
        for li, layer in enumerate(self.layers):
            layer.reshape_if_needed(self._bottom_vecs[li], self._top_vecs[li])
        if self.memory_plan is not None:
            self.memory_plan.refresh()
        refresh_kept()

    def unfold(self):
        """Turn the TEST folding off: every layer runs on its own again (so
        that backward can run); the training fusions stay."""
        self.plan = self.plan.without_folding()

    def forward_from_to(self, start, end):
        """Caffe's ForwardFromTo: run layers ``start``..``end`` (indices) as
        the execution plan says; no inputs set, nothing read back. A TEST
        net replays a recorded pass where nothing it depends on changed
        (plan/trace.py)."""
        if self._tracer is not None:
            reshaped = self._tracer.forward(start, end, self._forward_step)
        else:
            reshaped = False
            with self._forward_builds():
                for li, action in self.plan.forward_schedule(start, end):
                    reshaped |= self._forward_step(li, action)
        if reshaped and self.memory_plan is not None:
            self.memory_plan.refresh()      # shapes changed: plan the diffs again

    def _forward_step(self, li, action):
        """One step of forward_schedule: layer ``li``'s own forward, a fused
        group at its first layer, or nothing (SKIP); True if the layer
        reshaped."""
        layer = self.layers[li]
        bottoms, tops = self._bottom_vecs[li], self._top_vecs[li]
        hooks = self._net_hooks         # pycaffe's before_/after_forward (pycaffe_net.py)
        if hooks is not None:
            hooks.run(BEFORE_FORWARD, li)
        reshaped = layer.reshape_if_needed(bottoms, tops)
        if action is execution.LAYER:
            layer.forward(bottoms, tops)
        elif action is not execution.SKIP:
            action.run()                # a fused group, at its first layer
        if hooks is not None:
            hooks.run(AFTER_FORWARD, li)
        return reshaped

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.forward: set inputs from kwargs, run, return
        {output name: host array}."""
        blobs = names_arg(blobs, "blobs")
        start_i = 0 if start is None else self._layer_index(start, "forward(start=)")
        if end is not None:
            end_i = self._layer_index(end, "forward(end=)")
            outputs = set(self.top_names[end] + blobs)
        else:
            end_i = len(self.layers) - 1
            outputs = set(self.outputs + blobs)
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise NetError(f"input blob arguments {sorted(kwargs)} do not match "
                               f"net inputs {self.inputs}")
            for name, arr in kwargs.items():
                arr = np.asarray(arr)
                b = self.blobs[name]
                if arr.ndim == 0 or (b.shape and arr.shape[0] != b.shape[0]):
                    raise ArrayShapeError(f"input {name!r} is not batch sized: got "
                                     f"{arr.shape}, blob is {b.shape}")
                _put(b.data, arr, f"input {name!r}", b.shape)
        self.forward_from_to(start_i, end_i)
        self.check_labels()
        refresh_kept()
        return {o: self.blobs[o].data for o in outputs}

    # ---- out-of-range labels (layers/loss.py LabelCheck) -------------------
    def _label_checks(self):
        checks = self.__dict__.get("_label_check_list")
        if checks is None:       # the layers are fixed once the net is built
            checks = [(li, layer.label_check) for li, layer in enumerate(self.layers)
                      if getattr(layer, "label_check", None) is not None]
            self._label_check_list = checks
        return checks

    def mark_label_passes(self, describe):
        """The forward passes from now on are ``describe(k)`` (k = 0, 1, ...;
        e.g. "iteration 12") in a LabelError's message."""
        for _, chk in self._label_checks():
            chk.mark(describe)

    def label_passes(self):
        """Forward passes run by the first label-checked layer (None: none)."""
        checks = self._label_checks()
        return checks[0][1].passes if checks else None

    def check_labels(self):
        """Raise LabelError for the first label outside its layer's range
        seen since the last check (reads a few ints from the device, so
        call it where the host waits for the device anyway)."""
        first = None
        for li, chk in self._label_checks():       # every record read (and cleared)
            pred, label = self._bottom_vecs[li][:2]
            msg = chk.report(self._blob_origin(label), self._blob_origin(pred))
            if msg and first is None:
                first = msg + self._label_source(label, chk.last_item)
        if first is not None:
            raise LabelError(first)

    def _producer(self, blob):
        for li, tops in enumerate(self._top_vecs):
            if any(t is blob for t in tops):
                layer = self.layers[li]
                if layer.type == "Split" and self._bottom_vecs[li]:
                    return self._producer(self._bottom_vecs[li][0])
                return layer
        return None

    def _blob_origin(self, blob):
        """The blob's name (for a Split's copy, the name of the blob it copies)."""
        for li, tops in enumerate(self._top_vecs):
            if self.layers[li].type == "Split" and any(t is blob for t in tops):
                return self._blob_origin(self._bottom_vecs[li][0])
        return blob.name

    def _label_source(self, blob, item=None):
        """Where the labels come from: the data layer, its source and, when
        it still holds the batch, the record of example ``item``."""
        layer = self._producer(blob) if blob is not None else None
        if layer is None:
            return ""
        lp = layer.param
        src = ""
        for field in ("data_param", "image_data_param", "hdf5_data_param",
                      "window_data_param"):
            if lp.HasField(field) and getattr(lp, field).source:
                src = f", source {getattr(lp, field).source!r}"
                break
        served = getattr(layer, "served_record", None)
        rec = served(item) if served is not None and item is not None else None
        rec = f"; that example is {rec}" if rec else ""
        return f" (the labels come from layer {layer.name!r} ({layer.type}){src}{rec})"

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.backward: set output diffs from kwargs, run backward,
        return {input name (and ``diffs``): host diff array}."""
        self.plan.check_backward()
        diffs = names_arg(diffs, "diffs")
        start_i = len(self.layers) - 1 if start is None else \
            self._layer_index(start, "backward(start=)")
        if end is not None:
            end_i = self._layer_index(end, "backward(end=)")
            outputs = set(self.bottom_names[end] + diffs)
        else:
            end_i = 0
            outputs = set(self.inputs + diffs)
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise NetError(f"top diff arguments {sorted(kwargs)} do not match net "
                               f"outputs {self.outputs}")
            for name, arr in kwargs.items():
                arr = np.asarray(arr)
                b = self.blobs[name]
                # a 0-d blob (a loss) has no batch axis: its diff is a scalar
                if b.shape and (arr.ndim == 0 or arr.shape[0] != b.shape[0]):
                    raise ArrayShapeError(f"diff {name!r} is not batch sized: got "
                                     f"{arr.shape}, blob is {b.shape}")
                _put(b.diff, arr, f"diff {name!r}", b.shape)
        self.backward_from_to(start_i, end_i)
        refresh_kept()
        return {o: self.blobs[o].diff for o in outputs}

    def backward_from_to(self, start, end, after_layer=None):
        """Caffe's BackwardFromTo: backward of layers start, start-1, ...,
        end (indices) as the execution plan says; ``after_layer(li)`` (the
        solver's data-parallel hooks) once each layer's is enqueued."""
        if self._tracer is not None:
            self._tracer.settle()       # backward reads the blobs' own memories
        layers, bvecs, tvecs = self.layers, self._bottom_vecs, self._top_vecs
        need = self._bottom_need_backward
        hooks = self._net_hooks         # pycaffe's before_/after_backward (pycaffe_net.py)
        for li, action in self.plan.backward_schedule(start, end):
            if hooks is not None:
                hooks.run(BEFORE_BACKWARD, li)
            if action is execution.LAYER:
                layers[li].backward(tvecs[li], need[li], bvecs[li])
            elif action is not execution.SKIP:
                action.backward()           # a fused group, at its last layer
            if after_layer is not None:
                after_layer(li)
            if hooks is not None:
                hooks.run(AFTER_BACKWARD, li)

    def forward_all(self, blobs=None, **kwargs):
        """Run in batches over all of ``kwargs``' arrays; concatenated outputs."""
        blobs = names_arg(blobs, "blobs")
        all_outs = {o: [] for o in set(self.outputs + blobs)}
        if not kwargs:
            out = self.forward(blobs=blobs)
            return {k: v.copy() for k, v in out.items()}
        n = self._forward_all_items(kwargs, all_outs)
        bs = self.blobs[self.inputs[0]].shape[0]
        if n == 0:
            # pycaffe: empty arrays of the outputs' item shape (concatenate
            # of no batches raised)
            return {k: np.zeros((0,) + tuple(self.blobs[k].shape[1:]), np.float32)
                    for k in all_outs}
        for i in range(0, n, bs):
            batch = {}
            for name, arr in kwargs.items():
                chunk = np.asarray(arr[i:i + bs])
                if len(chunk) < bs:     # pad the last batch, as pycaffe does
                    pad = np.zeros((bs - len(chunk),) + chunk.shape[1:], chunk.dtype)
                    chunk = np.concatenate([chunk, pad])
                batch[name] = chunk
            out = self.forward(blobs=blobs, **batch)
            for k, v in out.items():
                all_outs[k].append(v.copy())
        return {k: np.concatenate(v)[:n] for k, v in all_outs.items()}

    def _forward_all_items(self, kwargs, outs):
        """The number of items forward_all's ``kwargs`` hold; ArgumentError
        for a value that holds no items (None, a number: len() failed on
        it), OutOfHostMemory when the outputs for them would not fit host
        memory (a 2^31-row view ran batch after batch without end)."""
        n = next(iter(item_counts(kwargs, "forward_all: input ").values()))
        item_bytes = sum(4 * int(np.prod(self.blobs[k].shape[1:], dtype=np.int64))
                         for k in outs if k in self.blobs)
        need = n * item_bytes
        if need > host_memory_budget():
            raise OutOfHostMemory(f"forward_all: the outputs for {n} items would take "
                                  f"{need / 2**30:.1f} GiB, more than host memory allows "
                                  "(physical memory, or CAFFE_OCL_HOST_MEMORY_LIMIT_MB)")
        return n

    def clear_param_diffs(self):
        for b in self._learnable:
            pointwise.fill(b.diff_mem.device, b.diff_buffer(), b.count, 0.0)
            b.diff_mem.device_written()
        refresh_kept()

    def set_input_arrays(self, data, labels):
        """pycaffe's ``Net.set_input_arrays(data, labels)``: feed the first layer,
        a MemoryData layer, with float32 C-contiguous ``data`` (N, C, H, W) and
        ``labels`` (N,) or (N, 1, 1, 1); N must be a multiple of its batch size.
        The arrays are kept by reference (as pycaffe does), not copied."""
        if not self.layers or self.layers[0].type != "MemoryData":
            raise NetError("set_input_arrays may only be called if the first layer is a "
                           "MemoryData layer")
        self._input_arrays = self.layers[0].set_input_arrays(data, labels)

    # ---- weights -----------------------------------------------------------
    def copy_from(self, path_or_param):
        """Load weights by layer name (Caffe's CopyTrainedLayersFrom)."""
        if isinstance(path_or_param, caffe_pb2.NetParameter):
            src, where = path_or_param, "<NetParameter>"
        else:
            where = _path_arg(path_or_param, "copy_from: weights")
            if hdf5_weights.is_hdf5(where):      # by content, as Caffe's *.h5 weights
                hdf5_weights.copy_from_hdf5(self.layers, where)
                return
            src = read_net(where, "weights file")
        self._copy_layers(list(src.layer), where)

    def _copy_layers(self, layers, where, warn=True):
        """Copy the blobs of ``layers`` (LayerParameters) into this net's
        layers of the same names; ``warn``: log the layers left untouched."""
        index = {n: i for i, n in enumerate(self._layer_names)}
        copied = set()
        for sl in layers:
            ti = index.get(sl.name)
            if ti is None:
                log.info("Ignoring source layer %s", sl.name)
                continue
            copied.add(ti)
            target = self.layers[ti].blobs
            if len(sl.blobs) != len(target):
                hint = ("; a BN layer with 4 blobs is PSPNet's/DeepLab's: give its bn_param "
                        "one of its fields (e.g. frozen: true)"
                        if self.layers[ti].type == "BN" and len(sl.blobs) == 4 else "")
                raise ShapeError(f"{where}: incompatible number of blobs for layer "
                                 f"{sl.name!r}: the file has {len(sl.blobs)}, the net "
                                 f"expects {len(target)}{hint}")
            log.info("Copying source layer %s", sl.name)
            for bi, (bp, tb) in enumerate(zip(sl.blobs, target)):
                arr = blobproto_to_array(bp, where=f"{where}: layer {sl.name!r} param {bi}")
                if not _shape_matches(arr.shape, tb.shape, _is_legacy(bp)):
                    raise ShapeError(
                        f"{where}: cannot copy param {bi} weights from layer {sl.name!r}; "
                        f"shape mismatch. Source param shape is {_shape_str(arr.shape)}; "
                        f"target param shape is {_shape_str(tb.shape)}. To learn this "
                        "layer's parameters from scratch rather than copying from a "
                        "saved net, rename the layer.")
                tb.data[...] = arr.reshape(tb.shape)
        if warn:
            warn_untouched(self, copied, where)
        refresh_kept()

    def share_trained_layers_with(self, source):
        """Net::ShareTrainedLayersWith: this net's params, by layer name, use
        ``source``'s data storage (launch plans are rebound); a solver's test
        nets and pycaffe's ``share_with`` call it."""
        index = {n: i for i, n in enumerate(self.graph.layer_names)}
        for name, slayer in zip(source.graph.layer_names, source.layers):
            ti = index.get(name)
            if ti is None or not slayer.blobs:
                continue
            tlayer = self.layers[ti]
            if len(tlayer.blobs) != len(slayer.blobs):
                raise ShapeError(f"cannot share weights of layer {name!r}: the source net has "
                                 f"{len(slayer.blobs)} param blobs, the target net "
                                 f"{len(tlayer.blobs)}")
            changed = False
            for j, (sb, tb) in enumerate(zip(slayer.blobs, tlayer.blobs)):
                if sb.shape != tb.shape:
                    raise ShapeError(f"cannot share param {j} weights from layer {name!r}; shape "
                                     f"mismatch. Source param shape is {sb.shape}; target "
                                     f"param shape is {tb.shape}")
                if tb.data_mem is not sb.data_mem:
                    tb.share_data(sb)
                    changed = True
            if changed:
                tlayer.rebind(self.graph.bottoms[ti], self.graph.tops[ti])

    def copy_trained_layers_from(self, path):
        self.copy_from(path)

    def load_hdf5(self, path):
        """pycaffe's Net.load_hdf5: weights from Caffe's HDF5 layout."""
        hdf5_weights.copy_from_hdf5(self.layers, path)

    def save_hdf5(self, path, write_diff=False):
        """pycaffe's Net.save_hdf5: /data/<layer>/<i> datasets (Net::ToHDF5)."""
        hdf5_weights.save_hdf5(self.layers, path, write_diff)

    def to_proto(self, write_diff=False):
        """NetParameter with every layer's parameters and blobs (Net::ToProto)."""
        out = caffe_pb2.NetParameter()
        out.name = self.param.name
        for layer in self.layers:
            lp = out.layer.add()
            lp.CopyFrom(layer.param)
            del lp.blobs[:]
            for b in layer.blobs:
                bp = lp.blobs.add()
                bp.shape.dim.extend(b.shape)
                bp.data.extend(b.host_data().ravel().tolist())
                if write_diff:
                    bp.diff.extend(b.host_diff().ravel().tolist())
        return out

    def save(self, path):
        """Write a .caffemodel (binary NetParameter), atomically."""
        write_binary(self.to_proto(), _path_arg(path, "save: path"))

    # loss of the last forward (reads the device: call when displaying)
    def loss(self):
        total = 0.0
        for li, layer in enumerate(self.layers):
            for ti, w in enumerate(layer.loss_weights):
                if w:
                    total += w * float(np.sum(self._top_vecs[li][ti].host_data()))
        return total


def warn_untouched(net, copied, where):
    """A warning naming the layers with learnable parameters that ``where``
    left as filled (a 0-byte caffemodel, or one whose layer names match
    nothing, used to run on random weights without a word)."""
    missed = [n for i, (n, layer) in enumerate(zip(net._layer_names, net.layers))
              if layer.blobs and i not in copied]
    if missed:
        log.warning("%s has no weights for layer%s %s: %s keep%s the values of %s filler%s",
                    where, "s" if len(missed) > 1 else "", ", ".join(missed),
                    "they" if len(missed) > 1 else "it", "" if len(missed) > 1 else "s",
                    "their" if len(missed) > 1 else "its", "s" if len(missed) > 1 else "")


def _is_legacy(bp):
    return not len(bp.shape.dim) and (bp.HasField("num") or bp.HasField("channels")
                                      or bp.HasField("height") or bp.HasField("width"))


def _shape_matches(src, dst, legacy):
    """Caffe's Blob::ShapeEquals: exact, or for legacy 4-D blobs the shapes
    padded to 4 axes with leading 1s (a V1 1x1xMxN weight fits an MxN
    InnerProduct)."""
    src, dst = tuple(src), tuple(dst)
    if src == dst:
        return True
    if len(src) == 4 and len(dst) <= 4 and (legacy or src[:2] == (1, 1)):
        return src == (1,) * (4 - len(dst)) + dst
    return False



def _put(dst, arr, what, shape):
    """``dst[...] = arr`` (a blob's host data or diff); errors that name
    ``what``: values that are not numbers (their conversion error was
    hidden behind a shape message) or a shape that does not broadcast."""
    if arr.dtype.kind in "OUSV":
        try:
            arr = arr.astype(np.float32)
        except (TypeError, ValueError) as e:
            raise ArgumentValueError(f"{what}: the values are not numbers ({e})") from None
    try:
        dst[...] = arr
    except ValueError:
        raise ArrayShapeError(f"{what}: cannot put an array of shape {arr.shape} into blob "
                         f"of shape {shape}") from None
