"""Nothing in the library imports a command (issue #22): only the package
entry points (``__main__``, and the deprecated aliases ``cli``/``flags``
kept for old installs and for modules not yet moved) may import
caffe_ocl.commands."""
import ast

from conftest import ROOT

PKG = ROOT / "caffe_ocl"
ALLOWED = {"__main__.py", "cli.py", "flags.py"}


def _imported_modules(path):
    """Absolute dotted names of the caffe_ocl modules ``path`` imports."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])          # a module's package (an __init__'s own)
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in node.names]
    return out


def test_no_library_module_imports_a_command():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "commands" or str(rel) in ALLOWED:
            continue
        for mod in _imported_modules(path):
            if mod == "caffe_ocl.commands" or mod.startswith("caffe_ocl.commands.") or \
                    mod in ("caffe_ocl.cli", "caffe_ocl.train_cli", "caffe_ocl.flags"):
                offenders.append(f"{rel}: {mod}")
    assert offenders == []


def test_the_check_sees_an_upward_import():
    """The scan resolves relative imports (so the test above can fail)."""
    d = ROOT / "caffe_ocl" / "data" / "demo.py"
    assert "caffe_ocl.data.tools" in _imported_modules(d)
    assert "caffe_ocl.commands" in _imported_modules(ROOT / "caffe_ocl" / "__main__.py")
