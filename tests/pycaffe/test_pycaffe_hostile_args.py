"""pycaffe's API called with wrong or hostile arguments (a fuzz campaign's
findings): each call either gives pycaffe's result or raises one error
naming what is wrong, of the Python type pycaffe raised for the misuse."""
import numpy as np
import pytest

import caffe
from caffe_ocl.errors import ArgumentError, CaffeOclError

DEPLOY = """
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "prob"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
"""


@pytest.fixture
def deploy(tmp_path):
    p = tmp_path / "deploy.prototxt"
    p.write_text(DEPLOY)
    return str(p)


def transformer():
    t = caffe.io.Transformer({"data": (1, 3, 8, 8)})
    t.set_transpose("data", (2, 0, 1))
    return t


def image(h=8, w=8, c=3):
    return np.random.RandomState(1).rand(h, w, c).astype(np.float32)


# ---- Net: forward_backward_all, share_with --------------------------------------
def test_forward_backward_all_with_inputs_only_runs_both_passes(lin):
    """pycaffe zips the batches with izip_longest: inputs without output
    diffs still run forward and backward (zip ran nothing: empty arrays)."""
    w = lin.params["ip"][0].data.copy()
    x = np.random.RandomState(1).randn(7, 4).astype(np.float32)
    outs, diffs = lin.forward_backward_all(x=x)
    np.testing.assert_allclose(outs["y"], x @ w.T, rtol=1e-5, atol=1e-5)
    assert diffs["x"].shape == (7, 4)


def test_forward_backward_all_refuses_names_and_lengths_it_would_ignore(lin):
    x = np.zeros((7, 4), np.float32)
    with pytest.raises(CaffeOclError, match="'foo'.*neither inputs"):
        lin.forward_backward_all(x=x, foo=x)
    with pytest.raises(CaffeOclError, match="same length.*'x': 7.*'y': 5"):
        lin.forward_backward_all(x=x, y=np.zeros((5, 2), np.float32))
    with pytest.raises(CaffeOclError, match="needs input arrays"):
        lin.forward_backward_all()          # was a StopIteration escaping
    with pytest.raises(TypeError, match=r"blobs must be a list.*blobs=\['y'\]"):
        lin.forward_backward_all(blobs="y", x=x)


def test_share_with_a_non_net_names_the_argument(lin):
    for bad in (None, "net", 3):
        with pytest.raises(ArgumentError, match="share_with takes a caffe.Net"):
            lin.share_with(bad)
    assert issubclass(ArgumentError, TypeError)     # pycaffe: Boost.Python.ArgumentError


# ---- caffe.io.Transformer ------------------------------------------------------------
def test_transformer_transpose_must_be_an_order_of_the_axes():
    t = transformer()
    for bad in ((0, 0, 1), (3, 0, 1)):
        with pytest.raises(ValueError, match=r"set_transpose\('data'\).*not an order"):
            t.set_transpose("data", bad)
    with pytest.raises(TypeError, match="axis indices"):
        t.set_transpose("data", None)
    t.set_transpose("data", (-1, 0, 1))     # NumPy's negative axes stay valid
    assert t.preprocess("data", image()).shape == (3, 8, 8)


def test_transformer_channel_swap_indices_are_checked():
    t = transformer()
    with pytest.raises(TypeError, match=r"set_channel_swap\('data'\).*channel indices"):
        t.set_channel_swap("data", (2.0, 1.0, 0.0))
    t.set_channel_swap("data", (0, 1, 5))
    with pytest.raises(IndexError, match="picks channel 5 of an image with 3 channels"):
        t.preprocess("data", image())


def test_transformer_repeated_channel_swap_preprocesses_but_does_not_deprocess():
    """(0, 0, 0) replicates a gray channel (pycaffe allows it); its argsort
    is no inverse, so deprocess refuses instead of returning a wrong image."""
    t = transformer()
    t.set_channel_swap("data", (0, 0, 0))
    out = t.preprocess("data", image(c=1))
    np.testing.assert_array_equal(out[1], out[0])
    with pytest.raises(ValueError, match="repeats channels"):
        t.deprocess("data", out)


def test_transformer_scales_and_mean_must_be_numbers():
    t = transformer()
    with pytest.raises(TypeError, match=r"set_raw_scale\('data'\).*number"):
        t.set_raw_scale("data", "255")
    with pytest.raises(TypeError, match=r"set_mean\('data'\).*numbers"):
        t.set_mean("data", None)
    with pytest.raises(ValueError, match="mean is empty"):
        t.set_mean("data", np.zeros((3, 0, 0)))
    t.set_mean("data", [0.5, 0.5, 0.5])          # a list of channel means works
    np.testing.assert_allclose(t.preprocess("data", image()),
                               image().transpose(2, 0, 1) - 0.5)


