"""WindowData: Caffe's R-CNN data layer (window_data_layer.cpp).

Reads a window file and, in a prefetch thread, fills each batch with
``batch_size * (1 - fg_fraction)`` background windows then the foreground
ones, each drawn at random from its set, cut out of its image (with
``context_pad`` pixels of context at the output scale and, for
``crop_mode: "square"``, the window squared first; any other mode warps
the window as it is, as in Caffe), warped to ``crop_size``
x ``crop_size`` (bilinear), mirrored at random when ``mirror``, minus the
mean (``mean_file``, centred, or ``mean_value``) and times ``scale``; the
part of the expanded window outside the image stays 0. Labels: the
window's class, 0 for background.

Window file, whitespace-separated, repeated per image:
``# image_index``, image path (``root_folder`` prepended), channels,
height, width, window count, then per window ``class overlap x1 y1 x2 y2``
(inclusive pixel corners). Windows with overlap >= ``fg_threshold`` are
foreground (class must be > 0), those < ``bg_threshold`` background, the
rest unused.

As in Caffe, ``crop_size``, ``mirror`` and the mean come from
``transform_param`` (V1 nets' window_data_param fields are moved there by
the upgrade). Differences a user may notice: random draws come from
caffe_ocl's generator (not Caffe's Mersenne twister); an unreadable image
or a window outside its image is an error naming the file (Caffe logs and
leaves the rest of the batch as it was, or aborts); images are always read
as 3-channel colour, as Caffe's cv::imread does, so the window file's
channel count must be 3.
"""
import logging
import math
import os

import numpy as np

from ..data.datum import opencv_quiet
from ..data.transformer import DataTransformer, seeded_rng
from ..errors import DataError
from .base import register
from .data import BasePrefetchingDataLayer, RecordSource, shape_str

log = logging.getLogger("caffe_ocl")

# columns of a window row
IMAGE, LABEL, OVERLAP, X1, Y1, X2, Y2 = range(7)


def _c_round(x):
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def read_window_file(path, root, fg_threshold, bg_threshold, where):
    """([(image path, (channels, height, width))], fg windows, bg windows),
    windows as float32 rows (image index into the list, label, overlap,
    x1, y1, x2, y2)."""
    if not os.path.isfile(path):
        raise DataError(f"{where}: window file {path} not found")
    with open(path, encoding="utf-8", errors="replace") as f:
        tokens = f.read().split()
    if not tokens:
        raise DataError(f"{where}: window file {path} is empty")
    pos = 0

    def take(kind, what):
        nonlocal pos
        if pos >= len(tokens):
            raise DataError(f"{where}: window file {path} ends early: expected {what} "
                            f"(token {pos + 1})")
        tok = tokens[pos]
        pos += 1
        try:
            return kind(tok)
        except ValueError:
            raise DataError(f"{where}: window file {path} token {pos}: expected {what}, "
                            f"got {tok!r}") from None

    images, fg, bg = [], [], []
    while pos < len(tokens):
        if tokens[pos] != "#":
            raise DataError(f"{where}: window file {path} token {pos + 1}: expected '#' "
                            f"starting an image, got {tokens[pos]!r}")
        pos += 1
        index = take(int, "the image index")
        image = root + take(str, "the image path")
        size = tuple(take(int, what) for what in ("channels", "height", "width"))
        if index != len(images):
            raise DataError(f"{where}: window file {path}: image index {index} where "
                            f"{len(images)} was expected (images are numbered from 0)")
        images.append((image, size))
        for _ in range(take(int, "the window count")):
            label = take(int, "a window's class")
            overlap = take(float, "a window's overlap")
            box = [take(int, f"a window's {c}") for c in ("x1", "y1", "x2", "y2")]
            row = [index, label, overlap] + box
            if overlap >= fg_threshold:
                if label <= 0:
                    raise DataError(f"{where}: window file {path}, image {index}: a "
                                    f"foreground window (overlap {overlap}) has class "
                                    f"{label}; foreground classes must be > 0")
                fg.append(row)
            elif overlap < bg_threshold:
                bg.append([index, 0, 0.0] + box)
    return images, np.asarray(fg, np.float32), np.asarray(bg, np.float32)


