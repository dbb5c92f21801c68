"""Write nets in Python, compatible with pycaffe's ``caffe.net_spec``.

``layers`` (``L``) makes layers: ``L.Convolution(bottom, kernel_size=3,
num_output=64)`` returns a :class:`Top`, or a tuple of Tops with ``ntop=2``,
or the :class:`Function` itself with ``ntop=0``.  Keyword arguments go into
the layer's ``<type>_param`` message when it has such a field, onto the
``LayerParameter`` otherwise (``loss_weight``, ``param``, ``include``, ...);
``*_param`` keywords are assigned directly.  Lists become repeated fields,
dicts become messages.  ``params`` (``P``) gives enum values:
``P.Pooling.MAX``, ``P.Data.LMDB``.

Assign Tops to a :class:`NetSpec` to name them, then ``to_proto()`` gives a
``caffe_pb2.NetParameter``; unnamed blobs and layers are named
``<Type><count>`` as pycaffe does.  ``in_place=True`` makes a layer write
into its bottom.

One addition to pycaffe: Deconvolution and Im2col layers also take their
convolution keywords directly (pycaffe needs ``convolution_param=dict(...)``
for them).
"""

import operator
from collections import Counter, OrderedDict

from .proto import caffe_pb2

__all__ = ["param_name_dict", "to_proto", "assign_proto", "Top", "Function",
           "NetSpec", "Layers", "Parameters", "layers", "params"]


def param_name_dict():
    """Map layer type names to their parameter field names, derived from
    LayerParameter's ``*_param`` fields: {'Convolution': 'convolution',
    'InnerProduct': 'inner_product', ...}."""
    result = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if not field.name.endswith('_param') or field.message_type is None:
            continue
        type_name = field.message_type.name
        if type_name.endswith('Parameter'):
            type_name = type_name[:-len('Parameter')]
        result[type_name] = field.name[:-len('_param')]
    return result


def to_proto(*tops):
    """A NetParameter with every layer needed to compute ``tops``."""
    layers = OrderedDict()
    autonames = Counter()
    for top in tops:
        _check_top(top, "to_proto argument")
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


def _is_repeated(proto, name):
    field = proto.DESCRIPTOR.fields_by_name.get(name)
    if field is not None:
        if hasattr(field, 'is_repeated'):
            return bool(field.is_repeated)
        return field.label == field.LABEL_REPEATED
    return hasattr(getattr(proto, name), 'extend')


def assign_proto(proto, name, val):
    """Assign a Python value to field ``name`` of message ``proto``.

    Lists fill repeated fields (a list of dicts adds one message per dict),
    dicts fill sub-messages, anything else is set directly; a single value
    given for a repeated field is treated as a one-element list.
    """
    field = proto.DESCRIPTOR.fields_by_name.get(name)
    if field is None:       # protobuf's AttributeError said the name alone
        raise AttributeError(f"{proto.DESCRIPTOR.name} has no field {name!r}")
    is_repeated_field = _is_repeated(proto, name)
    if is_repeated_field and not isinstance(val, list):
        val = [val]
    if isinstance(val, list) and not is_repeated_field:
        raise AttributeError(f"{proto.DESCRIPTOR.name}.{name} is not a repeated field: give "
                             f"one value, not a list")
    if (isinstance(val, dict) or isinstance(val, list) and val and isinstance(val[0], dict)) \
            and field.message_type is None:
        raise AttributeError(f"{proto.DESCRIPTOR.name}.{name} is a plain value, not a "
                             f"message: give a value, not a dict")
    if isinstance(val, list):
        if val and isinstance(val[0], dict):
            for item in val:
                proto_item = getattr(proto, name).add()
                for k, v in item.items():
                    assign_proto(proto_item, k, v)
        else:
            getattr(proto, name).extend(val)
    elif isinstance(val, dict):
        for k, v in val.items():
            assign_proto(getattr(proto, name), k, v)
    else:
        setattr(proto, name, val)


