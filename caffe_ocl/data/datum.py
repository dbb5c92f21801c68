"""Datum records: parse, validate, decode (raw uint8, float_data, encoded
JPEG/PNG), and build them (Caffe's io.cpp CVMatToDatum/ReadImageToDatum).

Decoded images are NumPy arrays of shape (channels, height, width): uint8
for ``data`` and encoded images, float32 for ``float_data``. Colour images
are BGR, as OpenCV (and therefore Caffe) reads them.
"""
import contextlib
import os

import numpy as np

from ..device import check_host_alloc
from ..errors import CaffeOclError, DataError
from ..proto import caffe_pb2, read_file_bytes


def _cv2():
    try:
        import cv2
    except ImportError:  # pragma: no cover - opencv is a dependency
        raise DataError("images need OpenCV: pip install opencv-python-headless")
    try:   # OpenCV's own warnings ("can't open/read file") would be a second line
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    except AttributeError:  # pragma: no cover - older OpenCV
        pass
    return cv2


@contextlib.contextmanager
def opencv_quiet(cv2):
    """OpenCV's own log at ERROR for the block: imread of a missing or
    unreadable file prints "[ WARN ] ... findDecoder ..." beside the one
    DataError that caffe_ocl raises naming the file (OpenCV 4 and 5 have
    cv2.utils.logging; without it nothing changes)."""
    lg = getattr(getattr(cv2, "utils", None), "logging", None)
    if lg is None or not hasattr(lg, "setLogLevel"):
        yield
        return
    old = lg.getLogLevel()
    lg.setLogLevel(lg.LOG_LEVEL_ERROR)
    try:
        yield
    finally:
        lg.setLogLevel(old)


def parse_datum(value, where):
    """A validated Datum from a record's bytes; DataError naming ``where``."""
    from google.protobuf.message import DecodeError
    d = caffe_pb2.Datum()
    try:
        d.ParseFromString(bytes(value))
    except (DecodeError, RuntimeError, ValueError) as e:
        raise DataError(f"{where}: record is not a Datum ({e})") from None
    if d.encoded:
        if not d.data:
            raise DataError(f"{where}: encoded Datum has no image bytes")
        return d
    if not d.data and not len(d.float_data):
        raise DataError(f"{where}: record is not a Datum (no data, float_data or "
                        "encoded image in it)")
    if d.channels <= 0 or d.height <= 0 or d.width <= 0:
        raise DataError(f"{where}: Datum has shape {d.channels}x{d.height}x{d.width}; "
                        "channels, height and width must be positive")
    n = d.channels * d.height * d.width
    size = len(d.data) if d.data else len(d.float_data)
    if size != n:
        field = "data" if d.data else "float_data"
        raise DataError(f"{where}: Datum {field} holds {size} values but its shape "
                        f"{d.channels}x{d.height}x{d.width} needs {n}")
    return d


def imdecode_flag(force_color=False, force_gray=False):
    cv2 = _cv2()
    if force_color and force_gray:
        raise DataError("cannot set both force_color and force_gray")
    if force_color:
        return cv2.IMREAD_COLOR
    if force_gray:
        return cv2.IMREAD_GRAYSCALE
    return cv2.IMREAD_UNCHANGED   # Caffe's DecodeDatumToCVMatNative


def hwc_to_chw(img, where):
    if img.dtype != np.uint8:
        raise DataError(f"{where}: image has {img.dtype} pixels; Caffe reads 8-bit images")
    if img.ndim == 2:
        return img[None]
    return np.ascontiguousarray(img.transpose(2, 0, 1))


def decode_image_bytes(buf, flag, where):
    cv2 = _cv2()
    arr = np.frombuffer(bytes(buf), np.uint8)
    img = cv2.imdecode(arr, flag) if arr.size else None
    if img is None:
        raise DataError(f"{where}: image bytes do not decode (not a JPEG/PNG/... "
                        "OpenCV can read)")
    return hwc_to_chw(img, where)


def decode_datum(datum, where, force_color=False, force_gray=False, is_color=None):
    """(C, H, W) array of a parsed Datum: uint8 or float32. Encoded images
    decode natively (Caffe's DecodeDatumToCVMatNative: grey stays 1 channel,
    an alpha channel stays) unless ``force_color``/``force_gray`` or
    ``is_color`` (Caffe's DecodeDatumToCVMat(datum, is_color)) is given."""
    if datum.encoded:
        if is_color is not None:
            force_color, force_gray = bool(is_color), not is_color
        return decode_image_bytes(datum.data, imdecode_flag(force_color, force_gray), where)
    shape = (datum.channels, datum.height, datum.width)
    if datum.data:
        return np.frombuffer(datum.data, np.uint8).reshape(shape)
    return np.asarray(datum.float_data, np.float32).reshape(shape)


