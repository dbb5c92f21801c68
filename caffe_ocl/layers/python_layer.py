"""Python layers: ``type: "Python"`` with ``python_param { module layer
param_str share_in_parallel }``, as pycaffe's PythonLayer.

A user layer is a class that subclasses ``caffe_ocl.Layer`` (pycaffe's
``caffe.Layer``; here :class:`PythonLayerBase`) and defines::

    setup(self, bottom, top)                  # once; read self.param_str
    reshape(self, bottom, top)                # before every forward, as Caffe
    forward(self, bottom, top)
    backward(self, top, propagate_down, bottom)

``bottom``/``top`` are lists of :class:`~caffe_ocl.blob.Blob`; ``.data`` and
``.diff`` are host NumPy arrays and ``top[i].reshape(*shape)`` shapes a top.
``self.param_str``, ``self.phase`` (0 TRAIN, 1 TEST) and ``self.blobs`` (a
list of learnable Blobs; ``self.blobs.add_blob(2, 3)`` appends one) are set
before ``setup`` runs, so parameters added in ``setup`` are seen by the net
and the solver. Parameter gradients should accumulate (``diff +=``), bottom
gradients overwrite, as in Caffe.

The module named by ``python_param.module`` is imported from ``sys.path``
(``PYTHONPATH``) only when a net containing the layer is built: loading a
model never runs code unless its prototxt names a Python layer.

The net holds a :class:`PythonLayer` wrapper (registered as "Python"); it
drives the user object and hands it host arrays. ``net.layers[i]`` is the
wrapper; attribute reads and writes it does not own itself go to the user
object (``net.layers[i].my_attr``), and ``net.layers[i].py_layer`` is the user
object itself. ``net.layers[i].blobs`` is the user object's ``blobs``.

Host/device traffic: reading ``bottom[i].data`` downloads it when the device
holds the newer copy; writing ``top[i].data`` marks the host copy newest, and
the next layer that runs on the device uploads it (``Blob`` keeps the sync
state). A Python layer therefore costs a round trip per iteration, as it does
in Caffe on a GPU.
"""
import importlib

from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register
from .fork_vision import SPATIAL_DROPOUT, SpatialDropoutLayer
from .proposal import PYTHON_FALLBACK, ProposalLayer

# Python layers of published forks run by a built-in when their module is not
# importable: (module, class) -> (built-in layer, whether it has a backward)
BUILTIN_FALLBACKS = {PYTHON_FALLBACK: (ProposalLayer, False),
                     SPATIAL_DROPOUT: (SpatialDropoutLayer, True)}


