"""Structure-aware fuzzing: mutations that know the formats' structure,
where fuzzing.py and fuzzing_more.py flip bytes of a few fixed files.

Formats (each case is (format, seed), as in fuzzing.py):

- ``layer``: one layer of a registered type between small Input blobs, its
  ``*_param`` message filled from the protobuf descriptor with boundary
  values (0, -1, 2^31, 2^63-1, NaN, Inf, huge repeated fields, unknown
  strings) and its bottoms of random small, empty or overflowing shapes;
  the net is built, run forward, and (TRAIN) backward.
- ``graph``: net-level wiring of a small net: duplicate layer/top names,
  cycles, in-place misuse, bottoms nobody produces, include/exclude rules,
  stages, levels, shared params by name with other shapes, force_backward,
  loss weights, propagate_down counts; and text tricks (unterminated
  strings, invalid UTF-8, huge numbers, deep nesting, unknown enums).
- ``wire``: caffemodel / binaryproto / solverstate bytes edited at the
  protobuf wire level: a field given another wire type, varints of 10+
  bytes, declared lengths past the end or near 2^64, deeply nested groups
  and messages, packed fields of millions of entries, fields repeated.
- ``v1mix``: caffemodels mixing V1 ``layers`` and V2 ``layer``, V0 ``layer``
  inside V1, blobs whose data count differs from their shape (legacy 4-D
  fields and ``shape`` both set, double_data and data both set).
- ``datum``: a valid LMDB whose Datum values are hostile (sizes that
  overflow, data shorter than channels*height*width, float_data and data
  both set, garbage encoded images, channels that differ record to record),
  read by a Data layer or compute_image_mean.
- ``onnxsem``: ONNX graphs built op by op (Conv, ConvTranspose, pools,
  Reshape, Slice, Pad, Gather, Resize, ...) with hostile attributes,
  initializers that do not fill their dims or have another type, cycles,
  missing inputs; converted by onnx2caffe, then built and run.
- ``solverval``: solver prototxts with hostile values (negative or huge
  max_iter/test_iter/iter_size, NaN rates, snapshot prefixes in missing,
  unwritable or special folders); earlier snapshot files must survive and
  no snapshot may be left half-written or as a temp file.
- ``chain``: random small DAGs of the layers the plan passes fuse
  (convolution + BatchNorm/Scale/activations, Eltwise, Concat, Slice,
  in place or not), TEST (three forwards: the trace replays) and TRAIN.

``write_case`` writes a case's files without running them (for runs through
the commands). ``python fuzzing_struct.py FORMAT FIRST COUNT DIR`` runs cases in a child
process (fuzzing.main) and prints one JSON line per case.
"""
import os
import random
import shutil
import struct
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fuzzing  # noqa: E402

FORMATS = ("layer", "graph", "wire", "v1mix", "datum", "onnxsem", "solverval", "chain")


class Finding(Exception):
    pass


def _pb():
    from caffe_ocl.proto import caffe_pb2
    return caffe_pb2


# --------------------------------------------------------------------------
# layer: one layer with descriptor-driven hostile params

INT_VALUES = [0, 1, 2, 3, -1, -2, 7, 64, 2**15, 2**16 + 1, 2**31 - 1, 2**31, 2**32 - 1,
              2**32, 2**62, 2**63 - 1, -2**31, -2**63]
FLOAT_VALUES = [0.0, 1.0, -1.0, 0.5, 1e-45, 1e-30, 1e30, 3.4e38, -3.4e38, float("nan"),
                float("inf"), float("-inf"), 2.0**31, 1e10]

# type -> (bottom shapes, base params text, needs integer labels in bottom k)
LAYERS = {
    "Convolution": ([(2, 3, 6, 6)], "convolution_param { num_output: 4 kernel_size: 3 "
                    "weight_filler { type: 'xavier' } }", None),
    "Deconvolution": ([(2, 4, 4, 4)], "convolution_param { num_output: 2 kernel_size: 3 "
                      "stride: 2 weight_filler { type: 'gaussian' std: 0.1 } }", None),
    "ConvolutionDepthwise": ([(1, 4, 6, 6)], "convolution_param { num_output: 4 group: 4 "
                             "kernel_size: 3 weight_filler { type: 'xavier' } }", None),
    "DepthwiseConvolution": ([(1, 4, 6, 6)], "convolution_param { num_output: 4 group: 4 "
                             "kernel_size: 3 weight_filler { type: 'xavier' } }", None),
    "Im2col": ([(1, 2, 5, 5)], "convolution_param { kernel_size: 2 }", None),
    "Pooling": ([(2, 3, 6, 6)], "pooling_param { pool: MAX kernel_size: 2 stride: 2 }", None),
    "SPP": ([(1, 2, 8, 8)], "spp_param { pyramid_height: 2 }", None),
    "InnerProduct": ([(2, 3, 2, 2)], "inner_product_param { num_output: 3 "
                     "weight_filler { type: 'gaussian' std: 0.1 } }", None),
    "LRN": ([(1, 5, 4, 4)], "lrn_param { local_size: 3 }", None),
    "BatchNorm": ([(2, 3, 4, 4)], "batch_norm_param { use_global_stats: false }", None),
    "BN": ([(2, 3, 4, 4)], "bn_param { }", None),
    "Scale": ([(2, 3, 4, 4)], "scale_param { bias_term: true }", None),
    "Bias": ([(2, 3, 4, 4)], "bias_param { }", None),
    "MVN": ([(2, 3, 4, 4)], "mvn_param { }", None),
    "Normalize": ([(1, 3, 4, 4)], "norm_param { across_spatial: false }", None),
    "ReLU": ([(2, 3, 4, 4)], "relu_param { negative_slope: 0.1 }", None),
    "ReLU6": ([(2, 3, 4, 4)], "", None),
    "PReLU": ([(2, 3, 4, 4)], "prelu_param { channel_shared: false }", None),
    "ELU": ([(2, 3)], "elu_param { alpha: 1 }", None),
    "Sigmoid": ([(2, 3)], "", None), "TanH": ([(2, 3)], "", None),
    "AbsVal": ([(2, 3)], "", None), "BNLL": ([(2, 3)], "", None),
    "Swish": ([(2, 3)], "swish_param { beta: 1 }", None),
    "Power": ([(2, 3)], "power_param { power: 2 scale: 1 shift: 0 }", None),
    "Exp": ([(2, 3)], "exp_param { base: -1 scale: 1 shift: 0 }", None),
    "Log": ([(2, 3)], "log_param { base: -1 scale: 1 shift: 2 }", None),
    "Threshold": ([(2, 3)], "threshold_param { threshold: 0 }", None),
    "Clip": ([(2, 3)], "clip_param { min: -1 max: 1 }", None),
    "Dropout": ([(2, 3)], "dropout_param { dropout_ratio: 0.5 }", None),
    "Softmax": ([(2, 3, 2)], "softmax_param { axis: 1 }", None),
    "ArgMax": ([(2, 5)], "argmax_param { top_k: 2 }", None),
    "Concat": ([(2, 3, 2), (2, 1, 2)], "concat_param { axis: 1 }", None),
    "Slice": ([(2, 4, 2)], "slice_param { axis: 1 slice_point: 1 slice_point: 3 }", None),
    "Split": ([(2, 3)], "", None),
    "Eltwise": ([(2, 3), (2, 3)], "eltwise_param { operation: PROD }", None),
    "Axpy": ([(2, 3, 1, 1), (2, 3, 2, 2), (2, 3, 2, 2)], "", None),
    "Flatten": ([(2, 3, 2, 2)], "flatten_param { axis: 1 end_axis: -1 }", None),
    "Reshape": ([(2, 3, 2, 2)], "reshape_param { shape { dim: 0 dim: -1 } }", None),
    "Tile": ([(2, 3)], "tile_param { axis: 1 tiles: 2 }", None),
    "Crop": ([(1, 2, 6, 6), (1, 2, 3, 3)], "crop_param { axis: 2 offset: 1 }", None),
    "Permute": ([(1, 2, 3, 4)], "permute_param { order: 0 order: 2 order: 3 order: 1 }", None),
    "Reduction": ([(2, 3, 2)], "reduction_param { operation: SUM axis: 1 }", None),
    "Embed": ([(2, 3)], "embed_param { num_output: 4 input_dim: 5 "
              "weight_filler { type: 'gaussian' std: 0.1 } }", 0),
    "Interp": ([(1, 2, 3, 3)], "interp_param { zoom_factor: 2 }", None),
    "Upsample": ([(1, 2, 3, 3)], "upsample_param { scale: 2 }", None),
    "ShuffleChannel": ([(1, 4, 2, 2)], "shuffle_channel_param { group: 2 }", None),
    "Reorg": ([(1, 4, 4, 4)], "reorg_param { stride: 2 }", None),
    "BatchReindex": ([(3, 2), (4,)], "", 1),
    "Filter": ([(3, 2), (3,)], "", None),
    "Silence": ([(2, 3)], "", None),
    "Parameter": ([], "parameter_param { shape { dim: 2 dim: 3 } }", None),
    "DummyData": ([], "dummy_data_param { shape { dim: 2 dim: 3 } "
                  "data_filler { type: 'uniform' } }", None),
    "Input": ([], "input_param { shape { dim: 2 dim: 3 } }", None),
    "SoftmaxWithLoss": ([(2, 3), (2,)], "loss_param { normalization: VALID }", 1),
    "EuclideanLoss": ([(2, 3), (2, 3)], "", None),
    "SigmoidCrossEntropyLoss": ([(2, 3), (2, 3)], "", None),
    "HingeLoss": ([(2, 3), (2,)], "hinge_loss_param { norm: L2 }", 1),
    "MultinomialLogisticLoss": ([(2, 3), (2,)], "", 1),
    "InfogainLoss": ([(2, 3), (2,), (1, 1, 3, 3)], "", 1),
    "ContrastiveLoss": ([(2, 3), (2, 3), (2,)], "contrastive_loss_param { margin: 1 }", None),
    "Accuracy": ([(2, 3), (2,)], "accuracy_param { top_k: 1 }", 1),
    "LSTM": ([(2, 2, 3), (2, 2)], "recurrent_param { num_output: 2 "
             "weight_filler { type: 'uniform' min: -0.1 max: 0.1 } }", None),
    "RNN": ([(2, 2, 3), (2, 2)], "recurrent_param { num_output: 2 "
            "weight_filler { type: 'uniform' min: -0.1 max: 0.1 } }", None),
    "LSTMUnit": ([(1, 2, 3), (1, 2, 12), (1, 2)], "", None),
    "PriorBox": ([(1, 2, 3, 3), (1, 3, 12, 12)], "prior_box_param { min_size: 4 "
                 "aspect_ratio: 2 flip: true }", None),
    "ROIPooling": ([(1, 2, 6, 6), (1, 5)], "roi_pooling_param { pooled_h: 2 pooled_w: 2 "
                   "spatial_scale: 1 }", None),
    "PSROIPooling": ([(1, 8, 6, 6), (1, 5)], "psroi_pooling_param { output_dim: 2 "
                     "group_size: 2 spatial_scale: 1 }", None),
    "DetectionOutput": ([(1, 8), (1, 6), (1, 2, 8)], "detection_output_param { "
                        "num_classes: 3 share_location: true background_label_id: 0 "
                        "nms_param { nms_threshold: 0.45 top_k: 4 } keep_top_k: 4 "
                        "confidence_threshold: 0.01 }", None),
    "Proposal": ([(1, 18, 2, 2), (1, 36, 2, 2), (1, 3)], "proposal_param { feat_stride: 16 }",
                 None),
    "YoloDetectionOutput": ([(1, 125, 2, 2)], "yolo_detection_output_param { num_classes: 20 "
                            "}", None),
    "Yolov3DetectionOutput": ([(1, 255, 2, 2)], "yolov3_detection_output_param { "
                              "num_classes: 80 }", None),
}

