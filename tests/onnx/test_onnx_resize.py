"""ONNX Resize / Upsample by whole-number factors converted to a grouped
Deconvolution (nearest: weights of ones; linear at even factors: the edge
repeated, then Caffe's bilinear taps), other modes and sizes to a product
by each axis's weights, checked against ONNX Runtime; resizing N or C and
tf_crop_and_resize are reported, not converted."""
import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_helpers import check_onnx, make_model, node, rand  # noqa: E402

from caffe_ocl.onnx import to_caffe  # noqa: E402
from caffe_ocl.onnx._common import OnnxConversionError  # noqa: E402

X = (1, 3, 4, 5)


def _resize(attrs, scales=None, sizes=None, opset=13, op="Resize"):
    """x -> Conv 1x1 (so the resize reads a computed blob) -> Resize -> y."""
    inits = {"w": rand(3, 3, 1, 1), "b": rand(3)}
    ins = ["c", "", "", ""]
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
        ins[2] = "scales"
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
        ins[3] = "sizes"
    if op == "Upsample" or opset < 11:
        ins = ["c", "scales"]
    elif opset < 13:        # roi and scales are required inputs there, empty if unused
        inits["roi"] = np.zeros(0, np.float32)
        ins[1] = "roi"
        if scales is None:
            inits["scales"] = np.zeros(0, np.float32)
            ins[2] = "scales"
    while ins[-1] == "":
        ins.pop()
    nodes = [node("Conv", ["x", "w", "b"], ["c"]), node(op, ins, ["y"], **attrs)]
    return make_model(nodes, {"x": X}, ["y"], inits, opset=opset)


def _deconv(net):
    (lp,) = [lp for lp in net.layer if lp.type == "Deconvolution"]
    return lp


@pytest.mark.parametrize("attrs,scales,sizes,opset,op", [
    # what torch.onnx.export writes for nn.Upsample(scale_factor=2) (opset 11-13)
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"), [1, 1, 2, 2], None, 13, "Resize"),
    # ONNX's defaults: half_pixel, round_prefer_floor; unequal factors
    (dict(mode="nearest"), [1, 1, 3, 2], None, 13, "Resize"),
    (dict(mode="nearest", coordinate_transformation_mode="pytorch_half_pixel",
          nearest_mode="round_prefer_ceil"), None, [1, 3, 8, 15], 13, "Resize"),
    (dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn",
          nearest_mode="floor"), [1, 1, 4, 4], None, 11, "Resize"),
    (dict(mode="nearest"), [1, 1, 2, 3], None, 10, "Resize"),
    # the rule is ONNX's index map, not the mode's name: align_corners at
    # factor 2 on 4 x 5 happens to copy each pixel to a 2 x 2 block
    (dict(mode="nearest", coordinate_transformation_mode="align_corners"), [1, 1, 2, 2], None,
     13, "Resize"),
    (dict(mode="nearest"), [1, 1, 2, 2], None, 9, "Upsample"),
])
def test_nearest_whole_factors_match_onnxruntime(attrs, scales, sizes, opset, op):
    net = check_onnx(_resize(attrs, scales, sizes, opset, op), tol=1e-6,
                     layer_types=["Deconvolution"])
    lp = _deconv(net)
    cp = lp.convolution_param
    factors = [cp.kernel_h or cp.kernel_size[0], cp.kernel_w or cp.kernel_size[-1]]
    assert cp.group == 3 and cp.num_output == 3 and not cp.bias_term
    assert list(cp.stride) in ([factors[0]] if factors[0] == factors[1] else [], factors) \
        or [cp.stride_h, cp.stride_w] == factors
    # constants of the conversion: ones, never trained
    assert all(v == 1.0 for v in lp.blobs[0].data) and lp.param[0].lr_mult == 0


def test_upsample_opset7_attribute_scales():
    inits = {"w": rand(3, 3, 1, 1), "b": rand(3)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"]),
             node("Upsample", ["c"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0])]
    m = make_model(nodes, {"x": X}, ["y"], inits, opset=7)
    net = to_caffe.convert(m)
    assert _deconv(net).convolution_param.group == 3


def test_factor_one_is_an_alias():
    net = check_onnx(_resize(dict(mode="nearest"), [1, 1, 1, 1]), tol=1e-6)
    assert not [lp for lp in net.layer if lp.type == "Deconvolution"]


def _products(net):
    """Layers of the axis-product form (the input's own 1x1 Conv left out)."""
    return [lp for lp in net.layer[2:] if lp.type in ("Convolution", "InnerProduct")]


