"""Caffe's image list files (ImageData layer, convert_imageset)."""
import os

from ..errors import DataError


def read_image_list(source, where):
    """Caffe's list file: ``path label`` per line (split at the last space)."""
    if not os.path.isfile(source):
        raise DataError(f"{where}: image list file {source} not found")
    lines = []
    with open(source, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            pos = line.rfind(" ")
            if pos < 0:
                raise DataError(f"{where}: list file {source} line {n}: expected "
                                f"'path label', got {line!r}")
            try:
                label = int(line[pos + 1:])
            except ValueError:
                raise DataError(f"{where}: list file {source} line {n}: label "
                                f"{line[pos + 1:]!r} is not an integer") from None
            lines.append((line[:pos], label, n))
    if not lines:
        raise DataError(f"{where}: list file {source} is empty")
    return lines