class BlobVec(list):
    """pycaffe's ``layer.blobs``: a list of Blobs with ``add_blob``."""

    def __init__(self, owner_name="", device=None):
        super().__init__()
        self._owner_name = owner_name
        self._device = device

    def add_blob(self, *shape):
        """Append a new zero-filled Blob; ``add_blob(2, 3)`` or
        ``add_blob((2, 3))``. Returns the Blob."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        b = Blob(tuple(int(s) for s in shape),
                 name=f"{self._owner_name}.blobs[{len(self)}]", device=self._device)
        b.data[...] = 0
        self.append(b)
        return b


class _LayerMeta(type):
    """``isinstance(layer, caffe.Layer)`` holds for every layer of a net, as in
    pycaffe, not only for user Python layers."""

    def __instancecheck__(cls, obj):
        if cls is PythonLayerBase and isinstance(obj, Layer):
            return True
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub):
        if cls is PythonLayerBase and isinstance(sub, type) and issubclass(sub, Layer):
            return True
        return super().__subclasscheck__(sub)


class PythonLayerBase(metaclass=_LayerMeta):
    """Base class of user Python layers (exported as ``caffe_ocl.Layer``).

    Constructed by the net as ``cls(layer_param)``; a subclass that defines
    ``__init__`` must call ``super().__init__(param)``. Override ``setup``,
    ``reshape``, ``forward`` and ``backward``."""

    def __init__(self, param=None):
        self.layer_param = param if param is not None else caffe_pb2.LayerParameter()
        pp = self.layer_param.python_param
        self.param_str = pp.param_str
        self.phase = caffe_pb2.TEST
        self.blobs = BlobVec(self.layer_param.name)

    @property
    def type(self):
        return "Python"

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def backward(self, top, propagate_down, bottom):
        raise NotImplementedError(f"{type(self).__name__} defines no backward()")


def _note(exc, text):
    if hasattr(exc, "add_note"):
        exc.add_note(text)


@register("Python")
class PythonLayer(Layer):
    """Wrapper that runs a user layer (see the module docstring)."""

    _OWN = frozenset(("py_layer", "module_name", "class_name", "share_in_parallel",
                      "builtin"))
    untrusted_refusal = "imports and runs Python code named by the model"

    def __init__(self, param, phase=None):
        object.__setattr__(self, "py_layer", None)
        # py-faster-rcnn's rpn.proposal_layer.ProposalLayer when that module is
        # not importable: the built-in Proposal layer (layers/proposal.py)
        object.__setattr__(self, "builtin", None)
        super().__init__(param, phase)

    # attribute delegation to the user object ---------------------------------
    def __getattr__(self, name):
        py = self.__dict__.get("py_layer")
        if py is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!s} object has no attribute {name!r}")
        return getattr(py, name)

    def __setattr__(self, name, value):
        py = self.__dict__.get("py_layer")
        if (py is None or name in self.__dict__ or name.startswith("_")
                or name in self._OWN or hasattr(type(self), name)):
            object.__setattr__(self, name, value)
        else:
            setattr(py, name, value)

    # lifecycle -----------------------------------------------------------------
    def _load_class(self):
        pp = self.param.python_param
        if not self.param.HasField("python_param") or not pp.module or not pp.layer:
            raise self.error("python_param { module: ... layer: ... } is required")
        self.module_name, self.class_name = pp.module, pp.layer
        where = (f"cannot import module {pp.module!r} named by python_param.module "
                 "(it must be importable from sys.path / PYTHONPATH)")
        try:
            mod = importlib.import_module(pp.module)
        except ImportError as e:
            if (pp.module, pp.layer) in BUILTIN_FALLBACKS:
                return None
            raise self.error(f"{where}: {e}") from e
        except Exception as e:   # an error in the module's own top-level code
            raise self.error(f"{where}: importing it raised "
                             f"{type(e).__name__}: {e}") from e
        cls = getattr(mod, pp.layer, None)
        if cls is None:
            raise self.error(f"module {pp.module!r} ({getattr(mod, '__file__', '?')}) "
                             f"has no class {pp.layer!r} (python_param.layer)")
        if not (isinstance(cls, type) and issubclass(cls, PythonLayerBase)
                and cls is not PythonLayerBase and not issubclass(cls, Layer)):
            raise self.error(f"{pp.module}.{pp.layer} must be a class that subclasses "
                             "caffe_ocl.Layer (pycaffe's caffe.Layer)")
        return cls

    def layer_setup(self, bottom, top):
        cls = self._load_class()
        if cls is None:     # a built-in stands in (rpn.proposal_layer, spatial_dropout)
            self.share_in_parallel = self.param.python_param.share_in_parallel
            pp = self.param.python_param
            self.builtin = BUILTIN_FALLBACKS[(pp.module, pp.layer)][0](self.param, self.phase)
            self.builtin.setup(bottom, top)
            return
        where = f"Python layer {self.name!r} ({self.module_name}.{self.class_name})"
        try:
            py = cls(self.param)
        except Exception as e:
            _note(e, f"while constructing {where}")
            raise
        if not isinstance(py.__dict__.get("blobs"), BlobVec):
            raise self.error(f"{self.module_name}.{self.class_name}.__init__ must call "
                             "super().__init__(param)")
        py.blobs._device = self.device
        py.param_str = self.param.python_param.param_str
        py.phase = self.phase
        self.share_in_parallel = self.param.python_param.share_in_parallel
        self.py_layer = py
        self.blobs = py.blobs
        try:
            py.setup(bottom, top)
        except Exception as e:
            _note(e, f"in setup() of {where}")
            raise
        self.blobs = py.blobs        # setup may have replaced the list

    def _call(self, what, *args):
        try:
            return getattr(self.py_layer, what)(*args)
        except Exception as e:
            _note(e, f"in {what}() of Python layer {self.name!r} "
                     f"({self.module_name}.{self.class_name})")
            raise

    def reshape(self, bottom, top):
        if self.builtin is not None:
            return self.builtin.reshape(bottom, top)
        self._call("reshape", bottom, top)

    def forward(self, bottom, top):
        if self.builtin is not None:
            return self.builtin.forward(bottom, top)
        # Caffe's Layer::Forward reshapes before every forward.
        before = [t.shape for t in top]
        self._call("reshape", bottom, top)
        if [t.shape for t in top] != before:
            self._fill_loss_diffs(top)
        self._call("forward", bottom, top)

    def backward(self, top, propagate_down, bottom):
        self.propagate_down = list(propagate_down)
        if self.builtin is not None:     # py-faster-rcnn's proposals: no gradient
            pp = self.param.python_param
            if BUILTIN_FALLBACKS[(pp.module, pp.layer)][1]:
                self.builtin.backward(top, propagate_down, bottom)
            return
        self._call("backward", top, list(propagate_down), bottom)
