"""Parse a Caffe (or caffe_ocl) training log and plot it with OpenCV.

    caffe_ocl plot_log LOG OUT.png

Recognised lines (glog prefixes are ignored), as Caffe's tools/extra/parse_log.py:
    Iteration 100 (2.5 iter/s, 40s/100 iters), loss = 0.31     (or "Iteration 100, loss = 0.31")
    Iteration 500, Testing net (#0)
        Test net output #0: accuracy = 0.98
    Iteration 100, lr = 0.0099
The picture: training loss (left axis) and test accuracy (right axis, 0-1)
against iterations. No matplotlib needed.
"""
import math
import re
import sys

import numpy as np

from ..errors import DataError
from .parse_log import VALUE as _NUM, number

# a value (_NUM): a run of characters up to a space or bracket, a number
# when number() reads it as one ("0.31", "-1e-05", "nan", "-inf"; not "e",
# "1.5x" or "1.#INF")
RE_LOSS = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = " + _NUM)
RE_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
RE_TEST_OUT = re.compile(r"Test net output #(\d+): (\S+) = " + _NUM)
RE_TRAIN_OUT = re.compile(r"Train net output #(\d+): (\S+) = " + _NUM)
RE_LR = re.compile(r"Iteration (\d+), lr = " + _NUM)


def _iteration(digits):
    """The int an "Iteration N" prints, or None when it is too large to
    place on an axis (a float overflows; also beyond Python's int digit
    limit)."""
    if not math.isfinite(float(digits)):
        return None
    return int(digits.lstrip("0") or "0")


