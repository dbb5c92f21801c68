"""Bring old Caffe net and solver definitions up to the current format.

A Python port of the logic of BVLC Caffe's ``src/caffe/util/upgrade_proto.cpp``
(BSD-2-Clause, see caffe.proto for the notice).  ``upgrade_net`` runs the same
steps in the same order as Caffe's ``UpgradeNetAsNeeded``:

1. V0 -> V1 (``layers { layer { type: "conv" ... } }``), folding V0
   ``padding`` layers into the conv/pool layer that reads them;
2. V1 data-layer transformation fields (scale, mean_file, crop_size, mirror)
   -> ``transform_param``;
3. V1 -> current (``layers`` -> ``layer``, enum types -> type strings,
   ``blobs_lr``/``weight_decay`` -> ``param { lr_mult decay_mult }``, ...);
4. ``input``/``input_dim``/``input_shape`` -> an ``Input`` layer;
5. old BatchNorm definitions that declare three ``param`` specs lose them.

On top of Caffe's steps it rewrites each layer blob's legacy
num/channels/height/width into a 4-D ``shape``, as Caffe's
``Blob::FromProto`` does when it loads such a blob, so that later code only
ever has to look at ``shape``.

Both functions modify the message in place and also return it.  They log, on
the "caffe_ocl" logger, the lines Caffe logs for each upgrade.  A net that
cannot be upgraded (an unknown V0 or V1 layer type, both ``layer`` and
``layers`` given, a padding layer in front of something else than a conv or
pool layer) raises :class:`caffe_ocl.errors.ParseError` naming the file and
the layer.
"""

import logging

from ..errors import ParseError
from . import caffe_pb2 as pb

log = logging.getLogger("caffe_ocl")

__all__ = [
    "upgrade_net", "upgrade_solver", "upgrade_blob_shapes",
    "net_needs_upgrade", "net_needs_v0_to_v1_upgrade",
    "net_needs_v1_to_v2_upgrade", "net_needs_data_upgrade",
    "net_needs_input_upgrade", "net_needs_batchnorm_upgrade",
    "V0_LAYER_TYPES", "V1_LAYER_TYPES", "SOLVER_TYPES",
]

_V1 = pb.V1LayerParameter

# V0 type string -> V1 enum (UpgradeV0LayerType).
V0_LAYER_TYPES = {
    "accuracy": _V1.ACCURACY,
    "bnll": _V1.BNLL,
    "concat": _V1.CONCAT,
    "conv": _V1.CONVOLUTION,
    "data": _V1.DATA,
    "dropout": _V1.DROPOUT,
    "euclidean_loss": _V1.EUCLIDEAN_LOSS,
    "flatten": _V1.FLATTEN,
    "hdf5_data": _V1.HDF5_DATA,
    "hdf5_output": _V1.HDF5_OUTPUT,
    "im2col": _V1.IM2COL,
    "images": _V1.IMAGE_DATA,
    "infogain_loss": _V1.INFOGAIN_LOSS,
    "innerproduct": _V1.INNER_PRODUCT,
    "lrn": _V1.LRN,
    "multinomial_logistic_loss": _V1.MULTINOMIAL_LOGISTIC_LOSS,
    "pool": _V1.POOLING,
    "relu": _V1.RELU,
    "sigmoid": _V1.SIGMOID,
    "softmax": _V1.SOFTMAX,
    "softmax_loss": _V1.SOFTMAX_LOSS,
    "split": _V1.SPLIT,
    "tanh": _V1.TANH,
    "window_data": _V1.WINDOW_DATA,
}

