"""caffe_ocl.draw: pycaffe's net drawing and the draw_net command."""

import builtins
import sys

import pytest

from caffe_ocl import draw
from caffe_ocl.commands import main as cli_main
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import caffe_pb2, parse_net_text

NET = '''name: "tiny"
layer { name: "data" type: "Data" top: "data" top: "label"
        include { phase: TRAIN } data_param { source: "x" batch_size: 32 } }
layer { name: "data" type: "Data" top: "data" top: "label"
        include { phase: TEST } data_param { source: "y" batch_size: 10 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 20 kernel_size: 5 stride: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "ip" type: "InnerProduct" bottom: "pool1" top: "ip"
        inner_product_param { num_output: 10 } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
        include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label"
        top: "loss" }
'''

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def net():
    return parse_net_text(NET, "tiny.prototxt")


@pytest.fixture
def no_pydot(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name in ("pydot", "pydotplus"):
            raise ImportError("No module named " + name)
        return real_import(name, *args, **kwargs)
    from caffe_ocl.commands import deps          # the command's own check, before any import
    real_available = deps.available
    monkeypatch.setattr(deps, "available",
                        lambda m: m not in ("pydot", "pydotplus") and real_available(m))
    monkeypatch.delitem(sys.modules, "pydot", raising=False)
    monkeypatch.delitem(sys.modules, "pydotplus", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)


# --------------------------------------------------------------------------
# labels and colours (no pydot needed)

def test_labels_and_colors(net):
    conv, pool = net.layer[2], net.layer[3]
    assert draw.get_pooling_types_dict() == {0: 'MAX', 1: 'AVE', 2: 'STOCHASTIC'}
    assert draw.get_layer_label(conv, 'LR') == \
        r'"conv1\n(Convolution)\nkernel size: 5\nstride: 1\npad: 0"'
    assert draw.get_layer_label(pool, 'TB') == \
        '"pool1 (Pooling MAX) kernel size: 2 stride: 2 pad: 0"'
    assert draw.get_layer_label(conv, 'BT', display_lrm=True) == \
        '"conv1 (Convolution) kernel size: 5 stride: 1 pad: 0 lr mult: 1.0, 2.0"'
    assert draw.get_layer_label(net.layer[4], 'LR') == r'"relu1\n(ReLU)"'
    assert draw.get_edge_label(net.layer[0]) == 'Batch 32'
    assert draw.get_edge_label(conv) == '20'
    assert draw.get_edge_label(net.layer[5]) == '10'
    assert draw.get_edge_label(pool) == '""'
    assert draw.get_layer_lr_mult(conv) == (1.0, 2.0)
    assert draw.get_layer_lr_mult(net.layer[5]) == (1.0, 1.0)
    with pytest.raises(ValueError):
        draw.get_layer_lr_mult(pool)
    assert draw.choose_color_by_layertype('Convolution') == '#FF5050'
    assert draw.choose_color_by_layertype('Deconvolution') == '#FF5050'
    assert draw.choose_color_by_layertype('Pooling') == '#FF9900'
    assert draw.choose_color_by_layertype('InnerProduct') == '#CC33FF'
    assert draw.choose_color_by_layertype('ReLU') == '#6495ED'


# --------------------------------------------------------------------------
# clear errors

def test_missing_pydot_is_a_clear_error(net, no_pydot):
    with pytest.raises(CaffeOclError, match=r"drawing nets needs pydot: pip install pydot"):
        draw.get_pydot_graph(net, 'LR')
    with pytest.raises(CaffeOclError, match="pip install pydot"):
        draw.draw_net(net, 'LR')


def test_missing_pydot_in_command(net, no_pydot, tmp_path, capsys):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    rc = cli_main(["draw_net", str(proto), str(tmp_path / "out.png")])
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert "'pydot'" in err and "pip install 'caffe_ocl[draw]'" in err and "\n" not in err


def test_missing_dot_is_a_clear_error(net, monkeypatch):
    pytest.importorskip("pydot")
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    with pytest.raises(CaffeOclError, match=r"graphviz.*apt-get install graphviz"):
        draw.draw_net(net, 'LR')
    # the Graphviz source needs no dot
    assert draw.draw_net(net, 'LR', ext='raw').startswith(b"digraph tiny {")
    assert draw.draw_net(net, 'LR', ext='dot').startswith(b"digraph tiny {")


def test_dot_output_is_graphvizs_laid_out_dot(net):
    """pycaffe's draw_net(ext='dot') is pydot's create(format='dot'): dot
    -Tdot, the graph with Graphviz's layout (pos=...); 'raw' is the source."""
    pytest.importorskip("pydot")
    if draw.shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    out = draw.draw_net(net, 'LR', ext='dot')
    assert out.startswith(b"digraph tiny {") and b"pos=" in out
    assert b"pos=" not in draw.draw_net(net, 'LR', ext='raw')


def test_command_errors_are_one_line(tmp_path, capsys):
    rc = cli_main(["draw_net", str(tmp_path / "missing.prototxt"), str(tmp_path / "o.png")])
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert "missing.prototxt" in err and "\n" not in err

    bad = tmp_path / "bad.prototxt"
    bad.write_text("layer { name: \n")
    assert cli_main(["draw_net", str(bad), str(tmp_path / "o.png")]) == 1
    err = capsys.readouterr().err.strip()
    assert "bad.prototxt" in err and "\n" not in err

    good = tmp_path / "good.prototxt"
    good.write_text(NET)
    assert cli_main(["draw_net", str(good), str(tmp_path / "o.png"), "--phase", "VAL"]) == 1
    err = capsys.readouterr().err.strip()
    assert "Unknown phase: VAL" in err and "\n" not in err


# --------------------------------------------------------------------------
# drawing (needs pydot + Graphviz)

@pytest.fixture
def pydot_and_dot():
    pytest.importorskip("pydot")
    import shutil
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' not installed")


def test_graph_structure_and_phase_filter(net, pydot_and_dot):
    g_all = draw.get_pydot_graph(net, 'LR')
    g_train = draw.get_pydot_graph(net, 'LR', phase=caffe_pb2.TRAIN)
    g_test = draw.get_pydot_graph(net, 'LR', phase=caffe_pb2.TEST)
    n_all = len(g_all.get_nodes())
    assert len(g_train.get_nodes()) == n_all - 2          # no acc layer/blob
    assert len(g_test.get_nodes()) == n_all
    src = g_all.to_string()
    assert 'rankdir=LR' in src
    assert '#90EE90' in src            # in-place relu drawn as neuron layer
    assert 'label=20' in src or 'label="20"' in src
    unlabeled = draw.get_pydot_graph(net, 'LR', label_edges=False).to_string()
    assert 'label=20' not in unlabeled and 'label="20"' not in unlabeled
    bad = caffe_pb2.NetParameter()
    layer = bad.layer.add(name="x", type="ReLU")
    layer.include.add(phase=caffe_pb2.TRAIN)
    layer.exclude.add(phase=caffe_pb2.TEST)
    with pytest.raises(ValueError, match="both include and exclude"):
        draw.get_pydot_graph(bad, 'LR', phase=caffe_pb2.TRAIN)


def test_draw_net_png(net, pydot_and_dot):
    png = draw.draw_net(net, 'TB', ext='png', phase=caffe_pb2.TEST,
                        display_lrm=True)
    assert png.startswith(PNG_MAGIC) and len(png) > 1000
    with pytest.raises(CaffeOclError, match="could not draw the net as 'nosuchfmt'"):
        draw.draw_net(net, 'LR', ext='nosuchfmt')


def test_draw_net_to_file_and_command(net, pydot_and_dot, tmp_path, capsys):
    out = tmp_path / "net.png"
    draw.draw_net_to_file(net, str(out))
    assert out.read_bytes().startswith(PNG_MAGIC)
    svg = tmp_path / "net.svg"
    draw.draw_net_to_file(net, str(svg), 'BT', caffe_pb2.TRAIN, True)
    assert b"<svg" in svg.read_bytes()

    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    out2 = tmp_path / "cli.png"
    rc = cli_main(["draw_net", str(proto), str(out2), "--rankdir", "TB", "--phase",
                    "TRAIN", "--display_lrm"])
    assert rc == 0
    assert out2.read_bytes().startswith(PNG_MAGIC)
    assert "Drawing net to" in capsys.readouterr().out
    # an unnamed net draws too
    anon = caffe_pb2.NetParameter()
    anon.CopyFrom(net)
    anon.ClearField("name")
    assert draw.draw_net(anon, 'LR').startswith(PNG_MAGIC)


# --------------------------------------------------------------------------
# names are escaped for Graphviz (a quote in a name was a syntax error, or
# wrote DOT of the name's choosing into the graph)

HOSTILE = r'''name: "n\"{"
layer { name: "a\"]; evil [label=\"pwned" type: "Input" top: "x\"y"
        input_param { shape { dim: 1 dim: 2 } } }
layer { name: "b\\" type: "Input" top: "graph" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "c\nd\000e" type: "In\"nerProduct" bottom: "x\"y" bottom: "graph"
        top: "o:1\\" }
'''


def test_labels_escape_quotes_backslashes_and_newlines():
    net = parse_net_text(HOSTILE, "hostile.prototxt")
    assert draw.get_layer_label(net.layer[0], 'LR') == \
        r'"a\"]; evil [label=\"pwned\n(Input)"'
    assert draw.get_layer_label(net.layer[1], 'TB') == r'"b\\ (Input)"'
    assert draw.get_layer_label(net.layer[2], 'TB') == r'"c\nd\\0e (In\"nerProduct)"'


def test_hostile_names_stay_inside_their_strings(pydot_and_dot, tmp_path, capsys):
    net = parse_net_text(HOSTILE, "hostile.prototxt")
    src = draw.draw_net(net, 'LR', ext='raw').decode()
    assert src.startswith('digraph "n\\"{" {')
    assert 'evil [label="pwned' not in src
    lines = src.splitlines()
    assert r'"a\"]; evil [label=\"pwned\n(Input)" [' in src
    assert r'"x\"y" [' in src and '"graph" [' in src and r'"o:1\\";' in src
    assert sum(' -> ' in line for line in lines) == 5
    # Graphviz reads it: each name is one node, labelled with the name
    svg = draw.draw_net(net, 'LR', ext='svg').decode()
    import re
    titles = re.findall(r'<g id="node\d+" class="node">\s*<title>([^<]*)</title>', svg)
    assert sorted(titles) == sorted([
        r'a&quot;]; evil [label=&quot;pwned\n(Input)', 'x&quot;y', r'b\\\n(Input)', 'graph',
        r'c\nd\\0e\n(In&quot;nerProduct)', r'o:1\\'])
    assert 'pwned</text>' in svg and '>evil<' not in svg
    # the command: no Graphviz error
    proto = tmp_path / "hostile.prototxt"
    proto.write_text(HOSTILE)
    assert cli_main(["draw_net", str(proto), str(tmp_path / "h.png")]) == 0
    assert (tmp_path / "h.png").read_bytes().startswith(PNG_MAGIC)


def test_graphviz_error_names_the_drawing(net, pydot_and_dot, tmp_path):
    with pytest.raises(CaffeOclError, match=r"x\.nosuchfmt: Graphviz could not draw"):
        draw.draw_net_to_file(net, str(tmp_path / "x.nosuchfmt"))
    assert not (tmp_path / "x.nosuchfmt").exists()
