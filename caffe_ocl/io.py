"""Host-side input helpers, compatible with pycaffe's ``caffe.io``.

Everything here is NumPy (and OpenCV for image files and resizing); nothing
touches OpenCL.  Images are handled the way pycaffe hands them around:
float32, H x W x K, RGB channel order, values in [0, 1] when loaded from a
file.  ``Transformer`` turns such images into K x H x W net inputs and back.

Differences from pycaffe a user may notice:

* ``load_image`` decodes with OpenCV (the same pixels as pycaffe's
  scikit-image for JPEG and 8-bit PNG). ``resize_image`` is pycaffe's own
  computation when scikit-image (1 or 3 channels) or SciPy (other channel
  counts) can be imported, and OpenCV's otherwise; the OpenCV fallback
  differs at the borders of upscaled images and, against scikit-image
  0.15 or later, by the anti-aliasing of downscaled ones.
* ``Transformer.preprocess`` never modifies the array it is given (pycaffe
  scales a float32 input in place when no resize or channel swap is needed).
* Bad files raise :class:`~caffe_ocl.errors.FileNotFound` or
  :class:`~caffe_ocl.errors.DataError` naming the path.
* Arguments pycaffe let through to fail later inside NumPy, or to give a
  wrong result (a transpose repeating an axis, a channel swap picking a
  channel the image lacks, windows of other shapes in ``oversample``, a
  float label cut to an int), raise at once, naming the call and the value,
  with pycaffe's exception type (``ArrayShapeError`` is a ValueError and
  an IndexError; ``ArgumentError`` a TypeError).
"""

import math
import operator
import os
from collections.abc import Mapping

import numpy as np

from . import errors
from .device import host_memory_budget
from .errors import (ArgumentError, ArgumentValueError, CaffeOclError, DataError, FileNotFound,
                     OutOfHostMemory, ShapeError)
from .proto import caffe_pb2
from .proto import files as _files

__all__ = [
    "blobproto_to_array", "array_to_blobproto",
    "arraylist_to_blobprotovector_str", "arraylist_to_blobprotovecor_str",
    "blobprotovector_str_to_arraylist", "array_to_datum", "datum_to_array",
    "Transformer", "load_image", "resize_image", "oversample",
]


# ---------------------------------------------------------------------------
# proto / datum / ndarray conversion

class BlobShapeError(ShapeError, ValueError):
    """A BlobProto whose values do not fit its shape.

    Also a ValueError, which is what pycaffe raises in that case."""


class ArrayShapeError(errors.ArrayShapeError, IndexError):
    """An image, mean, window or dims argument of a shape the call cannot
    use: caffe_ocl.errors.ArrayShapeError (a ShapeError and a ValueError,
    as for a net input of the wrong shape), and an IndexError too (as
    NumPy's AxisError): pycaffe's NumPy code failed with one or the other
    for such arrays."""


def blobproto_to_array(blob, return_diff=False):
    """A BlobProto's data (or diff, with ``return_diff=True``) as an array.

    The legacy num/channels/height/width shape is used when any of them is
    set, ``blob.shape.dim`` otherwise (as pycaffe).  Values are float32.
    """
    try:
        return _files.blobproto_to_array(blob, return_diff)
    except ShapeError as e:
        raise BlobShapeError(str(e)) from None


def array_to_blobproto(arr, diff=None):
    """An array (and optionally its diff) as a BlobProto with ``shape.dim``
    set; values stored as float32."""
    for what, a in (("array", arr), ("diff", diff)):
        # np.asarray(None) made a blob holding one NaN (pycaffe: AttributeError)
        if (a is None and what == "array") or isinstance(a, (str, bytes)):
            raise ArgumentError(f"array_to_blobproto: the {what} must be an array of "
                                f"numbers, got {type(a).__name__}")
    return _files.array_to_blobproto(arr, diff)