# V1 enum -> current type string (UpgradeV1LayerType).
V1_LAYER_TYPES = {
    _V1.NONE: "",
    _V1.ABSVAL: "AbsVal",
    _V1.ACCURACY: "Accuracy",
    _V1.ARGMAX: "ArgMax",
    _V1.BNLL: "BNLL",
    _V1.CONCAT: "Concat",
    _V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
    _V1.CONVOLUTION: "Convolution",
    _V1.DECONVOLUTION: "Deconvolution",
    _V1.DATA: "Data",
    _V1.DROPOUT: "Dropout",
    _V1.DUMMY_DATA: "DummyData",
    _V1.EUCLIDEAN_LOSS: "EuclideanLoss",
    _V1.ELTWISE: "Eltwise",
    _V1.EXP: "Exp",
    _V1.FLATTEN: "Flatten",
    _V1.HDF5_DATA: "HDF5Data",
    _V1.HDF5_OUTPUT: "HDF5Output",
    _V1.HINGE_LOSS: "HingeLoss",
    _V1.IM2COL: "Im2col",
    _V1.IMAGE_DATA: "ImageData",
    _V1.INFOGAIN_LOSS: "InfogainLoss",
    _V1.INNER_PRODUCT: "InnerProduct",
    _V1.LRN: "LRN",
    _V1.MEMORY_DATA: "MemoryData",
    _V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss",
    _V1.MVN: "MVN",
    _V1.POOLING: "Pooling",
    _V1.POWER: "Power",
    _V1.RELU: "ReLU",
    _V1.SIGMOID: "Sigmoid",
    _V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss",
    _V1.SILENCE: "Silence",
    _V1.SOFTMAX: "Softmax",
    _V1.SOFTMAX_LOSS: "SoftmaxWithLoss",
    _V1.SPLIT: "Split",
    _V1.SLICE: "Slice",
    _V1.TANH: "TanH",
    _V1.WINDOW_DATA: "WindowData",
    _V1.THRESHOLD: "Threshold",
}

# The *_param sub-messages a V1 layer may carry; each is copied verbatim into
# the field of the same name of the current LayerParameter.
_V1_PARAM_FIELDS = (
    "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param",
    "convolution_param", "data_param", "dropout_param", "dummy_data_param",
    "eltwise_param", "exp_param", "hdf5_data_param", "hdf5_output_param",
    "hinge_loss_param", "image_data_param", "infogain_loss_param",
    "inner_product_param", "lrn_param", "memory_data_param", "mvn_param",
    "pooling_param", "power_param", "relu_param", "sigmoid_param",
    "softmax_param", "slice_param", "tanh_param", "threshold_param",
    "window_data_param", "transform_param", "loss_param",
)

SOLVER_TYPES = {
    pb.SolverParameter.SGD: "SGD",
    pb.SolverParameter.NESTEROV: "Nesterov",
    pb.SolverParameter.ADAGRAD: "AdaGrad",
    pb.SolverParameter.RMSPROP: "RMSProp",
    pb.SolverParameter.ADADELTA: "AdaDelta",
    pb.SolverParameter.ADAM: "Adam",
}


def _layer_label(index, name):
    return f"layer {index} ({name!r})" if name else f"layer {index}"


# --------------------------------------------------------------------------
# Which upgrades a net needs

def net_needs_v0_to_v1_upgrade(net):
    return any(l.HasField("layer") for l in net.layers)


def net_needs_v1_to_v2_upgrade(net):
    return len(net.layers) > 0


_DATA_V1_FIELDS = {
    _V1.DATA: "data_param",
    _V1.IMAGE_DATA: "image_data_param",
    _V1.WINDOW_DATA: "window_data_param",
}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def net_needs_data_upgrade(net):
    for l in net.layers:
        field = _DATA_V1_FIELDS.get(l.type)
        if field is None:
            continue
        sub = getattr(l, field)
        if any(sub.HasField(f) for f in _TRANSFORM_FIELDS):
            return True
    return False


def net_needs_input_upgrade(net):
    return len(net.input) > 0


def net_needs_batchnorm_upgrade(net):
    return any(l.type == "BatchNorm" and len(l.param) == 3 for l in net.layer)


def _blob_needs_shape(blob):
    return any(blob.HasField(f) for f in ("num", "channels", "height", "width"))


def _layer_blobs(net):
    for l in net.layer:
        yield from l.blobs
    for l in net.layers:
        yield from l.blobs
        if l.HasField("layer"):
            yield from l.layer.blobs


