"""ops/channel.py affine (Scale / Bias layers' y = x * scale[d] + bias[d]
over outer x D x inner) against float64 NumPy, with shapes whose work
chunks start and end inside a channel's run, span several channels and
wrap from the last channel to the next outer index (CPU drivers walk each
chunk run by run: chan_affine_runs), for each choice of terms and in place."""
import numpy as np
import pytest

from caffe_ocl.ops import channel

# O, D, I: one tiny run; SE-style planes (112 x 112, 7 x 7); many short
# runs per chunk; a run longer than a chunk; inner 1 (one channel per element)
SHAPES = [(1, 3, 5), (1, 32, 112 * 112), (2, 40, 49), (3, 7, 1000), (2, 9000, 1),
          (4, 5, 37 * 41)]


@pytest.mark.parametrize("O,D,I", SHAPES)
@pytest.mark.parametrize("terms", ["scale", "bias", "both"])
def test_affine_matches_numpy(d, rng, O, D, I, terms):
    x = rng.standard_normal((O, D, I))
    s = rng.standard_normal(D) if terms in ("scale", "both") else None
    b = rng.standard_normal(D) if terms in ("bias", "both") else None
    want = x.copy()
    if s is not None:
        want = want * s[None, :, None]
    if b is not None:
        want = want + b[None, :, None]
    xb = d.buf(x)
    yb = d.buf(np.full(x.shape, np.nan))
    d.run([channel.affine(d.dev, O, D, I, xb, yb,
                          scale=None if s is None else d.buf(s),
                          bias=None if b is None else d.buf(b))])
    np.testing.assert_allclose(d.get(yb, x.shape), want, rtol=1e-5, atol=1e-6)


def test_affine_in_place(d, rng):
    O, D, I = 2, 24, 300
    x = rng.standard_normal((O, D, I))
    s, b = rng.standard_normal(D), rng.standard_normal(D)
    xb = d.buf(x)
    d.run([channel.affine(d.dev, O, D, I, xb, xb, scale=d.buf(s), bias=d.buf(b))])
    np.testing.assert_allclose(d.get(xb, x.shape), x * s[None, :, None] + b[None, :, None],
                               rtol=1e-5, atol=1e-6)
