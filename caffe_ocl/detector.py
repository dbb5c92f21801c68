"""Detector: windowed detection by classifying many crops at once, as
pycaffe's ``caffe.Detector`` (python/caffe/detector.py), after R-CNN
(Girshick et al., "Rich feature hierarchies for accurate object detection
and semantic segmentation", 2014).

    det = caffe.Detector(deploy, weights, mean=..., raw_scale=255,
                         channel_swap=(2, 1, 0), context_pad=16)
    dets = det.detect_windows([("img.jpg", [(ymin, xmin, ymax, xmax), ...])])
    # -> [{'window': ..., 'prediction': ..., 'filename': ...}, ...]

Each window is cropped (with ``context_pad`` pixels of surrounding context
at net-input scale, padded with the mean where the box leaves the image,
as R-CNN), warped to the net's input size, preprocessed and classified.

Selective search proposals come, as in pycaffe, from the MATLAB-based
``selective_search_ijcv_with_python`` package; without it
``detect_selective_search`` raises :class:`SelectiveSearchUnavailable`, an
ImportError as pycaffe's (scripts catch that).
Window coordinates may be any integer sequence (pycaffe needed NumPy
arrays), and the context crop uses integer box corners (pycaffe indexed
with floats, which current NumPy rejects).
"""
import os

import numpy as np

from . import io as caffe_io
from .errors import ArgumentError, ArgumentValueError, CaffeOclError, ShapeError
from .classifier import input_transformer
from .net import Net, TEST


class SelectiveSearchUnavailable(CaffeOclError, ImportError, NotImplementedError):
    """``Detector.detect_selective_search``: the selective search package is
    not installed (an ImportError, as pycaffe's failing import)."""