def net_needs_upgrade(net):
    return (net_needs_v0_to_v1_upgrade(net) or net_needs_v1_to_v2_upgrade(net)
            or net_needs_data_upgrade(net) or net_needs_input_upgrade(net)
            or net_needs_batchnorm_upgrade(net)
            or any(_blob_needs_shape(b) for b in _layer_blobs(net)))


# --------------------------------------------------------------------------
# V0 -> V1

def _fold_padding_layers(net, source):
    """UpgradeV0PaddingLayers: drop V0 "padding" layers, moving their pad
    into the conv/pool layer that consumes their output."""
    out = pb.NetParameter()
    out.CopyFrom(net)
    del out.layers[:]
    last_top = {name: -1 for name in net.input}
    for i, conn in enumerate(net.layers):
        v0 = conn.layer
        if v0.type != "padding":
            out.layers.add().CopyFrom(conn)
        for j, blob_name in enumerate(conn.bottom):
            if blob_name not in last_top:
                raise ParseError(
                    f"{source}: {_layer_label(i, v0.name)}: unknown bottom blob "
                    f"{blob_name!r} (no earlier layer or input produces it)")
            top_idx = last_top[blob_name]
            if top_idx == -1:
                continue
            src = net.layers[top_idx]
            if src.layer.type != "padding":
                continue
            if v0.type not in ("conv", "pool"):
                raise ParseError(
                    f"{source}: {_layer_label(i, v0.name)}: a V0 padding layer "
                    f"feeds a layer of type {v0.type!r}; only conv and pool "
                    f"layers can take one")
            if len(conn.bottom) != 1 or len(src.bottom) != 1 or len(src.top) != 1:
                raise ParseError(
                    f"{source}: {_layer_label(i, v0.name)}: padding folding "
                    f"needs one bottom on the layer and one bottom and top on "
                    f"the padding layer {src.layer.name!r}")
            tgt = out.layers[len(out.layers) - 1]
            tgt.layer.pad = src.layer.pad
            tgt.bottom[j] = src.bottom[0]
        for blob_name in conn.top:
            last_top[blob_name] = i
    return out


# V0 field -> {v0 type: (sub-message path, field name, how)}; how is "set",
# "add" (repeated) or "copy" (message).
_V0_FIELD_MAP = {
    "num_output": {"conv": ("convolution_param", "num_output", "set"),
                   "innerproduct": ("inner_product_param", "num_output", "set")},
    "biasterm": {"conv": ("convolution_param", "bias_term", "set"),
                 "innerproduct": ("inner_product_param", "bias_term", "set")},
    "weight_filler": {"conv": ("convolution_param", "weight_filler", "copy"),
                      "innerproduct": ("inner_product_param", "weight_filler", "copy")},
    "bias_filler": {"conv": ("convolution_param", "bias_filler", "copy"),
                    "innerproduct": ("inner_product_param", "bias_filler", "copy")},
    "pad": {"conv": ("convolution_param", "pad", "add"),
            "pool": ("pooling_param", "pad", "set")},
    "kernelsize": {"conv": ("convolution_param", "kernel_size", "add"),
                   "pool": ("pooling_param", "kernel_size", "set")},
    "group": {"conv": ("convolution_param", "group", "set")},
    "stride": {"conv": ("convolution_param", "stride", "add"),
               "pool": ("pooling_param", "stride", "set")},
    "pool": {"pool": ("pooling_param", "pool", "set")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio", "set")},
    "local_size": {"lrn": ("lrn_param", "local_size", "set")},
    "alpha": {"lrn": ("lrn_param", "alpha", "set")},
    "beta": {"lrn": ("lrn_param", "beta", "set")},
    "k": {"lrn": ("lrn_param", "k", "set")},
    "source": {"data": ("data_param", "source", "set"),
               "hdf5_data": ("hdf5_data_param", "source", "set"),
               "images": ("image_data_param", "source", "set"),
               "window_data": ("window_data_param", "source", "set"),
               "infogain_loss": ("infogain_loss_param", "source", "set")},
    "batchsize": {"data": ("data_param", "batch_size", "set"),
                  "hdf5_data": ("hdf5_data_param", "batch_size", "set"),
                  "images": ("image_data_param", "batch_size", "set"),
                  "window_data": ("window_data_param", "batch_size", "set")},
    "rand_skip": {"data": ("data_param", "rand_skip", "set"),
                  "images": ("image_data_param", "rand_skip", "set")},
    "shuffle_images": {"images": ("image_data_param", "shuffle", "set")},
    "new_height": {"images": ("image_data_param", "new_height", "set")},
    "new_width": {"images": ("image_data_param", "new_width", "set")},
    "concat_dim": {"concat": ("concat_param", "concat_dim", "set")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold", "set")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold", "set")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction", "set")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad", "set")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode", "set")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", None, "copy")},
}
# V0 fields that go to transform_param whatever the layer type.
_V0_TRANSFORM = {"scale": "scale", "meanfile": "mean_file",
                 "cropsize": "crop_size", "mirror": "mirror"}


