"""Nonsense command-line values through the real commands (issue #25):
each ends in exit 0, or exit 1 with the error as the one last stderr line;
never a traceback, a signal or a run without end. Each case here broke
before (a traceback, or --iterations 10^20 running forever)."""
import resource
import subprocess
import sys

import pytest

import fuzzing_more
from conftest import child_env

CHILD_MEMORY = 6 << 30


def _limit_child():
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def caffe_ocl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "caffe_ocl", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=child_env(),
                          preexec_fn=_limit_child, cwd=cwd)


def error_line(p):
    """The one error line of a failed command (exit 1, no traceback)."""
    assert p.returncode == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-1500:])
    last = p.stderr.strip().splitlines()[-1]
    assert ": error: " in last, p.stderr[-800:]
    return last


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    b = tmp_path_factory.mktemp("cmdmore") / "base"
    fuzzing_more.make_base(str(b))
    return b


def test_int_flags_are_int32(base):
    net, w = base / "deploy.prototxt", base / "deploy.caffemodel"
    for flag, value in [("--level", "-99999999999"), ("--iterations", str(10**20))]:
        last = error_line(caffe_ocl("test", "--model", net, "--weights", w, flag, value))
        assert f"{flag} expects an integer in [-2147483648, 2147483647]" in last, last


def test_unwritable_outputs_are_one_line(base, tmp_path):
    onnx_model = base / "model.onnx"
    last = error_line(caffe_ocl("onnx2caffe", onnx_model, "/dev/null/x.prototxt",
                                tmp_path / "x.caffemodel"))
    assert "/dev/null/x.prototxt" in last and "Not a directory" in last, last
    last = error_line(caffe_ocl("detect", "--model", base / "deploy.prototxt", "--weights",
                                base / "deploy.caffemodel", "--output_dir", "/dev/null/out",
                                base / "img.png"))
    assert "/dev/null/out" in last, last


def test_newline_in_a_path_stays_one_line(base):
    p = caffe_ocl("test", "--model", f"{base}/deploy.prototxt\nx", "--iterations", "1")
    last = error_line(p)
    assert "deploy.prototxt\\nx" in last and p.stderr.strip().count("\n") == 0, p.stderr


def test_classify_and_onnx2caffe_refuse_nonsense_values(base, tmp_path):
    net, w, img = base / "deploy.prototxt", base / "deploy.caffemodel", base / "img.png"
    for args, want in [(("--top_k", "0"), "--top_k must be at least 1"),
                       (("--scale", "nan"), "--scale must be a finite number"),
                       (("--mean_value", "nan,1,2"), "--mean_value expects finite numbers"),
                       (("--mean_value", "1,2"), "the mean has shape [2, 1, 1]")]:
        last = error_line(caffe_ocl("classify", "--model", net, "--weights", w, *args, img))
        assert want in last, (args, last)
    out = (tmp_path / "o.prototxt", tmp_path / "o.caffemodel")
    for args, want in [(("--input_shape", "data=-1,3,8,8"), "dimensions must be positive"),
                       (("--batch", "0"), "--batch must be at least 1")]:
        last = error_line(caffe_ocl("onnx2caffe", base / "model.onnx", *out, *args))
        assert want in last, (args, last)
    assert not out[0].exists()


def test_unknown_solver_type_names_the_file(tmp_path):
    import caffe_ocl as caffe
    from caffe_ocl.errors import SolverError
    (tmp_path / "net.prototxt").write_text(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 1 } } }')
    s = tmp_path / "bad_type.prototxt"
    s.write_text(f'net: "{tmp_path}/net.prototxt" type: "Newton" base_lr: 0.1')
    with pytest.raises(SolverError, match="bad_type.prototxt: Unknown solver type: 'Newton'"):
        caffe.get_solver(str(s))
