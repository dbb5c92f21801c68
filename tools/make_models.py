#!/usr/bin/env python
"""Generate the shipped model definitions under models/<name>/ with
caffe_ocl.net_spec, so deploy and train nets stay consistent.

For every architecture two files are written:

* ``deploy.prototxt``: Input "data" 1x3x224x224 ... Softmax "prob".
* ``train.prototxt`` (benchmarking / training from scratch): Input layers
  "data" 64x3x224x224 and "label" 64, the same network, and SoftmaxWithLoss
  "loss" on the last InnerProduct/convolution (GoogLeNet also keeps BVLC's
  two auxiliary classifiers, loss weight 0.3). Feed real data by replacing
  the two Input layers with a Data layer.

Architectures: googlenet, vgg16, resnet18, resnet50, squeezenet1_1,
mobilenet_v2, and alexnet (train.prototxt only: models/alexnet/deploy.prototxt
is hand-written; the generated train net uses the same layers).

BatchNorm layers leave ``use_global_stats`` unset so it follows the phase
(batch statistics in TRAIN, stored ones in TEST), and mask their statistics
with ``lr_mult: 0``. Weight fillers: msra for ReLU networks trained from
scratch (VGG, ResNet, MobileNet), xavier where the reference definitions use
it (GoogLeNet, SqueezeNet), gaussian as in BVLC's AlexNet.

Usage: python tools/make_models.py [--out models] [--only NAME ...]
       [--relu6 ReLU6|Clip]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from google.protobuf import text_format  # noqa: E402

from caffe_ocl.net_spec import NetSpec, layers as L, params as P  # noqa: E402

TRAIN_BATCH = 64
DEPLOY_BATCH = 1
SIZE = 224

MSRA = dict(type="msra")
XAVIER = dict(type="xavier")
LEARN = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]
LEARN_W = [dict(lr_mult=1, decay_mult=1)]
FROZEN3 = [dict(lr_mult=0, decay_mult=0)] * 3

# MobileNet v2's ReLU6: "ReLU6" (a caffe_ocl extension, also read by OpenCV's
# Caffe importer) or "Clip" (BVLC Caffe's Clip layer, min 0 max 6).
RELU6 = "ReLU6"

PAPERS = {
    "googlenet": ('GoogLeNet', 'Szegedy et al., "Going Deeper with Convolutions", '
                  'CVPR 2015 (arXiv:1409.4842); layout of BVLC\'s bvlc_googlenet'),
    "vgg16": ('VGG-16', 'Simonyan & Zisserman, "Very Deep Convolutional Networks for '
              'Large-Scale Image Recognition", ICLR 2015 (arXiv:1409.1556), configuration D'),
    "resnet18": ('ResNet-18', 'He et al., "Deep Residual Learning for Image Recognition", '
                 'CVPR 2016 (arXiv:1512.03385); basic blocks, in the style of the '
                 'authors\' Caffe ResNet-50/101/152 definitions'),
    "resnet50": ('ResNet-50', 'He et al., "Deep Residual Learning for Image Recognition", '
                 'CVPR 2016 (arXiv:1512.03385); bottleneck blocks, layer names of the '
                 'authors\' Caffe release'),
    "squeezenet1_1": ('SqueezeNet v1.1', 'Iandola et al., "SqueezeNet: AlexNet-level '
                      'accuracy with 50x fewer parameters and <0.5MB model size" '
                      '(arXiv:1602.07360); v1.1 layout of the DeepScale/SqueezeNet release'),
    "mobilenet_v2": ('MobileNet v2', 'Sandler et al., "MobileNetV2: Inverted Residuals '
                     'and Linear Bottlenecks", CVPR 2018 (arXiv:1801.04381), width 1.0'),
    "alexnet": ('AlexNet', 'Krizhevsky et al., "ImageNet Classification with Deep '
                'Convolutional Neural Networks", NIPS 2012; layout of BVLC\'s bvlc_alexnet'),
}


# ---------------------------------------------------------------------------
# building blocks

def conv(bottom, nout, ks, stride=1, pad=0, group=1, bias=True, filler=MSRA,
         bias_value=0.0):
    kw = dict(num_output=nout, kernel_size=ks, weight_filler=filler)
    if stride != 1:
        kw["stride"] = stride
    if pad:
        kw["pad"] = pad
    if group != 1:
        kw["group"] = group
    if bias:
        kw["bias_filler"] = dict(type="constant", value=bias_value)
        return L.Convolution(bottom, param=LEARN, **kw)
    kw["bias_term"] = False
    return L.Convolution(bottom, param=LEARN_W, **kw)


def fc(bottom, nout, filler=XAVIER, bias_value=0.0):
    return L.InnerProduct(bottom, num_output=nout, weight_filler=filler,
                          bias_filler=dict(type="constant", value=bias_value), param=LEARN)


def max_pool(bottom, ks, stride, pad=0):
    kw = dict(pad=pad) if pad else {}
    return L.Pooling(bottom, pool=P.Pooling.MAX, kernel_size=ks, stride=stride, **kw)


def ave_pool(bottom, ks, stride):
    return L.Pooling(bottom, pool=P.Pooling.AVE, kernel_size=ks, stride=stride)


def global_ave_pool(bottom):
    return L.Pooling(bottom, pool=P.Pooling.AVE, global_pooling=True)


def relu(bottom):
    return L.ReLU(bottom, in_place=True)


def lrn(bottom):
    return L.LRN(bottom, local_size=5, alpha=1e-4, beta=0.75)


def conv_bn(n, bottom, name, bn, scale, nout, ks, stride=1, pad=0, group=1):
    """Convolution (no bias) + BatchNorm + Scale(bias), Kaiming He's Caffe style.
    Returns the (in-place) output top."""
    n[name] = conv(bottom, nout, ks, stride, pad, group, bias=False)
    n[bn] = L.BatchNorm(n[name], in_place=True, param=FROZEN3)
    n[scale] = L.Scale(n[bn], in_place=True, bias_term=True)
    return n[scale]


def inputs(n, train):
    if train:
        n.data = L.Input(shape=dict(dim=[TRAIN_BATCH, 3, SIZE, SIZE]))
        n.label = L.Input(shape=dict(dim=[TRAIN_BATCH]))
    else:
        n.data = L.Input(shape=dict(dim=[DEPLOY_BATCH, 3, SIZE, SIZE]))


def head(n, last, train):
    if train:
        n.loss = L.SoftmaxWithLoss(last, n.label)
    else:
        n.prob = L.Softmax(last)


# ---------------------------------------------------------------------------
# architectures

def googlenet(train):
    n = NetSpec()
    inputs(n, train)

    def c(bottom, name, nout, ks, stride=1, pad=0):
        n[name] = conv(bottom, nout, ks, stride, pad, filler=XAVIER, bias_value=0.2)
        return n[name]

    def c_relu(bottom, name, relu_name, nout, ks, stride=1, pad=0):
        c(bottom, name, nout, ks, stride, pad)
        n[relu_name] = relu(n[name])
        return n[relu_name]

    def inception(bottom, pre, o1, r3, o3, r5, o5, pp):
        p = pre + "/"
        b1 = c_relu(bottom, p + "1x1", p + "relu_1x1", o1, 1)
        b3 = c_relu(bottom, p + "3x3_reduce", p + "relu_3x3_reduce", r3, 1)
        b3 = c_relu(b3, p + "3x3", p + "relu_3x3", o3, 3, pad=1)
        b5 = c_relu(bottom, p + "5x5_reduce", p + "relu_5x5_reduce", r5, 1)
        b5 = c_relu(b5, p + "5x5", p + "relu_5x5", o5, 5, pad=2)
        n[p + "pool"] = max_pool(bottom, 3, 1, pad=1)
        bp = c_relu(n[p + "pool"], p + "pool_proj", p + "relu_pool_proj", pp, 1)
        n[p + "output"] = L.Concat(b1, b3, b5, bp)
        return n[p + "output"]

    def aux(bottom, pre):
        p = pre + "/"
        n[p + "ave_pool"] = ave_pool(bottom, 5, 3)
        x = c_relu(n[p + "ave_pool"], p + "conv", p + "relu_conv", 128, 1)
        n[p + "fc"] = fc(x, 1024, bias_value=0.2)
        n[p + "relu_fc"] = relu(n[p + "fc"])
        n[p + "drop_fc"] = L.Dropout(n[p + "relu_fc"], in_place=True, dropout_ratio=0.7)
        n[p + "classifier"] = fc(n[p + "drop_fc"], 1000)
        n[p + "loss"] = L.SoftmaxWithLoss(n[p + "classifier"], n.label, loss_weight=0.3)

    x = c_relu(n.data, "conv1/7x7_s2", "conv1/relu_7x7", 64, 7, 2, 3)
    n["pool1/3x3_s2"] = max_pool(x, 3, 2)
    n["pool1/norm1"] = lrn(n["pool1/3x3_s2"])
    x = c_relu(n["pool1/norm1"], "conv2/3x3_reduce", "conv2/relu_3x3_reduce", 64, 1)
    x = c_relu(x, "conv2/3x3", "conv2/relu_3x3", 192, 3, pad=1)
    n["conv2/norm2"] = lrn(x)
    n["pool2/3x3_s2"] = max_pool(n["conv2/norm2"], 3, 2)
    x = inception(n["pool2/3x3_s2"], "inception_3a", 64, 96, 128, 16, 32, 32)
    x = inception(x, "inception_3b", 128, 128, 192, 32, 96, 64)
    n["pool3/3x3_s2"] = max_pool(x, 3, 2)
    x = inception(n["pool3/3x3_s2"], "inception_4a", 192, 96, 208, 16, 48, 64)
    if train:
        aux(x, "loss1")
    x = inception(x, "inception_4b", 160, 112, 224, 24, 64, 64)
    x = inception(x, "inception_4c", 128, 128, 256, 24, 64, 64)
    x = inception(x, "inception_4d", 112, 144, 288, 32, 64, 64)
    if train:
        aux(x, "loss2")
    x = inception(x, "inception_4e", 256, 160, 320, 32, 128, 128)
    n["pool4/3x3_s2"] = max_pool(x, 3, 2)
    x = inception(n["pool4/3x3_s2"], "inception_5a", 256, 160, 320, 32, 128, 128)
    x = inception(x, "inception_5b", 384, 192, 384, 48, 128, 128)
    n["pool5/7x7_s1"] = ave_pool(x, 7, 1)
    n["pool5/drop_7x7_s1"] = L.Dropout(n["pool5/7x7_s1"], in_place=True, dropout_ratio=0.4)
    n["loss3/classifier"] = fc(n["pool5/drop_7x7_s1"], 1000)
    head(n, n["loss3/classifier"], train)
    return n


def vgg16(train):
    n = NetSpec()
    inputs(n, train)
    x = n.data
    for stage, (nout, reps) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], 1):
        for i in range(1, reps + 1):
            name = f"conv{stage}_{i}"
            n[name] = conv(x, nout, 3, pad=1)
            n[f"relu{stage}_{i}"] = relu(n[name])
            x = n[f"relu{stage}_{i}"]
        n[f"pool{stage}"] = max_pool(x, 2, 2)
        x = n[f"pool{stage}"]
    for i in (6, 7):
        n[f"fc{i}"] = fc(x, 4096)
        n[f"relu{i}"] = relu(n[f"fc{i}"])
        n[f"drop{i}"] = L.Dropout(n[f"relu{i}"], in_place=True, dropout_ratio=0.5)
        x = n[f"drop{i}"]
    n.fc8 = fc(x, 1000)
    head(n, n.fc8, train)
    return n


def _resnet(train, blocks, bottleneck):
    n = NetSpec()
    inputs(n, train)
    x = conv_bn(n, n.data, "conv1", "bn_conv1", "scale_conv1", 64, 7, 2, 3)
    n.conv1_relu = relu(x)
    n.pool1 = max_pool(n.conv1_relu, 3, 2)
    x = n.pool1
    in_ch = 64
    letters = "abcdefghijklmnopqrstuvwxyz"
    for s, (width, count) in enumerate(zip((64, 128, 256, 512), blocks)):
        stage = s + 2
        out_ch = width * 4 if bottleneck else width
        for i in range(count):
            tag = f"{stage}{letters[i]}"
            stride = 2 if (i == 0 and stage > 2) else 1
            if i == 0 and (stride != 1 or in_ch != out_ch):
                shortcut = conv_bn(n, x, f"res{tag}_branch1", f"bn{tag}_branch1",
                                   f"scale{tag}_branch1", out_ch, 1, stride)
            else:
                shortcut = x
            if bottleneck:
                specs = [("2a", width, 1, stride, 0), ("2b", width, 3, 1, 1),
                         ("2c", out_ch, 1, 1, 0)]
            else:
                specs = [("2a", width, 3, stride, 1), ("2b", out_ch, 3, 1, 1)]
            y = x
            for j, (br, nout, ks, st, pad) in enumerate(specs):
                y = conv_bn(n, y, f"res{tag}_branch{br}", f"bn{tag}_branch{br}",
                            f"scale{tag}_branch{br}", nout, ks, st, pad)
                if j < len(specs) - 1:
                    n[f"res{tag}_branch{br}_relu"] = relu(y)
                    y = n[f"res{tag}_branch{br}_relu"]
            n[f"res{tag}"] = L.Eltwise(shortcut, y, operation=P.Eltwise.SUM)
            n[f"res{tag}_relu"] = relu(n[f"res{tag}"])
            x = n[f"res{tag}_relu"]
            in_ch = out_ch
    # The authors' files pool with kernel 7 (224 input); global pooling is the
    # same there and lets the nets run at other input sizes.
    n.pool5 = global_ave_pool(x)
    n.fc1000 = fc(n.pool5, 1000, filler=MSRA)
    head(n, n.fc1000, train)
    return n


def resnet18(train):
    return _resnet(train, (2, 2, 2, 2), bottleneck=False)


def resnet50(train):
    return _resnet(train, (3, 4, 6, 3), bottleneck=True)


def squeezenet1_1(train):
    n = NetSpec()
    inputs(n, train)

    def c_relu(bottom, name, relu_name, nout, ks, stride=1, pad=0, filler=XAVIER):
        n[name] = conv(bottom, nout, ks, stride, pad, filler=filler)
        n[relu_name] = relu(n[name])
        return n[relu_name]

    def fire(bottom, name, s, e):
        p = name + "/"
        sq = c_relu(bottom, p + "squeeze1x1", p + "relu_squeeze1x1", s, 1)
        e1 = c_relu(sq, p + "expand1x1", p + "relu_expand1x1", e, 1)
        e3 = c_relu(sq, p + "expand3x3", p + "relu_expand3x3", e, 3, pad=1)
        n[p + "concat"] = L.Concat(e1, e3)
        return n[p + "concat"]

    x = c_relu(n.data, "conv1", "relu_conv1", 64, 3, 2)
    n.pool1 = max_pool(x, 3, 2)
    x = fire(n.pool1, "fire2", 16, 64)
    x = fire(x, "fire3", 16, 64)
    n.pool3 = max_pool(x, 3, 2)
    x = fire(n.pool3, "fire4", 32, 128)
    x = fire(x, "fire5", 32, 128)
    n.pool5 = max_pool(x, 3, 2)
    x = fire(n.pool5, "fire6", 48, 192)
    x = fire(x, "fire7", 48, 192)
    x = fire(x, "fire8", 64, 256)
    x = fire(x, "fire9", 64, 256)
    n.drop9 = L.Dropout(x, in_place=True, dropout_ratio=0.5)
    c_relu(n.drop9, "conv10", "relu_conv10", 1000, 1,
           filler=dict(type="gaussian", mean=0.0, std=0.01))
    n.pool10 = global_ave_pool(n.relu_conv10)
    head(n, n.pool10, train)
    return n


def mobilenet_v2(train):
    n = NetSpec()
    inputs(n, train)

    def cbr(bottom, name, nout, ks, stride=1, pad=0, group=1, act=True):
        y = conv_bn(n, bottom, name, name + "/bn", name + "/scale", nout, ks, stride, pad,
                    group)
        if not act:
            return y
        kw = dict(min=0.0, max=6.0) if RELU6 == "Clip" else {}
        n[name + "/relu"] = getattr(L, RELU6)(y, in_place=True, **kw)
        return n[name + "/relu"]

    x = cbr(n.data, "conv1", 32, 3, 2, 1)
    in_ch = 32
    # (expansion t, channels c, repeats n, first stride s), Table 2 of the paper
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    for stage, (t, c, reps, s) in enumerate(settings, 2):
        for i in range(1, reps + 1):
            stride = s if i == 1 else 1
            p = f"conv{stage}_{i}"
            y = x
            hidden = in_ch * t
            if t != 1:
                y = cbr(y, p + "/expand", hidden, 1)
            y = cbr(y, p + "/dwise", hidden, 3, stride, 1, group=hidden)
            y = cbr(y, p + "/linear", c, 1, act=False)
            if stride == 1 and in_ch == c:
                n[f"block{stage}_{i}"] = L.Eltwise(x, y, operation=P.Eltwise.SUM)
                y = n[f"block{stage}_{i}"]
            x = y
            in_ch = c
    x = cbr(x, "conv9_1", 1280, 1)
    n.pool9 = global_ave_pool(x)
    n.fc10 = fc(n.pool9, 1000, filler=MSRA)
    head(n, n.fc10, train)
    return n


def alexnet(train):
    """BVLC's bvlc_alexnet (as models/alexnet/deploy.prototxt)."""
    n = NetSpec()
    inputs(n, train)
    g = lambda std: dict(type="gaussian", std=std)  # noqa: E731
    n.conv1 = conv(n.data, 96, 11, 4, filler=g(0.01))
    n.relu1 = relu(n.conv1)
    n.norm1 = lrn(n.relu1)
    n.pool1 = max_pool(n.norm1, 3, 2)
    n.conv2 = conv(n.pool1, 256, 5, pad=2, group=2, filler=g(0.01), bias_value=0.1)
    n.relu2 = relu(n.conv2)
    n.norm2 = lrn(n.relu2)
    n.pool2 = max_pool(n.norm2, 3, 2)
    n.conv3 = conv(n.pool2, 384, 3, pad=1, filler=g(0.01))
    n.relu3 = relu(n.conv3)
    n.conv4 = conv(n.relu3, 384, 3, pad=1, group=2, filler=g(0.01), bias_value=0.1)
    n.relu4 = relu(n.conv4)
    n.conv5 = conv(n.relu4, 256, 3, pad=1, group=2, filler=g(0.01), bias_value=0.1)
    n.relu5 = relu(n.conv5)
    n.pool5 = max_pool(n.relu5, 3, 2)
    n.fc6 = fc(n.pool5, 4096, filler=g(0.005), bias_value=0.1)
    n.relu6 = relu(n.fc6)
    n.drop6 = L.Dropout(n.relu6, in_place=True, dropout_ratio=0.5)
    n.fc7 = fc(n.drop6, 4096, filler=g(0.005), bias_value=0.1)
    n.relu7 = relu(n.fc7)
    n.drop7 = L.Dropout(n.relu7, in_place=True, dropout_ratio=0.5)
    n.fc8 = fc(n.drop7, 1000, filler=g(0.01))
    head(n, n.fc8, train)
    return n


