"""The SE squeeze kernels (kernels/se_squeeze.cl through ops/se_squeeze.py):
mean over each plane -> product + activation -> product + activation, for
both the GPU's work-groups and the CPU drivers' se_squeeze_cpu, against a
float64 reference at sizes that leave tails everywhere (channels, planes,
hidden units and outputs not multiples of 4 or 8; a plane under one
vector), with and without biases, several images. The plan's rewrite is
tests/plan/test_se_squeeze.py."""
import numpy as np
import pytest

from caffe_ocl.ops import se_squeeze as squeeze_ops
from refs import rel_err

SIZES = [  # (n, c, hw, s, co)
    (1, 13, 50, 5, 13),
    (2, 24, 7, 6, 24),       # planes under 8 floats
    (3, 9, 49, 1, 11),       # one hidden unit, outputs != channels
    (1, 40, 196, 10, 40),
]


@pytest.mark.parametrize("kernel", ["gpu", "cpu"])
@pytest.mark.parametrize("size", SIZES, ids=[str(s) for s in SIZES])
def test_squeeze_kernel(d, rng, monkeypatch, kernel, size):
    n, c, hw, s, co = size
    monkeypatch.setattr(squeeze_ops, "cpu_kernel", lambda dev: kernel == "cpu")
    x = rng.standard_normal((n, c, hw))
    w1, b1 = rng.standard_normal((s, c)), rng.standard_normal(s)
    w2, b2 = rng.standard_normal((co, s)), rng.standard_normal(co)
    for bias in (True, False):
        h = x.mean(axis=2) @ w1.T + (b1 if bias else 0)
        h = np.maximum(h, 0)                                   # ReLU
        g = h @ w2.T + (b2 if bias else 0)
        want = 1 / (1 + np.exp(-g))                            # Sigmoid
        y = d.buf(np.full((n, co), np.nan))
        ln = squeeze_ops.forward(d.dev, n, c, hw, s, co, d.buf(x), d.buf(w1),
                                 d.buf(b1) if bias else None, ("relu", 0.0), d.buf(w2),
                                 d.buf(b2) if bias else None, ("sigmoid",), y)
        assert ln.name == ("se_squeeze_cpu" if kernel == "cpu" else "se_squeeze")
        d.run([ln])
        assert rel_err(d.get(y, (n, co)), want) < 1e-5, bias