def arraylist_to_blobprotovector_str(arraylist):
    """Serialize a list of arrays as a BlobProtoVector (bytes)."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend([array_to_blobproto(arr) for arr in arraylist])
    return vec.SerializeToString()


# pycaffe's spelling (sic), kept so old scripts keep working.
arraylist_to_blobprotovecor_str = arraylist_to_blobprotovector_str


def blobprotovector_str_to_arraylist(str):  # noqa: A002 (pycaffe's name)
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(str)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr, label=None):
    """A C x H x W array as a Datum.

    uint8 arrays go to ``data`` as raw bytes, anything else to ``float_data``.
    The label is only set when given (an unset label keeps the record
    smaller, as in pycaffe).
    """
    if arr.ndim != 3:
        raise ValueError('Incorrect array shape.')
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.float_data.extend(np.asarray(arr, dtype=np.float64).ravel().tolist())
    if label is not None:
        datum.label = _datum_label(label)
    return datum


def _datum_label(label):
    """An integral ``label`` as an int; int() cut 1.7 to 1 without a word
    (pycaffe's protobuf refuses floats)."""
    try:
        value = operator.index(label)
    except TypeError:
        if not isinstance(label, (float, np.floating)) or not float(label).is_integer():
            raise ArgumentError(f"array_to_datum: the label must be an integer, got "
                                f"{label!r}") from None
        value = int(label)
    if not -2**31 <= value < 2**31:
        raise ArgumentValueError(f"array_to_datum: label {value} does not fit Datum's int32")
    return value


def datum_to_array(datum):
    """A Datum's values as a C x H x W array: uint8 from ``data``, float64
    from ``float_data`` (as pycaffe).  The label is ``datum.label``."""
    shape = (datum.channels, datum.height, datum.width)
    count = math.prod(shape)        # exact: np.prod wrapped to 0 for huge shapes
    if len(datum.data):
        arr = np.frombuffer(datum.data, dtype=np.uint8).copy()
    else:
        arr = np.array(datum.float_data, dtype=float)
    if arr.size != count:
        raise DataError(
            f"Datum says {datum.channels}x{datum.height}x{datum.width} "
            f"({count} values) but holds {arr.size}")
    return arr.reshape(shape)


# ---------------------------------------------------------------------------
# Pre-processing

class Transformer:
    """Turn H x W x K images into K x H x W net inputs, and back.

    ``inputs`` maps input blob names to their shapes (N, K, H, W), e.g.
    ``{'data': net.blobs['data'].data.shape}``.  ``preprocess`` applies, in
    this order: convert to float32, resize to (H, W), transpose, channel
    swap, raw scale, mean subtraction, input scale.  ``deprocess`` undoes it
    (except the resize).
    """

    def __init__(self, inputs):
        if not isinstance(inputs, Mapping):
            raise ArgumentError("Transformer takes a dict {input name: shape (N, K, H, W)}, "
                                f"got {type(inputs).__name__}")
        self.inputs = inputs
        self.transpose = {}
        self.channel_swap = {}
        self.raw_scale = {}
        self.mean = {}
        self.input_scale = {}

    def __check_input(self, in_):
        if in_ not in self.inputs:
            raise CaffeOclError('{} is not one of the net inputs: {}'.format(
                in_, self.inputs))

    def preprocess(self, in_, data):
        """Format ``data`` (H' x W' x K) for input blob ``in_``; returns a
        float32 K x H x W array."""
        self.__check_input(in_)
        caffe_in = np.array(data, dtype=np.float32, copy=True)
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        in_dims = tuple(self.inputs[in_][2:])
        if len(in_dims) != 2:
            raise ArrayShapeError(f"preprocess({in_!r}): the input's shape "
                                  f"{tuple(self.inputs[in_])} is not N x K x H x W")
        if tuple(caffe_in.shape[:2]) != in_dims:
            if caffe_in.ndim != 3:
                raise ArrayShapeError(f"preprocess({in_!r}): expected an H x W x K image, got "
                                      f"shape {caffe_in.shape}")
            caffe_in = resize_image(caffe_in, in_dims)
        if transpose is not None:
            if caffe_in.ndim != len(transpose):
                raise ArrayShapeError(f"preprocess({in_!r}): transpose {tuple(transpose)} needs "
                                      f"a {len(transpose)}-axis image, got shape "
                                      f"{caffe_in.shape}")
            caffe_in = caffe_in.transpose(transpose)
        if channel_swap is not None:
            _check_channel_swap(in_, channel_swap, caffe_in.shape)
            caffe_in = caffe_in[list(channel_swap), :, :]
        if raw_scale is not None:
            caffe_in *= raw_scale
        if mean is not None:
            caffe_in -= mean
        if input_scale is not None:
            caffe_in *= input_scale
        return caffe_in

    def deprocess(self, in_, data):
        """Invert ``preprocess`` (but not its resize): K x H x W -> H x W x K."""
        self.__check_input(in_)
        decaf_in = np.array(data, copy=True).squeeze()
        transpose = self.transpose.get(in_)
        if transpose is not None and decaf_in.ndim != len(transpose):
            raise ArrayShapeError(f"deprocess({in_!r}) takes one {len(transpose)}-axis image "
                                  f"(a batch of one is squeezed), got shape {np.shape(data)}")
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            decaf_in /= input_scale
        if mean is not None:
            decaf_in += mean
        if raw_scale is not None:
            decaf_in /= raw_scale
        if channel_swap is not None:
            n = len(channel_swap)
            if sorted(c % n for c in channel_swap) != list(range(n)):
                # argsort of a non-permutation is no inverse: a wrong image, silently
                raise ArgumentValueError(f"deprocess({in_!r}): channel_swap "
                                         f"{tuple(channel_swap)} repeats channels, so it "
                                         "cannot be undone")
            _check_channel_swap(in_, channel_swap, decaf_in.shape)
            decaf_in = decaf_in[np.argsort([c % n for c in channel_swap]), :, :]
        if transpose is not None:
            decaf_in = decaf_in.transpose(np.argsort([a % len(transpose) for a in transpose]))
        return decaf_in

    def set_transpose(self, in_, order):
        """Dimension order, e.g. (2, 0, 1) for H x W x K -> K x H x W."""
        self.__check_input(in_)
        _check_indices(in_, order, "set_transpose", "axis")
        n = len(self.inputs[in_]) - 1
        if len(order) != n:
            raise CaffeOclError('Transpose order needs to have the same number of '
                                'dimensions as the input.')
        if sorted(a % n if -n <= a < n else a for a in order) != list(range(n)):
            raise ArrayShapeError(f"set_transpose({in_!r}): {tuple(order)} is not an order "
                                  f"of the axes 0..{n - 1}, each once")
        self.transpose[in_] = order

    def set_channel_swap(self, in_, order):
        """Channel order after the transpose, e.g. (2, 1, 0) for RGB -> BGR."""
        self.__check_input(in_)
        _check_indices(in_, order, "set_channel_swap", "channel")
        if len(order) != self.inputs[in_][1]:
            raise CaffeOclError('Channel swap needs to have the same number of '
                                'dimensions as the input channels.')
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_, scale):
        """Scale applied before mean subtraction (255 for [0, 255] models
        fed with [0, 1] images)."""
        self.__check_input(in_)
        self.raw_scale[in_] = _check_scale(in_, scale, "set_raw_scale")

    def set_mean(self, in_, mean):
        """Mean to subtract: per channel (K,) or elementwise (K x H x W)."""
        self.__check_input(in_)
        mean = _mean_array(in_, mean)
        ms = mean.shape
        if mean.ndim == 1:
            if ms[0] != self.inputs[in_][1]:
                raise ValueError('Mean channels incompatible with input.')
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            if len(ms) == 2:
                ms = (1,) + ms
            if len(ms) != 3:
                raise ArrayShapeError(f'Mean shape invalid: {mean.shape}; give (K,), (H, W) '
                                      'or (K, H, W)')
            in_shape = tuple(self.inputs[in_][1:])
            if tuple(ms) != in_shape:
                # BVLC master: resize the (e.g. 256 x 256) mean to the input
                # (e.g. 227 x 227), as classify.py's defaults need
                if ms[0] != in_shape[0]:
                    raise ValueError('Mean channels incompatible with input.')
                mean = np.asarray(mean, np.float32).reshape(ms)
                m_min, m_max = mean.min(), mean.max()
                if m_max > m_min:
                    normal_mean = (mean - m_min) / (m_max - m_min)
                    mean = resize_image(normal_mean.transpose((1, 2, 0)),
                                        in_shape[1:]).transpose((2, 0, 1)) * \
                        (m_max - m_min) + m_min
                else:
                    mean = np.full(in_shape, m_min, np.float32)
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Scale applied last, after mean subtraction."""
        self.__check_input(in_)
        self.input_scale[in_] = _check_scale(in_, scale, "set_input_scale")


def _check_indices(in_, order, call, what):
    """``order`` is a sequence of integer indices (pycaffe failed later, in
    NumPy's indexing, on None, strings or floats)."""
    if isinstance(order, (str, bytes)) or not hasattr(order, "__len__") or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))
            for i in order):
        raise ArgumentError(f"{call}({in_!r}): the order must be a sequence of {what} "
                            f"indices (integers), got {order!r}")


