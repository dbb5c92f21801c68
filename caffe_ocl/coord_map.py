"""Spatial coordinate mapping between the tops of a NetSpec, as pycaffe's
``caffe.coord_map``.

A map is ``(axis, a, b)``: a coordinate ``x`` of the input of a layer lands
at ``a * x + b`` in its output, on the spatial axes from ``axis`` on
(``axis`` None means "any axis": the identity of pointwise layers).  ``a``
and ``b`` are scalars or per-axis arrays.  ``crop(top_from, top_to)`` uses
the map between two tops to spec the Crop layer that aligns them, as in the
FCN nets.
"""

import numpy as np

from .net_spec import layers as L

__all__ = ["PASS_THROUGH_LAYERS", "conv_params", "crop_params",
           "UndefinedMapException", "AxisMismatchException", "coord_map",
           "compose", "inverse", "coord_map_from_to", "crop"]

PASS_THROUGH_LAYERS = ['AbsVal', 'BatchNorm', 'Bias', 'BNLL', 'Dropout',
                       'Eltwise', 'ELU', 'Log', 'LRN', 'Exp', 'MVN', 'Power',
                       'ReLU', 'PReLU', 'Scale', 'Sigmoid', 'Split', 'TanH',
                       'Threshold']


def conv_params(fn):
    """(axis, stride, effective kernel extent, pad) of a Convolution,
    Deconvolution, Im2col or Pooling Function, from ``convolution_param``
    when given as a dict and from its keyword arguments otherwise.  The
    kernel extent includes dilation."""
    params = fn.params.get('convolution_param', fn.params)
    axis = params.get('axis', 1)
    ks = np.array(params['kernel_size'], ndmin=1)
    dilation = np.array(params.get('dilation', 1), ndmin=1)
    assert len({'pad_h', 'pad_w', 'kernel_h', 'kernel_w', 'stride_h',
                'stride_w'} & set(fn.params)) == 0, \
        'cropping does not support legacy _h/_w params'
    return (axis, np.array(params.get('stride', 1), ndmin=1),
            (ks - 1) * dilation + 1,
            np.array(params.get('pad', 0), ndmin=1))


def crop_params(fn):
    """(axis, offset) of a Crop Function, with Caffe's defaults (axis 2)."""
    params = fn.params.get('crop_param', fn.params)
    axis = params.get('axis', 2)
    offset = np.array(params.get('offset', 0), ndmin=1)
    return (axis, offset)


class UndefinedMapException(Exception):
    """The layer type has no coordinate mapping."""


class AxisMismatchException(Exception):
    """Two maps on different axes cannot be composed."""


def coord_map(fn):
    """The (axis, scale, shift) map from the input to the output of one
    layer Function; raises UndefinedMapException for other layer types."""
    if fn.type_name in ['Convolution', 'Pooling', 'Im2col']:
        axis, stride, ks, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (ks - 1) / 2) / stride
    elif fn.type_name == 'Deconvolution':
        axis, stride, ks, pad = conv_params(fn)
        return axis, stride, (ks - 1) / 2 - pad
    elif fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0
    elif fn.type_name == 'Crop':
        axis, offset = crop_params(fn)
        axis -= 1  # a crop axis counts the channel axis; maps start after it
        return axis, 1, - offset
    else:
        raise UndefinedMapException


def compose(base_map, next_map):
    """Apply ``next_map`` after ``base_map``: scales multiply and the
    further shift is scaled by the base scale."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is None:
        ax = ax2
    elif ax2 is None or ax1 == ax2:
        ax = ax1
    else:
        raise AxisMismatchException
    return ax, a1 * a2, a1 * b2 + b1


def inverse(coord_map):
    """The backward map of ``coord_map``."""
    ax, a, b = coord_map
    return ax, 1 / a, -b / a


def _mappable_bottoms(top):
    # Every bottom of a layer maps the same way, except that only the first
    # (cropped) bottom of a Crop maps: the second only gives the size.
    bottoms = top.fn.inputs
    if top.fn.type_name == 'Crop':
        bottoms = bottoms[:1]
    return bottoms


def coord_map_from_to(top_from, top_to):
    """The map from coordinates of ``top_from`` to those of ``top_to``.

    Walks back from both tops to a common ancestor blob, composing layer
    maps on the way, then inverts the ``top_from`` side.  Raises
    RuntimeError when no spatially connected common ancestor exists.
    """
    from_maps = {top_from: (None, 1, 0)}
    frontier = {top_from}
    while frontier:
        top = frontier.pop()
        try:
            for bottom in _mappable_bottoms(top):
                from_maps[bottom] = compose(from_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            pass

    to_maps = {top_to: (None, 1, 0)}
    frontier = {top_to}
    while frontier:
        top = frontier.pop()
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
        try:
            for bottom in _mappable_bottoms(top):
                to_maps[bottom] = compose(to_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            continue

    raise RuntimeError('Could not compute map between tops; are they '
                       'connected by spatial layers?')


def crop(top_from, top_to):
    """A Crop layer (a Top) cropping ``top_from`` to the size of ``top_to``
    with the offsets that align their coordinates.  Raises AssertionError
    when the scales differ or the offsets are negative or fractional."""
    ax, a, b = coord_map_from_to(top_from, top_to)
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    assert (a == 1).all(), 'scale mismatch on crop (a = {})'.format(a)
    assert (b <= 0).all(), 'cannot crop negative offset (b = {})'.format(b)
    assert (np.round(b) == b).all(), 'cannot crop noninteger offset ' \
        '(b = {})'.format(b)
    return L.Crop(top_from, top_to,
                  crop_param=dict(axis=ax + 1,  # + 1: the channel axis
                                  offset=[int(o) for o in -np.round(b)]))