class Top(object):
    """One output blob of a layer (``fn``), the ``n``-th of its tops."""

    def __init__(self, fn, n):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter with every layer needed to compute this top."""
        return to_proto(self)

    def _update(self, params):
        self.fn._update(params)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)


class Function(object):
    """A layer: its type, its inputs (Tops of other layers) and parameters."""

    def __init__(self, type_name, inputs, params):
        self.type_name = type_name
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                raise TypeError('%s input %d is not a Top (type is %s)' %
                                (type_name, index, type(inp)))
        self.inputs = inputs
        self.params = params
        # ntop and in_place shape the layer; they are not layer parameters
        ntop = self.params.pop('ntop', 1)
        try:
            self.ntop = operator.index(ntop)
        except TypeError:
            raise TypeError(f"{type_name}: ntop must be an integer (the number of tops), "
                            f"got {ntop!r}") from None
        self.in_place = self.params.pop('in_place', False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames):
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top, names, autonames):
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _update(self, params):
        self.params.update(params)

    def _to_proto(self, layers, names, autonames):
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)

        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)

        type_param = _param_names.get(self.type_name)
        type_param = getattr(layer, type_param + '_param') if type_param else None
        for k, v in self.params.items():
            # explicit *_param (or 'param' specs), and names the type's message
            # lacks, go onto the layer. pycaffe tried the type's message and on
            # any AttributeError the layer, which hid the real error
            # (kernel_size={...} said "kernel_size")
            target = layer
            if not k.endswith('param') and type_param is not None and \
                    k in type_param.DESCRIPTOR.fields_by_name:
                target = type_param
            where = f"layer {layer.name!r} ({self.type_name})"
            if target is layer and type_param is not None and \
                    k not in layer.DESCRIPTOR.fields_by_name:
                raise AttributeError(f"{where}: no parameter {k!r}: neither "
                                     f"{type_param.DESCRIPTOR.name} nor LayerParameter has "
                                     "such a field")
            try:
                assign_proto(target, k, v)
            except _ASSIGN_ERRORS as e:
                # the same Python type (pycaffe's), with the layer and field named
                kind = next(c for c in _ASSIGN_ERRORS if isinstance(e, c))
                raise kind(f"{where}: {k}={v!r}: {e}") from None

        layers[self] = layer


class NetSpec(object):
    """A set of named Tops; ``to_proto()`` gives the NetParameter computing
    all of them, with blobs (and the layers making them) named after the
    attributes they were assigned to."""

    def __init__(self):
        super(NetSpec, self).__setattr__('tops', OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        if name == 'tops':
            raise AttributeError(name)
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setitem__(self, key, value):
        self.__setattr__(key, value)

    def __getitem__(self, item):
        return self.tops[item]

    def __delitem__(self, name):
        del self.tops[name]

    def __contains__(self, name):
        return name in self.tops

    def keys(self):
        return list(self.tops.keys())

    def vals(self):
        return list(self.tops.values())

    def update(self, name, params):
        self.tops[name]._update(params)

    def to_proto(self):
        names = {v: k for k, v in self.tops.items()}
        autonames = Counter()
        layers = OrderedDict()
        for name, top in self.tops.items():
            _check_top(top, f"NetSpec.{name}")
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers(object):
    """Pseudo-module of layer constructors: ``Layers().Convolution(bottom,
    kernel_size=3)`` specifies a 3x3 convolution of ``bottom``."""

    def __getattr__(self, name):
        if name.startswith('__') and name.endswith('__'):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            elif fn.ntop == 1:
                return fn.tops[0]
            else:
                return fn.tops
        layer_fn.__name__ = name
        return layer_fn


class Parameters(object):
    """Pseudo-module of parameter constants: ``Parameters().Pooling.MAX`` is
    ``caffe_pb2.PoolingParameter.MAX``."""

    def __getattr__(self, name):
        if name.startswith('__') and name.endswith('__'):
            raise AttributeError(name)

        message = getattr(caffe_pb2, name + 'Parameter', None)
        if message is None:
            raise AttributeError(f"caffe.params.{name}: caffe_pb2 has no message "
                                 f"{name}Parameter")

        class Param:
            def __getattr__(self, param_name):
                try:
                    return getattr(message, param_name)
                except AttributeError:
                    values = ", ".join(v.name for e in message.DESCRIPTOR.enum_types
                                       for v in e.values)
                    raise AttributeError(f"caffe.params.{name}.{param_name}: "
                                         f"{name}Parameter has no value {param_name!r} "
                                         f"(its values: {values or 'none'})") from None
        return Param()


# what protobuf (and assign_proto) raise for a value a field cannot take
_ASSIGN_ERRORS = (AttributeError, TypeError, ValueError)


def _check_top(top, what):
    """Only layers' tops (or a layer without tops, ntop=0) make a net:
    anything else failed with an AttributeError naming _to_proto."""
    if not isinstance(top, (Top, Function)):
        raise AttributeError(f"{what} is a {type(top).__name__} object, not a layer's top "
                             f"(made by caffe.layers.<Type>(...))")


_param_names = param_name_dict()
# Layer types that share another type's parameter message (not derivable
# from the field names); only added where the derived map has no entry.
for _type, _field in (('Deconvolution', 'convolution'),
                      ('Im2col', 'convolution')):
    _param_names.setdefault(_type, _field)
del _type, _field

layers = Layers()
params = Parameters()