def _upgrade_v0_layer(conn, index, source):
    """UpgradeV0LayerParameter: one V1LayerParameter holding a V0 layer ->
    a plain V1LayerParameter.  Returns (layer, fully_compatible)."""
    out = pb.V1LayerParameter()
    out.bottom.extend(conn.bottom)
    out.top.extend(conn.top)
    ok = True
    if not conn.HasField("layer"):
        return out, ok
    v0 = conn.layer
    if v0.HasField("name"):
        out.name = v0.name
    t = v0.type
    if v0.HasField("type"):
        if t not in V0_LAYER_TYPES:
            raise ParseError(
                f"{source}: {_layer_label(index, v0.name)}: unknown V0 layer "
                f"type {t!r}; known: {', '.join(sorted(V0_LAYER_TYPES))}")
        out.type = V0_LAYER_TYPES[t]
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    for field, targets in _V0_FIELD_MAP.items():
        if not v0.HasField(field):
            continue
        target = targets.get(t)
        if target is None:
            log.error("%s: %s: unknown parameter %s for V0 layer type %r",
                      source, _layer_label(index, v0.name), field, t)
            ok = False
            continue
        sub_name, name, how = target
        value = getattr(v0, field)
        sub = getattr(out, sub_name)
        if how == "set":
            setattr(sub, name, value)
        elif how == "add":
            getattr(sub, name).append(value)
        elif name is None:
            sub.CopyFrom(value)
        else:
            getattr(sub, name).CopyFrom(value)
    for field, name in _V0_TRANSFORM.items():
        if v0.HasField(field):
            setattr(out.transform_param, name, getattr(v0, field))
    return out, ok


def _upgrade_v0_net(net, source):
    padded = _fold_padding_layers(net, source)
    out = pb.NetParameter()
    ok = True
    if padded.HasField("name"):
        out.name = padded.name
    for i, conn in enumerate(padded.layers):
        layer, layer_ok = _upgrade_v0_layer(conn, i, source)
        out.layers.add().CopyFrom(layer)
        ok &= layer_ok
    out.input.extend(padded.input)
    out.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        out.force_backward = padded.force_backward
    return out, ok


# --------------------------------------------------------------------------
# V1 data transformation fields -> transform_param

def _upgrade_data_transformation(net):
    for l in net.layers:
        field = _DATA_V1_FIELDS.get(l.type)
        if field is None:
            continue
        sub = getattr(l, field)
        for f in _TRANSFORM_FIELDS:
            if sub.HasField(f):
                setattr(l.transform_param, f, getattr(sub, f))
                sub.ClearField(f)


# --------------------------------------------------------------------------
# V1 -> current

def _unknown_varints(msg, number):
    """Values of field ``number`` that parsing kept as unknown fields (how
    proto2 stores an enum value the schema does not define)."""
    try:
        from google.protobuf import unknown_fields
    except ImportError:  # pragma: no cover - older runtimes
        return []
    return [f.data for f in unknown_fields.UnknownFieldSet(msg)
            if f.field_number == number]


