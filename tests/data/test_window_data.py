"""WindowData (caffe_ocl/layers/window_data.py) on small images written
here: the window file's foreground/background split, background windows
first in a batch, the warped crops with context padding worked out by hand
from Caffe's window_data_layer.cpp, mirroring, mean and scale, and clear
errors for bad input."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.errors import CaffeOclError
from caffe_ocl.proto import parse_net_text

cv2 = pytest.importorskip("cv2")


def _image(h=40, w=40):
    """A 3-channel image whose pixels encode their position."""
    y, x = np.mgrid[:h, :w]
    return np.stack([(x * 5) % 256, (y * 5) % 256, (x + y) % 256], axis=2).astype(np.uint8)


def _files(tmp_path, windows, channels=3, extra=""):
    img = _image()
    cv2.imwrite(str(tmp_path / "a.png"), img)
    lines = ["# 0", "a.png", str(channels), "40", "40", str(len(windows))]
    lines += [" ".join(str(v) for v in w) for w in windows]
    (tmp_path / "windows.txt").write_text("\n".join(lines) + "\n" + extra)
    return img


def _net(tmp_path, batch=4, crop=10, pad=0, mode="warp", mirror=False, fg=0.5,
         mean="", scale=1.0):
    text = f"""
    layer {{ name: "data" type: "WindowData" top: "data" top: "label"
      window_data_param {{ source: "{tmp_path / 'windows.txt'}" root_folder: "{tmp_path}/"
        batch_size: {batch} fg_threshold: 0.6 bg_threshold: 0.4 fg_fraction: {fg}
        context_pad: {pad} crop_mode: "{mode}" scale: {scale} }}
      transform_param {{ crop_size: {crop} mirror: {str(mirror).lower()} {mean} }} }}
    """
    return caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)


def test_windows_cropped_in_batch_order(tmp_path):
    """Background windows (overlap 0.1, 0.3) and one foreground (class 3,
    overlap 0.9); a window of crop_size needs no warping. The overlap
    between the thresholds (0.5) is not used."""
    img = _files(tmp_path, [(7, 0.1, 0, 0, 9, 9), (3, 0.9, 10, 20, 19, 29),
                            (5, 0.5, 20, 20, 29, 29), (4, 0.3, 5, 5, 6, 6)])
    net = _net(tmp_path, batch=4)
    net.forward()
    data, label = net.blobs["data"].data, net.blobs["label"].data
    assert data.shape == (4, 3, 10, 10)
    np.testing.assert_array_equal(label, [0, 0, 3, 3])     # background first
    bg = img[0:10, 0:10].transpose(2, 0, 1)
    fg = img[20:30, 10:20].transpose(2, 0, 1)
    for i, want in enumerate([bg, bg, fg, fg]):
        # the background windows are 0,0-9,9 or 5,5-6,6 (warped), drawn at random
        if i < 2 and not np.array_equal(data[i], want):
            want = cv2.resize(img[5:7, 5:7], (10, 10)).transpose(2, 0, 1)
        np.testing.assert_array_equal(data[i], want)


def test_context_padding_clipped_at_the_border(tmp_path):
    """Window 0,0-9,9, crop 20, context_pad 5: expanded by 20/10 about its
    centre to -5..15 (21 px unclipped), clipped to 0..15 (16 px), warped
    to round(16 * 20/21) = 15 px at offset round(5 * 20/21) = 5; the 5
    leading rows and columns stay 0."""
    img = _files(tmp_path, [(2, 1.0, 0, 0, 9, 9), (0, 0.0, 0, 0, 9, 9)])
    net = _net(tmp_path, batch=2, crop=20, pad=5, fg=0.5)
    net.forward()
    fg = net.blobs["data"].data[1]
    assert net.blobs["label"].data[1] == 2
    want = cv2.resize(img[0:16, 0:16], (15, 15), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(fg[:, 5:, 5:], want.transpose(2, 0, 1))
    assert not fg[:, :5, :].any() and not fg[:, :, :5].any()


def test_square_mode_and_interior_context(tmp_path):
    """Window 14,16-21,19 (8 x 4), square: half sides 4, centre (18, 18);
    crop 16, pad 4 -> scale 2 -> 10..26 both ways (17 px), inside the
    image: warped whole to 16 x 16."""
    img = _files(tmp_path, [(1, 0.8, 14, 16, 21, 19)])
    net = _net(tmp_path, batch=1, crop=16, pad=4, mode="square", fg=1.0)
    net.forward()
    want = cv2.resize(img[10:27, 10:27], (16, 16), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(net.blobs["data"].data[0], want.transpose(2, 0, 1))


def test_mirror_mean_and_scale(tmp_path):
    img = _files(tmp_path, [(1, 0.9, 10, 20, 19, 29)])
    net = _net(tmp_path, batch=8, fg=1.0, mirror=True, scale=0.5,
               mean="mean_value: 10 mean_value: 20 mean_value: 30")
    crop = img[20:30, 10:20].transpose(2, 0, 1).astype(np.float32)
    mean = np.array([10, 20, 30], np.float32)[:, None, None]
    plain, flipped = (crop - mean) * 0.5, (crop[:, :, ::-1] - mean) * 0.5
    seen = set()
    for _ in range(4):
        net.forward()
        for x in net.blobs["data"].data:
            if np.array_equal(x, plain):
                seen.add("plain")
            else:
                np.testing.assert_array_equal(x, flipped)
                seen.add("flipped")
    assert seen == {"plain", "flipped"}


def test_mean_file_centred(tmp_path):
    img = _files(tmp_path, [(1, 0.9, 10, 20, 19, 29)])
    mean = np.random.default_rng(0).uniform(0, 50, (1, 3, 14, 14)).astype(np.float32)
    _write_mean(mean, tmp_path)
    net = _net(tmp_path, batch=1, fg=1.0, mean=f'mean_file: "{tmp_path / "mean.binaryproto"}"')
    net.forward()
    want = img[20:30, 10:20].transpose(2, 0, 1) - mean[0, :, 2:12, 2:12]
    np.testing.assert_allclose(net.blobs["data"].data[0], want, rtol=1e-6)


def _write_mean(mean, tmp_path):
    blob = caffe_ocl.io.array_to_blobproto(mean)
    (tmp_path / "mean.binaryproto").write_bytes(blob.SerializeToString())


@pytest.mark.parametrize("windows,extra,msg", [
    ([(0, 0.9, 0, 0, 9, 9)], "", "foreground classes must be > 0"),
    ([(1, 0.9, 0, 0, 9, 9)], "# 1 a.png 3 40", "ends early"),
    ([(1, 0.9, 0, 0, 9, 9)], "# 5 a.png 3 40 40 0", "image index 5"),
    ([(1, 0.9, 0, 0, 9, 9)], "oops", "expected '#'"),
    ([(1, 0.9, 0, 0, 9, 9)], "# 1 a.png 3 forty 40 0", "expected height"),
    ([(1, 0.9, 0, 0, 9, 9)], "", "no background windows"),
])
def test_bad_window_files_are_named(tmp_path, windows, extra, msg):
    _files(tmp_path, windows, extra=extra)
    with pytest.raises(CaffeOclError) as e:
        _net(tmp_path, batch=2)
    assert msg in str(e.value) and "windows.txt" in str(e.value)


def test_missing_image_and_window_outside(tmp_path):
    _files(tmp_path, [(1, 0.9, 30, 30, 45, 45)])
    net = _net(tmp_path, batch=1, fg=1.0)
    with pytest.raises(CaffeOclError, match="lies outside the image"):
        net.forward()
    _files(tmp_path, [(1, 0.9, 0, 0, 9, 9)])
    (tmp_path / "a.png").unlink()
    net = _net(tmp_path, batch=1, fg=1.0)
    with pytest.raises(CaffeOclError, match="a.png"):
        net.forward()


def test_setup_errors(tmp_path):
    _files(tmp_path, [(1, 0.9, 0, 0, 9, 9), (0, 0.1, 0, 0, 9, 9)])
    with pytest.raises(CaffeOclError, match="crop_size must be positive"):
        _net(tmp_path, crop=0)
    with pytest.raises(CaffeOclError, match="window file .* not found"):
        (tmp_path / "windows.txt").unlink()
        _net(tmp_path)


def test_mirrored_window_mirrors_its_padding(tmp_path):
    """The clipped window above, mirrored: Caffe puts the (mirrored) warped
    part at the left edge and the zero band at the right."""
    img = _files(tmp_path, [(2, 1.0, 0, 0, 9, 9)])
    net = _net(tmp_path, batch=8, crop=20, pad=5, fg=1.0, mirror=True)
    warped = cv2.resize(img[0:16, 0:16], (15, 15)).transpose(2, 0, 1)
    seen = set()
    for _ in range(3):
        net.forward()
        for x in net.blobs["data"].data:
            if x[:, :, :5].any():                    # mirrored
                np.testing.assert_array_equal(x[:, 5:, :15], warped[:, :, ::-1])
                assert not x[:, :, 15:].any()
                seen.add("mirrored")
            else:
                np.testing.assert_array_equal(x[:, 5:, 5:], warped)
                seen.add("plain")
    assert seen == {"plain", "mirrored"}


def test_legacy_fields_in_window_data_param(tmp_path):
    """A layer { } net with crop_size in window_data_param: Caffe reads it
    from transform_param only, so the error says to move it."""
    _files(tmp_path, [(1, 0.9, 0, 0, 9, 9), (0, 0.1, 0, 0, 9, 9)])
    text = f"""
    layer {{ name: "data" type: "WindowData" top: "data" top: "label"
      window_data_param {{ source: "{tmp_path / 'windows.txt'}" root_folder: "{tmp_path}/"
        batch_size: 2 crop_size: 10 mirror: true }} }}"""
    with pytest.raises(CaffeOclError, match="crop_size, mirror: Caffe reads these from "
                                            "transform_param"):
        caffe_ocl.Net(parse_net_text(text), caffe_ocl.TRAIN)


def test_v1_net_upgraded(tmp_path):
    """A V1 net (R-CNN's era) keeps crop_size in window_data_param; the
    upgrade moves it to transform_param, as Caffe's does."""
    _files(tmp_path, [(1, 0.9, 0, 0, 9, 9), (0, 0.1, 0, 0, 9, 9)])
    path = tmp_path / "v1.prototxt"
    path.write_text(f"""
    layers {{ name: "data" type: WINDOW_DATA top: "data" top: "label"
      window_data_param {{ source: "{tmp_path / 'windows.txt'}" root_folder: "{tmp_path}/"
        batch_size: 2 crop_size: 10 fg_fraction: 0.5 }} }}""")
    net = caffe_ocl.Net(str(path), caffe_ocl.TRAIN)
    net.forward()
    assert net.blobs["data"].data.shape == (2, 3, 10, 10)
    np.testing.assert_array_equal(net.blobs["label"].data, [0, 1])