class _WindowSource(RecordSource):
    def __init__(self, images, fg, bg, p, crop, mirror, mean, mean_values, rng, **kw):
        super().__init__(**kw)
        self.images, self.fg, self.bg = images, fg, bg
        self.p = p
        self.crop, self.mirror = crop, mirror
        self.mean, self.mean_values = mean, mean_values
        self.rng = rng
        self.cache = {}

    def _image(self, index):
        import cv2
        path = self.images[index][0]
        if self.p.cache_images:
            if index not in self.cache:
                try:
                    self.cache[index] = np.fromfile(path, np.uint8)
                except OSError as e:
                    raise DataError(f"WindowData: could not read image {path}: {e}") from None
            img = cv2.imdecode(self.cache[index], cv2.IMREAD_COLOR)
        else:
            with opencv_quiet(cv2):
                img = cv2.imread(path, cv2.IMREAD_COLOR)
        if img is None:
            raise DataError(f"WindowData: could not open or decode image {path}")
        return img

    def fill(self, batch):
        data, labels = batch.arrays
        data[...] = 0
        num_fg = int(np.float32(self.batch_size) * np.float32(self.p.fg_fraction))
        item = 0
        for windows, count in ((self.bg, self.batch_size - num_fg), (self.fg, num_fg)):
            for _ in range(count):
                w = windows[int(self.rng.integers(len(windows)))]
                flip = bool(self.mirror and self.rng.integers(2))
                self._window(w, flip, data[item])
                labels[item] = w[LABEL]
                item += 1

    def _window(self, w, flip, out):
        """Caffe's load_batch for one window, into out (C, crop, crop)."""
        import cv2
        img = self._image(int(w[IMAGE]))
        crop, pad = self.crop, int(self.p.context_pad)
        x1, y1, x2, y2 = (int(v) for v in w[X1:Y2 + 1])
        rows, cols = img.shape[:2]
        size = (crop, crop)              # (width, height) of the warped window
        pad_w = pad_h = 0
        f32 = np.float32
        if pad > 0 or self.p.crop_mode == "square":
            # expand so that, warped, the window has `pad` pixels of context
            context_scale = f32(crop) / f32(crop - 2 * pad)
            half_h, half_w = f32(y2 - y1 + 1) / f32(2), f32(x2 - x1 + 1) / f32(2)
            cx, cy = f32(x1) + half_w, f32(y1) + half_h
            if self.p.crop_mode == "square":
                half_h = half_w = max(half_h, half_w)
            x1 = _c_round(cx - half_w * context_scale)
            x2 = _c_round(cx + half_w * context_scale)
            y1 = _c_round(cy - half_h * context_scale)
            y2 = _c_round(cy + half_h * context_scale)
            unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            scale_x, scale_y = f32(crop) / f32(unclipped_w), f32(crop) / f32(unclipped_h)
            size = (_c_round(f32(x2 - x1 + 1) * scale_x), _c_round(f32(y2 - y1 + 1) * scale_y))
            pad_x1, pad_x2 = _c_round(f32(pad_x1) * scale_x), _c_round(f32(pad_x2) * scale_x)
            pad_h = _c_round(f32(pad_y1) * scale_y)
            pad_w = pad_x2 if flip else pad_x1       # the padding mirrors too
            size = (min(size[0], crop - pad_w), min(size[1], crop - pad_h))
        if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows) or min(size) <= 0:
            raise DataError(f"WindowData: window ({int(w[X1])}, {int(w[Y1])}, {int(w[X2])}, "
                            f"{int(w[Y2])}) of image {self.images[int(w[IMAGE])][0]} "
                            f"({cols} x {rows}) lies outside the image")
        warped = cv2.resize(img[y1:y2 + 1, x1:x2 + 1], size, interpolation=cv2.INTER_LINEAR)
        if flip:
            warped = warped[:, ::-1]
        h, wd = warped.shape[:2]
        pix = np.transpose(warped, (2, 0, 1)).astype(np.float32)
        if self.mean is not None:
            off = (self.mean.shape[2] - crop) // 2
            pix -= self.mean[:, off + pad_h:off + pad_h + h, off + pad_w:off + pad_w + wd]
        elif self.mean_values is not None:
            pix -= self.mean_values[:, None, None]
        out[:, pad_h:pad_h + h, pad_w:pad_w + wd] = pix * np.float32(self.p.scale)


