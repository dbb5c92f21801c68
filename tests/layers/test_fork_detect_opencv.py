"""R-FCN's PSROIPooling against OpenCV 4's Caffe importer on the same
prototxt and inputs. (OpenCV's caffe.proto has no reorg_param, so a Caffe
Reorg layer does not load there: no comparison for it.)"""
import numpy as np

import caffe_ocl
from conftest import opencv_with_caffe_importer

cv2 = opencv_with_caffe_importer()   # skips the module without one


def test_psroi_pooling_matches_opencv(rng, tmp_path):
    dim, g, h, w = 2, 3, 12, 10
    proto = f'''name: "rfcn_head"
input: "feat" input_shape {{ dim: 1 dim: {dim * g * g} dim: {h} dim: {w} }}
input: "rois" input_shape {{ dim: 4 dim: 5 }}
layer {{ name: "psroi" type: "PSROIPooling" bottom: "feat" bottom: "rois" top: "psroi"
  psroi_pooling_param {{ spatial_scale: 0.25 output_dim: {dim} group_size: {g} }} }}
'''
    path = tmp_path / "net.prototxt"
    path.write_text(proto)
    feat = rng.standard_normal((1, dim * g * g, h, w)).astype(np.float32)
    rois = np.array([[0, 0, 0, 39, 47], [0, 5, 6, 20, 30], [0, 12, 3, 13, 4],
                     [0, -8, -8, 10, 6]], np.float32)
    cvnet = cv2.dnn.readNetFromCaffe(str(path))
    cvnet.setInput(feat, "feat")
    cvnet.setInput(rois, "rois")
    cv_o = cvnet.forward("psroi")
    net = caffe_ocl.Net(str(path), caffe_ocl.TEST)
    net.blobs["feat"].data[...] = feat
    net.blobs["rois"].data[...] = rois
    net.forward()
    o = net.blobs["psroi"].data
    assert cv_o.shape == o.shape == (4, dim, g, g)
    np.testing.assert_allclose(o, cv_o, rtol=1e-5, atol=1e-5)