@pytest.mark.parametrize("attrs,scales,sizes", [
    (dict(mode="cubic"), [1, 1, 2, 2], None),
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), [1, 1, 2, 3], None),
    # bilinear with corners aligned is no convolution: its weights vary
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), [1, 1, 2, 2], None),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), None, [1, 3, 9, 11]),
    (dict(mode="linear", coordinate_transformation_mode="asymmetric"), [1, 1, 2, 2], None),
    # align_corners at factor 3 on 4 x 5 picks pixel 1 for output 2
    (dict(mode="nearest", coordinate_transformation_mode="align_corners"), [1, 1, 3, 3], None),
    # asymmetric with ties rounded up picks pixel k + 1 for odd outputs
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="round_prefer_ceil"), [1, 1, 2, 2], None),
    (dict(mode="nearest"), [1, 1, 1.5, 2], None),
    (dict(mode="nearest"), None, [1, 3, 7, 3]),           # 4 -> 7 rows, 5 -> 3 columns
    (dict(mode="linear"), [1, 1, 0.5, 0.6], None),         # downsampling
    (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), None,
     [1, 3, 1, 7]),                                        # one output row
], ids=["cubic", "cubic-a-exclude", "align_corners", "align_corners-sizes", "asymmetric",
        "nearest-align_corners", "round_prefer_ceil", "nearest-x1.5", "nearest-sizes",
        "linear-down", "pytorch_half_pixel-one-row"])
def test_other_modes_convert_to_axis_products(attrs, scales, sizes):
    """Modes and sizes no Deconvolution expresses: each axis a product by
    ONNX's own weights (a 1x1 Convolution over rows, an InnerProduct over
    columns), against ONNX Runtime."""
    net = check_onnx(_resize(attrs, scales, sizes), tol=1e-5)
    assert net.layer[1].type == "Convolution" and _products(net)
    assert "Deconvolution" not in {lp.type for lp in net.layer}


@pytest.mark.parametrize("opset", [10, 11, 13])
def test_axis_products_at_older_opsets(opset):
    """Resize-10 (asymmetric, floor) and 11's required roi input."""
    check_onnx(_resize(dict(mode="linear"), [1, 1, 1.5, 2.5], opset=opset), tol=1e-5)


@pytest.mark.parametrize("attrs,scales,why", [
    (dict(mode="nearest"), [1, 2, 2, 2], "channel axis"),
    (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"), [1, 1, 2, 2],
     "tf_crop_and_resize"),
])
def test_other_resizes_are_reported(attrs, scales, why):
    with pytest.raises(OnnxConversionError) as e:
        to_caffe.convert(_resize(attrs, scales))
    assert "Resize" in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("scales", [[1, 1, float("nan"), 2], [1, 1, 0, 2], [1, 1, -2, 2]])
def test_hostile_scales_are_one_error_naming_the_node(scales):
    inits = {"w": rand(3, 3, 1, 1), "b": rand(3), "scales": np.asarray(scales, np.float32)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"]),
             node("Resize", ["c", "", "scales"], ["y"], mode="nearest")]
    g = onnx.helper.make_graph(
        nodes, "t", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 13)])
    m.ir_version = 8
    with pytest.raises(OnnxConversionError) as e:
        to_caffe.convert(m)
    assert "resize_y" in str(e.value) and "\n" not in str(e.value)


def test_torch_nearest_upsample_converts():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                          nn.Upsample(scale_factor=2, mode="nearest"),
                          nn.Conv2d(4, 2, 3, padding=1)).eval()
    buf = io.BytesIO()
    torch.onnx.export(model, torch.randn(1, 3, 6, 7), buf, opset_version=13,
                      input_names=["x"], output_names=["y"], dynamo=False)
    m = onnx.load_from_string(buf.getvalue())
    check_onnx(m, tol=1e-5, layer_types=["Deconvolution"])


@pytest.mark.parametrize("attrs,scales,sizes,opset", [
    # PyTorch's F.interpolate(mode="bilinear", align_corners=False)
    (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 2, 2],
     None, 13),
    (dict(mode="linear"), [1, 1, 4, 2], None, 13),           # ONNX's default: half_pixel
    (dict(mode="linear"), None, [1, 3, 32, 40], 13),          # by 8 and 8, from sizes
    (dict(mode="linear"), [1, 1, 1, 2], None, 11),            # one axis only
    # odd factors: kernel 2f - 1 (PSPNet's pyramid bins at a 30 x 30 map)
    (dict(mode="linear"), [1, 1, 3, 3], None, 13),
    (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), None,
     [1, 3, 20, 15], 13),                                      # by 5 and 3
    (dict(mode="linear"), [1, 1, 3, 2], None, 13),            # odd and even
])
def test_bilinear_even_factors_match_onnxruntime(attrs, scales, sizes, opset):
    net = check_onnx(_resize(attrs, scales, sizes, opset), tol=1e-5,
                     layer_types=["Deconvolution", "Concat"])
    lp = _deconv(net)
    assert lp.convolution_param.group == 3 and lp.param[0].lr_mult == 0