PARAM_FIELD = {"Deconvolution": "convolution_param", "ConvolutionDepthwise":
               "convolution_param", "DepthwiseConvolution": "convolution_param",
               "Im2col": "convolution_param", "InnerProduct": "inner_product_param",
               "BatchNorm": "batch_norm_param", "BN": "bn_param", "Normalize": "norm_param",
               "TanH": "tanh_param", "ArgMax": "argmax_param", "Embed": "embed_param",
               "LSTM": "recurrent_param", "RNN": "recurrent_param",
               "SoftmaxWithLoss": "loss_param", "EuclideanLoss": "loss_param",
               "SigmoidCrossEntropyLoss": "loss_param", "MultinomialLogisticLoss":
               "loss_param", "InfogainLoss": "infogain_loss_param",
               "ContrastiveLoss": "contrastive_loss_param", "HingeLoss": "hinge_loss_param",
               "PriorBox": "prior_box_param", "ROIPooling": "roi_pooling_param",
               "PSROIPooling": "psroi_pooling_param", "DetectionOutput":
               "detection_output_param", "ShuffleChannel": "shuffle_channel_param",
               "YoloDetectionOutput": "yolo_detection_output_param",
               "Yolov3DetectionOutput": "yolov3_detection_output_param",
               "DummyData": "dummy_data_param", "Parameter": "parameter_param",
               "Input": "input_param", "ReLU6": "relu_param", "ReLU": "relu_param",
               "PReLU": "prelu_param", "Axpy": None,
               "LSTMUnit": None, "Split": None, "Silence": None, "BatchReindex": None,
               "Filter": None, "AbsVal": None, "BNLL": None, "Sigmoid": "sigmoid_param"}


def _snake(name):
    out = ""
    for i, c in enumerate(name):
        if c.isupper() and i and not name[i - 1].isupper():
            out += "_"
        out += c.lower()
    return out


def param_field(t):
    if t in PARAM_FIELD:
        return PARAM_FIELD[t]
    return _snake(t) + "_param"


def _random_value(fd, r):
    from google.protobuf.descriptor import FieldDescriptor as F
    if fd.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        v = r.choice(INT_VALUES)
        return max(-2**31, min(2**31 - 1, v))
    if fd.type in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return max(0, min(2**32 - 1, r.choice(INT_VALUES)))
    if fd.type in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return max(-2**63, min(2**63 - 1, r.choice(INT_VALUES)))
    if fd.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return max(0, min(2**64 - 1, r.choice(INT_VALUES)))
    if fd.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        v = r.choice(FLOAT_VALUES)
        return v
    if fd.type == F.TYPE_BOOL:
        return r.random() < 0.5
    if fd.type == F.TYPE_ENUM:
        return r.choice([v.number for v in fd.enum_type.values])
    if fd.type == F.TYPE_STRING:
        return r.choice(["", "x", "constant", "gaussian", "xavier", "msra", "bilinear",
                         "unknown_thing", "\u00e9", "a" * 1000])
    if fd.type == F.TYPE_BYTES:
        return b"\xff\x00"
    raise ValueError(fd.type)


def _is_repeated(fd):
    rep = getattr(fd, "is_repeated", None)
    if rep is not None:
        return rep
    from google.protobuf.descriptor import FieldDescriptor as F
    return fd.label == F.LABEL_REPEATED


def mutate_message(msg, r, depth=0):
    """Set one field of ``msg`` (recursing into sub-messages) to a boundary
    value; repeated fields get 0, 1, several or many entries."""
    fields = list(msg.DESCRIPTOR.fields)
    if not fields:
        return
    fd = r.choice(fields)
    from google.protobuf.descriptor import FieldDescriptor as F
    repeated = _is_repeated(fd)
    if fd.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        if depth > 3:
            return
        if repeated:
            k = r.choice(["add", "add", "clear", "many"])
            sub = getattr(msg, fd.name)
            if k == "clear":
                del sub[:]
            elif k == "many":
                for _ in range(r.choice([2, 5, 40])):
                    mutate_message(sub.add(), r, depth + 1)
            else:
                target = sub[r.randrange(len(sub))] if len(sub) and r.random() < 0.6 \
                    else sub.add()
                mutate_message(target, r, depth + 1)
        else:
            mutate_message(getattr(msg, fd.name), r, depth + 1)
        return
    if repeated:
        seq = getattr(msg, fd.name)
        k = r.choice(["set", "append", "clear", "many", "huge"])
        if k == "clear":
            del seq[:]
        elif k == "many":
            seq.extend(_random_value(fd, r) for _ in range(r.choice([3, 9, 33])))
        elif k == "huge":
            v = _random_value(fd, r)
            seq.extend([v] * r.choice([1000, 100000]))
        elif k == "set" and len(seq):
            seq[r.randrange(len(seq))] = _random_value(fd, r)
        else:
            seq.append(_random_value(fd, r))
    else:
        setattr(msg, fd.name, _random_value(fd, r))


def _bottom_shape(shape, r):
    shape = list(shape)
    if shape and r.random() < 0.25:
        i = r.randrange(len(shape))
        shape[i] = r.choice([0, 1, 2, 5, 2**31 - 1, 2**31, 2**40, 2**62, -1])
    if r.random() < 0.08:
        shape = shape[:r.randrange(len(shape) + 1)] if shape else [1] * r.randint(1, 40)
    if r.random() < 0.05:
        shape = shape + [1] * r.choice([1, 2, 28, 40])
    return shape


def build_layer_net(r):
    """A NetParameter: Input layers for the bottoms, then the fuzzed layer."""
    from google.protobuf import text_format
    pb = _pb()
    t = r.choice(sorted(LAYERS))
    shapes, text, label = LAYERS[t]
    net = pb.NetParameter(name="fl")
    bottoms = []
    for i, s in enumerate(shapes):
        s = _bottom_shape(s, r)
        lp = net.layer.add(name=f"in{i}", type="Input", top=[f"b{i}"])
        lp.input_param.shape.add().dim.extend(s)
        bottoms.append(f"b{i}")
    if shapes and r.random() < 0.06:       # one bottom too few or too many
        if r.random() < 0.5:
            bottoms.pop()
        else:
            bottoms.append(bottoms[0])
    lp = net.layer.add(name="L", type=t, bottom=bottoms)
    text_format.Parse(text.replace("'", '"'), lp)
    ntop = {"Slice": 3, "Split": 2, "Silence": 0, "LSTMUnit": 2, "Filter": 2,
            "DummyData": 1, "Parameter": 1, "Input": 1}.get(t, 1)
    if t == "Accuracy" and r.random() < 0.3:
        ntop = 2
    if r.random() < 0.06:
        ntop = max(0, ntop + r.choice([-1, 1, 3]))
    lp.top.extend(f"t{i}" for i in range(ntop))
    field = param_field(t)
    n_mut = r.choice([1, 1, 2, 3, 4])
    for _ in range(n_mut):
        k = r.random()
        if field and k < 0.75:
            mutate_message(getattr(lp, field), r)
        elif k < 0.82:
            lp.loss_weight.extend([r.choice(FLOAT_VALUES)] * r.choice([1, len(lp.top) + 1]))
        elif k < 0.88:
            ps = lp.param.add()
            ps.lr_mult = r.choice(FLOAT_VALUES)
            ps.decay_mult = r.choice(FLOAT_VALUES)
            if r.random() < 0.3:
                ps.name = "shared"
        elif k < 0.94:
            lp.propagate_down.extend([r.random() < 0.5] * r.choice([1, len(bottoms) + 1]))
        else:
            mutate_message(lp, r)
    phase = r.choice([0, 1])
    return net, t, label, phase


