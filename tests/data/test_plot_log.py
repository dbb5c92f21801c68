"""plot_log on synthetic Caffe / caffe_ocl logs."""
import contextlib
import math
import signal
import subprocess
import sys

import cv2
import numpy as np
import pytest

from caffe_ocl import commands as cli
from caffe_ocl.data.plot_log import parse_log
from caffe_ocl.errors import DataError
from conftest import ROOT, child_env


def synthetic_log(path, new_style=True):
    lines = ["Log file created at: 2024/01/01 10:00:00",
             "I0101 10:00:00.000000  1234 caffe.cpp:218] Using GPUs 0",
             "I0101 10:00:01.000000  1234 solver.cpp:330] Iteration 0, Testing net (#0)",
             "I0101 10:00:01.100000  1234 solver.cpp:397]     Test net output #0: accuracy = 0.1",
             "I0101 10:00:01.100000  1234 solver.cpp:397]     Test net output #1: loss = 2.3 (* 1 = 2.3 loss)"]
    accs = {0: 0.1}
    losses = {}
    for it in range(0, 1001, 100):
        loss = 2.3 * np.exp(-it / 300) + 0.05
        losses[it] = round(loss, 5)
        head = f"Iteration {it} (12.5 iter/s, 8s/100 iters), loss = {losses[it]}" if new_style \
            else f"Iteration {it}, loss = {losses[it]}"
        lines += [f"I0101 10:00:{it // 100 + 2:02d}.000000  1234 solver.cpp:218] {head}",
                  f"I0101 10:00:02.000000  1234 solver.cpp:237]     Train net output #0: loss = {losses[it]} (* 1 = {losses[it]} loss)",
                  f"I0101 10:00:02.000000  1234 sgd_solver.cpp:105] Iteration {it}, lr = 0.01"]
        if it and it % 500 == 0:
            accs[it] = round(0.9 + it / 20000, 4)
            lines += [f"I0101 10:00:03.000000  1234 solver.cpp:330] Iteration {it}, Testing net (#0)",
                      f"I0101 10:00:03.000000  1234 solver.cpp:397]     Test net output #0: accuracy = {accs[it]}",
                      "I0101 10:00:03.000000  1234 solver.cpp:397]     Test net output #1: loss = 0.1 (* 1 = 0.1 loss)"]
    path.write_text("\n".join(lines) + "\n")
    return losses, accs


@pytest.mark.parametrize("new_style", [True, False])
def test_parse_log(tmp_path, new_style):
    losses, accs = synthetic_log(tmp_path / "a.log", new_style)
    p = parse_log(str(tmp_path / "a.log"))
    assert p["train"] == sorted(losses.items())
    assert [(i, o["accuracy"]) for i, o in p["test"]] == sorted(accs.items())
    assert p["lr"][0] == (0, 0.01)


def test_plot_log_writes_png(tmp_path):
    synthetic_log(tmp_path / "a.log")
    out = tmp_path / "plot.png"
    assert cli.main(["plot_log", str(tmp_path / "a.log"), str(out)]) == 0
    img = cv2.imread(str(out))
    assert img is not None and img.shape == (560, 900, 3)
    b, r = img[..., 0].astype(int), img[..., 2].astype(int)
    assert ((b > 150) & (r < 80)).sum() > 500      # the blue loss curve
    assert ((r > 150) & (b < 80)).sum() > 500      # the red accuracy curve


def test_plot_log_without_data(tmp_path, capsys):
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(DataError, match="no training loss"):
        from caffe_ocl.data.plot_log import plot
        plot(parse_log(str(tmp_path / "empty.log")), str(tmp_path / "x.png"))
    assert cli.main(["plot_log", str(tmp_path / "missing.log"), "x.png"]) == 1
    err = capsys.readouterr().err
    assert "file not found" in err and "missing.log" in err


# --------------------------------------------------------------------------
# odd numbers in a log: skipped or left out, never a traceback or a hang

STAMP = "I1206 09:00:01.000000  1 solver.cpp:2] "


def write_log(path, *lines):
    path.write_text("".join(STAMP + line + "\n" for line in lines))
    return str(path)


def test_parse_log_skips_values_that_are_not_numbers(tmp_path):
    log = write_log(tmp_path / "odd.log",
                    "Iteration 1, loss = e", "Iteration 2, loss = ...", "Iteration 3, loss = -+-",
                    "Iteration 4, loss = 1.5x", "Iteration 5, loss = 0.5\x00",   # a NUL ends it
                    "Iteration 6, loss = -nan", "Iteration 7, loss = inf (* 1 = inf loss)",
                    "Iteration 8, lr = 1-5", "Iteration 8, lr = 0.01",
                    "Iteration 9" + "9" * 5000 + ", loss = 1",          # beyond int()'s digits
                    "Iteration 1" + "0" * 400 + ", loss = 1",           # beyond a float
                    "Iteration 1" + "0" * 400 + ", Testing net (#0)",
                    "    Test net output #0: accuracy = 0.3",               # goes with it
                    "Iteration 10, Testing net (#0)",
                    "    Test net output #0: accuracy = e",
                    "    Test net output #1: loss = 0.25")
    p = parse_log(log)
    assert [i for i, _ in p["train"]] == [5, 6, 7]
    assert p["train"][0] == (5, 0.5) and p["train"][2] == (7, float("inf"))
    assert p["train"][1][1] != p["train"][1][1]                           # nan
    assert p["lr"] == [(8, 0.01)]
    assert p["test"] == [(10, {"loss": 0.25})]
    assert p["path"] == log


