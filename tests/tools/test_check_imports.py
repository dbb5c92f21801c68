"""tools/check_imports.py: the import-structure check CI runs (issue #22)."""
import subprocess
import sys
import textwrap

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import check_imports  # noqa: E402


def test_package_has_no_violation_beyond_the_baseline():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check_imports.py"),
                          "--baseline", str(ROOT / "tools" / "check_imports_baseline.txt")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_lower_layers_stay_clean():
    """No violation at all in the runtime below the planning stage (errors,
    config, device, ops, blob, proto, data readers, layers)."""
    found, _ = check_imports.check(str(ROOT))
    low = [v for v in found if (check_imports.layer_of(v.module) or (99,))[0]
           <= [n for n, _ in check_imports.LAYERS].index("layers")]
    assert not low, "\n".join(map(str, low))


def _write(root, files):
    for rel, text in files.items():
        p = root / "caffe_ocl" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_each_rule_fires(tmp_path):
    """A toy package breaking every rule once."""
    _write(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "config.py": "import os\nX = os.environ.get('CAFFE_OCL_FOLD')\n",
        "device.py": """
            from . import blob
            import os
            def f():
                from . import errors
                return os.environ.get("CAFFE_OCL_DEVICE")
            """,
        "blob.py": "from .device import _hidden\nfrom . import device as d\nY = d._other\n",
        "ops/__init__.py": "",
        "ops/_impl.py": "",
        "layers/__init__.py": "from ..ops import _impl\n",
        "stray.py": "",
    })
    found, _ = check_imports.check(str(tmp_path))
    got = {(v.rule, check_imports.short(v.module)) for v in found}
    assert ("upward", "device") in got            # device imports blob (higher)
    assert ("cycle", "blob") in got               # blob <-> device
    assert ("function", "device") in got          # errors imported in f()
    assert ("private", "blob") in got             # _hidden, d._other
    assert ("private", "layers") in got           # ops/_impl.py from outside ops/
    assert ("env", "device") in got               # CAFFE_OCL_DEVICE outside config.py
    assert ("env", "config") not in got
    assert ("unplaced", "stray") in got
    details = {v.detail for v in found}
    assert "imports _hidden from device" in details and "uses device._other" in details


def test_baseline_lets_known_violations_pass(tmp_path):
    _write(tmp_path, {"__init__.py": "", "errors.py": "",
                      "device.py": "def f():\n    from . import errors\n"})
    base = tmp_path / "baseline.txt"
    assert check_imports.main(["--root", str(tmp_path)]) == 1
    assert check_imports.main(["--root", str(tmp_path), "--write-baseline", str(base)]) == 0
    assert "function|device|imports errors inside a function" in base.read_text()
    assert check_imports.main(["--root", str(tmp_path), "--baseline", str(base)]) == 0


def test_architecture_page_lists_the_layers_in_order():
    """docs/ARCHITECTURE.md's table has one row per layer of LAYERS, in order."""
    rows = [line.split("|")[1].strip()
            for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| layer ")]
    assert rows == [name for name, _ in check_imports.LAYERS]
