"""Test helpers: run a single layer, and Caffe's GradientChecker.

``make_layer(prototxt_text, bottoms, phase)`` builds one layer from a
``layer { ... }`` text and NumPy bottoms and sets it up, so a test is
three lines. ``check_gradient`` follows Caffe's GradientChecker
(include/caffe/test/test_gradient_check_util.hpp): the objective is
1/2 * sum(top^2) (or one element of one top), central differences with
``stepsize``, and an element passes when
|analytic - numeric| <= threshold * max(|analytic|, |numeric|, 1);
elements whose top feature lies within ``kink_range`` of ``kink`` are
skipped (ReLU-like kinks).
"""
import numpy as np
from google.protobuf import text_format

from .blob import Blob
from .layers.base import create_layer
from .proto import caffe_pb2


def layer_param(text):
    p = caffe_pb2.LayerParameter()
    text_format.Parse(text, p)
    if not p.name:
        p.name = p.type.lower() or "layer"
    return p


def make_blobs(arrays, prefix="b"):
    out = []
    for i, a in enumerate(arrays):
        a = np.asarray(a, np.float32)
        b = Blob(a.shape, name=f"{prefix}{i}")
        b.data[...] = a
        out.append(b)
    return out


def make_layer(text, bottoms, phase=caffe_pb2.TEST, ntop=None):
    """Build and set up a layer. ``bottoms`` are arrays or Blobs.
    Returns (layer, bottom blobs, top blobs)."""
    p = layer_param(text)
    bl = [b if isinstance(b, Blob) else make_blobs([b], f"bottom{i}_")[0]
          for i, b in enumerate(bottoms)]
    n = ntop if ntop is not None else max(len(p.top), 1)
    tops = [Blob((), name=f"top{i}") for i in range(n)]
    layer = create_layer(p, phase)
    layer.propagate_down = [True] * len(bl)
    layer.setup(bl, tops)
    return layer, bl, tops


def forward(layer, bottoms, tops):
    layer.reshape_if_needed(bottoms, tops)
    layer.forward(bottoms, tops)
    return [t.host_data().copy() for t in tops]


def _objective(tops, top_id, top_data_id):
    if top_id is None:
        return 0.5 * sum(float(np.sum(t.host_data().astype(np.float64) ** 2)) for t in tops)
    if top_data_id is not None:
        return float(tops[top_id].host_data().ravel()[top_data_id])
    return 0.5 * float(np.sum(tops[top_id].host_data().astype(np.float64) ** 2))


def _set_top_diffs(tops, top_id, top_data_id):
    for i, t in enumerate(tops):
        d = np.zeros(t.shape, np.float32)
        if top_id is None or (i == top_id and top_data_id is None):
            d[...] = t.host_data()
        elif i == top_id:
            d.ravel()[top_data_id] = 1.0
        t.diff[...] = d


def check_gradient(layer, bottoms, tops, *, stepsize=1e-2, threshold=1e-3,
                   check_bottom=None, check_params=True, top_id=None, top_data_id=None,
                   kink=0.0, kink_range=-1.0, seed_fn=None, max_checks=None):
    """Assert analytic gradients of ``layer`` match central differences.

    ``check_bottom``: indices of bottoms to check (default all).
    ``seed_fn``: called before every forward (reseed random layers).
    ``max_checks``: check at most this many elements per blob (random subset).
    Returns the number of elements checked."""
    if check_bottom is None:
        check_bottom = list(range(len(bottoms)))
    reseed = seed_fn or (lambda: None)
    blobs = [bottoms[i] for i in check_bottom]
    if check_params:
        blobs += list(layer.blobs)
    # analytic gradients
    for p in layer.blobs:
        p.diff[...] = 0
    reseed()
    forward(layer, bottoms, tops)
    _set_top_diffs(tops, top_id, top_data_id)
    prop = [i in check_bottom for i in range(len(bottoms))]
    layer.backward(tops, prop, bottoms)
    analytic = [b.host_diff().astype(np.float64).copy() for b in blobs]
    # feature values at the kink test
    top_feat = [t.host_data().copy() for t in tops]
    rng = np.random.default_rng(1701)
    checked = 0
    for bi, b in enumerate(blobs):
        idxs = np.arange(b.count)
        if max_checks is not None and b.count > max_checks:
            idxs = rng.choice(b.count, max_checks, replace=False)
        for idx in idxs:
            orig = float(b.host_data().ravel()[idx])
            b.data.ravel()[idx] = orig + stepsize
            reseed()
            forward(layer, bottoms, tops)
            pos = _objective(tops, top_id, top_data_id)
            b.data.ravel()[idx] = orig - stepsize
            reseed()
            forward(layer, bottoms, tops)
            neg = _objective(tops, top_id, top_data_id)
            b.data.ravel()[idx] = orig
            numeric = (pos - neg) / (2.0 * stepsize)
            computed = analytic[bi].ravel()[idx]
            feature = None
            if top_id is not None and top_data_id is not None:
                feature = float(top_feat[top_id].ravel()[top_data_id])
            elif len(tops) and tops[0].count == b.count and bi < len(check_bottom):
                feature = float(top_feat[0].ravel()[idx])
            if feature is not None and kink - kink_range <= abs(feature) <= kink + kink_range:
                continue
            scale = max(abs(computed), abs(numeric), 1.0)
            if abs(computed - numeric) > threshold * scale:
                which = (f"bottom {check_bottom[bi]}" if bi < len(check_bottom)
                         else f"param {bi - len(check_bottom)}")
                raise AssertionError(
                    f"{layer.type} layer {layer.name!r}: gradient of {which} element "
                    f"{idx} is {computed:.6g}, finite differences give {numeric:.6g} "
                    f"(threshold {threshold} x {scale:.3g})")
            checked += 1
    forward(layer, bottoms, tops)
    return checked
