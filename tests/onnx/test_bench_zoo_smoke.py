"""benchmarks/bench_zoo.py --smoke: a tiny torch net through export ->
convert -> check against PyTorch -> one interleaved timing round against
ONNX Runtime on the CPU device. Skipped where torch (CI) or onnxruntime is
not installed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def test_bench_zoo_smoke(tmp_path):
    out = tmp_path / "zoo.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.join(str(ROOT), "benchmarks", "bench_zoo.py"),
                        "--smoke", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    (rec,) = data["records"]
    assert rec["net"] == "tiny" and rec["batch"] == 1 and rec["status"] == "ok", rec
    # the check is a real comparison: small but computed, not a constant
    assert 0 <= rec["err_rel"] <= 1e-3
    assert rec["layers"] > 5
    assert rec["ours_ms"] > 0 and rec["ort_ms"] > 0
    # the Markdown table names the net and has the ratio and summary rows
    assert "| tiny |" in p.stdout and "b1 ort/ours" in p.stdout
    assert "**geomean**" in p.stdout and "**worst**" in p.stdout
