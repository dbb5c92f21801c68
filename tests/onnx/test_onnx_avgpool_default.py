"""onnx2caffe's AveragePool without a count_include_pad attribute: ONNX's
default is 0 (padding excluded from the divisor), which Caffe's AVE
pooling (padding counted inside the padded image) needs a correction for
(issue #25: the tests always set the attribute, so a converter assuming
the default 1 passed)."""
import numpy as np
import onnxruntime as ort
import pytest

from onnx_helpers import check_onnx, make_model, node, rand


def exclude_pad_average(x, k, s, p):
    """float64 reference: mean over the window's real (unpadded) pixels."""
    n, c, h, w = x.shape
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = np.empty((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            hs, ws = i * s - p, j * s - p
            win = x[:, :, max(hs, 0):min(hs + k, h), max(ws, 0):min(ws + k, w)]
            out[:, :, i, j] = win.astype(np.float64).mean(axis=(2, 3))
    return out


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (2, 2, 1)])
def test_average_pool_default_attributes(k, s, p):
    x = rand(2, 3, 6, 5)
    m = make_model([node("AveragePool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s],
                         pads=[p] * 4)], {"x": x.shape}, ["y"])
    attrs = {a.name for a in m.graph.node[0].attribute}
    assert "count_include_pad" not in attrs           # the default is what is tested
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (y_ort,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y_ort, exclude_pad_average(x, k, s, p), rtol=1e-5, atol=1e-6)
    # ...and the border windows really differ from a padded-count average
    assert not np.allclose(y_ort[:, :, 0, 0], x[:, :, :k - p, :k - p].sum(axis=(2, 3)) / k ** 2)
    net = check_onnx(m, tol=1e-5, inputs={"x": x})     # caffe_ocl vs onnxruntime
    assert "Scale" in [lp.type for lp in net.layer]    # the per-window divisor fix
    # a constant of the conversion: training the net leaves it alone
    (fix,) = [lp for lp in net.layer if lp.type == "Scale"]
    assert [(ps.lr_mult, ps.decay_mult) for ps in fix.param] == [(0.0, 0.0)]