class Detector(Net):
    """Net extended for windowed detection by a list of crops.

    ``mean``, ``input_scale``, ``raw_scale``, ``channel_swap``: Transformer
    settings of the first input. ``context_pad``: amount of surrounding
    context to take so that a ``context_pad``-pixel border of the network
    input is context, as in R-CNN feature extraction."""

    def __init__(self, model_file, pretrained_file=None, mean=None,
                 input_scale=None, raw_scale=None, channel_swap=None,
                 context_pad=None):
        Net.__init__(self, model_file, TEST, weights=pretrained_file)

        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)

        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """Detect over ``images_windows``: an iterable of (image filename,
        window list), each window (ymin, xmin, ymax, xmax). Returns a list of
        {'window', 'prediction', 'filename'} dicts, in input order."""
        images_windows = [_image_windows(item) for item in images_windows]
        window_inputs = []
        for image_fname, windows in images_windows:
            image = caffe_io.load_image(image_fname).astype(np.float32)
            for window in windows:
                window_inputs.append(self.crop(image, window))
        if not window_inputs:
            return []

        # Warp windows to the input dimensions, preprocess, classify.
        in_ = self.inputs[0]
        caffe_in = np.zeros((len(window_inputs), window_inputs[0].shape[2])
                            + self.blobs[in_].data.shape[2:], dtype=np.float32)
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        out = self.forward_all(**{in_: caffe_in})
        predictions = out[self.outputs[0]]

        detections = []
        ix = 0
        for image_fname, windows in images_windows:
            for window in windows:
                detections.append({'window': window, 'prediction': predictions[ix],
                                   'filename': image_fname})
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames):
        """Windows from selective search (the selective_search_ijcv_with_python
        package, as pycaffe), then ``detect_windows``. Without the package:
        :class:`SelectiveSearchUnavailable` (an ImportError)."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise SelectiveSearchUnavailable(
                "Detector.detect_selective_search: selective search proposals need the "
                "MATLAB-based selective_search_ijcv_with_python package, which is not "
                "installed. Compute windows with another proposal method, e.g. OpenCV "
                "contrib's cv2.ximgproc.segmentation.createSelectiveSearchSegmentation(), "
                "and pass (filename, [(ymin, xmin, ymax, xmax), ...]) pairs to "
                "detect_windows().", name="selective_search_ijcv_with_python") from None
        # absolute paths so that MATLAB finds the files
        image_fnames = [os.path.abspath(f) for f in image_fnames]
        windows_list = selective_search.get_windows(image_fnames,
                                                    cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows_list))

    def crop(self, im, window):
        """Crop ``window`` = (ymin, xmin, ymax, xmax) from the H x W x K image
        ``im``, with surrounding context when ``context_pad`` is set (then the
        result is already of the net's input size, mean-padded where the
        context box leaves the image)."""
        window = np.asarray(window)
        if window.shape != (4,):
            raise ShapeError(f"Detector.crop: a window is (ymin, xmin, ymax, xmax), "
                             f"got {window.tolist()}")
        if not np.all(np.isfinite(window.astype(float))):
            raise ArgumentValueError(f"Detector.crop: window {window.tolist()} has "
                                     "coordinates that are not finite numbers")
        w = window.astype(int)
        crop = im[w[0]:w[2], w[1]:w[3]]
        if not self.context_pad:
            _check_crop(crop, window, im)
            return crop

        box = window.astype(float)
        crop_size = self.blobs[self.inputs[0]].width  # assumes square
        scale = crop_size / (1. * crop_size - self.context_pad * 2)
        # A box plus surrounding context.
        half_h = (box[2] - box[0] + 1) / 2.
        half_w = (box[3] - box[1] + 1) / 2.
        center = (box[0] + half_h, box[1] + half_w)
        scaled_dims = scale * np.array((-half_h, -half_w, half_h, half_w))
        box = np.round(np.tile(center, 2) + scaled_dims)
        full_h = box[2] - box[0] + 1
        full_w = box[3] - box[1] + 1
        scale_h = crop_size / full_h
        scale_w = crop_size / full_w
        pad_y = int(round(max(0, -box[0]) * scale_h))  # amount out of bounds
        pad_x = int(round(max(0, -box[1]) * scale_w))

        # Clip the box to the image.
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0., [im_h, im_w, im_h, im_w])
        clip_h = box[2] - box[0] + 1
        clip_w = box[3] - box[1] + 1
        if clip_h <= 0 or clip_w <= 0:
            raise ShapeError(f"Detector.crop: window {window.tolist()} lies outside the "
                             f"{im_h} x {im_w} image")
        crop_h = int(round(clip_h * scale_h))
        crop_w = int(round(clip_w * scale_w))
        if pad_y + crop_h > crop_size:
            crop_h = crop_size - pad_y
        if pad_x + crop_w > crop_size:
            crop_w = crop_size - pad_x

        # Context crop placed in the input, mean-padded.
        b = box.astype(int)
        context_crop = im[b[0]:b[2], b[1]:b[3]]
        if crop_h <= 0 or crop_w <= 0:
            context_crop = context_crop[:0]     # nothing of it lands in the input
        _check_crop(context_crop, window, im)
        context_crop = caffe_io.resize_image(context_crop, (crop_h, crop_w))
        crop = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        crop[pad_y:(pad_y + crop_h), pad_x:(pad_x + crop_w)] = context_crop
        return crop

    def configure_crop(self, context_pad):
        """Set the crop dimensions and amount of context; with context, make
        the mean (in unprocessed input space) used to pad context crops."""
        in_ = self.inputs[0]
        tpose = self.transformer.transpose[in_]
        inv_tpose = [tpose[t] for t in tpose]
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inv_tpose]
        self.context_pad = context_pad
        crop_size = self.blobs[in_].width
        if context_pad and not 0 < 2 * context_pad < crop_size:
            # pycaffe divided by zero at half the input, and cut mirrored
            # boxes past it or below zero
            raise ArgumentValueError(f"Detector: context_pad {context_pad} must be positive "
                                     f"and below half of the {crop_size}-pixel net input")
        if self.context_pad:
            transpose = self.transformer.transpose.get(in_)
            channel_order = self.transformer.channel_swap.get(in_)
            raw_scale = self.transformer.raw_scale.get(in_)
            # Padding context crops needs the mean in unprocessed input space.
            mean = self.transformer.mean.get(in_)
            if mean is not None:
                inv_transpose = [transpose[t] for t in transpose]
                crop_mean = np.array(mean, dtype=np.float32).transpose(inv_transpose)
                if channel_order is not None:
                    channel_order_inverse = [list(channel_order).index(i)
                                             for i in range(crop_mean.shape[2])]
                    crop_mean = crop_mean[:, :, channel_order_inverse]
                if raw_scale is not None:
                    crop_mean = crop_mean / raw_scale
                self.crop_mean = crop_mean
            else:
                self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)


def _image_windows(item):
    """One (image filename, windows) pair of detect_windows' argument."""
    if isinstance(item, (str, bytes, os.PathLike)) or not hasattr(item, "__len__") \
            or len(item) != 2:
        raise ArgumentError(f"Detector.detect_windows takes (image filename, [windows]) "
                            f"pairs, got {item!r}")
    fname, windows = item
    return fname, list(windows)


def _check_crop(crop, window, im):
    """A window that selects no pixels: pycaffe failed resizing the empty
    crop; classifying a blank input instead gave a prediction for nothing."""
    if crop.size == 0:
        raise caffe_io.ArrayShapeError(f"Detector.crop: window {window.tolist()} selects no "
                                       f"pixels of the {im.shape[0]} x {im.shape[1]} image")
