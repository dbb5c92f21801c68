"""Draw a net (a ``caffe_pb2.NetParameter``) with Graphviz, as pycaffe's
``caffe.draw`` (the ``draw_net`` command is caffe_ocl/commands/draw_net.py).

Needs the optional ``pydot`` package (``pip install pydot``; ``pydotplus``
works too) to build the graph and Graphviz's ``dot`` program to render it;
both are looked up only when needed, so importing this module always works.
Rendering runs ``dot -T<ext>`` directly so that Graphviz's own complaint
(e.g. an unknown format) ends up in the error message.
"""

import re
import shutil
import subprocess

from .errors import CaffeOclError, naming
from .proto import caffe_pb2

__all__ = ["LAYER_STYLE_DEFAULT", "NEURON_LAYER_STYLE", "BLOB_STYLE",
           "get_pooling_types_dict", "get_edge_label", "get_layer_lr_mult",
           "get_layer_label", "choose_color_by_layertype", "get_pydot_graph",
           "draw_net", "draw_net_to_file"]

LAYER_STYLE_DEFAULT = {'shape': 'record',
                       'fillcolor': '#6495ED',
                       'style': 'filled'}
NEURON_LAYER_STYLE = {'shape': 'record',
                      'fillcolor': '#90EE90',
                      'style': 'filled'}
BLOB_STYLE = {'shape': 'octagon',
              'fillcolor': '#E0E0E0',
              'style': 'filled'}

_PYDOT_MISSING = "drawing nets needs pydot: pip install pydot"
_DOT_MISSING = ("drawing nets needs Graphviz's 'dot' program, which was not "
                "found on PATH: install graphviz (apt-get install graphviz)")


# A DOT ID that needs no quotes (and that pydot, of every version, leaves
# unquoted): letters, digits and '_' not starting with a digit, or a numeral.
_DOT_PLAIN_ID = re.compile(r'^[_a-zA-Z][_a-zA-Z0-9]*$|^([0-9]+\.?[0-9]*|[0-9]*\.[0-9]+)$')
_DOT_KEYWORDS = ('graph', 'digraph', 'subgraph', 'node', 'edge', 'strict')


def _dot_escape(text):
    """``text`` for the inside of a double-quoted DOT string: a backslash
    or quote of a layer or blob name is shown as itself, never ends the
    string (a layer named ``a"]; evil [label="x`` wrote its own node into
    the graph) nor starts a Graphviz escape; a line break is one (``\\n``,
    ``\\r``, as pydot writes them), and a NUL, which Graphviz cannot read,
    is shown as ``\\0``."""
    return (text.replace('\\', '\\\\').replace('"', '\\"')
            .replace('\r', '\\r').replace('\n', '\\n').replace('\0', '\\\\0'))


def _dot_id(name):
    """``name`` as a DOT ID: as it is when that is a plain ID (the output
    of pycaffe's draw for ordinary names), else quoted and escaped. pydot
    leaves a quoted string alone, and does not split it at ':' into a node
    and a port."""
    if _DOT_PLAIN_ID.match(name) and name.lower() not in _DOT_KEYWORDS:
        return name
    return '"%s"' % _dot_escape(name)


def _pydot():
    try:
        import pydot
        return pydot
    except ImportError:
        pass
    try:
        import pydotplus
        return pydotplus
    except ImportError:
        raise CaffeOclError(_PYDOT_MISSING) from None


def get_pooling_types_dict():
    """{pool method number: name}, e.g. {0: 'MAX', 1: 'AVE', 2: 'STOCHASTIC'}."""
    desc = caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR
    return {v.number: k for k, v in desc.values_by_name.items()}


def get_edge_label(layer):
    """Label of the edges out of ``layer``: batch size of a Data layer,
    num_output of Convolution/Deconvolution/InnerProduct, empty otherwise."""
    if layer.type == 'Data':
        edge_label = 'Batch ' + str(layer.data_param.batch_size)
    elif layer.type == 'Convolution' or layer.type == 'Deconvolution':
        edge_label = str(layer.convolution_param.num_output)
    elif layer.type == 'InnerProduct':
        edge_label = str(layer.inner_product_param.num_output)
    else:
        edge_label = '""'
    return edge_label


