"""xavier and msra with each variance_norm on a blob whose fan_in and
fan_out differ a lot: xavier's uniform limit sqrt(3 / n) is matched from
both sides (the largest |value| within 1% below it, never above), msra's
std sqrt(2 / n) within 5%, where n is fan_in, fan_out or their mean
(AVERAGE). The tolerances separate the three norms, so computing one as
another fails (issue #25: AVERAGE computed as fan_out passed an
upper-bound-only test)."""
import numpy as np
import pytest

from caffe_ocl.testing import forward, make_layer

SHAPE = (40, 8, 3, 3)                # count 2880
FAN_IN = 8 * 3 * 3                   # 72
FAN_OUT = 40 * 3 * 3                 # 360
N = {"FAN_IN": FAN_IN, "FAN_OUT": FAN_OUT, "AVERAGE": (FAN_IN + FAN_OUT) / 2}


def filled(filler):
    dims = " ".join(f"dim: {d}" for d in SHAPE)
    layer, b, t = make_layer(f'type: "DummyData" dummy_data_param {{ shape {{ {dims} }} '
                             f'data_filler {{ {filler} }} }}', [])
    (a,) = forward(layer, b, t)
    assert a.shape == SHAPE
    return a.astype(np.float64)


def test_the_norms_are_told_apart():
    # the tolerances below only mean something if the norms' values differ
    lim = {k: np.sqrt(3 / n) for k, n in N.items()}
    for a in lim:
        for b in lim:
            if a != b:
                assert not 0.99 * lim[a] <= lim[b] <= lim[a] * (1 + 1e-6)
    std = {k: np.sqrt(2 / n) for k, n in N.items()}
    for a in std:
        for b in std:
            if a != b:
                assert abs(std[b] / std[a] - 1) > 0.1


@pytest.mark.parametrize("norm", sorted(N))
def test_xavier_limit(norm):
    a = filled(f'type: "xavier" variance_norm: {norm}')
    limit = np.sqrt(3.0 / N[norm])
    top = np.abs(a).max()
    # 2880 uniform draws: max |x| < 0.99 * limit has probability 0.99^2880 ~ 3e-13
    assert 0.99 * limit <= top <= limit * (1 + 1e-6), (norm, top, limit)
    assert abs(a.var() / (limit ** 2 / 3) - 1) < 0.1


@pytest.mark.parametrize("norm", sorted(N))
def test_msra_std(norm):
    a = filled(f'type: "msra" variance_norm: {norm}')
    std = np.sqrt(2.0 / N[norm])
    assert abs(a.std() / std - 1) < 0.05, (norm, a.std(), std)
    assert abs(a.mean()) < 0.1 * std