MODELS = {
    "googlenet": googlenet,
    "vgg16": vgg16,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "squeezenet1_1": squeezenet1_1,
    "mobilenet_v2": mobilenet_v2,
    "alexnet": alexnet,
}
# models whose deploy.prototxt is hand-written and kept
TRAIN_ONLY = {"alexnet"}


def net_param(name, train):
    """The NetParameter of model ``name`` (deploy or train form)."""
    title = PAPERS[name][0]
    p = MODELS[name](train).to_proto()
    p.name = title.replace(" ", "")
    return p


def render(name, train):
    """The prototxt text, with a header comment."""
    title, paper = PAPERS[name]
    kind = ("train form for benchmarking and training from scratch: Input data "
            f"{TRAIN_BATCH}x3x{SIZE}x{SIZE} and label {TRAIN_BATCH}, SoftmaxWithLoss"
            if train else f"deploy form: Input {DEPLOY_BATCH}x3x{SIZE}x{SIZE}, Softmax prob")
    header = [f"# {title}: {paper}.",
              f"# {kind[0].upper() + kind[1:]}.",
              "# Written for caffe_ocl; generated by tools/make_models.py (edit that, "
              "not this file)."]
    return "\n".join(header) + "\n" + text_format.MessageToString(net_param(name, train))


def main(argv=None):
    global RELU6
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "models"))
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), default=None)
    ap.add_argument("--relu6", choices=("ReLU6", "Clip"), default=RELU6)
    args = ap.parse_args(argv)
    RELU6 = args.relu6
    for name in args.only or MODELS:
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        forms = [True] if name in TRAIN_ONLY else [False, True]
        for train in forms:
            path = os.path.join(d, "train.prototxt" if train else "deploy.prototxt")
            with open(path, "w") as f:
                f.write(render(name, train))
            print("wrote", os.path.normpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
