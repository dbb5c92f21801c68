"""What caffe_ocl knows about Caffe forks' layer types and fields, for
errors that say where an unknown type or field comes from, and the text of
custom layer types' ``*_param`` blocks (``caffe_ocl.register_layer``).

``FORK_TYPES`` and ``FORK_FIELDS`` name the fork a layer type or a
``LayerParameter`` field comes from. Types and fields that caffe_ocl
implements never reach these tables' users (they parse and build).
"""
import re

from . import caffe_pb2

SSD = "the SSD fork (weiliu89/caffe, branch ssd)"
FRCNN = "Fast/Faster R-CNN's fork (rbgirshick/caffe-fast-rcnn, py-faster-rcnn)"
RFCN = "R-FCN's fork (daijifeng001/caffe-rfcn)"
PSPNET = "PSPNet/DeepLab's fork (hszhao/PSPNet, DeepLab v2)"
SEGNET = "SegNet's fork (alexgkendall/caffe-segnet)"
ENET = "ENet's fork (TimoSaemann/caffe-enet)"
YOLO = "the YOLO ports to Caffe (e.g. ChenYingpeng/caffe-yolov3)"
MOBILENET = "the MobileNet forks (yonghenglh6/DepthwiseConvolution, Caffe-MobileNetV2)"
SHUFFLENET = "ShuffleNet's fork (farmingyard/ShuffleNet)"
SENET = "SENet's fork (hujie-frank/SENet)"
NVCAFFE = "NVIDIA's Caffe (NVIDIA/caffe)"
INTEL = "Intel's Caffe (intel/caffe)"
CENTERLOSS = "the center-loss fork (ydwen/caffe-face)"
OPENPOSE = "OpenPose's fork (CMU-Perceptual-Computing-Lab/caffe_train)"
MOBILENET_YOLO = "the MobileNet-YOLO fork (eric612/MobileNet-YOLO)"
DEEPLAB = "DeepLab v2's fork (deeplab-public-ver2)"
CTPN = "CTPN's fork (tianzhi0549/CTPN)"
CAFFE_OCR = "the CRNN OCR fork (senlinuc/caffe_ocr)"
REFINEDET = "RefineDet's fork (sfzhang15/RefineDet)"
SOEAVER_INTERP = ("soeaver's Interp (soeaver/caffe-model's FPN nets; size from the second "
                  "bottom, which caffe_ocl's Interp does whenever it has two bottoms: "
                  "remove the line)")

# layer type -> fork
FORK_TYPES = {
    "Normalize": SSD, "Permute": SSD, "PriorBox": SSD, "DetectionOutput": SSD,
    "MultiBoxLoss": SSD, "AnnotatedData": SSD, "DetectionEvaluate": SSD, "VideoData": SSD,
    "SmoothL1Loss": SSD + " and " + FRCNN,
    "ROIPooling": FRCNN, "Proposal": FRCNN, "PSROIPooling": RFCN, "BoxAnnotatorOHEM": RFCN,
    "Interp": PSPNET, "Upsample": SEGNET + " and " + YOLO, "BN": ENET,
    "Yolo": YOLO, "YoloDetectionOutput": YOLO, "Region": YOLO, "Reorg": YOLO,
    "DepthwiseConvolution": MOBILENET, "ConvolutionDepthwise": MOBILENET, "ReLU6": MOBILENET,
    "ShuffleChannel": SHUFFLENET, "Axpy": SENET, "CenterLoss": CENTERLOSS,
    "Resize": OPENPOSE, "Nms": OPENPOSE, "BodyPartConnection": OPENPOSE,
    "DenseImageData": SEGNET, "RegionLoss": YOLO, "EvalDetection": YOLO,
    "Yolov3DetectionOutput": MOBILENET_YOLO, "Yolov3": MOBILENET_YOLO,
    "ImageSegData": DEEPLAB, "MatWrite": DEEPLAB, "MatRead": DEEPLAB,
    "SegAccuracy": DEEPLAB, "DenseCRF": DEEPLAB, "DomainTransform": DEEPLAB,
    "UniqueLabel": DEEPLAB, "Lstm": CTPN, "Reverse": CTPN, "Transpose": CTPN,
    "CTCGreedyDecoder": CAFFE_OCR, "DenseBlock": CAFFE_OCR, "WarpCTCLoss": CAFFE_OCR,
    "ReverseTime": CAFFE_OCR,
}

