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