def _check_channel_swap(in_, order, shape):
    """The channel swap picks channels the (transposed) image has."""
    if len(shape) != 3:
        raise ArrayShapeError(f"channel_swap of input {in_!r} needs a K x H x W image after "
                              f"the transpose, got shape {shape}")
    bad = [c for c in order if not -shape[0] <= c < shape[0]]
    if bad:
        raise ArrayShapeError(f"channel_swap {tuple(order)} of input {in_!r} picks channel "
                              f"{bad[0]} of an image with {shape[0]} channels")


def _check_scale(in_, scale, call):
    """A number (or an array broadcasting over the image); None unsets it."""
    if scale is not None and not _numeric(np.asarray(scale)):
        raise ArgumentError(f"{call}({in_!r}): the scale must be a number, got {scale!r}")
    return scale


def _numeric(arr):
    return arr.dtype != object and (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool)


def _mean_array(in_, mean):
    """The mean as an array (a list or tuple of per-channel values too);
    pycaffe's mean.shape failed on them with an AttributeError."""
    arr = mean if isinstance(mean, np.ndarray) else np.asarray(mean)
    if not _numeric(arr):
        raise ArgumentError(f"set_mean({in_!r}): the mean must be an array of numbers, got "
                            f"{type(mean).__name__}")
    if arr.size == 0:
        raise ArrayShapeError(f"set_mean({in_!r}): the mean is empty (shape {arr.shape})")
    return arr


