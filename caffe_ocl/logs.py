"""Caffe's glog-style log lines, so existing Caffe log parsers read ours.

    I1129 17:12:14.123456 12345 solver.cpp:228] Iteration 100, loss = 0.3
"""
import logging
import os
import sys
import time


class GlogFormatter(logging.Formatter):
    LEVEL = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
             logging.ERROR: "E", logging.CRITICAL: "F"}

    def format(self, record):
        t = time.localtime(record.created)
        us = int((record.created % 1) * 1e6)
        where = getattr(record, "where", None) or f"{record.module}.py:{record.lineno}"
        return (f"{self.LEVEL.get(record.levelno, 'I')}{t.tm_mon:02d}{t.tm_mday:02d} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{us:06d} {os.getpid():5d} "
                f"{where}] {record.getMessage()}")


def init_log(level=logging.INFO, stream=None):
    logger = logging.getLogger("caffe_ocl")
    for h in list(logger.handlers):
        if getattr(h, "_caffe_ocl", False):
            logger.removeHandler(h)
    h = logging.StreamHandler(stream or sys.stderr)
    h.setFormatter(GlogFormatter())
    h._caffe_ocl = True
    logger.addHandler(h)
    logger.setLevel(level)
    # Propagation stays on: with no root handlers (the command line) nothing
    # prints twice, and applications' own logging setups still see our lines.
    return logger


# glog severities (FLAGS_minloglevel, GLOG_minloglevel) -> Python levels
GLOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}


def glog_min_level():
    """The Python level for glog's GLOG_minloglevel (pycaffe users set it,
    e.g. to 2, before ``import caffe``); INFO when unset or unreadable."""
    raw = os.environ.get("GLOG_minloglevel", "").strip()
    try:
        sev = int(raw) if raw else 0
    except ValueError:
        sev = 0
    return GLOG_LEVELS[min(max(sev, 0), 3)]


def python_level(level):
    """Python logging level for pycaffe's init_log(level): a glog severity
    0..3, None (GLOG_minloglevel), or already a Python level (>= 10)."""
    if level is None:
        return glog_min_level()
    level = int(level)
    if level >= 10:
        return level
    return GLOG_LEVELS[min(max(level, 0), 3)]


def init_pycaffe_log():
    """What ``import caffe`` does: Caffe's log lines on stderr from
    GLOG_minloglevel on (pycaffe prints glog's lines to stderr), unless a
    caffe_ocl log handler is installed already."""
    logger = logging.getLogger("caffe_ocl")
    if any(getattr(h, "_caffe_ocl", False) for h in logger.handlers):
        return logger
    return init_log(glog_min_level())
