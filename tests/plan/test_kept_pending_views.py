"""A host view of a blob the plan leaves to be computed on read (pycaffe's
``feat = net.blobs['conv1'].data`` kept across forwards) shows each
forward's value, as pycaffe's views of the blob's memory do: the TEST
folding's elided tops, Concat slices and chains with new tops."""
import numpy as np
import pytest

from caffe_ocl.net import Net, TEST
from caffe_ocl.proto import parse_net_text
from test_concat_in_place import INCEPTION
from test_swish_fusion import CONVERTED

ELIDED = """name: "k"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "r" type: "ReLU" bottom: "c" top: "r" }
layer { name: "c2" type: "Convolution" bottom: "r" top: "out"
        convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "gaussian" std: 1 } } }
"""


@pytest.mark.parametrize("text,names", [(ELIDED, ["c"]), (INCEPTION, ["b1", "b2", "b2r"]),
                                        (CONVERTED, ["c1", "a1_s", "c2", "f2"])],
                         ids=["elided", "concat", "silu"])
def test_kept_views_of_pending_blobs_follow_each_forward(text, names, rng):
    folded = Net(parse_net_text(text), TEST, fold=True)
    plain = Net(parse_net_text(text), TEST, fold=False)
    for name, blobs in plain.params.items():
        for a, b in zip(folded.params[name], blobs):
            a.data[...] = b.data
    views = {n: (folded.blobs[n].data, plain.blobs[n].data) for n in names}
    shape = folded.blobs["data"].shape
    for k in range(4):
        x = rng.normal(0, 1, shape).astype(np.float32)
        for net in (folded, plain):
            net.blobs["data"].data[...] = x
            net.forward()
        for n, (fv, pv) in views.items():
            np.testing.assert_allclose(fv, pv, rtol=1e-4, atol=1e-5, err_msg=f"{n} pass {k}")
