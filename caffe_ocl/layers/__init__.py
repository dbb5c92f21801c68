"""Layer types, one class per Caffe type, registered by type name.

Families: input (Input, DummyData), vision (Convolution, Deconvolution,
Pooling, LRN), neuron (ReLU, Sigmoid, TanH, Dropout, ...), common
(InnerProduct, Softmax, ...), eltwise, reduction, embed, ... Every module of
this package but ``base`` and ``fillers`` is a family: importing the package
(which any import of one of its modules does first) imports each family
once, so the registry is complete before a net is built.
"""
import importlib
import pkgutil

from .base import Layer, register, layer_type_list, create_layer  # noqa: F401

NOT_FAMILIES = ("base", "fillers")

for _family in pkgutil.iter_modules(__path__):
    if _family.name not in NOT_FAMILIES:
        importlib.import_module(f"{__name__}.{_family.name}")