def _fill_inputs(net, label, r):
    for i, name in enumerate(net.inputs):
        b = net.blobs[name]
        if b.count > 1 << 20:
            continue
        if label is not None and i == label:
            b.data[...] = np.random.RandomState(r.randrange(1000)).randint(
                0, 3, b.data.shape)
        else:
            b.data[...] = np.random.RandomState(r.randrange(1000)).randn(*b.data.shape)


def run_layer(r, work, ctx):
    import caffe_ocl as caffe
    from caffe_ocl.proto import write_text
    net_p, t, label, phase = build_layer_net(r)
    target = os.path.join(work, f"layer_{t}.prototxt")
    write_text(net_p, target)
    ctx["target"] = target
    ctx["names"] = {"'L'", "'in0'", "'in1'", "'in2'"}
    if ctx.get("write_only"):
        return
    net = caffe.Net(target, phase)
    _fill_inputs(net, label, r)
    net.forward()
    if phase == caffe.TRAIN:
        net.backward()


# --------------------------------------------------------------------------
# graph: net-level wiring and text tricks

GRAPH_NET = """name: "fg"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } shape { dim: 2 }
    data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  param { name: "cw" lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "conv2" type: "Convolution" bottom: "conv" top: "conv2"
  param { name: "cw" } convolution_param { num_output: 3 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "elt" type: "Eltwise" bottom: "conv" bottom: "conv2" top: "elt" }
layer { name: "drop" type: "Dropout" bottom: "elt" top: "elt" include { phase: TRAIN } }
layer { name: "pool" type: "Pooling" bottom: "elt" top: "pool"
  pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
  include { phase: TEST } }
"""


def _graph_mutation(net, r):
    pb = _pb()
    layers = net.layer
    n = len(layers)
    lp = layers[r.randrange(n)]
    k = r.choice(["dup_name", "dup_top", "cycle", "self_loop", "inplace_multi",
                  "missing_bottom", "rule", "rule", "stage", "shared_param",
                  "force_backward", "loss_weight", "propagate_down", "drop_layer",
                  "swap", "top_is_input", "input_field", "many_layers", "same_top_twice",
                  "bottom_twice", "state", "param_count", "empty_names", "reverse"])
    if k == "dup_name":
        lp.name = layers[r.randrange(n)].name
    elif k == "dup_top" and len(lp.top):
        lp.top[0] = r.choice([t for l in layers for t in l.top])
    elif k == "cycle":
        j = r.randrange(n)
        if len(lp.bottom) and len(layers[j].top):
            lp.bottom[0] = layers[max(j, r.randrange(n))].top[0]
    elif k == "self_loop" and len(lp.top):
        lp.bottom.append(lp.top[0])
    elif k == "inplace_multi":
        if len(lp.bottom) >= 2 or len(lp.top) >= 2:
            lp.top[:] = [lp.bottom[0]] * max(1, len(lp.top)) if len(lp.bottom) else lp.top
    elif k == "missing_bottom":
        lp.bottom.append(r.choice(["nowhere", "", "label", "data"]))
    elif k == "rule":
        rule = (lp.include if r.random() < 0.5 else lp.exclude).add()
        kk = r.choice(["phase", "min", "max", "stage", "not"])
        if kk == "phase":
            rule.phase = r.choice([0, 1])
        elif kk == "min":
            rule.min_level = r.choice([-2**31, 0, 2**31 - 1])
        elif kk == "max":
            rule.max_level = r.choice([-2**31, -1, 0])
        elif kk == "stage":
            rule.stage.append(r.choice(["deploy", "", "x" * 300]))
        else:
            rule.not_stage.append("deploy")
        if r.random() < 0.3:
            (lp.exclude if kk == "phase" else lp.include).add().phase = 0
    elif k == "stage":
        net.state.stage.extend(["deploy"] * r.choice([1, 1000]))
    elif k == "state":
        net.state.phase = r.choice([0, 1])
        net.state.level = r.choice([-2**31, 2**31 - 1, 5])
    elif k == "shared_param":
        tgt = r.choice([l for l in layers if l.type in ("Convolution", "InnerProduct")])
        ps = tgt.param.add() if not len(tgt.param) else tgt.param[0]
        ps.name = "cw"
        if r.random() < 0.5:
            ps.share_mode = r.choice([0, 1])
    elif k == "force_backward":
        net.force_backward = True
        if r.random() < 0.5:
            net.debug_info = True
    elif k == "loss_weight":
        lp.loss_weight.extend([r.choice(FLOAT_VALUES)] * r.choice([1, 2, 5]))
    elif k == "propagate_down":
        lp.propagate_down.extend([r.random() < 0.5] * r.choice([1, 2, 5]))
    elif k == "drop_layer":
        del layers[r.randrange(n)]
    elif k == "swap":
        i, j = r.randrange(n), r.randrange(n)
        a, b = pb.LayerParameter(), pb.LayerParameter()
        a.CopyFrom(layers[i])
        b.CopyFrom(layers[j])
        layers[i].CopyFrom(b)
        layers[j].CopyFrom(a)
    elif k == "top_is_input":
        net.input.append(r.choice(["data", "conv", "x"]))
        if r.random() < 0.5:
            net.input_shape.add().dim.extend(r.choice([[2, 3, 4, 4], [1], [0], [-1, 3],
                                                       [2**31, 2**31]]))
        elif r.random() < 0.5:
            net.input_dim.extend(r.choice([[2, 3, 4, 4], [1, 2], [2**31 - 1] * 4]))
    elif k == "input_field":
        net.input.extend(["a", "a"])
        net.input_dim.extend([1, 1, 1, 1])
    elif k == "many_layers":
        for i in range(r.choice([50, 300])):
            net.layer.add(name=f"x{i}", type="ReLU", bottom=["ip"], top=["ip"])
    elif k == "same_top_twice":
        lp.top.extend(list(lp.top[:1]) * 2)
    elif k == "bottom_twice" and len(lp.bottom):
        lp.bottom.append(lp.bottom[0])
    elif k == "param_count":
        for _ in range(r.choice([3, 10])):
            lp.param.add().lr_mult = r.choice(FLOAT_VALUES)
    elif k == "empty_names":
        lp.name = ""
        if len(lp.top):
            lp.top[0] = ""
    elif k == "reverse":
        items = [pb.LayerParameter() for _ in range(n)]
        for i in range(n):
            items[i].CopyFrom(layers[n - 1 - i])
        del layers[:]
        layers.extend(items)


def _text_trick(text, r):
    """Text-level edits that a byte fuzzer rarely builds."""
    k = r.choice(["unterminated", "utf8", "hugenum", "deep", "enum", "escape", "comment",
                  "bigfloat", "colon", "negexp", "longstr", "bom", "crlf", "unknown_field",
                  "repeat_scalar", "angle"])
    lines = text.split("\n")
    i = r.randrange(len(lines))
    if k == "unterminated":
        text = text.replace('"conv"', '"conv', 1)
    elif k == "utf8":
        b = text.encode()
        j = b.find(b'"', r.randrange(len(b)))
        j = j if j >= 0 else 10
        return b[:j + 1] + r.choice([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                     b"\xc0\xaf"]) + b[j + 1:]
    elif k == "hugenum":
        text = text.replace("num_output: 3", "num_output: " + r.choice(
            ["99999999999999999999999", "4294967296", "-0", "0x7fffffff", "1e3", "0777",
             "2147483648", "-2147483649", "3.5"]), 1)
    elif k == "deep":
        depth = r.choice([50, 1000, 100000])
        text += "\nlayer { name: 'd' type: 'ReLU' bottom: 'ip' top: 'ip' " + \
            "relu_param { " * depth + "}" * depth + " }\n"
    elif k == "enum":
        text = text.replace("pool: AVE", "pool: " + r.choice(["BOGUS", "7", "-1", "ave", '"AVE"',
                                                               "99999999999"]))
    elif k == "escape":
        text = text.replace('"xavier"', '"xa\\' + r.choice(["x", "u", "777", "q", "U0010ffff",
                                                              "x\n"]) + 'vier"')
    elif k == "comment":
        lines.insert(i, "# " + "\u202e" * 3 + "\x00\x01")
    elif k == "bigfloat":
        text = text.replace("std: 0.1", "std: " + r.choice(["1e999", "-1e999", "nan", "inf",
                                                            "-inf", "1e-999", "infinity",
                                                            "NaN", "0x1p3", "1f"]))
    elif k == "colon":
        text = text.replace("convolution_param {", "convolution_param: {", 1)
    elif k == "negexp":
        text = text.replace("kernel_size: 3", "kernel_size: -3e2", 1)
    elif k == "longstr":
        text = text.replace('"fg"', '"' + "n" * r.choice([10**5, 10**7]) + '"')
    elif k == "bom":
        return b"\xef\xbb\xbf" + text.encode()
    elif k == "crlf":
        text = text.replace("\n", "\r\n" if r.random() < 0.5 else "\r")
    elif k == "unknown_field":
        lines.insert(i, r.choice(["frobnicate: 3", "layer { name: 'u' type: 'ReLU' zap: 1 }",
                                  "[ext.field]: 1", "layers { type: RELU bottom: 'ip' top: 'ip' }",
                                  "layers { name: 'v1' type: 99999 }"]))
    elif k == "repeat_scalar":
        text = text.replace("kernel_size: 3", "kernel_size: 3 kernel_size: 5 kernel_size: 7")
        text = text.replace('name: "fg"', 'name: "fg" name: "fg2"')
    elif k == "angle":
        text = text.replace("{", "<", 3).replace("}", ">", 3)
    if k not in ("comment", "unknown_field"):
        return text.encode()
    return "\n".join(lines).encode()