def parse_log(path):
    """{'train': [(iter, loss)], 'test': [(iter, {name: value})],
    'lr': [(iter, lr)], 'path': path} from a log file (only test net #0 is
    kept). A line whose value is not a number ("loss = e") or whose
    iteration does not fit a float is skipped; "nan" and "inf" are kept
    (plot() leaves them out)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise DataError(f"plot_log: cannot read log {path} ({e})") from None
    train, test, lr = [], [], []
    test_net = 0
    for line in text.splitlines():
        m = RE_TESTING.search(line)
        if m:
            test_it, test_net = _iteration(m.group(1)), int(m.group(2))
            if test_it is None:
                test_net = -1            # its outputs are skipped with it
            elif test_net == 0:
                test.append((test_it, {}))
            continue
        m = RE_LOSS.search(line)
        if m:
            it, v = _iteration(m.group(1)), number(m.group(2))
            if it is not None and v is not None:
                train.append((it, v))
            continue
        m = RE_LR.search(line)
        if m:
            it, v = _iteration(m.group(1)), number(m.group(2))
            if it is not None and v is not None:
                lr.append((it, v))
            continue
        m = RE_TEST_OUT.search(line)
        if m and test and test_net == 0:
            v = number(m.group(3))
            if v is not None:
                test[-1][1][m.group(2)] = v
    test = [t for t in test if t[1]]
    return {"train": train, "test": test, "lr": lr, "path": path}


def accuracy_name(test):
    names = []
    for _, outs in test:
        for n in outs:
            if n not in names:
                names.append(n)
    for n in names:
        if "acc" in n.lower():
            return n
    return None


def _nice_ticks(lo, hi, n=5, max_ticks=20):
    """Round values (steps of 1, 2, 2.5 or 5 times a power of ten) from
    below ``lo`` to ``hi``, about ``n`` of them and never more than
    ``max_ticks``: they are made by index, so this ends for any input. Where
    the range has no such steps (not finite, empty, or narrower than the
    floats near its ends resolve) the ticks are its finite ends."""
    ends = sorted({float(v) for v in (lo, hi) if math.isfinite(v)})
    if len(ends) < 2:
        return ends
    lo, hi = ends
    raw = hi / n - lo / n                 # span / n, without overflow
    if not raw >= sys.float_info.min or raw < max(abs(lo), abs(hi)) * 1e-12:
        return ends
    mag = 10.0 ** math.floor(math.log10(raw))
    step = min((s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw), default=raw)
    first, last = math.floor(lo / step), math.floor(hi / step + 1e-6)
    if not 0 <= last - first < max_ticks:
        return ends
    ticks = (float(f"{k * step:.12g}") for k in range(first, last + 1))
    return [t for t in ticks if math.isfinite(t)]


def _axis(lo, hi):
    """(lo, hi) for an axis that shows [lo, hi]: finite, and wide enough to
    divide by (a range of denormals or a single value gets hi = lo + 1)."""
    big = sys.float_info.max
    lo, hi = min(max(lo, -big), big), min(max(hi, -big), big)
    if hi / 2 - lo / 2 >= 1e-300:
        return lo, hi
    if lo + 1.0 > lo:
        return lo, lo + 1.0
    mid = lo / 2 + hi / 2                 # |lo| > 2**53: pad by a thousandth
    pad = abs(mid) * 1e-3
    return max(mid - pad, -big), min(mid + pad, big)


def _fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.0e}" if abs(v) < 0.01 else f"{v:g}"
    return f"{v:g}"


def drawn_points(parsed):
    """(train loss points, test accuracy points, accuracy name) that plot()
    draws: those with a finite iteration and value (a nan or inf loss is
    left out)."""
    def finite(i, v):
        return math.isfinite(i) and math.isfinite(v)

    train = [(i, v) for i, v in parsed["train"] if finite(i, v)]
    acc_name = accuracy_name(parsed["test"])
    acc = [(i, o[acc_name]) for i, o in parsed["test"]
           if acc_name in o and finite(i, o[acc_name])] if acc_name else []
    return train, acc, acc_name


def plot(parsed, out_path, title="training", size=(900, 560)):
    """Draw training loss and test accuracy vs iterations into a PNG."""
    import cv2

    train, acc, acc_name = drawn_points(parsed)
    if not train and not acc:
        raise DataError(f"plot_log: {parsed.get('path', 'the log')}: no training loss "
                        "('Iteration N, loss = X') or test accuracy ('Test net output #k: "
                        "accuracy = X') lines with finite numbers")
    W, H = size
    left, right, top, bottom = 80, 80, 50, 60
    img = np.full((H, W, 3), 255, np.uint8)
    pw, ph = W - left - right, H - top - bottom
    font = cv2.FONT_HERSHEY_SIMPLEX
    black, grey = (0, 0, 0), (215, 215, 215)
    blue, red = (200, 90, 20), (40, 40, 210)          # BGR
    iters = [i for i, _ in train] + [i for i, _ in acc]
    x0, x1 = min(iters), max(iters)
    if x1 == x0:
        x1 = x0 + 1
    xt = [t for t in _nice_ticks(x0, x1) if x0 <= t <= x1] or [x0, x1]
    if train:
        losses = [v for _, v in train]
        y0, y1 = 0.0, max(losses) * 1.05 if max(losses) > 0 else 1.0
        if min(losses) < 0:
            y0 = min(losses) * 1.05
    else:
        y0, y1 = 0.0, 1.0
    y0, y1 = _axis(y0, y1)
    tol = (y1 / 2 - y0 / 2) * 2e-9
    yt = [t for t in _nice_ticks(y0, y1) if y0 - tol <= t <= y1 + tol]

    def px(x):      # x - x0 on the ints of the log is exact, also beyond 2**53
        return int(round(left + (x - x0) / (x1 - x0) * pw))

    def py(y, lo, hi):                  # halves: no overflow near +-1.8e308
        return int(round(top + ph - (y / 2 - lo / 2) / (hi / 2 - lo / 2) * ph))

    for t in yt:                                        # grid + left ticks
        y = py(t, y0, y1)
        cv2.line(img, (left, y), (left + pw, y), grey, 1)
        s = _fmt(t)
        (tw, th), _ = cv2.getTextSize(s, font, 0.45, 1)
        cv2.putText(img, s, (left - 8 - tw, y + th // 2), font, 0.45, blue, 1, cv2.LINE_AA)
    for t in xt:
        x = px(t)
        cv2.line(img, (x, top + ph), (x, top + ph + 5), black, 1)
        s = _fmt(t)
        (tw, th), _ = cv2.getTextSize(s, font, 0.45, 1)
        cv2.putText(img, s, (x - tw // 2, top + ph + 8 + th), font, 0.45, black, 1, cv2.LINE_AA)
    if acc:
        for t in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):        # right ticks
            y = py(t, 0.0, 1.0)
            cv2.line(img, (left + pw, y), (left + pw + 5, y), red, 1)
            cv2.putText(img, f"{t:.1f}", (left + pw + 8, y + 5), font, 0.45, red, 1,
                        cv2.LINE_AA)
    cv2.rectangle(img, (left, top), (left + pw, top + ph), black, 1)
    if train:
        pts = np.array([[px(i), py(v, y0, y1)] for i, v in train], np.int32)
        cv2.polylines(img, [pts], False, blue, 2, cv2.LINE_AA)
    if acc:
        pts = np.array([[px(i), py(min(max(v, 0.0), 1.0), 0.0, 1.0)] for i, v in acc],
                       np.int32)
        cv2.polylines(img, [pts], False, red, 2, cv2.LINE_AA)
        for p in pts:
            cv2.circle(img, tuple(int(c) for c in p), 4, red, -1, cv2.LINE_AA)
    # labels, title, legend
    s = "iterations"
    (tw, _), _ = cv2.getTextSize(s, font, 0.55, 1)
    cv2.putText(img, s, (left + pw // 2 - tw // 2, H - 12), font, 0.55, black, 1, cv2.LINE_AA)
    lab = np.full((30, ph, 3), 255, np.uint8)            # rotated axis labels
    cv2.putText(lab, "training loss", (ph // 2 - 60, 21), font, 0.55, blue, 1, cv2.LINE_AA)
    img[top:top + ph, 8:38] = cv2.rotate(lab, cv2.ROTATE_90_COUNTERCLOCKWISE)
    if acc:
        lab = np.full((30, ph, 3), 255, np.uint8)
        cv2.putText(lab, f"test {acc_name}", (ph // 2 - 60, 21), font, 0.55, red, 1,
                    cv2.LINE_AA)
        img[top:top + ph, W - 32:W - 2] = cv2.rotate(lab, cv2.ROTATE_90_CLOCKWISE)
    cv2.putText(img, title, (left, 30), font, 0.65, black, 1, cv2.LINE_AA)
    lx = left + pw - 230
    if train:
        cv2.line(img, (lx, 25), (lx + 25, 25), blue, 2, cv2.LINE_AA)
        cv2.putText(img, "train loss", (lx + 30, 30), font, 0.5, black, 1, cv2.LINE_AA)
    if acc:
        cv2.line(img, (lx + 115, 25), (lx + 140, 25), red, 2, cv2.LINE_AA)
        cv2.putText(img, f"test {acc_name}"[:14], (lx + 145, 30), font, 0.5, black, 1,
                    cv2.LINE_AA)
    try:
        ok = cv2.imwrite(out_path, img)
    except cv2.error as e:
        raise DataError(f"plot_log: cannot write {out_path} ({e})") from None
    if not ok:
        raise DataError(f"plot_log: cannot write {out_path} (unknown extension or folder)")
    return img