# LayerParameter (or other message) field -> fork
FORK_FIELDS = {
    "norm_param": SSD, "permute_param": SSD, "prior_box_param": SSD,
    "detection_output_param": SSD, "multibox_loss_param": SSD, "annotated_data_param": SSD,
    "detection_evaluate_param": SSD, "video_data_param": SSD, "resize_param": SSD,
    "noise_param": SSD, "distort_param": SSD, "expand_param": SSD, "emit_constraint": SSD,
    "batch_sampler": SSD, "label_map_file": SSD,
    "roi_pooling_param": FRCNN, "proposal_param": FRCNN + " (OpenCV's numbering)",
    "smooth_l1_loss_param": FRCNN, "psroi_pooling_param": RFCN,
    "box_annotator_ohem_param": RFCN,
    "interp_param": PSPNET, "upsample_param": SEGNET + " and " + YOLO, "bn_param": ENET,
    "ceil_mode": "the DenseNet/PSPNet ports' Pooling (and OpenCV's caffe.proto)",
    "dense_image_data_param": SEGNET, "label_type": DEEPLAB + " (ImageSegData)",
    "mat_write_param": DEEPLAB, "mat_read_param": DEEPLAB, "seg_accuracy_param": DEEPLAB,
    "dense_crf_param": DEEPLAB, "domain_transform_param": DEEPLAB, "region_loss_param": YOLO,
    "eval_detection_param": YOLO, "yolo_detection_output_param": MOBILENET_YOLO,
    "yolov3_detection_output_param": MOBILENET_YOLO, "yolov3_param": MOBILENET_YOLO,
    "region_param": YOLO, "reorg_param": YOLO, "yolo_param": YOLO,
    "shuffle_channel_param": SHUFFLENET, "axpy_param": SENET,
    "center_loss_param": CENTERLOSS, "raw_data": NVCAFFE, "raw_data_type": NVCAFFE,
    "multinode": INTEL, "engine": INTEL + " (a string engine field)",
    "lstm_param": CTPN, "transpose_param": CTPN, "reverse_param": CTPN,
    "ctc_decoder_param": CAFFE_OCR, "ctc_loss_param": CAFFE_OCR,
    "denseblock_param": CAFFE_OCR, "reverse_time_param": CAFFE_OCR,
    "objectness_score": REFINEDET + " (its DetectionOutput)", "use_blob_size": SOEAVER_INTERP,
}

_NO_FIELD = re.compile(r'has no field named "([A-Za-z_0-9]+)"')
_PARAM_FIELD = re.compile(r"([A-Za-z_][A-Za-z_0-9]*_param)\s*:?\s*\{")
_TYPE = re.compile(r"""\btype\s*:\s*(?:"([^"]*)"|'([^']*)')""")
_NAME = re.compile(r"""\bname\s*:\s*(?:"([^"]*)"|'([^']*)')""")

# Layer types registered by caffe_ocl.register_layer (filled by
# caffe_ocl.layers.custom): their unknown *_param blocks are handed to the
# layer as text instead of failing the parse.
_custom_types = set()


def add_custom_type(name):
    _custom_types.add(name)


def remove_custom_type(name):
    _custom_types.discard(name)


def fork_of_type(type_name):
    return FORK_TYPES.get(type_name)


# --------------------------------------------------------------------------
# A small scanner of protobuf text: top-level blocks and their children

def _blocks(text):
    """[(ident, open, close)] of every ``ident {`` ... ``}`` block (offsets
    of the braces), skipping strings and # comments; unbalanced text gives
    what it can."""
    out, stack = [], []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if ch == "{":
            m = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*:?\s*$", text[max(0, i - 200):i])
            stack.append((m.group(1) if m else "", i, len(stack)))
        elif ch == "}" and stack:
            ident, start, depth = stack.pop()
            out.append((ident, start, i, depth))
        i += 1
    return out


