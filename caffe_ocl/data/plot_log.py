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

import numpy as np

from ..errors import DataError

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)"
RE_ITER = re.compile(r"Iteration (\d+)")
RE_LOSS = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = " + _NUM)
RE_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
RE_TEST_OUT = re.compile(r"Test net output #(\d+): (\S+) = " + _NUM)
RE_TRAIN_OUT = re.compile(r"Train net output #(\d+): (\S+) = " + _NUM)
RE_LR = re.compile(r"Iteration (\d+), lr = " + _NUM)


def parse_log(path):
    """{'train': [(iter, loss)], 'test': [(iter, {name: value})],
    'lr': [(iter, lr)]} from a log file (only test net #0 is kept)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise DataError(f"plot_log: cannot read log {path} ({e})") from None
    train, test, lr = [], [], []
    it = -1
    test_it, test_net = None, 0
    for line in text.splitlines():
        m = RE_TESTING.search(line)
        if m:
            test_it, test_net = int(m.group(1)), int(m.group(2))
            if test_net == 0:
                test.append((test_it, {}))
            continue
        m = RE_LOSS.search(line)
        if m:
            it = int(m.group(1))
            train.append((it, float(m.group(2))))
            continue
        m = RE_LR.search(line)
        if m:
            lr.append((int(m.group(1)), float(m.group(2))))
            continue
        m = RE_TEST_OUT.search(line)
        if m and test and test_net == 0:
            test[-1][1][m.group(2)] = float(m.group(3))
            continue
        m = RE_ITER.search(line)
        if m:
            it = int(m.group(1))
    test = [t for t in test if t[1]]
    return {"train": train, "test": test, "lr": lr}


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


def _nice_ticks(lo, hi, n=5):
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        hi = lo + 1.0
    span = hi - lo
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw), default=raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-6:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.0e}" if abs(v) < 0.01 else f"{v:g}"
    return f"{v:g}"


def plot(parsed, out_path, title="training", size=(900, 560)):
    """Draw training loss and test accuracy vs iterations into a PNG."""
    import cv2
    train = [(i, v) for i, v in parsed["train"] if math.isfinite(v)]
    acc_name = accuracy_name(parsed["test"])
    acc = [(i, o[acc_name]) for i, o in parsed["test"] if acc_name in o] if acc_name else []
    if not train and not acc:
        raise DataError("plot_log: no training loss ('Iteration N, loss = X') or test "
                        "accuracy ('Test net output #k: accuracy = X') lines in the log")
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
    yt = [t for t in _nice_ticks(y0, y1) if y0 - 1e-9 <= t <= y1 + 1e-9]

    def px(x):
        return int(round(left + (x - x0) / (x1 - x0) * pw))

    def py(y, lo, hi):
        return int(round(top + ph - (y - lo) / (hi - lo) * ph))

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
