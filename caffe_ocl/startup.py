"""Quiet interrupts while the ``caffe_ocl`` command starts (issue #25).

Importing the package (pyopencl, the layer registry, ...) takes about a
second; a Ctrl-C then would print a KeyboardInterrupt traceback from
inside some import. When the process was started as the command
(``caffe_ocl ...`` or ``python -m caffe_ocl ...``), ``guard()`` -- called
first thing by the package, before any other import of it -- installs a
SIGINT handler that prints one line and ends the process with status 130
at once (``os._exit``: an exception raised inside an import could be
swallowed by a ``__del__`` or an ``except BaseException`` on the way, or
print "Exception ignored"); the command dispatcher calls ``end()`` as the
command's ``main`` starts, which puts Python's own handler back (the
dispatcher turns a KeyboardInterrupt into one line and 130, and training
installs its --sigint_effect handler), and ``guard()`` again once it has
returned, for the interpreter's shutdown. This module imports only
modules Python has loaded before any user code runs, so the handler is in
place a fraction of a millisecond after the package starts importing.
Importing caffe_ocl as a library changes no signal handler.
"""
import os
import signal
import sys


def started_as_command():
    orig = list(getattr(sys, "orig_argv", ()))
    for i, a in enumerate(orig):
        if a == "-m":
            return orig[i + 1:i + 2] == ["caffe_ocl"]
        if a.startswith("-m"):
            return a[2:] == "caffe_ocl"
    return os.path.basename(sys.argv[0] if sys.argv else "") == "caffe_ocl"


def _interrupted(signum, frame):
    for stream, text in ((sys.stdout, ""), (sys.stderr, "caffe_ocl: interrupted\n")):
        try:
            stream.write(text)
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(130)


def _set(handler):
    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:          # not the main thread: leave signals alone
        pass


def guard():
    """Install the start-up SIGINT handler when running as the command
    and nobody has changed Python's default handler."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler and \
            started_as_command():
        _set(_interrupted)


def end():
    """Start-up is over: Python's own SIGINT handler again (only where
    ``guard`` installed ours)."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        _set(signal.default_int_handler)
