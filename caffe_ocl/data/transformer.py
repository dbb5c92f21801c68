"""Caffe's DataTransformer (src/caffe/data_transformer.cpp), host-side NumPy.

For each image (C x H x W, uint8 or float) and in Caffe's order:
1. ``do_mirror = mirror && Rand(2)`` (drawn first),
2. crop offsets: random ``Rand(H - crop + 1)``, ``Rand(W - crop + 1)`` in
   TRAIN, centred ``(H - crop) / 2`` in TEST,
3. ``out = (pixel - mean) * scale`` in float32, where ``mean`` is the mean
   file's value at the *uncropped* position (the mean image has the full
   record size) or ``mean_value[c]`` (one value is replicated to every
   channel),
4. mirrored outputs are written right to left.

The random numbers come from a NumPy Generator seeded from
``caffe_ocl.ops.random``'s seed state (``set_random_seed``/the solver's
``random_seed``), so runs are reproducible.
"""
import os

import numpy as np

from ..errors import CaffeOclError, DataError
from ..ops import random as oprandom
from ..proto import blobproto_to_array, caffe_pb2, read_blobproto


def seeded_rng():
    """A NumPy Generator drawn from the process-wide seed state."""
    seed, stream = oprandom.next_stream()
    return np.random.default_rng([seed, stream, 0xDA7A])


class DataTransformer:
    def __init__(self, param=None, phase=caffe_pb2.TEST, rng=None, where="data layer"):
        if param is None:
            param = caffe_pb2.TransformationParameter()
        self.param = param
        self.phase = phase
        self.where = where
        self.scale = np.float32(param.scale)
        self.mirror = bool(param.mirror)
        self.crop_size = int(param.crop_size)
        self.force_color = bool(param.force_color)
        self.force_gray = bool(param.force_gray)
        if self.force_color and self.force_gray:
            raise DataError(f"{where}: cannot set both force_color and force_gray")
        self.rng = rng if rng is not None else seeded_rng()
        self.mean = None
        self.mean_values = None
        if param.HasField("mean_file") and len(param.mean_value):
            raise DataError(f"{where}: cannot specify mean_file and mean_value at the "
                            "same time")
        if param.HasField("mean_file"):
            self.mean_file = param.mean_file
            self.mean = load_mean_file(param.mean_file, where)
        if len(param.mean_value):
            self.mean_values = np.asarray(list(param.mean_value), np.float32)

    # ---- shapes ---------------------------------------------------------------
    def infer_shape(self, shape, source=""):
        """Output (C, h, w) for records of ``shape`` (C, H, W); checks the crop
        size, the mean file's shape and the number of mean values."""
        c, h, w = (int(s) for s in shape)
        of = f" of {source}" if source else ""
        if self.crop_size and (h < self.crop_size or w < self.crop_size):
            raise DataError(f"{self.where}: crop_size {self.crop_size} is larger than the "
                            f"records{of} ({c}x{h}x{w})")
        if self.mean is not None and self.mean.shape != (c, h, w):
            raise DataError(f"{self.where}: mean file {self.mean_file} has shape "
                            f"{'x'.join(map(str, self.mean.shape))} but the records{of} are "
                            f"{c}x{h}x{w}")
        if self.mean_values is not None and len(self.mean_values) not in (1, c):
            raise DataError(f"{self.where}: specify either 1 mean_value or as many as "
                            f"channels ({c}); got {len(self.mean_values)}")
        if self.crop_size:
            return (c, self.crop_size, self.crop_size)
        return (c, h, w)

    @property
    def needs_rand(self):
        return self.mirror or (self.phase == caffe_pb2.TRAIN and self.crop_size > 0)

    # ---- transform --------------------------------------------------------------
    def draw(self, h, w):
        """(do_mirror, h_off, w_off) for one image, in Caffe's draw order."""
        do_mirror = self.mirror and bool(self.rng.integers(2))
        h_off = w_off = 0
        if self.crop_size:
            if self.phase == caffe_pb2.TRAIN:
                h_off = int(self.rng.integers(h - self.crop_size + 1))
                w_off = int(self.rng.integers(w - self.crop_size + 1))
            else:
                h_off = (h - self.crop_size) // 2
                w_off = (w - self.crop_size) // 2
        return do_mirror, h_off, w_off

    def transform(self, img, out=None):
        """Transform one (C, H, W) image into ``out`` (C, h, w) float32."""
        c, h, w = img.shape
        do_mirror, h_off, w_off = self.draw(h, w)
        oh, ow = (self.crop_size, self.crop_size) if self.crop_size else (h, w)
        x = img[:, h_off:h_off + oh, w_off:w_off + ow].astype(np.float32)
        if self.mean is not None:
            x -= self.mean[:, h_off:h_off + oh, w_off:w_off + ow]
        elif self.mean_values is not None:
            mv = self.mean_values if len(self.mean_values) == c else \
                np.repeat(self.mean_values[:1], c)
            x -= mv[:, None, None]
        x *= self.scale
        if do_mirror:
            x = x[:, :, ::-1]
        if out is None:
            return np.ascontiguousarray(x)
        out[...] = x
        return out

    def transform_batch(self, imgs, out):
        """Transform a stack (N, C, H, W) into ``out`` (N, C, h, w); one batched
        NumPy expression when there is no crop and no mirror (same numbers)."""
        if not self.crop_size and not self.mirror:
            x = np.asarray(imgs).astype(np.float32)
            if self.mean is not None:
                x -= self.mean
            elif self.mean_values is not None:
                c = x.shape[1]
                mv = self.mean_values if len(self.mean_values) == c else \
                    np.repeat(self.mean_values[:1], c)
                x -= mv[None, :, None, None]
            x *= self.scale
            out[...] = x
            return out
        for i in range(len(imgs)):
            self.transform(imgs[i], out[i])
        return out


def load_mean_file(path, where="data layer"):
    """A mean .binaryproto as a (C, H, W) float32 array."""
    if not os.path.exists(path):
        raise DataError(f"{where}: mean file {path} not found")
    try:
        arr = blobproto_to_array(read_blobproto(path))
    except CaffeOclError as e:
        msg = str(e)
        msg = msg[len(path) + 2:] if msg.startswith(f"{path}: ") else msg
        raise DataError(f"{where}: mean file {path} cannot be read: {msg}") from None
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise DataError(f"{where}: mean file {path} has shape {arr.shape}; expected "
                        "1 x C x H x W")
    return np.ascontiguousarray(arr, np.float32)