def get_layer_lr_mult(layer):
    """(weight lr_mult, bias lr_mult) of a Convolution, Deconvolution or
    InnerProduct layer; 1.0 where not given."""
    if layer.type not in ['Convolution', 'Deconvolution', 'InnerProduct']:
        raise ValueError("%s layers do not have a "
                         "learning rate multiplier" % layer.type)
    params = layer.param
    if len(params) == 0:
        return (1.0, 1.0)
    if len(params) == 1:
        return (params[0].lr_mult, 1.0)
    if len(params) == 2:
        return (params[0].lr_mult, params[1].lr_mult)
    raise ValueError("Could not parse the learning rate multiplier")


def get_layer_label(layer, rankdir, display_lrm=False):
    """Node label of ``layer``: name, (type), and for spatial layers kernel
    size/stride/pad, optionally the lr multipliers; quoted for Graphviz.
    Parts are separated by spaces for vertical layouts (TB, BT) and by
    newlines otherwise."""
    if rankdir in ('TB', 'BT'):
        separator = ' '
    else:
        separator = r'\n'

    descriptors_list = [_dot_escape(layer.name)]
    if layer.type == 'Pooling':
        pooling_types_dict = get_pooling_types_dict()
        layer_type = '(%s %s)' % (layer.type,
                                  pooling_types_dict[layer.pooling_param.pool])
    else:
        layer_type = '(%s)' % _dot_escape(layer.type)
    descriptors_list.append(layer_type)

    if layer.type in ['Convolution', 'Deconvolution', 'Pooling']:
        if layer.type == 'Pooling':
            kernel_size = layer.pooling_param.kernel_size
            stride = layer.pooling_param.stride
            padding = layer.pooling_param.pad
        else:
            cp = layer.convolution_param
            kernel_size = cp.kernel_size[0] if len(cp.kernel_size) else 1
            stride = cp.stride[0] if len(cp.stride) else 1
            padding = cp.pad[0] if len(cp.pad) else 0
        descriptors_list.append(separator.join([
            "kernel size: %d" % kernel_size,
            "stride: %d" % stride,
            "pad: %d" % padding,
        ]))

    if display_lrm and layer.type in ['Convolution', 'Deconvolution',
                                      'InnerProduct']:
        lrm0, lrm1 = get_layer_lr_mult(layer)
        if any([lrm0, lrm1]):
            descriptors_list.append("lr mult: %.1f, %.1f" % (lrm0, lrm1))

    # the outer quotes keep Graphviz from reading ':' as a port separator;
    # the name and type inside are escaped (_dot_escape)
    return '"%s"' % separator.join(descriptors_list)


def choose_color_by_layertype(layertype):
    """Fill colour of a layer node."""
    color = '#6495ED'
    if layertype == 'Convolution' or layertype == 'Deconvolution':
        color = '#FF5050'
    elif layertype == 'Pooling':
        color = '#FF9900'
    elif layertype == 'InnerProduct':
        color = '#CC33FF'
    return color


def _included(layer, phase):
    """Caffe's include/exclude rule, by phase only (as pycaffe's draw)."""
    if len(layer.include) > 0 and len(layer.exclude) > 0:
        raise ValueError('layer ' + layer.name + ' has both include '
                         'and exclude specified.')
    included = len(layer.include) == 0
    for rule in layer.include:
        included = included or rule.phase == phase
    for rule in layer.exclude:
        included = included and not rule.phase == phase
    return included


