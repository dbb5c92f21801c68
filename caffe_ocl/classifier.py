"""Classifier: a Net for image classification, as pycaffe's
``caffe.Classifier`` (python/caffe/classifier.py).

    net = caffe.Classifier(deploy, weights, image_dims=(256, 256),
                           mean=mean_kx1x1_or_khw, raw_scale=255,
                           channel_swap=(2, 1, 0))
    probs = net.predict([caffe.io.load_image(path)])       # N x C

``predict`` resizes each H x W x K image to ``image_dims``, then either takes
ten crops of the net's input size (four corners, center, and their mirrors)
and averages the ten predictions (``oversample=True``, the default), or the
center crop alone; preprocessing is ``caffe_ocl.io.Transformer``'s (transpose
to K x H x W, channel swap, raw scale, mean, input scale).

Differences from pycaffe a user may notice: images are resized with OpenCV
(see ``caffe_ocl.io``); ``image_dims`` smaller than the crop raise a
ShapeError instead of failing inside NumPy; an empty input list raises too.
"""
import numpy as np

from . import io as caffe_io
from .errors import ShapeError
from .net import Net, TEST


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """The Transformer pycaffe's Classifier and Detector configure for the
    net's first input: HxWxC -> CxHxW, then the optional mean, input scale,
    raw scale and channel swap."""
    in_ = net.inputs[0]
    t = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    t.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        t.set_mean(in_, mean)
    if input_scale is not None:
        t.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        t.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        t.set_channel_swap(in_, channel_swap)
    return t


class Classifier(Net):
    """Net extended for image class prediction by scaling, center cropping
    or oversampling.

    ``image_dims``: (height, width) the inputs are resized to before
    cropping; defaults to the net's input size (whole-image crop).
    ``mean``, ``input_scale``, ``raw_scale``, ``channel_swap``: the
    ``Transformer`` settings for the net's first input."""

    def __init__(self, model_file, pretrained_file=None, image_dims=None,
                 mean=None, input_scale=None, raw_scale=None, channel_swap=None):
        Net.__init__(self, model_file, TEST, weights=pretrained_file)

        in_ = self.inputs[0]
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)

        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        if image_dims is None or len(image_dims) == 0:
            image_dims = self.crop_dims
        self.image_dims = image_dims

    def predict(self, inputs, oversample=True):
        """Class probabilities (N x C) of ``inputs``, an iterable of
        H x W x K arrays; averaged over 10 crops when ``oversample``."""
        inputs = list(inputs)
        if not inputs:
            raise ShapeError("Classifier.predict: no input images")
        for ix, in_ in enumerate(inputs):
            if np.ndim(in_) != 3:       # pycaffe: an IndexError from in_.shape[2]
                raise caffe_io.ArrayShapeError(f"Classifier.predict: input {ix} must be an "
                                               f"H x W x K image, got shape {np.shape(in_)}")
        image_dims = caffe_io.height_width(self.image_dims, "Classifier: image_dims")
        if image_dims[0] < self.crop_dims[0] or image_dims[1] < self.crop_dims[1]:
            raise ShapeError(f"Classifier: image_dims {image_dims} are smaller than the "
                             f"net's input crop {tuple(int(d) for d in self.crop_dims)}")
        # Scale to standardize input dimensions.
        input_ = np.zeros((len(inputs), image_dims[0], image_dims[1], np.shape(inputs[0])[2]),
                          dtype=np.float32)
        for ix, in_ in enumerate(inputs):
            input_[ix] = caffe_io.resize_image(in_, image_dims)

        if oversample:
            # Center, corner, and mirrored crops.
            input_ = caffe_io.oversample(input_, self.crop_dims)
        else:
            # Center crop (corners truncated to integers, as pycaffe).
            center = np.array(image_dims) / 2.0
            crop = np.tile(center, (1, 2))[0] + np.concatenate(
                [-self.crop_dims / 2.0, self.crop_dims / 2.0])
            crop = crop.astype(int)
            input_ = input_[:, crop[0]:crop[2], crop[1]:crop[3], :]

        # Classify
        caffe_in = np.zeros(np.array(input_.shape)[[0, 3, 1, 2]], dtype=np.float32)
        for ix, in_ in enumerate(input_):
            caffe_in[ix] = self.transformer.preprocess(self.inputs[0], in_)
        out = self.forward_all(**{self.inputs[0]: caffe_in})
        predictions = out[self.outputs[0]]

        # For oversampling, average predictions across crops.
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1))
            predictions = predictions.mean(1)
        return predictions