def read_image(path, height=0, width=0, is_color=True, where=None):
    """Caffe's ReadImageToCVMat as (C, H, W) uint8 BGR (or grey): resized to
    height x width (bilinear) when both are > 0."""
    cv2 = _cv2()
    flag = cv2.IMREAD_COLOR if is_color else cv2.IMREAD_GRAYSCALE
    if not os.path.isfile(path):     # also a FIFO or device: imread would block or not end
        raise DataError(f"{where or path}: image {path} is not a regular file"
                        if os.path.exists(path) else f"{where or path}: image {path} not found")
    with opencv_quiet(cv2):
        img = cv2.imread(path, flag)
    if img is None:
        raise DataError(f"{where or path}: could not open or decode image {path}")
    if height > 0 and width > 0:
        channels = img.shape[2] if img.ndim == 3 else 1
        check_host_alloc(height * width * channels, f"{where or path}: image {path} resized "
                         f"to {height}x{width}")
        try:
            img = cv2.resize(img, (width, height))
        except cv2.error as e:      # OpenCV's own out-of-memory or size limits
            raise DataError(f"{where or path}: cannot resize image {path} to "
                            f"{height}x{width} ({' '.join(str(e).split())[-160:]})") from None
    return hwc_to_chw(img, where or path)


def read_image_file(path, flag):
    """An image file decoded by OpenCV (``flag``: cv2.IMREAD_*): one
    DataError line naming the file when it is missing, not a regular file
    (a FIFO would block, /dev/zero never end), empty or not decodable."""
    cv2 = _cv2()
    with_path = str(path)
    try:
        raw = read_file_bytes(with_path, "image")
    except CaffeOclError as e:
        raise DataError(str(e) if with_path in str(e) else f"{with_path}: {e}") from None
    arr = np.frombuffer(raw, np.uint8)
    try:
        with opencv_quiet(cv2):
            im = cv2.imdecode(arr, flag) if arr.size else None
    except cv2.error as e:
        msg = " ".join(str(e).split())[-200:]
        raise DataError(f"{with_path}: OpenCV cannot decode the image ({msg})") from None
    if im is None:
        raise DataError(f"{with_path}: not an image OpenCV can decode (empty, truncated or "
                        "another format)")
    if im.dtype != np.uint8:
        im = (im / 257).astype(np.uint8) if im.dtype == np.uint16 else im.astype(np.uint8)
    return im


def array_to_datum(arr, label=0):
    """Datum of a (C, H, W) array: uint8 -> data, anything else -> float_data."""
    arr = np.asarray(arr)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise DataError(f"array_to_datum: expected 3 axes (C, H, W), got shape {arr.shape}")
    d = caffe_pb2.Datum()
    d.channels, d.height, d.width = (int(s) for s in arr.shape)
    if arr.dtype == np.uint8:
        d.data = np.ascontiguousarray(arr).tobytes()
    else:
        d.float_data.extend(arr.astype(np.float32).ravel().tolist())
    d.label = int(label)
    return d


def image_file_to_datum(path, label, height, width, is_color, encoding, where):
    """Caffe's ReadImageToDatum: raw CxHxW BGR bytes, or (with ``encoding``)
    the file's own bytes when it already has that encoding and needs no
    resize or colour change, else the image re-encoded."""
    cv2 = _cv2()
    img = read_image(path, height, width, is_color, where)      # (C, H, W)
    if encoding:
        d = caffe_pb2.Datum()
        ext = path.rsplit(".", 1)[-1].lower() if "." in path else ""
        same_ext = ext == encoding.lower() or (ext in ("jpg", "jpeg") and
                                               encoding.lower() in ("jpg", "jpeg"))
        if (img.shape[0] == 3) == is_color and not height and not width and same_ext:
            with open(path, "rb") as f:
                d.data = f.read()
        else:
            hwc = img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0)
            ok, buf = cv2.imencode("." + encoding, np.ascontiguousarray(hwc))
            if not ok:
                raise DataError(f"{where}: cannot encode image as {encoding!r}")
            d.data = buf.tobytes()
        d.label = int(label)
        d.encoded = True
        return d, img.shape
    return array_to_datum(img, label), img.shape