def get_pydot_graph(caffe_net, rankdir, label_edges=True, phase=None,
                    display_lrm=False):
    """A pydot graph of ``caffe_net``: a node per layer and per blob.

    ``phase`` (caffe_pb2.TRAIN / TEST) keeps only that phase's layers; None
    draws all of them.  In-place layers are drawn green.
    """
    pydot = _pydot()
    pydot_graph = pydot.Dot(_dot_id(caffe_net.name) if caffe_net.name else 'Net',
                            graph_type='digraph',
                            rankdir=rankdir)
    pydot_nodes = {}
    pydot_edges = []
    for layer in caffe_net.layer:
        if phase is not None and not _included(layer, phase):
            continue
        node_label = get_layer_label(layer, rankdir, display_lrm=display_lrm)
        node_name = "%s_%s" % (layer.name, layer.type)
        if (len(layer.bottom) == 1 and len(layer.top) == 1 and
                layer.bottom[0] == layer.top[0]):
            pydot_nodes[node_name] = pydot.Node(node_label,
                                                **NEURON_LAYER_STYLE)
        else:
            layer_style = dict(LAYER_STYLE_DEFAULT)
            layer_style['fillcolor'] = choose_color_by_layertype(layer.type)
            pydot_nodes[node_name] = pydot.Node(node_label, **layer_style)
        for bottom_blob in layer.bottom:
            pydot_nodes[bottom_blob + '_blob'] = pydot.Node(
                _dot_id(bottom_blob), **BLOB_STYLE)
            pydot_edges.append({'src': bottom_blob + '_blob',
                                'dst': node_name,
                                'label': '""'})
        for top_blob in layer.top:
            pydot_nodes[top_blob + '_blob'] = pydot.Node(_dot_id(top_blob))
            edge_label = get_edge_label(layer) if label_edges else '""'
            pydot_edges.append({'src': node_name,
                                'dst': top_blob + '_blob',
                                'label': edge_label})
    for node in pydot_nodes.values():
        pydot_graph.add_node(node)
    for edge in pydot_edges:
        pydot_graph.add_edge(
            pydot.Edge(pydot_nodes[edge['src']],
                       pydot_nodes[edge['dst']],
                       label=edge['label']))
    return pydot_graph


def _render(graph, ext):
    """Run Graphviz's dot on the graph's source; bytes in format ``ext``."""
    source = graph.to_string().encode('utf-8')
    if ext == 'raw':
        # the Graphviz source itself, no rendering needed
        return source
    dot = shutil.which('dot')
    if dot is None:
        if ext in ('dot', 'gv'):
            # pycaffe gives Graphviz's laid-out dot (positions added); without
            # Graphviz the source is still a valid .dot file
            return source
        raise CaffeOclError(_DOT_MISSING)
    try:
        proc = subprocess.run([dot, '-T' + ext], input=source,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise CaffeOclError("%s (%s)" % (_DOT_MISSING, e)) from None
    if proc.returncode != 0:
        msg = ' '.join(proc.stderr.decode('utf-8', 'replace').split())
        raise CaffeOclError("Graphviz could not draw the net as '%s': %s"
                            % (ext, msg[:300] or 'dot exited with status %d'
                               % proc.returncode))
    return proc.stdout


def draw_net(caffe_net, rankdir, ext='png', phase=None, display_lrm=False):
    """The drawing of ``caffe_net`` as bytes in format ``ext`` (any Graphviz
    output format: png, svg, pdf, dot (laid out, as pycaffe), ...; 'raw'
    gives the Graphviz source, as 'dot' does when Graphviz is missing)."""
    return _render(get_pydot_graph(caffe_net, rankdir, phase=phase,
                                   display_lrm=display_lrm), ext)


def draw_net_to_file(caffe_net, filename, rankdir='LR', phase=None,
                     display_lrm=False):
    """Draw ``caffe_net`` into ``filename``, in the format its extension
    names ('.raw' writes the Graphviz source)."""
    ext = filename[filename.rfind('.') + 1:]
    with naming(filename):          # a Graphviz error names the drawing
        data = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    with open(filename, 'wb') as fid:
        fid.write(data)
