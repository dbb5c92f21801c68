"""pycaffe code as BVLC's examples/ notebooks write it (LeNet solved from
Python with NetSpec and a Python data layer, net surgery, classification,
the multilabel notebook's share_with), on small data, through ``import
caffe``."""
import sys

import numpy as np
import pytest

import caffe
from caffe import layers as L, params as P

TOY_DATA = '''
import numpy as np
import caffe


class ToyData(caffe.Layer):
    """Two classes of 1 x 8 x 8 images: a bright left or right half."""

    def setup(self, bottom, top):
        params = eval(self.param_str)
        self.batch = params["batch_size"]
        self.r = np.random.RandomState(params["seed"])

    def reshape(self, bottom, top):
        top[0].reshape(self.batch, 1, 8, 8)
        top[1].reshape(self.batch)

    def forward(self, bottom, top):
        y = self.r.randint(0, 2, self.batch)
        x = self.r.rand(self.batch, 1, 8, 8).astype(np.float32) * 0.5
        for i, c in enumerate(y):
            x[i, 0, :, 4 * c:4 * c + 4] += 1.0
        top[0].data[...] = x
        top[1].data[...] = y

    def backward(self, top, propagate_down, bottom):
        pass
'''


@pytest.fixture
def toy_module(tmp_path):
    (tmp_path / "toy_data.py").write_text(TOY_DATA)
    sys.path.insert(0, str(tmp_path))
    yield
    sys.path.remove(str(tmp_path))
    sys.modules.pop("toy_data", None)


def lenet(batch_size, seed):
    n = caffe.NetSpec()
    n.data, n.label = L.Python(module="toy_data", layer="ToyData", ntop=2,
                               param_str=str(dict(batch_size=batch_size, seed=seed)))
    n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=4,
                            weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool1, num_output=16, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=2, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


def test_learning_lenet_from_python(tmp_path, toy_module):
    (tmp_path / "train.prototxt").write_text(str(lenet(16, 1)))
    (tmp_path / "test.prototxt").write_text(str(lenet(50, 2)))
    (tmp_path / "solver.prototxt").write_text(
        f'train_net: "{tmp_path}/train.prototxt"\ntest_net: "{tmp_path}/test.prototxt"\n'
        'test_iter: 1\ntest_interval: 1000\nbase_lr: 0.05\nmomentum: 0.9\n'
        'weight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\n'
        'max_iter: 100\nrandom_seed: 3\nsnapshot_after_train: false\n')
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    assert [(k, v.data.shape) for k, v in solver.net.blobs.items()][:2] == \
        [("data", (16, 1, 8, 8)), ("label", (16,))]
    assert [(k, v[0].data.shape) for k, v in solver.net.params.items()] == \
        [("conv1", (4, 1, 3, 3)), ("fc1", (16, 36)), ("score", (2, 16))]
    solver.net.forward()
    solver.test_nets[0].forward()
    solver.step(1)
    assert solver.net.params["conv1"][0].diff[:, 0].any()
    niter = 40
    train_loss = np.zeros(niter)
    test_acc = []
    for it in range(niter):
        solver.step(1)
        train_loss[it] = solver.net.blobs["loss"].data
        if it % 10 == 0:
            correct = 0
            solver.test_nets[0].forward(start="conv1")
            correct += sum(solver.test_nets[0].blobs["score"].data.argmax(1)
                           == solver.test_nets[0].blobs["label"].data)
            test_acc.append(correct / 50.0)
    assert train_loss[-5:].mean() < train_loss[:5].mean()
    assert test_acc[-1] >= 0.9, test_acc
    assert solver.iter == niter + 1