def _limit_memory():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_plot_log(*argv, timeout=60):
    """`python -m caffe_ocl plot_log ...` in a subprocess (4 GiB of address
    space), so that a hang fails the test instead of stopping the run."""
    try:
        return subprocess.run([sys.executable, "-m", "caffe_ocl", "plot_log", *argv], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"plot_log {' '.join(argv)} did not end in {timeout} s")


@contextlib.contextmanager
def time_limit(seconds):
    """Fail (TimeoutError) a block of pure Python that runs longer than
    ``seconds``: the tick loop that never ended also grew a list without
    bound, so it must be stopped early."""
    def expire(*_):
        raise TimeoutError(f"did not end in {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_plot_log_iterations_beyond_2_to_53_end(tmp_path):
    # v += step no longer changed v at 1e20: the tick loop never ended
    log = write_log(tmp_path / "big.log", "Iteration 100000000000000000000, loss = 1",
                    "Iteration 100000000000000000001, loss = 2")
    r = run_plot_log(log, str(tmp_path / "big.png"))
    assert r.returncode == 0, r.stderr
    assert "2 loss points" in r.stdout and cv2.imread(str(tmp_path / "big.png")) is not None


@pytest.mark.parametrize("lo, hi", [
    (0, 1000), (-0.3, 2.4), (10**20, 10**20 + 1), (2**53, 2**53 + 3), (0.0, 5e-324),
    (0.0, 1e-12), (5e-324, 5e-324), (-1.7e308, 1.7e308), (0.0, float("inf")),
    (float("nan"), 1.0), (float("-inf"), float("inf")), (3.0, 3.0), (7.0, 2.0),
    (1e300, 1.7e308), (-2.0, -1.0)])
def test_nice_ticks_is_bounded_and_finite(lo, hi):
    from caffe_ocl.data.plot_log import _nice_ticks
    with time_limit(2):
        ticks = _nice_ticks(lo, hi)
    assert len(ticks) <= 20
    assert bool(ticks) == (math.isfinite(lo) or math.isfinite(hi))   # none without a finite end
    assert all(math.isfinite(t) for t in ticks)
    assert ticks == sorted(ticks)


def test_nice_ticks_round_steps():
    from caffe_ocl.data.plot_log import _nice_ticks
    assert _nice_ticks(0, 1000) == [0, 200, 400, 600, 800, 1000]
    assert _nice_ticks(0, 2.415) == [0, 0.5, 1, 1.5, 2]
    assert _nice_ticks(0, 1e-12) == [0, 2e-13, 4e-13, 6e-13, 8e-13, 1e-12]
    assert _nice_ticks(-1.7e308, 1.7e308) == [-1e308, 0, 1e308]


@pytest.mark.parametrize("losses", [("5e-324", "5e-324"), ("1e-320", "0"), ("1.7e308", "-1.7e308"),
                                    ("1.7e308", "1.7e308"), ("inf", "2"), ("-3", "-3")])
def test_plot_log_extreme_losses(tmp_path, losses):
    log = write_log(tmp_path / "x.log", *(f"Iteration {i}, loss = {v}"
                                          for i, v in enumerate(losses)))
    out = tmp_path / "x.png"
    assert cli.main(["plot_log", log, str(out)]) == 0
    assert cv2.imread(str(out)).shape == (560, 900, 3)


def test_plot_log_skips_non_finite_points(tmp_path, capsys):
    # loss = inf and accuracy = nan: int(round(nan)) failed; only the finite
    # accuracy is drawn
    log = write_log(tmp_path / "nan.log", "Iteration 1, loss = inf",
                    "Iteration 2, Testing net (#0)", "  Test net output #0: accuracy = nan",
                    "Iteration 3, Testing net (#0)", "  Test net output #0: accuracy = 0.5")
    out = tmp_path / "nan.png"
    assert cli.main(["plot_log", log, str(out)]) == 0
    img = cv2.imread(str(out))
    assert ((img[..., 2] > 150) & (img[..., 0] < 80)).sum() > 20     # the red accuracy point
    # the count printed is of the points drawn
    assert f"{out}: 0 loss points, 1 test points" in capsys.readouterr().out


@pytest.mark.parametrize("lines", [
    ("Iteration 1, loss = inf", "Iteration 2, Testing net (#0)",
     "  Test net output #0: accuracy = nan"),
    ("Iteration 1" + "0" * 400 + ", loss = 1", "Iteration 2" + "0" * 400 + ", loss = 2"),
    ("Iteration 9" + "9" * 5000 + ", loss = 1",),
    ("Iteration 1, loss = e",)])
def test_plot_log_without_finite_points_names_the_log(tmp_path, capsys, lines):
    log = write_log(tmp_path / "inf.log", *lines)
    assert cli.main(["plot_log", log, str(tmp_path / "inf.png")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "inf.log" in err and "no training loss" in err and "Traceback" not in err
