"""caffe.proto's fork fields sit at the forks' numbers (weiliu89/caffe ssd
branch; OpenCV 4's caffe.proto for its additions), so the forks' binary
files parse; and the clash resolutions written in the README hold."""
from google.protobuf.internal import encoder

from caffe_ocl.proto import caffe_pb2 as pb
from caffe_ocl.proto import parse_net_text


def _num(msg, field):
    return msg.DESCRIPTOR.fields_by_name[field].number


def test_ssd_numbers():
    L = pb.LayerParameter
    assert {f: _num(L, f) for f in ("permute_param", "prior_box_param",
                                    "detection_output_param", "norm_param")} == {
        "permute_param": 202, "prior_box_param": 203, "detection_output_param": 204,
        "norm_param": 206}
    # BVLC's own numbers that OpenCV's SSD numbers would have clashed with
    assert _num(L, "swish_param") == 147 and _num(L, "clip_param") == 148
    P = pb.PriorBoxParameter
    assert [_num(P, f) for f in ("min_size", "max_size", "aspect_ratio", "flip", "clip",
                                 "variance", "img_size", "img_h", "img_w", "step", "step_h",
                                 "step_w", "offset", "offset_h", "offset_w", "width",
                                 "height")] == list(range(1, 18))
    assert P.CORNER == 1 and P.CENTER_SIZE == 2 and P.CORNER_SIZE == 3
    assert not P().clip              # the fork's default
    D = pb.DetectionOutputParameter
    assert [_num(D, f) for f in ("num_classes", "share_location", "background_label_id",
                                 "nms_param", "save_output_param", "code_type", "keep_top_k",
                                 "variance_encoded_in_target", "confidence_threshold",
                                 "normalized_bbox", "visualize_threshold", "save_file", "clip",
                                 "visualize")] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1000,
                                                   1001]
    N = pb.NormalizeParameter
    assert [_num(N, f) for f in ("across_spatial", "scale_filler", "channel_shared",
                                 "eps")] == [1, 2, 3, 4]
    assert abs(N().eps - 1e-10) < 1e-16
    assert _num(pb.SaveOutputParameter, "resize_param") == 7
    assert _num(pb.NonMaximumSuppressionParameter, "eta") == 3


def _field(num, payload):
    return encoder.TagBytes(num, 2) + encoder._VarintBytes(len(payload)) + payload


def test_fork_binary_layer_parses():
    """A layer as the SSD fork serializes it: norm_param at 206 and the
    training net's multibox_loss_param at 201 (read as unknown or as
    OpenCV's proposal_param, never an error)."""
    norm = pb.NormalizeParameter(across_spatial=False, channel_shared=False, eps=1e-5)
    raw = (_field(1, b"conv4_3_norm") + _field(2, b"Normalize")
           + _field(206, norm.SerializeToString()))
    lp = pb.LayerParameter.FromString(raw)
    assert lp.type == "Normalize" and not lp.norm_param.across_spatial
    assert abs(lp.norm_param.eps - 1e-5) < 1e-10
    mbl = (encoder.TagBytes(1, 0) + b"\x01" + encoder.TagBytes(3, 5) + b"\x00\x00\x80\x3f"
           + encoder.TagBytes(4, 0) + b"\x15" + encoder.TagBytes(7, 5) + b"\x00\x00\x00\x3f")
    lp = pb.LayerParameter.FromString(_field(1, b"mbox_loss") + _field(201, mbl))
    assert lp.name == "mbox_loss"


def test_fork_prototxt_with_visualize_parses():
    net = parse_net_text('layer { name: "d" type: "DetectionOutput" detection_output_param { '
                         'num_classes: 2 visualize: false code_type: CORNER_SIZE '
                         'save_output_param { resize_param { height: 3 resize_mode: WARP } } '
                         '} }')
    p = net.layer[0].detection_output_param
    assert p.code_type == pb.PriorBoxParameter.CORNER_SIZE and p.normalized_bbox
