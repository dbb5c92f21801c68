"""Slow, optional: real torch.onnx.export (TorchScript exporter) of the
torchvision classification architectures, written out here layer for layer
as torchvision defines them (torchvision does not install beside torch
here), converted to Caffe and run in caffe_ocl and ONNX Runtime on the same
input: largest difference <= 1e-4 x output scale and the same top-5 classes.

Weights are random (fixed seed) and every BatchNorm gets random running
statistics and affine parameters, so no BatchNorm is an identity. Channel
counts, strides, paddings, pooling ceil/floor modes, groups, SE blocks and
width multipliers are torchvision's; only the input is smaller than 224 where
the architecture allows (global pooling heads). AlexNet and VGG-16 keep 224:
their AdaptiveAvgPool2d((6, 6)) / ((7, 7)) heads are exported only when the
feature map divides evenly (here an identity, as in torchvision at 224).
Eval mode: dropout and stochastic depth are identities, GoogLeNet has no
auxiliary heads and transform_input=False."""
import io
import math
import time
from functools import partial

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn
F = torch.nn.functional

from caffe_ocl.onnx import check, to_caffe  # noqa: E402

pytestmark = pytest.mark.slow


def _make_divisible(v, divisor=8, min_value=None):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvNormAct(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation (bias only without a norm)."""

    def __init__(self, cin, cout, k=3, s=1, p=None, groups=1, norm=nn.BatchNorm2d,
                 act=nn.ReLU):
        p = (k - 1) // 2 if p is None else p
        layers = [nn.Conv2d(cin, cout, k, s, p, groups=groups, bias=norm is None)]
        if norm is not None:
            layers.append(norm(cout))
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation."""

    def __init__(self, cin, squeeze, act=nn.ReLU, scale_act=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(cin, squeeze, 1), nn.Conv2d(squeeze, cin, 1)
        self.activation, self.scale_activation = act(), scale_act()

    def forward(self, x):
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


# ---- AlexNet, VGG ---------------------------------------------------------
class AlexNet(nn.Module):
    def __init__(self, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(True),
            nn.Dropout(dropout), nn.Linear(4096, 4096), nn.ReLU(True),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class VGG(nn.Module):
    CFG_D = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
             512, 512, 512, "M"]

    def __init__(self, cfg=CFG_D, num_classes=1000, dropout=0.5):
        super().__init__()
        layers, c = [], 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ---- ResNet family -----------------------------------------------------------
def conv3x3(cin, cout, stride=1, groups=1):
    return nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(inplanes, planes, stride), nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(True)
        self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1, self.bn1 = conv1x1(inplanes, width), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = conv3x3(width, width, stride, groups), nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000, groups=1, width_per_group=64):
        super().__init__()
        self.inplanes, self.groups, self.base_width = 64, groups, width_per_group
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU(True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        down = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            down = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                 nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, down, self.groups, self.base_width)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, groups=self.groups,
                         base_width=self.base_width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---- SqueezeNet --------------------------------------------------------------
class Fire(nn.Module):
    def __init__(self, inplanes, squeeze, e1, e3):
        super().__init__()
        self.squeeze, self.squeeze_activation = nn.Conv2d(inplanes, squeeze, 1), nn.ReLU(True)
        self.expand1x1, self.expand1x1_activation = nn.Conv2d(squeeze, e1, 1), nn.ReLU(True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet(nn.Module):
    def __init__(self, version="1_0", num_classes=1000, dropout=0.5):
        super().__init__()
        pool = partial(nn.MaxPool2d, kernel_size=3, stride=2, ceil_mode=True)
        if version == "1_0":
            self.features = nn.Sequential(
                nn.Conv2d(3, 96, 7, 2), nn.ReLU(True), pool(),
                Fire(96, 16, 64, 64), Fire(128, 16, 64, 64), Fire(128, 32, 128, 128), pool(),
                Fire(256, 32, 128, 128), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
                Fire(384, 64, 256, 256), pool(), Fire(512, 64, 256, 256))
        else:
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 3, 2), nn.ReLU(True), pool(),
                Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool(),
                Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool(),
                Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
                Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Conv2d(512, num_classes, 1),
                                        nn.ReLU(True), nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


# ---- MobileNetV2 -------------------------------------------------------------
class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = [] if expand_ratio == 1 else [ConvNormAct(inp, hidden, 1, act=nn.ReLU6)]
        layers += [ConvNormAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000, width_mult=1.0, round_nearest=8, dropout=0.2):
        super().__init__()
        setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                   [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
        cin = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features = [ConvNormAct(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in setting:
            cout = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvNormAct(cin, self.last_channel, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout),
                                        nn.Linear(self.last_channel, num_classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ---- DenseNet ----------------------------------------------------------------
class DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU(True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, inputs):                    # a list of tensors, as torchvision
        x = torch.cat(inputs, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers, cin, bn_size, growth):
        super().__init__()
        for i in range(num_layers):
            self.add_module(f"denselayer{i + 1}", DenseLayer(cin + i * growth, growth, bn_size))

    def forward(self, init_features):
        features = [init_features]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.BatchNorm2d(cin), nn.ReLU(True), nn.Conv2d(cin, cout, 1, bias=False),
                         nn.AvgPool2d(2, 2))


class DenseNet(nn.Module):
    def __init__(self, growth=32, block_config=(6, 12, 24, 16), num_init_features=64,
                 bn_size=4, num_classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, num_init_features, 7, 2, 3, bias=False),
                  nn.BatchNorm2d(num_init_features), nn.ReLU(True), nn.MaxPool2d(3, 2, 1)]
        c = num_init_features
        for i, n in enumerate(block_config):
            layers.append(DenseBlock(n, c, bn_size, growth))
            c += n * growth
            if i != len(block_config) - 1:
                layers.append(Transition(c, c // 2))
                c //= 2
        layers.append(nn.BatchNorm2d(c))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(F.relu(self.features(x), inplace=True), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ---- EfficientNet-B0 ---------------------------------------------------------
class MBConv(nn.Module):
    def __init__(self, expand_ratio, k, stride, cin, cout):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        expanded = _make_divisible(cin * expand_ratio, 8)
        layers = []
        if expanded != cin:
            layers.append(ConvNormAct(cin, expanded, 1, act=nn.SiLU))
        layers += [ConvNormAct(expanded, expanded, k, stride, groups=expanded, act=nn.SiLU),
                   SqueezeExcitation(expanded, max(1, cin // 4),
                                     act=partial(nn.SiLU, inplace=True)),
                   ConvNormAct(expanded, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res_connect else y   # StochasticDepth: identity at eval


class EfficientNet(nn.Module):
    B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
          (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
          (6, 3, 1, 192, 320, 1)]

    def __init__(self, width_mult=1.0, depth_mult=1.0, dropout=0.2, num_classes=1000):
        super().__init__()
        ch = lambda c: _make_divisible(c * width_mult, 8)  # noqa: E731
        layers = [ConvNormAct(3, ch(32), 3, 2, act=nn.SiLU)]
        for t, k, s, cin, cout, n in self.B0:
            for i in range(int(math.ceil(n * depth_mult))):
                layers.append(MBConv(t, k, s if i == 0 else 1, ch(cin) if i == 0 else ch(cout),
                                     ch(cout)))
        last_in = ch(320)
        layers.append(ConvNormAct(last_in, 4 * last_in, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(dropout, inplace=True),
                                        nn.Linear(4 * last_in, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ---- RegNet ------------------------------------------------------------------
def regnet_params(depth, w_0, w_a, w_m, group_width, bottleneck_multiplier=1.0):
    """torchvision.models.regnet.BlockParams.from_init_params (+ width/group fix)."""
    widths_cont = torch.arange(depth) * w_a + w_0
    block_capacity = torch.round(torch.log(widths_cont / w_0) / math.log(w_m))
    block_widths = (torch.round(torch.divide(w_0 * torch.pow(w_m, block_capacity), 8))
                    * 8).int().tolist()
    splits = [w != wp or r != rp for w, wp, r, rp in
              zip(block_widths + [0], [0] + block_widths, block_widths + [0], [0] + block_widths)]
    stage_widths = [w for w, t in zip(block_widths, splits[:-1]) if t]
    stage_depths = torch.diff(torch.tensor([d for d, t in enumerate(splits) if t])).int().tolist()
    w_bot = [int(w * bottleneck_multiplier) for w in stage_widths]
    g = [min(group_width, wb) for wb in w_bot]
    w_bot = [_make_divisible(wb, gw) for wb, gw in zip(w_bot, g)]
    stage_widths = [int(wb / bottleneck_multiplier) for wb in w_bot]
    return stage_widths, stage_depths, g


class ResBottleneckBlock(nn.Module):
    def __init__(self, w_in, w_out, stride, group_width, bottleneck_multiplier, se_ratio):
        super().__init__()
        self.proj = None
        if w_in != w_out or stride != 1:
            self.proj = ConvNormAct(w_in, w_out, 1, stride, act=None)
        w_b = int(round(w_out * bottleneck_multiplier))
        layers = [ConvNormAct(w_in, w_b, 1), ConvNormAct(w_b, w_b, 3, stride,
                                                         groups=w_b // group_width)]
        if se_ratio:
            layers.append(SqueezeExcitation(w_b, int(round(se_ratio * w_in))))
        layers.append(ConvNormAct(w_b, w_out, 1, act=None))
        self.f = nn.Sequential(*layers)
        self.activation = nn.ReLU(True)

    def forward(self, x):
        return self.activation((x if self.proj is None else self.proj(x)) + self.f(x))


class RegNet(nn.Module):
    def __init__(self, depth, w_0, w_a, w_m, group_width, se_ratio=0.25, stem_width=32,
                 num_classes=1000):
        super().__init__()
        widths, depths, groups = regnet_params(depth, w_0, w_a, w_m, group_width)
        self.stem = ConvNormAct(3, stem_width, 3, 2)
        stages, c = [], stem_width
        for w, d, g in zip(widths, depths, groups):
            stages.append(nn.Sequential(*[ResBottleneckBlock(c if i == 0 else w, w,
                                                             2 if i == 0 else 1, g, 1.0,
                                                             se_ratio) for i in range(d)]))
            c = w
        self.trunk_output = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        x = self.avgpool(self.trunk_output(self.stem(x)))
        return self.fc(x.flatten(start_dim=1))


# ---- GoogLeNet ---------------------------------------------------------------
class BasicConv2d(nn.Module):
    def __init__(self, cin, cout, **kw):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kw)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class Inception(nn.Module):
    def __init__(self, cin, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj):
        super().__init__()
        self.branch1 = BasicConv2d(cin, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(BasicConv2d(cin, ch3x3red, kernel_size=1),
                                     BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1))
        # torchvision's known quirk: the "5x5" branch uses a 3x3 kernel
        self.branch3 = nn.Sequential(BasicConv2d(cin, ch5x5red, kernel_size=1),
                                     BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True),
                                     BasicConv2d(cin, pool_proj, kernel_size=1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    """aux_logits=False, transform_input=False."""

    def __init__(self, num_classes=1000, dropout=0.2):
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x):
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        for m in (self.inception4a, self.inception4b, self.inception4c, self.inception4d,
                  self.inception4e):
            x = m(x)
        x = self.inception5b(self.inception5a(self.maxpool4(x)))
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


# ---- ShuffleNetV2 ------------------------------------------------------------
def channel_shuffle(x, groups):
    batchsize, num_channels, height, width = x.size()
    x = x.view(batchsize, groups, num_channels // groups, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, -1, height, width)


class ShuffleInvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        bf = oup // 2
        dw = lambda c: nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False)  # noqa: E731
        if stride > 1:
            self.branch1 = nn.Sequential(dw(inp), nn.BatchNorm2d(inp),
                                         nn.Conv2d(inp, bf, 1, bias=False), nn.BatchNorm2d(bf),
                                         nn.ReLU(True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else bf, bf, 1, bias=False), nn.BatchNorm2d(bf),
            nn.ReLU(True), dw(bf), nn.BatchNorm2d(bf), nn.Conv2d(bf, bf, 1, bias=False),
            nn.BatchNorm2d(bf), nn.ReLU(True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024), num_classes=1000):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, channels[0], 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(channels[0]), nn.ReLU(True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        c = channels[0]
        for name, n, cout in zip(("stage2", "stage3", "stage4"), repeats, channels[1:]):
            setattr(self, name, nn.Sequential(ShuffleInvertedResidual(c, cout, 2), *[
                ShuffleInvertedResidual(cout, cout, 1) for _ in range(n - 1)]))
            c = cout
        self.conv5 = nn.Sequential(nn.Conv2d(c, channels[-1], 1, bias=False),
                                   nn.BatchNorm2d(channels[-1]), nn.ReLU(True))
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x):
        x = self.stage4(self.stage3(self.stage2(self.maxpool(self.conv1(x)))))
        return self.fc(self.conv5(x).mean([2, 3]))


# name: (constructor, input size)
ARCHS = {
    "alexnet": (AlexNet, 224),
    "vgg16": (VGG, 224),
    "resnet18": (lambda: ResNet(BasicBlock, [2, 2, 2, 2]), 64),
    "resnet50": (lambda: ResNet(Bottleneck, [3, 4, 6, 3]), 64),
    "resnext50_32x4d": (lambda: ResNet(Bottleneck, [3, 4, 6, 3], groups=32,
                                       width_per_group=4), 64),
    "wide_resnet50_2": (lambda: ResNet(Bottleneck, [3, 4, 6, 3], width_per_group=128), 64),
    "squeezenet1_0": (lambda: SqueezeNet("1_0"), 67),
    "squeezenet1_1": (lambda: SqueezeNet("1_1"), 67),
    "mobilenet_v2": (MobileNetV2, 64),
    "densenet121": (DenseNet, 64),
    "efficientnet_b0": (EfficientNet, 64),
    "regnet_y_400mf": (lambda: RegNet(16, 48, 27.89, 2.09, 8), 64),
    "googlenet": (GoogLeNet, 67),
    "shufflenet_v2_x1_0": (ShuffleNetV2, 64),
    # not one of torchvision's listed models: a MobileNetV3-style block keeps
    # HardSwish (HardSigmoid + Mul below opset 14) covered
    "hardswish_block": (lambda: nn.Sequential(
        ConvNormAct(3, 16, 3, 2, act=nn.Hardswish),
        ConvNormAct(16, 16, 3, 1, groups=16, act=nn.Hardswish),
        SqueezeExcitation(16, 8, scale_act=nn.Hardsigmoid),
        ConvNormAct(16, 32, 1, act=nn.Hardswish), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10)), 33),
}

# torchvision's documented parameter counts (weights' "num_params")
TORCHVISION_PARAMS = {
    "alexnet": 61100840, "vgg16": 138357544, "resnet18": 11689512, "resnet50": 25557032,
    "resnext50_32x4d": 25028904, "wide_resnet50_2": 68883240, "squeezenet1_0": 1248424,
    "squeezenet1_1": 1235496, "mobilenet_v2": 3504872, "densenet121": 7978856,
    "efficientnet_b0": 5288548, "regnet_y_400mf": 4344144, "googlenet": 6624904,
    "shufflenet_v2_x1_0": 2278604}


def _init(model, seed):
    """Random weights that keep activations O(1) through the depth (He
    fan-in for convolutions, 1/sqrt(fan-in) for Linear) and random
    BatchNorm statistics and affine parameters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                gain = 2.0 if isinstance(m, nn.Conv2d) else 1.0
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * math.sqrt(gain / fan_in))
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)


def export(name, opset, seed=0, fold=True):
    """(ONNX bytes, input array) of the torch model ``name``. The exporter
    folds a BatchNorm that follows a convolution into it (eval mode);
    ``fold=False`` keeps every BatchNormalization node (and Identity
    nodes for the parameters)."""
    build, size = ARCHS[name]
    torch.manual_seed(seed)
    model = build().eval()
    _init(model, seed + 1)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    f = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (x,), f, opset_version=opset, dynamo=False,
                          input_names=["x"], output_names=["y"], do_constant_folding=fold)
    return f.getvalue(), x.numpy()


def compare(name, opset, fold=True):
    """(max |caffe_ocl - onnxruntime| / max |onnxruntime|, top-5 of each, seconds)."""
    t0 = time.time()
    data, x = export(name, opset, fold=fold)
    net = to_caffe.convert(onnx.load_model_from_string(data))
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = check.run_caffe(net, {"x": x}, ["y"])["y"].reshape(ref.shape)
    rel = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    top = lambda a: list(np.argsort(-a.ravel(), kind="stable")[:5])  # noqa: E731
    return rel, top(got), top(ref), time.time() - t0


CASES = [(n, 13) for n in ARCHS] + [
    (n, o) for n in ("resnet18", "squeezenet1_1", "mobilenet_v2", "efficientnet_b0",
                     "googlenet", "shufflenet_v2_x1_0", "hardswish_block") for o in (9, 17)]


def test_architectures_match_torchvision_sizes():
    """Same parameter count as torchvision's model of that name, and
    regnet_y_400mf's derived stages are torchvision's."""
    for name, n in TORCHVISION_PARAMS.items():
        assert sum(p.numel() for p in ARCHS[name][0]().parameters()) == n, name
    assert regnet_params(16, 48, 27.89, 2.09, 8) == ([48, 104, 208, 440], [1, 3, 6, 6],
                                                     [8, 8, 8, 8])


@pytest.mark.parametrize("name,opset", CASES, ids=[f"{n}-opset{o}" for n, o in CASES])
def test_torchvision_architecture_converts(name, opset):
    rel, got5, ref5, secs = compare(name, opset)
    print(f"{name} opset {opset} input {ARCHS[name][1]}: max diff / scale = {rel:.2e}, "
          f"top-5 {got5} vs {ref5}, {secs:.1f} s")
    assert rel <= 1e-4, rel
    assert got5 == ref5


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_unfolded_batchnorm_export(name):
    """Without the exporter's constant folding every BatchNorm stays a
    BatchNormalization node (BatchNorm + Scale in Caffe)."""
    data, _ = export(name, 13, fold=False)
    assert "BatchNormalization" in {n.op_type for n in onnx.load_model_from_string(data).graph.node}
    rel, got5, ref5, secs = compare(name, 13, fold=False)
    print(f"{name} opset 13 unfolded: max diff / scale = {rel:.2e}, {secs:.1f} s")
    assert rel <= 1e-4, rel
    assert got5 == ref5
