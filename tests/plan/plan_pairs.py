"""Helpers shared by the tests that compare a net run through a plan
rewrite with the same net unrewritten (test_concat_gather, test_residual)."""
import numpy as np


def assert_same_bits(a, b, skip=(), zero_sign=True):
    """Every blob of ``b`` (but ``skip``) has the same bits in ``a``;
    ``zero_sign=False``: -0.0 and +0.0 count as the same (a GEMM turns a
    -0.0 input into +0.0 where a copy keeps it)."""
    for name in b.blobs:
        if name in skip:
            continue
        x, y = a.blobs[name].data, b.blobs[name].data
        assert x.shape == y.shape, name
        if not zero_sign:
            x, y = np.where(x == 0, 0, x), np.where(y == 0, 0, y)
        np.testing.assert_array_equal(x.view(np.int32), y.view(np.int32), err_msg=name)


def same_random_weights(nets, seed, batchnorm=(), scale_factor=1.0):
    """The same random parameters in every net of ``nets`` (built from one
    prototxt): N(0, 0.5), but for the BatchNorm layers named in
    ``batchnorm`` a random mean, a variance in [0.5, 2) and a scale factor
    of ``scale_factor``."""
    nets = list(nets)
    rng = np.random.default_rng(seed)
    for name, blobs in nets[0].params.items():
        for k, b in enumerate(blobs):
            if name in batchnorm:
                v = [rng.normal(0, 0.5, b.shape), rng.uniform(0.5, 2, b.shape),
                     np.full(b.shape, scale_factor)][k]
            else:
                v = rng.normal(0, 0.5, b.shape)
            for net in nets:
                net.params[name][k].data[...] = v


def forward_reshaped(nets, x):
    """Each net's "data" reshaped to ``x``'s shape, then a forward on ``x``."""
    for net in nets:
        net.blobs["data"].reshape(*x.shape)
        net.reshape()
        net.forward(data=x)


def assert_same_backward(fused, plain, top="out"):
    """A backward from a diff of ones at ``top`` gives the same input and
    parameter gradients in both nets (the rewrite computes the blobs it
    left pending first)."""
    for net in (fused, plain):
        net.blobs[top].diff[...] = 1.0
    gf, gp = fused.backward(diffs=["data"]), plain.backward(diffs=["data"])
    np.testing.assert_allclose(gf["data"], gp["data"], rtol=1e-4, atol=1e-5)
    for name, blobs in plain.params.items():
        for a, b in zip(fused.params[name], blobs):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-4, atol=1e-5, err_msg=name)


def nets_with_and_without(text, setting):
    """(net with the rewrite ``setting`` on, the same net with it off), TEST
    phase, from prototxt ``text`` (test_row_reduce, test_matmul_operands,
    test_slice_concat)."""
    from caffe_ocl import config
    from caffe_ocl.net import Net, TEST
    from caffe_ocl.proto import parse_net_text
    with config.override(**{setting: True}):
        on = Net(parse_net_text(text), TEST)
    with config.override(**{setting: False}):
        off = Net(parse_net_text(text), TEST)
    return on, off


def layer_text(name, type_, bottoms, tops, param=""):
    """One prototxt layer; ``tops`` a name or a list of names."""
    tops = [tops] if isinstance(tops, str) else tops
    bs = " ".join(f'bottom: "{b}"' for b in bottoms)
    ts = " ".join(f'top: "{t}"' for t in tops)
    return f'layer {{ name: "{name}" type: "{type_}" {bs} {ts} {param} }}\n'