def _ensure_params(layer, n):
    while len(layer.param) < n:
        layer.param.add()


def _upgrade_v1_layer(v1, index, source):
    """UpgradeV1LayerParameter.  Returns (LayerParameter, fully_compatible)."""
    out = pb.LayerParameter()
    ok = True
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    if v1.HasField("name"):
        out.name = v1.name
    out.include.extend(v1.include)
    out.exclude.extend(v1.exclude)
    if not v1.HasField("type"):
        unknown = _unknown_varints(v1, 5)
        if unknown:
            raise ParseError(
                f"{source}: {_layer_label(index, v1.name)}: unknown V1 layer "
                f"type {unknown[0]} (not a V1LayerParameter.LayerType value)")
    else:
        if v1.type not in V1_LAYER_TYPES:
            raise ParseError(
                f"{source}: {_layer_label(index, v1.name)}: unknown V1 layer "
                f"type {v1.type}")
        out.type = V1_LAYER_TYPES[v1.type]
    out.blobs.extend(v1.blobs)
    for i, name in enumerate(v1.param):
        _ensure_params(out, i + 1)
        out.param[i].name = name
    for i, mode in enumerate(v1.blob_share_mode):
        _ensure_params(out, i + 1)
        if mode == _V1.STRICT:
            out.param[i].share_mode = pb.ParamSpec.STRICT
        elif mode == _V1.PERMISSIVE:
            out.param[i].share_mode = pb.ParamSpec.PERMISSIVE
        else:
            raise ParseError(
                f"{source}: {_layer_label(index, v1.name)}: unknown "
                f"blob_share_mode {mode}")
    for i, lr in enumerate(v1.blobs_lr):
        _ensure_params(out, i + 1)
        out.param[i].lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        _ensure_params(out, i + 1)
        out.param[i].decay_mult = decay
    out.loss_weight.extend(v1.loss_weight)
    for field in _V1_PARAM_FIELDS:
        if v1.HasField(field):
            getattr(out, field).CopyFrom(getattr(v1, field))
    if v1.HasField("layer"):
        log.error("%s: %s: input NetParameter has V0 layer -- ignoring.",
                  source, _layer_label(index, v1.name))
        ok = False
    return out, ok


def _upgrade_v1_net(net, source):
    if len(net.layer) > 0:
        raise ParseError(
            f"{source}: refusing to upgrade inconsistent NetParameter input; "
            "the definition includes both 'layer' and 'layers' fields. The "
            "current format defines 'layer' fields with string type like "
            "layer { type: 'Layer' ... } and not layers { type: LAYER ... }. "
            "Switch the definition to 'layer' format to continue.")
    ok = True
    new_layers = []
    for i, v1 in enumerate(net.layers):
        layer, layer_ok = _upgrade_v1_layer(v1, i, source)
        if not layer_ok:
            log.error("%s: upgrade of input layer %d failed.", source, i)
            ok = False
        new_layers.append(layer)
    net.ClearField("layers")
    net.ClearField("layer")
    net.layer.extend(new_layers)
    return ok


# --------------------------------------------------------------------------
# input fields -> Input layer, BatchNorm params, blob shapes

def _upgrade_net_input(net, source):
    has_shape = len(net.input_shape) > 0
    has_dim = len(net.input_dim) > 0
    if has_shape or has_dim:
        n = len(net.input)
        if has_shape and len(net.input_shape) != n:
            raise ParseError(
                f"{source}: {n} input blob(s) but {len(net.input_shape)} "
                f"input_shape(s); give one input_shape per input")
        if not has_shape and len(net.input_dim) != 4 * n:
            raise ParseError(
                f"{source}: {n} input blob(s) need {4 * n} input_dim values "
                f"(num, channels, height, width each), found "
                f"{len(net.input_dim)}")
        layer = pb.LayerParameter(name="input", type="Input")
        for i, name in enumerate(net.input):
            layer.top.append(name)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i:4 * i + 4])
        rest = list(net.layer)
        net.ClearField("layer")
        net.layer.append(layer)
        net.layer.extend(rest)
    # A bare input with no shape is a legacy caffemodel: just drop it.
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def _upgrade_batchnorm(net):
    for l in net.layer:
        if l.type == "BatchNorm" and len(l.param) == 3:
            l.ClearField("param")