def run_graph(r, work, ctx):
    import caffe_ocl as caffe
    from google.protobuf import text_format
    pb = _pb()
    net = pb.NetParameter()
    text_format.Parse(GRAPH_NET, net)
    for _ in range(r.choice([1, 1, 2, 3])):
        _graph_mutation(net, r)
    data = text_format.MessageToString(net).encode()
    if r.random() < 0.35:
        data = _text_trick(data.decode(), r)
    target = os.path.join(work, "graph.prototxt")
    open(target, "wb").write(data)
    ctx["target"] = target
    ctx["names"] = {f"'{lp.name}'" for lp in net.layer} | {f'"{lp.name}"' for lp in net.layer}
    if ctx.get("write_only"):
        return
    phase = r.choice([caffe.TRAIN, caffe.TEST])
    kw = {}
    if r.random() < 0.3:
        kw = {"level": r.choice([-1, 0, 2**31 - 1]), "stages": r.choice([["deploy"], []])}
    net = caffe.Net(target, phase, **kw)
    net.forward()
    if phase == caffe.TRAIN:
        net.backward()


# --------------------------------------------------------------------------
# wire: protobuf wire-format edits guided by the schema

def _varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(data, i):
    v, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def wire_decode(data, desc):
    """A list of [field, wiretype, value] where value is an int, bytes, or
    (for a length-delimited field the schema says is a message) a nested
    list."""
    from google.protobuf.descriptor import FieldDescriptor as F
    out, i = [], 0
    while i < len(data):
        key, i = _read_varint(data, i)
        fn, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(data, i)
        elif wt == 1:
            v, i = data[i:i + 8], i + 8
        elif wt == 5:
            v, i = data[i:i + 4], i + 4
        elif wt == 2:
            n, i = _read_varint(data, i)
            v, i = data[i:i + n], i + n
            fd = desc.fields_by_number.get(fn) if desc is not None else None
            if fd is not None and fd.type == F.TYPE_MESSAGE:
                v = wire_decode(v, fd.message_type)
        else:
            raise ValueError(wt)
        out.append([fn, wt, v])
    return out


def wire_encode(fields):
    out = bytearray()
    for fn, wt, v in fields:
        out += _varint((fn << 3) | wt)
        if wt == 0:
            out += _varint(v)
        elif wt in (1, 5, 3, 4, 6, 7):
            out += v
        else:
            b = wire_encode(v) if isinstance(v, list) else v
            out += _varint(len(b)) + b
    return bytes(out)


def _wire_nodes(fields, acc):
    for node in fields:
        acc.append((fields, node))
        if node[1] == 2 and isinstance(node[2], list):
            _wire_nodes(node[2], acc)
    return acc


