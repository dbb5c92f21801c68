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
stamp (or with an impossible one: month 13, hour 25, ...) are skipped, and
so is an output or "lr =" whose value is not a number ("loss = e"); a
value is a decimal number as C++ or Python prints one, "nan" and "inf"
included (BVLC's script skips "nan" and fails on "-nan", "e" or "1-5").
Time stamps that wrap past the year 9999 are an error naming the line.

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
# the value after " = ": a run of characters up to a space, bracket, comma or
# control character (a NUL), read by number() (BVLC's regex [\.\deE+-]+ also
# matched "e", "..." or "-+-", and float() failed)
VALUE = r"([^\s,;()\[\]\x00-\x1f\x7f]+)"
RE_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = " + VALUE)
RE_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = " + VALUE)
RE_LEARNING_RATE = re.compile(r"lr = " + VALUE)
RE_NUMBER = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)",
                       re.IGNORECASE | re.ASCII)
# a glog time stamp "I0210 13:39:22.381027": level, month, day, h:m:s.fraction
RE_STAMP = re.compile(r"\S(\d{2})(\d{1,2})\s+(\d{1,2}):(\d{1,2}):(\d{1,2})\.(\d{1,6})(?:\s|$)",
                      re.ASCII)
HEAD = ("NumIters", "Seconds", "LearningRate")


def number(token):
    """The float a log prints as ``token`` ("0.5", "-1e-05", "nan", "-inf"),
    or None when ``token`` is not a number ("e", "...", "1-5", "1_0")."""
    return float(token) if RE_NUMBER.fullmatch(token) else None


def stamp_of_line(line):
    """(month, day, hour, minute, second, microsecond) of a glog line's time
    stamp, or None when it has none. Each field has at most two digits (the
    microseconds six; BVLC's script reads them as an integer too), so the
    values are small; their ranges are checked by ``datetime``."""
    m = RE_STAMP.match(line.strip())
    return tuple(int(g) for g in m.groups()) if m else None


def datetime_of_line(line, year):
    """The time stamp of a glog line ("I0210 13:39:22.381027 ...") in
    ``year``; ValueError when the line has none or it is not a date."""
    stamp = stamp_of_line(line)
    if stamp is None:
        raise ValueError(f"no glog time stamp: {line!r}")
    try:
        return datetime.datetime(year, *stamp)
    except (ValueError, OverflowError, TypeError):
        raise ValueError(f"not a date in {year}: {line!r}") from None


def _row_for_output(regex, row, rows, line, iteration, seconds, lr):
    m = regex.search(line)
    if m and number(m.group(3)) is not None:
        if not row or row["NumIters"] != iteration:
            if row:
                rows.append(row)
            row = OrderedDict([("NumIters", iteration), ("Seconds", seconds),
                               ("LearningRate", lr)])
        row[m.group(2)] = number(m.group(3))
    if row and len(rows) >= 1 and len(row) == len(rows[0]):
        rows.append(row)
        row = None
    return rows, row


def parse_log(path, year=None):
    """(train rows, test rows) of a Caffe log (see the module's text)."""
    try:
        if year is None:
            year = datetime.datetime.fromtimestamp(os.path.getctime(path)).year
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
            except ValueError:
                what = "no" if stamp_of_line(line) is None else "an impossible"
                raise DataError(f"{path}:{k + 1}: the 'Solving' line has {what} glog time "
                                f"stamp: {line.strip()[:200]!r}") from None
            break
    if start is None:
        raise DataError(f"{path}: no 'Solving' line (is this a Caffe training log?)")
    last_month = start.month
    iteration, lr = -1, float("nan")
    train, test, train_row, test_row = [], [], None, None
    for lineno, line in enumerate(lines[k + 1:], k + 2):
        m = RE_ITERATION.search(line)
        if m:
            iteration = float(m.group(1))
        if iteration == -1:
            continue
        stamp = stamp_of_line(line)
        if stamp is None:
            continue
        # the year goes up where the month goes down (December -> January)
        y = year + 1 if stamp[0] < last_month else year
        if y > datetime.MAXYEAR:
            raise DataError(f"{path}:{lineno}: the time stamps go back a month so often that "
                            f"the log would end after the year {datetime.MAXYEAR} (is this one "
                            "training log?)")
        try:
            t = datetime.datetime(y, *stamp)
        except ValueError:       # month 13, 30 February, hour 25, ...: not a time stamp
            continue
        year, last_month = y, stamp[0]
        seconds = (t - start).total_seconds()
        m = RE_LEARNING_RATE.search(line)
        if m and number(m.group(1)) is not None:
            lr = number(m.group(1))
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
    fields = list(HEAD)         # every row's columns, in the order they first appear
    for row in rows:
        fields += [c for c in row if c not in fields]
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