def test_transformer_image_and_inputs_of_the_wrong_shape():
    t = transformer()
    with pytest.raises(ValueError, match=r"preprocess\('data'\).*3-axis image.*\(8, 8\)"):
        t.preprocess("data", image()[:, :, 0])
    with pytest.raises(ValueError, match=r"deprocess\('data'\).*\(2, 3, 8, 8\)"):
        t.deprocess("data", np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(TypeError, match="Transformer takes a dict"):
        caffe.io.Transformer(["data"])
    with pytest.raises(ValueError, match=r"\(3, 8, 8\) is not N x K x H x W"):
        caffe.io.Transformer({"data": (3, 8, 8)}).preprocess("data", image())


# ---- caffe.io conversions, resize_image, oversample ---------------------------------------
def test_array_to_blobproto_of_none_is_refused():
    with pytest.raises(TypeError, match="array_to_blobproto.*NoneType"):
        caffe.io.array_to_blobproto(None)       # was a blob holding one NaN


def test_array_to_datum_label_is_not_truncated():
    im = np.ones((1, 2, 2), np.uint8)
    with pytest.raises(TypeError, match="label must be an integer, got 1.7"):
        caffe.io.array_to_datum(im, 1.7)
    assert caffe.io.array_to_datum(im, np.float32(3.0)).label == 3
    assert caffe.io.array_to_datum(im, np.int64(4)).label == 4
    with pytest.raises(ValueError, match="label 1099511627776 does not fit"):
        caffe.io.array_to_datum(im, 2**40)


def test_datum_to_array_message_counts_huge_shapes_exactly():
    d = caffe.proto.caffe_pb2.Datum(channels=2**30, height=2**30, width=2**30, data=b"\0")
    with pytest.raises(CaffeOclError, match=f"\\({2**90} values\\)"):
        caffe.io.datum_to_array(d)


def test_resize_image_refuses_absurd_sizes_and_bad_arguments():
    with pytest.raises(MemoryError, match="resize_image.*GiB"):
        caffe.io.resize_image(image(), (2**20, 2**20))
    with pytest.raises(ValueError, match="the image is empty"):
        caffe.io.resize_image(np.zeros((0, 4, 3)), (2, 2))     # was a zero image
    with pytest.raises(TypeError, match=r"new_dims must be \(height, width\)"):
        caffe.io.resize_image(image(), (4,))
    with pytest.raises(ValueError, match="interp_order is a spline order 0..5, got 99"):
        caffe.io.resize_image(image(), (4, 4), interp_order=99)


def test_oversample_checks_images_and_crop():
    with pytest.raises(ValueError, match="one shape"):
        caffe.io.oversample([image(), image(10, 10)], (4, 4))   # was crops at wrong places
    with pytest.raises(ValueError, match=r"crop \(10, 10\) does not fit in the 8 x 8"):
        caffe.io.oversample([image()], (10, 10))
    with pytest.raises(IndexError, match="no images"):
        caffe.io.oversample([], (4, 4))


# ---- Classifier / Detector ------------------------------------------------------------
def test_classifier_names_bad_images_and_dims(deploy):
    clf = caffe.Classifier(deploy, image_dims=(8,))
    with pytest.raises(TypeError, match=r"image_dims must be \(height, width\)"):
        clf.predict([image()])
    clf = caffe.Classifier(deploy)
    with pytest.raises(IndexError, match=r"input 0 must be an H x W x K image.*\(8, 8\)"):
        clf.predict([image()[:, :, 0]])


@pytest.fixture
def png(tmp_path):
    cv2 = pytest.importorskip("cv2")
    p = tmp_path / "im.png"
    cv2.imwrite(str(p), (image(20, 20) * 255).astype(np.uint8))
    return str(p)


def test_detector_window_selecting_nothing_is_refused(deploy, png):
    """pycaffe failed resizing the empty crop; a blank input was classified."""
    det = caffe.Detector(deploy)
    for window in ((5, 5, 5, 5), (100, 100, 200, 200)):
        with pytest.raises(ValueError, match="selects no pixels of the 20 x 20 image"):
            det.detect_windows([(png, [window])])
    with pytest.raises(ValueError, match="not finite"):
        det.detect_windows([(png, [(np.nan, 0, 10, 10)])])
    with pytest.raises(TypeError, match=r"\(image filename, \[windows\]\) pairs"):
        det.detect_windows([png])


def test_detector_context_pad_must_leave_room(deploy):
    with pytest.raises(ValueError, match="context_pad 4 must be positive and below half"):
        caffe.Detector(deploy, context_pad=4)           # was a ZeroDivisionError later


# ---- module functions, net_spec ------------------------------------------------------------
def test_solver_count_and_rank_take_integers():
    count = caffe.solver_count()
    with pytest.raises(TypeError, match="set_solver_count takes an integer, got 2.5"):
        caffe.set_solver_count(2.5)
    with pytest.raises(TypeError, match="init_log takes an integer"):
        caffe.init_log("x")
    assert caffe.solver_count() == count


def test_net_spec_errors_name_the_layer_and_field():
    L = caffe.layers
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 8, 8]))
    n.conv = L.Convolution(n.data, kernel_size={"a": 1})
    with pytest.raises(AttributeError, match=r"layer 'conv' \(Convolution\): kernel_size=.*"
                                             "plain value, not a message"):
        n.to_proto()
    n.conv = L.Convolution(n.data, bogus=3)
    with pytest.raises(AttributeError, match="no parameter 'bogus': neither "
                                             "ConvolutionParameter nor LayerParameter"):
        n.to_proto()
    n.conv = L.Convolution(n.data, kernel_size="x")
    with pytest.raises(TypeError, match=r"layer 'conv' \(Convolution\): kernel_size='x'"):
        n.to_proto()
    n.conv = 3
    with pytest.raises(AttributeError, match="NetSpec.conv is a int object, not a layer's top"):
        n.to_proto()
    with pytest.raises(AttributeError, match="PoolingParameter has no value 'NOPE'.*MAX"):
        caffe.params.Pooling.NOPE