def wire_mutate(fields, r):
    """One schema-aware edit of the decoded tree; may return raw bytes
    (for edits that cannot be expressed as a tree)."""
    nodes = _wire_nodes(fields, [])
    if not nodes:                   # every field dropped: add one of another type
        return _raw_encode([[1, 0, 2**63]])
    parent, node = r.choice(nodes)
    k = r.choice(["wiretype", "overlong", "hugelen", "nest", "packed_many", "dup", "dup",
                  "dims", "dims", "bigvarint", "drop", "endgroup", "lenpastend", "zero_len",
                  "float_bits", "unknown_field"])
    if k == "wiretype":
        node[1] = r.choice([0, 1, 2, 5, 3, 4, 6, 7])
        if node[1] == 0:
            node[2] = r.choice([0, 1, 2**63, 2**64 - 1])
        elif node[1] == 1:
            node[2] = b"\xff" * 8
        elif node[1] == 5:
            node[2] = b"\x00\x00\xc0\x7f"
        elif node[1] == 2:
            node[2] = b"\x08\x01" if not isinstance(node[2], (bytes, list)) else node[2]
        else:
            node[2] = b""
    elif k == "overlong" and node[1] == 0:
        # a varint of 10+ bytes: continuation bits set past 64 bits
        node[1] = 1000 + node[1]           # marker: raw encoding below
        node[2] = bytes([0xFF] * r.choice([9, 10, 11, 20])) + b"\x01"
    elif k == "hugelen":
        node[1] = 2000
        node[2] = _varint(r.choice([2**31 - 1, 2**32, 2**63, 2**64 - 1, 2**28])) + b"\x00" * 8
    elif k == "nest":
        depth = r.choice([100, 1000, 20000])
        if r.random() < 0.5:       # nested length-delimited unknown fields
            inner = b""
            for _ in range(min(depth, 3000)):
                inner = _varint((15000 << 3) | 2) + _varint(len(inner)) + inner
            parent.append([1, 3000, inner])
        else:                      # nested start-groups
            parent.append([1, 3000, bytes([(9000 << 3 | 3) & 0x7F | 0x80, (9000 << 3 | 3) >> 7
                                           & 0x7F | 0x80, (9000 << 3 | 3) >> 14]) * depth])
    elif k == "packed_many":
        # a packed float field (data of a blob) or dims of millions of entries
        n = r.choice([10**5, 10**6, 5 * 10**6])
        body = struct.pack("<f", 1.0) * n if r.random() < 0.5 else _varint(1) * n
        node[1], node[2] = 2, body if not isinstance(node[2], list) else node[2]
        parent.append([r.choice([5, 1, 7, node[0]]), 2, body])
    elif k == "dup":
        parent.insert(r.randrange(len(parent) + 1), [node[0], node[1],
                                                     node[2] if not isinstance(node[2], list)
                                                     else [list(x) for x in node[2]]])
    elif k == "dims":
        # a BlobShape's packed dims with boundary values
        v = r.choice([[2**31], [2**32, 2**32], [2**63 - 1], [2**64 - 1], [0], [1] * 64,
                      [2**62, 4], [-1 & (2**64 - 1)]])
        parent.append([r.choice([7, 1]), 2, [[1, 2, b"".join(_varint(x) for x in v)]]])
    elif k == "bigvarint" and node[1] == 0:
        node[2] = r.choice([2**31, 2**32, 2**63, 2**64 - 1, 2**31 - 1])
    elif k == "drop":
        parent.remove(node)
    elif k == "endgroup":
        parent.insert(r.randrange(len(parent) + 1), [node[0], 4, b""])
    elif k == "lenpastend":
        return wire_encode(fields) + _varint((1 << 3) | 2) + _varint(r.choice([5, 2**20]))
    elif k == "zero_len" and node[1] == 2:
        node[2] = b""
    elif k == "float_bits" and node[1] in (1, 5):
        node[2] = r.choice([b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\xff\xff\xff\xff"]) \
            if node[1] == 5 else struct.pack("<d", float("nan"))
    elif k == "unknown_field":
        parent.append([r.choice([99, 536870911, 19000]), r.choice([0, 2]),
                       r.choice([1, b"xyz"]) if False else 1])
        if parent[-1][1] == 2:
            parent[-1][2] = b"xyz"
    return _raw_encode(fields)


def _raw_encode(fields):
    out = bytearray()
    for fn, wt, v in fields:
        if wt >= 3000:                       # raw bytes appended as is
            out += v
        elif wt >= 2000:                     # length-delimited, raw length + bytes
            out += _varint((fn << 3) | 2) + v
        elif wt >= 1000:                     # varint bytes given raw
            out += _varint((fn << 3) | 0) + v
        elif wt == 2:
            b = _raw_encode(v) if isinstance(v, list) else v
            out += _varint((fn << 3) | 2) + _varint(len(b)) + b
        elif wt == 0:
            out += _varint((fn << 3) | 0) + _varint(v)
        else:
            out += _varint((fn << 3) | wt) + (v if isinstance(v, bytes) else b"")
    return bytes(out)


_fz_cache = {}


def run_wire(r, base, work, ctx):
    """A caffemodel, V1 caffemodel, binaryproto or solverstate edited at the
    wire level, read where the commands read it."""
    pb = _pb()
    fbase = os.path.join(base, "fz")
    fuzzing.make_base(fbase)
    kind = r.choice(["caffemodel", "caffemodel", "caffemodel_v1", "binaryproto",
                     "solverstate", "solverstate"])
    name, desc = {"caffemodel": ("net.caffemodel", pb.NetParameter.DESCRIPTOR),
                  "caffemodel_v1": ("net_v1.caffemodel", pb.NetParameter.DESCRIPTOR),
                  "binaryproto": ("mean.binaryproto", pb.BlobProto.DESCRIPTOR),
                  "solverstate": ("snap.solverstate", pb.SolverState.DESCRIPTOR)}[kind]
    data = open(os.path.join(fbase, name), "rb").read()
    tree = wire_decode(data, desc)
    for _ in range(r.choice([1, 1, 2, 3])):
        out = wire_mutate(tree, r)
        if len(out) > 1 << 20:           # a field of millions of entries: keep it
            break
        tree = wire_decode_lenient(out, desc)
        if tree is None:
            break
    target = os.path.join(work, name)
    open(target, "wb").write(out)
    ctx["target"] = target
    ctx["names"] = {name}
    if ctx.get("write_only"):
        return
    if kind.startswith("caffemodel"):
        import caffe_ocl as caffe
        if ("net", fbase) not in _fz_cache:
            _fz_cache[("net", fbase)] = caffe.Net(os.path.join(fbase, "net.prototxt"),
                                                  caffe.TEST)
        _fz_cache[("net", fbase)].copy_from(target)
        if r.random() < 0.3:
            from caffe_ocl.proto import read_net_binary
            read_net_binary(target)
    elif kind == "binaryproto":
        from caffe_ocl.data.transformer import load_mean_file
        load_mean_file(target)
    else:
        import caffe_ocl as caffe
        if ("solver", fbase) not in _fz_cache:
            _fz_cache[("solver", fbase)] = caffe.get_solver(
                os.path.join(fbase, "solver.prototxt"))
        ctx["names"] |= {"net.caffemodel", "snap", "learned_net"}
        _fz_cache[("solver", fbase)].restore(target)


def wire_decode_lenient(data, desc):
    try:
        return wire_decode(data, desc)
    except (ValueError, IndexError):
        return None


# --------------------------------------------------------------------------
# v1mix: V0/V1/V2 mixed caffemodels, blob counts that do not match

def _v1mix_model(base, r):
    pb = _pb()
    new = pb.NetParameter()
    new.ParseFromString(open(os.path.join(base, "net.caffemodel"), "rb").read())
    old = pb.NetParameter()
    old.ParseFromString(open(os.path.join(base, "net_v1.caffemodel"), "rb").read())
    m = pb.NetParameter()
    k = r.choice(["both", "both", "v0_in_v1", "v1_params", "blob_both_shapes", "double_and_float",
                  "blob_extra", "v1_as_net", "v1_type_mix", "v0_only", "blob_legacy_neg",
                  "input_mix"])
    if k == "both":
        m.CopyFrom(old)
        m.layer.extend(r.sample(list(new.layer), r.randint(1, len(new.layer))))
    elif k == "v0_in_v1":
        m.CopyFrom(old)
        l1 = r.choice(m.layers)
        l1.layer.name = r.choice([l1.name, "other", ""])
        l1.layer.type = r.choice(["conv", "innerproduct", "relu", "bogus", ""])
        l1.layer.num_output = r.choice([0, 4, 2**32 - 1])
        if r.random() < 0.5:
            l1.layer.blobs.extend(l1.blobs)
        if r.random() < 0.5:
            l1.layer.kernelsize = r.choice([0, 3, 2**32 - 1])
        if r.random() < 0.4:
            l1.ClearField("type")
    elif k == "v1_params":
        m.CopyFrom(old)
        l1 = r.choice(m.layers)
        l1.blobs_lr.extend([r.choice(FLOAT_VALUES)] * r.choice([1, 3, 7]))
        l1.weight_decay.extend([1.0] * r.choice([1, 5]))
        l1.param.extend(["p"] * r.choice([1, 4]))
        l1.blob_share_mode.extend([1] * r.choice([1, 6]))
    elif k == "blob_both_shapes":
        m.CopyFrom(r.choice([old, new]))
        layers = m.layers if len(m.layers) else m.layer
        b = r.choice([bb for lp in layers for bb in lp.blobs])
        b.shape.dim.extend(r.choice([[4, 3, 3, 3], [1], [108], [2, 54], []]))
        b.num, b.channels = r.choice([(4, 3), (1, 1), (0, 0), (-1, -108), (2**31 - 1, 2)])
    elif k == "double_and_float":
        m.CopyFrom(r.choice([old, new]))
        layers = m.layers if len(m.layers) else m.layer
        b = r.choice([bb for lp in layers for bb in lp.blobs])
        b.double_data.extend([float(v) for v in b.data][:r.choice([0, 1, len(b.data)])])
        b.double_data.extend([float("nan"), 1e300, -1e300][:r.randint(0, 3)])
        if r.random() < 0.5:
            del b.data[:]
        if r.random() < 0.3:
            b.diff.extend([1.0] * r.choice([1, len(b.data)]))
    elif k == "blob_extra":
        m.CopyFrom(r.choice([old, new]))
        layers = m.layers if len(m.layers) else m.layer
        lp = r.choice(layers)
        for _ in range(r.choice([1, 3])):
            nb = lp.blobs.add()
            nb.shape.dim.extend(r.choice([[1], [0], [4], [2**31]]))
            nb.data.extend([0.5] * r.choice([0, 1, 4]))
    elif k == "v1_as_net":
        m.CopyFrom(old)
        for l1 in m.layers:
            l1.bottom.append(r.choice(["data", "conv", "nowhere"]))
            l1.top.append(l1.name)
    elif k == "v1_type_mix":
        m.CopyFrom(old)
        for l1 in m.layers:
            l1.type = r.choice([0, 4, 14, 18, 33, 39])
    elif k == "v0_only":
        l1 = m.layers.add()
        l1.layer.name = "conv"
        l1.layer.type = r.choice(["conv", "innerproduct", "padding", "data", "pool"])
        l1.layer.num_output = 4
        l1.layer.kernelsize = 3
        l1.layer.pad = r.choice([0, 1, 2**32 - 1])
        l1.layer.blobs.extend(old.layers[0].blobs)
        if r.random() < 0.5:
            pad = m.layers.add()
            pad.layer.name = "pad"
            pad.layer.type = "padding"
            pad.layer.pad = r.choice([1, 2**32 - 1])
            pad.top.append("x")
            l1.bottom.append(r.choice(["x", "y"]))
    elif k == "blob_legacy_neg":
        m.CopyFrom(old)
        b = r.choice([bb for lp in m.layers for bb in lp.blobs])
        b.num, b.channels, b.height, b.width = r.choice(
            [(-1, -1, 1, 108), (0, 0, 0, 0), (65536, 65536, 1, 1), (2**31 - 1, 2**31 - 1,
                                                                    2**31 - 1, 2**31 - 1)])
    else:
        m.CopyFrom(r.choice([old, new]))
        m.input.extend(["data", "data"])
        m.input_dim.extend([2, 3, 8, 8][:r.randint(0, 4)])
        if r.random() < 0.5:
            m.input_shape.add().dim.extend([2, 3, 8, 8])
    return m


def run_v1mix(r, base, work, ctx):
    import caffe_ocl as caffe
    fbase = os.path.join(base, "fz")
    fuzzing.make_base(fbase)
    m = _v1mix_model(fbase, r)
    target = os.path.join(work, "mix.caffemodel")
    open(target, "wb").write(m.SerializeToString())
    ctx["target"] = target
    ctx["names"] = {"mix.caffemodel"}
    if ctx.get("write_only"):
        return
    way = r.choice(["copy", "copy", "read", "upgrade", "net_from"])
    if way == "copy":
        if ("net", fbase) not in _fz_cache:
            _fz_cache[("net", fbase)] = caffe.Net(os.path.join(fbase, "net.prototxt"),
                                                  caffe.TEST)
        _fz_cache[("net", fbase)].copy_from(target)
    elif way == "read":
        from caffe_ocl.proto import read_net_binary
        read_net_binary(target)
    elif way == "upgrade":
        from caffe_ocl.commands import upgrade_net_proto_binary as up
        rc = up.main([target, os.path.join(work, "up.caffemodel")])
        if rc not in (0, None):
            raise Finding(f"upgrade_net_proto_binary returned {rc}")
    else:
        # the caffemodel read as a net definition (pycaffe allows binary nets)
        net = caffe.Net(target, caffe.TEST)
        net.forward()


# --------------------------------------------------------------------------
# datum: a valid LMDB of hostile Datum records

def _hostile_datum(r, i):
    pb = _pb()
    import cv2
    d = pb.Datum(channels=3, height=4, width=4, label=i % 3)
    d.data = bytes(48)
    k = r.choice(["short", "long", "float_and_bytes", "floats_short", "overflow", "zero",
                  "neg", "encoded_garbage", "encoded_trunc", "encoded_gray", "encoded_16bit",
                  "encoded_big", "encoded_channels", "label", "nan_floats", "empty_value",
                  "not_datum", "mixed_shape", "encoded_flag_raw"])
    if k == "short":
        d.data = bytes(r.choice([0, 1, 47]))
    elif k == "long":
        d.data = bytes(49)
    elif k == "float_and_bytes":
        d.float_data.extend([0.5] * 48)
    elif k == "floats_short":
        d.ClearField("data")
        d.float_data.extend([0.5] * r.choice([0, 1, 47, 49]))
    elif k == "overflow":
        d.channels, d.height, d.width = r.choice([(2**31 - 1, 2**31 - 1, 2**31 - 1),
                                                  (65536, 65536, 1), (2**16, 2**16, 2**16),
                                                  (1, 1, 2**31 - 1)])
    elif k == "zero":
        d.channels, d.height, d.width = r.choice([(0, 4, 4), (3, 0, 4), (0, 0, 0)])
        d.data = b""
    elif k == "neg":
        d.channels, d.height, d.width = r.choice([(-3, 4, 4), (3, -4, -4), (-1, -1, 48)])
    elif k.startswith("encoded"):
        d.encoded = True
        png = cv2.imencode(".png", np.full((4, 4, 3), 7, np.uint8))[1].tobytes()
        if k == "encoded_garbage":
            d.data = bytes(r.randrange(256) for _ in range(r.choice([0, 1, 8, 100])))
        elif k == "encoded_trunc":
            d.data = png[:r.randrange(len(png))]
        elif k == "encoded_gray":
            d.data = cv2.imencode(".png", np.full((4, 4), 7, np.uint8))[1].tobytes()
        elif k == "encoded_16bit":
            d.data = cv2.imencode(".png", np.full((4, 4, 3), 40000, np.uint16))[1].tobytes()
        elif k == "encoded_big":
            hdr = bytearray(png)
            hdr[16:20] = (60000).to_bytes(4, "big")
            hdr[20:24] = (60000).to_bytes(4, "big")
            d.data = bytes(hdr)
        elif k == "encoded_channels":
            d.data = cv2.imencode(".png", np.full((5, 7, 4), 7, np.uint8))[1].tobytes()
        else:
            d.data = png
            d.channels, d.height, d.width = 1, 9, 9
    elif k == "label":
        d.label = r.choice([-1, 2**31 - 1, -2**31, 1000])
    elif k == "nan_floats":
        d.ClearField("data")
        d.float_data.extend([float("nan"), float("inf")] * 24)
    elif k == "empty_value":
        return b""
    elif k == "not_datum":
        return r.choice([b"\xff" * 10, b"\x08", pb.NetParameter(name="x").SerializeToString(),
                         b"\x0a\xff\xff\xff\xff\x0f"])
    elif k == "mixed_shape":
        d.channels, d.height, d.width = 1, 6, 8
        d.data = bytes(48)
    else:
        d.encoded = False
        d.data = cv2.imencode(".png", np.full((4, 4, 3), 7, np.uint8))[1].tobytes()
    return d.SerializeToString()


DATUM_NET = """name: "fzd"
layer { name: "data" type: "Data" top: "data" top: "label"
  data_param { source: "{db}" backend: LMDB batch_size: 2 }
  transform_param { {tp} } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def run_datum(r, base, work, ctx):
    import caffe_ocl as caffe
    from caffe_ocl.data.db import LMDBWriter
    pb = _pb()
    db = os.path.join(work, "db")
    n = r.choice([1, 3, 6])
    bad = {r.randrange(n) for _ in range(r.choice([1, 1, 2]))}
    with LMDBWriter(db) as w:
        for i in range(n):
            if i in bad:
                v = _hostile_datum(r, i)
            else:
                v = pb.Datum(channels=3, height=4, width=4, label=i % 3,
                             data=bytes(range(i, i + 48))).SerializeToString()
            w.put(f"{i:08d}", v)
    ctx["target"] = db
    ctx["names"] = {"db", "'data'"}
    if ctx.get("write_only"):
        return
    tp = r.choice(["", "scale: 0.5", "crop_size: 3", "crop_size: 5", "mirror: true",
                   "mean_value: 1 mean_value: 2", "mean_value: 1 mean_value: 2 mean_value: 3",
                   "force_color: true", "force_gray: true", "crop_size: 2147483647"])
    way = r.choice(["net", "net", "mean", "mean_cmd"])
    if way == "net":
        net_path = os.path.join(work, "datum.prototxt")
        open(net_path, "w").write(DATUM_NET.replace("{db}", db).replace("{tp}", tp))
        ctx["names"] |= {"datum.prototxt"}
        net = caffe.Net(net_path, caffe.TRAIN)
        for _ in range(n):
            net.forward()
            net.backward()
    elif way == "mean":
        from caffe_ocl.data.tools import compute_image_mean
        compute_image_mean(db)
    else:
        from caffe_ocl.commands import compute_image_mean as cmd
        rc = cmd.main([db, os.path.join(work, "mean.binaryproto")])
        if rc not in (0, None):
            raise Finding(f"compute_image_mean returned {rc}")


# --------------------------------------------------------------------------
# onnxsem: small ONNX graphs built op by op with hostile attributes,
# initializers and wiring

ONNX_INT = [0, 1, 2, 3, -1, -2, -5, 7, 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1, -2**63]
ONNX_FLOAT = [0.0, 1.0, -1.0, 1e-5, float("nan"), float("inf"), -float("inf"), 1e38]


def _onnx_node(r, x, shape, i, inits):
    """One node reading ``x`` (4-D ``shape``): (node, out name); ``inits``
    gets the initializers it needs."""
    from onnx import helper, numpy_helper
    out = f"y{i}"
    c = shape[1]
    op = r.choice(["Conv", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "Gemm",
                   "MatMul", "BatchNormalization", "Reshape", "Reshape", "Transpose",
                   "Slice", "Pad", "Concat", "Split", "Gather", "Flatten", "Squeeze",
                   "Unsqueeze", "Softmax", "Clip", "Add", "Mul", "LRN", "ReduceMean",
                   "Resize", "Upsample", "Expand", "Tile", "ConstantOfShape", "Relu",
                   "LeakyRelu", "Pow", "PRelu", "Cast", "GlobalAveragePool"])
    attrs, inputs = {}, [x]

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        inputs.append(name)

    if op in ("Conv", "ConvTranspose"):
        k = r.choice([1, 3])
        g = r.choice([1, 1, c, 2])
        oc = r.choice([2, 4, c])
        wshape = (oc, max(1, c // g), k, k) if op == "Conv" else (c, max(1, oc // g), k, k)
        init(f"w{i}", np.full(wshape, 0.1, np.float32))
        if r.random() < 0.5:
            init(f"b{i}", np.zeros(oc, np.float32))
        attrs = {"kernel_shape": [k, k], "group": g, "pads": [0, 0, 0, 0],
                 "strides": [1, 1], "dilations": [1, 1]}
    elif op in ("MaxPool", "AveragePool"):
        attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]}
        if r.random() < 0.3:
            attrs["ceil_mode"] = 1
    elif op == "Gemm":
        inputs = []
        fl = f"f{i}"
        pre = helper.make_node("Flatten", [x], [fl], axis=1)
        inputs.append(fl)
        n_in = int(np.prod(shape[1:]))
        init(f"w{i}", np.full((3, n_in), 0.1, np.float32))
        init(f"b{i}", np.zeros(3, np.float32))
        attrs = {"transB": 1, "alpha": 1.0, "beta": 1.0}
        node = helper.make_node(op, inputs, [out], **_hostile(attrs, r))
        return [pre, node], out
    elif op == "MatMul":
        init(f"w{i}", np.full((shape[-1], 3), 0.1, np.float32))
    elif op == "BatchNormalization":
        for nm in ("s", "bb", "m", "v"):
            init(f"{nm}{i}", np.ones(c, np.float32))
        attrs = {"epsilon": 1e-5, "momentum": 0.9}
    elif op == "Reshape":
        init(f"s{i}", np.array(r.choice([[0, -1], [1, -1], [-1], [2**31, -1], [0, 0, -1, 1],
                                         [-1, -1], [0, 2**40], [1, 0], [2**62, 2**62]]),
                               np.int64))
        attrs = {"allowzero": r.choice([0, 1])} if r.random() < 0.2 else {}
    elif op == "Transpose":
        attrs = {"perm": r.choice([[0, 2, 3, 1], [0, 1, 3, 2], [0, 0, 1, 2], [3, 2, 1, 0, 4]])}
    elif op == "Slice":
        init(f"st{i}", np.array([r.choice([0, 1, -1, 2**62, -2**63])], np.int64))
        init(f"en{i}", np.array([r.choice([1, 2**63 - 1, -1, 0, 2**31])], np.int64))
        init(f"ax{i}", np.array([r.choice([1, 2, 3, -1, 7])], np.int64))
        if r.random() < 0.5:
            init(f"sp{i}", np.array([r.choice([1, 2, -1, 0, 2**62])], np.int64))
    elif op == "Pad":
        init(f"p{i}", np.array(r.choice([[0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 2**31, 0, 0, 0, 0, 0],
                                         [0, 0, -1, -1, 0, 0, -1, -1], [1] * 8, [0, 0, 1]]),
                               np.int64))
        attrs = {"mode": r.choice(["constant", "reflect", "edge", "wrap", "bogus"])}
    elif op == "Concat":
        inputs.append(x)
        attrs = {"axis": 1}
    elif op == "Split":
        attrs = {"axis": 1}
        if r.random() < 0.5:
            init(f"sp{i}", np.array(r.choice([[1, c - 1], [c, 0], [c + 1, -1], [2**40, 1]]),
                                    np.int64))
        node = helper.make_node(op, inputs, [out, out + "b"], **_hostile(attrs, r))
        return [node], out
    elif op == "Gather":
        init(f"ix{i}", np.array(r.choice([[0], [1, 0], [-1], [2**40], [c]]), np.int64))
        attrs = {"axis": 1}
    elif op in ("Flatten", "Softmax"):
        attrs = {"axis": 1}
    elif op in ("Squeeze", "Unsqueeze"):
        init(f"ax{i}", np.array(r.choice([[0], [1], [-1], [9], [0, 0]]), np.int64))
    elif op == "Clip":
        init(f"lo{i}", np.array(r.choice([0.0, float("nan"), 1.0]), np.float32))
        init(f"hi{i}", np.array(r.choice([6.0, -1.0, float("inf")]), np.float32))
    elif op in ("Add", "Mul", "Pow", "PRelu"):
        init(f"k{i}", np.full(r.choice([(1,), (c,), (1, c, 1, 1), (c + 1,), (2, 2, 2, 2, 2)]),
                              0.5, np.float32))
    elif op == "LRN":
        attrs = {"size": 3, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    elif op == "ReduceMean":
        attrs = {"axes": [2, 3], "keepdims": 1}
    elif op in ("Resize", "Upsample"):
        inputs.append("")
        init(f"sc{i}", np.array(r.choice([[1, 1, 2, 2], [1, 1, 1e9, 1e9], [1, 1, 0, 0],
                                          [1, 1, -2, 2], [1, 1, float("nan"), 2]]), np.float32))
        attrs = {"mode": r.choice(["nearest", "linear", "cubic"])}
        if op == "Upsample":
            inputs.pop(1)
    elif op in ("Expand", "Tile"):
        init(f"e{i}", np.array(r.choice([[1, 1, 2, 2], [2**20, 1, 1, 1], [1, 1, 2**31, 1]]),
                               np.int64))
    elif op == "ConstantOfShape":
        inputs = []
        init(f"cs{i}", np.array(r.choice([[1, 2], [2**31, 2**31], [0], [-1]]), np.int64))
    elif op == "LeakyRelu":
        attrs = {"alpha": 0.1}
    elif op == "Cast":
        attrs = {"to": r.choice([1, 7, 8, 11, 0, 99])}
    node = helper.make_node(op, inputs, [out], **_hostile(attrs, r))
    return [node], out


def _hostile(attrs, r):
    attrs = dict(attrs)
    if attrs and r.random() < 0.6:
        key = r.choice(sorted(attrs))
        v = attrs[key]
        if isinstance(v, list):
            v = list(v)
            if v and r.random() < 0.8:
                v[r.randrange(len(v))] = r.choice(ONNX_INT)
            else:
                v = v[:r.randrange(len(v) + 1)] + [r.choice(ONNX_INT)] * r.choice([1, 3])
        elif isinstance(v, float):
            v = r.choice(ONNX_FLOAT)
        elif isinstance(v, int):
            v = r.choice(ONNX_INT)
        else:
            v = r.choice(["", "bogus", "\xe9"])
        attrs[key] = v
    if r.random() < 0.1:
        attrs[r.choice(["auto_pad", "storage_order", "output_padding", "output_shape",
                        "nonsense"])] = r.choice(["SAME_UPPER", "VALID", "SAME_LOWER", 1,
                                                  [1, 1], [2**40, 1]])
    return attrs


def _build_onnx(r):
    import onnx
    from onnx import TensorProto, helper
    shape = [1, r.choice([1, 2, 4]), r.choice([1, 4, 6]), r.choice([4, 6])]
    if r.random() < 0.1:
        shape[r.randrange(4)] = r.choice([0, 2**31, 2**40, -1])
    nodes, inits = [], []
    x = "x"
    for i in range(r.choice([1, 1, 2, 3])):
        ns, x = _onnx_node(r, x, [max(1, min(d, 8)) for d in shape], i, inits)
        nodes += ns
    k = r.random()
    if k < 0.1 and inits:          # an initializer whose data does not fill its dims
        t = r.choice(inits)
        if len(t.dims):
            t.dims[0] = t.dims[0] + r.choice([1, 2**40])
        else:
            t.dims.append(r.choice([0, 2]))
    elif k < 0.15 and len(nodes) > 1:   # a cycle
        nodes[0].input[0] = nodes[-1].output[0]
    elif k < 0.2:                  # a missing input
        nodes[-1].input.append("ghost")
    elif k < 0.25 and inits:       # an initializer of another type
        t = r.choice(inits)
        t.data_type = r.choice([TensorProto.STRING, TensorProto.INT8, TensorProto.DOUBLE,
                                TensorProto.BOOL, 0, 17])
    elif k < 0.3 and inits:        # an initializer that is also a graph input
        t = r.choice(inits)
        nodes[0].input[0] = t.name
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            x, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", r.choice(
        [11, 13, 13, 13, 17, 9]))])
    m.ir_version = 8
    return m


def run_onnxsem(r, base, work, ctx):
    import caffe_ocl as caffe
    from caffe_ocl.onnx.to_caffe import onnx2caffe
    m = _build_onnx(r)
    target = os.path.join(work, "model.onnx")
    open(target, "wb").write(m.SerializeToString())
    ctx["target"] = target
    ctx["names"] = {"model.onnx", "o.prototxt", "o.caffemodel"}
    if ctx.get("write_only"):
        return
    proto, weights = os.path.join(work, "o.prototxt"), os.path.join(work, "o.caffemodel")
    onnx2caffe(target, proto, weights)
    net = caffe.Net(proto, weights, caffe.TEST)
    net.forward()


# --------------------------------------------------------------------------
# solverval: solver prototxts with hostile values; snapshots never lost

SOLVER_NET = """name: "fs"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 }
    data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
  include { phase: TEST } }
