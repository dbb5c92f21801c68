"""caffe_ocl.config: one declaration and one parser for every setting."""
import pytest

from caffe_ocl import config


def test_bool_spellings_and_default():
    for raw in ("1", "true", "YES", " on "):
        assert config.get("FOLD", environ={"CAFFE_OCL_FOLD": raw}) is True
    for raw in ("0", "False", "no", "OFF"):
        assert config.get("FOLD", environ={"CAFFE_OCL_FOLD": raw}) is False
    assert config.get("FOLD", environ={}) is True
    assert config.get("FOLD", environ={"CAFFE_OCL_FOLD": ""}) is True


def test_bad_value_names_the_variable():
    with pytest.raises(config.ConfigError, match="CAFFE_OCL_WINOGRAD='maybe'"):
        config.get("WINOGRAD", environ={"CAFFE_OCL_WINOGRAD": "maybe"})
    with pytest.raises(config.ConfigError, match="one of 2, 4"):
        config.get("WINOGRAD_TILE", environ={"CAFFE_OCL_WINOGRAD_TILE": "3"})
    with pytest.raises(config.ConfigError, match="unknown setting"):
        config.get("NO_SUCH_THING")


def test_tristate_and_empty_path():
    assert config.get("WINOGRAD", environ={}) is None
    assert config.get("WINOGRAD", environ={"CAFFE_OCL_WINOGRAD": "1"}) is True
    assert config.get("CACHE", environ={"CAFFE_OCL_CACHE": ""}) == ""
    assert config.get("BUCKET_MB", environ={"CAFFE_OCL_BUCKET_MB": "0.5"}) == 0.5


def test_override_beats_environment_and_is_restored(monkeypatch):
    monkeypatch.setenv("CAFFE_OCL_FOLD", "0")
    assert config.get("FOLD") is False
    with config.override(FOLD=True, WINOGRAD_TILE=2):
        assert config.get("FOLD") is True
        assert config.get("WINOGRAD_TILE") == "2"
        assert config.is_set("FOLD")
    assert config.get("FOLD") is False
    assert config.get("WINOGRAD_TILE") == "4"


def test_describe_lists_every_public_setting():
    rows = config.describe()
    names = {r[0] for r in rows}
    assert {"CAFFE_OCL_FOLD", "CAFFE_OCL_DEVICE", "CAFFE_OCL_TF32"} <= names
    assert "CAFFE_OCL_SPAWNED" not in names
    assert all(r[3] for r in rows)          # every setting says what it does
    assert "CAFFE_OCL_FOLD" in config.format_table(rows)
