"""Slow, optional: real torch.onnx.export (TorchScript exporter) of
torchvision-style modules defined here (torchvision does not install beside
torch here), at opsets 9, 13 and 17, converted to Caffe and compared with
ONNX Runtime: largest difference <= 1e-4 x output scale, same top-5."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn
F = torch.nn.functional

from caffe_ocl.onnx import check, to_caffe  # noqa: E402

pytestmark = pytest.mark.slow


def cbr(cin, cout, k, s=1, g=1, act=nn.ReLU):
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=False),
                         nn.BatchNorm2d(cout), act())


class Basic(nn.Module):
    def __init__(self, cin, cout, s):
        super().__init__()
        self.a = cbr(cin, cout, 3, s)
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = None if (s == 1 and cin == cout) else nn.Sequential(
            nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        return F.relu(self.b(self.a(x)) + idt)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, cout, s, groups):
        super().__init__()
        self.body = nn.Sequential(cbr(cin, width, 1), cbr(width, width, 3, s, groups),
                                  nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = None if (s == 1 and cin == cout) else nn.Sequential(
            nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + (x if self.down is None else self.down(x)))


def resnet(block_args, bottleneck=False):
    layers = [cbr(3, 8, 7, 2), nn.MaxPool2d(3, 2, 1)]
    for a in block_args:
        layers.append(Bottleneck(*a) if bottleneck else Basic(*a))
    c = block_args[-1][2] if bottleneck else block_args[-1][1]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(c, 10))


class SE(nn.Module):
    def __init__(self, c, sq, act):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Conv2d(c, sq, 1), nn.Conv2d(sq, c, 1), act()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(s))))


class MBConv(nn.Module):
    def __init__(self, cin, cout, s, t, k=3, act=nn.ReLU6, se=False):
        super().__init__()
        hid = cin * t
        layers = [cbr(cin, hid, 1, act=act)] if t != 1 else []
        layers.append(cbr(hid, hid, k, s, hid, act=act))
        if se:
            layers.append(SE(hid, max(1, cin // 4), act))
        layers += [nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.res = s == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.res else y


class Fire(nn.Module):
    def __init__(self, cin, sq, e):
        super().__init__()
        self.s = nn.Conv2d(cin, sq, 1)
        self.e1, self.e3 = nn.Conv2d(sq, e, 1), nn.Conv2d(sq, e, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.s(x))
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


class Dense(nn.Module):
    def __init__(self, c, growth=4):
        super().__init__()
        self.n1, self.c1 = nn.BatchNorm2d(c), nn.Conv2d(c, 8, 1, bias=False)
        self.n2, self.c2 = nn.BatchNorm2d(8), nn.Conv2d(8, growth, 3, padding=1, bias=False)

    def forward(self, x):
        y = self.c2(F.relu(self.n2(self.c1(F.relu(self.n1(x))))))
        return torch.cat([x, y], 1)


def channel_shuffle(x, groups):
    n, c, h, w = x.size()
    x = x.view(n, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(n, -1, h, w)


class Shuffle(nn.Module):
    def __init__(self, cin, cout, s):
        super().__init__()
        bf = cout // 2
        self.s = s
        if s > 1:
            self.b1 = nn.Sequential(nn.Conv2d(cin, cin, 3, s, 1, groups=cin, bias=False),
                                    nn.BatchNorm2d(cin), cbr(cin, bf, 1))
        cb = cin if s > 1 else bf
        self.b2 = nn.Sequential(cbr(cb, bf, 1), nn.Conv2d(bf, bf, 3, s, 1, groups=bf,
                                                          bias=False),
                                nn.BatchNorm2d(bf), cbr(bf, bf, 1))

    def forward(self, x):
        if self.s == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.b2(x2)), dim=1)
        else:
            out = torch.cat((self.b1(x), self.b2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(cbr(3, 8, 3, 2), nn.MaxPool2d(3, 2, 1), Shuffle(8, 16, 2),
                                  Shuffle(16, 16, 1), cbr(16, 32, 1))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.body(x).mean([2, 3]))


class VGGish(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(True),
                                      nn.MaxPool2d(2, 2), nn.Conv2d(8, 16, 3, padding=1),
                                      nn.ReLU(True), nn.MaxPool2d(2, 2))
        self.classifier = nn.Sequential(nn.Linear(16 * 4 * 4, 32), nn.ReLU(True),
                                        nn.Dropout(), nn.Linear(32, 10))

    def forward(self, x):
        x = self.features(x)
        return self.classifier(x.view(x.size(0), -1))


ARCHS = {
    "resnet18": (lambda: resnet([(8, 8, 1), (8, 16, 2)]), 32),
    "resnext50_32x4d": (lambda: resnet([(8, 16, 16, 1, 4), (16, 32, 32, 2, 4)], True), 32),
    "mobilenet_v2": (lambda: nn.Sequential(cbr(3, 8, 3, 2, act=nn.ReLU6), MBConv(8, 8, 1, 1),
                                           MBConv(8, 12, 2, 6), MBConv(12, 12, 1, 6),
                                           nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                           nn.Dropout(0.2), nn.Linear(12, 10)), 32),
    "efficientnet_b0": (lambda: nn.Sequential(
        cbr(3, 8, 3, 2, act=nn.SiLU), MBConv(8, 8, 1, 1, act=nn.SiLU, se=True),
        MBConv(8, 12, 2, 6, 5, nn.SiLU, True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(12, 10)), 32),
    "squeezenet1_1": (lambda: nn.Sequential(
        nn.Conv2d(3, 16, 3, 2), nn.ReLU(True), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 4, 8), Fire(16, 4, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.Dropout(0.5), nn.Conv2d(16, 10, 1), nn.ReLU(True), nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten()), 39),
    "densenet121": (lambda: nn.Sequential(
        cbr(3, 8, 7, 2), nn.MaxPool2d(3, 2, 1), Dense(8), Dense(12), nn.BatchNorm2d(16),
        nn.ReLU(), nn.Conv2d(16, 8, 1, bias=False), nn.AvgPool2d(2, 2), Dense(8),
        nn.BatchNorm2d(12), nn.ReLU(), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
        nn.Linear(12, 10)), 32),
    "shufflenet_v2": (ShuffleNet, 32),
    "vgg16": (VGGish, 16),
    "mobilenet_v3_hardswish": (lambda: nn.Sequential(
        cbr(3, 8, 3, 2, act=nn.Hardswish), MBConv(8, 8, 1, 2, act=nn.Hardswish),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)), 32),
}


def _randomize_bn(model, seed):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


@pytest.mark.parametrize("opset", [9, 13, 17])
@pytest.mark.parametrize("name", sorted(ARCHS))
def test_torch_export_converts(name, opset):
    if name == "mobilenet_v3_hardswish" and opset < 14:
        opset = 14            # HardSwish exists from opset 14
    torch.manual_seed(0)
    build, size = ARCHS[name]
    model = build().eval()
    _randomize_bn(model, 1)
    x = torch.randn(1, 3, size, size)
    f = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (x,), f, opset_version=opset, dynamo=False,
                          input_names=["x"], output_names=["y"])
    m = onnx.load_model_from_string(f.getvalue())
    net = to_caffe.convert(m)
    xn = x.numpy()
    ref = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"]).run(
        None, {"x": xn})[0]
    got = check.run_caffe(net, {"x": xn}, ["y"])["y"].reshape(ref.shape)
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))
    assert set(np.argsort(-got.ravel())[:5]) == set(np.argsort(-ref.ravel())[:5])