def test_net_surgery_fc_to_conv(tmp_path):
    (tmp_path / "fc.prototxt").write_text("""
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } } }
layer { name: "fc6" type: "InnerProduct" bottom: "data" top: "fc6"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 }
    bias_filler { type: "gaussian" std: 1 } } }
""")
    (tmp_path / "conv.prototxt").write_text("""
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
layer { name: "fc6-conv" type: "Convolution" bottom: "data" top: "fc6-conv"
  convolution_param { num_output: 3 kernel_size: 4 } }
""")
    net = caffe.Net(str(tmp_path / "fc.prototxt"), caffe.TEST)
    net_full_conv = caffe.Net(str(tmp_path / "conv.prototxt"), caffe.TEST)
    params = ["fc6"]
    fc_params = {pr: (net.params[pr][0].data, net.params[pr][1].data) for pr in params}
    conv_params = {pr: (net_full_conv.params[pr][0].data, net_full_conv.params[pr][1].data)
                   for pr in ["fc6-conv"]}
    for pr, pr_conv in zip(params, ["fc6-conv"]):
        conv_params[pr_conv][0].flat = fc_params[pr][0].flat   # flat unrolls the arrays
        conv_params[pr_conv][1][...] = fc_params[pr][1]
    x = np.random.RandomState(0).randn(1, 2, 6, 6).astype(np.float32)
    net_full_conv.blobs["data"].data[...] = x
    out = net_full_conv.forward()["fc6-conv"]
    assert out.shape == (1, 3, 3, 3)
    for i in range(3):
        for j in range(3):
            net.blobs["data"].data[...] = x[:, :, i:i + 4, j:j + 4]
            np.testing.assert_allclose(net.forward()["fc6"][0], out[0, :, i, j],
                                       rtol=1e-4, atol=1e-4)
    # editing a filter by hand, as the notebook's Gaussian blur
    conv_params["fc6-conv"][0][...] = 0
    conv_params["fc6-conv"][0][0, 0] = 1.0 / 16
    conv_params["fc6-conv"][1][...] = 0
    blurred = net_full_conv.forward()["fc6-conv"][0, 0]
    want = np.array([[x[0, 0, i:i + 4, j:j + 4].mean() for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(blurred, want, rtol=1e-5, atol=1e-6)
    net_full_conv.save(str(tmp_path / "surgery.caffemodel"))
    again = caffe.Net(str(tmp_path / "conv.prototxt"), str(tmp_path / "surgery.caffemodel"),
                      caffe.TEST)
    np.testing.assert_array_equal(again.params["fc6-conv"][0].data,
                                  net_full_conv.params["fc6-conv"][0].data)


def test_classification_with_a_tiny_net(tmp_path):
    import cv2
    (tmp_path / "deploy.prototxt").write_text("""
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.02 } } }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
""")
    net = caffe.Net(str(tmp_path / "deploy.prototxt"), caffe.TEST)
    net.save(str(tmp_path / "w.caffemodel"))
    r = np.random.RandomState(0)
    img = (r.rand(10, 12, 3) * 255).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "cat.png"), img)
    mu = np.array([104.0, 117.0, 123.0])
    # the 00-classification notebook's preprocessing, by hand
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))
    transformer.set_mean("data", mu)
    transformer.set_raw_scale("data", 255)
    transformer.set_channel_swap("data", (2, 1, 0))
    net.blobs["data"].reshape(1, 3, 6, 6)
    image = caffe.io.load_image(str(tmp_path / "cat.png"))
    net.blobs["data"].data[...] = transformer.preprocess("data", image)
    prob = net.forward()["prob"][0].copy()
    assert prob.shape == (5,) and abs(prob.sum() - 1) < 1e-5
    # classify.py's Classifier on the same image (resized to the input)
    clf = caffe.Classifier(str(tmp_path / "deploy.prototxt"), str(tmp_path / "w.caffemodel"),
                           image_dims=(6, 6), mean=mu, raw_scale=255,
                           channel_swap=(2, 1, 0))
    with open(tmp_path / "cat.png", "rb") as f:            # the web demo passes a file
        pred = clf.predict([caffe.io.load_image(f)], oversample=False)
    np.testing.assert_allclose(pred[0], prob, rtol=1e-4, atol=1e-6)


def test_multilabel_style_share_with(tmp_path, toy_module):
    (tmp_path / "train.prototxt").write_text(str(lenet(8, 4)))
    (tmp_path / "val.prototxt").write_text(str(lenet(8, 5)))
    (tmp_path / "solver.prototxt").write_text(
        f'train_net: "{tmp_path}/train.prototxt"\ntest_net: "{tmp_path}/val.prototxt"\n'
        'test_iter: 1\ntest_interval: 100000\nbase_lr: 0.05\nlr_policy: "fixed"\n'
        'max_iter: 10\nsnapshot_after_train: false\n')
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    solver.test_nets[0].share_with(solver.net)
    solver.step(3)
    for k in solver.net.params:
        for a, b in zip(solver.net.params[k], solver.test_nets[0].params[k]):
            np.testing.assert_array_equal(a.data, b.data)
