"""caffe_ocl.io: pycaffe's caffe.io semantics (blob/datum conversion,
Transformer, image loading/resizing, oversampling)."""

import sys

import numpy as np
import pytest

import caffe_ocl.io as cio
from caffe_ocl.errors import CaffeOclError, DataError, FileNotFound
from caffe_ocl.proto import caffe_pb2

cv2 = pytest.importorskip("cv2")


# --------------------------------------------------------------------------
# blob protos (cases of pycaffe's python/caffe/test/test_io.py)

def test_blobproto_old_format():
    blob = caffe_pb2.BlobProto()
    blob.data.extend(list(np.zeros((10, 10)).flatten()))
    blob.num, blob.channels, blob.height, blob.width = (1, 1, 10, 10)
    assert cio.blobproto_to_array(blob).shape == (1, 1, 10, 10)


def test_blobproto_new_format():
    blob = caffe_pb2.BlobProto()
    blob.data.extend(list(np.arange(100.0)))
    blob.shape.dim.extend([10, 10])
    arr = cio.blobproto_to_array(blob)
    assert arr.shape == (10, 10)
    np.testing.assert_array_equal(arr.ravel(), np.arange(100))


def test_blobproto_no_shape_is_value_error():
    blob = caffe_pb2.BlobProto()
    blob.data.extend(list(np.zeros(100)))
    with pytest.raises(ValueError):
        cio.blobproto_to_array(blob)
    with pytest.raises(CaffeOclError):
        cio.blobproto_to_array(blob)


def test_blobproto_scalar():
    blob = caffe_pb2.BlobProto()
    blob.data.extend([123.0])
    assert cio.blobproto_to_array(blob) == 123


def test_blobproto_round_trip_with_diff():
    a = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    d = a * 2
    blob = cio.array_to_blobproto(a, d)
    np.testing.assert_array_equal(cio.blobproto_to_array(blob), a)
    np.testing.assert_array_equal(cio.blobproto_to_array(blob, return_diff=True), d)


def test_blobprotovector_round_trip():
    arrs = [np.arange(24, dtype=np.float32).reshape(2, 3, 4),
            np.ones((5,), np.float32)]
    s = cio.arraylist_to_blobprotovector_str(arrs)
    assert isinstance(s, bytes)
    assert cio.arraylist_to_blobprotovecor_str(arrs) == s   # pycaffe spelling
    back = cio.blobprotovector_str_to_arraylist(s)
    assert len(back) == 2
    for a, b in zip(arrs, back):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------
# datums

def test_datum_label_none_is_smaller():
    d1 = cio.array_to_datum(np.ones((10, 10, 3)), label=1)
    d2 = cio.array_to_datum(np.ones((10, 10, 3)))
    assert len(d1.SerializeToString()) > len(d2.SerializeToString())
    assert not d2.HasField("label")


def test_datum_uint8_round_trip():
    arr = np.random.RandomState(1).randint(0, 256, (3, 5, 7)).astype(np.uint8)
    datum = cio.array_to_datum(arr, label=7)
    assert datum.data == arr.tobytes()
    assert len(datum.float_data) == 0
    assert (datum.channels, datum.height, datum.width, datum.label) == (3, 5, 7, 7)
    datum2 = caffe_pb2.Datum.FromString(datum.SerializeToString())
    back = cio.datum_to_array(datum2)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, arr)
    back[0, 0, 0] = 1        # writable, like pycaffe's fromstring copy


def test_datum_float_round_trip():
    arr = np.random.RandomState(2).rand(2, 3, 4).astype(np.float32)
    datum = cio.array_to_datum(arr)
    assert len(datum.data) == 0 and len(datum.float_data) == arr.size
    back = cio.datum_to_array(datum)
    assert back.dtype == np.float64
    np.testing.assert_allclose(back, arr, rtol=1e-7)


def test_datum_bad_ndim():
    with pytest.raises(ValueError, match="Incorrect array shape"):
        cio.array_to_datum(np.zeros((2, 2)))


# --------------------------------------------------------------------------
# Transformer

def _reference_preprocess(img, mean_c, raw_scale, input_scale):
    x = img.astype(np.float64).transpose(2, 0, 1)[[2, 1, 0]]
    x = x * raw_scale
    x = x - mean_c[:, None, None]
    return x * input_scale


def _imagenet_transformer(shape=(1, 3, 20, 24)):
    t = cio.Transformer({"data": shape})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    mean = np.array([104.0, 117.0, 123.0])
    t.set_mean("data", mean)
    t.set_input_scale("data", 0.5)
    return t, mean


