"""A Caffe training log as two CSV tables, as BVLC's tools/extra/parse_log.py
writes them (the library side of `caffe_ocl parse_log`).

``parse_log(path)`` returns (train rows, test rows); each row is an ordered
dict ``NumIters, Seconds, LearningRate`` followed by the net's outputs in
the order the log prints them ("Train net output #k: NAME = V" / "Test net
output #k: NAME = V"). ``NumIters`` is the last "Iteration N" seen (a
float, as BVLC's script keeps it); ``Seconds`` counts from the log's
"Solving" line (glog time stamps; the year is the log file's creation year,
plus one at each month wrap); ``LearningRate`` is the last "lr = X" (the
first row takes the second row's, as BVLC's ``fix_initial_nan_learning_rate``
does). Lines before the first "Iteration" and lines without a glog time
stamp are skipped.

``save_csv_files`` writes ``OUTPUT_DIR/<log name>.train`` and ``.test``
(csv's excel dialect with the given delimiter, a header row). Where BVLC's
script differs: a row still open when the log ends is written when it has
every column of the rows before it or is the only one (BVLC's drops it),
and a table without rows is written as its header (BVLC's script fails).
"""
import csv
import datetime
import os
import re
from collections import OrderedDict

from ..errors import DataError

RE_ITERATION = re.compile(r"Iteration (\d+)")
RE_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
RE_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
RE_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")
HEAD = ("NumIters", "Seconds", "LearningRate")


def datetime_of_line(line, year):
    """The time stamp of a glog line ("I0210 13:39:22.381027 ...");
    ValueError when the line has none."""
    parts = line.strip().split()
    if len(parts) < 2 or len(parts[0]) < 5:
        raise ValueError(f"no glog time stamp: {line!r}")
    month, day = int(parts[0][1:3]), int(parts[0][3:])
    stamp = parts[1]
    pos = stamp.rfind(".")
    hms = [int(x) for x in stamp[:pos].split(":")]
    if len(hms) != 3:
        raise ValueError(f"no glog time stamp: {line!r}")
    return datetime.datetime(year, month, day, hms[0], hms[1], hms[2], int(stamp[pos + 1:]))


def _row_for_output(regex, row, rows, line, iteration, seconds, lr):
    m = regex.search(line)
    if m:
        if not row or row["NumIters"] != iteration:
            if row:
                rows.append(row)
            row = OrderedDict([("NumIters", iteration), ("Seconds", seconds),
                               ("LearningRate", lr)])
        row[m.group(2)] = float(m.group(3))
    if row and len(rows) >= 1 and len(row) == len(rows[0]):
        rows.append(row)
        row = None
    return rows, row


def parse_log(path, year=None):
    """(train rows, test rows) of a Caffe log (see the module's text)."""
    if year is None:
        year = datetime.datetime.fromtimestamp(os.path.getctime(path)).year
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise DataError(f"parse_log: cannot read {path} ({e.strerror})") from None
    start = None
    k = 0
    for k, line in enumerate(lines):
        if "Solving" in line:
            try:
                start = datetime_of_line(line, year)
            except (ValueError, IndexError):
                raise DataError(f"{path}: the 'Solving' line has no glog time stamp: "
                                f"{line.strip()!r}") from None
            break
    if start is None:
        raise DataError(f"{path}: no 'Solving' line (is this a Caffe training log?)")
    last = start
    iteration, lr = -1, float("nan")
    train, test, train_row, test_row = [], [], None, None
    for line in lines[k + 1:]:
        m = RE_ITERATION.search(line)
        if m:
            iteration = float(m.group(1))
        if iteration == -1:
            continue
        try:
            t = datetime_of_line(line, year)
        except (ValueError, IndexError):
            continue
        if t.month < last.month:
            year += 1
            t = datetime_of_line(line, year)
        last = t
        seconds = (t - start).total_seconds()
        m = RE_LEARNING_RATE.search(line)
        if m:
            lr = float(m.group(1))
        train, train_row = _row_for_output(RE_TRAIN_OUTPUT, train_row, train, line, iteration,
                                           seconds, lr)
        test, test_row = _row_for_output(RE_TEST_OUTPUT, test_row, test, line, iteration,
                                         seconds, lr)
    for rows, row in ((train, train_row), (test, test_row)):
        if row and (not rows or len(row) == len(rows[0])):
            rows.append(row)
        if len(rows) > 1:
            rows[0]["LearningRate"] = rows[1]["LearningRate"]
    return train, test


def write_csv(path, rows, delimiter=","):
    fields = list(rows[0].keys()) if rows else list(HEAD)
    try:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, dialect=csv.excel, delimiter=delimiter)
            w.writeheader()
            w.writerows(rows)
    except OSError as e:
        raise DataError(f"parse_log: cannot write {path} ({e.strerror})") from None


def save_csv_files(log_path, output_dir, train, test, delimiter=","):
    """Write OUTPUT_DIR/<log name>.train and .test; returns their paths."""
    base = os.path.basename(log_path)
    paths = (os.path.join(output_dir, base + ".train"), os.path.join(output_dir, base + ".test"))
    write_csv(paths[0], train, delimiter)
    write_csv(paths[1], test, delimiter)
    return paths
