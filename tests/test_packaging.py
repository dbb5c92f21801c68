"""Package metadata (issue #26): what `pip show caffe_ocl` and PyPI show."""
import pytest

from conftest import ROOT

tomllib = pytest.importorskip("tomllib")      # Python 3.11+


@pytest.fixture(scope="module")
def project():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def test_metadata_complete(project):
    for key in ("description", "authors", "keywords", "classifiers", "urls", "license"):
        assert project.get(key), key
    assert "License :: OSI Approved :: BSD License" in project["classifiers"]
    assert project["license"]["text"] == "BSD-2-Clause"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 2-Clause License") and "Redistributions in binary form" in text
    for url in project["urls"].values():
        assert url.startswith("https://")


def test_extras(project):
    """Tests run on the OpenCV a plain install brings; the OpenCV-4-only
    comparison (cv2.dnn.readNetFromCaffe) has its own extra."""
    extras = project["optional-dependencies"]
    assert not any(r.startswith("opencv") for r in extras["test"])
    assert extras["compare"] == ["opencv-python-headless>=4.5,<5"]
    for name in ("onnx", "draw", "hdf5", "mpi", "progress"):
        assert name in extras