def _layer_blocks(text):
    blocks = _blocks(text)
    layers = [b for b in blocks if b[3] == 0 and b[0] in ("layer", "layers")]
    return layers, blocks


def _own_text(text, block, blocks):
    """The text of ``block`` without its nested blocks (its own fields)."""
    _, start, end, depth = block
    parts, pos = [], start + 1
    for _, s, e, d in sorted(b for b in blocks if b[3] == depth + 1 and start < b[1] < end):
        if s < pos:
            continue
        parts.append(text[pos:s])
        pos = e + 1
    parts.append(text[pos:end])
    return " ".join(parts)


def _first(regex, s):
    m = regex.search(s)
    return (m.group(1) if m.group(1) is not None else m.group(2)) if m else None


def layer_at(text, offset):
    """(name, type) of the layer block holding ``offset``, or (None, None)."""
    layers, blocks = _layer_blocks(text)
    for b in layers:
        if b[1] <= offset <= b[2]:
            own = _own_text(text, b, blocks)
            return _first(_NAME, own), _first(_TYPE, own)
    return None, None


def offset_of(text, line, col):
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[:max(line - 1, 0)]) + max((col or 1) - 1, 0)


def explain_unknown_field(text, line, col, what):
    """Extra words for a text parse error about an unknown field: the layer
    it is in and the fork the field belongs to. '' when not applicable."""
    m = _NO_FIELD.search(what)
    if not m or line is None:
        return ""
    field = m.group(1)
    name, type_ = layer_at(text, offset_of(text, line, col))
    bits = []
    if name is not None or type_ is not None:
        bits.append(f"in layer {name!r} (type {type_!r})")
    fork = FORK_FIELDS.get(field)
    if fork:
        bits.append(f"field {field!r} belongs to {fork}, which caffe_ocl does not implement")
    elif field.endswith("_param"):
        bits.append(f"field {field!r} is no caffe_ocl or known fork field; a custom layer "
                    "type registered with caffe_ocl.register_layer receives its *_param "
                    "text")
    # any other unknown field: the layer alone (the parser's message already
    # names the field and the message type)
    return "; ".join(bits)


def explained(message, text, source):
    """``message`` ("source:line:col: what") with explain_unknown_field's
    words appended when they apply."""
    m = re.match(re.escape(source) + r":(\d+):(\d+): (.*)$", message, re.S)
    if not m:
        return message
    extra = explain_unknown_field(text, int(m.group(1)), int(m.group(2)), m.group(3))
    return f"{message.rstrip('.')}; {extra}" if extra else message


def extract_custom_params(text):
    """For layers whose type is registered with register_layer: cut out
    their ``X_param { ... }`` blocks that LayerParameter does not declare.
    Returns (text without them, {layer index: (field name, inner text)})."""
    if not _custom_types:
        return text, {}
    known = set(caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name)
    layers, blocks = _layer_blocks(text)
    cuts, found = [], {}
    for li, b in enumerate(sorted(layers, key=lambda b: b[1])):
        own = _own_text(text, b, blocks)
        if _first(_TYPE, own) not in _custom_types:
            continue
        for ident, s, e, d in blocks:
            if d == 1 and b[1] < s < b[2] and ident.endswith("_param") and ident not in known:
                m = list(re.finditer(re.escape(ident) + r"\s*:?\s*$", text[b[1]:s]))
                head = b[1] + m[-1].start() if m else s
                cuts.append((head, e + 1))
                found[li] = (ident, text[s + 1:e].strip())
    for s, e in sorted(cuts, reverse=True):
        text = text[:s] + " " * (e - s) + text[e:]      # keep line/column numbers
    return text, found


def attach_custom_params(net, found):
    """Hand the cut-out blocks' inner text to their layers as
    python_param.param_str (unless one is given)."""
    for li, (_field, body) in found.items():
        layers = net.layer if len(net.layer) else net.layers
        if li < len(layers):
            lp = layers[li]
            if not lp.python_param.param_str:
                lp.python_param.param_str = body