@register("WindowData")
class WindowDataLayer(BasePrefetchingDataLayer):
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.window_data_param
        t = self.param.transform_param
        where = f"layer {self.name!r} (WindowData)"
        if not p.source:
            raise self.error("window_data_param.source (the window file) is not set",
                             DataError)
        if p.batch_size <= 0:
            raise self.error("window_data_param.batch_size must be positive", DataError)
        moved = [f for f in ("crop_size", "mirror", "mean_file") if p.HasField(f)]
        if moved and not any(t.HasField(f) for f in moved):
            raise self.error(f"window_data_param.{', '.join(moved)}: Caffe reads these from "
                             f"transform_param in a layer {{ }} net; move them there",
                             DataError)
        crop = int(t.crop_size)
        if crop <= 0:
            raise self.error("transform_param.crop_size must be positive (the warped "
                             "window size)", DataError)
        if 2 * int(p.context_pad) >= crop:
            raise self.error(f"context_pad {p.context_pad} leaves nothing of crop_size "
                             f"{crop}", DataError)
        images, fg, bg = read_window_file(p.source, p.root_folder, p.fg_threshold,
                                          p.bg_threshold, where)
        channels = images[-1][1][0]
        if channels != 3:
            raise self.error(f"window file {p.source}: images have {channels} channels; "
                             "WindowData reads colour images (3)", DataError)
        bs = int(p.batch_size)
        num_fg = int(np.float32(bs) * np.float32(p.fg_fraction))
        for name, windows, need in (("foreground", fg, num_fg), ("background", bg, bs - num_fg)):
            if need and not len(windows):
                raise self.error(f"window file {p.source} has no {name} windows (overlap "
                                 f"thresholds {p.fg_threshold} / {p.bg_threshold}) but a "
                                 f"batch takes {need}", DataError)
        log.info("Window data layer: %d images, %d foreground and %d background windows; "
                 "context_pad %d, crop_mode %s", len(images), len(fg), len(bg),
                 p.context_pad, p.crop_mode)
        # the mean as the DataTransformer reads it (its checks included);
        # WindowData applies it itself, centred on the warped window
        tr = DataTransformer(t, self.phase, seeded_rng(), where)
        mean, mean_values = tr.mean, None
        if mean is not None:
            if mean.shape[0] != channels or min(mean.shape[1:]) < crop:
                raise self.error(f"mean file {t.mean_file} is {shape_str(mean.shape)}; "
                                 f"needs {channels} channels of at least {crop} x {crop}",
                                 DataError)
        if tr.mean_values is not None:
            if len(tr.mean_values) not in (1, channels):
                raise self.error(f"specify either 1 mean_value or as many as channels "
                                 f"({channels})", DataError)
            mean_values = np.resize(tr.mean_values, channels)
        out = (channels, crop, crop)
        top[0].reshape((bs,) + out)
        top[1].reshape((bs,))
        log.info("output data size: %s", shape_str((bs,) + out))
        src = _WindowSource(images, fg, bg, p, crop, tr.mirror, mean, mean_values,
                            tr.rng, batch_size=bs, out_shape=out, with_label=True,
                            transformer=None)
        self._start_prefetch(src, self.param.data_param.prefetch)
