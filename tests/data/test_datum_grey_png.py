"""Encoded grey (1-channel) PNG Datums: native decoding (Caffe's
DecodeDatumToCVMatNative) keeps 1 channel; DecodeDatumToCVMat with
is_color true gives 3 equal channels, with is_color false 1; the Data
layer's top follows (issue #25: a 3-channel native decode passed every test)."""
import cv2
import lmdb
import numpy as np
import pytest

from caffe_ocl.data.datum import decode_datum
from caffe_ocl.proto import caffe_pb2
from caffe_ocl.testing import forward, make_layer


@pytest.fixture
def grey(rng):
    return rng.integers(0, 256, (5, 7), dtype=np.uint8)


def png_datum(img, label=1):
    ok, buf = cv2.imencode(".png", img)
    assert ok
    d = caffe_pb2.Datum(data=buf.tobytes(), encoded=True, label=label)
    parsed = cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_UNCHANGED)
    assert parsed.ndim == img.ndim      # the PNG really is 1 channel (or 3)
    return d


def test_native_decode_keeps_one_channel(grey):
    out = decode_datum(png_datum(grey), "t")
    assert out.shape == (1, 5, 7)
    np.testing.assert_array_equal(out[0], grey)


def test_is_color_true_gives_three_equal_channels(grey):
    out = decode_datum(png_datum(grey), "t", is_color=True)
    assert out.shape == (3, 5, 7)
    for c in range(3):
        np.testing.assert_array_equal(out[c], grey)


def test_is_color_false_gives_one_channel(grey, rng):
    np.testing.assert_array_equal(decode_datum(png_datum(grey), "t", is_color=False),
                                  grey[None])
    color = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    d = png_datum(color)
    out = decode_datum(d, "t", is_color=False)
    assert out.shape == (1, 5, 7)
    # OpenCV's own grey decode of the PNG (as Caffe's cv::imdecode)
    np.testing.assert_array_equal(
        out[0], cv2.imdecode(np.frombuffer(d.data, np.uint8), cv2.IMREAD_GRAYSCALE))
    # native: a colour PNG stays BGR, 3 channels
    np.testing.assert_array_equal(decode_datum(png_datum(color), "t"),
                                  color.transpose(2, 0, 1))


@pytest.mark.parametrize("transform,channels", [("", 1), ("force_color: true", 3)])
def test_data_layer_top_of_a_grey_png_db(tmp_path, grey, transform, channels):
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"0", png_datum(grey).SerializeToString())
    env.close()
    layer, b, t = make_layer(
        f'type: "Data" top: "x" top: "y" transform_param {{ {transform} }} '
        f'data_param {{ source: "{tmp_path}/db" backend: LMDB batch_size: 2 }}', [],
    )
    x, y = forward(layer, b, t)
    assert x.shape == (2, channels, 5, 7)
    for c in range(channels):
        np.testing.assert_array_equal(x[0, c], grey)
        np.testing.assert_array_equal(x[1, c], grey)
    np.testing.assert_array_equal(y, [1, 1])
    layer.close()
