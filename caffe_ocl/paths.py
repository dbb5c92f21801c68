"""Where the shipped files live, in a checkout and in an installed package."""
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def models_dir():
    """The `models/` folder: inside the package when installed from a wheel
    (mapped there by pyproject.toml), beside it in a checkout."""
    for cand in (_PKG / "models", _PKG.parent / "models"):
        if cand.is_dir():
            return cand
    raise FileNotFoundError("caffe_ocl's models/ folder is missing from this installation")
