"""Quiet interrupts while the ``caffe_ocl`` command starts (issue #25).

Importing the package (pyopencl, the layer registry, ...) takes about a
second; a Ctrl-C then would print a KeyboardInterrupt traceback from
inside some import. When the process was started as the command
(``caffe_ocl ...`` or ``python -m caffe_ocl ...``), ``guard()`` -- called
first thing by the package -- installs a SIGINT handler that prints one
line and exits with status 130; the command dispatcher calls ``end()``
just before the command's ``main`` runs, which puts Python's own handler
back (the dispatcher turns a KeyboardInterrupt into one line and 130, and
training installs its --sigint_effect handler). Importing caffe_ocl as a
library changes no signal handler.
"""
import os
import signal
import sys
import threading


def started_as_command():
    orig = list(getattr(sys, "orig_argv", ()))
    for i, a in enumerate(orig):
        if a == "-m":
            return orig[i + 1:i + 2] == ["caffe_ocl"]
        if a.startswith("-m"):
            return a[2:] == "caffe_ocl"
    return os.path.basename(sys.argv[0] if sys.argv else "") == "caffe_ocl"


def _interrupted(signum, frame):
    try:
        sys.stderr.write("caffe_ocl: interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    raise SystemExit(130)


def _main_thread():
    return threading.current_thread() is threading.main_thread()


def guard():
    """Install the start-up SIGINT handler when running as the command
    and nobody has changed Python's default handler."""
    if _main_thread() and started_as_command() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def end():
    """Start-up is over: Python's own SIGINT handler again (only where
    ``guard`` installed ours)."""
    if _main_thread() and signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