def test_odd_bilinear_factor_is_caffes_bilinear_filler():
    """At factor 3 the kernel is 5 taps, Caffe's bilinear filler for a
    kernel of 5 (centred on a whole pixel): 1/3, 2/3, 1, 2/3, 1/3."""
    net = check_onnx(_resize(dict(mode="linear"), [1, 1, 3, 3]), tol=1e-5)
    lp = _deconv(net)
    cp = lp.convolution_param
    assert list(cp.kernel_size) == [5] and list(cp.stride) == [3] and list(cp.pad) == [4]
    w = np.asarray(lp.blobs[0].data, np.float64).reshape(3, 1, 5, 5)[0, 0]
    t = np.array([1, 2, 3, 2, 1]) / 3.0
    np.testing.assert_allclose(w, np.outer(t, t), atol=1e-7)


def test_torch_bilinear_upsample_converts():
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional

    class Seg(nn.Module):           # an FCN-style head: back to the input's size
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.c2 = nn.Conv2d(4, 5, 3, stride=2, padding=1)

        def forward(self, x):
            y = self.c2(torch.relu(self.c1(x)))
            return (F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False),
                    F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False))

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Seg().eval(), torch.randn(1, 3, 16, 24), buf, opset_version=13,
                      input_names=["x"], dynamo=False)
    check_onnx(onnx.load_from_string(buf.getvalue()), tol=1e-5, layer_types=["Deconvolution"])


def test_factor_one_is_checked_like_any_other():
    # tf_half_pixel_for_nn rounding ties up at scale 1: not the Deconvolution
    # form's identity by its own formula (the shortcut for factor 1 had
    # aliased it unchecked); ONNX Runtime and onnx's reference give the
    # identity, which the axis products find and alias
    net = check_onnx(_resize(dict(mode="nearest",
                                  coordinate_transformation_mode="tf_half_pixel_for_nn",
                                  nearest_mode="round_prefer_ceil"), [1, 1, 1, 1]), tol=1e-6)
    assert not _products(net)
    # linear at scale 1 is the identity: an alias, no layer
    net = check_onnx(_resize(dict(mode="linear"), [1, 1, 1, 1]), tol=1e-6)
    assert not [lp for lp in net.layer if lp.type == "Deconvolution"]


@pytest.mark.parametrize("hw", [(1, 2), (2, 1), (2, 2), (3, 5)])
def test_bilinear_edges_of_one_two_and_more_rows(hw):
    """The edge rows repeated by one Slice (first, the unused middle, last),
    or none for a single row: planes of 1, 2 and more rows and columns."""
    inits = {"w": rand(3, 3, 1, 1), "b": rand(3), "scales": np.array([1, 1, 2, 4], np.float32)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"]),
             node("Resize", ["c", "", "scales"], ["y"], mode="linear")]
    net = check_onnx(make_model(nodes, {"x": (1, 3) + hw}, ["y"], inits), tol=1e-5)
    slices = [lp for lp in net.layer if lp.type == "Slice"]
    assert len(slices) == sum(n > 1 for n in hw)


@pytest.mark.parametrize("ctm", ["align_corners", "half_pixel", "pytorch_half_pixel",
                                 "asymmetric"])
def test_bilinear_from_a_single_pixel_is_a_copy(ctm):
    """DeepLab's image-pooling branch: a 1 x 1 map resized bilinearly to
    the feature map's size (odd factors, align_corners too) is that pixel
    everywhere: kernel = stride = the factor, ones, no edge repeat."""
    inits = {"w": rand(3, 3, 1, 1), "b": rand(3), "sizes": np.array([2, 3, 7, 6], np.int64)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"]),
             node("Resize", ["c", "", "", "sizes"], ["y"], mode="linear",
                  coordinate_transformation_mode=ctm)]
    net = check_onnx(make_model(nodes, {"x": (2, 3, 1, 1)}, ["y"], inits), tol=1e-6,
                     layer_types=["Deconvolution"])
    cp = _deconv(net).convolution_param
    assert [cp.kernel_h, cp.kernel_w] == [7, 6] and [cp.stride_h, cp.stride_w] == [7, 6]
    assert not [lp for lp in net.layer if lp.type in ("Concat", "Slice")]


def test_torch_image_pooling_branch_converts():
    """F.interpolate(pooled, size=x.shape[-2:], mode="bilinear",
    align_corners=True) after AdaptiveAvgPool2d(1): the form of DeepLab
    v3's ASPP pooling in many ports; a single row and a single column
    resized alone too (1 x W and H x 1 maps)."""
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            size = x.shape[-2:]
            p = self.c(F.adaptive_avg_pool2d(x, 1))
            row = self.c(F.avg_pool2d(x, (x.shape[2], 1)))      # 1 x W
            return (F.interpolate(p, size=size, mode="bilinear", align_corners=True),
                    F.interpolate(row, size=size, mode="bilinear", align_corners=False))

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Pool().eval(), torch.randn(1, 3, 9, 10), buf, opset_version=13,
                      input_names=["x"], dynamo=False)
    check_onnx(onnx.load_from_string(buf.getvalue()), tol=1e-5, layer_types=["Deconvolution"])