def upgrade_blob_shapes(blobs):
    """Turn legacy num/channels/height/width of BlobProtos into a 4-D shape,
    as Caffe's Blob::FromProto reads them.  Returns how many were changed."""
    changed = 0
    for b in blobs:
        if _blob_needs_shape(b):
            dims = [b.num, b.channels, b.height, b.width]
            b.ClearField("shape")
            b.shape.dim.extend(dims)
            for f in ("num", "channels", "height", "width"):
                b.ClearField(f)
            changed += 1
    return changed


# --------------------------------------------------------------------------
# Entry points

def upgrade_net(net, source="<net>"):
    """Upgrade a NetParameter in place, as Caffe's UpgradeNetAsNeeded does,
    then give every layer blob a ``shape``.  Returns ``net``."""
    if net_needs_v0_to_v1_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "V0LayerParameter: %s", source)
        upgraded, ok = _upgrade_v0_net(net, source)
        net.CopyFrom(upgraded)
        if ok:
            log.info("Successfully upgraded file specified using deprecated "
                     "V0LayerParameter")
        else:
            log.error("Warning: had one or more problems upgrading "
                      "V0NetParameter to NetParameter (see above); "
                      "continuing anyway.")
    if net_needs_data_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "transformation parameters: %s", source)
        _upgrade_data_transformation(net)
        log.info("Successfully upgraded file specified using deprecated "
                 "data transformation parameters.")
    if net_needs_v1_to_v2_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "V1LayerParameter: %s", source)
        if _upgrade_v1_net(net, source):
            log.info("Successfully upgraded file specified using deprecated "
                     "V1LayerParameter")
        else:
            log.error("Warning: had one or more problems upgrading "
                      "V1LayerParameter (see above); continuing anyway.")
    if net_needs_input_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "input fields: %s", source)
        _upgrade_net_input(net, source)
        log.info("Successfully upgraded file specified using deprecated "
                 "input fields.")
    if net_needs_batchnorm_upgrade(net):
        log.info("Attempting to upgrade batch norm layers using deprecated "
                 "params: %s", source)
        _upgrade_batchnorm(net)
        log.info("Successfully upgraded batch norm layers using deprecated "
                 "params.")
    n = upgrade_blob_shapes(b for l in net.layer for b in l.blobs)
    if n:
        log.info("Upgraded %d blob(s) with legacy num/channels/height/width "
                 "to shape: %s", n, source)
    return net


def upgrade_solver(solver, source="<solver>"):
    """Upgrade a SolverParameter in place (UpgradeSolverAsNeeded): the old
    ``solver_type`` enum becomes the ``type`` string.  Returns ``solver``."""
    if solver.HasField("solver_type"):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "'solver_type' field (enum)': %s", source)
        if solver.HasField("type"):
            raise ParseError(
                f"{source}: failed to upgrade solver: old solver_type field "
                "(enum) and new type field (string) cannot be both specified")
        name = SOLVER_TYPES.get(solver.solver_type)
        if name is None:
            raise ParseError(
                f"{source}: unknown SolverParameter solver_type: "
                f"{solver.solver_type}")
        solver.type = name
        solver.ClearField("solver_type")
        log.info("Successfully upgraded file specified using deprecated "
                 "'solver_type' field (enum) to 'type' field (string).")
    # Inline nets are upgraded too (Caffe leaves them alone, and a V1 inline
    # net then builds nothing); a net already current is left unchanged.
    if solver.HasField("net_param"):
        upgrade_net(solver.net_param, f"{source}: net_param")
    if solver.HasField("train_net_param"):
        upgrade_net(solver.train_net_param, f"{source}: train_net_param")
    for i, net in enumerate(solver.test_net_param):
        upgrade_net(net, f"{source}: test_net_param[{i}]")
    return solver
