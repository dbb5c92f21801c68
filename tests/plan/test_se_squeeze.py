"""An SE block's squeeze as one launch (plan/se_squeeze.py,
kernels/se_squeeze.cl): global AVE pooling -> product + activation ->
product + gate activation, in the three forms nets bring it (onnx2caffe's
1x1 convolutions with SiLU / Sigmoid, MobileNet v3's ReLU / hard sigmoid,
Caffe SENet's InnerProducts with in-place ReLU / Sigmoid). The rule is
made to hold on whatever device runs the tests, and each test runs with
both kernels (the GPU's work-groups run on PoCL too; se_squeeze_cpu, the
CPU drivers' own). Every blob equals the net run
layer by layer; batches past the kernel's limit run the steps; ranges
cutting the group and a backward after it."""
import numpy as np
import pytest

from caffe_ocl import config
from caffe_ocl.net import Net, TEST
from caffe_ocl.ops import se_squeeze as squeeze_ops
from caffe_ocl.plan import se_squeeze
from caffe_ocl.proto import parse_net_text
from test_se_gated import _nets
from test_swish_fusion import CONVERTED, MOBILENET_V3, _W, _B, _assert_blobs_equal

pytestmark = pytest.mark.usefixtures("gpu_kernels_unoptimized_on_cpu")
RULE = squeeze_ops.applies          # the real rule (the fixture below replaces it)

SENET = ('name: "senet" layer { name: "data" type: "Input" top: "data" '
         'input_param { shape { dim: 2 dim: 12 dim: 5 dim: 3 } } }\n'
         'layer { name: "gap" type: "Pooling" bottom: "data" top: "gap" '
         'pooling_param { pool: AVE global_pooling: true } }\n'
         f'layer {{ name: "fc1" type: "InnerProduct" bottom: "gap" top: "fc1" '
         f'inner_product_param {{ num_output: 3 {_W} {_B} }} }}\n'
         'layer { name: "r1" type: "ReLU" bottom: "fc1" top: "fc1" }\n'
         f'layer {{ name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2" '
         f'inner_product_param {{ num_output: 12 {_W} {_B} }} }}\n'
         'layer { name: "sig" type: "Sigmoid" bottom: "fc2" top: "fc2" }\n'
         'layer { name: "scale" type: "Scale" bottom: "data" bottom: "fc2" top: "out" '
         'scale_param { axis: 0 } }\n')


KERNEL_NAME = {"gpu": "se_squeeze", "cpu": "se_squeeze_cpu"}


@pytest.fixture(autouse=True, params=["gpu", "cpu"])
def kernel(request, monkeypatch):
    """ops.se_squeeze.applies as on a GPU, whatever the device, and the
    kernel of the param (GPU or CPU drivers')."""
    real = squeeze_ops.applies

    class _Gpu:
        is_cpu = False
    monkeypatch.setattr(squeeze_ops, "applies", lambda dev, *a: real(_Gpu, *a))
    monkeypatch.setattr(squeeze_ops, "cpu_kernel", lambda dev: request.param == "cpu")
    return request.param


def _forward(nets, rng, n):
    shape = (n,) + tuple(nets[0].blobs["data"].shape[1:])
    x = rng.normal(0, 1, shape).astype(np.float32)
    for net in nets:
        if net.blobs["data"].shape[0] != n:
            net.blobs["data"].reshape(*shape)
            net.reshape()
        net.forward(data=x)


