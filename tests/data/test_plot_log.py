"""plot_log on synthetic Caffe / caffe_ocl logs."""
import cv2
import numpy as np
import pytest

from caffe_ocl import commands as cli
from caffe_ocl.data.plot_log import parse_log
from caffe_ocl.errors import DataError


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
    b, g, r = img[..., 0].astype(int), img[..., 1].astype(int), img[..., 2].astype(int)
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