def test_transformer_preprocess_matches_reference_and_round_trips():
    rng = np.random.RandomState(3)
    img = rng.rand(20, 24, 3).astype(np.float32)
    keep = img.copy()
    t, mean = _imagenet_transformer()
    out = t.preprocess("data", img)
    assert out.dtype == np.float32 and out.shape == (3, 20, 24)
    ref = _reference_preprocess(img, mean, 255.0, 0.5)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(img, keep)   # input left alone
    back = t.deprocess("data", out[np.newaxis])  # batch dim squeezed away
    assert back.shape == (20, 24, 3)
    np.testing.assert_allclose(back, img, atol=1e-5)


def test_transformer_elementwise_mean_and_uint8_input():
    rng = np.random.RandomState(4)
    img = rng.randint(0, 256, (6, 5, 3)).astype(np.uint8)
    t = cio.Transformer({"data": (2, 3, 6, 5)})
    t.set_transpose("data", (2, 0, 1))
    mean = rng.rand(3, 6, 5) * 100
    t.set_mean("data", mean)
    out = t.preprocess("data", img)
    ref = img.astype(np.float64).transpose(2, 0, 1) - mean
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t.deprocess("data", out), img, atol=1e-4)


def test_transformer_resizes_to_input_dims():
    img = np.random.RandomState(5).rand(40, 48, 3).astype(np.float32)
    t = cio.Transformer({"data": (1, 3, 20, 24)})
    t.set_transpose("data", (2, 0, 1))
    out = t.preprocess("data", img)
    assert out.shape == (3, 20, 24)
    assert out.min() >= img.min() - 1e-6 and out.max() <= img.max() + 1e-6


def test_transformer_errors_like_pycaffe():
    t = cio.Transformer({"data": (1, 3, 4, 4)})
    with pytest.raises(Exception, match="foo is not one of the net inputs"):
        t.preprocess("foo", np.zeros((4, 4, 3)))
    with pytest.raises(Exception, match="Transpose order needs to have the same number"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(Exception, match="Channel swap needs to have the same number"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="Mean channels incompatible with input."):
        t.set_mean("data", np.zeros(4))
    with pytest.raises(ValueError, match="Mean channels incompatible with input."):
        t.set_mean("data", np.zeros((2, 5, 5)))
    with pytest.raises(ValueError, match="Mean shape invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 4)))


def test_transformer_set_mean_resizes_a_larger_mean():
    """BVLC master: a 3 x 256 x 256 mean for a 227 input is resized to the
    input (normalised to [0, 1], resized, scaled back)."""
    rng = np.random.RandomState(3)
    mean = (rng.rand(3, 9, 9) * 100 + 20).astype(np.float32)
    t = cio.Transformer({"data": (1, 3, 6, 6)})
    t.set_transpose("data", (2, 0, 1))
    t.set_mean("data", mean)
    lo, hi = mean.min(), mean.max()
    want = cio.resize_image(((mean - lo) / (hi - lo)).transpose(1, 2, 0),
                            (6, 6)).transpose(2, 0, 1) * (hi - lo) + lo
    np.testing.assert_allclose(t.mean["data"], want, rtol=1e-6)
    assert t.mean["data"].shape == (3, 6, 6)
    img = rng.rand(6, 6, 3).astype(np.float32)
    np.testing.assert_allclose(t.preprocess("data", img), img.transpose(2, 0, 1) - want,
                               rtol=1e-5, atol=1e-4)


def test_load_image_from_file_object(tmp_path):
    import cv2
    rgb = (np.arange(4 * 5 * 3).reshape(4, 5, 3) * 4).astype(np.uint8)
    path = tmp_path / "a.png"
    cv2.imwrite(str(path), rgb[:, :, ::-1])
    from_path = cio.load_image(str(path))
    with open(path, "rb") as f:
        from_obj = cio.load_image(f)
    np.testing.assert_array_equal(from_obj, from_path)
    np.testing.assert_allclose(from_obj, rgb / 255.0, atol=1e-6)
    import io as _io
    gray = cio.load_image(_io.BytesIO(path.read_bytes()), color=False)
    assert gray.shape == (4, 5, 1)


# --------------------------------------------------------------------------
# images

def test_load_image_color_is_rgb_unit_float(tmp_path):
    rgb = np.random.RandomState(6).randint(0, 256, (7, 9, 3)).astype(np.uint8)
    p = tmp_path / "c.png"
    assert cv2.imwrite(str(p), rgb[:, :, ::-1])       # cv2 writes BGR
    img = cio.load_image(str(p))
    assert img.dtype == np.float32 and img.shape == (7, 9, 3)
    np.testing.assert_allclose(img, rgb / 255.0, atol=1e-6)
    gray = cio.load_image(str(p), color=False)
    assert gray.shape == (7, 9, 1)
    lum = (rgb / 255.0) @ np.array([0.2125, 0.7154, 0.0721])
    np.testing.assert_allclose(gray[:, :, 0], lum, atol=1e-5)


def test_load_image_gray_and_alpha_and_16bit(tmp_path):
    g = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    p = tmp_path / "g.png"
    cv2.imwrite(str(p), g)
    c = cio.load_image(str(p))
    assert c.shape == (3, 4, 3)
    np.testing.assert_allclose(c[:, :, 1], g / 255.0, atol=1e-6)
    one = cio.load_image(str(p), color=False)
    assert one.shape == (3, 4, 1)

    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[..., 0] = 255          # blue
    bgra[..., 3] = 10           # alpha, dropped
    pa = tmp_path / "a.png"
    cv2.imwrite(str(pa), bgra)
    a = cio.load_image(str(pa))
    assert a.shape == (2, 2, 3)
    np.testing.assert_allclose(a[0, 0], [0, 0, 1])

    w = np.full((2, 3), 65535, np.uint16)
    pw = tmp_path / "w.png"
    cv2.imwrite(str(pw), w)
    np.testing.assert_allclose(cio.load_image(str(pw)), 1.0)


def test_load_image_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.jpg"
    with pytest.raises(FileNotFound, match="nope.jpg"):
        cio.load_image(str(missing))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"this is not an image")
    with pytest.raises(DataError, match="bad.png"):
        cio.load_image(str(bad))
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="empty.jpg"):
        cio.load_image(str(empty))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7])
