"""Deprecated: the flag parser moved to caffe_ocl/commands/flags.py.

Kept only so that command modules written against the old name still
import; new code uses ``caffe_ocl.commands.flags``. (This module will be
removed once every command module has moved; it is the one library-level
module that imports from commands/.)
"""
from .commands.flags import FlagError, parse_flags  # noqa: F401