FORMS = {
    "onnx-silu-sigmoid": (CONVERTED, "gap -> fc1 -> f1_fc1_0_split -> a3_sig -> a3_mul -> fc2 -> gate", "gate"),
    "mobilenet-v3": (MOBILENET_V3, "gap -> fc1 -> r -> fc2 -> hs_aff -> hs_clip", "gate"),
    "caffe-senet": (SENET, "gap -> fc1 -> r1 -> fc2 -> sig", "fc2"),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_squeeze_in_one_launch(rng, form, kernel):
    text, layers, gate = FORMS[form]
    fused, plain = _nets(text, rng)
    (sq,) = [c for c in fused.plan.groups if isinstance(c, se_squeeze.SESqueeze)]
    assert sq.describe() == layers + " (SE squeeze in one launch)"
    taken = {li for c in fused.plan.groups for li in c.layers if c is not sq}
    assert not taken.intersection(sq.layers)          # its products' groups taken in
    for n in (2, 1, 5, 2):       # 5: past the kernel's images, the steps run
        _forward((fused, plain), rng, n)
        assert [ln.name for ln in sq.fwd] == [KERNEL_NAME[kernel]]
        assert (fused.blobs["gap"].compute_on_read is not None) == (n <= 4)
        _assert_blobs_equal(fused, plain, [gate, fused.outputs[0]])
        _assert_blobs_equal(fused, plain)
    with config.override(FUSE_SE_SQUEEZE=False):
        assert not any(isinstance(c, se_squeeze.SESqueeze)
                       for c in Net(parse_net_text(text), TEST).plan.groups)


def test_planned_at_a_big_batch(rng):
    """A net built at batch 8 (past the kernel's images; deploy prototxts
    say 10) takes the group, which runs the steps there and the kernel once
    reshaped to batch 1."""
    text = SENET.replace("dim: 2 dim: 12", "dim: 8 dim: 12")
    fused, plain = _nets(text, rng)
    (sq,) = [c for c in fused.plan.groups if isinstance(c, se_squeeze.SESqueeze)]
    for n in (8, 1):
        _forward((fused, plain), rng, n)
        assert (fused.blobs["gap"].compute_on_read is not None) == (n == 1)
        _assert_blobs_equal(fused, plain)


def test_not_applied():
    # a product's output also read elsewhere; a MAX pooling
    peek = SENET + ('layer { name: "peek" type: "Power" bottom: "gap" top: "peek" }\n')
    assert not any(isinstance(c, se_squeeze.SESqueeze)
                   for c in Net(parse_net_text(peek), TEST).plan.groups)
    mx = SENET.replace("pool: AVE", "pool: MAX")
    assert not any(isinstance(c, se_squeeze.SESqueeze)
                   for c in Net(parse_net_text(mx), TEST).plan.groups)


def test_the_rule(kernel, monkeypatch):
    """The setting, at most 4 images of at most 2^17 floats, channels and
    squeeze units that fit local memory (the GPU kernel's partial sums, the
    CPU's pooled vector and hidden units)."""
    if kernel == "cpu":
        pytest.skip("the rule once")
    monkeypatch.undo()              # the real cpu_kernel

    class Dev:
        is_cpu = False
    assert RULE(Dev, 1, 1152, 49, 48, 1152)
    assert RULE(Dev, 4, 32, 64 * 64, 8, 32)
    assert not RULE(Dev, 5, 32, 49, 8, 32)                 # images
    assert not RULE(Dev, 1, 32, 112 * 112, 8, 32)          # 401 K floats an image
    assert not RULE(Dev, 1, 8192, 1, 8, 8192)              # channels
    with config.override(FUSE_SE_SQUEEZE=False):
        assert not RULE(Dev, 1, 1152, 49, 48, 1152)
    assert not RULE(Dev, 1, 4096, 1, 1024, 4096)           # partial sums of 8 lanes
    Dev.is_cpu = True
    assert RULE(Dev, 1, 1152, 49, 48, 1152)
    assert RULE(Dev, 1, 4096, 1, 1024, 4096)               # 5 K floats of local
    assert not RULE(Dev, 1, 32, 112 * 112, 8, 32)
    assert not RULE(Dev, 5, 32, 49, 8, 32)
    with config.override(FUSE_SE_SQUEEZE=False):
        assert not RULE(Dev, 1, 1152, 49, 48, 1152)


def test_ranges_and_backward(rng):
    """Ranges cutting the group (Caffe SENet's form); a backward (the
    converted form, whose product groups keep every value) after the
    pending blobs are computed."""
    fused, plain = _nets(SENET, rng)
    _forward((fused, plain), rng, 2)
    for net in (fused, plain):
        net.forward(start="fc1", end="r1")
        net.forward(start="fc2")
    _assert_blobs_equal(fused, plain)
    text = (CONVERTED.replace('top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } }',
                              'top: "data" top: "t" input_param { shape { dim: 2 dim: 3 '
                              'dim: 6 dim: 5 } shape { dim: 2 dim: 5 } }')
            + 'layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "t" '
              'top: "loss" }\n')
    fused, plain = _nets(text, rng)
    assert any(isinstance(c, se_squeeze.SESqueeze) for c in fused.plan.groups)
    x, t = rng.normal(0, 1, (2, 3, 6, 5)).astype(np.float32), rng.normal(0, 1, (2, 5))
    for net in (fused, plain):
        net.forward(data=x, t=t.astype(np.float32))
    gf, gp = fused.backward(diffs=["data"]), plain.backward(diffs=["data"])
    np.testing.assert_allclose(gf["data"], gp["data"], rtol=1e-4, atol=1e-5)
    for name, blobs in plain.params.items():
        for a, b in zip(fused.params[name], blobs):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-5, err_msg=name)
    _assert_blobs_equal(fused, plain)