# ---------------------------------------------------------------------------
# Image IO

# scikit-image's rgb2gray weights (what pycaffe's load_image(color=False) uses)
_GRAY_WEIGHTS = np.array([0.2125, 0.7154, 0.0721], dtype=np.float32)


def _to_unit_float(img):
    """Integer images to float32 in [0, 1] (skimage.img_as_float's rule for
    unsigned types; signed types to [-1, 1])."""
    if np.issubdtype(img.dtype, np.integer):
        return img.astype(np.float32) / np.float32(np.iinfo(img.dtype).max)
    if img.dtype == np.bool_:
        return img.astype(np.float32)
    return img.astype(np.float32)


def load_image(filename, color=True):
    """Load an image file as float32 in [0, 1].

    Returns H x W x 3 RGB when ``color`` is true (grayscale files are tiled
    to 3 channels), H x W x 1 intensity otherwise (colour files are
    converted with scikit-image's luminance weights).  An alpha channel is
    dropped.
    """
    import cv2

    if hasattr(filename, "read"):        # a file object (pycaffe: skimage.io.imread)
        path = getattr(filename, "name", None) or "<file object>"
        data = filename.read()
        if isinstance(data, str):
            raise DataError(f"{path}: load_image needs a binary file object (open(..., 'rb'))")
        raw = np.frombuffer(data, dtype=np.uint8)
        return _decode_image(cv2, raw, str(path), color)
    path = os.fspath(filename)
    if not os.path.exists(path):
        raise FileNotFound(f"image file not found: {path}")
    if os.path.isdir(path):
        raise FileNotFound(f"image file is a directory, expected a file: {path}")
    try:
        # a regular file only: np.fromfile of a FIFO blocked, of /dev/zero never ended
        raw = np.frombuffer(_files.read_file_bytes(path, "image file"), dtype=np.uint8)
    except CaffeOclError as e:
        raise DataError(str(e)) from None
    return _decode_image(cv2, raw, path, color)


def _decode_image(cv2, raw, path, color):
    try:
        img = cv2.imdecode(raw, cv2.IMREAD_UNCHANGED) if raw.size else None
    except cv2.error as e:      # e.g. a header claiming more pixels than OpenCV allows
        msg = " ".join(str(e).split())
        raise DataError(f"{path}: cannot decode image (OpenCV: "
                        f"{msg[msg.find('error:'):] if 'error:' in msg else msg})") from None
    except MemoryError:
        raise DataError(f"{path}: cannot decode image: out of host memory") from None
    if img is None:
        raise DataError(f"{path}: cannot decode image (not an image format "
                        f"OpenCV can read, or a truncated file)")
    try:
        return _unit_float_image(img, color)
    except MemoryError:         # a valid image too large for float32 in this process
        c = 3 if color else 1
        need = img.shape[0] * img.shape[1] * c * 4
        raise DataError(f"{path}: a {img.shape[1]}x{img.shape[0]} image needs "
                        f"{need / 2**30:.1f} GiB as float32: out of host memory") from None


