"""Custom layer types: ``caffe_ocl.register_layer("TypeName", cls)``, as
OpenCV's ``dnn_registerLayer``, for layer types that caffe_ocl does not
implement (a fork's, or your own), named directly in the prototxt.

``cls`` is written like a pycaffe Python layer: a subclass of
``caffe_ocl.Layer`` with ``setup``, ``reshape``, ``forward`` and
``backward`` over bottom/top Blobs (host NumPy ``.data``/``.diff``; see
caffe_ocl/layers/python_layer.py). Before ``setup`` runs it has
``self.param_str`` (the text inside the layer's ``*_param { ... }`` block
that caffe.proto does not declare, or ``python_param.param_str`` when given)
and ``self.layer_param`` (the layer's LayerParameter), ``self.phase`` and
``self.blobs``. A layer of a registered type runs on the host, as a Python
layer does in Caffe. Built-in types cannot be replaced.
"""
from ..proto import forks
from .base import is_registered, register
from .python_layer import PythonLayer, PythonLayerBase

_custom = {}     # type name -> wrapper class


class CustomLayer(PythonLayer):
    """The net's wrapper of a registered custom type (see the module doc)."""

    user_class = None

    def _load_class(self):
        self.module_name = getattr(self.user_class, "__module__", "?")
        self.class_name = self.user_class.__name__
        return self.user_class


def register_layer(type_name, cls):
    """Make layer type ``type_name`` run ``cls`` (a caffe_ocl.Layer subclass).
    Registering the same type again replaces its class for nets built later."""
    if not isinstance(type_name, str) or not type_name:
        raise TypeError("register_layer: the type name must be a non-empty string")
    if not (isinstance(cls, type) and issubclass(cls, PythonLayerBase)
            and cls is not PythonLayerBase):
        raise TypeError(f"register_layer({type_name!r}, ...): the class must subclass "
                        "caffe_ocl.Layer (pycaffe's caffe.Layer) and define setup/reshape/"
                        "forward/backward")
    wrapper = _custom.get(type_name)
    if wrapper is None:
        if is_registered(type_name):
            raise ValueError(f"register_layer: {type_name!r} is a built-in layer type of "
                             "caffe_ocl and cannot be replaced")
        wrapper = type(f"Custom{type_name}Layer", (CustomLayer,), {"type": type_name})
        register(type_name)(wrapper)
        _custom[type_name] = wrapper
    forks.add_custom_type(type_name)
    wrapper.user_class = cls
    return cls


def unregister_layer(type_name):
    """Forget a registration's class (the type then fails as unknown)."""
    wrapper = _custom.get(type_name)
    if wrapper is not None:
        wrapper.user_class = None
        forks.remove_custom_type(type_name)
