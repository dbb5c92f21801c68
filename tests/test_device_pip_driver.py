"""caffe_ocl registers the CPU OpenCL driver of the `[cpu]` extra (Intel's
intel-opencl-rt from PyPI) when no driver is registered system-wide."""
import os

from caffe_ocl import device as D


def _fake_prefix(tmp_path):
    lib = tmp_path / "venv" / "lib"
    lib.mkdir(parents=True)
    (lib / "libintelocl.so").write_bytes(b"")
    return str(tmp_path / "venv"), str(lib / "libintelocl.so")


def test_pip_cpu_driver_found_under_prefix(tmp_path):
    prefix, lib = _fake_prefix(tmp_path)
    assert D.pip_cpu_driver([str(tmp_path / "nothing"), prefix]) == lib
    assert D.pip_cpu_driver([str(tmp_path / "nothing")]) is None


def test_registered_when_no_icd_is_visible(tmp_path):
    _, lib = _fake_prefix(tmp_path)
    empty = tmp_path / "vendors"
    empty.mkdir()
    (empty / "README").write_text("not an icd")
    env = {"OCL_ICD_VENDORS": str(empty)}
    assert D.register_pip_cpu_driver(env, lib=lib) == lib
    assert env["OCL_ICD_VENDORS"] == lib
    # a vendor folder that does not exist counts as empty
    env = {"OPENCL_VENDOR_PATH": str(tmp_path / "missing")}
    assert D.register_pip_cpu_driver(env, lib=lib) == lib and env["OCL_ICD_VENDORS"] == lib


def test_left_alone_when_a_driver_is_registered(tmp_path):
    _, lib = _fake_prefix(tmp_path)
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2\n")
    env = {"OCL_ICD_VENDORS": str(vendors)}
    assert D.register_pip_cpu_driver(env, lib=lib) is None
    assert env == {"OCL_ICD_VENDORS": str(vendors)}
    # OCL_ICD_VENDORS naming one driver file: the user's choice stands
    env = {"OCL_ICD_VENDORS": lib}
    assert D.register_pip_cpu_driver(env, lib=str(tmp_path / "other.so")) is None
    assert env["OCL_ICD_VENDORS"] == lib


def test_nothing_to_register_without_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "pip_cpu_driver", lambda prefixes=None: None)
    env = {"OCL_ICD_VENDORS": str(tmp_path)}
    assert D.register_pip_cpu_driver(env) is None
    assert env == {"OCL_ICD_VENDORS": str(tmp_path)}
    assert os.path.isdir(str(tmp_path))
