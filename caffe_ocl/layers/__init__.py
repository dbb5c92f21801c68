"""Layer types, one class per Caffe type, registered by type name.

Families: input (Input, DummyData), vision (Convolution, Deconvolution,
Pooling, LRN), neuron (ReLU, Sigmoid, TanH, Dropout, ...), common
(InnerProduct, Softmax, ...). ``_load_all`` imports every family so the
registry is complete before a net is built.
"""
from .base import Layer, register, layer_type_list, create_layer  # noqa: F401


def _import_families():
    import importlib
    import pkgutil
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in ("base", "fillers", "_load_all"):
            importlib.import_module(f"{__name__}.{mod.name}")
