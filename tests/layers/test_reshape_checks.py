"""The per-layer shape check of a forward (Layer.reshape_if_needed) is
skipped while no blob's shape or memory has changed since it last ran
(blob.LAYOUT): the shortcut must never miss a change -- an input reshaped
between forwards, an intermediate blob reshaped by the user, a layer whose
forward reshapes its own top -- and must let the steady state skip it."""
import numpy as np

import caffe_ocl as caffe
from caffe_ocl.blob import LAYOUT
from caffe_ocl.layers import base

NET = """
name: "chk"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "r" }
layer { name: "pool" type: "Pooling" bottom: "r" top: "pool"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "out"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
"""


def _ref(net, x):
    w, b = (p.data.astype(np.float64) for p in net.params["conv"])
    n, c, h, ww = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((n, w.shape[0], h, ww))
    for i in range(h):
        for j in range(ww):
            y[:, :, i, j] = np.einsum("ncij,ocij->no", xp[:, :, i:i + 3, j:j + 3], w) + b
    pooled = np.maximum(y, 0).mean(axis=(2, 3))
    wi, bi = (p.data.astype(np.float64) for p in net.params["ip"])
    return pooled @ wi.T + bi


def test_steady_state_skips_the_checks_and_changes_are_seen(tmp_path, rng, monkeypatch):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TEST)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    net.blobs["data"].data[...] = x
    np.testing.assert_allclose(net.forward()["out"], _ref(net, x), rtol=1e-4, atol=1e-5)
    epoch = LAYOUT.epoch
    net.forward()
    assert LAYOUT.epoch == epoch               # a forward at the same shapes changes nothing
    shortcut = []
    orig = base.Layer.reshape_if_needed

    def spy(self, bottom, top):
        shortcut.append(self._checked is not None and self._checked[1] == LAYOUT.epoch)
        return orig(self, bottom, top)
    monkeypatch.setattr(base.Layer, "reshape_if_needed", spy)
    net.forward()
    assert shortcut and all(shortcut)          # every check took the shortcut

    # the input reshaped between forwards: every layer follows
    x3 = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
    net.blobs["data"].reshape(*x3.shape)
    net.blobs["data"].data[...] = x3
    out = net.forward()["out"]
    assert out.shape == (3, 3) and net.blobs["conv"].shape == (3, 4, 4, 6)
    np.testing.assert_allclose(out, _ref(net, x3), rtol=1e-4, atol=1e-5)

    # back to the first shape (a shape seen before is a change too)
    net.blobs["data"].reshape(*x.shape)
    net.blobs["data"].data[...] = x
    np.testing.assert_allclose(net.forward()["out"], _ref(net, x), rtol=1e-4, atol=1e-5)


class GrowingTop(caffe.Layer):
    """Keeps the first ``k`` rows of its bottom, ``k`` growing by one each
    forward: its top changes shape inside the forward (as data-dependent
    layers do), after the shape checks of the layers after it."""

    def setup(self, bottom, top):
        self.k = 0

    def reshape(self, bottom, top):
        top[0].reshape(max(self.k, 1), *bottom[0].shape[1:])

    def forward(self, bottom, top):
        self.k = min(self.k + 1, bottom[0].shape[0])
        top[0].reshape(self.k, *bottom[0].shape[1:])
        top[0].data[...] = bottom[0].data[:self.k]


GROW = """
name: "grow"
input: "data" input_shape { dim: 3 dim: 4 }
layer { name: "g" type: "TestGrowingTop" bottom: "data" top: "g" }
layer { name: "ip" type: "InnerProduct" bottom: "g" top: "out"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
"""


def test_a_top_reshaped_inside_a_forward_reaches_the_next_layer(tmp_path, rng):
    caffe.register_layer("TestGrowingTop", GrowingTop)
    try:
        path = tmp_path / "grow.prototxt"
        path.write_text(GROW)
        net = caffe.Net(str(path), caffe.TEST)
        x = rng.standard_normal((3, 4)).astype(np.float32)
        w, b = (p.data.astype(np.float64) for p in net.params["ip"])
        for k in (1, 2, 3, 3):
            out = net.forward(data=x)["out"]
            assert out.shape == (k, 2)
            np.testing.assert_allclose(out, x[:k].astype(np.float64) @ w.T + b,
                                       rtol=1e-5, atol=1e-6)
    finally:
        caffe.unregister_layer("TestGrowingTop")