def _unit_float_image(img, color):
    """The decoded image ``img`` (OpenCV's BGR(A) or gray) as load_image
    returns it."""
    alpha = None
    if img.ndim == 3:
        if img.shape[2] == 1:
            img = img[:, :, 0]
        elif img.shape[2] >= 3:
            if img.shape[2] == 4 and not color:
                alpha = _to_unit_float(np.ascontiguousarray(img[:, :, 3]))
            img = img[:, :, 2::-1]           # BGR(A) -> RGB, alpha dropped
        else:                                 # 2 channels: gray + alpha
            img = img[:, :, 0]
    img = _to_unit_float(np.ascontiguousarray(img))
    if alpha is not None:
        # pycaffe's skimage.io.imread(as_gray=True) composites RGBA over a
        # white background (skimage.color.rgba2rgb) before the luminance
        alpha = alpha[:, :, np.newaxis]
        img = np.clip((1 - alpha) + alpha * img, 0, 1).astype(np.float32)
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
        if color:
            img = np.tile(img, (1, 1, 3))
    elif not color:
        img = (img @ _GRAY_WEIGHTS)[:, :, np.newaxis].astype(np.float32)
    return img


def _cv2_interp(interp_order):
    import cv2
    return {0: cv2.INTER_NEAREST, 1: cv2.INTER_LINEAR,
            2: cv2.INTER_CUBIC, 3: cv2.INTER_CUBIC,
            4: cv2.INTER_LANCZOS4, 5: cv2.INTER_LANCZOS4}.get(
                int(interp_order), cv2.INTER_LINEAR)


def _bvlc_resize(im, h, w, interp_order):
    """pycaffe's resize_image computation (python/caffe/io.py): 1 or 3
    channels through scikit-image's ``resize`` on the image scaled to
    [0, 1] (``mode='constant'``: outside the image is 0 there, so upscaled
    borders blend toward the minimum; anti-aliasing when downscaling with
    scikit-image 0.15 or later), other channel counts through
    ``scipy.ndimage.zoom``. None when the library it needs is missing."""
    k = im.shape[-1]
    if k in (1, 3):
        try:
            from skimage.transform import resize
        except ImportError:
            return None
        im_min, im_max = im.min(), im.max()
        im_std = (im - im_min) / (im_max - im_min)
        resized_std = resize(im_std, (h, w), order=interp_order, mode='constant')
        return (resized_std * (im_max - im_min) + im_min).astype(np.float32)
    try:
        from scipy.ndimage import zoom
    except ImportError:
        return None
    scale = tuple(np.array((h, w), dtype=float) / np.array(im.shape[:2]))
    return zoom(im, scale + (1,), order=interp_order).astype(np.float32)


