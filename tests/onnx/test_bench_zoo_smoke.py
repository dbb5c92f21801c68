"""benchmarks/bench_zoo.py --smoke: a tiny torch net through export ->
convert -> check against PyTorch -> one interleaved timing round against
ONNX Runtime on the CPU device. Skipped where torch (CI) or onnxruntime is
not installed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, child_env

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def test_bench_zoo_smoke(tmp_path):
    out = tmp_path / "zoo.json"
    env = child_env()
    p = subprocess.run([sys.executable, os.path.join(str(ROOT), "benchmarks", "bench_zoo.py"),
                        "--smoke", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    (rec,) = data["records"]
    assert rec["net"] == "tiny" and rec["batch"] == 1 and rec["status"] == "ok", rec
    # the check is a real comparison: small but computed, not a constant
    assert 0 <= rec["err_rel"] <= 1e-3
    # both frameworks were also compared with the float64 run of the model
    assert 0 < rec["err64_rel"] <= 1e-3 and 0 <= rec["ref_err64_rel"] <= 1e-3
    assert rec["layers"] > 5
    assert rec["ours_ms"] > 0 and rec["ort_ms"] > 0
    # the Markdown table names the net and has the ratio and summary rows
    assert "| tiny |" in p.stdout and "b1 ort/ours" in p.stdout
    assert "**geomean**" in p.stdout and "**worst**" in p.stdout


def test_check_accepts_ill_conditioned_only_when_no_worse_than_pytorch():
    sys.path.insert(0, os.path.join(str(ROOT), "benchmarks"))
    import bench_zoo
    ok = dict(err_rel=5e-4, err64_rel=6e-5, ref_err64_rel=3.4e-4)      # MobileNet v3 large, b4
    assert bench_zoo.check_ok(ok, 1e-4)
    bad = dict(err_rel=5e-4, err64_rel=5e-4, ref_err64_rel=1e-6)      # PyTorch exact, ours off
    assert not bench_zoo.check_ok(bad, 1e-4)
    assert bench_zoo.check_ok(dict(err_rel=1e-5, err64_rel=1e-5, ref_err64_rel=0.0), 1e-4)
