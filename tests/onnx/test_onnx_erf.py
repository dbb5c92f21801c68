"""ONNX Erf and Gelu in standard Caffe layers (caffe_ocl/onnx/_erf.py):
Abramowitz & Stegun 7.1.26 (error <= 1.5e-7) written as AbsVal, Power,
Eltwise, Exp (and TanH for Gelu's tanh form), against float64 erf and
ONNX Runtime; PyTorch's GELU export (Div -> Erf -> Add -> Mul -> Mul)
converts through the generic Erf."""
import math

import numpy as np
import pytest

from caffe_ocl.onnx import check, to_caffe
from onnx_helpers import make_model, node

BVLC = {"Input", "AbsVal", "Power", "Eltwise", "Exp", "TanH", "Split"}


def _x():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 2, 200), np.linspace(-6, 6, 241),
                        [0.0, 1e-30, -1e-30, 1e-10, -1e-10, 1e-3, -1e-3, 50.0, -50.0, 1e4]])
    return x.astype(np.float32).reshape(1, 1, 1, -1)


def _run(model, x):
    net_param = to_caffe.convert(model)
    assert {lp.type for lp in net_param.layer} <= BVLC, [lp.type for lp in net_param.layer]
    got = check.run_caffe(net_param, {"x": x})
    return {k: np.asarray(v, np.float64) for k, v in got.items()}


def _erf64(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


def test_erf_within_a_few_float32_steps_of_float64():
    """Absolute error <= 5e-7: 7.1.26's 1.5e-7 and float32's rounding of
    1 - r (r near 1 for small x, so the error is absolute, not relative:
    erf(0.04) = 0.045 is off by up to 3.4e-7 on PoCL), plus the 3 ulp that
    OpenCL allows exp() (NVIDIA's driver: 4.2e-7 at x = -0.043)."""
    x = _x()
    got = _run(make_model([node("Erf", ["x"], ["y"])], {"x": x.shape}, ["y"]), x)["y"]
    err = np.abs(got - _erf64(x))
    assert err.max() <= 5e-7, (err.max(), x.ravel()[err.argmax()])
    assert np.all(got[x == 0] == 0) and np.all(got[x > 0] >= 0) and np.all(got[x < 0] <= 0)
    assert np.all(got[np.abs(x) >= 6] == np.sign(x[np.abs(x) >= 6]))


def _gelu64(x, tanh=False):
    x = x.astype(np.float64)
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf64(x / math.sqrt(2)))


def _check_gelu(got, x, tanh=False):
    want = _gelu64(x, tanh)
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    assert err.max() <= 4e-7, (err.max(), x.ravel()[err.argmax()])


def test_gelu_as_pytorch_exports_it():
    """x * 0.5 * (1 + erf(x / sqrt 2)) at opset 13 (torch.nn.GELU)."""
    x = _x()
    nodes = [node("Div", ["x", "s2"], ["d"]), node("Erf", ["d"], ["e"]),
             node("Add", ["e", "one"], ["a"]), node("Mul", ["x", "a"], ["m"]),
             node("Mul", ["m", "half"], ["y"])]
    inits = {"s2": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    got = _run(make_model(nodes, {"x": x.shape}, ["y"], inits), x)["y"]
    _check_gelu(got, x)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_op(approximate):
    x = _x()
    m = make_model([node("Gelu", ["x"], ["y"], approximate=approximate)], {"x": x.shape},
                   ["y"], opset=20)
    got = _run(m, x)["y"]
    _check_gelu(got, x, tanh=approximate == "tanh")
    # and as ONNX Runtime computes it
    report = check.compare(m, to_caffe.convert(m), inputs={"x": x})
    for diff, scale in report.values():
        assert diff <= 1e-6 * max(scale, 1.0)


def test_gelu_unknown_approximation_is_refused():
    from caffe_ocl.onnx._common import OnnxConversionError
    m = make_model([node("Gelu", ["x"], ["y"], approximate="cubic")], {"x": (1, 4)},
                   ["y"], opset=20)
    with pytest.raises(OnnxConversionError, match="approximate"):
        to_caffe.convert(m)