def test_resize_image_channels_and_range(k):
    im = np.random.RandomState(k).rand(10, 12, k).astype(np.float32) * 50 - 10
    for order in (0, 1, 3):
        out = cio.resize_image(im, (17, 5), interp_order=order)
        assert out.shape == (17, 5, k) and out.dtype == np.float32
        if order <= 1:      # cubic splines (pycaffe's scipy zoom) may overshoot
            assert out.min() >= im.min() - 1e-4 and out.max() <= im.max() + 1e-4


def test_resize_image_nearest_and_constant():
    im = np.arange(6, dtype=np.float32).reshape(2, 3, 1)
    out = cio.resize_image(im, (4, 6), interp_order=0)
    np.testing.assert_array_equal(out[:, :, 0], np.repeat(np.repeat(im[:, :, 0], 2, 0), 2, 1))
    const = np.full((3, 3, 3), 0.25)
    out = cio.resize_image(const, (5, 4))
    assert out.shape == (5, 4, 3) and out.dtype == np.float32
    assert np.all(out == 0.25)
    # linear resize of a linear ramp: a ramp inside (pycaffe's skimage path
    # blends the upscaled border columns toward the minimum)
    ramp = np.tile(np.linspace(0, 1, 8, dtype=np.float32)[None, :, None], (4, 1, 3))
    out = cio.resize_image(ramp, (4, 16))
    np.testing.assert_allclose(np.diff(out[0, 1:-1, 0]), 1 / 14, atol=1e-5)


def test_oversample_shapes_and_order():
    rng = np.random.RandomState(7)
    ims = [rng.rand(9, 11, 3).astype(np.float32) for _ in range(2)]
    ch, cw = 4, 6
    crops = cio.oversample(ims, (ch, cw))
    assert crops.shape == (20, ch, cw, 3) and crops.dtype == np.float32
    for n, im in enumerate(ims):
        # corners, then center (4.5-2=2.5 -> 2, 5.5-3=2.5 -> 2), then mirrors
        expect = [im[0:4, 0:6], im[0:4, 5:11], im[5:9, 0:6], im[5:9, 5:11],
                  im[2:6, 2:8]]
        expect += [e[:, ::-1] for e in expect]
        for i, e in enumerate(expect):
            np.testing.assert_array_equal(crops[10 * n + i], e)
    # a 4-D batch works as input too
    assert cio.oversample(np.stack(ims), (3, 3)).shape == (20, 3, 3, 3)


# pycaffe's resize_image (BVLC python/caffe/io.py, BSD-2), the reference for
# caffe.io.resize_image when its libraries are installed
def _bvlc_resize_image(im, new_dims, interp_order=1):
    if im.shape[-1] == 1 or im.shape[-1] == 3:
        from skimage.transform import resize
        im_min, im_max = im.min(), im.max()
        im_std = (im - im_min) / (im_max - im_min)
        resized_std = resize(im_std, new_dims, order=interp_order, mode='constant')
        resized_im = resized_std * (im_max - im_min) + im_min
    else:
        from scipy.ndimage import zoom
        scale = tuple(np.array(new_dims, dtype=float) / np.array(im.shape[:2]))
        resized_im = zoom(im, scale + (1,), order=interp_order)
    return resized_im.astype(np.float32)


