"""Importing this module registers every built-in layer family."""
from . import _import_families

_import_families()
