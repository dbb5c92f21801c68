"""OpenCV's own log lines stay out of caffe_ocl's error messages (issue #26)."""
import pytest

from caffe_ocl.data.datum import opencv_quiet, read_image
from caffe_ocl.errors import DataError

cv2 = pytest.importorskip("cv2")


def test_missing_image_gives_one_message_without_opencv_warnings(tmp_path, capfd):
    bad = tmp_path / "not_an_image.jpg"
    bad.write_text("hello")
    with pytest.raises(DataError, match="image .*missing.jpg not found"):
        read_image(str(tmp_path / "missing.jpg"), where="convert_imageset")
    with pytest.raises(DataError, match="could not open or decode image"):
        read_image(str(bad), where="convert_imageset")
    err = capfd.readouterr().err
    assert "WARN" not in err and "findDecoder" not in err


def test_opencv_log_level_is_restored():
    lg = cv2.utils.logging
    before = lg.getLogLevel()
    with opencv_quiet(cv2):
        assert lg.getLogLevel() == lg.LOG_LEVEL_ERROR
    assert lg.getLogLevel() == before