@pytest.mark.parametrize("k", [1, 3])
def test_resize_image_is_pycaffes_with_scikit_image(k):
    """Up- and downscaling, every order: the same pixels as pycaffe (border
    blending toward the minimum when upscaling, skimage's anti-aliasing when
    downscaling), so Classifier/Transformer inputs match BVLC's."""
    pytest.importorskip("skimage")
    im = np.random.RandomState(k).rand(20, 30, k).astype(np.float32) * 3 - 1
    for order in (0, 1, 2, 3):
        for dims in ((13, 17), (40, 33)):
            np.testing.assert_array_equal(cio.resize_image(im, dims, order),
                                          _bvlc_resize_image(im, dims, order))


@pytest.mark.parametrize("k", [2, 4])
def test_resize_image_is_pycaffes_zoom_for_other_channel_counts(k):
    pytest.importorskip("scipy")
    im = np.random.RandomState(k).rand(20, 30, k).astype(np.float32) * 3 - 1
    for order in (0, 1, 3):
        for dims in ((13, 17), (40, 33)):
            np.testing.assert_array_equal(cio.resize_image(im, dims, order),
                                          _bvlc_resize_image(im, dims, order))


def test_resize_image_opencv_without_the_libraries(monkeypatch):
    """Neither scikit-image nor SciPy: OpenCV resizes, the same shapes and
    (linear downscaling) the values of a plain bilinear resize."""
    monkeypatch.setitem(sys.modules, "skimage.transform", None)
    monkeypatch.setitem(sys.modules, "scipy.ndimage", None)
    im = np.random.RandomState(0).rand(20, 30, 3).astype(np.float32)
    out = cio.resize_image(im, (10, 15))
    want = 0.25 * (im[0::2, 0::2] + im[1::2, 0::2] + im[0::2, 1::2] + im[1::2, 1::2])
    np.testing.assert_allclose(out, want, atol=1e-6)
    assert cio.resize_image(im[:, :, :2], (7, 9)).shape == (7, 9, 2)


def test_load_image_gray_of_rgba_composites_over_white(tmp_path):
    """pycaffe's skimage.io.imread(as_gray=True) blends RGBA over white
    before the luminance; color=True drops the alpha."""
    import cv2
    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[..., 2] = 255            # red
    bgra[..., 3] = [[255, 0], [51, 255]]
    path = str(tmp_path / "a.png")
    cv2.imwrite(path, bgra)
    gray = cio.load_image(path, color=False)[:, :, 0]
    a = bgra[..., 3] / 255.0
    rgb = np.stack([np.ones((2, 2)), 1 - a, 1 - a], -1)     # red over white
    np.testing.assert_allclose(gray, rgb @ [0.2125, 0.7154, 0.0721], atol=1e-6)
    np.testing.assert_array_equal(cio.load_image(path)[..., 0], 1.0)


def _png_header_only(width, height):
    """A PNG whose IHDR claims ``width`` x ``height`` (8-bit RGB) with a few
    bytes of image data."""
    import struct
    import zlib

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def test_load_image_huge_header_is_one_error(tmp_path):
    """A 74-byte PNG claiming 100000 x 100000 pixels: OpenCV's size
    assertion (a cv2.error traceback) becomes a DataError naming the file."""
    from caffe_ocl.errors import DataError
    path = tmp_path / "huge.png"
    path.write_bytes(_png_header_only(100000, 100000))
    with pytest.raises(DataError, match=rf"{path}: cannot decode image"):
        cio.load_image(str(path))


def test_load_image_out_of_memory_is_one_error(tmp_path, monkeypatch):
    """A valid image too large for float32 in this process (a 30000 x 30000
    1-bit PNG is 109 KB on disk, 10 GiB as RGB float32) is a DataError
    naming the file and the size, not a numpy MemoryError."""
    import cv2
    from caffe_ocl.errors import DataError
    path = tmp_path / "gray.png"
    cv2.imwrite(str(path), np.zeros((6, 5), np.uint8))

    def no_memory(img):
        raise MemoryError("Unable to allocate")
    monkeypatch.setattr(cio, "_to_unit_float", no_memory)
    with pytest.raises(DataError, match=rf"{path}: a 5x6 image needs 0.0 GiB as float32: "
                                        "out of host memory"):
        cio.load_image(str(path))