def resize_image(im, new_dims, interp_order=1):
    """Resize an H x W x K image to ``new_dims`` = (height, width).

    ``interp_order`` as in pycaffe (0 nearest, 1 linear, 3 cubic, ...).  Any
    number of channels works.  Returns float32.

    The result is pycaffe's (the same library calls) when scikit-image (for
    1 or 3 channels) or SciPy (other counts) is installed. Without them
    OpenCV resizes (cubic/Lanczos results clipped to the input's min/max):
    the same pixels inside the image for linear downscaling without
    anti-aliasing, but no blending toward the minimum at upscaled borders.
    """
    import cv2

    im = np.asarray(im)
    if im.ndim != 3:
        raise ArrayShapeError(f"resize_image expects an H x W x K array, got shape "
                              f"{tuple(im.shape)}")
    h, w = height_width(new_dims, "resize_image: new_dims")
    k = im.shape[-1]
    if h <= 0 or w <= 0:
        raise ArrayShapeError(f"resize_image: new dims must be positive, got ({h}, {w})")
    if im.size == 0 and k:
        # pycaffe fails on it (min of an empty array); a zero image came out
        raise ArrayShapeError(f"resize_image: the image is empty (shape {im.shape})")
    if h * w * k * 4 > host_memory_budget():
        raise OutOfHostMemory(f"resize_image: a {h} x {w} x {k} float32 result needs "
                              f"{h * w * k * 4 / 2**30:.1f} GiB, more than this machine has")
    if not isinstance(interp_order, (int, np.integer)) or not 0 <= interp_order <= 5:
        raise ArgumentValueError(f"resize_image: interp_order is a spline order 0..5, got "
                                 f"{interp_order!r}")
    im_min, im_max = (im.min(), im.max()) if im.size else (0, 0)
    if im.size == 0 or im_max <= im_min:
        # constant image (or no channels): nothing to interpolate
        ret = np.empty((h, w, k), dtype=np.float32)
        ret.fill(im_min)
        return ret
    out = _bvlc_resize(im, h, w, int(interp_order))
    if out is not None:
        return out
    src = im if im.dtype in (np.float32, np.float64) else im.astype(np.float32)
    interp = _cv2_interp(interp_order)
    # cv2.resize takes at most 512 channels (CV_CN_MAX) and drops a single
    # channel axis; work in chunks of 4 and restack.
    chunks = []
    for c0 in range(0, k, 4):
        part = np.ascontiguousarray(src[:, :, c0:c0 + 4])
        out = cv2.resize(part, (w, h), interpolation=interp)
        if out.ndim == 2:
            out = out[:, :, np.newaxis]
        chunks.append(out)
    resized = chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=2)
    if int(interp_order) > 1:
        resized = np.clip(resized, im_min, im_max)
    return resized.astype(np.float32)


def oversample(images, crop_dims):
    """Ten crops per image: the four corners and the center, then the same
    five mirrored left-right.

    ``images``: sequence of H x W x K arrays (all the same shape);
    ``crop_dims``: (height, width).  Returns float32 (10*N) x h x w x K.
    """
    crop_dims = np.array(_check_oversample(images, crop_dims))
    im_shape = np.array(np.shape(images[0]))
    im_center = im_shape[:2] / 2.0

    h_indices = (0, im_shape[0] - crop_dims[0])
    w_indices = (0, im_shape[1] - crop_dims[1])
    crops_ix = np.empty((5, 4), dtype=int)
    curr = 0
    for i in h_indices:
        for j in w_indices:
            crops_ix[curr] = (i, j, i + crop_dims[0], j + crop_dims[1])
            curr += 1
    # center crop; the float corners are truncated, as pycaffe does
    crops_ix[4] = (np.tile(im_center, (1, 2)) +
                   np.concatenate([-crop_dims / 2.0, crop_dims / 2.0])).astype(int)
    crops_ix = np.tile(crops_ix, (2, 1))

    crops = np.empty((10 * len(images), crop_dims[0], crop_dims[1],
                      im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for crop in crops_ix:
            crops[ix] = im[crop[0]:crop[2], crop[1]:crop[3], :]
            ix += 1
        crops[ix - 5:ix] = crops[ix - 5:ix, :, ::-1, :]  # mirrors
    return crops


def height_width(dims, what):
    """(height, width) from ``dims``: two numbers."""
    try:
        h, w = dims
        return int(h), int(w)
    except (TypeError, ValueError):
        raise ArgumentError(f"{what} must be (height, width), two integers, got "
                            f"{dims!r}") from None


def _check_oversample(images, crop_dims):
    """(height, width) of the crop, after checking for images of one
    H x W x K shape and a crop inside them: pycaffe took every crop at the
    first image's positions and failed in NumPy (or cut wrong crops)
    otherwise."""
    if images is None or len(images) == 0:
        raise ArrayShapeError("oversample: no images")
    shapes = sorted({np.shape(im) for im in images})
    if len(shapes) > 1:
        raise ArrayShapeError(f"oversample: the images must all have one shape, got {shapes}")
    if len(shapes[0]) != 3:
        raise ArrayShapeError(f"oversample: the images must be H x W x K, got shape "
                              f"{shapes[0]}")
    h, w = height_width(crop_dims, "oversample: crop_dims")
    if not (0 <= h <= shapes[0][0] and 0 <= w <= shapes[0][1]):
        raise ArrayShapeError(f"oversample: crop ({h}, {w}) does not fit in the "
                              f"{shapes[0][0]} x {shapes[0][1]} images")
    return h, w