"""

SOLVER_BASE = """net: "{net}"
type: "SGD" base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "step"
gamma: 0.5 stepsize: 2 display: 1 average_loss: 2 max_iter: 2 iter_size: 1
snapshot: 1 snapshot_prefix: "{prefix}" random_seed: 3 test_iter: 1 test_interval: 1
test_initialization: true
"""

SENTINEL = b"an earlier snapshot the user keeps"


def run_solverval(r, base, work, ctx):
    import caffe_ocl as caffe
    from google.protobuf import text_format
    pb = _pb()
    net = os.path.join(work, "net.prototxt")
    open(net, "w").write(SOLVER_NET)
    snapdir = os.path.join(work, "snaps")
    os.makedirs(snapdir)
    prefix = os.path.join(snapdir, "s")
    sp = pb.SolverParameter()
    text_format.Parse(SOLVER_BASE.replace("{net}", net).replace("{prefix}", prefix), sp)
    for _ in range(r.choice([1, 2, 3])):
        k = r.random()
        if k < 0.55:
            mutate_message(sp, r)
        elif k < 0.7:
            sp.snapshot_prefix = r.choice([
                os.path.join(work, "missing", "dir", "s"), os.path.join(work, "ro", "s"),
                snapdir + "/", "/dev/null/s", os.path.join(work, "file_not_dir", "s"),
                os.path.join(snapdir, "link", "s"), "", prefix + "\u00e9" * 200,
                prefix + "x" * 300, os.path.join(snapdir, ".")])
        elif k < 0.85:
            fld = r.choice(["max_iter", "test_iter", "test_interval", "snapshot", "display",
                            "average_loss", "iter_size", "stepsize", "max_iter"])
            val = r.choice([-1, 0, -2**31, 2**31 - 1, 3])
            if fld == "test_iter":
                sp.test_iter[:] = [val] * r.choice([1, 2])
            else:
                setattr(sp, fld, val)
        else:
            fld = r.choice(["base_lr", "momentum", "gamma", "power", "weight_decay",
                            "clip_gradients", "delta", "momentum2", "rms_decay"])
            setattr(sp, fld, r.choice(FLOAT_VALUES))
    os.makedirs(os.path.join(work, "ro"))
    os.chmod(os.path.join(work, "ro"), 0o500)
    open(os.path.join(work, "file_not_dir"), "w").close()
    os.symlink(work, os.path.join(snapdir, "link"))
    # earlier snapshots that must survive any failed write
    olds = {}
    for it in (1, 2):
        for ext in (".caffemodel", ".solverstate", ".caffemodel.h5", ".solverstate.h5"):
            p = f"{prefix}_iter_{it}{ext}"
            open(p, "wb").write(SENTINEL)
            olds[p] = SENTINEL
    target = os.path.join(work, "solver.prototxt")
    data = text_format.MessageToString(sp).encode()
    open(target, "wb").write(data)
    ctx["target"] = target
    ctx["names"] = {"solver.prototxt", "net.prototxt", "snaps", "'data'", "'ip'", "'loss'",
                    "/dev/null", "missing", "file_not_dir", "ro/", "link"}
    if ctx.get("write_only"):
        return
    cwd = os.getcwd()
    os.chdir(work)
    try:
        s = caffe.get_solver(target)
        try:
            n = max(0, min(3, s.param.max_iter))
            if 0 < s.param.iter_size <= 4 and all(0 <= t <= 4 for t in s.param.test_iter):
                s.step(n)
                if r.random() < 0.5:
                    s.snapshot()
        finally:
            _check_snapshots(snapdir, prefix, olds)
    finally:
        os.chdir(cwd)


def _check_snapshots(snapdir, prefix, olds):
    """Every snapshot file is the earlier one untouched or a complete new one;
    no temp file is left behind."""
    for name in os.listdir(snapdir):
        p = os.path.join(snapdir, name)
        if os.path.islink(p):
            continue
        if ".tmp" in name:
            raise Finding(f"temp file left behind: {name}")
        data = open(p, "rb").read()
        if data == SENTINEL:
            continue
        if p.endswith(".h5"):
            import h5py
            try:
                h5py.File(p, "r").close()
            except Exception as e:  # noqa: BLE001
                raise Finding(f"snapshot {name} is not a complete HDF5 file: {e}") from None
        elif p.endswith((".caffemodel", ".solverstate")):
            pb_msg = _pb().NetParameter() if p.endswith(".caffemodel") else \
                _pb().SolverState()
            try:
                pb_msg.ParseFromString(data)
            except Exception as e:  # noqa: BLE001
                raise Finding(f"snapshot {name} is half-written: {e}") from None
    for p in olds:
        if not os.path.exists(p):
            raise Finding(f"an earlier snapshot was removed: {os.path.basename(p)}")


# --------------------------------------------------------------------------
# chain: random small DAGs of the layers the plan passes fuse (convolution +
# BatchNorm/Scale/activation folding, residual Eltwise, Concat in place,
# Swish/SE gates, permutation 1x1s), in place or not, TEST and TRAIN

def _chain_layer(r, i, blobs, shapes, net):
    """Append one random layer reading earlier blobs; returns nothing."""
    pb = _pb()
    from google.protobuf import text_format
    src = r.choice(blobs)
    c = shapes[src][1]
    name = f"l{i}"
    # in place only on a blob nothing read yet (Caffe: after a Split, "produced by
    # multiple sources")
    consumed = {b for l in net.layer for b in l.bottom}
    inplace = r.random() < 0.5 and src not in consumed
    kind = r.choice(["Convolution", "Convolution", "Convolution", "BatchNorm", "Scale",
                     "ReLU", "Sigmoid", "TanH", "Power", "Eltwise", "Eltwise", "Concat",
                     "Concat", "Pooling", "Slice", "InnerProduct", "Swish", "Clip", "PReLU",
                     "Deconvolution", "Dropout", "Bias", "ELU"])
    top = src if inplace and kind in ("BatchNorm", "Scale", "ReLU", "Sigmoid", "TanH", "Power",
                                      "Swish", "Clip", "PReLU", "Dropout", "Bias",
                                      "ELU") else f"b{i}"
    lp = net.layer.add(name=name, type=kind)
    out_shape = list(shapes[src])
    if kind in ("Convolution", "Deconvolution"):
        k = r.choice([1, 1, 3])
        oc = r.choice([1, 2, 4, c, 8])
        g = r.choice([1, 1, c]) if kind == "Convolution" and oc % c == 0 else 1
        text = (f"convolution_param {{ num_output: {oc} kernel_size: {k} pad: {k // 2} "
                f"group: {g} bias_term: {str(r.random() < 0.6).lower()} "
                f"weight_filler {{ type: 'gaussian' std: 0.3 }} "
                f"bias_filler {{ type: 'constant' value: 0.1 }} }}")
        text_format.Parse(text.replace("'", '"'), lp)
        lp.bottom.append(src)
        out_shape[1] = oc
    elif kind == "BatchNorm":
        lp.bottom.append(src)
        lp.batch_norm_param.use_global_stats = r.random() < 0.7
        if r.random() < 0.3:
            lp.batch_norm_param.eps = r.choice([1e-5, 0.0, 1.0])
    elif kind in ("Scale", "Bias"):
        lp.bottom.append(src)
        if kind == "Scale":
            lp.scale_param.bias_term = r.random() < 0.6
            lp.scale_param.filler.type = "uniform"
        if r.random() < 0.2:       # a second bottom: the scale itself (SE style)
            other = [b for b in blobs if shapes[b][:2] == shapes[src][:2] and
                     b != src]
            if other:
                lp.bottom.append(other[0])
    elif kind in ("ReLU", "Sigmoid", "TanH", "Swish", "Clip", "PReLU", "Dropout", "ELU"):
        lp.bottom.append(src)
        if kind == "ReLU" and r.random() < 0.3:
            lp.relu_param.negative_slope = 0.1
        if kind == "Clip":
            lp.clip_param.min, lp.clip_param.max = r.choice([(0, 6), (-1, 1), (1, -1)])
    elif kind == "Power":
        lp.bottom.append(src)
        lp.power_param.power = r.choice([1, 2, 0.5])
        lp.power_param.scale = r.choice([1, 0.5])
        lp.power_param.shift = r.choice([0, 1, 3])
    elif kind in ("Eltwise", "Concat"):
        same = [b for b in blobs if shapes[b] == shapes[src]] if kind == "Eltwise" else \
            [b for b in blobs if shapes[b][0] == shapes[src][0] and
             shapes[b][2:] == shapes[src][2:]]
        k = r.choice([2, 2, 3])
        picks = [src] + [r.choice(same) for _ in range(k - 1)]
        lp.bottom.extend(picks)
        if kind == "Eltwise":
            lp.eltwise_param.operation = r.choice([0, 1, 2])
            if lp.eltwise_param.operation == 1 and r.random() < 0.5:
                lp.eltwise_param.coeff.extend([1.0, -1.0, 0.5][:k])
        else:
            out_shape[1] = sum(shapes[b][1] for b in picks)
    elif kind == "Pooling":
        lp.bottom.append(src)
        lp.pooling_param.pool = r.choice([0, 1])
        if r.random() < 0.5:
            lp.pooling_param.global_pooling = True
            out_shape[2:] = [1, 1]
        else:
            lp.pooling_param.kernel_size = 1
            lp.pooling_param.stride = 1
    elif kind == "Slice":
        if c < 2:
            lp.type = "Split"
            lp.bottom.append(src)
            lp.top.extend([f"b{i}", f"b{i}x"])
            shapes[f"b{i}x"] = tuple(out_shape)
            blobs.append(f"b{i}x")
            shapes[f"b{i}"] = tuple(out_shape)
            blobs.append(f"b{i}")
            return
        lp.bottom.append(src)
        lp.slice_param.axis = 1
        lp.top.extend([f"b{i}", f"b{i}x"])
        out_shape[1] = 1
        s2 = list(shapes[src])
        s2[1] = c - 1
        shapes[f"b{i}x"] = tuple(s2)
        blobs.append(f"b{i}x")
        shapes[f"b{i}"] = tuple(out_shape)
        blobs.append(f"b{i}")
        return
    elif kind == "InnerProduct":
        lp.bottom.append(src)
        n = r.choice([2, 4, int(np.prod(shapes[src][1:]))])
        lp.inner_product_param.num_output = n
        lp.inner_product_param.weight_filler.type = "gaussian"
        lp.inner_product_param.weight_filler.std = 0.2
        lp.inner_product_param.bias_term = r.random() < 0.5
        out_shape = [shapes[src][0], n, 1, 1]
        if r.random() < 0.5:
            lp.inner_product_param.axis = 1
        top = f"b{i}"
        lp.top.append(top)
        # reshape back to 4-D so later layers can read it
        shapes[top] = (shapes[src][0], n)
        lr = net.layer.add(name=f"r{i}", type="Reshape", bottom=[top], top=[f"b{i}r"])
        lr.reshape_param.shape.dim.extend([0, -1, 1, 1])
        shapes[f"b{i}r"] = tuple(out_shape)
        blobs.append(f"b{i}r")
        return
    lp.top.append(top)
    shapes[top] = tuple(out_shape)
    if top not in blobs:
        blobs.append(top)


def run_chain(r, base, work, ctx):
    import caffe_ocl as caffe
    from caffe_ocl.proto import write_text
    pb = _pb()
    net = pb.NetParameter(name="chain")
    shape = (r.choice([1, 2]), r.choice([1, 2, 3, 4]), r.choice([1, 3, 5]), r.choice([1, 4]))
    lp = net.layer.add(name="in", type="Input", top=["data"])
    lp.input_param.shape.add().dim.extend(shape)
    blobs, shapes = ["data"], {"data": shape}
    for i in range(r.choice([2, 3, 4, 6, 8])):
        _chain_layer(r, i, blobs, shapes, net)
    phase = r.choice([caffe.TEST, caffe.TEST, caffe.TRAIN])
    if phase == caffe.TRAIN:
        last = net.layer[-1].top[0] if len(net.layer[-1].top) else "data"
        net.layer.add(name="loss", type="Reduction", bottom=[last], top=["loss"],
                      loss_weight=[1.0]).reduction_param.operation = r.choice([1, 3])
    target = os.path.join(work, "chain.prototxt")
    write_text(net, target)
    ctx["target"] = target
    ctx["names"] = {"chain.prototxt"} | {f"'{lp.name}'" for lp in net.layer}
    if ctx.get("write_only"):
        return
    n = caffe.Net(target, phase)
    rs = np.random.RandomState(r.randrange(1000))
    n.blobs["data"].data[...] = rs.randn(*shape)
    for _ in range(3):                  # the third TEST forward replays the trace
        out = n.forward()
        if phase == caffe.TRAIN:
            n.backward()
    for k, v in out.items():
        np.asarray(v)
    if r.random() < 0.3:               # a new input shape: every plan again
        n.blobs["data"].reshape(shape[0] + 1, *shape[1:])
        n.reshape()
        n.forward()


# --------------------------------------------------------------------------
# main

def write_case(fmt, seed, base, work):
    """Write the case's files without running them (for command-level runs):
    (the main file, ctx)."""
    r = random.Random(f"struct:{fmt}:{seed}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ctx = {"target": None, "names": set(), "write_only": True}
    RUNNERS[fmt](r, base, work, ctx)
    return ctx["target"], ctx


def run_case(fmt, seed, base, work):
    from caffe_ocl.errors import CaffeOclError
    if fmt == "mix":          # every format in turn: one child for a short run
        fmt = FORMATS[seed % len(FORMATS)]
        seed //= len(FORMATS)
    r = random.Random(f"struct:{fmt}:{seed}")
    if os.path.isdir(work):
        for dp, dn, _ in os.walk(work):
            for d in dn:
                os.chmod(os.path.join(dp, d), 0o700)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ctx = {"target": None, "names": set()}
    try:
        if fmt == "layer":
            run_layer(r, work, ctx)
        elif fmt == "graph":
            run_graph(r, work, ctx)
        elif fmt == "wire":
            run_wire(r, base, work, ctx)
        elif fmt == "v1mix":
            run_v1mix(r, base, work, ctx)
        elif fmt == "datum":
            run_datum(r, base, work, ctx)
        elif fmt == "onnxsem":
            run_onnxsem(r, base, work, ctx)
        elif fmt == "solverval":
            run_solverval(r, base, work, ctx)
        elif fmt == "chain":
            run_chain(r, base, work, ctx)
        else:
            raise ValueError(fmt)
        return "ok", ""
    except CaffeOclError as e:
        msg = str(e)
        if "\n" in msg.strip():
            raise Finding(f"multi-line message: {msg!r}")
        names, target = set(ctx["names"]), ctx["target"]
        if target:
            names |= {os.path.basename(target), target}
        if not any(n and n in msg for n in names):
            raise Finding(f"message names no file or layer: {msg!r}")
        return "error", msg
    except Finding:
        raise
    except Exception as e:  # noqa: BLE001 - that is the finding
        if isinstance(e, Finding):
            raise
        tb = traceback.extract_tb(e.__traceback__)
        where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in tb[-3:][::-1])
        raise Finding(f"{type(e).__name__}: {str(e)[:300]!r} at {where}") from None


def make_base(base):
    os.makedirs(base, exist_ok=True)


RUNNERS = {"layer": lambda r, base, work, ctx: run_layer(r, work, ctx),
           "graph": lambda r, base, work, ctx: run_graph(r, work, ctx),
           "wire": run_wire, "v1mix": run_v1mix, "datum": run_datum, "onnxsem": run_onnxsem,
           "solverval": run_solverval, "chain": run_chain}


def main(argv):
    return fuzzing.main(argv, run_case, make_base, Finding)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
